"""Deterministic function-space ODE (eq. 1 without noise), integrated with diffrax.

    df/dt = −η'(t) [Θ ∇_f L(f) + λ' p],       df_test/dt = −η'(t) [Θ(x_test, x) ∇_f L(f)
                                                                  + λ' p_test]

with L the MEAN loss (cross-entropy or MSE) and t in optimiser steps, so the curve at t = k is
comparable with step k of real training. Momentum enters through the effective learning rate
η'(t) = η(t)/(1 − m) (Sec. 3.1); heavy ball from a zero velocity lags this ODE by about
m/(1 − m) steps, so the exact discrete recursion is preferred for m > 0.

Schedules and weight decay (``ntk_tt.sgd(schedule, m, weight_decay=λ)``, METHOD.md §11).
η(t) is the schedule evaluated at real t (in optimiser steps; a constant η without one). The
η → 0 limit of the exact recursion of :mod:`ntk_tt.dynamics._optim_linear`
(h_{t+1} = m h_t + Θ g + λ_2 p_t, f_{t+1} = f_t − η_t(h_{t+1} + λ_d p_t), p = J θ): the
velocity image follows its quasi-static value h ≈ (Θ g + λ_2 p)/(1 − m), so L2 decay (in the
loss) is amplified by momentum and decoupled decay (added after the momentum trace) is not:

    df/dt = −η(t)/(1 − m)·(Θ g + λ_2 p) − η(t) λ_d p,    i.e.   λ' = λ_2 + (1 − m) λ_d,

with p = a + (f − f_0), a = J·θ_0 (p_test = a_test + (f_test − f_test,0)); Nesterov has the
same limit. Without decay λ' = 0 and the equation is the one above with η'(t).

Solver: Tsit5 with a PID controller (rtol = atol = 1e-6 in float64, 1e-5 in float32), saved at
the integer steps; with a warmup-cosine or warmup-stable-decay schedule it steps exactly to the
schedule's corners (end of warmup, start and end of the decay), where η(t) has a kink that the
error estimate would otherwise step across (measured: 5e-5 relative loss error after a corner
against 2e-7 without; a callable's corners are unknown and left to the controller).
Gradients through the solve use diffrax's default ``RecursiveCheckpointAdjoint``
(``BacksolveAdjoint`` integrates the contracting ODE backwards and blows up).
``throw=False``: a failed solve comes back as non-finite curves, which the caller reports as
divergence, so one bad member of a ``vmap`` does not kill the sweep.
"""

from __future__ import annotations

import diffrax
import jax.numpy as jnp

from ntk_tt._schedules import Schedule, WarmupCosine, WarmupStableDecay
from ntk_tt.dynamics._fspace import mean_grad, theta_dot


def rate_at(learning_rate, t, dtype):
    """η(t): ``learning_rate`` itself (a scalar, constant η), or a :class:`ntk_tt.Schedule`
    evaluated at (real) ``t`` in optimiser steps, in ``dtype``."""
    if isinstance(learning_rate, Schedule):
        return jnp.asarray(learning_rate(t), dtype)
    return learning_rate


def effective_rate(learning_rate, momentum, t, dtype):
    """η'(t) = η(t)/(1 − m) (:func:`rate_at`)."""
    return rate_at(learning_rate, t, dtype) / (1.0 - momentum)


def _controller(learning_rate, steps: int, tol: float, dtype):
    """The PID controller, clipped to step exactly to a warmup schedule's corners (times in
    ``dtype``, that of the save times)."""
    pid = diffrax.PIDController(rtol=tol, atol=tol)
    if isinstance(learning_rate, WarmupCosine):
        corners = [learning_rate.warmup, learning_rate.decay_steps]
    elif isinstance(learning_rate, WarmupStableDecay):
        corners = [learning_rate.warmup, learning_rate.decay_start,
                   learning_rate.decay_start + learning_rate.decay_steps]
    else:
        return pid
    corners = jnp.sort(jnp.clip(jnp.stack(corners).astype(dtype), 0.0, float(steps)))
    return diffrax.ClipStepSizeController(pid, step_ts=corners)


def with_decay(move, lam, f, f_start, tangent):
    """``move`` + λ'·p with p = tangent + (f − f_start) (J·θ_t), or ``move`` when no decay
    (``tangent`` None)."""
    return move if tangent is None else move + lam * (tangent + (f - f_start))


def ode_trajectory(
    op, f0, y, *, learning_rate, momentum, steps, loss, test_op=None, f0_test=None,
    decay=None, max_steps=16384,
):
    """Integrate the gradient-flow ODE of the linearised model over ``steps`` optimiser steps.

    Args:
      op: training kernel ``(mat, traced)``. f0: logits (N, C). y: labels (N,).
      learning_rate: η (scalar, traceable) or a :class:`ntk_tt.Schedule` η(t) of real t.
      momentum: m (scalar, traceable). steps, loss: static.
      test_op, f0_test: optional cross kernel and held-out logits (N_test, C).
      decay: None, or (λ', a, a_test): the effective decay λ_2 + (1 − m)λ_d (module
        docstring), J·θ_0 (N, C) and on the held-out inputs (N_test, C) (or None).
      max_steps: diffrax's cap on solver steps.

    Returns:
      ``(fs, fs_test)``: (steps + 1, N, C) and (steps + 1, N_test, C) or None; NaN where the
      solve failed.
    """
    lam, a, a_test = (None, None, None) if decay is None else decay
    dtype = f0.dtype
    # a constant η' once, outside the solver loop (as the shorthand always did: same bits)
    constant = None if isinstance(learning_rate, Schedule) else learning_rate / (1.0 - momentum)

    def drift(t, state, args):
        f, ft = state
        eta = constant if constant is not None else effective_rate(learning_rate, momentum, t,
                                                                   dtype)
        g = mean_grad(f, y, loss)
        dt = None
        if test_op is not None:
            dt = -eta * with_decay(theta_dot(*test_op, g), lam, ft, f0_test, a_test)
        return -eta * with_decay(theta_dot(*op, g), lam, f, f0, a), dt

    tol = 1e-6 if dtype == jnp.float64 else 1e-5
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(drift),
        diffrax.Tsit5(),
        t0=0.0,
        t1=float(steps),
        dt0=None,
        y0=(f0, f0_test),
        saveat=diffrax.SaveAt(ts=jnp.arange(steps + 1, dtype=dtype)),
        stepsize_controller=_controller(learning_rate, steps, tol, dtype),
        max_steps=max_steps,
        throw=False,
    )
    ok = sol.result == diffrax.RESULTS.successful
    fs, fts = sol.ys
    fs = jnp.where(ok, fs, jnp.nan)
    fts = jnp.where(ok, fts, jnp.nan) if fts is not None else None
    return fs, fts
