"""How often must the linearised model be refreshed to follow a real AdamW fine-tune? (issue 27)

    python experiments/adam_relinearise.py ROW_ID [ROW_ID ...] [--segments 1 8 32]
        [--table experiments/results/optimizers] [--csv OUT.csv]

For each row of a committed optimiser-benchmark table (e.g.
``cifar10_test-k5-n50-s0__adamw_cosine-p0.001-wd0.01-bN``) the task is loaded as the sweep
did and its optimiser rebuilt from the row (warmup + cosine to the row's peak, weight decay,
B), then :func:`ntk_tt.linearised_reference` trains the network linearised at θ_0 and
re-linearised at its own weights K − 1 times (``segments`` K; K = T is real training), on the
real run's batch order (the sweep's task key). Prints T_0.1, T_0.4 and L_T of the real run, of
the fast predictor (both from the table) and of each K, with the seconds each K took: the
exact weight-space ceiling of any predictor that re-linearises along its own path K times.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

import ntk_tt
from ntk_tt.sweep._grid import SweepSpec, Task
from ntk_tt.sweep._load import _task_key, load_task
from ntk_tt.sweep._table import read_table

EPSILONS = (0.1, 0.4)


def optimizer_of(row) -> ntk_tt.Optimizer:
    """The AdamW of an ``adamw_cosine`` row (``ntk_tt.sweep._optimizers.OptimSpec.optimizer``)."""
    if row.family != "adamw_cosine":
        raise SystemExit(f"adam_relinearise.py: error: {row.name} is a {row.family} row; give "
                         "adamw_cosine rows.")
    b = None if row.optimizer == "gd" else int(row.batch_size)
    return ntk_tt.adamw(ntk_tt.warmup_cosine(float(row.peak_learning_rate), int(row.warmup),
                                             int(row.steps)),
                        weight_decay=float(row.weight_decay), batch_size=b)


def times(curve) -> list[float]:
    """T_0.1 and T_0.4 of a loss curve (steps)."""
    return [float(ntk_tt.training_time(np.asarray(curve), e)) for e in EPSILONS]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rows", nargs="+")
    p.add_argument("--segments", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--table", default="experiments/results/optimizers")
    p.add_argument("--csv", default=None)
    a = p.parse_args(argv)
    table = read_table(a.table).set_index("row_id")
    missing = [r for r in a.rows if r not in table.index]
    if missing:
        p.error(f"rows not in {a.table}: {', '.join(missing)}")
    out = []
    for rid in a.rows:
        row = table.loc[rid]
        opt = optimizer_of(row)
        task = Task(row.dataset, int(row.per_class), int(row.seed))
        data = load_task(task, SweepSpec(datasets=(task.dataset,), per_class=(task.per_class,),
                                         seeds=(task.seed,)))
        steps = int(row.steps)
        rho = ntk_tt.weight_travel(opt.learning_rates(steps), data.split[1])
        base = {"row_id": rid, "weight_travel": rho}
        for who, curve in (("real", row.real_loss), ("fast", row.pred_loss)):
            out.append(base | {"curve": who, "seconds": np.nan, "L_T": float(curve[-1]),
                               **dict(zip([f"T{e}" for e in EPSILONS], times(curve),
                                          strict=True))})
        for k in a.segments:
            t0 = time.perf_counter()
            ref = ntk_tt.linearised_reference(data.apply_fn, data.params, data.x, data.y, opt,
                                              steps=steps, key=_task_key(task), segments=k)
            out.append(base | {"curve": f"K={k}", "seconds": time.perf_counter() - t0,
                               "L_T": float(ref.loss[-1]),
                               **dict(zip([f"T{e}" for e in EPSILONS], times(ref.loss),
                                          strict=True))})
        frame = pd.DataFrame([r for r in out if r["row_id"] == rid])
        print(f"{rid} (ρ = {rho:.3g})\n{frame.drop(columns=['row_id', 'weight_travel'])}",
              flush=True)
    if a.csv:
        pd.DataFrame(out).to_csv(a.csv, index=False)


if __name__ == "__main__":
    main()
