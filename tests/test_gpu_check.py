"""experiments/gpu_check.py (issue 26 item 5) at its --tiny size on the CPU: the JSON's
structure, and its numbers against ``ntk_tt.predict`` and the model's initial loss computed
here, independently, after the script's ``main`` has run in this process (the two share
JAX's imports and the compiled programs they have in common; a subprocess paid both again).
Bad options are refused in a subprocess, before JAX is imported."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import optax
import pytest

import ntk_tt
from ntk_tt.prediction._job import load_task

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "gpu_check.py"
LR, K, PER_CLASS, STEPS, SGD_BATCH = 3e-3, 5, 4, 20, 10  # --tiny with 5 classes: N = 20


def _run(tmp_path, *args, **kwargs):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=tmp_path,
                          capture_output=True, text=True, **kwargs)


def _main(monkeypatch, *args) -> int:
    """The script's ``main(args)`` in this process (its exit status), its process-wide
    changes undone: it prepends experiments/ to sys.path (for ``_rss``) and installs its own
    SIGTERM handler."""
    spec = importlib.util.spec_from_file_location("gpu_check_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "path", list(sys.path))
    handler = signal.getsignal(signal.SIGTERM)
    try:
        return module.main(list(args))
    finally:
        signal.signal(signal.SIGTERM, handler)
        sys.modules.pop("_rss", None)


def test_tiny_run_matches_predict_and_the_initial_loss(tmp_path, monkeypatch, capsys):
    out = tmp_path / "gpu_check.json"
    monkeypatch.chdir(tmp_path)
    t0 = time.perf_counter()
    code = _main(monkeypatch, "--tiny", "--data", "flowers5", "--classes", str(K), "--lr",
                 str(LR), "--out", str(out))
    log = capsys.readouterr()
    assert code == 0, (log.out + log.err)[-3000:]
    # the same task through the public API (the isotropic feature kernel the script measures,
    # the default before session 34)
    apply_fn, params, x, y, *_, head = load_task(
        dataset="flowers5", num_classes=K, per_class=PER_CLASS, test_per_class=0, seed=0)
    pred = ntk_tt.predict(apply_fn, params, x, y, learning_rate=LR, steps=STEPS, head=head,
                          backbone="isotropic")
    loss0 = float(optax.softmax_cross_entropy_with_integer_labels(
        apply_fn(params, x), y).mean())
    print(f"gpu_check --tiny and the reference: {time.perf_counter() - t0:.1f} s")
    rec = json.loads(out.read_text())

    assert rec["status"] == "complete"
    stages = ("environment", "load", "kernel", "lambda", "gd_step_time", "gd_predict",
              "gd_finetune", "gd_sweep", "sgd_predict", "sgd_finetune")
    assert {s: rec["stages"][s]["status"] for s in stages} == dict.fromkeys(stages, "ok")
    assert "kernel_repeat" not in rec["stages"]  # --tiny does not time the kernel twice
    assert rec["config"]["n"] == K * PER_CLASS and rec["environment"]["platform"] == "cpu"
    assert rec["kernel"]["seconds"] > 0 and rec["kernel"]["host_peak_rss_mib"] > 100
    assert rec["kernel"]["device_memory_after"] is None  # the CPU has no allocator stats
    assert rec["learning_rate"] == LR and rec["steps_used"] == STEPS

    gd, sgd = rec["rows"]["gd"], rec["rows"]["sgd"]
    # the script's prediction (head-aware kernel built once, shared by both rows) is
    # ntk_tt.predict's: same curve, same T_ε, same κ = η·λ_max/N (λ_max of its own kernel)
    np.testing.assert_allclose(gd["predicted_curves"]["loss"], pred.loss, rtol=1e-5)
    np.testing.assert_allclose(gd["predicted_curves"]["error"], pred.error, atol=1e-6)
    for curve in ("loss", "error"):
        for eps, steps in pred.training_time[curve].items():
            assert gd["predicted_training_time"][curve][str(eps)] == steps
    assert gd["kappa"] == pytest.approx(pred.kappa, rel=1e-4)
    assert rec["kappa_eff"] == pytest.approx(pred.kappa, rel=1e-4)
    # both real runs start from the model's initial cross-entropy
    for row in (gd, sgd):
        assert row["real_curves"]["loss"][0] == pytest.approx(loss0, rel=1e-5)
        assert row["predicted_curves"]["loss"][0] == pytest.approx(loss0, rel=1e-5)
        assert len(row["real_curves"]["loss"]) == STEPS + 1
    assert gd["batch_size"] == K * PER_CLASS and sgd["batch_size"] == SGD_BATCH
    assert np.shape(sgd["predicted_curves"]["loss_band"]) == (2, STEPS + 1)

    # the headline is the comparison's: real T_ε from the run's curve, the cost ratio with the
    # prediction's cost = kernel + λ_max + that row's solve
    st = rec["stages"]
    for name, row in (("gd", gd), ("sgd", sgd)):
        h, cmp = row["headline"], row["compare"]
        real_t = ntk_tt.training_time(np.asarray(row["real_curves"]["loss"]), 0.1)
        assert h["loss"]["0.1"]["real"] == real_t
        p = h["loss"]["0.1"]["predicted"]
        assert h["loss"]["0.1"]["rel_error"] == pytest.approx(abs(p - real_t) / real_t)
        cost = st["kernel"]["seconds"] + st["lambda"]["seconds"] + st[f"{name}_predict"][
            "seconds"]
        assert cmp["seconds"]["predict"] == pytest.approx(cost)
        assert h["cost_ratio_finetune_over_predict"] == pytest.approx(
            row["real_seconds"]["per_step"] * STEPS / cost)
    # the sweep (4 GD rates, η × 0.25 … 2 on the same kernel in one jit(vmap)): its entry at
    # η is the GD row's eager prediction; its cost ratio is 4 fine-tunes over kernel + solves
    sw = rec["sweep"]
    assert sw["configs"] == 4 and sw["learning_rates"][2] == pytest.approx(LR, rel=1e-6)
    for c, curve in enumerate(("loss", "error")):
        for e, eps in enumerate(("0.01", "0.1", "0.4")):
            assert sw["training_time"][2][c][e] == gd["predicted_training_time"][curve][eps]
    assert sw["ratio"] == pytest.approx(4 * gd["real_seconds"]["finetune"] / (
        st["kernel"]["seconds"] + st["lambda"]["seconds"] + st["gd_sweep"]["seconds"]))


def test_bad_input_is_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    out = tmp_path / "x.json"
    for args, said in [
        (["--data", str(tmp_path / "none.npz")], "none.npz: no such file"),
        (["--tiny", "--data", "flowers5", "--classes", "5", "--sgd-batch", "50"],
         "--sgd-batch must be in [1, N = 20) or 0"),
        (["--tiny", "--data", "flowers5", "--lr", "-1"], "--lr must be a finite number > 0"),
        # a fresh user (session 41): κ̃ = inf ran 12 s to four failed stages, and an unknown
        # name wrote the JSON of a failed load stage before its error line
        (["--tiny", "--data", "flowers5", "--kappa", "inf"],
         "--kappa must be a finite number > 0, got inf"),
        (["--tiny", "--data", "bogus"], "--data bogus: unknown dataset; the short names are "
                                        "flowers5, cifar10_source"),
    ]:
        t0 = time.perf_counter()
        done = _run(tmp_path, *args, "--out", str(out))
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and said in done.stderr, done.stderr
        assert time.perf_counter() - t0 < 10  # no JAX imported, nothing loaded
        assert not out.exists()
    out.write_text("{}")
    done = _run(tmp_path, "--tiny", "--data", "flowers5", "--out", str(out))
    assert done.returncode == 2 and "exists; pass --overwrite" in done.stderr
    assert out.read_text() == "{}"
    # a task the data cannot give: load_task's one line, also recorded, and nothing after it
    # (in this process: JAX is imported by then, a subprocess would spend 4 s importing it)
    monkeypatch.chdir(tmp_path)
    code = _main(monkeypatch, "--tiny", "--data", "flowers5", "--classes", "7", "--out",
                 str(out), "--overwrite")
    assert code == 2
    assert capsys.readouterr().err.endswith(
        "gpu_check.py: error: num_classes (K) = 7 is more than the 5 classes available; "
        "choose a smaller K or another dataset.\n")
    rec = json.loads(out.read_text())
    assert rec["stages"]["load"]["status"].startswith("failed: ValueError: num_classes (K) = 7")
    assert "kernel" not in rec["stages"] and "rows" not in rec
