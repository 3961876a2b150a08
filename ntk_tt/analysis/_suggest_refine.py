"""The ``jax.grad`` refinement of :func:`ntk_tt.suggest`'s best grid point: a projected
normalised gradient descent on the soft time to the target in two coordinates, (log η, m) for
constant-η SGD (:func:`_refine`) and (log η_peak, warmup) for an optimiser's schedule
(``_suggest_optimizer``), both through :func:`_descend`, projected onto the grid's range of η
(the user's ``kappa_range`` or ``learning_rate_range``) within the stability edge."""

from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt.analysis._suggest_curves import _edge, _surrogate_grad
from ntk_tt.analysis._suggest_report import _row

EDGE_MARGIN = 1e-3  # the refinement keeps κ ≤ (1 − EDGE_MARGIN)·edge


def _descend(best, u0, evaluate, bounds, scale, budget, make_row, names, rows, curves):
    """Projected normalised gradient descent on a soft time in u = (u_0, u_1) from ``best``.

    Coordinates are scaled by ``scale`` (2,) and each step moves δ of them along the steepest
    descent direction (∞-norm; a component pushing out of an active bound is dropped), δ
    starting at ½, ×1.5 after a step that lowers the surrogate, ×½ after one that does not.
    ``bounds(u)`` gives ((low_0, high_0), (low_1, high_1)): the second pair fixed, the first
    may depend on u_1; a point is projected onto u_1's bounds, then u_0's at that u_1.
    ``evaluate(u)`` → (soft time, its gradient (2,), the evaluation, run seconds without
    compilation); ``make_row(u, evaluation)`` → a grid row (appended to ``rows``, its curve to
    ``curves``); ``names``: the trace's keys of u_0 and u_1. Returns (the best admissible point
    by hard seconds if it beats ``best`` strictly, else ``best``; the trace; run seconds).
    """
    def project(u):
        v = np.array(u, float)
        v[1] = float(np.clip(v[1], *bounds(v)[1]))
        v[0] = float(np.clip(v[0], *bounds(v)[0]))
        return v

    def direction(u, g):
        """Descent direction −g·scale without components leaving an active bound."""
        d = -g * scale
        for i, (low, high) in enumerate(bounds(u)):
            if (u[i] <= low + 1e-12 and d[i] < 0) or (u[i] >= high - 1e-12 and d[i] > 0):
                d[i] = 0.0
        return d

    u = np.asarray(u0, float)
    val, g, _, sec = evaluate(u)
    trace = [{names[0]: u[0], names[1]: u[1], "soft_steps": val, "steps": best["steps"],
              "accepted": True}]
    chosen, delta = best, 0.5
    for _ in range(budget - 1):
        d = direction(u, g)
        if not np.all(np.isfinite(d)) or not np.any(d):
            break
        cand = project(u + delta * scale * d / np.max(np.abs(d)))
        if np.allclose(cand, u, rtol=0, atol=1e-9):
            delta *= 0.5
            continue
        val_c, g_c, ev, s = evaluate(cand)
        sec += s
        row = make_row(cand, ev)
        rows.append(row)
        curves[id(row)] = np.asarray(ev.loss)
        accepted = math.isfinite(val_c) and val_c < val
        trace.append({names[0]: cand[0], names[1]: cand[1], "soft_steps": val_c,
                      "steps": row["steps"], "accepted": accepted})
        if row["admissible"] and (row["seconds"], row["soft_steps"]) < (
                chosen["seconds"], chosen["soft_steps"]):
            chosen = row
        if accepted:
            u, val, g, delta = cand, val_c, g_c, min(1.5 * delta, 2.0)
        else:
            delta *= 0.5
    if chosen is not best and not chosen["seconds"] < best["seconds"]:
        chosen = best  # the hard time did not improve: keep the grid point
    return chosen, trace, sec


def _timed(exe, args):
    """(soft time, gradient, evaluation, run seconds) of a compiled ``value_and_grad``."""
    t0 = time.perf_counter()
    (val, ev), g = jax.device_get(jax.block_until_ready(exe(*args)))
    return float(val), np.asarray(g, float), ev, time.perf_counter() - t0


def _one(ev):
    """An evaluation as the row of a one-configuration grid (``_row``'s ``out``, ``i`` = 0)."""
    return jax.tree.map(lambda a: np.asarray(a)[None], ev)


def _refine(best, data, static, lam, n, target, tau, dtype, budget, step_log, m_range, sps,
            loss, rows, curves, compiled, k_range, kappa_eff_max=None):
    """:func:`_descend` in (log η, m) for constant-η SGD.

    Coordinates are scaled by (grid spacing of log κ, 0.1). m stays in ``m_range`` (the span
    of the grid's momenta: fixed when the grid has one), raised where needed so that the edge
    is above κ_min, and κ in [κ_best·e^(−10 cells), (1 − EDGE_MARGIN)·edge(m)] ∩ ``k_range``
    (the grid's κ range, the user's kappa_range); with ``kappa_eff_max`` the edge is at most
    kappa_eff_max·(1 − m) (``_edge``), and m is lowered where needed to keep that above κ_min.
    """
    k_lo, k_hi = k_range
    low = max(math.log(best["kappa"]) - 10 * step_log, math.log(k_lo))
    to_lr = math.log(n / lam)
    # the heavy-ball edge is edge(0)·(1 + m): below this m it is under κ_min (projecting κ
    # there would leave the range or the edge)
    m_edge = k_lo / ((1 - EDGE_MARGIN) * _edge(0.0, loss)) - 1.0
    m_range = (min(max(m_range[0], m_edge), m_range[1]), m_range[1])
    if kappa_eff_max is not None:  # the cap kappa_eff_max·(1 − m) falls with m
        m_cap = 1.0 - k_lo / ((1 - EDGE_MARGIN) * kappa_eff_max)
        m_range = (m_range[0], max(min(m_range[1], m_cap), m_range[0]))

    def bounds(u):
        high = min(math.log((1 - EDGE_MARGIN) * _edge(u[1], loss, kappa_eff_max)),
                   math.log(k_hi))
        return (low + to_lr, max(low, high) + to_lr), m_range

    def evaluate(u):
        args = (jnp.asarray(u, dtype), data, target, tau)
        return _timed(compiled(_surrogate_grad, *args, **static)[0], args)

    def make_row(u, ev):  # η within the range's (e^(log hi) may pass hi by a rounding)
        lr = min(max(math.exp(u[0]), k_lo * n / lam), k_hi * n / lam)
        return _row(best["b"], n, lr, float(u[1]), lam, _one(ev), 0, sps, loss, "refine",
                    kappa_eff_max)

    return _descend(best, [math.log(best["learning_rate"]), best["momentum"]], evaluate,
                    bounds, np.array([step_log, 0.1]), budget, make_row,
                    ("log_learning_rate", "momentum"), rows, curves)
