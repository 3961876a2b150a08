"""Headline statistics of a sweep, from the results table alone (paper Sec. 5, Fig. 1, Table 1).

Relative T_ε error of a row: (T̂_ε − T_ε)/T_ε, with T_ε the real (fine-tuned) and T̂_ε the
predicted training time in steps, both from ``ntk_tt.training_time`` on the mean training loss.
Rules, applied identically to the predictor and to the baselines:

* real and predicted both diverged: a correct flag, excluded from the T_ε statistics (counted);
* exactly one of them diverged (a false or a missed flag): |error| = 100 %;
* real T_ε undefined (flat or rising real curve): excluded (counted);
* predicted T_ε undefined while the real one exists: |error| = 100 %;
* ``median_other_tasks`` with no other task (same configuration and size) whose real T_ε is
  defined — none, or all of them diverged or flat: excluded, counted apart as "no other task
  with a defined real T_eps".

Baselines use only what is known before training: ``line`` is T̂_ε = (1 − ε)·T (a straight-line
curve from L_0 to L_T), ``median_other_tasks`` is the median real T_ε over the *other* tasks
(different task id) with the same configuration and per-class size.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

POOLED = (0.1, 0.4)
BANDS = (0.13, 0.20)
LOSS_DROP = 0.30


def t_col(prefix: str, eps: float) -> str:
    """Column holding T_ε (steps; NaN when undefined) for a predictor or ``real``."""
    return f"{prefix}_T{eps:g}"


def epsilons(frame: pd.DataFrame) -> list[float]:
    """The ε values present in the table."""
    return sorted(float(c[len("real_T"):]) for c in frame.columns if c.startswith("real_T"))


def variants(frame: pd.DataFrame) -> list[str]:
    """Names of the extra prediction variants (``var_<name>_T<ε>`` columns)."""
    found = (re.fullmatch(r"var_(.+)_T[0-9.e-]+", c) for c in frame.columns)
    return sorted({m.group(1) for m in found if m})


def _baseline(frame: pd.DataFrame, name: str, eps: float) -> np.ndarray:
    if name == "line":
        return np.full(len(frame), (1.0 - eps) * frame["steps"].to_numpy(float))
    real = frame[t_col("real", eps)].to_numpy(float)
    out = np.full(len(frame), np.nan)
    keys = frame["config_id"].astype(str) + "|" + frame["per_class"].astype(str)
    for _, idx in frame.groupby(keys).indices.items():
        tasks = frame["task_id"].to_numpy()[idx]
        for i in idx:
            others = real[idx][tasks != frame["task_id"].iat[i]]
            others = others[np.isfinite(others)]
            if len(others):
                out[i] = np.median(others)
    return out


def row_errors(frame: pd.DataFrame, predictor: str, eps: float):
    """Per-row relative T_ε errors of one predictor at one ε, aligned with ``frame``.

    ``predictor`` is ``"ntk"`` (the primary prediction), ``"line"``, ``"median_other_tasks"``
    or a variant name. Returns ``(abs_err, signed_err, excluded)``: ``abs_err`` is NaN on
    excluded rows and 1.0 on false flags / undefined predictions (where ``signed_err`` is NaN);
    ``excluded`` maps reason → number of rows.
    """
    real = frame[t_col("real", eps)].to_numpy(float)
    real_div = frame["real_diverged"].to_numpy(bool)
    if predictor in ("line", "median_other_tasks"):
        pred, pred_div = _baseline(frame, predictor, eps), np.zeros(len(frame), bool)
    else:
        prefix = "pred" if predictor == "ntk" else f"var_{predictor}"
        pred = frame[t_col(prefix, eps)].to_numpy(float)
        pred_div = frame[f"{prefix}_diverged"].to_numpy(bool)
    both = real_div & pred_div
    flag = real_div ^ pred_div
    no_real = ~real_div & ~pred_div & ~np.isfinite(real)
    no_pred = ~real_div & ~pred_div & np.isfinite(real) & ~np.isfinite(pred)
    # the median baseline is undefined only when no other task has a real T_ε: not a miss
    no_other = no_pred if predictor == "median_other_tasks" else np.zeros(len(frame), bool)
    no_pred = no_pred & ~no_other
    ok = ~(both | flag | no_real | no_pred | no_other)
    signed = np.full(len(frame), np.nan)
    signed[ok] = (pred[ok] - real[ok]) / np.maximum(real[ok], 1.0)
    abs_err = np.where(flag | no_pred, 1.0, np.abs(signed))
    abs_err[both | no_real | no_other] = np.nan
    excluded = {"both diverged": int(both.sum()), "real T_eps undefined": int(no_real.sum())}
    if predictor == "median_other_tasks":
        excluded["no other task with a defined real T_eps"] = int(no_other.sum())
    return abs_err, signed, excluded


def relative_errors(frame: pd.DataFrame, predictor: str, eps: float):
    """:func:`row_errors` restricted to the rows that count (excluded rows dropped); also
    returns each kept row's task id (the bootstrap's resampling unit)."""
    abs_err, signed, excluded = row_errors(frame, predictor, eps)
    keep = np.isfinite(abs_err)
    return abs_err[keep], signed[keep], excluded, frame["task_id"].to_numpy()[keep]


def _task_bootstrap(abs_err, groups, rng, boot):
    """p95 of |error| over ``boot`` resamples of whole tasks (with replacement): the rows of
    one task share its kernel and data, so resampling rows would make the interval too
    narrow.

    Vectorised over the resamples: a resample is a count per task, so its rows are the sorted
    errors with multiplicities, and np.percentile's linear rule is read off their cumulative
    counts (same draws and same values as concatenating the picked tasks' rows)."""
    ids, inverse = np.unique(groups, return_inverse=True)
    t = len(ids)
    counts = np.stack([np.bincount(rng.integers(0, t, t), minlength=t) for _ in range(boot)])
    order = np.argsort(abs_err, kind="stable")
    values = abs_err[order]
    cum = np.cumsum(counts[:, inverse[order]], axis=1)  # (boot, n) rows up to each value
    size = cum[:, -1]
    pos = 0.95 * (size - 1)
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, size - 1)
    v_lo = values[np.argmax(cum > lo[:, None], axis=1)]
    v_hi = values[np.argmax(cum > hi[:, None], axis=1)]
    return v_lo + (v_hi - v_lo) * (pos - lo)


def error_stats(abs_err: np.ndarray, signed: np.ndarray, *, groups=None, key: int = 0,
                boot: int = 2000):
    """p95 |error| with a bootstrap 95 % CI (over tasks when ``groups`` gives each error's
    task, else over rows), fractions within 13 % / 20 %, signed median."""
    n = len(abs_err)
    if n == 0:
        return {"n": 0}
    rng = np.random.default_rng(key)
    if groups is None:
        p95s = np.percentile(abs_err[rng.integers(0, n, (boot, n))], 95, axis=1)
    else:
        p95s = _task_bootstrap(abs_err, np.asarray(groups), rng, boot)
    finite = signed[np.isfinite(signed)]
    return {
        "n": n,
        "p95": float(np.percentile(abs_err, 95)),
        "p95_ci95": [float(np.percentile(p95s, 2.5)), float(np.percentile(p95s, 97.5))],
        "mean_abs": float(np.mean(abs_err)),
        "median_signed": float(np.median(finite)) if len(finite) else None,
        **{f"within_{int(b * 100)}pct": float(np.mean(abs_err <= b)) for b in BANDS},
        "false_flags_or_undefined": int(np.sum(~np.isfinite(signed))),
    }


def _pooled_stats(frame, predictor, eps_list) -> dict:
    parts = [relative_errors(frame, predictor, e) for e in eps_list]
    abs_err = np.concatenate([p[0] for p in parts])
    stats = error_stats(abs_err, np.concatenate([p[1] for p in parts]),
                        groups=np.concatenate([p[3] for p in parts]), boot=500)
    stats["excluded"] = {k: sum(p[2][k] for p in parts) for k in parts[0][2]}
    return stats


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
    """Per task: kernel, all predictions (one run's), and the sum of its rows' fine-tunes."""
    tasks = frame.groupby("task_id")[["task_seconds_kernel", "task_seconds_predict"]].first()
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
    """
    per_row = frame["seconds_finetune"] / frame["seconds_predict"]
    tasks = task_times(frame)
    per_task = tasks["task_seconds_finetune"] / (
        tasks["task_seconds_kernel"] + tasks["task_seconds_predict"]
    )
    return {
        "per_config_median_ratio": float(per_row.median()),
        "per_config_ratio_by_optimizer": {
            k: float(v) for k, v in per_row.groupby(frame["optimizer"]).median().items()
        },
        "per_task_median_ratio": float(per_task.median()),
        "per_task_ratio_min_max": [float(per_task.min()), float(per_task.max())],
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
    relabelling of stored columns (T_ε, divergence, spike, curve), nothing recomputed.
    Raises ValueError if ``variant`` is not in the table or ``demoted`` already is."""
    if variant not in variants(frame):
        raise ValueError(f"no variant {variant!r} in the table; recorded: {variants(frame)}.")
    if demoted in variants(frame):
        raise ValueError(f"variant {demoted!r} already exists; choose another name.")
    out = frame.copy()
    src = f"var_{variant}_"
    for col in [c for c in frame.columns if c.startswith(src)]:
        rest = col[len(src):]
        if f"pred_{rest}" in frame.columns:
            out[f"var_{demoted}_{rest}"] = frame[f"pred_{rest}"]
            out[f"pred_{rest}"] = frame[col]
        out = out.drop(columns=col)
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
    """Rows of the divergence benchmark's extra κ̃ values (``SweepSpec.edge_kappas`` not in
    ``kappas``): kept out of the headline so that runs compare across grids."""
    if not grid or not grid.get("edge_kappas"):
        return np.zeros(len(frame), bool)
    extra = set(grid["edge_kappas"]) - set(grid.get("kappas", ()))
    return ((frame["lr_kind"] == "kappa") & frame["lr_value"].isin(extra)
            & (frame["momentum"] == 0.0)).to_numpy()


def summarize(frame: pd.DataFrame, *, meta: dict | None = None) -> dict:
    """The sweep summary as a JSON-ready dict (see the module docstring for the rules).

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
        "curve_distance": curve_distance(frame),
        "rows": int(len(frame)),
        "tasks": int(frame["task_id"].nunique()),
        "datasets": sorted(frame["dataset"].unique().tolist()),
        "rows_by_optimizer": frame["optimizer"].value_counts().to_dict(),
        "headline": headline(frame),
        "divergence_confusion": divergence_confusion(frame),
        "sketch_vs_exact": sketch_agreement(frame),
        "breakdown": breakdown(frame),
        "wall_time": wall_time(everything),
        "methods": {"|".join(k): int(v) for k, v in methods.items()},
        "variants": {v: str(frame[f"var_{v}_label"].iat[0]) for v in variants(frame)
                     if f"var_{v}_label" in frame},
    }
