"""The argument checks of the what-if analysis (``ntk_tt.analysis._whatif``): every
ValueError before any work, and the validated problem (plain kernel or head-aware)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._options import FLOAT32_MAX, FLOAT32_TINY, MAX_STEPS, _is_int
from ntk_tt.analysis._whatif_optimizer import (
    DEFAULT_WARMUP_SMOOTHING,
    PEAK_FIELDS,
    hyperparameter_names,
)
from ntk_tt.data._batches import path_batch_indices
from ntk_tt.data._inputs import _check_finite, as_array, check_key, check_real
from ntk_tt.dynamics._adam_drift import drift_in_dtype
from ntk_tt.dynamics._adam_head_aware import AdamKernel, _check_precond, _maybe_nonzero
from ntk_tt.dynamics._checks import (
    check_adam_kernel,
    check_f0_shape,
    check_gram,
    check_num_paths,
    check_problem,
    check_test_kernel,
    float_logits,
    solve_dtype_fields,
)
from ntk_tt.dynamics._fspace import as_operator
from ntk_tt.dynamics._losses import check_loss
from ntk_tt.dynamics._optim_linear import check_tangent, decay_needs_tangent
from ntk_tt.dynamics._predict_head_aware import validate as validate_head_aware
from ntk_tt.kernels._head_aware import HeadAwareKernel
from ntk_tt.training._optimizer_run import check_learning_rates


def _check_scalar_in(value, name: str, low: float, high: float | None, hint: str,
                     low_open: bool = True) -> None:
    """ValueError unless ``value`` is a real scalar in (low, high) (low closed if not
    ``low_open``); values checked only when concrete."""
    check_real(value, name)
    if np.ndim(value) != 0:
        raise ValueError(f"{name} must be a scalar, got shape {np.shape(value)}; {hint}")
    if isinstance(value, jax.core.Tracer):
        return
    v = float(np.asarray(value))
    ok = np.isfinite(v) and (v > low if low_open else v >= low) and (high is None or v < high)
    if not ok:
        bounds = f"{'(' if low_open else '['}{low:g}, {'inf' if high is None else f'{high:g}'})"
        raise ValueError(f"{name} must be in {bounds}, got {value!r}; {hint}")


def _check_point(learning_rate, momentum, epsilon, temperature, accuracy_temperature,
                 window, steps) -> None:
    _check_scalar_in(learning_rate, "learning_rate", 0.0, None,
                     "pass the optax sgd step size as a positive float, e.g. 1e-3 "
                     "(divergence_boundary scans a range).")
    _check_scalar_in(momentum, "momentum", 0.0, 1.0,
                     "use 0.0 for plain (S)GD, e.g. 0.9 for heavy ball.", low_open=False)
    _check_measures(epsilon, temperature, accuracy_temperature, window, steps)


def _check_measures(epsilon, temperature, accuracy_temperature, window, steps) -> None:
    """The checks of what is measured on the predicted curves (ε, both temperatures, the T_ε
    window and the number of steps)."""
    _check_epsilon(epsilon)
    _check_scalar_in(temperature, "temperature", 0.0, None,
                     "it is the relative softness of smooth_training_time, e.g. 0.02.")
    _check_scalar_in(accuracy_temperature, "accuracy_temperature", 0.0, None,
                     "it is the logit-margin scale of the smoothed accuracy, e.g. 0.1.")
    _check_window(window, steps)


def _check_epsilon(epsilon) -> None:
    _check_scalar_in(epsilon, "epsilon", 0.0, 1.0,
                     "it is a fraction of the loss fall L_0 - L_T, e.g. 0.1 for 10 %.")


def _check_window(window, steps) -> None:
    if isinstance(steps, jax.core.Tracer):  # as the predictors say it (check_sizes)
        raise ValueError("steps cannot be traced (jit / vmap / grad over it): it sets the "
                         "recursion's length; call once per steps value and sweep the "
                         "learning rate and momentum inside.")
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be an int >= 1 (optimiser updates), got {steps!r}.")
    if _is_int(window) and window % 2 == 1 and window > steps + 1:  # e.g. the default 5
        raise ValueError(
            f"steps = {steps} is too short for the T_ε smoothing window (window = {window} "
            f"steps, default 5): the predicted curve has steps + 1 = {steps + 1} entries; use "
            f"steps >= {window - 1}, or pass an odd window <= {steps + 1} (window=1: no "
            "smoothing).")
    if (isinstance(window, bool) or not isinstance(window, (int, np.integer))
            or not 1 <= window <= steps + 1 or window % 2 == 0):
        raise ValueError(
            f"window must be an odd int in [1, steps + 1] = [1, {steps + 1}] (the centred "
            f"moving average of training_time), got {window!r}; e.g. window=5, or 1 for none."
        )


def _as_kernel(kernel):
    """Θ as an array (``as_array``'s checks); a ``(Θ, f0)`` pair of 2-D arrays passed as
    ``kernel`` (ragged, or a 3-D stack when N = C) is refused with where each goes."""
    pair = isinstance(kernel, (tuple, list)) and len(kernel) == 2 and all(
        isinstance(k, (np.ndarray, jax.Array)) and k.ndim == 2 for k in kernel)
    try:
        arr = as_array(kernel, "kernel")
    except ValueError as err:
        if not pair:
            raise
        said = str(err)
    else:  # two arrays of one shape: stacked into a 3-D "kernel"
        said = f"kernel is a {type(kernel).__name__} of two arrays, not one Θ."
    if pair:
        raise ValueError(
            f"{said} It looks like a (Θ, f0) pair (shapes {kernel[0].shape} and "
            f"{kernel[1].shape}): pass Θ as kernel and the initial logits as f0=, e.g. "
            "sensitivities(kernel, y, f0=f0, ...) or divergence_boundary(kernel, y, f0=f0, "
            "...).")
    return arr


class _Plain(NamedTuple):
    """Validated plain-kernel problem: Θ as ``(mat, traced)``, f0, held-out parts or None."""

    mat: jax.Array
    f0: jax.Array
    test_mat: jax.Array | None
    f0_test: jax.Array | None


def _prepare(kernel, y, *, f0, kernel_test, f0_test, y_test, learning_rate, momentum, steps,
             batch_size, loss, key, num_paths):
    """Validate everything (before any work); returns ``(kind, data, y, y_test, batch_size,
    static extras)`` with kind "plain" or "head_aware"."""
    check_loss(loss)
    check_key(key)
    check_num_paths(num_paths)
    if not isinstance(kernel, HeadAwareKernel):
        kernel = _as_kernel(kernel)
    rows = kernel.features if isinstance(kernel, HeadAwareKernel) else kernel
    if (np.ndim(rows) >= 1 and np.shape(rows)[0] == 0) or (np.ndim(y) == 1
                                                          and np.shape(y)[0] == 0):
        raise ValueError(f"the kernel / labels are empty (N = 0: kernel of shape "
                         f"{np.shape(rows)}, y of shape {np.shape(y)}); pass the kernel and "
                         "labels of at least one training sample.")
    if isinstance(kernel, HeadAwareKernel):
        if f0 is not None or kernel_test is not None or f0_test is not None:
            raise ValueError(
                "a HeadAwareKernel carries its own logits (features @ W + b) and held-out "
                "features: drop f0, kernel_test and f0_test (pass y_test for the held-out "
                "labels).")
        n_hk = np.shape(kernel.features)[0] if np.ndim(kernel.features) else None
        if np.ndim(y) == 1 and np.shape(y)[0] != n_hk:
            raise ValueError(
                f"the HeadAwareKernel was built on N = {n_hk} inputs (features of shape "
                f"{np.shape(kernel.features)}), but y has N = {np.shape(y)[0]} labels: build "
                "it with ntk_tt.head_aware_kernel(split, x) on the inputs x of these labels.")
        y, y_test, batch_size = validate_head_aware(
            kernel, y, y_test, learning_rate=learning_rate, momentum=momentum, steps=steps,
            batch_size=batch_size, loss=loss, key=key, num_paths=num_paths)
        if kernel.features_test is None and y_test is not None:
            raise ValueError("y_test given but the HeadAwareKernel has no held-out features: "
                             "build it with head_aware_kernel(split, x, x_test), or drop "
                             "y_test.")
        hk = solve_dtype_fields(kernel)[0]  # one dtype, >= float32 (README, "Dtypes")
        return "head_aware", hk, y, y_test, batch_size, {}
    if f0 is None:
        raise ValueError(
            "a plain kernel Θ needs f0, the initial logits (N, C) at the pre-trained weights: "
            "pass f0=apply_fn(params, x) (or give a HeadAwareKernel).")
    f0 = as_array(f0, "f0")
    check_f0_shape(kernel, f0, y)
    f0 = float_logits(f0, kernel)
    n, c, batch_size, y = check_problem(f0, y, loss, learning_rate, momentum, steps, batch_size)
    if batch_size < n and key is None:
        raise ValueError("SGD (batch_size < N) is random: pass key=jax.random.key(seed).")
    _check_finite(kernel, "kernel")
    check_gram(kernel)  # as predict_from_kernel: symmetric, diagonal >= 0
    dtype = jnp.asarray(f0).dtype
    mat, traced = as_operator(jnp.asarray(kernel, dtype), n, c, name="kernel")
    test_mat = test_traced = None
    if (kernel_test is None) != (f0_test is None) or (kernel_test is None
                                                     and y_test is not None):
        raise ValueError(
            "held-out data need all three of kernel_test Θ(x_test, x), f0_test (N_test, C) "
            "and y_test (N_test,), or none of them.")
    if kernel_test is not None:
        test_mat, test_traced, f0_test, y_test = check_test_kernel(kernel_test, f0_test, y_test,
                                                                   n, c, dtype)
    data = _Plain(mat, jnp.asarray(f0), test_mat, f0_test)
    return "plain", data, y, y_test, batch_size, dict(traced=traced, test_traced=test_traced)


def _check_grid(values, name: str, low: float, high: float | None, hint: str) -> np.ndarray:
    if isinstance(values, (int, float)):  # a bare number: "convert it with np.asarray" gave 0-D
        values = [values]  # (any other 0-D number is reshaped below)
    values = as_array(values, name)
    if isinstance(values, jax.core.Tracer):
        raise ValueError(f"{name} must be concrete (the grid is evaluated eagerly), got a "
                         "tracer; call divergence_boundary outside jit.")
    arr = np.asarray(values)
    if arr.ndim == 0 and arr.dtype.kind in "iuf":  # np.float32(0.1), jnp.array(0.1): one point
        arr = arr.reshape(1)
    if arr.ndim != 1 or arr.shape[0] < 1 or arr.dtype.kind not in "iuf":
        raise ValueError(f"{name} must be a 1-D array of real numbers with at least one "
                         f"entry, got shape {arr.shape} and dtype {arr.dtype}; {hint}")
    arr = arr.astype(float)
    if high is None:  # learning rates: float32's normal range (1e-50 is 0 in float32)
        ok = np.isfinite(arr) & (arr >= max(low, FLOAT32_TINY)) & (arr <= FLOAT32_MAX)
        rng = f"[{max(low, FLOAT32_TINY):.8g}, {FLOAT32_MAX:.8g}] (float32's normal range)"
    else:
        ok = np.isfinite(arr) & (arr >= low) & (arr < high)
        rng = f"[{low:g}, {high:g})"
    if not np.all(ok):
        i = int(np.flatnonzero(~ok)[0])
        raise ValueError(f"{name}[{i}] = {float(arr[i]):g} is outside {rng}; {hint}")
    if arr.shape[0] > 1 and not np.all(np.diff(arr) > 0):
        raise ValueError(f"{name} must be strictly increasing; sort it (np.unique does).")
    return arr


class _OptimizerProblem(NamedTuple):
    """A validated ``sensitivities(..., optimizer=)`` problem (``_whatif_optimizer``)."""

    kind: str  # "plain" | "head_aware" | "adam"
    data: object  # _Plain, HeadAwareKernel or (HeadAwareKernel, preconditioned one, DriftTable)
    y: jax.Array
    y_test: jax.Array | None
    optimizer: object
    batches: jax.Array  # (P, T, B)
    tangents: tuple  # (a, a_test), None where absent
    names: tuple
    warm: float | None
    traced: bool
    test_traced: bool
    dtype: object


def _warmup_smoothing(schedule, warmup_smoothing) -> float | None:
    """The smoothing (steps) the warmup derivative is taken with (None: no warmup)."""
    if not hasattr(schedule, "warmup"):
        if warmup_smoothing is not None:
            raise ValueError(f"warmup_smoothing applies to a schedule with a warmup "
                             f"(warmup_cosine, warmup_stable_decay), not to "
                             f"{type(schedule).__name__}: drop it.")
        return None
    if schedule.smoothing > 0:
        if warmup_smoothing is not None:
            raise ValueError(f"the schedule has its own smoothing={schedule.smoothing}, on which "
                             "the warmup derivative is taken: drop warmup_smoothing.")
        return schedule.smoothing
    if warmup_smoothing is None:
        return DEFAULT_WARMUP_SMOOTHING
    _check_scalar_in(warmup_smoothing, "warmup_smoothing", 0.0, None,
                     "it is the width in steps of the warmup relaxation (0 = the exact ramp), "
                     "e.g. 0.25, the default (a whole step can bias the derivative).",
                     low_open=False)
    return float(warmup_smoothing)


def _prepare_optimizer(kernel, y, optimizer, *, steps, key, y_test, f0, kernel_test, f0_test,
                       a, a_test, loss, num_paths, warmup_smoothing) -> _OptimizerProblem:
    """Validate ``sensitivities(..., optimizer=)`` (every ValueError before any work)."""
    if type(optimizer.learning_rate).__name__ not in PEAK_FIELDS:
        raise ValueError(
            "sensitivities differentiates the schedule's numbers; a callable schedule has none "
            "as leaves: use ntk_tt.constant, warmup_cosine, warmup_stable_decay or exponential.")
    warm = _warmup_smoothing(optimizer.learning_rate, warmup_smoothing)
    peak = check_learning_rates(optimizer, steps)
    if peak is None:
        raise ValueError(f"steps must be an int >= 1 and <= {MAX_STEPS:,} (optimiser updates), "
                         f"got {steps!r}.")
    adam = optimizer.rule == "adam"
    if isinstance(kernel, AdamKernel) != adam:
        raise ValueError(
            "Adam is predicted by the fast head-aware Adam predictor: pass kernel="
            "ntk_tt.adam_head_aware_kernel(split, x, y, optimizer, x_test)." if adam else
            "an AdamKernel is for an Adam optimizer: pass its .hk for SGD.")
    if adam and not optimizer.decoupled and (a is not None
                                             or _maybe_nonzero(optimizer.weight_decay)):
        raise ValueError("the fast Adam predictor has no L2 weight decay (it enters Adam's "
                         "elementwise moments): use ntk_tt.adamw(...) for weight decay, or drop "
                         "a.")
    kind, data, y, y_test, bs, extra = _prepare(
        kernel.hk if adam else kernel, y, f0=f0, kernel_test=kernel_test, f0_test=f0_test,
        y_test=y_test, learning_rate=peak, momentum=optimizer.momentum, steps=steps,
        batch_size=optimizer.batch_size, loss=loss, key=key, num_paths=num_paths)
    n, cols = data.f0.shape if kind == "plain" else data.features.shape
    held = data.f0_test if kind == "plain" else data.features_test
    dtype = data.f0.dtype if kind == "plain" else data.features.dtype
    if adam:
        check_adam_kernel(kernel, optimizer, bs, "the AdamKernel", loss, y)
        kind, data = "adam", (data, _check_precond(kernel.precond, data),
                              drift_in_dtype(kernel.drift, dtype))
    decay_needs_tangent(optimizer, a, "a")
    if a is None and a_test is not None:
        raise ValueError("a_test (J·θ0 on the held-out inputs) needs a on the training ones.")
    if (a is not None) and (held is None) != (a_test is None):
        raise ValueError("a_test goes with held-out data and a: pass a_test = "
                         "ntk_tt.weight_tangent(fn, params, x_test) with held-out data, or drop "
                         "it without.")
    tangents = (check_tangent(a, n, cols, "a", dtype),
                None if a_test is None else check_tangent(a_test, held.shape[0], cols, "a_test",
                                                          dtype))
    batches = (path_batch_indices(key, n, bs, steps, num_paths) if bs < n
               else jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (1, steps, n)))
    return _OptimizerProblem(kind, data, y, y_test, optimizer, batches, tangents,
                             hyperparameter_names(optimizer, a is not None), warm,
                             extra.get("traced", False), extra.get("test_traced", False), dtype)
