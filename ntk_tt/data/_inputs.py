"""Python inputs that are not arrays: convert the unambiguous ones, refuse the rest.

Every public entry point (``predict``, ``predict_from_kernel``, ``finetune``,
``empirical_ntk``) passes its array arguments, scalar hyperparameters and random key through
these helpers before any work. Error messages name the argument, its type and shape, never
its contents (a long list would flood the terminal).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_NUMERIC = "biuf"  # numpy dtype kinds of bool, int, unsigned and float arrays


def _describe(value: Any) -> str:
    shape = np.shape(value) if isinstance(value, (np.ndarray, jax.Array)) else None
    return type(value).__name__ + ("" if shape is None else f" of shape {shape}")


def as_array(value: Any, name: str) -> Any:
    """``value`` as an array: arrays (and tracers) unchanged, nested lists / tuples of numbers
    converted with ``np.asarray`` (ints stay ints: a list of labels becomes an int array).

    Raises:
      ValueError: a ragged list, a list of non-numbers, a string, a dict or another object.
    """
    if isinstance(value, (np.ndarray, jax.Array)):
        return value
    if not isinstance(value, (list, tuple)):
        raise ValueError(
            f"{name} must be an array (numpy or jax), got {_describe(value)}; convert it with "
            "np.asarray."
        )
    try:
        arr = np.asarray(value)
    except ValueError:
        raise ValueError(
            f"{name} is a ragged {type(value).__name__} (rows of different lengths, "
            f"{len(value)} at the top level); pass a rectangular array."
        ) from None
    if arr.dtype.kind not in _NUMERIC:
        raise ValueError(
            f"{name} must hold numbers, got a {type(value).__name__} of shape {arr.shape} "
            f"whose entries are not all numbers (numpy dtype {arr.dtype}); pass a numeric array."
        )
    return arr


def check_real(value: Any, name: str) -> None:
    """ValueError unless ``value`` is a real number (Python int/float, numpy or jax array of
    int/float dtype, or a tracer); strings such as ``"0.1"`` and booleans are refused."""
    dtype = getattr(value, "dtype", None)
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
            value, (bool, np.bool_)):
        return
    if dtype is not None and np.dtype(dtype).kind in "iuf":
        return
    raise ValueError(
        f"{name} must be a real number, got {_describe(value)}; pass e.g. {name}=0.1 (a float, "
        "not a string)."
    )


def check_key(key: Any, name: str = "key") -> None:
    """ValueError unless ``key`` is None, a typed ``jax.random.key(seed)`` or a raw uint32 (2,)
    ``jax.random.PRNGKey(seed)`` (concrete or traced)."""
    if key is None:
        return
    dtype = getattr(key, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return
    if dtype is not None and jnp.dtype(dtype) == jnp.uint32 and np.shape(key) == (2,):
        return
    raise ValueError(
        f"{name} must be a jax random key, got {_describe(key)}"
        + (f" with dtype {dtype}" if dtype is not None else "")
        + f"; pass {name}=jax.random.key(seed)."
    )
