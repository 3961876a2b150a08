"""predict_from_subset (App. D end to end), predict(subset=...) and ntk-tt predict --subset."""

import json

import jax
import numpy as np
import pytest
from _dynamics_helpers import linear_apply, linear_problem
from _ntk_models import mlp

import ntk_tt
from ntk_tt.cli import main
from ntk_tt.dynamics._training_time import DIVERGED, REASONS
from ntk_tt.prediction._subset import _predict_on_indices, balanced_subset, residual_in_blocks

EPS = (0.01, 0.1, 0.4)


def _task(n=120, c=3, seed=0):
    """Tiny structured 3-class task for a width-64 tanh MLP (D = 640 > N: full-rank Θ):
    balanced labels, inputs around class means."""
    apply_fn, params = mlp(jax.random.key(seed), d_in=6, width=64, c=c)
    y = np.arange(n) % c
    means = jax.random.normal(jax.random.key(seed + 1), (c, 6))
    x = jax.random.normal(jax.random.key(seed + 2), (n, 6)) + 1.5 * means[y]
    return apply_fn, params, x, y


def _full_curve(apply_fn, params, x, y, lr, steps):
    kern = ntk_tt.empirical_ntk(apply_fn, params, x, trace_logits=True)
    f0 = np.asarray(apply_fn(params, x))
    sp = ntk_tt.kernel_spectrum(kern, f0 - np.eye(f0.shape[1])[y])
    return np.asarray(ntk_tt.predict_curve_from_spectrum(sp, learning_rate=lr, steps=steps)), sp


@pytest.fixture(scope="module")
def task():
    apply_fn, params, x, y = _task()
    kern = ntk_tt.empirical_ntk(apply_fn, params, x, trace_logits=True)
    r = np.asarray(apply_fn(params, x)) - np.eye(3)[y]
    full = ntk_tt.kernel_spectrum(kern, r)
    lr = 1.0 / float(full.eigenvalues[0])  # κ = 1 on the full kernel
    ref = np.asarray(ntk_tt.predict_curve_from_spectrum(full, learning_rate=lr, steps=100))
    return apply_fn, params, x, y, lr, ref


@pytest.mark.parametrize("method,tol_curve,tol_t", [("power_law", 0.03, 0.1),
                                                   ("nystrom", 0.01, 0.05)])
def test_subset_curve_close_to_full_kernel(task, method, tol_curve, tol_t):
    """N = 120, N' = 90: the subset curve is close to Prop. 2 on the full kernel's exact
    spectrum (max |ΔL| relative to the fall, and T_ε), κ close, T_ε = training_time(curve)."""
    apply_fn, params, x, y, lr, ref = task
    p = ntk_tt.predict_from_subset(apply_fn, params, x, y, subset_size=90, learning_rate=lr,
                                   steps=100, method=method, key=jax.random.key(3))
    assert p.loss.shape == (101,) and p.num_samples == 120 and p.subset_size == 90
    np.testing.assert_allclose(p.loss[0], ref[0], rtol=1e-5)  # L_0 = ‖δy‖²/2N exactly
    assert np.max(np.abs(p.loss - ref)) / (ref[0] - ref[-1]) < tol_curve
    for e in EPS:
        t_ref = ntk_tt.training_time(ref, e)
        assert p.training_time[e] == ntk_tt.training_time(p.loss, e)
        assert abs(p.training_time[e] - t_ref) <= max(1.0, tol_t * t_ref), (e, p.training_time)
    assert abs(p.kappa - 1.0) < 0.05 and not p.beyond_edge and not p.diverged
    assert p.spectrum.num_samples == 120
    assert set(p.seconds) == {"kernel", "logits", "spectrum", "curve", "total", "compile"}
    assert all(v >= 0 for v in p.seconds.values())


def test_subset_draw_is_class_balanced_and_keyed():
    y = np.array([0] * 10 + [1] * 7 + [2] * 9)
    a = balanced_subset(y, 15, jax.random.key(0))
    assert len(a) == 15 and np.all(np.diff(a) > 0)
    assert np.all(np.bincount(y[a]) == 5)
    assert np.array_equal(a, balanced_subset(y, 15, jax.random.key(0)))
    assert not np.array_equal(a, balanced_subset(y, 15, jax.random.key(1)))


def test_all_landmarks_equal_the_full_kernel_exactly():
    """Landmarks = all N samples (the underlying function): Nyström reproduces Θ, the power
    law returns the exact spectrum (N' = N); both curves equal the full kernel's (float64)."""
    with jax.enable_x64(True):
        apply_fn, params, x, y = _task(n=45)
        lr = 0.5 / float(_full_curve(apply_fn, params, x, y, 1.0, 1)[1].eigenvalues[0])
        ref, _ = _full_curve(apply_fn, params, x, y, lr, 60)
        idx = np.arange(45)
        ny = _predict_on_indices(apply_fn, params, x, y, idx, learning_rate=lr, steps=60,
                                 method="nystrom", rcond=1e-13)
        pl = _predict_on_indices(apply_fn, params, x, y, idx, learning_rate=lr, steps=60,
                                 method="power_law")
    np.testing.assert_allclose(ny.loss, ref, rtol=1e-9)
    np.testing.assert_allclose(pl.loss, ref, rtol=1e-9)
    for e in EPS:
        assert ny.training_time[e] == pl.training_time[e] == ntk_tt.training_time(ref, e)


def test_nystrom_exact_from_a_subset_when_it_spans_the_kernel():
    """Linear model f = xW + b, 6 features: Θ_tr = C(xxᵀ + 1) has rank 7, so 12 landmarks
    span it and predict_from_subset(method="nystrom") equals the full kernel's curve."""
    with jax.enable_x64(True):
        params, x, _ = linear_problem(n=40, d=6, c=3)
        y = np.arange(40) % 3
        ref, full = _full_curve(linear_apply, params, x, y, 1.0, 1)
        lr = 1.5 / float(full.eigenvalues[0])
        ref, _ = _full_curve(linear_apply, params, x, y, lr, 50)
        p = ntk_tt.predict_from_subset(linear_apply, params, x, y, subset_size=12,
                                       learning_rate=lr, steps=50, method="nystrom",
                                       key=jax.random.key(0), rcond=1e-10)
    np.testing.assert_allclose(p.loss, ref, rtol=1e-8)
    np.testing.assert_allclose(p.kappa, 1.5, rtol=1e-8)


def test_kappa_and_beyond_edge_use_the_largest_eigenvalue_of_the_spectrum_used(monkeypatch):
    """κ was η·μ_1 of the predicted spectrum, but an extrapolated tail can start above the kept
    head (a subset spectrum flat up to k0 = 2, falling fast beyond: μ_2 ≈ 4·μ_1); at
    η = 1/μ_1 the curve diverged while κ said 1 and beyond_edge False. Now κ = η·max μ_k."""
    apply_fn, params, x, y = _task(n=60)
    k = np.arange(1, 31, dtype=np.float64)
    v = np.linalg.qr(np.random.default_rng(0).normal(size=(30, 30)))[0]
    kern = (v * (3 * 30 * np.where(k <= 10, 1.0, np.exp(-(k - 10))))) @ v.T  # Θ_tr, C = 3
    monkeypatch.setattr("ntk_tt.prediction._subset.empirical_ntk", lambda *a, **kw: kern)
    p = ntk_tt.predict_from_subset(apply_fn, params, x, y, subset_size=30, learning_rate=1.0,
                                   steps=50, key=jax.random.key(0), k0=2)
    eig = np.asarray(p.spectrum.eigenvalues)
    np.testing.assert_allclose(eig[0], 1.0, rtol=1e-5)
    assert eig.max() > 4 and p.kappa == pytest.approx(float(eig.max()))
    assert p.beyond_edge and p.diverged
    # a fresh user: the diverged curve's T_ε reason was "curve is flat or rising"; the kernel
    # predictors say it diverged
    for eps in (0.01, 0.1, 0.4):
        assert np.isnan(p.training_time[eps])
        assert p.training_time_reasons[eps] == REASONS[DIVERGED]


def test_residual_in_blocks_and_block_size_do_not_change_the_result(task):
    apply_fn, params, x, y, lr, _ = task
    r = residual_in_blocks(apply_fn, params, x, y, 1000)
    np.testing.assert_allclose(residual_in_blocks(apply_fn, params, x, y, 7), r, rtol=1e-6,
                               atol=1e-6)
    np.testing.assert_allclose(r, np.asarray(apply_fn(params, x)) - np.eye(3)[y], rtol=1e-6,
                               atol=1e-6)
    kw = dict(subset_size=60, learning_rate=lr, steps=20, key=jax.random.key(1))
    a = ntk_tt.predict_from_subset(apply_fn, params, x, y, **kw)
    b = ntk_tt.predict_from_subset(apply_fn, params, x, y, forward_block_size=11, **kw)
    np.testing.assert_allclose(a.loss, b.loss, rtol=1e-5)
    assert np.array_equal(a.subset_indices, b.subset_indices)


@pytest.mark.parametrize("kwargs,match", [
    (dict(loss="cross_entropy"), "predicts the mean MSE loss"),
    (dict(batch_size=10), "full-batch gradient descent only"),
    (dict(momentum=0.9), "plain gradient descent only"),
    (dict(key=None), "pass key=jax.random.key"),
    (dict(key=3), "key must be a jax random key"),
    (dict(subset_size=31), "must be a multiple of the K = 3 classes"),
    (dict(subset_size=120), "K <= N' < N = 120"),
    (dict(subset_size=0), "K <= N' < N"),
    (dict(subset_size=30.0), "must be an integer N'"),
    (dict(learning_rate=0.0), "learning_rate must be a finite scalar > 0"),
    (dict(learning_rate="0.1"), "learning_rate must be a real number"),
    (dict(steps=0), "steps must be an integer >= 1"),
    (dict(method="lanczos"), r"method must be one of \('power_law', 'nystrom'\)"),
    (dict(method="nystrom", k0=5), "k0 apply to method='power_law' only"),
    (dict(k0=31), r"k0 must be an integer in \[1, N'\] = \[1, 30\]"),
    (dict(fit_range=(5, 40)), "fit_range"),
    (dict(rcond=0.0), "rcond must be"),
    (dict(method="nystrom", rcond=2.0), r"^rcond must be in \(0, 1\) .*got 2\.0; e\.g\. 1e-6"),
    (dict(rcond=1.0), r"^rcond must be in \(0, 1\)"),
    (dict(slope_correction=-5.0), r"^slope_correction α must be finite and >= 0 \(it steepens"),
    (dict(forward_block_size=0), "forward_block_size must be"),
])
def test_bad_input_is_refused_before_any_kernel_work(kwargs, match, monkeypatch):
    apply_fn, params, x, y = _task()

    def refuse(*_, **__):
        raise AssertionError("kernel work started before validation")

    monkeypatch.setattr("ntk_tt.prediction._subset.empirical_ntk", refuse)
    kw = dict(subset_size=30, learning_rate=0.1, steps=10, key=jax.random.key(0)) | kwargs
    with pytest.raises(ValueError, match=match):
        ntk_tt.predict_from_subset(apply_fn, params, x, y, **kw)


def test_a_traced_argument_is_one_line_naming_the_jittable_spectrum_path(monkeypatch):
    """Under jax.jit / grad the subset prediction used to fail deep inside with a raw
    TracerArrayConversionError (a fresh user's find); now one ValueError names the traced
    argument and the jittable part (predict_curve_from_spectrum on the spectrum)."""
    apply_fn, params, x, y = _task()

    def refuse(*_, **__):
        raise AssertionError("kernel work started before the traced argument was refused")

    monkeypatch.setattr("ntk_tt.prediction._subset.empirical_ntk", refuse)
    kw = dict(subset_size=30, steps=10, key=jax.random.key(0))

    def by_lr(lr):
        return ntk_tt.predict_from_subset(apply_fn, params, x, y, learning_rate=lr, **kw).loss

    def by_params(p):
        return ntk_tt.predict_from_subset(apply_fn, p, x, y, learning_rate=0.1, **kw).loss[-1]

    match = r"cannot run under jax\.jit, vmap or grad \({} is traced\).*predict_curve_from_spectrum"
    with pytest.raises(ValueError, match=match.format("learning_rate")):
        jax.jit(by_lr)(0.1)
    with pytest.raises(ValueError, match=match.format("params")):
        jax.grad(by_params)(params)
    # a second probe: the subset draw's key, momentum, slope_correction and rcond were raw
    for name, value, extra in (("key", jax.random.key(1), {}), ("momentum", 0.0, {}),
                               ("slope_correction", 0.5, {}),
                               ("rcond", 1e-6, {"method": "nystrom"})):
        def by(v, name=name, extra=extra):
            args = dict(kw, learning_rate=0.1, **extra) | {name: v}
            return ntk_tt.predict_from_subset(apply_fn, params, x, y, **args).loss
        with pytest.raises(ValueError, match=match.format(name)):
            jax.jit(by)(value)


def test_class_with_too_few_samples_is_named():
    apply_fn, params, x, _ = _task(n=30)
    y = np.array([0] * 20 + [1] * 6 + [2] * 4)
    with pytest.raises(ValueError, match="class 2 has only 4; choose N' <= 12"):
        ntk_tt.predict_from_subset(apply_fn, params, x, y, subset_size=15, learning_rate=0.1,
                                   steps=5, key=jax.random.key(0))


def _small_subset_warnings(call):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    said = [w for w in caught if "the subset of N'" in str(w.message)]
    # at the user's line (this file), however deep in the package: predict(subset=) named
    # its own _predict_subset.py
    assert all(w.filename == __file__ for w in said), [w.filename for w in said]
    return [str(w.message) for w in said]


@pytest.mark.parametrize("per", [1, 2, 3, 4])
def test_a_subset_of_fewer_than_4_per_class_warns_before_the_kernel(per, monkeypatch):
    """A fresh user's probe: subset=K (one image per class) was accepted without a word. The
    T_ε it gives scatters widely between draws, and not much less at 2 or 3 per class (a
    smooth fall with N', measured in STABLE_PER_CLASS's docstring), so below 4 per class it
    warns, before any kernel work, through predict_from_subset and predict(subset=) alike;
    from 4 per class it does not."""
    apply_fn, params, x, y = _task()  # K = 3 classes, N = 120

    def refuse(*_, **__):
        raise AssertionError("kernel work started")

    monkeypatch.setattr("ntk_tt.prediction._subset.empirical_ntk", refuse)
    n_sub, kw = 3 * per, dict(learning_rate=0.01, steps=10, key=jax.random.key(0))
    expected = [] if per >= 4 else [
        f"the subset of N' = {n_sub} samples holds {per} of each of the K = 3 classes: with "
        "fewer than 4 per class its spectrum, and the predicted T_ε, change a lot from one "
        "subset draw (key) to the next (on small test tasks at 1 to 3 per class: T_ε off by "
        "a median 35 to 85 % and by up to 750 %, once divergence called for a κ = 1 run); "
        "take it as a rough guess, or use N' >= 12 (4 per class) or more."]

    def from_subset():
        with pytest.raises(AssertionError, match="kernel work started"):
            ntk_tt.predict_from_subset(apply_fn, params, x, y, subset_size=n_sub, **kw)

    def predict():
        with pytest.raises(AssertionError, match="kernel work started"):
            ntk_tt.predict(apply_fn, params, x, y, loss="mse", subset=n_sub, **kw)

    def predict_optimizer():
        with pytest.raises(AssertionError, match="kernel work started"):
            ntk_tt.predict(apply_fn, params, x, y, loss="mse", subset=n_sub, steps=10,
                           key=jax.random.key(0), optimizer=ntk_tt.sgd(0.01))

    assert _small_subset_warnings(from_subset) == expected
    assert _small_subset_warnings(predict) == expected  # once: not again inside
    assert _small_subset_warnings(predict_optimizer) == expected

    def refused():  # a refusal comes alone, without the warning
        with pytest.raises(ValueError, match="learning_rate must be a finite scalar > 0"):
            ntk_tt.predict_from_subset(apply_fn, params, x, y, subset_size=n_sub,
                                       **kw | dict(learning_rate=-1.0))

    assert _small_subset_warnings(refused) == []


def test_one_per_class_still_predicts_a_curve_of_the_full_length(task):
    """The warning does not stop the prediction: subset = K still gives the whole curve,
    from the exact L_0, and its T_ε."""
    apply_fn, params, x, y, lr, ref = task
    p = ntk_tt.predict_from_subset(apply_fn, params, x, y, subset_size=3, learning_rate=lr,
                                   steps=100, method="nystrom", key=jax.random.key(3))
    assert p.loss.shape == (101,) and p.subset_size == 3
    np.testing.assert_allclose(p.loss[0], ref[0], rtol=1e-5)  # L_0 = ‖δy‖²/2N exactly
    assert all(p.training_time[e] == ntk_tt.training_time(p.loss, e) for e in EPS)


def test_predict_with_subset_is_a_loss_only_prediction(task):
    apply_fn, params, x, y, lr, _ = task
    key = jax.random.key(5)
    pred = ntk_tt.predict(apply_fn, params, x, y, learning_rate=lr, steps=30, loss="mse",
                          subset=60, subset_method="nystrom", key=key)
    ref = ntk_tt.predict_from_subset(apply_fn, params, x, y, subset_size=60, learning_rate=lr,
                                     steps=30, method="nystrom", key=key)
    np.testing.assert_allclose(pred.loss, ref.loss, rtol=1e-6)
    assert pred.training_time["loss"] == ref.training_time
    assert np.all(np.isnan(pred.error)) and pred.error.shape == (31,)
    assert all(np.isnan(t) for t in pred.training_time["error"].values())
    assert all("not predicted" in r for r in pred.training_time_reasons["error"].values())
    assert pred.kernel == "traced:subset60:nystrom" and pred.method == "closed_form"
    hp = pred.hyperparameters
    assert hp["batch_size"] == hp["num_train"] == 120 and hp["subset_size"] == 60
    assert pred.kappa == pytest.approx(ref.kappa)
    assert {"kernel", "logits", "solve", "total", "compile"} <= set(pred.seconds)
    iv = ntk_tt.intervals(pred)  # works on a subset prediction like on any other
    assert set(iv["loss"]) == set(EPS)


@pytest.mark.parametrize("kwargs,match", [
    (dict(loss="cross_entropy"), r"predict\(subset=...\) predicts the mean MSE loss"),
    (dict(batch_size=20), "full-batch gradient descent only"),
    (dict(momentum=0.5), "plain gradient descent only"),
    (dict(method="ode"), "method must be 'auto' or 'closed_form'"),
    (dict(kernel="sketch"), "kernel must be 'exact' or 'traced'"),
    (dict(predictor="head_aware"), "frozen-kernel linear predictor"),
    (dict(head="a split_head tuple"), "frozen-kernel linear predictor"),  # auto + head
    (dict(x_test="XT", y_test="YT"), "drop x_test and y_test"),
    (dict(key=None), "pass key=jax.random.key"),
    (dict(subset_method="svd"), "subset_method must be one of"),
    (dict(subset=None, subset_method="nystrom"), "subset_method applies with subset"),
    (dict(subset=7), "must be a multiple of the K = 3 classes"),
])
def test_predict_subset_bad_options(task, kwargs, match, monkeypatch):
    apply_fn, params, x, y, _, _ = task

    def refuse(*_, **__):
        raise AssertionError("kernel work started before validation")

    monkeypatch.setattr("ntk_tt.prediction._subset.empirical_ntk", refuse)
    kw = dict(learning_rate=0.01, steps=10, loss="mse", subset=30, key=jax.random.key(0))
    kw |= kwargs
    if "x_test" in kwargs:
        kw["x_test"], kw["y_test"] = x[:6], y[:6]
    with pytest.raises(ValueError, match=match):
        ntk_tt.predict(apply_fn, params, x, y, **kw)


@pytest.mark.parametrize("kwargs,match", [
    (dict(key=None), r"^predict\(subset=\.\.\.\) draws the subset at random: pass "
                     r"key=jax\.random\.key\(seed\)\.$"),
    (dict(key=None, learning_rate=None, optimizer=ntk_tt.sgd(0.01, momentum=0.5)),
     r"^predict\(subset=\.\.\.\) draws the subset at random"),
    (dict(subset=7), r"^subset N' = 7 must be a multiple of the K = 3 classes .*N' = N is the "
                     r"full kernel: drop subset\); e\.g\. 30\.$"),
    (dict(subset=120), r"^subset N' = 120 must be .*K <= N' < N = 120"),
    (dict(subset=30.0), r"^subset must be an integer N' \(samples in the subset\), got 30\.0\."),
    (dict(learning_rate=None, optimizer=ntk_tt.sgd(0.01), subset=31), r"^subset N' = 31 must"),
    (dict(momentum=0.5), r"^predict\(subset=\.\.\.\)'s momentum= keyword .* pass optimizer="
                         r"ntk_tt\.sgd\(learning_rate, momentum=m\) to predict\(subset=\.\.\.\) "
                         r"instead of learning_rate= and momentum=\.$"),
    (dict(loss="cross_entropy"), r"^predict\(subset=\.\.\.\) predicts the mean MSE .* or "
                                 r"ntk_tt\.predict without subset \(the full kernel\)"),
    (dict(batch_size=20), r"^predict\(subset=\.\.\.\) predicts full-batch .* or ntk_tt\.predict "
                          r"without subset \(the full kernel\) for SGD\.$"),
])
def test_predict_subset_errors_name_predict_and_its_arguments(task, kwargs, match, monkeypatch):
    """``predict(subset=...)``'s refusals name ``predict(subset=...)`` and ``predict``'s own
    arguments (``subset``, ``key``), never ``predict_from_subset`` or its ``subset_size``: the
    user looks for the arguments they passed (the key and N' messages were
    predict_from_subset's, the momentum advice sent them to predict_from_subset)."""
    apply_fn, params, x, y, _, _ = task

    def refuse(*_, **__):
        raise AssertionError("kernel work started before validation")

    monkeypatch.setattr("ntk_tt.prediction._subset.empirical_ntk", refuse)
    kw = dict(learning_rate=0.01, steps=10, loss="mse", subset=30, key=jax.random.key(0))
    with pytest.raises(ValueError, match=match) as err:
        ntk_tt.predict(apply_fn, params, x, y, **(kw | kwargs))
    assert "predict_from_subset" not in str(err.value)
    assert "subset_size" not in str(err.value)


def test_predict_subset_power_law_failure_names_predict(task, monkeypatch):
    """A power-law extrapolation that fails after the kernel work ("choose another k0") is
    worded for predict(subset=...), which takes no k0: the other subset_method or subset, or
    predict_from_subset's k0= / fit_range=; predict_from_subset keeps the fit's own message."""
    apply_fn, params, x, y, lr, _ = task
    said = ("no power-law tail from k0 = 7 to K = 120 carries the missing residual mass 1 "
            "from the anchor p_k0 = 0.1; choose another k0.")

    def fail(*_, **__):
        raise ValueError(said)

    monkeypatch.setattr("ntk_tt.prediction._subset.extrapolate_spectrum", fail)
    kw = dict(learning_rate=lr, steps=10, loss="mse", key=jax.random.key(0))
    with pytest.raises(ValueError) as err:
        ntk_tt.predict(apply_fn, params, x, y, subset=30, subset_method="power_law", **kw)
    assert str(err.value) == (
        f"predict(subset=...): the power-law extrapolation of the N' = 30 subset's spectrum "
        f"failed with its default k0 and fit range ({said}); use subset_method='nystrom' or "
        "another subset, or choose k0= / fit_range= with ntk_tt.predict_from_subset.")
    with pytest.raises(ValueError) as err:
        ntk_tt.predict_from_subset(apply_fn, params, x, y, subset_size=30, **kw)
    assert str(err.value) == said


# ---- ntk-tt predict --subset -----------------------------------------------------------

def _cli_error(args, capsys, monkeypatch):
    def refuse(**_):
        raise AssertionError("work started before the options were checked")

    monkeypatch.setattr("ntk_tt.prediction._job.load_task", refuse)
    with pytest.raises(SystemExit) as exit_info:
        main(["predict", "--no-progress", "--figure", "", *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("ntk-tt: error:") and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("args,match", [
    (["--subset", "100"], "pass --loss mse, got loss 'cross_entropy'"),
    (["--subset", "100", "--loss", "mse", "-B", "50"], "predicts full-batch GD only: drop -B"),
    (["--subset", "100", "--loss", "mse", "-m", "0.9", "--method", "closed_form"],
     "with momentum (-m) runs each eigenmode's exact recursion"),
    (["--subset", "102", "--loss", "mse"], "must be a multiple of K = 5 classes with K <= N' "
                                           "< N = K·n = 5·150 = 750"),
    (["--subset", "750", "--loss", "mse"], "K <= N' < N = K·n"),
    (["--subset", "0", "--loss", "mse"], "must be an integer N' >= 1"),
    (["--subset", "100", "--loss", "mse", "--method", "ode"], "drop --method"),
    (["--subset", "100", "--loss", "mse", "--kernel", "sketch"], "drop --kernel sketch"),
    (["--subset", "100", "--loss", "mse", "--predictor", "head_aware"],
     "drop --predictor head_aware"),
    (["--subset", "100", "--loss", "mse", "--segments", "3"],
     "applies to the head-aware predictor only"),
    (["--subset-method", "nystrom"], "applies with subset (--subset N') only"),
])
def test_cli_subset_errors_are_one_line_before_any_work(args, match, capsys, monkeypatch):
    assert match in _cli_error(args, capsys, monkeypatch)


def test_cli_subset_help_is_shown(capsys):
    with pytest.raises(SystemExit):
        main(["predict", "-h"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--subset N'" in text and "--subset-method {power_law,nystrom}" in text
    assert "only with --loss mse and no -B" in text


def test_cli_subset_tiny_end_to_end(tmp_path, capsys):
    """Shipped checkpoint, 3 classes × 10 images, N' = 15 (Nyström); prediction only."""
    js = tmp_path / "r.json"
    code = main(["predict", "--no-progress", "-K", "3", "-n", "10", "--test-per-class", "2",
                 "-T", "8", "--lr", "0.002", "--loss", "mse", "--subset", "15",
                 "--subset-method", "nystrom", "--json", str(js), "--figure", ""])
    out = capsys.readouterr().out
    assert code == 0  # no wall-time bound: timing is for experiments/, not tests
    r = json.loads(js.read_text())
    assert r["predicted"]["kernel"] == "traced:subset15:nystrom"
    assert r["predicted"]["method"] == "closed_form"
    assert r["config"]["subset"] == 15 and r["task"]["n_train"] == 30
    assert len(r["curves"]["predicted"]["loss"]) == 9
    assert all(v is None for v in r["curves"]["predicted"]["error"])
    assert r["predicted"]["hyperparameters"]["subset_size"] == 15
    assert r["predicted"]["test_accuracy"] is None
    assert "kernel traced:subset15:nystrom" in out
    assert "(predicted: not predicted (--subset: loss curve only))" in out
    stages = r["seconds"]["predict_stages"]
    assert stages["kernel"] > 0 and stages["logits"] > 0


def test_subset_is_exported_lazily():
    assert "predict_from_subset" in ntk_tt.__all__ and "SubsetPrediction" in ntk_tt.__all__
    assert ntk_tt.predict_from_subset.__module__ == "ntk_tt.prediction._subset"
