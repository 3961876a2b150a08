"""Sketched empirical NTK: features J·diag(s)·P/√D' with P random and never materialised.

Paper Sec. 4 (METHOD.md §5): project each per-sample, per-logit gradient onto D' random
directions; Θ̂ = (J P)(J P)ᵀ/D' is unbiased for Θ. Rule for P (D × D'): columns come in blocks
of ``DIRECTION_BLOCK``; the block ``b`` rows of parameter leaf ``l`` (leaf order of
``jax.tree.leaves(params)``) are drawn as an array of shape (DIRECTION_BLOCK, size_l) from
``fold_in(fold_in(key, l), b)`` and transposed. So P depends only on the key and the parameter
shapes: not on the route, the sample blocks, the inputs or the machine (jax's counter-based
PRNG), and ``sketch_dim`` only truncates it.
"""

from __future__ import annotations

import math
import warnings
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt.data._inputs import check_key
from ntk_tt.data._model import ApplyFn, check_concrete, check_model, num_params
from ntk_tt.kernels._blocks import check_block_size, output_dtype, sample_blocks
from ntk_tt.kernels._memory import NTKMemoryError, available_memory, format_bytes
from ntk_tt.kernels._structured import project, structured_jacobian

DIRECTION_BLOCK = 32
# Achlioptas entries from 16 random bits (3× cheaper than randint on CPU): P(±) = T/2¹⁶ each,
# = 1/6 to 5e-6, and the magnitude makes E p² = 1 exactly (it is √3 to 2e-5).
_ACH_T = 10923
_ACH_VALUE = math.sqrt(2**16 / (2 * _ACH_T))
DISTRIBUTIONS = ("achlioptas", "gaussian")
ROUTES = ("auto", "forward", "reverse")


class SketchedNTK(NamedTuple):
    """Random features of the empirical NTK.

    Attributes:
      features: (N·C, D') array ``J·diag(s)·P/√D'``, rows sample-major (``i*C + c``).

    Source: Zancato et al. 2020 (arXiv 2008.12478), Sec. 4 (random projection); METHOD.md §5.
    """

    features: jax.Array

    @property
    def kernel(self) -> jax.Array:
        """Θ̂ = features @ featuresᵀ, shape (N·C, N·C); unbiased for J·diag(s²)·Jᵀ."""
        return self.features @ self.features.T


def _draw(key, b, sizes, dtype, distribution):
    """Direction block ``b``: one (DIRECTION_BLOCK, size_l) array per leaf (module rule)."""
    out = []
    for leaf_index, size in enumerate(sizes):
        k = jax.random.fold_in(jax.random.fold_in(key, leaf_index), b)
        shape = (DIRECTION_BLOCK, size)
        if distribution == "gaussian":
            out.append(jax.random.normal(k, shape, dtype))
        else:
            u = jax.random.bits(k, shape, jnp.uint16)
            sign = (u < _ACH_T).astype(dtype) - ((u >= _ACH_T) & (u < 2 * _ACH_T)).astype(dtype)
            out.append(_ACH_VALUE * sign)
    return out


@partial(jax.jit, static_argnums=(0, 5))
def _forward_block(apply_fn, params, xb, key, b, distribution, scale):
    """(B·C, DIRECTION_BLOCK) = J_xb diag(s) P_b: one vmapped jvp per direction."""
    leaves, treedef = jax.tree.flatten(params)
    dirs = _draw(key, b, [p.size for p in leaves], leaves[0].dtype, distribution)
    if scale is not None:
        dirs = [d * s.reshape(-1) for d, s in zip(dirs, scale, strict=True)]
    tangents = treedef.unflatten(
        [d.reshape((DIRECTION_BLOCK, *p.shape)) for d, p in zip(dirs, leaves, strict=True)]
    )

    def jvp(t):
        return jax.jvp(lambda p: apply_fn(p, xb), (params,), (t,))[1]

    return jax.vmap(jvp)(tangents).reshape(DIRECTION_BLOCK, -1).T


@partial(jax.jit, static_argnums=(3, 4))
def _project_block(jac, key, b, distribution, sizes, scale):
    """(B·C, DIRECTION_BLOCK) = J_block diag(s) P_b from per-sample derivatives."""
    some = next(iter({**jac.generic, **jac.cotangents}.values()))
    dirs = _draw(key, b, sizes, some.dtype, distribution)
    if scale is not None:
        dirs = [d * s.reshape(-1) for d, s in zip(dirs, scale, strict=True)]
    return project(jac, dict(enumerate(dirs)))


def _forward_flops(apply_fn, params, x) -> float:
    """XLA's FLOP count of one single-sample forward pass (fallback 2·D)."""
    try:
        spec = jax.ShapeDtypeStruct((1, *np.shape(x)[1:]), jnp.result_type(x))
        return float(jax.jit(apply_fn).lower(params, spec).cost_analysis()["flops"])
    except Exception:  # cost analysis is best-effort and backend dependent
        return 2.0 * num_params(params)


def choose_route(apply_fn, params, x, sketch_dim: int) -> str:
    """'forward' or 'reverse', whichever has fewer estimated FLOPs.

    Forward: a jvp (~2 forward passes) per direction and sample: N·F·(1 + 2D').
    Reverse: per-sample Jacobians (~C backward passes) plus the projection:
    N·F·(1 + 2C) + 2·N·C·D·D'.
    """
    n, c = np.shape(x)[0], jax.eval_shape(apply_fn, params, x).shape[1]
    flops, d = _forward_flops(apply_fn, params, x), num_params(params)
    forward = n * flops * (1 + 2 * sketch_dim)
    reverse = n * flops * (1 + 2 * c) + 2 * n * c * d * sketch_dim
    return "forward" if forward <= reverse else "reverse"


def _check_args(params, sketch_dim, key, distribution, route, param_scale):
    if (
        isinstance(sketch_dim, bool)
        or not isinstance(sketch_dim, (int, np.integer))
        or (sketch_dim < 1)
    ):
        raise ValueError(
            f"sketch_dim must be a positive integer (number of random directions D'), got "
            f"{sketch_dim!r}; the relative error is about sqrt((1 + r)/D'), try 1024."
        )
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}.")
    if route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, got {route!r}.")
    if key is None:
        raise ValueError("key must be a jax.random key, e.g. jax.random.key(0), got None: the "
                         "random projection P is drawn from it.")
    check_key(key)
    if param_scale is not None:
        same = jax.tree.structure(param_scale) == jax.tree.structure(params) and all(
            np.shape(s) == np.shape(p)
            for s, p in zip(jax.tree.leaves(param_scale), jax.tree.leaves(params), strict=True)
        )
        if not same:
            raise ValueError(
                "param_scale must be a pytree with the structure and leaf shapes of params "
                "(one scale per parameter), or None for all ones."
            )
        if not all(bool(jnp.all(jnp.isfinite(s))) for s in jax.tree.leaves(param_scale)):
            raise ValueError("param_scale contains NaN or inf; pass finite per-parameter scales.")


def sketched_ntk(
    apply_fn: ApplyFn,
    params: Any,
    x: Any,
    *,
    sketch_dim: int,
    key: jax.Array,
    distribution: str = "achlioptas",
    route: str = "auto",
    block_size: int | None = None,
    param_scale: Any = None,
    memory_limit: int | None = None,
) -> SketchedNTK:
    """Sketched empirical NTK: features J·diag(s)·P/√D' with D' = ``sketch_dim``.

    ``features @ featuresᵀ`` is an unbiased estimate of Θ = J Jᵀ (of J diag(s²) Jᵀ with a
    ``param_scale`` s) with E‖Θ̂ − Θ‖²_F = (‖Θ‖²_F + (tr Θ)²)/D' for both distributions (their
    fourth moments agree), i.e. relative Frobenius error ≈ √((1 + r)/D'), r = (tr Θ)²/‖Θ‖²_F
    (paper Sec. 4). P's entries are Achlioptas' √3·{+1, 0, −1} with probabilities
    1/6, 2/3, 1/6 (drawn from 16 random bits: probabilities within 5e-6 of these, magnitude
    rescaled so that E p² = 1 exactly, hence still unbiased), or standard Gaussian; P is
    generated per parameter leaf and per block of directions from ``key`` (module docstring),
    so the same key gives the same features whatever ``route``, ``block_size`` or input set
    (sketch [x; x_test] or x alone: the x rows agree).

    Routes: "forward" runs one ``jax.jvp`` per direction, vmapped over a block of directions;
    "reverse" computes per-sample Jacobians for ``block_size`` inputs at a time (like
    ``empirical_ntk``) and projects them; "auto" picks the one with fewer estimated FLOPs
    (:func:`choose_route`). Peak memory: the (N·C, D') features, one (DIRECTION_BLOCK × D)
    block of P, and for "reverse" a (block_size·C × D) Jacobian block — never D × D'.

    Source: Zancato et al. 2020 (arXiv 2008.12478), Sec. 4 (random projection, Achlioptas'
    directions); METHOD.md §5.

    Args:
      apply_fn: ``apply_fn(params, x) -> logits`` of shape (N, C).
      params: parameter pytree, D numbers.
      x: inputs, shape (N, ...).
      sketch_dim: D' ≥ 1, number of random directions.
      key: ``jax.random`` key determining P.
      distribution: "achlioptas" or "gaussian".
      route: "auto", "forward" or "reverse".
      block_size: samples per block (positive int) or None (all N, or what fits in memory).
      param_scale: pytree like ``params`` with per-parameter scales s, or None (all ones).
        The SGD-noise predictor passes the per-parameter std of per-sample loss gradients.
      memory_limit: bytes available, overriding ``$NTK_TT_MEMORY_LIMIT`` and /proc/meminfo.

    Returns:
      :class:`SketchedNTK` with ``features`` (N·C, D') in the logits' dtype.

    Raises:
      ValueError: bad model/input (``check_model``), ``sketch_dim`` ≤ 0 or, without a
        ``param_scale``, above D (it costs more than the exact kernel), ``block_size`` ≤ 0,
        unknown ``distribution`` or ``route``, ``key`` not a key, ``param_scale`` not shaped
        like ``params`` or non-finite, a traced ``params`` or ``x`` (no jit / vmap / grad).
      NTKMemoryError: features plus blocks exceed the available memory (before any work).

    Warns:
      UserWarning: ``sketch_dim`` > D with a ``param_scale`` (the SDE's noise features); without
        ``param_scale`` D/2 < ``sketch_dim`` ≤ D when D ≥ N·C ("sketch_dim D' = ... is
        more than half the number of parameters D = ..."): projecting the Jacobian, N·C·D·D'
        flops, and forming Θ̂, (N·C)²·D', then cost more than the exact Θ = J Jᵀ, (N·C)²·D,
        which also has no sampling error (``kernel='exact'`` in ``ntk_tt.predict``). Below
        D = N·C (a tiny model, many samples) such a sketch can be the cheaper estimate, and
        with a ``param_scale`` (the SDE's noise features) there is no exact kernel to advise,
        so in neither case does D/2 < D' ≤ D warn.
    """
    check_block_size(block_size)
    check_concrete("sketched_ntk", takes="predict_from_kernel", params=params, x=x)
    _check_args(params, sketch_dim, key, distribution, route, param_scale)
    n, c = check_model(apply_fn, params, x)
    _check_cost(sketch_dim, num_params(params), n * c, param_scale is None)
    x = jnp.asarray(x)
    if route == "auto":
        route = choose_route(apply_fn, params, x, sketch_dim)
    dtype = output_dtype(apply_fn, params, x)
    d, nblocks = num_params(params), -(-sketch_dim // DIRECTION_BLOCK)
    bs = _plan_sketch(n, c, d, sketch_dim, dtype.itemsize, route, block_size, memory_limit)
    sizes = tuple(int(np.size(p)) for p in jax.tree.leaves(params))
    scale = None
    if param_scale is not None:
        scale = [jnp.asarray(s, dtype) for s in jax.tree.leaves(param_scale)]
    rows = []
    for real, xb in sample_blocks(x, bs):
        if route == "forward":
            cols = [
                _forward_block(apply_fn, params, xb, key, b, distribution, scale)
                for b in range(nblocks)
            ]
        else:
            jac = structured_jacobian(apply_fn, params, xb)
            cols = [_project_block(jac, key, b, distribution, sizes, scale) for b in range(nblocks)]
        rows.append(jnp.concatenate(cols, axis=1)[: real * c, :sketch_dim])
    features = jnp.concatenate(rows, axis=0) / jnp.sqrt(jnp.asarray(sketch_dim, dtype))
    return SketchedNTK(features.astype(dtype))


def _check_cost(sketch_dim: int, d: int, nc: int, plain: bool) -> None:
    """The checks of :func:`sketched_ntk`'s cost: D' > D is a ValueError when ``plain`` (no
    param_scale: the exact kernel, (N·C)²·D flops, is the alternative; 10**6 directions on
    D = 387 ran for minutes) and a UserWarning otherwise; D/2 < D' ≤ D with D ≥ N·C = ``nc``
    and ``plain`` warns, where the sketch's N·C·D·D' + (N·C)²·D' flops exceed the exact
    kernel's."""
    if sketch_dim > d and plain:
        raise ValueError(
            f"sketch_dim D' = {sketch_dim} exceeds the number of parameters D = {d}: that "
            "sketch costs more than the exact kernel (ntk_tt.empirical_ntk, no sampling "
            f"error) and is still an estimate of it; use the exact kernel, or sketch_dim <= "
            f"D/2 = {d // 2}, where the sketch saves work.")
    if sketch_dim > d:
        warnings.warn(
            f"sketch_dim D' = {sketch_dim} exceeds the number of parameters D = {d}: this "
            "sketch costs more than the exact kernel (ntk_tt.empirical_ntk) and is still only "
            "an estimate of it.", stacklevel=3)
    elif plain and 2 * sketch_dim > d >= nc:
        warnings.warn(
            f"sketch_dim D' = {sketch_dim} is more than half the number of parameters D = {d} "
            f"(with N·C = {nc} <= D): there the exact kernel (kernel='exact' in "
            "ntk_tt.predict, --kernel exact, or ntk_tt.empirical_ntk) is cheaper than the "
            f"sketch and has no sampling error; use it, or sketch_dim <= {d // 2}.",
            UserWarning, stacklevel=3)


def _plan_sketch(n, c, d, sketch_dim, itemsize, route, block_size, memory_limit):
    """Block size for the sketch, after the memory guard."""
    avail = available_memory(memory_limit)
    fixed = itemsize * (n * c * sketch_dim + DIRECTION_BLOCK * d)
    per_row = itemsize * c * d if route == "reverse" else 0
    if block_size is None:
        block_size = n if per_row == 0 else max(1, min(n, (avail - fixed) // per_row))
    bs = int(min(block_size, n))
    need = fixed + per_row * bs
    if need > avail:
        raise NTKMemoryError(
            f"the sketched NTK (N·C={n * c}, D'={sketch_dim}, D={d}, route={route!r}, "
            f"block_size={bs}) needs about {format_bytes(need)} but only "
            f"{format_bytes(avail)} is available. Use a smaller sketch_dim"
            + (" or block_size, route='forward' (no Jacobian block)," if route == "reverse"
               else " (the features alone need it; the route is already 'forward'),")
            + " or ntk_vector_product for Θ·v."
        )
    return bs
