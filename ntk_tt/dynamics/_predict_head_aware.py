"""The head-aware dynamics: (W, b, θ) trained by optax with the backbone linearised.

On the model f(x) = (h_0(x) + φ(x))·W + b, φ(x) = J_h(x)(θ − θ_0), of
``ntk_tt.kernels._head_aware`` (whose :class:`HeadAwareKernel` holds h_0, the head and the
backbone feature kernel K_h = J_h J_hᵀ), optax's ``sgd(η, m, nesterov)`` on the mean loss
closes on (W, b, φ on the training inputs): with g = ∂L_B/∂f (B, C) on the minibatch B,

    grad_W = h_Bᵀ g,   grad_b = Σ_B g,   J_h grad_θ = Σ_{j∈B} K_h(·, j) (g_j Wᵀ),

and heavy ball / Nesterov act on each of the three exactly as on weights (J_h is constant, so
the backbone's velocity maps to feature space linearly). Each step costs O(N·B·C + N·F·C)
with the Kronecker feature kernel K_h(i, j) = k_b(i, j)·S (the residual g is contracted with
k_b before Wᵀ S maps it to features), O(N·F·B·F) with the exact one. Held-out
features follow with the cross kernel. This is exact for a network whose backbone is linear
in its weights (e.g. h = V x) and equals real optax training of f = (h_0 + J_h Δθ)W + b
(METHOD.md §10). :func:`predict_head_aware` is the sibling of
:func:`ntk_tt.predict_from_kernel` for this model.
"""

from __future__ import annotations

import weakref
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt.data._batches import path_batch_indices
from ntk_tt.dynamics._checks import (
    check_hyper,
    check_labels,
    check_num_paths,
    flag,
    solve_dtype_fields,
)
from ntk_tt.dynamics._fspace import clamp_psd
from ntk_tt.dynamics._losses import check_loss, logit_residual
from ntk_tt.dynamics._optim_linear import check_shorthand
from ntk_tt.dynamics._predict_kernel import _summarise
from ntk_tt.dynamics._regime import abstain_beyond_travel, kernel_travel
from ntk_tt.kernels._diagonal import solve_form
from ntk_tt.kernels._head_aware import (
    HeadAwareKernel,
    check_head_aware,
    head_kernel_part,
    initial_kernel,
)


class HeadState(NamedTuple):
    """State of the head-aware model: head W (F, C), b (C,), feature displacement φ (N, F)
    and their optax velocities u_W, u_b, v_φ; ``u_q`` (N, F): the backbone velocity as
    J_hᵀ u_q, and ``z`` (N, F): the backbone displacement since the last linearisation,
    θ − θ_k = −J_hᵀ z (both used when the backbone is re-linearised); φ_test, v_φ_test
    (N_test, F) or None."""

    w: jax.Array
    b: jax.Array
    phi: jax.Array
    uw: jax.Array
    ub: jax.Array
    vphi: jax.Array
    u_q: jax.Array
    z: jax.Array
    phit: jax.Array | None
    vphit: jax.Array | None


def head_aware_step(state: HeadState, idx, hk: HeadAwareKernel, y, *, learning_rate,
                    momentum, nesterov, loss, track_backbone: bool = True) -> HeadState:
    """One optax ``sgd(η, m, nesterov)`` step of the head-aware model on minibatch ``idx``
    (B,): exact for f = (h_0 + J_h Δθ) W + b with K_h = J_h J_hᵀ as given by ``hk``.
    ``track_backbone=False`` leaves ``u_q`` and ``z`` as they are: they are needed only to
    re-linearise the backbone, and updating them costs a sixth of an SGD step."""
    n = hk.features.shape[0]
    hb = (hk.features + state.phi)[idx]  # the batch features h_0 + φ (B, F)
    g = logit_residual(hb @ state.w + state.b, y[idx], loss) / idx.shape[0]  # (B, C)
    gw, gb = hb.T @ g, jnp.sum(g, axis=0)
    q = g @ state.w.T  # (B, F): ∂L/∂h on the batch
    dphi = _backbone_step(hk.backbone, hk.mixing, idx, g, state.w, q, n, hk.basis)

    def move(p, u, d):
        u = momentum * u + d
        step = d + momentum * u if nesterov else u
        return p - learning_rate * step, u, step

    w, uw, _ = move(state.w, state.uw, gw)
    b, ub, _ = move(state.b, state.ub, gb)
    phi, vphi, _ = move(state.phi, state.vphi, dphi)
    u_q, z = state.u_q, state.z
    if track_backbone:
        _, u_q, dz = move(0.0, u_q, jnp.zeros_like(state.phi).at[idx].add(q))
        z = z + learning_rate * dz
    phit, vphit = state.phit, state.vphit
    if phit is not None:
        dphit = _backbone_step(hk.backbone_test, hk.mixing, idx, g, state.w, q, phit.shape[0],
                               hk.basis)
        phit, vphit, _ = move(phit, vphit, dphit)
    return HeadState(w, b, phi, uw, ub, vphi, u_q, z, phit, vphit)


def _backbone_step(kernel, mixing, idx, g, w, q, rows, basis=None):
    """Σ_{j∈idx} K_h(·, j) q_j for q = g Wᵀ (B, F), g (B, C): (rows, F). The Kronecker kernel
    contracts the C-wide g first, (k_b[:, idx] g)(Wᵀ S): O(rows·B·C + rows·C·F) work instead
    of O(rows·B·F) (F/C = 13× less on the shipped model's F = 64, C = 5)."""
    if mixing is not None:
        return (kernel[:, idx] @ g) @ (w.T @ mixing)
    return _feature_kernel_dot(kernel, mixing, idx, q, rows, basis)


def _feature_kernel_dot(kernel, mixing, idx, q, rows, basis=None):
    """Σ_{j∈idx} K_h(·, j) q_j: (rows, F). With a subspace ``basis`` Z (F, k) the kernel is
    K_Z (rows·k, N·k): Z (K_Z (q Z)), the features moving in span(Z); a diagonal K_Z may come
    as its k blocks (k, rows, N) (``ntk_tt.kernels._diagonal.solve_form``)."""
    if mixing is not None:  # Kronecker: k_b[:, idx] (q S), S applied to the B rows only
        return kernel[:, idx] @ (q @ mixing)
    qz = q if basis is None else q @ basis
    k = qz.shape[1]
    # the B rows of q scattered into an (N, k) array (zero elsewhere): one matrix-vector
    # product with the whole kernel, never a gathered (rows·k, B, k) copy of its columns
    if kernel.ndim == 3:  # K_Z's diagonal blocks: k products of N × N, not one of (N·k)²
        full = jnp.zeros((kernel.shape[2], k), qz.dtype).at[idx].add(qz)
        out = jnp.einsum("aij,ja->ia", kernel, full)
        return out @ basis.T
    full = jnp.zeros((kernel.shape[1] // k, k), qz.dtype).at[idx].add(qz)
    out = (kernel @ full.reshape(-1)).reshape(rows, k)
    return out if basis is None else out @ basis.T


def logits(hk: HeadAwareKernel, state: HeadState, test: bool = False) -> jax.Array:
    """Training (or held-out) logits (N, C) of a head-aware state."""
    if test:
        return (hk.features_test + state.phit) @ state.w + state.b
    return (hk.features + state.phi) @ state.w + state.b


def initial_state(hk: HeadAwareKernel, w=None, b=None, u=None) -> HeadState:
    """The state at the start of a segment: head (W, b) (default ``hk``'s) with velocities
    ``u = (u_W, u_b, u_q)`` (default zero); φ = 0 and v_φ = K_h u_q, the backbone's carried
    velocity seen through ``hk``'s feature kernel."""
    w = hk.head_kernel if w is None else w
    b = hk.head_bias if b is None else b
    zf = jnp.zeros_like(hk.features)
    uw, ub, u_q = (jnp.zeros_like(w), jnp.zeros_like(b), zf) if u is None else u
    every = jnp.arange(zf.shape[0])
    with_test = hk.features_test is not None
    zt = jnp.zeros_like(hk.features_test) if with_test else None
    vt = (_feature_kernel_dot(hk.backbone_test, hk.mixing, every, u_q, zt.shape[0], hk.basis)
          if with_test else None)
    return HeadState(w, b, zf, uw, ub,
                     _feature_kernel_dot(hk.backbone, hk.mixing, every, u_q, zf.shape[0],
                                         hk.basis),
                     u_q, zf, zt, vt)


def head_aware_trajectory(hk: HeadAwareKernel, y, batches, *, learning_rate, momentum,
                          nesterov, loss, state0: HeadState | None = None,
                          track_backbone: bool = True):
    """Logits after 0..T steps (T + 1, N, C), held-out logits (or None) and the final
    :class:`HeadState`, for one batch sequence ``batches`` (T, B) from ``state0`` (default:
    :func:`initial_state`); ``track_backbone`` as :func:`head_aware_step`."""
    with_test = hk.features_test is not None
    state0 = initial_state(hk) if state0 is None else state0

    def step(state, idx):
        state = head_aware_step(state, idx, hk, y, learning_rate=learning_rate,
                                momentum=momentum, nesterov=nesterov, loss=loss,
                                track_backbone=track_backbone)
        return state, (logits(hk, state), logits(hk, state, True) if with_test else None)

    last, (fs, fts) = jax.lax.scan(step, state0, batches)
    fs = jnp.concatenate([logits(hk, state0)[None], fs])
    if with_test:
        fts = jnp.concatenate([logits(hk, state0, True)[None], fts])
    return fs, fts, last


def head_aware_paths(hk: HeadAwareKernel, y, *, key, num_paths, batch_size, steps,
                     **kwargs):
    """``head_aware_trajectory`` over ``num_paths`` minibatch orders (path 0 = the order of a
    real run with ``key``), vmapped; or one full-batch path when ``batch_size`` = N.
    Returns logits (P, T + 1, N, C) and held-out logits or None."""
    kwargs = dict(kwargs, track_backbone=False)  # the final state is not returned
    n = hk.features.shape[0]
    if batch_size == n:
        batches = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (steps, n))
        fs, fts, _ = head_aware_trajectory(hk, y, batches, **kwargs)
        return fs[None], None if fts is None else fts[None]
    batches = path_batch_indices(key, n, batch_size, steps, num_paths)
    fs, fts, _ = jax.vmap(lambda bt: head_aware_trajectory(hk, y, bt, **kwargs))(batches)
    return fs, fts


@jax.jit
def initial_eigenvalues(hk: HeadAwareKernel) -> tuple[jax.Array, jax.Array]:
    """(λ_min, λ_max) of Θ_0 (``ntk_tt.kernels._head_aware.initial_kernel``, (N·C, N·C))
    without forming it.

    With a Kronecker (or isotropic) feature kernel, Θ_0 = A ⊗ I_C + k_b ⊗ M with
    A = H Hᵀ + 1 and M = W_0ᵀ S W_0 (C × C, PSD). In the eigenbasis M = U diag(g) Uᵀ,
    (I ⊗ U)ᵀ Θ_0 (I ⊗ U) is block diagonal with the C blocks A + g_c k_b (N × N), so Θ_0's
    spectrum is theirs: C factorisations of N × N instead of one of N·C × N·C (C² less work,
    C² less memory). Each block goes through ``clamp_psd`` with the tolerance of the whole
    (N·C)-sized Θ_0, so λ_min is, as for Θ_0 itself, exact when negative beyond rounding and an
    inverse-iteration estimate (an upper bound) otherwise. The exact feature kernel
    (``mixing`` None) has no such structure: Θ_0 is formed.

    Returns:
      two scalars; ``negative_significant(λ_min, λ_max, N·C)`` says whether Θ_0 has
      eigenvalues significantly below zero.
    """
    n, c = hk.features.shape[0], hk.head_kernel.shape[1]
    if hk.mixing is None:
        return clamp_psd(initial_kernel(hk))[1]
    w = hk.head_kernel
    m = w.T @ hk.mixing @ w
    g = jnp.linalg.eigvalsh(0.5 * (m + m.T))
    a = head_kernel_part(hk.features, hk.features)
    lmin, lmax = jax.lax.map(lambda gc: clamp_psd(a + gc * hk.backbone, size=n * c)[1], g)
    return jnp.min(lmin), jnp.max(lmax)


_SPECTRA: dict = {}  # ids of Θ_0's arrays → (weak references to them, (λ_min, λ_max))


def initial_eigenvalues_once(hk: HeadAwareKernel) -> tuple[jax.Array, jax.Array]:
    """:func:`initial_eigenvalues`, computed once per kernel: a later call with the very same
    arrays (the one ``head_kernel`` of a sweep's rows; its Θ_0 factorisation takes 1.4 s at
    N·C = 3,750 here) returns the stored pair. Arrays are immutable and held by weak
    reference, so a freed kernel's entry is never matched (at most 8 are kept); under a trace
    (a traced kernel, or a concrete one inside a caller's ``jit``) it is computed, not kept."""
    arrays = (hk.features, hk.head_kernel, hk.backbone, hk.mixing, hk.basis)
    if any(isinstance(a, jax.core.Tracer) for a in arrays):
        return initial_eigenvalues(hk)
    key = tuple(id(a) for a in arrays)
    refs, lams = _SPECTRA.get(key, ((), None))
    if lams is not None and all((r() if r is not None else None) is a
                                for r, a in zip(refs, arrays, strict=True)):
        return lams
    lams = initial_eigenvalues(hk)
    if any(isinstance(v, jax.core.Tracer) for v in lams):  # computed inside a caller's trace
        return lams
    if len(_SPECTRA) >= 8:
        _SPECTRA.pop(next(iter(_SPECTRA)))
    _SPECTRA[key] = (tuple(None if a is None else weakref.ref(a) for a in arrays), lams)
    return lams


def validate(hk: HeadAwareKernel, y, y_test, *, learning_rate, momentum, steps, batch_size,
             loss, key, num_paths, nesterov=False):
    """The checks of :func:`predict_head_aware` (ValueErrors before any work); returns the
    labels, held-out labels and batch size (N for GD)."""
    if not isinstance(hk, HeadAwareKernel):
        from ntk_tt.dynamics._adam_head_aware import AdamKernel

        hint = ("an AdamKernel serves optimizer=ntk_tt.adamw(...); for constant-η SGD pass "
                "its .hk" if isinstance(hk, AdamKernel) else
                "for a plain Θ use ntk_tt.predict_from_kernel")
        raise ValueError(f"hk must be a HeadAwareKernel (ntk_tt.head_aware_kernel(split, x)), "
                         f"got {type(hk).__name__}; {hint}.")
    check_loss(loss)
    n = np.shape(hk.features)[0]
    c = np.shape(hk.head_bias)[0] if np.ndim(hk.head_bias) == 1 else 0
    check_loss(loss, c)
    check_head_aware(hk, n, c)
    batch_size = n if batch_size is None else batch_size
    check_hyper(learning_rate, momentum, steps, batch_size, n, nesterov)
    check_num_paths(num_paths)
    y = check_labels(y, n, c)
    if batch_size < n and key is None:
        raise ValueError("SGD (batch_size < N) is random: pass key=jax.random.key(seed).")
    if hk.features_test is not None:
        if y_test is None:
            raise ValueError("hk has held-out features: pass y_test (N_test,).")
        y_test = check_labels(y_test, np.shape(hk.features_test)[0], c, name="y_test")
    elif y_test is not None:  # a fresh user: y_test was ignored, test_loss None, silently
        raise ValueError("y_test given, but the kernel has no held-out features: build it with "
                         "x_test (head_aware_kernel(split, x, x_test)) or drop y_test.")
    return y, y_test, batch_size


def predict_head_aware(hk: HeadAwareKernel, y, *, learning_rate=None, momentum=None, steps,
                       batch_size=None, nesterov=None, loss="cross_entropy", key=None,
                       num_paths=32, y_test=None, optimizer=None, a_h=None, a_h_test=None):
    """Predicted curves and T_ε of the head-aware model (head exact, backbone linearised).

    The sibling of :func:`ntk_tt.predict_from_kernel` with the same contract: η and m are
    traceable arrays (``jit(vmap(...))`` over a sweep shares one :class:`HeadAwareKernel`),
    steps, batch_size, nesterov, loss and num_paths are static; time is in optimiser steps and
    the loss is the MEAN over samples. SGD path 0 uses ``ntk_tt.batch_indices(key, N, B,
    steps)``, the batch order of a real run with the same key.

    Source: ntk_tt's own (issue 9; METHOD.md §10, "Head-aware model"; with ``optimizer``
    §11); T_ε as Zancato et al. 2020 (arXiv 2008.12478), Sec. 5, Alg. 1 (METHOD.md §6).

    Args:
      hk: :class:`HeadAwareKernel` (:func:`ntk_tt.head_aware_kernel`). y: labels (N,).
      learning_rate, momentum, steps, batch_size, nesterov, loss, key, num_paths: as
        :func:`ntk_tt.predict_from_kernel`. y_test: held-out labels (N_test,) when ``hk``
        has held-out features.
      optimizer: an :class:`ntk_tt.Optimizer` instead of the four constant-η keywords:
        rule "sgd" runs :func:`ntk_tt.head_aware_sgd_trajectory` (exact, METHOD.md §11);
        Adam/AdamW needs ``hk`` = ``ntk_tt.adam_head_aware_kernel(split, x, y, optimizer,
        x_test)`` (an :class:`ntk_tt.AdamKernel` of the same B) and runs the fast,
        approximate :func:`ntk_tt.head_aware_adam_trajectory`. The same curves as
        ``ntk_tt.predict(head=, optimizer=)``; κ uses the schedule's peak η_t. Its
        leaves may be traced (``jit`` / ``vmap`` / ``grad``) but Adam's ε, which the
        AdamKernel is built for; an entry the eager checks would refuse comes back NaN with
        code ``INVALID`` (as :func:`ntk_tt.predict_from_kernel`).
      a_h, a_h_test: J_h θ_0 on x (N, F) and x_test (N_test, F) (``ntk_tt.weight_tangent(
        feature_fn, backbone_params, x)``): ``optimizer`` with weight decay λ ≠ 0 only.

    Returns:
      :class:`ntk_tt.KernelPrediction`; ``kappa`` and ``min_eigenvalue`` refer to Θ_0
      (``ntk_tt.kernels._head_aware.initial_kernel``).

    Warns:
      LinearRegimeWarning: Adam/AdamW whose weight travel ρ = Σ η_t / ``hk.weight_rms`` over
        the ``steps`` exceeds 0.07 (``ntk_tt.dynamics._regime``), as ``ntk_tt.predict`` does
        (ρ is not returned: a KernelPrediction has no hyperparameters); beyond ρ = 1 the
        call abstains as ``predict``'s: ``beyond_edge`` True and outcome "unknown" unless the
        curve itself diverges (also under ``jit`` / ``vmap``, computed in JAX). Neither when
        ``hk.weight_rms`` is None; no warning when the schedule or ``weight_rms`` is traced.

    Raises:
      ValueError: as :func:`ntk_tt.predict_from_kernel` (``optimizer`` included), shapes of
        ``hk`` not matching, a complex field of ``hk``, an ``hk`` not of the optimiser's
        kind (Adam: an AdamKernel), Adam with L2 weight decay (use ``ntk_tt.adamw``), a
        traced Adam ε, a concrete ``a_h`` or ``a_h_test`` with NaN or inf; ``y_test``
        missing for an ``hk`` with held-out features, or given for one without.

    Dtypes: every array of ``hk`` is cast to their common floating dtype, at least float32
    (bfloat16 is promoted), and η, m to it; the result is in it (README, "Dtypes").
    """
    check_shorthand(optimizer, where="predict_head_aware", learning_rate=learning_rate,
                    momentum=momentum, nesterov=nesterov, batch_size=batch_size)
    if optimizer is not None:
        from ntk_tt.dynamics._optim_predict import head_aware_prediction

        out = head_aware_prediction(hk, y, optimizer, steps=steps, loss=loss, key=key,
                                    num_paths=num_paths, y_test=y_test, a_h=a_h,
                                    a_h_test=a_h_test)
        # Adam: ρ from the AdamKernel's weight_rms, warned (stacklevel 2 = the user's call of
        # this) and, beyond ρ = 1, the call abstains as predict's
        rms = getattr(hk, "weight_rms", None)
        kernel_travel(optimizer, steps, rms, stacklevel=2)
        return abstain_beyond_travel(out, optimizer, steps, rms)
    if a_h is not None or a_h_test is not None:
        raise ValueError("a_h and a_h_test (J_h θ_0) serve the weight decay of optimizer=; "
                         "drop them with the constant-η keywords.")
    momentum, nesterov = 0.0 if momentum is None else momentum, flag(nesterov)
    y, y_test, batch_size = validate(hk, y, y_test, learning_rate=learning_rate,
                                     momentum=momentum, steps=steps, batch_size=batch_size,
                                     loss=loss, key=key, num_paths=num_paths, nesterov=nesterov)
    hk, dtype = solve_dtype_fields(hk)  # one dtype for all of hk, η and m (README, "Dtypes")
    return _head_core(hk, solve_form(hk), y, jnp.asarray(learning_rate, dtype),
                      jnp.asarray(momentum, dtype), key, y_test, steps=steps,
                      batch_size=batch_size, nesterov=nesterov, loss=loss, num_paths=num_paths)


@partial(jax.jit, static_argnames=("steps", "batch_size", "nesterov", "loss", "num_paths"))
def _head_core(hk, solve, y, lr, m, key, y_test, *, steps, batch_size, nesterov, loss,
               num_paths):
    lams = initial_eigenvalues(hk)  # ``solve``: hk in the recursion's form (solve_form)
    fs, fts = head_aware_paths(solve, y, key=key, num_paths=num_paths, batch_size=batch_size,
                               steps=steps, learning_rate=lr, momentum=m, nesterov=nesterov,
                               loss=loss)
    size = hk.features.shape[0] * hk.head_kernel.shape[1]
    return _summarise(fs, fts, y, y_test, size, lr, m, lams, nesterov=nesterov,
                      loss=loss, stochastic=fs.shape[0] > 1,
                      feature_subspace=hk.basis is not None)
