"""Is the head-aware model's T_ε error its function-space approximation, or the order of its
backbone? (issue 26: "a second-order (quadratic) model of the backbone")

    python experiments/backbone_order.py --out rows.jsonl [--per-class 50] [--kappas 1 4 12]
        [--momenta 0 0.9] [--batch N] [--orders 1 2] [ROW_ID ...]
    python experiments/backbone_order.py --out rows.jsonl --report [--summary summary.json]

For each constant-η row of the main sweep (``--table``, default
``experiments/results/sweep``; the GD rows of the given κ̃, m and per-class size unless
ROW_IDs are given), the task is loaded as the sweep did and the head-aware model is trained
EXACTLY in weight space (optax on (θ, W, b), the real run's batch order, the sweep's
``ntk_tt.sgd(η, m, batch_size=B)``), its backbone features expanded to order 1 or 2 in the
backbone weights, the head exact:

- order 1: f = (h_0 + J_h Δθ) W + b, the model the default predictor approximates in function
  space (``ntk_tt.predict``'s head-aware kernel, METHOD.md §10);
- order 2: f = (h_0 + J_h Δθ + ½ H_h[Δθ, Δθ]) W + b, the backbone's curvature added (the
  neural quadratic model of Zhu et al. 2022 for the backbone; one more nested ``jax.jvp``).

Order 1 against the real run is the ceiling of any function-space approximation of the
default's model; order 2 against order 1 is what a second-order backbone could add. A GD
row at N = 250 took a mean 32 s (order 1) and 54 s (order 2) on the shared 2-core CPU beside
other jobs, where the sweep's fine-tunes of those rows took a median 10.4 s: neither is a
predictor. Rows resume (one JSON line per row and order, written as it ends);
``--report`` prints p95 |T̂_ε − T_ε|/T_ε pooled over ε ∈ {0.1, 0.4} of the stored default
prediction and each order, by κ̃, m and N, and the final-loss ratio to the real run's.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd
from _args import exit_error, fail, rows_file  # experiments/_args.py, beside this script

import ntk_tt
from ntk_tt.dynamics._divergence import OUTCOMES, outcome
from ntk_tt.dynamics._losses import mean_loss
from ntk_tt.sweep._table import read_table

EPSILONS = (0.1, 0.4)


def taylor_features(feature_fn, bparams0, order: int, direction=None):
    """``h(θ, x)`` (N, F): the backbone features expanded around θ_0 to ``order`` (1 or 2) in
    Δθ = θ − θ_0, by nested ``jax.jvp`` (never a Jacobian or Hessian). With ``direction`` d (a
    unit pytree like θ_0) and order 2, the quadratic term is rank one along d:
    ½ (d·Δθ)² H_h[d, d] (equal to order 2 for Δθ ∥ d, to order 1 for Δθ ⊥ d)."""

    def h(theta, x):
        delta = jax.tree.map(jnp.subtract, theta, bparams0)
        if order == 1 or direction is not None:
            h0, t1 = jax.jvp(lambda p: feature_fn(p, x), (bparams0,), (delta,))
            if order == 1:
                return h0 + t1
            along = sum(jnp.vdot(a, b) for a, b in zip(jax.tree.leaves(direction),
                                                       jax.tree.leaves(delta), strict=True))
            _, (_, t2) = jax.jvp(lambda p: jax.jvp(lambda q: feature_fn(q, x), (p,),
                                                   (direction,)), (bparams0,), (direction,))
            return h0 + t1 + 0.5 * along**2 * t2
        (h0, t1), (_, t2) = jax.jvp(
            lambda p: jax.jvp(lambda q: feature_fn(q, x), (p,), (delta,)), (bparams0,), (delta,))
        return h0 + t1 + 0.5 * t2

    return h


def adam_direction(split, x, y, eps: float, loss: str = "cross_entropy"):
    """d = u/‖u‖, u = g_0/(|g_0| + ε): the direction of Adam's first full-batch step in the
    backbone weights (g_0 the full-batch gradient at θ_0 with the head W_0, b_0)."""
    feature_fn, bp0, w0, b0 = split
    g = jax.grad(lambda p: mean_loss(feature_fn(p, x) @ w0 + b0, y, loss))(bp0)
    u = jax.tree.map(lambda a: a / (jnp.abs(a) + eps), g)
    norm = jnp.sqrt(sum(jnp.sum(a * a) for a in jax.tree.leaves(u)))
    return jax.tree.map(lambda a: a / norm, u)


def taylor_reference(split, x, y, optimizer: ntk_tt.Optimizer, *, steps: int, key=None,
                     order: int = 2, loss: str = "cross_entropy", direction=None) -> dict:
    """Train the head-aware model with an order-``order`` backbone exactly in weight space.

    Args:
      split: ``(feature_fn, backbone_params, W (F, C), b (C,))`` (``ntk_tt.split_head``).
      x: training inputs (N, ...). y: integer labels (N,). optimizer: ``ntk_tt.sgd(...)`` or
        any :class:`ntk_tt.Optimizer` (its optax transformation, batch size and schedule).
      steps: T updates. key: the minibatch order's key (``ntk_tt.batch_indices``), as
        ``ntk_tt.finetune``. order: 1 or 2. loss: "cross_entropy" or "mse" (mean).
      direction: with order 2, a unit pytree d like the backbone weights: the quadratic term
        rank one along d (``taylor_features``), e.g. ``adam_direction``.

    Returns:
      {"loss": full-training-set mean loss after 0..T updates (T + 1,), held at its last
      finite value from a non-finite one on; "stopped_at": that update or None; "outcome":
      converges / catapult / diverges (``ntk_tt.dynamics._divergence.outcome``);
      "spike_step"}.

    Raises:
      ValueError: order not 1 or 2.
    """
    if order not in (1, 2):
        raise ValueError(f"order must be 1 or 2, got {order!r}.")
    feature_fn, bp0, w0, b0 = split
    x, y = jnp.asarray(x), jnp.asarray(y)
    n = x.shape[0]
    batches = ntk_tt.batch_indices(key, n, optimizer.batch_size or n, steps)
    h = taylor_features(feature_fn, bp0, order, direction)
    tx = optimizer.to_optax()

    def full_loss(params, xx, yy):
        theta, w, b = params
        return mean_loss(h(theta, xx) @ w + b, yy, loss)

    @jax.jit
    def step(params, state, idx, x, y):
        grads = jax.grad(full_loss)(params, x[idx], y[idx])
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        return params, state, full_loss(params, x, y)

    params = (bp0, w0, b0)
    state = tx.init(params)
    losses = [float(full_loss(params, x, y))]
    stopped = None
    for t in range(steps):
        params, state, value = step(params, state, batches[t], x, y)
        losses.append(float(value))
        if not np.isfinite(losses[-1]):
            stopped = t + 1
            break
    computed = held = np.asarray(losses)
    if stopped is not None:  # as computed: non-finite from `stopped` on; held: last finite
        computed = np.concatenate([computed, np.full(steps - stopped, np.inf)])
        held = np.concatenate([held[:stopped], np.full(steps + 1 - stopped, held[stopped - 1])])
    out = outcome(jnp.asarray(computed))
    return {"loss": held, "stopped_at": stopped, "outcome": OUTCOMES[int(out.outcome)],
            "spike_step": int(out.spike_step)}


def select_rows(table: pd.DataFrame, a) -> list[str]:
    """The row ids to run: the given ones, else the grid's (per-class, batch, m, κ̃)."""
    if a.rows:
        missing = [r for r in a.rows if r not in table.index]
        if missing:
            exit_error("backbone_order.py", f"rows not in {a.table}: {', '.join(missing)}")
        return list(a.rows)
    want = {f"b{a.batch}-m{m:g}-kappa{k:g}" for m in a.momenta for k in a.kappas}
    sel = table[table["per_class"].isin(a.per_class) & table["config_id"].isin(want)]
    if sel.empty:  # a fresh user's --kappas -1 exited 0 without a word
        exit_error("backbone_order.py", f"no row of {a.table} has --per-class {a.per_class}, "
                   f"--batch {a.batch}, --momenta {a.momenta} and --kappas {a.kappas}: pick "
                   "values of its grid.")
    return sorted(sel.index)


def run(a) -> None:
    from ntk_tt.sweep._grid import SweepSpec, Task
    from ntk_tt.sweep._load import _task_key, load_task
    table = read_table(a.table).set_index("row_id")
    rows = select_rows(table, a)
    out = pathlib.Path(a.out)
    done = {(r["row_id"], r["order"]) for r in _read(out)}
    for rid in rows:
        row = table.loc[rid]
        task = Task(row.dataset, int(row.per_class), int(row.seed))
        data = None
        for order in a.orders:
            if (rid, order) in done:
                continue
            if data is None:
                data = load_task(task, SweepSpec(datasets=(task.dataset,),
                                                 per_class=(task.per_class,),
                                                 seeds=(task.seed,)))
            b = None if row.optimizer == "gd" else int(row.batch_size)
            opt = ntk_tt.sgd(float(row.learning_rate), float(row.momentum), batch_size=b)
            t0 = time.perf_counter()
            ref = taylor_reference(data.split, data.x, data.y, opt, steps=int(row.steps),
                                   key=_task_key(task), order=order)
            rec = {"row_id": rid, "order": order, "seconds": time.perf_counter() - t0,
                   "loss": ref["loss"].tolist(), "stopped_at": ref["stopped_at"],
                   "outcome": ref["outcome"], "spike_step": ref["spike_step"]}
            with out.open("a") as f:
                f.write(json.dumps(rec) + "\n")
            times_ = [float(ntk_tt.training_time(ref["loss"], e)) for e in EPSILONS]
            print(f"{rid} order {order}: T_0.1, T_0.4 = {times_} (real "
                  f"{[float(row[f'real_T{e}']) for e in EPSILONS]}, default "
                  f"{[float(row[f'pred_T{e}']) for e in EPSILONS]}), {ref['outcome']} "
                  f"(real {row.real_outcome}), {rec['seconds']:.0f} s", flush=True)


def _read(path: pathlib.Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def frame(a) -> pd.DataFrame:
    """One line per (row, curve kind, ε): the relative T_ε error against the real run, and
    the final-loss ratio; curve kinds ``default`` (stored) and ``order K``."""
    table = read_table(a.table).set_index("row_id")
    recs = _read(pathlib.Path(a.out))
    lines = []
    for rid in sorted({r["row_id"] for r in recs}):
        row = table.loc[rid]
        real = np.asarray(row.real_loss)
        curves = {"default": (np.asarray(row.pred_loss), row.pred_outcome)}
        curves |= {f"order {r['order']}": (np.asarray(r["loss"]), r["outcome"])
                   for r in recs if r["row_id"] == rid}
        for kind, (curve, called) in curves.items():
            for e in EPSILONS:
                t_real = float(ntk_tt.training_time(real, e))
                t_hat = float(ntk_tt.training_time(curve, e))
                lines.append({"row_id": rid, "curve": kind, "eps": e,
                              "kappa": float(row.lr_value), "momentum": float(row.momentum),
                              "N": int(row.num_train), "optimizer": row.optimizer,
                              "real_outcome": row.real_outcome, "outcome": called,
                              "rel": abs(t_hat - t_real) / t_real,
                              "signed": (t_hat - t_real) / t_real,
                              "final_ratio": float(curve[-1] / real[-1])})
    return pd.DataFrame(lines)


def report(a) -> dict:
    """p95 / median relative T_ε error and median final-loss ratio per curve kind, overall and
    by κ̃ (and N, m, optimiser); outcome agreement with the real run."""
    d = frame(a)
    if d.empty:
        exit_error("backbone_order.py", f"no rows in {a.out}: run it first.")
    conv = d[~d["real_outcome"].isin(["diverges"])]

    def stats(sub):
        return {"pairs": int(len(sub)), "p95": float(sub["rel"].quantile(0.95)),
                "median": float(sub["rel"].median()),
                "signed_median": float(sub["signed"].median()),
                "final_ratio_median": float(sub["final_ratio"].median())}

    summary = {"rows": int(d["row_id"].nunique()), "all": {}, "by": {}}
    for kind, sub in conv.groupby("curve"):
        summary["all"][kind] = stats(sub.dropna(subset=["rel"]))
        for key in ("kappa", "N", "momentum", "optimizer"):
            for val, s in sub.groupby(key):
                summary["by"].setdefault(f"{key}={val:g}" if key != "optimizer"
                                         else f"{key}={val}", {})[kind] = stats(
                    s.dropna(subset=["rel"]))
    per_row = d[d["eps"] == EPSILONS[0]]
    summary["outcome_agreement"] = {
        kind: float((s["outcome"] == s["real_outcome"]).mean())
        for kind, s in per_row.groupby("curve")}
    return summary


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rows", nargs="*")
    p.add_argument("--out", required=True, help="JSON-lines file of the rows (resumes)")
    p.add_argument("--table", default="experiments/results/sweep")
    p.add_argument("--per-class", type=int, nargs="+", default=[50])
    p.add_argument("--kappas", type=float, nargs="+", default=[1, 4, 12])
    p.add_argument("--momenta", type=float, nargs="+", default=[0, 0.9])
    p.add_argument("--batch", default="N", help="N (GD) or a minibatch size of the grid")
    p.add_argument("--orders", type=int, nargs="+", default=[1, 2], choices=(1, 2))
    p.add_argument("--report", action="store_true")
    p.add_argument("--summary", default=None, help="with --report: write the summary JSON")
    a = p.parse_args(argv)
    rows_file(p, a.out, a.report)  # before any work
    if a.summary and not a.report:  # it was ignored, and the whole run started
        fail(p, "--summary writes the report's summary: it needs --report.")
    if not a.report:
        if not pathlib.Path(a.table).is_dir():  # a traceback from the table reader
            fail(p, f"--table {a.table}: no such folder (a sweep's output folder).")
        run(a)
        return
    summary = report(a)
    text = json.dumps(summary, indent=1)
    if a.summary:
        pathlib.Path(a.summary).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
