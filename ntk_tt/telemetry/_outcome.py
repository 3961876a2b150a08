"""Early-telemetry outcome prediction (issue 11, METHOD.md §9; arXiv 2608.03709).

From what a run has shown in its first k updates (its :class:`ntk_tt.Telemetry`, truncated
by
:func:`ntk_tt.telemetry._telemetry.truncate`), optionally with the head-aware NTK prediction of the
same run made before training, gradient-boosted trees (LightGBM) predict how it ends:

  ``test_accuracy``  final held-out accuracy in [0, 1] (regression; R²),
  ``diverged``       the run diverges (``ntk_tt.dynamics._divergence``: non-finite or L_T > L_0),
  ``failed``         diverged, or final held-out accuracy below chance + 0.05,
  ``above_median``   its final held-out accuracy beats the median of its task's runs,
  ``log_t_eps``      log(T_0.1 / T): the loss curve's training time at ε = 0.1 in steps,
                     relative to the planned horizon T (undefined for diverged runs).

One model per target serves every prefix length: each training run enters once per k in
``ks`` (fractions of T) with k/T among its features, and nothing after update k is read
(:func:`outcome_features` truncates first). Inputs (all scalars; NaN where a value does not exist):
hyperparameters (log η, m, log B, log N, B/N, C, log η/(1 − m), k/T), the prefix's loss
(L_0, L_k/L_0, min and max over the prefix relative to L_0, log-slope of the last half),
training accuracy, gradient norm (first, last, max, last/first) and SNR, weight distance and
norm growth, head norm growth, the last snapshot at or before k (softmax saturation, dead-ReLU
fraction, held-out loss and accuracy), and with ``ntk=True`` the NTK prediction's summary
(predicted final training / held-out loss and accuracy, divergence and spike flags, log κ,
predicted T_ε/T, and the real-to-predicted loss ratio at step k: early feedback on the open-
loop prediction).

Final accuracy is a two-part model (:func:`fit_models`): a regressor on the runs that did not
diverge, mixed with the divergence classifier's probability.

Uncertainty: each regression target carries a split-conformal 90 % interval (absolute
residual quantile of out-of-fold predictions on the fitting corpus, per k); classification
targets are probabilities.

Domain: a predictor keeps the range of every input over the rows it was fitted on
(:func:`feature_domain`: smallest and largest value, and whether any was missing); a run
whose inputs leave it (:func:`out_of_domain`: another model, data set or number of classes,
a prefix longer than the fitted ones) is flagged in :meth:`OutcomePredictor.predict`, since
trees do not extrapolate: they answer as for the nearest corpus runs.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import pathlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ntk_tt.telemetry._telemetry import Telemetry, truncate

FORMAT_VERSION = 1
TARGETS = ("test_accuracy", "diverged", "failed", "above_median", "log_t_eps")
REGRESSION = ("test_accuracy", "log_t_eps")
DEFAULT_KS = (0.0, 0.05, 0.1, 0.2)
T_EPS = "0.1"


def _f(a) -> float:
    try:
        v = float(a)
    except (TypeError, ValueError):
        return math.nan
    return v


def _log(a) -> float:
    a = _f(a)
    return math.log(a) if a > 0 and math.isfinite(a) else math.nan


def _ratio(a, b) -> float:
    a, b = _f(a), _f(b)
    return a / b if math.isfinite(a) and math.isfinite(b) and b != 0 else math.nan


def observed_updates(telemetry: Telemetry) -> int:
    """The number of updates a telemetry row covers (len(loss) − 1)."""
    return len(telemetry.loss) - 1


def prefix_length(telemetry: Telemetry, fraction: float) -> int:
    """k = round(fraction · T) updates, T = ``telemetry.steps`` (the planned horizon)."""
    return int(round(float(fraction) * telemetry.steps))


def _telemetry_features(t: Telemetry) -> dict[str, float]:
    k = observed_updates(t)
    loss = np.asarray(t.loss, float)
    l0 = loss[0]
    fin = loss[np.isfinite(loss)]
    half = loss[k // 2:]
    slope = math.nan
    if k >= 2 and np.all(np.isfinite(half)) and np.all(half > 0):
        slope = float(np.polyfit(np.arange(len(half)), np.log(half), 1)[0])
    g = np.asarray(t.grad_norm, float)
    snr = np.asarray(t.grad_snr, float)
    acc = np.asarray(t.accuracy, float)
    out = {
        "log_lr": _log(t.learning_rate), "momentum": float(t.momentum),
        "log_elr": _log(t.learning_rate / (1.0 - t.momentum)),
        "log_batch": _log(t.batch_size), "log_n": _log(t.num_train),
        "batch_frac": t.batch_size / t.num_train, "num_classes": float(t.num_classes),
        "k_frac": k / t.steps, "k": float(k),
        "loss0": l0, "loss_k_rel": _ratio(loss[k], l0),
        "loss_min_rel": _ratio(fin.min(), l0) if fin.size else math.nan,
        "loss_max_rel": _ratio(fin.max(), l0) if fin.size else math.nan,
        "loss_logslope": slope,
        "stopped": float(0 <= t.stopped_at <= k),
        "acc0": acc[0], "acc_k": acc[k], "acc_gain": acc[k] - acc[0],
        "grad_first": g[0] if k else math.nan, "grad_last": g[-1] if k else math.nan,
        "grad_max": np.nanmax(g) if k and np.isfinite(g).any() else math.nan,
        "grad_last_rel": _ratio(g[-1], g[0]) if k else math.nan,
        "snr_mean": np.nanmean(snr) if k and np.isfinite(snr).any() else math.nan,
        "snr_last": snr[-1] if k else math.nan,
        "wdist_k": _f(t.weight_distance[k]),
        "wdist_rel": _ratio(t.weight_distance[k], t.weight_norm[0]),
        "wnorm_growth": _ratio(t.weight_norm[k], t.weight_norm[0]),
        "head_growth": _ratio(t.head_norm[k], t.head_norm[0]),
        "lr_grad": _f(t.learning_rate * g[0]) if k else math.nan,
    }
    snaps = np.flatnonzero(np.asarray(t.snapshot_steps) <= k)
    last = snaps[-1] if snaps.size else None
    for name in ("max_prob_mean", "saturated_fraction", "dead_relu_fraction", "test_loss",
                 "test_accuracy"):
        arr = np.asarray(getattr(t, name), float)
        out[f"snap_{name}"] = arr[last] if last is not None else math.nan
        out[f"snap0_{name}"] = arr[snaps[0]] if snaps.size else math.nan
    out["snap_step_rel"] = (float(t.snapshot_steps[last]) / t.steps if last is not None
                            else math.nan)
    out["snap_test_gain"] = out["snap_test_accuracy"] - out["snap0_test_accuracy"]
    return {k_: _f(v) for k_, v in out.items()}


def _ntk_features(pred: dict, t: Telemetry) -> dict[str, float]:
    k = observed_updates(t)
    loss = np.asarray([_f(a) for a in pred["loss"]])
    tl = pred.get("test_loss")
    te = pred.get("test_error")
    tt = np.asarray(pred.get("training_time", [[math.nan] * 3] * 2), float)
    steps = t.steps
    out = {
        "ntk_loss_T_rel": _ratio(loss[-1], loss[0]),
        "ntk_err_T": _f(pred["error"][-1]),
        "ntk_test_loss_T": _f(tl[-1]) if tl else math.nan,
        "ntk_test_acc_T": 1.0 - _f(te[-1]) if te else math.nan,
        "ntk_diverged": float(bool(pred.get("diverged"))),
        "ntk_spiked": float(_f(pred.get("spiked_at", -1)) >= 0),
        "ntk_log_kappa": _log(pred.get("kappa")),
        "ntk_beyond_edge": float(bool(pred.get("beyond_edge"))),
        "ntk_t01_rel": _f(tt[0, 1]) / steps, "ntk_t04_rel": _f(tt[0, 2]) / steps,
        "ntk_real_over_pred_k": _ratio(t.loss[k], loss[min(k, len(loss) - 1)]),
        "ntk_loss_k_rel": _ratio(loss[min(k, len(loss) - 1)], loss[0]),
    }
    return out


def outcome_features(telemetry: Telemetry, k: int | None = None, prediction: dict | None = None
             ) -> dict[str, float]:
    """The outcome predictor's inputs from the first ``k`` updates of a run.

    Args:
      telemetry: the run's :class:`ntk_tt.Telemetry` (whole or already a prefix).
      k: updates to use (default: all it has); the row is truncated first, so nothing later
        can leak in.
      prediction: the run's NTK prediction (a corpus row's ``"prediction"``: ``loss``,
        ``error`` (T + 1,), ``test_loss``, ``test_error``, ``diverged``, ``spiked_at``,
        ``kappa``, ``beyond_edge``, ``training_time`` (2, 3)); None: telemetry only.

    Returns:
      dict of named float features (NaN where a value does not exist; units in the module
      docstring).

    Raises:
      ValueError: k outside [0, observed updates] (from :func:`truncate`); a prediction
        without ``loss``/``error``.
    """
    if not isinstance(telemetry, Telemetry):
        raise ValueError(f"telemetry must be an ntk_tt.Telemetry, got {type(telemetry).__name__}"
                         "; read a JSON row with ntk_tt.Telemetry.from_dict or "
                         "ntk_tt.load_telemetry.")
    t = telemetry if k is None else truncate(telemetry, k)
    out = _telemetry_features(t)
    if prediction is not None:
        if "loss" not in prediction or "error" not in prediction:
            raise ValueError("prediction must hold the predicted 'loss' and 'error' curves "
                             "(a corpus row's 'prediction').")
        out |= _ntk_features(prediction, t)
    return out


def labels(row: dict) -> dict[str, float]:
    """Targets of one corpus row (``above_median`` needs the task: see :func:`dataset`)."""
    o = row["outcome"]
    t_eps = _f(o["training_time"].get(T_EPS))
    return {
        "test_accuracy": _f(o["test_accuracy"]), "diverged": float(bool(o["diverged"])),
        "failed": float(bool(o["failed"])),
        "log_t_eps": (math.log(max(t_eps, 1.0) / row["steps"])
                      if math.isfinite(t_eps) and not o["diverged"] else math.nan),
    }


@dataclasses.dataclass
class Dataset:
    """Feature matrix of corpus rows × prefixes: ``x`` (R, F) with ``columns``, ``y`` target
    name → (R,), and per-row ``groups``: run id, task id, dataset, config id (B, m, κ̃)."""

    x: np.ndarray
    columns: list[str]
    y: dict[str, np.ndarray]
    meta: dict[str, np.ndarray]


def dataset(rows: Sequence[dict], *, ks: Sequence[float] = DEFAULT_KS, ntk: bool = True
            ) -> Dataset:
    """Featurise corpus rows (``ntk_tt.sweep._corpus``) at each prefix fraction in ``ks``.

    ``above_median`` is 1 when the run's final held-out accuracy beats the median over the
    runs of its task in ``rows``.

    Raises:
      ValueError: no rows, or a fraction outside [0, 1].
    """
    if not rows:
        raise ValueError("no corpus rows given.")
    if any(not 0.0 <= f <= 1.0 for f in ks):
        raise ValueError(f"prefix fractions must lie in [0, 1], got {tuple(ks)}.")
    tele = [Telemetry.from_dict(r["telemetry"]) for r in rows]
    lab = [labels(r) for r in rows]
    by_task: dict[str, list[float]] = {}
    for r, lb in zip(rows, lab, strict=True):
        by_task.setdefault(r["task_id"], []).append(lb["test_accuracy"])
    med = {t: float(np.nanmedian(v)) for t, v in by_task.items()}
    feats, ys, meta = [], {n: [] for n in TARGETS}, {n: [] for n in
                                                   ("run_id", "task_id", "dataset", "config",
                                                    "k_frac")}
    for r, t, lb in zip(rows, tele, lab, strict=True):
        lb = lb | {"above_median": float(lb["test_accuracy"] > med[r["task_id"]])}
        for frac in ks:
            k = min(prefix_length(t, frac), observed_updates(t))
            feats.append(outcome_features(t, k, r.get("prediction") if ntk else None))
            for n in TARGETS:
                ys[n].append(lb[n])
            cfg = f"{r['optimizer']}{r['batch_size'] if r['optimizer'] == 'sgd' else ''}-" \
                  f"n{r['per_class']}-m{r['momentum']:g}-k{r['kappa_eff']:g}"
            for n, v in (("run_id", r["run_id"]), ("task_id", r["task_id"]),
                         ("dataset", r["dataset"]), ("config", cfg), ("k_frac", frac)):
                meta[n].append(v)
    columns = list(feats[0])
    x = np.asarray([[f.get(c, math.nan) for c in columns] for f in feats], np.float64)
    return Dataset(x, columns, {n: np.asarray(v, float) for n, v in ys.items()},
                   {n: np.asarray(v) for n, v in meta.items()})


def _lgbm_params(seed: int) -> dict[str, Any]:
    return dict(n_estimators=150, learning_rate=0.1, num_leaves=7, min_child_samples=10,
                subsample=0.8, subsample_freq=1, colsample_bytree=0.8, reg_lambda=1.0,
                random_state=seed, n_jobs=1, deterministic=True, verbose=-1)


def _fit_one(target: str, x: np.ndarray, y: np.ndarray, seed: int):
    import lightgbm as lgb

    keep = np.isfinite(y)
    if keep.sum() < 2:
        return None  # nothing to learn from: predict the constant
    if target in REGRESSION:
        model = lgb.LGBMRegressor(**_lgbm_params(seed))
    else:
        if len(np.unique(y[keep])) < 2:
            return None  # a constant label: predict its rate
        model = lgb.LGBMClassifier(**_lgbm_params(seed))
    model.fit(x[keep], y[keep])
    return model


def _predict_one(target: str, model, x: np.ndarray, constant: float) -> np.ndarray:
    if model is None:
        return np.full(len(x), constant)
    if target in REGRESSION:
        return model.predict(x)
    return model.predict_proba(x)[:, 1]


def fit_models(x: np.ndarray, y: dict[str, np.ndarray], seed: int = 0
               ) -> tuple[dict[str, Any], dict[str, float]]:
    """One LightGBM model per target on features ``x`` (R, F) and labels ``y`` (target →
    (R,), NaN = unknown, left out): (models, constants). A target with fewer than 2 known
    labels (or one class) gets no model and predicts its constant (mean label).

    Final accuracy is a two-part (hurdle) model: the regressor is fitted on the runs that did
    not diverge, and :func:`predict_models` mixes it with the divergence classifier,
    E[acc] = p_div·acc_div + (1 − p_div)·acc_not_div, acc_div the mean final accuracy of the
    diverged training runs (near chance). A diverged run's accuracy is set by the divergence,
    not by its hyperparameters' smooth trend, and the classifier sees that from the first
    steps (measured on the corpus: README).
    """
    div = y["diverged"] == 1
    models, consts = {}, {}
    for t in TARGETS:
        yt = y[t]
        consts[t] = float(np.nanmean(yt)) if np.isfinite(yt).any() else math.nan
        keep = ~div if t == "test_accuracy" else np.ones(len(yt), bool)
        models[t] = _fit_one(t, x[keep], yt[keep], seed)
        if t == "test_accuracy" and np.isfinite(yt[~div]).any():
            consts[t] = float(np.nanmean(yt[~div]))
    acc = y["test_accuracy"][div]
    consts["acc_diverged"] = (float(np.nanmean(acc)) if np.isfinite(acc).any()
                              else consts["test_accuracy"])
    return models, consts


def predict_models(models: dict[str, Any], consts: dict[str, float], x: np.ndarray
                   ) -> dict[str, np.ndarray]:
    """Predictions (R,) per target from :func:`fit_models`' output: final accuracy (the
    hurdle mixture, clipped to [0, 1]) and log(T_0.1/T) values, probabilities for the
    classification targets."""
    out = {t: _predict_one(t, models[t], x, consts[t]) for t in TARGETS}
    p = out["diverged"]
    acc = np.clip(out["test_accuracy"], 0.0, 1.0)
    out["test_accuracy"] = np.clip(p * consts["acc_diverged"] + (1 - p) * acc, 0.0, 1.0)
    return out


def feature_domain(x: np.ndarray, columns: Sequence[str]) -> dict[str, list]:
    """The range of each input over fitting rows: {column: [low, high, missing]} from a
    feature matrix ``x`` (R, F) in ``columns`` order, low/high the smallest and largest
    non-NaN value (±inf kept: diverged runs have them; NaN when the column is all NaN) and
    missing whether any row is NaN there."""
    x = np.asarray(x, np.float64)
    out = {}
    for j, name in enumerate(columns):
        col = x[:, j]
        seen = col[~np.isnan(col)]
        lo, hi = (float(seen.min()), float(seen.max())) if seen.size else (math.nan, math.nan)
        out[name] = [lo, hi, bool(seen.size < col.size)]
    return out


def out_of_domain(features: dict[str, float], domain: dict[str, list]) -> list[dict]:
    """The inputs of one run (:func:`outcome_features`) outside a predictor's ``domain``
    (:func:`feature_domain`), farthest first.

    Returns:
      one dict per flagged input: ``feature``, ``value`` (None when missing), ``low`` and
      ``high`` (the fitting rows' range), ``by`` (how far outside it, in the feature's units)
      and ``relative`` (``by`` in units of the range's width, of the bound's magnitude when
      the rows held one value); ``by`` and ``relative`` are None when missing or infinite.
      An input is outside when it is below ``low`` or above ``high``, missing (NaN) where no
      fitting row was, or present where every fitting row was missing.
    """
    flagged = []
    for name, (lo, hi, missing) in domain.items():
        v = _f(features.get(name, math.nan))
        if math.isnan(v) or math.isnan(lo):
            if math.isnan(v) == math.isnan(lo) or (math.isnan(v) and missing):
                continue
            by = rel = math.nan
        elif lo <= v <= hi:
            continue
        else:
            bound = lo if v < lo else hi
            by = abs(v - bound)
            width = hi - lo
            rel = by / (width if math.isfinite(width) and width > 0 else max(abs(bound), 1e-12))
        flagged.append({"feature": name, "value": None if math.isnan(v) else v, "low": lo,
                        "high": hi, "by": by, "relative": rel})
    flagged.sort(key=lambda e: -1.0 if math.isnan(e["relative"]) else -e["relative"] - 1.0)
    for e in flagged:
        e["by"], e["relative"] = (None if not math.isfinite(e[k]) else e[k]
                                  for k in ("by", "relative"))
    return flagged


def _domain(doc, columns: Sequence[str]) -> dict[str, list] | None:
    """A predictor file's ``domain`` checked against its columns (None when absent)."""
    if doc is None:
        return None
    if not isinstance(doc, dict) or set(doc) != set(columns) or not all(
            isinstance(v, list) and len(v) == 3 for v in doc.values()):
        raise ValueError("domain is not {column: [low, high, missing]} for every column")
    return {c: [float(doc[c][0]), float(doc[c][1]), bool(doc[c][2])] for c in columns}


@dataclasses.dataclass
class OutcomePredictor:
    """Fitted gradient-boosted outcome models: one per target (see module docstring).

    ``ntk``: whether the NTK prediction's features are inputs. ``intervals``: per regression
    target, {k fraction (str): half-width of the 90 % split-conformal interval}. ``domain``:
    {column: [low, high, missing]} of the fitting rows (:func:`feature_domain`), or None for
    a file written before domains were kept (then nothing is flagged).
    """

    columns: list[str]
    ntk: bool
    ks: tuple[float, ...]
    models: dict[str, Any]
    constants: dict[str, float]
    intervals: dict[str, dict[str, float]]
    info: dict[str, Any]
    domain: dict[str, list] | None = None

    def predict_features(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """Predictions (R,) per target for a feature matrix (R, F) in ``columns`` order:
        accuracy and log(T_0.1/T) values, probabilities for the classification targets."""
        x = np.asarray(x, np.float64)
        if x.ndim != 2 or x.shape[1] != len(self.columns):
            raise ValueError(f"features must be (R, {len(self.columns)}), got {x.shape}.")
        return predict_models(self.models, self.constants, x)

    def predict(self, telemetry: Telemetry, prediction: dict | None = None, *,
                k: int | None = None) -> dict[str, Any]:
        """The predicted outcome of one run from its first k updates (default: all given).

        Returns a dict: ``test_accuracy`` with ``test_accuracy_interval`` (90 %),
        ``p_diverged``, ``p_failed``, ``p_above_median``, ``t_eps_0.1`` in steps with its 90 %
        interval, ``observed_updates`` k and ``steps`` T, and ``out_of_domain``: the inputs
        outside the range of the corpus the predictor was fitted on (:func:`out_of_domain`;
        [] when none, None when the predictor keeps no domain). A flagged run's numbers are
        extrapolations: the trees answer as for the nearest corpus runs.

        Raises:
          ValueError: a predictor with NTK features given no ``prediction``; k out of range.
        """
        if self.ntk and prediction is None:
            raise ValueError("this outcome predictor uses the NTK prediction's features: pass "
                             "the run's prediction, or use a telemetry-only predictor "
                             "(ntk=False).")
        feats = outcome_features(telemetry, k, prediction if self.ntk else None)
        x = np.asarray([[feats.get(c, math.nan) for c in self.columns]])
        p = {t: float(v[0]) for t, v in self.predict_features(x).items()}
        frac = feats["k_frac"]
        steps = telemetry.steps

        def half(target):
            table = self.intervals.get(target, {})
            if not table:
                return math.nan
            nearest = min(table, key=lambda s: abs(float(s) - frac))
            return table[nearest]

        ha, ht = half("test_accuracy"), half("log_t_eps")
        acc = p["test_accuracy"]
        t_eps = steps * math.exp(p["log_t_eps"])
        return {
            "observed_updates": int(feats["k"]), "steps": steps,
            "test_accuracy": acc,
            "test_accuracy_interval": [max(0.0, acc - ha), min(1.0, acc + ha)],
            "p_diverged": p["diverged"], "p_failed": p["failed"],
            "p_above_median": p["above_median"],
            f"t_eps_{T_EPS}": t_eps,
            f"t_eps_{T_EPS}_interval": [t_eps * math.exp(-ht), t_eps * math.exp(ht)],
            "out_of_domain": None if self.domain is None else out_of_domain(feats,
                                                                             self.domain),
        }

    def save(self, path: str | pathlib.Path) -> None:
        """Write the predictor as JSON (LightGBM models as their text form); ``.gz``:
        gzip-compressed."""
        doc = {"format_version": FORMAT_VERSION, "columns": self.columns, "ntk": self.ntk,
               "ks": list(self.ks), "constants": self.constants, "intervals": self.intervals,
               "info": self.info, "domain": self.domain,
               "models": {t: None if m is None else m.booster_.model_to_string()
                          for t, m in self.models.items()}}
        text = json.dumps(doc)
        path = pathlib.Path(path)
        if path.suffix == ".gz":
            with gzip.open(path, "wt", encoding="utf-8") as fh:
                fh.write(text)
        else:
            path.write_text(text, encoding="utf-8")

    @classmethod
    def load(cls, path: str | pathlib.Path) -> OutcomePredictor:
        """Read a predictor written by :meth:`save`.

        Raises:
          ValueError: not an outcome predictor file, or another format version.
          OSError: unreadable path.
        """
        import lightgbm as lgb

        path = pathlib.Path(path)
        try:
            if path.suffix == ".gz":
                with gzip.open(path, "rt", encoding="utf-8") as fh:
                    doc = json.load(fh)
            else:
                doc = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, gzip.BadGzipFile, EOFError) as err:
            raise ValueError(f"{path} is not an outcome predictor file ({err}).") from None
        if not isinstance(doc, dict) or doc.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{path} is not an outcome predictor of format version "
                             f"{FORMAT_VERSION}; refit it with ntk_tt.fit_outcome.")
        try:
            columns = list(doc["columns"])
            models = {t: None if doc["models"][t] is None
                      else _Booster(lgb.Booster(model_str=doc["models"][t]), t)
                      for t in TARGETS}
            for t, m in models.items():
                if m is not None and m.booster_.num_feature() != len(columns):
                    raise ValueError(f"model {t!r} reads {m.booster_.num_feature()} features, "
                                     f"the file names {len(columns)} columns")
            out = cls(columns, bool(doc["ntk"]), tuple(float(k) for k in doc["ks"]), models,
                      {k: float(v) for k, v in doc["constants"].items()}, doc["intervals"],
                      doc["info"], _domain(doc.get("domain"), columns))
            missing = set(TARGETS) - set(out.constants)
            if missing:
                raise ValueError(f"constants miss {sorted(missing)}")
        except (KeyError, TypeError, ValueError, AttributeError, lgb.basic.LightGBMError) as err:
            raise ValueError(f"{path} is a damaged outcome predictor file ({type(err).__name__}: "
                             f"{err}); refit it with ntk_tt.fit_outcome.") from None
        return out


class _Booster:
    """A loaded LightGBM booster behind the sklearn-style calls :class:`OutcomePredictor`
    makes (``predict`` / ``predict_proba``)."""

    def __init__(self, booster, target: str):
        self.booster_ = booster
        self.target = target

    def predict(self, x):
        return self.booster_.predict(x)

    def predict_proba(self, x):
        p = self.booster_.predict(x)
        return np.stack([1 - p, p], axis=1)


def fit_outcome(rows: Sequence[dict] | Dataset, *, ntk: bool = True,
                ks: Sequence[float] = DEFAULT_KS, seed: int = 0, folds: int = 5,
                level: float = 0.9) -> OutcomePredictor:
    """Fit the outcome predictor on corpus rows (or an already featurised :class:`Dataset`).

    The 90 % (``level``) intervals come from ``folds``-fold out-of-fold residuals, folds
    grouped by run (every prefix of a run in one fold), per prefix fraction.

    Raises:
      ValueError: no rows; ``level`` outside (0, 1); fewer than 2 folds.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}.")
    if folds < 2:
        raise ValueError(f"folds must be >= 2, got {folds}.")
    data = rows if isinstance(rows, Dataset) else dataset(rows, ks=ks, ntk=ntk)
    models, consts = fit_models(data.x, data.y, seed)
    runs = np.unique(data.meta["run_id"])
    rng = np.random.default_rng(seed)
    fold_of = dict(zip(rng.permutation(runs), np.arange(len(runs)) % folds, strict=True))
    fold = np.asarray([fold_of[r] for r in data.meta["run_id"]])
    oof = {t: np.full(len(fold), math.nan) for t in REGRESSION}
    for f in range(folds):
        tr, te = fold != f, fold == f
        pred = predict_models(*fit_models(data.x[tr], {k: v[tr] for k, v in data.y.items()},
                                          seed), data.x[te])
        for t in REGRESSION:
            oof[t][te] = pred[t]
    intervals: dict[str, dict[str, float]] = {}
    for t in REGRESSION:
        res = np.abs(oof[t] - data.y[t])
        intervals[t] = {}
        for frac in np.unique(data.meta["k_frac"]):
            r = res[(data.meta["k_frac"] == frac) & np.isfinite(res)]
            if r.size:
                q = min(1.0, math.ceil((r.size + 1) * level) / r.size)
                intervals[t][f"{float(frac):g}"] = float(np.quantile(r, q))
    info = {"runs": int(len(runs)), "rows": int(len(fold)), "level": level, "seed": seed,
            "lightgbm": _lgbm_params(seed)}
    return OutcomePredictor(data.columns, ntk, tuple(float(k) for k in ks), models, consts,
                            intervals, info, feature_domain(data.x, data.columns))


def parametric_baseline(telemetry: Telemetry, k: int) -> dict[str, float]:
    """Extrapolate the observed training-loss prefix L_0..L_k to the horizon T.

    Fits L(t) = c + a·exp(−b t) and L(t) = c + a·(t + 1)^(−b) (a, b ≥ 0, c ≥ 0) by least
    squares (``scipy.optimize.curve_fit``) and keeps the better fit; with k < 3 it
    extrapolates the last log-linear step. Returns the extrapolated final loss relative to
    L_0 (``loss_T_rel``; ∞ when the prefix is non-finite) and the T_0.1 of the extrapolated
    curve in steps (``t_eps``, NaN where undefined). The baseline issue 11 asks the outcome
    predictors to beat (README: "Telemetry and outcome prediction").

    Raises:
      ValueError: k not in [0, recorded updates] (:func:`ntk_tt.truncate`).
    """
    from scipy.optimize import curve_fit

    from ntk_tt.dynamics._training_time import training_time_report

    t = truncate(telemetry, int(k))
    loss = np.asarray(t.loss, float)
    steps = telemetry.steps
    grid = np.arange(steps + 1, dtype=float)
    if not np.all(np.isfinite(loss)) or t.stopped_at >= 0:
        return {"loss_T_rel": math.inf, "t_eps": math.nan}
    l0 = loss[0]
    if k < 3:
        r = loss[-1] / l0 if k else 1.0
        rate = r ** (1.0 / max(k, 1))
        curve = l0 * rate ** grid if rate < 1 else np.full_like(grid, loss[-1])
    else:
        ts = np.arange(k + 1, dtype=float)
        best, curve = math.inf, None
        forms = (lambda s, a, b, c: c + a * np.exp(-b * s),
                 lambda s, a, b, c: c + a * (s + 1.0) ** (-b))
        for form in forms:
            try:
                p, _ = curve_fit(form, ts, loss, p0=(max(l0 - loss[-1], 1e-3), 0.1,
                                                     max(loss[-1] * 0.5, 0.0)),
                                 bounds=([0, 0, 0], [np.inf, 10.0, np.inf]), maxfev=2000)
            except (RuntimeError, ValueError):
                continue
            err = float(np.sum((form(ts, *p) - loss) ** 2))
            if err < best:
                best, curve = err, form(grid, *p)
        if curve is None:
            curve = np.full_like(grid, loss[-1])
    return {"loss_T_rel": float(curve[-1] / l0), "t_eps": training_time_report(curve, 0.1)[0]}


def load_runs(path: str | pathlib.Path) -> Iterable[tuple[Telemetry, dict | None]]:
    """Runs to predict from a JSON Lines (``.gz`` too) or JSON file: each line (or the JSON
    list's items, or the single object) either a bare telemetry row
    (:meth:`ntk_tt.Telemetry.to_dict`) or a corpus row ``{"telemetry": {...}, "prediction":
    {...}}``. Yields (telemetry, prediction or None).

    Raises:
      ValueError: unreadable JSON, or a row that is neither form (with its line number).
    """
    path = pathlib.Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            text = fh.read()
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as err:
        raise ValueError(f"{path}: not a text JSON file ({err}).") from None
    try:
        doc = json.loads(text)
        items = doc if isinstance(doc, list) else [doc]
        numbered = list(enumerate(items, 1))
    except json.JSONDecodeError:
        numbered = []
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    numbered.append((i, json.loads(line)))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}, line {i}: not JSON ({err.msg}).") from None
    if not numbered:
        raise ValueError(f"{path} holds no runs.")
    out = []
    for i, item in numbered:
        if not isinstance(item, dict):
            raise ValueError(f"{path}, row {i}: expected a JSON object, got "
                             f"{type(item).__name__}.")
        row = item.get("telemetry", item)
        try:
            tele = Telemetry.from_dict(row)
        except (ValueError, TypeError, KeyError) as err:
            raise ValueError(f"{path}, row {i}: {err}") from None
        out.append((tele, item.get("prediction")))
    return out


def default_outcome_predictor(ntk: bool = False) -> OutcomePredictor:
    """The shipped predictor fitted on the issue-11 corpus (``ntk_tt/assets``): the
    telemetry-only one (``ntk=False``) or the one that also reads the NTK prediction.

    Raises:
      FileNotFoundError: the asset is missing from this installation.
    """
    from importlib.resources import files

    name = "outcome_ntk.json.gz" if ntk else "outcome_telemetry.json.gz"
    return OutcomePredictor.load(pathlib.Path(str(files("ntk_tt") / "assets" / name)))
