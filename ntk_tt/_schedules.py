"""Learning-rate schedules as pytrees: η_t for optimiser step t = 0, 1, ..., T − 1.

A schedule's numbers (peak, warmup length, ...) are array leaves, so ``jit``, ``vmap`` and
``jax.grad`` act on them; called with a step count (int array) it gives η at that step, as
optax's ``scale_by_learning_rate`` uses it (from 0). Any optax schedule or callable ``step ->
η`` is accepted through :func:`schedule` (its numbers closed over, not leaves).

Warmup length as a differentiable number (issue 27): the linear warmup is optax's,
η_t = init + (peak − init)·min(1, t/w) (η_0 = init), written so that η_t is continuous in w
and differentiable in w everywhere except at t = w: d η_t/d w = −(peak − init)·t/w² during
the warmup, 0 after. ``smoothing`` > 0 replaces min(1, x) by the softplus relaxation
s·softplus(x/s) − s·softplus((x − 1)/s), s = smoothing/w (``smoothing`` in steps): a clip of x
to [0, 1] smooth in w (η_t stays in [init, peak]), exact as smoothing → 0 (0, the default).
"""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._schedule_checks import (
    RATE_RANGE,
    _callable_rate,
    _check_arity,
    _check_below_peak,
    _check_order,
    _check_scalar,
    _concrete,
    _fn_name,
    _real_array,
    _warmup_ends,
    _within_peak,
    check_steps,
    is_rate,
)

Array = jax.Array


def _number(value, name: str, positive: bool = False) -> Array:
    """``value`` as a float array leaf; one-line ValueError for non-numbers (bools, strings,
    None) before any work. Tracers pass unchecked; a number's leaf stays concrete inside ``jit``
    (``jnp.asarray`` gives a tracer): a schedule built there keeps its constants checkable."""
    if isinstance(value, jax.core.Tracer):
        _check_scalar(value, name)
        return value
    if isinstance(value, bool) or value is None or isinstance(value, str):
        raise ValueError(f"{name} must be a real number, got {value!r}.")
    arr = _real_array(value, f"{name} must be a real number", type(value).__name__)
    _check_scalar(arr, name)
    if arr.ndim == 0 and not np.isfinite(float(arr)):
        raise ValueError(f"{name} must be finite, got {float(arr)}.")
    if positive and arr.ndim == 0 and not is_rate(arr):
        raise ValueError(f"{name} must be {RATE_RANGE}, got {float(arr)} (a learning rate or "
                         "decay factor <= 0 does not train; beyond float32's it is 0 or inf).")
    with jax.ensure_compile_time_eval():  # a constant stays concrete inside jit
        return jnp.asarray(arr, jnp.result_type(float))


class Schedule(eqx.Module):
    """Base class: ``schedule(step) -> η`` for an int (array) ``step`` (broadcasts).

    Source: ntk_tt's own (issue 27; METHOD.md §11; README "Optimisers")."""

    def __call__(self, step) -> Array:
        raise NotImplementedError

    def values(self, steps: int) -> Array:
        """η_0 … η_{T−1}: the learning rate of each of ``steps`` (an int >= 1, else ValueError)
        updates, (T,). One compiled program per schedule class and T (the leaves are its
        arguments), not one dispatch per operation: the predictors read η_t several times."""
        return _values(self, check_steps(steps))

    def valid(self, steps: int) -> Array:
        """Whether the constructor's and :func:`ntk_tt.dynamics._checks.check_warmup`'s
        value checks pass, as a traceable bool (the predictors flag a traced schedule that
        fails them as INVALID): here every number leaf finite; subclasses add their own."""
        leaves = [v for v in jax.tree_util.tree_leaves(self) if isinstance(v, jax.Array)]
        return jnp.all(jnp.array([jnp.all(jnp.isfinite(v)) for v in leaves] or [True]))


class Constant(Schedule):
    """η_t = ``value`` at every step."""

    value: Array

    def __call__(self, step) -> Array:
        return jnp.broadcast_to(self.value, jnp.shape(step)).astype(self.value.dtype)


class WarmupCosine(Schedule):
    """Linear warmup from ``init`` (η_0) to ``peak`` (step ``warmup``), then cosine decay to
    ``end`` at step ``decay_steps`` (counted from 0, warmup included), ``end`` after: optax's
    ``warmup_cosine_decay_schedule(init, peak, warmup, decay_steps, end)`` at integer
    ``warmup``, with ``warmup`` a differentiable leaf (``smoothing``: module docstring)."""

    peak: Array
    warmup: Array
    decay_steps: Array
    init: Array
    end: Array
    smoothing: float = eqx.field(static=True, default=0.0)

    def __call__(self, step) -> Array:
        t = jnp.asarray(step, self.peak.dtype)
        span = jnp.maximum(self.decay_steps - self.warmup, 1.0)
        frac = jnp.clip((t - self.warmup) / span, 0.0, 1.0)
        cos = self.end + (self.peak - self.end) * 0.5 * (1.0 + jnp.cos(jnp.pi * frac))
        # warmup ramp + (cosine − peak): the second term is 0 until the warmup ends
        ramp = (self.peak - self.init) * _ramp(t, self.warmup, self.smoothing)
        return self.init + ramp + (cos - self.peak)

    def valid(self, steps: int) -> Array:
        """init, end in [0, peak]; a warmup ≥ 0 that ends before ``steps`` (when η rises);
        decay_steps ≥ max(warmup, 1)."""
        return (super().valid(steps) & _within_peak(self.peak, self.init, self.end)
                & _warmup_ends(self.warmup, self.init < self.peak, steps)
                & (self.decay_steps >= jnp.maximum(self.warmup, 1.0)))


class WarmupStableDecay(Schedule):
    """Warmup–stable–decay (WSD): linear warmup from 0 (η_0) to ``peak`` (step ``warmup``),
    ``peak`` until step ``decay_start`` (>= warmup), then linear decay to ``end`` over
    ``decay_steps`` steps, ``end`` after."""

    peak: Array
    warmup: Array
    decay_start: Array
    decay_steps: Array
    end: Array
    smoothing: float = eqx.field(static=True, default=0.0)

    def __call__(self, step) -> Array:
        t = jnp.asarray(step, self.peak.dtype)
        frac = jnp.clip((t - self.decay_start) / jnp.maximum(self.decay_steps, 1.0), 0.0, 1.0)
        # warmup ramp + the decay (0 until decay_start >= warmup)
        return self.peak * _ramp(t, self.warmup, self.smoothing) + (self.end - self.peak) * frac

    def valid(self, steps: int) -> Array:
        """end in [0, peak]; a warmup ≥ 0 that ends before ``steps``; decay_start ≥ warmup;
        decay_steps ≥ 0."""
        return (super().valid(steps) & _within_peak(self.peak, self.end)
                & _warmup_ends(self.warmup, True, steps) & (self.decay_start >= self.warmup)
                & (self.decay_steps >= 0))


class Exponential(Schedule):
    """η_t = ``init``·``rate``^t (optax ``exponential_decay(init, 1, rate)``)."""

    init: Array
    rate: Array

    def __call__(self, step) -> Array:
        return self.init * self.rate ** jnp.asarray(step, self.init.dtype)

    def valid(self, steps: int) -> Array:
        """init > 0, rate in (0, 1]."""
        return super().valid(steps) & (self.init > 0) & (self.rate > 0) & (self.rate <= 1)


class FromCallable(Schedule):
    """Any ``fn(step) -> η``: an optax schedule or a user's function (static: no ``jax.grad``
    w.r.t. its numbers through the schedule object). A call raises ValueError when ``fn``
    fails on a traced step or returns no real η per step (``_schedule_checks._callable_rate``)."""

    fn: Callable = eqx.field(static=True)

    def __call__(self, step) -> Array:
        try:
            out = self.fn(step)
        except (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError,
                jax.errors.TracerArrayConversionError) as err:
            raise ValueError(
                f"the learning-rate schedule {_fn_name(self.fn)} failed on a traced step: η_t "
                "is computed under jax.vmap / jit, so write it with jax.numpy operations, e.g. "
                "lambda t: jnp.asarray(values)[t] (not values[t] of a list or NumPy array) or "
                f"0.1 * 0.99 ** t (not float(t)). JAX said: {str(err).splitlines()[0]}"
            ) from err
        return _callable_rate(out, step, self.fn)

    def values(self, steps: int) -> Array:
        """As :meth:`Schedule.values`, evaluated op by op: ``fn`` is static, so a compiled
        program would be rebuilt for every new callable (an optax schedule made per call)."""
        return _eager_values(self, check_steps(steps))


def _eager_values(sched: Schedule, steps: int) -> Array:
    return jax.vmap(sched)(jnp.arange(steps))


_values = jax.jit(_eager_values, static_argnums=1)


def _ramp(t, warmup, smoothing) -> Array:
    """min(1, t/w) (exact; 1 when w = 0), or its relaxation of width ``smoothing`` steps:
    s·softplus(x/s) − s·softplus((x − 1)/s) with x = t/w, s = smoothing/max(w, smoothing), a
    smooth clip of x to [0, 1] (both corners rounded), so η_t stays within [init, peak]
    (η_0 = s·ln 2 of the rise, not 0); 1 when w = 0."""
    x = jnp.where(warmup > 0, t / jnp.where(warmup > 0, warmup, 1.0), 1.0)
    if smoothing == 0:
        return jnp.minimum(x, 1.0)
    s = smoothing / jnp.maximum(warmup, smoothing)
    smooth = s * (jax.nn.softplus(x / s) - jax.nn.softplus((x - 1.0) / s))
    return jnp.where(warmup > 0, smooth, 1.0)


def constant(value) -> Constant:
    """A constant learning rate: η_t = ``value`` at every optimiser step t = 0, 1, ...
    (optax ``constant_schedule(value)``; a plain number as a learning rate means the same).

    Source: ntk_tt's own (issue 27; METHOD.md §11); optax's ``constant_schedule``.

    Args:
      value: η > 0, a real scalar (Python, NumPy or JAX number; a tracer under ``jit`` /
        ``vmap`` / ``grad``), per step: w ← w − η·g, g the gradient of the mean minibatch
        loss (:mod:`ntk_tt.dynamics._losses`).

    Returns:
      :class:`Constant`, ``value`` its float array leaf (``jax.grad`` w.r.t. η through it);
      called with a step array it gives η of that array's shape.

    Raises:
      ValueError: ``value`` not a real number (a string, None, a bool, complex), not
        finite, or <= 0 (a concrete scalar; a traced one is not checked).
    """
    return Constant(_number(value, "learning_rate", positive=True))


def warmup_cosine(peak, warmup, decay_steps, *, init=0.0, end=0.0,
                  smoothing: float = 0.0) -> WarmupCosine:
    """Linear warmup to ``peak`` over ``warmup`` steps, cosine decay to ``end`` at
    ``decay_steps`` (optax ``warmup_cosine_decay_schedule``'s convention).

    Source: ntk_tt's own (issue 27; METHOD.md §11); optax's ``warmup_cosine_decay_schedule``
    at an integer warmup, the warmup differentiable (module docstring).

    Args:
      peak: η at the end of the warmup (the largest η).
      warmup: warmup length w in optimiser steps, a real number (0: start at ``peak``).
      decay_steps: the step the cosine reaches ``end``, counted from 0 (warmup included).
      init: η_0, where the warmup starts.
      end: η from step ``decay_steps`` on.
      smoothing: warmup relaxation width in steps (module docstring; static; 0: exact ramp).

    Returns:
      :class:`WarmupCosine`, its numbers float leaves (``jax.grad`` w.r.t. peak and warmup).

    Raises:
      ValueError: a non-number, peak <= 0, init or end outside [0, peak], warmup < 0,
        decay_steps < max(warmup, 1) (η = end from step 1), smoothing < 0 or not finite.
    """
    leaves = (_number(peak, "peak", positive=True), _number(warmup, "warmup"),
              _number(decay_steps, "decay_steps"), _number(init, "init"), _number(end, "end"))
    _check_below_peak(peak, init=init, end=end)
    _check_order(warmup, decay_steps, "warmup", "decay_steps", smoothing)
    if (d := _concrete(decay_steps)) is not None and d < 1:
        raise ValueError(f"decay_steps must be >= 1 (the step the decay ends at), got {d}.")
    return WarmupCosine(*leaves, float(smoothing))


def warmup_stable_decay(peak, warmup, decay_start, decay_steps, *, end=0.0,
                        smoothing: float = 0.0) -> WarmupStableDecay:
    """Warmup (``warmup`` steps) – stable (``peak`` until ``decay_start``) – linear decay to
    ``end`` over ``decay_steps`` steps.

    Source: ntk_tt's own (issue 27; METHOD.md §11): the warmup–stable–decay (WSD) shape.

    Args:
      peak: η of the stable phase.
      warmup: length in optimiser steps of the linear warmup from 0.
      decay_start: the step the decay starts at.
      decay_steps: its length in steps (0: drop to ``end`` in one step).
      end: η after the decay.
      smoothing: as :func:`warmup_cosine`.

    Returns:
      :class:`WarmupStableDecay`, its numbers leaves as :func:`warmup_cosine`'s.

    Raises:
      ValueError: a non-number, peak <= 0, end outside [0, peak], warmup < 0, decay_start <
        warmup, decay_steps < 0, smoothing < 0 or not finite.
    """
    leaves = (_number(peak, "peak", positive=True), _number(warmup, "warmup"),
              _number(decay_start, "decay_start"), _number(decay_steps, "decay_steps"),
              _number(end, "end"))
    _check_below_peak(peak, end=end)
    _check_order(warmup, decay_start, "warmup", "decay_start", smoothing)
    if (d := _concrete(decay_steps)) is not None and d < 0:
        raise ValueError(f"decay_steps must be >= 0, got {d}.")
    return WarmupStableDecay(*leaves, float(smoothing))


def exponential(init, rate) -> Exponential:
    """η_t = init·rate^t (rate per step, e.g. 0.99): a decay, rate in (0, 1] (``ntk-tt
    predict --decay-rate``'s range).

    Source: ntk_tt's own (issue 27; METHOD.md §11); optax's ``exponential_decay(init, 1, rate)``.

    Args:
      init: η_0, the learning rate of step 0.
      rate: the factor per optimiser step.

    Returns:
      :class:`Exponential`, init and rate its float array leaves (as :func:`warmup_cosine`'s).

    Raises:
      ValueError: a non-number, init <= 0, rate <= 0 (a negative rate flips η_t's sign) or
        rate > 1 (η_t would grow without bound; optax clips such a growth only with its
        ``end_value``, which this schedule has not: pass that optax schedule, or any
        callable, as the learning rate instead).
    """
    leaves = (_number(init, "init", positive=True), _number(rate, "rate", positive=True))
    if (r := _concrete(rate)) is not None and r > 1:
        raise ValueError(f"rate must be in (0, 1] (a decay: η_t = init·rate^t), got {r}: a rate "
                         "> 1 grows η_t without bound; for a growing η_t pass a callable, e.g. "
                         "optax.exponential_decay(init, 1, rate, end_value=...).")
    return Exponential(*leaves)


def schedule(value) -> Schedule:
    """A :class:`Schedule` from a number (constant), a Schedule (unchanged) or any callable
    ``step -> η`` (an optax schedule such as ``optax.piecewise_constant_schedule(...)``).

    A callable is called with the step as an int array (traced: η_0 … η_{T−1} are computed
    under ``jax.vmap``), so it must use ``jax.numpy`` operations, and return one real η per
    step.

    Source: none (a utility: ntk_tt's schedule constructor, issue 27).

    Args:
      value: the number, Schedule or callable.

    Returns:
      :class:`Constant` (:func:`constant`) for a number, ``value`` for a Schedule, else a
      :class:`FromCallable` wrapping it.

    Raises:
      ValueError: anything else (a string, None, an array of per-step values v: use ``lambda
        t: v.at[t].get(mode="fill", fill_value=jnp.nan)``), naming ``value`` and the accepted
        forms; a callable that cannot be called with one argument (here, from its
        signature). When η is first computed (``Schedule.values``, e.g. in
        :func:`ntk_tt.predict`): a callable that returns no real number per step (a string,
        None, a bool, complex, another shape) or fails on a traced step (Python indexing of a
        list, ``float(t)``).
    """
    return _schedule(value, "schedule's value")


def _schedule(value, name: str) -> Schedule:
    """:func:`schedule`, its errors naming the argument ``name`` (``sgd``'s learning_rate)."""
    if isinstance(value, Schedule):
        return value
    if callable(value):
        _check_arity(value, name)
        return FromCallable(value)
    forms = (f"{name} must be a number (a constant η), a schedule (ntk_tt.warmup_cosine(...), "
             "any optax schedule) or a callable step -> η")
    if isinstance(value, jax.core.Tracer):
        return constant(value)
    try:
        kind = "b" if isinstance(value, bool) else np.asarray(value).dtype.kind
    except (TypeError, ValueError):  # a ragged list
        kind = "O"
    if kind not in "iuf":
        raise ValueError(f"{forms}, got {value!r}.")
    if np.ndim(value) != 0:
        raise ValueError(f"{forms}, got an array of shape {np.shape(value)}; per-step values "
                         "v: lambda t: v.at[t].get(mode='fill', fill_value=jnp.nan) (NaN past v).")
    return constant(value)
