"""The minibatch sequence shared by the SGD predictor and real fine-tuning."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._options import MAX_STEPS, _is_int
from ntk_tt.data._inputs import check_key


def batch_indices(key: jax.Array | None, n: int, batch_size: int, steps: int) -> jax.Array:
    """Sample indices used at each optimiser step.

    Each epoch ``e`` draws a fresh permutation of ``range(n)`` from ``fold_in(key, e)``, takes
    consecutive batches of ``batch_size`` and drops the last incomplete batch. Gradient descent
    (``batch_size == n``) uses ``arange(n)`` at every step and ignores ``key``, so a GD run
    does not depend on the key.

    Source: ntk_tt's own: the index sets B_t of the exact minibatch recursion (METHOD.md §2),
    shared by the SGD predictor and :func:`ntk_tt.finetune` so both see the same batches.

    Args:
      key: a ``jax.random`` key; may be ``None`` only when ``batch_size == n``.
      n: number of training samples N.
      batch_size: B, with 1 ≤ B ≤ N.
      steps: number of optimiser updates T ≥ 1.

    Returns:
      int32 array of shape (steps, batch_size); row t holds the batch of update t + 1.

    Raises:
      ValueError: n, B or steps not an int (a bool included), B < 1 or B > N, steps < 1, or
        ``key`` missing or not a jax random key for SGD (B < N).
    """
    if _check(key, n, batch_size, steps):
        return jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (steps, n))
    return _epoch_batches(key[None], int(n), int(batch_size), int(steps))[0]


def _check(key, n, batch_size, steps) -> bool:
    """:func:`batch_indices`' ValueErrors; True for gradient descent (B = N)."""
    for name, value in (("n", n), ("batch_size", batch_size), ("steps", steps)):
        if not _is_int(value):
            raise ValueError(f"{name} must be an int, got {value!r}.")
    if n < 1:
        raise ValueError(f"n (the number of training samples N) must be >= 1, got {n}.")
    if not 1 <= batch_size <= n:
        raise ValueError(
            f"batch_size must satisfy 1 <= batch_size <= N = {n}, got {batch_size}; "
            "use batch_size=None (or N) for full-batch gradient descent."
        )
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}.")
    if batch_size == n:
        return True
    if key is None:
        raise ValueError(
            f"minibatches (batch_size {batch_size} < N = {n}, SGD or Adam) need a key for "
            "their order: pass key=jax.random.key(seed)."
        )
    check_key(key)
    return False


def path_batch_indices(key: jax.Array, n: int, batch_size: int, steps: int,
                       num_paths: int) -> jax.Array:
    """The minibatch sequences of ``num_paths`` SGD paths: int32 (num_paths, steps, B).

    Path 0 is ``batch_indices(key, n, batch_size, steps)``, the order of a real run with
    ``key``; path p ≥ 1 is ``batch_indices(jax.random.split(key, num_paths)[p], ...)``. Equal
    to vmapping :func:`batch_indices` over those keys, but the (paths × epochs) permutations
    are drawn in one flat vmap: XLA:CPU compiles the nested vmap of the random bits 3× slower.

    Args:
      key: a ``jax.random`` key (typed or raw uint32 (2,)); n, batch_size (B < N), steps: as
        :func:`batch_indices`; num_paths: P ≥ 1.

    Raises:
      ValueError: as :func:`batch_indices`.
    """
    if _check(key, n, batch_size, steps):
        raise ValueError("path_batch_indices is for SGD (batch_size < N); GD has one path.")
    n, batch_size, steps = int(n), int(batch_size), int(steps)
    if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)
    keys = jnp.concatenate([key[None], jax.random.split(key, num_paths)[1:]])
    return _epoch_batches(keys, n, batch_size, steps)


def _epoch_batches(keys: jax.Array, n: int, batch_size: int, steps: int) -> jax.Array:
    """(P, steps, B) batches for typed or raw keys (P,): epoch e of path p permutes
    range(n) with ``fold_in(keys[p], e)``; the P·E permutations are drawn in one vmap."""
    per_epoch = n // batch_size
    epochs = -(-steps // per_epoch)
    folded = jax.vmap(lambda k: jax.vmap(lambda e: jax.random.fold_in(k, e))(
        jnp.arange(epochs)))(keys)
    flat = folded.reshape((-1, *folded.shape[2:]))  # raw keys keep their trailing (2,)
    perms = jax.vmap(lambda k: jax.random.permutation(k, n))(flat)
    batches = perms[:, : per_epoch * batch_size].reshape(keys.shape[0], epochs * per_epoch,
                                                         batch_size)
    return batches[:, :steps].astype(jnp.int32)


def check_sizes(steps, batch_size, n: int) -> None:
    """The predictors' ValueErrors for ``steps`` not an int in [1, MAX_STEPS] or ``batch_size``
    (None: GD) not an int in [1, N]; a traced one (jit / vmap / grad over it) is said to be
    static (a fresh user's vmap over B was told that B must be in [1, N])."""
    for name, value in (("steps", steps), ("batch_size", batch_size)):
        if isinstance(value, jax.core.Tracer):
            raise ValueError(f"{name} cannot be traced (jit / vmap / grad over it): it sets the "
                             "recursion's shapes (updates, minibatch size); call once per "
                             f"{name} value and sweep learning_rate and momentum inside.")
    if n < 1:
        raise ValueError(f"no training samples: N = {n} (an empty kernel, x or y); give at "
                         "least one example.")
    if (isinstance(steps, bool) or not _is_int(steps) or steps < 1 or steps > MAX_STEPS):
        raise ValueError(f"steps must be an int >= 1 and <= {MAX_STEPS:,} (optimiser updates), "
                         f"got {steps!r}{_array_hint('steps', steps)}.")
    if batch_size is not None and not (_is_int(batch_size) and 1 <= batch_size <= n):
        raise ValueError(
            f"batch_size must satisfy 1 <= batch_size <= N = {n} (an int), got {batch_size!r}"
            f"{_array_hint('batch_size', batch_size)}; use batch_size=None for full-batch "
            "gradient descent."
        )


def _array_hint(name: str, value) -> str:
    """For a JAX / NumPy array given as ``steps`` or B (whose value may be in range: a fresh
    user's jnp.array(10) was told to be in [1, N]): the type is what is refused."""
    if not isinstance(value, (jax.Array, np.ndarray)):
        return ""
    return (f" (an array, not an int: {name} is static, it sets the recursion's shapes; pass "
            f"int({name}))")
