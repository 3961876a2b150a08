"""Exact discrete recursion vs real optax training of a linear model (linearisation exact)."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _dynamics_helpers import brute_ntk, linear_apply, linear_problem, train_optax

import ntk_tt

STEPS = 25
PATHS = 4


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


@partial(jax.jit, static_argnames=("batch_size", "nesterov", "loss"))
def _predict(kernel, f0, y, lr, m, key, kt, f0t, yt, *, batch_size, nesterov, loss):
    return ntk_tt.predict_from_kernel(
        kernel, f0, y, learning_rate=lr, momentum=m, steps=STEPS, batch_size=batch_size,
        nesterov=nesterov, loss=loss, method="discrete", key=key, num_paths=PATHS,
        kernel_test=kt, f0_test=f0t, y_test=yt)


_train = jax.jit(partial(train_optax, linear_apply), static_argnames=("nesterov", "loss"))


def _split(n_train=16):
    params, x, y = linear_problem(n=n_train + 4)
    return params, x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def _run(params, xtr, ytr, xte, yte, lr, m, key, *, batch_size, nesterov, loss):
    return _predict(brute_ntk(linear_apply, params, xtr), linear_apply(params, xtr), ytr, lr,
                    m, key, brute_ntk(linear_apply, params, xte, xtr),
                    linear_apply(params, xte), yte, batch_size=batch_size, nesterov=nesterov,
                    loss=loss)


@pytest.mark.parametrize(
    "momentum, nesterov, batch_size, loss",
    [(0.0, False, None, "cross_entropy"), (0.9, False, None, "cross_entropy"),
     (0.9, True, None, "cross_entropy"), (0.5, False, 4, "cross_entropy"),
     (0.9, False, None, "mse")],
    ids=["gd", "heavy_ball", "nesterov", "sgd_momentum", "heavy_ball_mse"],
)
def test_recursion_equals_optax_training_of_linear_model(x64, momentum, nesterov, batch_size,
                                                        loss):
    params, xtr, ytr, xte, yte = _split()
    key, lr = jax.random.key(7), 0.3
    pred = _run(params, xtr, ytr, xte, yte, lr, momentum, key, batch_size=batch_size,
                nesterov=nesterov, loss=loss)
    for p in range(PATHS if batch_size else 1):
        # path 0 uses batch_indices(key, ...), path p ≥ 1 that of split(key, PATHS)[p]
        bs = batch_size or 16
        path_key = key if p == 0 else jax.random.split(key, PATHS)[p]
        batches = ntk_tt.batch_indices(path_key, 16, bs, STEPS)
        fs = _train(params, xtr, ytr, batches, jnp.concatenate([xtr, xte]), lr, momentum,
                    nesterov=nesterov, loss=loss)
        real = jax.vmap(lambda f: ntk_tt.mean_loss(f[:16], ytr, loss))(fs)
        real_test = jax.vmap(lambda f: ntk_tt.mean_loss(f[16:], yte, loss))(fs)
        # Tolerance: 1e-6 relative at every step (x64; differences are rounding only).
        np.testing.assert_allclose(pred.loss_paths[p], real, rtol=1e-6)
        if p == 0 and not batch_size:
            np.testing.assert_allclose(pred.test_loss, real_test, rtol=1e-6)
        assert real[-1] < 0.8 * real[0]  # the run really trains
    assert not bool(pred.diverged) and int(pred.diverged_at) == -1
    if batch_size:  # seeds give a band around their mean
        assert pred.loss_band.shape == (2, STEPS + 1)
        np.testing.assert_allclose(pred.loss, pred.loss_paths.mean(0), rtol=1e-12)
        assert np.all(pred.loss_band[0] <= pred.loss_band[1])
        assert float(np.mean(pred.loss_band[1] - pred.loss_band[0])) > 0
    else:
        assert pred.loss_band is None


def test_divergent_learning_rate_is_reported_with_finite_curves(x64):
    params, xtr, ytr, xte, yte = _split()
    lam_max = float(jnp.linalg.eigvalsh(brute_ntk(linear_apply, params, xtr))[-1])
    lr = 3.0 * 16 / lam_max  # κ = 3 > 2(1 + m) = 2: beyond the GD edge for MSE
    pred = _run(params, xtr, ytr, xte, yte, lr, 0.0, None, batch_size=None, nesterov=False,
                loss="mse")
    assert bool(pred.diverged) and bool(pred.beyond_edge)
    at = int(pred.diverged_at)
    assert 0 < at <= STEPS
    assert np.isclose(float(pred.kappa), 3.0, rtol=1e-6)
    for curve in (pred.loss, pred.error, pred.test_loss, pred.test_error):
        assert np.all(np.isfinite(curve))
    # shared rule: the final rise above L_0 starts at `at`; the curve is not held (finite)
    assert pred.loss[at - 1] <= pred.loss[0] and np.all(pred.loss[at:] > pred.loss[0])
    spike = int(pred.spiked_at)
    assert spike >= at and pred.loss[spike - 1] <= 10 * pred.loss[0] < pred.loss[spike]


def test_cross_entropy_beyond_edge_is_flagged_not_diverged(x64):
    params, xtr, ytr, xte, yte = _split()
    lam_max = float(jnp.linalg.eigvalsh(brute_ntk(linear_apply, params, xtr))[-1])
    lr = 6.0 * 16 / lam_max  # κ = 6 > 4 = 2/h with h = 1/2, CE's largest curvature
    pred = _run(params, xtr, ytr, xte, yte, lr, 0.0, None, batch_size=None, nesterov=False,
                loss="cross_entropy")
    assert bool(pred.beyond_edge)
    assert np.all(np.isfinite(pred.loss))


def test_a_traced_nesterov_flag_is_refused_by_name():
    """A fresh user: jax.vmap over nesterov gave a raw TracerBoolConversionError; the flag
    picks a compiled update rule, so it is refused by name (a concrete one still works)."""
    kernel, f0, y = 2.0 * jnp.eye(6), jnp.zeros((6, 3)), jnp.arange(6) % 3

    def loss(nesterov):
        return ntk_tt.predict_from_kernel(kernel, f0, y, learning_rate=0.1, momentum=0.5,
                                          nesterov=nesterov, steps=5).loss

    with pytest.raises(ValueError, match=r"^nesterov picks the update rule and cannot be "
                                         r"traced \(jit / vmap / grad\)"):
        jax.vmap(loss)(jnp.array([True, False]))
    np.testing.assert_array_equal(loss(jnp.array(True)), loss(True))
    assert not np.allclose(loss(True), loss(False))
