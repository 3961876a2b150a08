"""``predict_from_kernel``: pure, jittable curves and T_ε from a given empirical NTK.

Hyperparameters η and m are (traceable) arrays, so ``jit(vmap(...))`` over a sweep shares one
kernel; steps, batch size, loss, method, num_paths, nesterov are static (``STATIC``, for jit).
Eagerly it validates its arguments, then runs one compiled core (cached per static setting
and shapes). Divergence, a non-PSD kernel, undefined T_ε, a bad traced η come back flagged.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from ntk_tt._options import MAX_STEPS as MAX_STEPS  # the names shared with the JAX-free checks
from ntk_tt._options import METHODS as METHODS
from ntk_tt._options import resolve_method as resolve_method
from ntk_tt.data._inputs import _check_finite, as_array, check_key
from ntk_tt.dynamics._checks import (
    _check_method_inputs,
    check_f0_shape,
    check_gram,
    check_num_paths,
    check_problem,
    check_test_kernel,
    flag,
    float_logits,
)
from ntk_tt.dynamics._closed_form import mse_closed_form
from ntk_tt.dynamics._discrete import discrete_paths, discrete_trajectory
from ntk_tt.dynamics._divergence import (
    ABSTAINS,
    DIVERGES,
    beyond_edge,
    call,
    cannot_diverge,
    divergence,
    earliest,
    effective_rate_abstains,
    first_nonfinite,
    hold_from,
    paths_outcome,
    verdict,
)
from ntk_tt.dynamics._edge_warnings import warn_method_edges
from ntk_tt.dynamics._fspace import as_operator, clamp_psd, curves, negative_significant
from ntk_tt.dynamics._invalid import invalid, unless
from ntk_tt.dynamics._losses import check_loss
from ntk_tt.dynamics._ode import ode_trajectory
from ntk_tt.dynamics._optim_linear import check_shorthand
from ntk_tt.dynamics._sde import sde_paths
from ntk_tt.dynamics._training_time import (
    BEYOND_EDGE,
    CALLED_DIVERGES,
    DIVERGED,
    INVALID,
    curve_window,
    training_time_array,
)

EPSILONS = (0.01, 0.1, 0.4)
STATIC = ("steps", "batch_size", "nesterov", "loss", "method", "num_paths")


class KernelPrediction(NamedTuple):
    """Arrays returned by :func:`predict_from_kernel` (T = steps, P = paths or seeds).

    loss, error: mean curves (T + 1,), index = optimiser steps taken; loss is the MEAN loss.
    loss_band, error_band: 5 % / 95 % quantiles over paths (2, T + 1), None if deterministic.
    loss_paths, error_paths: every path (P, T + 1); P = 1 when deterministic.
    test_loss, test_error: held-out mean curves (T + 1,), or None without ``kernel_test``.
    diverged: bool, some path diverged (``ntk_tt.dynamics._divergence``: a non-finite loss, or
      L_T > L_0); diverged_at: int32, the earliest ``diverged_at`` of the diverged paths, −1
      if none. spiked_at: int32, the first step any path's loss exceeded 10·L_0, −1 if none
      (spiked and not diverged: spiked and recovered, yet called divergent, no T_ε).
      Each path's curves hold their last finite value from its first non-finite loss on.
    kappa: η·λ_max(Θ)/N. beyond_edge: κ beyond the linear model's stability edge
      2(1 + m)/h (heavy ball; 2(1 + m)/((1 + 2m)h) Nesterov), h = 1 for MSE, ½ for CE.
    outcome: int32 code of the call on the real run, ``_divergence.OUTCOMES[code]``
      (``_divergence.call``): 2 "diverges" (some path diverged or spiked above 10·L_0, or
      κ ≥ ``_divergence.KAPPA_MAX``), 3 "unknown" (κ beyond the edge for a predictor that
      cannot blow up there: frozen kernel with cross-entropy, or ODE/SDE; the closed form
      with m > 0 from κ = 2(1 − m), ``effective_rate_abstains``), else the mean
      curve's 1 "catapult" (it rises above its L_0) or 0 "converges". spike_step: int32, the
      first step above L_0 (of the earliest diverging path when it diverges), −1 if none.
    divergence (property): int32 verdict on the real run, ``_divergence.VERDICTS[code]``:
      1 "yes" (outcome "diverges"), 2 "unknown" (outcome "unknown"), else 0 "no". A frozen
      cross-entropy kernel's prediction beyond the edge has no T_ε either (NaN, code
      ``BEYOND_EDGE``): that recursion cannot blow up, so its curve says nothing there.
    min_eigenvalue: smallest eigenvalue estimate of Θ; clamped: negative ones set to 0.
    training_time: T_ε (2, 3): rows (loss, error), columns ε = 0.01, 0.1, 0.4; NaN undefined.
    training_time_code: int32 (2, 3), 0 = defined, else a key of ``_training_time.REASONS``
      (``CALLED_DIVERGES`` wherever ``outcome`` is "diverges" but the curve did not diverge).
    Under ``jit`` / ``vmap`` a traced η ≤ 0, NaN or inf, m ∉ [0, 1) or Nesterov's m = 0 is not
    refused, nor are traced labels outside [0, C), NaN or inf initial logits or a kernel whose
    λ_max is NaN or negative: that prediction's curves, κ, T_ε are NaN (``jax.grad`` through
    them too), code ``INVALID``, outcome "unknown".

    Source: ntk_tt's own container of :func:`predict_from_kernel`'s result (METHOD.md §2, §6).
    """

    loss: jax.Array
    error: jax.Array
    loss_band: jax.Array | None
    error_band: jax.Array | None
    loss_paths: jax.Array
    error_paths: jax.Array
    test_loss: jax.Array | None
    test_error: jax.Array | None
    diverged: jax.Array
    diverged_at: jax.Array
    spiked_at: jax.Array
    kappa: jax.Array
    beyond_edge: jax.Array
    min_eigenvalue: jax.Array
    clamped: jax.Array
    training_time: jax.Array
    training_time_code: jax.Array
    outcome: jax.Array
    spike_step: jax.Array

    @property
    def divergence(self) -> jax.Array:
        """Verdict code on the real run (see the class docstring), from ``outcome``."""
        return verdict(self.outcome == DIVERGES, self.outcome == ABSTAINS)


def _solve(method, op, f0, y, test_op, f0_test, *, lr, m, steps, batch_size, nesterov, loss,
           key, noise_features, num_paths):
    """Logits trajectories with a leading path axis, plus the closed form's exact λ_min."""
    n = f0.shape[0]
    common = dict(test_op=test_op, f0_test=f0_test)
    if method == "closed_form":
        fs, fts, lam_min = mse_closed_form(op, f0, y, learning_rate=lr, momentum=m,
                                           steps=steps, **common)
        return fs[None], None if fts is None else fts[None], lam_min
    if method == "ode":
        fs, fts = ode_trajectory(op, f0, y, learning_rate=lr, momentum=m, steps=steps,
                                 loss=loss, **common)
    elif method == "sde":
        return (*sde_paths(op, f0, y, noise_features, key=key, num_paths=num_paths,
                           learning_rate=lr, momentum=m, batch_size=batch_size, steps=steps,
                           loss=loss, **common), None)
    elif batch_size < n:
        return (*discrete_paths(op, f0, y, key=key, num_paths=num_paths,
                                batch_size=batch_size, steps=steps, learning_rate=lr,
                                momentum=m, nesterov=nesterov, loss=loss, **common), None)
    else:
        batches = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (steps, n))
        fs, fts = discrete_trajectory(op, f0, y, batches, learning_rate=lr, momentum=m,
                                      nesterov=nesterov, loss=loss, **common)
    return fs[None], None if fts is None else fts[None], None


def predict_from_kernel(
    kernel, f0, y, *, learning_rate=None, momentum=None, steps, batch_size=None,
    nesterov=None, loss="cross_entropy", method="discrete", key=None, noise_features=None,
    num_paths=32, kernel_test=None, f0_test=None, y_test=None, optimizer=None, a=None,
    a_test=None,
) -> KernelPrediction:
    """Predicted fine-tuning curves and T_ε of the linearised model, from Θ.

    Source: Zancato et al. 2020 (arXiv 2008.12478), Secs. 3–5, eq. (1); METHOD.md §2, §3, §6.

    Args:
      kernel: empirical NTK Θ (N·C, N·C), sample-major; or (N, N) logit-SUMMED, used as
        (Θ/C) ⊗ I_C. Symmetrised (rounding only: a visibly asymmetric kernel is refused);
        significant negative eigenvalues are clamped to 0.
      f0: initial logits (N, C) at the pre-trained weights. y: integer labels (N,).
        Dtypes: the solve runs in the kernel's floating dtype promoted with f0's, at least
        float32 (bfloat16 / float16 are promoted; integer or bool f0 takes the kernel's;
        float64 needs x64); the other arrays and η, m are cast to it, and the result's
        curves, κ and λ_min are in it (README, "Dtypes").
      learning_rate: η > 0 (array, traceable). momentum: m ∈ [0, 1) (array, traceable;
        None: 0). steps: T optimiser updates. batch_size: B (None = N, full-batch GD).
      nesterov: optax's Nesterov form (None: False). These four are the constant-η SGD
        shorthand; ``optimizer`` replaces them.
      optimizer: an SGD-family :class:`ntk_tt.Optimizer` (``ntk_tt.sgd(schedule, m,
        weight_decay=, batch_size=)``), the same curves as ``ntk_tt.predict(optimizer=)``
        (METHOD.md §11): "auto" / "discrete" by the exact recursion
        :func:`ntk_tt.sgd_trajectory`; "closed_form" (exact GD with η_t/(1 − m)), "ode" and
        "sde" with η(t) the schedule at real t (in steps), momentum via η(t)/(1 − m) and the
        decay λ_2 + (1 − m)λ_d (``ntk_tt.dynamics._ode``); a ``constant`` schedule without
        decay gives the shorthand's curves exactly. κ uses the schedule's peak η_t. Leaves
        may be traced (method "discrete"; refused entries: NaN, code ``INVALID``).
      a, a_test: J·θ0 on x (N, C) and x_test (N_test, C) (``ntk_tt.weight_tangent``):
        ``optimizer`` with weight decay λ ≠ 0 only.
      loss: "cross_entropy" or "mse" (mean over samples).
      method: "discrete" (exact recursion), "closed_form" (MSE + GD), "ode" (diffrax, m via
        η/(1 − m); SGD's mean flow, the GD curve whatever ``batch_size``; ``jax.grad``, not
        ``jax.jacfwd``: diffrax's default adjoint is a ``custom_vjp``), "sde" (diffrax, SGD
        noise; ``jax.grad`` and ``jax.jacfwd`` alike), "auto".
      key: jax.random key for the SDE's Brownian paths or the discrete SGD batch orders:
        seed 0 uses ``batch_indices(key, N, B, steps)``, a real run's with the same key.
      noise_features: (N·C, D') SDE noise features J·diag(σ_w)·P/√D'.
      num_paths: seeds / Brownian paths for stochastic methods.
      kernel_test: cross kernel Θ(x_test, x), (N_test·C, N·C) or (N_test, N) summed.
      f0_test: held-out initial logits (N_test, C). y_test: held-out labels (N_test,).

    Returns:
      :class:`KernelPrediction`.

    Raises:
      ValueError: arrays given as anything but arrays or nested lists of numbers, complex
        arrays (kernel, f0, kernel_test, f0_test: the message names the argument), η or m
        not a real number (a string included), a key that is not ``jax.random.key(seed)``,
        bad shapes (f0 not of the (N, C) shape the kernel and y imply: the message gives the
        expected and the given shape; f0 of shape (C, N) is said to be transposed), labels,
        η ≤ 0 or not a scalar, m ∉ [0, 1) or above 1 − 2⁻²⁴ (1.0 in float32) or 0 with
        Nesterov, B ∉ [1, N], steps or num_paths < 1, non-finite Θ, f0, f0_test (the count
        given), ``a`` / ``a_test`` / ``noise_features`` with NaN or inf, unknown method or
        loss, missing key / noise features, a kernel that cannot be Θ = J Jᵀ (asymmetric
        beyond 1e-3 of its largest entry, e.g. a cross kernel, with a negative diagonal entry,
        or zero everywhere; ``check_gram``) (value checks only when the arguments are
        concrete, i.e. not traced); ``optimizer`` with any of the four shorthand keywords (or
        neither), an Adam optimiser (no frozen-kernel form: use ``predict_head_aware``), a
        schedule that is never > 0 or whose warmup ends at or after ``steps`` (for the
        continuous methods a callable that fails at real t), ``noise_features`` without
        "sde", weight decay without ``a`` (``a_test``), ``a`` without ``optimizer``;
        "closed_form" with cross-entropy or B < N.

    Warns:
      BeyondEdgeWarning: (a UserWarning) ``method`` "ode" or "sde" with κ beyond the stability
        edge (concrete values): the continuous-time limit converges at any κ, the real run
        does not.
    """
    check_shorthand(optimizer, where="predict_from_kernel", learning_rate=learning_rate,
                    momentum=momentum, nesterov=nesterov, batch_size=batch_size)
    if optimizer is not None:
        from ntk_tt.dynamics._optim_predict import kernel_prediction

        return kernel_prediction(kernel, f0, y, optimizer, steps=steps, loss=loss, method=method,
                                 key=key, noise_features=noise_features, num_paths=num_paths,
                                 kernel_test=kernel_test, f0_test=f0_test, y_test=y_test, a=a,
                                 a_test=a_test)
    if a is not None or a_test is not None:
        raise ValueError("a and a_test (J·θ0) serve the weight decay of optimizer=; drop them "
                         "with the constant-η keywords.")
    momentum, nesterov = 0.0 if momentum is None else momentum, flag(nesterov)
    check_loss(loss)
    kernel, f0 = as_array(kernel, "kernel"), as_array(f0, "f0")
    check_key(key)
    check_f0_shape(kernel, f0, y)
    f0 = float_logits(f0, kernel)  # in the dtype of the solve (README, "Dtypes")
    n, c, batch_size, y = check_problem(f0, y, loss, learning_rate, momentum, steps, batch_size,
                                        nesterov)
    check_num_paths(num_paths)
    full_batch = batch_size == n
    method = resolve_method(method)
    _check_method_inputs(method, loss, full_batch, key, noise_features, n * c)
    _check_finite(kernel, "kernel")
    check_gram(kernel)
    dtype = f0.dtype
    mat, traced = as_operator(jnp.asarray(kernel, dtype), n, c, name="kernel")
    test_mat, test_traced, f0_test, y_test = check_test_kernel(kernel_test, f0_test, y_test,
                                                               n, c, dtype)
    if noise_features is not None:
        noise_features = jnp.asarray(noise_features, dtype)
    out = _core(mat, f0, y, jnp.asarray(learning_rate, dtype), jnp.asarray(momentum, dtype),
                key, noise_features, test_mat, f0_test, y_test, traced=traced,
                test_traced=test_traced, method=method, steps=steps, batch_size=batch_size,
                nesterov=nesterov, loss=loss, num_paths=num_paths)
    warn_method_edges(out, method, momentum, nesterov)
    return out


@partial(jax.jit, static_argnames=("traced", "test_traced", "method", "steps", "batch_size",
                                   "nesterov", "loss", "num_paths"))
def _core(mat, f0, y, lr, m, key, noise_features, test_mat, f0_test, y_test, *, traced,
          test_traced, method, steps, batch_size, nesterov, loss, num_paths):
    """The compiled part of :func:`predict_from_kernel` (arguments already validated)."""
    test_op = None if test_mat is None else (test_mat, test_traced)
    lams = None
    if method != "closed_form":
        mat, lams = clamp_psd(mat)
    op = (mat, traced)
    fs, fts, lam_exact = _solve(
        method, op, f0, y, test_op, f0_test, lr=lr, m=m, steps=steps, batch_size=batch_size,
        nesterov=nesterov, loss=loss, key=key, noise_features=noise_features,
        num_paths=num_paths)
    lams = lam_exact if lams is None else lams
    return _summarise(fs, fts, y, y_test, mat.shape[0], lr, m, lams, nesterov=nesterov, loss=loss,
                      stochastic=method == "sde" or fs.shape[0] > 1, frozen=True,
                      method=method)


def _mean_band(paths, stochastic):
    band = jnp.quantile(paths, jnp.array([0.05, 0.95]), axis=0) if stochastic else None
    return jnp.mean(paths, axis=0), band


def _summarise(fs, fts, y, y_test, size, lr, m, lams, *, nesterov, loss, stochastic,
               frozen=False, method="discrete", kappa_rule=True, feature_subspace=False):
    """Curves per path → divergence, hold past a non-finite loss → mean, band, κ, T_ε.
    ``size``: the side of the kernel that ``lams`` = (λ_min, λ_max) belong to. ``frozen``: the
    curves are of a frozen kernel (``predict_from_kernel``), whose cross-entropy T_ε beyond the
    stability edge is undefined (``BEYOND_EDGE``); ``method``: "ode" / "sde" (the call abstains
    beyond the edge, ``_divergence.cannot_diverge``), "closed_form" (with m > 0 it abstains
    from 2(1 − m), ``_divergence.effective_rate_abstains``). ``kappa_rule``: κ ≥ ``KAPPA_MAX``
    calls "diverges" whatever the curve (False for Adam, whose stability κ does not measure:
    its call is its curve's). ``feature_subspace``: a head-aware model with ``hk.basis`` set
    (subspace / diagonal): its own "diverges" below ``KAPPA_MAX`` is "catapult"."""
    n = fs.shape[2]
    loss_p, err_p = jax.vmap(lambda f: curves(f, y, loss))(fs)
    div = divergence(loss_p)
    raw = loss_p
    stop = first_nonfinite(loss_p)
    hold = jax.vmap(hold_from)
    loss_p, err_p = hold(loss_p, stop), hold(err_p, stop)
    loss_c, loss_band = _mean_band(loss_p, stochastic)
    err_c, err_band = _mean_band(err_p, stochastic)
    test_loss = test_err = None
    if fts is not None:
        tl, te = jax.vmap(lambda f: curves(f, y_test, loss))(fts)
        test_loss, test_err = jnp.mean(hold(tl, stop), 0), jnp.mean(hold(te, stop), 0)
    diverged = jnp.any(div.diverged)
    lam_min, lam_max = lams
    kappa = lr * lam_max / n
    window = curve_window(loss_c.shape[0])
    eps = jnp.asarray(EPSILONS, loss_c.dtype)
    tt = jax.vmap(lambda cv: jax.vmap(lambda e: training_time_array(cv, e, window))(eps))
    t_eps, codes = tt(jnp.stack([loss_c, err_c]))
    # a diverged run has no training time, whatever its held (finite) curve looks like
    t_eps = jnp.where(diverged, jnp.nan, t_eps)
    codes = jnp.where(diverged, DIVERGED, codes).astype(jnp.int32)
    beyond = beyond_edge(kappa, m, nesterov, loss)
    said = call(paths_outcome(raw, loss_c), kappa if kappa_rule else jnp.zeros_like(kappa),
                beyond & cannot_diverge(frozen, loss, method in ("ode", "sde")),
                feature_subspace and kappa_rule)
    if method == "closed_form":
        said = effective_rate_abstains(said, kappa, m, beyond)
    if frozen and loss == "cross_entropy":  # a bounded-gradient recursion: no evidence there
        blind = beyond & ~diverged
        t_eps = jnp.where(blind, jnp.nan, t_eps)
        codes = jnp.where(blind, BEYOND_EDGE, codes).astype(jnp.int32)
    called = (said.outcome == DIVERGES) & ~diverged  # a run called divergent: no T_ε
    t_eps = jnp.where(called, jnp.nan, t_eps)
    codes = jnp.where(called, CALLED_DIVERGES, codes).astype(jnp.int32)
    # traced η, m or data that the eager checks refuse: NaN, INVALID, "unknown"
    bad = invalid(lr, m, nesterov, fs, fts, y, y_test, lam_max)
    nan, none = partial(unless, bad, jnp.nan), partial(unless, bad, -1)
    return KernelPrediction(
        loss=nan(loss_c), error=nan(err_c), loss_band=nan(loss_band),
        error_band=nan(err_band), loss_paths=nan(loss_p), error_paths=nan(err_p),
        test_loss=nan(test_loss), test_error=nan(test_err),
        diverged=diverged & ~bad, diverged_at=none(earliest(div.diverged_at)),
        spiked_at=none(earliest(div.spiked_at)), kappa=nan(kappa), beyond_edge=beyond & ~bad,
        min_eigenvalue=lam_min, clamped=negative_significant(lam_min, lam_max, size),
        training_time=nan(t_eps), training_time_code=unless(bad, INVALID, codes),
        outcome=unless(bad, 3, said.outcome), spike_step=none(said.spike_step),
    )
