"""Benchmark sweep: predicted vs real training time over a grid of tasks and optimisers.

    python experiments/sweep.py --out DIR [--preset smoke|session|full] [--smoke] [grid options]
    python experiments/sweep.py --out DIR --report     # rebuild figures + summary from the table

Resumable: rerunning the same command skips every finished row (one crash-safe file per row in
DIR/rows). At the end the rows are gathered into DIR/results.parquet, and DIR/summary.json,
Table 1 (table1.csv) and the figures (fig1/2/5/6 PNG) are written from that table alone.
Presets: ``smoke`` (one task of 20 images, GD and B = 10, m ∈ {0, 0.9} at one κ̃, 10 steps: the
test's run), ``session`` (the grid run in the first session, sized for ~30 min on 2 shared CPU
cores: small tasks, B = 25), ``full`` (the grid committed for issue 5: 4 target sets ×
{10, 50, 150} per class, ~90 min), ``paper`` (the issue's whole protocol with three seeds and
125 per class: many hours on 2 cores).
Learning rates are effective κ̃ = η·λ_max(Θ)/(N·(1 − m)) values (see ntk_tt.sweep).
``--datasets`` takes short names or .npz paths; every one is loaded and checked before any
work. Every option is checked before anything is written: learning rates finite and > 0,
batch sizes N or integers >= 1, momenta in [0, 1), steps >= 1, ``--out`` a directory (or
missing) whose ``spec.json``, if any, records the same grid; grid values distinct (they name
the rows); a batch size below N = 5 × the largest per-class (else no task runs it); every
dataset's images ones the checkpoint's model takes. An error is one ``sweep.py: error:`` line,
exit status 2. Ctrl-C or SIGTERM ends the sweep with one ``sweep.py: interrupted`` (or
``terminated``) line naming the finished rows kept, exit status 130 (143); the same command
resumes.
"""

from __future__ import annotations

import signal

from ntk_tt.cli import guard_starting  # the standard library only: before the heavy imports

_STARTING = guard_starting("sweep.py", __name__ == "__main__")

import argparse  # noqa: E402  (after the handler: these imports take the first seconds)
import dataclasses  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402

from ntk_tt._cli_script import ScriptParser  # noqa: E402
from ntk_tt.cli import _STOPPED, _caused_by_interrupt, _guard_interrupts, exit_once  # noqa: E402
from ntk_tt.data._checkpoint import read_meta  # noqa: E402
from ntk_tt.sweep import SweepSpec  # noqa: E402
from ntk_tt.sweep._grid import check_batch_below_n  # noqa: E402
from ntk_tt.sweep._load import check_datasets  # noqa: E402
from ntk_tt.sweep._predictions import variant_names  # noqa: E402
from ntk_tt.sweep._run import check_resume, report, run_sweep  # noqa: E402
from ntk_tt.sweep._table import TABLE_NAME, check_out  # noqa: E402

TARGETS = ("cifar10_test", "mnist_test", "notmnist", "flowers5_300pc")
PRESETS = {
    # smoke: the vendored flowers5 set only, so the test suite runs without ../shared; one
    # task (its two batch sizes are the two groups that a kill between them leaves half done)
    "smoke": SweepSpec(datasets=("flowers5",), per_class=(4,), seeds=(0,),
                       batch_sizes=(None, 10), kappas=(4.0,), steps=10, sketch_dims=(32,)),
    "session": SweepSpec(datasets=TARGETS, per_class=(6, 10), seeds=(0,),
                         batch_sizes=(None, 25), kappas=(1.0, 4.0, 12.0), steps=150,
                         sketch_dims=(256,), noise_dim=64),
    # full: the grid run for issue 5, sized to finish in <= 90 min on 2 CPU cores (the
    # paper's task size 5 x 150 plus dataset sizes 10 and 50 per class, one task per size)
    # edge rows (issue 26): κ̃ ∈ {16, 24, 32, 48, 96} × m ∈ {0, 0.9} × (GD, B = 50) on every
    # task, N = 750 included: 200 rows, ~1.5 h of real fine-tuning more (README "Benchmark sweep")
    "full": SweepSpec(datasets=TARGETS, per_class=(150, 50, 10), seeds=(0,),
                      batch_sizes=(None, 50, 100), kappas=(1.0, 4.0, 12.0), steps=150,
                      sketch_dims=(256,), noise_dim=64, num_paths=8,
                      edge_kappas=(16.0, 24.0, 32.0, 48.0, 96.0), edge_momenta=(0.0, 0.9),
                      edge_batch_sizes=(None, 50)),
    # paper: the whole protocol (sizes 10/50/125/150, three seeds): many hours here
    "paper": SweepSpec(datasets=TARGETS, per_class=(10, 50, 125, 150), seeds=(0, 1, 2),
                       batch_sizes=(None, 50, 100), kappas=(1.0, 4.0, 12.0), steps=150,
                       sketch_dims=(256, 1024), noise_dim=256),
}


def batch_size(value: str) -> int | None:
    """A ``--batch-sizes`` / ``--edge-batch-sizes`` entry: N (or gd, none; full-batch GD) →
    None, an integer → itself (the grid refuses one < 1, naming the flag)."""
    if value.lower() in ("n", "gd", "none"):
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a batch size: give N (full-batch "
                                         "GD) or an integer >= 1, e.g. N 10") from None


def parse(argv=None) -> tuple[argparse.Namespace, SweepSpec]:
    """The command line's options and grid, every check made before anything is written.

    Raises:
      SystemExit: status 2 with one ``sweep.py: error:`` line for any bad option or dataset.
    """
    p = ScriptParser(description=__doc__.splitlines()[0])  # one-line errors, no abbreviations
    p.add_argument("--out", required=True, help="sweep directory (created; resumed if present)")
    p.add_argument("--preset", choices=sorted(PRESETS), help="the grid (default: session)")
    p.add_argument("--smoke", action="store_true", help="same as --preset smoke")
    p.add_argument("--report", action="store_true", help="only rebuild summary and figures")
    p.add_argument("--primary", nargs=2, metavar=("VARIANT", "DEMOTED"),
                   help="report the recorded variant VARIANT as the primary prediction, the "
                        "sweep's primary as variant DEMOTED (a relabelling of stored columns)")
    p.add_argument("--datasets", nargs="+")
    p.add_argument("--per-class", nargs="+", type=int)
    p.add_argument("--seeds", nargs="+", type=int)
    p.add_argument("--batch-sizes", nargs="+", type=batch_size, help="N (= GD) or integers")
    p.add_argument("--momenta", nargs="+", type=float)
    p.add_argument("--kappas", nargs="+", type=float, help="effective κ̃ values")
    p.add_argument("--etas", nargs="+", type=float,
                   help="fixed learning rates η: rows beside those of --kappas when both are "
                        "given; alone, in place of the preset's κ̃ rows")
    p.add_argument("--steps", type=int)
    p.add_argument("--sketch-dims", nargs="+", type=int)
    p.add_argument("--checkpoint", help="pre-trained checkpoint (default: the shipped one)")
    p.add_argument("--edge-kappas", nargs="+", type=float,
                   help="extra κ̃ values at/past the stability edge (the divergence benchmark)")
    p.add_argument("--edge-momenta", nargs="+", type=float,
                   help="momenta of the edge rows (default 0)")
    p.add_argument("--edge-batch-sizes", nargs="+", type=batch_size,
                   help="batch sizes of the edge rows, N (= GD) or integers (default: "
                        "--batch-sizes)")
    p.add_argument("--reuse-real", metavar="DIR",
                   help="reuse the identical real fine-tunes of the sweep in DIR (same task, "
                        "configuration and η); only the predictions are recomputed")
    p.add_argument("--reuse-predictions", metavar="DIR",
                   help="reuse the variants' identical predictions of the sweep in DIR (same "
                        "task, configuration, η and variant label); the primary and any "
                        "variant DIR lacks are computed")
    args = p.parse_args(argv)
    if args.smoke and args.preset not in (None, "smoke"):
        _error(p, f"--smoke is --preset smoke; it cannot be combined with --preset "
                  f"{args.preset} (give one of them).")
    spec = PRESETS["smoke" if args.smoke else args.preset or "session"]
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(SweepSpec)
                 if getattr(args, f.name, None) is not None}
    overrides = {k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()}
    if "etas" in overrides and "kappas" not in overrides:  # --etas 0.01 ran the κ̃ rows too
        overrides["kappas"] = ()
    try:  # every check before anything is written
        spec = dataclasses.replace(spec, **overrides)  # SweepSpec checks its grid
        unused = [f"--{f}" for f in ("edge-momenta", "edge-batch-sizes")
                  if getattr(args, f.replace("-", "_")) is not None]
        if unused and not spec.edge_kappas:
            raise ValueError(f"{' and '.join(unused)} set the edge rows' grid, but this grid "
                             "has no edge rows: add --edge-kappas (e.g. --edge-kappas 24 48 "
                             "96) or drop them.")
        check_out(args.out)
        out = pathlib.Path(args.out)
        grid = [f"--{k.replace('_', '-')}" for k, v in vars(args).items()
                if v not in (None, False)
                and k not in ("out", "report", "primary", "preset", "smoke")]
        if args.report and grid:  # a fresh user's --report --kappas 1 reported every κ̃
            raise ValueError(f"{' and '.join(grid)} set the grid to run; --report only "
                             "rebuilds the summary of the rows already there: drop "
                             f"{'it' if len(grid) == 1 else 'them'}.")
        if args.report and not ((out / TABLE_NAME).exists() or any(out.glob("rows/*.json"))):
            raise ValueError(f"--report rebuilds an existing sweep's summary: {args.out!r} "
                             f"holds no {TABLE_NAME} and no rows/ (run the sweep first).")
        if spec.checkpoint and not pathlib.Path(spec.checkpoint).expanduser().is_dir():
            raise ValueError(f"checkpoint not found: {spec.checkpoint!r} (pass the directory "
                             "written by experiments/pretrain.py or ntk_tt.save_checkpoint).")
        if args.primary and not args.report and args.primary[0] not in variant_names(spec):
            raise ValueError(f"--primary {args.primary[0]!r} is not a variant this sweep "
                             f"records; it records {list(variant_names(spec))}.")
        if not args.report:
            check_batch_below_n(spec)
            check_datasets(spec.datasets, spec.per_class, spec.classes,
                           meta=read_meta(spec.checkpoint)[1])  # no weight read
            check_resume(spec, args.out)
            for flag, where in (("--reuse-real", args.reuse_real),
                                ("--reuse-predictions", args.reuse_predictions)):
                if where and not (pathlib.Path(where) / TABLE_NAME).exists():
                    raise ValueError(f"{flag} {where!r} holds no {TABLE_NAME} (a sweep "
                                     "directory, e.g. experiments/results/sweep).")
    except ValueError as err:
        _error(p, str(err))
    return args, spec


def _error(parser: argparse.ArgumentParser, message: str) -> None:
    parser.exit(2, f"{parser.prog}: error: {message}\n")  # one line, no usage block


def _pct(value) -> str:
    return "n/a" if value is None else f"{value:+.1%}"


def _share(value) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _headline(summary: dict) -> str:
    lines = [f"{summary['rows']} rows, {summary['tasks']} tasks, "
             f"{summary.get('sweep_wall_seconds', 0):.0f} s of sweep wall time"]
    if summary.get("missing_rows"):  # a killed sweep, reported as it stands
        lines.append(f"partial: {summary['missing_rows']} of the grid's "
                     f"{summary['planned_rows']} rows are not run yet; run the sweep command "
                     "again (without --report) to finish it")
    for opt in ("gd", "sgd"):
        block = summary["headline"]["all"][opt].get("pooled_0.1_0.4", {})
        names = ("ntk", *[v for v in ("linear", "head_aware_kronecker", "head_aware_iso",
                                      "traced") if v in block],
                 "line", "median_other_tasks")
        for name in names:
            s = block.get(name, {})
            if s.get("n"):
                lines.append(f"{opt.upper():3s} {name:19s} p95 |err| {s['p95']:.1%} "
                             f"(CI {s['p95_ci95'][0]:.1%}–{s['p95_ci95'][1]:.1%}), within 13 %: "
                             f"{s['within_13pct']:.0%}, 20 %: {s['within_20pct']:.0%}, "
                             f"signed median {_pct(s['median_signed'])}  (n = {s['n']})")
    targets = summary.get("absolute_targets", {})
    for block, what in (("headline", "loss <= q·L_0"), ("headline_error", "training error")):
        for opt in ("gd", "sgd"):
            s = targets.get(block, {}).get(opt, {})
            if s.get("n"):
                lines.append(f"{opt.upper():3s} steps to {what}: p95 |err| {s['p95']:.1%}, "
                             f"median {s['median_abs']:.1%}, reached-or-not agrees "
                             f"{s['reach_agreement']:.0%} (n = {s['n']} of {s['pairs']})")
    for opt, s in summary.get("error_curve_distance", {}).items():
        if s.get("n"):
            lines.append(f"{opt.upper():3s} training error curve: max_t |predicted - real| "
                         f"median {s['median']:.3f}, p95 {s['p95']:.3f}; final error "
                         f"predicted - real, median {s['final_median_signed']:+.3f} "
                         f"(n = {s['n']})")
    for name, r in summary.get("outcome", {}).get("divergence", {}).items():
        if r["recall"] is not None or r["precision"] is not None:
            lines.append(f"outcome {name:18s} real diverges {r['real_diverges']}, called "
                         f"{r['called_diverges']} (unknown {r['unknown']}): recall "
                         f"{_share(r['recall'])}, precision {_share(r['precision'])}")
    for name, conf in summary.get("divergence", {}).get("confusion", {}).items():
        lines.append(f"divergence {name:15s} predicted/real yes-yes {conf['pred_yes_real_yes']}"
                     f", yes-no {conf['pred_yes_real_no']}, no-yes {conf['pred_no_real_yes']}, "
                     f"no-no {conf['pred_no_real_no']}")
    w = summary["wall_time"]
    lines.append(f"fine-tune / predict wall time: per configuration "
                 f"{w['per_config_median_ratio']:.1f}×, "
                 f"per task sweep {w['per_task_median_ratio']:.1f}× (each invocation's kernel "
                 f"counted), {w['per_task_median_ratio_kernel_once']:.1f}× (kernel once)")
    return "\n".join(lines)


def stopped_line(out, signum: int = signal.SIGINT) -> str:
    """The one line an interrupted sweep ends with: how many finished rows ``out/rows`` keeps
    (each written whole, atomically, so a resume skips them) and how to resume."""
    what = _STOPPED.get(signum, "interrupted")
    if out is None:
        return f"sweep.py: {what}; nothing was written"
    rows = pathlib.Path(out) / "rows"
    kept = sum(not p.name.startswith(".") for p in rows.glob("*.json"))
    if not kept:
        return f"sweep.py: {what} before any row was finished; run the same command to start"
    return (f"sweep.py: {what}; the {kept} finished row{'s are' if kept > 1 else ' is'} kept "
            f"in {rows}: run the same command to resume")


def _exit_interrupted(state: dict) -> None:
    """Write :func:`stopped_line` and end the process at once, status 128 + the signal
    (``os._exit``: JAX threads interrupted mid-work can crash the interpreter's teardown).
    Called by the main thread or the watcher of :func:`ntk_tt.cli._guard_interrupts`; the
    second waits (:func:`ntk_tt.cli.exit_once`)."""
    signum = state.get("signal", signal.SIGINT)
    exit_once(signum, lambda: stopped_line(state.get("out"), signum))


def main(argv=None) -> None:
    """Run (or resume, or with ``--report`` only report) the sweep of the command line.

    Exit status 0 done, 2 bad input (one ``sweep.py: error:`` line), 130 interrupted (Ctrl-C)
    and 143 terminated (SIGTERM): one line, :func:`stopped_line`. As the program (``argv``
    None) the signals are handled from here on (:func:`ntk_tt.cli._guard_interrupts`).

    Raises:
      SystemExit: with those statuses.
    """
    state: dict = {}
    if argv is None:  # ntk-tt's handling, ending in this script's line once --out is known
        for sig, default in _STARTING.items():  # the guard takes over default handlers only
            signal.signal(sig, default)
        _guard_interrupts(state, stop=_exit_interrupted, started=lambda st: "out" in st)
    try:
        _main(argv, state)
    except Exception as err:  # a KeyboardInterrupt inside XLA may come back wrapped
        if not _caused_by_interrupt(err):
            raise
        _stopped(argv, state)
    except KeyboardInterrupt:
        _stopped(argv, state)


def _stopped(argv, state: dict) -> None:
    if argv is None:
        _exit_interrupted(state)
    signum = state.get("signal", signal.SIGINT)
    print(stopped_line(state.get("out"), signum), file=sys.stderr)
    raise SystemExit(128 + signum) from None


def _main(argv, state: dict) -> None:
    args, spec = parse(argv)
    state["out"] = args.out

    def progress(message: str) -> None:
        print(message)
        # a Ctrl-C whose KeyboardInterrupt was dropped inside a callback (XLA's gc hook) is
        # honoured here, after the rows just written; the guard's watcher alone waits GRACE_S
        # and a sweep finishing sooner exited 0 as if never interrupted
        if "signal" in state:
            raise KeyboardInterrupt

    def summarise(counts: dict | None = None) -> None:
        if counts is not None:
            print(json.dumps(counts))
        try:  # --report with --primary: the table's variants are known only now
            summary = report(args.out, last_step=counts is not None,
                             primary=None if args.primary is None else tuple(args.primary))
        except ValueError as err:
            print(f"sweep.py: error: {err}", file=sys.stderr)
            raise SystemExit(2) from None
        print(_headline(summary))

    if args.report:
        summarise()
    else:  # the report is the invocation's last step: runs.json says finished once it is done
        run_sweep(spec, args.out, reuse_from=args.reuse_real,
                  reuse_predictions_from=args.reuse_predictions, progress=progress,
                  finish=summarise)


if __name__ == "__main__":
    main()
