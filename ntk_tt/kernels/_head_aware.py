"""Head-aware linearisation: the task head trained exactly, only the backbone linearised.

The fine-tuned network is f(x) = h(x; θ)·W + b (backbone features h ∈ R^F, a fresh linear
head W ∈ R^{F×C}, b ∈ R^C). The linearised model of Sec. 3 freezes the whole empirical NTK at
the pre-trained weights, but the backbone's share of Θ is

    Θ_backbone[(i, c), (j, c')] = Σ_{f, f'} W_{f c} K_h(i, j)_{f f'} W_{f' c'},
    K_h(i, j) = J_h(x_i) J_h(x_j)ᵀ   (F × F, the backbone feature kernel)

so it grows with the head: from a small fresh head it grows quadratically in ‖W‖ as the
head learns (METHOD.md §10). The head-aware model keeps W and b exact and linearises the
backbone only,

    f(x) = (h_0(x) + φ(x))·W + b,       φ(x) = J_h(x)(θ − θ_0),

and trains (W, b, θ) by optax's ``sgd(η, m, nesterov)`` on the mean loss. Its dynamics close
on (W, b, φ on the training inputs): with g = ∂L_B/∂f (B, C) on the minibatch B,

    grad_W = h_Bᵀ g,   grad_b = Σ_B g,   J_h grad_θ = Σ_{j∈B} K_h(·, j) (g_j Wᵀ),

and heavy ball / Nesterov act on each of the three exactly as on weights (J_h is constant, so
the backbone's velocity maps to feature space linearly). Each step costs O(N·B·C + N·F·C)
with the Kronecker feature kernel K_h(i, j) = k_b(i, j)·S (the residual g is contracted with
k_b before Wᵀ S maps it to features), O(N·F·B·F) with the exact one. Held-out
features follow with the cross kernel. This is exact for a network whose backbone is linear
in its weights (e.g. h = V x) and equals real optax training of f = (h_0 + J_h Δθ)W + b.

The Kronecker kernel is read off the ordinary empirical NTK: Θ − Θ_head with
Θ_head = (H Hᵀ + 1) ⊗ I_C is the backbone part Θ_b0 = k_b ⊗ (W_0ᵀ S W_0) at the fresh head, so
k_b = tr_C Θ_b0 / tr(W_0ᵀ S W_0) (a logit-summed kernel suffices), with S = I_F by default
(isotropic features) or S estimated from the feature kernel's diagonal blocks on a few inputs.
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ntk_tt._options import BACKBONES
from ntk_tt.data._batches import path_batch_indices
from ntk_tt.data._model import check_model
from ntk_tt.dynamics._losses import logit_residual
from ntk_tt.kernels._structured import contract, structured_jacobian


class HeadAwareKernel(NamedTuple):
    """Everything the head-aware dynamics need (F = feature width, C = classes).

    features: h_0 (N, F) at the pre-trained backbone. head_kernel: W_0 (F, C). head_bias:
    b_0 (C,). backbone: the feature kernel, either Kronecker k_b (N, N) (then ``mixing`` S is
    (F, F)) or exact K_h (N·F, N·F) sample-major (then ``mixing`` is None).
    features_test (N_test, F), backbone_test (N_test, N) or (N_test·F, N·F): held-out
    inputs, or None.
    """

    features: jax.Array
    head_kernel: jax.Array
    head_bias: jax.Array
    backbone: jax.Array
    mixing: jax.Array | None
    features_test: jax.Array | None = None
    backbone_test: jax.Array | None = None



class _Identity(nnx.Module):
    def __call__(self, x):
        return x


def split_head(model: nnx.Module) -> tuple[Any, Any, jax.Array, jax.Array]:
    """Split an NNX model with a linear ``head`` into backbone features and the head.

    Returns ``(feature_fn, backbone_params, head_kernel, head_bias)``: ``feature_fn(params,
    x) -> h`` (N, F) is the model with its head replaced by the identity (eval mode, as
    :func:`ntk_tt.from_nnx`), ``head_kernel`` (F, C) and ``head_bias`` (C,) the head's
    weights, so ``model(x) = feature_fn(backbone_params, x) @ head_kernel + head_bias``.

    Raises:
      ValueError: the model has no ``nnx.Linear`` attribute ``head`` with a bias.
    """
    from ntk_tt.data._model import from_nnx

    head = getattr(model, "head", None)
    if not isinstance(head, nnx.Linear) or head.bias is None:
        raise ValueError(
            f"the head-aware predictor needs a model whose classifier is an nnx.Linear "
            f"attribute `head` with a bias, got {type(model).__name__}; name the classifier "
            "layer `head` (ntk_tt.replace_head makes one)."
        )
    body = nnx.clone(model)
    body.head = _Identity()
    feature_fn, backbone_params = from_nnx(body)
    return (feature_fn, backbone_params, jnp.asarray(head.kernel[...]),
            jnp.asarray(head.bias[...]))


def head_kernel_part(h_rows: jax.Array, h_cols: jax.Array) -> jax.Array:
    """The head's logit-summed NTK share Σ_c Θ_head = C·(h_i·h_j + 1) divided by C: (N_r, N_c).

    Θ_head[(i, c), (j, c')] = δ_cc' (h_i·h_j + 1) (gradients wrt W and b).
    """
    return h_rows @ h_cols.T + 1.0


def kronecker_backbone(traced_kernel: jax.Array, h_rows: jax.Array, h_cols: jax.Array,
                       head_kernel: jax.Array, mixing: jax.Array) -> jax.Array:
    """k_b (N_r, N_c) from the logit-summed empirical NTK Σ_c Θ (N_r, N_c).

    Σ_c Θ_b0 = Σ_c Θ − C·(H_r H_cᵀ + 1) and Σ_c Θ_b0 = k_b · tr(W_0ᵀ S W_0).
    """
    c = head_kernel.shape[1]
    backbone = traced_kernel - c * head_kernel_part(h_rows, h_cols)
    return backbone / jnp.trace(head_kernel.T @ mixing @ head_kernel)


def feature_mixing(feature_fn, backbone_params, x: jax.Array) -> jax.Array:
    """S (F, F): the feature kernel's diagonal blocks Σ_i K_h(i, i) on inputs ``x`` (M, ...),
    normalised to trace F. The Kronecker model K_h(i, j) ≈ k_b(i, j)·S takes its
    feature-feature structure from it."""
    check_model(feature_fn, backbone_params, x, name="x (feature_fn inputs)")
    s = _diagonal_blocks(feature_fn, backbone_params, jnp.asarray(x))
    return s * (s.shape[0] / jnp.trace(s))


@partial(jax.jit, static_argnums=0)
def _diagonal_blocks(feature_fn, backbone_params, x):
    """Σ_i K_h(i, i) (F, F): one sample's Jacobian at a time in one compiled scan. Only the M
    diagonal blocks are needed, so the (M·F)² cross kernel (M·F·D work per entry row, 6×
    slower at M = 32, F = 64) is never formed."""
    def add(total, xi):
        jac = structured_jacobian(feature_fn, backbone_params, xi[None])
        return total + contract(jac, jac, False, symmetric=True), None

    h = jax.eval_shape(feature_fn, backbone_params, x[:1])
    return jax.lax.scan(add, jnp.zeros((h.shape[1],) * 2, h.dtype), x)[0]


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
    dphi = _backbone_step(hk.backbone, hk.mixing, idx, g, state.w, q, n)

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
        dphit = _backbone_step(hk.backbone_test, hk.mixing, idx, g, state.w, q, phit.shape[0])
        phit, vphit, _ = move(phit, vphit, dphit)
    return HeadState(w, b, phi, uw, ub, vphi, u_q, z, phit, vphit)


def _backbone_step(kernel, mixing, idx, g, w, q, rows):
    """Σ_{j∈idx} K_h(·, j) q_j for q = g Wᵀ (B, F), g (B, C): (rows, F). The Kronecker kernel
    contracts the C-wide g first, (k_b[:, idx] g)(Wᵀ S): O(rows·B·C + rows·C·F) work instead
    of O(rows·B·F) (F/C = 13× less on the shipped model's F = 64, C = 5)."""
    if mixing is not None:
        return (kernel[:, idx] @ g) @ (w.T @ mixing)
    return _feature_kernel_dot(kernel, mixing, idx, q, rows)


def _feature_kernel_dot(kernel, mixing, idx, q, rows):
    """Σ_{j∈idx} K_h(·, j) q_j: (rows, F)."""
    f = q.shape[1]
    if mixing is not None:  # Kronecker: k_b[:, idx] (q S), S applied to the B rows only
        return kernel[:, idx] @ (q @ mixing)
    cols = kernel.reshape(rows * f, -1, f)[:, idx, :]  # (rows·F, B, F)
    return jnp.einsum("rbf,bf->r", cols, q).reshape(rows, f)


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
    vt = (_feature_kernel_dot(hk.backbone_test, hk.mixing, every, u_q, zt.shape[0])
          if with_test else None)
    return HeadState(w, b, zf, uw, ub,
                     _feature_kernel_dot(hk.backbone, hk.mixing, every, u_q, zf.shape[0]),
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


def head_aware_kernel(split, x, x_test=None, *, backbone: str = "isotropic",
                      mixing_samples: int = 32, traced_kernel=None, traced_kernel_test=None,
                      key: jax.Array | None = None) -> HeadAwareKernel:
    """Build the :class:`HeadAwareKernel` of a network split as ``(feature_fn,
    backbone_params, head_kernel, head_bias)`` (:func:`split_head`) on inputs ``x`` (N, ...).

    ``backbone="kronecker"``: K_h(i, j) = k_b(i, j)·S with k_b from the logit-summed empirical
    NTK (``traced_kernel`` (N, N) if already computed, else built here) and S from the feature
    kernel's diagonal blocks on ``mixing_samples`` inputs drawn with ``key`` (the first ones if
    ``key`` is None). ``"isotropic"``: the same with S = I_F. ``"exact"``: the full feature
    kernel K_h (N·F, N·F), F²/C² times the cost of Θ (small N only).
    ``x_test`` (N_test, ...): also the held-out cross kernel (``traced_kernel_test``
    (N_test, N) if given).

    Raises:
      ValueError: unknown ``backbone``, ``mixing_samples`` < 1, kernels of the wrong shape or
        with NaN/inf, ``split`` not a 4-tuple, ``x``/``x_test`` that ``feature_fn`` cannot
        take (``check_model``'s messages, before any kernel work), or (Kronecker and isotropic,
        concrete values) a zero head or one so small that Θ's backbone share is below 10·eps
        of its largest entry: k_b would be 0/0 or rounding noise.
    """
    from ntk_tt.dynamics._checks import _check_finite
    from ntk_tt.kernels._ntk import empirical_ntk

    if backbone not in BACKBONES:
        raise ValueError(f"backbone must be one of {BACKBONES}, got {backbone!r}.")
    if isinstance(mixing_samples, bool) or not isinstance(mixing_samples, int) \
            or mixing_samples < 1:
        raise ValueError(f"mixing_samples must be an int >= 1, got {mixing_samples!r}.")
    if not isinstance(split, tuple | list) or len(split) != 4:
        size = f" of length {len(split)}" if isinstance(split, tuple | list) else ""
        raise ValueError("split must be ntk_tt.split_head(model): (feature_fn, "
                         "backbone_params, head_kernel, head_bias), got "
                         f"{type(split).__name__}{size}.")
    feature_fn, bparams, w0, b0 = split
    check_model(feature_fn, bparams, x, name="x (feature_fn inputs)")
    if x_test is not None:
        check_model(feature_fn, bparams, x_test, name="x_test (feature_fn inputs)")
    h0 = feature_fn(bparams, x)
    h0t = None if x_test is None else feature_fn(bparams, x_test)
    n, f = h0.shape
    if backbone == "exact":
        kh = empirical_ntk(feature_fn, bparams, x)
        kht = None if x_test is None else empirical_ntk(feature_fn, bparams, x_test, x)
        return HeadAwareKernel(h0, w0, b0, kh, None, h0t, kht)

    def apply_fn(p, xx):
        return feature_fn(p[0], xx) @ p[1] + p[2]

    params = (bparams, w0, b0)
    tk = (empirical_ntk(apply_fn, params, x, trace_logits=True)
          if traced_kernel is None else jnp.asarray(traced_kernel))
    if x_test is not None and traced_kernel_test is None:
        traced_kernel_test = empirical_ntk(apply_fn, params, x_test, x, trace_logits=True)
    for name, k, rows in (("traced_kernel", tk, n), ("traced_kernel_test", traced_kernel_test,
                                                     None if h0t is None else h0t.shape[0])):
        if k is not None and np.shape(k) != (rows, n):
            raise ValueError(f"{name} must be the logit-summed kernel ({rows}, {n}), got "
                             f"{np.shape(k)}.")
    if backbone == "isotropic":
        mixing = jnp.eye(f, dtype=h0.dtype)
    else:
        m = min(mixing_samples, n)
        pick = (jnp.arange(m) if key is None
                else jnp.sort(jax.random.choice(key, n, (m,), replace=False)))
        mixing = feature_mixing(feature_fn, bparams, jnp.asarray(x)[pick])
    _check_finite(tk, "traced_kernel")
    kb = kronecker_backbone(tk, h0, h0, w0, mixing)
    _check_backbone_resolved(tk, kb, w0, mixing)
    kbt = (None if h0t is None
           else kronecker_backbone(jnp.asarray(traced_kernel_test), h0t, h0, w0, mixing))
    return HeadAwareKernel(h0, w0, b0, kb, mixing, h0t, kbt)


def _check_backbone_resolved(traced_kernel, kb, w0, mixing) -> None:
    """ValueError when k_b cannot be read off the logit-summed Θ (concrete values only).

    k_b = (Σ_c Θ − C(H Hᵀ + 1)) / tr(W_0ᵀ S W_0): with a zero head the backbone's share is
    zero and k_b is 0/0; with a tiny head the difference is below the float rounding of Σ_c Θ
    and k_b is rounding noise divided by a tiny trace (it then blows the prediction up). The
    share max|k_b|·tr / max|Σ_c Θ| must exceed 10·eps, i.e. k_b known to better than ~10 %.
    """
    from ntk_tt.dynamics._checks import _concrete

    tk, kbc = _concrete(traced_kernel), _concrete(kb)
    if tk is None or kbc is None:
        return
    fix = ("initialise the head with non-zero weights of ordinary size (ntk_tt.replace_head), "
           "or use backbone='exact' (small N) or the frozen-kernel predictor "
           "(predictor='linear')")
    trace = float(jnp.trace(w0.T @ mixing @ w0))
    if not trace > 0:
        raise ValueError("the head-aware kernel needs a non-zero head: tr(W_0ᵀ S W_0) = "
                         f"{trace:.3g}, so the backbone's share of the logit-summed Θ is zero "
                         f"and k_b cannot be read off it; {fix}.")
    share = float(np.max(np.abs(kbc))) * trace / float(np.max(np.abs(tk)))
    tol = 10 * float(np.finfo(tk.dtype).eps)
    if not share > tol:
        raise ValueError(
            f"the backbone's share of the logit-summed Θ is {share:.2g} of its largest entry, "
            f"below float rounding ({tol:.2g}): the head (‖W_0‖_F = "
            f"{float(jnp.linalg.norm(w0)):.2g}) is too small for k_b to be read off Θ; "
            f"{fix}.")


def initial_kernel(hk: HeadAwareKernel) -> jax.Array:
    """The full empirical NTK Θ_0 (N·C, N·C) that the head-aware model starts from:
    (H Hᵀ + 1) ⊗ I_C plus the backbone part (I ⊗ W_0ᵀ) K_h (I ⊗ W_0)."""
    n, f = hk.features.shape
    c = hk.head_kernel.shape[1]
    w = hk.head_kernel
    head = jnp.kron(head_kernel_part(hk.features, hk.features), jnp.eye(c, dtype=w.dtype))
    if hk.mixing is not None:
        back = jnp.kron(hk.backbone, w.T @ hk.mixing @ w)
    else:
        kh = hk.backbone.reshape(n, f, n, f)
        back = jnp.einsum("fc,ifjg,gd->icjd", w, kh, w).reshape(n * c, n * c)
    return head + back


@jax.jit
def initial_eigenvalues(hk: HeadAwareKernel) -> tuple[jax.Array, jax.Array]:
    """(λ_min, λ_max) of Θ_0 (:func:`initial_kernel`, (N·C, N·C)) without forming it.

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
    from ntk_tt.dynamics._fspace import clamp_psd

    n, c = hk.features.shape[0], hk.head_kernel.shape[1]
    if hk.mixing is None:
        return clamp_psd(initial_kernel(hk))[1]
    w = hk.head_kernel
    m = w.T @ hk.mixing @ w
    g = jnp.linalg.eigvalsh(0.5 * (m + m.T))
    a = head_kernel_part(hk.features, hk.features)
    lmin, lmax = jax.lax.map(lambda gc: clamp_psd(a + gc * hk.backbone, size=n * c)[1], g)
    return jnp.min(lmin), jnp.max(lmax)


def check_head_aware(hk: HeadAwareKernel, n: int, c: int) -> None:
    """ValueErrors for a :class:`HeadAwareKernel` whose shapes do not match N and C."""
    if np.ndim(hk.features) != 2 or np.shape(hk.features)[0] != n:
        raise ValueError(f"features must be (N, F) = ({n}, F), got {np.shape(hk.features)}.")
    f = np.shape(hk.features)[1]
    if np.shape(hk.head_kernel) != (f, c) or np.shape(hk.head_bias) != (c,):
        raise ValueError(
            f"head_kernel must be (F, C) = ({f}, {c}) and head_bias ({c},), got "
            f"{np.shape(hk.head_kernel)} and {np.shape(hk.head_bias)}.")
    want = (n, n) if hk.mixing is not None else (n * f, n * f)
    if np.shape(hk.backbone) != want:
        raise ValueError(f"backbone kernel must be {want}, got {np.shape(hk.backbone)}.")
    if hk.mixing is not None and np.shape(hk.mixing) != (f, f):
        raise ValueError(f"mixing must be (F, F) = ({f}, {f}), got {np.shape(hk.mixing)}.")
    if (hk.features_test is None) != (hk.backbone_test is None):
        raise ValueError("features_test and backbone_test go together (or neither).")


def validate(hk: HeadAwareKernel, y, y_test, *, learning_rate, momentum, steps, batch_size,
             loss, key, num_paths):
    """The checks of :func:`predict_head_aware` (ValueErrors before any work); returns the
    labels, held-out labels and batch size (N for GD)."""
    from ntk_tt.dynamics._checks import check_hyper, check_labels, check_num_paths
    from ntk_tt.dynamics._losses import check_loss

    if not isinstance(hk, HeadAwareKernel):
        raise ValueError(f"hk must be a HeadAwareKernel (ntk_tt.head_aware_kernel(split, x)), "
                         f"got {type(hk).__name__}; for a plain Θ use ntk_tt.predict_from_kernel.")
    check_loss(loss)
    n = np.shape(hk.features)[0]
    c = np.shape(hk.head_bias)[0] if np.ndim(hk.head_bias) == 1 else 0
    check_loss(loss, c)
    check_head_aware(hk, n, c)
    batch_size = n if batch_size is None else batch_size
    check_hyper(learning_rate, momentum, steps, batch_size, n)
    check_num_paths(num_paths)
    y = check_labels(y, n, c)
    if batch_size < n and key is None:
        raise ValueError("SGD (batch_size < N) is random: pass key=jax.random.key(seed).")
    if hk.features_test is not None:
        if y_test is None:
            raise ValueError("hk has held-out features: pass y_test (N_test,).")
        y_test = check_labels(y_test, np.shape(hk.features_test)[0], c, name="y_test")
    return y, y_test, batch_size


def predict_head_aware(hk: HeadAwareKernel, y, *, learning_rate, momentum=0.0, steps,
                       batch_size=None, nesterov=False, loss="cross_entropy", key=None,
                       num_paths=32, y_test=None):
    """Predicted curves and T_ε of the head-aware model (head exact, backbone linearised).

    The sibling of :func:`ntk_tt.predict_from_kernel` with the same contract: η and m are
    traceable arrays (``jit(vmap(...))`` over a sweep shares one :class:`HeadAwareKernel`),
    steps, batch_size, nesterov, loss and num_paths are static; time is in optimiser steps and
    the loss is the MEAN over samples. SGD path 0 uses ``ntk_tt.batch_indices(key, N, B,
    steps)``, the batch order of a real run with the same key.

    Args:
      hk: :class:`HeadAwareKernel` (:func:`head_aware_kernel`). y: labels (N,).
      learning_rate, momentum, steps, batch_size, nesterov, loss, key, num_paths: as
        :func:`ntk_tt.predict_from_kernel`. y_test: held-out labels (N_test,) when ``hk``
        has held-out features.

    Returns:
      :class:`ntk_tt.KernelPrediction`; ``kappa`` and ``min_eigenvalue`` refer to Θ_0
      (:func:`initial_kernel`).

    Raises:
      ValueError: as :func:`ntk_tt.predict_from_kernel`, and shapes of ``hk`` not matching,
        or a complex field of ``hk``.

    Dtypes: every array of ``hk`` is cast to their common floating dtype, at least float32
    (bfloat16 is promoted), and η, m to it; the result is in it (README, "Dtypes").
    """
    from ntk_tt.dynamics._checks import solve_dtype_fields

    y, y_test, batch_size = validate(hk, y, y_test, learning_rate=learning_rate,
                                     momentum=momentum, steps=steps, batch_size=batch_size,
                                     loss=loss, key=key, num_paths=num_paths)
    hk, dtype = solve_dtype_fields(hk)  # one dtype for all of hk, η and m (README, "Dtypes")
    return _head_core(hk, y, jnp.asarray(learning_rate, dtype), jnp.asarray(momentum, dtype),
                      key, y_test, steps=steps, batch_size=batch_size, nesterov=nesterov,
                      loss=loss, num_paths=num_paths)


@partial(jax.jit, static_argnames=("steps", "batch_size", "nesterov", "loss", "num_paths"))
def _head_core(hk, y, lr, m, key, y_test, *, steps, batch_size, nesterov, loss, num_paths):
    from ntk_tt.dynamics._predict_kernel import _summarise

    lams = initial_eigenvalues(hk)
    fs, fts = head_aware_paths(hk, y, key=key, num_paths=num_paths, batch_size=batch_size,
                               steps=steps, learning_rate=lr, momentum=m, nesterov=nesterov,
                               loss=loss)
    size = hk.features.shape[0] * hk.head_kernel.shape[1]
    return _summarise(fs, fts, y, y_test, size, lr, m, lams, nesterov=nesterov,
                      loss=loss, stochastic=fs.shape[0] > 1)

