"""Real fine-tuning with optax, recorded the way the predictor reports its curves.

The baseline every prediction is compared against (paper Sec. 5). Conventions are those of the
predictor (dynamics issue): loss = mean over the batch of :func:`ntk_tt._losses.per_sample_loss`;
optimiser = ``optax.sgd(learning_rate, momentum, nesterov)``; minibatches =
:func:`ntk_tt.batch_indices` for the same key; curves have ``steps + 1`` entries, index t =
the full-training-set loss / error after t updates (not the minibatch loss).

:func:`finetune_core` is pure and jittable with array hyperparameters, so a sweep is
``jit(vmap(...))``; :func:`finetune` is the eager entry point that validates and times.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ntk_tt._batches import batch_indices
from ntk_tt._losses import check_loss, error_rate, mean_loss
from ntk_tt._model import ApplyFn, check_model

DIVERGENCE_FACTOR = 10.0
TIMING_STEPS = 5


class FineTuneTrace(NamedTuple):
    """Output of :func:`finetune_core` (add a leading axis per ``vmap``).

    loss, error: (T+1,) full-training-set mean loss and error rate; after divergence they hold
      the last value before it. diverged_at: int32, the first step whose loss was non-finite or
      above 10·L_0, or −1. params: the final (last non-diverged) parameters. logits: (N, C) at
      those parameters. test_logits: (M, C) or None. trajectory: (T+1, N, C) logits or None.
    """

    loss: jax.Array
    error: jax.Array
    diverged_at: jax.Array
    params: Any
    logits: jax.Array
    test_logits: jax.Array | None
    trajectory: jax.Array | None


def _where(pred, a, b):
    return jax.tree.map(lambda u, v: jnp.where(pred, u, v), a, b)


def finetune_core(apply_fn: ApplyFn, params: Any, x: jax.Array, y: jax.Array,
                  batches: jax.Array, learning_rate: jax.Array, momentum: jax.Array, *,
                  nesterov: bool = False, loss: str = "cross_entropy",
                  x_test: jax.Array | None = None, record_logits: bool = False) -> FineTuneTrace:
    """Pure, jittable fine-tuning: T steps of ``optax.sgd`` over a given batch sequence.

    Update (optax): ``u ← m·u + g``; ``w ← w − η·u`` (heavy ball) or ``w ← w − η·(g + m·u)``
    (Nesterov), with ``g = ∇_w mean_{i∈B_t} ℓ(f(x_i; w), y_i)``. Once the full-set loss is
    non-finite or exceeds ``10·L_0`` the run is frozen (``lax.cond``: no more work unless
    vmapped) and ``diverged_at`` records the step.

    Args:
      apply_fn: ``apply_fn(params, x) -> logits`` (N, C); static under ``jit``.
      params: initial parameters w0.
      x, y: training inputs (N, ...) and integer labels (N,).
      batches: int32 (T, B) indices, e.g. ``ntk_tt.batch_indices(key, N, B, T)``.
      learning_rate, momentum: scalar arrays η > 0 and m ∈ [0, 1) (traced: vmappable).
      nesterov, loss, record_logits: static.
      x_test: optional held-out inputs (M, ...), evaluated at the final parameters.

    Returns:
      :class:`FineTuneTrace`.
    """
    opt = optax.sgd(learning_rate, momentum, nesterov=nesterov)

    def evaluate(p):
        f = apply_fn(p, x)
        return mean_loss(f, y, loss), error_rate(f, y).astype(f.dtype), f

    def train(p, s, idx):
        g = jax.grad(lambda q: mean_loss(apply_fn(q, x[idx]), y[idx], loss))(p)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s

    l0, e0, f0 = evaluate(params)

    def active(carry, idx, t):
        p, s, l_prev, e_prev, f_prev, _ = carry
        p2, s2 = train(p, s, idx)
        l2, e2, f2 = evaluate(p2)
        bad = ~jnp.isfinite(l2) | (l2 > DIVERGENCE_FACTOR * l0)
        return (_where(bad, p, p2), _where(bad, s, s2), jnp.where(bad, l_prev, l2),
                jnp.where(bad, e_prev, e2), jnp.where(bad, f_prev, f2),
                jnp.where(bad, t, -1).astype(jnp.int32))

    def body(carry, inputs):
        idx, t = inputs
        carry = jax.lax.cond(carry[5] >= 0, lambda c: c, lambda c: active(c, idx, t), carry)
        return carry, (carry[2], carry[3], carry[4] if record_logits else None)

    init = (params, opt.init(params), l0, e0, f0, jnp.int32(-1))
    steps = jnp.arange(1, batches.shape[0] + 1, dtype=jnp.int32)
    (p, _, _, _, f, div), (ls, es, fs) = jax.lax.scan(body, init, (batches, steps))
    return FineTuneTrace(
        loss=jnp.concatenate([l0[None], ls]), error=jnp.concatenate([e0[None], es]),
        diverged_at=div, params=p, logits=f,
        test_logits=None if x_test is None else apply_fn(p, x_test),
        trajectory=jnp.concatenate([f0[None], fs]) if record_logits else None,
    )


def _train_only(apply_fn, params, x, y, batches, learning_rate, momentum, *, nesterov, loss):
    """The same optimiser steps without any evaluation, to time one training step."""
    opt = optax.sgd(learning_rate, momentum, nesterov=nesterov)

    def body(carry, idx):
        p, s = carry
        g = jax.grad(lambda q: mean_loss(apply_fn(q, x[idx]), y[idx], loss))(p)
        u, s = opt.update(g, s, p)
        return (optax.apply_updates(p, u), s), None

    return jax.lax.scan(body, (params, opt.init(params)), batches)[0][0]


@dataclasses.dataclass(frozen=True)
class FineTuneRun:
    """Result of :func:`finetune`. Curves are numpy (steps+1,), index t = after t updates.

    ``seconds``: ``compile`` (both jitted functions, reported apart), ``run`` (the whole
    recorded run, training plus per-step full-set evaluation, which is measurement),
    ``finetune`` (training steps only: ``seconds_per_step`` × steps taken, the number compared
    with the prediction's time). ``logits``: (steps+1, N, C) trajectory when recorded.
    """

    loss: np.ndarray
    error: np.ndarray
    test_accuracy: float | None
    seconds_per_step: float
    seconds: dict[str, float]
    diverged: bool
    diverged_at: int | None
    learning_rate: float
    momentum: float
    nesterov: bool
    batch_size: int
    steps: int
    params: Any = dataclasses.field(repr=False)
    logits: np.ndarray | None = dataclasses.field(default=None, repr=False)


def _labels(y, n, c, name):
    y = np.asarray(y)
    if y.shape != (n,) or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"{name} must be integer class labels of shape ({n},), got "
                         f"{y.dtype} {y.shape}; pass labels, not one-hot rows.")
    if y.min() < 0 or y.max() >= c:
        raise ValueError(f"{name} must lie in [0, {c}) for a {c}-output model, got "
                         f"[{y.min()}, {y.max()}]; relabel or replace the head.")
    return jnp.asarray(y, jnp.int32)


def finetune(apply_fn: ApplyFn, params: Any, x: Any, y: Any, *, learning_rate: float,
             steps: int, batch_size: int | None = None, momentum: float = 0.0,
             nesterov: bool = False, loss: str = "cross_entropy", key: jax.Array | None = None,
             x_test: Any = None, y_test: Any = None, record_logits: bool = False) -> FineTuneRun:
    """Fine-tune for real with ``optax.sgd`` and record full-training-set curves (paper Sec. 5).

    Same conventions as :func:`ntk_tt.predict`: mean loss, optax SGD semantics, the batch
    sequence ``ntk_tt.batch_indices(key, N, B, steps)`` (GD, B = N, ignores ``key``), curves of
    ``steps + 1`` entries in units of optimiser steps. The time per step is measured on
    ``min(5, steps)`` warm training steps without evaluation; compile time is reported apart.

    Args:
      apply_fn, params: the model, e.g. from :func:`ntk_tt.from_nnx`.
      x: training inputs (N, ...); y: integer labels (N,).
      learning_rate: η > 0. steps: T ≥ 1. batch_size: B (None = N, gradient descent).
      momentum: m ∈ [0, 1); nesterov: optax's Nesterov form.
      loss: "cross_entropy" or "mse". key: ``jax.random`` key, required when B < N.
      x_test, y_test: optional held-out split for the final accuracy.
      record_logits: keep the (steps+1, N, C) logits trajectory (linearisation gap).

    Returns:
      :class:`FineTuneRun`. A run whose loss becomes non-finite or exceeds 10·L_0 stops there
      (``diverged=True``, ``diverged_at`` = that step) and its curves hold the last value.

    Raises:
      ValueError: bad shapes or labels, η ≤ 0, m ∉ [0, 1), steps < 1, B ∉ [1, N], missing key
        for SGD, unknown loss, x_test without y_test.
    """
    n, c = check_model(apply_fn, params, x)
    y = _labels(y, n, c, "y")
    check_loss(loss)
    if not (np.isfinite(learning_rate) and learning_rate > 0):
        raise ValueError(f"learning_rate must be a finite number > 0, got {learning_rate}.")
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}; use 0 for plain SGD.")
    if (x_test is None) != (y_test is None):
        raise ValueError("pass both x_test and y_test, or neither.")
    if x_test is not None:
        m, _ = check_model(apply_fn, params, x_test, name="x_test")
        y_test = _labels(y_test, m, c, "y_test")
    b = n if batch_size is None else int(batch_size)
    batches = batch_indices(key, n, b, steps)
    x = jnp.asarray(x)
    dtype = jnp.result_type(*jax.tree_util.tree_leaves(params))
    hyper = (jnp.asarray(learning_rate, dtype), jnp.asarray(momentum, dtype))
    statics = dict(nesterov=bool(nesterov), loss=loss)

    t0 = time.perf_counter()
    run_fn = jax.jit(lambda p, xx, yy, bb, lr, mm, xt: finetune_core(
        apply_fn, p, xx, yy, bb, lr, mm, x_test=xt, record_logits=record_logits, **statics)
    ).lower(params, x, y, batches, *hyper, x_test).compile()
    k = min(TIMING_STEPS, int(steps))
    time_fn = jax.jit(lambda p, xx, yy, bb, lr, mm: _train_only(
        apply_fn, p, xx, yy, bb, lr, mm, **statics)).lower(params, x, y, batches[:k], *hyper)
    time_fn = time_fn.compile()
    t1 = time.perf_counter()
    jax.block_until_ready(time_fn(params, x, y, batches[:k], *hyper))  # warm-up
    t2 = time.perf_counter()
    jax.block_until_ready(time_fn(params, x, y, batches[:k], *hyper))
    seconds_per_step = (time.perf_counter() - t2) / k
    t3 = time.perf_counter()
    trace = jax.block_until_ready(run_fn(params, x, y, batches, *hyper, x_test))
    t4 = time.perf_counter()

    div = int(trace.diverged_at)
    taken = int(steps) if div < 0 else div
    acc = None
    if x_test is not None and len(y_test):
        acc = float(jnp.mean(jnp.argmax(trace.test_logits, -1) == y_test))
    return FineTuneRun(
        loss=np.asarray(trace.loss), error=np.asarray(trace.error), test_accuracy=acc,
        seconds_per_step=seconds_per_step,
        seconds={"compile": t1 - t0, "timing": t3 - t1, "run": t4 - t3,
                 "finetune": seconds_per_step * taken},
        diverged=div >= 0, diverged_at=div if div >= 0 else None,
        learning_rate=float(learning_rate), momentum=float(momentum), nesterov=bool(nesterov),
        batch_size=b, steps=int(steps), params=trace.params,
        logits=None if trace.trajectory is None else np.asarray(trace.trajectory),
    )
