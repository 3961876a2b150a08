"""Headline statistics of a sweep, from the results table alone (paper Sec. 5, Fig. 1, Table 1).

The relative T_ε error of a row, its rules and its statistics: ``ntk_tt.sweep._errors``.
Here: the headline by subset × optimiser × ε × predictor, the breakdown by factor, divergence,
curve distances, sketch agreement, wall time, and :func:`summarize`, which gathers them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ntk_tt.sweep._errors import LOSS_DROP, POOLED, _pooled_stats, epsilons, t_col, variants
from ntk_tt.sweep._outcomes import outcome_summary
from ntk_tt.sweep._targets import absolute_targets, error_curve_gap


def headline(frame: pd.DataFrame) -> dict:
    """Error statistics by subset (all rows / real loss fell ≥ 30 %) × optimiser × ε × predictor.

    ε keys are ``"0.01"``, ``"0.1"``, ``"0.4"`` and ``"pooled_0.1_0.4"`` (ε = 0.01 is reported
    but not pooled: at T = 150 its time is mostly set by the horizon).
    """
    predictors = ["ntk", "line", "median_other_tasks", *variants(frame)]
    eps_all = epsilons(frame)
    pooled = [e for e in POOLED if e in eps_all]
    subsets = {"all": frame, "loss_drop_ge_30pct": frame[frame["real_loss_drop"] >= LOSS_DROP]}
    out: dict = {}
    for sname, sub in subsets.items():
        out[sname] = {}
        for opt in ("gd", "sgd"):
            rows = sub[sub["optimizer"] == opt]
            block: dict = {}
            for label, eps_list in [*[(f"{e:g}", [e]) for e in eps_all],
                                    ("pooled_0.1_0.4", pooled)]:
                block[label] = {
                    p: _pooled_stats(rows, p, eps_list) if len(rows) else {"n": 0}
                    for p in predictors
                }
            out[sname][opt] = block
    return out


def divergence_confusion(frame: pd.DataFrame) -> dict:
    """Counts of (predicted diverged, real diverged) for the primary predictor."""
    p, r = frame["pred_diverged"].astype(bool), frame["real_diverged"].astype(bool)
    return {
        "pred_yes_real_yes": int((p & r).sum()),
        "pred_yes_real_no": int((p & ~r).sum()),
        "pred_no_real_yes": int((~p & r).sum()),
        "pred_no_real_no": int((~p & ~r).sum()),
    }


def sketch_agreement(frame: pd.DataFrame) -> dict:
    """Per sketch dimension D': |T̂_ε(sketch) − T̂_ε(exact)| / T̂_ε(exact) over ε and rows."""
    out = {}
    for name in variants(frame):
        if not name.startswith("sketch"):
            continue
        diffs = []
        for e in epsilons(frame):
            exact = frame[t_col("pred", e)].to_numpy(float)
            sk = frame[t_col(f"var_{name}", e)].to_numpy(float)
            ok = np.isfinite(exact) & np.isfinite(sk)
            diffs.append(np.abs(sk[ok] - exact[ok]) / np.maximum(exact[ok], 1.0))
        d = np.concatenate(diffs)
        out[name[len("sketch"):]] = {
            "n": int(d.size),
            "median_rel_diff": float(np.median(d)) if d.size else None,
            "p95_rel_diff": float(np.percentile(d, 95)) if d.size else None,
            "within_5pct": float(np.mean(d <= 0.05)) if d.size else None,
        }
    return out


def task_times(frame: pd.DataFrame) -> pd.DataFrame:
    """Per task: kernel and predictions, summed over the sweep invocations that wrote its rows
    (each invocation's rows share its ``task_seconds_kernel`` and ``task_seconds_predict``: a
    resumed run that adds edge rows to a task pays its kernel again), and the sum of its rows'
    fine-tunes. ``task_seconds_kernel_once``: the mean of its invocations' kernel seconds, the
    kernel a sweep run in one invocation pays once (the same work each time; the mean evens out
    the machine's load)."""
    cols = ["task_seconds_kernel", "task_seconds_predict"]
    invocations = frame.drop_duplicates(["task_id", *cols]).groupby("task_id")[cols]
    tasks = invocations.sum()
    tasks["task_seconds_kernel_once"] = invocations.mean()["task_seconds_kernel"]
    tasks["task_seconds_finetune"] = frame.groupby("task_id")["seconds_finetune"].sum()
    return tasks


def wall_time(frame: pd.DataFrame) -> dict:
    """Fine-tuning / prediction wall-time ratios, per configuration and per whole task sweep.

    Per configuration: one real fine-tune against one stand-alone prediction (kernel + solve).
    Per task: all fine-tunes of the task against its one kernel plus all its predictions
    (``frame`` must hold every row of a task, as ``task_seconds_predict`` times them all).
    The prediction side is the primary predictor's (``task_seconds_kernel``: its own kernel
    work; ``task_seconds_predict``: its solves); the variants recorded beside it are not
    counted. Fine-tunes count training steps only; reused runs are timed on the sweep's
    machine (``ntk_tt.sweep._run._real_runs``). Compilation is excluded on both sides.
    ``per_task_median_ratio`` counts a task's kernel once per invocation that wrote its rows
    (a preset grown by resuming pays it again); ``..._kernel_once`` counts it once, as one
    invocation of the whole grid would (:func:`task_times`).
    """
    per_row = frame["seconds_finetune"] / frame["seconds_predict"]
    tasks = task_times(frame)
    per_task = tasks["task_seconds_finetune"] / (
        tasks["task_seconds_kernel"] + tasks["task_seconds_predict"]
    )
    once = tasks["task_seconds_finetune"] / (
        tasks["task_seconds_kernel_once"] + tasks["task_seconds_predict"]
    )
    return {
        "per_config_median_ratio": float(per_row.median()),
        "per_config_ratio_by_optimizer": {
            k: float(v) for k, v in per_row.groupby(frame["optimizer"]).median().items()
        },
        "per_task_median_ratio": float(per_task.median()),
        "per_task_ratio_min_max": [float(per_task.min()), float(per_task.max())],
        "per_task_median_ratio_kernel_once": float(once.median()),
        "per_task_ratio_kernel_once_min_max": [float(once.min()), float(once.max())],
        "median_seconds_kernel": float(tasks["task_seconds_kernel"].median()),
        "median_seconds_predict_per_row": float(frame["seconds_predict"].median()),
        "median_seconds_finetune_per_row": float(frame["seconds_finetune"].median()),
        "total_seconds_finetune": float(tasks["task_seconds_finetune"].sum()),
        "total_seconds_kernel_and_predict": float(
            (tasks["task_seconds_kernel"] + tasks["task_seconds_predict"]).sum()
        ),
    }


FACTORS = ("kappa_eff", "dataset", "per_class", "batch_size", "momentum")


def _factor_values(frame: pd.DataFrame, factor: str) -> pd.Series:
    if factor == "kappa_eff":  # κ̃ as set by the grid (fixed-η rows get their realised κ̃)
        return frame["kappa_eff"].round(2)
    if factor == "batch_size":
        return frame["optimizer"].where(frame["optimizer"] == "gd",
                                        "B=" + frame["batch_size"].astype(str))
    return frame[factor]


def breakdown(frame: pd.DataFrame) -> dict:
    """What limits accuracy: pooled-ε error statistics of every predictor by one factor at a
    time (effective κ̃, target set, per-class size, GD / batch size, momentum), per optimiser.

    Also, per factor level, the median ratio of the predicted to the real loss fall over the
    whole horizon, (L̂_0 − L̂_T)/(L_0 − L_T): below 1 the linearised model plateaus while the
    real network keeps learning, which makes T̂_ε early.
    """
    predictors = ["ntk", *variants(frame)]
    pooled = [e for e in POOLED if e in epsilons(frame)]
    has_curves = {"real_loss", "pred_loss"} <= set(frame.columns)
    out: dict = {}
    for factor in FACTORS:
        if factor not in frame.columns and factor != "batch_size":
            continue
        values = _factor_values(frame, factor)
        out[factor] = {}
        for level in sorted(values.unique(), key=str):
            rows = frame[values == level]
            entry: dict = {}
            for opt in ("gd", "sgd"):
                sub = rows[rows["optimizer"] == opt]
                if len(sub):
                    entry[opt] = {p: {k: v for k, v in _pooled_stats(sub, p, pooled).items()
                                      if k in ("n", "p95", "median_signed", "mean_abs")}
                                  for p in predictors}
            if has_curves:
                entry["fall_ratio_median"] = float(np.median([
                    (pl[0] - pl[-1]) / (rl[0] - rl[-1])
                    for pl, rl in zip(rows["pred_loss"], rows["real_loss"], strict=True)
                    if rl[0] - rl[-1] > 0
                ] or [np.nan]))
            out[factor][str(level)] = entry
    return out


def promote(frame: pd.DataFrame, variant: str, demoted: str) -> pd.DataFrame:
    """The table with the recorded variant ``variant`` as the primary prediction (the
    headline's "ntk") and the primary it replaces kept as the variant ``demoted``: a
    relabelling of stored columns (T_ε, divergence, spike, curves), nothing recomputed; the
    error curves too where the variant stored them (a head-aware variant since session 34),
    else the primary's are dropped (no error targets).
    Raises ValueError if ``variant`` is not in the table or ``demoted`` already is, or is
    "ntk", the headline's name of the primary (the demoted primary vanished from the report)."""
    if variant not in variants(frame):
        raise ValueError(f"no variant {variant!r} in the table; recorded: {variants(frame)}.")
    if demoted in variants(frame) or demoted == "ntk":
        what = ("is the headline's name of the primary" if demoted == "ntk" else
                "already exists")
        raise ValueError(f"variant {demoted!r} {what}; choose another name.")
    out = frame.copy()
    src = f"var_{variant}_"
    for col in [c for c in frame.columns if c.startswith(src)]:
        rest = col[len(src):]
        if f"pred_{rest}" in frame.columns:
            out[f"var_{demoted}_{rest}"] = frame[f"pred_{rest}"]
            out[f"pred_{rest}"] = frame[col]
        out = out.drop(columns=col)
    if f"{src}error" not in frame.columns:  # the primary's error curves are not the variant's
        out = out.drop(columns=[c for c in ("pred_error",) if c in out.columns])
    out[f"var_{demoted}_label"] = (frame["pred_method"] + ", " + frame["pred_kernel"]
                                   + " (the sweep's primary)")
    out["pred_method"], out["pred_kernel"] = "promoted", variant
    return out


def _prefix(predictor: str) -> str:
    return "pred" if predictor == "ntk" else f"var_{predictor}"


def curve_distance(frame: pd.DataFrame) -> dict:
    """Per predictor: max_t |L̂_t − L_t| / (L_0 − L_T) of the real curve, median and p95 over
    rows whose real curve fell and neither side diverged — a curve that levels off early can
    still get T_ε right, this cannot. Needs the stored curves (``pred_loss``,
    ``var_<name>_loss``)."""
    out = {}
    for p in ["ntk", *variants(frame)]:
        col = "pred_loss" if p == "ntk" else f"var_{p}_loss"
        if col not in frame.columns or "real_loss" not in frame.columns:
            continue
        d = []
        for r, q, rd, qd in zip(frame["real_loss"], frame[col], frame["real_diverged"],
                                frame[f"{_prefix(p)}_diverged"], strict=True):
            r, q = np.asarray(r, float), np.asarray(q, float)
            if not (rd or qd) and r[0] - r[-1] > 0 and np.all(np.isfinite(q)):
                d.append(np.max(np.abs(q - r)) / (r[0] - r[-1]))
        if d:
            out[p] = {"n": len(d), "median": float(np.median(d)),
                      "p95": float(np.percentile(d, 95))}
    return out


def divergence(frame: pd.DataFrame) -> dict:
    """Per predictor: the confusion matrix of its divergence flag against the real run's,
    and, per κ̃, the fraction of rows that diverged (real and predicted) — where each side
    starts to diverge."""
    kappa = _factor_values(frame, "kappa_eff")
    real = frame["real_diverged"].astype(bool)
    out: dict = {"by_kappa": {}, "confusion": {}}
    for p in ["ntk", *variants(frame)]:
        pred = frame[f"{_prefix(p)}_diverged"].astype(bool)
        out["confusion"][p] = {
            "pred_yes_real_yes": int((pred & real).sum()),
            "pred_yes_real_no": int((pred & ~real).sum()),
            "pred_no_real_yes": int((~pred & real).sum()),
            "pred_no_real_no": int((~pred & ~real).sum()),
        }
    for level in sorted(kappa.unique()):
        rows = frame[kappa == level]
        entry = {"n": int(len(rows)), "real": float(rows["real_diverged"].mean())}
        if "real_spiked_at" in rows:
            entry["real_spiked_recovered"] = float(
                ((rows["real_spiked_at"] >= 0) & ~rows["real_diverged"].astype(bool)).mean())
        for p in ["ntk", *variants(frame)]:
            entry[p] = float(rows[f"{_prefix(p)}_diverged"].mean())
        out["by_kappa"][f"{level:g}"] = entry
    return out


def edge_rows(frame: pd.DataFrame, grid: dict | None) -> np.ndarray:
    """Rows of the divergence benchmark's edge configurations (``SweepSpec.edge_configs``):
    every row at an ``edge_kappas`` κ̃ that the main grid (``kappas`` × ``momenta`` ×
    ``batch_sizes``) lacks, whatever its B and m: kept out of the headline so that runs
    compare across grids. The B and m are not matched against ``edge_batch_sizes`` /
    ``edge_momenta``: a directory resumed with a grown grid holds edge rows of the earlier
    grids' edge sets too (the full preset's B = 100 rows of before issue 26)."""
    if not grid or not grid.get("edge_kappas"):
        return np.zeros(len(frame), bool)
    def inside(kappas, momenta, sizes) -> pd.Series:
        ok = (frame["lr_kind"] == "kappa") & frame["lr_value"].isin(kappas)
        if momenta is not None:
            ok &= frame["momentum"].isin(momenta)
        if sizes is not None:
            b = pd.Series(np.where(frame["optimizer"] == "gd", "N",
                                   frame["batch_size"].fillna(0).astype(int).astype(str)),
                          index=frame.index)
            ok &= b.isin({"N" if s is None else str(int(s)) for s in sizes})
        return ok

    edge = inside(grid["edge_kappas"], None, None)
    main = inside(grid.get("kappas", ()), grid.get("momenta"), grid.get("batch_sizes"))
    return (edge & ~main).to_numpy()


def summarize(frame: pd.DataFrame, *, meta: dict | None = None) -> dict:
    """The sweep summary as a JSON-ready dict (the rules: ``ntk_tt.sweep._errors``).

    The headline, breakdown, curve distances and sketch agreement use the main grid; the
    divergence block and the wall time use every row, the edge κ̃ included (a task's
    predictions are timed together, edge rows with the rest, so its fine-tunes are summed over
    the same rows).
    """
    if len(frame) == 0:
        raise ValueError("the results table is empty; run the sweep before summarising.")
    everything = frame
    edge = edge_rows(frame, (meta or {}).get("grid"))
    frame = frame[~edge]
    methods = frame.groupby(["optimizer", "pred_method", "pred_kernel"]).size()
    return {
        **(meta or {}),
        "edge_rows": int(edge.sum()),
        "divergence": divergence(everything),
        # the three-way outcomes and each predictor's call (ntk_tt.sweep._outcomes)
        "outcome": outcome_summary(everything),
        "curve_distance": curve_distance(frame),
        "rows": int(len(frame)),
        "tasks": int(frame["task_id"].nunique()),
        "datasets": sorted(frame["dataset"].unique().tolist()),
        "rows_by_optimizer": frame["optimizer"].value_counts().to_dict(),
        "headline": headline(frame),
        # steps to absolute targets (ntk_tt.sweep._targets), from the stored curves
        "absolute_targets": absolute_targets(frame),
        # the training error curves, predicted against real (error-rate units)
        "error_curve_distance": error_curve_gap(frame),
        "divergence_confusion": divergence_confusion(frame),
        "sketch_vs_exact": sketch_agreement(frame),
        "breakdown": breakdown(frame),
        "wall_time": wall_time(everything),
        "methods": {"|".join(k): int(v) for k, v in methods.items()},
        "variants": {v: str(frame[f"var_{v}_label"].iat[0]) for v in variants(frame)
                     if f"var_{v}_label" in frame},
    }
