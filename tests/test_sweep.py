"""Benchmark sweep: grid, crash-safe table, summary rules, and a SIGKILL-and-resume smoke run."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
from _scripts import experiment_script, refused

import ntk_tt
from ntk_tt.sweep import Config, ResultsTable, SweepSpec, plan, read_table, row_id
from ntk_tt.sweep._errors import row_errors
from ntk_tt.sweep._grid import check_batch_below_n, spec_from_dict, spec_to_dict
from ntk_tt.sweep._summary import breakdown, summarize

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "sweep.py"


# --- grid -------------------------------------------------------------------------------------


def test_kappa_learning_rate_and_equal_effective_pairs():
    lam, n = 37.0, 250
    plain, heavy = Config(None, 0.0, "kappa", 4.0), Config(None, 0.9, "kappa", 4.0)
    eta = plain.learning_rate(lam, n)
    assert eta * lam / n == pytest.approx(4.0)
    # equal effective learning rate η/(1 − m): the momentum run uses a 10× smaller η
    assert heavy.learning_rate(lam, n) / (1 - 0.9) == pytest.approx(eta)
    assert Config(50, 0.9, "eta", 1e-3).learning_rate(lam, n) == 1e-3


def test_plan_skips_and_counts_batches_not_below_n():
    spec = SweepSpec(datasets=("a",), per_class=(10, 50), seeds=(0, 1),
                     batch_sizes=(None, 50, 100), momenta=(0.0,), kappas=(1.0,))
    todo, skipped = plan(spec)
    per_task = {t.per_class: {c.batch_size for c in cfgs} for t, cfgs in todo}
    assert per_task == {10: {None}, 50: {None, 50, 100}}
    # N = 50: B = 50 equals GD and B = 100 exceeds N, for each of the 2 seeds
    assert skipped == {"batch_size == N (same as GD)": 2, "batch_size > N": 2}


def test_edge_kappas_run_with_m0_only_on_tasks_up_to_edge_max_train():
    spec = SweepSpec(datasets=("a",), per_class=(10, 50), seeds=(0,), batch_sizes=(None, 20),
                     momenta=(0.0, 0.9), kappas=(1.0, 24.0), edge_kappas=(24.0, 48.0),
                     edge_max_train=50)
    edge = spec.edge_configs()  # κ̃ = 24 at m = 0 is already in the grid: not repeated
    assert [(c.batch_size, c.momentum, c.lr_value) for c in edge] == [(None, 0.0, 48.0),
                                                                      (20, 0.0, 48.0)]
    todo, skipped = plan(spec)
    assert {t.per_class: len(cfgs) for t, cfgs in todo} == {10: 8 + 2, 50: 8}
    assert skipped == {"edge κ̃ on a task above edge_max_train": 2}


def test_an_edge_kappa_naming_a_main_row_is_that_row_and_mixed_batch_sizes_still_skip():
    spec = SweepSpec(datasets=("a",), per_class=(4, 10), seeds=(0,), batch_sizes=(None, 30),
                     momenta=(0.0,), kappas=(4.0,), edge_kappas=(4.0000001, 8.0))
    assert [c.id for c in spec.edge_configs()] == ["bN-m0-kappa8", "b30-m0-kappa8"]
    ids = [row_id(t, c) for t, cfgs in plan(spec)[0] for c in cfgs]
    assert len(ids) == len(set(ids)) == 6
    check_batch_below_n(spec)  # B = 30 >= N = 20 but < 50: documented skipping, no refusal
    assert plan(spec)[1] == {"batch_size > N": 2}
    with pytest.raises(ValueError, match=r"B = 50 is not below N = 50 \(classes × per_class"):
        check_batch_below_n(dataclasses.replace(spec, batch_sizes=(None, 50)))


def test_spec_rejects_bad_grids():
    with pytest.raises(ValueError, match="momenta"):
        SweepSpec(datasets=("a",), per_class=(10,), seeds=(0,), momenta=(1.0,))
    with pytest.raises(ValueError, match="learning rates"):
        SweepSpec(datasets=("a",), per_class=(10,), seeds=(0,), kappas=())


# --- results table ----------------------------------------------------------------------------


def test_table_writes_rows_atomically_and_refuses_duplicates(tmp_path):
    table = ResultsTable(tmp_path)
    (table.rows_dir / ".tmp-half-written.json").write_text('{"row_id": "x"')  # a killed write
    table.write_row({"row_id": "a", "value": 1.0, "curve": np.arange(3.0)})
    table.write_row({"row_id": "b", "value": float("nan"), "curve": [1.0, 2.0]})
    assert table.done_ids() == {"a", "b"}
    with pytest.raises(ValueError, match="already"):
        table.write_row({"row_id": "a", "value": 2.0})
    table.consolidate()
    frame = read_table(tmp_path)
    assert list(frame["row_id"]) == ["a", "b"]
    assert np.isnan(frame["value"].iloc[1])
    assert list(frame["curve"].iloc[0]) == [0.0, 1.0, 2.0]


def test_a_table_of_only_results_parquet_resumes_without_losing_its_rows(tmp_path):
    """A committed results directory keeps ``results.parquet`` but not ``rows/``: resuming
    there skips its rows and consolidating new rows keeps them (they were dropped: a resumed
    copy of a 12-row table ended with only its 12 new rows)."""
    first = ResultsTable(tmp_path / "run")
    first.write_row({"row_id": "a", "value": 1.0, "curve": np.arange(3.0)})
    first.write_row({"row_id": "b", "value": float("nan"), "curve": [1.0, 2.0]})
    first.consolidate()
    committed = tmp_path / "committed"
    committed.mkdir()
    shutil.copy(tmp_path / "run" / "results.parquet", committed)
    table = ResultsTable(committed)
    assert table.done_ids() == {"a", "b"}
    table.write_row({"row_id": "c", "value": 3.0, "curve": [4.0]})
    table.consolidate()
    frame = read_table(committed)
    assert list(frame["row_id"]) == ["a", "b", "c"]
    assert frame["value"].iloc[0] == 1.0 and np.isnan(frame["value"].iloc[1])
    assert [list(c) for c in frame["curve"]] == [[0.0, 1.0, 2.0], [1.0, 2.0], [4.0]]
    table.consolidate()  # again: the same table, no row twice
    pd.testing.assert_frame_equal(read_table(committed), frame)


# --- summary rules ----------------------------------------------------------------------------


def _frame(real, pred, real_div, pred_div, config="c", tasks=None):
    k = len(real)
    return pd.DataFrame({
        "row_id": [f"r{i}" for i in range(k)], "task_id": tasks or [f"t{i}" for i in range(k)],
        "config_id": config, "per_class": 10, "steps": 100, "optimizer": "gd",
        "real_T0.1": real, "pred_T0.1": pred, "real_diverged": real_div,
        "pred_diverged": pred_div,
    })


def test_row_errors_rules():
    frame = _frame(real=[50.0, 40.0, 30.0, np.nan, 20.0, 10.0],
                   pred=[55.0, 30.0, np.nan, 10.0, 20.0, 12.0],
                   real_div=[False, False, False, False, True, False],
                   pred_div=[False, False, False, False, True, True])
    abs_err, signed, excluded = row_errors(frame, "ntk", 0.1)
    # +10 %, −25 %, undefined prediction (100 %), undefined real (excluded), both diverged
    # (excluded), false divergence flag (100 %)
    np.testing.assert_allclose(abs_err, [0.1, 0.25, 1.0, np.nan, np.nan, 1.0])
    np.testing.assert_allclose(signed[:2], [0.1, -0.25])
    assert excluded == {"both diverged": 1, "real T_eps undefined": 1}
    line, _, _ = row_errors(frame, "line", 0.1)  # T̂ = (1 − ε)·T = 90 steps
    assert line[0] == pytest.approx(40 / 50)


def test_median_of_other_tasks_baseline_leaves_the_task_out():
    frame = _frame(real=[10.0, 20.0, 60.0], pred=[10.0, 20.0, 60.0], real_div=[False] * 3,
                   pred_div=[False] * 3)
    abs_err, _, _ = row_errors(frame, "median_other_tasks", 0.1)
    # row 0 sees median(20, 60) = 40 → +300 %; row 1: median(10, 60) = 35; row 2: 15
    np.testing.assert_allclose(abs_err, [3.0, 0.75, 0.75])


def test_median_of_other_tasks_baseline_gives_each_exclusion_its_reason():
    # config a: t0's only other task diverged; config b: t0 is flat, so t1 has no other task
    frame = _frame(real=[50.0, np.nan, np.nan, 40.0], pred=[50.0, np.nan, np.nan, 40.0],
                   real_div=[False, True, False, False], pred_div=[False] * 4,
                   config=["a", "a", "b", "b"], tasks=["t0", "t1", "t0", "t1"])
    abs_err, _, excluded = row_errors(frame, "median_other_tasks", 0.1)
    # row 1: the real run diverged, the baseline (50) did not predict it: a missed flag
    np.testing.assert_allclose(abs_err, [np.nan, 1.0, np.nan, np.nan])
    assert excluded == {"both diverged": 0, "real T_eps undefined": 1,
                        "no other task with a defined real T_eps": 2}


def test_task_bootstrap_resamples_whole_tasks():
    """Two tasks, one with every error 0, one with every error 1: a task resample may hold
    only the first task, so the interval reaches 0; resampling rows (half of them 1) gives
    p95 = 1 in every resample, an interval far too narrow."""
    from ntk_tt.sweep._errors import error_stats

    abs_err = np.array([0.0] * 10 + [1.0] * 10)
    groups = np.array(["a"] * 10 + ["b"] * 10)
    by_task = error_stats(abs_err, abs_err, groups=groups, boot=400)
    assert by_task["p95_ci95"] == [0.0, 1.0]
    assert error_stats(abs_err, abs_err, boot=400)["p95_ci95"] == [1.0, 1.0]


def test_task_bootstrap_equals_concatenating_the_picked_tasks():
    """The vectorised resampling against the direct one: the same task draws, the picked
    tasks' rows concatenated, np.percentile (ties and unequal task sizes included)."""
    from ntk_tt.sweep._errors import _task_bootstrap

    rng = np.random.default_rng(3)
    for n, t in [(1, 1), (7, 3), (60, 9)]:
        abs_err = np.round(rng.exponential(size=n), 1)  # rounding makes ties
        groups = rng.integers(0, t, n).astype(str)
        ids, inverse = np.unique(groups, return_inverse=True)
        draws = np.random.default_rng(11)
        direct = [np.percentile(abs_err[np.concatenate(
            [np.flatnonzero(inverse == k) for k in draws.integers(0, len(ids), len(ids))])], 95)
            for _ in range(200)]
        fast = _task_bootstrap(abs_err, groups, np.random.default_rng(11), 200)
        np.testing.assert_allclose(fast, direct, rtol=0, atol=1e-12)


def test_curve_distance_divergence_by_kappa_and_edge_rows():
    from ntk_tt.sweep._summary import curve_distance, divergence, edge_rows

    frame = _frame(real=[50.0, 40.0, 30.0], pred=[55.0, 30.0, 20.0],
                   real_div=[False, False, True], pred_div=[False, True, True])
    frame["real_loss"] = [np.array([2.0, 1.0, 0.0]), np.array([2.0, 1.5, 1.0]),
                          np.array([2.0, 9.0, 8.0])]
    frame["pred_loss"] = [np.array([2.0, 1.5, 0.5]), np.array([2.0, 3.0, 4.0]),
                          np.array([2.0, 9.0, 9.0])]
    # only row 0 counts (row 1: prediction diverged; row 2: both): max |Δ| 0.5 / fall 2
    assert curve_distance(frame)["ntk"] == {"n": 1, "median": 0.25, "p95": 0.25}
    frame["kappa_eff"] = [1.0, 24.0, 24.0]
    div = divergence(frame)
    assert div["confusion"]["ntk"] == {"pred_yes_real_yes": 1, "pred_yes_real_no": 1,
                                       "pred_no_real_yes": 0, "pred_no_real_no": 1}
    assert div["by_kappa"]["24"] == {"n": 2, "real": 0.5, "ntk": 1.0}
    frame["lr_kind"], frame["lr_value"] = "kappa", [1.0, 24.0, 24.0]
    frame["momentum"] = [0.0, 0.0, 0.9]
    grid = {"kappas": [1.0, 4.0], "edge_kappas": [24.0]}
    assert list(edge_rows(frame, grid)) == [False, True, True]  # any m at an edge κ̃
    # a directory resumed with a grown grid: rows of the earlier edge set (here B = 100)
    # stay edge rows though the grid now runs its edge κ̃ at B ∈ {N, 50} only
    frame["optimizer"], frame["batch_size"] = ["gd", "sgd", "sgd"], [np.nan, 100.0, 50.0]
    grid |= {"momenta": [0.0, 0.9], "batch_sizes": [None, 50, 100],
             "edge_momenta": [0.0, 0.9], "edge_batch_sizes": [None, 50]}
    assert list(edge_rows(frame, grid)) == [False, True, True]
    assert not edge_rows(frame, None).any()


def test_outcomes_filled_for_the_rows_that_lack_them():
    """A table resumed across the issue-26 columns: rows without outcome columns get them
    from their curves (the rule of ntk_tt.dynamics._divergence), rows with them keep theirs."""
    from ntk_tt.sweep._outcomes import with_outcomes

    calm, blown = np.linspace(2.0, 0.5, 20), np.r_[2.0, 5.0, 30.0, np.full(17, 40.0)]
    frame = pd.DataFrame({
        "real_loss": [calm, blown, calm], "real_diverged": False,
        "real_spiked_at": [-1, 2, -1],  # as ntk_tt.finetune flags it: above 10·L_0 at step 2
        "real_outcome": [None, None, "catapult"], "real_spike_step": [None, None, 7],
        "pred_loss": [calm, calm, calm], "pred_diverged": False, "pred_spiked_at": -1,
        "pred_method": "discrete", "pred_kernel": "head_aware:isotropic",
        "kappa": [1.0, 1.0, 1.0], "momentum": 0.0})
    out = with_outcomes(frame)
    # row 0 never rises above L_0; row 1 spiked above 10·L_0: diverges; row 2 kept
    assert list(out["real_outcome"]) == ["converges", "diverges", "catapult"]
    assert out["real_spike_step"].iloc[2] == 7
    assert list(out["pred_outcome"]) == ["converges"] * 3  # derived for every row


def test_a_feature_subspace_predictors_diverging_curve_below_kappa_max_is_a_catapult():
    """The sweep's calls, derived from stored curves: a diagonal / subspace kernel's (by its
    label, or the primary's ``pred_kernel``) diverging curve is "catapult" below κ = 68 and
    "diverges" at κ ≥ 68; the isotropic kernel's stays "diverges"."""
    from ntk_tt.sweep._outcomes import with_outcomes

    blown = np.r_[2.0, 5.0, 30.0, np.full(17, np.inf)]
    label = "head-aware, diagonal feature kernel (k = 5)"  # a variant's label saying so
    frame = pd.DataFrame({
        "real_loss": [blown] * 3, "real_diverged": True, "real_spiked_at": 2,
        "pred_loss": [blown] * 3, "pred_diverged": True, "pred_spiked_at": 2,
        "pred_method": "head_aware", "pred_kernel": ["isotropic", "diagonal", "subspace"],
        "var_d_loss": [blown] * 3, "var_d_diverged": True, "var_d_spiked_at": 2,
        "var_d_label": label, "var_d_T0.1": np.nan,
        "kappa": [40.0, 40.0, 70.0], "momentum": 0.0})
    out = with_outcomes(frame)
    assert list(out["pred_outcome"]) == ["diverges", "catapult", "diverges"]
    assert list(out["var_d_outcome"]) == ["catapult", "catapult", "diverges"]


def test_per_task_cost_ratio_counts_every_row_the_prediction_time_covers():
    """A task's predictions are timed together, edge κ̃ rows with the rest
    (``task_seconds_predict``): its fine-tunes are summed over the same rows."""
    from ntk_tt.sweep._summary import wall_time

    frame = pd.DataFrame({
        "task_id": ["a", "a", "a", "b", "b"], "optimizer": "gd",
        "seconds_finetune": [10.0, 20.0, 30.0, 40.0, 50.0],
        "seconds_predict": [1.0, 1.0, 1.0, 2.0, 2.0],
        "task_seconds_kernel": [1.0, 1.0, 1.0, 3.0, 3.0],
        "task_seconds_predict": [2.0, 2.0, 2.0, 6.0, 6.0],
    })
    out = wall_time(frame)
    assert out["per_task_ratio_min_max"] == [10.0, 20.0]  # b: 90 / 9, a: 60 / 3
    assert out["per_task_median_ratio"] == 15.0
    assert out["per_task_median_ratio_kernel_once"] == 15.0  # one invocation: the same
    assert out["total_seconds_finetune"] == 150.0
    assert out["total_seconds_kernel_and_predict"] == 12.0
    # a resumed invocation adds two rows to task a, paying its kernel and predictions again
    more = pd.DataFrame({"task_id": "a", "optimizer": "gd", "seconds_finetune": [25.0, 35.0],
                         "seconds_predict": 1.0, "task_seconds_kernel": 2.0,
                         "task_seconds_predict": 1.0})
    out = wall_time(pd.concat([frame, more], ignore_index=True))
    assert out["per_task_ratio_min_max"] == [10.0, 20.0]  # a: (60 + 60) / (3 + 3)
    # counted once (the mean of its invocations' 1 s and 2 s of kernel): a 120 / 4.5, b 90 / 9
    assert out["per_task_median_ratio_kernel_once"] == pytest.approx((120 / 4.5 + 10.0) / 2)
    assert out["total_seconds_kernel_and_predict"] == 15.0


def test_promote_swaps_a_variant_into_the_headline():
    from ntk_tt.sweep._summary import promote

    frame = _frame(real=[50.0, 40.0], pred=[55.0, 30.0], real_div=[False] * 2,
                   pred_div=[False] * 2)
    frame["pred_method"], frame["pred_kernel"] = "head_aware", "kronecker"
    frame["var_iso_T0.1"], frame["var_iso_diverged"] = [50.0, 44.0], [False, False]
    frame["var_iso_label"], frame["var_iso_seconds"] = "iso", 1.0
    out = promote(frame, "iso", "kron")
    np.testing.assert_allclose(row_errors(out, "ntk", 0.1)[0], [0.0, 0.1])
    np.testing.assert_allclose(row_errors(out, "kron", 0.1)[0], [0.1, 0.25])
    assert "var_iso_T0.1" not in out and out["pred_kernel"].iat[0] == "iso"
    with pytest.raises(ValueError, match="no variant"):
        promote(frame, "exact", "kron")
    # a fresh user's --primary iso ntk: the demoted primary took the headline's own name and
    # vanished from the report; refused as a name that exists is
    for taken, what in (("ntk", "is the headline's name of the primary"),
                        ("iso", "already exists")):
        with pytest.raises(ValueError, match=f"^variant '{taken}' {what}; choose another"):
            promote(frame, "iso", taken)


def test_promote_takes_the_variants_error_curves_or_drops_the_primarys():
    """The absolute error targets of a promoted variant are its own (stored error curves),
    never the demoted primary's: a variant without error curves gives no error targets."""
    from ntk_tt.sweep._summary import promote
    from ntk_tt.sweep._targets import steps_col, target_frame

    frame = _frame(real=[50.0, 40.0], pred=[55.0, 30.0], real_div=[False] * 2,
                   pred_div=[False] * 2)
    frame["pred_method"], frame["pred_kernel"] = "head_aware", "isotropic"
    curve = np.linspace(2.0, 0.5, 11)
    frame["real_loss"] = frame["pred_loss"] = [curve] * 2
    frame["real_error"] = [np.linspace(0.8, 0.0, 11)] * 2
    frame["pred_error"] = [np.full(11, 0.8)] * 2  # never reaches an error target
    frame["var_d_T0.1"], frame["var_d_diverged"] = [50.0, 44.0], [False, False]
    frame["var_d_label"], frame["var_d_loss"] = "d", [curve] * 2
    frame["var_d_error"] = [np.linspace(0.8, 0.0, 11)] * 2  # the real one: same steps
    col = steps_col("pred", "error", 0.5)
    real = target_frame(frame)[steps_col("real", "error", 0.5)]
    assert target_frame(frame)[col].isna().all() and real.notna().all()
    promoted = target_frame(promote(frame, "d", "iso"))
    np.testing.assert_array_equal(promoted[col], real)
    without = promote(frame.drop(columns="var_d_error"), "d", "iso")
    assert "pred_error" not in without and col not in target_frame(without)


def test_breakdown_splits_errors_by_factor_and_measures_the_fall_ratio():
    frame = _frame(real=[50.0, 40.0, 100.0, 80.0], pred=[55.0, 30.0, 50.0, 80.0],
                   real_div=[False] * 4, pred_div=[False] * 4)
    frame["real_T0.4"], frame["pred_T0.4"] = frame["real_T0.1"], frame["pred_T0.1"]
    frame["kappa_eff"] = [1.0, 1.0, 4.0, 4.0]
    frame["dataset"], frame["momentum"], frame["batch_size"] = "d", 0.0, 100
    frame["real_loss"] = [np.array([2.0, 1.0])] * 4
    frame["pred_loss"] = [np.array([2.0, 1.5]), np.array([2.0, 1.0]),
                          np.array([2.0, 1.8]), np.array([2.0, 1.6])]
    out = breakdown(frame)
    k1, k4 = out["kappa_eff"]["1.0"], out["kappa_eff"]["4.0"]
    # κ̃ = 1: errors +10 % and −25 % at both ε (pooled n = 4); κ̃ = 4: −50 % and 0 %
    assert k1["gd"]["ntk"]["n"] == 4
    assert k1["gd"]["ntk"]["p95"] == pytest.approx(np.percentile([0.1, 0.25] * 2, 95))
    assert k4["gd"]["ntk"]["median_signed"] == pytest.approx(-0.25)
    assert "sgd" not in k1
    # predicted fall / real fall: (0.5, 1.0) → 0.75 and (0.2, 0.4) → 0.3
    assert k1["fall_ratio_median"] == pytest.approx(0.75)
    assert k4["fall_ratio_median"] == pytest.approx(0.3)
    assert list(out["batch_size"]) == ["gd"]


# --- smoke sweep, killed with SIGKILL and resumed ---------------------------------------------


def _finished_rows(rows):
    """Row files of finished runs (a write in progress is a hidden ``.tmp-*.json`` file)."""
    return [p for p in rows.glob("*.json") if not p.name.startswith(".")] if rows.exists() else []


def _sweep(out, *extra):
    return [sys.executable, str(SCRIPT), "--smoke", "--out", str(out), *extra]


def _sweep_env(cache: pathlib.Path) -> dict:
    """The environment of a sweep run as a subprocess: a resumed process reuses the stopped
    one's compiled executables (JAX's persistent compilation cache in ``cache``): the tests
    check resumption, not compilation, twice; and XLA's optimisation level 1, not conftest's
    0: the kernels' per-sample Jacobians run so slowly unoptimised that level 0 costs more
    than it saves (killed + resumed run, user CPU: level 0 387 s, the default level 86–95 s,
    level 1 77 s)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_backend_optimization_level")]
    return dict(os.environ, PYTHONUNBUFFERED="1",
                XLA_FLAGS=" ".join(["--xla_backend_optimization_level=1", *flags]),
                JAX_COMPILATION_CACHE_DIR=str(cache),
                JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory):
    """One persistent compilation cache for this module's sweep subprocesses: the Ctrl-C test
    reuses the SIGKILL test's executables for the groups they share (GD and B = 10)."""
    return tmp_path_factory.mktemp("jax_cache")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, jax_cache):
    """The smoke preset (one task, its GD and B = 10 groups) killed with SIGKILL once its
    first group's rows are written, then resumed: the second process finishes the task."""
    out = tmp_path_factory.mktemp("sweep")
    rows = out / "rows"
    env = _sweep_env(jax_cache)
    t0 = time.perf_counter()
    # stderr to a file, not a pipe nobody reads while polling: a full pipe (progress bars,
    # JAX_LOG_COMPILES) would block the sweep before its first row and the loop forever
    log = out.parent / f"{out.name}-killed.stderr"
    with log.open("wb") as err:
        proc = subprocess.Popen(_sweep(out), cwd=out.parent, env=env,
                                stdout=subprocess.DEVNULL, stderr=err)
        while proc.poll() is None and not _finished_rows(rows):
            time.sleep(0.2)
    assert proc.poll() is None, log.read_text()[-2000:]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_with = len(_finished_rows(rows))
    done = subprocess.run(_sweep(out), cwd=out.parent, env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"smoke sweep, killed and resumed: {time.perf_counter() - t0:.1f} s")
    return out, killed_with, done.stdout


def test_sigkill_and_resume_gives_every_row_exactly_once(smoke):
    out, killed_with, stdout = smoke
    spec = SweepSpec(**{k: tuple(v) if isinstance(v, list) else v
                        for k, v in json.loads((out / "spec.json").read_text()).items()})
    todo, _ = plan(spec)
    expected = sorted(row_id(t, c) for t, cfgs in todo for c in cfgs)
    frame = read_table(out)
    assert 1 <= killed_with < len(expected)
    assert sorted(frame["row_id"]) == expected  # every row, none twice
    # the killed invocation keeps its entry (seconds and rows up to its last progress
    # message, which may precede its last row), marked unfinished; the resumed one finished
    killed, resumed = json.loads((out / "runs.json").read_text())
    assert not killed["finished"] and resumed["finished"]
    assert killed["seconds"] > 0 and 0 <= killed["rows_written"] <= killed_with
    assert resumed["rows_written"] == len(expected) - killed_with
    counts = next(line for line in stdout.splitlines() if line.startswith("{"))
    assert json.loads(counts)["already_present"] == killed_with


def test_smoke_table_figures_and_summary_are_consistent(smoke):
    out = smoke[0]
    frame = read_table(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows"] == len(frame) and summary["tasks"] == frame["task_id"].nunique()
    assert summary["missing_rows"] == 0 and summary["planned_rows"] == len(frame)
    runs = json.loads((out / "runs.json").read_text())  # the killed invocation counts too
    assert summary["sweep_invocations"] == 2 and summary["sweep_invocations_unfinished"] == 1
    assert summary["sweep_wall_seconds"] == pytest.approx(sum(r["seconds"] for r in runs))
    recomputed = summarize(frame, meta={k: summary[k] for k in ("grid", "skipped_rows",
                                                                "planned_rows", "missing_rows",
                                                                "sweep_wall_seconds",
                                                                "sweep_invocations",
                                                                "sweep_invocations_unfinished",
                                                                "primary")})
    assert json.loads(json.dumps(recomputed)) == summary  # the summary is the table's
    for opt in ("gd", "sgd"):
        block = summary["headline"]["all"][opt]["pooled_0.1_0.4"]["ntk"]
        assert block["n"] == 2 * (frame["optimizer"] == opt).sum() - sum(
            block["excluded"].values())
        assert 0.0 <= block["within_13pct"] <= block["within_20pct"] <= 1.0
    steps = frame["steps"].iloc[0]
    assert all(len(c) == steps + 1 for c in frame["real_loss"])
    assert all(len(c) == steps + 1 for c in frame["pred_loss"])
    assert (frame["seconds_predict"] > 0).all() and (frame["seconds_finetune"] > 0).all()
    for name in ("fig1_scatter.png", "fig2_equal_elr.png", "fig5_walltime.png",
                 "fig6_factors.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    table1 = pd.read_csv(out / "table1.csv")
    assert set(table1["dataset"]) == set(frame["dataset"])


def test_the_primary_is_predicts_default_and_the_isotropic_variant_its_kernel(smoke):
    """The primary (GD rows, deterministic) is what a user's ``ntk_tt.predict`` gives by
    default (the diagonal feature kernel) at the row's η and m, and the recorded
    ``head_aware_isotropic`` variant is ``predict(..., backbone="isotropic")``; the variant
    stores its error curve (promotable with the error targets)."""
    from ntk_tt.sweep import _run

    frame = read_table(smoke[0])
    spec = spec_from_dict(json.loads((smoke[0] / "spec.json").read_text()))
    task = spec.tasks()[0]
    data = _run.load_task(task, spec)
    gd = frame[frame["optimizer"] == "gd"]
    assert len(gd) >= 2 and (gd["pred_kernel"] == "diagonal").all()
    for r in gd.itertuples():
        kw = dict(learning_rate=r.learning_rate, momentum=r.momentum, steps=spec.steps,
                  head=data.split)
        out = ntk_tt.predict(data.apply_fn, data.params, data.x, data.y, **kw)
        assert out.kernel == "head_aware:diagonal"
        np.testing.assert_allclose(r.pred_loss, out.loss, rtol=2e-5)
        iso = ntk_tt.predict(data.apply_fn, data.params, data.x, data.y, backbone="isotropic",
                             **kw)
        np.testing.assert_allclose(r.var_head_aware_isotropic_loss, iso.loss, rtol=2e-5)
        np.testing.assert_allclose(r.var_head_aware_isotropic_error, iso.error, atol=1e-6)
    assert (frame["predictions_reused"] == "").all()


def test_reused_predictions_are_the_earlier_sweeps_and_only_missing_variants_are_built(
        smoke, tmp_path, monkeypatch):
    """``--reuse-predictions``: a rerun into a new directory takes every variant the earlier
    table has (same η, steps, label) without building its kernel, computes the one it lacks
    (deleted here) and a variant whose label changed, and its rows equal the earlier ones."""
    from ntk_tt.sweep import _predictions, _run

    earlier = read_table(smoke[0])
    lacking = earlier.drop(columns=[c for c in earlier.columns
                                    if c.startswith("var_head_aware_isotropic_")])
    lacking["var_traced_label"] = "an older traced variant"
    (tmp_path / "before").mkdir()
    lacking.to_parquet(tmp_path / "before" / "results.parquet")
    built = []
    variants = _predictions._variants

    def counted(*args, **kwargs):
        out = variants(*args, **kwargs)
        built.append(set(out))
        return out

    monkeypatch.setattr(_run, "_variants", counted)
    spec = spec_from_dict(json.loads((smoke[0] / "spec.json").read_text()))
    _run.run_sweep(spec, tmp_path / "again", reuse_from=tmp_path / "before",
                   reuse_predictions_from=tmp_path / "before", progress=lambda m: None)
    ResultsTable(tmp_path / "again").consolidate()
    assert built == [{"head_aware_isotropic", "traced"}]
    again = read_table(tmp_path / "again").set_index("row_id").loc[earlier["row_id"]]
    reused = sorted(set(_predictions.variant_names(spec)) - {"head_aware_isotropic", "traced"})
    assert set(again["predictions_reused"]) == {",".join(reused)}
    for name in _predictions.variant_names(spec):
        assert list(again[f"var_{name}_outcome"]) == list(earlier[f"var_{name}_outcome"])
        for col in (f"var_{name}_loss", f"var_{name}_T0.1"):
            for a, b in zip(again[col], earlier[col], strict=True):
                if name in reused:  # taken as stored
                    np.testing.assert_array_equal(a, b)
                else:  # computed again: deterministic up to float reassociation
                    np.testing.assert_allclose(a, b, rtol=1e-5)
    assert (again["real_source"] == "reused").all()


def test_a_report_of_a_sweep_not_finished_says_how_many_rows_are_missing(smoke, tmp_path):
    """A fresh user's --report on a killed sweep summarised it without saying it was partial:
    here the grid of spec.json gains a κ̃ the table has no rows for (as a sweep killed before
    reaching it), and the summary counts them and the text says so."""
    from ntk_tt.sweep._run import report

    out = tmp_path / "partial"
    shutil.copytree(smoke[0], out)
    spec = json.loads((out / "spec.json").read_text())
    spec["kappas"] = [*spec["kappas"], 0.5]
    (out / "spec.json").write_text(json.dumps(spec))
    todo, _ = plan(spec_from_dict(spec))
    missing = sum(c.id.endswith("kappa0.5") for _, cfgs in todo for c in cfgs)
    summary = report(out)
    assert missing >= 1 and summary["missing_rows"] == missing
    assert summary["planned_rows"] == summary["rows"] + missing
    assert f"partial: {missing} of the grid's {summary['planned_rows']} rows are not run " \
        "yet" in experiment_script("sweep")._headline(summary)


def _sigint_as_in_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_ends_in_one_line_keeps_the_rows_and_the_same_command_resumes(tmp_path,
                                                                           jax_cache):
    """Ctrl-C was a ~100-line KeyboardInterrupt traceback (exit -2), SIGTERM a silent exit.
    Three batch sizes: two groups of rows are still to come when the first is written."""
    out, rows = tmp_path / "out", tmp_path / "out" / "rows"
    env = _sweep_env(jax_cache)
    command = _sweep(out, "--batch-sizes", "N", "10", "5")
    log = tmp_path / "interrupted.stderr"
    with log.open("wb") as err:
        # Ctrl-C as in a terminal, even when the suite runs with SIGINT ignored (a job
        # started in the background): an ignored SIGINT stays ignored, by design
        proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                stderr=err, preexec_fn=_sigint_as_in_a_terminal)
        while proc.poll() is None and not _finished_rows(rows):
            time.sleep(0.05)
        assert proc.poll() is None, log.read_text()[-2000:]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130, log.read_text()[-3000:]
    kept = {p.name: p.read_bytes() for p in _finished_rows(rows)}
    verb = "rows are" if len(kept) > 1 else "row is"
    assert log.read_text().splitlines() == [
        f"sweep.py: interrupted; the {len(kept)} finished {verb} kept in {rows}: run the "
        "same command to resume"]
    assert all(json.loads(b)["row_id"] for b in kept.values())  # whole rows
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    spec = SweepSpec(**{k: tuple(v) if isinstance(v, list) else v
                        for k, v in json.loads((out / "spec.json").read_text()).items()})
    expected = sorted(row_id(t, c) for t, cfgs in plan(spec)[0] for c in cfgs)
    assert len(kept) < len(expected) == 6
    assert sorted(read_table(out)["row_id"]) == expected  # every row, none twice
    assert all((rows / name).read_bytes() == data for name, data in kept.items())


@pytest.mark.parametrize("raised", [KeyboardInterrupt(),
                                    RuntimeError("XLA compilation failed")])
def test_an_interrupted_sweep_is_one_line_130_and_sigterm_143(tmp_path, capsys, monkeypatch,
                                                               raised):
    """The handler's path in-process: a KeyboardInterrupt, or (inside XLA) an error it
    caused, ends main with one line naming the rows kept, exit status 130."""
    module = experiment_script("sweep")
    out = tmp_path / "out"
    if isinstance(raised, RuntimeError):
        raised.__context__ = KeyboardInterrupt()

    def interrupted(spec, out, **kw):
        ResultsTable(out).write_row({"row_id": "done", "value": 1.0})
        raise raised

    monkeypatch.setattr(module, "run_sweep", interrupted)
    with pytest.raises(SystemExit) as ended:
        module.main(["--out", str(out), "--smoke"])
    assert ended.value.code == 130
    assert capsys.readouterr().err.splitlines() == [
        f"sweep.py: interrupted; the 1 finished row is kept in {out / 'rows'}: run the same "
        "command to resume"]
    assert module.stopped_line(tmp_path / "new", signal.SIGTERM) == (
        "sweep.py: terminated (SIGTERM) before any row was finished; run the same command to "
        "start")
    monkeypatch.setattr(module, "run_sweep", lambda *a, **k: 1 / 0)  # other errors: raised
    with pytest.raises(ZeroDivisionError):
        module.main(["--out", str(out), "--smoke"])


def test_an_interrupted_invocation_records_its_seconds_up_to_the_interruption(tmp_path):
    """A fresh user's Ctrl-C 9 s into a sweep, before its first progress message, left
    ``seconds`` 0.0008 in runs.json: the interruption now rewrites the entry with the time
    spent (here 0.3 s in the task loader) and ``finished`` False, then propagates."""
    from ntk_tt.sweep._run import run_sweep

    def loader(task, spec):
        time.sleep(0.3)
        raise KeyboardInterrupt

    spec = SweepSpec(datasets=("flowers5",), per_class=(4,), seeds=(0,), batch_sizes=(None,),
                     kappas=(4.0,), steps=10)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, tmp_path / "out", loader=loader, progress=lambda _: None)
    (entry,) = json.loads((tmp_path / "out" / "runs.json").read_text())
    assert entry["seconds"] >= 0.3 and entry["rows_written"] == 0 and not entry["finished"]


@pytest.mark.parametrize("raised, status", [(KeyboardInterrupt(), 130),
                                            (ValueError("no table"), 2)])
def test_an_invocation_stopped_during_its_report_is_recorded_unfinished(tmp_path, capsys,
                                                                        monkeypatch, raised,
                                                                        status):
    """A fresh user's SIGTERM after every row was written, while the report (summary.json,
    figures) was being built: exit 143 and the ``terminated`` line, but the invocation's
    entry in runs.json said ``finished: true``. The report is the invocation's last step: one
    stopped (or failing) there is recorded unfinished; one that completes it is finished, and
    its own summary already counts it so."""
    module = experiment_script("sweep")
    out = tmp_path / "out"
    argv = ["--out", str(out), "--smoke"]
    _, spec = module.parse(argv)
    table = ResultsTable(out)  # every row done: the invocation goes straight to its report
    for task, configs in plan(spec)[0]:
        for c in configs:
            table.write_row({"row_id": row_id(task, c), "value": 1.0})
    seen = []  # the invocation's entry as each report reads it

    def report(out_, primary=None, last_step=False):
        assert last_step  # the run's own report: it counts its own entry finished
        seen.append(json.loads((out / "runs.json").read_text())[-1]["finished"])
        if len(seen) == 1:
            raise raised
        return {}

    monkeypatch.setattr(module, "report", report)
    monkeypatch.setattr(module, "_headline", lambda summary: "headline")
    with pytest.raises(SystemExit) as ended:
        module.main(argv)
    assert ended.value.code == status
    assert capsys.readouterr().err.count("\n") == 1
    assert [r["finished"] for r in json.loads((out / "runs.json").read_text())] == [False]
    module.main(argv)  # the same command again: its report completes
    assert capsys.readouterr().out.endswith("headline\n")
    assert [r["finished"] for r in json.loads((out / "runs.json").read_text())] == [False, True]
    assert seen == [False, False]  # unfinished until the report returns (kill -9 there too)


@pytest.mark.parametrize("script, args", [("sweep.py", ["--smoke"]),
                                          ("optimizer_sweep.py", ["--preset", "smoke"])])
def test_ctrl_c_or_sigterm_while_the_script_starts_is_one_line(tmp_path, script, args):
    """A fresh user: SIGINT in the first second (the imports) was a KeyboardInterrupt
    swallowed by an XLA callback, and the sweep then ran to its end with status 0, or an
    import traceback (optimizer_sweep.py: a traceback, and SIGTERM a silent death). The
    scripts take the signals before their imports (``ntk_tt.cli.guard_starting``): SIGTERM as
    soon as the handler is installed (seen in /proc) ends it with one line, status 143,
    nothing written."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, str(ROOT / "experiments" / script), *args,
                             "--out", str(out)], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    status = pathlib.Path(f"/proc/{proc.pid}/status")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:  # SIGTERM caught: SigCgt bit 14
        caught = next((int(line.split()[1], 16) for line in status.read_text().splitlines()
                       if line.startswith("SigCgt:")), 0)
        if caught & (1 << (signal.SIGTERM - 1)):
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and len(err.splitlines()) == 1, err[-2000:]
    # the handler is seen within milliseconds, the imports take seconds
    assert err == f"{script}: terminated (SIGTERM) while starting; nothing was written\n", err
    assert not out.exists()


def test_an_interrupt_dropped_by_a_callback_is_honoured_at_the_next_progress_line(tmp_path,
                                                                                  capsys):
    """A Ctrl-C whose KeyboardInterrupt is swallowed inside a callback (XLA's gc hook) left
    only the guard's watcher, which waits 3 s: a sweep whose last groups finished sooner
    would exit 0, nothing said. The signal (recorded in the guard's state) now ends the sweep
    at its next progress message, after the rows just written."""
    module = experiment_script("sweep")
    state = {"signal": signal.SIGINT}  # what the guard's handler records

    def sweep(spec, out, *, reuse_from=None, reuse_predictions_from=None, progress=print,
              finish=None):
        ResultsTable(out).write_row({"row_id": "done", "value": 1.0})
        progress("task: batch N: 1 rows written")
        raise AssertionError("the sweep went on after the interrupt")

    module_run = module.run_sweep
    try:
        module.run_sweep = sweep
        with pytest.raises(KeyboardInterrupt):
            module._main(["--out", str(tmp_path / "out"), "--smoke"], state)
    finally:
        module.run_sweep = module_run
    assert capsys.readouterr().out == "task: batch N: 1 rows written\n"


def test_sequential_and_vmapped_fine_tunes_agree():
    """The CPU path (configurations one after another) = the vmapped path, and a divergent
    configuration is flagged by both."""
    from ntk_tt.sweep import _run
    from ntk_tt.sweep._grid import Task

    task = Task("flowers5", 2, 0)
    data = _run.load_task(task, SweepSpec(datasets=("flowers5",), per_class=(2,), seeds=(0,)))
    lrs, moms = np.array([1e-3, 5e-3, 50.0], np.float32), np.array([0.0, 0.9, 0.0], np.float32)
    for b in (5,):  # minibatches: the full batch is the same code with one index set
        kw = dict(steps=8, batch_size=b)
        v = _run._finetune_group(data, _run._task_key(task), lrs, moms, vmapped=True, **kw)
        s = _run._finetune_group(data, _run._task_key(task), lrs, moms, vmapped=False, **kw)
        np.testing.assert_allclose(s[0], v[0], rtol=1e-4)
        assert list(s[1]) == list(v[1]) == [False, False, True]
        assert list(s[2]) == list(v[2]) and s[2][0] == s[2][1] == -1 and s[2][2] >= 1


def test_reused_real_runs_keep_their_curves_and_are_timed_on_this_machine():
    """A reused run keeps its curve; its seconds are T × this machine's step time now (the
    earlier run's may come from another machine); a run at another η is fine-tuned again."""
    from ntk_tt.sweep import _run
    from ntk_tt.sweep._grid import Task

    task = Task("flowers5", 2, 0)
    data = _run.load_task(task, SweepSpec(datasets=("flowers5",), per_class=(2,), seeds=(0,)))
    key, steps, b = _run._task_key(task), 6, 5
    cfgs = [Config(b, 0.0, "eta", 1e-3), Config(b, 0.9, "eta", 5e-3)]
    lrs, moms = np.array([1e-3, 5e-3], np.float32), np.array([0.0, 0.9], np.float32)
    fresh = _run._real_runs(data, task, key, cfgs, lrs, moms, b, steps, None)
    assert fresh[5] == ["fine-tuned"] * 2
    reuse = {row_id(task, c): (fresh[0][i], False, 0.0, float(lrs[i]), steps)
             for i, c in enumerate(cfgs)}
    reuse[row_id(task, cfgs[1])] = (fresh[0][1], False, 0.0, 2 * float(lrs[1]), steps)
    again = _run._real_runs(data, task, key, cfgs, lrs, moms, b, steps, reuse)
    assert again[5] == ["reused", "fine-tuned"]
    np.testing.assert_array_equal(again[0][0], fresh[0][0])
    np.testing.assert_allclose(again[0][1], fresh[0][1], rtol=1e-6)  # deterministic run
    per_step = again[3][0] / steps
    assert 0 < per_step and 0.1 < again[3][0] / fresh[3][0] < 10


# --- datasets given as .npz paths -------------------------------------------------------------


def _tiny_npz(path: pathlib.Path, classes: int = 5) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    np.savez(path, images=rng.integers(0, 256, (10 * classes, 8, 8, 3), dtype=np.uint8),
             labels=np.arange(10 * classes) % classes,
             class_names=np.array(list("abcde"[:classes])))
    return str(path)


def test_npz_paths_of_the_same_name_give_safe_distinct_ids(tmp_path):
    first = _tiny_npz(tmp_path / "a" / "my set.npz")
    second = _tiny_npz(tmp_path / "b" / "my set.npz")
    _, spec = experiment_script("sweep").parse(["--out", str(tmp_path / "out"), "--smoke",
                                                "--seeds", "0", "--datasets", first, second])
    tasks = spec.tasks()
    assert [t.dataset for t in tasks] == [first, second]
    ids = [t.id for t in tasks]
    assert len(set(ids)) == 2
    assert all(i.startswith("my_set-") and i.endswith("-k5-n4-s0") for i in ids)
    table = ResultsTable(tmp_path / "out")  # was: "row id ... must not contain '/'"
    for task in tasks:
        table.write_row({"row_id": row_id(task, spec.configs()[0]), "value": 1.0})
    assert len(table.done_ids()) == 2


def test_sweep_refuses_bad_dataset_paths_before_any_work(tmp_path, capsys, monkeypatch):
    module = experiment_script("sweep")
    monkeypatch.setattr(module, "run_sweep", lambda *a, **k: pytest.fail("work started"))
    good = _tiny_npz(tmp_path / "my_set.npz")
    (tmp_path / "broken.npz").write_bytes(b"not a zip archive")
    for datasets, message in [
        ([good, str(tmp_path / "missing.npz")], "dataset file not found"),
        ([str(tmp_path / "broken.npz")], "broken.npz"),
        ([good, str(tmp_path / "." / "my_set.npz")], "are the same dataset"),
        # a probe: the short name and the path of its vendored file ran as two data sets
        (["flowers5", str(pathlib.Path(ntk_tt.__file__).parent / "assets" / "data"
                          / "flowers5_32px_200pc.npz")], "are the same dataset"),
        ([_tiny_npz(tmp_path / "three.npz", classes=3)], "has 3 classes with at least 4"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            module.main(["--out", str(tmp_path / "out"), "--smoke", "--datasets", *datasets])
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == 2 and len(err) == 1, err  # one line, no usage block
        assert message in err[0] and ": error: " in err[0]


@pytest.mark.parametrize("channels", [4, 2])
def test_sweep_refuses_images_the_model_cannot_take_before_any_work(tmp_path, capsys,
                                                                    monkeypatch, channels):
    """RGBA (or 2-channel) images were refused only when their task was reached, after the
    earlier datasets' tasks had run, with prepare_images' ValueError as a traceback."""
    module = experiment_script("sweep")
    monkeypatch.setattr(module, "run_sweep", lambda *a, **k: pytest.fail("work started"))
    rng = np.random.default_rng(0)
    odd = tmp_path / "odd.npz"
    np.savez(odd, images=rng.integers(0, 256, (50, 32, 32, channels), dtype=np.uint8),
             labels=np.arange(50) % 5, class_names=np.array(list("abcde")))
    out = tmp_path / "out"
    line = refused(module, ["--out", str(out), "--smoke", "--datasets",
                            _tiny_npz(tmp_path / "good.npz"), str(odd)], capsys)
    assert line.split(": error: ", 1)[1] == (
        f"dataset '{odd}': images have shape (32, 32, {channels}) but the model expects "
        "(H, W, C) = (32, 32, 3); only grey (1-channel) images are converted, to 3 channels: "
        "use 3-channel data or a checkpoint made for these images.")
    assert not out.exists()  # no spec.json, no rows/


def test_a_table_consolidated_before_any_row_resumes_and_a_damaged_one_is_one_line(tmp_path):
    """consolidate() with no rows writes a parquet without columns: resuming there read its
    row_id column and raised pyarrow's ArrowInvalid; a damaged parquet is one ValueError."""
    ResultsTable(tmp_path / "empty").consolidate()
    table = ResultsTable(tmp_path / "empty")
    assert table.done_ids() == set()
    table.write_row({"row_id": "a", "value": 1.0})
    table.consolidate()
    assert list(read_table(tmp_path / "empty")["row_id"]) == ["a"]
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "results.parquet").write_bytes(b"")
    with pytest.raises(ValueError, match="is not a readable results table"):
        ResultsTable(tmp_path / "broken").done_ids()


# --- bad options: one error line, exit status 2, nothing written ------------------------------


@pytest.mark.parametrize("kwargs, message", [
    ({"kappas": (-1.0,)}, "SweepSpec.kappas (--kappas) must be finite numbers > 0"),
    ({"kappas": (4.0, 0.0)}, "SweepSpec.kappas (--kappas) must be finite numbers > 0"),
    ({"etas": (float("nan"),)}, "SweepSpec.etas (--etas) must be finite numbers > 0"),
    ({"edge_kappas": (float("inf"),)},
     "SweepSpec.edge_kappas (--edge-kappas) must be finite numbers > 0"),
    ({"batch_sizes": (None, 0)}, "SweepSpec.batch_sizes (--batch-sizes) must be integers >= 1"),
    ({"batch_sizes": (2.5,)}, "SweepSpec.batch_sizes (--batch-sizes) must be integers >= 1"),
    ({"edge_batch_sizes": (-3,)},
     "SweepSpec.edge_batch_sizes (--edge-batch-sizes) must be integers >= 1 or None"),
    ({"steps": 0}, "SweepSpec.steps (--steps) must be >= 1, got 0."),
    ({"momenta": (1.0,)}, "SweepSpec.momenta (--momenta) must lie in [0, 1) and at most "
                          "0.99999994 (float32's largest number below 1), got (1.0,)"),
    # a fresh user: m = 1 − 1e-10 passed (< 1), and is 1.0 in float32
    ({"edge_momenta": (1 - 1e-10,)}, "SweepSpec.edge_momenta (--edge-momenta) must lie in "
                                     "[0, 1) and at most 0.99999994"),
    ({"seeds": ()}, "SweepSpec.seeds (--seeds) is empty"),
    ({"kappas": (), "etas": ()}, "give kappas (--kappas) and/or etas (--etas)"),
    ({"per_class": (0,)}, "SweepSpec.per_class (--per-class) must be integers >= 1"),
])
def test_spec_rejects_non_positive_learning_rates_and_bad_batch_sizes(kwargs, message):
    """Negative κ̃ ran the whole sweep at negative learning rates (a fresh user's finding)."""
    with pytest.raises(ValueError, match=re.escape(message)):  # each names its flag
        SweepSpec(**{"datasets": ("a",), "per_class": (10,), "seeds": (0,)} | kwargs)
    SweepSpec(datasets=("a",), per_class=(10,), seeds=(0,), batch_sizes=(None, 1),
              etas=(1e-3,), edge_kappas=(48.0,))  # the edges of what is allowed


@pytest.mark.parametrize("extra, message", [
    (["--kappas", "-1"], "SweepSpec.kappas (--kappas) must be finite numbers > 0"),
    (["--etas", "0"], "SweepSpec.etas (--etas) must be finite numbers > 0"),
    (["--batch-sizes", "N", "0"], "SweepSpec.batch_sizes (--batch-sizes) must be integers >= 1"),
    (["--momenta", "1.5"], "SweepSpec.momenta (--momenta) must lie in [0, 1)"),
    (["--steps", "0"], "SweepSpec.steps (--steps) must be >= 1"),
    (["--reuse-real", "nowhere"], "--reuse-real 'nowhere' holds no results.parquet"),
    (["--reuse-predictions", "nowhere"],
     "--reuse-predictions 'nowhere' holds no results.parquet"),
    # a second fresh user: each was a traceback after spec.json and rows/ were written, or
    # (--primary) after the whole sweep had run
    (["--sketch-dims", "0"], "SweepSpec.sketch_dims (--sketch-dims) must be integers >= 1"),
    (["--checkpoint", "nowhere"], "checkpoint not found: 'nowhere'"),
    (["--primary", "foo", "bar"], "--primary 'foo' is not a variant this sweep records"),
    (["--report"], "--report rebuilds an existing sweep's summary"),
    # a fresh user: grid flags beside --report were ignored (--kappas 1 reported every κ̃)
    (["--report", "--kappas", "1"], "--kappas set the grid to run; --report only rebuilds "
                                    "the summary of the rows already there: drop it."),
    (["--report", "--steps", "9", "--reuse-real", "x"], "--steps and --reuse-real set the grid"),
    # a third fresh user: a repeated value ran the kernel and some rows, then a traceback
    # ("row ... is already in rows/"); a batch size >= every N wrote an empty sweep
    (["--kappas", "4", "4"], "SweepSpec.kappas (--kappas) must be distinct to 6 significant "
                             "digits (they name the rows), got (4.0, 4.0): 4.0 is given twice"),
    (["--kappas", "4", "4.0000001"], "4.0 and 4.0000001 both give '4'"),
    (["--etas", "0.01", "0.01"], "SweepSpec.etas (--etas) must be distinct"),
    (["--momenta", "0", "0"], "SweepSpec.momenta (--momenta) must be distinct"),
    (["--batch-sizes", "N", "gd"], "SweepSpec.batch_sizes (--batch-sizes) must be distinct "
                                   "(they name the rows), got (None, None): N is given twice"),
    (["--batch-sizes", "10", "10"], "SweepSpec.batch_sizes (--batch-sizes) must be distinct"),
    (["--per-class", "4", "4"], "SweepSpec.per_class (--per-class) must be distinct"),
    (["--seeds", "0", "0"], "SweepSpec.seeds (--seeds) must be distinct"),
    (["--edge-kappas", "8", "8"], "SweepSpec.edge_kappas (--edge-kappas) must be distinct"),
    (["--batch-sizes", "10000"], "SweepSpec.batch_sizes (--batch-sizes) B = 10000 is not "
                                 "below N = 20 (classes × per_class = 5 × 4, the largest task)"),
    (["--batch-sizes", "N", "20"], "B = 20 is not below N = 20"),
    (["--edge-kappas", "8", "--edge-batch-sizes", "30"],
     "SweepSpec.edge_batch_sizes (--edge-batch-sizes) B = 30 is not below N = 20"),
    # these three ran: the smoke grid, seed -1, edge options that no row used
    (["--preset", "full"], "--smoke is --preset smoke; it cannot be combined with --preset "
                           "full (give one of them)"),
    (["--seeds", "-1"], "SweepSpec.seeds (--seeds) must be integers in [0, 2**32)"),
    (["--seeds", str(2**32)], "SweepSpec.seeds (--seeds) must be integers in [0, 2**32)"),
    (["--edge-momenta", "0.9"], "--edge-momenta set the edge rows' grid, but this grid has no "
                                "edge rows: add --edge-kappas"),
    (["--edge-momenta", "0.9", "--edge-batch-sizes", "10"],
     "--edge-momenta and --edge-batch-sizes set the edge rows' grid"),
    # a fresh user: "invalid _batch value: 'abc'" (a private function's name) under the usage
    # block; and a negative number in e-notation was taken for a flag ("expected at least one
    # argument") instead of reaching the grid's check, which -0.001 reached
    (["--batch-sizes", "abc"], "error: argument --batch-sizes: 'abc' is not a batch "
                               "size: give N (full-batch GD) or an integer >= 1, e.g. N 10"),
    (["--edge-kappas", "8", "--edge-batch-sizes", "N", "x"],
     "argument --edge-batch-sizes: 'x' is not a batch size: give N (full-batch GD) or"),
    (["--steps", "x"], "argument --steps: invalid int value: 'x'"),
    (["--kappas", "1", "-1e-3"], "SweepSpec.kappas (--kappas) must be finite numbers > 0 (κ̃ "
                                 "values, or "
                                 "η for etas) in [1.1754944e-38, 3.4028235e+38] (float32's normal "
                                 "range), got (1.0, -0.001)"),
    # a fresh user: --kappas 3.5e38 (inf in float32) started a sweep; 1e-50 is 0 there
    (["--kappas", "3.5e38"], "SweepSpec.kappas (--kappas) must be finite numbers > 0"),
    (["--etas", "1e-50"], "SweepSpec.etas (--etas) must be finite numbers > 0"),
    (["--etas", "-1E-3"], "SweepSpec.etas (--etas) must be finite numbers > 0"),
    (["--edge-kappas", "-2.5e1"], "SweepSpec.edge_kappas (--edge-kappas) must be finite"),
    (["--momenta", "-1e-2"], "(--momenta) must lie in [0, 1) and at most 0.99999994 (float32's "
                             "largest number below 1), got (-0.01,)"),
    (["--edge-kappas", "8", "--edge-momenta", "-1e-1"],
     "(--edge-momenta) must lie in [0, 1) and at most 0.99999994"),
    # a fresh user: --ste 6 was read as --steps 6 (ntk-tt refuses abbreviations)
    (["--ste", "6"], "error: unrecognized arguments: --ste 6"),
    # and a one-value flag given twice kept its last value (ntk-tt's parser refuses it now)
    (["--steps", "5", "--steps", "6"], "error: --steps is given twice (5 and 6): give it once."),
])
def test_sweep_script_refuses_bad_grids_in_one_line_before_anything(tmp_path, capsys,
                                                                    monkeypatch, extra,
                                                                    message):
    """Were tracebacks (exit 1), or (--kappas -1) a whole sweep at negative η, exit 0."""
    module = experiment_script("sweep")
    monkeypatch.setattr(module, "run_sweep", lambda *a, **k: pytest.fail("work started"))
    monkeypatch.chdir(tmp_path)  # a relative --reuse-real stays inside tmp_path
    out = tmp_path / "out"
    assert message in refused(module, ["--out", str(out), "--smoke", *extra], capsys)
    assert not out.exists()


def test_etas_alone_replace_the_presets_kappas_and_beside_kappas_add_to_them(tmp_path):
    """A fresh user's --etas 0.01 also ran the preset's κ̃ rows (with --kappas 4 both are
    asked for: the grid is their union)."""
    module = experiment_script("sweep")
    out = ["--out", str(tmp_path / "out"), "--smoke"]
    spec = module.parse([*out, "--etas", "0.01"])[1]
    assert spec.kappas == () and spec.etas == (0.01,)
    spec = module.parse([*out, "--etas", "0.01", "--kappas", "2"])[1]
    assert spec.kappas == (2.0,) and spec.etas == (0.01,)
    assert module.parse(out)[1].kappas == (4.0,) and module.parse(out)[1].etas == ()


@pytest.mark.parametrize("script", ["optimizer_sweep", "telemetry_corpus"])
def test_the_other_scripts_refuse_abbreviations_and_bad_choices_in_one_line(script, capsys,
                                                                             monkeypatch):
    """A fresh user: --pres smoke was read as --preset smoke, and --preset smok printed the
    whole usage block; both are one error line now, as sweep.py's (ScriptParser)."""
    module = experiment_script(script)
    for name in ("_run", "run_corpus"):
        if hasattr(module, name):
            monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("work started"))
    assert refused(module, ["--out", "o", "--pres", "smoke"], capsys).endswith(
        "error: unrecognized arguments: --pres smoke")
    assert "error: argument --preset: invalid choice: 'smok'" in refused(
        module, ["--out", "o", "--preset", "smok"], capsys)


@pytest.mark.skipif(not pathlib.Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize("script", ["sweep", "optimizer_sweep", "telemetry_corpus"])
def test_sweep_scripts_refuse_an_out_they_cannot_create(script, capsys, monkeypatch):
    """A fresh user: --out in a folder that takes no new entry (/proc here; a read-only one
    alike) was a PermissionError / FileNotFoundError traceback from ResultsTable's mkdir
    (exit 1) after the imports; now the scripts' one error line (exit 2), before any work."""
    module = experiment_script(script)
    for name in ("run_sweep", "_run", "run_corpus"):
        if hasattr(module, name):
            monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("work started"))
    out = "/proc/ntk_tt_sweep_out"
    preset = ["--smoke"] if script == "sweep" else ["--preset", "smoke"]
    line = refused(module, ["--out", out, *preset], capsys)
    assert f"cannot create files in --out '{out}' (in /proc)" in line
    assert not pathlib.Path(out).exists()


def test_sweep_script_refuses_an_out_that_is_a_file_or_another_grid(tmp_path, capsys,
                                                                     monkeypatch):
    """--out an existing file was a NotADirectoryError traceback (run and --report); resuming
    into a directory of another grid was run_sweep's ValueError as a traceback, after rows/
    was created."""
    module = experiment_script("sweep")
    monkeypatch.setattr(module, "run_sweep", lambda *a, **k: pytest.fail("work started"))
    monkeypatch.setattr(module, "report", lambda *a, **k: pytest.fail("report started"))
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    for out, mode in [(afile, []), (afile, ["--report"]), (afile / "sub", [])]:
        line = refused(module, ["--out", str(out), "--smoke", *mode], capsys)
        assert f"'{out}' " in line and "not a directory" in line
    assert afile.read_text() == "keep me"
    monkeypatch.chdir(tmp_path)  # a fresh user: --out '' ran the sweep into the current folder
    for mode in ([], ["--report"]):
        assert "--out is empty ('')" in refused(module, ["--out", "", "--smoke", *mode], capsys)
    with pytest.raises(ValueError, match=r"--out is empty \(' '\)"):
        ResultsTable(" ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
    other = tmp_path / "other"
    other.mkdir()
    _, smoke = module.parse(["--out", str(other), "--smoke"])
    recorded = json.dumps(spec_to_dict(dataclasses.replace(smoke, steps=5)))
    (other / "spec.json").write_text(recorded)
    line = refused(module, ["--out", str(other), "--smoke"], capsys)
    assert "holds a sweep with a different grid" in line and "choose a new --out" in line
    # the fields that differ, with their flags and values (a fresh user had to guess them)
    assert f"spec.json: SweepSpec.steps (--steps) stored 5, now {smoke.steps}); " in line
    assert sorted(p.name for p in other.iterdir()) == ["spec.json"]  # no rows/ made
    assert (other / "spec.json").read_text() == recorded
    from ntk_tt.sweep._run import run_sweep

    with pytest.raises(ValueError, match="different grid"):  # the API refuses it too
        run_sweep(smoke, other)
    assert sorted(p.name for p in other.iterdir()) == ["spec.json"]
    # a damaged row file is refused before any work (it counted as present and the resume
    # failed only after every other row's kernels, predictions and fine-tunes: a fresh user)
    (other / "spec.json").write_text(json.dumps(spec_to_dict(smoke)))
    (other / "rows").mkdir()
    (other / "rows" / "r.json").write_text('{"bad json')
    line = refused(module, ["--out", str(other), "--smoke"], capsys)
    assert f": error: row file {other / 'rows' / 'r.json'} is damaged (" in line
    with pytest.raises(ValueError, match="is damaged .*delete it and run the same command"):
        run_sweep(smoke, other)
    for text in ("[]", "null", "{}"):  # JSON, but no row (a second probe: raw KeyError later)
        (other / "rows" / "r.json").write_text(text)
        with pytest.raises(ValueError, match=r"is damaged \(not a row: a JSON object with a "
                                             r"row_id\)"):
            run_sweep(smoke, other)
    (other / "rows" / "r.json").unlink()
    # the same rows in another order are the same grid (a second probe: --momenta 0.9 0 against
    # a stored 0 0.9 was refused)
    from ntk_tt.sweep._run import check_resume

    reordered = dataclasses.replace(smoke, momenta=smoke.momenta[::-1],
                                    batch_sizes=smoke.batch_sizes[::-1],
                                    kappas=smoke.kappas[::-1])
    assert reordered != smoke and len(smoke.momenta) > 1 and len(smoke.batch_sizes) > 1
    check_resume(reordered, other)  # stored: smoke's order
    (other / "spec.json").write_text(json.dumps(spec_to_dict(dataclasses.replace(
        smoke, noise_dim=smoke.noise_dim + 1))))
    with pytest.raises(ValueError, match=r"SweepSpec\.noise_dim stored \d+, now \d+; a field "
                                         r"without a flag comes from --preset \(--smoke\)\)"):
        run_sweep(smoke, other)


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_row_files_get_the_permissions_of_a_plain_open(tmp_path, umask):
    """Rows were written through tempfile.mkstemp, mode 0600 whatever the umask (other outputs
    are 0644 under the usual umask 022)."""
    old = os.umask(umask)
    try:
        table = ResultsTable(tmp_path)
        table.write_row({"row_id": "a", "value": 1.0})
        plain = tmp_path / "plain.json"
        plain.write_text("{}")
    finally:
        os.umask(old)
    mode = (table.rows_dir / "a.json").stat().st_mode & 0o777
    assert mode == plain.stat().st_mode & 0o777 == 0o666 & ~umask
    assert [p.name for p in table.rows_dir.iterdir()] == ["a.json"]  # no temporary left
