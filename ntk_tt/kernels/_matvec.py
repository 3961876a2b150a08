"""Θ·v of the empirical NTK without forming Θ (or J), and its top eigenvalues by Lanczos.

Paper: Zancato et al. 2020, Prop. 2 and Sec. 4 (METHOD.md §4, §5). Layout: index ``i*C + c``
(sample-major), as :func:`ntk_tt.empirical_ntk`.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse.linalg as sla

from ntk_tt.data._inputs import check_key
from ntk_tt.data._model import ApplyFn, check_model
from ntk_tt.kernels._blocks import output_dtype


def _check_v(v: jax.Array, nc: int, given) -> None:
    """``given``: the dtype ``v`` was passed with (before ``jnp.asarray``, which makes a
    complex128 complex64 without x64)."""
    if not (jnp.issubdtype(given, jnp.floating) or jnp.issubdtype(given, jnp.integer)):
        fix = ("apply mv to v.real and v.imag apart (Θ is real)"
               if jnp.issubdtype(given, jnp.complexfloating) else "pass v.astype(float)")
        raise ValueError(  # a complex v lost its imaginary part in the cast to the logits' dtype
            f"v must be a real array (float or integer), got dtype {given}; {fix}.")
    if v.ndim not in (1, 2) or v.shape[0] != nc:
        raise ValueError(
            f"v must have shape (N·C,) = ({nc},) or (N·C, k), got {v.shape}; flatten the "
            "(N, C) residual sample-major with v.reshape(-1)."
        )


@partial(jax.jit, static_argnums=0)
def _ntk_mv(apply_fn: ApplyFn, params: Any, x: jax.Array, v: jax.Array) -> jax.Array:
    def f(p):
        return apply_fn(p, x)

    out, vjp = jax.vjp(f, params)

    def one(vi):
        (g,) = vjp(vi.reshape(out.shape).astype(out.dtype))
        return jax.jvp(f, (params,), (g,))[1].reshape(-1)

    return one(v) if v.ndim == 1 else jax.vmap(one, in_axes=1, out_axes=1)(v)


def ntk_vector_product(apply_fn: ApplyFn, params: Any, x: Any):
    """Return ``v ↦ Θ·v`` for the empirical NTK on ``x``, never forming Θ (or J).

    Θ v = J (Jᵀ v): one reverse-mode ``vjp`` then one forward-mode ``jvp`` per column, compiled
    once per ``apply_fn`` and shape. For Lanczos (``ntk_top_eigenvalues``) and for N too large
    for the (N·C)² kernel (METHOD.md §5).

    Source: ntk_tt's own matrix-free route (METHOD.md §5: Θ never formed) to the Θ = J Jᵀ of
    Zancato et al. 2020 (arXiv 2008.12478), eq. (2).

    Args:
      apply_fn: ``apply_fn(params, x) -> logits`` of shape (N, C).
      params: parameter pytree.
      x: inputs, shape (N, ...).

    Returns:
      ``mv(v)`` taking v of shape (N·C,) or (N·C, k) (sample-major, index ``i*C + c``) and
      returning Θ v of the same shape.

    Raises:
      ValueError: bad ``x``/params/``apply_fn`` output, or called under ``jax.jit`` / ``vmap``
        / ``grad`` (build ``mv`` outside, then transform it); (from ``mv``) v of the wrong
        shape, or not real (complex, bool).
    """
    n, c = check_model(apply_fn, params, x)
    x = jnp.asarray(x)

    def mv(v):
        given = v.dtype if hasattr(v, "dtype") else np.asarray(v).dtype
        v = jnp.asarray(v)
        _check_v(v, n * c, given)
        return _ntk_mv(apply_fn, params, x, v)

    return mv


def ntk_top_eigenvalues(
    apply_fn: ApplyFn, params: Any, x: Any, k: int, *, key: jax.Array
) -> jax.Array:
    """Top-k eigenvalues of the empirical NTK Θ on ``x`` by Lanczos on Θ·v (Θ never formed).

    Uses ``scipy.sparse.linalg.eigsh`` on a ``LinearOperator`` wrapping
    :func:`ntk_vector_product`; the Lanczos start vector is drawn from ``key``. Cost: a few
    times k Θ·v products, each about three forward passes over the N inputs. Paper Prop. 2 /
    METHOD.md §4: these set the fastest decay rates of the loss.

    Source: ntk_tt's own (Lanczos on :func:`ntk_vector_product`); the eigenvalues' role is
    Prop. 2 of Zancato et al. 2020 (arXiv 2008.12478); METHOD.md §4.

    Args:
      apply_fn: ``apply_fn(params, x) -> logits`` of shape (N, C).
      params: parameter pytree.
      x: inputs, shape (N, ...).
      k: number of eigenvalues, 1 ≤ k < N·C.
      key: ``jax.random`` key for the start vector.

    Returns:
      The k largest eigenvalues of the (N·C, N·C) kernel, descending.

    Raises:
      ValueError: ``key`` not a jax random key, bad model/input, or k outside [1, N·C).
    """
    if key is None:
        raise ValueError("key must be a jax random key (the Lanczos start vector); pass "
                         "key=jax.random.key(seed).")
    check_key(key)
    n, c = check_model(apply_fn, params, x)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k < n * c:
        raise ValueError(
            f"k must be an integer with 1 <= k < N·C = {n * c}, got {k!r}; for all eigenvalues "
            "use jnp.linalg.eigvalsh(empirical_ntk(...))."
        )
    mv = ntk_vector_product(apply_fn, params, x)
    dtype = output_dtype(apply_fn, params, x)
    op = sla.LinearOperator(
        (n * c, n * c), matvec=lambda v: np.asarray(mv(jnp.asarray(v, dtype))), dtype=dtype
    )
    v0 = np.asarray(jax.random.normal(key, (n * c,), dtype))
    ncv = min(n * c, max(2 * k + 1, 20))
    vals = sla.eigsh(op, k=k, which="LA", v0=v0, ncv=ncv, return_eigenvectors=False)
    return jnp.asarray(np.sort(vals)[::-1].copy())
