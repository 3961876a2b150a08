"""The relative T_ε error of a sweep row and its statistics (paper Sec. 5, Fig. 1, Table 1).

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
