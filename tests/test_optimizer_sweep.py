"""The optimiser benchmark (issue 27 item 5, ``ntk_tt.sweep._optimizers``): a row against
independent ``predict``/``finetune`` calls, resumption, the κ̃ → η map, and the summary
against a hand computation."""

import dataclasses
import json
import os
import signal

import jax
import numpy as np
import optax
import pandas as pd
import pytest
from _scripts import experiment_script, refused

import ntk_tt
from ntk_tt.sweep._grid import SweepSpec, Task
from ntk_tt.sweep._load import _task_key, load_task
from ntk_tt.sweep._optimizers import (
    OptimConfig,
    OptimSpec,
    RealRun,
    _reused,
    reusable_real,
    row_id,
    run_task,
)
from ntk_tt.sweep._optimizers_summary import summarize_optimizers
from ntk_tt.sweep._table import ResultsTable, read_table

SPEC = OptimSpec(datasets=("flowers5",), per_class=(2,), batch_sizes=(None,), steps=8,
                 sgd_kappas=(), adam_peaks=(1e-3,), adam_decays=(0.1,), num_paths=1)
TASK = Task("flowers5", 2, 0)  # N = 10 (K = 5): the row took 15–19 s of CPU, 24 s at N = 30


@pytest.fixture(scope="module")
def loss0():
    """The task's initial mean cross-entropy, computed here from its model and images."""
    data = load_task(TASK, SweepSpec(datasets=("flowers5",), per_class=(2,), seeds=(0,)))
    return float(optax.softmax_cross_entropy_with_integer_labels(
        jax.jit(data.apply_fn)(data.params, data.x), data.y).mean())


def test_row_starts_at_the_real_initial_loss_and_resumes(tmp_path, loss0):
    """One AdamW row of the vendored task: both curves start at the model's initial
    cross-entropy computed here; T_ε columns are ``ntk_tt.training_time`` of the stored
    curves; a second call writes nothing. (That a prediction with ``head_kernel=`` equals
    the one building its own kernels is tested in ``tests/test_optimizer_api.py``; a full
    independent predict + finetune of the ResNet here cost ~50 s of the suite.)"""
    table = ResultsTable(tmp_path)
    assert run_task(TASK, SPEC, table) == 1
    assert run_task(TASK, SPEC, table) == 0  # resumed: nothing twice
    table.consolidate()
    row = read_table(tmp_path).iloc[0]
    assert row["row_id"] == row_id(TASK, OptimConfig("adamw_cosine", 1e-3, 0.1, None))
    np.testing.assert_allclose([row["pred_loss"][0], row["real_loss"][0]], loss0, rtol=1e-5)
    assert len(row["pred_loss"]) == len(row["real_loss"]) == 9
    assert row["real_loss"][-1] < row["real_loss"][0]  # it trained
    for eps in (0.1, 0.4):
        for side in ("pred", "real"):
            assert row[f"{side}_T{eps:g}"] == ntk_tt.training_time(row[f"{side}_loss"], eps)
    assert row["peak_learning_rate"] == pytest.approx(1e-3)


def test_reuse_real_takes_the_earlier_run_and_recomputes_the_prediction(tmp_path, monkeypatch,
                                                                        loss0):
    """--reuse-real: an earlier row of the same id and training supplies the real curves (its
    stored prediction is ignored: the new one starts at the model's initial loss);
    ``ntk_tt.finetune`` is never called, and the fine-tune seconds are ``ntk_tt.step_time``
    (of this row's optimiser, batch size and key) × T measured now, the earlier 123 s kept
    beside them. A row of another T, peak η or λ is not reused."""
    cfg = OptimConfig("adamw_cosine", 1e-3, 0.1, None)
    real = np.linspace(2.0, 0.2, 9)
    source = ResultsTable(tmp_path / "old")
    source.write_row({"row_id": row_id(TASK, cfg), "family": cfg.family, "steps": 8,
                      "peak_learning_rate": 1e-3,
                      "weight_decay": 0.1, "real_loss": real, "real_error": real / 4,
                      "real_diverged": False, "seconds_finetune": 123.0,
                      "pred_loss": np.full(9, 99.0)})
    reuse = reusable_real(tmp_path / "old")

    def no_finetune(*args, **kwargs):
        raise AssertionError("finetune called although the real run is reused")

    timed = []

    def step_time(apply_fn, params, x, y, *, optimizer, key):
        timed.append((optimizer.batch_size, key))
        return 0.25

    monkeypatch.setattr(ntk_tt, "finetune", no_finetune)
    monkeypatch.setattr(ntk_tt, "step_time", step_time)
    table = ResultsTable(tmp_path / "new")
    assert run_task(TASK, SPEC, table, reuse=reuse) == 1
    table.consolidate()
    row = read_table(tmp_path / "new").iloc[0]
    np.testing.assert_array_equal(row["real_loss"], real)
    np.testing.assert_array_equal(row["real_error"], real / 4)
    assert row["seconds_finetune"] == 0.25 * 8 and row["seconds_finetune_recorded"] == 123.0
    assert row["real_source"] == "reused" and row["finetune_timing"] == "retimed"
    assert len(timed) == 1 and timed[0][0] is None and timed[0][1] is not None
    for eps in (0.1, 0.4):
        assert row[f"real_T{eps:g}"] == ntk_tt.training_time(real, eps)
    assert row["pred_loss"][0] == pytest.approx(loss0, rel=1e-5)
    assert row["pred_loss"][-1] < loss0
    opt = SPEC.optimizer(cfg, 1.0, TASK.num_train)
    old = reuse[row_id(TASK, cfg)]
    assert _reused(old, opt, SPEC) is not None
    for change in ({"steps": 9}, {"peak_learning_rate": 2e-3}, {"weight_decay": 0.01}):
        assert _reused(old | change, opt, SPEC) is None
    with pytest.raises(ValueError, match="no rows/\\*.json and no results.parquet"):
        reusable_real(tmp_path / "empty")


@pytest.mark.parametrize("family,backbone", [("sgdm_cosine", "subspace"),
                                             ("sgdm_cosine", "diagonal"),
                                             ("adamw_cosine", "diagonal")])
def test_subspace_backbone_predicts_as_predict_does(tmp_path, monkeypatch, family, backbone):
    """backbone="subspace" (or "diagonal", for AdamW too since session 35): the row's
    prediction is ``ntk_tt.predict(..., backbone=...)`` of the same optimiser (η from the
    isotropic kernel's stored λ_max, so the real run is the default benchmark's), labelled
    so. (The real run is stubbed.)"""
    spec = dataclasses.replace(SPEC, families=(family,), sgd_kappas=(4.0,), sgd_decays=(5e-4,),
                               adam_peaks=(1e-3,), adam_decays=(0.01,), backbone=backbone)
    cfg = (OptimConfig("sgdm_cosine", 4.0, 5e-4, None) if family == "sgdm_cosine"
           else OptimConfig("adamw_cosine", 1e-3, 0.01, None))
    real = np.linspace(2.0, 0.2, 9)
    monkeypatch.setattr(ntk_tt, "finetune", lambda *a, **k: RealRun(
        real, real / 4, False, {"finetune": 1.0}))
    table = ResultsTable(tmp_path)
    assert run_task(TASK, spec, table) == 1
    table.consolidate()
    row = read_table(tmp_path).iloc[0]
    data = load_task(TASK, SweepSpec(datasets=("flowers5",), per_class=(2,), seeds=(0,)))
    opt = spec.optimizer(cfg, row["lambda_max"], TASK.num_train)
    want = ntk_tt.predict(data.apply_fn, data.params, data.x, data.y, optimizer=opt, steps=8,
                          head=data.split, backbone=backbone, key=_task_key(TASK))
    label = "head_aware" if family == "sgdm_cosine" else "head_aware_adam"
    assert row["row_id"] == row_id(TASK, cfg) and row["pred_kernel"] == f"{label}:{backbone}"
    np.testing.assert_allclose(row["pred_loss"], want.loss, rtol=1e-5)
    iso = ntk_tt.predict(data.apply_fn, data.params, data.x, data.y, optimizer=opt, steps=8,
                         head=data.split, key=_task_key(TASK), backbone="isotropic")
    assert np.max(np.abs(iso.loss - want.loss)) > 1e-4  # another kernel, another curve


def test_sgd_peak_from_effective_kappa_and_skipped_batch_sizes():
    spec = OptimSpec(datasets=("a",), per_class=(10, 50), batch_sizes=(None, 50))
    opt = spec.optimizer(OptimConfig("sgdm_cosine", 4.0, 5e-4, 50), lam_max=200.0, n=250)
    peak = float(np.max(np.asarray(opt.learning_rates(150))))
    assert peak * 200.0 / (250 * (1 - 0.9)) == pytest.approx(4.0)  # κ̃ = η·λ/(N(1 − m))
    assert float(opt.weight_decay) == pytest.approx(5e-4) and opt.batch_size == 50
    sizes = {t.per_class: {c.batch_size for c in spec.configs(t)} for t in spec.tasks()}
    assert sizes == {10: {None}, 50: {None, 50}}  # B = 50 is N at n = 10 (K = 5): GD only
    assert len(spec.configs(Task("a", 10, 0))) == 12  # 2 families × 3 peaks × 2 λ, GD only
    adam_first = dataclasses.replace(spec, families=("adamw_cosine", "sgdm_cosine"))
    rows = adam_first.configs(Task("a", 50, 0))
    assert [c.family for c in rows] == ["adamw_cosine"] * 12 + ["sgdm_cosine"] * 12
    assert set(rows) == set(spec.configs(Task("a", 50, 0)))  # the same rows, reordered
    only = dataclasses.replace(spec, families=("adamw_cosine",)).configs(Task("a", 50, 0))
    assert only == rows[:12]


def _frame(real, pred, family, opt, task):
    k = len(real)
    return pd.DataFrame({
        "row_id": [f"{task}-{family}-{opt}-{i}" for i in range(k)], "task_id": task,
        "config_id": [f"c{i}" for i in range(k)], "per_class": 10, "steps": 100,
        "family": family, "optimizer": opt, "pred_method": "discrete",
        "real_T0.1": real, "pred_T0.1": pred, "real_T0.4": real, "pred_T0.4": pred,
        "real_diverged": False, "pred_diverged": False,
        "real_loss": [np.linspace(2, 0.5, 11)] * k, "pred_loss": [np.linspace(2, 0.5, 11)] * k,
        "real_error": [np.linspace(0.8, 0.0, 11)] * k,
        "pred_error": [np.linspace(0.8, 0.0, 11)] * k,
        "seconds_predict": 1.0, "seconds_finetune": 30.0, "task_seconds_kernel": 4.0,
    })


def test_summary_against_a_hand_computation():
    """sgdm rows err by 10 % and 30 %, adamw by 0 and 50 %; the constant sweep's rows of the
    same task by 20 % (another task's rows are ignored); cost per task = 4 × 30 / (4 + 4)."""
    frame = pd.concat([_frame([10.0, 10.0], [11.0, 13.0], "sgdm_cosine", "gd", "t0"),
                       _frame([20.0, 20.0], [20.0, 30.0], "adamw_cosine", "gd", "t0")],
                      ignore_index=True).assign(
        real_source=["reused", "reused", "fine-tuned", None],  # None: a row from before
        finetune_timing=["retimed", "recorded", "run", None],
        peak_setting=[4.0, 4.0, 1e-4, 1e-3])
    constant = pd.concat([_frame([10.0], [12.0], "constant", "gd", "t0"),
                          _frame([10.0], [30.0], "constant", "gd", "t0"),  # an edge row
                          _frame([10.0], [50.0], "constant", "gd", "other")],
                         ignore_index=True).assign(kappa_eff=[4.0, 48.0, 4.0])
    s = summarize_optimizers(frame, constant)
    sgdm = s["families"]["sgdm_cosine"]["t_eps_pooled_0.1_0.4"]["gd"]
    assert sgdm["n"] == 4 and sgdm["p95"] == pytest.approx(np.percentile([.1, .1, .3, .3], 95))
    adam = s["families"]["adamw_cosine"]["t_eps_pooled_0.1_0.4"]["gd"]
    assert adam["p95"] == pytest.approx(np.percentile([0, 0, .5, .5], 95))
    # per peak: AdamW's 1e-4 row is exact, its 1e-3 row 50 % late; no "all" (κ̃ and η mixed)
    by_peak = s["families"]["adamw_cosine"]["t_eps_pooled_by_peak"]
    assert (by_peak["0.0001"]["gd"]["p95"], by_peak["0.001"]["gd"]["p95"]) == (0.0, 0.5)
    assert s["families"]["sgdm_cosine"]["t_eps_pooled_by_peak"]["4"]["gd"]["p95"] == \
        pytest.approx(sgdm["p95"])
    assert "t_eps_pooled_by_peak" not in s["families"]["all"]
    assert s["constant_same_tasks"]["rows"] == 1
    assert s["sgdm_minus_constant_p95_points"]["gd"] == pytest.approx(100 * (sgdm["p95"] - .2))
    assert s["cost"]["per_task_median_ratio"] == pytest.approx(4 * 30 / (4 + 4))
    assert "per_task_median_ratio_compile_excluded" not in s["cost"]  # no warm kernel times
    warm = summarize_optimizers(frame.assign(task_seconds_kernel_warm=[1.0, 1.0, 2.0, 2.0]),
                                constant)
    assert warm["cost"]["per_task_median_ratio_compile_excluded"] == pytest.approx(
        4 * 30 / (2 + 4))  # the task's kernels: the largest running total, 2 s
    assert warm["cost"]["per_task_median_ratio"] == s["cost"]["per_task_median_ratio"]
    assert s["real_source"] == {"reused": 2, "fine-tuned": 2}
    assert s["finetune_timing"] == {"retimed": 1, "recorded": 1, "run": 2}
    # identical predicted and real curves: every absolute target reached at the same step
    loss = s["families"]["all"]["absolute_targets"]["gd"]["loss"]
    assert loss["reach_agreement"] == 1.0 and loss["p95"] == 0.0


def test_report_of_an_empty_directory_is_one_line_and_writes_nothing(tmp_path, capsys):
    """``--report`` where no benchmark ran (a fresh user's finding: a pandas KeyError and an
    empty results.parquet left behind)."""
    module = experiment_script("optimizer_sweep")
    out = tmp_path / "none"
    with pytest.raises(SystemExit) as ended:
        module.main(["--out", str(out), "--report"])
    assert not out.exists()
    assert ended.value.code == 2  # bad input: exit 2 (a second fresh user: it was 1)
    assert capsys.readouterr().err == (
        f"optimizer_sweep.py: error: {out} holds no rows to report: run the benchmark there "
        "first (the same command without --report).\n")



@pytest.mark.parametrize("kwargs, message", [
    ({"sgd_kappas": (-1.0,)}, "OptimSpec.sgd_kappas must be finite numbers > 0"),
    ({"adam_peaks": (1e-3, float("inf"))}, "OptimSpec.adam_peaks must be finite numbers > 0"),
    ({"adam_peaks": (0.0,)}, r"OptimSpec.adam_peaks must be finite numbers > 0 \(peak learning "
                             r"rates\)"),  # a fresh user was told "(κ̃ values, or η for etas)"
    ({"sgd_decays": (-5e-4,)}, "OptimSpec.sgd_decays must be finite weight decays >= 0"),
    ({"adam_decays": (float("nan"),)}, "OptimSpec.adam_decays must be finite weight decays"),
    ({"batch_sizes": (None, 0)}, "OptimSpec.batch_sizes must be integers >= 1 or None"),
    ({"per_class": (1,)}, "OptimSpec.per_class must be integers >= 2"),
    ({"steps": 0}, "OptimSpec.steps must be >= 1"),
    ({"sgd_momentum": 1.0}, "OptimSpec.sgd_momentum must lie in"),
    ({"warmup_fraction": 1.5}, "OptimSpec.warmup_fraction must lie in"),
    ({"families": ("adam",)}, "OptimSpec.families must be among"),
    ({"families": ()}, "OptimSpec.families is empty"),
    ({"sgd_kappas": (4.0, 4.0)}, "OptimSpec.sgd_kappas must be distinct"),
    # a fresh user: --per-class 4 4 ran (spec.json kept [4, 4]); sweep.py refused it
    ({"per_class": (4, 4)}, "OptimSpec.per_class must be distinct.*4 is given twice"),
    ({"backbone": "exact"}, "OptimSpec.backbone must be one of"),
])
def test_spec_rejects_bad_grids(kwargs, message):
    """OptimSpec checked nothing: negative peaks or decays ran as given."""
    with pytest.raises(ValueError, match=message):
        OptimSpec(**{"datasets": ("a",), "per_class": (10,)} | kwargs)


def test_bad_datasets_are_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    """--datasets nonexist wrote spec.json and rows/ and then died with a traceback; the
    corrected command in the same --out was then refused as another grid."""
    module = experiment_script("optimizer_sweep")
    monkeypatch.setattr(module, "run_task", lambda *a, **k: pytest.fail("work started"))
    rng = np.random.default_rng(0)
    three = tmp_path / "three.npz"  # 3 classes: a task needs 5
    np.savez(three, images=rng.integers(0, 256, (30, 8, 8, 3), dtype=np.uint8),
             labels=np.arange(30) % 3, class_names=np.array(list("abc")))
    out = tmp_path / "out"
    for datasets, message in [(["nonexist"], "unknown dataset 'nonexist'"),
                              ([str(three)], "has 3 classes with at least 6 images"),
                              (["flowers5", "flowers5"], "are the same dataset")]:
        line = refused(module, ["--out", str(out), "--preset", "smoke", "--datasets",
                                 *datasets], capsys)
        assert message in line
        assert not out.exists()
    # --families sgdm_cosine sgdm_cosine ran one family silently (sweep.py refuses a repeat)
    line = refused(module, ["--out", str(out), "--preset", "smoke", "--families", "sgdm_cosine",
                            "sgdm_cosine"], capsys)
    assert "--families names sgdm_cosine twice; give each once." in line
    assert not out.exists()


def test_an_out_that_is_a_file_or_another_grid_is_one_line(tmp_path, capsys, monkeypatch):
    """--out an existing file was a NotADirectoryError traceback; another grid's directory
    exited with status 1 after creating rows/ there."""
    module = experiment_script("optimizer_sweep")
    monkeypatch.setattr(module, "run_task", lambda *a, **k: pytest.fail("work started"))
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    for mode in ([], ["--report"]):
        line = refused(module, ["--out", str(afile), "--preset", "smoke", *mode], capsys)
        assert f"'{afile}' is not a directory" in line
    assert afile.read_text() == "keep me"
    other = tmp_path / "other"
    other.mkdir()
    _, smoke = module.parse(["--out", str(other), "--preset", "smoke"])
    recorded = json.dumps(dataclasses.asdict(dataclasses.replace(smoke, steps=5)))
    (other / "spec.json").write_text(recorded)
    line = refused(module, ["--out", str(other), "--preset", "smoke"], capsys)
    assert f"{other} holds another grid" in line and "choose a new --out" in line
    assert sorted(p.name for p in other.iterdir()) == ["spec.json"]  # no rows/ made
    assert (other / "spec.json").read_text() == recorded


def test_adam_grid_flags_set_the_grid_and_bad_values_are_one_line(tmp_path, capsys,
                                                                    monkeypatch):
    """--adam-peaks / --adam-decays replace the preset's AdamW grid (the intermediate-peak
    table of README); values OptimSpec refuses are one error line before anything is
    written."""
    module = experiment_script("optimizer_sweep")
    monkeypatch.setattr(module, "run_task", lambda *a, **k: pytest.fail("work started"))
    out = tmp_path / "out"
    _, spec = module.parse(["--out", str(out), "--preset", "smoke", "--adam-peaks", "1.5e-4",
                            "2e-4", "--adam-decays", "0.01"])
    assert spec.adam_peaks == (1.5e-4, 2e-4) and spec.adam_decays == (0.01,)
    for args, message in [
            (["--adam-peaks", "0"], "adam_peaks must be finite"),
            (["--adam-decays", "nan"], "adam_decays must be finite"),
            # a negative number in e-notation is a value, not a flag missing its argument
            (["--adam-peaks", "-1e-3"], "adam_peaks must be finite"),
            (["--adam-decays", "-1e-2"], "adam_decays must be finite"),
            # a fresh user: 1e-3 and 1.0000001e-3 name the same rows: a traceback after the work
            (["--adam-peaks", "1e-3", "1.0000001e-3"], "adam_peaks must be distinct"),
            (["--adam-peaks", "1e-3", "--report"], "--report only reports"),
            (["--adam-decays", "0.1", "--families", "sgdm_cosine"], "does not run")]:
        line = refused(module, ["--out", str(out), "--preset", "smoke", *args], capsys)
        assert message in line
    assert not out.exists()


def test_report_of_a_constant_eta_sweep_is_one_line_and_writes_nothing(tmp_path, capsys):
    """A fresh user's ``--report`` on a constant-η sweep's rows: results.parquet written, then
    a pandas KeyError 'family' traceback (exit 1). Now one line, exit 2, nothing written."""
    module = experiment_script("optimizer_sweep")
    out = tmp_path / "constant"
    ResultsTable(out).write_row({"row_id": "a", "optimizer": "gd", "momentum": 0.0})
    with pytest.raises(SystemExit) as ended:
        module.main(["--out", str(out), "--report"])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds rows without a 'family': a constant-η sweep's" in err
    assert sorted(p.name for p in out.iterdir()) == ["rows"]


def test_a_damaged_row_file_is_one_line_naming_it(tmp_path, capsys):
    """A row file cut short from outside (rows are written atomically) made --report and the
    resume end in a JSONDecodeError traceback; now one error line names the file and says
    how to redo that row (delete it), exit status 2."""
    module = experiment_script("optimizer_sweep")
    out = tmp_path / "out"
    table = ResultsTable(out)
    table.write_row({"row_id": "a", "x": 1})
    path = next((out / "rows").glob("*.json"))
    path.write_text(path.read_text()[:5])
    with pytest.raises(ValueError, match=f"row file {path} is damaged .*delete it"):
        table.load_rows()
    with pytest.raises(SystemExit) as ended:
        module.main(["--out", str(out), "--report"])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    # found by parse now, before any work: the parser's prog (the script's name as run)
    assert err.split(": error: ", 1)[1].startswith(f"row file {path} is damaged")
    assert err.count("\n") == 1


def test_an_interrupted_benchmark_is_one_line_and_keeps_its_rows(tmp_path, capsys,
                                                                monkeypatch):
    """Ctrl-C printed a 19-frame KeyboardInterrupt traceback; now one line says how many
    finished rows are kept and that the same command resumes, exit status 130."""
    module = experiment_script("optimizer_sweep")
    out = tmp_path / "out"

    def interrupted(task, spec, table, **_):
        table.write_row({"row_id": "done", "x": 1})
        raise KeyboardInterrupt

    def exited(code):
        raise SystemExit(code)

    monkeypatch.setattr(module, "run_task", interrupted)
    monkeypatch.setattr(os, "_exit", exited)  # ntk_tt.cli.exit_once ends the process
    with pytest.raises(SystemExit) as ended:
        module.main(["--out", str(out), "--preset", "smoke"])
    assert ended.value.code == 130
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"optimizer_sweep.py: interrupted; 1 finished row(s) kept in {out / 'rows'}: "
                   "run the same command to resume")
    # SIGTERM (a batch scheduler's; a fresh user saw the run die with no line): the guard of
    # ntk-tt records the signal and the same exit says "terminated (SIGTERM)", status 143
    with pytest.raises(SystemExit) as ended:
        module._exit_stopped({"out": out, "signal": signal.SIGTERM})
    assert ended.value.code == 143
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"optimizer_sweep.py: terminated (SIGTERM); 1 finished row(s) kept in {out / 'rows'}: "
        "run the same command to resume")
    # the same command resumes and says how many rows it found, as sweep.py (it said only
    # rows_written, a fresh user's find)
    monkeypatch.setattr(module, "run_task", lambda *a, **k: 0)
    monkeypatch.setattr(module, "report", lambda *a, **k: {"families": {}})
    module.main(["--out", str(out), "--preset", "smoke"])
    counts = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert counts["rows_written"] == 0 and counts["already_present"] == 1


def test_backbone_flag_sets_the_grid_and_old_directories_resume(tmp_path, capsys, monkeypatch):
    """--backbone subspace: both families, not with --report; a directory whose
    spec.json predates the option (the committed benchmark's) is the isotropic grid."""
    module = experiment_script("optimizer_sweep")
    monkeypatch.setattr(module, "run_task", lambda *a, **k: pytest.fail("work started"))
    out = tmp_path / "out"
    _, spec = module.parse(["--out", str(out), "--preset", "smoke", "--backbone", "subspace",
                            "--families", "sgdm_cosine"])
    assert spec.backbone == "subspace" and spec.families == ("sgdm_cosine",)
    _, both = module.parse(["--out", str(out), "--preset", "smoke", "--backbone", "subspace"])
    assert both.backbone == "subspace" and "adamw_cosine" in both.families
    _, unseen = module.parse(["--out", str(out), "--preset", "smoke", "--seeds", "1", "2"])
    assert unseen.seeds == (1, 2) and [t.seed for t in unseen.tasks()] == [1, 2]
    for args, message in [(["--report"], "--backbone sets the predictions to run"),
                          (["--families", "sgdm_cosine", "--seeds", "-1"],
                           "--seeds must be distinct integers in [0, 2**32)"),
                          (["--families", "sgdm_cosine", "--seeds", "1", "1"],
                           "--seeds must be distinct integers in [0, 2**32)"),
                          (["--families", "sgdm_cosine", "--seeds", str(2**32)],
                           "--seeds must be distinct integers in [0, 2**32)")]:
        line = refused(module, ["--out", str(out), "--preset", "smoke", "--backbone",
                                "subspace", *args], capsys)
        assert message in line
    assert not out.exists()
    old = tmp_path / "old"
    old.mkdir()
    sgdm = ["--out", str(old), "--preset", "smoke", "--families", "sgdm_cosine"]
    _, smoke = module.parse(sgdm)
    recorded = {k: v for k, v in dataclasses.asdict(smoke).items() if k != "backbone"}
    (old / "spec.json").write_text(json.dumps(recorded))
    args, _ = module.parse(sgdm)
    assert args.grid["backbone"] == "isotropic"
    line = refused(module, [*sgdm, "--backbone", "subspace"], capsys)
    assert "holds another grid" in line and "(it differs in backbone)" in line


def test_damaged_rows_a_wrong_reuse_folder_and_a_partial_report_are_said(tmp_path, capsys,
                                                                          monkeypatch):
    """Three fresh-user finds: a row file damaged from outside was found only after the whole
    run (it printed already_present 4 first); --reuse-real of a constant-η sweep reused
    nothing without a word; a --report of a stopped benchmark did not say it was partial."""
    import dataclasses

    import pandas as pd
    from _scripts import refused

    from ntk_tt.sweep._optimizers import row_id

    module = experiment_script("optimizer_sweep")
    monkeypatch.setattr(module, "run_task", lambda *a, **k: pytest.fail("work started"))
    out = tmp_path / "out"
    (out / "rows").mkdir(parents=True)
    (out / "rows" / "x.json").write_text("garbage")
    assert "x.json" in refused(module, ["--out", str(out), "--preset", "smoke"], capsys)
    constant = tmp_path / "constant"
    (constant / "rows").mkdir(parents=True)
    (constant / "rows" / "a.json").write_text(json.dumps({"row_id": "a", "kappa": 1.0}))
    assert refused(module, ["--out", str(tmp_path / "o2"), "--preset", "smoke", "--reuse-real",
                            str(constant)], capsys).endswith(
        "--reuse-real: " + f"{constant} holds rows without an optimiser family (a constant-η "
        "sweep's, whose real runs no row here repeats): give a directory written by "
        "experiments/optimizer_sweep.py --out.")
    spec = module.PRESETS["smoke"]
    done = tmp_path / "partial"
    done.mkdir()
    (done / "spec.json").write_text(json.dumps(dataclasses.asdict(spec)))
    ids = [row_id(t, c) for t in spec.tasks() for c in spec.configs(t)]
    got = module._planned(done, pd.DataFrame({"row_id": ids[:1] + ["not-in-the-grid"]}))
    assert got == {"planned_rows": len(ids), "missing_rows": len(ids) - 1} and len(ids) > 1
    # a third probe: a row whose row_id is not its file's name was reported as an extra row
    # (n doubled); a damaged row in the --reuse-real folder was called a constant-η sweep's;
    # grid flags beside --report were ignored without a word
    renamed = tmp_path / "renamed"
    (renamed / "rows").mkdir(parents=True)
    (renamed / "rows" / "a.json").write_text(json.dumps({"row_id": "zzz", "family": "x"}))
    assert "row_id 'zzz' is not its file's name" in refused(
        module, ["--out", str(renamed), "--report"], capsys)
    (constant / "rows" / "a.json").write_text("{}")
    assert f"row file {constant / 'rows' / 'a.json'} is damaged" in refused(
        module, ["--out", str(tmp_path / "o3"), "--preset", "smoke", "--reuse-real",
                 str(constant)], capsys)
    for flag in (["--datasets", "mnist_test"], ["--seeds", "3"], ["--per-class", "9"],
                 ["--reuse-real", str(constant)]):
        assert f"{flag[0]} set what to run; --report only reports the rows already there" in \
            refused(module, ["--out", str(done), "--report", *flag], capsys)
