"""diffrax ODE (eq. 1 without noise) vs the MSE closed form and the exact recursion."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _dynamics_helpers import brute_ntk, linear_apply, linear_problem

import ntk_tt
from ntk_tt.dynamics._closed_form import mse_closed_form
from ntk_tt.dynamics._fspace import curves

STEPS = 40


@pytest.fixture(scope="module")
def problem():
    with jax.enable_x64(True):
        params, x, y = linear_problem(n=16)
        kernel = brute_ntk(linear_apply, params, x)
        yield kernel, linear_apply(params, x), y, 16 / float(jnp.linalg.eigvalsh(kernel)[-1])


@partial(jax.jit, static_argnames=("method", "loss"))
def _sweep(kernel, f0, y, lrs, *, method, loss):
    def one(lr):
        return ntk_tt.predict_from_kernel(kernel, f0, y, learning_rate=lr, steps=STEPS,
                                          method=method, loss=loss).loss
    return jax.vmap(one)(lrs)


def test_mse_ode_equals_continuous_closed_form_over_a_vmapped_sweep(problem):
    kernel, f0, y, per_kappa = problem
    lrs = jnp.array([0.1, 0.3, 1.0]) * per_kappa
    ode = _sweep(kernel, f0, y, lrs, method="ode", loss="mse")

    def closed(lr):
        fs, _, _ = mse_closed_form((kernel, False), f0, y, learning_rate=lr, momentum=0.0,
                                   steps=STEPS, discrete=False)
        return curves(fs, y, "mse")[0]

    # Tolerance 1e-5 relative: the ODE is solved at rtol = atol = 1e-6.
    np.testing.assert_allclose(ode, jax.vmap(closed)(lrs), rtol=1e-5)


def test_cross_entropy_ode_is_the_small_eta_limit_of_gd(problem):
    kernel, f0, y, per_kappa = problem
    # The gap between GD and the ODE vanishes with η: at fixed T it shrinks at least 2× (first
    # order in η, and the shorter horizon η·T helps too) when η is halved.
    kappas = jnp.array([0.04, 0.02])
    ode = _sweep(kernel, f0, y, kappas * per_kappa, method="ode", loss="cross_entropy")
    gd = _sweep(kernel, f0, y, kappas * per_kappa, method="discrete", loss="cross_entropy")
    gaps = jnp.max(jnp.abs(ode - gd), axis=1) / gd[:, 0]
    assert float(gaps[0]) < 0.02
    assert float(gaps[0] / gaps[1]) > 1.7


def test_the_ode_takes_jax_grad_and_not_jacfwd_as_documented(problem):
    """README (a fresh user's probe found it said "jax.jacfwd through every method"): the
    ODE's dL_T/dη by jax.grad is the central difference; jax.jacfwd meets diffrax's default
    adjoint, a custom_vjp, and raises JAX's error."""
    kernel, f0, y, lr = problem

    def final_loss(eta):
        return ntk_tt.predict_from_kernel(kernel, f0, y, learning_rate=eta, steps=10,
                                          method="ode").loss[-1]

    with jax.enable_x64(True):
        h = 1e-5 * lr
        central = (final_loss(0.5 * lr + h) - final_loss(0.5 * lr - h)) / (2 * h)
        np.testing.assert_allclose(jax.grad(final_loss)(0.5 * lr), central, rtol=1e-4)
        with pytest.raises(TypeError, match="custom_vjp"):
            jax.jacfwd(final_loss)(0.5 * lr)
