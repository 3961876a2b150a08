"""Steps to absolute targets (issue 26 item 4): the definition against a numpy loop, predict's
``steps_to_target`` on its own curves, compare's real side and relative error, ``ntk-tt
predict --loss-target/--error-target/--accuracy-target``, and the sweep summary's block."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from flax import nnx

import ntk_tt
from ntk_tt.cli import main
from ntk_tt.dynamics._targets import TARGET_REASONS
from ntk_tt.dynamics._training_time import DIVERGED, REASONS
from ntk_tt.prediction._compare import NOT_RECORDED
from ntk_tt.sweep._targets import absolute_targets, error_curve_gap


def brute_steps(curve, target, window, tol=0.0):
    """First t whose centred mean over t − h..t + h (h = min(w // 2, t, T − t)) is ≤ target
    (+ ``tol``: error curves of k/N values sit exactly at targets such as 0.5, where float32
    rounding of the values would otherwise decide), by a loop in float64; NaN for a non-finite
    curve or when none is."""
    c = np.asarray(curve, np.float64)
    if not np.all(np.isfinite(c)):
        return math.nan
    last = len(c) - 1
    for t in range(len(c)):
        h = min(window // 2, t, last - t)
        if c[t - h:t + h + 1].mean() <= target + tol:
            return float(t)
    return math.nan


def smoothed(curve, window):
    c = np.asarray(curve, np.float64)
    last = len(c) - 1
    return np.array([c[t - (h := min(window // 2, t, last - t)):t + h + 1].mean()
                     for t in range(len(c))])


def test_steps_to_target_matches_a_numpy_loop_on_random_curves():
    """Noisy falling curves, targets below the end (never reached), above the start (step 0),
    and in between; windows 1, 3, 5; NaN and inf curves. Targets are kept 1e-4 away from every
    smoothed value, so float32 rounding cannot decide a comparison; negative ones (the noisy
    curves dip below 0) are refused."""
    rng = np.random.default_rng(0)
    reached = never = 0
    for trial in range(30):
        length = (5, 12, 31)[trial % 3]  # few shapes: few compilations
        curve = np.exp(-rng.uniform(0.01, 0.3) * np.arange(length)) * rng.uniform(0.5, 3)
        clean = curve + rng.normal(0, 0.05, length)
        curve = clean.copy()
        if trial % 10 == 9:
            curve[rng.integers(1, length)] = [np.nan, np.inf][trial % 20 == 19]
        for window in (1, 3, 5):
            sm = smoothed(clean, window)
            for target in (*rng.uniform(sm.min() - 0.2, sm[0] + 0.2, 3), sm.min() - 0.1):
                if np.all(np.isfinite(curve)) and np.min(np.abs(sm - target)) < 1e-4:
                    continue
                if target < 0:  # no loss or error target: refused, as predict refuses it
                    with pytest.raises(ValueError, match="never reaches a negative target"):
                        ntk_tt.steps_to_target_report(curve, target, window=window)
                    continue
                want = brute_steps(curve, target, window)
                got, why = ntk_tt.steps_to_target_report(curve.astype(np.float32), target,
                                                          window=window)
                assert (got == want) or (math.isnan(got) and math.isnan(want)), \
                    (trial, window, target)
                t_arr, code = ntk_tt.steps_to_target_array(jnp.asarray(curve, jnp.float32),
                                                           target, window)
                assert (float(t_arr) == got) or (math.isnan(got) and math.isnan(float(t_arr)))
                if not np.all(np.isfinite(curve)):
                    assert why == "curve has NaN or inf entries" and int(code) == 1
                elif math.isnan(want):
                    assert why == TARGET_REASONS[6] and int(code) == 6
                    never += 1
                else:
                    assert why is None and int(code) == 0
                    reached += 1
    assert reached > 100 and never > 30


def test_smoothing_ties_vmap_and_errors():
    # the smoothed curve, not the raw one, must reach the target: the raw dip at step 2 is
    # averaged away with window 5 (mean of 1, 1, 0.1, 1, 1 = 0.82)
    curve = np.array([1.0, 1.0, 0.1, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    assert ntk_tt.steps_to_target(curve, 0.3, window=1) == 2.0
    assert math.isnan(ntk_tt.steps_to_target(curve, 0.3, window=5))
    # an error curve of k/N values that sits exactly at e* = 150/750 = 0.2 has reached it:
    # step 6 is the first whose 5-step window holds only 150/750 (float32 rounding aside)
    err = np.array([300, 200, 160, 151, 150, 150, 150, 150, 150], np.float32) / 750
    assert ntk_tt.steps_to_target(err, 0.2, window=5) == 6.0
    # several targets at once under vmap, a target at or above L_0 reached at step 0
    many = jax.vmap(ntk_tt.steps_to_target_array, (None, 0))(jnp.linspace(2.0, 0.0, 21),
                                                            jnp.array([2.5, 1.0, -1.0]))
    np.testing.assert_array_equal(np.asarray(many[0])[:2], [0.0, 10.0])
    assert math.isnan(float(many[0][2])) and list(np.asarray(many[1])) == [0, 0, 6]
    with pytest.warns(UserWarning, match="first at step 1"):
        assert math.isnan(ntk_tt.steps_to_target([1.0, np.nan, 0.0], 0.5, window=1))
    for bad, match in ((dict(target="0.5"), "target must be a real number"),
                       (dict(target=True), "target must be a real number"),
                       (dict(target=np.nan), "one finite number"),
                       (dict(target=[0.5, 0.2]), "target must be a real number"),
                       (dict(target=np.array([0.5, 0.2])), "one finite number"),
                       (dict(target=0.5, window=4), "window must be an odd int")):
        with pytest.raises(ValueError, match=match):
            ntk_tt.steps_to_target(curve, **bad)
    with pytest.raises(ValueError, match="steps_to_target_array"):
        jax.jit(lambda t: ntk_tt.steps_to_target(curve, t))(0.5)


def test_steps_to_target_refuses_the_targets_predict_refuses():
    """steps_to_target(curve, -1) returned NaN silently where predict(targets={"loss": -1})
    refuses -1; now the same rule: a target predict takes on a loss curve (L* > 0) or an
    error curve (e* in [0, 1]) passes, anything else is refused."""
    from ntk_tt._options_targets import check_targets

    curve = np.linspace(1.0, 0.0, 11)
    for bad in (-1, -1e-3, np.float32(-0.5)):
        for curve_name in ("loss", "error"):
            with pytest.raises(ValueError):
                check_targets({curve_name: bad})
        for fn in (ntk_tt.steps_to_target, ntk_tt.steps_to_target_report):
            with pytest.raises(ValueError, match=r"target must be a mean loss L\* > 0 or an "
                                                 r"error rate e\* in \[0, 1\].*negative"):
                fn(curve, bad)
    # an error target of 0 (every sample right) and a loss target above 1 stay allowed
    assert ntk_tt.steps_to_target(curve, 0.0, window=1) == 10.0
    assert ntk_tt.steps_to_target(curve, 2.0) == 0.0


class _Net(nnx.Module):
    """A tiny classifier with a linear ``head`` (the head-aware predictor's split)."""

    def __init__(self, rngs):
        self.body = nnx.Linear(6, 12, rngs=rngs)
        self.head = nnx.Linear(12, 3, rngs=rngs)

    def __call__(self, x):
        return self.head(jnp.tanh(self.body(x)))


@pytest.fixture(scope="module")
def task():
    model = _Net(nnx.Rngs(0))
    apply_fn, params = ntk_tt.from_nnx(model)
    x = jax.random.normal(jax.random.key(1), (30, 6))
    y = jnp.argmax(x[:, :3], axis=1)  # learnable labels
    return model, apply_fn, params, x[:24], y[:24], x[24:], y[24:]


TARGETS = {"loss": [0.8, 0.5, 1e-4], "error": [0.3], "test_error": [0.5, 0.0]}


@pytest.fixture(scope="module")
def pred_and_run(task):
    """A prediction with targets on every curve and the real run it predicts (held-out
    curves recorded), with the arguments of ``ntk-tt predict --predictor linear -T 25 --lr
    0.5 --verify`` (a key, logits recorded): its compiled functions serve the CLI test."""
    _, apply_fn, params, x, y, xt, yt = task
    kw = dict(learning_rate=0.5, steps=25, x_test=xt, y_test=yt, key=jax.random.key(0))
    return (ntk_tt.predict(apply_fn, params, x, y, targets=TARGETS, **kw),
            ntk_tt.finetune(apply_fn, params, x, y, record_test_curves=True,
                            record_logits=True, **kw), kw)


def test_predict_steps_to_target_are_the_function_on_its_own_curves(task, pred_and_run):
    _, apply_fn, params, x, y, _, _ = task
    pred, targets = pred_and_run[0], TARGETS
    assert set(pred.steps_to_target) == set(targets)
    for curve, per in pred.steps_to_target.items():
        for target, steps in per.items():
            want = brute_steps(getattr(pred, curve), target, 5, tol=1e-6)
            assert steps == want or (math.isnan(steps) and math.isnan(want)), (curve, target)
            if math.isnan(want):
                assert pred.steps_to_target_reasons[curve][target] == TARGET_REASONS[6]
    assert math.isnan(pred.steps_to_target["loss"][1e-4])  # not reached in 25 steps
    assert pred.steps_to_target["loss"][0.8] < pred.steps_to_target["loss"][0.5] < 25
    # a diverged prediction reaches nothing, with T_ε's reason (MSE, κ far past the edge)
    div = ntk_tt.predict(apply_fn, params, x, y, learning_rate=500.0, steps=25, loss="mse",
                         targets={"loss": 10.0})
    assert div.diverged and math.isnan(div.steps_to_target["loss"][10.0])
    assert div.steps_to_target_reasons["loss"][10.0] == REASONS[DIVERGED]


@pytest.mark.parametrize("targets,match", [
    ({"test_error": 0.1}, "need x_test and y_test"),
    ({"accuracy": 0.9}, "unknown curve 'accuracy'"),
    ({"loss": 0.0}, "must be > 0"),
    ({"error": 1.5}, r"must be in \[0, 1\]"),
    ({"loss": "0.5"}, "finite real numbers"),
    ({"loss": []}, r"targets\['loss'\] is empty"),
    ([0.5], "must be a dict"),
])
def test_bad_targets_are_refused_before_the_kernel(task, targets, match, monkeypatch):
    _, apply_fn, params, x, y, *_ = task

    def refuse(*_, **__):
        raise AssertionError("the kernel was built before the targets were checked")

    monkeypatch.setattr("ntk_tt.prediction._predict._kernels", refuse)
    with pytest.raises(ValueError, match=match):
        ntk_tt.predict(apply_fn, params, x, y, learning_rate=0.5, steps=5, targets=targets)


def test_compare_reports_real_steps_by_the_same_definition(task, pred_and_run):
    _, apply_fn, params, x, y, xt, yt = task
    pred, run, kw = pred_and_run
    # the held-out curve: its first entry is the model's held-out error at w0, its last the
    # final held-out accuracy finetune reports
    f0t = np.asarray(apply_fn(params, xt))
    assert run.test_error[0] == pytest.approx(np.mean(f0t.argmax(1) != np.asarray(yt)))
    assert run.test_error[-1] == pytest.approx(1 - run.test_accuracy)
    report = ntk_tt.compare(pred, run)
    for curve, per in TARGETS.items():
        for target in per:
            real = brute_steps(getattr(run, curve), target, 5, tol=1e-6)
            p = report["predicted"]["steps_to_target"][curve][target]
            r = report["real"]["steps_to_target"][curve][target]
            assert r == (None if math.isnan(real) else real)
            rel = report["target_error"][curve][target]
            assert rel == (abs(p - r) / r if p is not None and r else None)
            wall = report["real"]["target_wall_clock"][curve][target]
            assert wall == (None if r is None else pytest.approx(r * run.seconds_per_step))
    assert report["target_error"]["loss"][0.8] is not None
    # a run without held-out curves has no real held-out steps, and says why
    bare = ntk_tt.finetune(apply_fn, params, x, y, **kw)
    again = ntk_tt.compare(pred, bare)
    assert again["real"]["steps_to_target"]["test_error"][0.5] is None
    assert again["real"]["steps_to_target_reasons"]["test_error"][0.5] == NOT_RECORDED
    assert again["target_error"]["test_error"][0.5] is None
    with pytest.raises(ValueError, match="record_test_curves=True"):
        ntk_tt.finetune(apply_fn, params, x, y, learning_rate=0.5, steps=2,
                        record_test_curves=True)


@pytest.fixture
def tiny_job(task, monkeypatch, tmp_path):
    """``ntk-tt predict`` on the tiny classifier instead of the shipped checkpoint (the job's
    own code from the task on), in a folder of its own."""
    model, apply_fn, params, x, y, xt, yt = task
    info = {"checkpoint": "tiny", "architecture": "_Net", "num_params": 123,
            "dataset": "tiny", "classes": ["a", "b", "c"], "n_train": 24, "n_test": 6,
            "test_per_class": 2, "image_shape": [6], "model_input_shape": [6],
            "preprocessing": "none"}
    head = ntk_tt.split_head(model)
    monkeypatch.setattr("ntk_tt.prediction._job.load_task",
                        lambda **_: (apply_fn, params, x, y, xt, yt, info, head))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_cli_loss_and_accuracy_targets_table_and_json(tiny_job, pred_and_run, capsys):
    code = main(["predict", "--no-progress", "--verify", "-K", "3", "-n", "8",
                 "--test-per-class", "2", "-T", "25", "--lr", "0.5", "--figure", "",
                 "--predictor", "linear",
                 "--json", "r.json", "--loss-target", "0.8,0.5", "--loss-target", "1e-4",
                 "--accuracy-target", "0.5"])
    out = capsys.readouterr().out
    assert code == 0
    r = json.loads((tiny_job / "r.json").read_text())
    pred, real = r["predicted"]["steps_to_target"], r["real"]["steps_to_target"]
    assert set(pred) == set(real) == {"loss", "test_error"}
    assert list(pred["loss"]) == ["0.8", "0.5", "0.0001"] and list(pred["test_error"]) == ["0.5"]
    for t in ("0.8", "0.5", "0.0001"):  # the report's own curves, by the definition
        for side, steps in (("predicted", pred), ("real", real)):
            want = brute_steps(r["curves"][side]["loss"], float(t), 5, tol=1e-6)
            assert steps["loss"][t] == (None if math.isnan(want) else want), (side, t)
    p, q = pred["loss"]["0.8"], real["loss"]["0.8"]
    assert r["target_error"]["loss"]["0.8"] == pytest.approx(abs(p - q) / q)
    assert r["real"]["steps_to_target_reasons"]["loss"]["0.0001"] == TARGET_REASONS[6]
    assert "steps to target" in out and "held-out accuracy ≥ 0.5" in out
    line = next(row for row in out.splitlines() if row.startswith("loss ≤ 0.0001"))
    assert "not reached within T" in line


@pytest.mark.parametrize("args,match", [
    (["--loss-target", "-1"], "loss_targets (--loss-target) entries must each be a mean"),
    (["--loss-target", "abc"], "comma-separated list of numbers, e.g. 0.5,0.2"),
    (["--error-target", "2"], "training error rate in [0, 1]"),
    (["--accuracy-target", "0"], "held-out accuracy in (0, 1]"),
    (["--accuracy-target", "0.9", "--test-per-class", "0"], "need held-out images"),
    (["--error-target", "0.1", "--loss", "mse", "--subset", "100"], "--subset does not"),
])
def test_cli_bad_targets_are_one_line_before_any_work(args, match, tiny_job, capsys,
                                                      monkeypatch):
    def refuse(**_):
        raise AssertionError("work started before the targets were checked")

    monkeypatch.setattr("ntk_tt.prediction._job.load_task", refuse)
    with pytest.raises(SystemExit) as exit_info:
        main(["predict", "--no-progress", *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and match in err, err


def test_cli_accuracy_target_without_held_out_images_refused_before_weights(
        capsys, monkeypatch, tmp_path):
    """flowers5 (vendored) has 200 images per class: -n 200 leaves no held-out image, which is
    known once the task is sampled, before the checkpoint's weights are read."""
    def refuse(*_, **__):
        raise AssertionError("weights read before the held-out images were counted")

    monkeypatch.setattr("ntk_tt.prediction._job.restore", refuse)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["predict", "--no-progress", "-K", "2", "-n", "200", "--accuracy-target", "0.9"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert "--accuracy-target needs held-out images" in err and "lower -n" in err, err


def _line(start, slope, steps=10):
    return start - slope * np.arange(steps + 1)


def test_sweep_summary_block_against_a_hand_computation():
    """Linear curves (the 5-step mean of a line is the line, ends included), L_0 = 2, so
    L* = 1 and 0.5, T = 10: real 2 − 0.33t reaches them at 4 and 5, predicted 2 − 0.27t at
    4 and 6; real 2 − 0.11t at 10 and never, predicted 2 − 0.21t at 5 and 8; a diverged real
    run reaches nothing; 2 − 0.05t and 2 − 0.06t reach neither. Error curves 0.8 − 0.065t
    (≤ 0.5 at 5, ≤ 0.2 at 10, never ≤ 0.1) and 0.8 − 0.09t (4, 7, 8)."""
    frame = pd.DataFrame({
        "task_id": ["t0", "t1", "t0", "t1"], "optimizer": ["gd", "gd", "sgd", "sgd"],
        "kappa_eff": [1.0, 4.0, 1.0, 4.0], "pred_method": "discrete",
        "real_loss": [_line(2, 0.33), _line(2, 0.11), _line(2, 0.33), _line(2, 0.05)],
        "pred_loss": [_line(2, 0.27), _line(2, 0.21), _line(2, 0.33), _line(2, 0.06)],
        "real_diverged": [False, False, True, False], "pred_diverged": [False] * 4,
        "real_error": [_line(0.8, 0.065)] * 4, "pred_error": [_line(0.8, 0.09)] * 4,
    })
    out = absolute_targets(frame)
    gd = out["headline"]["gd"]  # pairs: (4, 4), (5, 6), (10, 5), (never, 8)
    rel = [0.0, 0.2, 0.5]
    assert (gd["pairs"], gd["n"], gd["pred_only"], gd["real_only"]) == (4, 3, 1, 0)
    assert gd["reach_agreement"] == 0.75 and gd["real_reached"] == 0.75
    assert gd["p95"] == pytest.approx(np.percentile(rel, 95))
    assert gd["median_abs"] == pytest.approx(0.2) and gd["median_signed"] == pytest.approx(0.0)
    assert gd["p95_abs_steps"] == pytest.approx(np.percentile([0, 1, 5], 95))
    sgd = out["headline"]["sgd"]  # (diverged, 4), (diverged, 5), (never, never) × 2
    assert (sgd["pairs"], sgd["n"], sgd["pred_only"], sgd["reach_agreement"]) == (4, 0, 2, 0.5)
    assert out["by_kappa"]["1"]["gd"]["p95"] == pytest.approx(np.percentile([0.0, 0.2], 95))
    assert out["by_kappa"]["4"]["gd"]["reach_agreement"] == 0.5
    assert out["by_target"]["loss0.25"]["gd"]["n"] == 1
    # error targets: gd rows (5, 4), (10, 7), (never, 8) on both rows; sgd: the diverged row
    # reaches nothing, the other as gd
    e_gd = out["headline_error"]["gd"]
    assert (e_gd["pairs"], e_gd["n"], e_gd["reach_agreement"]) == (6, 4, 4 / 6)
    assert e_gd["median_abs"] == pytest.approx(np.median([0.2, 0.3, 0.2, 0.3]))
    assert out["by_target"]["error0.1"]["sgd"] == pytest.approx(
        {"pairs": 2, "reach_agreement": 0.0, "real_reached": 0.0, "pred_reached": 1.0,
         "pred_only": 2, "real_only": 0, "n": 0})
    # a table without error curves (the committed benchmark's) gets the loss targets only
    old = absolute_targets(frame.drop(columns=["real_error", "pred_error"]))
    assert "headline_error" not in old and "no error curves" in old["error_targets_missing"]
    assert old["headline"] == out["headline"]


def test_error_curve_distance_against_a_hand_computation():
    """Real error 0.8 − 0.065t, predicted 0.8 − 0.09t (T = 10): the gap grows to 0.25 at t = 10
    on both GD rows; a diverged row is left out; an SGD row with its curves missing too."""
    frame = pd.DataFrame({
        "optimizer": ["gd", "gd", "gd", "sgd"],
        "real_error": [_line(0.8, 0.065), _line(0.5, 0.01), _line(0.8, 0.065), None],
        "pred_error": [_line(0.8, 0.09), _line(0.55, 0.0), _line(0.8, 0.0), None],
        "real_diverged": [False, False, True, False], "pred_diverged": [False] * 4,
    })
    out = error_curve_gap(frame)
    # row 0: max gap 0.25, final −0.25; row 1: 0.05 + 0.01t: max 0.15 at t = 10, final +0.15
    assert out["gd"]["n"] == 2 and out["sgd"] == {"n": 0}
    assert out["gd"]["median"] == pytest.approx(0.2)
    assert out["gd"]["p95"] == pytest.approx(np.percentile([0.25, 0.15], 95))
    assert out["gd"]["final_median"] == pytest.approx(0.2)
    assert out["gd"]["final_median_signed"] == pytest.approx(-0.05)
    assert error_curve_gap(frame.drop(columns=["pred_error"]))["gd"] == {"n": 0}


def test_steps_to_target_array_refuses_a_target_vector_or_an_empty_curve():
    """A second fresh user: an array of targets or an empty curve gave raw JAX / NumPy
    errors; now one ValueError pointing to vmap; vmap over targets is the loop of calls."""
    curve = jnp.linspace(1.0, 0.1, 12)
    for bad_curve, target in ((curve, jnp.array([0.5, 0.2])), (jnp.zeros((0,)), 0.5),
                              (curve[None], 0.5)):
        with pytest.raises(ValueError, match="a 1-D curve with >= 1 entry and a scalar target"):
            ntk_tt.steps_to_target_array(bad_curve, target)
    swept = jax.vmap(ntk_tt.steps_to_target_array, in_axes=(None, 0))(curve, jnp.array([.5, .2]))
    assert [float(s) for s in swept[0]] == [float(ntk_tt.steps_to_target_array(curve, t)[0])
                                            for t in (0.5, 0.2)]
