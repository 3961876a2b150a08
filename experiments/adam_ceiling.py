"""Error budget of the fast AdamW predictor (issue 27): how much of its T_ε error the model it
approximates already makes.

The fast predictor (``ntk_tt.predict`` with an ``AdamKernel``) approximates, in function
space, Adam(W) on the head-aware linearised model f = (h_0 + J_h(θ − θ_0))W + b. Running that
model's Adam exactly in weight space (optax on (θ, W, b), the real run's batch order; the
"head-aware reference" of ``experiments/adam_batch_gap.py``) on every committed AdamW row of
the optimiser benchmark (``experiments/results/optimizers``, N = 250, four target sets; or of
another table with ``--per-class`` and ``--table``, e.g. N = 750) splits the predictor's error
into

- the reference against the real run: the ceiling of any predictor of that model, and
- the fast predictor against the reference: its own approximation.

T_ε (ε ∈ {0.1, 0.4}) and the steps to the absolute losses 0.5·L_0 and 0.25·L_0 are scored with
the sweep's rule (``adam_batch_gap._rel``); the fast predictor's curve is the stored one.

    python experiments/adam_ceiling.py [--out DIR] [DATASET ...]   # ~15 min on 2 CPU cores
    python experiments/adam_ceiling.py --per-class 150 --table experiments/results/optimizers_750
        --out DIR cifar10_test                     # N = 750, one target set (~15 min)
    python experiments/adam_ceiling.py --order 2 --out DIR   # a second-order backbone

``--order 2`` runs the reference with the backbone's features expanded to second order,
f = (h_0 + J_hΔθ + ½H_h[Δθ, Δθ])W + b (``backbone_order.taylor_reference``, nested
``jax.jvp``): how much of the ceiling's own error a quadratic backbone removes (for constant-η
GD at N = 250 it took T_ε p95 from 10.6 to 7.5 %, issue 26). Records and summary say ``"order": 2``.
``--order r1`` keeps only a rank-one quadratic term along the direction d of Adam's first
full-batch step, ½(d·Δθ)²H_h[d, d] (``backbone_order.adam_direction``; one more jvp than
order 1 in function space): whether the curvature that order 2 adds lies along that one
direction (README "A second-order backbone closes most of it").

Writes DIR/rows.json (resumes per task) and DIR/summary.json (default /tmp/adam_ceiling).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np
from _args import at_least, folder, known_sets, out_dir  # experiments/_args.py, beside this script

from ntk_tt.sweep._load import _task_key
from ntk_tt.sweep._optimizers import OptimSpec, row_id

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from adam_batch_gap import (  # noqa: E402
    BENCH_TARGETS,
    EPS_T,
    _rel,
    build,
    reference,
    score_curves,
    stored,
)
from backbone_order import adam_direction, taylor_reference  # noqa: E402

SIDES = ("stored", "reference")
TARGETS = (("T_eps", [f"T{e:g}" for e in EPS_T]), ("L_star", ["L0.5", "L0.25"]))


def score_task(spec, task, rows, order: int | str = 1):
    key, n = _task_key(task), task.num_train
    t0 = time.perf_counter()
    data, _, lam = build(spec, task)
    out = []
    for cfg in (c for c in spec.configs(task) if c.family == "adamw_cosine"):
        opt = spec.optimizer(cfg, lam, n)
        rid = row_id(task, cfg)
        r = rows[rid]
        curves = {"real": np.asarray(r["real_loss"], float),
                  "stored": np.asarray(r["pred_loss"], float),
                  "reference": np.asarray(
                      reference(data, opt, spec.steps, key)["loss"] if order == 1 else
                      taylor_reference(data.split, data.x, data.y, opt, steps=spec.steps,
                                       key=key, order=2, direction=None if order == 2 else
                                       adam_direction(data.split, data.x, data.y,
                                                      float(opt.eps)))["loss"], float)}
        rec = {"row_id": rid, "task_id": task.id,
               "optimizer": "gd" if cfg.batch_size is None else "sgd", "peak": cfg.peak,
               "weight_decay": cfg.weight_decay, "order": order}
        rec |= score_curves(curves, bool(r["real_diverged"]))
        rec |= {f"{name}_final": float(curve[-1]) for name, curve in curves.items()}
        out.append(rec)
        print(f"  {rid}: T0.1/T0.4 predicted {rec['stored_T0.1']:.0f}/{rec['stored_T0.4']:.0f}"
              f" reference {rec['reference_T0.1']:.0f}/{rec['reference_T0.4']:.0f} real "
              f"{rec['real_T0.1']:.0f}/{rec['real_T0.4']:.0f}", flush=True)
    return {"rows": out, "seconds": time.perf_counter() - t0}


def _stats(errors):
    a, s = (np.concatenate(v) for v in zip(*errors, strict=True))
    return {"n": int(a.size), "p95": float(np.percentile(a, 95)) if a.size else None,
            "median_abs": float(np.median(a)) if a.size else None,
            "median_signed": float(np.nanmedian(s)) if np.isfinite(s).any() else None}


def stats(recs):
    """p95 / medians per group: each side against the real run, and the predictor against
    the reference (the reference in the real run's place)."""
    groups = {"all": recs}
    for opt in ("gd", "sgd"):
        groups[opt] = [r for r in recs if r["optimizer"] == opt]
        for p in sorted({r["peak"] for r in groups[opt]}):
            groups[f"{opt}_peak{p:g}"] = [r for r in groups[opt] if r["peak"] == p]
    out = {}
    for g, sub in groups.items():
        block = {}
        for target, cols in TARGETS:
            for side in SIDES:
                block[f"{target}_{side}_vs_real"] = _stats(
                    [_rel([r[f"{side}_{c}"] for r in sub], [r[f"real_{c}"] for r in sub])
                     for c in cols])
            if target == "T_eps":  # absolute targets are defined on the real curve's L_0 only
                block["T_eps_stored_vs_reference"] = _stats(
                    [_rel([r[f"stored_{c}"] for r in sub], [r[f"reference_{c}"] for r in sub])
                     for c in cols])
        out[g] = block
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("datasets", nargs="*", default=list(BENCH_TARGETS))
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("/tmp/adam_ceiling"))
    ap.add_argument("--per-class", type=int, default=50, help="the tasks' images per class")
    ap.add_argument("--order", type=lambda v: v if v == "r1" else int(v),
                    choices=(1, 2, "r1"), default=1,
                    help="the reference backbone's order in Δθ (1: linearised; r1: order 2 "
                         "rank one along Adam's first step)")
    ap.add_argument("--table", default="experiments/results/optimizers",
                    help="the optimiser-benchmark folder holding those rows")
    args = ap.parse_args(argv)
    out_dir(ap, args.out)  # these were tracebacks, after an empty --out folder was made
    at_least(ap, "--per-class", args.per_class, 1, integer=True)
    folder(ap, args.table, "--table", "an optimiser-benchmark folder")
    known_sets(ap, args.datasets, "datasets")
    args.out.mkdir(parents=True, exist_ok=True)
    spec = OptimSpec(datasets=tuple(args.datasets), per_class=(args.per_class,))
    rows = stored(args.table)
    path = args.out / "rows.json"
    done = json.loads(path.read_text()) if path.exists() else {}
    for task in spec.tasks():
        if task.id not in done:
            print(task.id, flush=True)
            done[task.id] = score_task(spec, task, rows, args.order)
            path.write_text(json.dumps(done))
    recs = [r for t in done.values() for r in t["rows"]]
    if {r.get("order", 1) for r in recs} != {args.order}:
        raise SystemExit(f"{path} holds rows of another --order; use a new --out.")
    summary = {"tasks": list(done), "n_rows": len(recs), "order": args.order,
               "stats": stats(recs),
               "seconds": {t: d["seconds"] for t, d in done.items()}}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    for g, b in summary["stats"].items():
        print(f"{g:14s} " + " | ".join(
            f"{k} p95 {100 * v['p95']:.1f}% med {100 * (v['median_signed'] or np.nan):+.1f}%"
            for k, v in b.items() if v["n"]))


if __name__ == "__main__":
    main()
