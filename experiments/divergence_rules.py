"""Which divergence call is right: candidate rules scored on the real runs (issue 26, item 3).

    python experiments/divergence_rules.py [--sweep DIR] [--corpus FILE] [--out CSV]

Real label: the outcome "diverges" of ``ntk_tt.dynamics._divergence`` (non-finite, L_T > L_0,
or a spike above 10·L_0) of every real run of the committed benchmark (``--sweep``, default
experiments/results/sweep: 216 rows, T = 150) and telemetry corpus (``--corpus``: 1,024 runs,
T = 40). Every candidate is scored by recall and precision of those divergences; every fitted
quantity leave one target set out (fitted on the rows of three target sets, both data sets
pooled, scored on the fourth; the four held-out folds are summed). A threshold is fitted by
F1 over the geometric midpoints between the observed values. Candidates:

  (a)  the head-aware prediction's own divergence flag (no fit), and its own outcome
       "diverges" (flag, or its curve spiked above 10·L_0);
  (b)  the same for the Kronecker head-aware variant (benchmark only: the corpus has none);
  (c)  κ̃ = η·λ_max/(N(1 − m)) ≥ threshold;  (c') κ = η·λ_max/N ≥ threshold;
  (d)  the head-aware curve's peak max_t L̂_t / L̂_0 ≥ threshold (∞ if it diverged);
  (d*) the head-aware outcome "diverges" or κ ≥ threshold (LOTO), and the shipped
       ``_divergence.call`` with its ``KAPPA_MAX`` (fitted on all four sets);
  (e)  the outcome trees at k = 0 (``ntk_tt.telemetry``: hyperparameters, the state at w_0 and
       the NTK prediction; p ≥ 0.5), refitted leaving each target set out (corpus only: the
       benchmark stores no telemetry at w_0).
Prints one Markdown table; ``--out`` also writes it as CSV.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd
from _args import fail, output_file  # experiments/_args.py, beside this script

from ntk_tt import read_corpus
from ntk_tt.dynamics._divergence import DIVERGES, KAPPA_MAX, Outcome, call, outcome
from ntk_tt.sweep._table import read_table


def _outcome(curve, diverged, spiked_at) -> tuple[int, float]:
    """(outcome code, peak L_t/L_0 over t ≥ 1, ∞ when diverged or non-finite) of a held curve."""
    c = np.asarray(curve, float)
    o = outcome(c, bool(diverged), int(spiked_at))
    peak = math.inf if diverged or not np.all(np.isfinite(c)) else float(np.max(c[1:]) / c[0])
    return int(o.outcome), peak


def corpus_frame(path) -> tuple[pd.DataFrame, list[dict]]:
    rows = read_corpus(path)
    out = []
    for r in rows:
        t, p = r["telemetry"], r["prediction"]
        loss = np.asarray(t["loss"], float)
        stopped = t["stopped_at"] >= 0
        spiked = 1 if stopped or np.nanmax(loss[1:]) > 10 * loss[0] else -1  # step unused
        real, _ = _outcome(loss, r["outcome"]["diverged"], spiked)
        own, peak = _outcome(p["loss"], p["diverged"], p["spiked_at"])
        out.append(dict(src="corpus", dataset=r["dataset"], num_train=r["num_train"],
                        momentum=r["momentum"], kappa_eff=r["kappa_eff"],
                        kappa=float(p["kappa"]), real=real == DIVERGES, ha_flag=p["diverged"],
                        ha_own=own, ha_peak=peak, kr_flag=False, kr_own=-1))
    return pd.DataFrame(out), rows


def sweep_frame(path) -> pd.DataFrame:
    f = read_table(path)
    out = []
    for r in f.itertuples():
        real, _ = _outcome(r.real_loss, r.real_diverged, r.real_spiked_at)
        own, peak = _outcome(r.pred_loss, r.pred_diverged, r.pred_spiked_at)
        kr, _ = _outcome(r.var_head_aware_kronecker_loss, r.var_head_aware_kronecker_diverged,
                         r.var_head_aware_kronecker_spiked_at)
        out.append(dict(src="sweep", dataset=r.dataset, num_train=r.num_train,
                        momentum=r.momentum, kappa_eff=round(r.kappa_eff, 6), kappa=r.kappa,
                        real=real == DIVERGES, ha_flag=bool(r.pred_diverged), ha_own=own,
                        ha_peak=peak, kr_flag=bool(r.var_head_aware_kronecker_diverged),
                        kr_own=kr))
    return pd.DataFrame(out)


def _counts(pred, real) -> tuple[int, int, int]:
    return int(np.sum(pred & real)), int(np.sum(pred & ~real)), int(np.sum(~pred & real))


def fit_threshold(score: np.ndarray, real: np.ndarray) -> float:
    """The threshold t (predict "diverges" where score ≥ t) of largest F1, over the geometric
    midpoints between consecutive observed finite scores, taken to 3 significant digits (so
    one grid value, e.g. κ = 96 ± 1e-6, is not split; the smallest t among ties)."""
    u = np.unique([float(f"{v:.3g}") for v in score[np.isfinite(score) & (score > 0)]])
    cands = np.concatenate([[u[0] / 2], np.sqrt(u[1:] * u[:-1]), [u[-1] * 2]])
    f1 = []
    for t in cands:
        tp, fp, fn = _counts(score >= t, real)
        f1.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return float(cands[int(np.argmax(f1))])


def loto(frame: pd.DataFrame, score) -> tuple[np.ndarray, dict]:
    """Predictions of ``score(frame) ≥ t``, t fitted on the other three target sets."""
    pred, fitted = np.zeros(len(frame), bool), {}
    s, real = score(frame), frame["real"].to_numpy(bool)
    for name in sorted(frame["dataset"].unique()):
        out = (frame["dataset"] == name).to_numpy()
        fitted[name] = fit_threshold(s[~out], real[~out])
        pred[out] = s[out] >= fitted[name]
    return pred, fitted


def trees_k0(rows: list[dict], real: np.ndarray, ntk: bool) -> np.ndarray:
    """p(diverges) ≥ 0.5 of the outcome trees at k = 0, refitted leaving each target set out
    (labels: the outcome "diverges")."""
    from ntk_tt.telemetry._outcome_features import dataset
    from ntk_tt.telemetry._outcome_fit import fit_models, predict_models

    data = dataset(rows, ks=(0.0,), ntk=ntk)
    y = dict(data.y) | {"diverged": real.astype(float)}
    p = np.zeros(len(real))
    for name in np.unique(data.meta["dataset"]):
        tr = data.meta["dataset"] != name
        models, consts = fit_models(data.x[tr], {k: v[tr] for k, v in y.items()}, 0)
        p[~tr] = predict_models(models, consts, data.x[~tr])["diverged"]
    return p >= 0.5


def score_table(frame: pd.DataFrame, corpus_rows: list[dict]) -> pd.DataFrame:
    real = frame["real"].to_numpy(bool)
    corpus = (frame["src"] == "corpus").to_numpy()
    own_div = frame["ha_own"].to_numpy() == DIVERGES
    kr_own = frame["kr_own"].to_numpy()
    candidates: dict[str, tuple[np.ndarray, str]] = {
        "(a) head-aware own flag": (frame["ha_flag"].to_numpy(bool), "no fit"),
        "(a) head-aware own outcome": (own_div, "no fit"),
        "(b) Kronecker own flag": (frame["kr_flag"].to_numpy(bool), "no fit"),
        "(b) Kronecker own outcome": (kr_own == DIVERGES, "no fit"),
    }
    rules = {
        "(c) κ̃ ≥ t": lambda f: f["kappa_eff"].to_numpy(float),
        "(c') κ ≥ t": lambda f: f["kappa"].to_numpy(float),
        "(d) head-aware peak L̂/L̂_0 ≥ t": lambda f: f["ha_peak"].to_numpy(float),
        "(d*) head-aware outcome diverges or κ ≥ t": lambda f: np.where(
            f["ha_own"].to_numpy() == DIVERGES, np.inf, f["kappa"].to_numpy(float)),
    }
    for name, score in rules.items():
        pred, fitted = loto(frame, score)
        candidates[name] = (pred, "LOTO t: " + ", ".join(f"{v:.3g}" for v in fitted.values()))
    shipped = call(Outcome(frame["ha_own"].to_numpy(np.int32), np.zeros(len(frame), np.int32)),
                   frame["kappa"].to_numpy(float), np.zeros(len(frame), bool))
    candidates[f"(d*) shipped call, KAPPA_MAX = {KAPPA_MAX:g}"] = (
        np.asarray(shipped.outcome) == DIVERGES, "fitted on all four sets")
    for ntk in (True, False):
        pred = np.zeros(len(frame), bool)
        pred[corpus] = trees_k0(corpus_rows, real[corpus], ntk)
        candidates[f"(e) trees k = 0{' + NTK' if ntk else ', no NTK'}"] = (
            pred, "LOTO refit; corpus only")
    out = []
    for name, (pred, note) in candidates.items():
        row = {"rule": name, "note": note}
        for part, mask in (("corpus", corpus), ("benchmark", ~corpus),
                           ("pooled", np.ones(len(frame), bool))):
            if name.startswith("(b)") and part != "benchmark" or name.startswith("(e)") \
                    and part != "corpus":
                row[part] = "n/a"
                continue
            tp, fp, fn = _counts(pred[mask], real[mask])
            r = tp / (tp + fn) if tp + fn else math.nan
            p = tp / (tp + fp) if tp + fp else math.nan
            row[part] = f"R {r:.2f} P {p:.2f} ({tp}/{fp}/{fn})"
        out.append(row)
    return pd.DataFrame(out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweep", default="experiments/results/sweep")
    p.add_argument("--corpus", default="experiments/results/telemetry/corpus.jsonl.gz")
    p.add_argument("--out", help="also write the table as CSV")
    args = p.parse_args(argv)
    output_file(p, args.out, "--out")  # before reading and scoring
    for flag, path in (("--sweep", args.sweep), ("--corpus", args.corpus)):
        if not Path(path).exists():
            fail(p, f"{flag} {path}: no such file or folder (the committed ones are the "
                    "defaults; run from the repository's root).")
    corpus, rows = corpus_frame(args.corpus)
    frame = pd.concat([corpus, sweep_frame(args.sweep)], ignore_index=True)
    table = score_table(frame, rows)
    print(f"real divergences: corpus {int(corpus['real'].sum())} of {len(corpus)}, benchmark "
          f"{int(frame['real'].sum()) - int(corpus['real'].sum())} of {len(frame) - len(corpus)}"
          "; cells: recall, precision (true/false positives/missed)\n")
    print("| " + " | ".join(table.columns) + " |")
    print("|" + "---|" * len(table.columns))
    for row in table.itertuples(index=False):
        print("| " + " | ".join(map(str, row)) + " |")
    if args.out:
        table.to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
