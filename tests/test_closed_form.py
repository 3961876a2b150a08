"""MSE closed form (Prop. 2) vs the discrete recursion, the diffrax ODE, and the ELR heuristic."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _dynamics_helpers import brute_ntk, linear_apply, linear_problem

import ntk_tt
from ntk_tt.dynamics._closed_form import mse_closed_form
from ntk_tt.dynamics._fspace import curves

STEPS = 60


@pytest.fixture(scope="module")
def problem():
    with jax.enable_x64(True):
        params, x, y = linear_problem(n=20)
        xtr, ytr, xte, yte = x[:16], y[:16], x[16:], y[16:]
        kernel = brute_ntk(linear_apply, params, xtr)
        lam_max = float(jnp.linalg.eigvalsh(kernel)[-1])
        yield dict(kernel=kernel, f0=linear_apply(params, xtr), y=ytr,
                   kt=brute_ntk(linear_apply, params, xte, xtr), f0t=linear_apply(params, xte),
                   yt=yte, lr_per_kappa=16 / lam_max)


@partial(jax.jit, static_argnames=("method", "steps"))
def _predict(p, lr, m, *, method, steps=STEPS):
    return ntk_tt.predict_from_kernel(
        p["kernel"], p["f0"], p["y"], learning_rate=lr, momentum=m, steps=steps, loss="mse",
        method=method, kernel_test=p["kt"], f0_test=p["f0t"], y_test=p["yt"])


@partial(jax.jit, static_argnames="steps")
def _continuous_loss(p, lr, steps=STEPS):
    fs, _, _ = mse_closed_form((p["kernel"], False), p["f0"], p["y"], learning_rate=lr,
                               momentum=0.0, steps=steps, discrete=False)
    return curves(fs, p["y"], "mse")[0]


def test_exact_discrete_closed_form_equals_recursion(problem):
    lr = 1.0 * problem["lr_per_kappa"]  # κ = 1: far from the small-η limit
    closed = _predict(problem, lr, 0.0, method="closed_form")
    rec = _predict(problem, lr, 0.0, method="discrete")
    # Tolerance 1e-9 relative: both exact, x64 rounding only.
    for a, b in [(closed.loss, rec.loss), (closed.error, rec.error),
                 (closed.test_loss, rec.test_loss), (closed.test_error, rec.test_error)]:
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    assert rec.loss[-1] < 0.5 * rec.loss[0]


def test_discrete_tends_to_continuous_in_small_eta_limit(problem):
    def gap(kappa):
        lr = kappa * problem["lr_per_kappa"]
        disc = _predict(problem, lr, 0.0, method="closed_form").loss
        cont = _continuous_loss(problem, lr)
        return float(jnp.max(jnp.abs(disc - cont)) / disc[0])

    g1, g2 = gap(0.02), gap(0.01)
    # First-order convergence in η: gap ≤ κ and halving η halves it (±15 %).
    assert g1 < 0.02
    assert 1.7 < g1 / g2 < 2.3


def test_effective_learning_rate_and_heavy_ball_lag(problem):
    m = 0.9

    def compare(kappa, steps):
        lr = kappa * problem["lr_per_kappa"]
        hb = _predict(problem, lr, m, method="discrete", steps=steps).loss
        elr = _continuous_loss(problem, lr / (1 - m), steps=steps)
        return np.asarray(hb), np.asarray(elr), lr

    # Equal ELR: close curves at small η·λ, drifting ones at large η·λ (Fig. 2 effect).
    hb, elr, _ = compare(1e-4, STEPS)
    small = np.max(np.abs(hb - elr)) / hb[0]
    hb, elr, _ = compare(0.05, STEPS)
    large = np.max(np.abs(hb - elr)) / hb[0]
    assert small < 0.01 < 0.2 < large
    # Start-up lag of heavy ball from zero velocity: L_hb(t) = L_elr(t − lag) with
    # lag → m/(1 − m) = 9 steps in the small-η limit (measured 8.94 at κ = 1e-5).
    hb, _, lr = compare(1e-5, STEPS)
    grid = jnp.linspace(0.0, STEPS, 6001)
    fine = np.asarray(_fine_continuous(problem, lr / (1 - m), grid))
    ts = np.arange(40, STEPS + 1)
    tau = np.interp(-hb[ts], -fine, np.asarray(grid))
    np.testing.assert_allclose(ts - tau, m / (1 - m), atol=0.3)


@jax.jit
def _fine_continuous(p, lr, t):
    """Independent reference: L(t) = (1/2N) Σ_k exp(−2 η λ_k t / N) a_k² via numpy-free eigh."""
    lam, v = jnp.linalg.eigh(p["kernel"])
    a = v.T @ (p["f0"] - jax.nn.one_hot(p["y"], p["f0"].shape[1])).reshape(-1)
    n = p["f0"].shape[0]
    return jnp.sum(jnp.exp(-2 * lr * lam[None] * t[:, None] / n) * a**2, axis=1) / (2 * n)


def test_traced_kernel_equals_kronecker_full_kernel(problem):
    # For the linear model Θ = (X Xᵀ + 1) ⊗ I_C, so the logit-summed kernel carries it all.
    lr = 0.5 * problem["lr_per_kappa"]
    c = problem["f0"].shape[1]
    summed = problem["kernel"].reshape(16, c, 16, c).trace(axis1=1, axis2=3)
    full = ntk_tt.predict_from_kernel(problem["kernel"], problem["f0"], problem["y"],
                                      learning_rate=lr, steps=10, loss="mse",
                                      method="closed_form")
    traced = ntk_tt.predict_from_kernel(summed, problem["f0"], problem["y"], learning_rate=lr,
                                        steps=10, loss="mse", method="closed_form")
    np.testing.assert_allclose(traced.loss, full.loss, rtol=1e-9)
