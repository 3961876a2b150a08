"""Sample blocks of the exact empirical NTK: the argument checks shared by the kernels, the
blocks of inputs (the last one padded) and a block's Jacobians computed chunk by chunk into
host buffers, and the plan's block pairs (``ntk_tt.kernels._ntk``)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt.data._inputs import as_array
from ntk_tt.data._model import ApplyFn, check_concrete, check_model


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


def _padded(rows: np.ndarray, m: int) -> np.ndarray:
    """``rows`` with its last row repeated up to ``m`` rows (the compiled shape)."""
    if rows.shape[0] == m:
        return rows
    return np.concatenate([rows, np.repeat(rows[-1:], m - rows.shape[0], axis=0)])


def _block_jacobian(fn, params, xs: np.ndarray, chunk: int, cot, buf):
    """Jacobian of the rows ``xs`` (R, ...) for the cotangents ``cot``: ``(jac, buf)``.

    R ≤ ``chunk``: one call of ``fn`` on ``xs`` padded to ``chunk`` rows (the padded rows are
    returned too; callers slice Θ). Otherwise ``chunk`` rows per call, copied into ``buf``
    (host arrays of ≥ R rows, allocated on first use and returned for reuse: a new buffer
    would be page-faulted in again), and ``jac`` is its first R rows.
    """
    r = xs.shape[0]
    if r <= chunk:
        return fn(params, _padded(xs, chunk), cot), buf
    for s in range(0, r, chunk):
        part = fn(params, _padded(xs[s : s + chunk], chunk), cot)
        if buf is None or jax.tree.leaves(buf)[0].shape[0] < r:
            buf = jax.tree.map(lambda a: np.empty((r, *a.shape[1:]), a.dtype), part)
        m = min(chunk, r - s)
        for dst, src in zip(jax.tree.leaves(buf), jax.tree.leaves(part), strict=True):
            dst[s : s + m] = np.asarray(src)[:m]
    return jax.tree.map(lambda a: a[:r], buf), buf


def checked_inputs(name: str, apply_fn, params, x, x2, block_size):
    """``(x, x2, (N, C), N2)`` as arrays after the input checks of :func:`ntk_tt.empirical_ntk`
    (concrete inputs, ``block_size``, ``check_model`` on both, one C, one sample shape),
    before any work."""
    check_concrete(name, takes="predict_from_kernel", params=params, x=x, x2=x2)
    check_block_size(block_size)
    x = as_array(x, "x")
    x2 = None if x2 is None else as_array(x2, "x2")
    (n, c), n2 = pair_shapes(apply_fn, params, x, x2)
    return x, x2, (n, c), n2


def pair_shapes(apply_fn, params, x, x2) -> tuple[tuple[int, int], int]:
    """``((N, C), N2)`` of a kernel Θ(x, x2) after ``check_model`` on both: one C, and x2's
    samples of x's shape (a fresh user's 16×16 x2 beside 32×32 x gave a kernel without a word:
    a convolutional model takes any image size)."""
    n, c = check_model(apply_fn, params, x)
    if x2 is None:
        return (n, c), n
    n2, c2 = check_model(apply_fn, params, x2, name="x2")
    if np.shape(x2)[1:] != np.shape(x)[1:]:
        raise ValueError(f"x2's samples have shape {np.shape(x2)[1:]}, x's {np.shape(x)[1:]}: "
                         "Θ(x, x2) pairs samples of one input space; prepare both alike "
                         "(ntk_tt.prepare_images with the same input_shape).")
    if c2 != c:
        raise ValueError(f"apply_fn gives C={c} logits on x but C={c2} on x2; use one model.")
    return (n, c), n2


def block_pairs(plan, params, xr: np.ndarray, xc: np.ndarray, symmetric: bool):
    """The block pairs of :func:`ntk_tt.empirical_ntk`'s plan (``_ntk._Plan``), per logit group:
    ``(cot, real, (r0, ri), (c0, rj), ji, jj)`` with the group's cotangents ``cot`` (G, C),
    its ``real`` logits (the rest are zero padding), the row block's first index and size,
    the column block's, and their Jacobians (``jj is ji`` on the diagonal of a symmetric
    kernel; only blocks on and above it then). A caller drops its ``ji`` and ``jj`` before
    asking for the next pair, so that only one row and one column block are held."""
    n, n2, bs = xr.shape[0], xc.shape[0], plan.block_size
    row_buf = col_buf = None
    for cot in plan.groups:
        real = int(np.any(cot != 0, axis=1).sum())  # the group's logits; zero rows pad it
        for r0 in range(0, n, bs):
            ji = jj = None  # free the previous blocks first: the plan holds one row + one column
            ji, row_buf = _block_jacobian(plan.row_fn, params, xr[r0 : r0 + bs],
                                          plan.row_chunk, cot, row_buf)
            for c0 in range(r0 if symmetric else 0, n2, bs):
                jj = None
                if symmetric and c0 == r0:
                    jj = ji
                else:
                    jj, col_buf = _block_jacobian(plan.col_fn, params, xc[c0 : c0 + bs],
                                                  plan.col_chunk, cot, col_buf)
                yield cot, real, (r0, min(bs, n - r0)), (c0, min(bs, n2 - c0)), ji, jj
