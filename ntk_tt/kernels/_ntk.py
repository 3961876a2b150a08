"""Exact empirical NTK Θ = J Jᵀ, in sample blocks, and Θ·v without forming Θ.

Paper: Zancato et al. 2020, eq. (2) and Sec. 4 (METHOD.md §1, §5). Layout: row index
``i*C + c`` (sample-major); ``trace_logits=True`` gives Σ_c Θ[(i,c),(j,c)].
"""

from __future__ import annotations

import warnings
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse.linalg as sla

from ntk_tt.data._inputs import as_array
from ntk_tt.data._model import ApplyFn, check_model, num_params
from ntk_tt.kernels._memory import (
    NTKMemoryError,
    available_memory,
    format_bytes,
    kernel_memory_bytes,
)
from ntk_tt.kernels._structured import contract, contract_host, on_cpu, structured_jacobian


def check_trace_logits(trace_logits) -> bool:
    """``trace_logits`` as a Python bool; ``ValueError`` unless it is True or False (numpy
    bools included): a string such as ``"yes"`` (or ``"no"``) is refused, not read as True."""
    if not isinstance(trace_logits, (bool, np.bool_)):
        raise ValueError(
            f"trace_logits must be True (logit-summed (N, N2) kernel) or False (full "
            f"(N·C, N2·C) kernel), got {trace_logits!r}."
        )
    return bool(trace_logits)


def check_block_size(block_size: int | None) -> None:
    """Raise ``ValueError`` unless ``block_size`` is None or a positive integer."""
    if block_size is not None and (
        isinstance(block_size, bool)
        or not isinstance(block_size, (int, np.integer))
        or block_size < 1
    ):
        raise ValueError(
            f"block_size must be a positive integer (samples per Jacobian block) or None for "
            f"automatic, got {block_size!r}."
        )


def output_dtype(apply_fn: ApplyFn, params: Any, x: Any) -> np.dtype:
    """dtype of ``apply_fn(params, x)``, from shapes only."""
    spec = jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x))
    return np.dtype(jax.eval_shape(apply_fn, params, spec).dtype)


def sample_blocks(x: Any, block_size: int) -> list[tuple[int, jax.Array]]:
    """Split x into blocks of exactly ``block_size`` rows (last one padded by repeating its last
    row, so one compiled function serves every block); returns (number of real rows, block)."""
    x = jnp.asarray(x)
    out = []
    for start in range(0, x.shape[0], block_size):
        xb = x[start : start + block_size]
        real = xb.shape[0]
        if real < block_size:
            xb = jnp.concatenate([xb, jnp.repeat(xb[-1:], block_size - real, axis=0)])
        out.append((real, xb))
    return out


def _jacobian_fns(apply_fn, params, x, x2, block_size, symmetric):
    """Compiled ``structured_jacobian`` for the row (and column) block shape, and the bytes
    XLA reports for one call: ``(row_fn, col_fn, row_bytes, col_bytes)``, each bytes a
    ``(working, output)`` pair (working = temporaries + arguments, e.g. the activations that
    ``vmap(jacrev)`` keeps for the backward pass; output = the Jacobian block itself)."""

    def spec(inputs):
        rows = min(block_size, np.shape(inputs)[0])
        return jax.ShapeDtypeStruct((rows, *np.shape(inputs)[1:]), jnp.result_type(inputs))

    leaves, treedef = jax.tree.flatten(params)
    avals = (treedef, tuple((np.shape(v), jnp.result_type(v), getattr(v, "weak_type", False))
                            for v in leaves))
    row_fn, row_bytes = _compiled_block(apply_fn, avals, params, spec(x))
    if symmetric or spec(x2) == spec(x):
        return row_fn, row_fn, row_bytes, row_bytes
    col_fn, col_bytes = _compiled_block(apply_fn, avals, params, spec(x2))
    return row_fn, col_fn, row_bytes, col_bytes


_COMPILED: dict = {}
_COMPILED_MAX = 16


def _compiled_block(apply_fn, avals, params, block):
    """``structured_jacobian`` compiled ahead of time for one block shape, and XLA's
    ``(working, output)`` bytes for it. AOT executables are not in jit's cache, so the last
    ``_COMPILED_MAX`` are kept here, keyed on ``apply_fn``, the parameters' shapes and dtypes
    and the block's: an exact and a traced kernel of one model, or a kernel per call on the same
    inputs, compile once."""
    key = (apply_fn, avals, block)
    if key not in _COMPILED:
        fn = structured_jacobian.lower(apply_fn, params, block).compile()
        ma = fn.memory_analysis()
        while len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.pop(next(iter(_COMPILED)))
        _COMPILED[key] = fn, (ma.temp_size_in_bytes + ma.argument_size_in_bytes,
                              ma.output_size_in_bytes)
    return _COMPILED[key]


def _plan(apply_fn, params, x, x2, c, trace_logits, block_size, memory_limit):
    """Choose the block size from what the compiled Jacobian function really holds.

    Peak = Θ + the row block's Jacobian + (working memory and output of the column block being
    computed); the working memory (activations of the per-sample backward pass) comes from
    XLA's memory analysis of the compiled block function. An automatic block size is shrunk
    until the peak fits; a given one that does not fit raises. Returns
    ``(block_size, row_fn, col_fn)`` with the compiled block functions to use.
    """
    symmetric = x2 is None
    n, n2 = np.shape(x)[0], np.shape(x if symmetric else x2)[0]
    d, itemsize = num_params(params), output_dtype(apply_fn, params, x).itemsize
    avail = available_memory(memory_limit)
    kernel_only = kernel_memory_bytes(
        n, n2, c, d, itemsize=itemsize, trace_logits=trace_logits, jac_rows=0
    )
    per_row = itemsize * c * d  # the Jacobian rows alone: a lower bound, checked uncompiled
    def balanced(bs):
        """The smallest block size giving as many blocks as ``bs`` does over the larger
        input (less padding of the last block: e.g. 3 × 1334 instead of 2 × 1956 + 88
        padded to 1956)."""
        longest = max(n, n2)
        return int(-(-longest // -(-longest // max(1, int(bs)))))

    if block_size is None:
        fits_whole = kernel_only + per_row * (n if symmetric else n + n2) <= avail
        block_size = max(n, n2) if fits_whole else max(1, (avail - kernel_only) // (2 * per_row))
        block_size = balanced(min(block_size, max(n, n2)))
        auto = True
    else:
        auto = False

    def need(bs, row, col):
        single = symmetric and bs >= n
        lower = kernel_only + per_row * (bs if single else min(bs, n) + min(bs, n2))
        if row is None:
            return lower
        first = kernel_only + row[0] + row[1]
        return max(lower, first if single else max(first, kernel_only + row[1] + sum(col)))

    fns = (None, None, None, None)
    while True:
        if need(block_size, None, None) > avail:
            if not auto or block_size == 1:
                break
            # a shrink from one block to several holds two Jacobian blocks at once: go to the
            # largest block whose Jacobians alone fit, then check it compiled
            block_size = balanced(max(1, min(block_size - 1,
                                             (avail - kernel_only) // (2 * per_row))))
            continue
        fns = _jacobian_fns(apply_fn, params, x, x2, block_size, symmetric)
        total = need(block_size, fns[2], fns[3])
        if total <= avail or not auto or block_size == 1:
            break
        # Θ and the parameters (an argument of the block function) do not scale with the block
        fixed = kernel_only + sum(leaf.nbytes for leaf in jax.tree.leaves(params))
        per_sample = (total - fixed) / block_size
        block_size = balanced(max(1, min(block_size - 1, (avail - fixed) // per_sample)))
    total = need(block_size, fns[2], fns[3])
    if total > avail:
        shape = f"({n}, {n2})" if trace_logits else f"({n * c}, {n2 * c})"
        raise NTKMemoryError(
            f"the empirical NTK {shape} with block_size={block_size} needs about "
            f"{format_bytes(total)} (Θ: {format_bytes(kernel_only)}, Jacobian blocks of "
            f"C={c} × D={d} per sample and the activations kept to compute them: "
            f"{format_bytes(total - kernel_only)}) but only {format_bytes(avail)} is "
            "available. Use a smaller block_size, trace_logits=True (N×N kernel, C² times "
            "smaller), sketched_ntk(..., sketch_dim=...) (N·C × D' features), or "
            "ntk_vector_product for Θ·v without forming Θ."
        )
    if auto and block_size == 1 and max(n, n2) > 1:
        pairs = n * (n + 1) // 2 if symmetric else n * n2
        warnings.warn(
            f"empirical_ntk: only {format_bytes(avail)} available, so Jacobians are computed "
            f"one sample at a time and recomputed for each of the {pairs} block pairs (slow); "
            "raise memory_limit / $NTK_TT_MEMORY_LIMIT, or use trace_logits=True or "
            "sketched_ntk.",
            stacklevel=3,
        )
    return block_size, fns[0], fns[1]


def empirical_ntk(
    apply_fn: ApplyFn,
    params: Any,
    x: Any,
    x2: Any = None,
    *,
    trace_logits: bool = False,
    block_size: int | None = None,
    memory_limit: int | None = None,
) -> jax.Array:
    """Exact empirical NTK Θ(x, x2) = J(x) J(x2)ᵀ at ``params`` (paper eq. (2), Sec. 4).

    Per-sample Jacobians are computed for blocks of ``block_size`` inputs (one compiled function
    reused for every block) and contracted parameter leaf by parameter leaf: dense weights
    ``h @ W`` in structured form ``(h_i·h_j)(δ_ic·δ_jc')``, convolution kernels and weights
    shared over positions from the layer input's patches and δ = ∂f/∂y (Novak et al. 2022, Sec.
    4; ``ntk_tt.kernels._structured``), every other leaf by ``vmap(jacrev)``. Peak memory is Θ
    plus two Jacobian blocks (~``2·block_size·C·D`` numbers) plus the activations one block's
    per-sample backward passes keep (XLA's memory analysis of the compiled block function; for
    convolutions on large images these dominate), never N·C·D. With several blocks, Jacobian
    blocks are recomputed for each block pair (time grows with the number of blocks);
    ``block_size=None`` uses the fewest blocks whose peak fits in the available memory (one
    block when possible), of equal size (the last one padded as little as possible), and warns
    when that is a single sample (≈ N²/2 Jacobian recomputations).

    Call it outside ``jax.jit`` (it checks inputs on concrete values and compiles its own
    block function); the kernel it returns then goes into jitted, vmapped
    :func:`ntk_tt.predict_from_kernel` calls.

    Args:
      apply_fn: ``apply_fn(params, x) -> logits`` of shape (N, C).
      params: parameter pytree (trainable leaves only), D numbers in total.
      x: inputs, shape (N, ...).
      x2: optional second inputs, shape (N2, ...); None means ``x`` (symmetric kernel).
      trace_logits: return the logit-summed kernel Σ_c Θ[(i,c),(j,c)] of shape (N, N2).
      block_size: samples per Jacobian block (positive int) or None for automatic.
      memory_limit: bytes available, overriding ``$NTK_TT_MEMORY_LIMIT`` and /proc/meminfo.

    Returns:
      Θ of shape (N·C, N2·C) with entry ``[i*C + c, j*C + c']`` = ∂f_c(x_i)/∂w · ∂f_c'(x2_j)/∂w
      (sample-major), or (N, N2) when ``trace_logits``; dtype of the logits.

    Raises:
      ValueError: bad ``x``/``x2``/params/``apply_fn`` output (see ``check_model``),
        ``block_size`` ≤ 0, ``trace_logits`` not True / False (e.g. the string "yes"), or
        ``x2`` giving a different number of logits.
      NTKMemoryError: (a ``MemoryError`` and ``ValueError``) when Θ, the Jacobian blocks and
        the activations of one block (at ``block_size``, or at 1 when automatic) exceed the
        available memory; raised after compiling the block function, before any Jacobian is
        computed.

    Warns:
      UserWarning: the automatic block size is 1 because of the memory limit.
    """
    check_block_size(block_size)
    trace_logits = check_trace_logits(trace_logits)
    x = as_array(x, "x")
    x2 = None if x2 is None else as_array(x2, "x2")
    n, c = check_model(apply_fn, params, x)
    symmetric = x2 is None
    n2, c2 = (n, c) if symmetric else check_model(apply_fn, params, x2, name="x2")
    if c2 != c:
        raise ValueError(f"apply_fn gives C={c} logits on x but C={c2} on x2; use one model.")
    bs, row_fn, col_fn = _plan(apply_fn, params, x, x2, c, trace_logits, block_size,
                               memory_limit)
    rows = sample_blocks(x, min(bs, n))
    cols = rows if symmetric else sample_blocks(x2, min(bs, n2))
    k = 1 if trace_logits else c
    out = np.empty((n * k, n2 * k), dtype=output_dtype(apply_fn, params, x))
    ji = jj = None
    for i, (ri, xi) in enumerate(rows):
        ji = jj = None  # free the previous blocks first: the plan holds one row + one column
        ji = row_fn(params, xi)
        r0 = i * rows[0][1].shape[0] * k
        for j in range(i if symmetric else 0, len(cols)):
            rj, xj = cols[j]
            jj = None
            jj = ji if (symmetric and i == j) else col_fn(params, xj)
            same = jj is ji
            blk = (contract_host(ji, jj, trace_logits, symmetric=same) if on_cpu(ji)
                   else np.asarray(contract(ji, jj, trace_logits, symmetric=same))
                   )[: ri * k, : rj * k]
            c0 = j * cols[0][1].shape[0] * k
            out[r0 : r0 + ri * k, c0 : c0 + rj * k] = blk
            if symmetric and j != i:
                out[c0 : c0 + rj * k, r0 : r0 + ri * k] = blk.T
    return jnp.asarray(out)


def _check_v(v: jax.Array, nc: int) -> None:
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

    Args:
      apply_fn: ``apply_fn(params, x) -> logits`` of shape (N, C).
      params: parameter pytree.
      x: inputs, shape (N, ...).

    Returns:
      ``mv(v)`` taking v of shape (N·C,) or (N·C, k) (sample-major, index ``i*C + c``) and
      returning Θ v of the same shape.

    Raises:
      ValueError: bad ``x``/params/``apply_fn`` output; (from ``mv``) v of the wrong shape.
    """
    n, c = check_model(apply_fn, params, x)
    x = jnp.asarray(x)

    def mv(v):
        v = jnp.asarray(v)
        _check_v(v, n * c)
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

    Args:
      apply_fn: ``apply_fn(params, x) -> logits`` of shape (N, C).
      params: parameter pytree.
      x: inputs, shape (N, ...).
      k: number of eigenvalues, 1 ≤ k < N·C.
      key: ``jax.random`` key for the start vector.

    Returns:
      The k largest eigenvalues of the (N·C, N·C) kernel, descending.

    Raises:
      ValueError: bad model/input, or k outside [1, N·C).
    """
    n, c = check_model(apply_fn, params, x)
    if not isinstance(k, (int, np.integer)) or not 1 <= k < n * c:
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
