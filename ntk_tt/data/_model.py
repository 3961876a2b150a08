"""The one model convention of ntk_tt: a pure ``apply_fn(params, x) -> logits``.

Every part of the pipeline (linearisation, empirical NTK, dynamics, real fine-tuning) takes
``apply_fn`` with ``x`` a batch of N inputs and logits of shape (N, C). Flax NNX modules enter
through :func:`from_nnx`, the single adapter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ntk_tt.data._inputs import as_array, reason

ApplyFn = Callable[[Any, jax.Array], jax.Array]


def check_function(fn, name: str = "apply_fn", form: str = "apply_fn(params, x) -> logits"):
    """ValueError unless ``fn`` is a function ``form`` (a flax module is not: its weights live
    inside it, and :func:`from_nnx` splits them out)."""
    if isinstance(fn, nnx.Module) or not callable(fn):
        raise ValueError(f"{name} must be a function {form}, got {type(fn).__name__}; "
                         "ntk_tt.from_nnx(model) returns (apply_fn, params) of a flax model.")


def check_weights(params, name: str = "params") -> None:
    """ValueError unless ``params`` can be weights (a pytree of arrays): None, a string or a
    flax module (whose weights live inside it) cannot."""
    if params is None or isinstance(params, (str, bytes, nnx.Module)):
        raise ValueError(f"{name} must be the weights (a pytree of arrays), got "
                         f"{type(params).__name__}; ntk_tt.from_nnx(model) returns "
                         "(apply_fn, params) of a flax model.")


def _leaf_name(path, bare: str = "params (a single array)") -> str:
    """How a message names the params leaf at ``path``; ``bare`` for params that are one leaf
    (its path is empty: the message read "params leaf  has dtype ...", naming nothing)."""
    return f"params leaf {jax.tree_util.keystr(path)}" if path else bare


def check_concrete(where: str, *, takes: str = "predict_head_aware, or predict(head_kernel=)",
                   **trees) -> None:
    """ValueError when a leaf of one of ``trees`` (name=pytree) is traced: ``where`` builds a
    kernel from concrete arrays (host buffers, planned memory), so it cannot run under
    ``jax.jit``, ``vmap`` or ``grad``; the predictors that take the kernel (``takes``, named
    in the message) are the jittable part."""
    for name, tree in trees.items():
        if any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(tree)):
            raise ValueError(
                f"{where} builds its kernels from concrete arrays and cannot run under "
                f"jax.jit, vmap or grad ({name} is traced): build it once outside the "
                f"transformation and jit or vmap the predictor that takes it ({takes}) over "
                "the hyperparameters instead.")


def from_nnx(module: nnx.Module) -> tuple[ApplyFn, Any]:
    """Split a flax NNX module into a pure ``(apply_fn, params)`` pair.

    A copy of the module (``nnx.clone``: the same weight arrays) is put in evaluation mode
    (``.eval()``), so batch-norm layers use their frozen running statistics and dropout is
    off: a sample's output never depends on its batch. ``module`` itself keeps its mode (to
    go on training it with nnx). ``params`` holds the trainable ``nnx.Param`` leaves only;
    every other state (batch-norm statistics, RNG counters) is closed over by ``apply_fn`` as
    a constant and is therefore never differentiated.

    Source: none (ntk_tt's one adapter); eval mode as METHOD.md §1 requires (batch-norm
    statistics frozen in the prediction and in the real run).

    Args:
      module: a flax NNX module mapping a batch ``x`` of shape (N, ...) to logits (N, C).

    Returns:
      ``(apply_fn, params)`` with ``apply_fn(params, x) -> logits`` of shape (N, C) and
      ``params`` an ``nnx.State`` pytree of the trainable parameters.

    Raises:
      TypeError: if ``module`` is not an ``nnx.Module``.
    """
    if not isinstance(module, nnx.Module):
        raise TypeError(
            f"from_nnx expects a flax.nnx.Module, got {type(module).__name__}; for other "
            "libraries write apply_fn(params, x) -> logits yourself."
        )
    module = nnx.clone(module)  # the caller's module keeps its train/eval mode
    module.eval()
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)

    def apply_fn(params, x):
        return nnx.merge(graphdef, params, rest)(x)

    return apply_fn, params


def num_params(params: Any) -> int:
    """Total number of scalars D in a parameter pytree.

    Source: none (a utility: D of METHOD.md, Notation).

    Args:
      params: the weights, a pytree of numeric arrays or numbers (e.g.
        ``ntk_tt.from_nnx(model)[1]``).

    Returns:
      D, a Python int: the leaves' sizes summed (0 for an empty pytree such as ``{}``).

    Raises:
      ValueError: ``params`` not weights (None, a string, a flax module: pass
        ``ntk_tt.from_nnx(model)[1]``), or a leaf that is not a numeric array or a number
        (strings, booleans).
    """
    check_weights(params)
    leaves = jax.tree_util.tree_leaves_with_path(params)
    for path, leaf in leaves:
        numeric = (jnp.issubdtype(leaf.dtype, jnp.number) if hasattr(leaf, "dtype") else
                   isinstance(leaf, (int, float, complex)) and not isinstance(leaf, bool))
        if not numeric:  # strings, booleans, objects: not weights (bfloat16 is a number)
            raise ValueError(f"{_leaf_name(path, 'params')} ({type(leaf).__name__}) is not a "
                             "numeric array or a number; pass the weights alone "
                             "(ntk_tt.from_nnx(model) returns them).")
    return int(sum(np.size(leaf) for _, leaf in leaves))


def check_model(apply_fn: ApplyFn, params: Any, x: Any, *, name: str = "x") -> tuple[int, int]:
    """Validate ``params``, ``x`` and ``apply_fn``'s output shape before any heavy work.

    Shapes are traced (``jax.eval_shape``); finiteness is checked on the concrete arrays.
    ``apply_fn`` must treat every sample independently (the kernel is built sample by sample,
    fine-tuning runs on batches): when N ≥ 2, one forward pass on the first ≤ 4 samples of
    ``x``, together and one at a time, must agree up to float rounding (a single sample is
    its own batch: only shapes are traced), and a batch of one must give logits of shape
    (1, C). Models in training mode (batch statistics, dropout) or that centre, normalise
    or squeeze over the batch fail this; use eval mode (:func:`from_nnx` does).

    Args:
      apply_fn: ``apply_fn(params, x) -> logits``.
      params: parameter pytree.
      x: inputs, shape (N, ...) with at least 2 dimensions.
      name: how ``x`` is called in error messages.

    Returns:
      ``(N, C)``.

    Raises:
      ValueError: ``apply_fn`` not callable; ``x`` or a ``params`` leaf traced (under
        ``jax.jit`` / ``vmap`` / ``grad``); ``x`` not an array of numbers (nested lists
        of numbers are accepted), of rank < 2 or empty; non-finite entries in ``x`` or
        ``params``; a ``params`` leaf that is not a float array (integer, boolean or
        complex); ``params`` with no parameters;
        ``apply_fn`` failing on inputs of ``x``'s shape (e.g. a wrong feature size) or on
        ``params`` (a pytree not the one ``apply_fn`` was built with: the message names
        both), its output not one array (a tuple, a dict) or not of shape (N, C), or
        samples of one batch not independent.
    """
    check_function(apply_fn)
    traced = [what for what, tree in ((name, x), ("params", params))
              if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(tree))]
    if not traced and isinstance(jnp.zeros(()) + 0, jax.core.Tracer):  # staged: inside jit
        traced = ["the call"]
    if traced:  # np.asarray below: a TracerArrayConversionError from deep inside
        raise ValueError(
            f"{' and '.join(traced)} traced (inside jax.jit, vmap or grad): the model, its "
            "inputs and weights are checked as concrete arrays before any kernel is built; "
            "call this outside the transformation and transform what it returns instead (e.g. "
            "mv = ntk_vector_product(apply_fn, params, x) outside, then jax.jit(mv)).")
    x = as_array(x, name)
    if np.ndim(x) < 2:
        raise ValueError(
            f"{name} must be a batch of inputs with shape (N, ...) and at least 2 dimensions, "
            f"got shape {np.shape(x)}; add a batch axis, e.g. {name}[None]."
        )
    n = int(np.shape(x)[0])
    if n == 0:
        raise ValueError(f"{name} is empty (N = 0); pass at least one input.")
    if not np.isfinite(np.asarray(x)).all():  # numpy: no compile per shape
        raise ValueError(f"{name} contains NaN or inf; clean or re-normalise the inputs.")
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        where = _leaf_name(path)
        if not jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
            raise ValueError(
                f"{where} has dtype "
                f"{jnp.result_type(leaf)}: the NTK and fine-tuning differentiate every leaf "
                "of params, so every leaf must be a float array; keep integer constants "
                "(counts, indices) out of params, e.g. closed over in apply_fn."
            )
        if not np.isfinite(np.asarray(leaf)).all():
            raise ValueError(
                f"{where} contains NaN or inf; load a valid checkpoint or re-initialise.")
    if num_params(params) == 0:
        raise ValueError(
            "params holds no parameters (D = 0 numbers; got "
            f"{type(params).__name__} with {len(jax.tree_util.tree_leaves(params))} leaves): "
            "the NTK and fine-tuning differentiate params, so pass the trainable parameters "
            "apply_fn uses (ntk_tt.from_nnx(model) returns them), not an empty pytree.")
    try:
        out = jax.eval_shape(apply_fn, params,
                             jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x)))
    except (TypeError, ValueError) as err:  # e.g. a layer seeing the wrong feature size
        why = str(err).strip().rstrip(".") or type(err).__name__  # its own period: not twice
        raise ValueError(
            f"apply_fn(params, {name}) fails on {name} of shape {np.shape(x)}: {why}. Check "
            f"that {name} has the input shape the model was built for (the per-sample shape "
            "after the batch axis, e.g. (32, 32, 3) for the shipped checkpoint), or that "
            "params is the pytree apply_fn was built with (from_nnx returns both)."
        ) from err
    if not isinstance(out, jax.ShapeDtypeStruct):  # a tuple, a dict of heads, ...
        raise ValueError(
            f"apply_fn(params, {name}) must return one array of logits (N, C), got a "
            f"{type(out).__name__} ({jax.tree_util.tree_structure(out)}); return the logits "
            "alone (e.g. wrap the model: lambda p, x: apply_fn(p, x)[0]).")
    if len(out.shape) != 2 or out.shape[0] != n:
        raise ValueError(
            f"apply_fn(params, {name}) must return logits of shape (N, C) = ({n}, C), got "
            f"{tuple(out.shape)}; flatten extra output axes or return one row per input."
        )
    c = int(out.shape[1])
    _check_per_sample(apply_fn, params, x, name, c)
    return n, c


def _together_and_alone(apply_fn: ApplyFn, params: Any, xs: jax.Array):
    """Logits of ``xs`` as one batch and one sample at a time (one compiled call: eager
    op-by-op dispatch compiled every primitive apart, ~3 s for a small CNN). A
    ``jax.tree_util.Partial`` model is passed as a pytree (its bound arrays traced: one
    program for every value of them), any other callable as a static argument."""
    if isinstance(apply_fn, jax.tree_util.Partial):
        return _together_and_alone_traced(apply_fn, params, xs)
    return _together_and_alone_static(apply_fn, params, xs)


def _both(apply_fn, params, xs):
    return apply_fn(params, xs), jax.vmap(lambda xi: apply_fn(params, xi[None])[0])(xs)


_together_and_alone_static = jax.jit(_both, static_argnums=0)
_together_and_alone_traced = jax.jit(_both)


def _check_per_sample(apply_fn: ApplyFn, params: Any, x: Any, name: str, c: int) -> None:
    """ValueError unless ``apply_fn`` maps each of ``x[:4]`` to the same logits alone as in a
    batch (relative tolerance √eps of the logits' dtype; both computed at the "highest" matmul
    precision) and a batch of one to shape (1, C)."""
    one = jax.ShapeDtypeStruct((1, *np.shape(x)[1:]), jnp.result_type(x))
    try:
        shape = tuple(jax.eval_shape(apply_fn, params, one).shape)
    except (TypeError, ValueError) as err:
        shape = f"an error ({type(err).__name__})"
    if shape != (1, c):
        raise ValueError(
            f"apply_fn(params, {name}[:1]) gives {shape}, not logits of shape (1, {c}): apply_fn "
            "must map each sample independently, a batch of one included (do not squeeze the "
            "batch axis); the NTK is computed one sample at a time."
        )
    if np.shape(x)[0] == 1:  # one sample alone is the batch itself: nothing to compare (and
        return  # the two eager passes cost more than a 1-sample kernel, e.g. feature_mixing's)
    # at full float32 matmul precision: a GPU's default (TF32) rounds a batch's and a single
    # sample's products differently by ~1e-3 of the logits (seen on an H200 at re-linearised
    # weights), which is not coupling; this check is about the model's structure
    with jax.default_matmul_precision("highest"):
        together, alone = map(np.asarray,
                              _together_and_alone(apply_fn, params, jnp.asarray(x[:4])))
    if not (np.all(np.isfinite(together)) and np.all(np.isfinite(alone))):
        raise ValueError(f"apply_fn(params, {name}[:{len(together)}]) returns NaN or inf logits: "
                         "check the weights (a diverged or corrupt checkpoint) and the inputs' "
                         "normalisation.")
    diff = float(np.max(np.abs(together - alone)))
    scale = float(np.max(np.abs(together)) + np.max(np.abs(alone)))
    if not diff <= np.sqrt(np.finfo(together.dtype).eps) * scale:
        raise ValueError(
            f"apply_fn couples the samples of a batch: the logits of {name}[:{len(together)}] "
            f"computed together differ from those computed one sample at a time (max difference "
            f"{diff:.3g}); the NTK is computed per sample, so apply_fn must treat every sample "
            "independently: eval mode (frozen batch-norm statistics, no dropout), no statistics "
            "over the batch (e.g. centring the inputs)."
        )


def _empty_array(jaxpr) -> tuple[int, ...] | None:
    """The shape of the first array with no elements that ``jaxpr`` (or one nested in its
    equations' parameters) computes, or None."""
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            if 0 in getattr(var.aval, "shape", ()):
                return tuple(var.aval.shape)
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else (value,):
                sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's Jaxpr
                found = _empty_array(sub) if hasattr(sub, "eqns") else None
                if found is not None:
                    return found
    return None


def input_shape_problem(apply_fn: ApplyFn, params: Any, input_shape) -> str | None:
    """Why ``apply_fn`` cannot map one input of ``input_shape`` (H, W, C) to logits, found by
    tracing alone (``jax.make_jaxpr`` on abstract arrays: nothing computed or compiled), or
    None: it fails on such an input, returns no (1, C) logits, or shrinks it to an array with
    no elements (an input too small for the layers' pooling: a mean over it is NaN); then the
    smallest square side that works, up to 64 px, is named. Raises nothing: ``apply_fn``'s
    own error is the answer."""
    def problem(shape) -> tuple[str, bool] | None:
        x = jax.ShapeDtypeStruct((1, *shape), jnp.float32)
        try:
            closed = jax.make_jaxpr(apply_fn)(params, x)
        except Exception as err:  # any layer's error: the caller words the one line
            return f"it fails on it ({reason(err)})", False
        empty = _empty_array(closed.jaxpr)
        if empty is not None:
            return (f"its layers shrink it to an empty array of shape {empty}, so every logit "
                    "would be NaN"), True
        out = [tuple(a.shape) for a in closed.out_avals]
        if len(out) != 1 or len(out[0]) != 2 or out[0][0] != 1:
            return f"it returns arrays of shapes {out}, not logits of shape (1, C)", False
        return None

    found = problem(input_shape)
    if found is None or not found[1]:
        return found and found[0]
    h, w, c = input_shape
    side = next((s for s in range(2, 65) if problem((max(h, s), max(w, s), c)) is None), None)
    return found[0] + (f"; inputs of at least {side}×{side} px work" if side else "")
