"""``ntk-tt predict``: a tiny real run end to end, JSON + figure, and one-line errors."""

import json
import os

import numpy as np
import pytest

from ntk_tt.cli import format_report, main


def run_cli(args, capsys):
    code = main(["predict", "--no-progress", *args])
    return code, capsys.readouterr()


def test_tiny_verify_run_writes_json_and_figure(tmp_path, capsys):
    js, png = tmp_path / "r.json", tmp_path / "f.png"
    code, out = run_cli(["-K", "3", "-n", "4", "--test-per-class", "2", "-T", "6", "--lr",
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
    assert len(r["curves"]["real"]["loss"]) == 7 and r["task"]["n_train"] == 12
    assert r["seconds"]["finetune"] > 0 and r["seconds"]["predict"] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "predicted T_ε" in out.out and "real T_ε" in out.out


def test_prediction_only_reports_wall_clock(tmp_path, capsys):
    js = tmp_path / "r.json"
    code, out = run_cli(["-K", "2", "-n", "3", "-T", "4", "--json", str(js), "--figure", ""],
                        capsys)
    r = json.loads(js.read_text())
    assert code == 0 and r["real"] is None and r["seconds"]["finetune"] is None
    sps = r["predicted"]["seconds_per_step"]
    for eps, t in r["predicted"]["training_time"]["loss"].items():
        wall = r["predicted"]["wall_clock"]["loss"][eps]
        assert (t is None and wall is None) or wall == pytest.approx(t * sps)
    assert "pred. wall-clock" in out.out


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

    monkeypatch.setattr("ntk_tt._job.load_task", refuse)


def one_error_line(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(args, capsys)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("ntk-tt: error:") and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("args,match", [
    (["--json", "/nonexistent/dir/out.json"], "does not exist"),
    (["--figure", "/nonexistent/dir/f.png"], "does not exist"),
    (["--figure", "out.xyz"], "must end in a format matplotlib writes"),
    (["--num-paths", "0"], "num_paths must be an integer >= 1"),
    (["--num-paths", "-3"], "num_paths must be an integer >= 1"),
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
    code, out = run_cli(["-K", "2", "-n", "3", "--test-per-class", "1000", "-T", "4", "--lr",
                         "1000", "--json", str(js), "--figure", ""], capsys)
    r = json.loads(js.read_text())
    assert code == 0 and r["predicted"]["beyond_edge"] is True
    warning = [ln for ln in out.out.splitlines() if ln.startswith("warning: κ")]
    assert len(warning) == 1 and "stability edge" in warning[0] and "lower --lr" in warning[0]
    note = [ln for ln in out.out.splitlines() if ln.startswith("note:")]
    assert len(note) == 1 and "197 held-out images per class" in note[0] and "1000" in note[0]
    assert r["task"]["test_per_class"] == 197
    assert r["predicted"]["diverged"]  # κ far beyond the edge: the prediction diverges
    assert "prediction diverged at step" in out.out and "diverged: predicted True" in out.out
    assert "(predicted: diverged)" in out.out


def test_help_names_default_figure_and_npz_format(capsys):
    with pytest.raises(SystemExit):
        main(["predict", "-h"])
    text = " ".join(capsys.readouterr().out.split())
    assert "ntk_tt_predict.png in the current directory" in text
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
])
def test_ignored_or_clamped_options_are_errors(args, match, capsys, monkeypatch):
    no_work(monkeypatch)
    assert match in one_error_line(args, capsys)


@pytest.mark.parametrize("args,match", [
    (["--lr", "-1"], "learning_rate (--lr) must be a finite number > 0"),
    (["--lr", "nan"], "learning_rate (--lr) must be a finite number > 0"),
    (["-m", "1"], "momentum (-m) must be in [0, 1)"),
    (["-B", "0"], "batch_size (-B) must be an integer >= 1"),
    (["-K", "2", "-n", "3", "-B", "7"], "more than the N = K·n = 2·3 = 6 training images"),
    (["-T", "0"], "steps (-T) must be an integer >= 1"),
    (["--head-scale", "0"], "head_scale (--head-scale) must be a finite number > 0"),
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
        "task": {"dataset": "flowers5", "classes": ["daisy", "tulip"], "n_train": 10,
                 "n_test": 4, "test_per_class": 2, "architecture": "SmallResNet",
                 "num_params": 120706},
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


def test_converged_verify_run_keeps_the_comparisons():
    text = format_report(fake_report(verify=True, pred_diverged=False, real_diverged=False))
    assert "loss curves: max |predicted − real| = 0.01 (2 % of the real fall 0.5)" in text
    assert "held-out accuracy at T: predicted 0.5, real 0.5" in text
    assert "diverged" not in text.replace("diverged: predicted False, real False", "")


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
