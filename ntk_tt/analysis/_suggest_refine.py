"""The ``jax.grad`` refinement of :func:`ntk_tt.suggest`'s best grid point in (log η, m)."""

from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt.analysis._suggest_curves import _edge, _surrogate_grad
from ntk_tt.analysis._suggest_report import _row

EDGE_MARGIN = 1e-3  # the refinement keeps κ ≤ (1 − EDGE_MARGIN)·edge(m)


def _refine(best, data, static, lam, n, target, tau, dtype, budget, step_log, m_range, sps,
            loss, rows, curves, compiled):
    """Projected normalised gradient descent on the soft time in (log η, m) from ``best``.

    Coordinates are scaled by (grid spacing of log κ, 0.1) and each step moves δ of them along
    the steepest descent direction (∞-norm; a component pushing out of an active bound is
    dropped), δ starting at ½ grid cell, ×1.5 after a step that lowers the surrogate, ×½ after
    one that does not. Every point is projected onto m ∈ ``m_range`` (the span of the grid's
    momenta: m stays fixed when the grid has one) and κ ∈ [κ_best·e^(−10 cells),
    (1 − EDGE_MARGIN)·edge(m)]. Returns (the best admissible point by hard time if it beats
    ``best`` strictly, else ``best``; the trace; run seconds without compilation).
    """
    scale = np.array([step_log, 0.1])
    log_k_min = math.log(best["kappa"]) - 10 * step_log

    def bounds(m):
        """(lowest, highest) log η at momentum m."""
        return (math.log(math.exp(log_k_min) * n / lam),
                math.log((1 - EDGE_MARGIN) * _edge(m, loss) * n / lam))

    def project(u):
        m = float(np.clip(u[1], *m_range))
        return np.array([float(np.clip(u[0], *bounds(m))), m])

    def direction(u, g):
        """Descent direction −g·scale without components leaving an active bound."""
        d = -g * scale
        lo, hi = bounds(u[1])
        for i, (low, high) in enumerate(((lo, hi), m_range)):
            if (u[i] <= low + 1e-12 and d[i] < 0) or (u[i] >= high - 1e-12 and d[i] > 0):
                d[i] = 0.0
        return d

    def evaluate(u):
        args = (jnp.asarray(u, dtype), data, target, tau)
        exe, _ = compiled(_surrogate_grad, *args, **static)
        t0 = time.perf_counter()
        (val, ev), g = jax.device_get(jax.block_until_ready(exe(*args)))
        return float(val), np.asarray(g, float), ev, time.perf_counter() - t0

    u = np.array([math.log(best["learning_rate"]), best["momentum"]])
    val, g, _, sec = evaluate(u)
    trace = [{"log_learning_rate": u[0], "momentum": u[1], "soft_steps": val,
              "steps": best["steps"], "accepted": True}]
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
        row = _row(best["b"], n, math.exp(cand[0]), float(cand[1]), lam,
                   jax.tree.map(lambda a: np.asarray(a)[None], ev), 0, sps, loss, "refine")
        rows.append(row)
        curves[id(row)] = np.asarray(ev.loss)
        accepted = math.isfinite(val_c) and val_c < val
        trace.append({"log_learning_rate": cand[0], "momentum": cand[1], "soft_steps": val_c,
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
