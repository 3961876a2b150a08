"""How far beyond the measured weight travel the fast AdamW predictor still says something true
(issue 26 item 3 for Adam: beyond its edge a predictor must abstain, not call "converges").

The optimiser benchmark measured AdamW up to ρ = Σ η_t / rms(θ_0) = 0.58 (peak 1e-3, T = 150),
where every real run trained. A fresh user's AdamW run at peak 0.1 (ρ = 23) was predicted to
reach a loss of 0 while the real network ended at the loss of a uniform guess (ln K). This
script fine-tunes and predicts, on the shipped checkpoint with a fresh 5-class head and
flowers5 (10 per class, N = 50, full batch), AdamW warmup 10 + cosine over T = 60 steps,
λ = 0.01, at peaks 1e-3 … 1e-1, and prints ρ, the predicted and real final loss, the
real run's outcome (the divergence rule's three-way call on its curve), and the predicted
loss-curve T_0.1 against the real one.

    python experiments/adam_travel_edge.py [--out FILE.json]   # ~3 min on 2 CPU cores
"""

from __future__ import annotations

import argparse
import json
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from _args import output_file  # experiments/_args.py, beside this script

import ntk_tt
from ntk_tt.dynamics._divergence import OUTCOMES, outcome

PEAKS = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
T = 60


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args(argv)
    output_file(ap, args.out, "--out")  # it writes after the whole loop
    model, meta = ntk_tt.load_checkpoint()
    model = ntk_tt.replace_head(model, 5, key=jax.random.key(1))
    apply_fn, params = ntk_tt.from_nnx(model)
    task = ntk_tt.sample_task(ntk_tt.load_dataset("flowers5"), num_classes=5, per_class=10,
                              key=jax.random.key(0))
    x = ntk_tt.prepare_images(task.x_train, (32, 32, 3), mean=np.asarray(meta["mean"]),
                              std=np.asarray(meta["std"]))
    y = jnp.asarray(task.y_train)
    split = ntk_tt.split_head(model)
    rows = []
    for peak in PEAKS:
        opt = ntk_tt.adamw(ntk_tt.warmup_cosine(peak, 10, T), weight_decay=0.01)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pred = ntk_tt.predict(apply_fn, params, x, y, head=split, steps=T, optimizer=opt)
        run = ntk_tt.finetune(apply_fn, params, x, y, optimizer=opt, steps=T)
        real_t = float(ntk_tt.training_time(np.asarray(run.loss), 0.1))
        row = {"peak": peak, "rho": pred.hyperparameters["weight_travel"],
               "pred_final": float(pred.loss[-1]), "real_final": float(run.loss[-1]),
               "L0": float(run.loss[0]), "ln_K": math.log(5),
               "pred_outcome": pred.outcome, "real_outcome": OUTCOMES[int(outcome(
                   jnp.asarray(run.loss), jnp.asarray(run.diverged),
                   jnp.asarray(-1 if run.spiked_at is None else run.spiked_at)).outcome)],
               "pred_T0.1": pred.training_time["loss"][0.1],
               "real_T0.1": real_t if real_t >= 0 else None}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
