"""The argument checks of :mod:`ntk_tt.prediction._intervals` (:func:`ntk_tt.fit_intervals`'s
level and κ̃ bin edges, :meth:`ntk_tt.IntervalCalibrator.interval`'s numbers), each one
ValueError saying what is wrong and how to fix it, raised before any work."""

from __future__ import annotations

import math

import numpy as np

from ntk_tt._options import check_real

KAPPA_EDGES = (2.0, 8.0)  # the default κ̃ bin edges (``ntk_tt.prediction._intervals``'s)


def _check_level(level) -> float:
    if isinstance(level, bool) or not isinstance(level, (int, float, np.integer, np.floating)) \
            or not 0 < level < 1:
        raise ValueError(f"level must be a number in (0, 1) (e.g. 0.9), got {level!r}.")
    return float(level)


def _check_edges(edges) -> tuple:
    """``edges`` as a tuple of floats if they are finite, > 0 (κ̃ > 0) and strictly increasing."""
    try:
        e = np.asarray(edges, float)
    except (TypeError, ValueError):
        e = None
    if e is None or e.ndim != 1 or not len(e) or not np.all(np.isfinite(e)) or np.any(
            e <= 0) or np.any(np.diff(e) <= 0):
        raise ValueError(f"kappa_edges must be finite positive κ̃ bin edges in increasing "
                         f"order, at least one (e.g. {KAPPA_EDGES}), got {edges!r}.")
    return tuple(float(x) for x in e)


def scalar(value, name: str) -> float:
    """``value`` as a float: a real number (Python, NumPy or a 0-d JAX array; no string such
    as ``"1.0"``, no bool, ``ntk_tt._options.check_real``) holding one number, or ValueError."""
    check_real(value, name)
    if np.ndim(value) != 0:
        raise ValueError(f"{name} must be one number, got an array of shape {np.shape(value)}.")
    return float(value)


def check_interval_args(t_pred, steps) -> tuple[float, float]:
    """``(t, cap)`` of :meth:`ntk_tt.IntervalCalibrator.interval`: ``t_pred`` a finite number
    of steps > 0, ``steps`` (the horizon T; ``inf`` for None) a finite number > 0, and
    t ≤ T (a T_ε measured on a T-step curve is at most T; beyond it, it is undefined).

    Raises:
      ValueError: ``t_pred`` not a real number, NaN (an undefined T̂_ε has no interval),
        infinite or ≤ 0; ``steps`` not None or a finite real number > 0; ``t_pred`` > ``steps``.
    """
    t = scalar(t_pred, "t_pred")
    if math.isnan(t):
        raise ValueError("t_pred is NaN: an undefined predicted T_ε (never reached, or the "
                         "prediction diverged) has no interval; skip it (ntk_tt.intervals "
                         "gives None there) and pass only defined T_ε, in steps.")
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"t_pred must be a positive finite number of steps (the predicted "
                         f"T_ε), got {t_pred!r}.")
    if steps is None:
        return t, math.inf
    cap = scalar(steps, "steps")
    if not (math.isfinite(cap) and cap > 0):
        raise ValueError(f"steps must be the horizon T the prediction was made over, a "
                         f"positive finite number of steps, or None (no cap), got {steps!r}.")
    if t > cap:
        raise ValueError(f"t_pred = {t_pred!r} lies beyond the horizon steps = {steps!r}: a "
                         "T_ε predicted over T steps is at most T (it is undefined, NaN, when "
                         "the curve has not settled by then); pass the horizon the prediction "
                         "was made over, or steps=None for no cap.")
    return t, cap
