"""Exact empirical NTK Θ = J Jᵀ in sample blocks, planned from the compiled Jacobian's memory.

Θ·v without forming Θ: ``ntk_tt.kernels._matvec``; the blocks and their host buffers:
``ntk_tt.kernels._blocks``.

Paper: Zancato et al. 2020, eq. (2) and Sec. 4 (METHOD.md §1, §5). Layout: row index
``i*C + c`` (sample-major); ``trace_logits=True`` gives Σ_c Θ[(i,c),(j,c)].
"""

from __future__ import annotations

import warnings
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt.data._model import ApplyFn, num_params
from ntk_tt.kernels import _structured
from ntk_tt.kernels._blocks import (
    block_pairs,
    check_trace_logits,
    checked_inputs,
    output_dtype,
)
from ntk_tt.kernels._memory import (
    NTKMemoryError,
    available_memory,
    format_bytes,
    kernel_memory_bytes,
)
from ntk_tt.kernels._structured import contract, contract_host, on_cpu, structured_jacobian

CPU_CHUNK = 16
"""Samples per compiled Jacobian call on a CPU. A block's per-sample Jacobians are computed
at most ``CPU_CHUNK`` samples at a time into host buffers, so XLA's working memory (the
activations and per-logit cotangents that ``vmap`` keeps) is that of one chunk, not of the
whole block. Small chunks also run faster on a CPU (their working memory stays in cache): on
the 2-core CPU measured, the logit-summed Θ of the shipped SmallResNet at N = 750 took 4.0 /
4.4 / 5.9 s with chunks of 8 / 16 / 64 samples, of the benchmark CNN 0.53 s with 16 against
1.04 s with 64. On accelerators a block is one call."""

GROUP_BYTES = 3 * 2**29
"""Logit-summed Θ: the per-sample Jacobians of all N samples are held for a group of logits at
a time, as many logits as fit in ``GROUP_BYTES`` (1.5 GiB), or in half the memory left
beside Θ when that is less (at least one logit), and
Θ = Σ_groups J_g J_gᵀ. Each further group costs one more forward pass per sample (a group
padded with a zero cotangent also one more reverse pass; its products are skipped). Measured
on the shipped SmallResNet at N = 750, C = 5 (one logit's Jacobians: 0.34 GiB), steady
seconds / peak RSS: all 5 logits at once 3.3 s / 2.1 GiB, groups of 3 (this budget)
3.7–4.1 s / 1.4 GiB, of 2 4.1–4.4 s / 1.2 GiB."""


class _Plan(NamedTuple):
    """How ``empirical_ntk`` computes Θ: sample blocks of ``block_size`` rows and columns,
    Jacobians ``chunk`` samples per compiled call (``row_fn`` / ``col_fn``, compiled for
    ``row_chunk`` / ``col_chunk`` samples), and the logit ``groups`` (cotangent matrices
    (G, C), all of one shape; the last may have zero rows)."""

    block_size: int
    chunk: int
    row_chunk: int
    col_chunk: int
    groups: list
    row_fn: Any
    col_fn: Any


def _platform(params) -> str:
    """Platform of the device holding the first ``jax.Array`` leaf of ``params`` (where the
    Jacobians will be computed), else JAX's default backend."""
    for leaf in jax.tree.leaves(params):
        if isinstance(leaf, jax.Array):
            return next(iter(leaf.devices())).platform
    return jax.default_backend()


def logit_groups(c: int, group: int, dtype) -> list[np.ndarray]:
    """The C logits as ``ceil(C / group)`` groups of equal size: rows of the identity (C
    columns), the last group padded with zero rows so that one compiled function serves all."""
    count = -(-c // group)
    size = -(-c // count)
    eye = np.eye(count * size, c, dtype=dtype)  # rows past C are zero
    return [eye[k * size : (k + 1) * size] for k in range(count)]


def _jacobian_fns(apply_fn, params, x, x2, rows, cols, cot, symmetric):
    """Compiled ``structured_jacobian`` for ``rows`` samples of x and ``cols`` of x2 with the
    cotangents ``cot`` (G, C), and the bytes XLA reports for one call:
    ``(row_fn, col_fn, row_bytes, col_bytes)``, each bytes a ``(working, output)`` pair
    (working = temporaries + arguments, e.g. the activations that ``vmap`` keeps for the
    backward pass; output = the Jacobian of those samples)."""

    def spec(inputs, m):
        return jax.ShapeDtypeStruct((m, *np.shape(inputs)[1:]), jnp.result_type(inputs))

    avals = _avals(params)
    cot_spec = jax.ShapeDtypeStruct(cot.shape, cot.dtype)
    row_fn, row_bytes = _compiled_block(apply_fn, avals, params, spec(x, rows), cot_spec)
    if symmetric or spec(x2, cols) == spec(x, rows):
        return row_fn, row_fn, row_bytes, row_bytes
    col_fn, col_bytes = _compiled_block(apply_fn, avals, params, spec(x2, cols), cot_spec)
    return row_fn, col_fn, row_bytes, col_bytes


_COMPILED: dict = {}
_COMPILED_MAX = 16


def _compiled_block(apply_fn, avals, params, block, cot):
    """``structured_jacobian`` compiled ahead of time for one input and cotangent shape, and
    XLA's ``(working, output)`` bytes for it. AOT executables are not in jit's cache, so the
    last ``_COMPILED_MAX`` are kept here, keyed on ``apply_fn``, the parameters' shapes and
    dtypes and the shapes: an exact and a traced kernel of one model, or a kernel per call on
    the same inputs, compile once. A ``jax.tree_util.Partial(func, *arrays)`` is keyed on
    ``func`` and the arrays' shapes, its arrays passed as arguments: a model with other values
    bound (e.g. a preconditioned reparametrisation) reuses the program."""
    bound = isinstance(apply_fn, jax.tree_util.Partial) and not apply_fn.keywords
    func, args = (apply_fn.func, apply_fn.args) if bound else (apply_fn, ())
    key = (func, _avals(args), avals, block, cot)
    if key not in _COMPILED:
        fn = (_bound_jacobian.lower(func, args, params, block, cot) if bound
              else structured_jacobian.lower(apply_fn, params, block, cot)).compile()
        ma = fn.memory_analysis()
        while len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.pop(next(iter(_COMPILED)))
        _COMPILED[key] = fn, (ma.temp_size_in_bytes + ma.argument_size_in_bytes,
                              ma.output_size_in_bytes)
    fn, nbytes = _COMPILED[key]
    return (partial(fn, args) if bound else fn), nbytes


def _avals(tree) -> tuple:
    """Hashable structure, shapes and dtypes of a pytree of arrays (a compilation key)."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((np.shape(v), jnp.result_type(v), getattr(v, "weak_type", False))
                          for v in leaves)


@partial(jax.jit, static_argnums=0)
def _bound_jacobian(func, args, params, xb, cot):
    """``structured_jacobian`` of ``jax.tree_util.Partial(func, *args)`` with ``args`` traced:
    one program for every value of the bound arrays (``func`` hashable)."""
    return structured_jacobian(jax.tree_util.Partial(func, *args), params, xb, cot)


def _jacobian_bytes(apply_fn, params, x, c, dtype) -> tuple[int, int]:
    """Bytes of one sample's Jacobian: ``(per logit, per sample)``; structured dense leaves
    hold their input once per sample and δ per logit (from shapes only: nothing compiled)."""
    one = jax.ShapeDtypeStruct((1, *np.shape(x)[1:]), jnp.result_type(x))
    jac = jax.eval_shape(partial(_structured.structured_jacobian, apply_fn), params, one,
                         jax.ShapeDtypeStruct((1, c), dtype))  # abstract: no Jacobian
    per_logit = sum(a.size * a.dtype.itemsize for a in (*jac.generic.values(),
                                                         *jac.cotangents.values()))
    return per_logit, sum(a.size * a.dtype.itemsize for a in jac.acts.values())


def _plan(apply_fn, params, x, x2, c, trace_logits, block_size, memory_limit) -> _Plan:
    """Choose logit groups, block size and chunk from what the compiled Jacobian function
    really holds.

    Peak = Θ + the row and column blocks' Jacobians + the working memory and output of the
    chunk being computed (XLA's memory analysis of the compiled chunk function: the
    activations of the per-sample backward passes). When a block is one call (accelerators,
    or a block no larger than a chunk), its output is the block's Jacobian. An automatic block
    size is shrunk until the peak fits; a given one that does not fit raises.
    """
    symmetric = x2 is None
    n, n2 = np.shape(x)[0], np.shape(x if symmetric else x2)[0]
    d, dtype = num_params(params), output_dtype(apply_fn, params, x)
    itemsize = dtype.itemsize
    avail = available_memory(memory_limit)
    kernel_only = kernel_memory_bytes(
        n, n2, c, d, itemsize=itemsize, trace_logits=trace_logits, jac_rows=0
    )
    group = c
    samples = n if symmetric else n + n2
    # fewer logits per group before fewer samples per block: a group costs one more forward
    # pass, a block split recomputes Jacobians for every block pair
    budget = min(GROUP_BYTES, (avail - kernel_only) // 2)
    if trace_logits and itemsize * d * c * samples > budget:  # else all C fit anyway
        per_logit, per_sample = _jacobian_bytes(apply_fn, params, x, c, dtype)
        group = int(max(1, min(c, (budget / samples - per_sample) // per_logit)))
    groups = logit_groups(c, group, dtype)
    per_row = itemsize * groups[0].shape[0] * d  # Jacobian rows alone: a lower bound
    cap = CPU_CHUNK if _platform(params) == "cpu" else None

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

    def chunk_of(bs):
        """Samples per call: the block (accelerators), else the block in equal chunks of at
        most ``CPU_CHUNK`` (150 → 3 × 50: no padded samples)."""
        return bs if cap is None else -(-bs // -(-bs // cap))

    def held(bs):
        """Samples whose Jacobians are held at once: the row block, and the column block
        unless Θ is one symmetric block."""
        single = symmetric and bs >= n
        return min(bs, n) + (0 if single else min(bs, n2)), single

    def need(bs, fns):
        rows, single = held(bs)
        lower = kernel_only + per_row * rows
        if fns is None:
            return lower
        ch, (_, _, row, col) = chunk_of(bs), fns
        if ch >= bs:  # one call per block: its output is the block's Jacobian
            first = kernel_only + row[0] + row[1]
            return max(lower, first if single else max(first, kernel_only + row[1] + sum(col)))
        per_sample = row[1] / min(ch, n)  # host buffers filled chunk by chunk
        return max(lower, kernel_only + per_sample * rows + max(sum(row), sum(col)))

    def compiled(bs):
        ch = chunk_of(bs)
        return _jacobian_fns(apply_fn, params, x, x2, min(ch, n), min(ch, n2), groups[0],
                             symmetric)

    fns = None
    while True:
        if need(block_size, None) > avail:
            if not auto or block_size == 1:
                break
            # a shrink from one block to several holds two Jacobian blocks at once: go to the
            # largest block whose Jacobians alone fit, then check it compiled
            block_size = balanced(max(1, min(block_size - 1,
                                             (avail - kernel_only) // (2 * per_row))))
            continue
        fns = compiled(block_size)
        total = need(block_size, fns)
        if total <= avail or not auto or block_size == 1:
            break
        ch, (_, _, row, col) = chunk_of(block_size), fns
        if ch < block_size:  # the chunk's working memory is fixed; the held blocks scale
            per_sample = row[1] / min(ch, n)
            room = avail - kernel_only - max(sum(row), sum(col))
            smaller = room // (2 * per_sample)
        else:  # Θ and the parameters (an argument of the block function) do not scale
            fixed = kernel_only + sum(leaf.nbytes for leaf in jax.tree.leaves(params))
            smaller = (avail - fixed) // ((total - fixed) / block_size)
        block_size = balanced(max(1, min(block_size - 1, smaller)))
        fns = None
    total = need(block_size, fns)
    if total > avail:
        shape = f"({n}, {n2})" if trace_logits else f"({n * c}, {n2 * c})"
        raise NTKMemoryError(
            f"the empirical NTK {shape} with block_size={block_size} needs about "
            f"{format_bytes(total)} (Θ: {format_bytes(kernel_only)}, Jacobian blocks of "
            f"C={groups[0].shape[0]} × D={d} per sample and the activations kept to compute "
            f"them: {format_bytes(total - kernel_only)}) but only {format_bytes(avail)} is "
            "available. Use "
            + ("a smaller block_size, " if block_size > 1 else "")
            + ("" if trace_logits else "trace_logits=True (N×N kernel, C² times smaller), ")
            + "sketched_ntk(..., sketch_dim=...) (N·C × D' features), ntk_vector_product for "
            "Θ·v without forming Θ, or a larger memory_limit / $NTK_TT_MEMORY_LIMIT if more "
            "memory is free."
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
    ch = chunk_of(block_size)
    return _Plan(block_size, ch, min(ch, n), min(ch, n2), groups, fns[0], fns[1])


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

    Per-sample Jacobians are computed for blocks of ``block_size`` inputs and contracted
    parameter leaf by parameter leaf: dense weights ``h @ W`` in structured form
    ``(h_i·h_j)(δ_ic·δ_jc')``, convolution kernels and weights shared over positions from the
    layer input's patches and δ = ∂f/∂y (Novak et al. 2022, Sec. 4;
    ``ntk_tt.kernels._structured``), every other leaf by ``vmap`` of reverse passes; patch
    extractions (``lax.conv_general_dilated_patches``) are taken as strided slices, whose
    reverse pass is cheap (``ntk_tt.kernels._patches``). On a CPU a block's Jacobians are
    computed ``CPU_CHUNK`` (16) samples per compiled call into host buffers, so XLA's working
    memory is that of one chunk; on accelerators a block is one call. The logit-summed kernel
    (``trace_logits``) is summed over groups of logits, as many as keep the held Jacobians
    under ``GROUP_BYTES`` (1.5 GiB; at least one logit per group), each group one more
    forward pass per sample. Peak memory is Θ plus two Jacobian blocks (~``2·block_size·G·D``
    numbers for a group of G logits) plus one chunk's activations (XLA's memory analysis of
    the compiled chunk function; for convolutions on large images these dominate), never
    N·C·D when the groups are smaller. With several blocks, Jacobian blocks are recomputed
    for each block pair (time grows with the number of blocks); ``block_size=None`` uses the
    fewest blocks whose peak fits in the available memory (one block when possible), of
    equal size (the last one padded as little as possible), and warns when that is a single
    sample (≈ N²/2 Jacobian recomputations).

    Call it outside ``jax.jit``, ``vmap`` and ``grad`` (it checks inputs on concrete values,
    plans memory and compiles its own Jacobian function; traced arguments are refused); the
    kernel it returns then goes into jitted, vmapped :func:`ntk_tt.predict_from_kernel` calls.

    Source: Zancato et al. 2020 (arXiv 2008.12478), eq. (2), Sec. 4; METHOD.md §5. The
    structured contractions follow Novak et al. 2022, Sec. 4.

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
        ``block_size`` ≤ 0, ``trace_logits`` not True / False (e.g. the string "yes"),
        ``x2`` giving a different number of logits or with samples of another shape than
        ``x``'s, or a traced ``params`` / ``x`` / ``x2``
        (called under ``jax.jit``, ``vmap`` or ``grad``), before any work.
      NTKMemoryError: (a ``MemoryError`` and ``ValueError``) when Θ, the Jacobian blocks and
        the activations of one chunk (at ``block_size``, or at 1 when automatic) exceed the
        available memory; raised after compiling the Jacobian function, before any Jacobian
        is computed.

    Warns:
      UserWarning: the automatic block size is 1 because of the memory limit.
    """
    trace_logits = check_trace_logits(trace_logits)
    x, x2, (n, c), n2 = checked_inputs("empirical_ntk", apply_fn, params, x, x2, block_size)
    symmetric = x2 is None
    plan = _plan(apply_fn, params, x, x2, c, trace_logits, block_size, memory_limit)
    xr = np.asarray(x)
    xc = xr if symmetric else np.asarray(x2)
    k = 1 if trace_logits else c
    out = np.zeros((n * k, n2 * k), dtype=output_dtype(apply_fn, params, x))
    for _, real, (r0, ri), (c0, rj), ji, jj in block_pairs(plan, params, xr, xc, symmetric):
        same = jj is ji
        blk = (contract_host(ji, jj, trace_logits, symmetric=same, logits=real) if on_cpu(ji)
               else np.asarray(contract(ji, jj, trace_logits, symmetric=same)))[: ri * k, : rj * k]
        del ji, jj  # the next block is computed with only the generator's copy to free
        out[r0 * k : (r0 + ri) * k, c0 * k : (c0 + rj) * k] += blk
        if symmetric and c0 != r0:
            out[c0 * k : (c0 + rj) * k, r0 * k : (r0 + ri) * k] += blk.T
    return jnp.asarray(out)
