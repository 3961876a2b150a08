"""Per-sample Jacobians with structured dense layers (no (C × in × out) Jacobian for them).

A weight matrix W used once, as ``y = h @ W`` with h of shape (1, in) in the single-sample
network, has per-sample, per-logit Jacobian ``h_i ⊗ δ_ic`` (δ_ic = ∂f_c(x_i)/∂y). Its part of
the empirical NTK is ``(h_i · h_j)(δ_ic · δ_jc')``, an (N×N) ∘ (NC×NC) product that costs
N²·in + (NC)²·out instead of (NC)²·in·out (the "structured derivatives" idea of
neural-tangents, here only for this one pattern). Such leaves are found in the jaxpr of the
single-sample network; δ comes from differentiating with respect to a zero perturbation added
to y. Every other leaf gets its per-sample Jacobian by ``vmap(jacrev)`` as before.
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.extend.core import Literal

_DENSE_DIMS = (((1,), (0,)), ((), ()))


class BlockJacobian(NamedTuple):
    """Per-sample derivatives of a block of B inputs.

    Dicts keyed by leaf index l (order of ``jax.tree.leaves(params)``).

    Attributes:
      generic: per leaf not structured, (B, C, size_l).
      acts: per structured dense leaf, its input h, (B, in_l).
      cotangents: per structured dense leaf, δ = ∂f/∂y, (B, C, out_l).
    """

    generic: dict
    acts: dict
    cotangents: dict


def _dense_leaves(jaxpr, num_leaves: int) -> dict[int, int]:
    """Map leaf index → index of the dot_general eqn where it is the (in, out) right operand."""
    uses: dict[Any, list[tuple[int, int]]] = {}
    for k, eqn in enumerate(jaxpr.eqns):
        for pos, v in enumerate(eqn.invars):
            if not isinstance(v, Literal):
                uses.setdefault(v, []).append((k, pos))
    outvars = {v for v in jaxpr.outvars if not isinstance(v, Literal)}
    found = {}
    for i, var in enumerate(jaxpr.invars[:num_leaves]):
        if var in outvars or len(uses.get(var, [])) != 1:
            continue
        k, pos = uses[var][0]
        eqn = jaxpr.eqns[k]
        if eqn.primitive.name != "dot_general":
            continue
        dims = tuple(tuple(tuple(d) for d in part) for part in eqn.params["dimension_numbers"])
        lhs = eqn.invars[0]
        if (
            pos == 1
            and dims == _DENSE_DIMS
            and len(var.aval.shape) == 2
            and len(lhs.aval.shape) == 2
            and lhs.aval.shape[0] == 1
            and lhs is not var
        ):
            found[i] = k
    return found


def _interpret(closed, args, eps: dict[int, jax.Array]):
    """Evaluate ``closed`` on ``args``, adding ``eps[k]`` to the output of eqn k and returning
    (outputs, {k: left operand of eqn k})."""
    env = dict(zip(closed.jaxpr.constvars, closed.consts, strict=True))
    env.update(zip(closed.jaxpr.invars, args, strict=True))
    captured = {}

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    for k, eqn in enumerate(closed.jaxpr.eqns):
        invals = [read(v) for v in eqn.invars]
        outs = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))
        outs = outs if eqn.primitive.multiple_results else [outs]
        if k in eps:
            captured[k] = invals[0]
            outs = [outs[0] + eps[k]]
        env.update(zip(eqn.outvars, outs, strict=True))
    return [read(v) for v in closed.jaxpr.outvars], captured


@partial(jax.jit, static_argnums=0)
def structured_jacobian(apply_fn, params: Any, xb: jax.Array) -> BlockJacobian:
    """Per-sample derivatives of ``apply_fn`` at ``params`` for the inputs ``xb`` (B, ...)."""
    leaves, treedef = jax.tree.flatten(params)

    def single(leaf_list, xi):
        return apply_fn(treedef.unflatten(leaf_list), xi[None])[0]

    spec = [jax.ShapeDtypeStruct(p.shape, p.dtype) for p in leaves]
    xspec = jax.ShapeDtypeStruct(xb.shape[1:], xb.dtype)
    closed = jax.make_jaxpr(single)(spec, xspec)
    dense = _dense_leaves(closed.jaxpr, len(leaves))
    rest = [i for i in range(len(leaves)) if i not in dense]
    eqn_of = [dense[i] for i in sorted(dense)]

    def perturbed(rest_leaves, eps_list, xi):
        full = list(leaves)
        for i, leaf in zip(rest, rest_leaves, strict=True):
            full[i] = leaf
        eps = dict(zip(eqn_of, eps_list, strict=True))
        (out,), captured = _interpret(closed, [*full, xi], eps)
        return out, [captured[k][0] for k in eqn_of]

    def per_sample(xi):
        avals = [closed.jaxpr.eqns[k].outvars[0].aval for k in eqn_of]
        eps0 = [jnp.zeros(a.shape, a.dtype) for a in avals]
        (j_rest, j_eps), acts = jax.jacrev(perturbed, argnums=(0, 1), has_aux=True)(
            [leaves[i] for i in rest], eps0, xi
        )
        return j_rest, [j[:, 0] for j in j_eps], acts

    j_rest, cots, acts = jax.vmap(per_sample)(xb)
    generic = {i: j.reshape(j.shape[0], j.shape[1], -1) for i, j in zip(rest, j_rest, strict=True)}
    order = sorted(dense)
    return BlockJacobian(
        generic, dict(zip(order, acts, strict=True)), dict(zip(order, cots, strict=True))
    )


@partial(jax.jit, static_argnames="trace_logits")
def contract(a: BlockJacobian, b: BlockJacobian, trace_logits: bool) -> jax.Array:
    """Kernel block Θ(a, b): (B_a·C, B_b·C) sample-major, or (B_a, B_b) when traced."""
    some = next(iter(a.generic.values())) if a.generic else next(iter(a.cotangents.values()))
    some2 = next(iter(b.generic.values())) if b.generic else next(iter(b.cotangents.values()))
    (bsz, c), bsz2 = some.shape[:2], some2.shape[0]
    out = jnp.zeros((bsz, bsz2) if trace_logits else (bsz * c, bsz2 * c), some.dtype)
    for i, ja in a.generic.items():
        jb = b.generic[i]
        if trace_logits:
            out = out + jnp.einsum("bcd,ecd->be", ja, jb)
        else:
            out = out + ja.reshape(bsz * c, -1) @ jb.reshape(bsz2 * c, -1).T
    for i, da in a.cotangents.items():
        gram, db = a.acts[i] @ b.acts[i].T, b.cotangents[i]
        if trace_logits:
            out = out + gram * jnp.einsum("bco,eco->be", da, db)
        else:
            delta = jnp.einsum("bco,edo->bced", da, db)
            out = out + (gram[:, None, :, None] * delta).reshape(bsz * c, bsz2 * c)
    return out


def project(jac: BlockJacobian, dirs: dict) -> jax.Array:
    """J_block · P_b: (B·C, K) from per-leaf direction blocks ``dirs[l]`` of shape (K, size_l).

    A structured dense leaf (W of shape (in, out), entries row-major) is projected as
    Σ_ab h_a δ_cb P[a·out + b, k] without forming h ⊗ δ: C times cheaper than J_l · P_l.
    """
    terms = []
    for i, j in jac.generic.items():
        terms.append(j.reshape(-1, j.shape[-1]) @ dirs[i].T)
    for i, h in jac.acts.items():
        delta = jac.cotangents[i]
        p = dirs[i].reshape(dirs[i].shape[0], h.shape[-1], delta.shape[-1])
        hp = jnp.einsum("ba,kao->bko", h, p)
        terms.append(jnp.einsum("bko,bco->bck", hp, delta).reshape(-1, p.shape[0]))
    return sum(terms)
