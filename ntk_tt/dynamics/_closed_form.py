"""MSE closed form from one eigendecomposition of Θ (Prop. 2, METHOD.md §2 and §4).

For the mean MSE loss L = (1/N) Σ_i ½‖f_i − y_i‖², ∇_f L = r/N with r = f − Y, so GD reads
r_{t+1} = (I − (η'/N) Θ) r_t. With Θ = Σ_k λ_k v_k v_kᵀ and a_k = v_k·r_0:

    exact discrete:   r_t = Σ_k (1 − q_k)^t a_k v_k,      q_k = η' λ_k / N
    continuous time:  r_t = Σ_k exp(−q_k t) a_k v_k,       t in optimiser steps
    L_t = (1/2N) Σ_k decay_k(t)² a_k²

η' = η/(1 − m) is the effective learning rate (Sec. 3.1), exact for m = 0. Held-out logits:
f_test(t) = f_test(0) − (η'/N) Θ(x_test, x) Σ_k S_k(t) a_k v_k with S_k(t) = (1 − decay_k(t))/q_k
(= t when λ_k = 0), the sum (discrete) or integral (continuous) of decay_k.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ntk_tt.dynamics._fspace import theta_dot


def _project(v: jax.Array, traced: bool, r: jax.Array) -> jax.Array:
    """Eigen-coefficients a: (K, C) for a traced kernel, (K,) for the full one."""
    return v.T @ (r if traced else r.reshape(-1))


def _expand(v, traced, coeff, shape):
    """Σ_k coeff[t, k] a_k v_k back to logits, for every t: (T + 1, N, C)."""
    if traced:
        return jnp.einsum("nk,tkc->tnc", v, coeff)
    return (coeff @ v.T).reshape((coeff.shape[0],) + shape)


def mse_closed_form(
    op, f0, y, *, learning_rate, momentum, steps, discrete=True, test_op=None, f0_test=None
):
    """Training (and held-out) logits of GD on the linearised model with MSE, in closed form.

    Args:
      op: training kernel ``(mat, traced)``. f0: logits (N, C). y: labels (N,).
      learning_rate, momentum: scalars (traceable); momentum enters through η/(1 − m).
      steps: T (static). discrete: (1 − q)^t form if True, exp(−q t) otherwise.
      test_op, f0_test: optional cross kernel and held-out logits (N_test, C).

    Returns:
      ``(fs, fs_test, (min_eigenvalue, max_eigenvalue))``: (T + 1, N, C), (T + 1, N_test, C)
      or None, and the extreme eigenvalues of Θ before negative ones were clamped to zero.
    """
    mat, traced = op
    n, c = f0.shape
    lam, v = jnp.linalg.eigh(0.5 * (mat + mat.T))
    extremes = (lam[0], lam[-1])
    lam = jnp.maximum(lam, 0.0)
    r0 = f0 - jax.nn.one_hot(y, c, dtype=f0.dtype)
    a = _project(v, traced, r0)
    q = learning_rate / (1.0 - momentum) * lam / n
    t = jnp.arange(steps + 1, dtype=f0.dtype)[:, None]
    if discrete:
        factors = jnp.broadcast_to(1.0 - q, (steps, q.shape[0]))
        decay = jnp.concatenate([jnp.ones_like(q)[None], jnp.cumprod(factors, axis=0)])
    else:
        decay = jnp.exp(-q * t)
    scale = decay[..., None] if traced else decay
    fs = f0 - r0 + _expand(v, traced, scale * a, (n, c))
    if test_op is None:
        return fs, None, extremes
    positive = q > jnp.finfo(q.dtype).tiny * 1e6
    s = jnp.where(positive, (1.0 - decay) / jnp.where(positive, q, 1.0), t)
    s = s[..., None] if traced else s
    sums = _expand(v, traced, s * a, (n, c))
    eta = learning_rate / (1.0 - momentum) / n
    fts = f0_test - eta * jax.vmap(lambda r: theta_dot(*test_op, r))(sums)
    return fs, fts, extremes
