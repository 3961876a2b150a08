"""Check ``ntk_tt.suggest`` against the real (η, m, B) grid of the telemetry corpus.

    python experiments/suggest_check.py --corpus experiments/results/telemetry \\
        --out experiments/results/suggest [--fractions 0.5,0.7] [--per-class 10] \\
        [--kappa-eff-max 12] [--backbone diagonal]

For every corpus task with ``--per-class`` images per class (N = 50 at 10: 12 tasks), for each
target fraction q: the target is the absolute mean training loss q·L_0 (L_0 = the corpus runs'
full-training-set loss at w0, the same for every run of the task); ``suggest`` runs
restricted to the task's batch sizes (GD and B = 10 at N = 50) and T_max = the corpus's 40
steps, with the default grid (16 κ in [0.05, 50] × m ∈ {0, 0.5, 0.9, 0.95}), the head-aware
predictor and 8 SGD paths (``--kappa-eff-max``: ``suggest(kappa_eff_max=)``, the effective
κ̃ = κ/(1 − m) capped; ``--backbone``: ``suggest(backbone=)``), measuring its own seconds
per step; then the suggested configuration is fine-tuned for real once (``ntk_tt.finetune``,
the task's data from ``load_corpus_task`` and the batch order ``_run_key(task, 0)`` of the
corpus's run seed 0).

Real time to target = (first step whose real full-training-set loss ≤ target) × seconds per
step. Both sides use one clock per (task, B): the median of the corpus runs' measured seconds
per step at that B (``seconds.finetune`` / steps taken), so the comparison measures the
choice of (η, m, B), not the machine's load; the run's own measured time is reported too.
The corpus grid it is ranked against: every GD run and the seed-0 SGD runs (same batch order
as ours), those that did not diverge and reached the target. Rank 1 = no grid run was
faster; ratio = ours / the fastest grid run.

Also reported, without compute: "pred-grid", the grid run that the corpus's own stored
predictions (head-aware, made before each real run) say is fastest, and its real time.
Writes ``suggest_check.csv``, ``suggest_check.png`` and ``runs.json`` (per-task curves) to
``--out``.

    python experiments/suggest_check.py --verify-report docs/suggest_default.json \
        --out experiments/results/suggest

fine-tunes, on the task of an ``ntk-tt suggest --json`` report made with the default task
options, the suggestion and the grid's best (unrefined) point for T_max steps and writes
their real steps to target to ``default_task.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import statistics
import sys
import time

import numpy as np
from _args import at_least, fail, positive  # experiments/_args.py, beside this script


def first_hit(curve, target) -> float:
    hit = np.asarray(curve, float) <= target
    return float(np.argmax(hit)) if hit.any() else math.nan


def sps_of(row) -> float:
    """Seconds per real step of a corpus run: seconds.finetune / steps taken."""
    stop = row["telemetry"].get("stopped_at")
    taken = stop if isinstance(stop, int) and stop > 0 else row["steps"]
    return row["seconds"]["finetune"] / taken


def load_spec(corpus: pathlib.Path):
    from ntk_tt.sweep._corpus import CorpusSpec

    raw = json.loads((corpus / "spec.json").read_text())
    fields = {f.name for f in dataclasses.fields(CorpusSpec)}

    def tup(v):
        return tuple(tup(x) for x in v) if isinstance(v, list) else v

    return CorpusSpec(**{k: tup(v) for k, v in raw.items() if k in fields})


def grid_rows(corpus: pathlib.Path, task_id: str) -> list[dict]:
    """The task's corpus runs: ``corpus/runs/*.json`` (a generated corpus) or the packed
    ``corpus/corpus.jsonl.gz`` (the committed one, ``experiments/results/telemetry``)."""
    if (corpus / "runs").is_dir():
        return [json.loads(p.read_text())
                for p in sorted((corpus / "runs").glob(f"{task_id}__*.json"))]
    from ntk_tt.sweep._corpus_files import iter_corpus

    rows = [r for r in iter_corpus(corpus / "corpus.jsonl.gz") if r["task_id"] == task_id]
    return sorted(rows, key=lambda r: r["run_id"])


def check_task(task, spec, corpus, fractions, num_paths, kappa_eff_max=None, backbone=None):
    import ntk_tt
    from ntk_tt.sweep._corpus import _run_key, load_corpus_task

    rows = grid_rows(corpus, task.id)
    if not rows:
        raise SystemExit(f"no corpus runs for task {task.id} in {corpus}")
    l0 = rows[0]["telemetry"]["loss"][0]
    n = rows[0]["num_train"]
    steps = rows[0]["steps"]
    bs = sorted({r["batch_size"] for r in rows})
    clock = {b: statistics.median(sps_of(r) for r in rows if r["batch_size"] == b) for b in bs}
    t0 = time.perf_counter()
    apply_fn, params, x, y, xt, yt, split, _ = load_corpus_task(task, spec)
    key = _run_key(task, 0)
    seconds_load = time.perf_counter() - t0
    out = []
    for q in fractions:
        target = q * l0
        grid = []
        for r in rows:
            if r["batch_size"] != n and r["run_seed"] != 0:
                continue
            t = first_hit(r["telemetry"]["loss"], target)
            ok = math.isfinite(t) and not r["outcome"]["diverged"]
            p = r["prediction"]
            tp = first_hit(p["loss"], target)
            pred_ok = math.isfinite(tp) and not p["diverged"] and not p["beyond_edge"]
            grid.append(dict(config=r["config_id"], b=r["batch_size"], real_steps=t,
                             real_seconds=t * clock[r["batch_size"]] if ok else math.inf,
                             reached=math.isfinite(t), diverged=r["outcome"]["diverged"],
                             pred_seconds=tp * clock[r["batch_size"]] if pred_ok else math.inf))
        reached = [g for g in grid if math.isfinite(g["real_seconds"])]
        best = min(reached, key=lambda g: g["real_seconds"]) if reached else None
        pg = min(grid, key=lambda g: g["pred_seconds"])

        t1 = time.perf_counter()
        s = ntk_tt.suggest(apply_fn, params, x, y, head=split, target=target,
                           target_kind="absolute", steps=steps,
                           batch_sizes=tuple(None if b == n else b for b in bs), key=key,
                           num_paths=num_paths, kappa_eff_max=kappa_eff_max,
                           backbone=backbone)
        seconds_suggest = time.perf_counter() - t1
        rec = dict(task_id=task.id, dataset=task.dataset, task_seed=task.seed, fraction=q,
                   initial_loss=l0, target=target, grid_runs=len(grid),
                   grid_reaching=len(reached), suggest_seconds=seconds_suggest,
                   suggest_compile_seconds=s.timings["compile"], found=s.found)
        run = None
        if s.found:
            b = n if s.batch_size is None else s.batch_size
            t2 = time.perf_counter()
            run = ntk_tt.finetune(apply_fn, params, x, y, learning_rate=s.learning_rate,
                                  steps=steps, batch_size=s.batch_size, momentum=s.momentum,
                                  key=key, x_test=xt, y_test=yt)
            real_t = first_hit(run.loss, target)
            ok = math.isfinite(real_t) and not run.diverged
            ours = real_t * clock[b] if ok else math.inf
            faster = sum(g["real_seconds"] < ours for g in reached)
            rec |= dict(
                batch_size=b, momentum=s.momentum, learning_rate=s.learning_rate,
                kappa=s.kappa, kappa_eff=s.kappa / (1 - s.momentum), refined=s.refined,
                pred_steps=s.steps, pred_seconds_own_clock=s.seconds,
                suggest_sps=s.seconds_per_step[s.batch_size], real_steps=real_t,
                real_seconds=ours, real_seconds_own_clock=real_t * run.seconds_per_step,
                real_sps=run.seconds_per_step, real_diverged=run.diverged,
                finetune_seconds=time.perf_counter() - t2,
                rank=(faster + 1) if ok else None, ranked=len(reached) + 1,
                ratio=(ours / best["real_seconds"]) if (ok and best) else math.inf)
        rec |= dict(
            best_config=best["config"] if best else None,
            best_steps=best["real_steps"] if best else math.nan,
            best_seconds=best["real_seconds"] if best else math.nan,
            median_reaching_seconds=(statistics.median(g["real_seconds"] for g in reached)
                                     if reached else math.nan),
            predgrid_config=pg["config"], predgrid_real_seconds=pg["real_seconds"],
            predgrid_ratio=(pg["real_seconds"] / best["real_seconds"]) if best else math.nan,
            load_seconds=seconds_load, clock_gd=clock[n],
            clock_sgd=next((v for b, v in clock.items() if b != n), math.nan))
        out.append((rec, dict(task_id=task.id, fraction=q, grid=grid,
                              predicted=None if s.loss is None else s.loss.tolist(),
                              real=None if run is None else run.loss.tolist())))
        print(json.dumps({k: rec.get(k) for k in (
            "task_id", "fraction", "batch_size", "momentum", "kappa_eff", "pred_steps",
            "real_steps", "rank", "ranked", "ratio", "best_config", "predgrid_ratio",
            "suggest_seconds")}, default=str), flush=True)
    return out


def figure(df, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fracs = sorted(df.fraction.unique())
    fig, axes = plt.subplots(1, len(fracs), figsize=(6.5 * len(fracs), 4.2), squeeze=False,
                             constrained_layout=True)
    for ax, q in zip(axes[0], fracs, strict=True):
        d = df[df.fraction == q].reset_index(drop=True)
        grid = json.loads(pathlib.Path(path).with_name("runs.json").read_text())
        for i, rec in d.iterrows():
            g = next(x["grid"] for x in grid if x["task_id"] == rec.task_id
                     and x["fraction"] == q)
            secs = [x["real_seconds"] for x in g if math.isfinite(x["real_seconds"])]
            ax.scatter([i] * len(secs), secs, s=9, color="0.65", zorder=1,
                       label="corpus grid runs" if i == 0 else None)
            if math.isfinite(rec.best_seconds):
                ax.scatter([i], [rec.best_seconds], s=40, facecolor="none", edgecolor="C0",
                           zorder=2, label="fastest grid run" if i == 0 else None)
            if math.isfinite(rec.get("real_seconds", math.inf)):
                ax.scatter([i], [rec.real_seconds], marker="*", s=110, color="C3", zorder=3,
                           label="suggested, fine-tuned for real" if i == 0 else None)
            else:
                ax.annotate("suggested: missed", (i, rec.best_seconds), color="C3",
                            fontsize=7, rotation=90)
        ax.set_yscale("log")
        ax.set_xticks(range(len(d)))
        ax.set_xticklabels([t.replace("-k5-n10", "") for t in d.task_id], rotation=60,
                           ha="right", fontsize=7)
        ax.set_ylabel("real seconds to target")
        ax.set_title(f"target {q:g}·L_0, T_max = 40 (seconds = steps × the task's median "
                     "s/step at that B)", fontsize=9)
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def verify_report(path: pathlib.Path, out: pathlib.Path) -> None:
    """Fine-tune the suggestion and the grid's best of a default-task ``ntk-tt suggest`` report."""
    import jax

    import ntk_tt
    from ntk_tt._defaults import SUGGEST_DEFAULTS
    from ntk_tt.prediction._job import load_task

    r = json.loads(path.read_text())
    o = SUGGEST_DEFAULTS | r["config"]
    apply_fn, params, x, y, _, _, info, _ = load_task(
        **{k: o[k] for k in ("checkpoint", "dataset", "data_dir", "split", "num_classes",
                             "per_class", "seed", "resize", "head_scale")}, test_per_class=0)
    key = jax.random.fold_in(jax.random.key(o["seed"]), 2)  # as suggest_task
    n, target, steps = info["n_train"], r["target"]["loss"], r["target"]["steps_max"]
    res = {"report": str(path), "target": target, "steps_max": steps}
    for name, cfg in (("suggestion", r["suggestion"]), ("grid_best", r["grid_best"])):
        b = None if cfg["batch_size"] in (None, n) else int(cfg["batch_size"])
        run = ntk_tt.finetune(apply_fn, params, x, y, learning_rate=cfg["learning_rate"],
                              steps=steps, batch_size=b, momentum=cfg["momentum"], key=key)
        res[name] = dict(batch_size=b or n, momentum=cfg["momentum"],
                         learning_rate=cfg["learning_rate"], kappa=cfg["kappa"],
                         predicted_steps=cfg["steps"], real_steps=first_hit(run.loss, target),
                         real_diverged=run.diverged, real_spiked_at=run.spiked_at,
                         real_seconds_per_step=run.seconds_per_step,
                         real_final_loss=float(run.loss[-1]))
        print(name, json.dumps(res[name]), flush=True)
    (out / "default_task.json").write_text(json.dumps(res, indent=1))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", type=pathlib.Path)
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--fractions", default="0.5", help="target fractions of L_0, comma-separated")
    p.add_argument("--per-class", type=int, default=10)
    p.add_argument("--num-paths", type=int, default=8)
    p.add_argument("--tasks", nargs="*", help="only these task ids")
    p.add_argument("--kappa-eff-max", type=float, default=None,
                   help="suggest's cap on the effective κ̃ = κ/(1 − m) (default: none)")
    p.add_argument("--backbone", choices=("isotropic", "diagonal", "subspace"), default=None,
                   help="suggest's head-aware feature kernel (default: suggest's own)")
    p.add_argument("--replot", action="store_true",
                   help="only redraw the figure from --out's CSV and runs.json")
    p.add_argument("--verify-report", type=pathlib.Path,
                   help="only fine-tune the suggestion and grid best of this ntk-tt suggest "
                   "--json report (default task options)")
    args = p.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        fail(p, f"--out {args.out} is a file; give a folder.")
    if args.verify_report and not args.verify_report.is_file():  # a FileNotFoundError
        fail(p, f"--verify-report {args.verify_report}: no such file (an ntk-tt suggest "
                "--json report).")
    if args.replot and not (args.out / "suggest_check.csv").is_file():
        fail(p, f"--replot reads {args.out / 'suggest_check.csv'}, which does not exist: run "
                "without --replot first.")
    if args.verify_report:
        args.out.mkdir(parents=True, exist_ok=True)
        verify_report(args.verify_report, args.out)
        return 0
    if args.replot:
        import pandas as pd

        figure(pd.read_csv(args.out / "suggest_check.csv"), args.out / "suggest_check.png")
        return 0
    if args.corpus is None:
        p.exit(2, f"{p.prog}: error: give --corpus DIR (or --replot / --verify-report)\n")
    if not (args.corpus / "invocations.json").exists():
        p.exit(2, f"{p.prog}: error: {args.corpus} is not finished (no invocations.json)\n")
    import pandas as pd

    spec = load_spec(args.corpus)
    tasks = [t for t in spec.tasks() if t.per_class == args.per_class
             and (not args.tasks or t.id in args.tasks)]
    # a fresh user's --per-class 7 wrote an empty table then failed in pandas; --num-paths 0,
    # --fractions 1.5 and --kappa-eff-max -1 were library tracebacks after --out was made
    if not tasks:
        fail(p, f"no task of {args.corpus} has --per-class {args.per_class}"
                + (f" and --tasks {args.tasks}" if args.tasks else "") + ": pick one it holds "
                f"({sorted({t.per_class for t in spec.tasks()})}).")
    try:
        fractions = [float(f) for f in args.fractions.split(",")]
    except ValueError:
        fractions = [math.nan]
    if not all(0 < q < 1 for q in fractions):
        fail(p, f"--fractions takes numbers in (0, 1) (targets q·L_0), got {args.fractions!r}.")
    at_least(p, "--num-paths", args.num_paths, 1, integer=True)
    if args.kappa_eff_max is not None:
        positive(p, "--kappa-eff-max", args.kappa_eff_max)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    recs, curves = [], []
    for task in tasks:
        for rec, cv in check_task(task, spec, args.corpus, fractions, args.num_paths,
                                  args.kappa_eff_max, args.backbone):
            recs.append(rec)
            curves.append(cv)
    df = pd.DataFrame(recs)
    df.to_csv(args.out / "suggest_check.csv", index=False)
    (args.out / "runs.json").write_text(json.dumps(curves, default=float))
    figure(df, args.out / "suggest_check.png")
    total = time.perf_counter() - t0
    for q, d in df.groupby("fraction"):
        ranks = d["rank"].dropna()
        miss = ((d.pred_steps - d.real_steps).abs() / d.real_steps).dropna()
        print(f"q={q:g}: steps to target |pred − real|/real median {miss.median():.3g}, max "
              f"{miss.max():.3g} (n = {len(miss)})")
        print(f"q={q:g}: tasks {len(d)}, rank 1 in {int((ranks == 1).sum())}, median rank "
              f"{ranks.median() if len(ranks) else float('nan'):g} of "
              f"{d.ranked.median():g}, median ratio {d.ratio.median():.3g}, max ratio "
              f"{d.ratio.max():.3g}, missed {int(d['rank'].isna().sum())}; pred-grid median "
              f"ratio {d.predgrid_ratio.median():.3g}")
    print(f"total {total:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
