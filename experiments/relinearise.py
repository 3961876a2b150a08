"""How often must the linearised model be refreshed to follow a real fine-tune? (issues 26, 27)

    python experiments/relinearise.py ROW_ID [ROW_ID ...] [--segments 1 8 32] [--head-aware]
        [--backbone isotropic] [--table experiments/results/optimizers] [--csv OUT.csv]

For each row of a committed benchmark table, an AdamW row of the optimiser benchmark (e.g.
``cifar10_test-k5-n50-s0__adamw_cosine-p0.001-wd0.01-bN``) or a constant-η row of the main
sweep (``--table experiments/results/sweep``, e.g. ``cifar10_test-k5-n50-s0__bN-m0-kappa4``),
the task is loaded as the sweep did and its optimiser rebuilt from the row (AdamW: warmup +
cosine to the row's peak, weight decay, B; constant: ``ntk_tt.sgd(η, m, batch_size=B)``), then
:func:`ntk_tt.linearised_reference` trains the network linearised at θ_0 and re-linearised at
its own weights K − 1 times (``segments`` K; K = T is real training), on the real run's batch
order (the sweep's task key): the exact weight-space ceiling of any predictor that
re-linearises along its own path K times. ``--head-aware`` (SGD-family rows only) also runs
the function-space predictor re-linearised along its own path,
``predict_head_aware_refreshed(..., segments=K, backbone=--backbone)`` (curve ``HA K=k``;
the default isotropic feature kernel, or ``kronecker``).
Prints T_0.1, T_0.4 and L_T of the real run, of the committed prediction (``fast``, from the
table) and of each K, with the seconds each took, then the p95 relative T_ε error of each
curve kind pooled over rows and ε ∈ {0.1, 0.4}.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
from _args import at_least, fail, output_file  # experiments/_args.py, beside this script

import ntk_tt
from ntk_tt.prediction._head_aware_refresh import predict_head_aware_refreshed
from ntk_tt.sweep._grid import SweepSpec, Task
from ntk_tt.sweep._load import _task_key, load_task
from ntk_tt.sweep._table import read_table

EPSILONS = (0.1, 0.4)


def optimizer_of(row) -> ntk_tt.Optimizer:
    """The optimiser of a row: a main-sweep row's constant-η SGD, an ``adamw_cosine`` row's
    AdamW (``ntk_tt.sweep._optimizers.OptimSpec.optimizer``)."""
    b = None if row.optimizer == "gd" else int(row.batch_size)
    if "family" not in row.index:  # the main sweep: constant η, heavy-ball m
        return ntk_tt.sgd(float(row.learning_rate), float(row.momentum), batch_size=b)
    if row.family != "adamw_cosine":
        raise SystemExit(f"relinearise.py: error: {row.name} is a {row.family} row; give "
                         "adamw_cosine rows or main-sweep rows.")
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
    p.add_argument("--head-aware", action="store_true",
                   help="also predict_head_aware_refreshed at each K (SGD-family rows)")
    p.add_argument("--backbone", default="isotropic", choices=("isotropic", "kronecker"),
                   help="--head-aware's feature kernel (default isotropic, the default's)")
    a = p.parse_args(argv)
    output_file(p, a.csv, "--csv")  # before the first row's kernels
    at_least(p, "--segments", a.segments, 1, integer=True)
    if not Path(a.table).is_dir():
        fail(p, f"--table {a.table}: no such folder (a sweep's output folder).")
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
        rho = (ntk_tt.weight_travel(opt.learning_rates(steps), data.split[1])
               if opt.rule == "adam" else float("nan"))  # ρ bounds Adam's travel only
        base = {"row_id": rid, "weight_travel": rho}
        for who, curve in (("real", row.real_loss), ("fast", row.pred_loss)):
            out.append(base | curve_row(who, curve, np.nan))
        for k in a.segments:
            t0 = time.perf_counter()
            ref = ntk_tt.linearised_reference(data.apply_fn, data.params, data.x, data.y, opt,
                                              steps=steps, key=_task_key(task), segments=k)
            out.append(base | curve_row(f"K={k}", ref.loss, time.perf_counter() - t0))
            if a.head_aware and opt.rule == "sgd":
                t0 = time.perf_counter()
                ha = predict_head_aware_refreshed(data.split, data.x, data.y, segments=k,
                                                  optimizer=opt, steps=steps,
                                                  key=_task_key(task), backbone=a.backbone)
                out.append(base | curve_row(f"HA K={k}", ha.loss, time.perf_counter() - t0))
        frame = pd.DataFrame([r for r in out if r["row_id"] == rid])
        print(f"{rid} (ρ = {rho:.3g})\n{frame.drop(columns=['row_id', 'weight_travel'])}",
              flush=True)
        if a.csv:  # after each row: an interrupted run keeps the rows done
            pd.DataFrame(out).to_csv(a.csv, index=False)
    print(p95_table(pd.DataFrame(out)))


def curve_row(name: str, loss, seconds: float) -> dict:
    """One output line: T_ε and L_T of a loss curve, and the seconds it took (NaN: stored)."""
    return {"curve": name, "seconds": seconds, "L_T": float(loss[-1]),
            **dict(zip([f"T{e}" for e in EPSILONS], times(loss), strict=True))}


def p95_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per curve kind (not ``real``): p95 and median of |T − T_real|/T_real pooled over rows and
    ε, with the pairs counted."""
    real = frame[frame["curve"] == "real"].set_index("row_id")
    lines = []
    for name, sub in frame[frame["curve"] != "real"].groupby("curve", sort=False):
        sub = sub.set_index("row_id")
        err = pd.concat([(sub[f"T{e}"] - real.loc[sub.index, f"T{e}"]).abs()
                         / real.loc[sub.index, f"T{e}"] for e in EPSILONS]).dropna()
        lines.append({"curve": name, "pairs": len(err), "p95": err.quantile(0.95),
                      "median": err.median(), "seconds": sub["seconds"].sum()})
    return pd.DataFrame(lines)


if __name__ == "__main__":
    main()
