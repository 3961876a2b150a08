"""Default task, several optimisers: predicted vs real T_ε, wall-time ratio, peak memory.

    python experiments/closing_note.py --out experiments/results/closing_note.csv

One empirical NTK for the task (shared by every configuration, as in a sweep); for each
configuration the exact discrete linearised dynamics (``predict_from_kernel``) and a real
``finetune`` with the same batch sequence. Prediction time per configuration = kernel time +
its solve; fine-tuning time = training steps only. Momentum runs keep the effective learning
rate η/(1 − m) of the plain runs (paper Sec. 3.1).
"""

from __future__ import annotations

import argparse
import resource
import time

import jax
import numpy as np
import pandas as pd
from _args import at_least, output_file, positive  # experiments/_args.py, beside this script

import ntk_tt
from ntk_tt.dynamics._predict_kernel import STATIC
from ntk_tt.prediction._job import DEFAULTS, load_task

CONFIGS = [(None, 0.0), (None, 0.9), (50, 0.0), (50, 0.9), (100, 0.0), (100, 0.9)]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="experiments/results/closing_note.csv")
    p.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    p.add_argument("--lr", type=float, default=DEFAULTS["learning_rate"])
    a = p.parse_args(argv)
    output_file(p, a.out, "--out")  # before the kernel, the predictions and the fine-tunes
    at_least(p, "--steps", a.steps, 1, integer=True)
    positive(p, "--lr", a.lr)
    apply_fn, params, x, y, _, _, info, _ = load_task()
    t0 = time.perf_counter()
    kernel = jax.block_until_ready(ntk_tt.empirical_ntk(apply_fn, params, x))
    f0 = apply_fn(params, x)
    t_kernel = time.perf_counter() - t0
    solve = jax.jit(ntk_tt.predict_from_kernel, static_argnames=STATIC)
    rows = []
    for batch, m in CONFIGS:
        lr = a.lr * (1.0 - m)
        key = jax.random.key(0)
        kw = dict(learning_rate=lr, momentum=m, steps=a.steps, batch_size=batch)
        jax.block_until_ready(solve(kernel, f0, y, key=key, method="discrete", **kw))  # compile
        t1 = time.perf_counter()
        pred = jax.block_until_ready(solve(kernel, f0, y, key=key, method="discrete", **kw))
        t_pred = t_kernel + time.perf_counter() - t1
        run = ntk_tt.finetune(apply_fn, params, x, y, key=key, **kw)
        row = {"batch_size": batch or len(y), "momentum": m, "learning_rate": lr,
               "kappa": float(pred.kappa), "seconds_predict": t_pred,
               "seconds_finetune": run.seconds["finetune"],
               "ratio": run.seconds["finetune"] / t_pred,
               "pred_diverged": bool(pred.diverged), "real_diverged": run.diverged}
        for i, curve in enumerate(("loss", "error")):
            for j, eps in enumerate((0.01, 0.1, 0.4)):
                real = ntk_tt.training_time(getattr(run, curve), eps)
                guess = float(np.asarray(pred.training_time)[i, j])
                row[f"{curve}_T{eps}_pred"], row[f"{curve}_T{eps}_real"] = guess, real
                row[f"{curve}_T{eps}_relerr"] = abs(guess - real) / real
        rows.append(row)
        print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()},
              flush=True)
    table = pd.DataFrame(rows)
    table.to_csv(a.out, index=False)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"task {info['dataset']} N = {len(y)}, D = {info['num_params']}; kernel "
          f"{t_kernel:.1f} s; peak RSS {peak:.0f} MiB; wrote {a.out}")


if __name__ == "__main__":
    main()
