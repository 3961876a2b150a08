"""T_ε intervals for the subspace feature kernel (issue 26): the conformal calibrator of
``ntk_tt.intervals`` fitted on the subspace predictor's residuals, and its coverage.

    python experiments/subspace_intervals.py --set ROWS.jsonl DIR [--set ROWS2.jsonl DIR2 ...]
        [--schedule-set OPT_DIR ...] [--level 0.9] [--out experiments/results/intervals]

Each ``--set ROWS.jsonl DIR`` is what ``subspace_preset.py --out ROWS.jsonl --table DIR``
wrote for the sweep directory DIR (the committed full preset ``experiments/results/sweep``,
or a sweep of other tasks, e.g. ``sweep.py --seeds 1``): every main-grid row (κ̃ ≤ 12)
predicted with ``backbone="subspace"`` (k = ``ntk_tt._options_predict.SUBSPACE_DIM``), the
sweep's key and batch orders. Its curves are put in place of the table's primary
(``subspace_preset.frame_for``) and labelled as a ``predict(head=..., backbone="subspace")``
prediction is (``pred_method`` "head_aware", ``pred_kernel`` "subspace"); the sets' rows are
pooled. As ``experiments/intervals.py`` does for the default: coverage and median relative
width leaving one target set out (all its tasks, of every set), for each grouping of
``GROUPINGS`` (OUT/coverage_subspace.csv); the calibrator of ``BY`` fitted on every row
(OUT/calibrator_subspace.json, recording k as ``source["subspace_dim"]`` and the κ̃ range
as ``source["kappa_eff"]``, so a prediction beyond it is flagged;
``ntk_tt/assets/intervals_subspace.json`` is a copy); and, with several sets, the calibrator
fitted on the first set's rows alone applied to the others' (tasks it never saw:
OUT/coverage_subspace_unseen.csv, per ε and pooled). Each ``--schedule-set DIR`` (an
``optimizer_sweep.py --families sgdm_cosine --backbone subspace`` directory) adds its
SGD-momentum + warmup-cosine + weight-decay rows to the pool, so the calibrator records those
schedules and weight decays as calibrated; their own coverage, each target set left out of
the fit, is OUT/coverage_subspace_schedules.csv. With ``--t-eps FILE`` the ``--set`` rows'
subspace T_ε and diverged flags are written to FILE (``T_EPS`` is the committed one): passed
as every ``--set``'s ROWS in place of the curves, they give back the same calibrator
(``tests/test_subspace_intervals.py``). Every input is read before anything is written; a bad
one is one ``subspace_intervals.py: error:`` line (exit status 2).
"""

from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np
import pandas as pd
from intervals import GROUPINGS, coverage, family_table, held_out_cases, left_out_cases, summarise
from subspace_preset import EPS, frame_for

from ntk_tt import fit_intervals
from ntk_tt._options_predict import SUBSPACE_DIM
from ntk_tt.prediction._intervals_fit import residuals
from ntk_tt.sweep._errors import t_col
from ntk_tt.sweep._table import read_table

GROUPINGS = {**GROUPINGS, "eps": ("eps",)}
T_EPS = "experiments/results/subspace_preset/t_eps.csv"  # the sets' T_ε, written by main
BY = ("eps",)  # the shipped grouping: the closest to the level left out (README "Intervals")


def subspace_table(rows_path: str, table: str) -> pd.DataFrame:
    """The rows of sweep ``table`` that ``rows_path`` predicted, with the subspace T_ε and
    diverged flag as the primary's and the labels a subspace ``Prediction`` carries (module
    docstring). ``rows_path``: a ``subspace_preset.py --out`` file, or the ``T_EPS`` table
    (its rows of ``table``)."""
    if not pathlib.Path(rows_path).is_file():
        raise ValueError(f"--set {rows_path} {table}: {rows_path} is not a file (a "
                         "subspace_preset.py --out file, or the T_ε table)")
    df = read_table(table)
    cols = ["pred_diverged", *(t_col("pred", e) for e in EPS)]
    try:
        if rows_path.endswith(".csv"):
            short = pd.read_csv(rows_path)
            short = short[[_same(t, table) for t in short["table"]]].drop(columns="table")
        else:
            rows = {}
            for line in open(rows_path):
                r = json.loads(line)
                rows[r["row_id"]] = r
    except (ValueError, KeyError, UnicodeDecodeError) as err:  # JSON, CSV or text errors
        raise ValueError(f"{rows_path} is not a subspace_preset.py --out file or a T_ε table "
                         f"({type(err).__name__}: {err})") from None
    if not rows_path.endswith(".csv"):
        short = frame_for(df[df.row_id.isin(rows)].reset_index(drop=True), rows, "subspace")
        short = short[["row_id", *cols]]
    df = df.drop(columns=cols).merge(short, on="row_id")
    if df.empty:
        raise ValueError(f"no row of {table} is in {rows_path}: pass the table it was run on")
    return df.assign(pred_method="head_aware", pred_kernel="subspace",
                     pred_diverged=df["pred_diverged"].astype(bool))


def _same(a: str, b: str) -> bool:
    """Whether two spellings name one path (trailing slash, relative or absolute)."""
    return pathlib.Path(a).resolve() == pathlib.Path(b).resolve()


def schedule_table(table: str) -> pd.DataFrame:
    """The SGD-momentum + warmup-cosine rows of an optimiser-benchmark directory run with
    ``--backbone subspace``, in the columns ``fit_intervals`` reads (``intervals.family_table``;
    schedule "warmup_cosine", λ, heavy-ball; the peak η is not recorded: κ̃ sets it)."""
    if not (pathlib.Path(table) / "results.parquet").is_file():
        raise ValueError(f"--schedule-set {table} holds no results.parquet (an "
                         "optimizer_sweep.py --backbone subspace directory)")
    if "family" not in read_table(table).columns:
        raise ValueError(f"--schedule-set {table} is not an optimizer_sweep.py directory (its "
                         "table has no optimiser family)")
    try:
        frame = family_table([table], "sgdm_cosine")
    except SystemExit as no_rows:  # family_table's own refusal
        raise ValueError(str(no_rows)) from None
    if set(frame["pred_kernel"]) != {"subspace"}:
        raise ValueError(f"--schedule-set {table} holds {sorted(set(frame['pred_kernel']))} "
                         "predictions: pass a benchmark run with --backbone subspace")
    return frame.drop(columns="peak_learning_rate")


def _check_outputs(args) -> None:
    """ValueError for a ``--level`` outside (0, 1), a ``--t-eps`` that cannot be written, or
    one that is a ``--set`` ROWS table holding tables this run does not read (rewriting it
    would drop their rows)."""
    if not 0.0 < args.level < 1.0:
        raise ValueError(f"--level must lie in (0, 1) (e.g. 0.9), got {args.level}")
    if args.t_eps is None:
        return
    t = pathlib.Path(args.t_eps)
    if t.is_dir() or not t.parent.is_dir():
        raise ValueError(f"--t-eps {t} must be a file in an existing folder")
    given = [d for r, d in args.sets if t.exists() and _same(r, str(t))]  # tables read from t
    held = set(pd.read_csv(t)["table"]) if given and t.suffix == ".csv" else set()
    dropped = sorted(h for h in held if not any(_same(h, g) for g in given))
    if dropped:
        raise ValueError(f"--t-eps {t} is a --set table that also holds {dropped}, which "
                         "this run does not read: rewriting it would drop their rows (give "
                         "every table, or another --t-eps)")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--set", nargs=2, action="append", required=True, metavar=("ROWS", "DIR"),
                   dest="sets", help="subspace_preset.py --out file and its sweep directory")
    p.add_argument("--schedule-set", action="append", default=[], dest="schedule_sets",
                   metavar="DIR", help="an optimizer_sweep.py --backbone subspace directory: "
                   "its SGD-momentum + warmup-cosine rows join the pool")
    p.add_argument("--level", type=float, default=0.9)
    p.add_argument("--out", default="experiments/results/intervals")
    p.add_argument("--t-eps", help=f"write the --set rows' subspace T_ε there (e.g. {T_EPS}, "
                   "from which the calibrator is refitted without the curves)")
    args = p.parse_args(argv)
    try:  # every input read before anything is written: one error line
        _check_outputs(args)
        frames = [subspace_table(rows, table).assign(schedule="constant", weight_decay=0.0,
                                                     nesterov=False)
                  for rows, table in args.sets]
        schedules = [schedule_table(d) for d in args.schedule_sets]
    except (ValueError, OSError) as err:
        p.exit(2, f"{p.prog}: error: {err}\n")
    constant = pd.concat(frames).reset_index(drop=True)
    frame = pd.concat([constant, *schedules]).reset_index(drop=True)
    table = coverage(frame, args.level, GROUPINGS)
    cal = fit_intervals(frame, args.level, by=BY)
    cal.source["subspace_dim"] = SUBSPACE_DIM
    used = np.any([residuals(frame, e)[1] for e in EPS], axis=0)  # rows with a residual
    kappa = frame.loc[used, "kappa_eff"]  # the κ̃ the intervals were measured on (≤ 12)
    cal.source["kappa_eff"] = [round(float(kappa.min()), 6), round(float(kappa.max()), 6)]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.t_eps:
        short = constant[["row_id", "pred_diverged", *(t_col("pred", e) for e in EPS)]]
        short.assign(table=[t for f, (_, t) in zip(frames, args.sets, strict=True)
                            for _ in range(len(f))]).to_csv(args.t_eps, index=False)
    table.to_csv(out / "coverage_subspace.csv", index=False, float_format="%.4f")
    cal.save(out / "calibrator_subspace.json", overwrite=True)  # a rerun replaces it
    with pd.option_context("display.width", 120):
        print(table[(table["held_out"] == "pooled") | (table["eps"] == "all")].to_string(
            index=False, float_format=lambda v: f"{v:.3f}"))
    if schedules:  # the schedule rows' own coverage, each target set left out of the fit
        sc = summarise(left_out_cases(frame, args.level, BY, pd.concat(schedules)))
        sc = sc[sc["held_out"] == "pooled"].assign(held_out="schedule rows")
        sc.to_csv(out / "coverage_subspace_schedules.csv", index=False, float_format="%.4f")
        print(sc.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if len(frames) > 1:
        cases = held_out_cases(frames[0], pd.concat(frames[1:]), args.level, BY)
        u = summarise(cases.assign(dataset="unseen"))
        u = u[u["held_out"] == "pooled"].assign(fitted_on=args.sets[0][1])
        u.to_csv(out / "coverage_subspace_unseen.csv", index=False, float_format="%.4f")
        print(f"tasks of {[t for _, t in args.sets[1:]]}, calibrator fitted on "
              f"{args.sets[0][1]} alone:")
        print(u.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"level {args.level:g}; wrote {out / 'coverage_subspace.csv'} and "
          f"{out / 'calibrator_subspace.json'}")


if __name__ == "__main__":
    main()
