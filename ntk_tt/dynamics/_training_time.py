"""Training time T_ε of a loss or error curve, one definition for predicted and measured curves.

METHOD.md §6 (paper Sec. 5, Alg. 1), made precise: on a curve L_0..L_T (T + 1 entries, index
= optimiser steps taken),

1. smooth with a centred moving average of w steps (w odd; w = 1: no smoothing; at the ends
   the window shrinks symmetrically, so L̃_0 = L_0 and L̃_T is the raw last entry), giving L̃;
2. L_T = mean of the last w smoothed values; drop = L_0 − L_T with L_0 the raw first entry;
3. T_ε = the first t with |L̃_t − L_T| ≤ ε · drop.

T_ε is undefined (NaN, never 0) when the curve has non-finite entries, when the drop is not
clearly positive (≤ max(1e-3·|L_0|, 3·noise), noise = 1.4826 × the median absolute deviation
of L − L̃, the std for Gaussian noise that a spike training recovers from does not inflate: a
flat or rising curve), or when no step comes within ε·drop of L_T.
"""

from __future__ import annotations

import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._options import _describe, check_real

OK, NON_FINITE, NOT_DECREASING, NOT_SETTLED, DIVERGED, BEYOND_EDGE, INVALID, CALLED_DIVERGES = \
    range(8)
"""The reason codes (ints 0-7) of a T_ε: ``OK`` defined, the others why it is not;
``INVALID`` (6): a traced hyperparameter or data the eager checks would refuse (NaN T_ε)."""
REASONS = {
    OK: "defined: the first step of the smoothed curve within epsilon * (L_0 - L_T) of L_T",
    NON_FINITE: "curve has NaN or inf entries",
    NOT_DECREASING: "curve is flat or rising: L_0 - L_T is not clearly positive",
    NOT_SETTLED: "no step comes within epsilon * (L_0 - L_T) of L_T",
    DIVERGED: "training diverged (loss non-finite, or above L_0 at the end): no training time",
    BEYOND_EDGE: "beyond the stability edge: the linearised model cannot tell (cross-entropy on "
                 "a frozen kernel cannot blow up, so its curve says nothing of whether the real "
                 "run converges; use head=split_head(model) or a smaller learning rate)",
    INVALID: "invalid hyperparameters under jit / vmap (a learning rate or schedule, "
             "momentum, Adam's b2 or eps, or weight decay that the eager checks refuse, or an "
             "epsilon outside (0, 1)), or invalid data (labels outside [0, C), NaN or inf "
             "initial logits, a kernel whose top eigenvalue is NaN or negative): traced values "
             "cannot be refused, so this prediction is NaN; pass valid values",
    CALLED_DIVERGES: "predicted to diverge (the call on the real run is \"diverges\": the "
                     "predicted loss spiked above 10·L_0, or κ = η·λ_max/N ≥ 68, where the real "
                     "runs measured diverged; see divergence_reason): no training time, though "
                     "the linearised curve, kept in the result, did not end above L_0",
}
"""Reason code → the sentence a result, the CLI and the sweep give for it (see the codes above;
the sentences define T_ε's ε-rule of Zancato et al. 2020, Sec. 3, and ntk_tt's outcomes)."""


def curve_window(length: int) -> int:
    """The moving-average width that predicted and measured curves share: 5 steps, or 1 (no
    smoothing) for a curve of fewer than 5 entries (T < 4 steps)."""
    return 5 if length >= 5 else 1


def _check(curve, epsilon, window) -> jax.Array:
    traced = [name for name, v in (("curve", curve), ("epsilon", epsilon))
              if isinstance(v, jax.core.Tracer)]
    if traced:
        raise ValueError(
            f"{' and '.join(traced)} traced: training_time and training_time_report run "
            "eagerly and return Python floats; under jit, vmap or grad use "
            "training_time_array(curve, epsilon) (value and reason code) or "
            "smooth_training_time (differentiable)."
        )
    curve = _check_curve(curve, window)
    _check_epsilon(epsilon)
    return curve


def _check_curve(curve, window: int):
    """``curve`` checked (numbers, not bools; 1-D with >= 2 entries) and ``window`` (odd, in
    [1, len(curve)]); a traced curve has only its shape checked. Returns the curve as an array.
    Raises ValueError."""
    if not isinstance(curve, jax.core.Tracer):
        curve = jnp.asarray(_numbers(curve, "curve", "a 1-D array of numbers (a loss or error "
                                     "curve, one entry per step)"))
    if curve.ndim != 1 or curve.shape[0] < 2:
        raise ValueError(
            f"curve must be 1-D with steps + 1 >= 2 entries, got shape {curve.shape}; pass one "
            "curve at a time (vmap training_time_array for a batch)."
        )
    check_window(window, curve.shape[0])
    return curve


def check_not_complex(**values) -> None:
    """ValueError for a complex curve or threshold (a static dtype, checked under jit too): the
    ``*_array`` functions dropped the imaginary part, or failed inside ``jnp.quantile``."""
    for name, value in values.items():
        if jnp.iscomplexobj(value):
            raise ValueError(f"{name} must be real numbers, got the complex dtype "
                             f"{jnp.result_type(value)}; pass its real part if that is meant.")


def check_window(window, length: int) -> None:
    """ValueError unless ``window`` is an odd int in [1, ``length``] (static: checked under
    jit too, where the ``*_array`` functions took 0, an even width or one longer than the
    curve and returned a wrong time with a 'defined' code)."""
    if (not isinstance(window, (int, np.integer)) or isinstance(window, bool)
            or not 1 <= window <= length or window % 2 == 0):
        raise ValueError(
            f"window must be an odd int in [1, len(curve)] = [1, {length}] (centred moving "
            f"average), got {window!r}; e.g. window=5, or 1 for no smoothing."
        )


def _check_epsilon(epsilon) -> None:
    """ValueError unless ``epsilon`` is a real number (tracers pass) and, when concrete, a
    scalar in (0, 1)."""
    check_real(epsilon, "epsilon")
    if isinstance(epsilon, jax.core.Tracer):
        return
    eps = np.asarray(epsilon)
    if eps.ndim != 0 or not 0.0 < float(eps) < 1.0:
        raise ValueError(
            f"epsilon must be a scalar in (0, 1) (fraction of L_0 - L_T), got {epsilon!r}; "
            "e.g. 0.1 for 10%."
        )


def _numbers(value, name: str, what: str, dtype=None) -> np.ndarray | jax.Array:
    """``value`` as an array of numbers (converted to ``dtype`` if given, which also reads
    None entries as NaN; a jax array is kept as it is without ``dtype``), or a ValueError
    naming ``name``: strings (``"0.5"`` included), arrays of strings, ragged lists and other
    objects that are not numbers are refused, and so are booleans (True, a bool array)."""
    if isinstance(value, jax.Array) and dtype is None and value.dtype.kind != "b":
        return value
    arr = None
    if not isinstance(value, (str, bytes)):
        try:
            arr = np.asarray(value)
            if arr.dtype.kind in "iuf" or (dtype is not None and arr.dtype.kind == "O"):
                return arr if dtype is None else np.asarray(value, dtype=dtype)
        except (TypeError, ValueError):
            pass
    if arr is not None and arr.dtype.kind == "b":
        raise ValueError(f"{name} must be real numbers, got booleans ({_describe(value)}); "
                         f"pass {what}, not True/False.")
    kind = f" with dtype {arr.dtype}" if arr is not None else ""
    raise ValueError(f"{name} must be {what}, got {_describe(value)}{kind}; pass numbers (a "
                     "numeric array), not strings or ragged lists.")


def smooth(curve: jax.Array, window: int) -> jax.Array:
    """Centred moving average over ``window`` (odd) steps, same length.

    Symmetric at the ends: entry t averages t − h..t + h with h = min(window // 2, t, T − t),
    so the first and last entries stay the raw L_0 and L_T.
    """
    if window == 1:
        return curve
    last = curve.shape[0] - 1
    t = jnp.arange(curve.shape[0])
    h = jnp.minimum(jnp.minimum(window // 2, t), last - t)
    csum = jnp.concatenate([jnp.zeros(1, curve.dtype), jnp.cumsum(curve)])
    return (csum[t + h + 1] - csum[t - h]) / (2 * h + 1).astype(curve.dtype)


def _distance(curve, epsilon, window):
    """(|L̃_t − L_T| − ε·drop for every t, drop, threshold on drop)."""
    sm = smooth(curve, window)
    l_t = jnp.mean(sm[-window:])
    drop = curve[0] - l_t
    resid = curve - sm  # noise: 1.4826·MAD, a std that one recovered spike does not inflate
    noise = 1.4826 * jnp.median(jnp.abs(resid - jnp.median(resid)))
    floor = jnp.maximum(1e-3 * jnp.abs(curve[0]), 3.0 * noise)
    return jnp.abs(sm - l_t) - epsilon * drop, drop, floor


@partial(jax.jit, static_argnames="window")
def training_time_array(curve: jax.Array, epsilon, window: int = 5):
    """Jittable T_ε: ``(steps, code)``, steps a float (NaN when undefined), code an int32
    (0 = defined; otherwise a key of :data:`REASONS`). ``epsilon`` (a scalar) may be traced;
    ``window`` is static. No value checks (see :func:`training_time`): an ε outside (0, 1)
    or NaN gives NaN with code ``INVALID``, as an invalid traced hyperparameter does.

    Source: Zancato et al. 2020 (arXiv 2008.12478), Sec. 5, Alg. 1 (T_ε); METHOD.md §6, made
    precise by ntk_tt (module docstring).

    Raises:
      ValueError: ``curve`` not 1-D with >= 1 entry or ``epsilon`` not a scalar (shapes are
        static: one ε per call; ``jax.vmap`` over ε for several); ``window`` not an odd int
        in [1, len(curve)] (static, so checked under jit too).
    """
    if jnp.ndim(curve) != 1 or jnp.ndim(epsilon) != 0 or not jnp.shape(curve)[0]:
        raise ValueError(f"training_time_array takes a 1-D curve with >= 1 entry and a scalar "
                         f"epsilon, got shapes {jnp.shape(curve)} and {jnp.shape(epsilon)}: "
                         "for several ε use jax.vmap(training_time_array, in_axes=(None, 0)) "
                         "or a loop.")
    check_window(window, jnp.shape(curve)[0])
    check_not_complex(curve=curve, epsilon=epsilon)
    gap, drop, floor = _distance(curve, epsilon, window)
    hit = gap <= 0
    finite = jnp.all(jnp.isfinite(curve))
    code = jnp.where(
        ~((epsilon > 0) & (epsilon < 1)), INVALID, jnp.where(
            ~finite, NON_FINITE, jnp.where(drop <= floor, NOT_DECREASING,
                                           jnp.where(jnp.any(hit), OK, NOT_SETTLED))),
    ).astype(jnp.int32)
    t = jnp.argmax(hit).astype(curve.dtype)
    return jnp.where(code == OK, t, jnp.nan), code


def training_time_report(curve, epsilon, *, window: int | None = None
                         ) -> tuple[float, str | None]:
    """T_ε in steps and the reason it is undefined (None when defined): ``(NaN, reason)`` for
    a curve with NaN or inf entries, a flat or rising curve, or one that never comes within
    ε·drop of L_T. Eager, like :func:`training_time`, but it warns about nothing.

    Source: Zancato et al. 2020 (arXiv 2008.12478), Sec. 5, Alg. 1 (T_ε); METHOD.md §6, made
    precise by ntk_tt (module docstring).

    Args:
      curve: 1-D loss or error curve (steps + 1,), predicted or measured; index = optimiser
        steps taken.
      epsilon: ε in (0, 1), relative to the curve's drop L_0 − L_T.
      window: odd centred moving-average width w (1 = no smoothing); None (default):
        ``curve_window``'s, as :func:`training_time`.

    Returns:
      ``(t, reason)``: t, the Python float T_ε in optimiser steps of :func:`training_time`;
      reason, a sentence of :data:`REASONS`.

    Raises:
      ValueError: curve not numbers (a string, an array of strings, a ragged list, booleans:
        the message names ``curve``) or not 1-D with ≥ 2 entries, ε not a real number (e.g.
        the string "0.1") or ∉ (0, 1), window not odd in [1, len(curve)]; a traced curve or
        ε (under jit / vmap / grad: use :func:`training_time_array`).
    """
    curve = _check(curve, epsilon, 1 if window is None else window)
    window = curve_window(curve.shape[0]) if window is None else window
    t, code = training_time_array(curve, epsilon, window)
    return float(t), REASONS[int(code)] if int(code) else None


def training_time(curve, epsilon, *, window: int | None = None) -> float:
    """T_ε = first step t with |L̃_t − L_T| ≤ ε·(L_0 − L_T) (module docstring), in steps.

    Source: Zancato et al. 2020 (arXiv 2008.12478), Sec. 5, Alg. 1 (T_ε); METHOD.md §6, made
    precise by ntk_tt (module docstring).

    Args:
      curve: 1-D loss or error curve (steps + 1,), predicted or measured; index = steps.
      epsilon: threshold in (0, 1), relative to the curve's drop L_0 − L_T.
      window: centred moving-average width w (odd; 1 = no smoothing); L_T averages the last
        w. None (default): ``curve_window``, the width ``predict`` uses, 5 steps, or 1 for a
        curve of fewer than 5 entries (a prediction of T < 4 steps).

    Returns:
      T_ε as a Python float number of optimiser steps, or NaN ("not defined") when

      * the curve has NaN or inf entries (a diverged run, a broken pipeline): a
        ``UserWarning`` naming :func:`training_time_report` is also issued;
      * the curve is flat or rising (L_0 − L_T not clearly positive; never 0 then; no
        warning, and :func:`smooth_training_time` is NaN there too);
      * no step comes within ε·(L_0 − L_T) of L_T.

      :func:`training_time_report` returns the same value with the reason in words.

    Eager: it checks its arguments and returns a Python float, so it does not run under
    ``jax.jit`` / ``vmap`` / ``grad``; there, use :func:`training_time_array` (the value and
    a reason code, NaN when undefined, no warning) or the differentiable
    :func:`smooth_training_time`.

    Warns:
      UserWarning: the curve has NaN or inf entries (the result is NaN; the warning names
        the first such step and :func:`training_time_report`).

    Raises:
      ValueError: curve not numbers (a string, an array of strings, a ragged list, booleans:
        the message names ``curve``) or not 1-D with ≥ 2 entries, ε not a real number (e.g.
        the string "0.1") or ∉ (0, 1), window not odd in [1, len(curve)]; a traced curve or ε.
    """
    t, why = training_time_report(curve, epsilon, window=window)
    if why == REASONS[NON_FINITE]:
        first = int(np.flatnonzero(~np.isfinite(np.asarray(curve)))[0])
        warnings.warn(
            f"training_time: the curve has NaN or inf entries (the first at step {first}), so "
            "T_ε is undefined and NaN is returned; training_time_report(curve, epsilon) "
            "returns the reason with the value.", UserWarning, stacklevel=2)
    return t


def _check_temperature(temperature) -> None:
    """ValueError unless a concrete ``temperature`` is one finite number > 0 (a negative τ
    flipped every factor and gave ~0 steps; 0 divided by zero)."""
    if isinstance(temperature, jax.core.Tracer):
        return
    tau = _numbers(temperature, "temperature", "a number > 0")
    if tau.ndim != 0 or not (np.isfinite(tau) and tau > 0):
        raise ValueError(f"temperature must be one finite number > 0 (τ, the relative "
                         f"softness of the step count), got {temperature!r}; e.g. 0.05.")


def smooth_training_time(curve, epsilon, *, window: int = 5, temperature=0.05):
    """Differentiable T_ε: Σ_t Π_{s≤t} σ((|L̃_s − L_T| − ε·drop) / (τ·ε·drop)).

    Each factor is ~1 while the curve is still farther than ε·drop from L_T and ~0 after, so
    the sum counts the steps before the first hit; it tends to the hard T_ε as the relative
    temperature τ → 0. Jittable, ``jax.grad`` flows to the curve (and through it to η, m).

    Undefined as :func:`training_time`: NaN for a flat or rising curve (drop = L_0 − L_T not
    clearly positive, the same test as the hard T_ε, whose reason is
    ``REASONS[NOT_DECREASING]``, "curve is flat or rising: ...") and for a curve with NaN or
    inf entries (``REASONS[NON_FINITE]``); no warning (:func:`training_time` is silent on a
    flat curve too): :func:`training_time_report` (eager) or :func:`training_time_array`
    (traced) give the reason. There its gradient with respect to the curve is 0, never NaN
    (the NaN is a constant, computed apart from a stand-in falling curve), so one flat or
    diverged curve does not turn a batched ``jax.grad`` into NaN; filter with ``jnp.isnan``.
    A predictor's own backward pass through a configuration whose state overflowed (a
    diverged η) can still be NaN before it reaches this function (0·inf in its recursion):
    differentiate each configuration apart, ``jax.vmap(jax.grad(f))``, and mask the
    diverged ones, rather than ``jax.grad`` of a sum over a sweep. A curve that falls but
    never comes within ε·drop of L_T (the hard T_ε's third NaN, ``NOT_SETTLED``) still gets a
    value, about its number of steps. It sees the curve only: mask it with the prediction's
    ``training_time_code`` (a prediction beyond the stability edge, or called diverged, has no
    T_ε though its curve may fall).

    Source: ntk_tt's own differentiable relaxation (for :func:`ntk_tt.sensitivities`) of the
    T_ε of Zancato et al. 2020 (arXiv 2008.12478), Sec. 5, Alg. 1; METHOD.md §6.

    Args:
      curve: 1-D curve (steps + 1,). epsilon: in (0, 1) (traceable). window: static.
      temperature: τ > 0, relative to ε·drop.

    Returns:
      A scalar, T_ε in (fractional) optimiser steps, or NaN for a flat, rising or non-finite
      curve (above) and for a traced ε outside (0, 1) (``training_time_array``'s code
      ``INVALID``) or a traced ``temperature`` not finite and > 0 (a concrete one of either
      is refused), with gradient 0 there.

    Raises:
      ValueError: the same argument errors as :func:`training_time` (curve not numbers,
        booleans, not 1-D with ≥ 2 entries; ε not a real number, e.g. the string "0.1", or
        ∉ (0, 1); window not odd in [1, len(curve)]); ``temperature`` not one finite
        number > 0; values checked only when concrete.
    """
    curve = _check_curve(curve, window)
    check_not_complex(curve=curve, epsilon=epsilon)
    _check_epsilon(epsilon)
    _check_temperature(temperature)
    # a traced ε outside (0, 1) gives NaN (training_time_array: INVALID), computed at a
    # harmless ε so that the unused branch has no 0/0 in its gradient
    valid_eps = (epsilon > 0) & (epsilon < 1)
    epsilon = jnp.where(valid_eps, epsilon, 0.5)
    # a traced τ not finite and > 0 likewise (a concrete one is refused above): NaN, at τ = 1
    valid_tau = jnp.isfinite(temperature) & (temperature > 0)
    temperature = jnp.where(valid_tau, temperature, 1.0)
    _, drop, floor = _distance(curve, epsilon, window)
    falls = drop > floor  # training_time_array's test: NaN (NOT_DECREASING, NON_FINITE) else
    # the unused branch runs on a harmless falling curve, so that a rising, huge or non-finite
    # curve (a diverged prediction) gets gradient 0, not 0·inf = NaN
    curve = jnp.where(falls, curve, jnp.linspace(1.0, 0.0, curve.shape[0], dtype=curve.dtype))
    gap, drop, _ = _distance(curve, epsilon, window)
    log_far = jax.nn.log_sigmoid(gap / (temperature * epsilon * drop))
    return jnp.where(falls & valid_eps & valid_tau, jnp.sum(jnp.exp(jnp.cumsum(log_far))),
                     jnp.nan)


def wall_clock_time(steps, seconds_per_step):
    """Wall-clock training time = T_ε (steps) × measured seconds per optimiser step.

    Source: METHOD.md §6: T_ε × time per step, the combination that Zancato et al. 2020
    (arXiv 2008.12478) suggest but do not make.

    Args:
      steps: T_ε in optimiser steps, ≥ 0 or NaN (undefined): a number or an array (any
        shape; a list, NumPy or JAX array; None entries read as NaN).
      seconds_per_step: measured wall time of one optimiser step in seconds, finite ≥ 0: a
        number or an array broadcasting with ``steps``.

    Returns:
      Seconds, ``steps × seconds_per_step`` as float64 NumPy (a ``np.float64`` for two
      scalars, else the broadcast shape); NaN where ``steps`` is NaN.

    Raises:
      ValueError: ``steps`` or ``seconds_per_step`` not numbers (a string such as ``"0.5"``
        or a bool such as ``True`` included: the message names the argument), a negative or
        non-finite ``seconds_per_step``, or negative ``steps``.
    """
    steps_f = _numbers(steps, "steps", "a number or an array of numbers (a T_ε in optimiser "
                       "steps, NaN if undefined)", float)
    sps = _numbers(seconds_per_step, "seconds_per_step", "a number or an array of numbers (the "
                   "measured wall time of one optimiser step, e.g. 0.05)", float)
    if np.any(steps_f < 0):
        raise ValueError(f"steps must be >= 0 (a T_ε in optimiser steps, NaN if undefined), "
                         f"got {steps!r}.")
    if not np.all(np.isfinite(sps)) or np.any(sps < 0):
        raise ValueError(
            f"seconds_per_step must be finite and >= 0 (measured wall time of one optimiser "
            f"step), got {seconds_per_step!r}."
        )
    return steps_f * sps
