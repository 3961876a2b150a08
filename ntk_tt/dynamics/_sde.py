"""SGD as a function-space SDE (eq. 1) with the paper's cheap noise (Sec. 4), via diffrax.

    df = −η' Θ ∇_f L(f) dt + (η'/√B) · ρ · s(f) · G dW',     t in optimiser steps

* G (N·C, D') are the noise features J·diag(σ_w)·P/√D' (``noise_features``): G Gᵀ ≈
  J diag(σ_w²) Jᵀ, with σ_w² the per-parameter variance of the per-sample loss gradients at
  w0 (the diagonal of Σ in eq. 3) and W' a D'-dimensional Brownian motion.
* s(f) = ‖∇_f L(f)‖ / ‖∇_f L(f_0)‖ rescales the noise as training converges; without it the
  predicted loss plateaus (App. C, Fig. 8). ``rescale=False`` switches it off (ablation only;
  a bool or a traced bool array).
* ρ = √((N − B)/(N − 1)): the finite-population factor of sampling B of N without
  replacement, so B = N (GD) has no noise.
* η' = η/(1 − m): momentum through the effective learning rate in both terms (heavy ball
  averages the gradient noise of ~1/(1 − m) steps into each displacement).
* Schedules and weight decay (``ntk_tt.sgd(schedule, m, weight_decay=λ)``, METHOD.md §11):
  η'(t) = η(t)/(1 − m) with η(t) the schedule at real t, in the drift and the noise alike
  (the minibatch noise of a step is proportional to its step size), and the drift gains the
  decay term of :mod:`ntk_tt.dynamics._ode`, −η'(t) λ' p with p = a + (f − f_0),
  λ' = λ_2 + (1 − m) λ_d. The noise does not depend on λ (the penalty is deterministic):

      df = −η'(t) [Θ ∇_f L(f) + λ' p] dt + (η'(t)/√B) · ρ · s(f) · G dW'.

Solver choice: Euler–Maruyama (as in the paper) with a constant step dt = 1, so the mean
path is exactly the discrete GD recursion and every save time is a grid point. Fixed-step
Euler queries each Brownian increment once, over [k, k + 1]: they are drawn up front, as
diffrax's ``UnsafeBrownianPath`` draws them (the same numbers), and read back by step
(:class:`StepIncrements`), since ``UnsafeBrownianPath`` itself refuses reverse mode and the
alternative ``VirtualBrownianTree`` was measured ~14× slower here for a 300-step solve (diffrax
issue #517). With ``DirectAdjoint`` both ``jax.grad`` and ``jax.jacfwd`` go through the solve
(until session 42 it was ``ForwardMode``: ``jax.jacfwd`` only, and ``jax.grad`` ended in
diffrax's error). With dt = 1 the drift is evaluated at the integer steps, so η'(k) is the
schedule's η_k of step k and the B = N path is the discrete recursion with η_k/(1 − m) (the
step's time is rounded to its integer: ``DirectAdjoint``'s times can be an ulp off, which a
piecewise-constant schedule's corner would notice). Held-out logits are
driven by the noisy training gradient (no noise of their own):
f_test,k+1 = f_test,k − η'(k) [Θ(x_test, x) ∇_f L(f_k) + λ' p_test,k].
"""

from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp

from ntk_tt._schedules import Schedule
from ntk_tt.dynamics._fspace import mean_grad, theta_dot
from ntk_tt.dynamics._ode import effective_rate, rate_at, with_decay


class StepIncrements(diffrax.AbstractPath):
    """The Brownian increments of unit steps, W(k + 1) − W(k) = ``increments[k]`` (steps, D'),
    as a diffrax path that fixed-step (dt = 1) Euler queries over [k, k + 1]; unlike
    ``UnsafeBrownianPath`` it is an ordinary array, so reverse mode goes through it."""

    increments: jax.Array

    @property
    def t0(self):
        return 0

    @property
    def t1(self):
        return self.increments.shape[0]

    def evaluate(self, t0, t1=None, left=True):
        del t1, left  # always [k, k + 1]: the solve's constant step
        return self.increments[jnp.round(t0).astype(jnp.int32)]


def step_increments(key, steps: int, dim: int, dtype) -> StepIncrements:
    """The increments ``UnsafeBrownianPath(key)`` gives fixed-step Euler over [k, k + 1], k < steps
    (the numbers the SDE used before they were drawn up front)."""
    path = diffrax.UnsafeBrownianPath(shape=jax.ShapeDtypeStruct((dim,), dtype), key=key)
    ks = jnp.arange(steps, dtype=dtype)
    return StepIncrements(jax.vmap(lambda k: path.evaluate(k, k + 1.0))(ks))


def diffusion_scale(learning_rate, momentum, batch_size: int, n: int):
    """(η'/√B)·ρ: the factor in front of s(f)·G dW' (``learning_rate`` η or η(t))."""
    rho = jnp.sqrt((n - batch_size) / max(n - 1, 1))
    return learning_rate / (1.0 - momentum) / jnp.sqrt(batch_size) * rho


def sde_path(op, f0, y, noise_features, key, *, learning_rate, momentum, batch_size, steps,
             loss, rescale=True, decay=None):
    """One Euler–Maruyama path of the SDE, saved at every step: logits (steps + 1, N, C).
    ``learning_rate``: η or a :class:`ntk_tt.Schedule`; ``decay``: None or (λ', a, a_test)
    (:func:`ntk_tt.dynamics._ode.ode_trajectory`)."""
    n, c = f0.shape
    lam, a = (None, None) if decay is None else decay[:2]
    g0_norm = jnp.maximum(jnp.linalg.norm(mean_grad(f0, y, loss)), jnp.finfo(f0.dtype).tiny)
    g_mat = noise_features.reshape(n, c, -1)

    def drift(t, f, args):
        eta = effective_rate(learning_rate, momentum, jnp.round(t), f0.dtype)
        return -eta * with_decay(theta_dot(*op, mean_grad(f, y, loss)), lam, f, f0, a)

    def diffusion(t, f, args):
        scale = diffusion_scale(rate_at(learning_rate, jnp.round(t), f0.dtype), momentum,
                                batch_size, n)
        s = jnp.where(rescale, jnp.linalg.norm(mean_grad(f, y, loss)) / g0_norm, 1.0)
        return (scale * s) * g_mat

    # increments in f0's dtype: by default they are the default float (float64 under x64)
    brownian = step_increments(key, steps, noise_features.shape[1], f0.dtype)
    terms = diffrax.MultiTerm(diffrax.ODETerm(drift), diffrax.ControlTerm(diffusion, brownian))
    sol = diffrax.diffeqsolve(
        terms,
        diffrax.Euler(),
        t0=0.0,
        t1=float(steps),
        dt0=1.0,
        y0=f0,
        saveat=diffrax.SaveAt(ts=jnp.arange(steps + 1, dtype=f0.dtype)),
        adjoint=diffrax.DirectAdjoint(),  # jax.grad and jax.jacfwd alike
        max_steps=steps + 1,
        throw=False,
    )
    return jnp.where(sol.result == diffrax.RESULTS.successful, sol.ys, jnp.nan)


def sde_paths(op, f0, y, noise_features, *, key, num_paths, learning_rate, momentum,
              batch_size, steps, loss, test_op=None, f0_test=None, rescale=True, decay=None):
    """``num_paths`` independent paths in one vmapped solve; path p uses
    ``jax.random.split(key, num_paths)[p]``. ``learning_rate``, ``decay``: as
    :func:`sde_path` (``decay``'s a_test drives the held-out logits).

    Returns:
      ``(fs, fs_test)``: (num_paths, steps + 1, N, C) and (num_paths, steps + 1, N_test, C)
      or None.
    """
    def one(k):
        return sde_path(op, f0, y, noise_features, k, learning_rate=learning_rate,
                        momentum=momentum, batch_size=batch_size, steps=steps, loss=loss,
                        rescale=rescale, decay=decay)

    fs = jax.vmap(one)(jax.random.split(key, num_paths))
    if test_op is None:
        return fs, None
    if decay is None and not isinstance(learning_rate, Schedule):
        eta = learning_rate / (1.0 - momentum)

        def test_logits(path):
            grads = jax.vmap(lambda f: mean_grad(f, y, loss))(path[:-1])
            moves = jax.vmap(lambda g: theta_dot(*test_op, g))(grads)
            return jnp.concatenate([f0_test[None], f0_test - eta * jnp.cumsum(moves, axis=0)])

        return fs, jax.vmap(test_logits)(fs)
    lam, _, a_test = (None, None, None) if decay is None else decay
    t = jnp.arange(steps, dtype=f0.dtype)
    etas = effective_rate(learning_rate, momentum, t, f0.dtype) * jnp.ones_like(t)

    def test_logits(path):
        def step(ft, inputs):
            f, eta = inputs
            move = with_decay(theta_dot(*test_op, mean_grad(f, y, loss)), lam, ft, f0_test,
                              a_test)
            ft = ft - eta * move
            return ft, ft

        _, fts = jax.lax.scan(step, f0_test, (path[:-1], etas))
        return jnp.concatenate([f0_test[None], fts])

    return fs, jax.vmap(test_logits)(fs)
