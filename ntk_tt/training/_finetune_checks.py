"""Argument checks of :func:`ntk_tt.finetune` and :func:`ntk_tt.step_time` (split from
:mod:`ntk_tt.training._finetune`): the labels, and the constant-η SGD shorthand's η and m.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ntk_tt.data._inputs import as_array, check_real
from ntk_tt.dynamics._checks import check_two_classes
from ntk_tt.dynamics._label_checks import cast_hint


def _labels(y, n, c, name):
    y = np.asarray(as_array(y, name))
    if y.shape != (n,) or not np.issubdtype(y.dtype, np.integer):
        hint = ("pass labels, not one-hot rows" if y.ndim == 2 else
                cast_hint(y) if y.shape == (n,) else
                f"give one label per input ({n} inputs)")
        raise ValueError(f"{name} must be integer class labels of shape ({n},), got "
                         f"{y.dtype} {y.shape}; {hint}.")
    if y.min() < 0 or y.max() >= c:
        raise ValueError(f"{name} must lie in [0, {c}) for a {c}-output model, got "
                         f"[{y.min()}, {y.max()}]; relabel or replace the head.")
    if name == "y" and c >= 2:  # C = 1: a one-output MSE fit (cross-entropy is refused)
        check_two_classes(y, name)
    return jnp.asarray(y, jnp.int32)


def _check_hyper(learning_rate, momentum) -> None:
    """η and m must be real scalars: ValueError naming the argument otherwise (an array, e.g.
    a per-step schedule, included)."""
    for name, value in (("learning_rate", learning_rate), ("momentum", momentum)):
        check_real(value, name)
        if np.ndim(value) != 0:
            raise ValueError(
                f"{name} must be a scalar, one value for every step; got an array of shape "
                f"{np.shape(value)}. For a per-step schedule use optimizer=ntk_tt.sgd("
                f"ntk_tt.schedule(...)); else a scalar, e.g. "
                f"{name}={0.01 if name == 'learning_rate' else 0.9}.")
