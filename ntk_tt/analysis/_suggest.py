"""``suggest``: the (η, m, B) that reach a target loss soonest in wall-clock time, without training.

For a target mean training loss L* (an absolute value, or a fraction of the initial loss L_0),
a step budget T_max and candidate batch sizes, the predicted wall-clock time to the target of a
configuration (η, m, B) is

    seconds(η, m, B) = t*(η, m, B) × s(B),    t* = min { t ≤ T_max : L̂_t(η, m, B) ≤ L* },

with L̂ the predicted mean training-loss curve (head-aware predictor with ``head=``, METHOD.md
§10; the frozen-kernel linear predictor without, §2) and s(B) the measured seconds per real
optimiser step at batch size B (:func:`ntk_tt.step_time`, once per B, compile excluded;
METHOD.md §6, paper Sec. 5: wall-clock time = steps × time per step). A configuration is
admissible when its prediction does not diverge
(``ntk_tt.dynamics._divergence``) and κ = η·λ_max/N is
within the linearised model's stability edge (``beyond_edge`` false).

Search: a log grid of κ × a set of momenta for every B, all through ONE kernel, one compiled
``jit(vmap)`` per B; then the best admissible grid point is refined in (log η, m) by a few
projected steps of ``jax.grad`` of a differentiable surrogate of t* (a soft count of the steps
before the hit, built like :func:`ntk_tt.smooth_training_time`), kept only if the hard
predicted time improves and the configuration stays admissible.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# the argument checks need no JAX: ntk-tt suggest runs them before importing it
from ntk_tt._options import (
    _check_batch_sizes,
    _check_momenta,
    _check_scalars,
    _check_target,
    check_suggest_job,
)
from ntk_tt._options import _real_scalar as _real
from ntk_tt.data._inputs import as_array, at_least_float32, check_key
from ntk_tt.dynamics._divergence import divergence, first_nonfinite, hold_from
from ntk_tt.dynamics._losses import check_loss, logit_residual, mean_loss

MOMENTA = (0.0, 0.5, 0.9, 0.95)
KAPPA_RANGE = (0.05, 50.0)
NUM_KAPPAS = 16
LINEAR_KERNELS = ("exact", "traced")
EDGE_MARGIN = 1e-3  # the refinement keeps κ ≤ (1 − EDGE_MARGIN)·edge(m)


def soft_time_to_target(curve, target, *, temperature=0.05):
    """Differentiable count of the steps before a loss curve first reaches ``target``.

    Σ_t Π_{s≤t} σ((L_s − L*) / (τ·(L_0 − L*))) over t = 0..T: each factor is ~1 while the curve
    is above the target and ~0 once it is below, so the sum tends, as τ → 0, to the hard
    t* = min{t : L_t ≤ L*} (T + 1 when the curve never gets there). The construction of
    :func:`ntk_tt.smooth_training_time`, applied to the hit of a fixed target rather than to
    ε·(L_0 − L_T). Jittable; ``jax.grad`` flows to the curve (and through it to η and m).

    Args:
      curve: 1-D mean-loss curve (T + 1,), index = optimiser steps. target: L* < L_0.
      temperature: τ > 0, relative to L_0 − L*.

    Returns:
      A scalar: fractional optimiser steps.
    """
    gap = (curve - target) / (temperature * (curve[0] - target))
    return jnp.sum(jnp.exp(jnp.cumsum(jax.nn.log_sigmoid(gap))))


class _Eval(NamedTuple):
    loss: jax.Array  # (T + 1,) mean over paths of the held curves
    diverged: jax.Array  # bool
    steps: jax.Array  # first t with loss_t ≤ target, NaN if none
    soft: jax.Array  # soft_time_to_target


def _head_losses(hk, y, batches, lr, m, loss):
    """Mean training loss (T + 1,) of the head-aware model along one batch sequence (T, B):
    :func:`ntk_tt.kernels._head_aware.head_aware_trajectory` recording only the loss."""
    from ntk_tt.kernels._head_aware import head_aware_step, initial_state, logits

    def step(state, idx):
        state = head_aware_step(state, idx, hk, y, learning_rate=lr, momentum=m,
                                nesterov=False, loss=loss)
        return state, mean_loss(logits(hk, state), y, loss)

    s0 = initial_state(hk)
    _, ls = jax.lax.scan(step, s0, batches)
    return jnp.concatenate([mean_loss(logits(hk, s0), y, loss)[None], ls])


def _linear_losses(mat, traced, f0, y, batches, lr, m, loss):
    """Mean training loss (T + 1,) of the linearised model along one batch sequence: the
    heavy-ball recursion of :func:`ntk_tt.dynamics._discrete.discrete_trajectory`, loss only."""
    from ntk_tt.dynamics._fspace import theta_cols_dot, theta_dot

    n = f0.shape[0]
    full_batch = batches.shape[1] == n

    def step(carry, idx):
        f, h = carry
        if full_batch:
            d = theta_dot(mat, traced, logit_residual(f, y, loss) / n)
        else:
            g_b = logit_residual(f[idx], y[idx], loss) / idx.shape[0]
            d = theta_cols_dot(mat, traced, idx, g_b)
        h = m * h + d
        f = f - lr * h
        return (f, h), mean_loss(f, y, loss)

    _, ls = jax.lax.scan(step, (f0, jnp.zeros_like(f0)), batches)
    return jnp.concatenate([mean_loss(f0, y, loss)[None], ls])


def _evaluate(data, lr, m, target, temperature, *, kind, traced, loss) -> _Eval:
    """One configuration: losses per path → divergence (on the raw curves), curves held past
    a non-finite loss, their mean, the hard and the soft time to the target."""
    if kind == "head_aware":
        hk, y, batches = data
        paths = jax.vmap(lambda b: _head_losses(hk, y, b, lr, m, loss))(batches)
    else:
        mat, f0, y, batches = data
        paths = jax.vmap(lambda b: _linear_losses(mat, traced, f0, y, b, lr, m, loss))(batches)
    diverged = jnp.any(divergence(paths).diverged)
    held = jax.vmap(hold_from)(paths, first_nonfinite(paths))
    curve = jnp.mean(held, axis=0)
    hit = curve <= target
    steps = jnp.where(jnp.any(hit), jnp.argmax(hit).astype(curve.dtype), jnp.nan)
    return _Eval(curve, diverged, steps, soft_time_to_target(curve, target,
                                                             temperature=temperature))


_STATIC = ("kind", "traced", "loss")


def _grid(data, lrs, ms, target, temperature, *, kind, traced, loss) -> _Eval:
    """:func:`_evaluate` vmapped over the configurations (η, m) (G,), one shared kernel."""

    def one(lr, m):
        return _evaluate(data, lr, m, target, temperature, kind=kind, traced=traced, loss=loss)

    return jax.vmap(one)(lrs, ms)


_grid_jit = jax.jit(_grid, static_argnames=_STATIC)


def _surrogate(u, data, target, temperature, *, kind, traced, loss):
    """Soft time to the target (steps) as a function of u = (log η, m), with the evaluation."""
    ev = _evaluate(data, jnp.exp(u[0]), u[1], target, temperature, kind=kind, traced=traced,
                   loss=loss)
    return ev.soft, ev


_surrogate_grad = jax.jit(jax.value_and_grad(_surrogate, has_aux=True), static_argnames=_STATIC)


def _edge(m: float, loss: str) -> float:
    """Stability edge of κ for heavy ball (``dynamics._predict_kernel._edge``, Nesterov off)."""
    from ntk_tt.dynamics._predict_kernel import _edge as edge

    return float(edge(m, False, loss))


class TargetNotReachedWarning(UserWarning):
    """:func:`suggest` found no admissible configuration reaching the target within the step
    budget: its :class:`Suggestion` has ``found`` False and None choice fields; the message
    (= ``Suggestion.reason``) says what to try. ``ntk-tt suggest`` says it and exits 1."""


@dataclasses.dataclass(frozen=True)
class Suggestion:
    """Result of :func:`suggest`. Time is in optimiser steps and seconds; losses are MEAN
    training losses over the N samples.

    found: an admissible configuration reaches the target within ``steps_max``; when False the
      choice fields (learning_rate, momentum, batch_size, kappa, steps, seconds, loss,
      grid_best) are None, ``reason`` says why and what to try, :func:`suggest` warns
      (:class:`TargetNotReachedWarning`) with the same reason, and the grid is still there.
    learning_rate, momentum, batch_size (None = full-batch GD), kappa (η·λ_max/N): the choice.
    steps: predicted first step with L̂_t ≤ target (int). seconds: steps × seconds_per_step[B].
    loss: the choice's predicted mean loss curve (steps_max + 1,) (mean over SGD paths).
    target: the absolute target loss; initial_loss: L_0; target_kind, target_value: as given.
    refined: the gradient refinement improved on the best grid point (else the choice is it).
    grid_best: the best grid point (dict of the ``grid`` row).
    runners_up: pandas DataFrame of the best admissible grid configuration of every other
      (B, m) pair (and the next best of the choice's own), ≤ ``top`` rows, best first, columns
      as ``grid``.
    grid: pandas DataFrame, one row per grid configuration and per refinement candidate
      (``source`` "grid" or "refine"): batch_size (N for GD), gd, momentum,
      learning_rate, kappa, kappa_eff = κ/(1 − m), steps (NaN: target not reached), seconds,
      soft_steps, final_loss, diverged, beyond_edge, admissible, source, evaluated (False: a
      grid point beyond the stability edge, not predicted; its steps etc. are NaN).
    seconds_per_step: {B (None = GD): seconds per real step}, measured or as given.
    refinement: one dict per refinement evaluation (log η, m, soft steps, steps, accepted).
    predictor: "head_aware:<backbone>" ("head_aware:given" with ``head_kernel``) or
    "linear:<kernel>"; lambda_max: λ_max of Θ_0.
    num_train: N. steps_max: T_max. reason: why nothing was found (None when found).
    timings: wall seconds per stage ("kernel", "step_time", "grid", "refine", "total") without
      JAX compilation, which is summed apart in "compile".
    """

    found: bool
    learning_rate: float | None
    momentum: float | None
    batch_size: int | None
    kappa: float | None
    steps: int | None
    seconds: float | None
    loss: np.ndarray | None
    target: float
    initial_loss: float
    target_kind: str
    target_value: float
    refined: bool
    grid_best: dict | None
    runners_up: Any
    grid: Any
    seconds_per_step: dict
    refinement: list
    predictor: str
    lambda_max: float
    num_train: int
    steps_max: int
    reason: str | None
    timings: dict


def _check_seconds(seconds_per_step, batches, n) -> dict | None:
    if seconds_per_step is None:
        return None
    if not isinstance(seconds_per_step, Mapping):
        raise ValueError(f"seconds_per_step must be None (measure) or a dict {{batch size: "
                         f"seconds}}, got {type(seconds_per_step).__name__}.")
    out = {}
    for b, s in seconds_per_step.items():
        key = None if b is None or b == n else b
        s = _real(s, f"seconds_per_step[{b!r}]")
        if not (math.isfinite(s) and s > 0):
            raise ValueError(f"seconds_per_step[{b!r}] must be finite and > 0, got {s!r}.")
        out[key] = s
    missing = [b for b in batches if b not in out]
    if missing:
        raise ValueError(f"seconds_per_step has no entry for batch sizes {missing} (None = GD); "
                         "give one per batch size, or pass None to measure them.")
    return {b: out[b] for b in batches}


def _order(rows):
    """Admissible rows by (seconds, soft seconds), best first."""
    ok = [r for r in rows if r["admissible"]]
    return sorted(ok, key=lambda r: (r["seconds"], r["soft_steps"] * r["sps"]))


def suggest(apply_fn, params, x, y, *, target, steps, target_kind: str = "absolute",
            batch_sizes: Sequence = (None,), head=None, predictor: str = "auto",
            momenta: Sequence = MOMENTA, kappa_range: Sequence = KAPPA_RANGE,
            num_kappas: int = NUM_KAPPAS, refine_steps: int = 8, temperature: float = 0.05,
            loss: str = "cross_entropy", key=None, num_paths: int = 8,
            seconds_per_step: Mapping | None = None, kernel: str = "exact",
            backbone: str = "isotropic", top: int = 5, evaluate_beyond_edge: bool = False,
            head_kernel=None, progress: bool = False) -> Suggestion:
    """The (η, m, B) that minimise the predicted wall-clock time to a target training loss.

    seconds(η, m, B) = (first step t ≤ ``steps`` with predicted mean loss L̂_t ≤ target) ×
    (measured seconds per real step at B), over configurations whose prediction does not
    diverge and whose κ = η·λ_max/N is within the stability edge (METHOD.md §6 wall-clock,
    §10 head-aware; paper Sec. 5). Grid: ``num_kappas`` κ log-spaced over ``kappa_range`` ×
    ``momenta`` × ``batch_sizes``, one kernel, one compiled ``jit(vmap)`` per B; then
    ``refine_steps`` projected gradient steps of :func:`soft_time_to_target` in (log η, m) from
    the best grid point (B fixed), kept only if the hard predicted time improves.

    Example:
      >>> s = ntk_tt.suggest(apply_fn, params, x, y, head=ntk_tt.split_head(model),
      ...                    target=0.5, target_kind="fraction", steps=150,
      ...                    batch_sizes=(None, 50), key=jax.random.key(0))
      >>> s.learning_rate, s.momentum, s.batch_size, s.steps, s.seconds

    Args:
      apply_fn, params: the model with its new head, ``apply_fn(params, x)`` → logits (N, C);
        its real training step is timed per batch size.
      x: training inputs (N, ...). y: integer labels (N,).
      target: the target mean training loss (``target_kind="absolute"``, 0 < target < L_0) or
        a fraction of L_0 in (0, 1) (``"fraction"``).
      steps: the step budget T_max (optimiser updates).
      batch_sizes: candidate B: None (or N) = full-batch GD, integers in [1, N) = SGD with the
        batch order of ``ntk_tt.batch_indices`` (the predicted curve is the mean over
        ``num_paths`` orders, path 0 = the order a real run with ``key`` uses).
      head: ``ntk_tt.split_head(model)`` for the head-aware predictor (the default when given);
        None = the frozen-kernel linear predictor (``kernel`` "exact" N·C×N·C or "traced").
      predictor: "auto", "head_aware" or "linear". backbone: head-aware feature kernel.
      momenta: heavy-ball m of the grid, each in [0, 1). kappa_range, num_kappas: the κ grid.
      refine_steps: gradient evaluations of the refinement (0: none). temperature: τ of the
        surrogate. loss: "cross_entropy" or "mse" (mean over samples). key: jax.random key
        (needed when some B < N). num_paths: SGD batch orders averaged.
      seconds_per_step: {B: seconds} to use instead of measuring (e.g. from an earlier run).
      top: runner-up rows. evaluate_beyond_edge: also predict the grid points beyond the
        stability edge (never suggested; by default listed in ``grid`` unpredicted, which saves
        a third of the default grid's work). head_kernel: a :class:`ntk_tt.HeadAwareKernel`
        of ``head`` on ``x`` already built (``ntk_tt.head_aware_kernel``) to reuse instead of
        building one (its backbone kernel replaces ``backbone``). progress: a tqdm bar over
        the stages.

    Returns:
      :class:`Suggestion`.

    Warns:
      TargetNotReachedWarning: (a ``UserWarning``) when no admissible configuration reaches
        the target within ``steps``: the Suggestion then has ``found`` False and None choice
        fields; the message (= ``reason``) says what to try (a larger ``steps``, a looser
        target, a wider ``kappa_range``).

    Raises:
      ValueError: before any work, for every bad argument (the message says how to fix it):
        x, y, model or head as in :func:`ntk_tt.predict`; target or target_kind; steps < 1;
        batch sizes not None / int in [1, N] or repeated; momenta outside [0, 1);
        kappa_range not 0 < min <= max; num_kappas, refine_steps, num_paths, top; a
        temperature <= 0; seconds_per_step missing a B or not > 0; a missing key for SGD;
        unknown loss, predictor, kernel or backbone; a head_kernel that is not a
        HeadAwareKernel, given without head, or built on another N than x (both N named).
        After one forward pass (before the kernel): an absolute target not below L_0. After
        the kernel: λ_max ≤ 0 (outputs that do not depend on the parameters).
    """
    from tqdm import tqdm

    from ntk_tt.data._model import check_model
    from ntk_tt.dynamics._checks import check_labels
    from ntk_tt.prediction._predict import _check_predictor
    from ntk_tt.training._timing import Stopwatch

    check_loss(loss)
    check_key(key)
    target_value = _check_target(target, target_kind)
    lo, hi, tau = _check_scalars(steps, kappa_range, num_kappas, refine_steps, temperature,
                                 num_paths, top)
    if kernel not in LINEAR_KERNELS:
        raise ValueError(f"kernel must be one of {LINEAR_KERNELS}, got {kernel!r}.")
    x = as_array(x, "x")
    params, x, head = at_least_float32((params, x, head))  # as predict (README, "Dtypes")
    n, c = check_model(apply_fn, params, x)
    check_loss(loss, c)
    y = check_labels(y, n, c)
    bsizes = _check_batch_sizes(batch_sizes, n)
    moms = _check_momenta(momenta)
    if key is None and any(b is not None for b in bsizes):
        raise ValueError("SGD batch sizes (B < N) are random: pass key=jax.random.key(seed).")
    sps_given = _check_seconds(seconds_per_step, bsizes, n)
    head_aware = _check_predictor(predictor, head, backbone, "discrete", "exact", apply_fn,
                                  params, x)
    if head_kernel is not None:
        from ntk_tt.kernels._head_aware import HeadAwareKernel

        if not head_aware:
            raise ValueError("head_kernel is for the head-aware predictor: pass head="
                             "ntk_tt.split_head(model) too (or drop head_kernel).")
        if not isinstance(head_kernel, HeadAwareKernel):
            raise ValueError("head_kernel must be the HeadAwareKernel of head on these N = "
                             f"{n} inputs (ntk_tt.head_aware_kernel(head, x)), got "
                             f"{type(head_kernel).__name__}.")
        n_hk = np.shape(head_kernel.features)[0] if np.ndim(head_kernel.features) else None
        if n_hk != n:
            raise ValueError("head_kernel must be the HeadAwareKernel of head on these N = "
                             f"{n} inputs of x, but it was built on N = {n_hk} inputs "
                             f"(features of shape {np.shape(head_kernel.features)}): build it "
                             "with ntk_tt.head_aware_kernel(head, x) on the same x, or drop "
                             "head_kernel.")

    f0 = apply_fn(params, jnp.asarray(x))
    l0 = float(mean_loss(f0, y, loss))
    target_abs = target_value * l0 if target_kind == "fraction" else target_value
    if not target_abs < l0:
        raise ValueError(f"target {target_value:g} is not below the initial mean training loss "
                         f"L_0 = {l0:.6g}: it is reached at step 0; choose a lower target (or "
                         "target_kind='fraction' with a value in (0, 1)).")

    stages = 2 + len(bsizes) + (refine_steps > 0)
    bar = tqdm(total=stages, disable=not progress, unit="stage",
               bar_format="{desc}: {n}/{total} stages [{elapsed}]")
    timings: dict = {}
    try:
        with Stopwatch() as total:
            found = _search(apply_fn, params, x, y, f0, head if head_aware else None, n, c,
                            bsizes, moms, sps_given, target_abs, steps, lo, hi, num_kappas,
                            tau, refine_steps, loss, key, num_paths, kernel, backbone, timings,
                            bar, bool(evaluate_beyond_edge), head_kernel)
    except BaseException:
        bar.leave = False  # clear the bar: the caller's message starts a clean line
        raise
    finally:
        bar.close()
    timings["total"], timings["compile"] = total.seconds, total.compile_seconds
    rows, ranked, best, choice, curves, refinement, sps, name, lam = found
    s = _result(rows, ranked, best, choice, curves, refinement, sps, target_abs, l0,
                target_kind, target_value, name, lam, n, steps, top, timings, kappa_range)
    if not s.found:
        warnings.warn(f"suggest: target not reached: {s.reason} (Suggestion.found is False and "
                      "its choice fields are None; Suggestion.grid lists every configuration "
                      "tried).", TargetNotReachedWarning, stacklevel=2)
    return s


def _search(apply_fn, params, x, y, f0, head, n, c, bsizes, moms, sps_given, target_abs, steps,
            lo, hi, num_kappas, tau, refine_steps, loss, key, num_paths, kernel, backbone,
            timings, bar, evaluate_beyond_edge, head_kernel=None):
    """The work of :func:`suggest` (arguments validated): kernel, step times, grid, refinement.
    Fills ``timings`` (seconds without compilation) and advances ``bar`` per stage."""
    from ntk_tt.dynamics._fspace import clamp_psd
    from ntk_tt.training._aot import compiled
    from ntk_tt.training._finetune import step_time
    from ntk_tt.training._timing import Stopwatch

    # 1. the kernel, shared by every configuration
    bar.set_description("suggest: kernel")
    with Stopwatch() as sw:
        if head is not None:
            from ntk_tt.kernels._head_aware import head_aware_kernel, initial_eigenvalues

            hk = head_kernel if head_kernel is not None else head_aware_kernel(
                head, x, backbone=backbone,
                key=None if key is None else jax.random.fold_in(key, 1))
            lam = float(initial_eigenvalues(hk)[1])  # λ_max of Θ_0
            dtype = hk.features.dtype
            static = dict(kind="head_aware", traced=False, loss=loss)
            name = "head_aware:given" if head_kernel is not None else f"head_aware:{backbone}"
        else:
            from ntk_tt.dynamics._fspace import as_operator
            from ntk_tt.kernels._ntk import empirical_ntk

            theta = empirical_ntk(apply_fn, params, x, trace_logits=kernel == "traced")
            mat, traced = as_operator(theta, n, c, name="kernel")
            mat, (_, lam_arr) = jax.jit(clamp_psd)(mat)
            lam = float(lam_arr)
            dtype = f0.dtype
            static = dict(kind="linear", traced=traced, loss=loss)
            name = f"linear:{kernel}"
    timings["kernel"] = sw.seconds
    bar.update()
    if not (math.isfinite(lam) and lam > 0):
        raise ValueError(f"the kernel's largest eigenvalue is {lam:g}: the model's outputs do "
                         "not depend on its parameters here; nothing can be predicted.")

    # 2. seconds per real step, once per B
    bar.set_description("suggest: timing real steps")
    with Stopwatch() as sw:
        sps = sps_given if sps_given is not None else {
            b: float(step_time(apply_fn, params, x, y, learning_rate=1e-3, batch_size=b,
                               loss=loss, key=key)) for b in bsizes}
    timings["step_time"] = sw.seconds
    bar.update()

    # 3. the grid: one compiled jit(vmap) over (η, m) per B; configurations beyond the
    # stability edge can never be chosen, so they are listed without being predicted
    # unless asked for
    kappas = np.geomspace(lo, hi, num_kappas)
    kk, mm = (a.ravel() for a in np.meshgrid(kappas, np.asarray(moms), indexing="ij"))
    lrs = kk * n / lam
    run = np.array([evaluate_beyond_edge or not lr * lam / n > _edge(m, loss)
                    for lr, m in zip(lrs, mm, strict=True)])
    target_j, tau_j = jnp.asarray(target_abs, dtype), jnp.asarray(tau, dtype)
    rows, datas, curves = [], {}, {}
    timings["grid"] = 0.0
    for b in bsizes:
        bar.set_description(f"suggest: grid B={'N' if b is None else b}")
        batches = _batches(key, n, b, steps, num_paths)
        datas[b] = ((hk._replace(features_test=None, backbone_test=None), y, batches)
                    if head is not None else (mat, f0, y, batches))
        out = None
        if run.any():
            args = (datas[b], jnp.asarray(lrs[run], dtype), jnp.asarray(mm[run], dtype),
                    target_j, tau_j)
            exe, _ = compiled(_grid_jit, *args, **static)
            t0 = time.perf_counter()
            out = jax.device_get(jax.block_until_ready(exe(*args)))
            timings["grid"] += time.perf_counter() - t0
        j = 0
        for i in range(len(lrs)):
            if run[i]:
                row = _row(b, n, float(lrs[i]), float(mm[i]), lam, out, j, sps[b], loss,
                           "grid")
                curves[id(row)] = np.asarray(out.loss[j])
                j += 1
            else:
                row = _skipped(b, n, float(lrs[i]), float(mm[i]), lam, sps[b])
            rows.append(row)
        bar.update()
    ranked = _order(rows)
    best = ranked[0] if ranked else None

    # 4. refine the best grid point in (log η, m), B fixed
    refinement, choice = [], best
    timings["refine"] = 0.0
    if best is not None and refine_steps > 0:
        bar.set_description("suggest: refining (jax.grad)")
        step_log = (math.log(hi / lo) / (num_kappas - 1)) if num_kappas > 1 else 0.5
        choice, refinement, timings["refine"] = _refine(
            best, datas[best["b"]], static, lam, n, target_j, tau_j, dtype, refine_steps,
            step_log, (min(moms), max(moms)), sps[best["b"]], loss, rows, curves, compiled)
        bar.update()
    return rows, ranked, best, choice, curves, refinement, sps, name, lam


def _batches(key, n, b, steps, num_paths):
    """Batch sequences (P, T, B): GD one path of arange(N); SGD ``num_paths`` orders, path 0 =
    ``batch_indices(key, N, B, T)`` (the keys of ``head_aware_paths`` / ``discrete_paths``)."""
    from ntk_tt.data._batches import path_batch_indices

    if b is None:
        return jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (1, steps, n))
    return path_batch_indices(key, n, b, steps, num_paths)


def _skipped(b, n, lr, m, lam, sps) -> dict:
    """A grid row beyond the stability edge that was not predicted."""
    kappa = lr * lam / n
    return {"batch_size": n if b is None else b, "gd": b is None, "b": b, "momentum": m,
            "learning_rate": lr, "kappa": kappa, "kappa_eff": kappa / (1 - m),
            "steps": math.nan, "seconds": math.nan, "sps": sps, "soft_steps": math.nan,
            "final_loss": math.nan, "diverged": False, "beyond_edge": True,
            "admissible": False, "source": "grid", "evaluated": False}


def _row(b, n, lr, m, lam, out, i, sps, loss, source) -> dict:
    kappa = lr * lam / n
    steps = float(out.steps[i])
    beyond = kappa > _edge(m, loss)
    diverged = bool(out.diverged[i])
    reached = math.isfinite(steps)
    return {"batch_size": n if b is None else b, "gd": b is None, "b": b, "momentum": m,
            "learning_rate": lr, "kappa": kappa, "kappa_eff": kappa / (1 - m),
            "steps": steps if reached else math.nan,
            "seconds": steps * sps if reached else math.nan, "sps": sps,
            "soft_steps": float(out.soft[i]), "final_loss": float(out.loss[i][-1]),
            "diverged": diverged, "beyond_edge": bool(beyond),
            "admissible": reached and not diverged and not beyond, "source": source,
            "evaluated": True}


def _refine(best, data, static, lam, n, target, tau, dtype, budget, step_log, m_range, sps,
            loss, rows, curves, compiled):
    """Projected normalised gradient descent on the soft time in (log η, m) from ``best``.

    Coordinates are scaled by (grid spacing of log κ, 0.1) and each step moves δ of them along
    the steepest descent direction (∞-norm; a component pushing out of an active bound is
    dropped), δ starting at ½ grid cell, ×1.5 after a step that lowers the surrogate, ×½ after
    one that does not. Every point is projected onto m ∈ ``m_range`` (the span of the grid's
    momenta: m stays fixed when the grid has one) and κ ∈ [κ_best·e^(−10 cells),
    (1 − EDGE_MARGIN)·edge(m)]. Returns (the best admissible point by hard time if it beats
    ``best`` strictly, else ``best``; the trace; run seconds without compilation).
    """
    scale = np.array([step_log, 0.1])
    log_k_min = math.log(best["kappa"]) - 10 * step_log

    def bounds(m):
        """(lowest, highest) log η at momentum m."""
        return (math.log(math.exp(log_k_min) * n / lam),
                math.log((1 - EDGE_MARGIN) * _edge(m, loss) * n / lam))

    def project(u):
        m = float(np.clip(u[1], *m_range))
        return np.array([float(np.clip(u[0], *bounds(m))), m])

    def direction(u, g):
        """Descent direction −g·scale without components leaving an active bound."""
        d = -g * scale
        lo, hi = bounds(u[1])
        for i, (low, high) in enumerate(((lo, hi), m_range)):
            if (u[i] <= low + 1e-12 and d[i] < 0) or (u[i] >= high - 1e-12 and d[i] > 0):
                d[i] = 0.0
        return d

    def evaluate(u):
        args = (jnp.asarray(u, dtype), data, target, tau)
        exe, _ = compiled(_surrogate_grad, *args, **static)
        t0 = time.perf_counter()
        (val, ev), g = jax.device_get(jax.block_until_ready(exe(*args)))
        return float(val), np.asarray(g, float), ev, time.perf_counter() - t0

    u = np.array([math.log(best["learning_rate"]), best["momentum"]])
    val, g, _, sec = evaluate(u)
    trace = [{"log_learning_rate": u[0], "momentum": u[1], "soft_steps": val,
              "steps": best["steps"], "accepted": True}]
    chosen, delta = best, 0.5
    for _ in range(budget - 1):
        d = direction(u, g)
        if not np.all(np.isfinite(d)) or not np.any(d):
            break
        cand = project(u + delta * scale * d / np.max(np.abs(d)))
        if np.allclose(cand, u, rtol=0, atol=1e-9):
            delta *= 0.5
            continue
        val_c, g_c, ev, s = evaluate(cand)
        sec += s
        row = _row(best["b"], n, math.exp(cand[0]), float(cand[1]), lam,
                   jax.tree.map(lambda a: np.asarray(a)[None], ev), 0, sps, loss, "refine")
        rows.append(row)
        curves[id(row)] = np.asarray(ev.loss)
        accepted = math.isfinite(val_c) and val_c < val
        trace.append({"log_learning_rate": cand[0], "momentum": cand[1], "soft_steps": val_c,
                      "steps": row["steps"], "accepted": accepted})
        if row["admissible"] and (row["seconds"], row["soft_steps"]) < (
                chosen["seconds"], chosen["soft_steps"]):
            chosen = row
        if accepted:
            u, val, g, delta = cand, val_c, g_c, min(1.5 * delta, 2.0)
        else:
            delta *= 0.5
    if chosen is not best and not chosen["seconds"] < best["seconds"]:
        chosen = best  # the hard time did not improve: keep the grid point
    return chosen, trace, sec


_COLUMNS = ("batch_size", "gd", "momentum", "learning_rate", "kappa", "kappa_eff", "steps",
            "seconds", "soft_steps", "final_loss", "diverged", "beyond_edge", "admissible",
            "source", "evaluated")


def _frame(rows):
    import pandas as pd

    return pd.DataFrame([{k: r[k] for k in _COLUMNS} for r in rows], columns=list(_COLUMNS))


def _result(rows, ranked, best, choice, curves, refinement, sps, target_abs, l0, target_kind,
            target_value, name, lam, n, steps_max, top, timings, kappa_range) -> Suggestion:
    common = dict(target=target_abs, initial_loss=l0, target_kind=target_kind,
                  target_value=target_value, grid=_frame(rows), seconds_per_step=sps,
                  refinement=refinement, predictor=name, lambda_max=lam, num_train=n,
                  steps_max=steps_max, timings=timings)
    if choice is None:
        grid = [r for r in rows if not r["diverged"] and not r["beyond_edge"]]
        closest = min(grid, key=lambda r: r["final_loss"]) if grid else None
        why = (f"no configuration of the grid reaches the target loss {target_abs:.4g} within "
               f"T_max = {steps_max} steps without predicted divergence or κ beyond the "
               f"stability edge")
        if closest is not None:
            why += (f" (lowest final loss within the edge {closest['final_loss']:.4g} at "
                    f"κ = {closest['kappa']:.3g}, m = {closest['momentum']:g})")
        why += (f"; raise the step budget (steps, -T), raise the target, or widen "
                f"kappa_range {tuple(kappa_range)}")
        return Suggestion(found=False, learning_rate=None, momentum=None, batch_size=None,
                          kappa=None, steps=None, seconds=None, loss=None, refined=False,
                          grid_best=None, runners_up=_frame([]), reason=why, **common)
    others, seen = [], set()
    for r in _order([r for r in rows if r["source"] == "grid"]):
        if r is not choice and (r["b"], r["momentum"]) not in seen:
            seen.add((r["b"], r["momentum"]))
            others.append(r)
    return Suggestion(
        found=True, learning_rate=choice["learning_rate"], momentum=choice["momentum"],
        batch_size=choice["b"], kappa=choice["kappa"], steps=int(choice["steps"]),
        seconds=choice["seconds"], loss=curves[id(choice)], refined=choice is not best,
        grid_best={k: best[k] for k in _COLUMNS}, runners_up=_frame(others[:top]), reason=None,
        **common)


# --- the task job behind ``ntk-tt suggest`` ------------------------------------------------


def suggest_task(*, json_path=None, progress: bool = True, overwrite: bool = False,
                 **options) -> dict:
    """``ntk-tt suggest`` as a call: load the task like ``ntk-tt predict`` (shipped checkpoint
    and vendored flowers5 by default, fresh seeded head), run :func:`suggest`, return a
    JSON-ready report (and write it to ``json_path``).

    Options (defaults in ``ntk_tt._defaults.SUGGEST_DEFAULTS``): checkpoint, dataset,
    data_dir, split, num_classes (K), per_class (n), seed, resize, head_scale, target,
    target_kind, steps (T_max), batch_sizes (candidate B, None entries = GD; omitted or None:
    ``ntk_tt._options.default_batch_sizes(K·n)``, i.e. (None, 50) without 50 when N = K·n
    <= 50, as ``ntk-tt suggest`` without -B), momenta, kappa_min, kappa_max, num_kappas,
    refine_steps, num_paths, loss, predictor, top.

    Warns:
      TargetNotReachedWarning: as :func:`suggest`, when nothing reaches the target (the report
        has ``found`` False and its ``reason``).

    Raises:
      ValueError: one line for any bad option (values, the dataset path, data_dir and
        checkpoint that must exist, a split other than "train" for a short name or .npz file)
        or output path, before JAX work and before the
        checkpoint's weights are read (:func:`ntk_tt._options.check_suggest_job`).
    """
    from ntk_tt.prediction._job import _output, _plain, _write_json, load_task

    o = check_suggest_job(options, json_path, overwrite)
    apply_fn, params, x, y, _, _, info, head = load_task(
        **{k: o[k] for k in ("checkpoint", "dataset", "data_dir", "split", "num_classes",
                             "per_class", "seed", "resize", "head_scale")}, test_per_class=0)
    key = jax.random.fold_in(jax.random.key(o["seed"]), 2)
    s = suggest(apply_fn, params, x, y, target=o["target"], target_kind=o["target_kind"],
                steps=o["steps"], batch_sizes=tuple(o["batch_sizes"]),
                head=head if o["predictor"] != "linear" else None,
                predictor=o["predictor"], momenta=tuple(o["momenta"]),
                kappa_range=(o["kappa_min"], o["kappa_max"]), num_kappas=o["num_kappas"],
                refine_steps=o["refine_steps"], loss=o["loss"], key=key,
                num_paths=o["num_paths"], top=o["top"], progress=progress)
    report = _plain({
        "config": o, "task": info,
        "target": {"loss": s.target, "initial_loss": s.initial_loss, "kind": s.target_kind,
                   "value": s.target_value, "steps_max": s.steps_max},
        "found": s.found, "reason": s.reason,
        "suggestion": None if not s.found else {
            "learning_rate": s.learning_rate, "momentum": s.momentum,
            "batch_size": s.batch_size, "kappa": s.kappa, "steps": s.steps,
            "seconds": s.seconds, "refined": s.refined},
        "grid_best": s.grid_best, "predictor": s.predictor, "lambda_max": s.lambda_max,
        "seconds_per_step": {("N" if b is None else str(b)): v
                             for b, v in s.seconds_per_step.items()},
        "runners_up": s.runners_up.to_dict("records"), "grid": s.grid.to_dict("records"),
        "refinement": s.refinement, "seconds": s.timings,
        "curve": None if s.loss is None else {"loss": s.loss},
        "grid_size": {"kappas": o["num_kappas"], "momenta": len(o["momenta"]),
                      "batch_sizes": len(o["batch_sizes"])},
    })
    if json_path:
        from pathlib import Path

        _output(_write_json, Path(json_path).expanduser(), report, create=not overwrite)
    return report


def _b(b, n=None) -> str:
    return "N (GD)" if b is None or b == n else str(b)


def format_suggestion(r: dict) -> str:
    """Human-readable text of a :func:`suggest_task` report."""
    t, tg, sec = r["task"], r["target"], r["seconds"]
    n = t["n_train"]
    size = r["grid_size"]
    total = size["kappas"] * size["momenta"] * size["batch_sizes"]
    cfg = r["config"]
    lines = [
        f"task: {t['dataset']}, classes {', '.join(t['classes'])}; N = {n} train; model "
        f"{t['architecture']} (D = {t['num_params']})",
        f"target: mean training loss <= {tg['loss']:.4g} ("
        + (f"{tg['value']:g} × L_0 = {tg['initial_loss']:.4g}" if tg["kind"] == "fraction"
           else f"L_0 = {tg['initial_loss']:.4g}")
        + f") within T_max = {tg['steps_max']} steps",
        f"predictor: {r['predictor']}, λ_max = {r['lambda_max']:.4g}; grid {size['kappas']} κ "
        f"in [{cfg['kappa_min']:g}, {cfg['kappa_max']:g}] × {size['momenta']} m × "
        f"{size['batch_sizes']} B = {total} configurations; kernel {sec['kernel']:.1f} s, "
        f"grid {sec['grid']:.1f} s, refinement {sec['refine']:.1f} s, total {sec['total']:.1f} s "
        f"(compile {sec['compile']:.1f} s apart)",
        "seconds per real step (measured, 5 warm steps, compile excluded): "
        + ", ".join(f"B = {'N (GD)' if b == 'N' else b} {v * 1e3:.1f} ms"
                    for b, v in r["seconds_per_step"].items()),
    ]
    if not r["found"]:
        lines.append(f"no suggestion: {r['reason']}")
        return "\n".join(lines)
    s, g = r["suggestion"], r["grid_best"]
    lines.append(
        f"suggestion: B = {_b(s['batch_size'])}, m = {s['momentum']:.3g}, "
        f"η = {s['learning_rate']:.4g} (κ = {s['kappa']:.3g}): predicted to reach the target at "
        f"step {s['steps']}, {s['seconds']:.3g} s of training")
    if s["refined"]:
        lines.append(f"  (refined by jax.grad from the grid's best: m = {g['momentum']:g}, "
                     f"η = {g['learning_rate']:.4g}, {g['steps']:.0f} steps, "
                     f"{g['seconds']:.3g} s)")
    else:
        lines.append("  (the grid's best; the gradient refinement did not improve the hard "
                     "predicted time)")
    if r["runners_up"]:
        lines.append(f"runners-up: {'B':>7} {'m':>5} {'η':>10} {'κ':>7} {'steps':>6} "
                     f"{'seconds':>8}")
        for row in r["runners_up"]:
            lines.append(f"            {_b(row['batch_size'], n):>7} {row['momentum']:>5g} "
                         f"{row['learning_rate']:>10.4g} {row['kappa']:>7.3g} "
                         f"{row['steps']:>6.0f} {row['seconds']:>8.3g}")
    grid = [row for row in r["grid"] if row["source"] == "grid"]
    ok = sum(row["admissible"] for row in grid)
    edge = sum(row["beyond_edge"] for row in grid)
    div = sum(row["diverged"] and not row["beyond_edge"] for row in grid)
    skipped = sum(not row.get("evaluated", True) for row in grid)
    lines.append(f"admissible: {ok} of {len(grid)} grid configurations reach the target "
                 f"({edge} beyond the stability edge"
                 + (f", {skipped} of them not predicted" if skipped else "")
                 + f", {div} more diverged, "
                 f"{len(grid) - ok - edge - div} too slow)")
    return "\n".join(lines)
