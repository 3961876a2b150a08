"""Cost of predicting one task's whole hyperparameter sweep vs running it, per kernel kind.

    python experiments/bench_cost.py [--dataset cifar10_test] [--per-class 150] [--csv PATH]

Side by side in one process, for one task of the sweep (5 classes × ``--per-class`` images,
the shipped checkpoint with a fresh head) and the 18 configurations of the ``full`` sweep
preset (GD, SGD B = 50 and 100; m ∈ {0, 0.9}; κ̃ ∈ {1, 4, 12}; T = 150; SGD averaged over the
preset's 8 minibatch orders):

* prediction = kernel (exact Θ, traced Θ, sketch D' = 256, or the head-aware kernel: the
  traced Θ and the backbone features, isotropic, the default predictor) + λ_max + the
  vmapped solves of all 18 configurations (``jit(vmap(predict_from_kernel))``, or
  ``predict_head_aware``);
* fine-tuning = Σ over configurations of T × the measured seconds per real training step at
  that batch size (``ntk_tt.step_time``: 5 warm optax steps), i.e. the training cost of the
  sweep, without its per-step evaluation.

Compilation is excluded on both sides (every timed call runs once untimed first). The T_ε
accuracy of each kernel kind over many tasks is in the sweep's summary (``var_traced``,
``var_sketch256`` beside the exact kernel). Defaults read ``../shared/data``; ``--dataset
flowers5`` runs from the repository alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import pandas as pd
from _args import at_least, fail, output_file  # experiments/_args.py, beside this script
from sweep import PRESETS  # experiments/sweep.py, beside this script

import ntk_tt
from ntk_tt.dynamics._fspace import top_eigenvalue
from ntk_tt.kernels._head_aware import head_aware_kernel
from ntk_tt.sweep._grid import Task, plan
from ntk_tt.sweep._load import _task_key, load_task
from ntk_tt.sweep._predictions import _hyper, _predict_group

SKETCH_DIM = 256


def _best(fn, repeats=2):
    """Seconds of the fastest of ``repeats`` warm calls (one untimed call compiles)."""
    out = jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return out, min(times)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="cifar10_test")
    p.add_argument("--per-class", type=int, default=150)
    p.add_argument("--csv", help="also write the table here")
    a = p.parse_args(argv)
    output_file(p, a.csv, "--csv")  # before the kernels and the fine-tunes
    if a.dataset not in ntk_tt.known_datasets():
        fail(p, f"--dataset {a.dataset}: not a target set here; known: "
                f"{', '.join(ntk_tt.known_datasets())}.")
    at_least(p, "--per-class", a.per_class, 1, integer=True)
    # the full preset's grid, paths and steps on this one task (its edge κ̃ rows need
    # N <= 250, so a task of 5 x 150 has the 18 configurations)
    spec = dataclasses.replace(PRESETS["full"], datasets=(a.dataset,),
                               per_class=(a.per_class,), seeds=(0,))
    task = Task(a.dataset, a.per_class, 0)
    data = load_task(task, spec)
    n = data.x.shape[0]
    c = int(data.apply_fn(data.params, data.x[:1]).shape[-1])
    key = _task_key(task)
    kernels = {
        "exact": lambda: ntk_tt.empirical_ntk(data.apply_fn, data.params, data.x),
        "traced": lambda: ntk_tt.empirical_ntk(data.apply_fn, data.params, data.x,
                                               trace_logits=True),
        f"sketch{SKETCH_DIM}": lambda: ntk_tt.sketched_ntk(
            data.apply_fn, data.params, data.x, sketch_dim=SKETCH_DIM, key=key).kernel,
    }
    def head_aware():
        traced = kernels["traced"]()
        return traced, head_aware_kernel(data.split, data.x, traced_kernel=traced)

    kernels["head_aware"] = head_aware
    f0 = data.apply_fn(data.params, data.x)
    configs = plan(spec)[0][0][1]  # SGD with B >= N skipped, as in the sweep
    groups: dict = {}
    for cfg in configs:
        groups.setdefault(cfg.batch_size, []).append(cfg)

    finetune_s = 0.0
    for b, cfgs in groups.items():
        sec = ntk_tt.step_time(data.apply_fn, data.params, data.x, data.y,
                               learning_rate=1e-3, batch_size=b, key=key)  # η: same cost
        finetune_s += len(cfgs) * spec.steps * sec
        print(f"real step, B = {b or n}: {sec * 1e3:.1f} ms")

    rows = []
    for name, build in kernels.items():
        def kernel_and_lambda(build=build, name=name):
            k = build()  # traced: (N, N), which the solves read as (Θ/C) ⊗ I_C
            if name == "head_aware":  # λ_max of the traced Θ / C sets η
                traced, k = k
                return k, top_eigenvalue(traced) / c
            return k, top_eigenvalue(k) / (c if name == "traced" else 1)

        (theta, lam), kernel_s = _best(kernel_and_lambda)
        solve_s = 0.0
        for b, cfgs in groups.items():
            lrs, moms = _hyper(cfgs, float(lam), n)
            kw = dict(steps=spec.steps, batch_size=b, method="discrete",
                      num_paths=spec.num_paths)
            _predict_group(theta, f0, data.y, key, lrs, moms, None, **kw)  # warm
            solve_s += _predict_group(theta, f0, data.y, key, lrs, moms, None, **kw)[3]
        predict_s = kernel_s + solve_s
        rows.append({"kernel": name, "N": n, "configs": len(configs),
                     "seconds_kernel": kernel_s, "seconds_solves": solve_s,
                     "seconds_predict": predict_s, "seconds_finetune": finetune_s,
                     "ratio": finetune_s / predict_s})
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    if a.csv:
        table.to_csv(a.csv, index=False)


if __name__ == "__main__":
    main()
