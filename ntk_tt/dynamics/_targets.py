"""Steps to an absolute target: the first step at which a loss or error curve reaches L* or e*.

T_ε (``ntk_tt.dynamics._training_time``) is relative to the curve's own final value; a user
asks "how many steps until the training loss is ≤ 0.5" or "until held-out accuracy is ≥ 90 %"
(error ≤ 0.1). On a curve c_0..c_T (T + 1 entries, index = optimiser steps taken), with the
same smoothing as T_ε (METHOD.md §6, paper Sec. 5, Alg. 1):

1. smooth with the centred moving average of w steps (that of ``_training_time.smooth``,
   summed term by term here so that a value at the target stays at it to float rounding: w
   odd, the window shrinking symmetrically at the ends, so c̃_0 = c_0 and c̃_T = c_T;
   predicted and measured curves use w = ``curve_window(T + 1)``: 5, or 1 for T < 4);
2. steps to target = the first t with c̃_t ≤ target (0 when the curve starts there), up to
   float rounding (``TOLERANCE`` units of the curve's dtype × max(1, |target|): an error
   curve at exactly e* = 0.2 = 150/750 has reached it, whatever the rounding of its mean).

Smoothing keeps a stochastic (SGD) curve that grazes the target for a step or two from
counting as there, and is applied alike to predicted and real curves; it may put the hit a
step or two after the raw curve's first touch. Undefined (NaN) when the curve has NaN or inf
entries, or when no smoothed entry reaches the target within the T steps.
"""

from __future__ import annotations

import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._options import check_real
from ntk_tt._options_targets import check_targets
from ntk_tt.dynamics._training_time import (
    NON_FINITE,
    OK,
    REASONS,
    _check_curve,
    check_not_complex,
    check_window,
)

TOLERANCE = 32  # float rounding units (eps of the curve's dtype) of the test c̃_t ≤ target
NOT_REACHED = 6
TARGET_REASONS = {
    NON_FINITE: REASONS[NON_FINITE],
    NOT_REACHED: "the curve does not reach the target within the steps",
}


def window_mean(curve: jax.Array, window: int) -> jax.Array:
    """Centred moving average over ``window`` (odd) steps, same length, the ends' window
    shrinking symmetrically (``_training_time.smooth``), as a sum of ``window`` shifted
    copies: rounding of the order of the values, not of their running sum."""
    h, last = window // 2, curve.shape[0] - 1
    t = jnp.arange(curve.shape[0])
    half = jnp.minimum(jnp.minimum(h, t), last - t)
    padded = jnp.pad(curve, h)
    total = sum(jnp.where(abs(k) <= half, padded[h + k:h + k + last + 1], 0.0)
                for k in range(-h, h + 1))
    return total / (2 * half + 1).astype(curve.dtype)


@partial(jax.jit, static_argnames="window")
def steps_to_target_array(curve: jax.Array, target, window: int = 5):
    """Jittable steps to target: ``(steps, code)``, steps a float (NaN when undefined), code
    an int32 (0 = reached; otherwise a key of :data:`TARGET_REASONS`). ``target`` may be
    traced (``jax.vmap(steps_to_target_array, (None, 0))(curve, targets)`` for several);
    ``window`` is static. No value checks (see :func:`steps_to_target`).

    Source: ntk_tt's own (README "Steps to an absolute target"), smoothed as T_ε is
    (METHOD.md §6; Zancato et al. 2020, Sec. 5, Alg. 1).

    Raises:
      ValueError: ``curve`` not 1-D with >= 1 entry or ``target`` not a scalar (static
        shapes; vmap over targets for several); ``window`` not an odd int in [1, len(curve)]
        (static, so checked under jit too).
    """
    curve = jnp.asarray(curve)
    if curve.ndim != 1 or curve.shape[0] < 1 or jnp.ndim(target) != 0:
        raise ValueError(f"steps_to_target_array takes a 1-D curve with >= 1 entry and a scalar "
                         f"target, got shapes {curve.shape} and {jnp.shape(target)}: for several "
                         "targets use jax.vmap(steps_to_target_array, in_axes=(None, 0)).")
    check_window(window, curve.shape[0])
    check_not_complex(curve=curve, target=target)
    curve = curve.astype(jnp.promote_types(curve.dtype, jnp.float32))
    tol = TOLERANCE * jnp.finfo(curve.dtype).eps * jnp.maximum(1.0, jnp.abs(target))
    hit = window_mean(curve, window) <= target + tol
    code = jnp.where(~jnp.all(jnp.isfinite(curve)), NON_FINITE,
                     jnp.where(jnp.any(hit), OK, NOT_REACHED)).astype(jnp.int32)
    return jnp.where(code == OK, jnp.argmax(hit).astype(curve.dtype), jnp.nan), code


def _checked(curve, target, window):
    traced = [name for name, v in (("curve", curve), ("target", target))
              if isinstance(v, jax.core.Tracer)]
    if traced:
        raise ValueError(f"{' and '.join(traced)} traced: steps_to_target and "
                         "steps_to_target_report run eagerly and return Python floats; under "
                         "jit or vmap use steps_to_target_array(curve, target) (value and "
                         "reason code).")
    curve = _check_curve(curve, window)
    check_real(target, "target")
    if np.ndim(target) != 0 or not np.isfinite(float(target)):
        raise ValueError(f"target must be one finite number (a loss L* or an error rate e*), "
                         f"got {target!r}; for several, call once per target or vmap "
                         "steps_to_target_array.")
    if not _valid_target(float(target)):
        raise ValueError(f"target must be a mean loss L* > 0 or an error rate e* in [0, 1], "
                         f"as predict(targets=...) takes, got {float(target)!r}: a loss or "
                         "error curve (>= 0) never reaches a negative target.")
    return curve


def _valid_target(value: float) -> bool:
    """Whether ``predict(targets=...)`` takes ``value`` on a loss curve or an error curve
    (:func:`ntk_tt._options_targets.check_targets`' rule: L* > 0, e* in [0, 1]); the curve's
    kind is unknown here, so either passes."""
    for curve in ("loss", "error"):
        try:
            check_targets({curve: value})
            return True
        except ValueError:
            pass
    return False


def steps_to_target_report(curve, target, *, window: int = 5) -> tuple[float, str | None]:
    """Steps to target and the reason it is undefined (None when reached): ``(NaN, reason)``
    for a curve with NaN or inf entries or one that does not reach the target. Eager, like
    :func:`steps_to_target`; it warns about nothing.

    Source: ntk_tt's own (README "Steps to an absolute target"), smoothed as T_ε is
    (METHOD.md §6; Zancato et al. 2020, Sec. 5, Alg. 1).

    Args:
      curve: 1-D loss or error curve (steps + 1,), predicted or measured; index = optimiser
        steps taken.
      target: the absolute target in the curve's units: a mean loss L* or an error rate e*.
      window: odd centred moving-average width w (1 = the raw curve; default 5).

    Returns:
      ``(t, reason)``: t, optimiser steps as a Python float (0.0 when the curve starts at or
      below the target; NaN when undefined); reason, a sentence of :data:`TARGET_REASONS`.

    Raises:
      ValueError: as :func:`steps_to_target`.
    """
    curve = _checked(curve, target, window)
    t, code = steps_to_target_array(curve, target, window)
    return float(t), TARGET_REASONS.get(int(code))


def steps_to_target(curve, target, *, window: int = 5) -> float:
    """First step t at which the smoothed curve is ≤ ``target`` (module docstring), in steps.

    Source: ntk_tt's own (README "Steps to an absolute target"), smoothed as T_ε is
    (METHOD.md §6; Zancato et al. 2020, Sec. 5, Alg. 1).

    Args:
      curve: 1-D loss or error curve (steps + 1,), predicted or measured; index = optimiser
        steps taken.
      target: the absolute target, in the curve's units: a mean loss L*, or an error rate e*
        (held-out accuracy ≥ A is the held-out error curve ≤ 1 − A).
      window: centred moving-average width w (odd; 1 = the raw curve).

    Returns:
      Optimiser steps as a Python float (0.0 when the curve starts at or below the target),
      or NaN when the curve has NaN or inf entries (a ``UserWarning`` names
      :func:`steps_to_target_report`, which gives the reason) or never reaches the target.
      Multiply by seconds per step for wall-clock time (:func:`ntk_tt.wall_clock_time`).

    Raises:
      ValueError: curve not numbers (a string, a ragged list, booleans) or not 1-D with ≥ 2
        entries; target not one finite real number (a string such as "0.5" included) or
        one that ``predict(targets=...)`` refuses on both a loss and an error curve (L* > 0,
        e* in [0, 1]: a negative target); window not odd in [1, len(curve)]; a traced curve
        or target (under ``jit`` / ``vmap``: use :func:`steps_to_target_array`).
    """
    t, why = steps_to_target_report(curve, target, window=window)
    if why == TARGET_REASONS[NON_FINITE]:
        first = int(np.flatnonzero(~np.isfinite(np.asarray(curve, float)))[0])
        warnings.warn(f"steps_to_target: the curve has NaN or inf entries (the first at step "
                      f"{first}), so NaN is returned; steps_to_target_report(curve, target) "
                      "returns the reason with the value.", UserWarning, stacklevel=2)
    return t


# several targets on one curve, compiled once per (curve length, number of targets, window)
_many = jax.jit(jax.vmap(steps_to_target_array, (None, 0, None)), static_argnums=2)


def curve_targets(curves: dict, targets: dict, *, window: int,
                  undefined: str | None = None) -> tuple[dict, dict]:
    """Steps to every target of ``targets`` ({curve: (target, ...)}, checked) on ``curves``
    ({curve: array (T + 1,) or None}): ({curve: {target: steps, NaN if undefined}},
    {curve: {target: reason}} for the undefined ones). ``undefined`` (a reason) makes every
    entry undefined (a diverged run, a prediction that cannot tell); a curve that is None
    (not predicted or not recorded) has every target undefined with the reason in
    ``curves``' place: pass a string instead of the array."""
    steps: dict = {}
    reasons: dict = {}
    for name, values in targets.items():
        curve = curves.get(name)
        steps[name], reasons[name] = {}, {}
        why = undefined or (curve if isinstance(curve, str) else None)
        if why is None:
            c = jnp.asarray(curve)
            c = c.astype(jnp.promote_types(c.dtype, jnp.float32))  # targets in its dtype
            ts, codes = jax.device_get(_many(c, jnp.asarray(values, c.dtype), window))
        for i, v in enumerate(values):
            if why is not None:
                steps[name][v], reasons[name][v] = float("nan"), why
                continue
            steps[name][v] = float(ts[i])
            if int(codes[i]):
                reasons[name][v] = TARGET_REASONS[int(codes[i])]
    return steps, reasons
