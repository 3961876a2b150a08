"""The linearised network (Zancato et al. 2020, Sec. 3; METHOD.md §1)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ntk_tt.data._inputs import as_array
from ntk_tt.data._model import ApplyFn, check_function, check_weights


def linearize(apply_fn: ApplyFn, params0: Any) -> ApplyFn:
    """First-order Taylor expansion of ``apply_fn`` in the weights around ``params0``.

    ``f_lin(params, x) = f(params0, x) + J(x) (params − params0)`` with ``J(x) = ∂f(params0, x)/∂w``
    the Jacobian at the pre-trained weights (paper Sec. 3). ``J(x)·Δw`` is one forward-mode
    ``jax.jvp``: the Jacobian is never formed. Fine-tuning the linear model by gradient descent
    gives exactly the function-space dynamics driven by the empirical NTK Θ = J Jᵀ.

    Source: Zancato et al. 2020 (arXiv 2008.12478), Sec. 3; METHOD.md §1.

    Args:
      apply_fn: ``apply_fn(params, x) -> logits`` of shape (N, C).
      params0: the pre-trained parameter pytree w0 (trainable leaves only).

    Returns:
      ``f_lin(params, x) -> logits`` of shape (N, C), same conventions as ``apply_fn``;
      ``params`` must have the tree structure of ``params0``.

    Raises:
      ValueError: ``apply_fn`` not a function (a flax module: use ``ntk_tt.from_nnx``), or
        ``params0`` not weights (None, a string, a module); (from ``f_lin``) if ``params``
        and ``params0`` have different tree structures (the message gives both leaf counts
        and the first key paths that differ), ``x`` is not an array, or ``apply_fn`` fails
        on ``x`` (e.g. a wrong feature size).
    """
    check_function(apply_fn)
    check_weights(params0, "params0")
    treedef0 = jax.tree_util.tree_structure(params0)

    def f_lin(params: Any, x: jax.Array) -> jax.Array:
        if jax.tree_util.tree_structure(params) != treedef0:
            raise ValueError(_mismatch(params, params0))
        x = as_array(x, "x")
        delta = jax.tree.map(jnp.subtract, params, params0)
        try:
            f0, jvp = jax.jvp(lambda p: apply_fn(p, x), (params0,), (delta,))
        except (TypeError, ValueError) as err:  # a fresh user's x of the wrong width: raw
            why = str(err).strip().rstrip(".") or type(err).__name__  # dot_general's error
            raise ValueError(
                f"apply_fn(params0, x) fails on x of shape {x.shape}: {why}. Check that x has "
                "the input shape the model was built for (the per-sample shape after the "
                "batch axis), as for ntk_tt.empirical_ntk.") from err
        return f0 + jvp

    return f_lin


def _paths(tree: Any) -> list[str]:
    """The key path of every leaf, e.g. ``['w1']`` or ``[0].kernel``."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [jax.tree_util.keystr(path) or "(the root: a single array)" for path, _ in flat]


def _mismatch(params: Any, params0: Any) -> str:
    """One line saying how ``params``' tree differs from ``params0``'s: the leaf counts and
    the first key paths one has and the other lacks (never the whole tree definition)."""
    want, got = _paths(params0), _paths(params)

    def some(paths):
        return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")

    lacks = [p for p in want if p not in set(got)]
    extra = [p for p in got if p not in set(want)]
    where = "; ".join(([f"params lacks {some(lacks)}"] if lacks else [])
                      + ([f"params has {some(extra)}, which params0 lacks"] if extra else []))
    where = where or ("the key paths agree but a container type differs (e.g. a tuple for a "
                      "list, or a FrozenDict for a dict)")
    leaves = f"{len(got)} lea{'f' if len(got) == 1 else 'ves'}"
    return (f"params must have the tree structure of the params0 given to linearize "
            f"({len(want)} leaves), got {leaves}: {where}. Pass params with the same keys and "
            "nesting, e.g. jax.tree.map(lambda w, d: w + d, params0, delta).")
