"""Fine-tuning with an :class:`ntk_tt.Optimizer` (issue 27), and the description of one.

``finetune(..., optimizer=opt)`` trains with ``opt.to_optax()`` (schedule, momentum or Adam,
weight decay), with everything else of :func:`ntk_tt.finetune`: the MEAN loss on the minibatch
``ntk_tt.batch_indices(key, N, B, T)`` (B = ``opt.batch_size``, None = N), one compiled step
dispatched per update, the full training set measured after every update, a stop at the first
non-finite step (:func:`ntk_tt.training._steps.advance`). The predictors read the same
object, so a prediction and a run made with one ``opt`` and one ``key`` see the same rule,
learning rates and batches.

:func:`optimizer_hyperparameters` is the JSON description that ``Prediction.hyperparameters``
records and that :func:`ntk_tt.compare` checks on both sides.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ntk_tt._optimizer import Optimizer
from ntk_tt.data._model import ApplyFn
from ntk_tt.dynamics._losses import mean_loss
from ntk_tt.dynamics._optim_linear import check_learning_rates as check_learning_rates
from ntk_tt.dynamics._optim_linear import check_shorthand as check_shorthand
from ntk_tt.training._steps import FineTuneState, _evaluate, advance


def _schedule_name(schedule) -> str:
    """``WarmupCosine`` → "warmup_cosine"; ``FromCallable`` → "callable"."""
    name = type(schedule).__name__
    return "callable" if name == "FromCallable" else re.sub(r"(?<!^)(?=[A-Z])", "_",
                                                            name).lower()


def optimizer_hyperparameters(optimizer: Optimizer, steps: int, num_train: int) -> dict:
    """JSON description of ``optimizer`` over ``steps`` updates on N = ``num_train`` samples.

    Keys: "optimizer" ("sgd" | "adam" | "adamw"), "learning_rate" (the peak η_t over the T
    steps), "learning_rate_mean" and "learning_rate_last" (mean η_t and η_{T−1}),
    "schedule" (e.g. "warmup_cosine", "constant", "callable") and "schedule_parameters"
    ({field: value} of a schedule pytree; {} for a callable), "momentum" (SGD's m; Adam's
    β₁ too, as ``compare`` and the intervals read it), "nesterov", "b1", "b2", "eps" (Adam;
    None for SGD), "weight_decay" λ, "decoupled", "batch_size" (B; N for full batch).
    """
    lrs = np.asarray(optimizer.learning_rates(int(steps)), float)
    sched = optimizer.learning_rate
    params = {} if _schedule_name(sched) == "callable" else {
        f.name: float(getattr(sched, f.name)) for f in dataclasses.fields(sched)}
    adam = optimizer.rule == "adam"
    name = ("adamw" if optimizer.decoupled else "adam") if adam else "sgd"
    return {"optimizer": name, "learning_rate": float(lrs.max()),
            "learning_rate_mean": float(lrs.mean()), "learning_rate_last": float(lrs[-1]),
            "schedule": _schedule_name(sched), "schedule_parameters": params,
            "momentum": float(optimizer.momentum), "nesterov": bool(optimizer.nesterov),
            "b1": float(optimizer.momentum) if adam else None,
            "b2": float(optimizer.b2) if adam else None,
            "eps": float(optimizer.eps) if adam else None,
            "weight_decay": float(optimizer.weight_decay),
            "decoupled": bool(optimizer.decoupled),
            "batch_size": int(optimizer.batch_size or num_train)}


def in_dtype(optimizer: Optimizer, dtype) -> Optimizer:
    """``optimizer`` with its floating leaves in the weights' ``dtype`` (as ``finetune`` casts
    η and m)."""
    return jax.tree.map(lambda a: jnp.asarray(a, dtype)
                        if jnp.issubdtype(jnp.result_type(a), jnp.floating) else a, optimizer)


def init_state(apply_fn: ApplyFn, params: Any, x: jax.Array, y: jax.Array,
               optimizer: Optimizer, *, loss: str) -> FineTuneState:
    """The state before any update (fresh optax state, full-set loss L_0)."""
    l0, e0, f0 = _evaluate(apply_fn, params, x, y, loss)
    return FineTuneState(params, optimizer.to_optax().init(params), l0, e0, f0, jnp.int32(-1))


def train_step(apply_fn: ApplyFn, params: Any, opt_state: Any, x: jax.Array, y: jax.Array,
               idx: jax.Array, optimizer: Optimizer, *, loss: str) -> tuple[Any, Any]:
    """One ``optimizer.to_optax()`` update on the minibatch ``idx`` (its step count, hence
    η_t, is in ``opt_state``). Returns ``(params, opt_state)``."""
    g = jax.grad(lambda q: mean_loss(apply_fn(q, x[idx]), y[idx], loss))(params)
    updates, opt_state = optimizer.to_optax().update(g, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def finetune_step(apply_fn: ApplyFn, state: FineTuneState, x: jax.Array, y: jax.Array,
                  idx: jax.Array, t: jax.Array, optimizer: Optimizer, *,
                  loss: str) -> FineTuneState:
    """Update t (1-based) then measure; hold once non-finite (as the SGD step)."""
    p, s = train_step(apply_fn, state.params, state.opt_state, x, y, idx, optimizer, loss=loss)
    return advance(apply_fn, state, p, s, x, y, t, loss)


_init_jit = jax.jit(init_state, static_argnums=0, static_argnames="loss")


_step_jit = jax.jit(finetune_step, static_argnums=0, static_argnames="loss")


_train_jit = jax.jit(train_step, static_argnums=0, static_argnames="loss")
