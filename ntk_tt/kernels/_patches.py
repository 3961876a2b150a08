"""Patch extraction (im2col) as strided slices, for the per-sample Jacobians.

``lax.conv_general_dilated_patches`` (a convolution written as patches @ W) is a grouped
convolution with a constant one-hot kernel. Its transpose, which every reverse pass through the
layer runs once per sample and logit, is another grouped convolution, and XLA:CPU runs those
slowly: on the benchmark CNN's second layer (16 → 144 features, 16 × 16 inputs) the transpose
for 750 samples × 5 logits took 1.6 s, against 0.05 s for the transpose of the same patches
taken as strided slices (a pad and a sum). ``patch_rewrites`` finds such convolutions in a
jaxpr: a ``conv_general_dilated`` whose kernel is a constant (it depends on no input) that
copies one input feature at one window offset into each output feature, with one group per
input feature. ``structured_jacobian`` evaluates those as slices instead; the values are the
same (a one-hot kernel only copies), the reverse pass is cheap.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Literal


def _constant_eqns(jaxpr) -> set[int]:
    """Indices of the equations whose inputs are all literals, constvars or outputs of other
    such equations (values fixed at trace time), without effects."""
    known = set(jaxpr.constvars)
    found = set()
    for k, eqn in enumerate(jaxpr.eqns):
        if not eqn.effects and all(isinstance(v, Literal) or v in known for v in eqn.invars):
            found.add(k)
            known.update(eqn.outvars)
    return found


def _evaluate(closed, var, constant: set[int], producer: dict):
    """Concrete value of a constant ``var`` of ``closed`` (its producing equations evaluated
    eagerly, even inside a ``jit`` trace)."""
    env = dict(zip(closed.jaxpr.constvars, closed.consts, strict=True))

    def value(v):
        if isinstance(v, Literal):
            return v.val
        if v not in env:
            eqn = closed.jaxpr.eqns[producer[v]]
            outs = eqn.primitive.bind(*[value(u) for u in eqn.invars],
                                      **eqn.primitive.get_bind_params(eqn.params))
            outs = outs if eqn.primitive.multiple_results else [outs]
            env.update(zip(eqn.outvars, outs, strict=True))
        return env[v]

    with jax.ensure_compile_time_eval():
        return np.asarray(value(var))


def _one_hot_copy(rhs: np.ndarray, dn, groups: int) -> tuple[np.ndarray, np.ndarray] | None:
    """For a one-hot kernel with one input feature per group: (input feature, flat window
    offset) of each output feature, else None."""
    window = [rhs.shape[a] for a in dn.rhs_spec[2:]]
    if rhs.shape[dn.rhs_spec[1]] != 1 or rhs.shape[dn.rhs_spec[0]] % groups:
        return None
    taps = np.transpose(rhs, dn.rhs_spec).reshape(rhs.shape[dn.rhs_spec[0]], int(np.prod(window)))
    if not (np.all((taps == 0) | (taps == 1)) and np.all(taps.sum(axis=1) == 1)):
        return None
    feature = np.arange(taps.shape[0]) // (taps.shape[0] // groups)
    return feature, np.argmax(taps, axis=1)


def _by_slicing(lhs, feature, offset, window, strides, padding, dilation, dn, dtype):
    """Output feature o of a one-hot convolution of ``lhs`` = input feature ``feature[o]`` at
    flat window offset ``offset[o]``, by strided slices; laid out as ``dn.out_spec``."""
    spatial = len(window)
    h = jnp.transpose(lhs, (dn.lhs_spec[0], *dn.lhs_spec[2:], dn.lhs_spec[1]))
    h = jax.lax.pad(h, jnp.zeros((), h.dtype),
                    [(0, 0, 0), *[(lo, hi, 0) for lo, hi in padding], (0, 0, 0)])
    out = [(h.shape[1 + s] - (window[s] - 1) * dilation[s] - 1) // strides[s] + 1
           for s in range(spatial)]
    pieces = []
    for flat in range(int(np.prod(window))):
        tap = np.unravel_index(flat, window)
        start = [0, *[int(tap[s]) * dilation[s] for s in range(spatial)], 0]
        limit = [h.shape[0], *[start[1 + s] + (out[s] - 1) * strides[s] + 1
                               for s in range(spatial)], h.shape[-1]]
        pieces.append(jax.lax.slice(h, start, limit, [1, *strides, 1]))
    stacked = jnp.stack(pieces, axis=-1)  # (batch, out spatial…, features, taps)
    flat = stacked.reshape(*stacked.shape[:-2], -1)
    index = feature * len(pieces) + offset
    if not np.array_equal(index, np.arange(flat.shape[-1])):
        flat = jnp.take(flat, index, axis=-1)
    order = (dn.out_spec[0], *dn.out_spec[2:], dn.out_spec[1])
    return jnp.transpose(flat, np.argsort(order)).astype(dtype)


def patches(h, window, strides, padding, rhs_dilation, dn):
    """``lax.conv_general_dilated_patches(h, window, strides, padding, (1, …),
    rhs_dilation, dn)`` (explicit padding pairs) by strided slices: output features ordered
    (input feature, window offset), laid out as ``dn.out_spec``."""
    taps, features = int(np.prod(window)), h.shape[dn.lhs_spec[1]]
    return _by_slicing(h, np.repeat(np.arange(features), taps), np.tile(np.arange(taps), features),
                       tuple(window), strides, padding, rhs_dilation, dn, h.dtype)


def patch_rewrites(closed) -> dict[int, Callable]:
    """``{equation index: f(lhs, rhs) -> output}`` for the patch extractions of ``closed``
    (one-hot constant-kernel convolutions, one group per input feature, no input dilation):
    each ``f`` computes the equation's output by strided slices of ``lhs``."""
    jaxpr = closed.jaxpr
    constant = _constant_eqns(jaxpr)
    producer = {v: k for k in constant for v in jaxpr.eqns[k].outvars}
    consts = set(jaxpr.constvars)
    rewrites = {}
    for k, eqn in enumerate(jaxpr.eqns):
        if eqn.primitive.name != "conv_general_dilated" or k in constant:
            continue
        p, (lhs, rhs) = eqn.params, eqn.invars
        dn = p["dimension_numbers"]
        if (p["batch_group_count"] != 1 or any(d != 1 for d in p["lhs_dilation"])
                or p["feature_group_count"] != lhs.aval.shape[dn.lhs_spec[1]]
                or not (isinstance(rhs, Literal) or rhs in producer or rhs in consts)):
            continue
        kernel = _evaluate(closed, rhs, constant, producer)
        copy = _one_hot_copy(kernel, dn, p["feature_group_count"])
        if copy is None:
            continue
        args = (tuple(kernel.shape[a] for a in dn.rhs_spec[2:]), p["window_strides"],
                p["padding"], p["rhs_dilation"], dn, eqn.outvars[0].aval.dtype)

        def rewrite(lhs_value, _rhs, feature=copy[0], offset=copy[1], args=args):
            return _by_slicing(lhs_value, feature, offset, *args)

        rewrites[k] = rewrite
    return rewrites
