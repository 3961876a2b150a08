"""The pure, jittable fine-tuning step of :func:`ntk_tt.finetune` and its scan.

:func:`finetune_step` (one ``optax.sgd`` update + full-set measurement) is pure and jittable
with array hyperparameters; :func:`finetune_core` scans it, so a sweep is
``jit(vmap(...))``. Conventions: ``ntk_tt.training._finetune``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ntk_tt.data._model import ApplyFn
from ntk_tt.dynamics._divergence import divergence
from ntk_tt.dynamics._losses import error_rate, mean_loss


class FineTuneState(NamedTuple):
    """Carry of one fine-tuning step: parameters, optax state, the full-training-set loss,
    error and logits (N, C) at those parameters, and ``stopped_at`` (int32): the first step
    whose loss or parameters were non-finite, −1 while training goes on."""

    params: Any
    opt_state: Any
    loss: jax.Array
    error: jax.Array
    logits: jax.Array
    stopped_at: jax.Array


class FineTuneTrace(NamedTuple):
    """Output of :func:`finetune_core` (add a leading axis per ``vmap``).

    loss, error: (T+1,) full-training-set mean loss and error rate; from the first step whose
      loss or parameters were non-finite on, they hold the last finite values.
      diverged_at, spiked_at: int32 steps of :func:`ntk_tt.dynamics._divergence.divergence` (−1 for
      none): diverged = a non-finite step or L_T > L_0; spiked = loss above 10·L_0.
      params: the final (last finite) parameters. logits: (N, C) at
      those parameters. test_logits: (M, C) or None. trajectory: (T+1, N, C) logits or None.
      linear_trajectory: (T+1, N, C) outputs f_lin(w_t) = f(w0) + J(w_t − w0) of the
      linearised model (paper Sec. 3) at the same weights, or None.
    """

    loss: jax.Array
    error: jax.Array
    diverged_at: jax.Array
    spiked_at: jax.Array
    params: Any
    logits: jax.Array
    test_logits: jax.Array | None
    trajectory: jax.Array | None
    linear_trajectory: jax.Array | None


def _evaluate(apply_fn, params, x, y, loss):
    f = apply_fn(params, x)
    return mean_loss(f, y, loss), error_rate(f, y).astype(f.dtype), f


def train_step(apply_fn: ApplyFn, params: Any, opt_state: Any, x: jax.Array, y: jax.Array,
               idx: jax.Array, learning_rate: jax.Array, momentum: jax.Array, *,
               nesterov: bool = False, loss: str = "cross_entropy") -> tuple[Any, Any]:
    """One ``optax.sgd(learning_rate, momentum, nesterov)`` update on the minibatch ``idx``.

    ``g = ∇_w mean_{i∈idx} ℓ(f(x_i; w), y_i)``; heavy ball ``u ← m·u + g, w ← w − η·u``;
    Nesterov ``w ← w − η·(g + m·u)``. Returns ``(params, opt_state)``.
    """
    opt = optax.sgd(learning_rate, momentum, nesterov=nesterov)
    g = jax.grad(lambda q: mean_loss(apply_fn(q, x[idx]), y[idx], loss))(params)
    updates, opt_state = opt.update(g, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def init_state(apply_fn: ApplyFn, params: Any, x: jax.Array, y: jax.Array,
               momentum: jax.Array, *, loss: str = "cross_entropy") -> FineTuneState:
    """The state before any update (zero optax momentum, full-set loss L_0)."""
    l0, e0, f0 = _evaluate(apply_fn, params, x, y, loss)
    opt_state = optax.sgd(1.0, momentum).init(params)
    return FineTuneState(params, opt_state, l0, e0, f0, jnp.int32(-1))


def _verdict(loss: jax.Array, stopped_at: jax.Array):
    """:func:`ntk_tt.dynamics._divergence.divergence` of a recorded curve (T+1,) whose entries from
    ``stopped_at`` (the first non-finite step, −1 if none) on were held, not computed."""
    t = jnp.arange(loss.shape[0])
    return divergence(jnp.where((stopped_at >= 0) & (t >= stopped_at), jnp.nan, loss))


def finetune_step(apply_fn: ApplyFn, state: FineTuneState, x: jax.Array, y: jax.Array,
                  idx: jax.Array, t: jax.Array, learning_rate: jax.Array,
                  momentum: jax.Array, *, nesterov: bool = False,
                  loss: str = "cross_entropy") -> FineTuneState:
    """Update t (1-based) then measure the full training set; stop once non-finite.

    A large finite loss (a spike, e.g. the catapult phase above the stability edge) does not
    stop training. When the new full-set loss or any parameter is non-finite, ``stopped_at =
    t`` and parameters, optimiser state, loss, error and logits keep their last finite values;
    a stopped state stays stopped. Selection is by ``jnp.where`` (no ``lax.cond``), so the
    step vmaps and XLA keeps its fast CPU convolution.
    """
    p, s = train_step(apply_fn, state.params, state.opt_state, x, y, idx, learning_rate,
                      momentum, nesterov=nesterov, loss=loss)
    return advance(apply_fn, state, p, s, x, y, t, loss)


def advance(apply_fn: ApplyFn, state: FineTuneState, p: Any, s: Any, x: jax.Array,
            y: jax.Array, t: jax.Array, loss: str) -> FineTuneState:
    """The state after update t to weights ``p`` and optimiser state ``s``: measure the full
    training set, or hold ``state`` once non-finite (:func:`finetune_step`; shared with the
    optimiser-driven step of ``ntk_tt.training._optimizer_run``)."""
    l2, e2, f2 = _evaluate(apply_fn, p, x, y, loss)
    stopped = state.stopped_at >= 0
    finite = jnp.isfinite(l2)
    for leaf in jax.tree_util.tree_leaves(p):
        finite &= jnp.all(jnp.isfinite(leaf))
    new = FineTuneState(p, s, l2, e2, f2, state.stopped_at)
    out = jax.tree.map(lambda a, b: jnp.where(stopped | ~finite, a, b), state, new)
    return out._replace(stopped_at=jnp.where(~stopped & ~finite, t, state.stopped_at)
                        .astype(jnp.int32))


def linear_logits(apply_fn: ApplyFn, params0: Any, f0: jax.Array, params: Any,
                  x: jax.Array) -> jax.Array:
    """f_lin(x; w) = f(x; w0) + J(x)(w − w0) by one ``jax.jvp`` (paper Sec. 3), (N, C)."""
    delta = jax.tree.map(jnp.subtract, params, params0)
    return f0 + jax.jvp(lambda q: apply_fn(q, x), (params0,), (delta,))[1]


def finetune_core(apply_fn: ApplyFn, params: Any, x: jax.Array, y: jax.Array,
                  batches: jax.Array, learning_rate: jax.Array, momentum: jax.Array, *,
                  nesterov: bool = False, loss: str = "cross_entropy",
                  x_test: jax.Array | None = None, record_logits: bool = False) -> FineTuneTrace:
    """Pure, jittable fine-tuning: :func:`finetune_step` scanned over a batch sequence.

    For ``jit(vmap(...))`` sweeps over η and m. On CPU prefer :func:`ntk_tt.finetune`: XLA:CPU runs
    convolutions inside a ``lax.scan`` body about 40× slower than at top level (measured on
    the small ResNet: 1.5 s vs 0.04 s of CPU per step), so the eager entry point dispatches
    one jitted step at a time instead. Same arithmetic, same results.

    Args:
      apply_fn: ``apply_fn(params, x) -> logits`` (N, C); static under ``jit``.
      params: initial parameters w0.
      x, y: training inputs (N, ...) and integer labels (N,).
      batches: int32 (T, B) indices, e.g. ``ntk_tt.batch_indices(key, N, B, T)``.
      learning_rate, momentum: scalar arrays η > 0 and m ∈ [0, 1) (traced: vmappable).
      nesterov, loss, record_logits: static.
      x_test: optional held-out inputs (M, ...), evaluated at the final parameters.
      record_logits: also return the logits trajectory and, for the linearisation gap, the
        linearised model's outputs at the same weights (one extra ``jax.jvp`` per step).

    Returns:
      :class:`FineTuneTrace`.
    """
    state0 = init_state(apply_fn, params, x, y, momentum, loss=loss)

    def body(state, inputs):
        idx, t = inputs
        state = finetune_step(apply_fn, state, x, y, idx, t, learning_rate,
                              momentum, nesterov=nesterov, loss=loss)
        logits = ((state.logits, linear_logits(apply_fn, params, state0.logits, state.params,
                                               x)) if record_logits else (None, None))
        return state, (state.loss, state.error, *logits)

    steps = jnp.arange(1, batches.shape[0] + 1, dtype=jnp.int32)
    last, (ls, es, fs, fls) = jax.lax.scan(body, state0, (batches, steps))

    def first(a, rest):
        return jnp.concatenate([a[None], rest])

    loss_curve = first(state0.loss, ls)
    verdict = _verdict(loss_curve, last.stopped_at)
    return FineTuneTrace(
        loss=loss_curve, error=first(state0.error, es), diverged_at=verdict.diverged_at,
        spiked_at=verdict.spiked_at, params=last.params, logits=last.logits,
        test_logits=None if x_test is None else apply_fn(last.params, x_test),
        trajectory=first(state0.logits, fs) if record_logits else None,
        linear_trajectory=first(state0.logits, fls) if record_logits else None,
    )


_STATIC = ("nesterov", "loss")


_init_jit = jax.jit(init_state, static_argnums=0, static_argnames="loss")


_step_jit = jax.jit(finetune_step, static_argnums=0, static_argnames=_STATIC)


_train_jit = jax.jit(train_step, static_argnums=0, static_argnames=_STATIC)


_linear_jit = jax.jit(linear_logits, static_argnums=0)


# the held-out set's mean loss, error and logits at given weights (finetune(...,
# record_test_curves=True): measurement after every step, not training)
_evaluate_jit = jax.jit(_evaluate, static_argnums=0, static_argnames="loss")
