"""Ahead-of-time compilation shared by the sweep's predictions and fine-tunes, and timing."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp


def _timed(fn, *args):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - t0


_COMPILED: dict = {}


def _compiled(name, fn, *args):
    """``jit(fn)`` compiled ahead of time for ``args``, cached by ``name`` and argument shapes.

    ``name`` must identify ``fn`` with its static settings (and the model's ``apply_fn``), so
    tasks of equal shapes reuse one executable. Returns (compiled, compile seconds; 0 on reuse).
    """
    shapes = jax.tree.map(lambda a: (jnp.shape(a), jnp.result_type(a)), args)
    key = (name, str(jax.tree.structure(args)), str(shapes))
    if key in _COMPILED:
        return _COMPILED[key], 0.0
    t0 = time.perf_counter()
    _COMPILED[key] = jax.jit(fn).lower(*args).compile()
    return _COMPILED[key], time.perf_counter() - t0
