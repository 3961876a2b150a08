"""Which part of the head-aware prediction's state drift costs T_ε? (issue 26's error budget)

    python experiments/state_split.py --per-class 50 --kappas 4 12 --out OUT.jsonl

For every GD row of the committed full preset (``experiments/results/sweep``) with the given
images per class and κ̃, the real fine-tune is run again as ``error_budget.py`` does, keeping
its weights and optax momentum every T/8 steps, and the default head-aware prediction is
re-linearised at the real weights there (as ``oracle_kernel_8``) with only part of its state
reset to the real network's: ``head`` (W, b and their velocities; the predicted features
carried on) or ``features`` (h(θ_k) and the backbone velocity J_h v_θ; the predicted head
carried on). ``error_budget.py``'s ``oracle_state_8`` resets both. One JSON line per row:
T_0.01, T_0.1, T_0.4 (steps) of the real run, the default prediction and each reset.
"""

from __future__ import annotations

import argparse
import functools
import json

import error_budget as eb
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from _args import no_rows, rows_file  # experiments/_args.py, beside this script

import ntk_tt
from ntk_tt.dynamics._predict_head_aware import HeadState, initial_state
from ntk_tt.sweep._grid import Task
from ntk_tt.sweep._load import _task_key

SEGMENTS = 8


def partial_oracle(data, saved, batches, lr, mom, steps, mode, hk0, kernels):
    """Loss curve (T + 1,) re-linearised at the real weights every T/8 steps with the
    ``mode`` part of the state ("head" or "features") reset to the real network's."""
    kw = dict(learning_rate=jnp.float32(lr), momentum=jnp.float32(mom), nesterov=False,
              loss=eb.LOSS)
    ends = eb.boundaries(steps, SEGMENTS)
    state, hk, parts = initial_state(hk0), hk0, []
    for s in range(SEGMENTS):
        if s:
            params, opt_state = saved[int(ends[s])]
            split = eb._split_of(params, data)
            if int(ends[s]) not in kernels:
                kernels[int(ends[s])] = ntk_tt.head_aware_kernel(split, data.x)
            new = kernels[int(ends[s])]
            feature_fn, back, w, b = split
            _, tb, uw, ub = eb._split_of(eb._trace(opt_state), data)
            if mode == "features":
                _, vphi = jax.jvp(functools.partial(feature_fn, x=data.x), (back,), (tb,))
                hk, z = new, jnp.zeros_like(new.features)
                state = HeadState(state.w, state.b, z, state.uw, state.ub, vphi, z, z, None,
                                  None)
            else:
                hk = new._replace(features=hk.features + state.phi)
                state = initial_state(hk, w, b, (uw, ub, state.u_q))
        f, _, state = eb._trajectory(hk, data.y, batches[ends[s]:ends[s + 1]], state, **kw)
        parts.append(f if s == 0 else f[1:])
    fs = jnp.concatenate(parts)
    return np.asarray(jax.vmap(lambda f: eb.mean_loss(f, data.y, eb.LOSS))(fs), np.float64)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-class", type=int, default=50)
    p.add_argument("--kappas", type=float, nargs="+", default=[4.0, 12.0])
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    rows_file(p, a.out, False)  # a missing folder was a FileNotFoundError
    df = pd.read_parquet(eb.SWEEP)
    df = df[(df.per_class == a.per_class) & (df.optimizer == "gd")
            & np.isclose(df.kappa_eff.to_numpy()[:, None], np.array(a.kappas)).any(1)]
    no_rows(df, f"--per-class {a.per_class} and --kappas {a.kappas} among its GD rows")
    with open(a.out, "a") as out:
        for data, hk0, group in eb.task_kernels(df):
            for row in group.itertuples():
                steps, lr, mom = int(row.steps), float(row.learning_rate), float(row.momentum)
                key = _task_key(Task(row.dataset, int(row.per_class), int(row.seed)))
                real, saved, batches = eb.real_run(data, key, lr, mom, steps, None,
                                                   set(eb.boundaries(steps, SEGMENTS).tolist()))
                default = eb.oracle_curve(data, saved, batches, lr, mom, steps, 1, False, hk0,
                                          {})
                kernels: dict = {}
                res = {"row_id": row.row_id, "kappa_eff": float(row.kappa_eff),
                       "momentum": mom, "real": eb.t_eps(real), "default": eb.t_eps(default)}
                for mode in ("head", "features"):
                    res[mode] = eb.t_eps(partial_oracle(data, saved, batches, lr, mom, steps,
                                                        mode, hk0, kernels))
                out.write(json.dumps(res) + "\n")
                out.flush()
                print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
