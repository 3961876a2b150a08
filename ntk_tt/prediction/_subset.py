"""Predict the MSE GD loss curve and T_ε on N samples from the NTK of a subset (App. D).

METHOD.md §7, paper Sec. 4 / App. D. :func:`predict_from_subset` is the end-to-end call over
the spectrum tools of ``_extrapolate``: draw a class-balanced subset X' of N' samples, build
the logit-summed (traced) empirical NTK on it only (and, for Nyström, the cross kernel
Θ(X, X') with N·N' entries instead of N²), the residual δy = f0 − onehot(y) on all N samples
(forward passes only), the N-sample spectrum, and Prop. 2's curve. Everything is stated for
the mean MSE loss of ``_losses`` and full-batch training: constant-η GD (the spectrum formula
L_t = (1/2N) Σ_k (1 − η μ_k)^(2t) p_k) or an SGD-family optimiser without weight decay (each
mode's exact recursion, :mod:`ntk_tt.prediction._spectrum_sgd`); nothing else decouples.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._frames import user_stacklevel
from ntk_tt._options import SUBSET_METHODS as SUBSET_METHODS  # importable without JAX
from ntk_tt._options import _is_int
from ntk_tt._schedule_checks import RATE_RANGE, is_rate
from ntk_tt.data._inputs import as_array, check_real, warn_raw_pixels
from ntk_tt.data._model import ApplyFn, check_concrete, check_model
from ntk_tt.dynamics._checks import check_labels
from ntk_tt.dynamics._divergence import beyond_edge, divergence
from ntk_tt.dynamics._predict_kernel import EPSILONS
from ntk_tt.dynamics._training_time import DIVERGED, REASONS, training_time_report
from ntk_tt.kernels._blocks import sample_blocks
from ntk_tt.kernels._ntk import empirical_ntk
from ntk_tt.prediction._extrapolate import (
    Spectrum,
    _check_range,
    check_rcond,
    check_slope_correction,
    extrapolate_spectrum,
    nystrom_spectrum,
    predict_curve_from_spectrum,
)
from ntk_tt.prediction._spectrum_sgd import check_spectrum_optimizer
from ntk_tt.prediction._subset_checks import check_gd_mse, check_subset_key, check_subset_size
from ntk_tt.training._optimizer_run import optimizer_hyperparameters
from ntk_tt.training._timing import Stopwatch, timed_stage


class SubsetPrediction(NamedTuple):
    """Result of :func:`predict_from_subset` (T = steps; N samples, N' in the subset).

    loss: predicted mean MSE training loss on all N samples, (T + 1,), index = steps taken.
    training_time: {ε: T_ε in steps} for ε ∈ (0.01, 0.1, 0.4), NaN when undefined, with the
      reason in training_time_reasons[ε].
    kappa: η·μ_max, μ_max = λ_max(Θ_tr / C)/N of the predicted N-sample spectrum, η the
      peak η_t of an optimizer's schedule (dimensionless). beyond_edge: kappa beyond the
      MSE stability edge 2(1 + m) (heavy ball; 2(1 + m)/(1 + 2m) Nesterov; 2 for GD).
    diverged, diverged_at, spiked_at: the rule of ``ntk_tt.dynamics._divergence`` on ``loss``.
    spectrum: the predicted :class:`ntk_tt.Spectrum` of the N-sample kernel.
    subset_indices: the N' indices into x of the subset (sorted), int (N',).
    method: "power_law" | "nystrom". num_samples: N. subset_size: N'.
    hyperparameters: {"learning_rate", "steps", "num_train": N, "subset_size": N',
      "method", "k0", "loss": "mse", "batch_size": N, "momentum": 0.0}; with ``optimizer``
      ``ntk_tt.training._optimizer_run.optimizer_hyperparameters`` (learning_rate = peak
      η_t, schedule, momentum, nesterov, ...) with those from "steps" on.
    seconds: wall time per stage WITHOUT JAX compilation: "kernel" (Θ(X', X') for the power
      law; the cross kernel Θ(X, X'), whose rows at X' are Θ(X', X'), for Nyström),
      "logits" (f0 on all N samples), "spectrum", "curve" (curve and T_ε), "total" (from the
      call to the result, validation included); "compile" is all JAX compilation during the
      call (tracing, lowering, XLA), excluded from every other entry.

    Source: ntk_tt's own container (the App. D prediction of METHOD.md §7).
    """

    loss: np.ndarray
    training_time: dict
    training_time_reasons: dict
    kappa: float
    beyond_edge: bool
    diverged: bool
    diverged_at: int | None
    spiked_at: int | None
    spectrum: Spectrum
    subset_indices: np.ndarray
    method: str
    num_samples: int
    subset_size: int
    hyperparameters: dict
    seconds: dict


class PowerLawFitError(ValueError):
    """The power-law extrapolation of the subset's spectrum failed, after the kernel work
    (``extrapolate_spectrum``'s ValueError, its message unchanged): ``ntk_tt.predict(subset=)``,
    which takes no k0 or fit_range, words it for its own arguments."""


STABLE_PER_CLASS = 4
"""Samples per class below which :func:`predict_from_subset` warns: on the tests' small tasks
(K = 3, 5; N = 120, 200; κ = 1; 18 draws) |ΔT_ε|/T_ε against the full kernel fell smoothly
with N' (power law median / worst 0.67 / 7.5 at 2 per class, 0.33 / 1.25 at 4, 0.29 / 0.73 at
6; Nyström 0.85 / 0.92 at 1, 0.19 / 0.33 at 6), no cliff to refuse at."""


def warn_small_subset(subset_size: int, k: int) -> None:
    """UserWarning for fewer than :data:`STABLE_PER_CLASS` samples of each of the ``k``
    classes (naming no argument: it serves ``predict_from_subset`` and ``predict``), at the
    user's line whichever of them was called."""
    if (per := subset_size // k) < STABLE_PER_CLASS:
        warnings.warn(
            f"the subset of N' = {subset_size} samples holds {per} of each of the K = {k} "
            f"classes: with fewer than {STABLE_PER_CLASS} per class its spectrum, and the "
            "predicted T_ε, change a lot from one subset draw (key) to the next (on small "
            "test tasks at 1 to 3 per class: T_ε off by a median 35 to 85 % and by up to "
            "750 %, once divergence called for a κ = 1 run); take it as a rough guess, or "
            f"use N' >= {STABLE_PER_CLASS * k} ({STABLE_PER_CLASS} per class) or more.",
            UserWarning, stacklevel=user_stacklevel())


def balanced_subset(y, subset_size: int, key: jax.Array) -> np.ndarray:
    """Sorted indices of N' samples, N'/K of each class present in ``y``: the first N'/K of
    a permutation of each class's indices (class c's permutation from ``fold_in(key, c)``)."""
    y = np.asarray(y)
    classes = np.unique(y)
    per = subset_size // len(classes)
    picks = []
    for c in classes:
        idx = np.flatnonzero(y == c)
        perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, int(c)), len(idx)))
        picks.append(idx[perm[:per]])
    return np.sort(np.concatenate(picks))


def residual_in_blocks(apply_fn: ApplyFn, params: Any, x, y, block_size: int) -> np.ndarray:
    """δy = f0 − onehot(y) on all N samples, (N, C), by forward passes over blocks of
    ``block_size`` samples (the last one padded, so one compiled function serves all)."""
    fwd = jax.jit(apply_fn)
    parts = []
    for real, xb in sample_blocks(x, min(block_size, int(np.shape(x)[0]))):
        parts.append(np.asarray(fwd(params, xb))[:real])
    f0 = np.concatenate(parts)
    return f0 - np.eye(f0.shape[1], dtype=f0.dtype)[np.asarray(y)]


def _check_options(method, k0, fit_range, slope_correction, rcond, subset_size,
                   forward_block_size):
    if method not in SUBSET_METHODS:
        raise ValueError(f"method must be one of {SUBSET_METHODS}, got {method!r}.")
    if method == "nystrom":
        given = [nm for nm, v in (("k0", k0), ("fit_range", fit_range)) if v is not None]
        if not (isinstance(slope_correction, (int, float)) and slope_correction == 0):
            given.append("slope_correction")
        if given:
            raise ValueError(f"{', '.join(given)} apply to method='power_law' only (App. D's "
                             "power-law tails); drop them for method='nystrom'.")
    else:
        if k0 is not None and (not _is_int(k0) or not 1 <= k0 <= subset_size):
            raise ValueError(f"k0 must be an integer in [1, N'] = [1, {subset_size}] (first "
                             f"index of the power-law tails), got {k0!r}.")
        if fit_range is not None:
            fit_range = tuple(fit_range)
            if len(fit_range) != 2:
                raise ValueError(f"fit_range must be two integers (lo, hi), got "
                                 f"{fit_range!r}.")
            _check_range(fit_range, subset_size)
        check_slope_correction(slope_correction)
    check_rcond(rcond)
    if not _is_int(forward_block_size) or forward_block_size < 1:
        raise ValueError(f"forward_block_size must be an integer >= 1 (samples per forward "
                         f"pass), got {forward_block_size!r}.")


def _check_lr_steps(learning_rate, steps):
    check_real(learning_rate, "learning_rate")
    if np.ndim(learning_rate) != 0 or not is_rate(learning_rate):
        raise ValueError(f"learning_rate must be a finite scalar {RATE_RANGE}, got "
                         f"{learning_rate!r}.")
    if not _is_int(steps) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1 (GD updates), got {steps!r}.")


def predict_from_subset(
    apply_fn: ApplyFn, params: Any, x, y, *, subset_size: int,
    learning_rate: float | None = None, steps: int, method: str = "power_law",
    key: jax.Array | None = None, k0: int | None = None,
    fit_range=None, slope_correction: float = 0.0, rcond: float = 1e-6, loss: str = "mse",
    batch_size: int | None = None, momentum: float | None = None,
    forward_block_size: int = 1000, optimizer=None,
) -> SubsetPrediction:
    """Predict the mean MSE loss curve of full-batch training and T_ε on N samples from N'.

    Steps: (1) draw a class-balanced subset X' of
    N' = ``subset_size`` samples (N'/K per class, from ``key``); (2) the logit-summed empirical
    NTK ``empirical_ntk(apply_fn, params, x_subset, trace_logits=True)`` (N', N') — for
    ``method="nystrom"`` instead the cross kernel Θ(X, X') (N, N'), computed as
    ``empirical_ntk(apply_fn, params, x_subset, x, trace_logits=True).T`` so that the subset's
    Jacobians are computed once, with Θ(X', X') its rows at X'; (3) δy = f0 − onehot(y) on
    all N samples (forward passes in blocks of ``forward_block_size``); (4) the N-sample
    spectrum by :func:`ntk_tt.extrapolate_spectrum` (power law: top μ'_k kept below k0,
    power-law eigenvalue and projection tails, Σ p_k = ‖δy‖²) or :func:`ntk_tt.nystrom_spectrum`;
    (5) the curve L_t = (1/2N) Σ_k (1 − η μ_k)^(2t) p_k (:func:`ntk_tt.predict_curve_from_spectrum`;
    with ``optimizer`` each mode's exact recursion with the schedule's η_t and momentum)
    and T_ε by :func:`ntk_tt.training_time` (window 5) for ε ∈ {0.01, 0.1, 0.4}.
    The traced kernel acts as (Θ_tr / C) ⊗ I_C, as ``predict(..., kernel="traced")``.

    Cost: power law N'²·C·D kernel work plus N forward passes; Nyström N·N'·C·D (never N²).

    Source: Zancato et al. 2020 (arXiv 2008.12478), Sec. 4, App. D; METHOD.md §7.

    Args:
      apply_fn, params: the pre-trained model with its new head, ``apply_fn(params, x)`` →
        logits (N, C). x: inputs (N, ...). y: integer labels (N,) in [0, C).
      subset_size: N', an integer in [K, N), a multiple of the K classes present in y, with
        N'/K samples in every class.
      learning_rate: η > 0 of GD on the mean loss (or None with ``optimizer``). steps: T ≥ 1
        updates.
      method: "power_law" (App. D) or "nystrom".
      key: ``jax.random.key(seed)`` for the subset draw (required).
      k0, fit_range, slope_correction: power law only (see :func:`ntk_tt.extrapolate_spectrum`;
        k0 ∈ [1, N'], default min(100, N'/4)).
      rcond: Nyström only in effect: relative pseudo-inverse cut-off in (0, 1).
      loss, batch_size, momentum: accepted only at "mse", None (or N) and None (or 0): the
        spectrum formula is for full-batch GD on the MSE loss; anything else is refused.
      forward_block_size: samples per forward pass for δy (≥ 1).
      optimizer: instead of learning_rate (and batch_size, momentum): an SGD-family
        :class:`ntk_tt.Optimizer` at full batch (``batch_size`` None or N) with
        ``weight_decay`` 0: ``ntk_tt.sgd(schedule, momentum, nesterov=...)``.

    Returns:
      :class:`SubsetPrediction`: ``loss`` (T + 1,) in mean-loss units, ``training_time``
      {ε: steps}, ``kappa`` = η·μ_max (dimensionless), ``spectrum``, ``subset_indices``,
      ``seconds`` per stage (kernel, logits, spectrum, curve, total; compile apart).

    Raises:
      ValueError: before any kernel work (and before calling the model): an ``optimizer``
        that is Adam, has weight decay ≠ 0, a batch size < N or a bad schedule, or comes with
        learning_rate / momentum / batch_size; loss not "mse", batch_size not None/N,
        momentum ≠ 0, a bad or missing key, bad x / y / model output (``check_model``),
        subset_size not an int in [K, N) and a multiple of K or a class with fewer than N'/K
        samples, η not finite > 0, steps < 1, an unknown method, power-law options with "nystrom",
        k0 / fit_range out of range, slope_correction < 0, rcond not in (0, 1),
        forward_block_size < 1; a traced argument (params, x, y, learning_rate, optimizer,
        key, momentum, k0, fit_range, slope_correction, rcond: no ``jax.jit``, ``vmap`` or
        ``grad`` over it; jit ``predict_curve_from_spectrum`` on the spectrum instead). After
        the eigendecomposition, as :class:`PowerLawFitError` (a ValueError, the power-law
        fit's message): no power-law projection tail reaching ‖δy‖²
        (choose another k0), or a fit range reaching numerically zero eigenvalues.
      NTKMemoryError: the subset (or cross) kernel does not fit (``empirical_ntk``).

    Warns:
      UserWarning: ``x`` is uint8 (raw pixels most likely, as ``ntk_tt.predict`` warns).
        Before any kernel work, fewer than 4 samples per class (N' = K: one each;
        "the subset of N' = ... samples holds ... of each of the K = ... classes: ... use N'
        >= 4·K"): spectrum and T_ε scatter widely between draws (off by a median 35–85 %, up
        to 750 %, on small test tasks; ``STABLE_PER_CLASS``); the prediction is still made.
    """
    with Stopwatch() as whole:
        out = _validated_predict(apply_fn, params, x, y, subset_size, learning_rate, steps,
                                 method, key, k0, fit_range, slope_correction, rcond, loss,
                                 batch_size, momentum, forward_block_size, optimizer)
    out.seconds["total"] = whole.seconds
    out.seconds["compile"] = whole.compile_seconds
    return out


def _validated_predict(apply_fn, params, x, y, subset_size, learning_rate, steps, method, key,
                       k0, fit_range, slope_correction, rcond, loss, batch_size, momentum,
                       forward_block_size, optimizer) -> SubsetPrediction:
    check_concrete("predict_from_subset", params=params, x=x, y=y, learning_rate=learning_rate,
                   optimizer=optimizer, key=key, momentum=momentum, k0=k0, fit_range=fit_range,
                   slope_correction=slope_correction, rcond=rcond,
                   takes="predict_curve_from_spectrum, on the spectrum of extrapolate_spectrum "
                   "or nystrom_spectrum")
    x = as_array(x, "x")
    n = int(np.shape(x)[0])
    if optimizer is not None:
        check_spectrum_optimizer(optimizer, n, steps, where="predict_from_subset",
                                 learning_rate=learning_rate, momentum=momentum,
                                 batch_size=batch_size)
    check_gd_mse(loss, batch_size, 0.0 if momentum is None else momentum, n)
    check_subset_key(key)
    n, c = check_model(apply_fn, params, x)
    y = np.asarray(check_labels(y, n, c))
    k = check_subset_size(subset_size, y)
    if optimizer is None:
        _check_lr_steps(learning_rate, steps)
    _check_options(method, k0, fit_range, slope_correction, rcond, subset_size,
                   forward_block_size)
    warn_small_subset(int(subset_size), k)  # after every refusal, before any kernel work
    warn_raw_pixels(x)  # as predict warns (a fresh user's raw pixels: κ 4,853)
    idx = balanced_subset(y, int(subset_size), key)
    return _predict_on_indices(apply_fn, params, x, y, idx, learning_rate=learning_rate,
                               steps=int(steps), method=method, k0=k0, fit_range=fit_range,
                               slope_correction=slope_correction, rcond=rcond,
                               forward_block_size=forward_block_size, optimizer=optimizer)


def _predict_on_indices(apply_fn, params, x, y, idx, *, learning_rate, steps, method, k0=None,
                        fit_range=None, slope_correction=0.0, rcond=1e-6,
                        forward_block_size=1000, optimizer=None) -> SubsetPrediction:
    """:func:`predict_from_subset` on given (validated) subset indices ``idx``; idx may be
    all N samples (then the power law returns the exact spectrum and Nyström is exact).
    ``learning_rate`` None with a (validated) ``optimizer``."""
    start = time.perf_counter()
    seconds: dict = {}
    x_sub = jnp.asarray(x)[jnp.asarray(idx)]
    if method == "nystrom":
        cross = timed_stage(seconds, "kernel", lambda: np.asarray(
            empirical_ntk(apply_fn, params, x_sub, x, trace_logits=True)).T)
        k_sub = cross[idx]
    else:
        k_sub = timed_stage(seconds, "kernel", lambda: np.asarray(
            empirical_ntk(apply_fn, params, x_sub, trace_logits=True)))
    r = timed_stage(seconds, "logits", residual_in_blocks, apply_fn, params, x, y,
               forward_block_size)
    if method == "nystrom":
        spectrum = timed_stage(seconds, "spectrum", nystrom_spectrum, cross, k_sub, r, rcond=rcond)
    else:
        try:
            spectrum = timed_stage(seconds, "spectrum", extrapolate_spectrum, k_sub, r[idx], r,
                                   k0=k0, fit_range=fit_range,
                                   slope_correction=slope_correction)
        except ValueError as err:
            raise PowerLawFitError(str(err)) from err

    def curve_and_times():
        curve = np.asarray(predict_curve_from_spectrum(spectrum, learning_rate=learning_rate,
                                                       steps=steps, optimizer=optimizer))
        return curve, {e: training_time_report(curve, e) for e in EPSILONS}

    curve, reports = timed_stage(seconds, "curve", curve_and_times)
    div = divergence(jnp.asarray(curve))
    at, spike = int(div.diverged_at), int(div.spiked_at)
    if bool(div.diverged):  # as the kernel predictors: no T_ε, for that reason
        reports = {e: (float("nan"), REASONS[DIVERGED]) for e in EPSILONS}
    n, n_sub = len(y), len(idx)
    k0_used = None if method == "nystrom" else max(1, min(100, n_sub // 4)) if k0 is None \
        else int(k0)
    run = {"steps": int(steps), "num_train": n, "subset_size": n_sub, "method": method,
           "k0": k0_used, "loss": "mse"}
    if optimizer is None:
        hyper = {"learning_rate": float(learning_rate), **run, "batch_size": n,
                 "momentum": 0.0}
    else:
        hyper = optimizer_hyperparameters(optimizer, steps, n) | run
    kappa = hyper["learning_rate"] * float(np.max(spectrum.eigenvalues))  # peak η_t, max μ_k
    beyond = bool(beyond_edge(kappa, hyper["momentum"], bool(hyper.get("nesterov")), "mse"))
    seconds["total"] = time.perf_counter() - start - seconds["compile"]
    return SubsetPrediction(
        loss=curve, training_time={e: t for e, (t, _) in reports.items()},
        training_time_reasons={e: why for e, (_, why) in reports.items() if why},
        kappa=kappa, beyond_edge=beyond, diverged=bool(div.diverged),
        diverged_at=None if at < 0 else at, spiked_at=None if spike < 0 else spike,
        spectrum=spectrum, subset_indices=np.asarray(idx), method=method, num_samples=n,
        subset_size=n_sub, hyperparameters=hyper, seconds=seconds)
