"""The head-aware feature kernel exact on the features' leading principal directions (issue 26).

    python experiments/feature_subspace.py --out OUT.jsonl [--per-class 50 150 10]
    python experiments/feature_subspace.py --out OUT.jsonl --report
    python experiments/feature_subspace.py --out EDGE.jsonl --edge [--report]

The default head-aware predictor approximates the backbone feature kernel K_h (N·F)² by
k_b(i, j)·I_F. The head-aware model trained exactly in weight space
(``experiments/backbone_order.py``, order 1) shows that this approximation, not the
linearisation of the backbone, is most of the default's T_ε error at N = 250. Here K_h is
kept exact on the k leading principal directions Z of the centred training features
(``ntk_tt.head_aware_kernel(..., backbone="subspace", subspace_dim=k)``; K_Z (N·k)², the
features moving in span(Z) only), for k ∈ ``KS``, on every row of the committed full preset
with κ̃ ≤ 12 (``experiments/results/sweep``; GD, and minibatch rows as the mean over the
sweep's batch orders, path 0 the real run's, as the sweep predicts them). The principal
directions are nested, so one K_Z of the largest k per task gives every k (its leading
blocks). Rows resume per task (one JSON line per row, written as it ends) and record the
seconds of the task's K_Z and of the default's isotropic kernel, built side by side.
``--report`` gives T_ε p95 / mean (signed median) pooled over ε ∈ {0.1, 0.4} per k,
optimiser, κ̃ and N, with the default's stored predictions beside them, and the kernels'
seconds per task. k is not fitted: every k is reported. ``--edge`` takes the preset's edge
rows instead (κ̃ ∈ {16, …, 96}) and records each curve's outcome (converges / catapult /
diverges, ``ntk_tt.dynamics._divergence.outcome``, as the sweep calls its curves, without the
κ ≥ 68 rule) against the real run's; ``--report`` then gives the confusion per k.
"""

from __future__ import annotations

import argparse
import json
import time

import error_budget as eb
import numpy as np
import pandas as pd
from _args import no_rows, rows_file  # experiments/_args.py, beside this script
from feature_shrinkage import _t as times
from feature_shrinkage import pending_tasks, print_groups
from kernel_growth import grown_curve

import ntk_tt
from ntk_tt.dynamics._divergence import OUTCOMES, outcome
from ntk_tt.sweep._load import _task_key

KS = (8, 16, 24)


def nested(hk, k: int):
    """The k-direction subspace kernel from one with more directions: Z's first k columns and
    K_Z's leading (k × k) blocks (the principal directions are nested)."""
    n, kmax = hk.features.shape[0], hk.basis.shape[1]
    blocks = hk.backbone.reshape(n, kmax, n, kmax)[:, :k, :, :k].reshape(n * k, n * k)
    return hk._replace(backbone=blocks, basis=hk.basis[:, :k])


def _t(curve) -> dict:
    """feature_shrinkage's T_ε per ε, and the curve's outcome."""
    return times(curve) | {"outcome": OUTCOMES[int(outcome(np.asarray(curve)).outcome)]}


def collect(path: str, per_class, edge: bool = False) -> None:
    df = pd.read_parquet(eb.SWEEP)
    df = df[((df.kappa_eff >= 13) if edge else (df.kappa_eff < 13))
            & df.per_class.isin(per_class)]
    no_rows(df, f"--per-class {list(per_class)}" + (" and --edge" if edge else ""))
    with open(path, "a") as out:
        for group, task, data in pending_tasks(path, df):
            t0 = time.perf_counter()
            iso = ntk_tt.head_aware_kernel(data.split, data.x)
            iso.backbone.block_until_ready()
            t1 = time.perf_counter()
            big = ntk_tt.head_aware_kernel(data.split, data.x, backbone="subspace",
                                           subspace_dim=max(KS))
            big.backbone.block_until_ready()
            seconds = {"isotropic": t1 - t0, "subspace": time.perf_counter() - t1}
            write_rows(out, group, task, data, {f"k{k}": nested(big, k) for k in KS},
                       kernel_seconds=seconds, outcomes=True)


def write_rows(out, group, task, data, kernels: dict, kernel_seconds, outcomes=False) -> None:
    """One JSON line per sweep row of ``group`` (written as it ends, so a run resumes): the
    row's identity, the real and the stored default's T_ε (and outcomes), and each kernel's
    curve's :func:`_t`, predicted as the sweep predicts the row (:func:`grown_curve`, a = 0)."""
    for row in group.itertuples():
        res = {"row_id": row.row_id, "dataset": row.dataset, "optimizer": row.optimizer,
               "num_train": int(row.num_train), "kappa_eff": float(row.kappa_eff),
               "momentum": float(row.momentum), "kernel_seconds": kernel_seconds,
               "real": _t(row.real_loss), "default": _t(row.pred_loss)}
        if outcomes:
            res |= {"real_outcome": row.real_outcome, "default_outcome": row.pred_outcome}
        res |= {name: _t(grown_curve(hk, data.y, row, 0.0, _task_key(task)))
                for name, hk in kernels.items()}
        out.write(json.dumps(res) + "\n")
        out.flush()
        print(row.row_id, {n: res[n]["0.1"] for n in ["default", *kernels]}, "real",
              res["real"]["0.1"], flush=True)


def report(path: str) -> None:
    rows = [json.loads(line) for line in open(path)]
    names = ["default", *[f"k{k}" for k in KS]]
    if min(r["kappa_eff"] for r in rows) >= 13:  # --edge rows: outcomes only
        frame = pd.DataFrame([{"real": r["real_outcome"], "k": n, "called":
                               r["default_outcome"] if n == "default" else r[n]["outcome"]}
                              for r in rows for n in names])
        print(f"{len(rows)} edge rows; the default's call includes the κ ≥ 68 rule")
        for n, sub in frame.groupby("k", sort=False):
            print(f"--- {n}\n{pd.crosstab(sub['real'], sub['called'])}")
        return
    print(f"{len(rows)} rows; |T̂_ε − T_ε|/T_ε pooled over ε ∈ {{0.1, 0.4}}")
    print_groups(rows, names)
    by_task = {}
    for r in rows:
        by_task.setdefault((r["dataset"], r["num_train"]), r["kernel_seconds"])
    for n in sorted({k[1] for k in by_task}):
        s = [v for k, v in by_task.items() if k[1] == n]
        print(f"N = {n}: kernel seconds per task (median of {len(s)}): isotropic "
              f"{np.median([v['isotropic'] for v in s]):.1f}, subspace k = {max(KS)} "
              f"{np.median([v['subspace'] for v in s]):.1f}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--per-class", type=int, nargs="+", default=[10, 50, 150])
    p.add_argument("--edge", action="store_true", help="the edge rows (κ̃ >= 16): outcomes")
    p.add_argument("--report", action="store_true")
    a = p.parse_args(argv)
    rows_file(p, a.out, a.report)  # before any work
    if a.report:
        report(a.out)
    else:
        collect(a.out, a.per_class, a.edge)


if __name__ == "__main__":
    main()
