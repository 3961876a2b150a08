"""The subspace feature kernel scored as the sweep scores its primary (issue 26): T_ε, absolute
targets and cost on the full preset's main grid, and minibatch rows predicted on the real
run's own batch order.

    python experiments/subspace_preset.py --out OUT.jsonl [--per-class 10 50 150] [--table DIR]
        [--backbone subspace|diagonal]
    python experiments/subspace_preset.py --out OUT.jsonl --report [--json SUMMARY.json]
        [--table DIR]

For every task of the committed full preset (``experiments/results/sweep``, or another sweep
directory ``--table``, e.g. of unseen tasks: ``sweep.py --seeds 1``) with κ̃ ≤ 12 rows
it builds the default's isotropic head-aware kernel and ``backbone="subspace"`` (k =
``ntk_tt._options_predict.SUBSPACE_DIM``), timed side by side as a user pays them
(``ntk_tt.head_aware_kernel``), and predicts every row with ``ntk_tt.predict_head_aware``,
one compiled ``vmap`` over (η, m) per batch size as the sweep does, timed without
compilation (the sweep's rule):

- ``default``: isotropic, the sweep's key and ``pred_paths`` (a check: it must equal the
  stored prediction);
- ``subspace``: the same with the subspace kernel (``--backbone diagonal``: ``diagonal``, the
  diagonal kernel, k = ``ntk_tt._options_predict.DIAGONAL_DIM``, in its place throughout);
- ``default_own`` / ``subspace_own`` (minibatch rows): ``num_paths=1``, path 0 being
  ``ntk_tt.batch_indices(key, N, B, T)``, the order the real run used. This is the
  prediction of one run whose key is fixed before training, not of a typical run; GD rows
  have one order and reuse the rows above.

Rows resume per task (one JSON line per row with every curve, written when its task ends).
``--report`` puts each predictor's curves in place of the stored primary's and scores them
with the sweep's own functions (``ntk_tt.sweep._errors._pooled_stats``,
``ntk_tt.sweep._targets.absolute_targets``): T_ε p95 pooled over ε ∈ {0.1, 0.4} by
optimiser, κ̃ and N; loss- and error-target p95; the share of rows whose diverged flag agrees
with the real run's; and the cost ratio per task, fine-tune seconds of the task's main-grid
rows ÷ (kernel + prediction seconds).
"""

from __future__ import annotations

import argparse
import json
import time

import error_budget as eb
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from _args import fail, rows_file  # experiments/_args.py, beside this script
from feature_shrinkage import pending_tasks

import ntk_tt
from ntk_tt.sweep._compile import _compiled, _timed
from ntk_tt.sweep._errors import _pooled_stats, t_col
from ntk_tt.sweep._load import _task_key
from ntk_tt.sweep._predictions import _t_eps
from ntk_tt.sweep._table import read_table
from ntk_tt.sweep._targets import absolute_targets

BACKBONES = ("subspace", "diagonal")


def predictors(backbone: str) -> tuple[str, ...]:
    """The predictors of a row file of ``backbone``: the default, it, and on own orders."""
    return ("default", backbone, "default_own", f"{backbone}_own")
EPS = (0.01, 0.1, 0.4)
POOLED = [0.1, 0.4]


def _predict(hk, y, key, lrs, moms, *, steps, batch_size, num_paths):
    def one(lr, m):
        o = ntk_tt.predict_head_aware(hk, y, learning_rate=lr, momentum=m, steps=steps,
                                      batch_size=batch_size, key=key, num_paths=num_paths)
        return o.loss, o.error, o.diverged, o.spiked_at

    return jax.vmap(one)(lrs, moms)


def _group(hk, kind, data, key, rows, num_paths):
    """Curves of one batch size's rows: (loss, error, diverged, spiked_at), seconds."""
    b = rows.iloc[0].batch_size
    b = None if b >= len(data.y) else int(b)
    lrs = jnp.asarray(rows.learning_rate.to_numpy(), jnp.float32)
    moms = jnp.asarray(rows.momentum.to_numpy(), jnp.float32)
    args = (hk, data.y, key, lrs, moms)
    steps = int(rows.iloc[0].steps)

    def fn(*a):
        return _predict(*a, steps=steps, batch_size=b, num_paths=num_paths)

    compiled, _ = _compiled(("subspace_preset", kind, steps, b, num_paths), fn, *args)
    out, seconds = _timed(compiled, *args)
    return [np.asarray(o) for o in out], seconds


def _curve(x) -> list:
    return [float(f"{v:.7g}") for v in np.asarray(x, np.float64)]


def collect(path: str, per_class, table, backbone: str = "subspace") -> None:
    df = read_table(table)
    df = df[(df.kappa_eff < 13) & df.per_class.isin(per_class)]
    for group, task, data in pending_tasks(path, df):
        key = _task_key(task)
        t0 = time.perf_counter()
        iso = jax.block_until_ready(ntk_tt.head_aware_kernel(data.split, data.x))
        t1 = time.perf_counter()
        sub = jax.block_until_ready(ntk_tt.head_aware_kernel(data.split, data.x,
                                                             backbone=backbone))
        seconds = {"kernel_default": t1 - t0, f"kernel_{backbone}": time.perf_counter() - t1}
        res = {r: {} for r in group.row_id}
        for _, rows in group.groupby("batch_size"):
            sgd = rows.iloc[0].optimizer != "gd"
            runs = [("default", iso, int(rows.iloc[0].pred_paths)),
                    (backbone, sub, int(rows.iloc[0].pred_paths))]
            if sgd:
                runs += [("default_own", iso, 1), (f"{backbone}_own", sub, 1)]
            for name, hk, paths in runs:
                kind = "isotropic" if hk is iso else backbone
                (loss, err, div, spike), s = _group(hk, kind, data, key, rows, paths)
                seconds[f"predict_{name}"] = seconds.get(f"predict_{name}", 0.0) + s
                for i, r in enumerate(rows.row_id):
                    res[r][name] = {"loss": _curve(loss[i]), "error": _curve(err[i]),
                                    "diverged": bool(div[i]), "spiked_at": int(spike[i])}
        with open(path, "a") as out:
            for r in group.itertuples():
                out.write(json.dumps({"row_id": r.row_id, "seconds": seconds} | res[r.row_id])
                          + "\n")
        stored = np.stack(group.pred_loss.to_list())
        check = np.stack([res[r]["default"]["loss"] for r in group.row_id])
        print(f"{task.id}: {len(group)} rows, {seconds}; default vs stored max |Δ| "
              f"{np.max(np.abs(check - stored)):.2e}", flush=True)


def frame_for(df: pd.DataFrame, rows: dict, name: str) -> pd.DataFrame:
    """The table ``df`` with predictor ``name``'s curves as the primary's (``*_own`` falls
    back to the sweep's prediction on GD rows, which have one batch order)."""
    out = df.copy()
    for col in ("pred_loss", "pred_error", "pred_diverged", "pred_spiked_at",
                *(t_col("pred", e) for e in EPS)):
        out[col] = out[col].astype(object)
    for idx, r in df.iterrows():
        rec = rows[r.row_id]
        p = rec.get(name) or rec[name.removesuffix("_own")]
        out.at[idx, "pred_loss"] = np.asarray(p["loss"])
        out.at[idx, "pred_error"] = np.asarray(p["error"])
        out.at[idx, "pred_diverged"] = p["diverged"]
        out.at[idx, "pred_spiked_at"] = p["spiked_at"]
        for e in EPS:
            out.at[idx, t_col("pred", e)] = _t_eps(p["loss"], e)
    return out


def _p95(frame) -> str:
    s = _pooled_stats(frame, "ntk", POOLED)
    return f"{100 * s['p95']:.1f} % ({100 * s['median_signed']:+.1f}, n {s['n']})"


def report(path: str, json_out: str | None, table) -> None:
    rows = {}
    for line in open(path):
        r = json.loads(line)
        rows[r["row_id"]] = r
    df = read_table(table)
    df = df[df.row_id.isin(rows)].reset_index(drop=True)
    backbone = next(b for b in BACKBONES if b in next(iter(rows.values())))
    summary = {"rows": len(df), "definition": __doc__.split("\n\n")[2].strip()}
    print(f"{len(df)} rows; T_ε p95 pooled over ε ∈ {{0.1, 0.4}} (signed median, pairs)")
    for name in predictors(backbone):
        fr = frame_for(df, rows, name)
        entry = {}
        for opt in ("gd", "sgd"):
            sub = fr[fr.optimizer == opt]
            parts = {"all": sub,
                     **{f"kappa {k:g}": sub[np.isclose(sub.kappa_eff, k, rtol=1e-3)]
                        for k in (1, 4, 12)},
                     **{f"N {n}": sub[sub.num_train == n] for n in sorted(sub.num_train.unique())}}
            entry[opt] = {k: _pooled_stats(v, "ntk", POOLED) for k, v in parts.items() if len(v)}
            print(f"{name:13s} {opt}: " + "; ".join(f"{k} {_p95(v)}" for k, v in parts.items()
                                                    if len(v)))
        targets = absolute_targets(fr)
        entry["absolute_targets"] = {k: targets[k] for k in ("headline", "headline_error")}
        entry["diverged_agreement"] = float(np.mean(fr.pred_diverged == fr.real_diverged))
        for k in ("headline", "headline_error"):
            print(f"{name:13s} {k}: p95 " + " / ".join(
                f"{opt} {100 * h['p95']:.1f} % (n {h['n']})"
                for opt, h in targets[k].items() if "p95" in h))
        summary[name] = entry
    cost = {}
    for task, g in df.groupby("task_id"):
        s = rows[g.row_id.iloc[0]]["seconds"]
        ft = float(g.seconds_finetune.sum())
        cost[task] = {"num_train": int(g.num_train.iloc[0]), "finetune_seconds": ft} | {
            name: ft / (s[f"kernel_{name}"] + s[f"predict_{name}"])
            for name in ("default", backbone)} | s
    summary["cost_per_task"] = cost
    for name in ("default", backbone):
        ratios = [c[name] for c in cost.values()]
        summary[f"cost_ratio_median_{name}"] = float(np.median(ratios))
        print(f"fine-tune ÷ (kernel + predict) per task, {name}: median "
              f"{np.median(ratios):.1f}× ({min(ratios):.1f}–{max(ratios):.1f}×)")
    for n in sorted({c["num_train"] for c in cost.values()}):
        sel = [c for c in cost.values() if c["num_train"] == n]
        print(f"N = {n}: kernel seconds default / {backbone} (median of {len(sel)}): "
              f"{np.median([c['kernel_default'] for c in sel]):.1f} / "
              f"{np.median([c[f'kernel_{backbone}'] for c in sel]):.1f}")
    if json_out:
        with open(json_out, "w") as f:
            json.dump(summary, f, indent=1)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON-lines file of rows (resumed)")
    p.add_argument("--per-class", type=int, nargs="+", default=[10, 50, 150])
    p.add_argument("--report", action="store_true")
    p.add_argument("--json", help="with --report: also write the figures to this JSON file")
    p.add_argument("--table", default=eb.SWEEP.parent,
                   help="the sweep directory whose rows are predicted (default: the full preset)")
    p.add_argument("--backbone", choices=BACKBONES, default="subspace",
                   help="the feature kernel beside the default (rows record it)")
    a = p.parse_args(argv)
    rows_file(p, a.out, a.report)  # before any work
    if a.report:
        report(a.out, a.json, a.table)
        return
    if a.json:  # it was ignored, and the whole run started
        fail(p, "--json writes the report's figures: it needs --report.")
    if not (read_table(a.table).per_class.isin(a.per_class)).any():  # exited 0 silently
        fail(p, f"no row of {a.table} has --per-class {a.per_class}: pick values of its grid.")
    collect(a.out, a.per_class, a.table, a.backbone)


if __name__ == "__main__":
    main()
