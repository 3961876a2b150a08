"""The fast AdamW predictor with K_P's step sized by its own form along the current gradient
(issue 27; a candidate fix for the speed bias diagnosed in ``experiments/adam_batch_gap.py``).

Today's drift factor c_t (``ntk_tt.dynamics._adam_drift``) divides the profile model's
weight-space loss decrease by a *modelled* K_P form, (1 − λ')·T_0(λ_ref)/γ_0 + λ'·T_1(λ_ref)/γ_1:
K_P's form along g_0 and along the mean per-sample deviation, calibrated at θ_0. Along the
later gradients the isotropic K_P's form is 1.3–1.6× the exact weight-space one
(``adam_batch_gap.py --logit``), so the predicted step is too large there. The fix replaces
the modelled denominator by K_P's actual form along the step's own gradient,
‖Q_t‖²_{K_P}·‖g_0‖²/‖g_t‖² (one more quadratic form per step, no kernel): the step's
first-order loss decrease then equals the profile model's weight-space decrease whatever
K_P's form along that direction. It equals today's step at GD's first update (both are
‖g_0‖²_{K_P} there).

Scored like ``adam_batch_gap.py --benchmark`` on the committed AdamW rows of the optimiser
benchmark (``experiments/results/optimizers``, N = 250, the four target sets): the sweep's
prediction recomputed ("before", checked against the stored curve) and the fix ("after"),
T_ε (ε ∈ {0.1, 0.4}) and the absolute loss targets against the stored real curves.

    python experiments/adam_path_form.py [--out DIR] [DATASET ...]   # ~2 min on 2 CPU cores
    python experiments/adam_path_form.py --decompose GAP_DIR [--out DIR]

Writes DIR/rows.json (resumes per task) and DIR/summary.json (default /tmp/adam_path_form).
``--decompose`` reads the per-step sums that ``adam_batch_gap.py`` (default run) stored along
the head-aware reference's path (GAP_DIR/diag_p0.001_b{N,50}.npz) and writes
DIR/decomposition.json: over windows of steps, lr-weighted ratios of the predictor's
first-order loss decrease ("pred"), the profile model's with the predictor's K_h-form λ and
s ("model_k") and with the exact weight-space ones ("model_w"), and Adam's own ("true"); the
K_h form of the off-g_0 gradient against its weight-space norm (rest_k / rest_w) and the
second-moment levels (s_k / s_w).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from _args import folder, known_sets, out_dir  # experiments/_args.py, beside this script

import ntk_tt
from ntk_tt.dynamics import _adam_head_aware as aha
from ntk_tt.dynamics._adam_drift import _on_grid
from ntk_tt.sweep._optimizers import OptimSpec

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from adam_batch_gap import (  # noqa: E402
    BENCH_TARGETS,
    before_after_rows,
    bench_stats,
    build,
    print_stats,
    stored,
)


def path_form_core():
    """``_adam_core`` re-traced with the drift factor's modelled K_P form replaced by K_P's
    form along the step's own gradient (module docstring)."""
    orig_qf, orig_ds = aha.quadratic_form, aha.drift_scale
    core0 = aha._adam_core.__wrapped__

    @partial(jax.jit, static_argnames="loss")
    def core(hk, hp, y, optimizer, batches, a_h, a_h_test, *, loss, table=None):
        last = {}

        def qf(kernel, idx, q):  # the core's ‖g_t‖² call: remember the step's gradient
            last["idx"], last["q"] = idx, q
            return orig_qf(kernel, idx, q)

        def ds(table, moments, along, rest, big_g, b2, c2, tiny):
            moments, size = orig_ds(table, moments, along, rest, big_g, b2, c2, tiny)
            norm = along**2 * big_g + rest
            lam_now = rest / jnp.maximum(norm, tiny)
            r0, r1 = _on_grid(table, table.ref)
            g0, g1 = table.calibration[0], table.calibration[1]
            modelled = (1 - lam_now) * r0 / g0 + lam_now * r1 / g1
            actual = orig_qf(hp, last["idx"], last["q"]) * big_g / jnp.maximum(norm, tiny)
            return moments, size * modelled / jnp.maximum(actual, tiny)

        aha.quadratic_form, aha.drift_scale = qf, ds
        try:
            return core0(hk, hp, y, optimizer, batches, a_h, a_h_test, loss=loss, table=table)
        finally:
            aha.quadratic_form, aha.drift_scale = orig_qf, orig_ds

    return core


def score_task(spec, task, rows, core):
    n = task.num_train
    t0 = time.perf_counter()
    data, hk, lam = build(spec, task)
    cfgs = [c for c in spec.configs(task) if c.family == "adamw_cosine"]
    aks = {}
    for bsz in dict.fromkeys(c.batch_size for c in cfgs):
        opt = spec.optimizer(next(c for c in cfgs if c.batch_size == bsz), lam, n)
        aks[bsz] = ntk_tt.adam_head_aware_kernel(data.split, data.x, data.y, opt, hk=hk)
    out = before_after_rows(spec, task, data, lam, rows, aks, dict.fromkeys(aks, core))
    return {"rows": out, "seconds": time.perf_counter() - t0}


def decompose(gap_dir: pathlib.Path) -> dict:
    """The module docstring's ``--decompose`` ratios, per batch size and window of steps."""
    out = {}
    for tag in ("bN", "b50"):
        d = np.load(gap_dir / f"diag_p0.001_{tag}.npz")
        lr = d["lrs"]
        out[tag] = {}
        for a, b in ((1, 16), (16, 41), (41, 150)):
            def tot(k, a=a, b=b, d=d, lr=lr):
                return float(np.sum(lr[a:b] * d[k][a:b]))
            out[tag][f"{a}-{b - 1}"] = {
                "pred/true": tot("pred") / tot("true"),
                "pred/model_k": tot("pred") / tot("model_k"),
                "model_k/true": tot("model_k") / tot("true"),
                "model_w/true": tot("model_w") / tot("true"),
                "rest_k/rest_w": float(np.sum(d["rest_k"][a:b]) / np.sum(d["rest_w"][a:b])),
                "s_k/s_w": float(np.mean(d["s_k"][a:b]) / np.mean(d["s_w"][a:b]))}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("datasets", nargs="*", default=list(BENCH_TARGETS))
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("/tmp/adam_path_form"))
    ap.add_argument("--decompose", type=pathlib.Path, metavar="GAP_DIR")
    args = ap.parse_args(argv)
    out_dir(ap, args.out)  # these were tracebacks, after an empty --out folder was made
    if args.decompose:  # reads adam_batch_gap.py's files only: no target set needed
        folder(ap, args.decompose, "--decompose", "adam_batch_gap.py's output folder")
    else:
        known_sets(ap, args.datasets, "datasets")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.decompose:
        res = decompose(args.decompose)
        (args.out / "decomposition.json").write_text(json.dumps(res, indent=1))
        print(json.dumps(res, indent=1))
        return
    spec = OptimSpec(datasets=tuple(args.datasets), per_class=(50,))
    rows, core = stored(), path_form_core()
    path = args.out / "rows.json"
    done = json.loads(path.read_text()) if path.exists() else {}
    for task in spec.tasks():
        if task.id not in done:
            print(task.id, flush=True)
            done[task.id] = score_task(spec, task, rows, core)
            path.write_text(json.dumps(done))
    recs = [r for t in done.values() for r in t["rows"]]
    summary = {"tasks": list(done), "n_rows": len(recs),
               "max_abs_dloss_before_vs_stored": max(r["max_abs_dloss_vs_stored"] for r in recs),
               "stats": bench_stats(recs)}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print_stats(summary["stats"])


if __name__ == "__main__":
    main()
