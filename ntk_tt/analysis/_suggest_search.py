"""The search of :func:`ntk_tt.suggest` (and its ``seconds_per_step`` check): the kernel, the
real step times, the κ × m grid per batch size (one compiled ``jit(vmap)`` each), then the
refinement of the best grid point."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._options import _real_scalar as _real
from ntk_tt.analysis._suggest_curves import _edge, _grid_jit
from ntk_tt.analysis._suggest_refine import _refine
from ntk_tt.analysis._suggest_report import _order, _row, _skipped


def _check_seconds(seconds_per_step, batches, n) -> dict | None:
    """``suggest``'s ``seconds_per_step`` as {B (None = GD): seconds} for ``batches``, or None
    (measure); a one-line ValueError for a bad one (before any work)."""
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


def _search(apply_fn, params, x, y, f0, head, n, c, bsizes, moms, sps_given, target_abs, steps,
            lo, hi, num_kappas, tau, refine_steps, loss, key, num_paths, kernel, backbone,
            timings, bar, evaluate_beyond_edge, head_kernel=None, kappa_eff_max=None):
    """The work of :func:`ntk_tt.suggest` (arguments validated): kernel, step times, grid,
    refinement. Fills ``timings`` (seconds without compilation) and advances ``bar`` per stage."""
    from ntk_tt._aot import compiled
    from ntk_tt.dynamics._fspace import clamp_psd
    from ntk_tt.training._finetune import step_time
    from ntk_tt.training._timing import Stopwatch

    # 1. the kernel, shared by every configuration
    bar.set_description("suggest: kernel")
    with Stopwatch() as sw:
        if head is not None:
            from ntk_tt.dynamics._checks import solve_dtype_fields
            from ntk_tt.dynamics._predict_head_aware import initial_eigenvalues
            from ntk_tt.kernels._head_aware import head_aware_kernel

            hk = head_kernel if head_kernel is not None else head_aware_kernel(
                head, x, backbone=backbone,
                key=None if key is None else jax.random.fold_in(key, 1))
            # one dtype for every field (float64 x with float32 weights: the scan's carry)
            hk, dtype = solve_dtype_fields(hk)
            lam = float(initial_eigenvalues(hk)[1])  # λ_max of Θ_0
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
    run = np.array([evaluate_beyond_edge or not lr * lam / n > _edge(m, loss, kappa_eff_max)
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
                           "grid", kappa_eff_max)
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
            step_log, (min(moms), max(moms)), sps[best["b"]], loss, rows, curves, compiled,
            (lo, hi), kappa_eff_max)
        bar.update()
    return rows, ranked, best, choice, curves, refinement, sps, name, lam


def _batches(key, n, b, steps, num_paths):
    """Batch sequences (P, T, B): GD one path of arange(N); SGD ``num_paths`` orders, path 0 =
    ``batch_indices(key, N, B, T)`` (the keys of ``head_aware_paths`` / ``discrete_paths``)."""
    from ntk_tt.data._batches import path_batch_indices

    if b is None:
        return jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (1, steps, n))
    return path_batch_indices(key, n, b, steps, num_paths)
