"""Telemetry corpus (issue 11): real fine-tunes with telemetry and their NTK predictions.

    python experiments/telemetry_corpus.py --out DIR [--preset full|smoke] [grid options]
    python experiments/telemetry_corpus.py --out DIR --pack FILE.jsonl.gz   # one file of rows

Resumable: rerunning the same command skips every finished run (one crash-safe JSON file per
run in DIR/runs). ``full``: every shared target set × {10, 50} images per class × {3, 2} task
seeds; GD and B = 10 (3 batch orders) at N = 50, B ∈ {25, 50} at N = 250; m ∈ {0, 0.9};
κ̃ ∈ {0.1, 0.3, 1, 3, 10, 30, 100, 300} (far below to past the divergence edge); T = 40
steps: 1,024 runs.
``smoke``: the vendored flowers5 set, 2 tiny tasks (the test's run). Every dataset is loaded
and checked before any work (one ``telemetry_corpus.py: error:`` line, exit status 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import sys

from ntk_tt.sweep._corpus import CorpusSpec, iter_corpus, run_corpus
from ntk_tt.sweep._table import check_out

TARGETS = ("cifar10_test", "mnist_test", "notmnist", "flowers5_300pc")
PRESETS = {
    "full": CorpusSpec(datasets=TARGETS),
    "smoke": CorpusSpec(datasets=("flowers5",), per_class=(4,), seeds=(0,),
                        batch_sizes=((None, 5),), sgd_seeds=(1,), task_seeds=None,
                        momenta=(0.0,),
                        kappas=(1.0, 300.0), steps=6, test_per_class=4,
                        snapshot_steps=(0, 1, 3, 6), num_paths=2),
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="corpus directory (created; resumed if present)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="full")
    p.add_argument("--datasets", nargs="+", help="short names or .npz paths")
    p.add_argument("--seeds", nargs="+", type=int, help="task seeds")
    p.add_argument("--steps", type=int)
    p.add_argument("--pack", metavar="FILE", help="only write DIR's runs into one JSON Lines "
                                                  "file (.gz: gzip-compressed; floats to 7 "
                                                  "significant digits)")
    args = p.parse_args(argv)
    if args.pack:
        opener = gzip.open if args.pack.endswith(".gz") else open
        count = 0
        with opener(args.pack, "wt", encoding="utf-8") as fh:
            for row in iter_corpus(args.out):
                fh.write(json.dumps(_round(row), allow_nan=False) + "\n")
                count += 1
        print(f"{count} runs → {args.pack}")
        return 0
    over = {k: tuple(v) if isinstance(v, list) else v for k, v in
            dict(datasets=args.datasets, seeds=args.seeds, steps=args.steps).items()
            if v is not None}
    try:
        spec = dataclasses.replace(PRESETS[args.preset], **over)
        _check_datasets(spec)
        check_out(args.out)  # a file, or a folder that takes no new entry: one line, not later
    except ValueError as err:
        p.exit(2, f"{p.prog}: error: {err}\n")
    counts = run_corpus(spec, args.out, progress=lambda s: print(s, flush=True))
    print(json.dumps(counts))
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

    need = max(spec.per_class) + spec.test_per_class
    for name in spec.datasets:
        counts = np.bincount(np.asarray(load_dataset(name).labels))
        if int(np.sum(counts >= need)) < spec.classes:
            raise ValueError(f"dataset {name!r} has fewer than {spec.classes} classes with "
                             f"{need} images (train + held out); choose another dataset.")


if __name__ == "__main__":
    sys.exit(main())
