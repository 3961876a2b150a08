"""Seconds of the subspace feature kernel per call: the Jacobian program bound to Z (reused
for every basis of the same shape) against a fresh closure over Z per call (compiled again).

    python experiments/subspace_compile.py [--per-class 10] [--datasets ...] [--repeats 2]

Side by side in one process, alternating, on the sweep's tasks (5 classes × ``--per-class``
images of each target set, the shipped checkpoint with a fresh head): ``head_aware_kernel(
split, x, backbone="subspace")`` as shipped (``_Projected`` bound to Z with
``jax.tree_util.Partial``) and the same K_Z through ``empirical_ntk`` of a new
``lambda p, x: feature_fn(p, x) @ Z`` per call (how ``_Projected`` was keyed before: by
identity). The first task of each pays its compilation; the later ones show what a sweep over
tasks, data sets or budgets pays per kernel. Prints the seconds, their ratio and the largest
difference between the two kernels (they must agree). Reads ``../shared/data``.
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import jax
import numpy as np
from _args import at_least, known_sets  # experiments/_args.py, beside this script

import ntk_tt
from ntk_tt.kernels._head_aware import feature_basis
from ntk_tt.kernels._ntk import empirical_ntk
from ntk_tt.sweep._grid import SweepSpec, Task
from ntk_tt.sweep._load import load_task

TARGETS = ("cifar10_test", "mnist_test", "notmnist", "flowers5_300pc")


def _timed(fn):
    t = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - t


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-class", type=int, default=10)
    ap.add_argument("--datasets", nargs="+", default=list(TARGETS))
    ap.add_argument("--repeats", type=int, default=2, help="calls per task and way")
    a = ap.parse_args(argv)
    at_least(ap, "--repeats", a.repeats, 1, integer=True)  # 0 printed "nan" and exited 0
    at_least(ap, "--per-class", a.per_class, 1, integer=True)
    known_sets(ap, a.datasets, "--datasets")
    rows = []
    for ds in a.datasets:
        task = Task(ds, a.per_class, 0)
        data = load_task(task, SweepSpec(datasets=(ds,), per_class=(a.per_class,), seeds=(0,)))
        feature_fn, bparams = data.split[:2]
        for rep in range(a.repeats):
            hk, bound = _timed(partial(ntk_tt.head_aware_kernel, data.split, data.x,
                                       backbone="subspace"))
            z = feature_basis(feature_fn(bparams, data.x), hk.basis.shape[1])
            closure = lambda p, xx, f=feature_fn, zz=z: f(p, xx) @ zz  # noqa: E731
            kz, fresh = _timed(partial(empirical_ntk, closure, bparams, data.x))
            diff = float(np.max(np.abs(np.asarray(kz) - np.asarray(hk.backbone))))
            rows.append((ds, rep, bound, fresh))
            print(f"{ds} call {rep}: bound {bound:.2f} s, fresh closure {fresh:.2f} s "
                  f"({fresh / bound:.1f}x); max |ΔK_Z| {diff:.1e} "
                  f"(of {float(np.max(np.abs(hk.backbone))):.1e})", flush=True)
    later = rows[1:]
    print(f"N = {5 * a.per_class}: median seconds per kernel after the first call: bound "
          f"{np.median([r[2] for r in later]):.2f}, fresh closure "
          f"{np.median([r[3] for r in later]):.2f} "
          f"({np.median([r[3] for r in later]) / np.median([r[2] for r in later]):.1f}x)")


if __name__ == "__main__":
    main()
