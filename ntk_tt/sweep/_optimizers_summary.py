"""``summary.json`` of the optimiser benchmark (:mod:`ntk_tt.sweep._optimizers`), from its
results table alone, beside the constant-η sweep's rows of the same tasks."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ntk_tt.sweep._errors import _pooled_stats
from ntk_tt.sweep._optimizers import FAMILIES
from ntk_tt.sweep._targets import ERROR_TARGETS, LOSS_FRACTIONS, _stats, target_frame

POOLED = (0.1, 0.4)
MAIN_KAPPA_MAX = 12.0  # the constant-η sweep's main grid; its edge rows lie beyond


def _t_stats(rows: pd.DataFrame) -> dict:
    """Relative T_ε error of the prediction pooled over ε ∈ {0.1, 0.4} (the sweep's rules:
    ``ntk_tt.sweep._errors.row_errors``; p95 with a bootstrap CI over tasks)."""
    return _pooled_stats(rows, "ntk", list(POOLED)) if len(rows) else {"n": 0}


def _by_batch(rows: pd.DataFrame, fn) -> dict:
    return {opt: fn(rows if opt == "all" else rows[rows["optimizer"] == opt])
            for opt in ("gd", "sgd", "all")}


def _targets(rows: pd.DataFrame) -> dict:
    """Steps to the absolute targets (loss ≤ q·L_0, training error ≤ e*), predicted vs real,
    pooled over the loss targets and over the error targets (``ntk_tt.sweep._targets``)."""
    if not len(rows):
        return {"loss": {"pairs": 0}, "error": {"pairs": 0}}
    cols = target_frame(rows)
    return {"loss": _stats(rows, cols, [("loss", q) for q in LOSS_FRACTIONS]),
            "error": _stats(rows, cols, [("error", e) for e in ERROR_TARGETS])}


def _cost(rows: pd.DataFrame) -> dict:
    """Fine-tuning seconds / prediction seconds per task sweep: all of a task's fine-tunes
    (training steps, compilation excluded) against its kernels (built once per task, the
    Adam kernel once per batch size; compilation included: what a fresh process pays) plus
    all its predictions (compilation excluded). ``*_compile_excluded``: the kernels without
    their compilation too (``task_seconds_kernel_warm``; the constant sweep's rule,
    ``wall_time``), for rows that recorded it."""
    if not len(rows):
        return {"tasks": 0}
    per_task = rows.groupby("task_id").agg(
        finetune=("seconds_finetune", "sum"), predict=("seconds_predict", "sum"),
        kernel=("task_seconds_kernel", "max"))
    ratio = per_task["finetune"] / (per_task["kernel"] + per_task["predict"])
    out = {"tasks": int(len(per_task)), "per_task_median_ratio": float(ratio.median()),
           "per_task_ratio_min_max": [float(ratio.min()), float(ratio.max())],
           "total_seconds_finetune": float(per_task["finetune"].sum()),
           "total_seconds_kernel_and_predict": float(
               (per_task["kernel"] + per_task["predict"]).sum())}
    if "task_seconds_kernel_warm" in rows and rows["task_seconds_kernel_warm"].notna().all():
        warm = rows.groupby("task_id")["task_seconds_kernel_warm"].max()
        excluded = per_task["finetune"] / (warm + per_task["predict"])
        out |= {"per_task_median_ratio_compile_excluded": float(excluded.median()),
                "total_seconds_kernel_warm_and_predict": float(
                    (warm + per_task["predict"]).sum())}
    return out


def _divergence(rows: pd.DataFrame) -> dict:
    real, pred = rows["real_diverged"].astype(bool), rows["pred_diverged"].astype(bool)
    return {"real": int(real.sum()), "predicted": int(pred.sum()),
            "both": int((real & pred).sum()), "rows": int(len(rows))}


def summarize_optimizers(frame: pd.DataFrame, constant: pd.DataFrame | None = None) -> dict:
    """The benchmark's summary: per family (and "all"), per GD / SGD / all rows, the T_ε
    error pooled over ε ∈ {0.1, 0.4}, the absolute-target errors, divergences and the cost
    ratio; ``constant_same_tasks``: the constant-η sweep's primary on the same tasks (rows of
    ``constant`` whose ``task_id`` is in ``frame``, main grid κ̃ <= 12: the edge rows
    beyond it test divergence calls, which the optimiser grid does not) and
    ``sgdm_minus_constant_p95_points``, the difference of the two p95s in percentage points
    (issue 27's "within 3 points"); ``real_source``: how many real runs were fine-tuned and
    how many reused from an earlier table (when the table records it)."""
    out: dict = {"rows": int(len(frame)), "tasks": int(frame["task_id"].nunique()),
                 "families": {}}
    for fam in (*FAMILIES, "all"):
        rows = frame if fam == "all" else frame[frame["family"] == fam]
        out["families"][fam] = {
            "rows": int(len(rows)),
            "t_eps_pooled_0.1_0.4": _by_batch(rows, _t_stats),
            "absolute_targets": _by_batch(rows, _targets),
            "divergence": _by_batch(rows, _divergence),
            "cost": _cost(rows),
        }
        if fam != "all":  # per peak: SGD-momentum's κ̃_peak, AdamW's η_peak (whose weight
            # travel ρ grows with it, README "Optimiser benchmark")
            out["families"][fam]["t_eps_pooled_by_peak"] = {
                f"{peak:g}": _by_batch(part, _t_stats)
                for peak, part in rows.groupby("peak_setting")}
    out["cost"] = out["families"]["all"]["cost"]
    if "real_source" in frame:  # --reuse-real: real runs taken from an earlier table
        out["real_source"] = {str(k): int(v) for k, v in
                              frame["real_source"].fillna("fine-tuned").value_counts().items()}
    if "finetune_timing" in frame:  # "run", "retimed" (reused, timed here) or "recorded"
        out["finetune_timing"] = {str(k): int(v) for k, v in
                                  frame["finetune_timing"].fillna("run").value_counts().items()}
    if constant is not None:
        same = constant[constant["task_id"].isin(set(frame["task_id"]))]
        if "kappa_eff" in same:  # the main grid (κ̃ <= 12), not the edge rows
            same = same[same["kappa_eff"] <= MAIN_KAPPA_MAX]
        out["constant_same_tasks"] = {"rows": int(len(same)), **_by_batch(same, _t_stats)}
        sgdm = out["families"]["sgdm_cosine"]["t_eps_pooled_0.1_0.4"]
        out["sgdm_minus_constant_p95_points"] = {
            opt: (100.0 * (sgdm[opt]["p95"] - out["constant_same_tasks"][opt]["p95"])
                  if sgdm[opt].get("n") and out["constant_same_tasks"][opt].get("n")
                  else None)
            for opt in ("gd", "sgd", "all")}
    return _plain(out)


def _plain(value):
    """JSON-ready: numpy scalars to Python numbers, NaN to None."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return None if not np.isfinite(value) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value
