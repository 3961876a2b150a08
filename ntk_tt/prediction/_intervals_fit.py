"""Fitting a T_ε interval calibrator (:class:`ntk_tt.IntervalCalibrator`) on a benchmark table:
the residuals log(real T_ε / predicted T_ε) of its rows, grouped as the module
:mod:`ntk_tt.prediction._intervals` describes."""

from __future__ import annotations

import re
import warnings

import numpy as np

from ntk_tt.prediction._intervals import (
    _FIELDS,
    KAPPA_EDGES,
    MIN_COUNT,
    IntervalCalibrator,
    _check_edges,
    _check_level,
    kappa_bin,
)
from ntk_tt.prediction._intervals_range import (
    CalibrationRangeWarning,
    _level_message,
    rule_source,
)

_EPS = re.compile(r"0?\.\d+|\d+(\.\d*)?(e-?\d+)?")  # a column's ε as the sweep writes it (:g)


def residuals(frame, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """``(r, keep)``: log(real T_ε / predicted T_ε) per row of a sweep table, and the mask of
    rows where it is defined (neither side diverged, both T_ε finite and > 0); r is NaN
    elsewhere. ``frame``: the sweep table (``ntk_tt.sweep._table.read_table``)."""
    real, pred = (frame[f"{side}_T{eps:g}"].to_numpy(float) for side in ("real", "pred"))
    keep = (~frame["real_diverged"].to_numpy(bool) & ~frame["pred_diverged"].to_numpy(bool)
            & np.isfinite(real) & np.isfinite(pred) & (real > 0) & (pred > 0))
    r = np.full(len(frame), np.nan)
    r[keep] = np.log(real[keep] / pred[keep])
    return r, keep


def fit_intervals(frame, level: float = 0.9, *, by=("kappa",), min_count: int = MIN_COUNT,
                  kappa_edges=KAPPA_EDGES) -> IntervalCalibrator:
    """Fit a T_ε interval calibrator on a benchmark sweep table.

    Source: split conformal prediction (Vovk, Gammerman & Shafer 2005; Lei et al. 2018) on
    ntk_tt's benchmark table (README "Calibrated intervals for T_ε").

    Args:
      frame: pandas DataFrame with the sweep table's columns ``kappa_eff``, ``optimizer``,
        ``real_diverged``, ``pred_diverged``, ``real_T<ε>`` and ``pred_T<ε>`` (steps) for
        every ε it holds (``ntk_tt.sweep._table.read_table(sweep_dir)``), optionally
        ``dataset``, ``pred_method``, ``pred_kernel``, ``num_train``, ``steps``,
        ``num_classes`` (N, T, C: [min, max] over the rows with a residual) and ``schedule``,
        ``weight_decay``, ``nesterov``, ``decoupled`` (absent: "constant", 0, False, True),
        recorded in ``source``.
      level: the default 1 − α in (0, 1). by: grouping fields, finest first, from "kappa",
        "eps", "optimizer" (() = pooled; one name alone is one field). min_count: fewest
        residuals for a group to be used
        (else the next coarser one; the pooled group, the last resort, whatever its count).
      kappa_edges: finite, positive (κ̃ > 0), strictly increasing κ̃ bin edges.

    Returns:
      :class:`IntervalCalibrator` holding every defined residual, grouped.

    Warns:
      CalibrationRangeWarning: fewer residuals than ``level`` needs for a finite bound even
        pooled (level > 1 − 2/(n + 1)): every interval at that level is (0, T).

    Raises:
      ValueError: level not in (0, 1), ``by`` not distinct fields of "kappa", "eps",
        "optimizer", min_count < 1, kappa_edges not finite positive increasing numbers,
        columns missing, a ``real_T<ε>`` column whose ε is not in (0, 1), a kappa_eff that is
        NaN or negative, a T_ε that is ≤ 0 or infinite (NaN is undefined: that row is
        left out), diverged columns that are not bools, or no defined residual;
        ``frame`` not a pandas DataFrame.
    """
    import pandas as pd

    if not isinstance(frame, pd.DataFrame):
        raise ValueError(f"fit_intervals takes the sweep's results table as a pandas DataFrame"
                         f" (pd.read_parquet('.../results.parquet')), got {type(frame).__name__}.")
    level = _check_level(level)
    edges = _check_edges(kappa_edges)
    by = (by,) if isinstance(by, str) else tuple(by)  # by="kappa" was read as its letters
    if not set(by) <= set(_FIELDS) or len(set(by)) != len(by):
        raise ValueError(f"by must be distinct fields of {_FIELDS}, got {by!r}.")
    if not isinstance(min_count, int) or min_count < 1:
        raise ValueError(f"min_count must be a positive int, got {min_count!r}.")
    names = [c[len("real_T"):] for c in frame.columns if c.startswith("real_T")]
    eps_all = sorted(float(e) for e in names if _EPS.fullmatch(e) and 0 < float(e) < 1)
    if bad := [e for e in names if not (_EPS.fullmatch(e) and 0 < float(e) < 1)]:
        raise ValueError(f"column real_T{bad[0]}: its ε must be a decimal number in (0, 1), as "
                         "the sweep names them (real_T0.1, pred_T0.1).")
    need = {"kappa_eff", "optimizer", "real_diverged", "pred_diverged",
            *(f"pred_T{e:g}" for e in eps_all)}
    missing = sorted(need - set(frame.columns)) + ([] if eps_all else ["real_T<eps>"])
    if missing:
        raise ValueError(f"the table lacks columns {missing}: pass a sweep results table.")
    kappas = frame["kappa_eff"].to_numpy(float)
    if not np.isfinite(kappas).all() or (kappas < 0).any():
        i = int(np.flatnonzero(~(np.isfinite(kappas) & (kappas >= 0)))[0])
        raise ValueError(f"kappa_eff must be a finite number >= 0 in every row (it picks the "
                         f"interval's κ̃ bin), got {kappas[i]} in row {i}.")
    for c in ("real_diverged", "pred_diverged"):
        if frame[c].dtype.kind not in "biuf":  # strings: "False" is truthy
            raise ValueError(f"column {c} must hold bools, got dtype {frame[c].dtype}.")
    for col in (f"{side}_T{e:g}" for e in eps_all for side in ("real", "pred")):
        t = frame[col].to_numpy(float)
        if (wrong := ~np.isnan(t) & ~(np.isfinite(t) & (t > 0))).any():  # was dropped silently
            i = int(np.flatnonzero(wrong)[0])
            raise ValueError(f"column {col} holds {t[i]} in row {i}: a T_ε is a finite number "
                             "of steps > 0, NaN where undefined (as the sweep writes it); fix "
                             "or drop that row.")
    bins = [kappa_bin(k, edges) for k in kappas]
    opts = frame["optimizer"].astype(str).to_numpy()
    groups: dict = {}
    used = np.zeros(len(frame), bool)  # rows with a residual: the N and T calibrated
    for e in eps_all:
        r, keep = residuals(frame, e)
        used |= keep
        for i in np.flatnonzero(keep):
            groups.setdefault((bins[i], f"{e:g}", opts[i]), []).append(float(r[i]))
    if not groups:
        raise ValueError("no row with a defined real and predicted T_eps: nothing to fit.")
    source = {"rows": len(frame), "residuals": sum(len(v) for v in groups.values()),
              **{c: sorted(map(str, frame[c].unique())) for c in
                 ("dataset", "pred_method", "pred_kernel") if c in frame.columns},
              **{f: [int(v.min()), int(v.max())] for f in ("num_train", "steps", "num_classes")
                 if f in frame.columns for v in [frame[f].to_numpy(float)[used]]},
              **rule_source(frame, used)}
    if level > 1 - 2 / (source["residuals"] + 1):  # its every interval (0, T) (a fresh user)
        warnings.warn(f"fit_intervals on {len(frame)} rows: "
                      f"{_level_message(level, source['residuals'])}; fit on a larger sweep "
                      "table.", CalibrationRangeWarning, stacklevel=2)
    return IntervalCalibrator(level=level, by=by, min_count=min_count, kappa_edges=edges,
                              groups={k: tuple(sorted(v)) for k, v in groups.items()},
                              source=source)
