"""Sample blocks of the exact empirical NTK: the argument checks shared by the kernels, the
blocks of inputs (the last one padded) and a block's Jacobians computed chunk by chunk into
host buffers (``ntk_tt.kernels._ntk``)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt.data._model import ApplyFn


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
