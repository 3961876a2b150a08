"""What-if analysis from one kernel: how the prediction moves with η and m, and where it
diverges (issue 13, item 2).

Two questions a researcher asks before a fine-tune, answered from the empirical NTK alone:

* :func:`sensitivities`: at one (η, m), the predicted T_ε, final training loss L_T and final
  held-out accuracy, with their derivatives with respect to η and m (forward-mode
  ``jax.jacfwd`` through the exact discrete recursion, METHOD.md §2) and the elasticities
  d log Q / d log η. T_ε is the differentiable :func:`ntk_tt.smooth_training_time` of the
  predicted mean loss curve (METHOD.md §6), beside the hard :func:`ntk_tt.training_time`.
  The hard held-out accuracy is piecewise constant in η and m (its derivative is 0 almost
  everywhere), so the derivatives are those of a smoothed accuracy, the mean of
  σ(margin / τ_acc) over held-out samples (margin = true-class logit minus the largest
  other logit), which tends to the hard accuracy as τ_acc → 0.
* :func:`divergence_boundary`: the prediction on an η × m grid in one ``jit(vmap(vmap))``
  sharing the kernel, the predicted ``diverged`` flag (``ntk_tt.dynamics._divergence``: a non-finite
  loss or L_T > L_0), T_ε and L_T on the grid, and for each m the largest grid η below the
  first diverging one: the predicted stability boundary. For MSE and full-batch GD on a
  frozen kernel it is the linear model's edge η·λ_max/N = 2(1 + m) (heavy ball; METHOD.md §2,
  ``beyond_edge`` of :func:`ntk_tt.predict_from_kernel`) up to the grid spacing.

:func:`plot_whatif` draws the grid. Both computations use the exact discrete recursion
(``method="discrete"``, the default of ``predict``): the plain kernel Θ through
:func:`ntk_tt.predict_from_kernel`'s solver (f0 needed), a :class:`ntk_tt.HeadAwareKernel`
through :func:`ntk_tt.predict_head_aware`'s. Time is in optimiser steps; losses are MEAN
losses over the training samples.
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt.data._inputs import as_array, check_key, check_real
from ntk_tt.dynamics._checks import (
    _check_finite,
    check_f0_shape,
    check_num_paths,
    check_problem,
    check_test_kernel,
    float_logits,
    solve_dtype_fields,
)
from ntk_tt.dynamics._discrete import discrete_paths, discrete_trajectory
from ntk_tt.dynamics._fspace import as_operator, clamp_psd
from ntk_tt.dynamics._losses import check_loss, mean_loss
from ntk_tt.dynamics._predict_kernel import _summarise, predict_from_kernel
from ntk_tt.dynamics._training_time import DIVERGED, OK, smooth_training_time, training_time_array
from ntk_tt.kernels._head_aware import (
    HeadAwareKernel,
    head_aware_paths,
    initial_eigenvalues,
    predict_head_aware,
)
from ntk_tt.kernels._head_aware import validate as validate_head_aware


class Sensitivities(NamedTuple):
    """Result of :func:`sensitivities` (all float scalars unless stated).

    learning_rate, momentum: the point (η, m) the derivatives are taken at.
    training_time: T_ε of the predicted mean training-loss curve by
      :func:`ntk_tt.smooth_training_time`, in (fractional) optimiser steps; NaN where the hard
      T_ε is undefined (diverged, flat, not settled). training_time_hard: the hard
      :func:`ntk_tt.training_time` of the same curve (whole steps, NaN when undefined);
      training_time_code: int32, 0 when defined, else a key of
      ``ntk_tt.dynamics._training_time.REASONS``.
    final_loss: predicted mean training loss L_T after ``steps`` updates.
    test_accuracy: predicted held-out accuracy after ``steps`` updates (1 − error, the figure
      ``compare`` reports); NaN without held-out data or when diverged. soft_test_accuracy: the
      smoothed accuracy mean σ(margin/τ_acc) whose derivatives are given (NaN likewise).
    d_training_time_d_lr, d_training_time_d_momentum: dT_ε/dη (steps per unit η), dT_ε/dm.
    d_final_loss_d_lr, d_final_loss_d_momentum: dL_T/dη, dL_T/dm.
    d_test_accuracy_d_lr, d_test_accuracy_d_momentum: d(soft accuracy)/dη, /dm.
    training_time_elasticity, final_loss_elasticity, test_accuracy_elasticity:
      d log Q / d log η = (η/Q)·dQ/dη (dimensionless: +1 means Q grows in proportion to η).
    diverged: bool, the prediction diverged (every derivative is then NaN).
    kappa: η·λ_max(Θ)/N (Θ_0 for the head-aware kernel). beyond_edge: bool, κ beyond the
      linear model's stability edge (see :class:`ntk_tt.KernelPrediction`).
    """

    learning_rate: jax.Array
    momentum: jax.Array
    training_time: jax.Array
    training_time_hard: jax.Array
    training_time_code: jax.Array
    final_loss: jax.Array
    test_accuracy: jax.Array
    soft_test_accuracy: jax.Array
    d_training_time_d_lr: jax.Array
    d_training_time_d_momentum: jax.Array
    d_final_loss_d_lr: jax.Array
    d_final_loss_d_momentum: jax.Array
    d_test_accuracy_d_lr: jax.Array
    d_test_accuracy_d_momentum: jax.Array
    training_time_elasticity: jax.Array
    final_loss_elasticity: jax.Array
    test_accuracy_elasticity: jax.Array
    diverged: jax.Array
    kappa: jax.Array
    beyond_edge: jax.Array


class WhatIfGrid(NamedTuple):
    """Result of :func:`divergence_boundary` (G_m = len(momenta), G_η = len(learning_rates)).

    learning_rates (G_η,), momenta (G_m,): the grid, ascending η.
    diverged: bool (G_m, G_η), the predicted run diverged (non-finite loss or L_T > L_0).
    training_time: (G_m, G_η) hard T_ε of the predicted mean loss curve at ``epsilon``, in
      optimiser steps; NaN where undefined (diverged included).
    final_loss: (G_m, G_η) predicted mean training loss L_T (a diverged run's is held at its
      last finite value, as in :class:`ntk_tt.KernelPrediction`).
    test_accuracy: (G_m, G_η) predicted held-out accuracy at T; NaN without held-out data
      or where diverged.
    kappa: (G_η,) η·λ_max/N. beyond_edge: bool (G_m, G_η), κ beyond the linear model's
      stability edge 2(1 + m)/h (a formula, not the prediction).
    boundary: (G_m,) for each m the largest grid η below the first diverged one: the
      predicted divergence boundary; NaN when the smallest η already diverges, the largest
      grid η when none does (then ``boundary_inside`` is False).
    boundary_inside: bool (G_m,), some grid η diverged at that m (the boundary lies inside
      the grid). monotone: bool (G_m,), no grid η above the first diverged one recovers
      (False flags e.g. SGD noise or a cross-entropy catapult at that m).
    epsilon: the ε of ``training_time`` (a Python float). steps: T (a Python int).

    Printed (``repr``), arrays show as plain numbers ``[0.01, 0.1]`` (numpy's summary for
    large ones), not ``array(...)`` / ``np.float64(...)``; the fields stay numpy arrays.
    """

    learning_rates: np.ndarray
    momenta: np.ndarray
    diverged: np.ndarray
    training_time: np.ndarray
    final_loss: np.ndarray
    test_accuracy: np.ndarray
    kappa: np.ndarray
    beyond_edge: np.ndarray
    boundary: np.ndarray
    boundary_inside: np.ndarray
    monotone: np.ndarray
    epsilon: float
    steps: int

    def __repr__(self) -> str:
        def show(v):
            if isinstance(v, np.ndarray):
                return np.array2string(v, separator=", ", threshold=100, precision=6)
            return repr(v.item() if isinstance(v, np.generic) else v)

        body = ", ".join(f"{k}={show(v)}" for k, v in zip(self._fields, self, strict=True))
        return f"WhatIfGrid({body})"


# -- validation -------------------------------------------------------------------------------


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
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be an int >= 1 (optimiser updates), got {steps!r}.")
    if (isinstance(window, bool) or not isinstance(window, (int, np.integer))
            or not 1 <= window <= steps + 1 or window % 2 == 0):
        raise ValueError(
            f"window must be an odd int in [1, steps + 1] = [1, {steps + 1}] (the centred "
            f"moving average of training_time), got {window!r}; e.g. window=5, or 1 for none."
        )


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
    kernel = as_array(kernel, "kernel")
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


# -- the prediction with its held-out logits -------------------------------------------------


def _clamped(kind, data):
    """The symmetrised, clamped kernel (None for the head-aware model, whose solver does not
    read Θ_0) and (λ_min, λ_max): independent of η and m."""
    if kind == "plain":
        return clamp_psd(data.mat)
    return None, initial_eigenvalues(data)


def _paths(kind, data, psd, y, lr, m, key, *, traced, test_traced, steps, batch_size,
           nesterov, loss, num_paths):
    """Training and held-out logits (P, T + 1, N, C), (P, T + 1, N_test, C) or None: the
    solver of ``predict_from_kernel(method="discrete")`` / ``predict_head_aware``."""
    if kind == "head_aware":
        return head_aware_paths(data, y, key=key, num_paths=num_paths, batch_size=batch_size,
                                steps=steps, learning_rate=lr, momentum=m, nesterov=nesterov,
                                loss=loss)
    op = (psd, traced)
    test_op = None if data.test_mat is None else (data.test_mat, test_traced)
    n = data.f0.shape[0]
    common = dict(learning_rate=lr, momentum=m, nesterov=nesterov, loss=loss, test_op=test_op,
                  f0_test=data.f0_test)
    if batch_size < n:
        return discrete_paths(op, data.f0, y, key=key, num_paths=num_paths,
                              batch_size=batch_size, steps=steps, **common)
    batches = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (steps, n))
    fs, fts = discrete_trajectory(op, data.f0, y, batches, **common)
    return fs[None], None if fts is None else fts[None]


def soft_accuracy(logits: jax.Array, y: jax.Array, temperature) -> jax.Array:
    """mean_i σ((f_i,y_i − max_{c≠y_i} f_i,c) / τ): a smooth accuracy in (0, 1) that tends to
    the arg-max accuracy as τ → 0 (ties aside). logits (N, C), y (N,) → scalar."""
    c = logits.shape[-1]
    true = jnp.take_along_axis(logits, y[:, None], axis=-1)[:, 0]
    other = jnp.max(jnp.where(jax.nn.one_hot(y, c, dtype=bool), -jnp.inf, logits), axis=-1)
    return jnp.mean(jax.nn.sigmoid((true - other) / temperature))


@partial(jax.jit, static_argnames=("kind", "traced", "test_traced", "steps", "batch_size",
                                   "nesterov", "loss", "num_paths", "window"))
def _sensitivity_core(data, y, y_test, lr, m, key, epsilon, temperature, acc_temperature, *,
                      kind, traced, test_traced, steps, batch_size, nesterov, loss, num_paths,
                      window):
    psd, lams = _clamped(kind, data)
    static = dict(traced=traced, test_traced=test_traced, steps=steps, batch_size=batch_size,
                  nesterov=nesterov, loss=loss, num_paths=num_paths)

    def quantities(point):
        # only what the derivatives need is traced with tangents; the rest of the summary
        # (divergence, κ, T_ε codes) is computed once from the primal logits below
        fs, fts = _paths(kind, data, psd, y, point[0], point[1], key, **static)
        loss_c = jnp.mean(jax.vmap(jax.vmap(lambda f: mean_loss(f, y, loss)))(fs), axis=0)
        t_soft = smooth_training_time(loss_c, epsilon, window=window,
                                      temperature=temperature)
        if fts is None:
            soft = jnp.full((), jnp.nan, loss_c.dtype)
        else:
            soft = jnp.mean(jax.vmap(lambda f: soft_accuracy(f[-1], y_test, acc_temperature))(
                fts))
        out = jnp.stack([t_soft, loss_c[-1], soft])
        return out, (out, fs, fts)

    jac, (values, fs, fts) = jax.jacfwd(quantities, has_aux=True)(jnp.stack([lr, m]))
    size = psd.shape[0] if kind == "plain" else fs.shape[2] * fs.shape[3]  # Θ_0: N·C
    pred = _summarise(fs, fts, y, y_test, size, lr, m, lams, nesterov=nesterov, loss=loss,
                      stochastic=fs.shape[0] > 1)
    acc = (jnp.full((), jnp.nan, values.dtype) if fts is None
           else 1.0 - pred.test_error[-1])
    t_hard, code = training_time_array(pred.loss, epsilon, window)
    diverged = pred.diverged
    t_hard = jnp.where(diverged, jnp.nan, t_hard)
    defined = (code == OK) & ~diverged
    nan = jnp.asarray(jnp.nan, values.dtype)
    jac = jnp.where(diverged, nan, jac)
    if y_test is None:  # no held-out data: the accuracy row is NaN, not a derivative of 0
        jac = jac.at[2].set(nan)
    t_soft = jnp.where(defined, values[0], nan)
    d_t = jnp.where(defined, jac[0], nan)
    soft = jnp.where(diverged, nan, values[2])
    acc = jnp.where(diverged, nan, acc)

    def elastic(value, d_lr):
        return lr * d_lr / value

    return Sensitivities(
        learning_rate=lr, momentum=m,
        training_time=t_soft, training_time_hard=t_hard,
        training_time_code=jnp.where(diverged, DIVERGED, code).astype(jnp.int32),
        final_loss=pred.loss[-1], test_accuracy=acc, soft_test_accuracy=soft,
        d_training_time_d_lr=d_t[0], d_training_time_d_momentum=d_t[1],
        d_final_loss_d_lr=jac[1, 0], d_final_loss_d_momentum=jac[1, 1],
        d_test_accuracy_d_lr=jac[2, 0], d_test_accuracy_d_momentum=jac[2, 1],
        training_time_elasticity=elastic(t_soft, d_t[0]),
        final_loss_elasticity=elastic(pred.loss[-1], jac[1, 0]),
        test_accuracy_elasticity=elastic(soft, jac[2, 0]),
        diverged=diverged, kappa=pred.kappa, beyond_edge=pred.beyond_edge)


def sensitivities(
    kernel, y, *, learning_rate, momentum=0.0, steps, epsilon=0.1, batch_size=None,
    key=None, y_test=None, f0=None, kernel_test=None, f0_test=None, nesterov=False,
    loss="cross_entropy", num_paths=32, window=5, temperature=0.02, accuracy_temperature=0.1,
) -> Sensitivities:
    """Predicted T_ε, final loss and held-out accuracy at (η, m), with d/dη, d/dm and
    elasticities d log Q / d log η (paper Secs. 3–5; METHOD.md §2, §3, §6).

    The prediction is the exact discrete recursion of the linearised model
    (:func:`ntk_tt.predict_from_kernel` with ``method="discrete"``) for a plain kernel Θ, or
    the head-aware model (:func:`ntk_tt.predict_head_aware`, METHOD.md §10) for a
    :class:`ntk_tt.HeadAwareKernel`. Derivatives are exact forward-mode derivatives
    (``jax.jacfwd`` over (η, m), one compiled call) of the same functions: T_ε by
    :func:`ntk_tt.smooth_training_time` on the predicted mean training-loss curve (it tends
    to the hard T_ε as ``temperature`` → 0; the hard one is returned beside it), L_T, and the
    smoothed held-out accuracy mean σ(margin/``accuracy_temperature``) (the hard accuracy is
    piecewise constant in η and m, so its own derivative is 0 almost everywhere). For SGD
    (``batch_size`` < N) the curves are means over ``num_paths`` batch orders drawn from
    ``key`` (common random numbers across η and m), as in ``predict_from_kernel``.

    Args:
      kernel: Θ (N·C, N·C) sample-major or (N, N) logit-summed (then ``f0`` is required), or
        a :class:`ntk_tt.HeadAwareKernel` (then ``f0``, ``kernel_test``, ``f0_test`` must be
        None; its held-out features, if any, need ``y_test``).
      y: integer labels (N,).
      learning_rate: η > 0, a scalar. momentum: m ∈ [0, 1), a scalar (heavy ball; Nesterov
        with ``nesterov=True``).
      steps: T optimiser updates. epsilon: ε ∈ (0, 1), the fraction of the loss fall
        L_0 − L_T that defines T_ε. batch_size: B (None = N, full-batch GD).
      key: ``jax.random.key(seed)`` for the SGD batch orders (needed when B < N).
      y_test (N_test,), f0 (N, C), kernel_test Θ(x_test, x) (N_test·C, N·C) or
        (N_test, N), f0_test (N_test, C): as :func:`ntk_tt.predict_from_kernel`.
      nesterov, loss, num_paths: as :func:`ntk_tt.predict_from_kernel`.
      window: odd smoothing window of T_ε (as :func:`ntk_tt.training_time`).
      temperature: τ > 0 of :func:`ntk_tt.smooth_training_time`, relative to ε·drop.
        Default 0.02, lower than that function's 0.05: on a curve that approaches L_T
        slowly (the README example, T_0.1 = 51 of 150 steps at η = 0.1, 30 at η = 0.3)
        τ = 0.05 put the smooth T_ε 2–3 steps below the hard one, 0.02 within 0.6 steps,
        0.01 within 0.3, with dT_ε/dη unchanged at η = 0.1 (−198, −203, −203; the hard
        T_ε's secant slope ≈ −200); at 0.005 the derivative starts to follow the hard
        T_ε's unit jumps (−166).
      accuracy_temperature: τ_acc > 0 in logit units, the margin scale of the smoothed
        accuracy.

    Returns:
      :class:`Sensitivities`: T_ε in optimiser steps (its derivatives in steps per unit η
      and per unit m), L_T in loss units; accuracy entries NaN without held-out data; T_ε
      entries NaN where T_ε is undefined; every derivative NaN when the prediction diverged.

    Raises:
      ValueError (before any work, with how to fix it): η not a real scalar or ≤ 0, m ∉
      [0, 1), ε ∉ (0, 1), temperatures ≤ 0, ``window`` not odd in [1, steps + 1], steps < 1,
      B ∉ [1, N], SGD without ``key``, a plain kernel without ``f0``, ``f0`` with a
      HeadAwareKernel, a HeadAwareKernel built on another N than ``y`` has (both N named),
      held-out arrays given in part, and every shape, label, loss and
      finiteness check of :func:`ntk_tt.predict_from_kernel` / :func:`ntk_tt.predict_head_aware`.
    """
    _check_point(learning_rate, momentum, epsilon, temperature, accuracy_temperature, window,
                 steps)
    kind, data, y, y_test, batch_size, extra = _prepare(
        kernel, y, f0=f0, kernel_test=kernel_test, f0_test=f0_test, y_test=y_test,
        learning_rate=learning_rate, momentum=momentum, steps=steps, batch_size=batch_size,
        loss=loss, key=key, num_paths=num_paths)
    dtype = data.f0.dtype if kind == "plain" else data.features.dtype
    return _sensitivity_core(
        data, y, y_test, jnp.asarray(learning_rate, dtype), jnp.asarray(momentum, dtype), key,
        jnp.asarray(epsilon, dtype), jnp.asarray(temperature, dtype),
        jnp.asarray(accuracy_temperature, dtype), kind=kind,
        traced=extra.get("traced", False), test_traced=extra.get("test_traced", False),
        steps=steps, batch_size=batch_size, nesterov=nesterov, loss=loss,
        num_paths=num_paths, window=window)


# -- the η × m grid ----------------------------------------------------------------------------


def _check_grid(values, name: str, low: float, high: float | None, hint: str) -> np.ndarray:
    values = as_array(values, name)
    if isinstance(values, jax.core.Tracer):
        raise ValueError(f"{name} must be concrete (the grid is evaluated eagerly), got a "
                         "tracer; call divergence_boundary outside jit.")
    arr = np.asarray(values)
    if arr.ndim != 1 or arr.shape[0] < 1 or arr.dtype.kind not in "iuf":
        raise ValueError(f"{name} must be a 1-D array of real numbers with at least one "
                         f"entry, got shape {arr.shape} and dtype {arr.dtype}; {hint}")
    arr = arr.astype(float)
    ok = np.isfinite(arr) & (arr > low if name == "learning_rates" else arr >= low)
    if high is not None:
        ok &= arr < high
    if not np.all(ok):
        bad = arr[~ok][0]
        raise ValueError(f"{name} has an entry outside its range ({bad!r}); {hint}")
    if arr.shape[0] > 1 and not np.all(np.diff(arr) > 0):
        raise ValueError(f"{name} must be strictly increasing; sort it (np.unique does).")
    return arr


@partial(jax.jit, static_argnames=("kind", "steps", "batch_size", "nesterov", "loss",
                                   "num_paths", "window"))
def _grid_core(data, y, y_test, lrs, ms, key, epsilon, *, kind, steps, batch_size, nesterov,
               loss, num_paths, window):
    def one(lr, m):
        common = dict(learning_rate=lr, momentum=m, steps=steps, batch_size=batch_size,
                      nesterov=nesterov, loss=loss, key=key, num_paths=num_paths,
                      y_test=y_test)
        if kind == "plain":
            pred = predict_from_kernel(data.kernel, data.f0, y, method="discrete",
                                       kernel_test=data.kernel_test, f0_test=data.f0_test,
                                       **common)
        else:
            pred = predict_head_aware(data, y, **common)
        t, _ = training_time_array(pred.loss, epsilon, window)
        nan = jnp.asarray(jnp.nan, pred.loss.dtype)
        acc = nan if pred.test_error is None else 1.0 - pred.test_error[-1]
        return (pred.diverged, jnp.where(pred.diverged, nan, t), pred.loss[-1],
                jnp.where(pred.diverged, nan, acc), pred.kappa, pred.beyond_edge)

    return jax.vmap(lambda m: jax.vmap(lambda lr: one(lr, m))(lrs))(ms)


class _PlainRaw(NamedTuple):
    kernel: jax.Array
    f0: jax.Array
    kernel_test: jax.Array | None
    f0_test: jax.Array | None


def _boundary(lrs: np.ndarray, diverged: np.ndarray):
    """(boundary, inside, monotone) per row of ``diverged`` (G_m, G_η)."""
    inside = diverged.any(axis=1)
    first = np.where(inside, diverged.argmax(axis=1), diverged.shape[1])
    boundary = np.array([lrs[k - 1] if k > 0 else np.nan for k in first])
    cols = np.arange(diverged.shape[1])
    monotone = ~np.any(~diverged & (cols[None, :] > first[:, None]), axis=1)
    return boundary, inside, monotone


def divergence_boundary(
    kernel, y, *, momenta, learning_rates, steps, batch_size=None, epsilon=0.1, key=None,
    y_test=None, f0=None, kernel_test=None, f0_test=None, nesterov=False,
    loss="cross_entropy", num_paths=32, window=5,
) -> WhatIfGrid:
    """The predicted divergence boundary, T_ε and L_T over an η × m grid, from one kernel
    (paper Sec. 3–5; METHOD.md §2 "Divergence", §3, §6).

    Every grid point is :func:`ntk_tt.predict_from_kernel` (``method="discrete"``, the exact
    linearised recursion, which predicts divergence) for a plain kernel, or
    :func:`ntk_tt.predict_head_aware` for a :class:`ntk_tt.HeadAwareKernel`, evaluated in one
    ``jit(vmap(vmap(...)))`` (m outer, η inner) that shares the kernel and compiles once.
    ``diverged`` follows the package's one rule
    (``ntk_tt.dynamics._divergence``: a non-finite loss or
    L_T > L_0 within ``steps``), so a run just beyond the stability edge whose loss has not
    yet risen above L_0 within ``steps`` counts as not diverged: take ``steps`` long enough
    for the instability to show. For MSE, full-batch GD and heavy ball on a plain kernel the
    boundary is the linear model's edge η·λ_max/N = 2(1 + m) (``beyond_edge``) up to the grid
    spacing. Memory: the vmapped sweep holds every grid point's logits at once, about
    G_m·G_η·P·(T + 1)·(N + N_test)·C floats (P = ``num_paths`` for SGD, else 1); for a large
    grid call it once per slice of ``momenta``.

    Args:
      kernel, y, steps, batch_size, key, y_test, f0, kernel_test, f0_test, nesterov, loss,
        num_paths: as :func:`sensitivities` (``key`` is shared by every grid point: the same
        SGD batch orders everywhere).
      momenta: (G_m,) strictly increasing momenta in [0, 1).
      learning_rates: (G_η,) strictly increasing learning rates > 0 (e.g. ``np.geomspace``).
      epsilon: ε ∈ (0, 1) of the T_ε grid. window: odd smoothing window of T_ε.

    Returns:
      :class:`WhatIfGrid` of numpy arrays: ``diverged``, ``training_time`` (optimiser steps),
      ``final_loss``, ``test_accuracy``, ``beyond_edge`` of shape (G_m, G_η), ``kappa``
      (G_η,), ``boundary`` (G_m,) (the largest grid η below the first diverged one),
      ``boundary_inside`` and ``monotone`` (G_m,).

    Raises:
      ValueError (before any work, with how to fix it): ``momenta`` or ``learning_rates`` not
      1-D, empty, unsorted, with an η ≤ 0 or an m ∉ [0, 1); ε ∉ (0, 1); ``window`` not odd
      in [1, steps + 1]; and the checks of :func:`sensitivities` on the other arguments.
    """
    lrs = _check_grid(learning_rates, "learning_rates", 0.0, None,
                      "pass positive step sizes, e.g. np.geomspace(1e-4, 1e-1, 32).")
    ms = _check_grid(momenta, "momenta", 0.0, 1.0,
                     "pass momenta in [0, 1), e.g. np.array([0.0, 0.5, 0.9]).")
    _check_epsilon(epsilon)
    _check_window(window, steps)
    kind, data, y, y_test, batch_size, _ = _prepare(
        kernel, y, f0=f0, kernel_test=kernel_test, f0_test=f0_test, y_test=y_test,
        learning_rate=float(lrs[0]), momentum=float(ms[0]), steps=steps,
        batch_size=batch_size, loss=loss, key=key, num_paths=num_paths)
    if kind == "plain":
        dtype = data.f0.dtype
        data = _PlainRaw(jnp.asarray(kernel, dtype), data.f0,
                         None if kernel_test is None else jnp.asarray(kernel_test, dtype),
                         data.f0_test)
    else:
        dtype = data.features.dtype
    div, t, lt, acc, kappa, edge = _grid_core(
        data, y, y_test, jnp.asarray(lrs, dtype), jnp.asarray(ms, dtype), key,
        jnp.asarray(epsilon, dtype), kind=kind, steps=steps, batch_size=batch_size,
        nesterov=nesterov, loss=loss, num_paths=num_paths, window=window)
    div = np.asarray(div)
    boundary, inside, monotone = _boundary(lrs, div)
    return WhatIfGrid(
        learning_rates=lrs, momenta=ms, diverged=div, training_time=np.asarray(t),
        final_loss=np.asarray(lt), test_accuracy=np.asarray(acc),
        kappa=np.asarray(kappa)[0], beyond_edge=np.asarray(edge), boundary=boundary,
        boundary_inside=inside, monotone=monotone, epsilon=float(epsilon), steps=int(steps))


# -- figure ------------------------------------------------------------------------------------


def plot_whatif(grid_result: WhatIfGrid, ax: Any = None):
    """Heat map of the predicted T_ε over η × m with the predicted divergence boundary.

    x axis: learning rate η (log scale); y axis: momentum m; colour: T_ε in optimiser steps
    (``grid_result.training_time``), diverged cells grey, cells where T_ε is otherwise
    undefined (flat or not settled) left white; the boundary (per m, the largest grid η below
    the first diverged one) is drawn as a line with markers. Uses matplotlib's object API
    (no pyplot state, no backend change); a new figure has a colour bar. What it shows is
    defined in METHOD.md §2 ("Divergence", the heavy-ball stability edge) and §6 (T_ε; paper
    Sec. 5, Alg. 1).

    Args:
      grid_result: a :class:`WhatIfGrid` from :func:`divergence_boundary`.
      ax: a matplotlib Axes to draw on (default: a new Figure with one Axes).

    Returns:
      The ``matplotlib.figure.Figure`` drawn on.

    Raises:
      ValueError: ``grid_result`` is not a :class:`WhatIfGrid` or its arrays do not have the
        shapes (G_m, G_η), (G_m,), (G_η,); pass the result of ``divergence_boundary``.
    """
    if not isinstance(grid_result, WhatIfGrid):
        raise ValueError(f"grid_result must be the WhatIfGrid returned by "
                         f"divergence_boundary, got {type(grid_result).__name__}.")
    lrs, ms = np.asarray(grid_result.learning_rates), np.asarray(grid_result.momenta)
    shape = (ms.shape[0], lrs.shape[0])
    t = np.asarray(grid_result.training_time, float)
    div = np.asarray(grid_result.diverged, bool)
    if (lrs.ndim != 1 or ms.ndim != 1 or t.shape != shape or div.shape != shape
            or np.shape(grid_result.boundary) != (shape[0],)):
        raise ValueError(f"grid_result arrays do not match its grid {shape} (momenta × "
                         "learning rates); pass the result of divergence_boundary unchanged.")
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure

    new = ax is None
    if new:
        fig = Figure(figsize=(6.4, 4.2), constrained_layout=True)
        ax = fig.add_subplot()
    fig = ax.figure
    x_edges, y_edges = _edges(lrs, log=True), np.clip(_edges(ms, log=False), 0.0, 1.0)
    mesh = ax.pcolormesh(x_edges, y_edges, np.ma.masked_invalid(t), cmap="viridis",
                         shading="flat")
    if div.any():
        ax.pcolormesh(x_edges, y_edges, np.ma.masked_where(~div, np.ones(shape)),
                      cmap=ListedColormap(["0.7"]), shading="flat")
    b = np.asarray(grid_result.boundary, float)
    ax.plot(b, ms, "o-", color="crimson", lw=2, ms=4,
            label="predicted divergence boundary")
    ax.set_xscale("log")
    ax.set_xlim(x_edges[0], x_edges[-1])
    ax.set_ylim(y_edges[0], y_edges[-1])
    ax.set_xlabel("learning rate η (log scale)")
    ax.set_ylabel("momentum m")
    ax.set_title(f"predicted T_{grid_result.epsilon:g} (loss, steps of {grid_result.steps}); "
                 "grey: diverged", fontsize=9)
    ax.legend(loc="lower left", fontsize=8)
    if new:
        fig.colorbar(mesh, ax=ax, label="predicted T_ε (optimiser steps)")
    return fig


def _edges(centres: np.ndarray, *, log: bool) -> np.ndarray:
    """Cell edges around grid ``centres`` (midpoints; geometric when ``log``)."""
    v = np.log(centres) if log else np.asarray(centres, float)
    if v.shape[0] == 1:
        half = 0.1 if log else 0.05
        e = np.array([v[0] - half, v[0] + half])
    else:
        mid = 0.5 * (v[1:] + v[:-1])
        e = np.concatenate([[2 * v[0] - mid[0]], mid, [2 * v[-1] - mid[-1]]])
    return np.exp(e) if log else e
