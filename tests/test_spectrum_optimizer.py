"""predict_curve_from_spectrum / predict_from_subset with a full-batch SGD-family optimiser
(issue 27): each eigenmode's exact heavy-ball / Nesterov recursion with the schedule's η_t."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _dynamics_helpers import linear_apply, linear_problem

import ntk_tt
from ntk_tt.prediction._subset import _predict_on_indices

N, C, T, WARMUP, M = 6, 2, 40, 5, 0.9


def _gram():
    """A random PSD Θ (N·C, N·C), a residual δy (N, C) and Θ's exact spectrum (float64)."""
    rng = np.random.default_rng(0)
    a = rng.normal(size=(N * C, N * C))
    theta, r = a @ a.T, rng.normal(size=(N, C))
    with jax.enable_x64(True):
        return theta, r, ntk_tt.kernel_spectrum(theta, r)


def _numpy_momentum_loss(theta, r, rates, m, nesterov):
    """Explicit loop on the MSE linear model f_{t+1} = f_t − η_t (Θ/N (f_t − y) + momentum):
    optax's heavy-ball u_{t+1} = m u_t + g_t, step u_{t+1} (Nesterov: g_t + m u_{t+1})."""
    res, u = r.reshape(-1).copy(), np.zeros(r.size)
    out = [res @ res / (2 * N)]
    for lr in rates:
        g = theta @ res / N
        u = m * u + g
        res = res - lr * (g + m * u if nesterov else u)
        out.append(res @ res / (2 * N))
    return np.array(out)


@pytest.mark.parametrize("nesterov", [False, True])
def test_schedule_and_momentum_equal_an_explicit_numpy_loop(nesterov):
    theta, r, sp = _gram()
    peak = 1.0 / float(sp.eigenvalues[0])
    with jax.enable_x64(True):
        opt = ntk_tt.sgd(ntk_tt.warmup_cosine(peak, WARMUP, T), M, nesterov=nesterov)
        curve = np.asarray(ntk_tt.predict_curve_from_spectrum(sp, steps=T, optimizer=opt))
        rates = np.asarray(optax.warmup_cosine_decay_schedule(0.0, peak, WARMUP, T)(
            np.arange(T)))
    ref = _numpy_momentum_loss(theta, r, rates, M, nesterov)
    np.testing.assert_allclose(curve, ref, rtol=1e-9)
    assert ref[-1] < 0.5 * ref[0]  # it trains: the test is not about a flat curve


@pytest.mark.parametrize("x64", [True, False])
def test_constant_rate_keyword_path_is_unchanged_and_equals_sgd(x64):
    """learning_rate=η: the closed form (1 − η μ)^(2t) as before, bit for bit; sgd(η) gives the
    same bits, and both equal the explicit GD loop (m = 0)."""
    theta, r, sp = _gram()
    lr = 1.2 / float(sp.eigenvalues[0])
    with jax.enable_x64(x64):
        mu, p = jnp.asarray(sp.eigenvalues), jnp.asarray(sp.projections)
        if not x64:
            mu, p = mu.astype(jnp.float32), p.astype(jnp.float32)
        sp = ntk_tt.Spectrum(mu, p, N)
        t = jnp.arange(T + 1, dtype=mu.dtype)[:, None]
        old = np.asarray(((1.0 - lr * mu) ** 2) ** t @ p / (2 * N))  # the pre-issue formula
        kw = np.asarray(ntk_tt.predict_curve_from_spectrum(sp, learning_rate=lr, steps=T))
        opt = np.asarray(ntk_tt.predict_curve_from_spectrum(sp, steps=T,
                                                            optimizer=ntk_tt.sgd(lr)))
    assert np.array_equal(kw, old) and np.array_equal(opt, kw)
    ref = _numpy_momentum_loss(theta, r, np.full(T, lr), 0.0, False)
    np.testing.assert_allclose(opt, ref, rtol=1e-9 if x64 else 1e-4)


def _linear_task():
    """Linear model f = xW + b (6 features, N = 40, C = 3): Θ = (xxᵀ + 1) ⊗ I_C has rank 7,
    so 12 Nyström landmarks span it, and the traced kernel equals the full one."""
    params, x, _ = linear_problem(n=40, d=6, c=3)
    return params, x, np.arange(40) % 3


@pytest.mark.parametrize("nesterov", [False, True])
def test_subset_with_optimizer_equals_the_full_kernel_prediction(nesterov):
    with jax.enable_x64(True):
        params, x, y = _linear_task()
        opt = ntk_tt.sgd(ntk_tt.warmup_cosine(0.05, WARMUP, T), M, nesterov=nesterov)
        ref = ntk_tt.predict(linear_apply, params, x, y, optimizer=opt, steps=T, loss="mse",
                             method="discrete", kernel="exact")
        ny = ntk_tt.predict_from_subset(linear_apply, params, x, y, subset_size=12, steps=T,
                                        method="nystrom", key=jax.random.key(0), rcond=1e-10,
                                        optimizer=opt)
        full = _predict_on_indices(linear_apply, params, x, y, np.arange(40), learning_rate=None,
                                   steps=T, method="power_law", optimizer=opt)  # N' = N
    for p in (ny, full):
        np.testing.assert_allclose(p.loss, np.asarray(ref.loss), rtol=1e-8)
        np.testing.assert_allclose(p.kappa, float(ref.kappa), rtol=1e-8)
        assert p.beyond_edge == bool(ref.beyond_edge)
        hp = p.hyperparameters
        assert hp["momentum"] == pytest.approx(M) and hp["nesterov"] == nesterov
        assert hp["learning_rate"] == pytest.approx(0.05) and hp["schedule"] == "warmup_cosine"
    assert ref.loss[-1] < 0.5 * ref.loss[0]


def test_subset_constant_rate_keywords_equal_sgd_bit_for_bit():
    with jax.enable_x64(True):
        params, x, y = _linear_task()
        kw = dict(subset_size=12, steps=T, method="nystrom", key=jax.random.key(1))
        a = ntk_tt.predict_from_subset(linear_apply, params, x, y, learning_rate=0.05, **kw)
        b = ntk_tt.predict_from_subset(linear_apply, params, x, y, optimizer=ntk_tt.sgd(0.05),
                                       **kw)
    assert np.array_equal(a.loss, b.loss) and a.kappa == b.kappa
    assert a.training_time == b.training_time
    assert a.hyperparameters["momentum"] == b.hyperparameters["momentum"] == 0.0


def _boom(*_):
    raise AssertionError("the model was called before validation")


REFUSALS = [
    (ntk_tt.adamw(1e-3), {}, "elementwise moments mix the eigenmodes.*head=ntk_tt.split_head"),
    (ntk_tt.sgd(0.1, weight_decay=1e-3), {}, "weight decay acts on J·θ0.*weight_decay=0"),
    (ntk_tt.sgd(0.1, batch_size=5), {}, "batch_size=5: minibatches couple the eigenmodes"),
    (ntk_tt.sgd(0.1, 0.9), {"learning_rate": 0.1}, "drop learning_rate"),
    ("sgd", {}, "optimizer must be an ntk_tt.Optimizer"),
    (ntk_tt.sgd(ntk_tt.warmup_cosine(0.1, 50, 100)), {}, "warmup is 50 steps"),
]


@pytest.mark.parametrize("opt,extra,match", REFUSALS)
def test_spectrum_refusals(opt, extra, match):
    sp = ntk_tt.Spectrum(jnp.ones(3), jnp.ones(3), 12)
    with pytest.raises(ValueError, match=match):
        ntk_tt.predict_curve_from_spectrum(sp, steps=T, optimizer=opt, **extra)


@pytest.mark.parametrize("opt,extra,match", REFUSALS + [
    (ntk_tt.sgd(0.1, 0.9), {"momentum": 0.9}, "drop momentum"),
    (ntk_tt.sgd(0.1, 0.9), {"batch_size": 12}, "drop batch_size"),
    (None, {"learning_rate": 0.1, "momentum": 0.9},
     "plain gradient descent only.*optimizer=ntk_tt.sgd\\(learning_rate, momentum=m\\)"),
])
def test_subset_refusals_come_before_the_model_and_the_kernel(opt, extra, match, monkeypatch):
    def refuse(*_, **__):
        raise AssertionError("kernel work started before validation")

    monkeypatch.setattr("ntk_tt.prediction._subset.empirical_ntk", refuse)
    x, y = np.zeros((12, 4)), np.arange(12) % 3
    with pytest.raises(ValueError, match=match):
        ntk_tt.predict_from_subset(_boom, {}, x, y, subset_size=6, steps=T, optimizer=opt,
                                   key=jax.random.key(0), **extra)
