"""Inputs and labels of the outcome predictors (``ntk_tt.telemetry._outcome``; METHOD.md §9).

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
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ntk_tt._options import _is_int, a_type, is_real
from ntk_tt.telemetry._prediction_checks import check_prediction
from ntk_tt.telemetry._telemetry import Telemetry, check_telemetry, truncate

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

    Source: the early-telemetry signals of arXiv 2608.03709 (METHOD.md §9); the NTK
    prediction's features (the closed loop) are ntk_tt's own (issue 11).

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
        that is not one ntk_tt writes (``check_prediction``: a field missing, of the wrong
        type, length or range, named); a telemetry :meth:`Telemetry.from_dict` would refuse
        (built directly, e.g. with ``dataclasses.replace``: ``check_telemetry``).
    """
    if not isinstance(telemetry, Telemetry):
        raise ValueError(f"telemetry must be an ntk_tt.Telemetry, got {type(telemetry).__name__}"
                         "; read a JSON row with ntk_tt.Telemetry.from_dict or "
                         "ntk_tt.load_telemetry.")
    check_telemetry(telemetry)
    t = telemetry if k is None else truncate(telemetry, k)
    out = _telemetry_features(t)
    if prediction is not None:
        check_prediction(prediction, t.steps)
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


def run_labels(rows: Sequence[dict]) -> list[dict[str, float]]:
    """Every target of each corpus row (:func:`labels`, and ``above_median``: the run's final
    held-out accuracy beats the median over the runs of its task in ``rows``).

    Raises:
      ValueError: no rows.
    """
    if not rows:
        raise ValueError("no corpus rows given.")
    lab = [labels(r) for r in rows]
    by_task: dict[str, list[float]] = {}
    for r, lb in zip(rows, lab, strict=True):
        by_task.setdefault(r["task_id"], []).append(lb["test_accuracy"])
    # a task whose runs all lack an accuracy has no median (NaN, without numpy's warning)
    med = {t: float(np.nanmedian(v)) if not np.isnan(v).all() else math.nan
           for t, v in by_task.items()}
    return [lb | {"above_median": math.nan if math.isnan(lb["test_accuracy"])
                  else float(lb["test_accuracy"] > med[r["task_id"]])}
            for r, lb in zip(rows, lab, strict=True)]


@dataclasses.dataclass
class Dataset:
    """Feature matrix of corpus rows × prefixes: ``x`` (R, F) with ``columns``, ``y`` target
    name → (R,), and per-row ``meta``: run id, task id, dataset, config id (B, m, κ̃), prefix
    fraction and the run's ``loss_name``."""

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
    if any(not 0.0 <= f <= 1.0 for f in ks):
        raise ValueError(f"prefix fractions must lie in [0, 1], got {tuple(ks)}.")
    lab = run_labels(rows)
    tele = []
    for i, r in enumerate(rows):
        try:
            tele.append(Telemetry.from_dict(r["telemetry"]))
        except ValueError as err:  # name the row (the corpus has a thousand)
            raise ValueError(f"rows[{i}]['telemetry']: {err}") from None
    feats, ys, meta = [], {n: [] for n in TARGETS}, {n: [] for n in
                                                   ("run_id", "task_id", "dataset", "config",
                                                    "k_frac", "loss_name")}
    for r, t, lb in zip(rows, tele, lab, strict=True):
        for frac in ks:
            k = min(prefix_length(t, frac), observed_updates(t))
            feats.append(outcome_features(t, k, r.get("prediction") if ntk else None))
            for n in TARGETS:
                ys[n].append(lb[n])
            cfg = f"{r['optimizer']}{r['batch_size'] if r['optimizer'] == 'sgd' else ''}-" \
                  f"n{r['per_class']}-m{r['momentum']:g}-k{r['kappa_eff']:g}"
            for n, v in (("run_id", r["run_id"]), ("task_id", r["task_id"]),
                         ("dataset", r["dataset"]), ("config", cfg), ("k_frac", frac),
                         ("loss_name", t.loss_name)):
                meta[n].append(v)
    columns = list(feats[0])
    x = np.asarray([[f.get(c, math.nan) for c in columns] for f in feats], np.float64)
    return Dataset(x, columns, {n: np.asarray(v, float) for n, v in ys.items()},
                   {n: np.asarray(v) for n, v in meta.items()})


_ROW_FIELDS = ("telemetry", "outcome", "steps", "run_id", "task_id", "dataset", "optimizer",
               "per_class", "momentum", "kappa_eff")
_OUTCOME_FIELDS = ("test_accuracy", "diverged", "failed", "training_time")
# read as numbers (the config id formats them with :g, labels divide by steps)
_NUMERIC_FIELDS = ("kappa_eff", "momentum", "per_class", "steps", "batch_size")


def _shown(value) -> str:
    """A number's repr, else the type (with a short string's repr): one short line."""
    if is_real(value):
        return repr(value)
    short = isinstance(value, str) and len(value) <= 20
    return a_type(value) + (f" ({value!r})" if short else "")


def check_fit_args(level, folds, seed, ks=DEFAULT_KS, ntk=True) -> None:
    """:func:`ntk_tt.fit_outcome`'s ``level`` a number in (0, 1), ``folds`` an integer >= 2,
    ``seed`` one in [0, 2**31), ``ks`` distinct fractions in [0, 1] and ``ntk`` a bool
    (ValueError naming the argument; a string such as "0.9" is refused)."""
    if isinstance(ks, (str, bytes)) or not isinstance(ks, Iterable) or not (ks := list(ks)) \
            or not all(is_real(f) and 0 <= f <= 1 for f in ks) or len(set(ks)) < len(ks):
        shown = repr(ks) if isinstance(ks, list) and len(repr(ks)) <= 60 else _shown(ks)
        raise ValueError(f"ks must be a non-empty list of distinct prefix fractions in [0, 1] "
                         f"(e.g. ks=(0.0, 0.1)), got {shown}.")
    if not isinstance(ntk, (bool, np.bool_)):
        raise ValueError(f"ntk must be True or False (use the NTK prediction's features), got "
                         f"{_shown(ntk)}.")
    if not is_real(level) or not 0.0 < level < 1.0:
        raise ValueError(f"level must be a number in (0, 1), the intervals' coverage (e.g. "
                         f"level=0.9, not a string), got {_shown(level)}.")
    if not (is_real(folds) and isinstance(folds, (int, np.integer))) or folds < 2:
        raise ValueError(f"folds must be an integer >= 2, the number of cross-validation folds "
                         f"(e.g. folds=5, not a string), got {_shown(folds)}.")
    check_seed(seed, "fit_outcome")


def check_seed(seed, where: str) -> None:
    """``seed`` an integer in [0, 2**31): LightGBM's ``random_state`` and the fold draw's
    ``numpy.random.default_rng`` (ValueError naming ``where``; a float such as 1.5 or a bool is
    refused, not passed on)."""
    if not _is_int(seed) or not 0 <= seed < 2**31:
        raise ValueError(f"{where} needs seed, an integer in [0, 2**31) (LightGBM's "
                         f"random_state), got {seed!r}.")


def check_rows(rows) -> list:
    """``rows`` as a list, each a dict with the fields :func:`ntk_tt.fit_outcome` reads, its
    numeric ones real numbers (ValueError naming the first row that is not, and what it lacks
    or which field is not a number)."""
    if isinstance(rows, Mapping):
        raise ValueError("rows is a single dict (one corpus row?), but fit_outcome takes a list "
                         "of corpus rows: pass a list, e.g. fit_outcome([row, ...]) or the list "
                         "ntk_tt.read_corpus(path) returns.")
    if isinstance(rows, (str, bytes, pathlib.PurePath)) or not isinstance(rows, Iterable):
        raise ValueError(f"rows must be a list of corpus rows (dicts), got {type(rows).__name__}"
                         "; read a corpus file with ntk_tt.read_corpus(path).")
    rows, bad = list(rows), []
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise ValueError(f"rows[{i}] is {type(r).__name__}, not a corpus row (a dict, as "
                             "ntk_tt.read_corpus returns).")
        lack = [f for f in _ROW_FIELDS if f not in r] + (
            ["batch_size"] if r.get("optimizer") == "sgd" and "batch_size" not in r else [])
        if "outcome" in r:
            out = r["outcome"]
            lack += ([f"outcome.{f}" for f in _OUTCOME_FIELDS if f not in out]
                     if isinstance(out, dict) else ["outcome (a dict)"])
        bad += [(i, lack)] if lack else []
    if bad:
        (i, lack), more = bad[0], len(bad) - 1
        raise ValueError(
            f"rows[{i}] lacks the field(s) {', '.join(lack)} that fit_outcome needs"
            + (f" ({more} more of the {len(rows)} rows lack fields too)" if more else "")
            + f"; a corpus row (ntk_tt.read_corpus) holds {', '.join(_ROW_FIELDS)}"
            f", batch_size (sgd), and outcome: {', '.join(_OUTCOME_FIELDS)}.")
    for i, r in enumerate(rows):
        for f in _NUMERIC_FIELDS:
            if f == "batch_size" and r.get(f) is None and r["optimizer"] != "sgd":
                continue  # gd: batch_size may be absent or None
            if f in r and not is_real(r[f]):
                raise ValueError(f"rows[{i}][{f!r}] must be a real number, got {_shown(r[f])}"
                                 f"; store {', '.join(_NUMERIC_FIELDS)} as numbers in the "
                                 "corpus rows (e.g. 0.5, not '0.5').")
        _check_row_values(i, r)
    return rows


def _whole(v) -> bool:
    return math.isfinite(v) and v >= 1 and float(v).is_integer()


# what each field of a corpus row must be (checked after the fields are known to be numbers)
_RANGES = {"kappa_eff": (lambda v: math.isfinite(v) and v > 0, "a finite number > 0"),
           "momentum": (lambda v: 0 <= v < 1, "in [0, 1)"),
           "per_class": (_whole, "a whole number >= 1"), "steps": (_whole, "a whole number >= 1"),
           "batch_size": (_whole, "a whole number >= 1 (None for gd)")}


def _check_row_values(i: int, r: dict) -> None:
    """A corpus row's numbers in range and its outcome of the kinds :func:`labels` reads
    (ValueError naming the row and the field; NaN or None = unknown accuracy or T_ε)."""
    def refuse(field: str, value, want: str):
        raise ValueError(f"rows[{i}]{field} must be {want}, got {_shown(value)}; a corpus row "
                         "(ntk_tt.read_corpus) holds them so.")
    for f, (ok, want) in _RANGES.items():
        if r.get(f) is not None and not ok(r[f]):
            refuse(f"[{f!r}]", r[f], want)
    tele = r["telemetry"]
    if isinstance(tele, dict) and is_real(tele.get("steps")) and tele["steps"] != r["steps"]:
        refuse("['steps']", r["steps"], f"the telemetry's steps ({tele['steps']})")
    for f in ("run_id", "task_id"):
        if not isinstance(r[f], str) or not r[f]:
            refuse(f"[{f!r}]", r[f], "a non-empty string (it groups the rows)")
    o = r["outcome"]
    for f in ("diverged", "failed"):
        if not (isinstance(o[f], (bool, np.bool_)) or (is_real(o[f]) and o[f] in (0, 1))):
            refuse(f"['outcome'][{f!r}]", o[f], "True or False")
    if not isinstance(o["training_time"], dict):
        refuse("['outcome']['training_time']", o["training_time"], "a dict {ε: T_ε in steps}")
    acc = o["test_accuracy"]
    if acc is not None and not (is_real(acc) and (math.isnan(acc) or 0 <= acc <= 1)):
        refuse("['outcome']['test_accuracy']", acc, "a fraction in [0, 1] (None or NaN: unknown)")
    t_eps = o["training_time"].get(T_EPS)
    if t_eps is not None and not (is_real(t_eps) and (
            math.isnan(t_eps) or t_eps == math.inf or 0 <= t_eps <= r["steps"])):
        refuse(f"['outcome']['training_time'][{T_EPS!r}]", t_eps,
               f"T_ε in steps within [0, steps = {r['steps']}], inf (not reached) or None/NaN")
