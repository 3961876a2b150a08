"""The evolving-kernel predictor against one segment, on real runs of the committed sweep.

    python experiments/evolving_check.py DATASET PER_CLASS CONFIG_ID [CONFIG_ID ...]
        [--segments 4] [--backbone kronecker] [--table experiments/results/sweep]

For the sweep task (DATASET, PER_CLASS, seed 0) and each configuration id (e.g.
``bN-m0-kappa12``, or ``b50-m0-kappa12`` for SGD), predicts with
``ntk_tt.predict_head_aware_refreshed`` at 1 and ``--segments`` segments and prints T_0.1,
T_0.4, L_T and the curve distance against the real curve stored in the results table (its η,
m and B are reused). One kernel per segment and configuration. SGD rows are predicted on one
path, the real run's batch order (the sweep's task key), so their one-segment prediction is
path 0, not the sweep's mean over paths.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from _args import at_least, fail  # experiments/_args.py, beside this script

import ntk_tt
from ntk_tt.prediction._head_aware_refresh import predict_head_aware_refreshed
from ntk_tt.sweep._grid import SweepSpec, Task
from ntk_tt.sweep._load import _task_key, load_task
from ntk_tt.sweep._table import read_table


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dataset")
    p.add_argument("per_class", type=int)
    p.add_argument("configs", nargs="+")
    p.add_argument("--segments", type=int, default=4)
    p.add_argument("--backbone", default="kronecker", choices=("isotropic", "kronecker", "exact"))
    p.add_argument("--table", default="experiments/results/sweep")
    a = p.parse_args(argv)
    # a fresh user's --segments 0 failed after the data and a first prediction, a config id
    # not in the table was a KeyError after the data loaded
    at_least(p, "--segments", a.segments, 1, integer=True)
    if not Path(a.table).is_dir():
        fail(p, f"--table {a.table}: no such folder (a sweep's output folder).")
    table = read_table(a.table).set_index("row_id")
    task = Task(a.dataset, a.per_class, 0)
    if missing := [c for c in a.configs if f"{task.id}__{c}" not in table.index]:
        fail(p, f"rows not in {a.table}: {', '.join(f'{task.id}__{c}' for c in missing)} "
                "(configuration ids such as bN-m0-kappa12 of a task it holds).")
    data = load_task(task, SweepSpec(datasets=(a.dataset,), per_class=(a.per_class,),
                                     seeds=(0,)))
    key = _task_key(task)

    def t(curve, eps):
        return ntk_tt.training_time(np.asarray(curve), eps)

    for cid in a.configs:
        row = table.loc[f"{task.id}__{cid}"]
        real = np.asarray(row.real_loss)
        line = f"{cid}: real T0.1 {t(real, .1):.0f} T0.4 {t(real, .4):.0f} L_T {real[-1]:.3f}"
        for seg in (1, a.segments):
            t0 = time.perf_counter()
            out = predict_head_aware_refreshed(
                data.split, data.x, data.y, segments=seg, learning_rate=row.learning_rate,
                momentum=row.momentum, steps=len(real) - 1, key=key, backbone=a.backbone,
                batch_size=None if row.optimizer == "gd" else int(row.batch_size))
            q = np.asarray(out.loss)
            dist = np.max(np.abs(q - real)) / (real[0] - real[-1])
            line += (f" | {seg} seg: T0.1 {t(q, .1):.0f} T0.4 {t(q, .4):.0f} L_T {q[-1]:.3f}"
                     f" dist {dist:.3f} ({time.perf_counter() - t0:.0f} s)")
        print(line, flush=True)


if __name__ == "__main__":
    main()
