"""README's optimiser example (issue 27): a warmup-cosine AdamW prediction next to its real run.

On the default task (the shipped checkpoint, flowers5, 5 classes × 20 images: N = 100), one
``ntk_tt.adamw(ntk_tt.warmup_cosine(...), weight_decay=...)`` is predicted by
``ntk_tt.predict(..., optimizer=opt, head=head)`` (the fast head-aware Adam predictor,
METHOD.md §11; one path: the real run's batch order) and fine-tuned for real by
``ntk_tt.finetune(..., optimizer=opt)`` with the same key, so both see the same learning
rates and batches. Prints T_0.1 and T_0.4 of the training loss (and error), predicted vs
real, the predicted and real loss at a few steps, and the wall times. Runs in about 2 minutes
on 2 CPU cores.

    python experiments/optimizer_example.py
    python experiments/optimizer_example.py --peak 3e-4 --batch-size 0   # 0: full batch
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
from _args import at_least, fail  # experiments/_args.py, beside this script

import ntk_tt
from ntk_tt.prediction._job import load_task


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peak", type=float, default=1e-3, help="peak learning rate")
    ap.add_argument("--warmup", type=int, default=10, help="warmup steps")
    ap.add_argument("--steps", type=int, default=100, help="optimiser updates T")
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--batch-size", type=int, default=20, help="B (0: full batch, N)")
    ap.add_argument("--per-class", type=int, default=20)
    a = ap.parse_args(argv)
    # before the data (a fresh user's bad values were library tracebacks after it loaded,
    # in the library's names: "decay_steps (0.0) must be >= warmup (10.0)")
    at_least(ap, "--steps", a.steps, 1, integer=True)
    at_least(ap, "--per-class", a.per_class, 1, integer=True)
    at_least(ap, "--batch-size", a.batch_size, 0, integer=True)
    if not 0 <= a.warmup < a.steps:
        fail(ap, f"--warmup must be in [0, --steps) = [0, {a.steps}), got {a.warmup}.")
    if a.batch_size > 5 * a.per_class:
        fail(ap, f"--batch-size {a.batch_size} exceeds N = 5 × --per-class = "
                 f"{5 * a.per_class} (0 is full batch).")
    try:
        opt = ntk_tt.adamw(ntk_tt.warmup_cosine(a.peak, a.warmup, a.steps),
                           weight_decay=a.weight_decay, batch_size=a.batch_size or None)
    except ValueError as err:
        fail(ap, f"{err} (--peak {a.peak}, --weight-decay {a.weight_decay})")
    apply_fn, params, x, y, _, _, info, head = load_task(
        dataset="flowers5", num_classes=5, per_class=a.per_class, test_per_class=0, seed=0)
    key = jax.random.key(0)
    t0 = time.perf_counter()
    pred = ntk_tt.predict(apply_fn, params, x, y, optimizer=opt, steps=a.steps, head=head,
                          key=key, num_paths=1)
    t1 = time.perf_counter()
    run = ntk_tt.finetune(apply_fn, params, x, y, optimizer=opt, steps=a.steps, key=key)
    t2 = time.perf_counter()
    report = ntk_tt.compare(pred, run)
    print(f"task: {info['architecture']} on {info['dataset']}, N = {len(y)}; "
          f"adamw(warmup_cosine({a.peak:g}, {a.warmup}, {a.steps}), weight_decay="
          f"{a.weight_decay:g}, batch_size={a.batch_size or 'N'}), T = {a.steps}")
    for curve in ("loss", "error"):
        for eps in (0.1, 0.4):
            p = report["predicted"]["training_time"][curve][eps]
            r = report["real"]["training_time"][curve][eps]
            print(f"T_{eps} ({curve}): predicted {p}, real {r}")
    at = [0, a.warmup, a.steps // 2, a.steps]
    print("loss at steps", at, "predicted", np.round(pred.loss[at].astype(float), 3).tolist(),
          "real", np.round(run.loss[at], 3).tolist())
    print(f"predicted outcome {pred.outcome}, real diverged {run.diverged}; "
          f"seconds: predict {t1 - t0:.1f} (wall, compile included), fine-tune "
          f"{t2 - t1:.1f} (wall, compile included)")


if __name__ == "__main__":
    main()
