"""Loss conventions shared by the predictor and real fine-tuning (dynamics issue).

Loss = mean over the N samples of the per-sample loss:

* cross-entropy: ``-log softmax(f(x))_y``;
* MSE: ``½‖f(x) − onehot(y)‖²`` summed over the C outputs.

Keeping one definition here keeps η's meaning identical in the prediction and in the real run
(METHOD.md, Notation).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ntk_tt._options import LOSSES as LOSSES  # one list, importable without JAX
from ntk_tt._options import check_loss as check_loss


def per_sample_loss(logits: jax.Array, y: jax.Array, loss: str) -> jax.Array:
    """Per-sample loss, shape (N,), from logits (N, C) and integer labels (N,)."""
    c = logits.shape[-1]
    if loss == "cross_entropy":  # 0 − log p: a loss that rounds to 0 is +0.0, not −0.0
        return 0.0 - jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=-1)[:, 0]
    if loss == "mse":
        return 0.5 * jnp.sum((logits - jax.nn.one_hot(y, c, dtype=logits.dtype)) ** 2, axis=-1)
    raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}.")


def mean_loss(logits: jax.Array, y: jax.Array, loss: str) -> jax.Array:
    """Mean loss over the samples: a scalar."""
    return jnp.mean(per_sample_loss(logits, y, loss))


def error_rate(logits: jax.Array, y: jax.Array) -> jax.Array:
    """Fraction of samples whose arg-max logit is not the label: a scalar in [0, 1]."""
    return jnp.mean(jnp.argmax(logits, axis=-1) != y)


def logit_residual(logits: jax.Array, y: jax.Array, loss: str) -> jax.Array:
    """Per-sample gradient ``∂ℓ_i/∂f_i``, shape (N, C) (no 1/N factor).

    Cross-entropy: ``softmax(f_i) − onehot(y_i)``; MSE: ``f_i − onehot(y_i)``. The gradient of
    the mean loss over a set of n samples is this divided by n.
    """
    c = logits.shape[-1]
    onehot = jax.nn.one_hot(y, c, dtype=logits.dtype)
    if loss == "cross_entropy":
        return jax.nn.softmax(logits) - onehot
    if loss == "mse":
        return logits - onehot
    raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}.")
