"""The optimiser of :func:`ntk_tt.predict_task` (issue 27): the :class:`ntk_tt.Optimizer` its
options describe (checked by :mod:`ntk_tt._options_optimizer`); ``ntk_tt.step_time(...,
optimizer=)`` times one real step of it (the predicted wall clock without ``verify``)."""

from __future__ import annotations

from typing import Any

from ntk_tt import _optimizer, _schedules
from ntk_tt._optimizer import Optimizer
from ntk_tt._options_optimizer import optimizer_arguments, schedule_arguments


def job_optimizer(o: dict[str, Any]) -> Optimizer:
    """The optimiser of checked job options ``o``: ``ntk_tt.<optimizer>(ntk_tt.<schedule>(...),
    ...)`` with the peak η = ``learning_rate``, the decay horizon ``decay_end`` (default
    ``steps``), B = ``batch_size`` (None: full batch) and the defaults of
    :mod:`ntk_tt._options_optimizer`."""
    kind, sched = schedule_arguments(o)
    name, rest = optimizer_arguments(o)
    return getattr(_optimizer, name)(getattr(_schedules, kind)(**sched), **rest)
