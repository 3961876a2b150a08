"""Ahead-of-time compiled executables, reused across calls of equal shapes.

``jax.jit(f).lower(*args).compile()`` traces and compiles on every call; a loop of
:func:`ntk_tt.finetune` calls on one model (a hyperparameter sweep, the telemetry corpus)
would pay seconds of compilation per run for the same program. :func:`compiled` keeps the
executables of the last :data:`MAX_ENTRIES` (function, static arguments, argument shapes and
dtypes, tree structure) combinations, so a repeated call compiles nothing and reports 0 s.
"""

from __future__ import annotations

import collections
import time

import jax
import jax.numpy as jnp

MAX_ENTRIES = 64
_CACHE: collections.OrderedDict = collections.OrderedDict()


def _signature(args) -> tuple:
    leaves, tree = jax.tree_util.tree_flatten(args)
    return (str(tree), tuple((jnp.shape(a), str(jnp.result_type(a)),
                              str(getattr(a, "sharding", ""))) for a in leaves))


def compiled(jitted, *args, static: tuple = (), **static_kw):
    """``jitted.lower(*static, *args, **static_kw).compile()``, cached.

    Args:
      jitted: a ``jax.jit`` function whose static arguments are the leading positional
        ``static`` ones (hashable: e.g. the model's ``apply_fn``) and ``static_kw``.
      args: its traced arguments (arrays or pytrees of arrays; only their shapes, dtypes,
        shardings and tree structure enter the key).

    Returns:
      (executable taking ``*args``, compile seconds: 0.0 when reused).
    """
    key = (jitted, static, tuple(sorted(static_kw.items())), _signature(args))
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit, 0.0
    t0 = time.perf_counter()
    exe = jitted.lower(*static, *args, **static_kw).compile()
    seconds = time.perf_counter() - t0
    _CACHE[key] = exe
    while len(_CACHE) > MAX_ENTRIES:
        _CACHE.popitem(last=False)
    return exe, seconds
