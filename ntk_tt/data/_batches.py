"""The minibatch sequence shared by the SGD predictor and real fine-tuning."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def batch_indices(key: jax.Array | None, n: int, batch_size: int, steps: int) -> jax.Array:
    """Sample indices used at each optimiser step.

    Each epoch ``e`` draws a fresh permutation of ``range(n)`` from ``fold_in(key, e)``, takes
    consecutive batches of ``batch_size`` and drops the last incomplete batch. Gradient descent
    (``batch_size == n``) uses ``arange(n)`` at every step and ignores ``key``, so a GD run
    does not depend on the key.

    Args:
      key: a ``jax.random`` key; may be ``None`` only when ``batch_size == n``.
      n: number of training samples N.
      batch_size: B, with 1 ≤ B ≤ N.
      steps: number of optimiser updates T ≥ 1.

    Returns:
      int32 array of shape (steps, batch_size); row t holds the batch of update t + 1.

    Raises:
      ValueError: B < 1 or B > N, steps < 1, or ``key`` missing for SGD (B < N).
    """
    n, batch_size, steps = int(n), int(batch_size), int(steps)
    if not 1 <= batch_size <= n:
        raise ValueError(
            f"batch_size must satisfy 1 <= batch_size <= N = {n}, got {batch_size}; "
            "use batch_size=None (or N) for full-batch gradient descent."
        )
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}.")
    if batch_size == n:
        return jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (steps, n))
    if key is None:
        raise ValueError(
            "SGD (batch_size < N) needs a key for the minibatch order: pass "
            "key=jax.random.key(seed)."
        )
    per_epoch = n // batch_size
    epochs = -(-steps // per_epoch)
    perms = jax.vmap(lambda e: jax.random.permutation(jax.random.fold_in(key, e), n))(
        jnp.arange(epochs)
    )
    batches = perms[:, : per_epoch * batch_size].reshape(epochs * per_epoch, batch_size)
    return batches[:steps].astype(jnp.int32)
