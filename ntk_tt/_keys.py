"""The one check of a ``jax.random`` key every function that draws takes (a base module:
``ntk_tt.models.replace_head`` uses it too; re-exported by ``ntk_tt.data._inputs``)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._options import _describe


def check_key(key: Any, name: str = "key") -> None:
    """ValueError unless ``key`` is None, a single typed ``jax.random.key(seed)`` (shape ())
    or a raw uint32 (2,) ``jax.random.PRNGKey(seed)`` (concrete or traced)."""
    if key is None:
        return
    # an array's dtype only: flax's nnx.Rngs answers any attribute with a stream (a fresh user's
    # key=nnx.Rngs(0) was a raw TypeError)
    dtype = key.dtype if isinstance(key, (jax.Array, np.ndarray, np.generic)) else None
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        if np.shape(key) != ():
            raise ValueError(
                f"{name} must be a single jax random key, got an array of {np.size(key)} keys "
                f"(shape {np.shape(key)}, e.g. from jax.random.split); pass one of them, "
                f"e.g. {name}=keys[0], or jax.vmap over the keys.")
        return
    if dtype is not None and jnp.dtype(dtype) == jnp.uint32 and np.shape(key) == (2,):
        return
    if dtype is not None and jnp.dtype(dtype) == jnp.uint32 and np.shape(key)[-1:] == (2,):
        raise ValueError(
            f"{name} must be a single jax random key, got {np.size(key) // 2} raw keys (shape "
            f"{np.shape(key)}, e.g. from jax.random.split(jax.random.PRNGKey(seed))); pass "
            f"one of them, e.g. {name}=keys[0], or jax.vmap over the keys.")
    raise ValueError(
        f"{name} must be a jax random key, got {_describe(key)}"
        + (f" with dtype {dtype}" if dtype is not None else "")
        + f"; pass {name}=jax.random.key(seed)"
        + (" (an nnx.Rngs draws one when called: rngs())"
           if type(key).__name__ in ("Rngs", "RngStream") else "") + ".")
