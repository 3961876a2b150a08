"""The N, T and update rule a T_ε interval calibrator was fitted on, and the check of a new
prediction's.

A calibrator (:class:`ntk_tt.IntervalCalibrator`) may record, in its ``source``,
``"num_train"`` and ``"steps"``: the [min, max] N and T (optimiser steps) of the benchmark
rows that gave it residuals (:func:`ntk_tt.fit_intervals`), and their update rule:
``"schedule"`` (the schedule names), ``"weight_decay"`` ([min, max] λ), ``"nesterov"``
(the flags seen) and, for a table of the optimiser benchmark (a ``peak_learning_rate``
column), ``"learning_rate"`` ([min, max] peak η: Adam's step has no κ̃ to group by),
``"num_classes"`` ([min, max] C), ``"decoupled"`` (the weight-decay forms seen), and
``"kappa_eff"`` ([min, max] κ̃, recorded by ``experiments/subspace_intervals.py``: its
table has no edge rows). A
prediction outside them gets an interval whose coverage was never measured:
:func:`prediction_messages` says so, and :func:`ntk_tt.intervals` warns
:class:`CalibrationRangeWarning`. Calibrators written before a field was recorded flag nothing
for it. The other notes of :func:`ntk_tt.intervals` are here too: a level the table cannot
resolve, and why a prediction gets no interval.
"""

from __future__ import annotations

import json

import numpy as np

from ntk_tt._options import a_type, is_real
from ntk_tt._options_predict import NO_INTERVAL
from ntk_tt.dynamics._edge_warnings import BeyondEdgeWarning

RANGES = (("num_train", "N", "training samples"), ("steps", "T", "steps"),
          ("num_classes", "C", "classes"))
EXTRAPOLATION = "(the T_ε intervals are an extrapolation there: their coverage is not measured)"


class CalibrationRangeWarning(BeyondEdgeWarning):
    """A T_ε interval for an N, T, C, κ̃ or update rule outside the calibration table's
    (:func:`ntk_tt.intervals`).

    Source: ntk_tt's own (README "Calibrated intervals for T_ε")."""


def range_messages(source: dict, num_train=None, steps=None, num_classes=None) -> list[str]:
    """One message per quantity, N = ``num_train``, T = ``steps`` or C = ``num_classes``,
    outside ``source``'s recorded [min, max] ("N = 2000 training samples is outside the
    calibration table's N = 50–750 (...)"); none for a quantity that is None or has no
    recorded range.

    Raises:
      ValueError: ``num_train``, ``steps`` or ``num_classes`` neither None nor a number.
    """
    out = []
    for (field, sym, unit), v in zip(RANGES, (num_train, steps, num_classes), strict=True):
        if v is None:
            continue
        if not is_real(v):
            raise ValueError(f"{field} must be a number ({sym}, {unit}) or None, got "
                             f"{a_type(v)}; pass e.g. {field}=250, not a string.")
        if field not in source:  # no range recorded: never outside
            continue
        lo, hi = source[field]
        if not lo <= v <= hi:
            shown = f"{lo:g}" if lo == hi else f"{lo:g}–{hi:g}"
            out.append(f"{sym} = {v:g} {unit} is outside the calibration table's {sym} = "
                       f"{shown} {EXTRAPOLATION}")
    return out


def rule_source(frame, used) -> dict:
    """The update rule of ``frame``'s rows where ``used`` (bool mask): "schedule" (sorted
    names), "weight_decay" ([min, max] λ), "nesterov" and "decoupled" (sorted flags). A column
    the table lacks takes the benchmarks' value (their rows have none): "constant", 0, False,
    True (``ntk_tt.sgd`` / ``adamw`` decay is decoupled)."""
    def col(name, default):
        return frame[name].to_numpy()[used] if name in frame.columns else np.array([default])

    decay = col("weight_decay", 0.0).astype(float)
    out = {"schedule": sorted(set(map(str, col("schedule", "constant")))),
           "weight_decay": [float(decay.min()), float(decay.max())],
           "nesterov": sorted(set(map(bool, col("nesterov", False)))),
           "decoupled": sorted(set(map(bool, col("decoupled", True))))}
    if "peak_learning_rate" in frame.columns:
        peak = frame["peak_learning_rate"].to_numpy(float)[used]
        out["learning_rate"] = [float(peak.min()), float(peak.max())]
    return out


def prediction_messages(source: dict, hyper: dict) -> list[str]:
    """:func:`range_messages` of a prediction's ``hyperparameters`` (N, T, C), then one
    message per field ("kappa_eff" κ̃ = κ/(1 − m), "schedule", "weight_decay", "decoupled"
    when λ > 0, "nesterov", peak "learning_rate") that ``source`` records and the
    prediction's value lies outside of; a field absent on either side is not checked."""
    out = range_messages(source, hyper.get("num_train"), hyper.get("steps"),
                         hyper.get("num_classes"))
    kappa = hyper.get("kappa_eff")
    if kappa is not None and "kappa_eff" in source:
        lo, hi = source["kappa_eff"]
        if not _inside(kappa, lo, hi):
            out.append(f"κ̃ = {kappa:.3g} is outside the calibration table's κ̃ = "
                       f"{lo:.3g}–{hi:.3g} {EXTRAPOLATION}")
    schedule, decay, nesterov, peak = (hyper.get(k) for k in (
        "schedule", "weight_decay", "nesterov", "learning_rate"))
    if schedule is not None and "schedule" in source and schedule not in source["schedule"]:
        out.append(f"the {schedule} learning-rate schedule is outside the calibration table's "
                   f"schedules ({', '.join(source['schedule'])}) {EXTRAPOLATION}")
    if decay is not None and "weight_decay" in source:
        lo, hi = source["weight_decay"]
        if not _inside(decay, lo, hi):
            shown = f"{lo:g}" if lo == hi else f"{lo:g}–{hi:g}"
            out.append(f"weight decay λ = {decay:g} is outside the calibration table's "
                       f"λ = {shown} {EXTRAPOLATION}")
        elif decay > 0 and "decoupled" in source and bool(
                hyper.get("decoupled", True)) not in source["decoupled"]:
            kind = "decoupled" if hyper.get("decoupled", True) else "L2 (in the loss)"
            out.append(f"{kind} weight decay is outside the calibration table's "
                       f"({' and '.join('decoupled' if v else 'L2' for v in source['decoupled'])}"
                       f" decay only) {EXTRAPOLATION}")
    if peak is not None and "learning_rate" in source:
        lo, hi = source["learning_rate"]
        if not _inside(peak, lo, hi):
            out.append(f"the peak learning rate η = {peak:g} is outside the calibration "
                       f"table's η = {lo:g}–{hi:g} {EXTRAPOLATION}")
    if nesterov is not None and "nesterov" in source and bool(nesterov) not in source["nesterov"]:
        kind = "Nesterov" if nesterov else "heavy-ball"
        seen = " and ".join("Nesterov" if v else "heavy-ball" for v in source["nesterov"])
        out.append(f"{kind} momentum is outside the calibration table's ({seen} momentum "
                   f"only) {EXTRAPOLATION}")
    return out


def _inside(v, lo, hi) -> bool:
    """lo <= v <= hi up to float32 rounding (hyperparameters are stored as the optimiser's
    float32 leaves: η = 1e-3 reads 0.0010000000475)."""
    return lo - 1e-6 * abs(lo) <= v <= hi + 1e-6 * abs(hi)


def check_ranges(path, source: dict) -> None:
    """ValueError unless each recorded range of a calibrator file's ``source`` ("num_train",
    "steps", "weight_decay", "learning_rate", "kappa_eff") is a [min, max] pair of numbers
    with min <= max, "schedule" a list of names and "nesterov" and "decoupled" lists of
    true/false (an absent one is fine: an older file)."""
    for field, kind in (("schedule", str), ("nesterov", bool), ("decoupled", bool)):
        r = source.get(field, [])
        if not (isinstance(r, list) and all(isinstance(v, kind) for v in r)):
            raise ValueError(f"{path}: source[{field!r}] must be a list of "
                             f"{'names' if kind is str else 'true/false'}, got "
                             f"{json.dumps(r)[:60]}; fix or delete it, or refit.")
    for field in (*(f for f, _, _ in RANGES), "weight_decay", "learning_rate", "kappa_eff"):
        if field not in source:
            continue
        r = source[field]
        if not (isinstance(r, list) and len(r) == 2 and all(map(is_real, r)) and r[0] <= r[1]):
            shown = json.dumps(r) if isinstance(r, list) and len(r) <= 2 else a_type(r)
            raise ValueError(f"{path}: source[{field!r}] must be a [min, max] pair of numbers "
                             f"with min <= max, got {shown}; fix or delete it, or refit.")


def _level_message(level: float, n: int) -> str:
    """The note for a level the calibration table cannot resolve: a finite conformal bound
    from n residuals needs ⌈(n + 1)(1 − α/2)⌉ <= n, i.e. level <= 1 − 2/(n + 1)."""
    return (f"level {level:g} needs more residuals than the calibration table has ({n}, all "
            f"pooled): its bounds are 0 and the horizon T, so the interval says nothing; "
            f"levels up to {1 - 2 / (n + 1):.3f} are resolved")


def _abstain_message(prediction, cal) -> str:
    """Why :func:`ntk_tt.intervals` gives no interval to ``prediction``: it abstains, or the
    residuals of ``cal`` (an :class:`ntk_tt.IntervalCalibrator`) are of another predictor."""
    if prediction.outcome in ("unknown", "diverges"):
        what = "abstains" if prediction.outcome == "unknown" else "calls divergence"
        return (f"{NO_INTERVAL}: the prediction {what} (outcome {prediction.outcome}: "
                f"{prediction.divergence_reason}), so it has no T_ε to bound")
    names = [f"{m}:{k}" for m in cal.source.get("pred_method") or []
             for k in cal.source.get("pred_kernel") or []]
    of = f"the {' / '.join(names)} predictor" if names else "discrete-recursion predictions"
    hp = prediction.hyperparameters
    k = cal.source.get("subspace_dim")  # the table's k, then the prediction's, if recorded
    dims = ["" if k is None or d is None else f" with k = {d} feature directions{cap}"
            for d, cap in ((k, ""), (hp.get("subspace_dim"), " (k = min(subspace_dim, F))"))]
    return (f"{NO_INTERVAL}: the calibration table's residuals are of {of}{dims[0]} (method "
            f"discrete, loss cross_entropy); this prediction's kernel is {prediction.kernel}"
            f"{dims[1]} (method {prediction.method}, loss {hp.get('loss', 'cross_entropy')}): "
            "fit a calibrator on a sweep of its predictor (ntk_tt.fit_intervals) to get one")
