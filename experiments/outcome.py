"""Outcome prediction from early telemetry (issue 11): splits, ablations and baselines.

    python experiments/outcome.py CORPUS [--out DIR] [--ship]

CORPUS: a corpus directory of ``experiments/telemetry_corpus.py`` or its packed .jsonl.gz.
Writes DIR/ablation.csv (every split × predictor × prefix × metric) and its Markdown
ablation.md, DIR/interval_coverage.csv (the 90 % intervals of ``trees+ntk`` on unseen test
runs: held-out configurations and each left-out target set), DIR/summary.json and,
with ``--ship``, the shipped predictors fitted on the whole corpus
(``ntk_tt/assets/outcome_{telemetry,ntk}.json.gz``).

Splits: ``heldout_configs`` (a permanently held-out 20 % of the configurations (optimiser and
B, n per class, m, κ̃), seed 0: every run of them, on every task, is test data; four more
draws ``heldout_configs_s1..s4`` show how much the figure depends on the draw) and ``loto:X``
(leave target set X out). Predictors, each at prefix fractions k ∈ {0, 5, 10, 20} % of T:
``trees+ntk`` (telemetry and the NTK prediction's features; at k = 0 the NTK prediction and
the hyperparameters alone), ``trees`` (telemetry only), ``parametric`` (the loss prefix
extrapolated by an exponential / power law: final loss → accuracy by isotonic regression
fitted on the training split, divergence / failure / rank scored by the extrapolated final
loss, T_0.1 read off the extrapolated curve) and ``ntk_raw`` (the NTK prediction itself:
its held-out accuracy, divergence flag (ties broken by κ), failure score = flag + 1 − accuracy,
T_0.1; no fitting).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time

import numpy as np
import pandas as pd
from sklearn.isotonic import IsotonicRegression
from sklearn.metrics import r2_score, roc_auc_score

from ntk_tt import read_corpus
from ntk_tt.sweep._table import check_out
from ntk_tt.telemetry._outcome import fit_outcome, parametric_baseline
from ntk_tt.telemetry._outcome_features import DEFAULT_KS, Dataset, dataset
from ntk_tt.telemetry._outcome_fit import fit_models, predict_models
from ntk_tt.telemetry._telemetry import Telemetry

CLASSIFY = ("diverged", "failed", "above_median")


def _auc(y, s):
    ok = np.isfinite(y) & np.isfinite(s)
    y, s = y[ok], s[ok]
    return float(roc_auc_score(y, s)) if len(np.unique(y)) == 2 else math.nan


def _r2(y, p):
    ok = np.isfinite(y) & np.isfinite(p)
    return float(r2_score(y[ok], p[ok])) if ok.sum() > 1 else math.nan


def _t_eps_p95(log_true, steps_true, pred_steps):
    """p95 and median relative error |T̂ − T| / T of T_0.1 in steps."""
    real = np.exp(log_true) * steps_true
    ok = np.isfinite(real) & np.isfinite(pred_steps)
    if not ok.any():
        return math.nan, math.nan, 0
    rel = np.abs(pred_steps[ok] - real[ok]) / real[ok]
    return float(np.quantile(rel, 0.95)), float(np.median(rel)), int(ok.sum())


def metrics(y: dict, pred: dict, steps: np.ndarray) -> dict:
    """Every metric of one predictor on one test slice."""
    p95, med, n = _t_eps_p95(y["log_t_eps"], steps, pred["t_eps_steps"])
    return {"r2_test_accuracy": _r2(y["test_accuracy"], pred["test_accuracy"]),
            "auc_diverged": _auc(y["diverged"], pred["diverged"]),
            "auc_failed": _auc(y["failed"], pred["failed"]),
            "auc_above_median": _auc(y["above_median"], pred["above_median"]),
            "t_eps_p95_rel_err": p95, "t_eps_median_rel_err": med, "t_eps_n": n,
            "n_runs": int(len(steps)), "n_diverged": int(np.nansum(y["diverged"])),
            "n_failed": int(np.nansum(y["failed"]))}


def _trees(train: Dataset, test: Dataset, seed: int = 0) -> dict:
    out = predict_models(*fit_models(train.x, train.y, seed), test.x)
    out["t_eps_steps"] = np.exp(out["log_t_eps"]) * _col(test, "steps")
    return out


def _col(d: Dataset, name: str) -> np.ndarray:
    if name == "steps":
        return d.meta["steps"]
    return d.x[:, d.columns.index(name)]


def _subset(d: Dataset, mask: np.ndarray) -> Dataset:
    return Dataset(d.x[mask], d.columns, {k: v[mask] for k, v in d.y.items()},
                   {k: v[mask] for k, v in d.meta.items()})


def _parametric_columns(rows, ks) -> np.ndarray:
    """(R·len(ks), 2): extrapolated L_T/L_0 and T_0.1 (steps), in :func:`dataset` order."""
    out = []
    for r in rows:
        t = Telemetry.from_dict(r["telemetry"])
        for f in ks:
            b = parametric_baseline(t, min(int(round(f * t.steps)), len(t.loss) - 1))
            out.append((b["loss_T_rel"], b["t_eps"]))
    return np.asarray(out, float)


def _parametric(train_idx, test_idx, para, data: Dataset) -> dict:
    lt = np.where(np.isfinite(para[:, 0]), para[:, 0], 1e6)
    score = np.log(np.maximum(lt, 1e-9))
    y = data.y["test_accuracy"]
    ok = train_idx & np.isfinite(y)
    iso = IsotonicRegression(increasing=False, out_of_bounds="clip").fit(score[ok], y[ok])
    s = score[test_idx]
    return {"test_accuracy": iso.predict(s), "diverged": s, "failed": s, "above_median": -s,
            "t_eps_steps": para[test_idx, 1]}


def _ntk_raw(test: Dataset) -> dict:
    acc = _col(test, "ntk_test_acc_T")
    div = _col(test, "ntk_diverged")
    return {"test_accuracy": acc, "diverged": div + 1e-3 * _col(test, "ntk_log_kappa"),
            "failed": div + (1.0 - acc), "above_median": acc,
            "t_eps_steps": _col(test, "ntk_t01_rel") * test.meta["steps"]}


def splits(data: Dataset, draws: int = 5) -> dict[str, np.ndarray]:
    """name → boolean test mask over the rows of ``data`` (all prefixes of a run together).

    ``heldout_configs``: the permanent held-out 20 % of the configurations (draw seed 0);
    ``heldout_configs_s1`` … : further independent draws (seeds 1 … draws − 1), to show how
    much the figure depends on which configurations are held out; ``loto:X``: target set X."""
    configs = np.unique(data.meta["config"])
    out = {}
    for seed in range(draws):
        rng = np.random.default_rng(seed)
        held = rng.choice(configs, size=max(1, int(round(0.2 * len(configs)))), replace=False)
        out["heldout_configs" + (f"_s{seed}" if seed else "")] = np.isin(data.meta["config"],
                                                                          held)
    for d in np.unique(data.meta["dataset"]):
        out[f"loto:{d}"] = data.meta["dataset"] == d
    return out


def evaluate(rows, ks=DEFAULT_KS, progress=print) -> pd.DataFrame:
    """The ablation table: one line per (split, predictor, k fraction)."""
    full = dataset(rows, ks=ks, ntk=True)
    tele = dataset(rows, ks=ks, ntk=False)
    steps = np.repeat([r["steps"] for r in rows], len(ks)).astype(float)
    for d in (full, tele):
        d.meta["steps"] = steps
    para = _parametric_columns(rows, ks)
    lines = []
    for name, test in splits(full).items():
        train = ~test
        if not train.any() or not test.any():
            continue
        t0 = time.perf_counter()
        preds = {"trees+ntk": _trees(_subset(full, train), _subset(full, test)),
                 "trees": _trees(_subset(tele, train), _subset(tele, test)),
                 "parametric": _parametric(train, test, para, full),
                 "ntk_raw": _ntk_raw(_subset(full, test))}
        ts = _subset(full, test)
        for pname, pred in preds.items():
            for f in ks:
                m = ts.meta["k_frac"] == f
                lines.append({"split": name, "predictor": pname, "k_frac": f,
                              **metrics({k: v[m] for k, v in ts.y.items()},
                                        {k: v[m] for k, v in pred.items()}, ts.meta["steps"][m])})
        progress(f"{name}: {int(test.sum() / len(ks))} test runs "
                 f"({time.perf_counter() - t0:.0f} s)")
    return pd.DataFrame(lines)


def interval_coverage(rows, names=("heldout_configs", "loto"), ks=DEFAULT_KS,
                      progress=print) -> pd.DataFrame:
    """Coverage and median width of the 90 % intervals of the ``trees+ntk`` predictor on test
    data it never saw: ``fit_outcome`` (its own out-of-fold calibration) on each split's
    training runs, the intervals checked on the test runs, per prefix fraction."""
    full = dataset(rows, ks=ks, ntk=True)
    lines = []
    for name, test in splits(full).items():
        if not name.startswith(names) or name.startswith("heldout_configs_s"):
            continue
        t0 = time.perf_counter()
        train_ids = set(full.meta["run_id"][~test])
        model = fit_outcome([r for r in rows if r["run_id"] in train_ids], ntk=True, ks=ks)
        ts = _subset(full, test)
        pred = model.predict_features(ts.x)
        for f in ks:
            m = ts.meta["k_frac"] == f
            for target in ("test_accuracy", "log_t_eps"):
                half = model.intervals[target][f"{f:g}"]
                y, p = ts.y[target][m], pred[target][m]
                ok = np.isfinite(y)
                lines.append({"split": name, "k_frac": f, "target": target,
                              "coverage": float(np.mean(np.abs(p[ok] - y[ok]) <= half)),
                              "half_width": half, "n": int(ok.sum())})
        progress(f"intervals, {name} ({time.perf_counter() - t0:.0f} s)")
    return pd.DataFrame(lines)


def summarize(table: pd.DataFrame) -> dict:
    """Headline figures: held-out configurations and the pooled LOTO mean, per predictor/k."""
    out = {}
    kind = np.where(table.split.str.startswith("loto"), "loto_mean", table.split)
    draws = table[table.split.str.startswith("heldout_configs")].assign(kind="heldout_draws_mean")
    for (split_kind, pname, f), g in pd.concat([table.assign(kind=kind), draws]).groupby(
            ["kind", "predictor", "k_frac"]):
        cols = [c for c in g.columns if c.startswith(("r2_", "auc_", "t_eps_p95", "t_eps_med"))]
        out.setdefault(split_kind, {}).setdefault(pname, {})[f"{f:g}"] = {
            c: (None if not np.isfinite(v) else round(float(v), 4))
            for c, v in g[cols].mean(skipna=True).items()}
    return out


_METRICS = (("r2_test_accuracy", "R² acc"), ("auc_diverged", "AUC diverged"),
            ("auc_failed", "AUC failed"), ("auc_above_median", "AUC > task median"),
            ("t_eps_p95_rel_err", "T_0.1 p95 err"), ("t_eps_median_rel_err", "T_0.1 median err"))


def markdown(table: pd.DataFrame) -> str:
    """The ablation tables as Markdown: held-out configurations, then each left-out target
    set and their mean."""
    kinds = ["heldout_configs", *sorted(s for s in table.split.unique() if s.startswith("loto"))]
    blocks = []
    frames = [(k, table[table.split == k]) for k in kinds]
    for name, prefix in (("mean over the 5 held-out configuration draws", "heldout_configs"),
                         ("leave-one-target-set-out mean", "loto")):
        part = table[table.split.str.startswith(prefix)]
        frames.append((name, part.groupby(["predictor", "k_frac"], as_index=False)
                       .mean(numeric_only=True)))
    for name, g in frames:
        head = "| predictor | k | " + " | ".join(m[1] for m in _METRICS) + " |"
        lines = [f"**{name}**", "", head, "|" + "---|" * (len(_METRICS) + 2)]
        for r in g.sort_values(["predictor", "k_frac"]).itertuples():
            vals = []
            for col, _ in _METRICS:
                v = getattr(r, col)
                vals.append("–" if not np.isfinite(v) else
                            f"{100 * v:.1f} %" if "err" in col else f"{v:.3f}")
            lines.append(f"| {r.predictor} | {100 * r.k_frac:g} % | " + " | ".join(vals) + " |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("corpus")
    p.add_argument("--out", default="experiments/results/telemetry")
    p.add_argument("--ship", action="store_true",
                   help="also fit and write the shipped predictors on the whole corpus")
    args = p.parse_args(argv)
    try:  # a file, or a folder that takes no new entry: one line now, not after the reading
        check_out(args.out)
    except ValueError as err:
        p.exit(2, f"{p.prog}: error: {err}\n")
    try:  # a missing corpus was a traceback
        rows = read_corpus(args.corpus)
    except ValueError as err:
        p.exit(2, f"{p.prog}: error: {err}\n")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = evaluate(rows, progress=lambda s: print(s, flush=True))
    table.to_csv(out / "ablation.csv", index=False, float_format="%.4f")
    summary = {"runs": len(rows), "tasks": len({r["task_id"] for r in rows}),
               "datasets": sorted({r["dataset"] for r in rows}),
               "diverged": int(sum(r["outcome"]["diverged"] for r in rows)),
               "failed": int(sum(r["outcome"]["failed"] for r in rows)),
               "results": summarize(table)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "ablation.md").write_text(markdown(table))
    cover = interval_coverage(rows, progress=lambda s: print(s, flush=True))
    cover.to_csv(out / "interval_coverage.csv", index=False, float_format="%.4f")
    summary["interval_coverage_k10"] = {
        f"{r.split}:{r.target}": {"coverage": round(r.coverage, 4),
                                  "half_width": round(r.half_width, 4)}
        for r in cover[cover.k_frac == 0.1].itertuples()}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary["results"].get("heldout_configs", {}), indent=1)[:3000])
    if args.ship:
        assets = pathlib.Path(__file__).resolve().parents[1] / "ntk_tt" / "assets"
        for ntk in (False, True):
            model = fit_outcome(rows, ntk=ntk)
            model.info["corpus"] = {"runs": len(rows), "source": "issue-11 corpus"}
            path = assets / f"outcome_{'ntk' if ntk else 'telemetry'}.json.gz"
            model.save(path, overwrite=True)  # --ship replaces the shipped file
            print(f"shipped {path} ({path.stat().st_size / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
