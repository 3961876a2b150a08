"""Run the benchmark grid: one kernel per task, jit(vmap) predictions, real fine-tunes, rows.

For each task with unfinished rows: build the primary predictor's kernel (the diagonal
head-aware kernel of ``ntk_tt.predict``'s default) and the exact empirical NTK Θ once, and from
Θ the variants' kernels (the Kronecker head-aware one, its mixing S from 32 inputs, is the
variant ``head_aware_kronecker``, the isotropic one, the primary before session 34, is
``head_aware_isotropic``; the traced kernel, free), a sketch per
requested D'; read λ_max of Θ, turn every configuration's κ̃ into η, predict all configurations
sharing a batch size with one compiled ``jit(vmap(...))`` over (η, m) per predictor (the
frozen-kernel ``predict_from_kernel`` on Θ is the variant ``linear``, the primary before
issue 9), fine-tune them for real through one compiled training step (vmapped over (η, m)
except on CPU, see :func:`_finetune_group`) — or reuse the identical real run of an earlier
sweep (``reuse``) — and write one row per configuration as soon as its batch size's
fine-tunes have finished (an earlier sweep's identical variant predictions can be reused too,
``ntk_tt.sweep._reuse``). Compile time is measured apart (ahead-of-time
``lower().compile()``) and never counted in the prediction or fine-tuning wall times. The
prediction wall time is the primary predictor's alone: its own kernel work (not the exact Θ,
which the variants need) and its solves. The task's data: ``_load``; its
kernels and predictions: ``_predictions``; its real fine-tunes: ``_finetune``.
"""

from __future__ import annotations

import json
import os
import pathlib
import time
from collections.abc import Callable

import jax
import numpy as np

import ntk_tt
from ntk_tt.dynamics._divergence import divergence
from ntk_tt.sweep._errors import t_col
from ntk_tt.sweep._figures import make_figures
from ntk_tt.sweep._finetune import TaskData, _finetune_group
from ntk_tt.sweep._grid import (
    Config,
    SweepSpec,
    Task,
    _field,
    check_batch_below_n,
    plan,
    row_id,
    spec_from_dict,
    spec_to_dict,
)
from ntk_tt.sweep._load import _task_key, load_task
from ntk_tt.sweep._outcomes import FEATURE_SUBSPACE, SUBSPACE_KERNELS, outcome_columns
from ntk_tt.sweep._predictions import (
    PRIMARY,
    _hyper,
    _kernel,
    _predict_group,
    _t_eps,
    _variants,
    variant_labels,
)
from ntk_tt.sweep._reuse import reusable_predictions, reusable_runs, reused_predictions
from ntk_tt.sweep._summary import promote, summarize
from ntk_tt.sweep._table import ResultsTable, read_rows, read_table
from ntk_tt.sweep._targets import target_columns


def _row(task, cfg, b, n, c, lam, lr, spec) -> dict:
    return {
        "row_id": row_id(task, cfg), "task_id": task.id, "dataset": task.dataset,
        "per_class": task.per_class, "seed": task.seed, "num_train": n, "num_classes": c,
        "config_id": cfg.id, "optimizer": cfg.optimizer, "batch_size": n if b is None else b,
        "momentum": cfg.momentum, "lr_kind": cfg.lr_kind, "lr_value": cfg.lr_value,
        "learning_rate": lr, "lambda_max": lam, "kappa": lr * lam / n,
        "kappa_eff": lr * lam / (n * (1 - cfg.momentum)), "steps": spec.steps,
        "pred_method": PRIMARY[0], "pred_kernel": PRIMARY[1],
        "pred_paths": 1 if b is None else spec.num_paths,
    }


def _curve_columns(prefix: str, loss, diverged, spiked_at, epsilons) -> dict:
    out = {f"{prefix}_diverged": bool(diverged), f"{prefix}_spiked_at": int(spiked_at)}
    out.update({t_col(prefix, e): _t_eps(loss, e) for e in epsilons})
    return out


def run_task(task: Task, configs: list[Config], spec: SweepSpec, data: TaskData,
             table: ResultsTable, *, progress: Callable[[str], None] = print,
             reuse: dict | None = None, reuse_predictions: dict | None = None) -> int:
    """Predict and fine-tune every configuration of one task; write one row each.

    All predictions come first (one compiled vmap per batch size and predictor); then, per
    batch size, one real fine-tune of its configurations, whose rows are written as soon as it
    finishes. ``reuse`` maps row ids to the real runs of an earlier sweep
    (:func:`reusable_runs`); a configuration found there at the same learning rate reuses
    its run instead of fine-tuning again; ``reuse_predictions`` maps row ids to an earlier
    sweep's variant predictions (``_reuse.reusable_predictions``): a variant that every
    configuration of a batch size has there (same η, steps and label) is taken from it, and
    its kernel is built only if another batch size needs it. Returns the number of rows
    written.
    """
    key = _task_key(task)
    t0 = time.perf_counter()
    theta, f0, lam, hk, sec_kernel = _kernel(data, key)
    n, c = f0.shape
    groups: dict = {}
    for cfg in configs:
        groups.setdefault(cfg.batch_size, []).append(cfg)
    labels = variant_labels(spec)
    hyper = {b: _hyper(cfgs, lam, n) for b, cfgs in groups.items()}
    reused = {b: reused_predictions(reuse_predictions, task, cfgs, hyper[b][0], spec.steps,
                                    labels) for b, cfgs in groups.items()}
    needed = {name for name in labels if any(name not in r for r in reused.values())}
    # the variants' kernels are dispatched asynchronously: finish them before any prediction
    # is timed (else the first timed solve waits for them: 6-7 s instead of 0.5 s at N = 750)
    variants = jax.block_until_ready(_variants(data, spec, key, theta, f0, needed))
    primary = theta if hk is None else hk
    preds, sec_predict, compile_s = {}, 0.0, 0.0
    for b in groups:
        lrs, moms = hyper[b]
        kw = {"steps": spec.steps, "batch_size": b, "num_paths": spec.num_paths}
        main = _predict_group(primary, f0, data.y, key, lrs, moms, None, method="discrete",
                              **kw)
        var = {}
        for name in labels:
            if name in reused[b]:
                var[name] = reused[b][name]
            elif name in variants:
                v = variants[name]
                method = ("ode" if b is None else "sde") if v.continuous else "discrete"
                var[name] = _predict_group(v.kernel, f0, data.y, key, lrs, moms, v.noise,
                                           method=method, **kw)
        preds[b] = (main, var, lrs, moms)
        sec_predict += main[3]
        compile_s += main[4]
    progress(f"{task.id}: kernels and {len(configs)} predictions "
             f"({time.perf_counter() - t0:.0f} s with compilation)")
    written = 0
    for b, cfgs in groups.items():
        (loss_p, div_p, spike_p, s_pred, _, err_p), var, lrs, moms = preds[b]
        loss_r, div_r, spike_r, s_ft, cs, source, err_r = _real_runs(
            data, task, key, cfgs, lrs, moms, b, spec.steps, reuse)
        kappas = np.asarray(lrs, np.float64) * lam / n  # the rows' κ (exact Θ)
        outs = outcome_columns("real", loss_r, div_r, spike_r) | outcome_columns(
            "pred", loss_p, div_p, spike_p, kappa=kappas, momentum=moms, frozen=hk is None,
            feature_subspace=hk is not None and PRIMARY[1] in SUBSPACE_KERNELS)
        for name, (vloss, vdiv, vspike, *_) in var.items():
            outs |= outcome_columns(f"var_{name}", vloss, vdiv, vspike, kappa=kappas,
                                    momentum=moms, frozen=not name.startswith("head_aware"),
                                    feature_subspace=any(s in labels[name]
                                                         for s in FEATURE_SUBSPACE))
        for i, cfg in enumerate(cfgs):
            row = _row(task, cfg, b, n, c, lam, float(lrs[i]), spec)
            if hk is None:
                row.update(pred_method="discrete", pred_kernel="exact")
            row.update(_curve_columns("real", loss_r[i], div_r[i], spike_r[i], spec.epsilons))
            row.update(_curve_columns("pred", loss_p[i], div_p[i], spike_p[i], spec.epsilons))
            row.update(target_columns(loss_r[i], loss_p[i], div_r[i], div_p[i], err_r[i],
                                      err_p[i]))
            row.update({k: v[i] for k, v in outs.items()})
            for name, (vloss, vdiv, vspike, vsec, _, verr) in var.items():
                row.update(_curve_columns(f"var_{name}", vloss[i], vdiv[i], vspike[i],
                                          spec.epsilons))
                row[f"var_{name}_label"] = labels[name]
                row[f"var_{name}_seconds"] = vsec / len(cfgs)
                row[f"var_{name}_loss"] = vloss[i]
                if name.startswith("head_aware") and verr is not None:  # promotable
                    row[f"var_{name}_error"] = verr[i]
            row["predictions_reused"] = ",".join(sorted(reused[b]))
            row.update(
                real_loss=loss_r[i], pred_loss=loss_p[i], real_source=source[i],
                real_error=err_r[i], pred_error=err_p[i],
                real_loss_drop=float(1 - loss_r[i][-1] / loss_r[i][0]),
                seconds_predict=sec_kernel + s_pred / len(cfgs), seconds_finetune=s_ft[i],
                seconds_compile_finetune=cs, task_seconds_kernel=sec_kernel,
                task_seconds_predict=sec_predict, task_seconds_compile_predict=compile_s,
                task_configs=len(configs),
            )
            table.write_row(row)
            written += 1
        progress(f"{task.id}: batch {b or 'N'}: {len(cfgs)} rows written, "
                 f"{source.count('reused')} real runs reused ({time.perf_counter() - t0:.0f} s)")
    return written


def _real_runs(data, task, key, cfgs, lrs, moms, b, steps, reuse):
    """Real loss curves (G, T + 1), divergence flags, spike steps, fine-tune seconds (G,),
    compile seconds, each run's source and its error curve (None for a reused run whose
    table stored none): the earlier run from ``reuse`` where it exists with
    the same η (to 1e-5) and steps (its flags re-derived from its curve by
    ``ntk_tt.dynamics._divergence``), a fresh fine-tune (one ``_finetune_group``) for the
    others. An earlier run flagged diverged is never reused: runs before issue 10 stopped at
    10·L_0. A reused run's seconds are T × this machine's seconds per training step now
    (``ntk_tt.step_time``: 5 warm steps of the group's batch size), so that its cost and the
    predictions' are measured on one machine, as for a fresh fine-tune (training steps only,
    no per-step evaluation)."""
    found = [(reuse or {}).get(row_id(task, cfg)) for cfg in cfgs]
    lr_np = np.asarray(lrs)
    ok = [f is not None and abs(f[3] - lr) <= 1e-5 * abs(lr) and len(f[0]) == steps + 1
          and not f[1] for f, lr in zip(found, lr_np, strict=True)]
    fresh = [i for i, good in enumerate(ok) if not good]
    loss = np.empty((len(cfgs), steps + 1))
    div = np.zeros(len(cfgs), bool)
    spike = np.full(len(cfgs), -1)
    secs = np.zeros(len(cfgs))
    err: list = [None] * len(cfgs)
    cs = 0.0
    if fresh:
        pick = np.array(fresh)
        lf, df, kf, sf, cs, ef = _finetune_group(data, key, lrs[pick], moms[pick],
                                                 steps=steps, batch_size=b)
        loss[pick], div[pick], spike[pick], secs[pick] = lf, df, kf, sf
        for j, i in enumerate(fresh):
            err[i] = ef[j]
    per_step = 0.0
    if any(ok):
        per_step = ntk_tt.step_time(data.apply_fn, data.params, data.x, data.y,
                                    learning_rate=float(lr_np[0]), momentum=float(moms[0]),
                                    batch_size=b, key=key)  # η, m: the same cost
    for i, good in enumerate(ok):
        if good:
            loss[i], secs[i] = np.asarray(found[i][0], float), steps * per_step
            err[i] = found[i][5] if len(found[i]) > 5 else None
            verdict = divergence(loss[i])
            div[i], spike[i] = bool(verdict.diverged), int(verdict.spiked_at)
            cs = cs or float(found[i][2])
    return (loss, div, spike, secs, cs, ["reused" if good else "fine-tuned" for good in ok],
            err)


def _read_json(path: pathlib.Path, default):
    return json.loads(path.read_text()) if path.exists() else default


def _write_json(path: pathlib.Path, data) -> None:
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def check_resume(spec: SweepSpec, out) -> None:
    """Refuse to resume into ``out`` if its ``spec.json`` records another grid or a row file
    is damaged (nothing is read but those files, nothing written).

    Raises:
      ValueError: ``out`` holds a sweep of a different grid (the fields that differ named
        with their flags), or a row file that is not JSON (:func:`read_rows`; a fresh user's
        damaged row counted as present, and the resume failed only after all its work).
    """
    read_rows(pathlib.Path(out) / "rows")
    spec_path = pathlib.Path(out) / "spec.json"
    differs = ""
    try:
        old = _read_json(spec_path, None)
        stored = None if old is None else spec_to_dict(spec_from_dict(old))
        now = spec_to_dict(spec)  # a list's order is not the grid (rows are named by value)
        keys = [] if old is None else [k for k in now if _sorted(stored[k]) != _sorted(now[k])]
        same = not keys
        if not same:  # the fields that differ, with their flags (a fresh user had to guess)
            differs = ": " + "; ".join(f"{_field(k)} stored {_listed(stored[k])}, now "
                                       f"{_listed(now[k])}" for k in keys)
            if any("(--" not in _field(k) for k in keys):
                differs += "; a field without a flag comes from --preset (--smoke)"
    except (TypeError, ValueError):  # unreadable JSON, or a grid this version refuses
        same = False
    if not same:
        raise ValueError(f"{out} holds a sweep with a different grid ({spec_path}{differs}); "
                         "resume it with the same options or choose a new --out.")


def _sorted(value):
    """A spec field's value with its list in a fixed order (None, i.e. B = N, first)."""
    if isinstance(value, (tuple, list)):
        return sorted(value, key=lambda v: (v is not None, v if v is not None else 0))
    return value


def _listed(value) -> str:
    """A spec field's value as the flags take it: tuples as space-separated lists (None: N)."""
    if isinstance(value, (tuple, list)):
        return " ".join("N" if v is None else str(v) for v in value) or "(none)"
    return repr(value)


def run_sweep(spec: SweepSpec, out, *, loader: Callable[[Task, SweepSpec], TaskData] = load_task,
              progress: Callable[[str], None] = print, reuse_from=None,
              reuse_predictions_from=None, finish: Callable[[dict], object] | None = None) -> dict:
    """Run (or resume) the grid into ``out``; finished rows are skipped, never recomputed.

    ``reuse_from``: an earlier sweep directory whose identical real runs are reused
    (:func:`reusable_runs`); rows record ``real_source`` ("fine-tuned" or "reused").
    ``reuse_predictions_from``: an earlier sweep directory whose variants' predictions are
    reused where identical (``ntk_tt.sweep._reuse``); rows record the reused variants'
    names in ``predictions_reused`` (comma-separated, "" for none).
    ``finish``: the invocation's last step, given the counts once every row is written
    (``experiments/sweep.py``: the report); the invocation has finished when it returns.

    ``out/spec.json`` records the grid; resuming with a different grid is refused. Each
    invocation appends its entry to ``out/runs.json`` when it starts and rewrites it after
    every progress message (a task's predictions, each batch size's rows), when it is
    interrupted or fails, and at its end: ``seconds`` (wall time so far), ``rows_written``
    (rows it has written, counted on disk), ``finished`` (False until it has every row and
    ``finish`` has returned: an invocation stopped in any way during its report, ``kill -9``
    included, stays unfinished; a report made in ``finish`` counts its own invocation
    finished: :func:`report`'s ``last_step``), so an invocation stopped at any point keeps its
    seconds in ``sweep_wall_seconds``: up to the interruption (Ctrl-C, SIGTERM, an error), up
    to its last message after a SIGKILL.

    Returns:
      counts of rows written now, already present, and skipped (by reason).

    Raises:
      ValueError: ``out`` holds a sweep of a different grid (:func:`check_resume`) or is not
        a directory, or a batch size is not below any task's N
        (:func:`ntk_tt.sweep._grid.check_batch_below_n`); all before anything is written.
    """
    t0 = time.perf_counter()
    check_batch_below_n(spec)
    check_resume(spec, out)
    table = ResultsTable(out)
    _write_json(table.out / "spec.json", spec_to_dict(spec))
    done = table.done_ids()
    reuse = None if reuse_from is None else reusable_runs(reuse_from)
    reuse_pred = (None if reuse_predictions_from is None
                  else reusable_predictions(reuse_predictions_from))
    todo, skipped = plan(spec)
    runs_path = table.out / "runs.json"
    runs = _read_json(runs_path, [])
    mine = len(runs)

    def record(finished: bool) -> None:  # its rows are in rows/ until a report gathers them
        runs[mine:] = [{"seconds": time.perf_counter() - t0,
                        "rows_written": len(table.row_ids() - done), "finished": finished}]
        _write_json(runs_path, runs)

    def noted(message: str) -> None:
        progress(message)
        record(False)

    record(False)
    written, present = 0, 0
    try:
        for task, configs in todo:
            left = [c for c in configs if row_id(task, c) not in done]
            present += len(configs) - len(left)
            if left:
                written += run_task(task, left, spec, loader(task, spec), table,
                                    progress=noted, reuse=reuse, reuse_predictions=reuse_pred)
        counts = {"written": written, "already_present": present, "skipped": dict(skipped)}
        record(False)  # its seconds up to the report, still unfinished (even after kill -9)
        if finish is not None:
            finish(counts)
        runs[mine]["finished"] = True  # the seconds the report counted (summary.json) kept
        _write_json(runs_path, runs)
    except BaseException:  # Ctrl-C / SIGTERM (a KeyboardInterrupt here) or an error
        record(False)
        raise
    return counts


def report(out, *, primary: tuple[str, str] | None = None, last_step: bool = False) -> dict:
    """Consolidate ``out/rows`` into the table, then write ``summary.json``, figures, Table 1.

    Everything is computed from the results table (plus the grid in ``spec.json`` for the
    skipped-row counts and the planned rows the table lacks, ``missing_rows``: > 0 for a
    sweep stopped before its end, and ``runs.json`` for the sweep's wall time).
    ``primary = (variant, name)`` reports the recorded variant as the primary prediction and
    the sweep's primary as variant ``name`` (:func:`ntk_tt.sweep._summary.promote`).
    ``last_step``: the report is the last step of the invocation recorded last in
    ``runs.json`` (:func:`run_sweep`'s ``finish``), which is counted finished. Returns the
    summary.
    """
    table = ResultsTable(out)
    if table.done_ids():
        table.consolidate()
    frame = read_table(out)
    meta: dict = {}
    spec = _read_json(table.out / "spec.json", None)
    if spec is not None:
        meta["grid"] = spec
        pairs, skipped = plan(spec_from_dict(spec))
        meta["skipped_rows"] = dict(skipped)
        planned = {row_id(task, c) for task, configs in pairs for c in configs}
        # a sweep killed before its end is summarised as it stands: say how much is missing
        meta["planned_rows"] = len(planned)
        meta["missing_rows"] = len(planned - set(frame["row_id"]))
    runs = _read_json(table.out / "runs.json", [])
    meta["sweep_wall_seconds"] = sum(r["seconds"] for r in runs)
    meta["sweep_invocations"] = len(runs)
    # killed or interrupted ones: their seconds count up to their last progress message
    meta["sweep_invocations_unfinished"] = sum(not r.get("finished", True) for r in runs) - (
        last_step and bool(runs) and not runs[-1].get("finished", True))  # this invocation's
    # the key is always there (None: the table's own primary is the headline)
    meta["primary"] = {"promoted_variant": None, "demoted_primary_as": None}
    if primary is not None:
        frame = promote(frame, *primary)
        meta["primary"] = {"promoted_variant": primary[0], "demoted_primary_as": primary[1]}
    summary = summarize(frame, meta=meta)
    make_figures(frame, table.out)
    _write_json(table.out / "summary.json", summary)
    return summary
