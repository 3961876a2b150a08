"""The predicted loss curve of one :func:`ntk_tt.suggest` configuration (η, m) from the shared
kernel, its hard time to the target and the differentiable surrogate of that time, compiled
over a grid (``jit(vmap)``) and for ``jax.value_and_grad`` (the refinement)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ntk_tt.dynamics._divergence import divergence, first_nonfinite, hold_from, paths_outcome
from ntk_tt.dynamics._losses import logit_residual, mean_loss


def soft_time_to_target(curve, target, *, temperature=0.05):
    """Differentiable count of the steps before a loss curve first reaches ``target``.

    Σ_t Π_{s≤t} σ((L_s − L*) / (τ·(L_0 − L*))) over t = 0..T: each factor is ~1 while the curve
    is above the target and ~0 once it is below, so the sum tends, as τ → 0, to the hard
    t* = min{t : L_t ≤ L*} (T + 1 when the curve never gets there). The construction of
    :func:`ntk_tt.smooth_training_time`, applied to the hit of a fixed target rather than to
    ε·(L_0 − L_T). Jittable; ``jax.grad`` flows to the curve (and through it to η and m).

    Args:
      curve: 1-D mean-loss curve (T + 1,), index = optimiser steps. target: L* < L_0.
      temperature: τ > 0, relative to L_0 − L*.

    Returns:
      A scalar: fractional optimiser steps.
    """
    gap = (curve - target) / (temperature * (curve[0] - target))
    return jnp.sum(jnp.exp(jnp.cumsum(jax.nn.log_sigmoid(gap))))


class _Eval(NamedTuple):
    loss: jax.Array  # (T + 1,) mean over paths of the held curves
    diverged: jax.Array  # bool
    steps: jax.Array  # first t with loss_t ≤ target, NaN if none
    soft: jax.Array  # soft_time_to_target
    outcome: jax.Array  # int32 code of OUTCOMES (paths_outcome): converges, catapult, diverges
    spike: jax.Array  # int32 step of the spike (catapult / divergence), −1 if none


def _head_losses(hk, y, batches, lr, m, loss):
    """Mean training loss (T + 1,) of the head-aware model along one batch sequence (T, B):
    :func:`ntk_tt.dynamics._predict_head_aware.head_aware_trajectory` recording only the loss."""
    from ntk_tt.dynamics._predict_head_aware import head_aware_step, initial_state, logits

    def step(state, idx):
        state = head_aware_step(state, idx, hk, y, learning_rate=lr, momentum=m,
                                nesterov=False, loss=loss)
        return state, mean_loss(logits(hk, state), y, loss)

    s0 = initial_state(hk)
    _, ls = jax.lax.scan(step, s0, batches)
    return jnp.concatenate([mean_loss(logits(hk, s0), y, loss)[None], ls])


def _linear_losses(mat, traced, f0, y, batches, lr, m, loss):
    """Mean training loss (T + 1,) of the linearised model along one batch sequence: the
    heavy-ball recursion of :func:`ntk_tt.dynamics._discrete.discrete_trajectory`, loss only."""
    from ntk_tt.dynamics._fspace import theta_cols_dot, theta_dot

    n = f0.shape[0]
    full_batch = batches.shape[1] == n

    def step(carry, idx):
        f, h = carry
        if full_batch:
            d = theta_dot(mat, traced, logit_residual(f, y, loss) / n)
        else:
            g_b = logit_residual(f[idx], y[idx], loss) / idx.shape[0]
            d = theta_cols_dot(mat, traced, idx, g_b)
        h = m * h + d
        f = f - lr * h
        return (f, h), mean_loss(f, y, loss)

    _, ls = jax.lax.scan(step, (f0, jnp.zeros_like(f0)), batches)
    return jnp.concatenate([mean_loss(f0, y, loss)[None], ls])


def _evaluate(data, lr, m, target, temperature, *, kind, traced, loss) -> _Eval:
    """One configuration (η, m): its loss curve per path, then :func:`_summary`."""
    if kind == "head_aware":
        hk, y, batches = data
        paths = jax.vmap(lambda b: _head_losses(hk, y, b, lr, m, loss))(batches)
    else:
        mat, f0, y, batches = data
        paths = jax.vmap(lambda b: _linear_losses(mat, traced, f0, y, b, lr, m, loss))(batches)
    return _summary(paths, target, temperature)


def _summary(paths, target, temperature) -> _Eval:
    """Loss curves per path (P, T + 1) → divergence (on the raw curves), curves held past a
    non-finite loss, their mean, the hard and the soft time to the target, and the predicted
    outcome (:func:`ntk_tt.dynamics._divergence.paths_outcome`: a catapult rises above L_0)."""
    diverged = jnp.any(divergence(paths).diverged)
    held = jax.vmap(hold_from)(paths, first_nonfinite(paths))
    curve = jnp.mean(held, axis=0)
    hit = curve <= target
    steps = jnp.where(jnp.any(hit), jnp.argmax(hit).astype(curve.dtype), jnp.nan)
    said = paths_outcome(paths, curve)
    return _Eval(curve, diverged, steps, soft_time_to_target(curve, target,
                                                             temperature=temperature),
                 said.outcome, said.spike_step)


_STATIC = ("kind", "traced", "loss")


def _grid(data, lrs, ms, target, temperature, *, kind, traced, loss) -> _Eval:
    """:func:`_evaluate` vmapped over the configurations (η, m) (G,), one shared kernel."""

    def one(lr, m):
        return _evaluate(data, lr, m, target, temperature, kind=kind, traced=traced, loss=loss)

    return jax.vmap(one)(lrs, ms)


_grid_jit = jax.jit(_grid, static_argnames=_STATIC)


def _surrogate(u, data, target, temperature, *, kind, traced, loss):
    """Soft time to the target (steps) as a function of u = (log η, m), with the evaluation."""
    ev = _evaluate(data, jnp.exp(u[0]), u[1], target, temperature, kind=kind, traced=traced,
                   loss=loss)
    return ev.soft, ev


_surrogate_grad = jax.jit(jax.value_and_grad(_surrogate, has_aux=True), static_argnames=_STATIC)


def _edge(m: float, loss: str, kappa_eff_max: float | None = None,
          nesterov: bool = False) -> float:
    """Largest κ :func:`ntk_tt.suggest` may choose at momentum m: the stability edge
    (``_divergence.stability_edge``; heavy ball unless ``nesterov``), and with
    ``kappa_eff_max`` at most ``kappa_eff_max``·(1 − m) (the effective κ̃ = κ/(1 − m)
    capped)."""
    from ntk_tt.dynamics._divergence import stability_edge as edge

    stable = float(edge(m, nesterov, loss))
    return stable if kappa_eff_max is None else min(stable, capped(kappa_eff_max, m))


def capped(kappa_eff_max: float, m: float) -> float:
    """The largest κ at momentum m within ``kappa_eff_max`` on κ̃ = κ/(1 − m), with 1e-9
    relative slack: a grid point computed as η·λ_max/N lands on a cap it was chosen at only
    within float rounding (κ̃ = 5.0000000000000009 against a cap of 5, a fresh user's find)."""
    return kappa_eff_max * (1.0 - m) * (1.0 + 1e-9)
