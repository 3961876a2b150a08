"""``ntk-tt predict``: a tiny real run end to end, JSON + figure, and one-line errors."""

import json

import numpy as np
import pytest

from ntk_tt.cli import main


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


@pytest.mark.parametrize("args,match", [
    (["--json", "/nonexistent/dir/out.json"], "does not exist"),
    (["--figure", "/nonexistent/dir/f.png"], "does not exist"),
    (["--figure", "out.xyz"], "must end in a format matplotlib writes"),
    (["--num-paths", "0"], "num_paths must be an integer >= 1"),
    (["--num-paths", "-3"], "num_paths must be an integer >= 1"),
])
def test_bad_options_fail_before_any_work(args, match, capsys, monkeypatch):
    def no_work(**_):
        raise AssertionError("work started before the options were checked")

    monkeypatch.setattr("ntk_tt._job.load_task", no_work)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(args, capsys)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert err.startswith("ntk-tt: error:") and match in err, err


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


def test_help_names_default_figure_and_npz_format(capsys):
    with pytest.raises(SystemExit):
        main(["predict", "-h"])
    text = " ".join(capsys.readouterr().out.split())
    assert "ntk_tt_predict.png in the current directory" in text
    assert ".npz file with keys images" in text
