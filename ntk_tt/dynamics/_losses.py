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
import numpy as np

from ntk_tt._options import LOSSES as LOSSES  # one list, importable without JAX
from ntk_tt._options import check_loss as check_loss


def _checked(logits, y) -> tuple[jax.Array, jax.Array]:
    """``(logits, y)`` as arrays after ValueErrors, before any work, for logits not (N, C)
    real numbers or labels not integers of shape (N,); labels outside [0, C) are refused when
    concrete (traced labels, under ``jit`` / ``vmap`` / ``grad``, pass unchecked: the shapes
    and dtypes are static, the values are not)."""
    concrete = not isinstance(y, jax.core.Tracer)  # of the input: inside jit, asarray traces
    labels = np.asarray(y) if concrete else None
    logits, y = jnp.asarray(logits), jnp.asarray(y)
    if logits.ndim != 2 or not jnp.issubdtype(logits.dtype, jnp.floating):
        raise ValueError(f"logits must be a float array of shape (N, C) (one row of C logits per "
                         f"sample), got shape {logits.shape} and dtype {logits.dtype}; for one "
                         "sample pass logits[None] and y[None].")
    n, c = logits.shape
    if y.shape != (n,) or not jnp.issubdtype(y.dtype, jnp.integer):
        hint = ("pass class indices, not one-hot vectors" if y.ndim == 2 else
                "pass integer class indices, e.g. y.astype(jnp.int32)" if not
                jnp.issubdtype(y.dtype, jnp.integer) else f"give one label per row ({n} rows)")
        raise ValueError(f"y must be integer class labels of shape ({n},) matching the logits "
                         f"({n}, {c}), got shape {y.shape} and dtype {y.dtype}; {hint}.")
    if labels is not None and n:  # NumPy, not jnp: no op staged into an enclosing jit
        lo, hi = int(labels.min()), int(labels.max())
        if lo < 0 or hi >= c:
            raise ValueError(f"y has labels outside [0, C) = [0, {c}) (min {lo}, max {hi}): "
                             f"the logits have C = {c} classes, so a label must be an index "
                             "0 … C − 1 of one of them.")
    return logits, y


def per_sample_loss(logits: jax.Array, y: jax.Array, loss: str) -> jax.Array:
    """Per-sample loss ℓ_i (module docstring), shape (N,), from logits (N, C) and integer
    labels (N,); in nats for cross-entropy.

    Raises:
      ValueError: an unknown ``loss`` (the known ones named); logits not a float (N, C)
        array, labels not integers of shape (N,), or (concrete labels only) a label outside
        [0, C).
    """
    check_loss(loss)
    logits, y = _checked(logits, y)
    c = logits.shape[-1]
    if loss == "cross_entropy":  # 0 − log p: a loss that rounds to 0 is +0.0, not −0.0
        return 0.0 - jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=-1)[:, 0]
    return 0.5 * jnp.sum((logits - jax.nn.one_hot(y, c, dtype=logits.dtype)) ** 2, axis=-1)


def mean_loss(logits: jax.Array, y: jax.Array, loss: str) -> jax.Array:
    """Mean loss over the N samples, L = (1/N) Σ_i ℓ_i (module docstring; METHOD.md,
    Notation): cross-entropy ℓ_i = −log softmax(f_i)_{y_i} (nats), MSE ℓ_i =
    ½‖f_i − onehot(y_i)‖² summed over the C outputs (not divided by C). The loss that
    :func:`ntk_tt.finetune` trains on and :func:`ntk_tt.predict` predicts. Usable under
    ``jit`` / ``vmap`` / ``grad`` (there the labels' values are not checked).

    Source: METHOD.md, Notation (one loss convention, mean over samples, for the predictor
    and the real run); the normalisation is ntk_tt's (module docstring).

    Args:
      logits: f, float (N, C), one row of C logits per sample.
      y: integer class labels (N,), in [0, C).
      loss: "cross_entropy" or "mse".

    Returns:
      L, a scalar (shape ()) array in the logits' dtype.

    Raises:
      ValueError: an unknown ``loss``; logits not a float (N, C) array; labels not integers
        of shape (N,) (one-hot rows included); concrete labels outside [0, C).
    """
    return jnp.mean(per_sample_loss(logits, y, loss))


def error_rate(logits: jax.Array, y: jax.Array) -> jax.Array:
    """Fraction of the N samples whose arg-max logit is not the label, (1/N) Σ_i
    [argmax_c f_ic ≠ y_i] (1 − accuracy; ties go to the lowest class, as ``jnp.argmax``).
    The error curve of :func:`ntk_tt.predict` and :func:`ntk_tt.finetune`. Usable under
    ``jit`` / ``vmap`` (labels' values unchecked there).

    Source: Zancato et al. 2020 (arXiv 2008.12478), Sec. 5, Alg. 1 (T_ε on the training
    error as well as the loss); METHOD.md §6.

    Args:
      logits: f, float (N, C).
      y: integer class labels (N,), in [0, C).

    Returns:
      The error rate, a scalar (shape ()) float array in [0, 1]: float64 for float64 logits,
      else float32 (``jnp.mean`` of booleans alone is float32 even under x64).

    Raises:
      ValueError: logits not a float (N, C) array; labels not integers of shape (N,);
        concrete labels outside [0, C) (a label no arg-max can equal).
    """
    logits, y = _checked(logits, y)
    dtype = jnp.promote_types(logits.dtype, jnp.float32)  # float64 kept, bf16/f16 → float32
    return jnp.mean((jnp.argmax(logits, axis=-1) != y).astype(dtype))


def logit_residual(logits: jax.Array, y: jax.Array, loss: str) -> jax.Array:
    """Per-sample gradient ``∂ℓ_i/∂f_i``, shape (N, C) (no 1/N factor).

    Cross-entropy: ``softmax(f_i) − onehot(y_i)``; MSE: ``f_i − onehot(y_i)``. The gradient of
    the mean loss over a set of n samples is this divided by n. ``logits`` (N, C) float,
    ``y`` (N,) integer labels in [0, C), not checked here (the predictors' hot loops; their
    entry points check the labels, :func:`ntk_tt.dynamics._checks.check_labels`).

    Raises:
      ValueError: an unknown ``loss`` (the known ones named).
    """
    c = logits.shape[-1]
    onehot = jax.nn.one_hot(y, c, dtype=logits.dtype)
    if loss == "cross_entropy":
        return jax.nn.softmax(logits) - onehot
    if loss == "mse":
        return logits - onehot
    raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}.")
