"""MSE closed form from one eigendecomposition of Θ (Prop. 2, METHOD.md §2 and §4).

For the mean MSE loss L = (1/N) Σ_i ½‖f_i − y_i‖², ∇_f L = r/N with r = f − Y, so GD reads
r_{t+1} = (I − (η'/N) Θ) r_t. With Θ = Σ_k λ_k v_k v_kᵀ and a_k = v_k·r_0:

    exact discrete:   r_t = Σ_k (1 − q_k)^t a_k v_k,      q_k = η' λ_k / N
    continuous time:  r_t = Σ_k exp(−q_k t) a_k v_k,       t in optimiser steps
    L_t = (1/2N) Σ_k decay_k(t)² a_k²

η' = η/(1 − m) is the effective learning rate (Sec. 3.1), exact for m = 0. Held-out logits:
f_test(t) = f_test(0) − (η'/N) Θ(x_test, x) Σ_k S_k(t) a_k v_k with S_k(t) = (1 − decay_k(t))/q_k
(= t when λ_k = 0), the sum (discrete) or integral (continuous) of decay_k.

Schedules and weight decay (``ntk_tt.sgd(schedule, m, weight_decay=λ)``, METHOD.md §11),
:func:`mse_schedule_closed_form`: the same exact discrete form with the step's own
η'_t = η_t/(1 − m) (η_t the schedule at step t, as the real run) and the decay of
:mod:`ntk_tt.dynamics._ode`, λ' = λ_2 + (1 − m) λ_d, p = a + (f − f_0) (a = J·θ_0):
r_{t+1} = r_t − η'_t [(Θ/N + λ') r_t + λ' c] with c = a + Y − f_0. Its fixed point
r* = −λ' (Θ/N + λ')⁻¹ c does not depend on t, so with μ_k = λ_k/N + λ',

    r_t = r* + Σ_k Π_{s<t} (1 − η'_s μ_k) (a_k − r*_k) v_k,      r*_k = −λ' c_k / μ_k

(r*_k = 0 where μ_k = 0, which needs λ' = 0). Held-out, with q = p_test = a_test + (f_test −
f_test,0): q_{t+1} = (1 − η'_t λ') q_t − (η'_t/N) Θ(x_test, x) r_t, i.e. q_t = α_t a_test −
(1/N) Θ(x_test, x) Σ_k w_{t,k} v_k with α_{t+1} = (1 − η'_t λ') α_t, α_0 = 1 and
w_{t+1} = (1 − η'_t λ') w_t + η'_t r_{t,k}, w_0 = 0 (a scan over T of K numbers). Exact GD
(m = 0) on the linearised model with any schedule and decay: the recursion of
:func:`ntk_tt.sgd_trajectory` with B = N. The continuous-time limit (``method="ode"``) is
r(t) − r* = exp(−(Θ/N + λ') ∫_0^t η'(s) ds)(r_0 − r*).
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


def mse_schedule_closed_form(op, f0, y, *, rates, decay=None, test_op=None, f0_test=None):
    """:func:`mse_closed_form` (exact discrete form) for per-step effective learning rates and
    weight decay (module docstring).

    Args:
      op: training kernel ``(mat, traced)``. f0: logits (N, C). y: labels (N,).
      rates: η'_t = η_t/(1 − m) for t = 0 … T − 1, (T,) (T = steps).
      decay: None, or (λ', a, a_test): λ_2 + (1 − m) λ_d, J·θ_0 (N, C) and on the held-out
        inputs (N_test, C) (None without them).
      test_op, f0_test: optional cross kernel and held-out logits (N_test, C).

    Returns:
      As :func:`mse_closed_form`: (T + 1, N, C), (T + 1, N_test, C) or None, (λ_min, λ_max).
    """
    mat, traced = op
    n, c = f0.shape
    lam, v = jnp.linalg.eigh(0.5 * (mat + mat.T))
    extremes = (lam[0], lam[-1])
    lam = jnp.maximum(lam, 0.0)
    target = jax.nn.one_hot(y, c, dtype=f0.dtype)
    coeff0 = _project(v, traced, f0 - target)
    wd = jnp.zeros((), f0.dtype) if decay is None else decay[0]
    mu = lam / n + wd
    col = (lambda x: x[..., None]) if traced else (lambda x: x)
    rstar = jnp.zeros_like(coeff0)
    if decay is not None:
        ck = _project(v, traced, decay[1] + target - f0)
        pos = mu > 0
        rstar = jnp.where(col(pos), -wd * ck / col(jnp.where(pos, mu, 1.0)), 0.0)
    decays = jnp.concatenate([jnp.ones_like(mu)[None],
                              jnp.cumprod(1.0 - rates[:, None] * mu, axis=0)])
    coeffs = rstar + col(decays) * (coeff0 - rstar)  # r_t's coefficients, (T + 1, K[, C])
    fs = target + _expand(v, traced, coeffs, (n, c))
    if test_op is None:
        return fs, None, extremes

    def step(carry, inputs):
        alpha, w = carry
        eta, coeff = inputs
        keep = 1.0 - eta * wd
        carry = (keep * alpha, keep * w + eta * coeff)
        return carry, carry

    init = (jnp.ones((), f0.dtype), jnp.zeros_like(coeff0))
    _, (alphas, ws) = jax.lax.scan(step, init, (rates, coeffs[:-1]))
    alphas = jnp.concatenate([init[0][None], alphas])
    ws = jnp.concatenate([init[1][None], ws])
    sums = _expand(v, traced, ws, (n, c))
    fts = f0_test - jax.vmap(lambda r: theta_dot(*test_op, r))(sums) / n
    if decay is not None:
        fts = fts + (alphas[:, None, None] - 1.0) * decay[2]
    return fs, fts, extremes
