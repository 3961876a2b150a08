"""What-if for a whole :class:`ntk_tt.Optimizer` (issue 27): ``sensitivities(...,
optimizer=)``.

The quantities of :func:`ntk_tt.sensitivities` (smooth and hard T_ε, L_T, held-out
accuracy) of the optimiser recursions of METHOD.md §11, and their forward-mode derivatives
(``jax.jacfwd``, one compiled call) with respect to the optimiser's hyperparameters: the
schedule's peak learning rate, its warmup length, the weight decay λ and the momentum m
(SGD) or β₁ (Adam). The recursions are those of :func:`ntk_tt.predict` with ``optimizer=``:
:func:`ntk_tt.sgd_trajectory` on a plain Θ (clamped to PSD), and
:func:`ntk_tt.head_aware_sgd_trajectory` or :func:`ntk_tt.head_aware_adam_trajectory` on a
head-aware kernel; SGD (B < N) averages ``num_paths`` batch orders, path 0 =
``ntk_tt.batch_indices(key, N, B, T)`` (a real run's order).

The warmup length w enters η_t through min(1, t/w), whose derivative in w jumps wherever w
crosses a step t. The warmup derivative is therefore Σ_t (∂Q/∂η_t)·(∂η̃_t/∂w): the
prediction's response to each step's learning rate, at the schedule as given, along the
direction in which the softplus-relaxed ramp η̃ of :mod:`ntk_tt._schedules` moves with w.
η̃ is the schedule itself when its ``smoothing`` > 0 (the derivative is then dQ/dw), else
the schedule relaxed to ``warmup_smoothing`` steps (default :data:`DEFAULT_WARMUP_SMOOTHING`
= 0.25; 0 = the exact ramp, whose derivative at an integer w is the mean of the one-sided
ones). The relaxation's tails reach several widths: on the frozen-kernel test problem
(warmup 5 of 30 steps) dL_T/dw was −1.0e-4 (exact), −1.3e-4 (0.25 step), −3.0e-4 (1 step),
against −1.2e-4 to −1.3e-4 for the exact prediction's secants over w ± 0.25 … ± 1 step. The
values and every other derivative are those of the schedule as given, as
``predict(optimizer=)`` predicts it. :func:`run_paths` and :func:`summarise_run` (that
recursion and its summary) also serve ``divergence_boundary(optimizer=)``
(``_whatif_boundary``).
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from ntk_tt._schedules import Schedule
from ntk_tt.analysis._whatif_core import (
    _clamped,
    divergence_reason,
    is_blind,
    measure,
    settle,
    training_time_reason,
    verdict,
)
from ntk_tt.dynamics._adam_head_aware import _adam_core
from ntk_tt.dynamics._optim_head_aware import _head_sgd_core
from ntk_tt.dynamics._optim_linear import _sgd_core
from ntk_tt.dynamics._predict_kernel import _summarise

DEFAULT_WARMUP_SMOOTHING = 0.25  # steps: the warmup relaxation when the schedule has none
QUANTITIES = ("training_time", "final_loss", "test_accuracy")
PEAK_FIELDS = {"Constant": "value", "WarmupCosine": "peak", "WarmupStableDecay": "peak",
               "Exponential": "init"}  # the leaf that is "peak_learning_rate"


class OptimizerSensitivities(NamedTuple):
    """Result of :func:`ntk_tt.sensitivities` with ``optimizer=`` (float scalars unless said).

    hyperparameters: {name: value} at the point the derivatives are taken at, names among
      "peak_learning_rate" (the schedule's ``value`` for a constant, ``peak`` for
      warmup_cosine / warmup_stable_decay, ``init`` for exponential), "warmup" (steps;
      schedules with a warmup only), "weight_decay" (λ; only when the tangent ``a`` is given:
      d/dλ acts on J·θ0), "momentum" (SGD's m) or "b1" (Adam's β₁).
    training_time, training_time_hard, training_time_code, final_loss, test_accuracy,
      soft_test_accuracy, diverged, outcome (and the properties divergence,
      divergence_reason, training_time_reason): as :class:`ntk_tt.Sensitivities` (the
      accuracies None without held-out data).
    gradients: {"training_time": {name: dT_ε/d name}, "final_loss": {name: dL_T/d name},
      "test_accuracy": {name: d(soft accuracy)/d name}}, per unit of each hyperparameter
      (T_ε in steps, so dT_ε/d warmup is steps per step); no "test_accuracy" key without
      held-out data. NaN as :class:`ntk_tt.Sensitivities`; d/d warmup also NaN at warmup 0
      (η_0 jumps from the peak to ``init`` as a warmup starts: no derivative).
    elasticities: the same keys, d log Q / d log name = (name/Q)·dQ/d name.
    warmup_smoothing: the width (steps) of the relaxed ramp whose direction ∂η̃_t/∂w the
      "warmup" derivatives follow (module docstring); None without a warmup.
    kappa: η_peak·λ_max(Θ_0)/N with the largest η_t over the T steps; beyond_edge: κ beyond
      the linear model's edge for m (for Adam, as ``predict(optimizer=)``, the plain-GD number:
      it does not measure Adam's stability).

    Source: ntk_tt's own (issues 13 and 27; README "What-if"; METHOD.md §11).
    """

    hyperparameters: dict
    training_time: jax.Array
    training_time_hard: jax.Array
    training_time_code: jax.Array
    final_loss: jax.Array
    test_accuracy: jax.Array
    soft_test_accuracy: jax.Array
    gradients: dict
    elasticities: dict
    warmup_smoothing: float | None
    diverged: jax.Array
    kappa: jax.Array
    beyond_edge: jax.Array
    outcome: jax.Array

    divergence = property(verdict)
    divergence_reason = property(lambda self: divergence_reason(
        self.outcome, self.diverged, None if "b1" in self.hyperparameters else self.kappa))
    training_time_reason = property(training_time_reason)


def hyperparameter_names(optimizer, with_tangent: bool) -> tuple[str, ...]:
    """The names differentiated for ``optimizer`` (its schedule a known pytree schedule)."""
    names = ["peak_learning_rate"]
    if hasattr(optimizer.learning_rate, "warmup"):
        names.append("warmup")
    if with_tangent:
        names.append("weight_decay")
    names.append("momentum" if optimizer.rule == "sgd" else "b1")
    return tuple(names)


def _getter(name: str, optimizer):
    if name == "peak_learning_rate":
        field = PEAK_FIELDS[type(optimizer.learning_rate).__name__]
        return lambda o: getattr(o.learning_rate, field)
    if name == "warmup":
        return lambda o: o.learning_rate.warmup
    if name == "weight_decay":
        return lambda o: o.weight_decay
    return lambda o: o.momentum  # "momentum" / "b1"


def _values(optimizer, names, dtype) -> jax.Array:
    return jnp.stack([jnp.asarray(_getter(n, optimizer)(optimizer), dtype) for n in names])


def _substitute(optimizer, values: dict):
    """``optimizer`` with the hyperparameters named in ``values`` set to them."""
    getters = [_getter(n, optimizer) for n in values]
    return eqx.tree_at(lambda o: [g(o) for g in getters], optimizer, replace=list(values.values()))


class _Rates(Schedule):
    """η_t from a table (T,): the schedule a traced warmup direction is pushed through."""

    rates: jax.Array

    def __call__(self, step) -> jax.Array:
        return self.rates[step]


def warmup_direction(schedule, smoothing: float, steps: int) -> jax.Array:
    """∂η̃_t/∂w (T,) of ``schedule`` relaxed to ``smoothing`` steps (module docstring)."""
    relaxed = dataclasses.replace(schedule, smoothing=smoothing)
    return jax.jacfwd(lambda w: eqx.tree_at(lambda s: s.warmup, relaxed, w).values(steps))(
        relaxed.warmup)


def run_paths(kind, data, psd, y, optimizer, batches, tangents, *, traced, test_traced, loss):
    """Training and held-out logits (P, T + 1, N, C), (P, T + 1, N_test, C) or None of the
    recursion ``predict(optimizer=)`` runs for ``kind`` (module docstring; "plain": Θ clamped
    to PSD as ``psd``), one path per batch order of ``batches`` (P, T, B); ``tangents`` (a,
    a_test) or Nones."""
    a, a_test = tangents

    def run(bt):
        if kind == "plain":
            test = None if data.test_mat is None else (data.test_mat, data.f0_test, a_test)
            return _sgd_core(psd, data.f0, y, optimizer, bt, a, test, traced=traced,
                             test_traced=test_traced, loss=loss)
        if kind == "head_aware":
            return _head_sgd_core(data, y, optimizer, bt, a, a_test, loss=loss)
        return _adam_core(data[0], data[1], y, optimizer, bt, a, a_test, loss=loss,
                          table=data[2])

    return jax.vmap(run)(batches)


def summarise_run(kind, data, fs, fts, y, y_test, optimizer, peak, psd, lams, *, loss):
    """``predict(optimizer=)``'s summary (a KernelPrediction) of :func:`run_paths`' logits,
    κ = ``peak``·λ_max/N and the edge of the optimiser's momentum (a subspace / diagonal
    kernel's own divergence below κ = 68 called "catapult", as ``predict``'s)."""
    size = psd.shape[0] if kind == "plain" else fs.shape[2] * fs.shape[3]  # Θ_0: N·C
    return _summarise(fs, fts, y, y_test, size, peak,
                      jnp.asarray(optimizer.momentum, fs.dtype), lams,
                      nesterov=optimizer.nesterov, loss=loss, stochastic=fs.shape[0] > 1,
                      frozen=kind == "plain", kappa_rule=optimizer.rule != "adam",
                      feature_subspace=has_basis(kind, data))


def has_basis(kind, data) -> bool:
    """Whether the head-aware kernel of ``data`` has a feature basis (subspace / diagonal)."""
    return kind != "plain" and (data[0] if kind == "adam" else data).basis is not None


@partial(jax.jit, static_argnames=("kind", "names", "warm", "traced", "test_traced", "loss",
                                   "window"))
def _optimizer_core(data, y, y_test, optimizer, batches, tangents, epsilon, temperature,
                    acc_temperature, *, kind, names, warm, traced, test_traced, loss, window):
    """Values and derivatives (module docstring). ``batches`` (P, T, B); ``tangents`` (a,
    a_test) or Nones; ``warm``: the smoothing for the warmup derivative (None: no warmup).
    Returns (settled quantities, L_T, hyperparameter values (k,), diverged, κ, beyond_edge,
    outcome), the derivatives' columns in the order of ``names``."""
    base = data[0] if kind == "adam" else data  # the Adam kernel's plain head-aware kernel
    psd, lams = _clamped(kind, base)
    dtype = base.f0.dtype if kind == "plain" else base.features.dtype
    steps = batches.shape[1]
    point = _values(optimizer, names, dtype)
    if warm is not None:
        at = names.index("warmup")
        direction = warmup_direction(optimizer.learning_rate, warm, steps).astype(dtype)

    def quantities(p):
        opt = _substitute(optimizer, {n: p[i] for i, n in enumerate(names) if n != "warmup"})
        if warm is not None:  # η_t + (w' − w)·∂η̃_t/∂w: the exact η_t, the relaxed direction
            rates = opt.learning_rates(steps).astype(dtype) + (p[at] - point[at]) * direction
            opt = eqx.tree_at(lambda o: o.learning_rate, opt, replace=_Rates(rates))
        fs, fts = run_paths(kind, data, psd, y, opt, batches, tangents, traced=traced,
                            test_traced=test_traced, loss=loss)
        out = measure(fs, fts, y, y_test, epsilon, temperature, acc_temperature, loss=loss,
                      window=window)
        return out, (out, fs, fts)

    jac, (values, fs, fts) = jax.jacfwd(quantities, has_aux=True)(point)
    if warm is not None:
        jac = jac.at[:, at].set(jnp.where(point[at] > 0, jac[:, at], jnp.nan))
    peak = jnp.max(optimizer.learning_rates(steps)).astype(dtype)
    pred = summarise_run(kind, data, fs, fts, y, y_test, optimizer, peak, psd, lams, loss=loss)
    settled = settle(values, jac, pred, y_test, epsilon, window, is_blind(kind, loss, pred))
    return (settled, pred.loss[-1], point, pred.diverged, pred.kappa, pred.beyond_edge,
            pred.outcome)


def optimizer_sensitivities(prepared, epsilon, temperature, accuracy_temperature, *, loss,
                            window) -> OptimizerSensitivities:
    """Run the core on a problem validated by
    ``ntk_tt.analysis._whatif_checks._prepare_optimizer`` and name its outputs."""
    p = prepared
    (t_soft, t_hard, code, acc, soft, jac), final, point, div, kappa, edge, said = \
        _optimizer_core(
            p.data, p.y, p.y_test, p.optimizer, p.batches, p.tangents,
            *(jnp.asarray(v, p.dtype) for v in (epsilon, temperature, accuracy_temperature)),
            kind=p.kind, names=p.names, warm=p.warm, traced=p.traced,
            test_traced=p.test_traced, loss=loss, window=window)
    values = (t_soft, final, soft)
    quantities = QUANTITIES[:jac.shape[0]]  # no accuracy row without held-out data
    grads = {q: {n: jac[i, j] for j, n in enumerate(p.names)} for i, q in enumerate(quantities)}
    elastic = {q: {n: point[j] * jac[i, j] / values[i] for j, n in enumerate(p.names)}
               for i, q in enumerate(quantities)}
    return OptimizerSensitivities(
        hyperparameters={n: point[j] for j, n in enumerate(p.names)},
        training_time=t_soft, training_time_hard=t_hard, training_time_code=code,
        final_loss=final, test_accuracy=acc, soft_test_accuracy=soft, gradients=grads,
        elasticities=elastic, warmup_smoothing=p.warm, diverged=div, kappa=kappa,
        beyond_edge=edge, outcome=said)
