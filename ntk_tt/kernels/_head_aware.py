"""Head-aware linearisation: the task head trained exactly, only the backbone linearised.

The fine-tuned network is f(x) = h(x; θ)·W + b (backbone features h ∈ R^F, a fresh linear
head W ∈ R^{F×C}, b ∈ R^C). The linearised model of Sec. 3 freezes the whole empirical NTK at
the pre-trained weights, but the backbone's share of Θ is

    Θ_backbone[(i, c), (j, c')] = Σ_{f, f'} W_{f c} K_h(i, j)_{f f'} W_{f' c'},
    K_h(i, j) = J_h(x_i) J_h(x_j)ᵀ   (F × F, the backbone feature kernel)

so it grows with the head: from a small fresh head it grows quadratically in ‖W‖ as the
head learns (METHOD.md §10). The head-aware model keeps W and b exact and linearises the
backbone only,

    f(x) = (h_0(x) + φ(x))·W + b,       φ(x) = J_h(x)(θ − θ_0);

this module builds what its dynamics need, the :class:`HeadAwareKernel` (features h_0, the
head, the feature kernel K_h and its held-out cross kernel); the dynamics themselves are
``ntk_tt.dynamics._predict_head_aware``.

The Kronecker kernel is read off the ordinary empirical NTK: Θ − Θ_head with
Θ_head = (H Hᵀ + 1) ⊗ I_C is the backbone part Θ_b0 = k_b ⊗ (W_0ᵀ S W_0) at the fresh head, so
k_b = tr_C Θ_b0 / tr(W_0ᵀ S W_0) (a logit-summed kernel suffices), with S = I_F by default
(isotropic features) or S estimated from the feature kernel's diagonal blocks on a few inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ntk_tt._options import BACKBONES
from ntk_tt._options_predict import check_subspace_dim
from ntk_tt.data._model import check_concrete, check_model
from ntk_tt.kernels._structured import _diagonal_blocks


class HeadAwareKernel(NamedTuple):
    """Everything the head-aware dynamics need (F = feature width, C = classes).

    features: h_0 (N, F) at the pre-trained backbone. head_kernel: W_0 (F, C). head_bias:
    b_0 (C,). backbone: the feature kernel, either Kronecker k_b (N, N) (then ``mixing`` S is
    (F, F)), exact K_h (N·F, N·F) sample-major (``mixing`` and ``basis`` None), or exact on a
    feature subspace, K_Z = (I ⊗ Zᵀ) K_h (I ⊗ Z) (N·k, N·k) sample-major (``basis`` Z (F, k)
    with orthonormal columns, ``mixing`` None: the features move in span(Z) only).
    features_test (N_test, F), backbone_test (N_test, N), (N_test·F, N·F) or
    (N_test·k, N·k): held-out inputs, or None.

    Source: ntk_tt's own (issue 9; METHOD.md §10; the subspace form issue 26).
    """

    features: jax.Array
    head_kernel: jax.Array
    head_bias: jax.Array
    backbone: jax.Array
    mixing: jax.Array | None
    features_test: jax.Array | None = None
    backbone_test: jax.Array | None = None
    basis: jax.Array | None = None


class _Identity(nnx.Module):
    def __call__(self, x):
        return x


def split_head(model: nnx.Module) -> tuple[Any, Any, jax.Array, jax.Array]:
    """Split an NNX model with a linear ``head`` into backbone features and the head.

    Source: ntk_tt's own (issue 9; METHOD.md §10): the f = h W + b split of the head-aware
    model.

    Args:
      model: the NNX model to fine-tune (not modified: the backbone is a copy).

    Returns:
      ``(feature_fn, backbone_params, head_kernel, head_bias)``: ``feature_fn(params, x) -> h``
      (N, F) is the model with its head replaced by the identity (eval mode, as
      :func:`ntk_tt.from_nnx`), ``head_kernel`` (F, C) and ``head_bias`` (C,) the head's
      weights, so ``model(x) = feature_fn(backbone_params, x) @ head_kernel + head_bias``.

    Raises:
      ValueError: the model has no ``nnx.Linear`` attribute ``head`` with a bias.
    """
    from ntk_tt.data._model import from_nnx

    head = getattr(model, "head", None)
    if isinstance(head, nnx.Linear) and head.bias is None:
        raise ValueError(f"split_head: the `head` of {type(model).__name__} is an nnx.Linear "
                         "without a bias (use_bias=False); the head-aware predictor needs W "
                         "and b: build it with use_bias=True (ntk_tt.replace_head does).")
    if not isinstance(head, nnx.Linear):
        raise ValueError(f"split_head (the head-aware predictor) needs a model whose "
                         f"classifier is an nnx.Linear attribute `head` with a bias, got "
                         f"{type(model).__name__}; name the classifier layer `head` "
                         "(ntk_tt.replace_head makes one).")
    body = nnx.clone(model)
    body.head = _Identity()
    feature_fn, backbone_params = from_nnx(body)
    return (feature_fn, backbone_params, jnp.asarray(head.kernel[...]),
            jnp.asarray(head.bias[...]))


def head_kernel_part(h_rows: jax.Array, h_cols: jax.Array) -> jax.Array:
    """The head's logit-summed NTK share Σ_c Θ_head = C·(h_i·h_j + 1) divided by C: (N_r, N_c)
    (Θ_head[(i, c), (j, c')] = δ_cc' (h_i·h_j + 1): the gradients with respect to W and b)."""
    return h_rows @ h_cols.T + 1.0


def kronecker_backbone(traced_kernel: jax.Array, h_rows: jax.Array, h_cols: jax.Array,
                       head_kernel: jax.Array, mixing: jax.Array) -> jax.Array:
    """k_b (N_r, N_c) from the logit-summed empirical NTK Σ_c Θ (N_r, N_c): Σ_c Θ_b0 =
    Σ_c Θ − C·(H_r H_cᵀ + 1) and Σ_c Θ_b0 = k_b · tr(W_0ᵀ S W_0)."""
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


def feature_basis(features: jax.Array, k: int) -> jax.Array:
    """Z (F, k), k ≤ F: the k leading right singular vectors of the centred features
    h_0 − mean(h_0) (N, F), orthonormal columns: the feature directions a ``"subspace"`` kernel
    moves. Past the features' rank (≤ N − 1) the columns complete an orthonormal basis of
    R^F, so k = F spans every direction (the exact kernel) even when N < F."""
    centred = features - jnp.mean(features, axis=0)  # rank ≤ N − 1: beyond it, F − rank more
    return jnp.linalg.svd(centred, full_matrices=True)[2][:k].T  # orthonormal directions


@dataclass(frozen=True)
class _Projected:
    """``(Z, params, x) ↦ feature_fn(params, x) @ Z`` (N, k): the features' coordinates in
    span(Z), equal for the same ``feature_fn``. Bound to Z with ``jax.tree_util.Partial``, the
    kernel's compiled Jacobian program is reused for every basis of the same shape (each
    task, data set or call) instead of compiled per call around a fresh closure."""

    feature_fn: Any

    def __call__(self, basis, p, xx):
        return self.feature_fn(p, xx) @ basis


def check_head_reproduces(split, apply_fn, params, x) -> None:
    """ValueError unless ``split`` (:func:`split_head`) gives ``apply_fn`` on 4 inputs of x:
    ``feature_fn(backbone_params, x) @ head_kernel + head_bias`` (a layer after ``head``, or
    another model's split, fails here in one line, not in a raw shape error)."""
    feature_fn, bparams, w, b = split
    xs = jnp.asarray(x)[:4]
    f = np.asarray(apply_fn(params, xs))
    why = "differs from apply_fn(params, x)"
    try:
        g = np.asarray(feature_fn(bparams, xs) @ w + b)
    except (TypeError, ValueError) as err:  # e.g. a layer after `head` gets the features
        g, why = None, f"fails ({str(err).splitlines()[0]}): does a layer follow `head`?"
    if g is None or g.shape != f.shape \
            or not np.allclose(g, f, rtol=1e-4, atol=1e-4 * (1 + np.abs(f).max())):
        raise ValueError(
            f"head does not reproduce apply_fn: feature_fn(backbone_params, x) @ head_kernel + "
            f"head_bias {why}; the head must be the model's last layer, model(x) = "
            "features(x) @ W + b: split the same model you predict (ntk_tt.split_head(model) "
            "after replace_head).") from None


def check_split(split) -> None:
    """ValueError unless ``split`` is a 4-tuple (or list) as :func:`split_head` returns."""
    if not isinstance(split, tuple | list) or len(split) != 4:
        size = f" of length {len(split)}" if isinstance(split, tuple | list) else ""
        raise ValueError("split must be ntk_tt.split_head(model): (feature_fn, backbone_params, "
                         f"head_kernel, head_bias), got {type(split).__name__}{size}.")


def head_aware_kernel(split, x, x_test=None, *, backbone: str = "isotropic",
                      mixing_samples: int = 32, traced_kernel=None, traced_kernel_test=None,
                      key: jax.Array | None = None,
                      subspace_dim: int | None = None) -> HeadAwareKernel:
    """Build the :class:`HeadAwareKernel` of a network split by :func:`split_head` on ``x``.

    ``backbone="kronecker"``: K_h(i, j) = k_b(i, j)·S with k_b from the logit-summed empirical
    NTK and S from the feature kernel's diagonal blocks on ``mixing_samples`` inputs.
    ``"isotropic"``: the same with S = I_F. ``"exact"``: the full feature kernel K_h (N·F,
    N·F), F²/C² times the cost of Θ (small N only). ``"subspace"``: K_h exactly on the
    k = min(``subspace_dim``, F) leading principal directions Z (F, k) of the centred training
    features h_0 (their right singular vectors), K_Z = (I ⊗ Zᵀ) K_h (I ⊗ Z) (N·k, N·k), k²/C²
    times the cost of Θ; the features move in span(Z) only (issue 26: k = 16 brings the full
    preset's constant-η T_ε p95 from 22.7 / 23.0 % to 9.9 / 15.6 %, GD / SGD; README "Error
    budget"). ``"diagonal"``: K_Z's diagonal blocks only (``ntk_tt.kernels._diagonal``; k = 5:
    the multiply-adds of a 5-class logit-summed Θ; README "Which predictor").

    Source: ntk_tt's own (issue 9; METHOD.md §10, the head-aware model and its feature
    kernels; "subspace" issue 26), built from the empirical NTK of Zancato et al. 2020, eq. (2).

    Args:
      split: ``(feature_fn, backbone_params, head_kernel, head_bias)`` from :func:`split_head`.
      x: training inputs (N, ...) that ``feature_fn`` takes.
      x_test: held-out inputs (N_test, ...) for the cross kernel, or None.
      backbone: "isotropic" (default), "kronecker", "exact", "subspace" or "diagonal".
      mixing_samples: "kronecker": the number of inputs S is estimated on (at most N).
      traced_kernel: "kronecker" / "isotropic": Σ_c Θ(x, x) (N, N) if already computed
        (None: built here); the other backbones ignore it.
      traced_kernel_test: likewise Σ_c Θ(x_test, x) (N_test, N).
      key: "kronecker": ``jax.random`` key drawing the mixing inputs (None: the first ones).
      subspace_dim: "subspace" / "diagonal": k (None: 16 / 5).

    Returns:
      :class:`HeadAwareKernel` (fields and shapes there); its held-out fields are None
      without ``x_test``.

    Raises:
      ValueError: unknown ``backbone``, ``mixing_samples`` < 1, ``subspace_dim`` not an
        int >= 1 (None: ``SUBSPACE_DIM``) or given with another backbone, kernels of the
        wrong shape or with NaN/inf, ``split`` not a 4-tuple, ``x``/``x_test`` that
        ``feature_fn`` cannot take (``check_model``'s messages, before any kernel work), a
        traced argument (no ``jax.jit``, ``vmap`` or ``grad`` over the kernel's
        construction), or (Kronecker and isotropic) a zero head or one so small that Θ's
        backbone share is below 10·eps of its largest entry: k_b would be 0/0 or rounding
        noise. NTKMemoryError: "exact" with K_h (and its test part) over half the memory.
    """
    from ntk_tt.data._inputs import _check_finite
    from ntk_tt.kernels._diagonal import diagonal_kernel
    from ntk_tt.kernels._memory import check_feature_kernel_fits
    from ntk_tt.kernels._ntk import empirical_ntk

    if backbone not in BACKBONES:
        raise ValueError(f"backbone must be one of {BACKBONES}, got {backbone!r}.")
    if isinstance(mixing_samples, bool) or not isinstance(mixing_samples, int) \
            or mixing_samples < 1:
        raise ValueError(f"mixing_samples must be an int >= 1, got {mixing_samples!r}.")
    subspace_dim = check_subspace_dim(subspace_dim, backbone)  # None: SUBSPACE_DIM for it
    check_split(split)
    check_concrete("head_aware_kernel", split=split[1:], x=x, x_test=x_test,
                   traced_kernel=traced_kernel, traced_kernel_test=traced_kernel_test)
    feature_fn, bparams, w0, b0 = split
    check_model(feature_fn, bparams, x, name="x (feature_fn inputs)")
    if x_test is not None:
        check_model(feature_fn, bparams, x_test, name="x_test (feature_fn inputs)")
    h0 = feature_fn(bparams, x)
    h0t = None if x_test is None else feature_fn(bparams, x_test)
    n, f = h0.shape
    if backbone == "exact":
        check_feature_kernel_fits(n * f, 0 if h0t is None else h0t.shape[0] * f, h0.itemsize)
        kh = empirical_ntk(feature_fn, bparams, x)
        kht = None if x_test is None else empirical_ntk(feature_fn, bparams, x_test, x)
        return HeadAwareKernel(h0, w0, b0, kh, None, h0t, kht)
    if backbone in ("subspace", "diagonal"):
        z = feature_basis(h0, min(int(subspace_dim), f))  # k ≥ F: every direction (exact)
        projected = jax.tree_util.Partial(_Projected(feature_fn), z)
        ntk = empirical_ntk if backbone == "subspace" else diagonal_kernel
        kz = ntk(projected, bparams, x)
        _check_finite(kz, f"{backbone} feature kernel's empirical NTK Θ(x, x)", computed=True)
        kzt = None if x_test is None else ntk(projected, bparams, x_test, x)
        return HeadAwareKernel(h0, w0, b0, kz, None, h0t, kzt, z)

    apply_fn, params = _WithHead(feature_fn), (bparams, w0, b0)
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
    _check_finite(tk, "logit-summed empirical NTK Θ(x, x)" if traced_kernel is None else
                  "traced_kernel", computed=traced_kernel is None)
    kb = kronecker_backbone(tk, h0, h0, w0, mixing)
    _check_backbone_resolved(tk, kb, w0, mixing)
    kbt = None if h0t is None else kronecker_backbone(jnp.asarray(traced_kernel_test), h0t,
                                                      h0, w0, mixing)
    return HeadAwareKernel(h0, w0, b0, kb, mixing, h0t, kbt)


def backbone_kind(hk: HeadAwareKernel) -> str:
    """The ``backbone`` that built ``hk`` (diagonal: a basis of k > 1, K_Z 0 between them)."""
    if hk.basis is not None:
        k = np.shape(hk.basis)[1]
        kz = np.asarray(hk.backbone).reshape(-1, k, np.shape(hk.backbone)[1] // k, k)
        return "diagonal" if k > 1 and not np.any(kz * (1 - np.eye(k))[:, None]) else "subspace"
    if hk.mixing is None:
        return "exact"
    eye = np.eye(np.shape(hk.mixing)[0])
    return "isotropic" if np.array_equal(np.asarray(hk.mixing), eye) else "kronecker"


def check_kernel_backbone(backbone: str, head_kernel) -> None:
    """ValueError when ``backbone`` names another feature kernel than the ``head_kernel``
    given (a HeadAwareKernel, or an Adam kernel holding one, ``.hk``): the kernel decides. None
    (the default), another type (``check_head_kernel`` refuses), k = 1 subspace / diagonal pass."""
    hk = getattr(head_kernel, "hk", head_kernel)
    if backbone is None or not isinstance(hk, HeadAwareKernel):
        return
    kind = backbone_kind(hk)  # at k = 1 the subspace and diagonal kernels are one
    one = {kind, backbone} <= {"subspace", "diagonal"} and np.shape(hk.basis)[1] == 1
    if kind != backbone and not one:
        raise ValueError(f"backbone={backbone!r}, but the head_kernel given is of the "
                         f"{kind!r} form (built with backbone={kind!r}), which decides: drop "
                         f"backbone, or build head_kernel with backbone={backbone!r}.")


def _check_backbone_resolved(traced_kernel, kb, w0, mixing) -> None:
    """ValueError when k_b cannot be read off the logit-summed Θ.

    k_b = (Σ_c Θ − C(H Hᵀ + 1)) / tr(W_0ᵀ S W_0): with a zero head the backbone's share is
    zero and k_b is 0/0; with a tiny head the difference is below the float rounding of Σ_c Θ
    and k_b is rounding noise divided by a tiny trace (it then blows the prediction up). The
    share max|k_b|·tr / max|Σ_c Θ| must exceed 10·eps, i.e. k_b known to better than ~10 %.
    """
    tk, kbc = np.asarray(traced_kernel), np.asarray(kb)
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
    else:  # exact: K_h (N·F)², or K_Z (N·k)² seen through Zᵀ W_0
        wz = w if hk.basis is None else hk.basis.T @ w
        kh = hk.backbone.reshape(n, wz.shape[0], n, wz.shape[0])
        back = jnp.einsum("fc,ifjg,gd->icjd", wz, kh, wz).reshape(n * c, n * c)
    return head + back


def check_head_aware(hk: HeadAwareKernel, n: int, c: int) -> None:
    """ValueErrors for a :class:`HeadAwareKernel` whose shapes do not match N and C."""
    if np.ndim(hk.features) != 2 or np.shape(hk.features)[0] != n:
        raise ValueError(f"features must be (N, F) = ({n}, F), got {np.shape(hk.features)}.")
    f = np.shape(hk.features)[1]
    if np.shape(hk.head_kernel) != (f, c) or np.shape(hk.head_bias) != (c,):
        raise ValueError(
            f"head_kernel must be (F, C) = ({f}, {c}) and head_bias ({c},), got "
            f"{np.shape(hk.head_kernel)} and {np.shape(hk.head_bias)}.")
    k = f
    if hk.basis is not None:
        k = np.shape(hk.basis)[-1]
        if hk.mixing is not None or np.ndim(hk.basis) != 2 or not 1 <= k <= f \
                or np.shape(hk.basis)[0] != f:
            raise ValueError(f"basis must be (F, k) = ({f}, k) with 1 <= k <= F and mixing "
                             f"None, got {np.shape(hk.basis)} (mixing "
                             f"{'set' if hk.mixing is not None else 'None'}).")
    want = (n, n) if hk.mixing is not None else (n * k, n * k)
    if np.shape(hk.backbone) != want:
        raise ValueError(f"backbone kernel must be {want}, got {np.shape(hk.backbone)}.")
    if hk.mixing is not None and np.shape(hk.mixing) != (f, f):
        raise ValueError(f"mixing must be (F, F) = ({f}, {f}), got {np.shape(hk.mixing)}.")
    if (hk.features_test is None) != (hk.backbone_test is None):
        raise ValueError("features_test and backbone_test go together (or neither).")
    want = None if hk.features_test is None else (np.shape(hk.features_test)[0] * want[0] // n,
                                                  want[1])  # held-out rows × training rows
    if want is not None and np.shape(hk.backbone_test) != want:
        raise ValueError(f"backbone_test must be {want}, got {np.shape(hk.backbone_test)}.")


@dataclass(frozen=True)
class _WithHead:
    """``apply_fn((backbone_params, W, b), x) = feature_fn(backbone_params, x) @ W + b``,
    equal (and of equal hash) for the same ``feature_fn``: the compiled kernel programs, keyed
    on the function, are reused by every call with the same split (a closure made per call
    recompiled them each time)."""

    feature_fn: Any

    def __call__(self, p, xx):
        return self.feature_fn(p[0], xx) @ p[1] + p[2]
