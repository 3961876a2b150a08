"""SGD noise at the pre-trained weights (paper Sec. 4, "Computing the noise"; METHOD.md §2).

σ_w² is the per-parameter variance, over the N training samples, of the per-sample loss
gradients ∇_w ℓ_i(w0): the diagonal of Σ in eq. (3), estimated once. Function-space noise
features G = J·diag(σ_w)·P/√D' come from the sketch with ``param_scale = σ_w``, so
G Gᵀ ≈ J diag(σ_w²) Jᵀ; the SDE uses them as (η/√B)·G·dW'.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._options import _is_int
from ntk_tt.data._model import ApplyFn, check_model
from ntk_tt.dynamics._losses import check_loss, mean_loss


@partial(jax.jit, static_argnums=(0, 4))
def _add_sq_dev(apply_fn, params, xb, yb, loss, mean, total):
    """``total`` + Σ_i (∇_w ℓ_i − mean)² over a block of samples, per parameter (the running
    sum is added inside the program: no eager op per parameter leaf, each of which XLA would
    compile once per leaf shape)."""

    def one(xi, yi):
        return jax.grad(lambda p: mean_loss(apply_fn(p, xi[None]), yi[None], loss))(params)

    grads = jax.vmap(one)(xb, yb)
    return jax.tree.map(lambda t, g, m: t + jnp.sum((g - m) ** 2, axis=0), total, grads, mean)


@jax.jit
def _zeros(tree):
    """Zeros like ``tree``, one compiled program per tree structure (not per leaf shape)."""
    return jax.tree.map(jnp.zeros_like, tree)


@jax.jit
def _squared(tree):
    """``tree`` squared elementwise, one program per tree structure."""
    return jax.tree.map(jnp.square, tree)


@jax.jit
def _scaled(tree, scale):
    """``tree`` · ``scale``, one program per tree structure."""
    return jax.tree.map(lambda v: v * scale, tree)


@partial(jax.jit, static_argnums=(0, 4))
def _mean_grad(apply_fn, params, x, y, loss):
    """∇_w of the mean loss = the mean of the per-sample gradients."""
    return jax.grad(lambda p: mean_loss(apply_fn(p, x), y, loss))(params)


def gradient_variance(
    apply_fn: ApplyFn, params: Any, x, y, *, loss: str = "cross_entropy", block_size: int = 64
) -> Any:
    """Per-parameter variance σ_w² of the per-sample loss gradients at ``params`` (two-pass).

    Source: Zancato et al. 2020 (arXiv 2008.12478), Sec. 4 ("Computing the noise"): the
    diagonal of Σ in eq. (3); METHOD.md §2.

    Args:
      apply_fn, params: the model at the pre-trained weights w0.
      x: inputs (N, ...). y: integer labels (N,).
      loss: "cross_entropy" or "mse" (per-sample loss as in ``ntk_tt.dynamics._losses``).
      block_size: samples per vmapped per-sample-gradient block (memory: block_size × D).

    Returns:
      A pytree like ``params``: population variance (divided by N) of ∂ℓ_i/∂w.

    Raises:
      ValueError: bad model/inputs (see ``check_model``), labels of wrong shape or outside
        [0, C), unknown loss,
        ``block_size`` not an integer >= 1; all before any gradient.
    """
    check_loss(loss)
    if not _is_int(block_size) or block_size < 1:
        raise ValueError(f"block_size must be an integer >= 1 (samples per per-sample-gradient "
                         f"block), got {block_size!r}.")
    n, c = check_model(apply_fn, params, x)
    labels = np.asarray(y)
    if labels.shape != (n,):
        raise ValueError(f"y must be integer labels of shape ({n},), got {labels.shape}.")
    if labels.dtype.kind not in "iuf" or not np.all(
            (labels == np.floor(labels)) & (labels >= 0) & (labels < c)):
        raise ValueError(f"y must be integer class labels in [0, {c}) (the model has C = {c} "
                         "outputs); a label outside it has no logit, and its gradient would "
                         "be zero.")
    y = jnp.asarray(labels)
    x = jnp.asarray(x)
    mean = _mean_grad(apply_fn, params, x, y, loss)
    total = _scaled(mean, 0.0)  # zeros placed like the gradients (no second compilation)
    for start in range(0, n, block_size):
        total = _add_sq_dev(apply_fn, params, x[start:start + block_size],
                            y[start:start + block_size], loss, mean, total)
    return _scaled(total, 1.0 / n)


def noise_features(
    apply_fn: ApplyFn, params: Any, x, y, *, sketch_dim: int, key: jax.Array,
    loss: str = "cross_entropy",
) -> jax.Array:
    """Noise features G = J·diag(σ_w)·P/√D', shape (N·C, D'), sample-major rows.

    Uses :func:`ntk_tt.sketched_ntk` with ``param_scale = σ_w`` (Achlioptas directions drawn
    from ``key``); E[G Gᵀ] = J diag(σ_w²) Jᵀ, the paper's diagonal noise in function space.

    Source: Zancato et al. 2020 (arXiv 2008.12478), Sec. 4: eq. (3)'s diagonal noise through
    the random projection of the same section; METHOD.md §2, §5.

    Args:
      apply_fn, params: the model at the pre-trained weights w0.
      x: inputs (N, ...). y: integer labels (N,).
      sketch_dim: D' >= 1, the number of random directions (columns of G).
      key: a ``jax.random`` key drawing the directions P.
      loss: "cross_entropy" or "mse" (the per-sample loss of :func:`gradient_variance`).

    Returns:
      G (N·C, D'), rows sample-major (sample i's C logits together).

    Raises:
      ValueError: as :func:`gradient_variance` and ``sketched_ntk`` (``sketch_dim`` not an
        integer >= 1, ``key`` not a jax.random key: both before the gradients).
    """
    from ntk_tt import sketched_ntk
    from ntk_tt.kernels._sketch import _check_args

    _check_args(params, sketch_dim, key, "achlioptas", "auto", None)
    sigma = jax.tree.map(jnp.sqrt, gradient_variance(apply_fn, params, x, y, loss=loss))
    return sketched_ntk(apply_fn, params, x, sketch_dim=sketch_dim, key=key,
                        param_scale=sigma).features
