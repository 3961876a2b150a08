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
