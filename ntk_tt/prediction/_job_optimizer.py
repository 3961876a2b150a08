"""The optimiser of :func:`ntk_tt.predict_task` (issue 27): the :class:`ntk_tt.Optimizer` its
options describe (checked by :mod:`ntk_tt._options_optimizer`), and the measured time of one
real step of it (the predicted wall clock without ``verify``)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ntk_tt import _optimizer, _schedules
from ntk_tt._optimizer import Optimizer
from ntk_tt._options_optimizer import optimizer_arguments, schedule_arguments
from ntk_tt.data._batches import batch_indices
from ntk_tt.data._model import ApplyFn
from ntk_tt.training import _optimizer_run as optimizer_run
from ntk_tt.training._finetune import TIMING_STEPS, _time_steps


def job_optimizer(o: dict[str, Any]) -> Optimizer:
    """The optimiser of checked job options ``o``: ``ntk_tt.<optimizer>(ntk_tt.<schedule>(...),
    ...)`` with the peak η = ``learning_rate``, the decay horizon ``decay_end`` (default
    ``steps``), B = ``batch_size`` (None: full batch) and the defaults of
    :mod:`ntk_tt._options_optimizer`."""
    kind, sched = schedule_arguments(o)
    name, rest = optimizer_arguments(o)
    return getattr(_optimizer, name)(getattr(_schedules, kind)(**sched), **rest)


def optimizer_step_time(apply_fn: ApplyFn, params: Any, x, y, optimizer: Optimizer, *,
                        key: jax.Array, loss: str) -> float:
    """Measured seconds per real ``finetune(optimizer=optimizer)`` step: the compiled
    ``optimizer.to_optax()`` update of :func:`ntk_tt.finetune`, 5 warm steps on the first
    batches of ``ntk_tt.batch_indices(key, N, B, 5)``, compile time excluded (as
    :func:`ntk_tt.step_time` for constant-η SGD). ``x`` (N, ...), ``y`` (N,) int labels,
    already checked by the prediction."""
    n = len(y)
    dtype = jnp.result_type(*jax.tree_util.tree_leaves(params))
    batches = batch_indices(key, n, optimizer.batch_size or n, TIMING_STEPS)
    opt = optimizer_run.in_dtype(optimizer, dtype)
    return _time_steps(optimizer_run._train_jit, apply_fn, params,
                       opt.to_optax().init(params), jnp.asarray(x), jnp.asarray(y, jnp.int32),
                       batches, (opt,), dict(loss=loss))[0]
