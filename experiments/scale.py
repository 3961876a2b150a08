"""Larger N from a subset (App. D) on CPU: wall time and memory of every stage, and T_ε.

    python experiments/scale.py                      # notmnist, N = 4,000 and 10,000, N' = 1,000
    python experiments/scale.py --dataset mnist_test --per-class 400,892
    python experiments/scale.py --per-class 15 --subset 50 --out /tmp/scale_tiny  # smoke

Shipped checkpoint with a fresh seeded 10-output head
(``ntk_tt.prediction._job.load_task``: the same
task, head and preprocessing as ``ntk-tt predict --dataset D -K 10 -n n --seed s``), all
K = 10 classes × n images (notmnist: 1,000 per class, so n = 1,000 is the whole file), mean
MSE loss, full-batch GD, T = ``--steps``. For every n in ``--per-class`` (N = 10·n) and each
``--methods`` entry, ``ntk_tt.predict_from_subset`` predicts the loss curve from a
class-balanced subset of N' = ``--subset`` images (the same subset for both methods: same
key); for every n in ``--full-per-class`` (default: the smallest n) the full traced kernel
N × N is also built and Prop. 2 applied to its exact spectrum (the reference the subset T_ε is
compared with).

η is fixed once for all cases, η = κ/μ_pilot with μ_pilot the top normalised eigenvalue of
the traced kernel of a 100-image pilot (10 per class, not counted in any case),
so every case predicts the same training; each case reports its own κ = η·μ_max. T_ε at the
other ``--kappas`` comes from the saved spectra (the same curve formula, no new kernel).

Each case runs in its own process (``--in-process`` to share one), so the peak memory is the
case's own: ``process_peak_rss_mib`` = the process's ru_maxrss (imports, data and model
included), ``rss_peak_mib`` / ``rss_delta_mib`` = peak RSS during the timed call and its rise
above the RSS before it (``experiments/_rss.py``). Seconds per stage exclude JAX compilation
(reported apart). Outputs in ``--out`` (default ``experiments/results/scale``):
``cases/<case>.json`` (+ ``.npz`` spectrum), written as each stage finishes (``status``), and
``summary.csv`` / ``summary.json`` rebuilt after each case. Resumable: a finished case is
skipped when the command is run again (options must match ``config.json``; ``--force``
recomputes).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

EPSILONS = (0.01, 0.1, 0.4)
K = 10
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _ints(text):
    return [int(v) for v in text.split(",") if v]


def _floats(text):
    return [float(v) for v in text.split(",") if v]


def _parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="notmnist", help="ntk_tt dataset name or .npz path")
    p.add_argument("--per-class", type=_ints, default=[400, 1000],
                   help="images per class n (N = 10·n), comma-separated")
    p.add_argument("--full-per-class", type=_ints, default=None,
                   help="n at which the full N×N traced kernel is also built (default: the "
                   "smallest --per-class; '' for none)")
    p.add_argument("--subset", type=int, default=1000, help="N', a multiple of 10")
    p.add_argument("--methods", default="power_law,nystrom")
    p.add_argument("--kappas", type=_floats, default=[1.0, 0.25],
                   help="κ targets (η = κ/μ_pilot); the first is the one each case runs")
    p.add_argument("--lr", type=float, default=None, help="η (default: from the pilot)")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(HERE / "results" / "scale"))
    p.add_argument("--force", action="store_true", help="recompute finished cases")
    p.add_argument("--in-process", action="store_true",
                   help="run every case in this process (peak memory then accumulates)")
    p.add_argument("--case", default=None, help=argparse.SUPPRESS)  # child: one case
    return p


def _fail(msg):
    from _args import exit_error  # experiments/_args.py, beside this script

    exit_error("scale.py", msg)


def _check_dataset(name: str) -> None:
    """A short name known here, or an .npz file, with K = 10 classes (read from its labels)."""
    from ntk_tt.data._data import known_datasets, load_dataset

    if not name.endswith(".npz") and name not in known_datasets():
        _fail(f"--dataset {name}: not a target set here; known: "
              f"{', '.join(known_datasets())}, or an .npz path.")
    try:
        classes = len(load_dataset(name).class_names)
    except ValueError as err:
        _fail(f"--dataset {name}: {err}")
    if classes < K:
        _fail(f"--dataset {name} has {classes} classes; scale.py samples K = {K}.")


def _case_name(dataset, n, method, subset):
    stem = Path(dataset).stem if dataset.endswith(".npz") else dataset
    return f"{stem}_n{n}_{method}" + ("" if method == "full" else f"_sub{subset}")


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def _cases(a):
    full = a.full_per_class if a.full_per_class is not None else [min(a.per_class)]
    out = []
    for pc in a.per_class:
        out += [(pc, m) for m in a.methods.split(",")]
        if pc in full:
            out.append((pc, "full"))
    return out


def _config(a):
    return {"dataset": a.dataset, "subset": a.subset, "steps": a.steps, "seed": a.seed,
            "kappas": a.kappas, "classes": K}


def load(dataset, num_classes, per_class, seed):
    """(apply_fn, params, x, y, seconds): the task of ``ntk-tt predict --dataset D -K K -n n
    --seed s`` (``load_task``: shipped checkpoint, fresh seeded head; no held-out split, which
    does not change the training images)."""
    import jax

    from ntk_tt.prediction._job import load_task

    t0 = time.perf_counter()
    apply_fn, params, x, y, *_ = load_task(dataset=dataset, num_classes=num_classes,
                                           per_class=per_class, test_per_class=0, seed=seed)
    x = jax.block_until_ready(x)
    return apply_fn, params, x, np.asarray(y), time.perf_counter() - t0


def _task(a, per_class):
    return load(a.dataset, K, per_class, a.seed)


def full_spectrum(apply_fn, params, x, y, stage):
    """Exact spectrum of the full N × N traced kernel (the reference): ``stage(name, fn)`` runs
    and times each of "kernel", "logits", "spectrum" and returns fn's value."""
    import ntk_tt
    from ntk_tt.prediction._subset import residual_in_blocks

    kern = stage("kernel", lambda: np.asarray(
        ntk_tt.empirical_ntk(apply_fn, params, x, trace_logits=True)))
    r = stage("logits", lambda: residual_in_blocks(apply_fn, params, x, y, 1000))
    return stage("spectrum", lambda: ntk_tt.kernel_spectrum(kern, r))


def subset_key(seed):
    """The subset draw's key (the same subset for every method)."""
    import jax

    return jax.random.fold_in(jax.random.key(seed), 3)


def _pilot_lr(a):
    """η = κ_0 / μ_max of the traced kernel of a 10-per-class pilot task."""
    import ntk_tt
    from ntk_tt.prediction._subset import residual_in_blocks

    apply_fn, params, x, y, _ = _task(a, 10)
    kern = ntk_tt.empirical_ntk(apply_fn, params, x, trace_logits=True)
    sp = ntk_tt.kernel_spectrum(kern, residual_in_blocks(apply_fn, params, x, y, 1000))
    mu = float(sp.eigenvalues[0])
    return a.kappas[0] / mu, mu


def _run_case(a, per_class, method, path: Path) -> None:
    """One case, its record rewritten after each stage."""
    import jax
    from _rss import PeakRSS

    import ntk_tt
    from ntk_tt.training._timing import Stopwatch

    wall0 = time.perf_counter()
    rec = {"config": _config(a), "learning_rate": a.lr, "per_class": per_class,
           "method": method, "status": "loading"}
    apply_fn, params, x, y, t_load = _task(a, per_class)
    n = len(y)
    rec |= {"n": n, "n_subset": None if method == "full" else a.subset,
            "num_params": ntk_tt.num_params(params), "seconds": {"load": t_load}, "rss": {}}
    secs, rss = rec["seconds"], rec["rss"]

    def stage(name, fn):
        with PeakRSS() as m, Stopwatch() as sw:
            out = jax.block_until_ready(fn())
        secs[name] = sw.seconds
        secs["compile"] = secs.get("compile", 0.0) + sw.compile_seconds
        rss[name] = {"peak_mib": m.peak_mib, "delta_mib": m.delta_mib, "base_mib": m.base_mib}
        rec["status"] = f"{name} done"
        _write_json(path, rec)
        return out

    if method == "full":
        sp = full_spectrum(apply_fn, params, x, y, stage)
        curve = stage("curve", lambda: np.asarray(ntk_tt.predict_curve_from_spectrum(
            sp, learning_rate=a.lr, steps=a.steps)))
        times = {e: ntk_tt.training_time(curve, e) for e in EPSILONS}
        kappa = a.lr * float(sp.eigenvalues[0])
        secs["total"] = sum(secs[s] for s in ("kernel", "logits", "spectrum", "curve"))
    else:
        def call():
            return ntk_tt.predict_from_subset(
                apply_fn, params, x, y, subset_size=a.subset, learning_rate=a.lr,
                steps=a.steps, method=method, key=subset_key(a.seed))

        with PeakRSS() as m:
            p = call()
        secs |= {k: v for k, v in p.seconds.items()}
        rss["predict_from_subset"] = {"peak_mib": m.peak_mib, "delta_mib": m.delta_mib,
                                      "base_mib": m.base_mib}
        sp, curve, times, kappa = p.spectrum, p.loss, p.training_time, p.kappa
        rec["subset_indices_head"] = [int(i) for i in p.subset_indices[:10]]
        rec["k0"] = p.hyperparameters["k0"]
    np.savez(path.with_suffix(".npz"), eigenvalues=np.asarray(sp.eigenvalues),
             projections=np.asarray(sp.projections), num_samples=sp.num_samples)
    rec |= {"kappa": kappa, "training_time": {str(e): t for e, t in times.items()},
            "curve": [float(v) for v in curve], "mu_max": float(sp.eigenvalues[0]),
            "spectrum_size": int(np.shape(sp.eigenvalues)[0]),
            "process_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "process_wall_s": time.perf_counter() - wall0, "status": "complete"}
    _write_json(path, rec)


def _summary(a, out: Path) -> None:
    """summary.csv / .json from every finished case: T_ε per κ from the saved spectra."""
    import pandas as pd

    import ntk_tt
    from ntk_tt.prediction._extrapolate import Spectrum

    recs = {}
    for f in sorted((out / "cases").glob("*.json")):
        r = json.loads(f.read_text())
        if r.get("status") == "complete":
            recs[f.stem] = r
    rows, curves = [], {}
    for name, r in recs.items():
        z = np.load(out / "cases" / f"{name}.npz")
        sp = Spectrum(z["eigenvalues"], z["projections"], int(z["num_samples"]))
        for kt in a.kappas:
            lr = r["learning_rate"] * kt / a.kappas[0]
            curves[(name, kt)] = np.asarray(ntk_tt.predict_curve_from_spectrum(
                sp, learning_rate=lr, steps=a.steps))
    for name, r in recs.items():
        full = next((m for m, q in recs.items() if q["method"] == "full"
                     and q["n"] == r["n"]), None)
        s, rss = r["seconds"], r["rss"]
        peak = max(v["peak_mib"] for v in rss.values())
        delta = max(v["delta_mib"] for v in rss.values())
        for kt in a.kappas:
            cur = curves[(name, kt)]
            ref = None if full is None else curves[(full, kt)]
            for e in EPSILONS:
                t = ntk_tt.training_time(cur, e)
                t_ref = np.nan if ref is None else ntk_tt.training_time(ref, e)
                rows.append(dict(
                    dataset=r["config"]["dataset"], n=r["n"], method=r["method"],
                    n_subset=r["n_subset"], kappa_target=kt,
                    learning_rate=r["learning_rate"] * kt / a.kappas[0],
                    kappa=r["kappa"] * kt / a.kappas[0], epsilon=e, t_eps=t, t_full=t_ref,
                    rel_error=(t - t_ref) / t_ref if ref is not None else np.nan,
                    curve_distance=(np.nan if ref is None else
                                    float(np.max(np.abs(cur - ref)) / (ref[0] - ref[-1]))),
                    s_load=s["load"], s_kernel=s["kernel"], s_logits=s["logits"],
                    s_spectrum=s["spectrum"], s_curve=s["curve"], s_total=s["total"],
                    s_compile=s.get("compile", 0.0), rss_peak_mib=peak, rss_delta_mib=delta,
                    process_peak_rss_mib=r["process_peak_rss_mib"],
                    process_wall_s=r["process_wall_s"]))
    if not rows:
        return
    df = pd.DataFrame(rows)
    df.to_csv(out / "summary.csv", index=False)
    main_k = df[df.kappa_target == a.kappas[0]]
    _write_json(out / "summary.json", {
        "config": json.loads((out / "config.json").read_text()),
        "cases": {name: {k: r[k] for k in ("n", "method", "n_subset", "kappa", "mu_max",
                                            "training_time", "seconds", "rss",
                                            "process_peak_rss_mib", "process_wall_s")}
                  for name, r in recs.items()},
        "max_abs_rel_error_vs_full": {
            f"{m}@n{n}": float(np.nanmax(np.abs(g.rel_error))) if g.rel_error.notna().any()
            else None for (n, m), g in df[df.method != "full"].groupby(["n", "method"])},
        "main_kappa_rows": json.loads(main_k.to_json(orient="records")),
    })
    cols = ["n", "method", "kappa", "epsilon", "t_eps", "t_full", "rel_error", "s_kernel",
            "s_logits", "s_total", "rss_peak_mib", "process_peak_rss_mib"]
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(main_k[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))


def main(argv=None) -> None:
    a = _parser().parse_args(argv)
    # a fresh user's --lr -1, --steps 0, --per-class 0 / '' and a 5-class --dataset failed in
    # the child (after a pilot, config.json written) or blamed --subset
    if not a.per_class or min(a.per_class) < 1:
        _fail(f"--per-class takes a comma list of integers >= 1, got {a.per_class}.")
    if a.full_per_class is not None and a.full_per_class and min(a.full_per_class) < 1:
        _fail(f"--full-per-class takes integers >= 1 (or '' for none), got {a.full_per_class}.")
    if a.lr is not None and not (math.isfinite(a.lr) and a.lr > 0):
        _fail(f"--lr must be a finite number > 0, got {a.lr}.")
    if a.steps < 1:
        _fail(f"--steps must be an integer >= 1, got {a.steps}.")
    if a.case is None:  # the parent; its children load the set anyway
        _check_dataset(a.dataset)
    out = Path(a.out)
    if out.exists() and not out.is_dir():
        _fail(f"--out {out} is a file; give a folder (it holds config.json and cases/).")
    if a.subset % K or a.subset < K:
        _fail(f"--subset N' = {a.subset} must be a positive multiple of the {K} classes.")
    methods = a.methods.split(",")
    if not set(methods) <= {"power_law", "nystrom"}:
        _fail(f"--methods must be power_law and/or nystrom, got {a.methods!r}.")
    for pc in a.per_class:
        if not a.subset < K * pc:
            _fail(f"--subset N' = {a.subset} must be below N = {K}·{pc} = {K * pc}.")
    if not a.kappas or not all(math.isfinite(k) and k > 0 for k in a.kappas):
        _fail("--kappas must be finite positive numbers.")
    (out / "cases").mkdir(parents=True, exist_ok=True)
    if a.case is not None:  # child process: one case, with η given
        pc, method = a.case.split(":")
        name = _case_name(a.dataset, int(pc), method, a.subset)
        _run_case(a, int(pc), method, out / "cases" / f"{name}.json")
        return
    cfg_path = out / "config.json"
    if cfg_path.exists():
        cfg = json.loads(cfg_path.read_text())
        if {k: cfg.get(k) for k in _config(a)} != _config(a) and not a.force:
            _fail(f"{cfg_path} was written with other options ({cfg}); use another --out or "
                  "--force.")
        if a.lr is None and not a.force:
            a.lr = cfg["learning_rate"]
        elif not a.force and a.lr != cfg["learning_rate"]:
            _fail(f"--lr {a.lr} differs from η = {cfg['learning_rate']} of {cfg_path}; use "
                  "another --out or --force.")
    if a.lr is None:
        t0 = time.perf_counter()
        a.lr, mu = _pilot_lr(a)
        print(f"pilot (100 images): μ_max = {mu:.5g}, η = κ/μ_max = {a.lr:.5g} "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)
        _write_json(cfg_path, _config(a) | {"learning_rate": a.lr, "mu_pilot": mu,
                                            "pilot_per_class": 10})
    elif not cfg_path.exists() or a.force:
        _write_json(cfg_path, _config(a) | {"learning_rate": a.lr, "mu_pilot": None})
    for pc, method in _cases(a):
        path = out / "cases" / f"{_case_name(a.dataset, pc, method, a.subset)}.json"
        if path.exists() and not a.force and json.loads(path.read_text()).get(
                "status") == "complete":
            print(f"{path.stem}: done earlier, skipped", flush=True)
            continue
        t0 = time.perf_counter()
        print(f"{path.stem}: running (N = {K * pc})", flush=True)
        if a.in_process:
            _run_case(a, pc, method, path)
        else:
            args = [sys.executable, __file__, "--case", f"{pc}:{method}", "--lr", repr(a.lr),
                    "--dataset", a.dataset, "--subset", str(a.subset), "--steps", str(a.steps),
                    "--seed", str(a.seed), "--kappas", ",".join(map(repr, a.kappas)),
                    "--per-class", str(pc), "--out", str(out)]
            subprocess.run(args, check=True)
        r = json.loads(path.read_text())
        print(f"{path.stem}: {time.perf_counter() - t0:.1f} s wall; κ = {r['kappa']:.4g}, "
              f"T_ε = {r['training_time']}, stages {json.dumps(r['seconds'])}", flush=True)
        _summary(a, out)
    _summary(a, out)


if __name__ == "__main__":
    main()
