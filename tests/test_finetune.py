"""Real fine-tuning: optax semantics, batch sequence, determinism, divergence, validation."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ntk_tt
from ntk_tt.dynamics._losses import error_rate, mean_loss
from ntk_tt.training._steps import finetune_core

N, DIN, C = 24, 6, 3


def mlp(params, x):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return h @ params["w2"]


def problem(dtype=jnp.float32):
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {"w1": jax.random.normal(k1, (DIN, 16), dtype) / np.sqrt(DIN),
              "b1": jnp.zeros((16,), dtype),
              "w2": jax.random.normal(k2, (16, C), dtype) / 4.0}
    x = jax.random.normal(k3, (N, DIN), dtype)
    y = jnp.arange(N) % C
    return params, x, y


def reference_curve(params, x, y, *, lr, momentum, nesterov, batches, loss):
    """Independent reference: a plain Python loop of optax.sgd steps."""
    opt = optax.sgd(lr, momentum, nesterov=nesterov)
    state = opt.init(params)
    curve = [mean_loss(mlp(params, x), y, loss)]
    for idx in np.asarray(batches):
        g = jax.grad(lambda p, i=idx: mean_loss(mlp(p, x[i]), y[i], loss))(params)
        upd, state = opt.update(g, state, params)
        params = optax.apply_updates(params, upd)
        curve.append(mean_loss(mlp(params, x), y, loss))
    return np.asarray(curve)


@pytest.mark.parametrize("momentum,nesterov,batch_size,loss", [
    (0.0, False, None, "cross_entropy"), (0.9, False, 8, "cross_entropy"),
    (0.9, True, 12, "mse"),
])
def test_matches_plain_optax_loop(momentum, nesterov, batch_size, loss):
    with jax.enable_x64(True):
        params, x, y = problem(jnp.float64)
        key = jax.random.key(3)
        run = ntk_tt.finetune(mlp, params, x, y, learning_rate=0.3, steps=12,
                              batch_size=batch_size, momentum=momentum, nesterov=nesterov,
                              loss=loss, key=key)
        batches = ntk_tt.batch_indices(key, N, batch_size or N, 12)
        ref = reference_curve(params, x, y, lr=0.3, momentum=momentum, nesterov=nesterov,
                              batches=batches, loss=loss)
    assert run.loss.shape == run.error.shape == (13,)
    np.testing.assert_allclose(run.loss, ref, rtol=1e-10)
    assert not run.diverged and run.diverged_at is None


def test_same_key_same_run_and_gd_ignores_key():
    params, x, y = problem()
    kw = dict(learning_rate=0.5, steps=10)
    a = ntk_tt.finetune(mlp, params, x, y, batch_size=6, key=jax.random.key(1), **kw)
    b = ntk_tt.finetune(mlp, params, x, y, batch_size=6, key=jax.random.key(1), **kw)
    other = ntk_tt.finetune(mlp, params, x, y, batch_size=6, key=jax.random.key(2), **kw)
    np.testing.assert_array_equal(a.loss, b.loss)
    assert not np.array_equal(a.loss, other.loss)
    gd = [ntk_tt.finetune(mlp, params, x, y, key=k, **kw)
          for k in (None, jax.random.key(1), jax.random.key(2))]
    for run in gd[1:]:
        np.testing.assert_array_equal(run.loss, gd[0].loss)


def test_loss_decreases_at_small_lr_and_error_is_full_set():
    params, x, y = problem()
    run = ntk_tt.finetune(mlp, params, x, y, learning_rate=0.05, steps=20,
                          x_test=x[:6], y_test=y[:6], record_logits=True)
    assert np.all(np.diff(run.loss) < 0)
    assert run.logits.shape == (21, N, C)
    np.testing.assert_allclose(run.error[-1], error_rate(jnp.asarray(run.logits[-1]), y))
    assert run.test_accuracy == pytest.approx(1 - float(error_rate(run.logits[-1][:6], y[:6])))
    assert run.seconds_per_step > 0 and set(run.seconds) >= {"compile", "run", "finetune"}


def test_huge_lr_divergence_is_flagged_with_finite_curves():
    """The run stops at the first non-finite step of a plain optax loop and holds the last
    finite value; it rose above L_0 at step 1 and never came back."""
    params, x, y = problem()
    run = ntk_tt.finetune(mlp, params, x, y, learning_rate=1e4, steps=15, loss="mse")
    with np.errstate(over="ignore", invalid="ignore"):
        ref = reference_curve(params, x, y, lr=1e4, momentum=0.0, nesterov=False,
                              batches=ntk_tt.batch_indices(None, N, N, 15), loss="mse")
    stop = int(np.argmax(~np.isfinite(ref)))
    assert stop >= 2 and np.all(ref[1:stop] > 10 * ref[0])
    assert run.diverged and run.diverged_at == 1 and run.spiked_at == 1
    assert np.all(np.isfinite(run.loss)) and np.all(np.isfinite(run.error))
    np.testing.assert_allclose(run.loss[:stop], ref[:stop], rtol=1e-3)
    assert np.all(run.loss[stop:] == run.loss[stop - 1])
    assert run.seconds["finetune"] == pytest.approx(run.seconds_per_step * stop)


def test_spike_does_not_stop_training_and_non_finite_does():
    """Spec: a loss above 10·L_0 is trained through (every step equals a plain optax loop,
    eager and scanned); diverged iff L_T > L_0 there. A non-finite step holds the previous
    finite value."""
    params, x, y = problem()
    run = ntk_tt.finetune(mlp, params, x, y, learning_rate=30.0, steps=5)
    ref = reference_curve(params, x, y, lr=30.0, momentum=0.0, nesterov=False,
                          batches=ntk_tt.batch_indices(None, N, N, 5), loss="cross_entropy")
    assert ref[1] > 10 * ref[0] and run.spiked_at == 1
    np.testing.assert_allclose(run.loss, ref, rtol=1e-4)
    assert run.diverged == (ref[-1] > ref[0])
    core = finetune_core(mlp, params, x, y, ntk_tt.batch_indices(None, N, N, 5),
                         jnp.float32(30.0), jnp.float32(0.0))
    np.testing.assert_allclose(core.loss, run.loss, rtol=1e-5)
    assert int(core.spiked_at) == 1 and (int(core.diverged_at) >= 0) == run.diverged
    inf = ntk_tt.finetune(mlp, params, x, y, learning_rate=1e30, steps=3, loss="mse")
    assert inf.diverged_at == 1 and inf.spiked_at == 1 and np.all(inf.loss == inf.loss[0])


def test_compare_diverged_run_and_beyond_edge():
    params, x, y = problem()
    run = ntk_tt.finetune(mlp, params, x, y, learning_rate=30.0, steps=6)
    pred = ntk_tt.predict(mlp, params, x, y, learning_rate=30.0, steps=6)
    report = ntk_tt.compare(pred, run)
    assert report["predicted"]["beyond_edge"] is True
    assert report["predicted"]["kappa"] > 2
    # diverged: no curve distance or linearisation gap, no accuracy (not meaningful)
    assert report["curve_distance"] is None and report["linearisation_gap"] is None
    assert report["real"]["test_accuracy"] is None
    for curve in ("loss", "error"):
        assert all(t is None for t in report["real"]["training_time"][curve].values())
        assert set(report["real"]["training_time_reasons"][curve].values()) == {
            "diverged at step 1"}


def test_compare_refuses_a_run_with_other_hyperparameters():
    params, x, y = problem()
    key = jax.random.key(3)
    run = ntk_tt.finetune(mlp, params, x, y, learning_rate=0.1, steps=4, batch_size=8,
                          momentum=0.5, key=key)
    pred = ntk_tt.predict(mlp, params, x, y, learning_rate=0.1, steps=4, batch_size=8,
                          momentum=0.5, key=key, num_paths=2)
    assert pred.hyperparameters == {"learning_rate": 0.1, "momentum": 0.5, "nesterov": False,
                                    "batch_size": 8, "steps": 4, "num_train": N,
                                    "num_classes": C, "loss": "cross_entropy"}
    ntk_tt.compare(pred, run)  # same training: accepted
    other = ntk_tt.predict(mlp, params, x, y, learning_rate=0.2, steps=4, momentum=0.9)
    with pytest.raises(ValueError, match=r"learning_rate: predicted 0.2, fine-tuned 0.1.*"
                                         r"momentum.*batch_size: predicted 24, fine-tuned 8"):
        ntk_tt.compare(other, run)
    mse = ntk_tt.finetune(mlp, params, x, y, learning_rate=0.1, steps=4, batch_size=8,
                          momentum=0.5, key=key, loss="mse")
    with pytest.raises(ValueError, match="loss: predicted 'cross_entropy', fine-tuned 'mse'"):
        ntk_tt.compare(pred, mse)
    fewer = ntk_tt.finetune(mlp, params, x[:12], y[:12], learning_rate=0.1, steps=4)
    with pytest.raises(ValueError, match=r"N \(training samples\): predicted 24, fine-tuned 12\)"):
        ntk_tt.compare(pred, fewer)
    with pytest.raises(ValueError, match="in that order; got FineTuneRun and Prediction"):
        ntk_tt.compare(run, pred)


def test_compare_refuses_a_run_on_other_data_or_weights():
    """Same hyperparameters, other inputs / labels / weights: the initial losses differ."""
    params, x, y = problem()
    kw = dict(learning_rate=0.1, steps=4)
    pred = ntk_tt.predict(mlp, params, x, y, **kw)
    other = jax.tree.map(lambda a: 2 * a, params)
    for run in (ntk_tt.finetune(mlp, params, 3 * x, y[::-1], **kw),
                ntk_tt.finetune(mlp, other, x, y, **kw)):
        with pytest.raises(ValueError, match=rf"start from different losses \(L_0 = loss at step "
                                             rf"0: predicted {pred.loss[0]:.6g}, fine-tuned "
                                             rf"{run.loss[0]:.6g}\).*same model, weights and"):
            ntk_tt.compare(pred, run)


def test_compare_refuses_a_run_with_another_held_out_set():
    """Same training, other held-out inputs: the step-0 held-out losses differ and compare
    says so (before, it put one set's predicted accuracy beside another's real one); the
    same held-out set is accepted."""
    params, x, y = problem()
    xt, yt = x[:8] + 0.5, y[:8]
    kw = dict(learning_rate=0.1, steps=4)
    pred = ntk_tt.predict(mlp, params, x, y, x_test=xt, y_test=yt, **kw)
    same = ntk_tt.finetune(mlp, params, x, y, x_test=xt, y_test=yt, record_test_curves=True,
                           **kw)
    assert abs(pred.test_loss[0] - same.test_loss[0]) <= 1e-5 * same.test_loss[0]
    ntk_tt.compare(pred, same)
    other = ntk_tt.finetune(mlp, params, x, y, x_test=3 * xt, y_test=yt[::-1],
                            record_test_curves=True, **kw)
    with pytest.raises(ValueError, match=rf"different held-out losses \(test_loss at step 0: "
                                         rf"predicted {pred.test_loss[0]:.6g}, fine-tuned "
                                         rf"{other.test_loss[0]:.6g}\).*same x_test, y_test"):
        ntk_tt.compare(pred, other)


def test_core_vmaps_over_learning_rate_and_momentum():
    params, x, y = problem()
    batches = ntk_tt.batch_indices(jax.random.key(0), N, 8, 9)
    lrs, ms = jnp.array([0.1, 0.4, 1e4]), jnp.array([0.0, 0.9, 0.5])
    sweep = jax.jit(jax.vmap(lambda lr, m: finetune_core(mlp, params, x, y, batches, lr, m)))(
        lrs, ms)
    for i in range(3):
        one = finetune_core(mlp, params, x, y, batches, lrs[i], ms[i])
        # η = 1e4 trains on through huge losses, where vmapped rounding grows: 3 steps only
        stop = 10 if i < 2 else 3
        np.testing.assert_allclose(sweep.loss[i, :stop], one.loss[:stop], rtol=1e-5)
        assert int(sweep.diverged_at[i]) == int(one.diverged_at)
        assert int(sweep.spiked_at[i]) == int(one.spiked_at)
    assert int(sweep.diverged_at[2]) > 0 and int(sweep.diverged_at[0]) == -1


@pytest.mark.parametrize("kwargs,match", [
    (dict(learning_rate=0.0), "learning_rate"),
    (dict(momentum=1.0), "momentum"),
    (dict(batch_size=100), "batch_size"),
    (dict(batch_size=4), "key"),
    (dict(loss="hinge"), "loss"),
    (dict(y=jnp.zeros((N, C), jnp.int32)), "labels"),
    (dict(y=jnp.full((N,), C)), r"\[0, 3\)"),
    (dict(x_test=jnp.zeros((2, DIN))), "y_test"),
    # a fresh user's B = 10.5 and True ran with B = 10 and 1; nesterov="no" ran Nesterov
    (dict(batch_size=10.5, key=jax.random.key(0)), r"batch_size must satisfy .*\(an int\)"),
    (dict(batch_size=True, key=jax.random.key(0)), r"batch_size must satisfy .*\(an int\)"),
    (dict(nesterov="no", momentum=0.5), "nesterov must be True or False"),
    (dict(nesterov=1, momentum=0.5), "nesterov must be True or False"),
])
def test_bad_input_raises_value_error(kwargs, match):
    params, x, y = problem()
    args = dict(learning_rate=0.1, steps=3, y=y) | kwargs
    with pytest.raises(ValueError, match=match):
        ntk_tt.finetune(mlp, params, x, **args)


def test_python_lists_are_converted_and_strings_or_int_keys_refused():
    params, x, y = problem()
    args = dict(learning_rate=0.1, steps=3)
    ref = ntk_tt.finetune(mlp, params, x, y, **args)
    run = ntk_tt.finetune(mlp, params, np.asarray(x).tolist(), np.asarray(y).tolist(), **args)
    np.testing.assert_allclose(run.loss, ref.loss, rtol=1e-6)
    for kwargs, message in [
        (dict(learning_rate="0.1"), "learning_rate must be a real number, got str; pass e.g. "
                                    "learning_rate=0.1 (a float, not a string)."),
        (dict(momentum="0.9"), "momentum must be a real number, got str; pass e.g. "
                               "momentum=0.1 (a float, not a string)."),
        (dict(key=0, batch_size=4), "key must be a jax random key, got int; pass "
                                    "key=jax.random.key(seed)."),
    ]:
        with pytest.raises(ValueError) as err:
            ntk_tt.finetune(mlp, params, x, y, **(args | kwargs))
        assert str(err.value) == message
    with pytest.raises(ValueError, match=r"^y must hold numbers, got a list of shape \(24,\)"):
        ntk_tt.finetune(mlp, params, x, ["cat"] * N, **args)


@pytest.mark.parametrize("name, value", [
    ("learning_rate", np.geomspace(0.1, 0.01, 3)),  # a per-step schedule
    ("learning_rate", jnp.array([0.1])),
    ("momentum", np.array([0.9, 0.0, 0.0])),
])
@pytest.mark.parametrize("entry", ["finetune", "step_time"])
def test_array_hyperparameters_are_named_not_ambiguous(name, value, entry, monkeypatch):
    """Issue 25: an array η (a schedule) or m is one ValueError naming the argument (it was
    NumPy's "truth value of an array is ambiguous"), before the model is run."""
    params, x, y = problem()
    calls = []
    monkeypatch.setattr("ntk_tt.training._finetune.check_model",
                        lambda *a, **k: calls.append(a))
    fn = getattr(ntk_tt, entry)
    kw = dict(learning_rate=0.1) | ({"steps": 3} if entry == "finetune" else {})
    with pytest.raises(ValueError) as err:
        fn(mlp, params, x, y, **(kw | {name: value}))
    assert str(err.value) == (
        f"{name} must be a scalar, one value for every step; got an array of shape "
        f"{np.shape(value)}. For a per-step schedule use optimizer=ntk_tt.sgd("
        f"ntk_tt.schedule(...)); else a scalar, e.g. "
        f"{name}={0.01 if name == 'learning_rate' else 0.9}.")
    assert calls == []


def test_training_labels_of_one_class_are_refused_held_out_ones_are_not():
    """As ``ntk-tt`` refuses -K 1; a one-output MSE fit (C = 1, labels all 0) stays allowed
    (tests/test_losses.py)."""
    params, x, _ = problem()
    one = jnp.full((N,), 1)
    for fn, kw in ((ntk_tt.finetune, dict(steps=2)), (ntk_tt.step_time, {})):
        with pytest.raises(ValueError, match=r"^y holds labels of one class only \(all 1, "
                                             r"N = 24\): a task needs at least two classes"):
            fn(mlp, params, x, one, learning_rate=0.1, **kw)
    run = ntk_tt.finetune(mlp, params, x[:18], jnp.arange(18) % C, learning_rate=0.1, steps=2,
                          x_test=x[18:], y_test=one[18:])
    assert run.test_accuracy == pytest.approx(float(np.mean(np.argmax(
        mlp(run.params, x[18:]), 1) == 1)))


def test_compare_of_runs_shorter_than_the_smoothing_window():
    """T = 3 gives 4-entry curves, shorter than the 5-step window: both sides fall back to no
    smoothing (the real side raised "window must be an odd int ..." before)."""
    params, x, y = problem()
    run = ntk_tt.finetune(mlp, params, x, y, learning_rate=0.5, steps=3)
    pred = ntk_tt.predict(mlp, params, x, y, learning_rate=0.5, steps=3)
    report = ntk_tt.compare(pred, run)
    for eps in (0.01, 0.1, 0.4):
        want = ntk_tt.training_time(run.loss, eps, window=1)
        assert report["real"]["training_time"]["loss"][eps] == want
        assert report["predicted"]["training_time"]["loss"][eps] == ntk_tt.training_time(
            pred.loss, eps, window=1)
