"""Absolute targets in the sweep: steps to a training loss ≤ q·L_0 and to a training error
≤ e*, predicted and real, per row, and their statistics for ``summary.json``.

The sweep's tasks have no held-out set, so the targets are set from the task alone, before
training: loss targets L* = q·L_0 for q in :data:`LOSS_FRACTIONS` (L_0 = the initial mean
training loss at the pre-trained weights, the real curve's first entry) and training-error
targets e* in :data:`ERROR_TARGETS`. Steps to a target: :func:`ntk_tt.steps_to_target` (first
step with the 5-step smoothed curve ≤ target) on the stored curves, the same definition as
``predict(..., targets=...)``; a diverged side has none (as its T_ε). Everything is computed
from the stored curves (``real_loss``, ``pred_loss``; ``real_error``, ``pred_error`` where the
sweep stored them), so an existing ``results.parquet`` is re-reported without re-running.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ntk_tt.dynamics._targets import curve_targets
from ntk_tt.dynamics._training_time import curve_window
from ntk_tt.sweep._errors import error_stats

LOSS_FRACTIONS = (0.5, 0.25)
ERROR_TARGETS = (0.5, 0.2, 0.1)


def steps_col(side: str, kind: str, value: float) -> str:
    """Column of the steps to a target: ``real_steps_loss0.5`` (L* = 0.5·L_0),
    ``pred_steps_error0.1`` (training error ≤ 0.1); NaN where not reached or diverged."""
    return f"{side}_steps_{kind}{value:g}"


def _steps(curve, targets, diverged: bool) -> list[float]:
    """Steps to each target on one curve (NaN where not reached), all NaN when diverged."""
    if diverged:
        return [np.nan] * len(targets)
    curve = np.asarray(curve, float)
    steps, _ = curve_targets({"c": curve}, {"c": tuple(targets)},
                             window=curve_window(len(curve)))
    return [steps["c"][t] for t in targets]


def target_columns(real_loss, pred_loss, real_diverged, pred_diverged, real_error=None,
                   pred_error=None) -> dict:
    """One row's steps-to-target columns (:func:`steps_col`): the loss targets always, the
    error targets when both error curves are given."""
    l0 = float(np.asarray(real_loss, float)[0])
    out = {}
    for side, loss, err, div in (("real", real_loss, real_error, real_diverged),
                                 ("pred", pred_loss, pred_error, pred_diverged)):
        fractions = _steps(loss, [q * l0 for q in LOSS_FRACTIONS], bool(div))
        out.update({steps_col(side, "loss", q): s
                    for q, s in zip(LOSS_FRACTIONS, fractions, strict=True)})
        if real_error is not None and pred_error is not None:
            errors = _steps(err, ERROR_TARGETS, bool(div))
            out.update({steps_col(side, "error", e): s
                        for e, s in zip(ERROR_TARGETS, errors, strict=True)})
    return out


def _has_error_curves(frame: pd.DataFrame) -> str | None:
    """None when the frame's rows carry both error curves, else why the error targets are
    not computed."""
    if {"real_error", "pred_error"} <= set(frame.columns):
        return None
    if (frame["pred_method"] == "promoted").any():
        return "the primary was promoted from a variant, whose error curves are not stored"
    return "the table stores no error curves (a sweep before absolute targets)"


def target_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Every row's :func:`target_columns` recomputed from its stored curves (aligned with
    ``frame``), and ``error_curves``: whether the row stores both error curves (the error
    columns are NaN where it does not: not computed, not "not reached")."""
    errors = _has_error_curves(frame) is None
    rows = []
    for i in range(len(frame)):
        r = frame.iloc[i]
        curves = (r["real_error"], r["pred_error"]) if errors else (None, None)
        has = all(c is not None and np.ndim(c) == 1 for c in curves)
        rows.append(target_columns(r["real_loss"], r["pred_loss"], r["real_diverged"],
                                   r["pred_diverged"], *(curves if has else (None, None)))
                    | {"error_curves": has})
    return pd.DataFrame(rows, index=frame.index)


def _stats(frame: pd.DataFrame, cols: pd.DataFrame, targets: list[tuple[str, float]]) -> dict:
    """Pooled over ``targets`` ([(kind, value)]) and the rows of ``frame``: the fraction of
    (row, target) pairs where prediction and real run agree on reaching the target, and,
    over pairs where both reached it, the relative error |ŝ − s| / max(s, 1) (p95 with a
    bootstrap CI over tasks, median, signed median: ``_errors.error_stats``)."""
    real, pred, tasks = [], [], []
    for kind, value in targets:
        if steps_col("real", kind, value) not in cols:
            continue
        here = cols.loc[frame.index]
        if kind == "error":  # rows without error curves have no error columns
            here = here[here["error_curves"].astype(bool)]
        real.append(here[steps_col("real", kind, value)].to_numpy(float))
        pred.append(here[steps_col("pred", kind, value)].to_numpy(float))
        tasks.append(frame.loc[here.index, "task_id"].to_numpy())
    real, pred, tasks = (np.concatenate(a) if a else np.zeros(0) for a in (real, pred, tasks))
    if not len(real):
        return {"pairs": 0}
    reached_r, reached_p = np.isfinite(real), np.isfinite(pred)
    both = reached_r & reached_p
    signed = (pred[both] - real[both]) / np.maximum(real[both], 1.0)
    stats = error_stats(np.abs(signed), signed, groups=tasks[both], boot=500)
    stats.pop("false_flags_or_undefined", None)  # only pairs where both reached are here
    if both.any():
        steps = np.abs(pred[both] - real[both])
        stats.update(median_abs=float(np.median(np.abs(signed))),
                     median_abs_steps=float(np.median(steps)),
                     p95_abs_steps=float(np.percentile(steps, 95)))
    return {"pairs": int(len(real)), "reach_agreement": float(np.mean(reached_r == reached_p)),
            "real_reached": float(np.mean(reached_r)),
            "pred_reached": float(np.mean(reached_p)),
            "pred_only": int(np.sum(reached_p & ~reached_r)),
            "real_only": int(np.sum(reached_r & ~reached_p)), **stats}


def absolute_targets(frame: pd.DataFrame) -> dict:
    """The ``absolute_targets`` block of ``summary.json`` (module docstring), from the curves.

    ``headline`` {gd, sgd}: pooled over the loss targets; ``headline_error``: pooled over the
    error targets (when the table stores error curves); ``by_target`` {"loss0.5", ...:
    {gd, sgd}}; ``by_kappa`` {κ̃: {gd, sgd}} pooled over the loss targets. Each entry:
    ``pairs`` (rows × targets), ``reach_agreement`` (predicted reached-or-not = real),
    ``real_reached``, ``pred_reached``, ``pred_only``, ``real_only``, and over the pairs where
    both reached the target ``n``, ``p95`` (with ``p95_ci95``), ``median_abs``,
    ``median_signed``, ``mean_abs``, ``within_13pct``, ``within_20pct`` of the relative error
    (ŝ − s)/max(s, 1), and ``median_abs_steps``, ``p95_abs_steps`` of |ŝ − s| in steps.
    """
    cols = target_frame(frame)
    why_not = _has_error_curves(frame)
    loss = [("loss", q) for q in LOSS_FRACTIONS]
    error = [] if why_not else [("error", e) for e in ERROR_TARGETS]
    by_opt = {opt: frame[frame["optimizer"] == opt] for opt in ("gd", "sgd")}
    kappa = frame["kappa_eff"].round(2)
    out = {
        "definition": "steps to target = first step with the 5-step smoothed curve <= target "
                      "(ntk_tt.steps_to_target), real and predicted alike; loss targets "
                      "L* = q * L_0 (L_0 the initial training loss), error targets on the "
                      "training error; a diverged side never reaches a target; relative error "
                      "(predicted - real) / max(real, 1) over rows where both reached it",
        "loss_fractions": list(LOSS_FRACTIONS),
        "error_targets": [e for _, e in error],
        "error_targets_missing": why_not,
        "headline": {opt: _stats(sub, cols, loss) for opt, sub in by_opt.items()},
        "by_target": {f"{kind}{value:g}": {opt: _stats(sub, cols, [(kind, value)])
                                           for opt, sub in by_opt.items()}
                      for kind, value in loss + error},
        "by_kappa": {f"{level:g}": {opt: _stats(sub[kappa[sub.index] == level], cols, loss)
                                    for opt, sub in by_opt.items()}
                     for level in sorted(kappa.unique())},
    }
    if error:
        out["headline_error"] = {opt: _stats(sub, cols, error) for opt, sub in by_opt.items()}
    return out


def error_curve_gap(frame: pd.DataFrame) -> dict:
    """The ``error_curve_distance`` block of ``summary.json``: how far the predicted training
    error curve ê_t (the primary predictor's) is from the real e_t, in error-rate units (a
    fraction of the training set, not relative), per optimiser {gd, sgd}, over the rows that
    store both error curves and where neither side diverged: ``n``, ``median`` and ``p95`` of
    max_t |ê_t − e_t| (t = 0 … T), ``final_median`` and ``final_p95`` of |ê_T − e_T| and
    ``final_median_signed`` of ê_T − e_T (> 0: the prediction ends with more errors). Where
    the error curve is flat near an error target e*, a small gap here moves the steps to e*
    by many steps (:func:`absolute_targets`); this is the curve-level figure beside it.
    ``{"n": 0}`` for an optimiser without such rows."""
    out = {}
    for opt in ("gd", "sgd"):
        rows = frame[frame["optimizer"] == opt]
        gaps, final = [], []
        if {"real_error", "pred_error"} <= set(frame.columns):
            for r, q, rd, qd in zip(rows["real_error"], rows["pred_error"],
                                    rows["real_diverged"], rows["pred_diverged"], strict=True):
                if r is None or q is None or np.ndim(r) != 1 or np.ndim(q) != 1 or rd or qd:
                    continue
                r, q = np.asarray(r, float), np.asarray(q, float)
                gaps.append(float(np.max(np.abs(q - r))))
                final.append(float(q[-1] - r[-1]))
        if not gaps:
            out[opt] = {"n": 0}
            continue
        out[opt] = {"n": len(gaps), "median": float(np.median(gaps)),
                    "p95": float(np.percentile(gaps, 95)),
                    "final_median": float(np.median(np.abs(final))),
                    "final_p95": float(np.percentile(np.abs(final), 95)),
                    "final_median_signed": float(np.median(final))}
    return out
