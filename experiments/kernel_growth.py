"""A fitted growth law for the backbone feature kernel, scored leaving one target set out.

    python experiments/kernel_growth.py --out OUT.jsonl [--sgd]     # 72 GD main-grid rows
    python experiments/kernel_growth.py --out OUT.jsonl --report    # p95 per growth and LOO

The default head-aware prediction's features fall behind the real ones late in the run
(README "Error budget"). Here its backbone feature kernel K_h is scaled by
c_k = 1 + a·k/7 over the k = 0 … 7 eighths of the horizon (K_h grows linearly to (1 + a)·K_h;
the state carried across, as ``experiments/error_budget.py`` chains segments), for
a ∈ ``GROWTHS``, on every GD row of the committed full preset with κ̃ ≤ 12 (with ``--sgd``
the 96 minibatch rows too, the mean over the sweep's minibatch orders;
``experiments/results/sweep``; a = 0 reproduces its predictions exactly). ``--report``
gives T_ε p95 pooled over ε ∈ {0.1, 0.4} per a (and that of the steps to the sweep's
absolute losses q·L_0), and the leave-one-target-set-out figure of choosing a by T_ε on the
other three sets (one a for all rows, or one per κ̃): the only honest score of a growth law
fitted to the benchmark (issue 26).
"""

from __future__ import annotations

import argparse
import json

import error_budget as eb
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from _args import rows_file  # experiments/_args.py, beside this script

import ntk_tt
from ntk_tt.data._batches import path_batch_indices
from ntk_tt.dynamics._predict_head_aware import initial_state
from ntk_tt.sweep._grid import Task
from ntk_tt.sweep._load import _task_key
from ntk_tt.sweep._targets import LOSS_FRACTIONS, target_columns

GROWTHS = (0.0, 0.25, 0.5, 1.0, 2.0)
EPS = ("0.1", "0.4")
SEGMENTS = 8


def grown_curve(hk, y, row, growth: float, key) -> np.ndarray:
    """Loss curve (T + 1,) of the head-aware model with K_h scaled by 1 + a·k/7 in the k-th
    eighth of the horizon: GD, or for B < N the mean over the row's ``pred_paths`` minibatch
    orders of ``path_batch_indices(key, ...)`` (path 0 the real run's), as the sweep."""
    n, steps = hk.features.shape[0], int(row.steps)
    if row.optimizer == "gd":
        batches = jnp.tile(jnp.arange(n)[None], (1, steps, 1))
    else:
        batches = path_batch_indices(key, n, int(row.batch_size), steps, int(row.pred_paths))
    ends = eb.boundaries(steps, SEGMENTS)
    kw = dict(learning_rate=jnp.float32(row.learning_rate),
              momentum=jnp.float32(row.momentum), nesterov=False, loss=eb.LOSS)

    def path(order):
        state, parts = initial_state(hk), []
        for s in range(SEGMENTS):
            scaled = hk._replace(backbone=hk.backbone * (1.0 + growth * s / (SEGMENTS - 1)))
            f, _, state = eb._trajectory(scaled, y, order[ends[s]:ends[s + 1]], state, **kw)
            parts.append(f if s == 0 else f[1:])
        fs = jnp.concatenate(parts)
        return jax.vmap(lambda f: eb.mean_loss(f, y, eb.LOSS))(fs)

    return np.asarray(jnp.mean(jax.vmap(path)(batches), axis=0), np.float64)


def times(curve, real) -> dict[str, float | None]:
    """T_ε (ε in ``EPS``) of a loss curve and its steps to the sweep's absolute targets
    L* = q·L_0 of the real run (``ntk_tt.sweep._targets``: ``loss0.5``, ``loss0.25``; None if
    never reached)."""
    out = {e: float(ntk_tt.training_time(np.asarray(curve), float(e))) for e in EPS}
    steps = target_columns(real, curve, False, False)
    for q in LOSS_FRACTIONS:
        v = steps[f"pred_steps_loss{q:g}"]
        out[f"loss{q:g}"] = None if np.isnan(v) else float(v)
    return out


def collect(path: str, sgd: bool) -> None:
    df = pd.read_parquet(eb.SWEEP)
    df = df[df.kappa_eff < 13]
    if not sgd:
        df = df[df.optimizer == "gd"]
    with open(path, "a") as out:
        for data, hk, group in eb.task_kernels(df):
            for row in group.itertuples():
                res = {"row_id": row.row_id, "dataset": row.dataset, "optimizer": row.optimizer,
                       "num_train": int(row.num_train), "kappa_eff": float(row.kappa_eff),
                       "momentum": float(row.momentum),
                       "real": times(row.real_loss, row.real_loss)}
                key = _task_key(Task(row.dataset, int(row.per_class), int(row.seed)))
                res |= {f"{a:g}": times(grown_curve(hk, data.y, row, a, key), row.real_loss)
                        for a in GROWTHS}
                out.write(json.dumps(res) + "\n")
                out.flush()


def _p95(cases, keys=EPS) -> float:
    """p95 of |T̂ − T| / T over (row, a) ``cases`` and ``keys`` (T_ε), or of
    |ŝ − s| / max(s, 1) for the absolute targets (``loss<q>`` keys: pairs both reach)."""
    errs = [abs(r[a][k] - r["real"][k]) / (r["real"][k] if k in EPS else max(r["real"][k], 1))
            for r, a in cases for k in keys
            if r[a][k] is not None and r["real"][k] is not None]
    return float(np.quantile(errs, 0.95))


def report(path: str) -> None:
    """The figures of :func:`_report` per optimiser (GD; SGD with ``--sgd``)."""
    rows = [json.loads(line) for line in open(path)]
    for opt in sorted({r.get("optimizer", "gd") for r in rows}):
        print(f"--- {opt}")
        _report([r for r in rows if r.get("optimizer", "gd") == opt])


def _report(rows: list[dict]) -> None:
    names = [f"{a:g}" for a in GROWTHS]
    kap = {k: [r for r in rows if round(r["kappa_eff"]) == k] for k in (1, 4, 12)}
    targets = tuple(f"loss{q:g}" for q in LOSS_FRACTIONS)
    for a in names:
        print(f"a = {a}: p95 {_p95([(r, a) for r in rows]):.3f}; by κ̃ " + ", ".join(
            f"{k}: {_p95([(r, a) for r in rs]):.3f}" for k, rs in kap.items())
            + f"; absolute targets {_p95([(r, a) for r in rows], targets):.3f}")
    sets = sorted({r["dataset"] for r in rows})
    for per_kappa in (False, True):
        held = []
        for s in sets:
            for rs in (kap.values() if per_kappa else [rows]):
                train = [r for r in rs if r["dataset"] != s]
                best = min(names, key=lambda a, tr=train: _p95([(r, a) for r in tr]))
                held += [(r, best) for r in rs if r["dataset"] == s]
        print(f"leave one target set out, one a {'per κ̃' if per_kappa else 'for all'}: p95 "
              f"{_p95(held):.3f}; by κ̃ " + ", ".join(
                  f"{k}: {_p95([c for c in held if round(c[0]['kappa_eff']) == k]):.3f}"
                  for k in kap) + f"; absolute targets {_p95(held, targets):.3f}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--report", action="store_true")
    p.add_argument("--sgd", action="store_true", help="the minibatch rows too")
    a = p.parse_args(argv)
    rows_file(p, a.out, a.report)  # before any work
    if a.report:
        report(a.out)
    else:
        collect(a.out, a.sgd)


if __name__ == "__main__":
    main()
