"""Empirical NTK with its sample axis sharded over devices (``jax.sharding``, ``jax.shard_map``).

Paper eq. (2), Sec. 4 (METHOD.md §5): Θ = J Jᵀ. The N inputs are padded to a multiple of the
d devices of a 1-D ``Mesh`` and split along it; each device computes the structured Jacobian of
its own N/d samples (``_structured.structured_jacobian``) and contracts it
(``_structured.contract``) against every column block, which travel round the ring of devices
by ``ppermute`` (d − 1 hops), so a device holds two Jacobian blocks and its N/d rows of Θ, never
the whole J or Θ.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ntk_tt.data._model import ApplyFn, check_concrete
from ntk_tt.kernels._blocks import check_trace_logits, pair_shapes
from ntk_tt.kernels._structured import contract, structured_jacobian


def _check_mesh(mesh) -> Mesh:
    if mesh is None:
        return Mesh(np.asarray(jax.devices()), ("samples",))
    if not isinstance(mesh, Mesh) or len(mesh.axis_names) != 1:
        raise ValueError(
            f"mesh must be a 1-D jax.sharding.Mesh over the sample axis (e.g. "
            f"Mesh(jax.devices(), ('samples',))) or None for all devices, got {mesh!r}."
        )
    return mesh


def _padded(x, devices: int, sharding: NamedSharding) -> jax.Array:
    """x with its last row repeated up to a multiple of ``devices`` rows, laid out by
    ``sharding`` (each process supplies the full x; works on one or several hosts)."""
    x = np.asarray(x)
    pad = -x.shape[0] % devices
    if pad:
        x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)])
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


@partial(jax.jit, static_argnums=0, static_argnames=("trace_logits", "symmetric", "mesh", "k"))
def _ring(apply_fn, params, x, x2, *, trace_logits, symmetric, mesh, k):
    axis = mesh.axis_names[0]
    d = mesh.shape[axis]
    hop = [(i, (i - 1) % d) for i in range(d)]  # after s hops device i holds block (i + s) % d

    def local(params, xl, x2l):
        ja = structured_jacobian(apply_fn, params, xl)
        jb = ja if symmetric else structured_jacobian(apply_fn, params, x2l)
        me = jax.lax.axis_index(axis)
        cols = x2l.shape[0] * k
        first = contract(ja, jb, trace_logits)
        out = jnp.zeros((first.shape[0], d * cols), first.dtype)
        out = jax.lax.dynamic_update_slice(out, first, (0, me * cols))

        def body(s, carry):
            out, jb = carry
            jb = jax.lax.ppermute(jb, axis, hop)
            blk = contract(ja, jb, trace_logits)
            return jax.lax.dynamic_update_slice(out, blk, (0, ((me + s) % d) * cols)), jb

        return jax.lax.fori_loop(1, d, body, (out, jb))[0]

    # check_vma=False: structured_jacobian re-binds jaxpr primitives itself, which the
    # varying-manual-axes type check cannot follow (every value here is per-device anyway)
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(axis), P(axis)),
                         out_specs=P(axis, None), check_vma=False)(params, x, x2)


def sharded_empirical_ntk(
    apply_fn: ApplyFn, params: Any, x: Any, x2: Any = None, *, trace_logits: bool = False,
    mesh: Mesh | None = None,
) -> jax.Array:
    """Exact empirical NTK Θ(x, x2) = J(x) J(x2)ᵀ with the samples sharded over devices.

    Same value and layout as :func:`ntk_tt.empirical_ntk` (paper eq. (2)); the rows of x (and of
    x2) are padded to a multiple of the number of devices d by repeating the last one and split
    over ``mesh``; device i computes Θ rows of its N/d samples against every column block
    (passed round the devices by ``ppermute``), so per device memory is two Jacobian blocks
    (2·⌈N/d⌉·C·D numbers) plus N/d rows of Θ. Several hosts: call
    ``jax.distributed.initialize()`` first on every process, pass the same full ``x`` on each,
    and the default mesh spans ``jax.devices()`` (all hosts); the result is then a global array
    (gather it with ``jax.experimental.multihost_utils.process_allgather``).

    Source: Zancato et al. 2020 (arXiv 2008.12478), eq. (2); METHOD.md §5. The sharding is
    ntk_tt's own (README "Larger N from a subset (App. D) and sharded kernels").

    Args:
      apply_fn: ``apply_fn(params, x) -> logits`` of shape (N, C).
      params: parameter pytree (replicated on every device).
      x: inputs (N, ...). x2: optional second inputs (N2, ...); None means x (symmetric).
      trace_logits: return the logit-summed (N, N2) kernel instead of (N·C, N2·C).
      mesh: a 1-D ``jax.sharding.Mesh`` over the sample axis; None = all devices.

    Returns:
      Θ of shape (N·C, N2·C) (sample-major, row ``i*C + c``) or (N, N2) when traced, dtype of
      the logits; a ``jax.Array`` whose rows are split over the mesh when d divides N, else
      replicated on every device (JAX arrays cannot be split unevenly).

    Raises:
      ValueError: ``trace_logits`` not True or False; bad x / x2 / params / ``apply_fn``
        output (``check_model``), x2 giving a different number of logits or with samples of
        another shape than x's, a mesh that is
        not a 1-D ``Mesh``, or a traced ``params`` / ``x`` / ``x2`` (called under
        ``jax.jit``, ``vmap`` or ``grad``: it pads and places concrete arrays), before any work.
    """
    check_concrete("sharded_empirical_ntk", takes="predict_from_kernel", params=params, x=x,
                   x2=x2)
    trace_logits = check_trace_logits(trace_logits)
    mesh = _check_mesh(mesh)
    (n, c), n2 = pair_shapes(apply_fn, params, x, x2)
    symmetric = x2 is None
    d = mesh.shape[mesh.axis_names[0]]
    rows = NamedSharding(mesh, P(mesh.axis_names[0]))
    xs = _padded(x, d, rows)
    x2s = xs if symmetric else _padded(x2, d, rows)
    params = jax.device_put(params, NamedSharding(mesh, P()))
    k = 1 if trace_logits else c
    out = _ring(apply_fn, params, xs, x2s, trace_logits=trace_logits, symmetric=symmetric,
                mesh=mesh, k=k)
    # drop the padding; a jax.Array cannot be split unevenly, so rows stay split over the mesh
    # only when d divides N, otherwise the result is replicated
    keep = rows if n % d == 0 else NamedSharding(mesh, P())
    return jax.jit(lambda o: o[: n * k, : n2 * k], out_shardings=keep)(out)
