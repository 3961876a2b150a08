"""``ntk-tt predict``: a tiny real run end to end, JSON + figure, and one-line errors."""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from _cli_tiny import cli_before_jax

import ntk_tt
from ntk_tt._cli_parser import DEFAULT_FIGURE, _schedule_name
from ntk_tt._cli_report import format_report
from ntk_tt.cli import main
from ntk_tt.prediction._report_file import INTERRUPTED, RUNNING

ROOT = str(Path(__file__).resolve().parents[1])  # on PYTHONPATH of the programs run
STALE = b"an earlier run's default figure"


@pytest.fixture(autouse=True)
def in_a_used_folder(tmp_path, monkeypatch):
    """Every test runs in its own folder (never the repository), one where an earlier
    ``ntk-tt predict`` left its default figure, as README's main job leaves it in the
    repository's root before README's test command runs."""
    (tmp_path / DEFAULT_FIGURE).write_bytes(STALE)
    monkeypatch.chdir(tmp_path)


def run_cli(args, capsys):
    code = main(["predict", "--no-progress", *args])
    return code, capsys.readouterr()


def grey_digits(folder):
    """A 2-class .npz of 5 grey 28×28 images per class (random pixels, class b's brighter, so
    the predicted loss falls): with -n 3 the model's 32×32×3 input after conversion and 2
    held-out images per class, so the tests that predict on it share the shapes (N = 6, C = 2,
    4 held out) of the tiny verify run's compiled programs."""
    labels = np.arange(10) % 2
    grey = np.random.default_rng(0).integers(0, 128, (10, 28, 28)) + 128 * labels[:, None, None]
    return npz(folder / "grey.npz", grey.astype(np.uint8), labels, "ab")


def test_tiny_verify_run_writes_json_and_figure(tmp_path, capsys):
    js, png = tmp_path / "r.json", tmp_path / "f.png"
    code, out = run_cli(["-K", "2", "-n", "3", "--test-per-class", "2", "-T", "4", "--lr",
                         "0.002", "--verify", "--json", str(js), "--figure", str(png)], capsys)
    assert code == 0
    r = json.loads(js.read_text())
    for path in ("predicted.training_time", "real.training_time", "relative_error",
                 "seconds.predict", "seconds.finetune", "diverged"):
        node = r
        for part in path.split("."):
            assert part in node, path
            node = node[part]
    assert set(r["predicted"]["training_time"]) == {"loss", "error"}
    assert set(r["predicted"]["training_time"]["loss"]) == {"0.01", "0.1", "0.4"}
    assert len(r["curves"]["real"]["loss"]) == 5 and r["task"]["n_train"] == 6
    assert r["seconds"]["finetune"] > 0 and r["seconds"]["predict"] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "predicted T_ε" in out.out and "real T_ε" in out.out


def test_prediction_only_reports_wall_clock_and_image_conversion(tmp_path, capsys):
    """... replaces the default figure an earlier run left, without --overwrite, and says how
    the images were converted (grey 28×28 → the model's 32×32 RGB)."""
    js = tmp_path / "r.json"
    code, out = run_cli(["--dataset", grey_digits(tmp_path), "-K", "2", "-n", "3", "-T", "4",
                         "--json", str(js)], capsys)
    r = json.loads(js.read_text())
    assert code == 0 and r["real"] is None and r["seconds"]["finetune"] is None
    said = ("grey → RGB (channel repeated); resized from 28×28 to 32×32 px (bilinear, "
            "antialiased)")
    assert r["task"]["preprocessing"] == said
    assert r["task"]["image_shape"] == [28, 28, 1] and r["task"]["model_input_shape"] == [32, 32, 3]
    assert f"images: 28×28×1 → 32×32×3, preprocessing: {said}" in out.out
    assert r["figure"] == DEFAULT_FIGURE and f"figure: {DEFAULT_FIGURE}\n" in out.out
    assert (tmp_path / DEFAULT_FIGURE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sps = r["predicted"]["seconds_per_step"]
    assert sum(t is not None for t in r["predicted"]["training_time"]["loss"].values()) >= 2
    for eps, t in r["predicted"]["training_time"]["loss"].items():
        wall = r["predicted"]["wall_clock"]["loss"][eps]
        assert (t is None and wall is None) or wall == pytest.approx(t * sps)
        iv = r["predicted"]["interval_90"]["loss"][eps]  # the shipped calibrator's
        assert (t is None) == (iv is None) and (iv is None or iv[0] < iv[1])
    assert "pred. wall-clock" in out.out and "90 % interval" in out.out


def fake_npz(folder, name, images):
    np.savez(folder / name, images=images, labels=np.arange(len(images)) % 5,
             class_names=np.array(list("abcde")))


@pytest.mark.parametrize("args,match", [
    (["--dataset", "nope"], "unknown dataset 'nope'; known datasets: flowers5"),
    (["-K", "6"], "num_classes"),
    (["-n", "201"], "per_class"),
    (["--checkpoint", "/nonexistent/ck"], "checkpoint not found"),
    (["--checkpoint", "EMPTY"], "corrupt or not an ntk_tt checkpoint"),
    (["--dataset", "cifar10", "--data-dir", "TMP"], "not prepared"),
    (["--dataset", "cifar10_test", "-n", "2"], "channels"),
    (["--dataset", "mnist_test", "-n", "2", "--no-resize"], "28×28 px"),
    (["--lr", "-1", "-n", "2"], "learning_rate"),
])
def test_bad_input_is_one_clear_line(args, match, tmp_path, capsys, monkeypatch):
    (tmp_path / "empty").mkdir()
    fake_npz(tmp_path, "cifar10_test_300pc.npz", np.zeros((20, 32, 32, 2), np.uint8))
    fake_npz(tmp_path, "mnist_test.npz", np.zeros((20, 28, 28), np.uint8))
    monkeypatch.setenv("NTK_TT_DATA_DIR", str(tmp_path))
    args = [str(tmp_path / "empty") if a == "EMPTY" else str(tmp_path) if a == "TMP" else a
            for a in args]
    with pytest.raises(SystemExit) as exit_info:
        run_cli(args, capsys)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    lines = [ln for ln in err.splitlines() if ln.startswith("ntk-tt: error:")]
    assert len(lines) == 1 and match in lines[0], err
    assert "Traceback" not in err


def no_work(monkeypatch):
    def refuse(**_):
        raise AssertionError("work started before the options were checked")

    monkeypatch.setattr("ntk_tt.prediction._job.load_task", refuse)


def one_error_line(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(args, capsys)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("ntk-tt: error:") and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("args, said", [
    (["predict", "--lr", "0.01", "--lr", "0.001"],
     "ntk-tt predict: error: --lr is given twice (0.01 and 0.001): give it once."),
    (["predict", "-T", "10", "--steps", "20"],
     "ntk-tt predict: error: --steps is given twice (10 and 20): give it once."),
    (["suggest", "--target", "0.5", "--target", "0.6"],
     "ntk-tt suggest: error: --target is given twice (0.5 and 0.6): give it once."),
])
def test_a_one_value_flag_given_twice_is_refused(args, said, capsys, monkeypatch):
    """A fresh user: a one-value flag given twice kept its last value silently (predict --lr
    0.01 --lr 0.001 ran at 0.001, -B 10 -B 25 at 25); refused now, whichever spelling
    repeats it, as a repeated list flag's value is."""
    no_work(monkeypatch)
    with pytest.raises(SystemExit) as ended:
        main(args)
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.splitlines()[-1] == said


def test_a_misspelt_schedule_is_echoed_as_typed(capsys, monkeypatch):
    """A fresh user: --schedule warmup-cosin was echoed as 'warmup_cosin' (hyphens made
    underscores) beside choices spelt unlike -h and README; both spellings still work."""
    no_work(monkeypatch)
    with pytest.raises(SystemExit) as ended:
        main(["predict", "--schedule", "warmup-cosin"])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and "Traceback" not in err
    assert err.splitlines()[-1] == (
        "ntk-tt predict: error: argument --schedule: invalid choice: 'warmup-cosin' (choose "
        "from constant, warmup-cosine, warmup-stable-decay, exponential)")
    for spelling in ("warmup-stable-decay", "warmup_stable_decay"):
        assert _schedule_name(spelling) == "warmup_stable_decay"


@pytest.mark.parametrize("args, parsed", [
    (["predict", "--loss", "cross-entropy", "--method", "closed-form"],
     {"loss": "cross_entropy", "method": "closed_form"}),
    (["predict", "--predictor", "head-aware", "--subset-method", "power-law"],
     {"predictor": "head_aware", "subset_method": "power_law"}),
    (["suggest", "--loss", "cross-entropy", "--predictor", "head-aware"],
     {"loss": "cross_entropy", "predictor": "head_aware"}),
    (["predict", "--loss", "mse", "--method", "discrete"], {"loss": "mse", "method": "discrete"}),
])
def test_choice_options_take_hyphens_as_schedule_does(args, parsed):
    """--schedule took warmup-cosine and warmup_cosine, while --loss cross-entropy, --method
    closed-form and --predictor head-aware were invalid choices (a fresh user's find): every
    choice of two words now takes either spelling, read as the options spell it."""
    from ntk_tt._cli_parser import parse

    args_, _ = parse(args)
    assert {k: getattr(args_, k) for k in parsed} == parsed


def test_a_misspelt_choice_is_echoed_as_typed(capsys, monkeypatch):
    no_work(monkeypatch)
    with pytest.raises(SystemExit) as ended:
        main(["suggest", "--predictor", "head-awar"])
    assert ended.value.code == 2 and capsys.readouterr().err.splitlines()[-1] == (
        "ntk-tt suggest: error: argument --predictor: invalid choice: 'head-awar' (choose "
        "from auto, head_aware, linear)")


@pytest.mark.parametrize("args,match", [
    (["--json", "/nonexistent/dir/out.json"], "does not exist"),
    (["--figure", "/nonexistent/dir/f.png"], "does not exist"),
    (["--figure", "out.xyz"], "must end in a format matplotlib writes"),
    (["--num-paths", "0"], "num_paths (--num-paths) must be an integer in [1, 4096]"),
    (["--num-paths", "-3"], "num_paths (--num-paths) must be an integer in [1, 4096]"),
    # a fresh user: 10⁶ paths took 17.5 GB for N = 10
    (["--num-paths", "1000000", "-B", "3"], "must be an integer in [1, 4096] (SGD noise"),
    # a fresh user: --num-paths with GD was silently ignored (its JSON recorded it)
    (["--num-paths", "4"], "num_paths (--num-paths) averages SGD batch orders (or SDE paths) "
                           "and full-batch GD has one (no -B, or -B N): give -B < N"),
    (["--num-paths", "4", "-n", "2", "-B", "10"], "and full-batch GD has one"),
    (["--num-paths", "4", "--subset", "100", "--loss", "mse"],
     "full-batch GD has one (no -B, or -B N): drop --num-paths (--subset predicts GD only)."),
    # a fresh user: with --method ode the flag was accepted and changed nothing
    (["--num-paths", "4", "-B", "10", "--method", "ode"],
     "method 'ode' (--method ode) is deterministic, the mean flow of -B's SGD"),
])
def test_bad_options_fail_before_any_work(args, match, capsys, monkeypatch):
    no_work(monkeypatch)
    assert match in one_error_line(args, capsys)


@pytest.mark.parametrize("content,match", [
    ("keys", "lacks the keys ['class_names']"),
    ("text", "not a numpy .npz archive"),
    ("missing", "file not found"),
    ("one_class", "only 1 class"),
])
def test_bad_npz_dataset_is_one_line(content, match, tmp_path, capsys):
    path = tmp_path / "bad.npz"
    if content == "keys":
        np.savez(path, images=np.zeros((4, 8, 8, 3), np.uint8), labels=np.arange(4) % 2)
    elif content == "text":
        path.write_text("hello")
    elif content == "one_class":
        np.savez(path, images=np.zeros((4, 8, 8, 3), np.uint8), labels=np.zeros(4, int),
                 class_names=np.array(["a"]))
    with pytest.raises(SystemExit):
        run_cli(["--dataset", str(path), "-n", "1"], capsys)
    err = capsys.readouterr().err
    assert err.startswith("ntk-tt: error:") and err.count("\n") == 1 and match in err, err


@pytest.mark.parametrize("args,match", [(["-n", "0"], "per_class (n) must be >= 1"),
                                         (["-K", "1"], "num_classes (K) must be >= 2")])
def test_k_and_n_below_minimum_say_the_minimum(args, match, capsys):
    with pytest.raises(SystemExit):
        run_cli(args, capsys)
    err = capsys.readouterr().err
    assert err.startswith("ntk-tt: error:") and match in err, err


def test_beyond_edge_warning_and_held_out_note(tmp_path, capsys):
    js = tmp_path / "r.json"
    code, out = run_cli(["--dataset", grey_digits(tmp_path), "-K", "2", "-n", "3",
                         "--test-per-class", "1000", "-T", "4", "--lr", "1000", "--json",
                         str(js), "--figure", ""], capsys)
    r = json.loads(js.read_text())
    assert code == 0 and r["predicted"]["beyond_edge"] is True
    warning = [ln for ln in out.out.splitlines() if ln.startswith("warning: κ")]
    assert len(warning) == 1 and "stability edge" in warning[0] and "lower --lr" in warning[0]
    note = [ln for ln in out.out.splitlines() if ln.startswith("note:")]
    assert len(note) == 1 and "2 held-out images per class" in note[0] and "1000" in note[0]
    assert r["task"]["test_per_class"] == 2
    assert r["predicted"]["diverged"]  # κ far beyond the edge: the prediction diverges
    assert "prediction diverged at step" in out.out and "diverged: predicted True" in out.out
    assert "(predicted: diverged)" in out.out


def test_a_prediction_without_interval_says_why(tmp_path, capsys):
    """--predictor linear: the interval column is n/a, and a note: line says why (the
    shipped residuals are the head-aware predictor's); it said nothing."""
    js = tmp_path / "r.json"
    code, out = run_cli(["--dataset", grey_digits(tmp_path), "-K", "2", "-n", "3", "-T", "4",
                         "--predictor", "linear", "--json", str(js), "--figure", ""], capsys)
    r = json.loads(js.read_text())
    assert code == 0 and not r["predicted"]["diverged"]
    notes = [ln for ln in out.out.splitlines() if ln.startswith("note: no T_ε interval")]
    assert notes == ["note: " + w for w in r["predicted"]["interval_warnings"]]
    assert len(notes) == 1 and "this prediction's kernel is exact" in notes[0], notes
    assert all(v is None for v in r["predicted"]["interval_90"]["loss"].values())


def test_help_names_default_figure_and_npz_format(capsys):
    with pytest.raises(SystemExit):
        main(["predict", "-h"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: ntk_tt_predict.png, replaced by each run)" in text
    assert "in the current directory" in text
    assert ".npz file with keys images" in text


no_proc = pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux /proc")


@pytest.mark.parametrize("args,match", [
    (["--json", "TMP"], "is a directory"),
    (["--figure", "TMP"], "is a directory"),
    pytest.param(["--json", "/proc/x.json"], "cannot create a file in folder '/proc'",
                 marks=no_proc),
    pytest.param(["--figure", "/proc/x.png"], "cannot create a file in folder '/proc'",
                 marks=no_proc),
    (["--json", "TMP/same.png", "--figure", "TMP/same.png"], "both be written to"),
])
def test_unwritable_output_paths_fail_before_any_work(args, match, tmp_path, capsys,
                                                      monkeypatch):
    no_work(monkeypatch)
    args = [a.replace("TMP", str(tmp_path)) for a in args]
    assert match in one_error_line(args, capsys)


@pytest.mark.parametrize("args,match", [
    (["--test-per-class", "-1"], "test_per_class (--test-per-class) must be an integer >= 0"),
    (["--sketch-dim", "64"], "only applies to kernel 'sketch' (--kernel sketch) or method "
                             "'sde'"),
    (["--sketch-dim", "64", "--kernel", "traced"], "only applies to kernel 'sketch'"),
    (["--kernel", "sketch", "--sketch-dim", "0"], "sketch_dim (--sketch-dim) must be"),
    (["--nesterov"], "Nesterov needs momentum > 0"),
    (["--nesterov", "-m", "0"], "Nesterov needs momentum > 0"),
    (["--predictor", "head_aware", "--method", "ode"], "uses the exact discrete recursion"),
    # only what is wrong is named (a fresh user: "got method 'sde' and kernel 'exact'")
    (["--predictor", "head_aware", "--method", "sde"], "logit-summed kernel, got method 'sde'; "),
    (["--predictor", "head_aware", "--kernel", "sketch"], "kernel, got kernel 'sketch'; use"),
    (["--predictor", "head_aware", "--kernel", "sketch"], "use --predictor linear"),
    # a fresh user's --kernel traced ran the head-aware predictor (it has no traced form)
    (["--predictor", "head_aware", "--kernel", "traced"], "kernel, got kernel 'traced'; use "
                                                          "--predictor linear"),
    (["--kernel", "traced", "--backbone", "diagonal"], "--backbone diagonal applies to the "
     "head-aware predictor only, and --kernel traced selects the linear predictor"),
    (["--predictor", "linear", "--segments", "3"], "applies to the head-aware predictor only"),
    (["--method", "ode", "--backbone", "exact"], "applies to the head-aware predictor only"),
    (["--segments", "0"], "segments (--segments) must be an integer in [1, steps]"),
    (["--segments", "200"], "segments (--segments) must be an integer in [1, steps]"),
])
def test_ignored_or_clamped_options_are_errors(args, match, capsys, monkeypatch):
    no_work(monkeypatch)
    assert match in one_error_line(args, capsys)


def test_auto_takes_the_linear_predictor_for_a_traced_or_sketched_kernel():
    """--kernel traced with the default --predictor auto ran the head-aware predictor (whose
    kernel is always the exact logit-summed one) and reported kernel 'traced' in its JSON."""
    from ntk_tt._options_predict import resolve_predictor

    base = dict(predictor="auto", method="auto", kernel="exact", subset=None)
    assert resolve_predictor(base) == "head_aware"
    assert [resolve_predictor({**base, "kernel": k}) for k in ("traced", "sketch")] == [
        "linear", "linear"]


@pytest.mark.parametrize("args,match", [
    (["--lr", "-1"], "learning_rate (--lr) must be a finite number > 0"),
    (["--lr", "nan"], "learning_rate (--lr) must be a finite number > 0"),
    (["-m", "1"], "momentum (-m) must be in [0, 1)"),
    # a fresh user: -m 0.9999999999 (1.0 in float32) crashed the report with a TypeError
    (["-m", "0.9999999999"], "momentum (-m) must be in [0, 1) and at most 0.99999994"),
    (["-B", "0"], "batch_size (-B) must be an integer >= 1"),
    (["-K", "2", "-n", "3", "-B", "7"], "more than the N = K·n = 2·3 = 6 training images"),
    (["-T", "0"], "steps (-T) must be an integer >= 1"),
    (["-T", "10000000000"], "and <= 1,000,000 (optimiser updates)"),
    (["--head-scale", "0"], "head_scale (--head-scale) must be a number in [1e-06, 1e+06]"),
    # a fresh user: 1e30 overflowed the float32 head into a NaN-weights message
    (["--head-scale", "1e30"], "head_scale (--head-scale) must be a number in [1e-06, 1e+06]"),
    (["--checkpoint", "FILE"], "is a file; pass the directory written by "
                               "ntk_tt.save_checkpoint"),
    (["--checkpoint", "/nonexistent/ck"], "checkpoint not found"),
])
def test_numeric_flags_and_checkpoint_fail_before_loading(args, match, tmp_path, capsys,
                                                          monkeypatch):
    no_work(monkeypatch)
    (tmp_path / "ck").write_text("not a checkpoint")
    args = [str(tmp_path / "ck") if a == "FILE" else a for a in args]
    assert match in one_error_line(args, capsys)


def fake_report(*, verify, pred_diverged, real_diverged):
    """The keys format_report reads, as predict_task writes them (tiny task, T = 8)."""
    def side(diverged, at):
        reason = (f"diverged at step {at}" if diverged
                  else "no step comes within epsilon * (L_0 - L_T) of L_T")
        value = None if diverged else 5.0
        times = {c: {e: value for e in ("0.01", "0.1", "0.4")} for c in ("loss", "error")}
        times["loss"]["0.01"] = None
        return {"training_time": times, "wall_clock": times,
                "training_time_reasons": {c: {e: reason for e in ("0.01", "0.1", "0.4")
                                              if times[c][e] is None} for c in times},
                "test_accuracy": 0.5, "diverged": diverged,
                "diverged_at": at if diverged else None, "seconds_per_step": 0.005}

    pred = side(pred_diverged, 1) | {"method": "discrete", "kernel": "exact",
                                     "kappa": 6.9e11 if pred_diverged else 0.9,
                                     "beyond_edge": pred_diverged}
    real = side(real_diverged, 2) if verify else None
    fall = -6.65e33 if real_diverged else 0.5
    return {
        "config": {"test_per_class": 2},
        "optimizer": {"optimizer": "sgd", "learning_rate": 0.002, "schedule": "constant",
                      "schedule_parameters": {"value": 0.002}, "momentum": 0.0,
                      "nesterov": False, "b2": None, "eps": None, "weight_decay": 0.0,
                      "decoupled": True, "batch_size": 10},
        "task": {"dataset": "flowers5", "classes": ["daisy", "tulip"], "n_train": 10,
                 "n_test": 4, "test_per_class": 2, "architecture": "SmallResNet",
                 "num_params": 120706, "image_shape": [28, 28, 1],
                 "model_input_shape": [32, 32, 3],
                 "preprocessing": "grey → RGB (channel repeated); resized from 28×28 to "
                                  "32×32 px (bilinear, antialiased)"},
        "predicted": pred, "real": real,
        "relative_error": ({c: {e: None for e in ("0.01", "0.1", "0.4")}
                            for c in ("loss", "error")} if verify else None),
        "curve_distance": {"loss": {"max_abs": 6.65e33 if real_diverged else 0.01,
                                    "real_fall": fall,
                                    "max_rel_to_fall": None if real_diverged else 0.02}},
        "seconds": {"predict": 1.2, "predict_stages": {"compile": 6.0}, "finetune": 0.01,
                    "compile_finetune": 4.9, "ratio": 0.004},
        "diverged": {"predicted": pred_diverged, "real": real_diverged if verify else None},
    }


@pytest.mark.parametrize("pred_diverged,real_diverged", [(True, True), (False, True),
                                                         (True, False)])
def test_diverged_verify_run_is_said_and_not_compared(pred_diverged, real_diverged):
    text = format_report(fake_report(verify=True, pred_diverged=pred_diverged,
                                     real_diverged=real_diverged))
    assert ("prediction diverged at step 1" in text) == pred_diverged
    assert ("real run diverged at step 2" in text) == real_diverged
    assert "max |predicted − real|" not in text and "e+33" not in text
    assert "loss curves: not compared" in text and "not meaningful" in text
    acc = [ln for ln in text.splitlines() if ln.startswith("held-out accuracy")]
    assert len(acc) == 1 and acc[0].count("not meaningful (diverged)") == (pred_diverged
                                                                           + real_diverged)
    assert f"diverged: predicted {pred_diverged}, real {real_diverged}" in text
    ratio = [ln for ln in text.splitlines() if ln.startswith("real fine-tuning:")]
    assert len(ratio) == 1 and "0.004" not in ratio[0], ratio
    # "diverged at step 2 and stopped there" told a fresh user a run that trained on to
    # step 4 (its final rise began at step 2: diverged_at) had stopped at step 2
    why = ("the real run diverged: its loss rose from step 2 on and did not come back"
           if real_diverged
           else "the prediction diverged: it predicts no T_ε to compare")
    assert ratio[0].endswith(f"wall time = not meaningful ({why})")


def test_converged_verify_run_keeps_the_comparisons():
    text = format_report(fake_report(verify=True, pred_diverged=False, real_diverged=False))
    assert "loss curves: max |predicted − real| = 0.01 (2 % of the real fall 0.5)" in text
    assert "held-out accuracy at T: predicted 0.500, real 0.500" in text
    assert "fine-tuning / prediction wall time = 0.004" in text
    assert ("images: 28×28×1 → 32×32×3, preprocessing: grey → RGB (channel repeated); "
            "resized from 28×28 to 32×32 px (bilinear, antialiased)") in text
    assert "diverged" not in text.replace("diverged: predicted False, real False", "")


def test_the_prediction_line_names_the_sketch_sizes_and_subspace_k_used():
    """A fresh user: the D' of --kernel sketch and --method sde (default 256) and the
    subspace k (default 16) changed the prediction but were in neither the report nor the
    JSON's config (None for a default); the report's prediction line now names them from
    the prediction's hyperparameters, and names nothing when none was drawn."""
    r = fake_report(verify=False, pred_diverged=False, real_diverged=False)
    plain = [ln for ln in format_report(r).splitlines() if ln.startswith("prediction:")]
    assert plain[0].startswith("prediction: method discrete, kernel exact, κ")
    r["predicted"]["hyperparameters"] = {"sketch_dim": 256, "noise_dim": 256}
    assert "kernel exact (sketch D' = 256, noise D' = 256), κ" in format_report(r)
    r["predicted"]["hyperparameters"] = {"subspace_dim": 16}
    assert "kernel exact (k = 16), κ" in format_report(r)


def test_beyond_the_edge_the_warning_says_what_the_benchmark_measured():
    """A fresh user: "the real run will likely diverge or oscillate" fired on three runs that
    trained normally (T_ε within 0-9 %), where README counts 18 of 174 benchmark runs beyond
    the edge diverging; the warning now says may, with those counts."""
    r = fake_report(verify=False, pred_diverged=False, real_diverged=False)
    r["predicted"] |= {"beyond_edge": True, "kappa": 5.0}
    (line,) = [ln for ln in format_report(r).splitlines() if "stability edge" in ln]
    assert line.startswith("warning: κ = 5 is beyond the linearised model's stability edge, "
                           "where the real run may diverge or spike and recover (there 18 of "
                           "174 benchmark runs and 151 of 384 corpus runs diverged, README)")
    assert "effective κ̃" not in format_report(r)  # the edge's warning says more


def test_a_kappa_beyond_float32_reads_inf():
    """A fresh user: --lr 1e38 printed "κ = η·λ_max/N = n/a" and "κ = n/a is beyond the ...
    edge". κ = η·λ_max/N of that η overflows float32 (a prediction's κ is inf), which the JSON
    report holds as null; the text says so."""
    import jax.numpy as jnp

    from ntk_tt.prediction._job import _plain

    x = jnp.linspace(-10.0, 10.0, 12).reshape(6, 2)  # λ_max/N ≈ 77: η·λ_max/N = inf
    params = {"w": jnp.array([[1.0, -1.0], [0.5, 2.0]])}
    pred = ntk_tt.predict(lambda p, v: v @ p["w"], params, x,
                          jnp.array([0, 1, 0, 1, 0, 1]), learning_rate=1e38, steps=3)
    assert np.isinf(float(pred.kappa)) and _plain(float(pred.kappa)) is None
    r = fake_report(verify=False, pred_diverged=False, real_diverged=False)
    r["predicted"] |= {"beyond_edge": True, "kappa": _plain(float(pred.kappa))}
    text = format_report(r)
    assert "κ = η·λ_max/N = inf (η·λ_max overflows float32)" in text
    assert "warning: κ = inf (η·λ_max overflows float32) is beyond the linearised" in text


@pytest.mark.parametrize("kappa,momentum,noted", [(0.9, 0.95, True), (0.9, 0.9, False),
                                                   (13.0, 0.0, True), (11.0, 0.0, False)])
def test_an_effective_kappa_beyond_the_benchmark_grid_is_noted(kappa, momentum, noted):
    """A fresh user: predict at m = 0.999 (κ̃ = κ/(1 − m) ≈ 1000) said nothing, where suggest
    notes a κ̃ beyond the benchmark's main grid (κ̃ <= 12); predict now says it too."""
    r = fake_report(verify=False, pred_diverged=False, real_diverged=False)
    r["predicted"]["kappa"], r["optimizer"]["momentum"] = kappa, momentum
    notes = [ln for ln in format_report(r).splitlines() if "effective κ̃" in ln]
    assert len(notes) == int(noted)
    if noted:
        assert notes[0].startswith(f"note: effective κ̃ = κ/(1 − m) = "
                                   f"{kappa / (1 - momentum):.3g} is beyond the benchmark "
                                   "sweep's main grid (κ̃ <= 12;")
        assert notes[0].endswith("check it with a real run (--verify)")


@pytest.mark.parametrize("diverged", [False, True])
def test_prediction_only_table_gives_reasons_and_a_diverged_line(diverged):
    text = format_report(fake_report(verify=False, pred_diverged=diverged,
                                     real_diverged=False))
    rows = [ln for ln in text.splitlines() if ln.startswith(("loss ", "error "))]
    assert len(rows) == 6
    for row in rows:
        assert ("undefined" in row) == ("(predicted: " in row), row
    short = "diverged" if diverged else "never within ε of L_T"
    assert rows[0].endswith(f"(predicted: {short})")
    assert text.splitlines()[-1] == f"diverged: predicted {diverged}"
    assert ("prediction diverged at step 1" in text) == diverged


def test_spiked_and_recovered_run_is_said_not_called_diverged():
    """The catapult case: the real run spiked above 10·L_0 and recovered; the prediction
    (linear model beyond its edge) diverged."""
    r = fake_report(verify=True, pred_diverged=True, real_diverged=False)
    r["real"]["spiked_at"], r["predicted"]["spiked_at"] = 3, 1
    text = format_report(r)
    assert "real run spiked above 10·L_0 at step 3 and recovered" in text
    assert "prediction spiked" not in text and "real run diverged" not in text
    assert "diverged: predicted True, real False" in text


def test_a_real_spike_the_outcome_calls_divergent_is_explained_on_the_last_line():
    """A fresh user read "outcome: predicted diverges, real diverges" above "diverged:
    predicted True, real False" as a contradiction: a real spike above 10·L_0 that fell back
    is outcome "diverges" but not diverged (README "Diverged means"), so the last line keeps
    False and says why the outcome differs."""
    r = fake_report(verify=True, pred_diverged=True, real_diverged=False)
    r["real"] |= {"spiked_at": 1, "outcome": "diverges", "spike_step": 1}
    r["predicted"] |= {"outcome": "diverges", "spike_step": 1}
    lines = format_report(r).splitlines()
    assert "outcome: predicted diverges (first above L_0 at step 1), real diverges (first " \
           "above L_0 at step 1)" in lines
    assert lines[-1] == ("diverged: predicted True, real False (but it spiked above 10·L_0 at "
                         "step 1 and fell back: outcome diverges)")


@pytest.mark.parametrize("verify", [False, True])
def test_a_prediction_called_divergent_gives_no_t_eps_targets_or_comparison(verify):
    """A fresh user's finding: κ ≥ 68 (or a spike above 10·L_0) calls the real run divergent
    while the linearised curve falls; the report said "diverged: predicted True" yet printed
    T_ε, intervals and a comparison. Now (as predict writes it: every T_ε None with the
    reason CALLED_DIVERGES) the rows say "predicted: diverges", one line says why, and the
    curves, accuracies and wall-time ratio are not compared; the real side is kept."""
    from ntk_tt.dynamics._training_time import CALLED_DIVERGES, REASONS

    r = fake_report(verify=verify, pred_diverged=False, real_diverged=False)
    none = {c: {e: None for e in ("0.01", "0.1", "0.4")} for c in ("loss", "error")}
    why = "κ = η·λ_max/N = 70.2 ≥ 68, where the real runs measured diverged"
    r["predicted"] |= {"training_time": none, "wall_clock": none,
                       "training_time_reasons": {c: dict.fromkeys(per, REASONS[CALLED_DIVERGES])
                                                 for c, per in none.items()},
                       "outcome": "diverges", "divergence": "yes", "divergence_reason": why,
                       "kappa": 70.2, "beyond_edge": True}
    text = format_report(r)
    rows = [ln for ln in text.splitlines() if ln.split()[:2] in (
        [c, e] for c in ("loss", "error") for e in ("0.01", "0.1", "0.4"))]
    assert len(rows) == 6 and all("(predicted: diverges" in row for row in rows)
    (line,) = [ln for ln in text.splitlines() if ln.startswith("prediction: the real")]
    assert line == (f"prediction: the real run is predicted to diverge ({why}): no predicted "
                    "T_ε, steps to target or comparison (lower --lr)")
    assert text.splitlines()[-1].startswith(f"diverged: predicted True ({why}")
    assert "prediction diverged at step" not in text and "prediction spiked" not in text
    assert "stability edge, where the real run may" not in text  # nothing to distrust
    if verify:
        assert "max |predicted − real|" not in text
        assert "loss curves: not compared (the prediction calls the real run divergent" in text
        (acc,) = [ln for ln in text.splitlines() if ln.startswith("held-out accuracy")]
        assert acc == ("held-out accuracy at T: predicted not meaningful (predicted to "
                       "diverge), real 0.500")
        (ratio,) = [ln for ln in text.splitlines() if ln.startswith("real fine-tuning:")]
        assert ratio.endswith("wall time = not meaningful (the prediction calls divergence: "
                              "it predicts no T_ε to compare)")


def no_checkpoint(monkeypatch):
    def refuse(*_):
        raise AssertionError("the checkpoint was loaded before the cheap checks")

    monkeypatch.setattr("ntk_tt.prediction._job.restore", refuse)


def npz(path, images, labels, names="abc"):
    np.savez(path, images=images, labels=labels, class_names=np.array(list(names)))
    return str(path)


@pytest.mark.parametrize("progress", [True, False])
@pytest.mark.parametrize("case,match", [
    ("tfds_empty", "TFDS dataset 'cifar10' is not prepared in"),
    ("corrupt_npz", "not a numpy .npz archive"),
    ("labels_out_of_range", "must be integers in [0, K) with K = len(class_names) = 3"),
    ("too_many_classes", "num_classes (K) = 4 is more than the 3 classes available"),
    ("classes_without_images", "num_classes (K) = 5 is more than the 4 classes available: "
                               "only 4 of the 8 class_names have images; choose K <= 4"),
    ("too_many_per_class", "per_class (n) = 5 images is more than 2 classes have"),
    ("closed_form_cross_entropy", "method 'closed_form' (--method closed_form) exists for "
                                  "loss 'mse'"),
])
def test_cheap_errors_come_before_the_checkpoint_as_one_line(case, match, progress, tmp_path,
                                                            capsys, monkeypatch):
    no_checkpoint(monkeypatch)
    images = np.zeros((12, 8, 8, 3), np.uint8)
    args = {
        "tfds_empty": ["--dataset", "cifar10", "--data-dir", str(tmp_path)],
        "corrupt_npz": ["--dataset", str(tmp_path / "x.npz")],
        "labels_out_of_range": ["--dataset", npz(tmp_path / "l.npz", images,
                                                 np.arange(12) % 4)],
        "too_many_classes": ["--dataset", npz(tmp_path / "k.npz", images, np.arange(12) % 3),
                             "-K", "4", "-n", "1"],
        "classes_without_images": ["--dataset", npz(tmp_path / "g.npz", images,
                                                    np.tile([0, 2, 5, 7], 3), "abcdefgh"),
                                   "-K", "5", "-n", "3"],
        "too_many_per_class": ["--dataset", npz(tmp_path / "n.npz", images,
                                                np.arange(12) % 3), "-K", "2", "-n", "5"],
        "closed_form_cross_entropy": ["--method", "closed_form"],
    }[case]
    (tmp_path / "x.npz").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(SystemExit) as exit_info:
        main(["predict", *args, "--figure", ""] + ([] if progress else ["--no-progress"]))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.startswith("ntk-tt: error: ") and err.count("\n") == 1 and "\r" not in err, err
    assert match in err, err


def test_existing_outputs_are_refused_unless_overwrite(tmp_path, capsys, monkeypatch):
    no_work(monkeypatch)
    for name in ("r.json", "f.png"):
        (tmp_path / name).write_text("an earlier run")
        flag = "--json" if name.endswith("json") else "--figure"
        err = one_error_line([flag, str(tmp_path / name)], capsys)
        assert f"path {str(tmp_path / name)!r} exists (an earlier run's output?)" in err
        assert "pass --overwrite" in err
        with pytest.raises(AssertionError, match="work started"):  # accepted: work starts
            run_cli([flag, str(tmp_path / name), "--overwrite"], capsys)
        assert (tmp_path / name).read_text() == "an earlier run"


def test_overwrite_names_the_outputs_it_may_replace(tmp_path):
    """``overwrite`` is True / False for both outputs, or the list of those that may be
    replaced (``ntk-tt predict`` passes ["figure"] for its default figure)."""
    from ntk_tt._output_paths import check_outputs

    fig, js = tmp_path / "f.png", tmp_path / "r.json"
    fig.write_text("earlier")
    js.write_text("earlier")
    check_outputs(fig, js, True)
    check_outputs(fig, None, ["figure"])
    with pytest.raises(ValueError, match=r"json path .* exists \(an earlier run's output"):
        check_outputs(fig, js, ["figure"])
    with pytest.raises(ValueError, match=r"figure path .* exists"):
        check_outputs(fig, js, ("json",))
    with pytest.raises(ValueError, match="overwrite must be True, False or a list of the "
                                         "outputs it may replace, \\['figure', 'json'\\], "
                                         "got 'figure'"):
        check_outputs(fig, js, "figure")


def test_a_report_left_by_a_killed_run_is_said_to_be_one(tmp_path):
    """A fresh user's finding: after kill -9 the rerun was refused as "an earlier run's
    output?"; a --json report whose status still says started or running is now named as a
    run that has not finished (still writing, or killed), and told what to do."""
    from ntk_tt._output_paths import check_outputs
    from ntk_tt.prediction._report_file import RUNNING, STARTED

    js = tmp_path / "r.json"
    for status in (STARTED, RUNNING):
        js.write_text(json.dumps({"status": status}))
        with pytest.raises(ValueError) as err:
            check_outputs(None, js, False)
        assert (f"exists (the report of a run that has not finished, status {status!r}: that "
                "run is still writing it, or it was killed (kill -9, out of memory); if none is "
                "running, remove the file) and is not replaced") in str(err.value)
    for earlier in (json.dumps({"status": "complete"}), "not json", json.dumps([1])):
        js.write_text(earlier)
        with pytest.raises(ValueError, match=r"exists \(an earlier run's output\?\) and"):
            check_outputs(None, js, False)


def test_output_created_meanwhile_is_not_replaced(tmp_path):
    from ntk_tt.prediction._report_file import _output, _write_json

    path = tmp_path / "r.json"
    path.write_text("the other run")
    with pytest.raises(ValueError, match="was created by another run while this one worked"):
        _output(_write_json, path, {"a": 1}, create=True)
    assert path.read_text() == "the other run"


def test_json_claim_without_hard_links_still_writes_the_whole_report(tmp_path, monkeypatch):
    """A file system without hard links (os.link: PermissionError): the claim falls back to
    an empty exclusive file replaced by the whole report; another run's file still wins."""
    from ntk_tt.prediction import _report_file

    def no_links(src, dst):
        raise PermissionError(1, "Operation not permitted", str(dst))

    monkeypatch.setattr(_report_file.os, "link", no_links)
    path, claim = tmp_path / "r.json", {}
    _report_file._write_json(path, {"a": 1}, create=True, claim=claim)
    assert json.loads(path.read_text()) == {"a": 1} and claim == {}
    assert not list(tmp_path.glob(".r.json.*"))
    with pytest.raises(ValueError, match="was created by another run"):
        _report_file._output(_report_file._write_json, path, {"b": 2}, create=True)
    assert json.loads(path.read_text()) == {"a": 1}


@pytest.mark.parametrize("when", ["before the link", "after the link"])
def test_an_interrupt_inside_the_json_claim_leaves_no_file(when, tmp_path, monkeypatch):
    """Ctrl-C / SIGTERM (a KeyboardInterrupt) while ``predict_task`` claims its --json report:
    no report and no temporary file are left (a fresh user's SIGTERM under load left an
    empty report, which the rerun then refused as an earlier run's output); a report another
    run holds is never removed."""
    from ntk_tt.prediction import _job, _report_file

    real_link = os.link

    def link(src, dst):
        if when == "after the link":
            real_link(src, dst)
        raise KeyboardInterrupt

    monkeypatch.setattr(_report_file.os, "link", link)
    monkeypatch.setattr(_job, "_work", lambda *a: pytest.fail("work started"))
    js = tmp_path / "r.json"
    with pytest.raises(KeyboardInterrupt):
        _job.predict_task(json_path=js, progress=False)
    assert not js.exists() and not list(tmp_path.glob(".r.json.*"))
    other = {"status": _report_file.STARTED, "config": "the other run's"}

    def another_run_first(src, dst):  # another run claims the path after the up-front check
        Path(dst).write_text(json.dumps(other))
        real_link(src, dst)

    monkeypatch.setattr(_report_file.os, "link", another_run_first)
    with pytest.raises(ValueError, match="was created by another run"):
        _job.predict_task(json_path=js, progress=False)
    assert json.loads(js.read_text()) == other and not list(tmp_path.glob(".r.json.*"))


def test_every_predict_option_has_help_and_its_default_shown(capsys):
    from ntk_tt._cli_parser import _parser

    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    actions = [a for a in sub.choices["predict"]._actions if a.dest != "help"]
    assert all(a.help for a in actions), [a.dest for a in actions if not a.help]
    with pytest.raises(SystemExit):
        main(["predict", "-h"])
    text = " ".join(capsys.readouterr().out.split())
    for flag, default in (("-n", 150), ("-T", 150), ("--lr", 0.002), ("--loss", "cross_entropy"),
                          ("--head-scale", 0.3), ("--overwrite", False)):
        action = next(a for a in actions if flag in a.option_strings)
        assert f"{' '.join(action.help.split())} (default: {default})" in text, flag
    # given only with -B < N (refused with GD), so its default is the one used there
    assert "so 1 predicts that very run (default there: 32)" in text
    # a fresh user read "default: diagonal ... (default: None)" for --backbone: an option left
    # None says in its help what that means, and no command's help adds "(default: None)"
    for command in sub.choices:
        with pytest.raises(SystemExit):
            main([command, "-h"])
        said = " ".join(capsys.readouterr().out.split())
        assert "(default: None)" not in said and "(default: " in said, command
    none = [a for a in actions if a.default is None and a.option_strings]
    assert len(none) > 10 and "--backbone" in [a.option_strings[-1] for a in none]


def test_version_and_help_need_no_jax(tmp_path, capsys):
    code = ("import sys\nfrom ntk_tt.cli import main\ntry:\n    main(['-h'])\n"
            "except SystemExit:\n    pass\nprint('jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=os.environ | {"PYTHONPATH": ROOT}, cwd=tmp_path).stdout
    assert out.splitlines()[-1] == "False"
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"ntk-tt {ntk_tt.__version__}\n"


@pytest.mark.parametrize("argv, typed", [
    (["--lr", "-1e-3"], "predict --lr -1e-3"), (["--lr", "0.01"], "predict --lr 0.01"),
    (["--verify"], "predict --verify"), (["-T5"], "predict -T5"),
    (["--seed", "3", "suggest"], "suggest --seed 3"),
    (["--json", "o.json", "outcome", "r.jsonl"], "outcome --json o.json r.jsonl"),
    (["--lr-max=3"], "suggest --lr-max=3")])
def test_flags_before_any_command_say_to_name_the_command(argv, typed, capsys):
    """``ntk-tt --lr 0.01`` said "invalid choice: '0.01'" (argparse took the number for the
    command): now one line that shows the command to type, the command named later in the
    line if there is one (a second fresh user: '--seed 3 suggest' was told 'predict')."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"ntk-tt: error: name the command before its flags, e.g. 'ntk-tt {typed}' "
                   "(commands: predict, suggest, outcome; 'ntk-tt' alone runs predict --verify).")


@pytest.mark.parametrize("argv, flag, command", [
    (["-V"], "-V", "predict"), (["--bogusflag"], "--bogusflag", "predict"),
    (["--verify", "outcome"], "--verify", "outcome"),  # a flag of another command
    (["--lr", "0.01", "--fraction", "0.1"], "--fraction", "predict"),  # flags of two commands
    (["--seed", "3", "--", "suggest"], "--", "suggest")])
def test_flags_the_command_lacks_are_named_not_put_in_a_line_that_fails(argv, flag, command,
                                                                       capsys):
    """A second fresh user: 'ntk-tt --lr 0.01 --fraction 0.1' was told to type 'ntk-tt
    predict --lr 0.01 --fraction 0.1', which fails; now the flag the command lacks is named."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"ntk-tt: error: unrecognized argument {flag!r} for 'ntk-tt {command}': give the "
        f"command first ('ntk-tt {command} -h' lists its flags; commands: predict, suggest, "
        "outcome).")


def test_a_leading_double_dash_before_the_command_ends_no_options(capsys):
    """``ntk-tt -- predict ...`` (POSIX: "--" ends the options, and there are none before the
    command) is ``ntk-tt predict ...``; argparse said "invalid choice: '--'" (a fresh user's
    find). The predict flags after it are parsed as predict's."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--", "predict", "--lr", "-1"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "ntk-tt: error: learning_rate (--lr) must be a finite number > 0")
    with pytest.raises(SystemExit):  # a second probe: these said "invalid choice: '--'"
        main(["--", "--lr", "0.01"])
    assert "name the command before its flags, e.g. 'ntk-tt predict --lr 0.01'" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["--", "--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("ntk-tt ")


@pytest.mark.parametrize("given", [["--schedule", "warmup-cosine"], ["--schedule=constant"],
                                   ["--sched", "cosine"], ["--end-lr", "0"],
                                   ["--decay-rate", "0.9"]])
def test_predicts_schedule_flags_on_suggest_say_what_suggest_searches(given, capsys):
    """A fresh user: 'suggest --optimizer adamw --schedule warmup-cosine' was asked "did you
    mean --seed?"; suggest has no schedule flags (its search is warmup-cosine), so the
    message says that and names the flags it has."""
    with pytest.raises(SystemExit):
        main(["suggest", "--optimizer", "adamw", *given])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("ntk-tt suggest: error: unrecognized arguments: --") and \
        "suggest's schedule is not chosen: " in err and "did you mean" not in err, err
    if given[0].startswith("--schedule"):
        assert "searches the peak --lr-min/--lr-max and the warmup fraction --warmups" in err


def test_a_stray_double_dash_gets_no_list_of_every_flag(capsys):
    with pytest.raises(SystemExit):
        main(["suggest", "--seed", "3", "--"])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "ntk-tt suggest: error: unrecognized arguments: --")


def test_diverged_figure_is_marked_and_not_flattened(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from ntk_tt.prediction._job import figure

    figs, savefig = [], Figure.savefig

    def keep(self, *args, **kwargs):  # the figure as written
        figs.append(self)
        return savefig(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    loss = np.array([2.0, 1.5, 1.2, 7e33, 7e33, 7e33])  # diverged at step 3, then held
    error = np.array([0.5, 0.4, 0.3, 0.5, 0.5, 0.5])
    pred = SimpleNamespace(loss=loss, error=error, loss_band=None, error_band=None,
                           diverged_at=3, training_time={"loss": {0.1: np.nan},
                                                         "error": {0.1: np.nan}})
    run = SimpleNamespace(loss=loss[::-1].copy() * 0 + np.linspace(2, 1, 6), error=error,
                          diverged_at=None)
    figure(tmp_path / "f.png", pred, run, overwrite=False)
    ax = figs[0].axes[0]
    assert ax.get_ylim()[1] < 3.0  # the real curve's range, not 7e33
    marks = [ln for ln in ax.get_lines() if list(ln.get_xdata()) == [3, 3]]
    assert len(marks) == 1
    assert [t.get_text() for t in ax.texts] == ["prediction diverged\nat step 3"]
    with pytest.raises(FileExistsError):
        figure(tmp_path / "f.png", pred, run, overwrite=False)
    # both at one step: one label (a fresh user saw the two printed on top of each other)
    run.diverged_at = 3
    figure(tmp_path / "g.png", pred, run, overwrite=False)
    assert [t.get_text() for t in figs[-1].axes[0].texts] == [
        "prediction and real run diverged\nat step 3"]
    run.diverged_at = 4
    figure(tmp_path / "h.png", pred, run, overwrite=False)
    assert [t.get_text() for t in figs[-1].axes[0].texts] == [
        "prediction diverged\nat step 3", "real run diverged\nat step 4"]
    # a real run's diverged_at is where its final rise began; it trains on, rising, until a
    # value is non-finite and is held from there: drawn to its last finite value (a fresh
    # user's run, 2.1 → 4.7e7 at step 4, was drawn to step 1 only), marked at step 1
    run.loss = np.array([2.12, 7.21, 13.6, 4.67e7, 4.67e7, 4.67e7])
    run.diverged_at = 1
    figure(tmp_path / "r.png", pred, run, overwrite=False)
    loss_ax = figs[-1].axes[0]
    real_line = [ln for ln in loss_ax.get_lines() if ln.get_label() == "real fine-tuning"]
    assert list(real_line[0].get_xdata()) == [0, 1, 2, 3]  # the held tail (step 4 on) cut
    assert [t.get_text() for t in loss_ax.texts] == [
        "real run diverged\nat step 1", "prediction diverged\nat step 3"]
    assert loss_ax.get_ylim()[1] < 20.0  # spans the curves before the divergence
    # a real spike above 10·L_0 that recovered: marked at its step, and the loss axis is not
    # flattened by it (the figure marked only the diverged flag, so a 1e7·L_0 spike squeezed
    # the rest of both curves onto the x axis); the error axis keeps its full range
    pred.diverged_at = None
    pred.loss = np.linspace(2.0, 1.0, 6)
    run.loss, run.diverged_at, run.spiked_at = np.array([2.0, 3.0, 4e7, 1.9, 1.4, 1.1]), None, 2
    figure(tmp_path / "s.png", pred, run, overwrite=False)
    loss_ax, error_ax = figs[-1].axes
    assert 2.0 < loss_ax.get_ylim()[1] < 20.0  # below 10·L_0: 3.0 and the rest on the chart
    assert error_ax.get_ylim()[1] >= 0.5
    for ax in (loss_ax, error_ax):
        assert [t.get_text() for t in ax.texts] == [
            "real run spiked above 10·L_0\nat step 2, recovered"]
        assert len([ln for ln in ax.get_lines() if list(ln.get_xdata()) == [2, 2]]) == 1


def start_program(args, cwd, before=""):
    """``ntk-tt ARGS`` as the console script runs it, in ``cwd``, with Ctrl-C as in a terminal
    (even when this test runs with SIGINT ignored, e.g. in the background); ``before``: code
    run first (patches)."""
    code = ("import signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
            f"{before}sys.argv = ['ntk-tt', *{args!r}]\nfrom ntk_tt.cli import main\n"
            "sys.exit(main())")
    return subprocess.Popen([sys.executable, "-c", code], cwd=cwd,
                            env=os.environ | {"PYTHONPATH": ROOT}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for(proc, ready, seconds=240):
    deadline = time.monotonic() + seconds
    while not ready() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ready(), proc.communicate()


def status(js):
    try:
        return json.loads(js.read_text())["status"]
    except (OSError, ValueError):  # not there, or being replaced
        return None


STOPPED = {signal.SIGINT: "ntk-tt: interrupted", signal.SIGTERM: "ntk-tt: terminated (SIGTERM)"}
# ``before`` code of start_program: the tiny task of ``_cli_tiny`` in place of load_task
TINY = (f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import _cli_tiny, ntk_tt.prediction._job as j\n"
        "j.load_task = lambda **_: _cli_tiny.tiny_task()\n")


def test_sigint_during_verify_is_one_line_130_and_keeps_the_prediction(tmp_path):
    """On the tiny task of ``_cli_tiny`` (the shipped checkpoint's compilations cost most of
    this test's time): 10,000 real steps take seconds, the Ctrl-C comes 0.5 s in."""
    js = tmp_path / "r.json"
    proc = start_program(["predict", "--verify", "--no-progress", "-T", "10000", "--json",
                          str(js), "--figure", ""], tmp_path, TINY)
    wait_for(proc, lambda: status(js) == RUNNING)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err == f"ntk-tt: interrupted (the prediction is kept in {js})\n", err
    assert out == ""  # the JSON keeps the prediction: not printed as well
    r = json.loads(js.read_text())
    assert r["status"] == INTERRUPTED == "interrupted during the real fine-tuning"
    assert r["real"] is None and set(r["predicted"]["training_time"]) == {"loss", "error"}
    assert len(r["curves"]["predicted"]["loss"]) == 10001


@pytest.mark.parametrize("sig,moment", [(signal.SIGINT, "start"), (signal.SIGTERM, "start"),
                                        (signal.SIGINT, "imports"),
                                        (signal.SIGTERM, "json claimed")])
def test_a_signal_before_a_result_is_one_line_and_leaves_no_report(sig, moment, tmp_path):
    """Ctrl-C or SIGTERM as soon as the parser is built (the commands' modules still to
    import), 0.5 s later (JAX importing), or once the --json report is claimed (the job
    loading and predicting): one line, exit status 130 / 143, no traceback, and no report (it
    holds no result). The default figure an earlier run left is untouched."""
    js = tmp_path / "r.json"
    before = ("import pathlib, ntk_tt._cli_parser as c\nparser = c._parser\n"
              "def started():\n    pathlib.Path('started').touch()\n    return parser()\n"
              "c._parser = started\n")
    proc = start_program(["predict", "--verify", "--no-progress", "-K", "2", "-n", "4",
                          "--json", str(js)], tmp_path, before)
    wait_for(proc, (tmp_path / "started").exists)
    if moment == "imports":
        time.sleep(0.5)
    elif moment == "json claimed":
        wait_for(proc, js.exists)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig and (out, err) == ("", f"{STOPPED[sig]}\n"), err
    assert not js.exists() and (tmp_path / DEFAULT_FIGURE).read_bytes() == STALE
    assert not list(tmp_path.glob(".r.json.*"))  # nor its temporary file


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_program_starts_is_one_line(sig, tmp_path):
    """Ctrl-C or SIGTERM 0.05–0.6 s after the interpreter is up, while ``main`` imports numpy
    and the parser (before issue 25's fix ``ntk_tt.cli`` imported numpy when the console
    script imported it, before ``main`` could install the handler: a KeyboardInterrupt
    traceback): one line and exit status 130 / 143, whenever it lands. The delays count
    from a file the child writes just before it imports ``ntk_tt.cli``, whose import (the
    standard library only, about 15 ms) is all that runs before the handler."""
    code = "import sys, ntk_tt.cli\nprint(sorted({'numpy', 'jax'} & set(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env=os.environ | {"PYTHONPATH": ROOT})
    assert proc.stdout == "[]\n", proc.stderr
    for delay in (0.05, 0.15, 0.3, 0.6):
        (tmp_path / "up").unlink(missing_ok=True)
        proc = start_program(["predict", "--no-progress", "-K", "2", "-n", "4", "--figure", ""],
                             tmp_path, "import pathlib\npathlib.Path('up').touch()\n")
        wait_for(proc, (tmp_path / "up").exists)
        time.sleep(delay)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + sig and (out, err) == ("", f"{STOPPED[sig]}\n"), \
            (delay, proc.returncode, err)


def test_sigterm_while_the_main_thread_goes_on_marks_the_report_interrupted(tmp_path):
    """SIGTERM (what batch schedulers send) while the main thread does not end (here it
    drops the KeyboardInterrupt, as Python drops one raised in a ``__del__`` or
    garbage-collection callback; a long XLA compilation runs no handler at all): the
    watcher ends the program after GRACE_S with one line and status 143, and the report
    that said the fine-tuning is running says it was interrupted, not "running" for a
    dead process."""
    from ntk_tt.cli import GRACE_S

    js = tmp_path / "r.json"
    # every KeyboardInterrupt is dropped, also one that lands while the report is written
    # (the test sees "running" as soon as it is on disk, and may signal at once)
    before = ("import time, ntk_tt.prediction._job as j\n"
              "def work(o, verify, json_file, progress, on_prediction=None):\n"
              "    written = False\n"
              "    while True:\n"
              "        try:\n"
              "            if not written:\n"
              "                j._write_json(json_file, {'status': j.RUNNING, "
              "'predicted': 'kept'}, create=False)\n"
              "                written = True\n"
              "            time.sleep(1)\n"
              "        except KeyboardInterrupt:\n            pass\n"
              "j._work = work\n")
    proc = start_program(["predict", "--verify", "--no-progress", "--json", str(js)],
                         tmp_path, before)
    wait_for(proc, lambda: status(js) == RUNNING)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert GRACE_S <= time.monotonic() - t0 < GRACE_S + 30
    assert proc.returncode == 143, err
    assert err == f"ntk-tt: terminated (SIGTERM) (the prediction is kept in {js})\n", err
    assert json.loads(js.read_text()) == {"status": INTERRUPTED, "predicted": "kept"}


# the tiny task's options of the interruption tests below: 10,000 real steps take seconds
TINY_ARGS = ["-T", "10000", "--loss-target", "0.5", "--figure", ""]


def predicted_rows(text):
    """The predicted columns of ``ntk-tt predict``'s T_ε and steps-to-target rows: curve, ε,
    predicted T_ε, 90 % interval ("loss ≤ 0.5 1875" for a target)."""
    return [ln.split()[:4] for ln in text.splitlines() if ln.startswith(("loss ", "error "))]


@pytest.fixture(scope="module")
def tiny_prediction(tmp_path_factory):
    """The predicted rows of an uninterrupted ``ntk-tt predict`` of the tiny task with
    TINY_ARGS (no --verify: the prediction is the same)."""
    proc = start_program(["predict", "--no-progress", *TINY_ARGS],
                         tmp_path_factory.mktemp("reference"), TINY)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    rows = predicted_rows(out)
    assert len(rows) == 7 and rows[-1][:3] == ["loss", "≤", "0.5"], out
    return rows


def watch_stderr(proc):
    """Read ``proc``'s stderr as it comes (progress bars included): returns a function that
    gives the text so far, and after ``proc`` ends all of it."""
    chunks, reader = [], None

    def read():
        while chunk := os.read(proc.stderr.fileno(), 4096):
            chunks.append(chunk)

    def text():
        if proc.poll() is not None:
            reader.join(timeout=30)
        return b"".join(chunks).decode(errors="replace")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return text


def assert_prediction_printed(out, rows, line):
    """stdout holds the prediction's table (the predicted rows of an uninterrupted run, no
    wall-clock or real column) and ``line`` saying it is the prediction only."""
    assert predicted_rows(out) == rows, out
    head = next(ln for ln in out.splitlines() if ln.startswith("curve"))
    assert head.split() == ["curve", "ε", "predicted", "T_ε", "90", "%", "interval"], out
    assert "wall-clock" not in head and "real" not in head
    assert out.startswith("task: tiny, classes a, b, c;"), out
    assert f"\n{line}: the table above is the prediction only (" in out, out
    assert out.endswith("\ndiverged: predicted False\n"), out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_the_fine_tuning_prints_the_prediction(sig, tiny_prediction,
                                                               tmp_path):
    """A fresh user's finding: Ctrl-C (or SIGTERM) during the real fine-tuning of
    ``predict --verify`` without --json printed only ``ntk-tt: interrupted``, and the
    prediction (a minute of work on the shipped checkpoint) was lost. Now the prediction's
    table comes first on stdout, then the one line on stderr, and the exit status is
    130 / 143. The signal comes as soon as the progress bar says the fine-tuning started."""
    proc = start_program(["predict", "--verify", *TINY_ARGS], tmp_path, TINY)
    err = watch_stderr(proc)
    wait_for(proc, lambda: "fine-tuning for real (10000 steps)" in err())
    proc.send_signal(sig)
    proc.wait(timeout=120)
    out, err = proc.stdout.read(), err()
    assert proc.returncode == 128 + sig, err
    assert_prediction_printed(out, tiny_prediction, "real fine-tuning interrupted before it "
                                                    "ended")
    assert "no real T_ε or comparison" in out
    # the progress bars' text (cleared where it is a terminal), then the one line
    assert err.endswith(f"{STOPPED[sig]}\n") and err.count("ntk-tt:") == 1, err
    assert "Traceback" not in err and not list(tmp_path.glob("*.json"))


def test_the_watcher_prints_the_prediction_when_the_main_thread_goes_on(tiny_prediction,
                                                                        tmp_path):
    """SIGTERM during a fine-tuning that does not end (here it drops every
    KeyboardInterrupt, as a long XLA compilation runs no handler): the watcher ends the
    program after GRACE_S, printing the prediction first (formatted when the prediction
    existed, not in the watcher)."""
    from ntk_tt.cli import GRACE_S

    # the file is touched inside the try, so the signal cannot land before the loop drops it
    drop = ("import pathlib, time\n"
            "def finetune(*_, **__):\n"
            "    while True:\n"
            "        try:\n"
            "            pathlib.Path('fine-tuning').touch()\n"
            "            time.sleep(1)\n"
            "        except KeyboardInterrupt:\n            pass\n"
            "j.finetune = finetune\n")
    proc = start_program(["predict", "--verify", "--no-progress", *TINY_ARGS], tmp_path,
                         TINY + drop)
    wait_for(proc, (tmp_path / "fine-tuning").exists)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert GRACE_S <= time.monotonic() - t0 < GRACE_S + 30
    assert proc.returncode == 143 and err == "ntk-tt: terminated (SIGTERM)\n", err
    assert_prediction_printed(out, tiny_prediction, "real fine-tuning interrupted before it "
                                                    "ended")


def test_an_interrupt_while_real_steps_are_timed_prints_the_prediction(tiny_prediction,
                                                                       tmp_path):
    """Without --verify the prediction exists while a few real steps are timed (their
    compilation takes seconds on the shipped checkpoint); the --json report, written only at
    the end, holds no result then and is removed, so Ctrl-C there prints the prediction."""
    js = tmp_path / "r.json"
    slow = ("import pathlib, time\n"
            "def step_time(*_, **__):\n"
            "    pathlib.Path('timing').touch()\n"
            "    time.sleep(600)\n"
            "j.step_time = step_time\n")
    proc = start_program(["predict", "--no-progress", "--json", str(js), *TINY_ARGS],
                         tmp_path, TINY + slow)
    wait_for(proc, (tmp_path / "timing").exists)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err == "ntk-tt: interrupted\n", err
    assert_prediction_printed(out, tiny_prediction,
                              "interrupted while a few real training steps were timed")
    assert "no real T_ε" not in out and not js.exists()


def test_an_error_in_the_fine_tuning_prints_the_prediction_first(tiny_prediction, tmp_path):
    """A ValueError after the prediction (here from the fine-tuning) without --json used to
    print only the error line: the prediction is printed first, then the one error line."""
    failing = ("def finetune(*_, **__):\n"
               "    raise ValueError('the fine-tuning failed on purpose.')\n"
               "j.finetune = finetune\n")
    proc = start_program(["predict", "--verify", "--no-progress", *TINY_ARGS], tmp_path,
                         TINY + failing)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 2, err
    assert err == "ntk-tt: error: the fine-tuning failed on purpose.\n", err
    assert_prediction_printed(out, tiny_prediction,
                              "real fine-tuning not done (failed after the prediction)")


@pytest.mark.parametrize("verify", [True, False])
def test_the_prediction_alone_has_no_wall_clock_column_and_says_why(verify):
    """The report ``predict_task`` gives ``on_prediction`` (``real`` None, no wall-clock time
    yet, as the --verify JSON holds while the fine-tuning runs) renders whole."""
    from ntk_tt.prediction._job import TIMING

    r = fake_report(verify=False, pred_diverged=False, real_diverged=False)
    r["config"]["verify"], r["status"] = verify, RUNNING if verify else TIMING
    r["predicted"] |= {"wall_clock": None, "target_wall_clock": None,
                       "steps_to_target": {"loss": {"0.5": 3.0}},
                       "steps_to_target_reasons": {"loss": {}}}
    text = format_report(r)
    assert "pred. wall-clock" not in text
    assert not [ln for ln in text.splitlines() if ln.startswith(("loss ", "error "))
                and " s" in ln], text
    assert "loss ≤ 0.5 " in text and [ln.split() for ln in text.splitlines()
                                      if ln.startswith("loss ≤")] == [["loss", "≤", "0.5", "3"]]
    what = ("real fine-tuning not done" if verify else "real training steps not timed yet")
    assert f"{what} ({r['status']}): the table above is the prediction only (" in text
    assert ("no real T_ε or comparison" in text) == verify
    stopped = format_report(r, interrupted=True)
    assert (("real fine-tuning interrupted before it ended: " if verify else
             "interrupted while a few real training steps were timed: ") in stopped)
    assert text.splitlines()[-1] == "diverged: predicted False"


def test_a_second_run_with_the_same_json_refuses_before_its_work(tmp_path, capsys,
                                                                monkeypatch):
    """While a run works, its --json report exists (claimed when the work starts): a second
    run given the same path ends with one line and status 2 before any work, instead of
    refusing after all of it. A run that ends before a result removes its claim."""
    from ntk_tt.prediction._report_file import STARTED

    js, seen = tmp_path / "r.json", []

    def load_task(**_):  # the first run, at work; a second one starts meanwhile
        if seen:
            raise AssertionError("the second run started its work")
        seen.append(status(js))
        with pytest.raises(SystemExit) as second:
            run_cli(["--json", str(js)], capsys)
        seen.append((second.value.code, capsys.readouterr().err))
        raise ValueError("the first run stops here.")

    monkeypatch.setattr("ntk_tt.prediction._job.load_task", load_task)
    with pytest.raises(SystemExit) as first:
        run_cli(["--json", str(js)], capsys)
    assert seen[0] == STARTED
    code, err = seen[1]
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"ntk-tt: error: json path {str(js)!r} exists"), err
    assert first.value.code == 2 and capsys.readouterr().err == (
        "ntk-tt: error: the first run stops here.\n")
    assert not js.exists()


def test_a_figure_created_meanwhile_is_kept_and_this_run_s_goes_beside_it(tmp_path, capsys,
                                                                         monkeypatch):
    """An explicit --figure that another run wrote while this one worked is not replaced,
    and this run's result is not thrown away: its figure is f.1.png, and it says so (the
    work is a stand-in returning a finished report; the figure is drawn for real)."""
    from ntk_tt.prediction import _job

    png, js = tmp_path / "f.png", tmp_path / "r.json"
    curve = SimpleNamespace(loss=np.linspace(2, 1, 5), error=np.linspace(0.8, 0.5, 5),
                            loss_band=None, error_band=None, diverged_at=None,
                            training_time={"loss": {0.1: 3.0}, "error": {0.1: 3.0}})

    def work(*_):  # another run writes f.png meanwhile
        png.write_text("the other run's figure")
        report = fake_report(verify=False, pred_diverged=False, real_diverged=False)
        return report, curve, None, report["task"]

    monkeypatch.setattr(_job, "_work", work)
    code, out = run_cli(["--json", str(js), "--figure", str(png)], capsys)
    assert code == 0 and png.read_text() == "the other run's figure"
    kept = tmp_path / "f.1.png"
    assert kept.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(js.read_text())["figure"] == str(kept)
    assert f"figure: {kept} ({png} was created by another run meanwhile and is kept)" in out.out


def test_table_prints_the_90_percent_interval():
    r = fake_report(verify=True, pred_diverged=False, real_diverged=False)
    r["predicted"]["interval_90"] = {"loss": {"0.01": None, "0.1": [4.2, 7.7], "0.4": [3.0, None]},
                                     "error": {e: None for e in ("0.01", "0.1", "0.4")}}
    lines = format_report(r).splitlines()
    head = next(ln for ln in lines if ln.startswith("curve"))
    assert "90 % interval" in head
    rows = {tuple(ln.split()[:2]): ln for ln in lines
            if ln.startswith(("loss ", "error ")) and not ln.startswith("loss curves")}
    assert len(rows) == 6
    assert rows["loss", "0.1"].split()[3] == "4–8"  # widened outwards to whole steps
    assert rows["loss", "0.4"].split()[3] == "3–∞"
    assert all(row.split()[3] == "n/a" for k, row in rows.items()
               if k not in (("loss", "0.1"), ("loss", "0.4")))


def test_interrupt_during_an_import_is_an_interruption_too(tmp_path):
    """Ctrl-C while numpy / JAX import reaches the CLI as an ImportError caused by the
    KeyboardInterrupt (numpy re-raises it): still one line and exit status 130. Here the
    command's first ``import jax`` raises it (an import hook), so JAX is never loaded."""
    code = ("import sys, ntk_tt.cli as c\n"
            "class Interrupted:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'jax':\n"
            "            try:\n                raise KeyboardInterrupt\n"
            "            except KeyboardInterrupt as e:\n"
            "                raise ImportError('numpy failed') from e\n"
            "assert 'jax' not in sys.modules, 'ntk_tt.cli imported jax'\n"
            "sys.meta_path.insert(0, Interrupted())\n"
            "c.main(['predict', '--figure', ''])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=os.environ | {"PYTHONPATH": ROOT})
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == "ntk-tt: interrupted\n"


NORMAL = "[1.1754944e-38, 3.4028235e+38] (float32's normal range)"  # --lr-min, --lr-max
BEFORE_JAX = [
    (["predict", "--lr", "-1"], "learning_rate (--lr) must be a finite number > 0"),
    (["predict", "-K", "1"], "num_classes (K) must be >= 2"),
    (["predict", "-n", "0"], "per_class (n) must be >= 1"),
    (["predict", "--seed", str(2**32)], "seed (--seed) must be an integer in [0, 2**32) "
                                        "(jax.random.key keeps 32 bits: 2**32 would draw"),
    (["suggest", "--seed", "-1"], "seed (--seed) must be an integer in [0, 2**32)"),
    (["suggest", "-B", "N", "--num-paths", "4"], "num_paths (--num-paths) averages SGD batch "
                                                 "orders and the batch sizes searched are "
                                                 "full-batch GD only (-B N, N = 750): add a"),
    (["suggest", "-K", "2", "-n", "10", "-B", "20", "--num-paths", "4"],  # B = N as a number
     "full-batch GD only (-B N, N = 20)"),
    (["suggest", "--optimizer", "adamw", "--num-paths", "4"], "(-B N, N = 750): give a -B < N"),
    (["predict", "-T", "0"], "steps (-T) must be an integer >= 1"),
    (["predict", "--dataset", "TMP/missing.npz"], "dataset file not found: 'TMP/missing.npz'"),
    (["predict", "--dataset", "TMP"], "dataset 'TMP' is a folder; pass the .npz file in it."),
    (["predict", "--dataset", "cifar10", "--data-dir", "TMP/nope"],
     "data_dir (--data-dir) 'TMP/nope' is not a directory"),
    # a fresh user: --data-dir beside the vendored default set was silently ignored
    (["predict", "--data-dir", "TMP"], "data_dir (--data-dir) 'TMP' does not apply to dataset "
                                       "'flowers5': it is the vendored file"),
    (["suggest", "--data-dir", "TMP"], "drop --data-dir (it selects a prepared TFDS dataset"),
    (["predict", "--dataset", "cifar10_test", "--data-dir", "TMP"],  # read from its .npz whatever
     "data_dir (--data-dir) 'TMP' does not apply to dataset 'cifar10_test': it is the file"),
    (["predict", "--checkpoint", "TMP/nope"], "checkpoint not found"),
    (["predict", "--json", "TMP/no/r.json"], "does not exist; create it first"),
    (["predict", "--figure", "TMP/f.xyz"], "must end in a format matplotlib writes"),
    (["suggest", "-B", "N,abc"], "batch_sizes (-B/--batch-sizes) must be a comma-separated"),
    (["predict", "--split", "test"], "split (--split) 'test' does not apply to dataset "
                                     "'flowers5': it is the vendored file"),
    (["suggest", "--dataset", "cifar10_source", "--split", "test"],
     "does not apply to dataset 'cifar10_source'"),
    (["suggest", "-B", "50,-5"], "entries must be positive integers (mini-batch sizes B >= "
                                 "1) or N (full-batch GD), got -5 in '50,-5'"),
    (["predict", "-B", "-5"], "batch_size (-B) must be an integer >= 1, got -5; omit it"),
    (["suggest", "-m", "0,1"], "momenta (-m/--momenta) entries must be in [0, 1)"),
    (["suggest", "--target", "2"], "target (--target) with --target-kind fraction must be in"),
    (["suggest", "--dataset", "TMP/missing.npz"], "dataset file not found"),
    (["suggest", "--checkpoint", "TMP/nope"], "is not a directory written by"),
    (["outcome", "TMP/runs.jsonl"], "runs file 'TMP/runs.jsonl' does not exist"),
    (["outcome", "TMP"], "runs file 'TMP' is a directory: give the JSON Lines file"),
    (["outcome", "TMP", "--fraction", "2"], "--fraction must be in [0, 1], got 2.0"),
    # a fresh user: --lr-max 1e300 printed numpy's "overflow encountered in cast" and searched
    # a grid up to float32 inf; every float option without a bound of its own stops at
    # float32's largest
    (["suggest", "--optimizer", "adamw", "--lr-max", "1e300"],
     f"lr_max (--lr-max) must be in {NORMAL}, got 1e+300."),
    (["suggest", "--optimizer", "sgd", "--lr-min", "1", "--lr-max", "1e39"],
     f"lr_max (--lr-max) must be in {NORMAL}, got 1e+39."),
    (["suggest", "--optimizer", "adamw", "--weight-decay", "1e300"],
     "weight_decay (--weight-decay) must be in [0, 3.4028235e+38] (float32's largest)"),
    (["suggest", "--kappa-max", "1e39"], "kappa_min, kappa_max (--kappa-min, --kappa-max) must "
                                         "satisfy 0 < min <= max <= 3.4028235e+38 (float32's"),
    (["suggest", "--target", "1e300", "--target-kind", "absolute"],
     "must be finite and > 0 (at most 3.4028235e+38, float32's largest), got 1e+300"),
    (["predict", "--lr", "1e300"], "learning_rate (--lr) must be a finite number > 0 (in "
                                   "[1.1754944e-38, 3.4028235e+38], float32's normal range), "
                                   "got 1e+300."),
    # a second fresh user: 1e-50 is 0 in float32: the run went on to "η 0", κ nan and
    # T_ε undefined "under jit / vmap"
    (["predict", "--lr", "1e-50"], "learning_rate (--lr) must be a finite number > 0 (in "
                                   "[1.1754944e-38, 3.4028235e+38], float32's normal range), "
                                   "got 1e-50."),
    (["predict", "--optimizer", "adam", "--adam-eps", "1e-50"],
     "adam_eps (--adam-eps) must be a finite number > 0 (in [1.1754944e-38, 3.4028235e+38]"),
    (["predict", "--optimizer", "adamw", "--weight-decay", "1e39"],
     "weight_decay (--weight-decay) must be a finite number >= 0 (at most 3.4028235e+38, "
     "float32's largest), got 1e+39."),
    (["predict", "--optimizer", "adam", "--adam-eps", "1e39"],
     "adam_eps (--adam-eps) must be a finite number > 0 (in [1.1754944e-38, 3.4028235e+38], "
     "float32's"),
    (["predict", "--loss-target", "0.5,1e300"], "loss_targets (--loss-target) entries must "
     "each be a mean training loss L* > 0 (at most 3.4028235e+38, float32's largest), got 1e+300"),
    # the same user: a negative number in e-notation was taken for a flag (the usage block and
    # "argument --lr-min: expected one argument"), while -0.0001 reached the range check
    (["suggest", "--optimizer", "adamw", "--lr-min", "-1e-3"],
     f"lr_min (--lr-min) must be in {NORMAL}, got -0.001."),
    # a third: NaN was told "[0, ...]" and 0 then "0 < min"; and the default a given bound
    # was compared with went unnamed
    (["suggest", "--optimizer", "adamw", "--lr-min", "0"],
     f"lr_min (--lr-min) must be in {NORMAL}, got 0.0."),
    # a fourth: 1e-50 (0 in float32) passed this check and was refused after 32 s of work
    (["suggest", "--optimizer", "adamw", "--lr-min", "1e-50"],
     f"lr_min (--lr-min) must be in {NORMAL}, got 1e-50."),
    (["suggest", "--optimizer", "adamw", "--lr-min", "0.5"],
     "must satisfy 0 < min <= max (min == max exactly when --num-kappas is 1), got 0.5, 0.1 "
     "(AdamW's default --lr-max) with num_kappas 16."),
    (["suggest", "--optimizer", "adamw", "--weight-decay", "-1e-4"],
     "weight_decay (--weight-decay) must be in [0, 3.4028235e+38] (float32's largest), got "
     "-0.0001"),
    (["suggest", "--kappa-min", "-1E-3"], "(--kappa-min, --kappa-max) must satisfy 0 < min"),
    (["suggest", "-m", "-1e-1,0.5"], "momenta (-m/--momenta) entries must be in [0, 1)"),
    (["suggest", "--optimizer", "adamw", "--warmups", "-5e-2,0.1"],
     "warmups (--warmups) entries must be fractions of the step budget in [0, 1), got -0.05."),
    (["predict", "--schedule", "warmup-cosine", "--end-lr", "-1e-3"],
     "end_lr (--end-lr) must be a finite number in [0, --lr = 0.002], got -0.001."),
    (["predict", "--lr", "-2.5e-3"], "learning_rate (--lr) must be a finite number > 0"),
    (["predict", "--optimizer", "adamw", "--b1", "-1e-1"], "b1 (--b1) must be a finite number "
                                                          "in [0, 1) and at most 0.99999994 "
                                                          "(float32's largest number below 1), "
                                                          "got -0.1."),
    (["outcome", "TMP", "--fraction", "-1e-3"], "--fraction must be in [0, 1], got -0.001."),
    # and --warmups 0.1,0.1 was kept once, silently, where -m 0.5,0.5 and -B N,N are refused
    (["suggest", "--optimizer", "adamw", "--warmups", "0.1,0.1"],
     "warmups (--warmups) [0.1, 0.1] names 0.1 twice; give each once."),
    # a list flag given twice kept only its last list (-B 10 -B 10 ran B = 10 alone): now the
    # flags add up, as a comma does, so the repeat is seen
    (["suggest", "-B", "10", "-B", "N,10"], "(10, N, 10) names a batch size twice; give each"),
    (["suggest", "-B", "N", "-B", "750"], "(N, 750) names a batch size twice (None, N and 750 "
                                          "all name full-batch GD here); give each once."),
    # a fresh user: "(50, N, N) ... (None and N = 750 ...)" named a None they never typed
    (["suggest", "-B", "50,N,n"], "(50, N, N) names a batch size twice (None, N and 750 all "
                                  "name full-batch GD here)"),
    (["suggest", "-m", "0.9", "-m", "0,0.9"], "[0.9, 0.0, 0.9] names 0.9 twice"),
    (["suggest", "--optimizer", "adamw", "--warmups", "0", "--warmups", "0.2,0"],
     "warmups (--warmups) [0.0, 0.2, 0.0] names 0.0 twice; give each once."),
]


def test_bad_option_values_fail_before_jax_is_imported(tmp_path):
    """Option values that plain Python can check (ranges, comma lists, paths that must exist,
    output paths) end the CLI with one line and status 2 before JAX is imported: one fresh
    interpreter runs every case and reports, after each, whether ``jax`` was imported."""
    cases = [[a.replace("TMP", str(tmp_path)) for a in args] for args, _ in BEFORE_JAX]
    results, lines, stderr = cli_before_jax(cases, tmp_path)
    assert len(lines) == len(BEFORE_JAX), stderr  # one line per case, nothing else
    for (args, match), (status, jax_imported), line in zip(BEFORE_JAX, results, lines,
                                                           strict=True):
        assert status == 2, (args, status)
        assert line.startswith("ntk-tt: error: "), (args, line)
        assert match.replace("TMP", str(tmp_path)) in line, (args, line)
        assert jax_imported is False, args


@pytest.mark.parametrize("args, parsed", [
    (["suggest", "--lr-min", "-1e-3"], {"lr_min": -1e-3}),
    (["suggest", "--weight-decay", "-1E+2", "-n", "3"], {"weight_decay": -100.0, "per_class": 3}),
    (["suggest", "--kappa-max", "-.5e1"], {"kappa_max": -5.0}),
    (["suggest", "-m", "-1e-1,0.5", "-K", "4"], {"momenta": ["-1e-1,0.5"], "num_classes": 4}),
    (["suggest", "-B", "-5,N"], {"batch_sizes": ["-5,N"]}),
    (["predict", "--end-lr", "-1e-3", "-T", "7"], {"end_lr": -1e-3, "steps": 7}),
    (["predict", "--lr", "-inf"], {"learning_rate": -float("inf")}),
    (["predict", "--loss-target", "-inf,0.5"], {"loss_targets": ["-inf,0.5"]}),
    (["outcome", "runs.jsonl", "--fraction", "-2e-1"], {"fraction": -0.2}),
])
def test_a_negative_number_in_any_form_is_a_value_not_a_flag(args, parsed):
    """argparse reads only plain decimals (-0.001) as negative numbers: -1e-3 was taken for a
    flag, and the command ended on "expected one argument" with its usage block. Every
    subcommand's parser now takes any number (and a comma list starting with one) as a value,
    and the short flags given beside it are still flags."""
    from ntk_tt._cli_parser import parse

    args_, _ = parse(args)
    assert {k: getattr(args_, k) for k in parsed} == parsed


def test_split_is_refused_where_it_would_be_ignored_only(tmp_path):
    """--split selects a TFDS split: for a short name or an .npz file (one fixed set, read
    whatever the split) a split other than "train" is refused, for a TFDS name it is kept."""
    from ntk_tt._options import check_suggest_job
    from ntk_tt._options_predict import check_predict_job

    path = tmp_path / "set.npz"
    fake_npz(tmp_path, "set.npz", np.zeros((10, 8, 8, 3), np.uint8))
    for name in ("flowers5", "notmnist", str(path)):
        for check in (check_predict_job, check_suggest_job):
            with pytest.raises(ValueError, match=r"split \(--split\) 'test' does not apply"):
                check({"dataset": name, "split": "test"})
            assert check({"dataset": name, "split": "train"})["split"] == "train"
    assert check_predict_job({"dataset": "cifar10", "split": "test"})["split"] == "test"
    with pytest.raises(ValueError, match="split .--split. must be the name of a TFDS split"):
        check_predict_job({"dataset": "cifar10", "split": ""})


def test_bad_option_value_of_the_program_is_one_line_with_status_2(tmp_path):
    """The program itself (``python -m ntk_tt.cli``): a bad value, status 2, one line."""
    for args, match in (["predict", "-m", "1.5"], "momentum (-m) must be in [0, 1)"), \
            (["suggest", "--num-kappas", "0"], "num_kappas (--num-kappas) must be an integer"):
        proc = subprocess.run([sys.executable, "-m", "ntk_tt.cli", *args], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path,
                              env=os.environ | {"PYTHONPATH": ROOT})
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("ntk-tt: error: ")
        assert match in proc.stderr and proc.stdout == "", proc.stderr


def test_outcome_json_that_cannot_be_written_is_one_line_before_the_runs_are_read(tmp_path,
                                                                                  capsys):
    """A fresh user's probe: ``ntk-tt outcome --json`` to a path it cannot create printed the
    predictions and then a PermissionError traceback; it now makes predict's checks first
    (the runs file here is not even valid JSON, so reading it would fail differently)."""
    runs = tmp_path / "runs.jsonl"
    runs.write_text("not json\n")
    (tmp_path / "taken").write_text("")
    for path, message in ((tmp_path / "taken" / "x.json", "is a file, not a folder"),
                          (tmp_path / "no" / "x.json", "does not exist"),
                          (tmp_path, "is a directory"), (tmp_path / "taken", "exists")):
        with pytest.raises(SystemExit) as stop:
            main(["outcome", str(runs), "--json", str(path)])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.startswith("ntk-tt: error: json path ") \
            and message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("argv,flag", [(["predict", "--warm", "5"], "--warm"),
                                       (["suggest", "--optimizer", "adamw", "--warmup", "5"],
                                        "--warmup"),
                                       (["predict", "--weight", "0.1"], "--weight")])
def test_shortened_flags_are_not_guessed(argv, flag, capsys):
    """A fresh user's probe: argparse took ``--warm`` for ``--warmup`` and ``suggest
    --warmup 5`` for ``--warmups 5`` (then a confusing message); only whole flags count."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and f"unrecognized arguments: {flag}" in err, err


@pytest.mark.parametrize("argv,usage,meant", [
    (["predict", "--opt", "adamw"], "usage: ntk-tt predict [-h]", "--optimizer"),
    (["suggest", "--opt", "adamw"], "usage: ntk-tt suggest [-h]", "--optimizer"),
    (["outcome", "runs.jsonl", "--upd", "3"], "usage: ntk-tt outcome [-h]", "--updates"),
])
def test_an_unknown_flag_is_the_command_s_error_with_the_flag_meant(argv, usage, meant,
                                                                    capsys):
    """A fresh user's probe: ``ntk-tt predict --opt adamw`` (abbreviations are refused on
    purpose) printed the top-level usage; it is the command's, as its other argparse
    errors, and names the flag meant. Nothing is read or loaded (no work)."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    command = argv[0]
    assert stop.value.code == 2 and err.startswith(usage), err
    assert "{predict,suggest,outcome}" not in err
    assert err.splitlines()[-1] == (f"ntk-tt {command}: error: unrecognized arguments: "
                                    f"{' '.join(argv[-2:])} (did you mean {meant}?)")


@pytest.mark.parametrize("argv,said", [
    (["suggest", "--method", "closed-form"], "--method is an option of predict, not of suggest"),
    (["predict", "--lr-min", "0.1"], "--lr-min is an option of suggest, not of predict"),
    (["outcome", "runs.jsonl", "--top", "3"], "--top is an option of suggest, not of outcome"),
])
def test_another_command_s_flag_is_named_as_that_command_s(argv, said, capsys):
    """A fresh user: ``ntk-tt suggest --method closed-form`` was told "did you mean --top?";
    a flag of another command now says whose it is."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err.splitlines()[-1]
    assert stop.value.code == 2 and err == (f"ntk-tt {argv[0]}: error: unrecognized arguments: "
                                            f"{' '.join(argv[-2:])} ({said})"), err


def test_settle_on_a_read_only_folder_is_no_second_error(tmp_path, monkeypatch):
    """settle() removed this process's temporary file outside its try: on a folder turned
    read-only mid-run the unlink's OSError came on top of the write's one-line error."""
    from ntk_tt.prediction import _report_file

    path = tmp_path / "r.json"
    path.write_text(json.dumps({"status": _report_file.STARTED}))

    def read_only(self, missing_ok=False):
        raise OSError(30, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "unlink", read_only)
    assert _report_file.settle(path) is False


def test_a_diverged_run_with_weight_decay_is_told_to_lower_it_too():
    """A fresh user: --weight-decay 1e10 diverged at step 1 and was told to lower --lr only."""
    from ntk_tt._cli_report import format_report

    r = fake_report(verify=True, pred_diverged=True, real_diverged=True)
    def said(report):
        return [ln for ln in format_report(report).splitlines()
                if ln.split(" diverged at step")[0] in ("prediction", "real run")]

    assert len(said(r)) == 2 and all(ln.endswith("(lower --lr)") for ln in said(r)), said(r)
    r["optimizer"]["weight_decay"] = 1e10
    assert len(said(r)) == 2, said(r)
    assert all(ln.endswith("(lower --lr or --weight-decay)") for ln in said(r)), said(r)


def test_an_output_that_is_an_input_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    """A fresh user: --json victim.npz --overwrite replaced the dataset with the report, and
    ntk-tt outcome's --json its own runs file."""
    no_work(monkeypatch)
    fake_npz(tmp_path, "victim.npz", np.zeros((20, 32, 32, 3), np.uint8))
    victim = tmp_path / "victim.npz"
    before = victim.read_bytes()
    for flag, more in (("--json", ["--overwrite"]), ("--figure", ["--overwrite"]),
                       ("--json", [])):  # without --overwrite: not "exists ... --overwrite"
        err = one_error_line(["--dataset", str(victim), flag, str(victim), *more], capsys)
        none = " (or none: --figure '')" if flag == "--figure" else ""
        assert f"{flag[2:]} path {str(victim)!r} is the dataset this command reads; choose " \
               f"another path{none}." in err, err
    runs = tmp_path / "runs.jsonl"
    runs.write_text("{}\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["outcome", str(runs), "--json", str(runs), "--overwrite"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert f"json path {str(runs)!r} is the runs file this command reads" in err, err
    with pytest.raises(SystemExit):
        main(["outcome", str(runs), "--json", str(runs)])
    assert "is the runs file this command reads" in capsys.readouterr().err
    assert victim.read_bytes() == before and runs.read_text() == "{}\n"
    # a second fresh user: --json on the shipped predictor that --predictor ntk reads replaced
    # it (the next run failed); here the package folder is a copy, so a regression harms none
    package = tmp_path / "package"
    (package / "assets").mkdir(parents=True)
    shipped = package / "assets" / "outcome_ntk.json.gz"
    shipped.write_bytes(b"the shipped predictor")
    monkeypatch.setattr("importlib.resources.files", lambda name: package)
    for predictor in ("ntk", "auto"):
        with pytest.raises(SystemExit):
            main(["outcome", str(runs), "--predictor", predictor, "--json", str(shipped),
                  "--overwrite"])
        assert "is the shipped outcome predictor this command reads" in \
            capsys.readouterr().err
    assert shipped.read_bytes() == b"the shipped predictor"


def test_no_output_lands_in_the_shipped_assets_or_the_checkpoint_read(tmp_path, capsys,
                                                                      monkeypatch):
    """A fresh user: --json on the vendored .npz (the default dataset, named by its short
    name), on the shipped interval calibrator or on a checkpoint's meta, with --overwrite,
    replaced it and broke every later run; only a --dataset given as a path was protected.
    Now nothing is written inside the package's assets folder (here a copy, so a regression
    harms none) or inside the --checkpoint folder, by predict or suggest, before any work."""
    no_work(monkeypatch)
    assets = tmp_path / "assets"
    (assets / "data").mkdir(parents=True)
    shipped = [assets / "data" / "flowers5_32px_200pc.npz", assets / "intervals.json"]
    for f in shipped:
        f.write_bytes(b"shipped")
    monkeypatch.setattr("ntk_tt._output_paths.ASSETS", assets)
    ckpt = tmp_path / "my_ckpt"
    (ckpt / "meta").mkdir(parents=True)
    (ckpt / "meta" / "metadata").write_bytes(b"meta")
    for target in shipped:
        for command in ("predict", "suggest"):
            with pytest.raises(SystemExit) as exit_info:
                main([command, "--no-progress", "--json", str(target), "--overwrite"])
            err = capsys.readouterr().err
            assert exit_info.value.code == 2 and err.count("\n") == 1, err
            assert f"json path {str(target)!r} is inside the package's shipped assets folder" \
                in err, err
    for command, flag in (("predict", "--json"), ("predict", "--figure"), ("suggest", "--json")):
        out = ckpt / "meta" / ("metadata" if flag == "--json" else "f.png")
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--no-progress", "--checkpoint", str(ckpt), flag, str(out),
                  "--overwrite"])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2, err
        assert f"{flag[2:]} path {str(out)!r} is inside the checkpoint folder this command " \
               "reads; choose another path" in err, err
    assert [f.read_bytes() for f in shipped] == [b"shipped"] * 2
    assert (ckpt / "meta" / "metadata").read_bytes() == b"meta"
    assert not (ckpt / "meta" / "f.png").exists()

def test_python_advice_in_a_job_error_is_said_as_flags():
    """A fresh user: ntk-tt predict --head-scale 1e-30 advised ntk_tt.replace_head,
    backbone='exact' and predictor='linear'."""
    from ntk_tt._cli_commands import cli_terms

    said = ("the head (‖W_0‖_F = 1e-30) ...; initialise the head with non-zero weights of "
            "ordinary size (ntk_tt.replace_head), or use backbone='exact' (small N) or the "
            "frozen-kernel predictor (predictor='linear').")
    assert cli_terms(said) == ("the head (‖W_0‖_F = 1e-30) ...; give --head-scale nearer 1, or "
                               "use --backbone exact (small N) or the frozen-kernel predictor "
                               "(--predictor linear).")
    assert cli_terms("no suggestion: widen kappa_range (0.05, 50)") == \
        "no suggestion: widen --kappa-min/--kappa-max (0.05, 50)"
    # suggest --target 100 --target-kind absolute (above L_0), a fresh user's run
    assert cli_terms("choose a lower target (or target_kind='fraction' with a value in "
                     "(0, 1)).") == ("choose a lower target (or --target-kind fraction with a "
                                     "value in (0, 1)).")


def test_an_exact_feature_kernel_too_large_for_memory_is_one_line_in_the_cli(
        tmp_path, capsys, monkeypatch):
    """--backbone exact at the main job's N = 750 ran 15 minutes at 20 of 23 GiB without a
    word; its refusal (head_aware_kernel's NTKMemoryError, before any Jacobian) is one
    ``ntk-tt: error:`` line in the CLI's flags. A limit of 1 MB stands for the small machine."""
    monkeypatch.setenv("NTK_TT_MEMORY_LIMIT", "1e6")
    with pytest.raises(SystemExit) as ended:
        run_cli(["--dataset", grey_digits(tmp_path), "-K", "2", "-n", "3", "-T", "4",
                 "--backbone", "exact", "--figure", ""], capsys)
    err = capsys.readouterr().err.strip().splitlines()
    assert ended.value.code == 2 and len(err) == 1
    assert err[0].startswith("ntk-tt: error: --backbone exact needs the (384, 384) feature "
                             "kernel K_h and its held-out cross kernel (256, 384)")
    assert err[0].endswith("Use --backbone subspace (K_h exact on the features' k leading "
                           "directions, its measured substitute) or the default diagonal, or "
                           "fewer samples (-n).")
