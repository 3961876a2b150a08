"""App. D subset predictor against the full-kernel prediction and real MSE GD fine-tuning.

    nice -n 10 env NTK_TT_MEMORY_LIMIT=10e9 python experiments/subset_check.py          # N = 750
    nice -n 10 env NTK_TT_MEMORY_LIMIT=10e9 python experiments/subset_check.py --part 4000
    python experiments/subset_check.py --summary-only            # tables from finished cases
    python experiments/subset_check.py --datasets mnist_test --per-class 20 --subsets 25 \\
        --steps 20 --out /tmp/subset_check_tiny                  # smoke (about a minute)

Part 750 (issue 12 item 1): for every ``--datasets`` entry, the task of ``ntk-tt predict
--dataset D -K 5 -n 150 --seed 0`` (``scale.load`` → ``load_task``: shipped checkpoint, fresh
seeded 5-output head), mean MSE loss, full-batch GD, T = ``--steps``. Cases, each written to
``<out>/cases/n750/<case>.json`` when it finishes (skipped when run again):

* ``<D>_full``: the full N × N traced kernel and Prop. 2 on its exact spectrum
  (``scale.full_spectrum``); η = κ/μ_max for κ ∈ ``--kappas`` comes from its μ_max.
* ``<D>_<method>_sub<N'>``: ``ntk_tt.predict_from_subset`` for method ∈ {power_law, nystrom}
  and N' ∈ ``--subsets`` (class-balanced, key ``scale.subset_key(seed)``).
* ``<D>_real_k<κ>``: ``ntk_tt.finetune(..., loss="mse")`` (GD, momentum 0) at the same η, T.

Spectra are saved (``.npz``), so the predicted curves at every η come from them (no second
kernel). Cases run in the order: all predictions, then the real runs at the first κ on every
dataset, then the second κ, so an interrupted run still covers every dataset.

Part 4000 (item 2): K = 10 × 400 per class on notmnist and mnist_test, N' = 1,000, η of
``experiments/results/scale/config.json`` (the same task and η as ``scale.py``; κ there
0.93 and 0.23). notmnist's full-kernel and power-law spectra are read from
``experiments/results/scale/cases``; for mnist_test ``scale.py`` is run (its own pilot η,
power law only) into ``<out>/scale_mnist_test``. Each dataset's seconds per GD step at
N = 4,000 is measured with ``ntk_tt.step_time`` and the projected cost of a real run printed;
the real runs are made only with ``--real-4000`` (about 45 min each on 2 shared cores).

``summary.csv``: one row per (N, dataset, κ, predictor, N', ε) with T_ε of the predictor,
of the full kernel and of the real run, the relative errors, and the curve distances
max_t |L̂_t − L_t| / (L_0 − L_T) (L the reference curve).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from scale import _floats, _ints, full_spectrum, load, subset_key  # noqa: E402
from scale import _write_json as write_json  # noqa: E402

EPSILONS = (0.01, 0.1, 0.4)
DATASETS = ("cifar10_test", "flowers5_300pc", "mnist_test", "notmnist")
SCALE = HERE / "results" / "scale"


def _parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("750", "4000"), default="750")
    p.add_argument("--datasets", default=",".join(DATASETS))
    p.add_argument("--classes", type=int, default=5, help="K of part 750")
    p.add_argument("--per-class", type=int, default=150, help="n of part 750 (N = K·n)")
    p.add_argument("--subsets", type=_ints, default=[150, 250], help="N' of part 750")
    p.add_argument("--methods", default="power_law,nystrom")
    p.add_argument("--kappas", type=_floats, default=[1.0, 0.25],
                   help="part 750: κ = η·μ_max of the full kernel")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--real-4000", action="store_true",
                   help="part 4000: also run the real fine-tunes (long)")
    p.add_argument("--out", default=str(HERE / "results" / "subset_check"))
    p.add_argument("--summary-only", action="store_true")
    return p


def _done(path: Path) -> bool:
    return path.exists() and json.loads(path.read_text()).get("status") == "complete"


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _save_spectrum(path: Path, sp) -> None:
    np.savez(path.with_suffix(".npz"), eigenvalues=np.asarray(sp.eigenvalues),
             projections=np.asarray(sp.projections), num_samples=sp.num_samples)


def _load_spectrum(path: Path):
    from ntk_tt.prediction._extrapolate import Spectrum

    z = np.load(path.with_suffix(".npz"))
    return Spectrum(z["eigenvalues"], z["projections"], int(z["num_samples"]))


class Tasks:
    """Tasks loaded once per process."""

    def __init__(self, classes, per_class, seed):
        self.classes, self.per_class, self.seed, self.cache = classes, per_class, seed, {}

    def __call__(self, dataset):
        if dataset not in self.cache:
            self.cache[dataset] = load(dataset, self.classes, self.per_class, self.seed)
        return self.cache[dataset]


def _stage(secs):
    import jax

    from ntk_tt.training._timing import Stopwatch

    def stage(name, fn):
        with Stopwatch() as sw:
            out = jax.block_until_ready(fn())
        secs[name] = sw.seconds
        secs["compile"] = secs.get("compile", 0.0) + sw.compile_seconds
        return out

    return stage


def run_full(task, path: Path, kappas) -> None:
    from _rss import PeakRSS

    apply_fn, params, x, y, t_load = task
    secs = {"load": t_load}
    with PeakRSS() as m:
        sp = full_spectrum(apply_fn, params, x, y, _stage(secs))
    _save_spectrum(path, sp)
    mu = float(sp.eigenvalues[0])
    write_json(path, {"n": len(y), "method": "full", "mu_max": mu,
                      "learning_rates": {repr(k): k / mu for k in kappas}, "seconds": secs,
                      "rss_delta_mib": m.delta_mib, "process_peak_rss_mib": _peak_mib(),
                      "status": "complete"})


def run_subset(task, path: Path, method, n_sub, learning_rate, steps, seed) -> None:
    from _rss import PeakRSS

    import ntk_tt

    apply_fn, params, x, y, t_load = task
    with PeakRSS() as m:
        p = ntk_tt.predict_from_subset(apply_fn, params, x, y, subset_size=n_sub,
                                       learning_rate=learning_rate, steps=steps, method=method,
                                       key=subset_key(seed))
    _save_spectrum(path, p.spectrum)
    write_json(path, {"n": len(y), "method": method, "n_subset": n_sub,
                      "k0": p.hyperparameters["k0"], "mu_max": float(p.spectrum.eigenvalues[0]),
                      "seconds": dict(p.seconds), "rss_delta_mib": m.delta_mib,
                      "process_peak_rss_mib": _peak_mib(), "status": "complete"})


def run_real(task, path: Path, learning_rate, kappa, steps) -> None:
    import ntk_tt

    apply_fn, params, x, y, _ = task
    t0 = time.perf_counter()
    r = ntk_tt.finetune(apply_fn, params, x, y, learning_rate=learning_rate, steps=steps,
                        loss="mse")
    write_json(path, {"n": len(y), "method": "real", "kappa_target": kappa,
                      "learning_rate": learning_rate, "steps": steps,
                      "loss": [float(v) for v in r.loss], "diverged": r.diverged,
                      "spiked_at": r.spiked_at, "seconds_per_step": r.seconds_per_step,
                      "seconds": r.seconds, "wall_s": time.perf_counter() - t0,
                      "process_peak_rss_mib": _peak_mib(), "status": "complete"})


def _timed_case(path: Path, what: str, fn, *args) -> None:
    """fn(*args) unless ``path`` holds a finished case."""
    if _done(path):
        print(f"{path.stem}: done earlier, skipped", flush=True)
        return
    t0 = time.perf_counter()
    print(f"{path.stem}: {what} ...", flush=True)
    fn(*args)
    print(f"{path.stem}: {time.perf_counter() - t0:.1f} s", flush=True)


def part_750(a, out: Path) -> None:
    cases = out / "cases" / "n750"
    cases.mkdir(parents=True, exist_ok=True)
    tasks = Tasks(a.classes, a.per_class, a.seed)
    datasets = a.datasets.split(",")
    for ds in datasets:
        full = cases / f"{ds}_full.json"
        _timed_case(full, "full traced kernel", run_full, tasks(ds), full, a.kappas)
        lr0 = json.loads(full.read_text())["learning_rates"][repr(a.kappas[0])]
        for method in a.methods.split(","):
            for n_sub in a.subsets:
                path = cases / f"{ds}_{method}_sub{n_sub}.json"
                _timed_case(path, f"{method}, N' = {n_sub}", run_subset, tasks(ds), path,
                            method, n_sub, lr0, a.steps, a.seed)
    for kappa in a.kappas:
        for ds in datasets:
            lr = json.loads((cases / f"{ds}_full.json").read_text())["learning_rates"][
                repr(kappa)]
            path = cases / f"{ds}_real_k{kappa:g}.json"
            _timed_case(path, f"real GD, κ = {kappa:g}, η = {lr:.4g}", run_real, tasks(ds),
                        path, lr, kappa, a.steps)


def part_4000(a, out: Path) -> None:
    import ntk_tt

    cases = out / "cases" / "n4000"
    cases.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((SCALE / "config.json").read_text())
    mnist_scale = out / "scale_mnist_test"
    if not _done(mnist_scale / "cases" / "mnist_test_n400_power_law_sub1000.json"):
        subprocess.run([sys.executable, str(HERE / "scale.py"), "--dataset", "mnist_test",
                        "--per-class", "400", "--full-per-class", "", "--methods",
                        "power_law", "--steps", str(cfg["steps"]), "--out",
                        str(mnist_scale)], check=True)
    tasks = Tasks(10, 400, cfg["seed"])
    rates = {}
    for ds, root in (("notmnist", SCALE), ("mnist_test", mnist_scale)):
        c = json.loads((root / "config.json").read_text())
        lrs = {k: c["learning_rate"] * k / c["kappas"][0] for k in c["kappas"]}
        rates[ds] = lrs
        path = cases / f"{ds}_step_time.json"

        def measure(ds=ds, lrs=lrs, path=path):
            apply_fn, params, x, y, _ = tasks(ds)
            s = ntk_tt.step_time(apply_fn, params, x, y, learning_rate=min(lrs.values()),
                                 loss="mse")
            # finetune: 5 timed warm steps + T steps, each followed by a full-set forward
            # pass (about a third of a step), compilation apart
            proj = s * (5 + cfg["steps"] * 4 / 3)
            print(f"{ds}: {s:.2f} s per GD step at N = {len(y)}; one real run of "
                  f"{cfg['steps']} steps ≈ {proj / 60:.0f} min, {len(lrs)} runs ≈ "
                  f"{len(lrs) * proj / 60:.0f} min", flush=True)
            write_json(path, {"n": len(y), "seconds_per_step": s, "projected_run_s": proj,
                              "learning_rates": {repr(k): v for k, v in lrs.items()},
                              "process_peak_rss_mib": _peak_mib(), "status": "complete"})

        _timed_case(path, "seconds per step", measure)
    if a.real_4000:  # the first κ on every dataset, then the second: an interrupted run
        for i in range(max(len(v) for v in rates.values())):  # still covers both sets
            for ds, lrs in rates.items():
                if i < len(lrs):
                    k, lr = list(lrs.items())[i]
                    p = cases / f"{ds}_real_k{k:g}.json"
                    _timed_case(p, f"real GD, η = {lr:.4g}", run_real, tasks(ds), p, lr, k,
                                cfg["steps"])


def _compare(pred, ref):
    """T_ε relative errors and the curve distance of ``pred`` against ``ref``."""
    import ntk_tt

    t = {e: ntk_tt.training_time(pred, e) for e in EPSILONS}
    tr = {e: ntk_tt.training_time(ref, e) for e in EPSILONS}
    rel = {e: (t[e] - tr[e]) / tr[e] for e in EPSILONS}
    dist = float(np.max(np.abs(np.asarray(pred) - ref)) / (ref[0] - ref[-1]))
    return t, tr, rel, dist


def _rows(n, ds, kappa, lr, preds, real, steps):
    """Summary rows: every predictor against the full kernel (when there) and the real run."""
    import ntk_tt

    curves = {name: np.asarray(ntk_tt.predict_curve_from_spectrum(
        sp, learning_rate=lr, steps=steps)) for name, (sp, _) in preds.items()}
    full = curves.get("full")
    rows = []
    entries = list(curves.items()) + ([("real", real)] if real is not None else [])
    for name, cur in entries:
        n_sub = preds[name][1] if name in preds else None
        method = name.split("@")[0]
        t = {e: ntk_tt.training_time(cur, e) for e in EPSILONS}
        vs_full = (_compare(cur, full) if full is not None and name != "full" else None)
        vs_real = (_compare(cur, real) if real is not None and name != "real" else None)
        for e in EPSILONS:
            rows.append(dict(
                n=n, dataset=ds, kappa=kappa, learning_rate=lr, predictor=method,
                n_subset=n_sub, epsilon=e, t_eps=t[e],
                t_full=np.nan if full is None else ntk_tt.training_time(full, e),
                t_real=np.nan if real is None else ntk_tt.training_time(real, e),
                rel_vs_full=np.nan if vs_full is None else vs_full[2][e],
                rel_vs_real=np.nan if vs_real is None else vs_real[2][e],
                dist_vs_full=np.nan if vs_full is None else vs_full[3],
                dist_vs_real=np.nan if vs_real is None else vs_real[3],
                loss_0=float(cur[0]), loss_T=float(cur[-1])))
    return rows


def _pct(v):
    return "–" if not np.isfinite(v) else ("0" if v == 0 else f"{100 * v:+.1f} %")


def markdown(df) -> str:
    """README tables: T_ε per predictor, relative errors, curve distances."""
    df = df.assign(col=[p if p in ("full", "real") else f"{p} {int(m)}"
                        for p, m in zip(df.predictor, df.n_subset, strict=True)])
    subs = df[df.n_subset.notna()].sort_values(["predictor", "n_subset"],
                                               ascending=[False, True]).col.unique()
    cols = [c for c in ("real", "full") if c in set(df.col)] + list(subs)
    key = ["n", "dataset", "kappa", "epsilon"]
    out = []
    t = df.pivot_table(index=key, columns="col", values="t_eps", aggfunc="first")
    lines = ["| N | dataset | κ | ε | " + " | ".join(cols) + " |",
             "|" + "---|" * (4 + len(cols))]
    for (n, ds, k, e), r in t.iterrows():
        cells = ["–" if not np.isfinite(r.get(c, np.nan)) else f"{r[c]:.0f}" for c in cols]
        lines.append(f"| {n} | {ds} | {k:.3g} | {e:g} | " + " | ".join(cells) + " |")
    out += ["T_ε (steps)", "", *lines, ""]
    sub = [c for c in cols if c not in ("real", "full")]
    head = ["full vs real"] + [f"{c} vs {r}" for c in sub for r in ("full", "real")]
    lines = ["| N | dataset | κ | ε | " + " | ".join(head) + " |",
             "|" + "---|" * (4 + len(head))]
    g = df.set_index(key + ["col"])
    for idx in t.index:
        cells = [_pct(g.rel_vs_real.get(idx + ("full",), np.nan))]
        for c in sub:
            cells += [_pct(g.rel_vs_full.get(idx + (c,), np.nan)),
                      _pct(g.rel_vs_real.get(idx + (c,), np.nan))]
        n, ds, k, e = idx
        lines.append(f"| {n} | {ds} | {k:.3g} | {e:g} | " + " | ".join(cells) + " |")
    out += ["Relative error of T_ε, (T̂ − T_ref)/T_ref", "", *lines, ""]
    d = df[df.epsilon == df.epsilon.min()].set_index(["n", "dataset", "kappa", "col"])
    lines = ["| N | dataset | κ | " + " | ".join(head) + " |",
             "|" + "---|" * (3 + len(head))]
    for n, ds, k in t.index.droplevel("epsilon").unique():
        cells = [_pct(d.dist_vs_real.get((n, ds, k, "full"), np.nan))]
        for c in sub:
            cells += [_pct(d.dist_vs_full.get((n, ds, k, c), np.nan)),
                      _pct(d.dist_vs_real.get((n, ds, k, c), np.nan))]
        lines.append(f"| {n} | {ds} | {k:.3g} | " + " | ".join(cells).replace("+", "")
                     + " |")
    out += ["Curve distance max_t |L̂_t − L_t| / (L_0 − L_T), L the reference", "", *lines, ""]
    return "\n".join(out)


def timing(out: Path) -> str:
    """Seconds per case (compilation apart) and peak RSS of the process so far."""
    lines = ["Seconds per case (JAX compilation excluded; `real`: s per GD step, training "
             "steps only = s/step × T, and the whole recorded run with its per-step full-set "
             "evaluation)", "", "| N | case | kernel | total | compile | real: s/step | "
             "real: steps only | real: recorded run | process peak RSS (MiB) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for f in sorted((out / "cases").glob("n*/*.json")):
        r = json.loads(f.read_text())
        if r.get("status") != "complete":
            continue
        s = r.get("seconds", {})
        if r.get("method") == "real":
            cells = ["", "", f"{s['compile']:.1f}", f"{r['seconds_per_step']:.2f}",
                     f"{s['finetune']:.0f}", f"{s['run']:.0f}"]
        elif "seconds_per_step" in r:
            cells = ["", "", "", f"{r['seconds_per_step']:.2f}",
                     f"{r['projected_run_s']:.0f} (projected, with evaluation)", ""]
        else:
            total = s.get("total", sum(s.get(k, 0.0) for k in ("kernel", "logits",
                                                                 "spectrum")))
            cells = [f"{s['kernel']:.1f}", f"{total:.1f}", f"{s.get('compile', 0.0):.1f}",
                     "", "", ""]
        lines.append(f"| {r['n']} | {f.stem} | " + " | ".join(cells)
                     + f" | {r['process_peak_rss_mib']:,.0f} |")
    return "\n".join(lines) + "\n"


def summary(a, out: Path) -> None:
    import pandas as pd

    rows = []
    c750 = out / "cases" / "n750"
    for full in sorted(c750.glob("*_full.json")) if c750.exists() else []:
        ds = full.stem[: -len("_full")]
        rec = json.loads(full.read_text())
        preds = {"full": (_load_spectrum(full), None)}
        for f in sorted(c750.glob(f"{ds}_*_sub*.json")):
            r = json.loads(f.read_text())
            if r.get("status") == "complete":
                preds[f"{r['method']}@{r['n_subset']}"] = (_load_spectrum(f), r["n_subset"])
        for k, lr in rec["learning_rates"].items():
            real = c750 / f"{ds}_real_k{float(k):g}.json"
            cur = np.asarray(json.loads(real.read_text())["loss"]) if _done(real) else None
            rows += _rows(rec["n"], ds, float(k), lr, preds, cur, a.steps)
    c4 = out / "cases" / "n4000"
    for st in sorted(c4.glob("*_step_time.json")) if c4.exists() else []:
        ds = st.stem[: -len("_step_time")]
        rec = json.loads(st.read_text())
        root = SCALE if ds == "notmnist" else out / "scale_mnist_test"
        preds = {}
        for name, stem in (("full", f"{ds}_n400_full"),
                           ("power_law@1000", f"{ds}_n400_power_law_sub1000"),
                           ("nystrom@1000", f"{ds}_n400_nystrom_sub1000")):
            f = root / "cases" / f"{stem}.json"
            if _done(f):
                preds[name] = (_load_spectrum(f), None if name == "full" else 1000)
        for k, lr in rec["learning_rates"].items():
            real = c4 / f"{ds}_real_k{float(k):g}.json"
            cur = np.asarray(json.loads(real.read_text())["loss"]) if _done(real) else None
            kappa = lr * float(preds["full" if "full" in preds else "power_law@1000"][0]
                               .eigenvalues[0])
            rows += _rows(rec["n"], ds, kappa, lr, preds, cur, a.steps)
    if not rows:
        return
    df = pd.DataFrame(rows)
    df.to_csv(out / "summary.csv", index=False)
    (out / "tables.md").write_text("".join(
        f"## N = {n:,}\n\n" + markdown(g.dropna(axis=1, how="all").reindex(
            columns=df.columns)) + "\n" for n, g in df.groupby("n")) + timing(out))
    cols = ["n", "dataset", "kappa", "predictor", "n_subset", "epsilon", "t_eps", "t_full",
            "t_real", "rel_vs_full", "rel_vs_real", "dist_vs_full", "dist_vs_real"]
    with pd.option_context("display.width", 220, "display.max_rows", 500):
        print(df[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))


def main(argv=None) -> None:
    p = _parser()
    a = p.parse_args(argv)
    from ntk_tt.data._data import known_datasets

    wanted = a.datasets.split(",") if a.part == "750" else ["notmnist", "mnist_test"]
    if not a.summary_only and (missing := [d for d in wanted if d not in known_datasets()]):
        p.exit(2, f"subset_check.py: error: target sets {', '.join(missing)} are not here "
                  f"(known: {', '.join(known_datasets())}); the shared ones need ../shared/data"
                  " or $NTK_TT_DATA_DIR.\n")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if not a.summary_only:
        t0 = time.perf_counter()
        (part_750 if a.part == "750" else part_4000)(a, out)
        print(f"part {a.part}: {time.perf_counter() - t0:.1f} s", flush=True)
    summary(a, out)


if __name__ == "__main__":
    main()
