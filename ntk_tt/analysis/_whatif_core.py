"""The what-if results (:class:`Sensitivities`, :class:`WhatIfGrid`) and the compiled cores
that compute them from a validated problem: ``jax.jacfwd`` through the exact discrete
recursion at one (η, m), and the η × m grid in one ``jit(vmap(vmap))``
(``ntk_tt.analysis._whatif``)."""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt.dynamics._discrete import discrete_paths, discrete_trajectory
from ntk_tt.dynamics._divergence import ABSTAINS, DIVERGES, KAPPA_MAX
from ntk_tt.dynamics._fspace import clamp_psd
from ntk_tt.dynamics._losses import mean_loss
from ntk_tt.dynamics._predict_head_aware import (
    head_aware_paths,
    initial_eigenvalues,
    predict_head_aware,
)
from ntk_tt.dynamics._predict_kernel import _summarise, predict_from_kernel
from ntk_tt.dynamics._regime import UNKNOWN_TRAVEL
from ntk_tt.dynamics._training_time import (
    BEYOND_EDGE,
    CALLED_DIVERGES,
    DIVERGED,
    INVALID,
    OK,
    REASONS,
    smooth_training_time,
    training_time_array,
)


def divergence_verdict(outcome) -> str:
    """"yes", "no" or "unknown": the call ``outcome`` (an ``OUTCOMES`` code) as a verdict on
    the real run, as ``Prediction.divergence``."""
    return {DIVERGES: "yes", ABSTAINS: "unknown"}.get(int(outcome), "no")


def divergence_reason(outcome, diverged, kappa) -> str | None:
    """Why the verdict is "yes" though the predicted curve did not diverge (a spike above
    10·L_0 or κ ≥ KAPPA_MAX), or why it is "unknown"; None otherwise. ``kappa`` None: an Adam
    call (κ is not its edge; it abstains beyond the weight travel ρ = 1 only)."""
    verdict = divergence_verdict(outcome)
    if verdict == "unknown" and kappa is None:
        return (f"Adam's weight travel ρ = Σ η_t / rms(θ_0) > {UNKNOWN_TRAVEL:g}: the backbone's "
                "weights may move by more than their RMS, where real runs measured spiked or "
                "were destroyed; lower the peak learning rate or the steps for a verdict")
    if verdict == "yes" and not bool(diverged):
        why = (f"κ = η·λ_max/N = {float(kappa):.3g} ≥ {KAPPA_MAX:g}, where the real runs "
               "measured diverged" if kappa is not None and float(kappa) >= KAPPA_MAX else
               "the predicted loss spiked above 10·L_0 (real runs that did were destroyed)")
        return why + (", though the predicted curve did not end above L_0 (README, "
                      "\"Diverged means\")")
    if verdict == "unknown":
        return (f"κ = η·λ_max/N = {float(kappa):.3g} is beyond the linearised model's stability "
                "edge and the prediction did not diverge: it cannot tell; lower the learning "
                "rate for a verdict")
    return None


def time_reason(code) -> str | None:
    """Why T_ε is NaN (``REASONS`` of its ``training_time_code``); None when defined."""
    return REASONS[int(code)] if int(code) else None


def _each(fn, *fields):
    """``fn`` of scalar fields, or, for the fields of a ``jax.vmap``-ed result (arrays), a NumPy
    object array of its value at every entry (a vmapped sensitivities' properties raised a
    bare TypeError)."""
    arrays = [np.asarray(f) for f in fields]
    if arrays[0].ndim == 0:
        return fn(*arrays)
    out = np.empty(arrays[0].shape, object)
    for idx in np.ndindex(out.shape):
        out[idx] = fn(*(a[idx] for a in arrays))
    return out


def verdict(result) -> str:
    """``result.divergence``: "yes" / "no" / "unknown" from its outcome code, as
    :attr:`ntk_tt.Prediction.divergence` (an object array of them for a vmapped result)."""
    return _each(divergence_verdict, result.outcome)


def verdict_reason(result) -> str | None:
    """``result.divergence_reason``: why the call is what it is (None when it converges)."""
    return _each(divergence_reason, result.outcome, result.diverged, result.kappa)


def training_time_reason(result) -> str | None:
    """``result.training_time_reason``: why T_ε is NaN (None when it is defined)."""
    return _each(time_reason, result.training_time_code)


class Sensitivities(NamedTuple):
    """Result of :func:`ntk_tt.sensitivities` (all float scalars unless stated).

    learning_rate, momentum: the point (η, m) the derivatives are taken at.
    training_time: T_ε of the predicted mean training-loss curve by
      :func:`ntk_tt.smooth_training_time`, in (fractional) optimiser steps; NaN where the hard
      T_ε is undefined (diverged, flat, not settled). training_time_hard: the hard
      :func:`ntk_tt.training_time` of the same curve (whole steps, NaN when undefined);
      training_time_code: int32, 0 when defined, else a key of
      ``ntk_tt.dynamics._training_time.REASONS``.
    final_loss: predicted mean training loss L_T after ``steps`` updates.
    test_accuracy: predicted held-out accuracy after ``steps`` updates (1 − error, the figure
      ``compare`` reports); NaN when diverged; None without held-out data (as every accuracy
      field). soft_test_accuracy: the smoothed accuracy mean σ(margin/τ_acc) whose derivatives
      are given (NaN / None likewise).
    d_training_time_d_lr, d_training_time_d_momentum: dT_ε/dη (steps per unit η), dT_ε/dm.
    d_final_loss_d_lr, d_final_loss_d_momentum: dL_T/dη, dL_T/dm.
    d_test_accuracy_d_lr, d_test_accuracy_d_momentum: d(soft accuracy)/dη, /dm.
    training_time_elasticity, final_loss_elasticity, test_accuracy_elasticity:
      d log Q / d log η = (η/Q)·dQ/dη (dimensionless: +1 means Q grows in proportion to η).
    diverged: bool, the predicted curve diverged (every derivative is then NaN).
    kappa: η·λ_max(Θ)/N (Θ_0 for the head-aware kernel). beyond_edge: bool, κ beyond the
      linear model's stability edge (see :class:`ntk_tt.KernelPrediction`). On a plain Θ with
      cross-entropy beyond the edge (and not diverged) T_ε is NaN with code ``BEYOND_EDGE``,
      as in ``predict``: that recursion cannot blow up, so its curve says nothing there.
    outcome: int32 code of ``predict``'s call on the real run, ``_divergence.OUTCOMES[code]``
      ("diverges" also when κ ≥ ``KAPPA_MAX`` or the curve spiked above 10·L_0).
    divergence, divergence_reason, training_time_reason (properties): the call as "yes" /
      "no" / "unknown" (as ``Prediction.divergence``), why it is "yes" without ``diverged``
      or "unknown" (None otherwise), and why T_ε is NaN (None when defined); for a result of
      ``jax.vmap(sensitivities)`` NumPy object arrays of those, one per entry.

    Source: ntk_tt's own (issue 13; README "What-if").
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
    outcome: jax.Array

    divergence = property(verdict)
    divergence_reason = property(verdict_reason)
    training_time_reason = property(training_time_reason)


class WhatIfGrid(NamedTuple):
    """Result of :func:`ntk_tt.divergence_boundary` (G_m = len(momenta),
    G_η = len(learning_rates)).

    learning_rates (G_η,), momenta (G_m,): the grid, ascending η.
    diverged: bool (G_m, G_η), the predicted run diverged (non-finite loss or L_T > L_0), as
      ``Prediction.diverged``.
    training_time: (G_m, G_η) hard T_ε of the predicted mean loss curve at ``epsilon``, in
      optimiser steps; NaN where ``predict``'s is: undefined, diverged, or the frozen-kernel
      cross-entropy recursion beyond the edge (code ``BEYOND_EDGE``).
    final_loss: (G_m, G_η) predicted mean training loss L_T (a diverged run's is held at its
      last finite value, as in :class:`ntk_tt.KernelPrediction`).
    test_accuracy: (G_m, G_η) predicted held-out accuracy at T; NaN without held-out data
      or where diverged.
    kappa: (G_η,) η·λ_max/N. beyond_edge: bool (G_m, G_η), κ beyond the linear model's
      stability edge 2(1 + m)/h (a formula, not the prediction).
    outcome: int32 (G_m, G_η), each point's call on the real run, ``ntk_tt.OUTCOMES[code]``
      ("converges", "catapult", "diverges", "unknown"), as ``Prediction.outcome``.
    boundary: (G_m,) for each m the largest grid η below the first one that the prediction
      says diverges (``predict``'s ``divergence == "yes"``: ``diverged``, or the call
      "diverges": a spike above 10·L_0, which real networks did not survive even where the
      linearised model does, or κ ≥ 68; ``ntk_tt.dynamics._divergence``): the predicted
      divergence boundary; NaN when the smallest η already diverges, the largest grid η when
      none does (then ``boundary_inside`` is False).
    boundary_inside: bool (G_m,), some grid η diverges at that m (the boundary lies inside
      the grid). monotone: bool (G_m,), no grid η above the first diverging one recovers
      (False flags e.g. SGD noise or a cross-entropy catapult at that m).
    epsilon: the ε of ``training_time`` (a Python float). steps: T (a Python int).
    momentum_name: what ``momenta`` are, for labels: "momentum m", or "Adam β₁" for an
      Adam-family ``optimizer=`` grid.

    Printed (``repr``), arrays show as plain numbers ``[0.01, 0.1]`` (numpy's summary for
    large ones), not ``array(...)`` / ``np.float64(...)``; the fields stay numpy arrays.

    Source: ntk_tt's own (issue 13; README "What-if").
    """

    learning_rates: np.ndarray
    momenta: np.ndarray
    diverged: np.ndarray
    training_time: np.ndarray
    final_loss: np.ndarray
    test_accuracy: np.ndarray
    kappa: np.ndarray
    beyond_edge: np.ndarray
    outcome: np.ndarray
    boundary: np.ndarray
    boundary_inside: np.ndarray
    monotone: np.ndarray
    epsilon: float
    steps: int
    momentum_name: str = "momentum m"

    def __repr__(self) -> str:
        def show(v):
            if isinstance(v, np.ndarray):
                return np.array2string(v, separator=", ", threshold=100, precision=6)
            return repr(v.item() if isinstance(v, np.generic) else v)

        body = ", ".join(f"{k}={show(v)}" for k, v in zip(self._fields, self, strict=True))
        return f"WhatIfGrid({body})"


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


def measure(fs, fts, y, y_test, epsilon, temperature, acc_temperature, *, loss, window):
    """The differentiated quantities of paths' logits fs (P, T + 1, N, C) and held-out fts
    (P, T + 1, N_test, C) or None: (smooth T_ε of the mean loss curve, L_T, the mean smoothed
    held-out accuracy, NaN without held-out data), (3,)."""
    loss_c = jnp.mean(jax.vmap(jax.vmap(lambda f: mean_loss(f, y, loss)))(fs), axis=0)
    t_soft = smooth_training_time(loss_c, epsilon, window=window, temperature=temperature)
    if fts is None:
        soft = jnp.full((), jnp.nan, loss_c.dtype)
    else:
        soft = jnp.mean(jax.vmap(lambda f: soft_accuracy(f[-1], y_test, acc_temperature))(fts))
    return jnp.stack([t_soft, loss_c[-1], soft])


def settle(values, jac, pred, y_test, epsilon, window, blind):
    """The summary's verdicts on :func:`measure`'s ``values`` (3,) and their derivatives
    ``jac`` (3, k): (smooth T_ε, hard T_ε, its code, held-out accuracy, soft accuracy, jac),
    NaN where undefined, T_ε also where ``blind`` (code ``BEYOND_EDGE``: a frozen kernel with
    cross-entropy beyond the edge, as ``predict``) or called divergent (code
    ``CALLED_DIVERGES``, :func:`called_divergent`); the accuracies None and ``jac`` without
    its accuracy row (2, k) without held-out data (as :class:`Sensitivities` documents). A
    point the eager checks would refuse (traced; ``pred``'s code ``INVALID``) is NaN with every
    derivative, code ``INVALID``, as ``predict_from_kernel``."""
    nan = jnp.asarray(jnp.nan, values.dtype)
    t_hard, code = training_time_array(pred.loss, epsilon, window)
    diverged, called = pred.diverged, called_divergent(pred)
    invalid = jnp.any(pred.training_time_code == INVALID)
    code = jnp.where(invalid, INVALID, jnp.where(diverged, DIVERGED, jnp.where(
        called, CALLED_DIVERGES, jnp.where(blind, BEYOND_EDGE, code)))).astype(jnp.int32)
    defined = code == OK
    values = jnp.where(invalid, nan, values)
    jac = jnp.where(diverged | invalid, nan, jac)
    jac = jac.at[0].set(jnp.where(defined, jac[0], nan))
    t_hard = jnp.where(diverged | blind | called, nan, t_hard)
    if y_test is None:  # no held-out data: no accuracy, no derivative of it
        return jnp.where(defined, values[0], nan), t_hard, code, None, None, jac[:2]
    acc = 1.0 - pred.test_error[-1]
    return (jnp.where(defined, values[0], nan), t_hard, code,
            jnp.where(diverged, nan, acc), jnp.where(diverged, nan, values[2]), jac)


def called_divergent(pred):
    """The call on the real run is "diverges" though the predicted curve did not diverge (a
    spike above 10·L_0, or κ ≥ 68): no T_ε (``CALLED_DIVERGES``, as ``predict``)."""
    return (pred.outcome == DIVERGES) & ~pred.diverged


def is_blind(kind, loss, pred):
    """The frozen-kernel cross-entropy recursion beyond the edge, not diverged: no T_ε
    (``BEYOND_EDGE``, as ``predict_from_kernel``)."""
    if kind == "plain" and loss == "cross_entropy":
        return pred.beyond_edge & ~pred.diverged
    return jnp.zeros((), bool)


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
        out = measure(fs, fts, y, y_test, epsilon, temperature, acc_temperature, loss=loss,
                      window=window)
        return out, (out, fs, fts)

    jac, (values, fs, fts) = jax.jacfwd(quantities, has_aux=True)(jnp.stack([lr, m]))
    size = psd.shape[0] if kind == "plain" else fs.shape[2] * fs.shape[3]  # Θ_0: N·C
    pred = _summarise(fs, fts, y, y_test, size, lr, m, lams, nesterov=nesterov, loss=loss,
                      stochastic=fs.shape[0] > 1, frozen=kind == "plain",
                      feature_subspace=kind != "plain" and data.basis is not None)
    t_soft, t_hard, code, acc, soft, jac = settle(values, jac, pred, y_test, epsilon, window,
                                                  is_blind(kind, loss, pred))
    d_t = jac[0]
    held = y_test is not None

    def elastic(value, d_lr):
        return lr * d_lr / value

    return Sensitivities(
        learning_rate=lr, momentum=m,
        training_time=t_soft, training_time_hard=t_hard,
        training_time_code=code,
        final_loss=pred.loss[-1], test_accuracy=acc, soft_test_accuracy=soft,
        d_training_time_d_lr=d_t[0], d_training_time_d_momentum=d_t[1],
        d_final_loss_d_lr=jac[1, 0], d_final_loss_d_momentum=jac[1, 1],
        d_test_accuracy_d_lr=jac[2, 0] if held else None,
        d_test_accuracy_d_momentum=jac[2, 1] if held else None,
        training_time_elasticity=elastic(t_soft, d_t[0]),
        final_loss_elasticity=elastic(pred.loss[-1], jac[1, 0]),
        test_accuracy_elasticity=elastic(soft, jac[2, 0]) if held else None,
        diverged=pred.diverged, kappa=pred.kappa, beyond_edge=pred.beyond_edge,
        outcome=pred.outcome)


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
        return grid_cell(pred, epsilon, window, is_blind(kind, loss, pred))

    return jax.vmap(lambda m: jax.vmap(lambda lr: one(lr, m))(lrs))(ms)


def grid_cell(pred, epsilon, window, blind):
    """One :class:`WhatIfGrid` cell of a prediction: (diverged, hard T_ε, L_T, held-out
    accuracy, κ, beyond_edge, outcome), T_ε NaN where diverged, called divergent
    (:func:`called_divergent`) or ``blind`` (:func:`is_blind`), as ``predict``'s, the
    accuracy NaN where diverged."""
    t, _ = training_time_array(pred.loss, epsilon, window)
    nan = jnp.asarray(jnp.nan, pred.loss.dtype)
    acc = nan if pred.test_error is None else 1.0 - pred.test_error[-1]
    return (pred.diverged, jnp.where(pred.diverged | blind | called_divergent(pred), nan, t),
            pred.loss[-1],
            jnp.where(pred.diverged, nan, acc), pred.kappa, pred.beyond_edge, pred.outcome)


class _PlainRaw(NamedTuple):
    kernel: jax.Array
    f0: jax.Array
    kernel_test: jax.Array | None
    f0_test: jax.Array | None
