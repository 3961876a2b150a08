"""Optimiser benchmark (issue 27 item 5): SGD-momentum + warmup-cosine + weight decay and
AdamW + warmup-cosine, predicted vs real, on the constant-η sweep's tasks.

Grid (``--preset full``): the four shared target sets × 50 and 150 images per class (K = 5:
N = 250, 750) × {sgdm_cosine: κ̃ ∈ {1, 4, 12}, m = 0.9, λ ∈ {0, 5e-4}; adamw_cosine: peak
η ∈ {1e-4, 3e-4, 1e-3}, λ ∈ {0.01, 0.1}} × B ∈ {N (GD), 50}, T = 150, warmup 15 steps, cosine
to 0 at T (``ntk_tt.sweep._optimizers``). Every row is written when it is done; rerunning
the same command resumes. ``--report`` only rebuilds ``summary.json`` and the figure from the
table (with ``--constant DIR``: the constant-η sweep's results on the same tasks beside it).

    python experiments/optimizer_sweep.py --out runs/optimizers                 # full
    python experiments/optimizer_sweep.py --out runs/optimizers --per-class 50  # N = 250 only
    python experiments/optimizer_sweep.py --out runs/optimizers --report \\
        --constant experiments/results/sweep
    python experiments/optimizer_sweep.py --out /tmp/o --preset smoke           # minutes
    python experiments/optimizer_sweep.py --out runs/optimizers_v2 --per-class 50 \\
        --reuse-real runs/optimizers        # new predictions, the earlier real runs
    python experiments/optimizer_sweep.py --out runs/o750 --per-class 150 \\
        --families adamw_cosine             # one family only (or both, in the order given)
    python experiments/optimizer_sweep.py --out runs/peaks --per-class 50 \\
        --families adamw_cosine --adam-peaks 1.5e-4 2e-4 5e-4 --adam-decays 0.01
    python experiments/optimizer_sweep.py --out runs/sub --backbone subspace \\
        --reuse-real experiments/results/optimizers   # N = 250 rows, both families
    python experiments/optimizer_sweep.py --out runs/unseen --per-class 50 --seeds 1 \\
        --families sgdm_cosine           # tasks of another seed: other classes, images, head

``--reuse-real DIR``: a row of DIR (``DIR/rows`` or ``DIR/results.parquet``) with the same row
id and the same training (T, peak η, λ) supplies the real curves, so only the predictions are
recomputed (rows record ``real_source``); the fine-tune seconds of the cost ratio are its
training steps timed again in this run (``ntk_tt.step_time`` × T, 6 warm steps a row; rows
record ``finetune_timing`` and the earlier ``seconds_finetune_recorded``).

Ctrl-C (SIGTERM) ends it with one ``optimizer_sweep.py: interrupted`` (``terminated
(SIGTERM)``) line saying how many finished rows are kept, exit status 130 (143); while it
starts (imports, argument checks), ``... while starting; nothing was written``; a row file
damaged from outside is one error line naming it.

Every option is checked before anything is written (the datasets loaded, ``--out`` a
directory or missing, its ``spec.json`` the same grid): an error is one
``optimizer_sweep.py: error:`` line, exit status 2.
"""

from __future__ import annotations

from ntk_tt.cli import guard_starting  # the standard library only: before the heavy imports

_STARTING = guard_starting("optimizer_sweep.py", __name__ == "__main__")

import argparse  # noqa: E402  (after the handler: these imports take the first seconds)
import dataclasses  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from ntk_tt._cli_script import run_guarded  # noqa: E402
from ntk_tt.cli import _STOPPED, exit_once  # noqa: E402
from ntk_tt.sweep._load import check_datasets  # noqa: E402
from ntk_tt.sweep._optimizers import (  # noqa: E402
    BENCH_BACKBONES,
    FAMILIES,
    OptimSpec,
    reusable_real,
    run_task,
)
from ntk_tt.sweep._optimizers_summary import summarize_optimizers  # noqa: E402
from ntk_tt.sweep._table import ResultsTable, check_out, read_rows, read_table  # noqa: E402

TARGETS = ("cifar10_test", "mnist_test", "notmnist", "flowers5_300pc")
PRESETS = {
    "full": OptimSpec(datasets=TARGETS, per_class=(50, 150)),
    # smoke: the vendored flowers5 set, N = 30, T = 20, one peak per family
    "smoke": OptimSpec(datasets=("flowers5",), per_class=(6,), batch_sizes=(None, 10),
                       steps=20, sgd_kappas=(4.0,), sgd_decays=(5e-4,), adam_peaks=(1e-3,),
                       adam_decays=(0.1,), num_paths=2),
}


def parse(argv=None) -> tuple[argparse.Namespace, OptimSpec]:
    from ntk_tt._cli_script import ScriptParser  # -1e-3 a value; one-line errors

    p = ScriptParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--out", required=True, help="results directory (created; resumed)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="full")
    p.add_argument("--datasets", nargs="+")
    p.add_argument("--per-class", nargs="+", type=int)
    p.add_argument("--seeds", nargs="+", type=int,
                   help="task seeds (default 0): another seed draws other classes, images and "
                        "head from the same sets, tasks nothing was built on")
    p.add_argument("--families", nargs="+", choices=FAMILIES,
                   help="optimiser families to run, in this order (default: all)")
    p.add_argument("--adam-peaks", nargs="+", type=float, metavar="ETA",
                   help="AdamW peak learning rates (default: the preset's; full: 1e-4 3e-4 "
                        "1e-3)")
    p.add_argument("--adam-decays", nargs="+", type=float, metavar="LAMBDA",
                   help="AdamW weight decays (default: the preset's; full: 0.01 0.1)")
    p.add_argument("--backbone", choices=BENCH_BACKBONES,
                   help="feature kernel of the predictions, both families (default "
                        "isotropic, the committed tables'; diagonal: k = 5, predict's default; "
                        "subspace: k = 16)")
    p.add_argument("--report", action="store_true", help="only rebuild summary and figure")
    p.add_argument("--constant", help="the constant-η sweep directory to compare with")
    p.add_argument("--reuse-real", metavar="DIR",
                   help="take the real runs of the identical rows of an earlier benchmark "
                        "directory; only the predictions are recomputed")
    args = p.parse_args(argv)
    args.reuse, args.grid = None, None
    try:  # every check before anything is written
        spec = _spec(args)  # OptimSpec checks its grid
        if args.constant and not (pathlib.Path(args.constant) / "results.parquet").exists():
            raise ValueError(f"--constant {args.constant!r} holds no results.parquet (a sweep "
                             "directory, e.g. experiments/results/sweep)")
        check_out(args.out)
        read_rows(pathlib.Path(args.out) / "rows")  # a damaged row file: named before any work
        if not args.report:
            check_datasets(spec.datasets, spec.per_class, spec.classes)
            args.grid = _grid(spec, pathlib.Path(args.out))
            if args.reuse_real:
                try:
                    args.reuse = reusable_real(args.reuse_real)
                except ValueError as err:
                    raise ValueError(f"--reuse-real: {err}") from None
    except ValueError as err:
        p.exit(2, f"{p.prog}: error: {err}\n")  # one line, no usage block
    return args, spec


def _spec(args: argparse.Namespace) -> OptimSpec:
    """The preset with the command line's datasets, families and sizes.

    Raises:
      ValueError: a --per-class value < 2 (or another grid that OptimSpec refuses).
    """
    spec = PRESETS[args.preset]
    if args.datasets:
        spec = dataclasses.replace(spec, datasets=tuple(args.datasets))
    if args.families:
        twice = sorted({f for f in args.families if args.families.count(f) > 1})
        if twice:
            raise ValueError(f"--families names {', '.join(twice)} twice; give each once.")
        spec = dataclasses.replace(spec, families=tuple(args.families))
    if args.backbone:
        if args.report:
            raise ValueError("--backbone sets the predictions to run; --report only reports "
                             "the rows already there: drop it")
        spec = dataclasses.replace(spec, backbone=args.backbone)
    flags = [f"--{n.replace('_', '-')}" for n in ("adam_peaks", "adam_decays")
             if getattr(args, n)]
    given = [f"--{n.replace('_', '-')}" for n in ("datasets", "seeds", "per_class",
                                                  "reuse_real") if getattr(args, n)]
    if given and args.report:  # a third probe: these were ignored there without a word
        raise ValueError(f"{' and '.join(given)} set what to run; --report only reports the "
                         "rows already there: drop them")
    if flags and args.report:
        raise ValueError(f"{' and '.join(flags)} set the grid to run; --report only reports "
                         "the rows already there: drop them")
    if flags and args.families and "adamw_cosine" not in args.families:
        raise ValueError(f"{' and '.join(flags)} set the AdamW grid, which --families "
                         f"{' '.join(args.families)} does not run: add adamw_cosine or drop them")
    for name in ("adam_peaks", "adam_decays"):
        if getattr(args, name):
            spec = dataclasses.replace(spec, **{name: tuple(getattr(args, name))})
    if args.seeds:
        if any(not 0 <= v < 2**32 for v in args.seeds) or len(set(args.seeds)) != len(
                args.seeds):  # jax.random.key(2**32) is key(0): the same tasks again
            raise ValueError(f"--seeds must be distinct integers in [0, 2**32), got "
                             f"{args.seeds}")
        spec = dataclasses.replace(spec, seeds=tuple(args.seeds))
    if args.per_class:
        if any(n < 2 for n in args.per_class):
            raise ValueError(f"--per-class values must be integers >= 2, got {args.per_class}")
        spec = dataclasses.replace(spec, per_class=tuple(args.per_class))
    return spec


def _grid(spec: OptimSpec, out: pathlib.Path) -> dict:
    """The grid to record in ``out/spec.json``: one directory may gather tasks run at
    different times (--datasets, --per-class), whose rows' keys name their task, so the task
    fields are the union with the recorded ones; every other setting must be the same.

    Raises:
      ValueError: ``out/spec.json`` records another grid (or is not readable JSON).
    """
    grid, spec_path = json.loads(json.dumps(dataclasses.asdict(spec))), out / "spec.json"
    tasks_keys = ("datasets", "per_class", "seeds")
    if not spec_path.exists():
        return grid
    try:
        old = json.loads(spec_path.read_text())
        old.setdefault("families", list(FAMILIES))  # written before the option existed
        old.setdefault("backbone", "isotropic")  # the same
        if {k: v for k, v in old.items() if k not in tasks_keys} == \
                {k: v for k, v in grid.items() if k not in tasks_keys}:
            return grid | {k: sorted(set(old[k]) | set(grid[k])) for k in tasks_keys}
        differ = sorted(k for k in grid.keys() | old.keys()
                        if k not in tasks_keys and old.get(k) != grid.get(k))
    except (ValueError, AttributeError, KeyError, TypeError):  # not a grid's JSON object
        differ = []
    which = f" (it differs in {', '.join(differ)})" if differ else ""
    raise ValueError(f"{out} holds another grid ({spec_path}){which}; resume it with the same "
                     "options or choose a new --out.")


def _reused_rows(table: ResultsTable) -> int:
    return sum(r.get("real_source") == "reused" for r in read_rows(table.rows_dir))


def _planned(out: pathlib.Path, frame) -> dict:
    """``planned_rows`` of the grid ``out/spec.json`` records and ``missing_rows`` of them not
    in ``frame`` (empty without a readable spec.json): a stopped benchmark's report says so."""
    from ntk_tt.sweep._optimizers import row_id

    try:
        grid = json.loads((out / "spec.json").read_text())
        spec = OptimSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in grid.items()})
    except (OSError, ValueError, TypeError):
        return {}
    ids = {row_id(t, c) for t in spec.tasks() for c in spec.configs(t)}
    return {"planned_rows": len(ids), "missing_rows": len(ids - set(frame["row_id"]))}


def report(out: pathlib.Path, constant: str | None) -> dict:
    """Consolidate the rows, write ``summary.json`` (with ``planned_rows`` / ``missing_rows``
    of the recorded grid) and ``fig_optimizers.png``."""
    if not any((out / "rows").glob("*.json")) and not (out / "results.parquet").exists():
        print(f"optimizer_sweep.py: error: {out} holds no rows to report: run the benchmark "
              "there first (the same command without --report).", file=sys.stderr)
        sys.exit(2)
    stored = read_table(out) if (out / "results.parquet").exists() else None
    if any("family" not in r for r in read_rows(out / "rows")) or (
            stored is not None and "family" not in stored.columns):  # a KeyError, after a write
        raise ValueError(f"{out} holds rows without a 'family': a constant-η sweep's "
                         "(experiments/sweep.py --out DIR --report reports it), not this "
                         "benchmark's; nothing was written.")
    table = ResultsTable(out)
    table.consolidate()
    frame = read_table(out)
    summary = summarize_optimizers(frame, read_table(constant) if constant else None)
    summary |= _planned(out, frame)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    _figure(frame, out / "fig_optimizers.png")
    return summary


def _figure(frame, path: pathlib.Path) -> None:
    """Predicted (dashed) vs real (solid) loss curves: one panel per family of the table ×
    GD/SGD, the first task with rows there, every peak at the first weight decay."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = [f for f in FAMILIES if (frame["family"] == f).any()] or list(FAMILIES)
    fig, axes = plt.subplots(len(families), 2, figsize=(10, 3.5 * len(families)),
                             squeeze=False)
    for i, fam in enumerate(families):
        for j, opt in enumerate(("gd", "sgd")):
            ax, rows = axes[i][j], frame[(frame["family"] == fam) & (frame["optimizer"] == opt)]
            if not len(rows):
                ax.set_title(f"{fam}, {opt}: no rows")
                continue
            ax.set_title(f"{fam}, B = {'N' if opt == 'gd' else rows['batch_size'].iloc[0]}")
            task = rows["task_id"].iloc[0]
            rows = rows[(rows["task_id"] == task)
                        & (rows["weight_decay"] == rows["weight_decay"].min())]
            for k, (_, r) in enumerate(rows.sort_values("peak_setting").iterrows()):
                c = f"C{k}"
                ax.plot(r["real_loss"], c, label=f"peak {r['peak_learning_rate']:.2g} real")
                ax.plot(r["pred_loss"], c + "--", label="predicted")
            ax.set_xlabel(f"step ({task})")
            ax.set_ylabel("training loss")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    """Run (or resume, or with ``--report`` only report) the benchmark of the command line.
    Exit status 0 done, 2 bad input or a damaged row file (one ``optimizer_sweep.py: error:``
    line), 130 interrupted (Ctrl-C) or 143 terminated (SIGTERM, as batch schedulers send it):
    one line saying how many finished rows are kept. As the program (``argv`` None) the
    signals are handled by ``ntk-tt``'s guard (:func:`ntk_tt.cli._guard_interrupts`), which
    also ends a run whose interruption XLA swallowed."""
    args, spec = parse(argv)  # a signal until here: the starting line (nothing written)
    state = {"out": pathlib.Path(args.out)}
    try:
        run_guarded(lambda: _run(args, spec, state["out"]), state, _exit_stopped,
                    starting=_STARTING, is_program=argv is None)
    except ValueError as err:
        sys.stderr.write(f"optimizer_sweep.py: error: {err}\n")
        sys.exit(2)


def _exit_stopped(state: dict) -> None:
    """Say how many finished rows ``state["out"]`` keeps and end the process at once, status
    128 + the signal (:func:`ntk_tt.cli.exit_once`: the main thread or the guard's watcher,
    once)."""
    signum, out = state.get("signal", signal.SIGINT), state["out"]
    exit_once(signum, lambda: (
        f"\noptimizer_sweep.py: {_STOPPED.get(signum, 'interrupted')}; "
        f"{len(ResultsTable(out).row_ids())} finished row(s) kept in {out / 'rows'}: run the "
        "same command to resume"))


def _run(args, spec, out: pathlib.Path) -> None:
    if not args.report:
        table = ResultsTable(out)
        (out / "spec.json").write_text(json.dumps(args.grid, indent=1) + "\n")
        tasks = spec.tasks()
        total = sum(len(spec.configs(t)) for t in tasks)
        t0, written, present = time.perf_counter(), 0, len(table.done_ids())
        reused = -_reused_rows(table)
        with tqdm(total=total, initial=present, unit="row") as bar:
            for task in tasks:
                written += run_task(task, spec, table, progress=lambda _: bar.update(),
                                    reuse=args.reuse)
        reused += _reused_rows(table)  # this invocation's (a wrong --reuse-real: 0, said)
        print(json.dumps({"rows_written": written, "already_present": present,  # as sweep.py
                          "real_runs_reused": reused, "seconds": round(time.perf_counter() - t0)}))
    summary = report(out, args.constant)
    if summary.get("missing_rows"):  # a stopped benchmark, reported as it stands
        print(f"partial: {summary['missing_rows']} of the grid's {summary['planned_rows']} rows "
              "are not run yet; run the benchmark command again (without --report) to finish it")
    for fam, block in summary["families"].items():
        for opt in ("gd", "sgd"):
            s = block["t_eps_pooled_0.1_0.4"][opt]
            if s.get("n"):
                med = 100 * (np.nan if s["median_signed"] is None else s["median_signed"])
                print(f"{fam:13s} {opt.upper():3s} T_eps p95 {100 * s['p95']:.1f} % "
                      f"(n = {s['n']}), signed median {med:+.1f} %")
    for name, fam in summary["families"].items():
        cost = fam["cost"]
        if not cost.get("tasks"):  # a family this table has no rows of
            continue
        ratios = [cost.get(k, float("nan")) for k in (
            "per_task_median_ratio", "per_task_median_ratio_compile_excluded")]
        # below 0.05 (a smoke table's tiny fine-tunes) two significant digits, not "0.0x"
        ratios = [f"{r:.2g}" if r < 0.05 else f"{r:.1f}" for r in ratios]
        print(f"cost {name:12s}: fine-tune / predict per task sweep {ratios[0]}x (kernel "
              f"compilation included), {ratios[1]}x (excluded on both sides)")


if __name__ == "__main__":
    sys.exit(main())
