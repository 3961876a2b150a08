"""The drifting second-moment profile of the fast Adam predictor (issue 27; METHOD.md §11).

The frozen profile of :mod:`ntk_tt.dynamics._adam_head_aware` (v_t ≈ ρ_t·v̄, v̄ the expected
squared gradient at θ_0) fails when the gradient turns away from g_0: with full batches the
parameters whose g_0 nearly cancels over the samples get 1/|g_0| steps in the model, while
Adam's v_t soon holds their later, larger gradients. On the benchmark's cifar10 task (N = 250,
AdamW peak 1e-3, GD; README "Optimiser benchmark") g_t is 93 % orthogonal to g_0 after 15
steps, and along the exact path the frozen preconditioner gives 5–7× Adam's per-step loss
decrease (Σ g_t²·P against Σ g_t²/√v̂_t), 79 % of it from parameters with √v̄ below 0.1 of
its mean; a per-layer ρ changes that by under 3 %.

Model. Split each step's backbone gradient along g_0 and the rest, g_t = a_t g_0 + δ_t,
a_t = ⟨g_t, g_0⟩/‖g_0‖², and give the rest the profile of the per-sample gradient variance
σ² (δ_t is a re-weighted sum of per-sample gradients): per parameter

    g_t² ≈ a_t² g_0² + ‖δ_t‖² u,   u = σ²/Σσ²,   so   g_t² ∝ w(λ'_t),
    v̂_t ≈ s_t·w(λ_t),   w(λ) = (1 − λ) g_0² + λ‖g_0‖² u,

with λ'_t = ‖δ_t‖²/‖g_t‖², and s_t, λ_t from A_t, E_t, the β₂-EMAs of a_t² and ‖δ_t‖²/‖g_0‖²
(bias-corrected): s_t = (A_t + E_t)/(1 − β₂^{t+1}), λ_t = E_t/(A_t + E_t). The scalars are
function-space numbers: ⟨g_t, g_0⟩ = Σ_{i∈B} q_iᵀ z_i with z = K_h vec(Q_0), and ‖g_t‖² is
the quadratic form of K_h. The step keeps the direction of the one preconditioned kernel
K_P = J_h diag(P_ref) J_hᵀ, P_ref = 1/(√w(λ_ref) + ε), and takes its size from the drift: the
loss decrease Σ g_t² P of a gradient of profile w(λ'_t) under P(λ_t) against under P_ref,

    J_h d_t = c_t √κ K_P vec(Q̂_t)/√s_t,   c_t = [(1 − λ')T_0(λ) + λ'T_1(λ)] /
                                              [(1 − λ')T_0(λ_ref) + λ'T_1(λ_ref)] (λ, λ' at t),

κ = 1 + c_BΣσ²/‖g_0‖² (K_P = K(λ_ref)/√κ), T_0(λ) = Σ g_0²/(√w(λ) + ε), T_1(λ) =
‖g_0‖² Σ u/(√w(λ) + ε): weight-space sums tabulated on a grid of λ (:class:`DriftTable`), no
kernel. Along the exact path of that run (λ fitted to the true v̂_t) this step's loss decrease
is 1.1–1.7× Adam's (frozen 5–7×). GD's first step has Adam's first-order loss decrease
(a_0 = 1, δ_0 = 0, s_0 = 1: c_0 = T_0(0)/T_0(λ_ref)), and all the frozen model has exact
stays exact (the head's Adam, the first moment, AdamW's decay). σ² comes from ``samples``
per-sample gradients (unbiased: the mean of (g_i − g_0)² over a uniform subsample), not all N.

Reference profile. The batch's expected squared gradient v̄ = g_0² + σ²(N − B)/(B(N − 1)) is
κ·w(λ_B), λ_B = c_BΣσ²/(‖g_0‖² + c_BΣσ²): 0 for GD, where P = 1/(|g_0| + ε) is largest on
the parameters whose g_0 cancels over the samples. Adam's v̂_t holds their later gradients
within a few steps (bias-corrected, v̂_1 weighs g_0² and g_1² about equally), but K_P's
direction would keep the 1/|g_0| weights for the whole run; c_t fixes the step's first-order
decrease, not its direction, so the step overshoots along them. On the shipped backbone at
N = 50 (flowers5, GD, AdamW warmup 10 + cosine, peak 1e-3, T = 40; real final loss 0.22,
exact Adam on the linearised network 0.27) λ_ref = 0 gave a final loss of 1.32 with a
spurious catapult (2.0 → 4.1) for the exact K_P, 1.13 on the subspace kernel, 0.66 on the
isotropic one (γ_0 = 0.025: its forms 40× off along g_0); λ_ref = 0.1 … 0.9 gave 0.14–0.16,
0.19–0.20 and 0.12–0.14 (γ_0 = 0.64–1.01). So the exact, subspace and diagonal K_P (the
last, session 35, by analogy before measuring; there λ_ref = 0 ends at 0.999, 1/2 at 0.11
against the real 0.215: ``tests/test_adam_ref_profile.py``) are built at
λ_ref = max(λ_B, :data:`MIN_REF_MIX`): v̄ = κ·w(λ_ref), unchanged where λ_B is larger. GD's
first step is then exact in its loss decrease only (``min_ref_mix=0`` restores the exact
first step). The isotropic and Kronecker K_P keep λ_B: with the floor the default's AdamW
T_ε p95 on the benchmark went from 35.7 to 37.5 % (GD, N = 250) and 32.4 / 29.2 to 34.6 /
30.7 % (N = 750), and their calibration already corrects the logit-summed forms. Nor is it
better everywhere: on a 112-weight tanh layer (``tests/test_optimizer_api.py``), where the
gradient stays near g_0, GD at peak 2e-2 is 32 % from the exact reference with it, 9.6 %
without; on the benchmark's subspace rows at N = 750 the GD T_ε p95 rose from 24.2 to 30.0 %
(its absolute targets fell from 65–69 % to 29–30 %; README "The reference profile").

Calibration. c_t's denominator is the decrease K_P itself gives, so the isotropic or
Kronecker K_P (k_P read off a logit-summed kernel) must reproduce J_h P J_hᵀ's quadratic forms;
it does not along g_0: with P = 1/|g_0| the parameters whose per-sample gradients cancel get
the largest weights, and the trace over the head spreads them over directions the residual
does not see (cifar10, N = 250, GD: ‖g_0‖²_{K_P} 6.8× Σ g_0² P, while per-sample deviations
are within 7 %). So the denominator divides K_P's forms along and across g_0 by
(γ_0, γ_1), the weight-space sums over K_P's forms at θ_0 (:func:`kernel_calibration`); GD's
first step is then exact in its first-order loss decrease whatever the kernel's form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import Partial

from ntk_tt.dynamics._losses import logit_residual
from ntk_tt.dynamics._noise import (
    _add_sq_dev,
    _mean_grad,
    _scaled,
    _squared,
    _zeros,
    gradient_variance,
)
from ntk_tt.dynamics._predict_head_aware import _feature_kernel_dot
from ntk_tt.kernels._diagonal import diagonal_kernel
from ntk_tt.kernels._head_aware import HeadAwareKernel, _WithHead, feature_mixing
from ntk_tt.kernels._ntk import empirical_ntk

TABLE_SIZE = 257
"""λ points of :class:`DriftTable`, dense near 0 (λ = (k/256)³), where T_0 varies fastest."""

CHUNK = 16
"""Per-sample gradients per compiled call for σ² (small chunks run faster on a CPU)."""

MIN_REF_MIX = 0.5
"""The smallest λ_ref: K_P's profile w(λ_ref) is never g_0² alone (module docstring,
"Reference profile"). Not fitted: on the optimiser benchmark's 48 AdamW rows at N = 250 with
``backbone="subspace"`` the GD rows' T_ε p95 was 24.2 / 24.2 / 25.0 / 25.0 / 25.0 % for a
floor of 0.1 / 0.3 / 0.5 / 0.6 / 0.9 (27.1 % without one); 1/2 is the middle of that flat
range. With the diagonal K_P (session 36) a floor of 0.1 / 0.25 / 0.5 / 0.75 / 1 gave the same
21.2 % GD p95 at N = 250 (B = 50: 18.9 %; 18.6 % at 1) and 21.1 % at N = 50. The default for
the exact, subspace and diagonal K_P only (:func:`check_ref_mix`)."""


class DriftTable(NamedTuple):
    """The drifting profile's weight-space sums (module docstring), all in the predictor's dtype.

    grid: λ (L,), increasing from 0 to 1. along, across: T_0(λ), T_1(λ) (L,).
    ref: λ_ref of the kernel K_P (scalar). kappa: ‖v̄‖₁/‖g_0‖² = 1 + c_BΣσ²/‖g_0‖², the
    factor between v̄ and w(λ_ref) (K(λ_ref) = √κ·K_P). calibration: (γ_0, γ_1) (2,), the
    weight-space sums over K_P's quadratic forms along g_0 and across it
    (:func:`kernel_calibration`; ones: the kernel taken as exact). noise: Σσ²/‖g_0‖², floor:
    ``min_ref_mix`` (scalars: κ, λ_B and λ_ref of any B, ``ntk_tt.adam_kernel_for_batch``).
    """

    grid: jax.Array
    along: jax.Array
    across: jax.Array
    ref: jax.Array
    kappa: jax.Array
    calibration: jax.Array
    noise: jax.Array
    floor: jax.Array


def check_ref_mix(value, backbone: str, profile: str = "drift") -> float:
    """``min_ref_mix`` as a float: None → :data:`MIN_REF_MIX` for the exact, subspace and
    diagonal K_P, 0 for the isotropic and Kronecker ones (whose logit-summed forms the
    calibration already corrects: README "The reference profile"). Raises ValueError unless a
    real number in [0, 1] (Python, NumPy or JAX scalar) or None, or if given with
    ``profile="frozen"`` (whose v̄ has no mix)."""
    if value is None:
        return MIN_REF_MIX if backbone in ("exact", "subspace", "diagonal") else 0.0
    if profile != "drift":
        raise ValueError(f"min_ref_mix sets the drifting profile's K_P (profile='drift'); "
                         f"profile={profile!r} has none: drop min_ref_mix or use "
                         f"profile='drift'.")
    if np.ndim(value) != 0 or np.asarray(value).dtype.kind not in "fiu" \
            or not 0.0 <= float(value) <= 1.0:  # a bool's kind is "b": refused
        raise ValueError(f"min_ref_mix must be a number in [0, 1] (the smallest share of the "
                         f"per-sample variance's profile in K_P's) or None, got {value!r}.")
    return float(value)


def gradient_profiles(feature_fn, bparams, w0, b0, x, y, loss: str, samples: int, key=None):
    """(g_0², σ²) per backbone parameter (pytrees like ``bparams``): the full-batch gradient
    squared and the per-sample gradient variance (divisor N) estimated without bias as the
    mean of (g_i − g_0)² over ``samples`` inputs (all N if fewer; drawn with ``key``, evenly
    spaced over the set if None)."""
    # gradients of (backbone, W, b) through one module-level model (the compiled programs are
    # reused by every call on the same network); the head's entries are dropped
    apply, params = _WithHead(feature_fn), (bparams, w0, b0)
    n = x.shape[0]
    g0 = _mean_grad(apply, params, x, y, loss)
    m = min(samples, n)
    pick = (jnp.floor(jnp.arange(m) * (n / m)).astype(jnp.int32) if key is None
            else jnp.sort(jax.random.choice(key, n, (m,), replace=False)))
    total = _scaled(g0, 0.0)  # zeros placed like the gradients (no second compilation)
    for start in range(0, m, CHUNK):
        rows = pick[start:start + CHUNK]
        total = _add_sq_dev(apply, params, x[rows], y[rows], loss, g0, total)
    return _squared(g0[0]), _scaled(total[0], 1.0 / m)


def drift_table(g0sq, sigma2, eps, n: int, bsz: int, dtype,
                min_ref: float = 0.0) -> tuple[DriftTable, object]:
    """(:class:`DriftTable`, v̄ pytree) from g_0² and σ² (pytrees).

    λ_B = c_BΣσ²/(‖g_0‖² + c_BΣσ²), c_B = (N − B)/(B(N − 1)), is the mix of the expected
    squared minibatch gradient g_0² + c_Bσ² = κ·w(λ_B); K_P is built at λ_ref = max(λ_B,
    ``min_ref``) (``adam_head_aware_kernel`` passes :func:`check_ref_mix`'s), v̄ =
    κ·w(λ_ref) (= g_0² + c_Bσ² when λ_B ≥ min_ref)."""
    c_b = 0.0 if bsz == n else (n - bsz) / (bsz * (n - 1))
    table = _table(g0sq, sigma2, eps, c_b, min_ref)
    return (jax.tree.map(lambda a: jnp.asarray(a, dtype), table),
            _ref_profile(g0sq, sigma2, c_b, min_ref))


def frozen_profile(feature_fn, bparams, w0, b0, x, y, loss, bsz):
    """The frozen profile's v̄ = g_0² + σ²·(N − B)/(B(N − 1)) per backbone parameter (σ² from
    all N per-sample gradients; :mod:`ntk_tt.dynamics._adam_head_aware`)."""
    apply, params = _WithHead(feature_fn), (bparams, w0, b0)  # head entries dropped
    n = x.shape[0]
    g0sq = _squared(_mean_grad(apply, params, x, y, loss)[0])
    if bsz == n:
        return g0sq
    var = gradient_variance(apply, params, x, y, loss=loss)[0]
    return _vbar(g0sq, var, (n - bsz) / (bsz * (n - 1)))


@jax.jit
def _ref_profile(g0sq, sigma2, c_b, min_ref):
    """v̄ = κ·w(λ_ref) per parameter as the batch's v̄ plus the floor's share: g_0² + c_Bσ²
    + κ(λ_ref − λ_B)(‖g_0‖²u − g_0²), u = σ²/Σσ² (= g_0²/‖g_0‖² when Σσ² = 0), so exactly
    :func:`_vbar`'s when λ_B ≥ ``min_ref``."""
    leaves = jax.tree.leaves
    big_g = sum(jnp.sum(v) for v in leaves(g0sq))
    total = sum(jnp.sum(v) for v in leaves(sigma2))
    noise = c_b * total
    excess = jnp.maximum(min_ref - noise / (big_g + noise), 0.0) * (1.0 + noise / big_g)
    share = jnp.where(total > 0, big_g / jnp.where(total > 0, total, 1.0), 0.0)
    return jax.tree.map(
        lambda g, s: g + c_b * s + excess * jnp.where(total > 0, share * s - g, 0.0),
        g0sq, sigma2)


@jax.jit
def _vbar(g0sq, sigma2, c_b):
    """v̄ = g_0² + c_B σ² per parameter (one program per network, any B)."""
    return jax.tree.map(lambda g, s: g + c_b * s, g0sq, sigma2)


@jax.jit
def _table(g0sq, sigma2, eps, c_b, min_ref) -> DriftTable:
    """The table's sums over parameters (one program per network, any ε and B)."""
    leaves = jax.tree.leaves
    g2 = jnp.concatenate([v.ravel() for v in leaves(g0sq)])
    s2 = jnp.concatenate([v.ravel() for v in leaves(sigma2)])
    big_g, total = jnp.sum(g2), jnp.sum(s2)
    unit = jnp.where(total > 0, s2 / jnp.where(total > 0, total, 1.0), g2 / big_g)
    noise = c_b * total
    grid = jnp.linspace(0.0, 1.0, TABLE_SIZE, dtype=g2.dtype) ** 3

    def sums(lam):
        p = 1.0 / (jnp.sqrt((1 - lam) * g2 + lam * big_g * unit) + eps)
        return jnp.sum(g2 * p), big_g * jnp.sum(unit * p)

    along, across = jax.lax.map(sums, grid)
    ref = jnp.maximum(noise / (big_g + noise), min_ref)
    return DriftTable(grid, along, across, ref, 1.0 + noise / big_g, jnp.ones(2, g2.dtype),
                      total / big_g, jnp.asarray(min_ref, g2.dtype))


def _on_grid(table: DriftTable, lam):
    """(T_0(λ), T_1(λ)) by linear interpolation on the table's grid."""
    return (jnp.interp(lam, table.grid, table.along),
            jnp.interp(lam, table.grid, table.across))


def drift_factor(table: DriftTable, lam, lam_now):
    """c_t of the module docstring for the second moment's λ and the current gradient's λ':
    the weight-space loss decrease over the one K_P delivers (its forms along and across g_0
    divided by the table's calibration γ_0, γ_1)."""
    t0, t1 = _on_grid(table, lam)
    r0, r1 = _on_grid(table, table.ref)
    g0, g1 = table.calibration[0], table.calibration[1]
    return ((1 - lam_now) * t0 + lam_now * t1) / ((1 - lam_now) * r0 / g0 + lam_now * r1 / g1)


def drift_in_dtype(drift, dtype) -> DriftTable | None:
    """``AdamKernel.drift`` checked (a :class:`DriftTable` or None: the frozen profile) and
    cast to the predictor's dtype. Raises ValueError for anything else."""
    if drift is None:
        return None
    if not isinstance(drift, DriftTable):
        raise ValueError(f"ak.drift must be a DriftTable or None, got "
                         f"{type(drift).__name__}: build ak with adam_head_aware_kernel.")
    return jax.tree.map(lambda a: jnp.asarray(a, dtype), drift)


def quadratic_form(hk: HeadAwareKernel, idx, q) -> jax.Array:
    """Σ_{i,j∈idx} q_iᵀ K_h(i, j) q_j for q (B, F): ‖J_hᵀ vec(Q)‖², Q = q on the rows idx
    (a subspace kernel: of q's part in span(Z), the features' only moving directions)."""
    if hk.mixing is not None:
        return jnp.sum(hk.backbone[idx][:, idx] * (q @ hk.mixing @ q.T))
    # K_h vec(Q) by one matrix-vector product, never a gathered (B·F)² copy of the kernel
    # (at N·k = 12,000 a 576 MB copy per step)
    kq = _feature_kernel_dot(hk.backbone, None, idx, q, hk.features.shape[0], hk.basis)
    return jnp.sum(q * kq[idx])


def feature_coords(hk: HeadAwareKernel, q) -> jax.Array:
    """q (rows, F) in the coordinates of ``hk``'s full feature kernel: q itself, or q Z (rows, k)
    for a subspace kernel (basis Z)."""
    return q if hk.basis is None else q @ hk.basis


def expected_norm0(hk: HeadAwareKernel, y, batch_size: int, loss: str) -> jax.Array:
    """E‖g_0‖² over the minibatch draw (:mod:`ntk_tt.dynamics._adam_head_aware`'s docstring):
    the scale of v̄ in function space."""
    n = hk.features.shape[0]
    f0 = hk.features @ hk.head_kernel + hk.head_bias
    q = logit_residual(f0, y, loss) @ hk.head_kernel.T  # per-sample ∂ℓ_i/∂h_i (N, F)
    if hk.mixing is not None:
        pair = hk.backbone * (q @ hk.mixing @ q.T)
    else:  # q Z (N, k) for a subspace kernel
        q = feature_coords(hk, q)
        pair = (jnp.einsum("aij,ia,ja->ij", hk.backbone, q, q) if hk.backbone.ndim == 3  # blocks
                else jnp.einsum("ifjg,if,jg->ij", hk.backbone.reshape(n, q.shape[1], n, -1), q, q))
    diag, total, bsz = jnp.trace(pair), jnp.sum(pair), batch_size
    off = 0.0 if n == 1 else bsz * (bsz - 1) / (n * (n - 1)) * (total - diag)
    return (bsz / n * diag + off) / bsz**2


def kernel_calibration(hp: HeadAwareKernel, q, g0sq, sigma2, vbar, eps) -> jax.Array:
    """(γ_0, γ_1) (2,): the exact weight-space quadratic forms of P = diag(1/(√v̄ + ε)) over
    the ones K_P (``hp.backbone``, in its isotropic, Kronecker or exact form) gives, along the
    full-batch gradient and across it (the per-sample deviations):

        γ_0 = Σ g_0² P / ‖g_0‖²_{K_P},   γ_1 = Σ σ² P / (mean_i ‖g_i‖²_{K_P} − ‖g_0‖²_{K_P}),

    with ‖g‖²_{K_P} = vec(Q)ᵀ K_P vec(Q) for the feature-space gradient Q (g_i: q_i on row i;
    g_0: the mean of those). Both are 1 for the exact K_P (and σ² from every sample); the
    isotropic k_P, read off the logit-summed kernel, can be far off along g_0 (cifar10,
    N = 250, GD: γ_0 = 0.15, γ_1 = 0.94), which made the first Adam step 5× too large.

    Args:
      hp: the preconditioned kernel. q: per-sample ∂ℓ_i/∂h_i = r_i W_0ᵀ (N, F) at θ_0.
      g0sq, sigma2, vbar: pytrees over the backbone parameters. eps: Adam's ε.
    """
    n = q.shape[0]
    along_w, across_w = _weight_sums(g0sq, sigma2, vbar, eps)
    along_k = quadratic_form(hp, jnp.arange(n), q / n)
    if hp.mixing is not None:
        per_sample = jnp.diagonal(hp.backbone) * jnp.einsum("if,fg,ig->i", q, hp.mixing, q)
    else:
        qz = feature_coords(hp, q)
        f = qz.shape[1]
        blocks = hp.backbone.reshape(n, f, n, f)[jnp.arange(n), :, jnp.arange(n)]  # (N, F, F)
        per_sample = jnp.einsum("if,ifg,ig->i", qz, blocks, qz)
    across_k = jnp.mean(per_sample) - along_k
    tiny = jnp.finfo(along_k.dtype).tiny
    gamma0 = jnp.where(along_k > tiny, along_w / jnp.maximum(along_k, tiny), 1.0)
    gamma1 = jnp.where((across_k > tiny) & (across_w > 0),
                       across_w / jnp.maximum(across_k, tiny), 1.0)
    return jnp.stack([gamma0, gamma1]).astype(along_k.dtype)


@jax.jit
def _weight_sums(g0sq, sigma2, vbar, eps):
    """(Σ g_0² P, Σ σ² P) over the parameters, P = 1/(√v̄ + ε): one compiled program."""
    sums = [(jnp.sum(g / (jnp.sqrt(v) + eps)), jnp.sum(s / (jnp.sqrt(v) + eps)))
            for g, s, v in zip(jax.tree.leaves(g0sq), jax.tree.leaves(sigma2),
                               jax.tree.leaves(vbar), strict=True)]
    return tuple(sum(part) for part in zip(*sums, strict=True))


def drift_scale(table: DriftTable, moments, along, rest, big_g, b2, c2, tiny):
    """One step of the drift: the EMAs (A, E) (2,) updated with a_t² and ‖δ_t‖²/‖g_0‖², and
    the factor c_t·√κ/√s_t that multiplies K_P vec(Q̂_t)."""
    moments = b2 * moments + (1 - b2) * jnp.stack([along**2, rest / big_g])
    level = jnp.sum(moments)
    lam = moments[1] / jnp.maximum(level, tiny)
    lam_now = rest / jnp.maximum(along**2 * big_g + rest, tiny)
    size = drift_factor(table, lam, lam_now) * jnp.sqrt(table.kappa)
    return moments, size / jnp.sqrt(jnp.maximum(level / c2, tiny))


def precond_kernel(split, x, x_test, root, hk: HeadAwareKernel, backbone: str,
                   mixing_samples: int, key) -> HeadAwareKernel:
    """``hk`` with K_P = J_h diag(root²) J_hᵀ as its backbone kernel (and held-out cross
    kernel), in the form of ``backbone``: the NTK of θ' ↦ h(θ_0 + θ'·root) at θ' = 0
    (through the head W_0 and divided by tr(W_0ᵀ S W_0) unless "exact" or "subspace"; the
    latter on ``hk``'s basis Z: (I ⊗ Zᵀ) K_P (I ⊗ Z))."""
    feature_fn, bparams, w0, _ = split
    zeros = _zeros(bparams)
    pre_features = Partial(_Preconditioned(feature_fn), bparams, root)
    if backbone in ("exact", "subspace", "diagonal"):
        if hk.basis is not None:  # h Z, bound like W_0 below: one compiled program per network
            pre_features = Partial(_Preconditioned(feature_fn, with_head=True), bparams, root,
                                   hk.basis)
        ntk = diagonal_kernel if backbone == "diagonal" else empirical_ntk
        kp = ntk(pre_features, zeros, x)
        kpt = None if x_test is None else ntk(pre_features, zeros, x_test, x)
        return hk._replace(backbone=kp, backbone_test=kpt)
    mixing = jnp.eye(w0.shape[0], dtype=hk.features.dtype)
    if backbone == "kronecker":
        n = x.shape[0]
        m = min(mixing_samples, n)
        pick = (jnp.arange(m) if key is None
                else jnp.sort(jax.random.choice(key, n, (m,), replace=False)))
        mixing = feature_mixing(pre_features, zeros, x[pick])

    pre_logits = Partial(_Preconditioned(feature_fn, with_head=True), bparams, root, w0)
    trace = jnp.trace(w0.T @ mixing @ w0)
    kp = empirical_ntk(pre_logits, zeros, x, trace_logits=True) / trace
    kpt = (None if x_test is None
           else empirical_ntk(pre_logits, zeros, x_test, x, trace_logits=True) / trace)
    return hk._replace(backbone=kp, mixing=mixing, backbone_test=kpt)


@dataclass(frozen=True)
class _Preconditioned:
    """``(θ_0, root[, W_0], θ', x) ↦ h(θ_0 + θ'·root, x)`` (``@ W_0`` with ``with_head``), equal
    for the same ``feature_fn``: bound to its arrays with ``jax.tree_util.Partial``, the
    kernel's compiled Jacobian program is reused for every root (each optimiser, batch size
    and call) instead of compiled per call around a fresh closure."""

    feature_fn: Any
    with_head: bool = False

    def __call__(self, bparams, root, *rest):
        *head, tp, xx = rest
        h = self.feature_fn(jax.tree.map(lambda p0, t, r: p0 + t * r, bparams, tp, root), xx)
        return h @ head[0] if self.with_head else h
