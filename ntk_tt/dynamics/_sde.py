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

Solver choice: Euler–Maruyama (as in the paper) with a constant step dt = 1, so the mean
path is exactly the discrete GD recursion and every save time is a grid point. The Brownian
motion is ``UnsafeBrownianPath`` with ``ForwardMode`` adjoint: fixed-step Euler queries each
increment once, and the alternative ``VirtualBrownianTree`` was measured ~14× slower here for a
300-step solve (diffrax issue #517). Consequence: forward-mode differentiation only
(``jax.jacfwd``), not ``jax.grad``, through the SDE; use the discrete SGD recursion for reverse
mode. Held-out logits are driven by the noisy training gradient (no noise of their own):
f_test,t+1 = f_test,t − η' Θ(x_test, x) ∇_f L(f_t).
"""

from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp

from ntk_tt.dynamics._fspace import mean_grad, theta_dot


def diffusion_scale(learning_rate, momentum, batch_size: int, n: int):
    """(η'/√B)·ρ: the constant in front of s(f)·G dW'."""
    rho = jnp.sqrt((n - batch_size) / max(n - 1, 1))
    return learning_rate / (1.0 - momentum) / jnp.sqrt(batch_size) * rho


def sde_path(op, f0, y, noise_features, key, *, learning_rate, momentum, batch_size, steps,
             loss, rescale=True):
    """One Euler–Maruyama path of the SDE, saved at every step: logits (steps + 1, N, C)."""
    n, c = f0.shape
    eta = learning_rate / (1.0 - momentum)
    scale = diffusion_scale(learning_rate, momentum, batch_size, n)
    g0_norm = jnp.maximum(jnp.linalg.norm(mean_grad(f0, y, loss)), jnp.finfo(f0.dtype).tiny)
    g_mat = noise_features.reshape(n, c, -1)

    def drift(t, f, args):
        return -eta * theta_dot(*op, mean_grad(f, y, loss))

    def diffusion(t, f, args):
        s = jnp.where(rescale, jnp.linalg.norm(mean_grad(f, y, loss)) / g0_norm, 1.0)
        return (scale * s) * g_mat

    # increments in f0's dtype: by default they are the default float (float64 under x64)
    noise = jax.ShapeDtypeStruct((noise_features.shape[1],), f0.dtype)
    brownian = diffrax.UnsafeBrownianPath(shape=noise, key=key)
    terms = diffrax.MultiTerm(diffrax.ODETerm(drift), diffrax.ControlTerm(diffusion, brownian))
    sol = diffrax.diffeqsolve(
        terms,
        diffrax.Euler(),
        t0=0.0,
        t1=float(steps),
        dt0=1.0,
        y0=f0,
        saveat=diffrax.SaveAt(ts=jnp.arange(steps + 1, dtype=f0.dtype)),
        adjoint=diffrax.ForwardMode(),
        max_steps=steps + 1,
        throw=False,
    )
    return jnp.where(sol.result == diffrax.RESULTS.successful, sol.ys, jnp.nan)


def sde_paths(op, f0, y, noise_features, *, key, num_paths, learning_rate, momentum,
              batch_size, steps, loss, test_op=None, f0_test=None, rescale=True):
    """``num_paths`` independent paths in one vmapped solve; path p uses
    ``jax.random.split(key, num_paths)[p]``.

    Returns:
      ``(fs, fs_test)``: (num_paths, steps + 1, N, C) and (num_paths, steps + 1, N_test, C)
      or None.
    """
    def one(k):
        return sde_path(op, f0, y, noise_features, k, learning_rate=learning_rate,
                        momentum=momentum, batch_size=batch_size, steps=steps, loss=loss,
                        rescale=rescale)

    fs = jax.vmap(one)(jax.random.split(key, num_paths))
    if test_op is None:
        return fs, None
    eta = learning_rate / (1.0 - momentum)

    def test_logits(path):
        grads = jax.vmap(lambda f: mean_grad(f, y, loss))(path[:-1])
        moves = jax.vmap(lambda g: theta_dot(*test_op, g))(grads)
        return jnp.concatenate([f0_test[None], f0_test - eta * jnp.cumsum(moves, axis=0)])

    return fs, jax.vmap(test_logits)(fs)
