"""``ntk-tt predict --method closed_form|ode|sde`` with the optimiser flags (issue 27): the SGD
family goes to ``ntk_tt.predict(optimizer=, method=)`` (schedule η(t), momentum, weight decay;
METHOD.md §11), whose curves the report holds, with the optimiser recorded as for the discrete
recursion; Adam with those methods, as the API, is refused in one line before JAX is imported.
"""

import contextlib
import io
import json
from pathlib import Path

import jax
import numpy as np
import pytest
from _cli_tiny import cli_before_jax, tiny_task

import ntk_tt
from ntk_tt.cli import main

ROOT = str(Path(__file__).resolve().parents[1])  # on PYTHONPATH of the programs run
STEPS, LR, WARMUP, DECAY, M = 12, 0.05, 3, 0.01, 0.5
SCHEDULE = ["-T", str(STEPS), "--lr", str(LR), "--schedule", "warmup-cosine", "--warmup",
            str(WARMUP), "--weight-decay", str(DECAY), "-m", str(M)]


@pytest.fixture(scope="module")
def task():
    return tiny_task()


def _cli(task, folder, args):
    """``ntk-tt predict`` on the tiny task (the job's own code from the task on) in
    ``folder``: (exit status, stdout, the JSON report)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("ntk_tt.prediction._job.load_task", lambda **_: task)
        mp.chdir(folder)
        with contextlib.redirect_stdout(io.StringIO()) as out:
            code = main(["predict", "--no-progress", "-K", "3", "-n", "8", "--test-per-class",
                         "2", "--figure", "", "--json", "r.json", *args])
    return code, out.getvalue(), json.loads((folder / "r.json").read_text())


@pytest.mark.parametrize("method, loss, batch_size", [
    ("ode", "cross_entropy", None), ("closed_form", "mse", None), ("sde", "mse", 8)])
def test_continuous_method_predicts_the_api_s_curve_for_the_optimiser(task, tmp_path, method,
                                                                      loss, batch_size):
    """Warmup-cosine + decoupled weight decay + momentum with --method ode / closed_form / sde
    (SGD: B = 8, 2 paths, D' = 32): the report's curves are ``ntk_tt.predict(..., method=,
    optimizer=)``'s on the same task and key (the old CLI refused the method), and the report
    names the method and the optimiser as the discrete recursion's does."""
    apply_fn, params, x, y, xt, yt, _, _ = task
    sgd = [] if batch_size is None else ["-B", str(batch_size), "--num-paths", "2",
                                         "--sketch-dim", "32"]  # D' of the SDE's noise
    code, out, r = _cli(task, tmp_path, [*SCHEDULE, "--method", method, "--loss", loss, *sgd])
    assert code == 0 and r["status"] == "complete"
    opt = ntk_tt.sgd(ntk_tt.warmup_cosine(LR, WARMUP, STEPS), momentum=M, weight_decay=DECAY,
                     batch_size=batch_size)
    pred = ntk_tt.predict(apply_fn, params, x, y, optimizer=opt, steps=STEPS, loss=loss,
                          method=method, key=jax.random.fold_in(jax.random.key(0), 2),
                          x_test=xt, y_test=yt,
                          **{} if batch_size is None else dict(num_paths=2, sketch_dim=32))
    got = r["curves"]["predicted"]
    for name in ("loss", "error"):
        np.testing.assert_array_equal(np.array(got[name], float),
                                      np.asarray(getattr(pred, name), float))
    assert got["loss"][-1] < 0.95 * got["loss"][0]  # a curve that falls, not a flat one
    assert r["predicted"]["method"] == method and r["predicted"]["kernel"] == "exact"
    h = r["optimizer"]
    b = batch_size or 24
    assert (h["optimizer"], h["schedule"], h["batch_size"]) == ("sgd", "warmup_cosine", b)
    assert (h["momentum"], h["weight_decay"], h["decoupled"]) == (
        pytest.approx(M), pytest.approx(DECAY), True)
    assert h["schedule_parameters"]["warmup"] == WARMUP
    assert r["predicted"]["hyperparameters"]["schedule"] == "warmup_cosine"
    lines = out.splitlines()
    assert any(line.startswith(f"prediction: method {method}, kernel exact") for line in lines)
    assert (f"optimiser: sgd (m {M:g}), weight decay {DECAY:g} decoupled, B = {b}; "
            f"warmup_cosine: η 0 → {LR:g} over {WARMUP} steps, cosine to 0 at step "
            f"{STEPS}") in lines


REFUSED = [  # (flags, the line's words): Adam with a continuous method, as predict refuses it
    (["--optimizer", "adamw", "--method", "ode"],
     "method (--method) 'ode' takes --optimizer sgd only: --optimizer adamw has no "
     "continuous-time predictor"),
    (["--optimizer", "adam", "--method", "sde"],
     "method (--method) 'sde' takes --optimizer sgd only: --optimizer adam has no"),
    (["--optimizer", "adamw", "--method", "closed_form", "--loss", "mse"],
     "method (--method) 'closed_form' takes --optimizer sgd only"),
    # the SGD family meets the method's own limits: closed_form is MSE full-batch GD
    ([*SCHEDULE, "--method", "closed_form"],
     "method 'closed_form' (--method closed_form) exists for loss 'mse' (--loss mse) with "
     "full-batch GD only"),
    ([*SCHEDULE, "--method", "closed_form", "--loss", "mse", "-B", "8"],
     "method 'closed_form' (--method closed_form) exists for loss 'mse'"),
]


def test_adam_with_a_continuous_method_is_one_line_before_jax_is_imported(tmp_path):
    """One fresh interpreter runs every case: status 2, one ``ntk-tt: error:`` line, ``jax``
    still not imported after it, nothing written; the SGD flags with --method sde (which the
    old CLI refused) pass the same checks."""
    cases = [["predict", "-K", "3", "-n", "8", *args] for args, _ in REFUSED]
    then = ("from ntk_tt._options_predict import check_predict_job\n"
            "o = check_predict_job(dict(num_classes=3, per_class=8, steps=12, learning_rate=0.05,"
            " schedule='warmup_cosine', warmup=3, weight_decay=0.01, momentum=0.5, nesterov=True,"
            " batch_size=8, method='sde'))\n")
    (results, accepted, jax_imported), lines, stderr = cli_before_jax(
        cases, tmp_path, then=then, result="[out, o['method'], 'jax' in sys.modules]")
    assert accepted == "sde" and jax_imported is False
    assert len(lines) == len(REFUSED), stderr  # one line per case, nothing else
    for (args, match), (status, imported), line in zip(REFUSED, results, lines, strict=True):
        assert status == 2 and imported is False, (args, status)
        assert line.startswith("ntk-tt: error: ") and match in line, (args, line)
    assert not list(tmp_path.iterdir())
