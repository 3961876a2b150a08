"""``suggest(optimizer=...)``: the peak learning rate and warmup of a warmup-cosine schedule
that reach a target loss soonest, for an SGD-momentum or an Adam/AdamW template (issue 27).

The template :class:`ntk_tt.Optimizer` fixes the rule, momentum (β₁, β₂, ε), weight decay,
Nesterov, batch size and the schedule's shape: η_t = warmup_cosine(η_peak, w, T_max,
init = r_i·η_peak, end = r_e·η_peak) with r_i, r_e the template's init/peak and end/peak
(0 for a constant template) and the cosine ending at the step budget T_max. The search is
over η_peak (a log grid: κ_peak = η_peak·λ_max/N over ``kappa_range`` for SGD, as constant
SGD; η_peak over ``learning_rate_range`` for Adam, whose step η/√v̂ is not sized by κ) × the
warmup w (fractions of T_max, rounded to whole steps), through one kernel and one compiled
``jit(vmap)`` of the predictor :func:`ntk_tt.predict` uses for that optimiser (METHOD.md
§11: the frozen-kernel or head-aware SGD recursion, the fast head-aware Adam predictor),
then a refinement in (log η_peak, w) by :func:`ntk_tt.analysis._suggest_refine._descend`
on the soft time to the target, differentiating the exact schedule (η_t is differentiable in
w except at t = w). The schedule's softplus relaxation (``smoothing`` > 0) is not used: it
gives η_t < 0 for warmups shorter than ``smoothing``, and templates with it are refused.
Admissible: the prediction does not diverge and, for SGD, κ_peak is within the heavy-ball
(Nesterov) edge; for Adam, which has no κ edge, the weight travel ρ = Σ η_t / rms(θ_0) is at
most ``_regime.UNKNOWN_TRAVEL`` = 1, beyond which ``predict`` abstains (the row's
``weight_travel``; beyond it the row is ``beyond_edge``). Memory: the grid holds
every configuration's logits at once, (peaks × warmups × paths × (T_max + 1) × N × C) numbers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._optimizer import Optimizer
from ntk_tt._options import FLOAT32_MAX, _real_scalar
from ntk_tt._options_suggest import ADAM_LEARNING_RATE_RANGE, add_warmup
from ntk_tt._schedules import Constant, WarmupCosine, warmup_cosine
from ntk_tt.analysis._suggest_curves import _edge, _summary
from ntk_tt.analysis._suggest_refine import EDGE_MARGIN, _descend, _one, _timed
from ntk_tt.analysis._suggest_report import _order, _row, _skipped
from ntk_tt.dynamics._losses import mean_loss


def check_search(optimizer: Optimizer, *, n, steps, key, head_aware, warmups, kappa_range,
                 learning_rate_range, num_kappas) -> dict:
    """The checks of ``suggest(optimizer=...)`` beyond :func:`ntk_tt.suggest`'s own (one-line
    ValueErrors, before any work). Returns {"unit": the template with the unit schedule
    (η_peak = 1, w = 0, T_max), "b": its batch size (None = GD), "warmups": the warmup grid in
    steps (each below ``steps``), "lr_range": the η_peak range or None (κ grid)}."""
    from ntk_tt.dynamics._adam_head_aware import _maybe_nonzero

    sched, adam = optimizer.learning_rate, optimizer.rule == "adam"
    if not isinstance(sched, (Constant, WarmupCosine)):
        raise ValueError(f"suggest(optimizer=...) searches warmup-cosine schedules: give the "
                         f"template ntk_tt.warmup_cosine(...) or a constant learning rate (its "
                         f"peak and warmup are searched), got {type(sched).__name__}.")
    if isinstance(sched, WarmupCosine) and sched.smoothing != 0:
        raise ValueError("suggest(optimizer=...) searches the exact warmup (smoothing=0): the "
                         "softplus relaxation gives η_t < 0 for warmups shorter than "
                         "smoothing; build the template's warmup_cosine without smoothing.")
    if adam and not head_aware:
        raise ValueError("Adam has no frozen-kernel predictor, which suggest uses without "
                         "head=: pass head=ntk_tt.split_head(model) (the fast head-aware Adam "
                         "predictor).")
    if adam and not optimizer.decoupled and _maybe_nonzero(optimizer.weight_decay):
        raise ValueError("the fast Adam predictor needs decoupled weight decay: use "
                         "ntk_tt.adamw(...) as the template.")
    b = optimizer.batch_size
    if b is not None and b > n:
        raise ValueError(f"the optimizer's batch_size {b} exceeds N = {n} training samples.")
    b = None if b is None or b == n else int(b)
    if b is not None and key is None:
        raise ValueError("SGD batch sizes (B < N) are random: pass key=jax.random.key(seed).")
    if adam and kappa_range is not None:
        raise ValueError("kappa_range sizes SGD's grid (κ = η·λ_max/N); Adam's step η/√v̂ is "
                         "not sized by κ: give learning_rate_range=(min, max) of η_peak.")
    if kappa_range is not None and learning_rate_range is not None:
        raise ValueError("give kappa_range (κ grid) or learning_rate_range (η_peak grid), not "
                         "both.")
    if learning_rate_range is None and adam:
        learning_rate_range = ADAM_LEARNING_RATE_RANGE
    if learning_rate_range is not None:
        _check_range(learning_rate_range, num_kappas)
    if isinstance(warmups, (str, bytes)) or not isinstance(warmups, Sequence) or not warmups:
        raise ValueError(f"warmups must be a non-empty list of fractions of steps in [0, 1), "
                         f"got {warmups!r}; e.g. warmups=(0, 0.05, 0.1, 0.2).")
    rounded, given = {}, []
    for f in warmups:
        f = _real_scalar(f, "warmups entry")
        if not 0.0 <= f < 1.0:
            raise ValueError(f"warmups entries must be fractions of steps in [0, 1), got {f!r}.")
        if f in given:  # as momenta
            raise ValueError(f"warmups {list(warmups)!r} names {f} twice; give each once.")
        given.append(f)
        add_warmup(rounded, f, steps, warmups)  # < steps: predict / finetune refuse longer
    grid = list(rounded)
    lo, hi = ((0.0, 0.0) if isinstance(sched, Constant) else
              (float(sched.init) / float(sched.peak), float(sched.end) / float(sched.peak)))
    if not (lo >= 0 and hi >= 0):
        raise ValueError(f"the template's warmup_cosine must have init and end >= 0 (they are "
                         f"kept as fractions of the searched peak), got init/peak = {lo:g}, "
                         f"end/peak = {hi:g}.")
    unit = eqx.tree_at(lambda o: o.learning_rate, optimizer,
                       warmup_cosine(1.0, 0.0, steps, init=lo, end=hi))
    return {"unit": unit, "b": b, "warmups": grid,
            "lr_range": None if learning_rate_range is None else tuple(
                float(v) for v in learning_rate_range)}


def _check_range(rng, num):
    if not (isinstance(rng, Sequence) and len(rng) == 2):
        raise ValueError(f"learning_rate_range must be (min, max) of the peak learning rate, "
                         f"got {rng!r}; e.g. (1e-4, 1e-1).")
    lo, hi = (_real_scalar(v, "learning_rate_range entry") for v in rng)
    if not 0 < lo <= hi <= FLOAT32_MAX or (num == 1) != (lo == hi):
        raise ValueError(f"learning_rate_range must satisfy 0 < min <= max <= "
                         f"{FLOAT32_MAX:.8g} (float32's largest; min == max exactly when "
                         f"num_kappas is 1), got {rng!r} with num_kappas {num}.")


def schedule_at(unit: Optimizer, peak, warmup) -> Optimizer:
    """``unit`` with η_t = warmup_cosine(peak, warmup, T_max, init = r_i·peak, end = r_e·peak)
    (numbers or tracers)."""
    s = unit.learning_rate
    return eqx.tree_at(lambda o: o.learning_rate, unit, warmup_cosine(
        peak, warmup, s.decay_steps, init=s.init * peak, end=s.end * peak))


def _evaluate(data, unit, peak, warmup, target, temperature, *, kind, traced, loss):
    """One (η_peak, w): the loss curve per batch path of the recursion ``predict`` runs for
    this optimiser (``kind`` "linear", "head_aware" or "adam"), then ``_summary``."""
    from ntk_tt.dynamics._adam_head_aware import _adam_core
    from ntk_tt.dynamics._optim_head_aware import _head_sgd_core
    from ntk_tt.dynamics._optim_linear import _sgd_core

    opt = schedule_at(unit, peak, warmup)
    if kind == "adam":
        hk, hp, y, batches, a_h, table = data

        def run(b):
            return _adam_core(hk, hp, y, opt, b, a_h, None, loss=loss, table=table)[0]
    elif kind == "head_aware":
        hk, y, batches, a_h = data

        def run(b):
            return _head_sgd_core(hk, y, opt, b, a_h, None, loss=loss)[0]
    else:
        mat, f0, y, batches, a = data

        def run(b):
            return _sgd_core(mat, f0, y, opt, b, a, None, traced=traced, test_traced=None,
                             loss=loss)[0]
    paths = jax.vmap(lambda b: jax.vmap(lambda f: mean_loss(f, y, loss))(run(b)))(batches)
    return _summary(paths, target, temperature)


_STATIC = ("kind", "traced", "loss")


def _grid(data, unit, peaks, warmups, target, temperature, *, kind, traced, loss):
    return jax.vmap(lambda p, w: _evaluate(data, unit, p, w, target, temperature, kind=kind,
                                           traced=traced, loss=loss))(peaks, warmups)


_grid_jit = jax.jit(_grid, static_argnames=_STATIC)


def _surrogate(u, data, unit, target, temperature, *, kind, traced, loss):
    """Soft time to the target (steps) as a function of u = (log η_peak, w)."""
    ev = _evaluate(data, unit, jnp.exp(u[0]), u[1], target, temperature, kind=kind,
                   traced=traced, loss=loss)
    return ev.soft, ev


_surrogate_grad = jax.jit(jax.value_and_grad(_surrogate, has_aux=True), static_argnames=_STATIC)


def _kappa_edge(unit: Optimizer, loss: str, kappa_eff_max: float | None = None) -> float:
    """κ edge of the SGD template (``_suggest_curves._edge``: heavy ball or Nesterov; with
    ``kappa_eff_max`` at most kappa_eff_max·(1 − m)); inf for Adam (no κ edge)."""
    if unit.rule == "adam":
        return math.inf
    return _edge(float(unit.momentum), loss, kappa_eff_max, unit.nesterov)


def _opt_row(unit, b, n, peak, w, lam, out, i, sps, loss, source, kappa_edge,
             travel=None) -> dict:
    """A grid or refinement row; ``travel``: (η_peak, w) ↦ Adam's ρ (None for SGD)."""
    from ntk_tt.dynamics._regime import UNKNOWN_TRAVEL

    row = _row(b, n, peak, float(unit.momentum), lam, out, i, sps, loss, source)
    rho = None if travel is None else travel(peak, w)
    beyond = row["kappa"] > kappa_edge or (rho is not None and rho > UNKNOWN_TRAVEL)
    abstains = {} if rho is None or rho <= UNKNOWN_TRAVEL or row["outcome"] == "diverges" \
        else {"outcome": "unknown", "spike_step": -1}  # as predict says there
    return row | {"warmup": w, "beyond_edge": bool(beyond),
                  "admissible": math.isfinite(row["steps"]) and not row["diverged"]
                  and not beyond} | ({} if rho is None else {"weight_travel": rho}) | abstains


def _travel(unit: Optimizer, head, steps):
    """(η_peak, w) ↦ ρ = η_peak·Σ_t schedule_at(unit, 1, w)_t / rms(θ_0) for Adam (the
    schedule is linear in η_peak), None for SGD."""
    if unit.rule != "adam":
        return None
    from ntk_tt.dynamics._regime import _ratio, backbone_rms

    rms, sums = backbone_rms(head[1]), {}

    def travel(peak, w):
        if w not in sums:
            sums[w] = float(np.sum(np.asarray(schedule_at(unit, 1.0, w).learning_rates(steps),
                                              np.float64)))
        return _ratio(peak * sums[w], rms)
    return travel


def search(apply_fn, params, x, y, f0, head, n, c, spec, sps_given, target_abs, steps, lo, hi,
           num_kappas, tau, refine_steps, loss, key, num_paths, kernel, backbone, timings, bar,
           evaluate_beyond_edge, head_kernel=None, kappa_eff_max=None):
    """The work of ``suggest(optimizer=...)`` (arguments checked; ``spec`` from
    :func:`check_search`; ``lo``, ``hi`` the κ range, used when ``spec["lr_range"]`` is None):
    kernel, step time, grid, refinement. Returns what ``_suggest_search._search`` returns."""
    from ntk_tt._aot import compiled
    from ntk_tt.analysis._suggest_search import _batches
    from ntk_tt.dynamics._optim_linear import weight_tangent
    from ntk_tt.training._timing import Stopwatch

    unit, b = spec["unit"], spec["b"]
    decay = float(unit.weight_decay) != 0.0
    bar.set_description("suggest: kernel")
    batches = _batches(key, n, b, steps, num_paths)
    with Stopwatch() as sw:
        if head is not None:
            data, lam, name = _head_data(head, x, y, unit, batches, loss, backbone, key,
                                         head_kernel, decay)
            kind = "adam" if unit.rule == "adam" else "head_aware"
            traced = False
        else:
            from ntk_tt.dynamics._checks import float_logits
            from ntk_tt.dynamics._fspace import as_operator, clamp_psd
            from ntk_tt.kernels._ntk import empirical_ntk

            k = empirical_ntk(apply_fn, params, x, trace_logits=kernel == "traced")
            k, (_, lmax) = jax.jit(clamp_psd)(k)  # as predict(optimizer=...)
            lam = float(lmax) / (c if k.shape[0] == n else 1)
            f0 = float_logits(jnp.asarray(f0), k)
            mat, traced = as_operator(jnp.asarray(k, f0.dtype), n, c, name="kernel")
            a = jnp.asarray(weight_tangent(apply_fn, params, x), f0.dtype) if decay else None
            data, kind, name = (mat, f0, y, batches, a), "linear", f"linear:{kernel}"
        dtype = data[0].features.dtype if head is not None else f0.dtype
    timings["kernel"] = sw.seconds
    bar.update()
    if not (math.isfinite(lam) and lam > 0):
        raise ValueError(f"the kernel's largest eigenvalue is {lam:g}: the model's outputs do "
                         "not depend on its parameters here; nothing can be predicted.")

    bar.set_description("suggest: timing real steps")
    with Stopwatch() as sw:
        sps = sps_given if sps_given is not None else {
            b: _step_seconds(apply_fn, params, x, y, schedule_at(unit, 1e-3, 0.0), loss, key)}
    timings["step_time"] = sw.seconds
    bar.update()

    rng = spec["lr_range"]
    lr_lo, lr_hi = rng if rng is not None else (lo * n / lam, hi * n / lam)
    peaks = np.geomspace(lr_lo, lr_hi, num_kappas)
    pp, ww = (a.ravel() for a in np.meshgrid(peaks, np.asarray(spec["warmups"]),
                                             indexing="ij"))
    kappa_edge, travel = _kappa_edge(unit, loss, kappa_eff_max), _travel(unit, head, steps)
    run = np.array([evaluate_beyond_edge or not p * lam / n > kappa_edge for p in pp])
    static = dict(kind=kind, traced=traced, loss=loss)
    target_j, tau_j = jnp.asarray(target_abs, dtype), jnp.asarray(tau, dtype)
    bar.set_description("suggest: grid")
    out, timings["grid"] = None, 0.0
    if run.any():
        args = (data, unit, jnp.asarray(pp[run], dtype), jnp.asarray(ww[run], dtype),
                target_j, tau_j)
        exe, _ = compiled(_grid_jit, *args, **static)
        t0 = time.perf_counter()
        out = jax.device_get(jax.block_until_ready(exe(*args)))
        timings["grid"] = time.perf_counter() - t0
    rows, curves, j = [], {}, 0
    m = float(unit.momentum)
    for i in range(len(pp)):
        if run[i]:
            row = _opt_row(unit, b, n, float(pp[i]), float(ww[i]), lam, out, j, sps[b], loss,
                           "grid", kappa_edge, travel)
            curves[id(row)] = np.asarray(out.loss[j])
            j += 1
        else:
            row = _skipped(b, n, float(pp[i]), m, lam, sps[b]) | {"warmup": float(ww[i])}
        rows.append(row)
    bar.update()
    ranked = _order(rows)
    best = ranked[0] if ranked else None

    refinement, choice, timings["refine"] = [], best, 0.0
    if best is not None and refine_steps > 0:
        bar.set_description("suggest: refining (jax.grad)")
        choice, refinement, timings["refine"] = _refine(
            best, data, unit, static, lam, n, target_j, tau_j, dtype, refine_steps,
            math.log(lr_hi / lr_lo) / (num_kappas - 1) if num_kappas > 1 else 0.5,
            spec["warmups"], sps[b], loss, kappa_edge, rows, curves, compiled, (lr_lo, lr_hi),
            travel)
        bar.update()
    return rows, ranked, best, choice, curves, refinement, sps, name, lam


def _head_data(head, x, y, unit, batches, loss, backbone, key, head_kernel, decay):
    """(data of ``_evaluate``, λ_max of Θ_0, predictor name) for the head-aware predictors:
    the kernels and J_h·θ_0 as ``predict(optimizer=..., head=...)`` builds them."""
    from ntk_tt.dynamics._adam_head_aware import _check_precond, adam_head_aware_kernel
    from ntk_tt.dynamics._optim_head_aware import validate_head
    from ntk_tt.dynamics._optim_linear import weight_tangent
    from ntk_tt.dynamics._predict_head_aware import initial_eigenvalues
    from ntk_tt.kernels._head_aware import head_aware_kernel

    k1 = None if key is None else jax.random.fold_in(key, 1)
    hk = head_kernel if head_kernel is not None else head_aware_kernel(
        head, x, backbone=backbone, key=k1)
    hk = hk._replace(features_test=None, backbone_test=None)
    lam = float(initial_eigenvalues(hk)[1])
    a_h = weight_tangent(head[0], head[1], x) if decay else None
    given = "given" if head_kernel is not None else backbone
    if unit.rule == "adam":
        ak = adam_head_aware_kernel(head, x, y, unit, backbone=backbone, loss=loss, hk=hk,
                                    key=k1)
        hk, y, a_h, _, _ = validate_head(ak.hk, y, unit, rules=("adam",), where="suggest",
                                         loss=loss, a_h=a_h, a_h_test=None)
        return (hk, _check_precond(ak.precond, hk), y, batches, a_h, ak.drift), lam, \
            f"head_aware_adam:{given}"
    hk, y, a_h, _, _ = validate_head(hk, y, unit, rules=("sgd",), where="suggest", loss=loss,
                                     a_h=a_h, a_h_test=None)
    return (hk, y, batches, a_h), lam, f"head_aware:{given}"


def _step_seconds(apply_fn, params, x, y, optimizer, loss, key) -> float:
    """Seconds per real ``optimizer.to_optax()`` step (5 warm steps, compile excluded):
    :func:`ntk_tt.step_time` with ``optimizer=``, as ``finetune(optimizer=...)`` steps."""
    from ntk_tt.training._finetune import step_time

    return float(step_time(apply_fn, params, x, y, optimizer=optimizer, loss=loss, key=key))


def _refine(best, data, unit, static, lam, n, target, tau, dtype, budget, step_log, warmups,
            sps, loss, kappa_edge, rows, curves, compiled, lr_range, travel=None):
    """``_descend`` in (log η_peak, w) from the best grid point: scaled by (grid spacing of
    log η_peak, smallest warmup gap (1 step if one warmup)); η_peak in [η_best·e^(∓10 cells)]
    ∩ ``lr_range`` (the grid's η_peak range: the user's learning_rate_range, or kappa_range
    as η), below (1 − EDGE_MARGIN)·edge for SGD; w in [1 step, the largest warmup of the grid]
    (below T_max: ``predict`` refuses a ramp that does not end before it), or held at 0 from
    a grid point without warmup (η_t jumps there: any w in (0, 1] sets η_0 = init, which the
    gradient at w = 0 does not see)."""
    gaps = np.diff(sorted(warmups))
    scale = np.array([step_log, float(gaps[gaps > 0].min()) if (gaps > 0).any() else 1.0])
    log_best = math.log(best["learning_rate"])
    top = min(log_best + 10 * step_log, math.log(lr_range[1]))
    if math.isfinite(kappa_edge):
        top = min(top, math.log((1 - EDGE_MARGIN) * kappa_edge * n / lam))
    low = max(log_best - 10 * step_log, math.log(lr_range[0]))
    last = float(unit.learning_rate.decay_steps) - 1.0  # ⌈w⌉ < T_max
    span = (0.0, 0.0) if best["warmup"] == 0 else (min(1.0, best["warmup"]),
                                                   min(max(warmups), last))
    fixed = ((low, max(low, top)), span)  # empty only if κ_min is within the edge's margin

    def evaluate(u):
        args = (jnp.asarray(u, dtype), data, unit, target, tau)
        return _timed(compiled(_surrogate_grad, *args, **static)[0], args)

    def make_row(u, ev):
        peak = min(max(math.exp(u[0]), lr_range[0]), lr_range[1])  # e^(log hi) may pass hi
        return _opt_row(unit, best["b"], n, peak, float(u[1]), lam, _one(ev), 0, sps, loss,
                        "refine", kappa_edge, travel)

    return _descend(best, [log_best, best["warmup"]], evaluate, lambda _: fixed, scale,
                    budget, make_row, ("log_learning_rate", "warmup"), rows, curves)
