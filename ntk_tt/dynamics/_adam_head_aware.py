"""A fast Adam/AdamW predictor at function-space cost: the head-aware model (issue 27).

METHOD.md §11. The model f = (h_0 + φ) W + b, φ = J_h (θ − θ_0) (METHOD.md §10), trained by
``ntk_tt.adam``/``adamw`` (β₁, β₂, ε, schedule η_t, decoupled weight decay λ):

* Head (W, b): EXACT Adam — its moments are elementwise on F×C and C numbers.
* Backbone: the weight gradient on the minibatch is g_t = J_hᵀ vec(Q_t), Q_t (N, F) = g W_tᵀ
  on the batch rows (g = ∂L_B/∂f), zero elsewhere. Adam's first moment is linear:
  m_t = β₁m_{t−1} + (1 − β₁)g_t = J_hᵀ vec(Q̄_t), Q̄ the β₁-EMA of Q (exact). The second
  moment v_t (the β₂-EMA of g_t², elementwise) has no function-space form; approximate it by
  the "rescaled diagonal" of Zancato et al. (2020, Sec. 4, there for the SGD noise): the
  per-parameter profile is frozen at θ_0 and its scale follows the gradient norm,

      g_t² ≈ r_t·v̄,   v̄ = E[g_0²] = g_0² + σ²·(N − B)/(B(N − 1)),   r_t = ‖g_t‖² / E‖g_0‖²,

  v̄ per parameter (g_0 the full-batch gradient, σ² the per-sample gradient variance of
  ``ntk_tt.gradient_variance``, the second term that of a mean over B samples drawn without
  replacement: 0 for GD). Then v_t ≈ ρ_t·v̄ with the scalar ρ_t = β₂ρ_{t−1} + (1 − β₂)r_t,
  and with the bias corrections m̂ = m/(1 − β₁^{t+1}), ρ̂ = ρ/(1 − β₂^{t+1}),

      d_t = m̂_t / (√v̂_t + ε) ≈ P m̂_t / √ρ̂_t,    P = diag(1 / (√v̄ + ε)),

  ε kept at ρ = 1 (so the first GD step, sign(g_0)·|g_0|/(|g_0| + ε), is exact) and
  otherwise ignored against √v (relative error O(ε/√v)). In feature space

      J_h d_t = K_P vec(Q̂_t) / √ρ̂_t,    K_P = J_h P J_hᵀ  (the preconditioned feature kernel),

  and M_t = K_P vec(Q̄_t) is carried by its own EMA, M_t = β₁M_{t−1} + (1 − β₁)K_P[:, B] Q_B
  (O(N·B·F) per step; O(N·B·C + N·C·F) with an isotropic / Kronecker K_P).
  Both norms are quadratic forms of the feature kernel K_h = J_h J_hᵀ:
  ‖g_t‖² = Σ_{i,j∈B} q_iᵀ K_h(i, j) q_j, and, for per-sample q_i = r_i W_0ᵀ (r = ∂ℓ_i/∂f_i),
  E‖g_0‖² = B⁻²[(B/N) Σ_i q_iᵀK_h(i,i)q_i + B(B − 1)/(N(N − 1)) Σ_{i≠j} q_iᵀK_h(i,j)q_j]
  (= ‖g_0‖² for B = N), so r_0 = 1 for GD whatever the feature-kernel approximation.
* Decoupled decay (AdamW): θ ← θ − η_t(d_t + λθ), in feature space
  φ ← φ − η_t(J_h d_t + λ(a_h + φ)) with a_h = J_h θ_0 (one jvp), exact; W, b decay exactly.
  L2 decay with Adam (λθ inside the elementwise moments) has no such form and is refused
  (``ntk_tt.linearised_reference`` handles it).

This (``profile="frozen"``) is exact for GD at t = 0 and while every parameter's gradient
stays proportional to its value at θ_0; its error, large (README "Optimiser benchmark"),
comes from the profile changing and, for SGD, from the realised minibatch. The default
``profile="drift"`` lets the profile drift from g_0²'s to the per-sample variance's as the
gradient turns from g_0, a scalar on the step K_P vec(Q̂_t) from tabulated weight-space sums,
with K_P built on a profile that mixes in the variance's (:mod:`ntk_tt.dynamics._adam_drift`).
:func:`adam_head_aware_kernel` builds K_P like the isotropic head-aware kernel: the wrapped
backbone θ' ↦ feature_fn(θ_0 + θ'·P^{1/2}) has Jacobian J_h P^{1/2} at θ' = 0, and its
logit-summed NTK through the head W_0 is k_P·tr(W_0ᵀ S W_0) (no head term), so k_P is read
off one more logit-summed kernel per task ("exact": K_P (N·F)² itself; "subspace" on the plain
kernel's basis Z; "diagonal", the default of ``predict`` since session 35: the k blocks
z_aᵀ K_P z_a only, from the per-logit products of the network h Z, at the logit-summed
kernel's cost).
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._optimizer import Optimizer
from ntk_tt._options import BACKBONES
from ntk_tt._schedules import _concrete
from ntk_tt.data._model import check_concrete
from ntk_tt.dynamics._adam_drift import (
    DriftTable,
    check_ref_mix,
    drift_in_dtype,
    drift_scale,
    drift_table,
    expected_norm0,
    frozen_profile,
    gradient_profiles,
    kernel_calibration,
    precond_kernel,
    quadratic_form,
)
from ntk_tt.dynamics._checks import check_adam_kernel, check_kernel_inputs, check_labels
from ntk_tt.dynamics._losses import LOSSES, check_loss, logit_residual
from ntk_tt.dynamics._optim_head_aware import decay_in_span, head_logits, validate_head
from ntk_tt.dynamics._optim_linear import check_optimizer, resolve_batches
from ntk_tt.dynamics._predict_head_aware import _backbone_step
from ntk_tt.dynamics._regime import backbone_rms
from ntk_tt.kernels._diagonal import solve_form
from ntk_tt.kernels._head_aware import (
    HeadAwareKernel,
    backbone_kind,
    check_head_aware,
    check_split,
    head_aware_kernel,
)

PROFILES = ("drift", "frozen")


class AdamKernel(NamedTuple):
    """The kernels of the fast Adam predictor (:func:`adam_head_aware_kernel`).

    hk: the head-aware kernel (features h_0, head W_0, b_0, feature kernel K_h: the gradient
    norms). precond: the same with K_P = J_h diag(1/(√v̄ + ε)) J_hᵀ as its backbone kernel
    (and held-out cross kernel): the Adam step's direction. batch_size: the B that v̄ was
    estimated for (N for full batch). drift: the drifting profile's table
    (:class:`ntk_tt.dynamics._adam_drift.DriftTable`; None: the frozen profile). eps: the ε
    that P = 1/(√v̄ + ε) was built with (None: not recorded, not checked). loss: index in
    ``LOSSES`` of the loss v̄ was taken of (an int: a pytree of numbers; None: not checked).
    labels: the y (N,) whose loss gradients v̄ holds (None: not checked). weight_rms:
    rms(θ_0) = ‖θ_0‖/√D of the backbone over its floating-point leaves
    (:func:`ntk_tt.dynamics._regime.backbone_rms`): ``predict_head_aware`` and
    ``sensitivities`` check Adam's weight travel ρ = Σ η_t / weight_rms with it (None: not
    checked).

    Source: ntk_tt's own (issue 27; METHOD.md §11, "Adam, approximate"), after the rescaled
    diagonal of Zancato et al. 2020 (arXiv 2008.12478), Sec. 4.
    """

    hk: HeadAwareKernel
    precond: HeadAwareKernel
    batch_size: int
    drift: DriftTable | None = None
    eps: float | None = None
    loss: int | None = None
    labels: jax.Array | None = None
    weight_rms: float | None = None


class AdamHeadState(NamedTuple):
    """Head W, b with Adam moments (m_W, v_W, m_b, v_b); φ (N, F); M = K_P vec(Q̄) (N, F);
    ρ (scalar; the drift's EMAs (A, E) (2,) with a DriftTable); φ_test, M_test (N_test, F) or
    None."""

    w: jax.Array
    b: jax.Array
    mw: jax.Array
    vw: jax.Array
    mb: jax.Array
    vb: jax.Array
    phi: jax.Array
    big_m: jax.Array
    rho: jax.Array
    phit: jax.Array | None
    big_mt: jax.Array | None


def adam_head_aware_kernel(split, x, y, optimizer: Optimizer, x_test=None, *,
                           backbone: str = "isotropic", loss: str = "cross_entropy",
                           hk: HeadAwareKernel | None = None, mixing_samples: int = 32,
                           key: jax.Array | None = None, profile: str = "drift",
                           variance_samples: int = 64,
                           min_ref_mix: float | None = None) -> AdamKernel:
    """The kernels of the fast Adam predictor for a network split as ``(feature_fn,
    backbone_params, head_kernel, head_bias)`` (:func:`ntk_tt.split_head`).

    v̄ = g_0² + σ²(N − B)/(B(N − 1)) per backbone parameter (g_0 the full-batch gradient at
    θ_0, one backward pass; σ² the per-sample gradient variance: from ``variance_samples``
    per-sample gradients with ``profile="drift"``, all N for B < N with ``"frozen"``, none for
    frozen GD); then K_P = J_h diag(1/(√v̄ + ε')) J_hᵀ (ε' = ε; ε√κ with "drift", K_P =
    K(λ_ref)/√κ: batch sizes of one λ_ref share it, ``ntk_tt.adam_kernel_for_batch``) in the
    form of ``backbone`` (:func:`ntk_tt.head_aware_kernel`'s; "kronecker" with S_P from the
    preconditioned kernel's diagonal blocks, "subspace" (k = 16 if built here) and "diagonal"
    (z_aᵀ K_P z_a only, k = 5) on ``hk``'s basis Z), from one more empirical NTK (module
    docstring); with "drift" also the table of :mod:`ntk_tt.dynamics._adam_drift`.

    Source: ntk_tt's own (issue 27; METHOD.md §11, "Adam, approximate"), after the rescaled
    diagonal of Zancato et al. 2020 (arXiv 2008.12478), Sec. 4.

    Args:
      split: ``ntk_tt.split_head(model)``. x: training inputs (N, ...). y: labels (N,).
      optimizer: the Adam optimiser to predict (its ε and batch size set v̄ and P).
      x_test: held-out inputs (N_test, ...) or None. backbone: feature-kernel form of both
        kernels. loss: "cross_entropy" or "mse".
      hk: the plain head-aware kernel if already built (same inputs and ``backbone``).
      mixing_samples, key: as :func:`ntk_tt.head_aware_kernel` (Kronecker S, S_P); ``key``
        also draws the σ² subsample (evenly spaced inputs if None).
      profile: "drift" (second-moment profile drifting along the run) or "frozen".
      variance_samples: per-sample gradients for σ² with "drift" (all N if fewer).
      min_ref_mix: with "drift", the smallest mix λ_ref of K_P's profile w(λ_ref), in [0, 1]
        (None: ``MIN_REF_MIX`` for the "exact", "subspace" and "diagonal" K_P, 0 for others;
        0 makes GD's first step exact but an exact K_P unstable at small N: "Reference
        profile" in :mod:`ntk_tt.dynamics._adam_drift`).

    Returns:
      :class:`AdamKernel` (``drift`` set with ``profile="drift"``; ``weight_rms`` split[1]'s).
    Raises:
      ValueError: not an Adam optimiser, L2 decay, B outside [1, N], unknown ``backbone`` or
        ``profile``, ``variance_samples`` not an int >= 2, ``min_ref_mix`` not a number in
        [0, 1] or given with "frozen", ``split`` not a 4-tuple, a ``hk`` of another form or
        size or not built from this ``split`` on these ``x`` / ``x_test``, a traced argument
        (jit, vmap, grad), backbone weights (``split[1]``) with no floating-point leaf or with
        NaN or inf, and every error of :func:`ntk_tt.head_aware_kernel` — before the kernels.
    """
    check_optimizer(optimizer, ("adam",), where="adam_head_aware_kernel")
    check_l2_adam(optimizer)
    check_loss(loss)
    n = np.shape(x)[0]
    bsz = n if optimizer.batch_size is None else optimizer.batch_size
    if not 1 <= bsz <= n:
        raise ValueError(f"batch_size must satisfy 1 <= batch_size <= N = {n}, got {bsz}: "
                         "use a smaller batch size or batch_size=None (full batch).")
    for name, value, known in (("backbone", backbone, BACKBONES), ("profile", profile, PROFILES)):
        if value not in known:
            raise ValueError(f"{name} must be one of {known}, got {value!r}.")
    if isinstance(variance_samples, bool) or not isinstance(variance_samples, int) \
            or variance_samples < 2:
        raise ValueError(f"variance_samples must be an int >= 2 (per-sample gradients for "
                         f"σ²), got {variance_samples!r}.")
    min_ref_mix = check_ref_mix(min_ref_mix, backbone, profile)
    check_split(split)
    check_concrete("adam_head_aware_kernel", split=split, x=x, x_test=x_test, y=y, hk=hk)
    rms = backbone_rms(split[1])  # weight_rms, ρ's scale (NaN weights refused before the work)
    if hk is None:
        hk = head_aware_kernel(split, x, x_test, backbone=backbone,
                               mixing_samples=mixing_samples, key=key)
    elif not _same_form(hk, backbone) or (hk.features_test is None) != (x_test is None):
        raise ValueError(f"hk must be the {backbone!r} HeadAwareKernel (head_aware_kernel(..., "
                         f"backbone={backbone!r}): the form of K_P) of the same inputs (x and "
                         "x_test), or None to build it here" + (": of an AdamKernel pass its "
                         ".hk." if isinstance(hk, AdamKernel) else "."))
    else:
        check_kernel_inputs(hk, split, x, x_test, name="hk", rows=None)  # every row: K_P's cost
    feature_fn, bparams, w0, b0 = split
    x = jnp.asarray(x)
    y = check_labels(y, n, w0.shape[1])
    table = None
    if profile == "drift":
        g0sq, sigma2 = gradient_profiles(feature_fn, bparams, w0, b0, x, y, loss,
                                         variance_samples, key)
        table, vbar = drift_table(g0sq, sigma2, optimizer.eps, n, bsz, hk.features.dtype,
                                  min_ref_mix)
    else:
        vbar = frozen_profile(feature_fn, bparams, w0, b0, x, y, loss, bsz)
    # drift: ε·√κ, so K_P = K(λ_ref)/√κ exactly (one λ_ref, one kernel up to a scalar)
    eps = optimizer.eps if table is None else optimizer.eps * jnp.sqrt(table.kappa)
    hp = precond_kernel(split, x, x_test, _root(vbar, eps), hk, backbone, mixing_samples, key)
    if table is not None:  # the step's size from weight-space sums, not K_P's own forms
        q = logit_residual(hk.features @ w0 + b0, y, loss) @ w0.T
        table = table._replace(calibration=kernel_calibration(
            hp, q, g0sq, sigma2, vbar, eps).astype(table.grid.dtype))
    return AdamKernel(hk, hp, bsz, table, _concrete(optimizer.eps), LOSSES.index(loss), y,
                      rms)


def _same_form(hk, backbone: str) -> bool:
    """Whether ``hk`` is a head-aware kernel of ``backbone``'s form (K_h's and K_P's agree)."""
    if not isinstance(hk, HeadAwareKernel):
        return False
    kind = backbone_kind(hk)  # at k = 1 the subspace and diagonal kernels are one
    one = {kind, backbone} <= {"subspace", "diagonal"} and np.shape(hk.basis)[1] == 1
    return one or kind == backbone or {kind, backbone} <= {"isotropic", "kronecker"}


@jax.jit
def _root(vbar, eps):
    """(√v̄ + ε)^(−1/2) per parameter: P^(1/2), one compiled program per network."""
    return jax.tree.map(lambda v: (jnp.sqrt(v) + eps) ** -0.5, vbar)


def head_aware_adam_trajectory(ak: AdamKernel, y, optimizer: Optimizer, *, steps: int,
                               key=None, a_h=None, a_h_test=None,
                               loss: str = "cross_entropy", batches=None):
    """Logits of the head-aware model trained by Adam/AdamW, predicted in function space.

    Head exact, backbone by the drifting (``ak.drift``) or frozen rescaled-diagonal
    preconditioner (module docstring). Pure and jittable: ``vmap`` over the optimiser's array
    leaves (η schedule, β₁, β₂, λ) shares ``ak``; ``ak`` depends on ε and the batch size
    (through v̄), so build it for those.

    Source: ntk_tt's own (issue 27; METHOD.md §11, "Adam, approximate"), after the rescaled
    diagonal of Zancato et al. 2020 (arXiv 2008.12478), Sec. 4.

    Args:
      ak: :class:`AdamKernel` (:func:`adam_head_aware_kernel`). y: labels (N,).
      optimizer: ``ntk_tt.adamw(...)`` or ``ntk_tt.adam(...)`` without weight decay.
      steps: T updates (static). key: minibatch order for B < N (``ntk_tt.finetune``'s).
      a_h, a_h_test: J_h θ_0 on the training (N, F) and held-out (N_test, F) inputs, needed
        when weight_decay ≠ 0 (``weight_tangent(feature_fn, backbone_params, x)``).
      loss: "cross_entropy" or "mse". batches: (T, B) indices instead of the key's.

    Returns:
      ``(fs, fs_test)``: logits after 0..T updates (T + 1, N, C), held-out ones or None.

    Raises:
      ValueError: not an Adam optimiser, Adam with L2 weight decay (use adamw), kernels that
        do not match, weight decay without ``a_h``, SGD without a key, bad labels.
    """
    check_l2_adam(optimizer)
    if not isinstance(ak, AdamKernel):
        raise ValueError(f"ak must be an AdamKernel (adam_head_aware_kernel(...)), got "
                         f"{type(ak).__name__}.")
    hk, y, a_h, a_h_test, _ = validate_head(ak.hk, y, optimizer, rules=("adam",),
                                            where="head_aware_adam_trajectory", loss=loss,
                                            a_h=a_h, a_h_test=a_h_test)
    hp = _check_precond(ak.precond, hk)
    table = drift_in_dtype(ak.drift, hk.features.dtype)
    check_adam_kernel(ak, optimizer, optimizer.batch_size or hk.features.shape[0], "ak", loss,
                      y)
    batches = resolve_batches(optimizer, hk.features.shape[0], steps, key, batches)
    return _adam_core(solve_form(hk), solve_form(hp), y, optimizer, batches, a_h, a_h_test,
                      loss=loss, table=table)


def check_l2_adam(optimizer) -> None:
    """ValueError for Adam with L2 weight decay (inside the moments: no feature-space form)."""
    if isinstance(optimizer, Optimizer) and optimizer.rule == "adam" \
            and not optimizer.decoupled and _maybe_nonzero(optimizer.weight_decay):
        raise ValueError("the fast Adam predictor needs decoupled weight decay: L2 decay "
                         "enters Adam's elementwise moments, which have no feature-space form; "
                         "use ntk_tt.adamw(...), or ntk_tt.linearised_reference for L2.")


def _check_precond(hp, hk: HeadAwareKernel) -> HeadAwareKernel:
    """``ak.precond`` checked against ``hk`` (same N, F, C and held-out inputs), in its dtype."""
    n, f = hk.features.shape
    check_head_aware(hp, n, hk.head_bias.shape[0])
    if np.shape(hp.features) != (n, f) or (hp.features_test is None) != (
            hk.features_test is None) or np.shape(hp.basis) != np.shape(hk.basis):
        raise ValueError("ak.precond must be built on the inputs and basis of ak.hk (the same "
                         "training and held-out sets): use adam_head_aware_kernel.")
    return HeadAwareKernel(*(None if a is None else jnp.asarray(a, hk.features.dtype) for a in hp))


def _maybe_nonzero(value) -> bool:
    return isinstance(value, jax.core.Tracer) or np.ndim(value) != 0 or float(value) != 0.0


@partial(jax.jit, static_argnames="loss")
def _adam_core(hk, hp, y, optimizer, batches, a_h, a_h_test, *, loss, table=None):
    """Logits (T + 1, N, C) and held-out ones or None; ``table``: the drifting profile's
    (:class:`DriftTable`) or None (frozen: the scalar ρ)."""
    a_h, a_h_test = decay_in_span(hk, a_h, a_h_test)
    steps, bsz = batches.shape
    n = hk.features.shape[0]
    dtype = hk.features.dtype
    lrs = optimizer.learning_rates(steps).astype(dtype)
    b1, b2 = (jnp.asarray(v, dtype) for v in (optimizer.momentum, optimizer.b2))
    eps, wd = (jnp.asarray(v, dtype) for v in (optimizer.eps, optimizer.weight_decay))
    norm0 = expected_norm0(hk, y, bsz, loss)
    if table is not None:  # z = K_h vec(Q_0), ‖g_0‖² = vec(Q_0)ᵀ z (function space)
        f0 = hk.features @ hk.head_kernel + hk.head_bias
        g_all = logit_residual(f0, y, loss) / n
        q_all = g_all @ hk.head_kernel.T
        z = _backbone_step(hk.backbone, hk.mixing, jnp.arange(n), g_all, hk.head_kernel,
                           q_all, n, hk.basis)
        big_g = jnp.sum(q_all * z)
    tiny = jnp.finfo(dtype).tiny
    decay = a_h is not None

    def adam_head(p, mom, var, grad, c1, c2, lr):
        mom = b1 * mom + (1 - b1) * grad
        var = b2 * var + (1 - b2) * grad**2
        direction = (mom / c1) / (jnp.sqrt(var / c2) + eps)
        if decay:
            direction = direction + wd * p
        return p - lr * direction, mom, var

    def backbone(phi, big_m, kernel, idx, g, w, q, tangent, scale, lr):
        big_m = b1 * big_m + (1 - b1) * _backbone_step(kernel, hp.mixing, idx, g, w, q,
                                                       phi.shape[0], hp.basis)
        direction = big_m * scale
        if decay:
            direction = direction + wd * (tangent + phi)
        return phi - lr * direction, big_m

    def step(s, inputs):
        idx, lr, t = inputs
        c1, c2 = 1 - b1 ** (t + 1), 1 - b2 ** (t + 1)
        hb = (hk.features + s.phi)[idx]
        g = logit_residual(hb @ s.w + s.b, y[idx], loss) / bsz
        q = g @ s.w.T
        w, mw, vw = adam_head(s.w, s.mw, s.vw, hb.T @ g, c1, c2, lr)
        b, mb, vb = adam_head(s.b, s.mb, s.vb, jnp.sum(g, axis=0), c1, c2, lr)
        if table is None:
            rho = b2 * s.rho + (1 - b2) * quadratic_form(hk, idx, q) / norm0
            scale = 1.0 / (c1 * jnp.sqrt(jnp.maximum(rho / c2, tiny)))  # 1/((1 − β₁ᵗ)√ρ̂)
        else:  # ρ holds the EMAs (A, E) of the drift
            along = jnp.sum(q * z[idx]) / big_g
            rest = jnp.maximum(quadratic_form(hk, idx, q) - along**2 * big_g, 0.0)
            rho, size = drift_scale(table, s.rho, along, rest, big_g, b2, c2, tiny)
            scale = size / c1
        phi, big_m = backbone(s.phi, s.big_m, hp.backbone, idx, g, s.w, q, a_h, scale, lr)
        phit, big_mt = s.phit, s.big_mt
        if phit is not None:
            phit, big_mt = backbone(phit, big_mt, hp.backbone_test, idx, g, s.w, q, a_h_test,
                                    scale, lr)
        s = AdamHeadState(w, b, mw, vw, mb, vb, phi, big_m, rho, phit, big_mt)
        return s, head_logits(hk, w, b, phi, phit)

    zf = jnp.zeros_like(hk.features)
    zt = None if hk.features_test is None else jnp.zeros_like(hk.features_test)
    w0, b0 = hk.head_kernel, hk.head_bias
    s0 = AdamHeadState(w0, b0, jnp.zeros_like(w0), jnp.zeros_like(w0), jnp.zeros_like(b0),
                       jnp.zeros_like(b0), zf, zf,
                       jnp.zeros((), dtype) if table is None else jnp.zeros(2, dtype), zt, zt)
    ts = jnp.arange(steps, dtype=dtype)
    _, (fs, fts) = jax.lax.scan(step, s0, (batches, lrs, ts))
    f0, ft0 = head_logits(hk, w0, b0, zf, zt)
    fs = jnp.concatenate([f0[None], fs])
    fts = None if ft0 is None else jnp.concatenate([ft0[None], fts])
    return fs, fts
