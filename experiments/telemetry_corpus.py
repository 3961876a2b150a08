"""Telemetry corpus (issue 11): real fine-tunes with telemetry and their NTK predictions.

    python experiments/telemetry_corpus.py --out DIR [--preset full|smoke] [grid options]
    python experiments/telemetry_corpus.py --out DIR --pack FILE.jsonl.gz   # one file of rows

Resumable: rerunning the same command skips every finished run (one crash-safe JSON file per
run in DIR/runs). ``full``: every shared target set × {10, 50} images per class × {3, 2} task
seeds; GD and B = 10 (3 batch orders) at N = 50, B ∈ {25, 50} at N = 250; m ∈ {0, 0.9};
κ̃ ∈ {0.1, 0.3, 1, 3, 10, 30, 100, 300} (far below to past the divergence edge); T = 40
steps: 1,024 runs.
``smoke``: the vendored flowers5 set, 2 tiny tasks (the test's run). Every option is checked
before any work: the datasets loaded (distinct), the seeds distinct in [0, 2**32), ``--out``
a directory whose ``spec.json``, if any, records the same grid and whose run files are
whole; ``--pack`` a new file (``--overwrite`` replaces one) of a corpus folder with runs,
written whole or not at all. An error is one ``telemetry_corpus.py: error:`` line, exit
status 2. Ctrl-C (SIGTERM) ends it with one ``telemetry_corpus.py: interrupted``
(``terminated (SIGTERM)``) line saying how many finished runs are kept, exit status 130
(143); the same command resumes.
"""

from __future__ import annotations

from ntk_tt.cli import guard_starting  # the standard library only: before the heavy imports

_STARTING = guard_starting("telemetry_corpus.py", __name__ == "__main__")

import dataclasses  # noqa: E402  (after the handler: these imports take the first seconds)
import gzip  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pathlib  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

from ntk_tt._cli_script import ScriptParser, run_guarded  # noqa: E402
from ntk_tt.cli import _STOPPED, exit_once  # noqa: E402
from ntk_tt.sweep._corpus import CorpusSpec, run_corpus  # noqa: E402
from ntk_tt.sweep._corpus_files import check_corpus_resume, iter_runs  # noqa: E402
from ntk_tt.sweep._table import check_out  # noqa: E402

TARGETS = ("cifar10_test", "mnist_test", "notmnist", "flowers5_300pc")
PRESETS = {
    "full": CorpusSpec(datasets=TARGETS),
    "smoke": CorpusSpec(datasets=("flowers5",), per_class=(4,), seeds=(0,),
                        batch_sizes=((None, 5),), sgd_seeds=(1,), task_seeds=None,
                        momenta=(0.0,),
                        kappas=(1.0, 300.0), steps=6, test_per_class=4,
                        snapshot_steps=(0, 1, 3, 6), num_paths=2),
}
_GRID_FLAGS = ("preset", "datasets", "seeds", "steps")


def main(argv=None) -> int:
    """Run (or resume, or with ``--pack`` only pack) the corpus of the command line. Exit
    status 0 done, 2 bad input (one error line), 130 / 143 interrupted / terminated (one line
    naming the finished runs kept). As the program (``argv`` None) the signals are handled by
    ``ntk-tt``'s guard (:func:`ntk_tt.cli._guard_interrupts`)."""
    p = ScriptParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="corpus directory (created; resumed if present)")
    p.add_argument("--preset", choices=sorted(PRESETS), help="the grid (default: full)")
    p.add_argument("--datasets", nargs="+", help="short names or .npz paths")
    p.add_argument("--seeds", nargs="+", type=int, help="task seeds")
    p.add_argument("--steps", type=int)
    p.add_argument("--pack", metavar="FILE", help="only write DIR's runs into one JSON Lines "
                                                  "file (.gz: gzip-compressed; floats to 7 "
                                                  "significant digits)")
    p.add_argument("--overwrite", action="store_true", help="with --pack: replace FILE")
    args = p.parse_args(argv)
    try:
        if args.pack is not None:
            return _pack(args)
        if args.overwrite:
            raise ValueError("--overwrite replaces a --pack file; a corpus run resumes its "
                             "--out instead: drop it")
        over = {k: tuple(v) if isinstance(v, list) else v for k, v in
                dict(datasets=args.datasets, seeds=args.seeds, steps=args.steps).items()
                if v is not None}
        spec = dataclasses.replace(PRESETS[args.preset or "full"], **over)
        _check_datasets(spec)
        check_out(args.out)  # a file, or a folder that takes no new entry: one line, not later
        check_corpus_resume(spec, args.out)  # another grid, a damaged run file: before work
    except ValueError as err:  # the grid's own names for what the flags set
        said = str(err)
        for name in _GRID_FLAGS[1:]:
            said = said.replace(f"CorpusSpec.{name}", f"--{name}")
        p.exit(2, f"{p.prog}: error: {said}\n")
    state = {"out": pathlib.Path(args.out)}
    counts = run_guarded(lambda: run_corpus(spec, args.out, progress=lambda s: print(s,
                                                                                  flush=True)),
                         state, _exit_stopped, starting=_STARTING, is_program=argv is None)
    print(json.dumps(counts))
    return 0


def _exit_stopped(state: dict) -> None:
    """Say how many finished runs ``state["out"]/runs`` keeps (each file written whole) and
    end the process at once, status 128 + the signal (:func:`ntk_tt.cli.exit_once`)."""
    signum, runs = state.get("signal", signal.SIGINT), state["out"] / "runs"
    exit_once(signum, lambda: (
        f"\ntelemetry_corpus.py: {_STOPPED.get(signum, 'interrupted')}; "
        f"{sum(1 for _ in runs.glob('*.json'))} finished run(s) kept in {runs}: run the same "
        "command to resume"))


def _pack(args) -> int:
    """``--pack``: every run of ``--out`` into one new JSON Lines file, written to a temporary
    file beside it and renamed (a damaged run stops it with nothing written).

    Raises:
      ValueError: grid options given (packing reads runs, it runs none), an empty FILE or one
        in a missing folder, an existing FILE without ``--overwrite`` (the committed corpus
        was replaced by 4 runs), or ``--out`` holding no runs.
    """
    given = [f"--{f}" for f in _GRID_FLAGS if getattr(args, f) is not None]
    if given:
        raise ValueError(f"--pack only packs the runs of --out; {', '.join(given)} set a grid "
                         "to run: drop them")
    pack = pathlib.Path(args.pack)
    if not args.pack.strip() or pack.is_dir():
        raise ValueError(f"--pack {args.pack!r} is not a file path; give e.g. --pack "
                         "corpus.jsonl.gz")
    if not pack.parent.is_dir():
        raise ValueError(f"--pack {args.pack!r}: the folder {str(pack.parent)!r} does not "
                         "exist; create it or give another path")
    if pack.resolve().is_relative_to(pathlib.Path(args.out).resolve()):
        raise ValueError(f"--pack {args.pack!r} is inside --out {args.out!r}, whose runs it "
                         "reads (a pack in runs/ is read as a damaged run); give a path "
                         "outside it")
    if pack.exists() and not args.overwrite:
        raise ValueError(f"--pack {args.pack!r} exists; give a new path, or --overwrite to "
                         "replace it")
    if not any((pathlib.Path(args.out) / "runs").glob("*.json")):
        raise ValueError(f"--out {args.out!r} holds no runs (no {args.out}/runs/*.json): "
                         "run the corpus there first, without --pack")
    opener = gzip.open if args.pack.endswith(".gz") else open
    fd, tmp = tempfile.mkstemp(dir=pack.parent, prefix=f".{pack.name}.")
    os.close(fd)
    count = 0
    try:
        with opener(tmp, "wt", encoding="utf-8") as fh:
            for row in iter_runs(args.out):  # a damaged or foreign run file: named, and the
                # temporary file removed (nothing written)
                fh.write(json.dumps(_round(row), allow_nan=False) + "\n")
                count += 1
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's file is the owner's only (0600)
        os.replace(tmp, pack)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    print(f"{count} runs → {args.pack}")
    return 0


def _round(value):
    """Floats to 7 significant digits (the runs are float32: nothing is lost)."""
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_round(v) for v in value]
    if isinstance(value, float):
        return float(f"{value:.7g}")
    return value


def _check_datasets(spec: CorpusSpec) -> None:
    import numpy as np

    from ntk_tt.data._data import load_dataset
    from ntk_tt.sweep._load import _same_file

    need = max(spec.per_class) + spec.test_per_class
    seen = {}
    for name in spec.datasets:
        counts = np.bincount(np.asarray(load_dataset(name).labels))
        if int(np.sum(counts >= need)) < spec.classes:
            raise ValueError(f"dataset {name!r} has fewer than {spec.classes} classes with "
                             f"{need} images (train + held out); choose another dataset.")
        if (tag := _same_file(name)) in seen:
            raise ValueError(f"--datasets {seen[tag]!r} and {name!r} are the same dataset; "
                             "give it once.")
        seen[tag] = name


if __name__ == "__main__":
    sys.exit(main())
