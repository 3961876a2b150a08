"""predict_from_subset: App. D end to end (subset draw, kernels, residual, spectrum, curve)."""

import jax
import numpy as np
import pytest
from _dynamics_helpers import linear_apply, linear_problem
from _ntk_models import mlp

import ntk_tt
from ntk_tt._subset import _predict_on_indices, balanced_subset, residual_in_blocks

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
    (dict(forward_block_size=0), "forward_block_size must be"),
])
def test_bad_input_is_refused_before_any_kernel_work(kwargs, match, monkeypatch):
    apply_fn, params, x, y = _task()

    def refuse(*_, **__):
        raise AssertionError("kernel work started before validation")

    monkeypatch.setattr("ntk_tt._subset.empirical_ntk", refuse)
    kw = dict(subset_size=30, learning_rate=0.1, steps=10, key=jax.random.key(0)) | kwargs
    with pytest.raises(ValueError, match=match):
        ntk_tt.predict_from_subset(apply_fn, params, x, y, **kw)


def test_class_with_too_few_samples_is_named():
    apply_fn, params, x, _ = _task(n=30)
    y = np.array([0] * 20 + [1] * 6 + [2] * 4)
    with pytest.raises(ValueError, match="class 2 has only 4; choose N' <= 12"):
        ntk_tt.predict_from_subset(apply_fn, params, x, y, subset_size=15, learning_rate=0.1,
                                   steps=5, key=jax.random.key(0))


def test_subset_is_exported_lazily():
    assert "predict_from_subset" in ntk_tt.__all__ and "SubsetPrediction" in ntk_tt.__all__
    assert ntk_tt.predict_from_subset.__module__ == "ntk_tt._subset"
