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
  With ``optimizer=`` (an :class:`ntk_tt.Optimizer`), the same quantities of the optimiser
  recursions and their derivatives with respect to the schedule's peak and warmup, the weight
  decay and m or β₁ (``_whatif_optimizer``, issue 27).
* :func:`divergence_boundary`: the prediction on an η × m grid in one ``jit(vmap(vmap))``
  sharing the kernel, the predicted ``diverged`` flag (``ntk_tt.dynamics._divergence``: a non-finite
  loss or L_T > L_0), T_ε and L_T on the grid, and for each m the largest grid η below the
  first diverging one: the predicted stability boundary. For MSE and full-batch GD on a
  frozen kernel it is the linear model's edge η·λ_max/N = 2(1 + m) (heavy ball; METHOD.md §2,
  ``beyond_edge`` of :func:`ntk_tt.predict_from_kernel`) up to the grid spacing. With
  ``optimizer=``, the grid is the schedule's peak × m or β₁ for that optimiser
  (``_whatif_boundary``, issue 27).

:func:`ntk_tt.plot_whatif` draws the grid (``_whatif_plot``). Both computations use the exact
discrete recursion (``method="discrete"``, the default of ``predict``): the plain kernel Θ
through :func:`ntk_tt.predict_from_kernel`'s solver (f0 needed), a
:class:`ntk_tt.HeadAwareKernel` through :func:`ntk_tt.predict_head_aware`'s. Time is in
optimiser steps; losses are MEAN losses over the training samples. This module holds the two
entry points; their argument checks are ``_whatif_checks``, the result types and the
compiled cores ``_whatif_core``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt.analysis._whatif_boundary import optimizer_grid
from ntk_tt.analysis._whatif_checks import (
    _check_epsilon,
    _check_grid,
    _check_measures,
    _check_point,
    _check_window,
    _prepare,
    _prepare_optimizer,
)
from ntk_tt.analysis._whatif_core import (
    Sensitivities,
    WhatIfGrid,
    _grid_core,
    _PlainRaw,
    _sensitivity_core,
)
from ntk_tt.analysis._whatif_optimizer import OptimizerSensitivities, optimizer_sensitivities
from ntk_tt.dynamics._checks import check_nesterov, flag
from ntk_tt.dynamics._divergence import DIVERGES
from ntk_tt.dynamics._optim_linear import is_traced
from ntk_tt.dynamics._regime import abstain_beyond_travel, kernel_travel
from ntk_tt.training._optimizer_run import check_shorthand


def sensitivities(
    kernel, y, *, learning_rate=None, momentum=None, steps, epsilon=0.1, batch_size=None,
    key=None, y_test=None, f0=None, kernel_test=None, f0_test=None, nesterov=None,
    loss="cross_entropy", num_paths=32, window=5, temperature=0.02, accuracy_temperature=0.1,
    optimizer=None, a=None, a_test=None, warmup_smoothing=None,
) -> Sensitivities | OptimizerSensitivities:
    """Predicted T_ε, final loss and held-out accuracy at (η, m), with d/dη, d/dm and
    elasticities d log Q / d log η (paper Secs. 3–5; METHOD.md §2, §3, §6); or, with
    ``optimizer=``, at an :class:`ntk_tt.Optimizer`, with the derivatives with respect to its
    schedule's peak, warmup, weight decay and momentum / β₁ (METHOD.md §11).

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

    With ``optimizer=`` (instead of ``learning_rate``, ``momentum``, ``nesterov``,
    ``batch_size``) the prediction is that of :func:`ntk_tt.predict` with ``optimizer=``:
    :func:`ntk_tt.sgd_trajectory` on a plain Θ, :func:`ntk_tt.head_aware_sgd_trajectory` on a
    HeadAwareKernel, :func:`ntk_tt.head_aware_adam_trajectory` on an
    :class:`ntk_tt.AdamKernel` (Adam needs one: build it with
    :func:`ntk_tt.adam_head_aware_kernel` for the same ε and batch size). The warmup
    derivative follows the direction in which the schedule's softplus-relaxed ramp moves η_t
    (``ntk_tt.analysis._whatif_optimizer``: the schedule's own smoothing, else
    ``warmup_smoothing`` steps, default 0.25); values and the other derivatives are of the
    schedule as given.

    Source: ntk_tt's own (issue 13; README "What-if"): exact forward-mode derivatives of the
    predictors of METHOD.md §2, §10, §11 and of the smooth T_ε of METHOD.md §6.

    Args:
      kernel: Θ (N·C, N·C) sample-major or (N, N) logit-summed (then ``f0`` is required), or
        a :class:`ntk_tt.HeadAwareKernel` (then ``f0``, ``kernel_test``, ``f0_test`` must be
        None; its held-out features, if any, need ``y_test``), or with an Adam ``optimizer``
        an :class:`ntk_tt.AdamKernel`.
      y: integer labels (N,).
      learning_rate: η > 0, a scalar. momentum: m ∈ [0, 1), a scalar (heavy ball; Nesterov
        with ``nesterov=True``); default 0.
      optimizer: an :class:`ntk_tt.Optimizer` (``ntk_tt.sgd``, ``adam``, ``adamw``) with a
        pytree schedule (constant, warmup_cosine, warmup_stable_decay, exponential).
      a, a_test: J·θ0 (:func:`ntk_tt.weight_tangent`) on the training and held-out inputs,
        (N, C) / (N_test, C) for a plain Θ (``apply_fn``), (N, F) / (N_test, F) for a
        head-aware kernel (``feature_fn``, backbone weights); needed for weight decay λ > 0
        and for d/dλ (without ``a`` at λ = 0 there is no "weight_decay" entry).
      warmup_smoothing: steps ≥ 0 of the warmup relaxation for a schedule of smoothing 0
        (None = 0.25; 0 = the exact ramp, whose derivative jumps at integer warmups).
      steps: T optimiser updates. epsilon: ε ∈ (0, 1), the fraction of the loss fall
        L_0 − L_T that defines T_ε. batch_size: B (None = N, full-batch GD).
      key: ``jax.random.key(seed)`` for the SGD batch orders (needed when B < N).
      y_test, f0, kernel_test, f0_test: held-out labels (N_test,), initial logits (N, C),
        Θ(x_test, x) (N_test·C, N·C) or (N_test, N), held-out initial logits (N_test, C): as
        :func:`ntk_tt.predict_from_kernel`.
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
      :class:`Sensitivities` (:class:`OptimizerSensitivities` with ``optimizer=``: the
      derivatives as dicts ``gradients[quantity][hyperparameter]``): T_ε in optimiser steps
      (its derivatives in steps per unit η and per unit m), L_T in loss units; accuracy
      entries None (no "test_accuracy" gradients) without held-out data; T_ε entries NaN
      where T_ε is undefined (``training_time_reason`` says why); every derivative NaN when
      the predicted curve diverged; ``outcome`` / ``divergence`` are ``predict``'s call on
      the real run (κ ≥ 68 says "diverges" whatever the curve; ``divergence_reason``).

    Warns:
      LinearRegimeWarning: an Adam ``optimizer`` whose weight travel ρ = Σ η_t /
        ``kernel.weight_rms`` over the ``steps`` exceeds 0.07 (``ntk_tt.dynamics._regime``;
        as ``ntk_tt.predict``), the derivatives' point then outside the linearised regime
        the fast Adam predictor is measured in. ρ is not returned (``hyperparameters`` holds
        the differentiated ones only); beyond ρ = 1 the call abstains as ``predict``'s
        (``beyond_edge`` True, outcome "unknown" unless the curve itself diverges; also under
        ``jit`` / ``vmap``). Neither when ``kernel.weight_rms`` is None; no warning when the
        schedule or ``weight_rms`` is traced.

    Raises:
      ValueError (before any work, with how to fix it): an empty kernel or y (N = 0), η not
      a real scalar or ≤ 0, m ∉
      [0, 1), ε ∉ (0, 1), temperatures ≤ 0, ``window`` not odd in [1, steps + 1], steps < 1
      (or steps + 1 < the default ``window`` 5: the message says what to pass),
      B ∉ [1, N], SGD without ``key``, a plain kernel without ``f0``, a ``(Θ, f0)`` pair
      passed as ``kernel`` (or another ragged list; pass Θ alone and ``f0=``), ``f0`` with a
      HeadAwareKernel, a HeadAwareKernel built on another N than ``y`` has (both N named),
      held-out arrays given in part, and every shape, label, loss and
      finiteness check of :func:`ntk_tt.predict_from_kernel` / :func:`ntk_tt.predict_head_aware`.
      With ``optimizer``: any of learning_rate, momentum, nesterov, batch_size given too (or
      ``a``, ``a_test``, ``warmup_smoothing`` without it); a callable schedule; a schedule
      never > 0; λ > 0 without ``a``; ``a``/``a_test`` of the wrong shape, given in part or
      (concrete) with NaN or inf;
      Adam without an AdamKernel (or one built for another B), an AdamKernel with SGD, Adam
      with L2 decay (use adamw).
    """
    check_shorthand(optimizer, where="sensitivities", learning_rate=learning_rate,
                    momentum=momentum, nesterov=nesterov, batch_size=batch_size)
    if optimizer is not None:
        _check_measures(epsilon, temperature, accuracy_temperature, window, steps)
        problem = _prepare_optimizer(
            kernel, y, optimizer, steps=steps, key=key, y_test=y_test, f0=f0,
            kernel_test=kernel_test, f0_test=f0_test, a=a, a_test=a_test, loss=loss,
            num_paths=num_paths, warmup_smoothing=warmup_smoothing)
        out = optimizer_sensitivities(problem, epsilon, temperature, accuracy_temperature,
                                      loss=loss, window=window)
        # Adam: ρ from the AdamKernel's weight_rms, warned (stacklevel 2 = the user's call of
        # this) and, beyond ρ = 1, the call abstains as predict's
        rms = getattr(kernel, "weight_rms", None)
        kernel_travel(optimizer, steps, rms, stacklevel=2)
        return abstain_beyond_travel(out, optimizer, steps, rms)
    _optimizer_only("sensitivities", a=a, a_test=a_test, warmup_smoothing=warmup_smoothing)
    momentum = 0.0 if momentum is None else momentum
    nesterov = flag(nesterov)  # "no" is truthy: refused, as predict_from_kernel refuses it
    if not isinstance(momentum, jax.core.Tracer):  # m = 0 was NaN throughout, not refused
        check_nesterov(nesterov, momentum)
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


def _optimizer_only(where: str, **given) -> None:
    """ValueError for arguments of ``where(..., optimizer=)`` given without an optimiser."""
    extra_args = [k for k, v in given.items() if v is not None]
    if extra_args:
        raise ValueError(f"{', '.join(extra_args)} belong(s) to {where}(..., optimizer=): "
                         "pass optimizer=ntk_tt.sgd(...) (weight decay, schedules) or drop them.")


def _check_eager(**trees) -> None:
    """ValueError when an argument of :func:`divergence_boundary` is traced: it returns a numpy
    grid from its own compiled sweep, so it cannot run inside a caller's transformation."""
    traced = [name for name, tree in trees.items() if is_traced(tree)]
    if traced:
        raise ValueError(
            f"divergence_boundary cannot run under jax.jit, vmap or grad ({', '.join(traced)} "
            "traced): it returns numpy arrays from its own compiled jit(vmap(vmap)) over the "
            "grid; call it eagerly, or jit / vmap predict_from_kernel, predict_head_aware or "
            "sensitivities over the hyperparameters instead.")


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
    y_test=None, f0=None, kernel_test=None, f0_test=None, nesterov=None,
    loss="cross_entropy", num_paths=32, window=5, optimizer=None, a=None, a_test=None,
) -> WhatIfGrid:
    """The predicted divergence boundary, T_ε and L_T over an η × m grid, from one kernel
    (paper Sec. 3–5; METHOD.md §2 "Divergence", §3, §6; with ``optimizer=``, §11).

    Every grid point is :func:`ntk_tt.predict_from_kernel` (``method="discrete"``, the exact
    linearised recursion, which predicts divergence) for a plain kernel, or
    :func:`ntk_tt.predict_head_aware` for a :class:`ntk_tt.HeadAwareKernel`, evaluated in one
    ``jit(vmap(vmap(...)))`` (m outer, η inner) that shares the kernel and compiles once.
    ``diverged`` follows the package's one rule (``ntk_tt.dynamics._divergence``: a
    non-finite loss or L_T > L_0 within ``steps``) and ``outcome`` holds each point's call
    ("diverges" also for a spike above 10·L_0 or κ ≥ 68), as in a ``Prediction``; the
    ``boundary`` stops at the first η whose prediction says "diverges" by either (its
    ``divergence == "yes"``), so a run just beyond the stability edge whose loss has not yet
    risen within ``steps`` counts as not diverging: take ``steps`` long enough for the
    instability to show. T_ε is NaN wherever ``predict``'s is (diverged, and the
    frozen-kernel cross-entropy recursion beyond the edge). For MSE, full-batch GD and heavy
    ball on a plain kernel ``diverged`` is the linear model's edge η·λ_max/N = 2(1 + m)
    (``beyond_edge``) up to the grid spacing; the boundary may stop lower where heavy ball's
    transient growth just below the edge spikes above 10·L_0. Memory: the vmapped sweep
    holds every grid point's logits at once, about G_m·G_η·P·(T + 1)·(N + N_test)·C floats
    (P = ``num_paths`` for SGD, else 1); for a large grid call it once per slice of
    ``momenta``.

    With ``optimizer=`` (an :class:`ntk_tt.Optimizer` template; ``batch_size`` and
    ``nesterov`` then come from it) a grid point is ``predict_from_kernel`` /
    ``predict_head_aware`` with ``optimizer=`` (``ntk_tt.analysis._whatif_boundary``: the
    frozen-kernel or head-aware SGD recursion, or on an :class:`ntk_tt.AdamKernel` the fast
    Adam predictor) for the template with ``learning_rates[j]`` as the PEAK of its schedule
    and ``momenta[i]`` as its momentum (SGD's m, Adam's β₁). The schedule is rescaled by one
    multiplier, η_t·η_peak/η_max with η_max the template's largest η_t over the ``steps``
    updates (= its peak field at an integer warmup): a constant becomes η_peak, a
    warmup_cosine's init and end scale with its peak, and a callable schedule is accepted
    and scaled the same way. Everything else (rule, Nesterov, b2, eps, weight decay and its
    coupling, batch size, warmup and decay shape) is the template's. ``kappa`` is
    η_peak·λ_max/N; ``beyond_edge`` compares it with the heavy-ball (Nesterov) edge of m for
    SGD; Adam has no linear edge (its call comes from the curve): ``beyond_edge`` is False.
    The grid is for finding the divergence edge, so Adam's weight travel ρ = Σ η_t /
    rms(θ_0) is not checked here (no ``LinearRegimeWarning``, unlike :func:`sensitivities`
    and ``predict``): peaks with ρ > 0.07 lie outside the linearised regime the fast Adam
    predictor is measured in, and their curves are less reliable.

    Source: ntk_tt's own (issue 13; README "What-if"): the predictors of METHOD.md §2, §10,
    §11 on an η × m grid, with the divergence rule of METHOD.md §2.

    Args:
      kernel, y, steps, batch_size, key, y_test, f0, kernel_test, f0_test, nesterov, loss,
        num_paths: as :func:`sensitivities` (``key`` is shared by every grid point: the same
        SGD batch orders everywhere; with ``optimizer=`` an Adam one needs an AdamKernel).
      momenta: (G_m,) strictly increasing momenta in [0, 1) (Adam: β₁).
      learning_rates: (G_η,) strictly increasing learning rates > 0 (e.g. ``np.geomspace``);
        with ``optimizer=`` the schedule's peaks. A Python number for either is a grid of one.
      epsilon: ε ∈ (0, 1) of the T_ε grid. window: odd smoothing window of T_ε.
      optimizer: an :class:`ntk_tt.Optimizer` (``ntk_tt.sgd``, ``adam``, ``adamw``), or None
        for constant-η SGD.
      a, a_test: J·θ0 on the training / held-out inputs, with ``optimizer=`` only: as
        :func:`sensitivities` (needed for weight decay λ > 0).

    Returns:
      :class:`WhatIfGrid` of numpy arrays: ``diverged``, ``training_time`` (optimiser steps),
      ``final_loss``, ``test_accuracy``, ``beyond_edge``, ``outcome`` of shape (G_m, G_η),
      ``kappa`` (G_η,), ``boundary`` (G_m,) (the largest grid η below the first one called
      "diverges", a recovered spike above 10·L_0 or κ ≥ 68 included: ``WhatIfGrid``),
      ``boundary_inside`` and ``monotone`` (G_m,).

    Raises:
      ValueError (before any work, with how to fix it): ``momenta`` or ``learning_rates`` not
      1-D, empty, unsorted, with an η ≤ 0 or an m ∉ [0, 1); ε ∉ (0, 1); ``window`` not odd
      in [1, steps + 1]; ``a``/``a_test`` without ``optimizer``; ``batch_size`` or
      ``nesterov`` with it; and the checks of :func:`sensitivities` on the other arguments
      (a ``(Θ, f0)`` pair passed as ``kernel`` included; with ``optimizer``: a schedule not
      finite and ≥ 0, never > 0 or whose warmup does not end before ``steps``; λ > 0 without
      ``a``; Adam without an AdamKernel, an AdamKernel with SGD or of another batch size,
      Adam with L2 decay); any argument traced by a caller's ``jax.jit`` / ``vmap`` / ``grad``
      (the grid is numpy, computed by its own compiled sweep).
    """
    _check_eager(kernel=kernel, y=y, momenta=momenta, learning_rates=learning_rates,
                 y_test=y_test, f0=f0, kernel_test=kernel_test, f0_test=f0_test,
                 optimizer=optimizer, a=a, a_test=a_test, epsilon=epsilon, key=key)
    if optimizer is not None:
        check_shorthand(optimizer, where="divergence_boundary", batch_size=batch_size,
                        nesterov=nesterov)
    else:
        _optimizer_only("divergence_boundary", a=a, a_test=a_test)
        nesterov = flag(nesterov)
    lrs = _check_grid(learning_rates, "learning_rates", 0.0, None,
                      "pass positive step sizes, e.g. np.geomspace(1e-4, 1e-1, 32).")
    ms = _check_grid(momenta, "momenta", 0.0, 1.0,
                     "pass momenta in [0, 1), e.g. np.array([0.0, 0.5, 0.9]).")
    nag = optimizer.nesterov if optimizer is not None and optimizer.rule == "sgd" else nesterov
    if nag and np.any(ms == 0):  # its row was all "unknown", its boundary the grid's largest η
        raise ValueError("Nesterov needs momentum > 0: momenta holds 0 with nesterov=True (plain "
                         "gradient descent there); drop 0 from momenta, or sweep without "
                         "Nesterov.")
    _check_epsilon(epsilon)
    _check_window(window, steps)
    if optimizer is not None:
        return _as_grid(lrs, ms, optimizer_grid(
            kernel, y, optimizer, lrs, ms, steps=steps, epsilon=epsilon, key=key,
            y_test=y_test, f0=f0, kernel_test=kernel_test, f0_test=f0_test, a=a, a_test=a_test,
            loss=loss, num_paths=num_paths, window=window), epsilon, steps,
            "momentum m" if optimizer.rule == "sgd" else "Adam β₁")
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
    return _as_grid(lrs, ms, _grid_core(
        data, y, y_test, jnp.asarray(lrs, dtype), jnp.asarray(ms, dtype), key,
        jnp.asarray(epsilon, dtype), kind=kind, steps=steps, batch_size=batch_size,
        nesterov=bool(nesterov), loss=loss, num_paths=num_paths, window=window),
        epsilon, steps)


def _as_grid(lrs, ms, cells, epsilon, steps, momentum_name="momentum m") -> WhatIfGrid:
    """The :class:`WhatIfGrid` of a core's (diverged, T_ε, L_T, accuracy, κ, beyond_edge,
    outcome)."""
    div, t, lt, acc, kappa, edge, said = (np.asarray(v) for v in cells)
    boundary, inside, monotone = _boundary(lrs, div | (said == DIVERGES))
    return WhatIfGrid(
        learning_rates=lrs, momenta=ms, diverged=div, training_time=t, final_loss=lt,
        test_accuracy=acc, kappa=kappa[0], beyond_edge=edge, outcome=said, boundary=boundary,
        boundary_inside=inside, monotone=monotone, epsilon=float(epsilon), steps=int(steps),
        momentum_name=momentum_name)
