"""Early-telemetry outcome prediction (issue 11, METHOD.md §9; arXiv 2608.03709).

From what a run has shown in its first k updates (its :class:`ntk_tt.Telemetry`, truncated by
:func:`ntk_tt.telemetry._telemetry.truncate`), optionally with the head-aware NTK prediction of the
same run made before training, gradient-boosted trees (LightGBM) predict how it ends:

  ``test_accuracy``  final held-out accuracy in [0, 1] (regression; R²),
  ``diverged``       the run diverges (``ntk_tt.dynamics._divergence``: non-finite or L_T > L_0),
  ``failed``         diverged, or final held-out accuracy below chance + 0.05,
  ``above_median``   its final held-out accuracy beats the median of its task's runs,
  ``log_t_eps``      log(T_0.1 / T): the loss curve's training time at ε = 0.1 in steps,
                     relative to the planned horizon T (undefined for diverged runs).

The inputs and labels: ``ntk_tt.telemetry._outcome_features``; the boosted models (final
accuracy a two-part model): ``ntk_tt.telemetry._outcome_fit``; the fitting corpus's range and
the runs outside it: ``ntk_tt.telemetry._outcome_domain``. Here: :class:`OutcomePredictor`
(fit, predict, save, load), the shipped ones, the runs file reader, the parametric baseline.

Uncertainty: each regression target carries a split-conformal interval of coverage ``level``
(default 90 %; absolute residual quantile of out-of-fold predictions on the fitting corpus, per
k); classification targets are probabilities.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ntk_tt._options import file_path
from ntk_tt._output_paths import require_folder
from ntk_tt.telemetry._outcome_domain import feature_domain, loss_out_of_domain, out_of_domain
from ntk_tt.telemetry._outcome_features import (
    DEFAULT_KS,
    REGRESSION,
    T_EPS,
    TARGETS,
    Dataset,
    check_fit_args,
    check_rows,
    dataset,
    outcome_features,
    run_labels,
)
from ntk_tt.telemetry._outcome_fit import _lgbm_params, check_fit_labels, fit_models, predict_models
from ntk_tt.telemetry._telemetry import Telemetry, truncate

FORMAT_VERSION = 1


@dataclasses.dataclass
class OutcomePredictor:
    """Fitted gradient-boosted outcome models: one per target (see module docstring).

    ``ntk``: whether the NTK prediction's features are inputs. ``intervals``: per regression target,
    {k fraction (str): half-width of the split-conformal interval, coverage ``info["level"]``}.
    ``info``: counts, settings and ``loss_names``, the losses of the fitting runs. ``domain``:
    {column: [low, high, missing]} of the fitting rows (:func:`feature_domain`), or None for a file
    written before domains were kept (then nothing is flagged).

    Source: arXiv 2608.03709 (METHOD.md §9), with ntk_tt's targets and NTK features (issue 11).
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

        Returns a dict: ``test_accuracy`` with ``test_accuracy_interval`` (coverage
        ``info["level"]``), ``p_diverged``, ``p_failed``, ``p_above_median``, ``t_eps_0.1`` in steps
        with its interval, both within [1, T] (None and [None, None] when ``p_diverged`` ≥ 0.5:
        a run expected to diverge has no training time, as ``ntk-tt outcome`` says),
        ``observed_updates`` k and
        ``steps`` T, and ``out_of_domain``: the inputs outside the range of the corpus the predictor
        was fitted on (:func:`out_of_domain`; first ``loss_is_mse`` when the run's loss is not the
        fitting runs', :func:`loss_out_of_domain`; [] when none, None when the predictor keeps no
        domain). A flagged run's numbers are extrapolations: the trees answer as for the nearest
        corpus runs.

        Raises:
          ValueError: a predictor with NTK features given no ``prediction``, one without
            them given one (it was silently unused: the first k updates are ``k=``, by
            keyword), a ``prediction`` not a dict; k out of range; a telemetry
            :meth:`ntk_tt.Telemetry.from_dict` would refuse.
        """
        if prediction is not None and not isinstance(prediction, dict):
            raise ValueError(f"prediction must be the run's NTK prediction (a dict: a corpus "
                             f"row's 'prediction') or None, got {type(prediction).__name__}; "
                             "the number of updates to read is k=, by keyword.")
        if prediction is not None and not self.ntk:
            raise ValueError("this outcome predictor uses no NTK features (ntk=False), so the "
                             "prediction given would be unused: drop it (the number of updates "
                             "to read is k=, by keyword), or use a predictor fitted with "
                             "ntk=True.")
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
        # T_ε of a run is in [1, T] steps (its fitting target, log(max(T_ε, 1) / T), too): a
        # fresh user's 1-step run was given T_0.1 = 0.58 steps
        def within(t):
            return min(max(t, 1.0), float(steps))

        t_eps = steps * math.exp(p["log_t_eps"])
        band = [within(t_eps * math.exp(-ht)), within(t_eps * math.exp(ht))]
        t_eps = within(t_eps)
        if p["diverged"] >= 0.5:  # expected to diverge: no training time
            t_eps, band = None, [None, None]
        return {
            "observed_updates": int(feats["k"]), "steps": steps,
            "test_accuracy": acc,
            "test_accuracy_interval": [max(0.0, acc - ha), min(1.0, acc + ha)],
            "p_diverged": p["diverged"], "p_failed": p["failed"],
            "p_above_median": p["above_median"],
            f"t_eps_{T_EPS}": t_eps,
            f"t_eps_{T_EPS}_interval": band,
            "out_of_domain": None if self.domain is None else (
                loss_out_of_domain(telemetry.loss_name, self.info)
                + out_of_domain(feats, self.domain)),
        }

    def save(self, path: str | pathlib.Path, *, overwrite: bool = False) -> None:
        """Write the predictor as JSON (LightGBM models as their text form); ``.gz``:
        gzip-compressed.

        Args:
          path: the file to write (str or os.PathLike, ``~`` expanded).
          overwrite: True replaces an existing file; False (default) refuses it (as
            :func:`ntk_tt.save_telemetry` and :func:`ntk_tt.save_checkpoint`).

        Raises:
          ValueError: ``path`` not a str or os.PathLike, its folder missing, or ``path``
            exists and ``overwrite`` is not True. Nothing is written then.
        """
        path = file_path(path, "outcome predictor", "predictor.save('outcome.json.gz')")
        require_folder(path, "outcome predictor")
        if path.exists() and overwrite is not True:
            raise ValueError(f"outcome predictor path {path} exists; pass overwrite=True to "
                             "replace it, or give a new file name. Nothing was written.")
        doc = {"format_version": FORMAT_VERSION, "columns": self.columns, "ntk": self.ntk,
               "ks": list(self.ks), "constants": self.constants, "intervals": self.intervals,
               "info": self.info, "domain": self.domain,
               "models": {t: None if m is None else m.booster_.model_to_string()
                          for t, m in self.models.items()}}
        text = json.dumps(doc)
        if path.suffix == ".gz":
            with gzip.open(path, "wt", encoding="utf-8") as fh:
                fh.write(text)
        else:
            path.write_text(text, encoding="utf-8")

    @classmethod
    def load(cls, path: str | pathlib.Path) -> OutcomePredictor:
        """Read a predictor written by :meth:`save`.

        Raises:
          ValueError: ``path`` not a str or os.PathLike (``~`` is expanded), not a file, not an
            outcome predictor file, or another format version.
          OSError: unreadable path.
        """
        import lightgbm as lgb

        from ntk_tt.telemetry._outcome_domain import _domain
        from ntk_tt.telemetry._outcome_fit import _Booster

        path = file_path(path, "outcome predictor", "OutcomePredictor.load('outcome.json.gz')")
        if not path.is_file():
            raise ValueError(f"{path} is not a file: give the path of an outcome predictor "
                             "that OutcomePredictor.save wrote.")
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


def fit_outcome(rows: Sequence[dict] | Dataset, *, ntk: bool = True,
                ks: Sequence[float] = DEFAULT_KS, seed: int = 0, folds: int = 5,
                level: float = 0.9) -> OutcomePredictor:
    """Fit the outcome predictor on corpus rows (or an already featurised :class:`Dataset`).

    Source: arXiv 2608.03709 (METHOD.md §9), with ntk_tt's targets and NTK features (issue 11).

    Args:
      rows: corpus rows (dicts: ``ntk_tt.read_corpus``), or a :class:`Dataset`
        (then ``ntk`` and ``ks`` are only recorded: pass those it was built with).
      ntk: whether the runs' NTK predictions (``row["prediction"]``) are inputs too.
      ks: prefix fractions; each run is featurised after round(frac·T) updates.
      seed: LightGBM's ``random_state`` and the folds' draw.
      folds: the number of cross-validation folds, grouped by run (all its prefixes in one).
      level: coverage of the split-conformal intervals (out-of-fold residuals per fraction).

    Returns:
      The fitted :class:`OutcomePredictor` (``models``, ``constants``: as :func:`fit_models`'s).

    Raises:
      ValueError: no rows; ``level`` not in (0, 1); ``folds`` not an integer >= 2; ``seed`` not one
        in [0, 2**31); ``ks`` not distinct fractions in [0, 1]; ``ntk`` not a bool; ``rows`` a path,
        a single row (a dict) or not a sequence; a row that is not a dict, lacks a field it needs
        (the first such row is named, with the fields it lacks), has a numeric field (kappa_eff,
        momentum, per_class, steps, batch_size) that is not a real number or out of range, or an
        outcome of the wrong kind (diverged not a bool, accuracy outside [0, 1], T_ε outside [0,
        steps]; row and field named); fewer runs than ``folds``, fewer than 20 rows (runs × ``ks``),
        or a classification target (diverged, failed, above_median) whose runs are all of one class
        (:func:`check_fit_labels`), all before any featurising or fitting (a :class:`Dataset`:
        before any fitting); with ``ntk`` True, a row without its NTK ``prediction`` (a dict);
        a row's telemetry that :meth:`ntk_tt.Telemetry.from_dict` refuses.
    """
    check_fit_args(level, folds, seed, ks, ntk)
    if isinstance(rows, Dataset):
        data = rows
        check_fit_labels(data.y, data.meta["run_id"], len(data.x), folds)
    else:
        rows = check_rows(rows)
        lacking = [i for i, r in enumerate(rows) if ntk and not isinstance(r.get("prediction"),
                                                                           dict)]
        if lacking:  # its NTK inputs were NaN in every row, the predictor none the wiser
            raise ValueError(f"ntk=True reads each row's NTK prediction, but rows[{lacking[0]}]"
                             f" has none ({len(lacking)} of the {len(rows)} rows): give rows "
                             "with their 'prediction' (as run_corpus writes them) or fit with "
                             "ntk=False.")
        lab = run_labels(rows)  # cheap: the featurising and fitting come after the checks
        check_fit_labels({t: np.asarray([lb[t] for lb in lab]) for t in TARGETS},
                         np.asarray([r["run_id"] for r in rows]), len(rows) * len(ks), folds)
        data = dataset(rows, ks=ks, ntk=ntk)
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
    losses = data.meta.get("loss_name")
    info = {"runs": int(len(runs)), "rows": int(len(fold)), "level": level, "seed": seed,
            "lightgbm": _lgbm_params(seed),
            "loss_names": None if losses is None else sorted({str(n) for n in losses})}
    return OutcomePredictor(data.columns, ntk, tuple(float(k) for k in ks), models, consts,
                            intervals, info, feature_domain(data.x, data.columns))


def parametric_baseline(telemetry: Telemetry, k: int) -> dict[str, float]:
    """Extrapolate the observed training-loss prefix L_0..L_k to the horizon T.

    Fits L(t) = c + a·exp(−b t) and L(t) = c + a·(t + 1)^(−b) (a, b ≥ 0, c ≥ 0) by least squares
    (``scipy.optimize.curve_fit``), keeping the better; with k < 3, the last log-linear step.

    Source: ntk_tt's own: the baseline issue 11 asks the outcome predictors to beat (README
    "Telemetry and outcome prediction"; METHOD.md §9).

    Args:
      telemetry: one run's :class:`ntk_tt.Telemetry` (T = its ``steps``).
      k: the number of updates observed (the prefix's length).

    Returns:
      {"loss_T_rel": extrapolated L_T / L_0, ∞ if the prefix is non-finite or the run stopped
      in it; "t_eps": the extrapolated curve's T_0.1 in steps, NaN if undefined}.

    Raises:
      ValueError: k not in [0, recorded updates] (:func:`ntk_tt.truncate`).
    """
    from scipy.optimize import curve_fit

    from ntk_tt.dynamics._training_time import training_time_report

    t = truncate(telemetry, k)  # int(k) took 2.7 as 2 and True as 1: truncate refuses them
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


def default_outcome_predictor(ntk: bool = False) -> OutcomePredictor:
    """The shipped predictor fitted on the issue-11 corpus (``ntk_tt/assets``).

    Source: ntk_tt's own fits (issue 11) of the method of arXiv 2608.03709; METHOD.md §9.

    Args:
      ntk: False: the telemetry-only one; True: the one that also reads the NTK prediction.

    Returns:
      The loaded :class:`OutcomePredictor`.

    Raises:
      ValueError: the asset is missing (not a file) or damaged (:meth:`OutcomePredictor.load`).
    """
    from importlib.resources import files

    name = "outcome_ntk.json.gz" if ntk else "outcome_telemetry.json.gz"
    return OutcomePredictor.load(pathlib.Path(str(files("ntk_tt") / "assets" / name)))
