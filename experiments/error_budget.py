"""Error budget of the default predictor (issue 26, item 1): where does its T_ε error come from?

On the full preset's tasks (``experiments/results/sweep``), each selected row is fine-tuned
again exactly as the sweep did (same task, η, m, B and batch order: the curve must equal the
stored one), keeping the real weights and optax momentum at the segment boundaries
t_k = round(k·T/8). Per row, beside the default prediction (head-aware, isotropic feature
kernel, one path: the real run's batch order):

* ``oracle_kernel_K`` (K ∈ {2, 4, 8}): the head-aware model re-linearised at the REAL
  backbone weights at the K − 1 inner boundaries (the feature kernel k_b read off the real
  network's logit-summed Θ there), the prediction's own state (features h_0 + φ, head,
  velocities) carried on: what a predictor that follows the real kernel would reach;
* ``oracle_state_K``: the same, and the state reset to the real network's at each boundary
  (features h(θ_k), head (W_k, b_k), optax velocities, the backbone's as J_h(θ_k)·v_θ): only
  the error made within T/K steps of linearisation is left;
* level vs shape: T_ε is invariant to rescaling the curve's fall (|L_t − L_T| ≤ ε(L_0 − L_T)
  is unchanged by L ↦ L_0 − a(L_0 − L)), so all of its error is shape; the final-loss ratio
  L̂_T / L_T and the error of the steps to reach an absolute loss are reported with and
  without that rescaling;
* horizon: real and predicted T_ε of the stored curves cut at T' < T;
* SGD noise (SGD rows): real fine-tunes with ``--orders − 1`` other batch orders; the spread
  of the real T_ε over orders is the floor of any prediction of one order.

Rows go to ``OUT/rows/<row_id>.json`` as they finish (an interrupted run resumes and skips
them); ``--report`` gathers ``rows.parquet``, ``summary.json`` and ``budget.csv``.

    python experiments/error_budget.py --out runs/budget                  # N = 250 and 750
    python experiments/error_budget.py --out runs/budget --report
    python experiments/error_budget.py --out /tmp/b --per-class 10 --kappas 4 --steps 20 \\
        --datasets flowers5_300pc --configs bN-m0                          # smoke
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd
from _args import at_least, fail, no_rows  # experiments/_args.py, beside this script
from kernel_evolution import _jit_eval, _jit_step  # the same jitted step and loss

import ntk_tt
from ntk_tt.dynamics._losses import mean_loss
from ntk_tt.dynamics._predict_head_aware import HeadState, head_aware_trajectory, initial_state
from ntk_tt.sweep._grid import SweepSpec, Task
from ntk_tt.sweep._load import _task_key, load_task

SWEEP = pathlib.Path(__file__).parent / "results" / "sweep" / "results.parquet"
LOSS = "cross_entropy"
EPSILONS = (0.01, 0.1, 0.4)
SEGMENTS = (2, 4, 8)
HORIZONS = (50, 75, 100)


def boundaries(steps: int, k: int) -> np.ndarray:
    """Segment ends 0 = t_0 < ... < t_K = T (those of K = 2 and 4 are among K = 8's)."""
    return np.linspace(0, steps, k + 1).round().astype(int)


def real_run(data, key, lr, mom, steps, batch_size, keep):
    """The sweep's real fine-tune (optax sgd, ``batch_indices(key, N, B, T)``, full-set loss
    after every step): loss curve (T + 1,) and (params, optax state) at the steps in
    ``keep``. Stops at the first non-finite loss (curve held from there, as the sweep)."""
    n = data.x.shape[0]
    batches = ntk_tt.batch_indices(key, n, n if batch_size is None else batch_size, steps)
    step, ev = _jit_step(data.apply_fn), _jit_eval(data.apply_fn)
    params, state = data.params, optax.sgd(0.1, 0.9).init(data.params)
    lr, mom = jnp.float32(lr), jnp.float32(mom)
    curve = np.full(steps + 1, np.nan)
    curve[0] = float(ev(params, data.x, data.y))
    saved = {0: (params, state)}
    for t in range(steps):
        params, state = step(params, state, data.x, data.y, batches[t], lr, mom)
        curve[t + 1] = float(ev(params, data.x, data.y))
        if not np.isfinite(curve[t + 1]):
            curve[t + 1:] = curve[t]
            break
        if t + 1 in keep:
            saved[t + 1] = (params, state)
    return curve, saved, batches


def _split_of(params, data):
    """``split_head`` of the model at ``params`` (or of an optax trace with the params'
    structure): (feature_fn, backbone pytree in ``split_head``'s structure, W (F, C), b (C,))."""
    feature_fn, bparams, _, _ = data.split
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    is_head = ["head" in jax.tree_util.keystr(k[:1]) for k, _ in flat]
    back = [v for (_, v), h in zip(flat, is_head, strict=True) if not h]
    head = [v for (_, v), h in zip(flat, is_head, strict=True) if h]
    treedef = jax.tree.structure(bparams)
    assert treedef.num_leaves == len(back), "unexpected params layout"
    w = next(v for v in head if v.ndim == 2)
    b = next(v for v in head if v.ndim == 1)
    return feature_fn, jax.tree.unflatten(treedef, back), w, b


def _trace(opt_state):
    """The optax sgd momentum trace (a params pytree) of ``optax.sgd(·, m)`` state."""
    return opt_state[0].trace


def oracle_curve(data, saved, batches, lr, mom, steps, k, reset, hk0, kernels):
    """Loss curve (T + 1,) of the head-aware model re-linearised at the real weights at the
    K − 1 inner boundaries; ``reset``: the state is also reset to the real network's.
    ``kernels``: a cache {t: head-aware kernel at the real weights of step t}."""
    y = data.y
    kw = dict(learning_rate=jnp.float32(lr), momentum=jnp.float32(mom), nesterov=False,
              loss=LOSS)
    ends = boundaries(steps, k)
    state, hk, parts = initial_state(hk0), hk0, []
    for s in range(k):
        if s:
            params, opt_state = saved[int(ends[s])]
            split = _split_of(params, data)
            if int(ends[s]) not in kernels:
                kernels[int(ends[s])] = ntk_tt.head_aware_kernel(split, data.x)
            new = kernels[int(ends[s])]
            if reset:
                feature_fn, back, w, b = split
                _, tb, uw, ub = _split_of(_trace(opt_state), data)
                _, vphi = jax.jvp(functools.partial(feature_fn, x=data.x), (back,), (tb,))
                hk = new
                z = jnp.zeros_like(new.features)
                state = HeadState(w, b, z, uw, ub, vphi, z, z, None, None)
            else:
                hk = new._replace(features=hk.features + state.phi)
                state = initial_state(hk, state.w, state.b, (state.uw, state.ub, state.u_q))
        f, _, state = _trajectory(hk, y, batches[ends[s]:ends[s + 1]], state, **kw)
        parts.append(f if s == 0 else f[1:])
    fs = jnp.concatenate(parts)
    return np.asarray(jax.vmap(lambda f: mean_loss(f, y, LOSS))(fs), np.float64)


@functools.partial(jax.jit, static_argnames=("nesterov", "loss"))
def _trajectory(hk, y, batches, state, **kw):
    return head_aware_trajectory(hk, y, batches, state0=state, **kw)


def t_eps(curve) -> dict[str, float | None]:
    out = {}
    for e in EPSILONS:
        t = ntk_tt.training_time(np.asarray(curve), e)
        out[f"{e:g}"] = None if not np.isfinite(t) else float(t)
    return out


def steps_to(curve, level) -> float | None:
    """First step whose loss is ≤ ``level`` (an absolute target), None if never."""
    hit = np.nonzero(np.asarray(curve) <= level)[0]
    return float(hit[0]) if hit.size else None


def level_shape(pred, real) -> dict:
    """Final-loss ratio, and absolute-target steps of the prediction as is and rescaled to
    the real fall (L_0 − a(L_0 − L̂), a = (L_0 − L_T)/(L_0 − L̂_T)) for targets at 50 %,
    30 % and 20 % of L_0 above... i.e. L* = L_0 − q·(L_0 − L_T), q ∈ {0.5, 0.8, 0.9}."""
    pred, real = np.asarray(pred), np.asarray(real)
    l0, lt, pt = real[0], real[-1], pred[-1]
    a = (l0 - lt) / (l0 - pt)
    rescaled = l0 - a * (l0 - pred)
    out = {"final_ratio": float(pt / lt)}
    for q in (0.5, 0.8, 0.9):
        level = l0 - q * (l0 - lt)
        out[f"abs_q{q:g}"] = {"real": steps_to(real, level), "pred": steps_to(pred, level),
                              "pred_rescaled": steps_to(rescaled, level)}
    return out


def select_rows(args) -> pd.DataFrame:
    df = pd.read_parquet(SWEEP)
    df = df[df.dataset.isin(args.datasets) & df.per_class.isin(args.per_class)]
    df = df[np.isclose(df.kappa_eff.to_numpy()[:, None], np.array(args.kappas)).any(1)]
    if args.configs:
        keep = df.config_id.map(lambda c: any(c.startswith(p + "-") for p in args.configs))
        df = df[keep.astype(bool)]  # an empty object-dtype mask selected columns, not rows
    return df.sort_values(["num_train", "dataset", "config_id"])


def run_row(row, data, args, hk0) -> dict:
    steps = args.steps or int(row.steps)
    key = _task_key(Task(row.dataset, int(row.per_class), int(row.seed)))
    b = None if row.optimizer == "gd" else int(row.batch_size)
    lr, mom = float(row.learning_rate), float(row.momentum)
    keep = set(boundaries(steps, max(SEGMENTS)).tolist())
    t0 = time.perf_counter()
    real, saved, batches = real_run(data, key, lr, mom, steps, b, keep)
    sec_real = time.perf_counter() - t0
    stored = np.asarray(row.real_loss)[: steps + 1]
    match = float(np.max(np.abs(real - stored)) / abs(stored[0]))
    out = {"row_id": row.row_id, "task_id": row.task_id, "dataset": row.dataset,
           "num_train": int(row.num_train), "config_id": row.config_id,
           "optimizer": row.optimizer, "batch_size": int(row.batch_size), "momentum": mom,
           "kappa_eff": float(row.kappa_eff), "learning_rate": lr, "steps": steps,
           "real_matches_stored": match, "seconds_real": sec_real,
           "real_diverged": bool(real[-1] > real[0] or not np.isfinite(real).all()),
           "curves": {"real": real.tolist()}}
    t0 = time.perf_counter()
    kernels: dict = {}
    out["curves"]["default"] = oracle_curve(data, saved, batches, lr, mom, steps, 1, False,
                                            hk0, kernels).tolist()
    for k in SEGMENTS:
        for reset in (False, True):
            name = f"oracle_{'state' if reset else 'kernel'}_{k}"
            out["curves"][name] = oracle_curve(data, saved, batches, lr, mom, steps, k,
                                               reset, hk0, kernels).tolist()
    out["seconds_oracles"] = time.perf_counter() - t0
    if row.optimizer == "sgd":
        out["curves"]["real_orders"] = []
        for j in range(1, args.orders):
            c, _, _ = real_run(data, jax.random.fold_in(key, 1000 + j), lr, mom, steps, b,
                               set())
            out["curves"]["real_orders"].append(c.tolist())
    out["t_eps"] = {name: t_eps(c) for name, c in out["curves"].items()
                    if name != "real_orders"}
    out["t_eps_orders"] = [t_eps(c) for c in out["curves"].get("real_orders", [])]
    out["level_shape"] = level_shape(out["curves"]["default"], real)
    out["horizon"] = {str(h): {"real": t_eps(real[: h + 1]),
                               "default": t_eps(np.asarray(out["curves"]["default"])[: h + 1])}
                      for h in HORIZONS if h < steps}
    return out


def task_kernels(frame: pd.DataFrame):
    """Per task of a sweep-table ``frame``: (its data as the sweep loaded it, its head-aware
    kernel at θ_0, its rows), for the one-off oracles built on this module."""
    for _, group in frame.groupby("task_id"):
        r0 = group.iloc[0]
        task = Task(r0.dataset, int(r0.per_class), int(r0.seed))
        data = load_task(task, SweepSpec(datasets=(task.dataset,), per_class=(task.per_class,),
                                         seeds=(task.seed,)))
        yield data, ntk_tt.head_aware_kernel(data.split, data.x), group


def collect(out: pathlib.Path, args) -> None:
    rows_dir = out / "rows"
    rows_dir.mkdir(parents=True, exist_ok=True)
    todo = select_rows(args)
    print(f"{len(todo)} rows selected", flush=True)
    for task_id, group in todo.groupby("task_id", sort=False):
        pending = [r for r in group.itertuples() if not (rows_dir / f"{r.row_id}.json").exists()]
        if not pending:
            continue
        r0 = pending[0]
        task = Task(r0.dataset, int(r0.per_class), int(r0.seed))
        data = load_task(task, SweepSpec(datasets=(r0.dataset,), per_class=(r0.per_class,),
                                         seeds=(r0.seed,)))
        hk0 = ntk_tt.head_aware_kernel(data.split, data.x)
        for row in pending:
            t0 = time.perf_counter()
            res = run_row(row, data, args, hk0)
            tmp = rows_dir / f".{row.row_id}.json.tmp"
            tmp.write_text(json.dumps(res))
            tmp.rename(rows_dir / f"{row.row_id}.json")
            te = res["t_eps"]
            print(f"{task_id} {row.config_id}: real {te['real']['0.1']} default "
                  f"{te['default']['0.1']} oracle_kernel_8 {te['oracle_kernel_8']['0.1']} "
                  f"oracle_state_8 {te['oracle_state_8']['0.1']} "
                  f"(match {res['real_matches_stored']:.1e}, {time.perf_counter() - t0:.0f} s)",
                  flush=True)


def _rel(pred, real):
    if pred is None or real is None or real == 0:
        return np.nan
    return abs(pred - real) / real


def report(out: pathlib.Path) -> None:
    rows = [json.loads(p.read_text()) for p in sorted((out / "rows").glob("*.json"))]
    recs = []
    for r in rows:
        base = {k: r[k] for k in ("row_id", "dataset", "num_train", "optimizer", "momentum",
                                  "config_id", "real_diverged")}
        base["kappa_eff"] = round(r["kappa_eff"], 3)
        real = r["t_eps"]["real"]
        for e in ("0.1", "0.4"):
            rec = dict(base, eps=float(e))
            for name, te in r["t_eps"].items():
                if name != "real":
                    rec[name] = _rel(te[e], real[e])
            others = [o[e] for o in r["t_eps_orders"]]
            rec["sgd_floor"] = (np.nanmax([_rel(o, real[e]) for o in others])
                                if others else np.nan)
            for h, hv in r["horizon"].items():
                rec[f"horizon_{h}"] = _rel(hv["default"][e], hv["real"][e])
            recs.append(rec)
        ls = r["level_shape"]
        for q in ("0.5", "0.8", "0.9"):
            a = ls[f"abs_q{q}"]
            recs[-1][f"abs_q{q}"] = _rel(a["pred"], a["real"])
            recs[-1][f"abs_q{q}_rescaled"] = _rel(a["pred_rescaled"], a["real"])
        recs[-1]["final_ratio"] = ls["final_ratio"]
    df = pd.DataFrame(recs)
    df.to_parquet(out / "rows.parquet")
    cols = ["default"] + [f"oracle_{v}_{k}" for v in ("kernel", "state") for k in SEGMENTS]
    p95 = functools.partial(np.nanpercentile, q=95)

    def table(frame):
        g = frame.groupby(["num_train", "kappa_eff", "optimizer"])
        t = g[cols + ["sgd_floor"]].agg(p95)
        t["rows"] = g.size() // 2
        return t

    frame = df[~df.real_diverged]
    summary = {"rows": len(rows), "p95": {c: float(p95(frame[c])) for c in cols},
               "by": table(frame).round(3).reset_index().to_dict("records"),
               "sgd_floor_p95": float(p95(frame[frame.optimizer == "sgd"]["sgd_floor"])),
               "horizon_p95": {h: float(p95(frame[f"horizon_{h}"])) for h in HORIZONS
                               if f"horizon_{h}" in frame},
               "final_ratio_median": float(frame["final_ratio"].median())}
    for q in ("0.5", "0.8", "0.9"):
        if f"abs_q{q}" in frame:
            summary[f"abs_q{q}_p95"] = float(p95(frame[f"abs_q{q}"]))
            summary[f"abs_q{q}_rescaled_p95"] = float(p95(frame[f"abs_q{q}_rescaled"]))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    table(frame).round(3).to_csv(out / "budget.csv")
    print(json.dumps({k: v for k, v in summary.items() if k != "by"}, indent=1))
    print(table(frame).round(3).to_string())


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=pathlib.Path)
    p.add_argument("--report", action="store_true")
    p.add_argument("--datasets", nargs="+",
                   default=["cifar10_test", "flowers5_300pc", "mnist_test", "notmnist"])
    p.add_argument("--per-class", nargs="+", type=int, default=[50, 150])
    p.add_argument("--kappas", nargs="+", type=float, default=[1.0, 4.0, 12.0])
    p.add_argument("--configs", nargs="*", default=["bN-m0", "bN-m0.9", "b50-m0", "b50-m0.9"],
                   help="config id prefixes (batch and momentum), e.g. bN-m0 b50-m0.9")
    p.add_argument("--orders", type=int, default=3, help="real batch orders for SGD rows")
    p.add_argument("--steps", type=int, default=None, help="override T (smoke runs only)")
    args = p.parse_args(argv)
    # a fresh user's --datasets bogus / --kappas -1 were a KeyError, an --out file a
    # NotADirectoryError, --report on a missing folder a pandas error, --steps -5 a traceback
    # after the kernel
    if args.out.exists() and not args.out.is_dir():
        fail(p, f"--out {args.out} is a file; give a folder (it holds rows/ and the table).")
    if args.report and not (args.out / "rows").is_dir():
        fail(p, f"--report reads {args.out / 'rows'}, which does not exist: run without "
                "--report first.")
    if args.steps is not None:
        at_least(p, "--steps", args.steps, 1, integer=True)
    at_least(p, "--orders", args.orders, 1, integer=True)
    if not args.report:
        no_rows(select_rows(args), f"--datasets {args.datasets}, --per-class "
                                   f"{args.per_class}, --kappas {args.kappas} and --configs "
                                   f"{args.configs}")
        collect(args.out, args)
    report(args.out)


if __name__ == "__main__":
    main()
