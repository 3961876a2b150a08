"""The exact weight-space reference: any :class:`ntk_tt.Optimizer` on the linearised model.

METHOD.md §1 and §11. ``optimizer.to_optax()`` trains f_lin(θ) = f(θ_0) + J(θ − θ_0) (paper
Sec. 3) in weight space, with the conventions of :func:`ntk_tt.finetune`: the MEAN loss on
the minibatch ``ntk_tt.batch_indices(key, N, B, T)`` (B = ``optimizer.batch_size``, None = N),
and the full-training-set loss and error after every update (curves of T + 1 entries, time in
optimiser steps). It needs no function-space closure, so it holds for Adam/AdamW (whose
elementwise moments have none) as for SGD; it is the reference the fast predictors are tested
against (for SGD it equals :func:`ntk_tt.dynamics._optim_linear.sgd_trajectory` to rounding).

Per update: the minibatch gradient J_Bᵀ g_B with g_B = ∂L_B/∂f at the linear model's current
logits (one ``jax.vjp`` at θ_0 on the batch: a forward and a backward pass, a training step),
then the new logits f_0 + J(θ_{t+1} − θ_0) on the training (and held-out) set by one
``jax.jvp``: the full-set evaluation that :func:`ntk_tt.finetune` does too. Rows of f_lin on
the whole set are f_lin on the batch because ``apply_fn`` treats samples independently
(``check_model``). One compiled update is dispatched per step (XLA:CPU runs convolutions
inside ``lax.scan`` far slower, as noted in ``ntk_tt.training._steps``).
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ntk_tt._optimizer import Optimizer
from ntk_tt._options import _is_int
from ntk_tt.data._batches import batch_indices
from ntk_tt.data._inputs import as_array, check_key
from ntk_tt.data._model import ApplyFn, check_model
from ntk_tt.dynamics._checks import check_labels
from ntk_tt.dynamics._losses import check_loss, error_rate, logit_residual, mean_loss
from ntk_tt.dynamics._optim_linear import check_learning_rates


class ReferenceRun(NamedTuple):
    """Result of :func:`linearised_reference` (numpy; T = steps).

    loss, error: full-training-set mean loss and error rate after 0..T updates (T + 1,).
    test_loss, test_error: held-out curves (T + 1,) or None. logits: (T + 1, N, C) training
    logits of the linear model (at a re-linearisation step, ``segments`` > 1, the network's
    own; the last step always the linear model's); test_logits (T + 1, N_test, C) or None.
    params: the final weights θ_T. stopped_at: the first update whose loss was non-finite
    (from there the curves hold the last finite values, as ``ntk_tt.finetune``), or None.

    Source: ntk_tt's own (issue 27; METHOD.md §11): the linearised model of Zancato et al.
    2020 (arXiv 2008.12478), Sec. 3, trained in weight space.
    """

    loss: np.ndarray
    error: np.ndarray
    test_loss: np.ndarray | None
    test_error: np.ndarray | None
    logits: np.ndarray
    test_logits: np.ndarray | None
    params: Any
    stopped_at: int | None


def linearised_reference(apply_fn: ApplyFn, params: Any, x, y, optimizer: Optimizer, *,
                         steps: int, key: jax.Array | None = None, loss: str = "cross_entropy",
                         x_test=None, y_test=None, segments: int = 1) -> ReferenceRun:
    """Train the linearised network with ``optimizer`` in weight space, exactly.

    With ``segments`` = K > 1 the network is re-linearised at its current weights θ_{t_k} at
    the steps t_k = round(k·T/K), k = 1 … K − 1: from there it trains f(θ_{t_k}) +
    J(θ_{t_k})(θ − θ_{t_k}), the logits jumping to the network's own f(θ_{t_k}), the optax
    state carried on. K = T re-linearises before every update, so every update is real
    training's: the weights θ_1 … θ_T and the logits and curves at steps 0 … T − 1 equal
    :func:`ntk_tt.finetune`'s with ``optimizer`` to rounding, and those at step T are the
    linear step from θ_{T−1} (no re-linearisation after the last update: off by second
    order in θ_T − θ_{T−1}). K measures how often a linearised model must be refreshed to
    follow the real run (issues 26 and 27, ``experiments/relinearise.py``).

    Source: ntk_tt's own (issues 26 and 27; METHOD.md §1, §11): the linearised model of
    Zancato et al. 2020 (arXiv 2008.12478), Sec. 3, trained in weight space.

    Args:
      apply_fn, params: the network and its pre-trained weights θ_0 (``ntk_tt.from_nnx``).
      x: training inputs (N, ...). y: integer labels (N,).
      optimizer: any :class:`ntk_tt.Optimizer` (``ntk_tt.sgd``, ``adam``, ``adamw``; its
        schedule, weight decay and batch size).
      steps: T ≥ 1 updates. key: ``jax.random`` key of the minibatch order (B < N), the same
        order as ``ntk_tt.finetune(..., key=key)``.
      loss: "cross_entropy" or "mse" (mean over samples).
      x_test, y_test: optional held-out set, evaluated after every update.
      segments: K, an int in [1, steps]: the number of linearisations (1: at θ_0 only).

    Returns:
      :class:`ReferenceRun` (``logits`` of the piecewise-linear model). Cost: about one
      training step per update plus the full-set evaluation (module docstring), plus one
      forward pass per segment.

    Raises:
      ValueError: ``optimizer`` not an :class:`ntk_tt.Optimizer`, steps not an int ≥ 1, bad
        model/inputs (``check_model``), labels, loss, a missing or bad key for B < N, a
        schedule with η_t not finite or < 0 or a warmup ending at or after ``steps``,
        x_test without y_test (or the reverse), segments not an int in [1, steps] — all
        before any training.
    """
    if not isinstance(optimizer, Optimizer):
        raise ValueError(f"optimizer must be an ntk_tt.Optimizer (ntk_tt.sgd(...), "
                         f"ntk_tt.adamw(...)), got {type(optimizer).__name__}.")
    if not _is_int(steps) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}.")
    if not _is_int(segments) or not 1 <= segments <= steps:
        raise ValueError(f"segments must be an int in [1, steps] = [1, {steps}] (the number "
                         f"of linearisations), got {segments!r}.")
    check_learning_rates(optimizer, steps)  # as predict / finetune: η_t finite, a warmup < T
    check_loss(loss)
    check_key(key)
    x = as_array(x, "x")
    n, c = check_model(apply_fn, params, x)
    check_loss(loss, c)
    y = check_labels(y, n, c)
    if (x_test is None) != (y_test is None):
        raise ValueError("pass both x_test and y_test, or neither.")
    if x_test is not None:
        x_test = as_array(x_test, "x_test")
        m, _ = check_model(apply_fn, params, x_test, name="x_test")
        y_test = check_labels(y_test, m, c, name="y_test")
        x_test = jnp.asarray(x_test)
    b = n if optimizer.batch_size is None else optimizer.batch_size
    batches = batch_indices(key, n, b, int(steps))
    x = jnp.asarray(x)

    f0 = _forward(apply_fn, params, x)
    ft0 = None if x_test is None else _forward(apply_fn, params, x_test)
    theta, state = params, _init(optimizer, params)
    f, ft = f0, ft0
    rec = {"logits": [f0], "test": [ft0]}
    stopped = None
    lin0, relinearise = params, set(np.linspace(0, int(steps), int(segments) + 1)
                                    .round().astype(int)[1:-1].tolist())
    for t in range(int(steps)):
        if t in relinearise:  # the network's own logits and Jacobian at θ_t
            lin0, f0 = theta, _forward(apply_fn, theta, x)
            f, ft0 = f0, None if x_test is None else _forward(apply_fn, theta, x_test)
            rec["logits"][-1], rec["test"][-1] = f0, ft0  # step t: the network's own
        *new, finite = _step(apply_fn, optimizer, theta, state, f, lin0, f0, x, y,
                             batches[t], x_test, ft0, loss=loss)
        if not bool(finite):
            stopped = t + 1
            break
        theta, state, f, ft = new
        rec["logits"].append(f)
        rec["test"].append(ft)
    held = int(steps) + 1 - len(rec["logits"])
    fs = np.stack([np.asarray(v) for v in rec["logits"] + rec["logits"][-1:] * held])
    curves = _curves(jnp.asarray(fs), y, loss)
    test = (None, None, None)
    if x_test is not None:
        fts = np.stack([np.asarray(v) for v in rec["test"] + rec["test"][-1:] * held])
        test = (*_curves(jnp.asarray(fts), y_test, loss), fts)
    return ReferenceRun(loss=curves[0], error=curves[1], test_loss=test[0],
                        test_error=test[1], logits=fs, test_logits=test[2], params=theta,
                        stopped_at=stopped)


def _curves(fs, y, loss):
    """Mean loss and error (T + 1,) as numpy, from logits (T + 1, N, C)."""
    out = jax.vmap(lambda f: (mean_loss(f, y, loss), error_rate(f, y)))(fs)
    return np.asarray(out[0], float), np.asarray(out[1], float)


@partial(jax.jit, static_argnums=0)
def _forward(apply_fn, params, x):
    return apply_fn(params, x)


@jax.jit
def _init(optimizer, params):
    return optimizer.to_optax().init(params)


@partial(jax.jit, static_argnums=0, static_argnames="loss")
def _step(apply_fn, optimizer, theta, state, f, params0, f0, x, y, idx, x_test, ft0, *, loss):
    """One update: the optax step on the batch gradient J_Bᵀ g_B(f_t[idx]), then the linear
    model's logits on the training (and held-out) inputs and whether their loss is finite."""
    g = logit_residual(f[idx], y[idx], loss) / idx.shape[0]
    _, vjp = jax.vjp(lambda p: apply_fn(p, x[idx]), params0)
    grad = vjp(g.astype(f.dtype))[0]
    updates, state = optimizer.to_optax().update(grad, state, theta)
    theta = optax.apply_updates(theta, updates)
    delta = jax.tree.map(jnp.subtract, theta, params0)

    def lin(xx, fx0):
        return fx0 + jax.jvp(lambda p: apply_fn(p, xx), (params0,), (delta,))[1]

    f = lin(x, f0)
    ft = None if x_test is None else lin(x_test, ft0)
    return theta, state, f, ft, jnp.isfinite(mean_loss(f, y, loss))
