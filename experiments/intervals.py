"""Coverage of the T_ε conformal intervals, leaving one target set out.

    python experiments/intervals.py SWEEP_DIR [--level 0.9] [--out experiments/results/intervals]

For each grouping (``by`` of ``ntk_tt.fit_intervals``: κ̃ alone, the default; κ̃ × ε;
κ̃ × ε × optimiser; none) and each target set (``dataset`` column) of SWEEP_DIR/results.parquet:
fit on the other sets, then on the held-out set's (row, ε) cases with a defined real and
predicted T_ε measure the coverage (real T_ε in [lo, hi], each bound capped at the row's T as
``ntk_tt.intervals`` caps it) and the median relative width (hi − lo)/T_real. Writes
OUT/coverage.csv (one line per grouping × held-out set × ε, with ``pooled`` over the sets and
``all`` over ε) and OUT/calibrator.json (the default grouping fitted on every set), and prints
the pooled lines. The predictor is the sweep's headline one:
when SWEEP_DIR/summary.json records a promoted primary (``--report --primary``), the same
relabelling is applied to the table first.

    python experiments/intervals.py OPT_DIR [OPT_DIR ...] --family adamw_cosine [--out DIR]

does the same for one optimiser family of the optimiser benchmark (``optimizer_sweep.py``
tables, e.g. ``experiments/results/optimizers_adamw_diagonal
experiments/results/optimizers_750_adamw_diagonal``; their rows pooled), grouped by the
optimiser (gd / sgd) or pooled, since Adam's step has no κ̃: OUT/coverage_<family>.csv,
OUT/calibrator_<family>.json (by optimiser, fitted on every set; ``ntk_tt/assets/
intervals_adamw.json`` is the adamw_cosine one of those tables, ``intervals_adamw_isotropic
.json`` of ``optimizers`` and ``optimizers_750``). The table's predictor ``pred_kernel``, e.g.
"head_aware_adam:diagonal", is recorded as ``Prediction.kernel`` reads it (method
"head_aware_adam", kernel "diagonal"; a diagonal one with k = 5, the default's),
κ̃ = κ/(1 − β₁) (unused by these groupings)
and the schedule as warmup_cosine (the benchmark's families are warmup + cosine). It also
writes OUT/stretch_<family>.json (:func:`stretch_check`: T_ε p95 with a constant time-stretch
fitted leaving each set out; reported, not applied).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib

import numpy as np
import pandas as pd
from _args import exit_error, fail  # experiments/_args.py, beside this script

from ntk_tt import fit_intervals
from ntk_tt._options_predict import DIAGONAL_DIM
from ntk_tt.prediction._intervals_fit import residuals
from ntk_tt.sweep._errors import epsilons
from ntk_tt.sweep._summary import promote
from ntk_tt.sweep._table import check_out, read_table

GROUPINGS = {"kappa": ("kappa",), "kappa+eps": ("kappa", "eps"),
             "kappa+eps+optimizer": ("kappa", "eps", "optimizer"), "none": ()}
FAMILY_GROUPINGS = {"eps": ("eps",), "eps+optimizer": ("eps", "optimizer"),
                    "optimizer": ("optimizer",), "none": ()}


def family_table(dirs, family: str) -> pd.DataFrame:
    """The rows of ``family`` in the optimiser-benchmark tables of ``dirs``, in the columns
    ``fit_intervals`` reads (module docstring)."""
    frame = pd.concat([pd.read_parquet(pathlib.Path(d) / "results.parquet") for d in dirs])
    if "family" not in frame.columns:  # the constant-η sweep's table: a KeyError
        exit_error("intervals.py", f"{dirs} hold no optimiser-benchmark table (no family "
                   "column): --family is for optimizer_sweep.py's folders.")
    frame = frame[frame["family"] == family].reset_index(drop=True)
    if frame.empty:
        exit_error("intervals.py", f"no {family!r} row in {dirs}")
    method, kernel = zip(*(k.split(":", 1) for k in frame["pred_kernel"]), strict=True)
    return frame.assign(pred_method=method, pred_kernel=kernel, schedule="warmup_cosine",
                        nesterov=False, kappa_eff=frame["kappa"] / (1 - frame["momentum"]))


def held_out_cases(train: pd.DataFrame, test: pd.DataFrame, level: float,
                   by: tuple) -> pd.DataFrame:
    """One line per defined (row, ε) of ``test``: real T_ε, interval, covered, fell back."""
    cal = fit_intervals(train, level, by=by)
    out = []
    for eps in epsilons(test):
        _, keep = residuals(test, eps)
        for _, row in test[keep].iterrows():
            args = (row["kappa_eff"], eps, row["optimizer"])
            lo, hi = cal.interval(row[f"pred_T{eps:g}"], *args, steps=row.get("steps"))
            real = row[f"real_T{eps:g}"]
            out.append({"dataset": row["dataset"], "kappa_eff": row["kappa_eff"],
                        "eps": f"{eps:g}", "real": real,
                        "lo": lo, "hi": hi, "covered": lo <= real <= hi,
                        "rel_width": (hi - lo) / real,
                        "fallback": len(cal.group(*args)[0]) < len(by)})
    return pd.DataFrame(out)


def left_out_cases(frame: pd.DataFrame, level: float, by: tuple,
                   test: pd.DataFrame | None = None) -> pd.DataFrame:
    """:func:`held_out_cases` of each target set of ``test`` (default ``frame``), the
    calibrator fitted on ``frame``'s other sets."""
    test = frame if test is None else test
    return pd.concat([held_out_cases(frame[frame["dataset"] != d], test[test["dataset"] == d],
                                     level, by) for d in sorted(test["dataset"].unique())])


def coverage(frame: pd.DataFrame, level: float, groupings: dict) -> pd.DataFrame:
    """:func:`summarise` of :func:`left_out_cases` per grouping (name → ``by``), one
    ``grouping`` column first."""
    table = pd.concat([summarise(left_out_cases(frame, level, by)).assign(grouping=name)
                       for name, by in groupings.items()])
    return table[["grouping", *table.columns.drop("grouping")]]


def summarise(cases: pd.DataFrame) -> pd.DataFrame:
    """Coverage and median relative width per held-out set × ε, per set, per ε and overall."""
    def line(held_out, eps, sub):
        return {"held_out": held_out, "eps": eps, "n": len(sub),
                "coverage": sub["covered"].mean(), "median_rel_width": sub["rel_width"].median(),
                "fallback_fraction": sub["fallback"].mean()}

    rows = []
    for name, sub in cases.groupby("dataset"):
        rows += [line(name, e, s) for e, s in sub.groupby("eps")] + [line(name, "all", sub)]
    rows += [line("pooled", e, s) for e, s in cases.groupby("eps")]
    rows.append(line("pooled", "all", cases))
    return pd.DataFrame(rows)


def stretch_check(frame: pd.DataFrame, eps=(0.1, 0.4)) -> dict:
    """T_ε p95 / median of |T̂ − T|/T over ε ∈ ``eps`` (the headline's) as predicted and with
    T̂ stretched by exp(median log residual of the other target sets): what a constant
    time-stretch fitted leaving each set out would do (reported, not applied)."""
    def logres(sub):
        return np.concatenate([r[keep] for r, keep in (residuals(sub, e) for e in eps)])

    def rel(sub, shift):
        real = np.concatenate([sub[f"real_T{e:g}"].to_numpy(float) for e in eps])
        pred = np.concatenate([sub[f"pred_T{e:g}"].to_numpy(float) for e in eps]) * np.exp(shift)
        ok = np.isfinite(real) & np.isfinite(pred)
        return np.abs(pred[ok] - real[ok]) / np.maximum(real[ok], 1.0)

    shifts, before, after = {}, [], []
    for d in sorted(frame["dataset"].unique()):
        shifts[d] = float(np.median(logres(frame[frame["dataset"] != d])))
        held = frame[frame["dataset"] == d]
        before.append(rel(held, 0.0))
        after.append(rel(held, shifts[d]))
    b, a = np.concatenate(before), np.concatenate(after)
    return {"eps": list(eps), "cases": int(b.size), "shift_log_by_held_out": shifts,
            "p95_as_predicted": float(np.percentile(b, 95)), "median_as_predicted":
            float(np.median(b)), "p95_stretched": float(np.percentile(a, 95)),
            "median_stretched": float(np.median(a))}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sweep_dir", nargs="+", help="sweep directory holding results.parquet "
                   "(several: optimiser-benchmark directories with --family)")
    p.add_argument("--level", type=float, default=0.9)
    p.add_argument("--out", default="experiments/results/intervals")
    p.add_argument("--family", help="an optimiser-benchmark family, e.g. adamw_cosine")
    args = p.parse_args(argv)
    try:  # a file, or a folder that takes no new entry: one line now, not after the reading
        check_out(args.out)
    except ValueError as err:
        p.exit(2, f"{p.prog}: error: {err}\n")
    if not 0 < args.level < 1:  # 1.5 and nan were fit_intervals' traceback after the reading
        p.exit(2, f"{p.prog}: error: --level must be a number in (0, 1), e.g. 0.9; got "
                  f"{args.level}.\n")
    if missing := [d for d in args.sweep_dir if not (pathlib.Path(d) / "results.parquet")
                   .is_file()]:
        p.exit(2, f"{p.prog}: error: no results.parquet in {', '.join(missing)}: give a "
                  "sweep's output folder.\n")
    if args.family:
        frame, groupings, tag = family_table(args.sweep_dir, args.family), FAMILY_GROUPINGS, \
            f"_{args.family}"
        fit_by = ("optimizer",)
    elif len(args.sweep_dir) > 1:
        fail(p, "give one sweep directory (several only with --family)")
    else:
        frame, groupings, tag, fit_by = read_table(args.sweep_dir[0]), GROUPINGS, "", ("kappa",)
        summary = pathlib.Path(args.sweep_dir[0]) / "summary.json"
        primary = json.loads(summary.read_text()).get("primary") if summary.exists() else None
        if primary and primary["promoted_variant"]:
            frame = promote(frame, primary["promoted_variant"], primary["demoted_primary_as"])
    table = coverage(frame, args.level, groupings)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / f"coverage{tag}.csv", index=False, float_format="%.4f")
    if args.family:
        stretch = stretch_check(frame)
        (out / f"stretch{tag}.json").write_text(json.dumps(stretch, indent=1))
        print(f"constant time-stretch left out: T_ε p95 {stretch['p95_as_predicted']:.1%} → "
              f"{stretch['p95_stretched']:.1%}, median {stretch['median_as_predicted']:.1%} → "
              f"{stretch['median_stretched']:.1%} (not applied)")
    cal = fit_intervals(frame, args.level, by=fit_by)
    if cal.source.get("pred_kernel") == ["diagonal"]:  # the sweep's primary: the default k
        cal = dataclasses.replace(cal, source=cal.source | {"subspace_dim": DIAGONAL_DIM})
    cal.save(out / f"calibrator{tag}.json", overwrite=True)  # a rerun replaces it
    with pd.option_context("display.width", 120):
        print(table[(table["held_out"] == "pooled") | (table["eps"] == "all")].to_string(
            index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"level {args.level:g}; wrote {out / f'coverage{tag}.csv'} and "
          f"{out / f'calibrator{tag}.json'}")


if __name__ == "__main__":
    main()
