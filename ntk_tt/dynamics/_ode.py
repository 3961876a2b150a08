"""Deterministic function-space ODE (eq. 1 without noise), integrated with diffrax.

    df/dt = −η' Θ ∇_f L(f),    df_test/dt = −η' Θ(x_test, x) ∇_f L(f)

with L the MEAN loss (cross-entropy or MSE) and t in optimiser steps, so the curve at t = k is
comparable with step k of real training. Momentum enters through the effective learning rate
η' = η/(1 − m) (Sec. 3.1); heavy ball from a zero velocity lags this ODE by about m/(1 − m)
steps, so the exact discrete recursion is preferred for m > 0.

Solver: Tsit5 with a PID controller (rtol = atol = 1e-6 in float64, 1e-5 in float32), saved at
the integer steps; gradients through the solve use diffrax's default
``RecursiveCheckpointAdjoint`` (``BacksolveAdjoint`` integrates the contracting ODE backwards
and blows up). ``throw=False``: a failed solve comes back as non-finite curves, which the
caller reports as divergence, so one bad member of a ``vmap`` does not kill the sweep.
"""

from __future__ import annotations

import diffrax
import jax.numpy as jnp

from ntk_tt.dynamics._fspace import mean_grad, theta_dot


def ode_trajectory(
    op, f0, y, *, learning_rate, momentum, steps, loss, test_op=None, f0_test=None,
    max_steps=16384,
):
    """Integrate the gradient-flow ODE of the linearised model over ``steps`` optimiser steps.

    Args:
      op: training kernel ``(mat, traced)``. f0: logits (N, C). y: labels (N,).
      learning_rate, momentum: scalars (traceable). steps, loss: static.
      test_op, f0_test: optional cross kernel and held-out logits (N_test, C).
      max_steps: diffrax's cap on solver steps.

    Returns:
      ``(fs, fs_test)``: (steps + 1, N, C) and (steps + 1, N_test, C) or None; NaN where the
      solve failed.
    """
    eta = learning_rate / (1.0 - momentum)

    def drift(t, state, args):
        f, _ = state
        g = mean_grad(f, y, loss)
        dt = -eta * theta_dot(*test_op, g) if test_op is not None else None
        return -eta * theta_dot(*op, g), dt

    tol = 1e-6 if f0.dtype == jnp.float64 else 1e-5
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(drift),
        diffrax.Tsit5(),
        t0=0.0,
        t1=float(steps),
        dt0=None,
        y0=(f0, f0_test),
        saveat=diffrax.SaveAt(ts=jnp.arange(steps + 1, dtype=f0.dtype)),
        stepsize_controller=diffrax.PIDController(rtol=tol, atol=tol),
        max_steps=max_steps,
        throw=False,
    )
    ok = sol.result == diffrax.RESULTS.successful
    fs, fts = sol.ys
    fs = jnp.where(ok, fs, jnp.nan)
    fts = jnp.where(ok, fts, jnp.nan) if fts is not None else None
    return fs, fts
