"""Type checks of learning-rate schedules (split from :mod:`ntk_tt._schedules`): a number
given for a schedule's leaf, and a callable schedule ``step -> η``'s signature and values.
Each raises one ValueError naming the argument and the accepted forms. Also the traceable
value checks of ``Schedule.valid`` (:func:`_within_peak`, :func:`_warmup_ends`), the range
of a learning rate (:func:`is_rate`, ``RATE_RANGE``: used by every eager η check), and the
constructors' checks of their arguments: one number each (:func:`_check_scalar`), concrete
values in range (:func:`_check_below_peak`, :func:`_check_order`).
"""

from __future__ import annotations

import inspect
import operator

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._options import FLOAT32_MAX, FLOAT32_TINY

Array = jax.Array

# a learning rate's range, float32's normal numbers: below it η is 0 in XLA's float32, above inf
RATE_RANGE = f"> 0, in [{FLOAT32_TINY:.8g}, {FLOAT32_MAX:.8g}] (float32's normal range)"


def check_steps(steps) -> int:
    """``steps`` (the number of updates T of a schedule's η_0 … η_{T−1}) as an int, after a
    ValueError unless it is an int >= 1 (Python, NumPy or a concrete JAX int; not a bool, a
    float or a traced value): -1 and 0 gave an empty array, 2.0 was cut to 2."""
    try:
        t = None if isinstance(steps, (bool, np.bool_)) else operator.index(steps)
    except TypeError:  # a float, a string, a traced int
        t = None
    if t is None or t < 1:
        raise ValueError(f"steps must be an int >= 1 (the number of updates, static), got "
                         f"{steps!r}.")
    return t


def is_rate(value) -> bool:
    """Whether a concrete learning rate (scalar or array) lies in ``RATE_RANGE``."""
    v = np.asarray(value, np.float64)
    return bool(np.all(np.isfinite(v)) and np.all((v >= FLOAT32_TINY) & (v <= FLOAT32_MAX)))


def rate_ok(value) -> Array:
    """:func:`is_rate` as a traceable bool array (a traced η outside the range: INVALID)."""
    return jnp.isfinite(value) & (value >= FLOAT32_TINY) & (value <= FLOAT32_MAX)


def _fn_name(fn) -> str:  # for messages: a function's name, or a callable's type
    return getattr(fn, "__name__", None) or type(fn).__name__


def _real_array(value, what: str, got: str, asarray=np.asarray):
    """``value`` as a real (float or integer) array, else one ValueError "{what}, got ..."."""
    try:
        arr = asarray(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{what}, got {got}.") from err
    if not (jnp.issubdtype(arr.dtype, jnp.floating) or jnp.issubdtype(arr.dtype, jnp.integer)):
        raise ValueError(f"{what}, got dtype {arr.dtype}.")
    return arr


def _callable_rate(out, step, fn) -> Array:
    """``fn(step)``'s value ``out`` as a float array, after a ValueError when it is not real
    numbers (a string, None, a bool, complex) or not one η per step (its shape must broadcast
    to ``step``'s). Type, dtype and shape only (static: also under jit / vmap)."""
    what = (f"the learning-rate schedule {_fn_name(fn)} must return a real number η for each "
            "step (step -> η)")
    arr = _real_array(out, what, f"{out!r:.80} ({type(out).__name__})", jnp.asarray)
    shape = jnp.shape(step)
    tail = shape[len(shape) - arr.ndim:] if arr.ndim <= len(shape) else None
    if tail is None or any(a not in (1, b) for a, b in zip(arr.shape, tail, strict=True)):
        raise ValueError(f"{what}, got shape {arr.shape} for a step of shape {shape}: give "
                         "one η per step, e.g. lambda t: 0.1 * 0.99 ** t.")
    return arr.astype(jnp.result_type(float))


def _check_arity(fn, name: str) -> None:
    """ValueError when the callable ``fn`` cannot be called with one positional argument (the
    step); a callable without a readable signature (a NumPy ufunc) is left to its first call."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(0)
    except TypeError as err:
        raise ValueError(
            f"{name} must be a callable of one argument, the step count (step -> η); "
            f"{_fn_name(fn)}{sig} cannot be called with one ({err}): e.g. lambda t: 0.1 * "
            "0.99 ** t, or a number for a constant η.") from None


def _within_peak(peak, *values) -> Array:
    """Every value in [0, peak] (a relative 1e-6 above passes, as :func:`_check_below_peak`)."""
    return jnp.all(jnp.array([(v >= 0) & (v <= peak * (1 + 1e-6)) for v in values]))


def _warmup_ends(warmup, rises, steps: int) -> Array:
    """warmup ≥ 0, and ⌈warmup⌉ < ``steps`` where η rises to its peak (``check_warmup``)."""
    return (warmup >= 0) & (~jnp.asarray(rises) | (jnp.ceil(warmup) < steps))


def _check_scalar(value, name: str) -> None:
    """One ValueError for an array of numbers (also a traced one's static shape under jit):
    each schedule and optimizer holds one number per field; a sweep vmaps over them (an
    array was accepted and failed deep in the predictor, unnamed)."""
    if jnp.ndim(value) != 0:
        raise ValueError(f"{name} must be a scalar, got shape {jnp.shape(value)}; to sweep it, "
                         "build the schedule or optimizer inside a function of one value and "
                         "jax.vmap that over the values.")


def _concrete(value) -> float | None:
    """A scalar argument's value as a float (None for a tracer or an array): the value range
    checks read the user's input, never the (possibly traced) leaf made from it."""
    if isinstance(value, jax.core.Tracer) or np.ndim(value) != 0:
        return None
    return float(np.asarray(value))


def _check_below_peak(peak, **values) -> None:
    """The concrete ``values`` (init, end) in [0, peak]: η_t stays in [0, peak] (``ntk-tt
    predict --end-lr``'s range); a relative 1e-6 above peak passes (a float32 leaf times the
    peak, as ``suggest`` rebuilds its template)."""
    top = _concrete(peak)
    for name, value in values.items():
        v = _concrete(value)
        if v is not None and (v < 0 or (top is not None and v > top * (1 + 1e-6))):
            where = "peak" if top is None else f"peak = {top:g}"
            fix = f"raise {name} to >= 0" if v < 0 else f"lower {name} or raise peak"
            raise ValueError(f"{name} must be in [0, {where}] (the learning rate the schedule "
                             f"{'starts' if name == 'init' else 'ends'} at), got {v:g}: {fix}.")


def _check_order(first, second, name1, name2, smoothing) -> None:
    if isinstance(smoothing, jax.core.Tracer):  # was "must be a finite number", of 0.7
        raise ValueError("smoothing is static (it shapes the relaxed warmup ramp, not a value "
                         "to differentiate or sweep): pass a Python number outside jax.grad, "
                         "jit and vmap, and build one schedule per smoothing.")
    if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) \
            or not 0 <= smoothing < float("inf"):
        raise ValueError(f"smoothing must be a finite number >= 0 (steps), got {smoothing!r}.")
    first, second = _concrete(first), _concrete(second)
    if first is not None and first < 0:
        raise ValueError(f"{name1} must be >= 0 steps, got {first}.")
    if first is not None and second is not None and second < first:
        raise ValueError(f"{name2} ({second}) must be >= {name1} ({first}).")
