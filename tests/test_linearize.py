"""Linearised network f_lin vs brute-force Jacobians, Taylor order, and one GD step via Θ."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _ntk_models import brute_jacobian, setup
from jax.flatten_util import ravel_pytree

import ntk_tt


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _direction(params, seed=3):
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return treedef.unflatten(
        [jax.random.normal(k, p.shape) for k, p in zip(keys, leaves, strict=True)]
    )


def _shift(params, delta, t):
    return jax.tree.map(lambda p, d: p + t * d, params, delta)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_linearized_output_is_f0_plus_jacobian_times_shift(x64, kind):
    apply_fn, params, x = setup(kind)
    f_lin = ntk_tt.linearize(apply_fn, params)
    np.testing.assert_allclose(f_lin(params, x), apply_fn(params, x), rtol=1e-14)
    delta = _direction(params)
    jac = brute_jacobian(apply_fn, params, x)
    expected = apply_fn(params, x).reshape(-1) + jac @ ravel_pytree(delta)[0] * 0.3
    np.testing.assert_allclose(
        f_lin(_shift(params, delta, 0.3), x).reshape(-1), expected, rtol=1e-10
    )


def test_linearization_is_exact_for_a_model_linear_in_its_weights(x64):
    def linear(p, x):
        return x @ p["w"] + p["b"]

    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    p0 = {"w": jax.random.normal(k1, (4, 3)), "b": jnp.zeros(3)}
    p1 = {"w": jax.random.normal(k2, (4, 3)), "b": jnp.ones(3)}
    x = jax.random.normal(k3, (5, 4))
    np.testing.assert_allclose(ntk_tt.linearize(linear, p0)(p1, x), linear(p1, x), rtol=1e-12)


def test_taylor_remainder_is_second_order(x64):
    apply_fn, params, x = setup("mlp")
    f_lin = ntk_tt.linearize(apply_fn, params)
    delta = _direction(params)

    def remainder(t):
        p = _shift(params, delta, t)
        return float(jnp.linalg.norm(apply_fn(p, x) - f_lin(p, x)))

    ratio = remainder(1e-2) / remainder(5e-3)
    assert 3.8 < ratio < 4.2, ratio


def test_one_gd_step_on_the_linear_model_is_a_kernel_step(x64):
    # w1 = w0 − η ∇_w L  ⇒  f_lin(w1) = f0 − η Θ ∇_f L (METHOD.md §2), L = mean MSE.
    apply_fn, params, x = setup("cnn")
    y = jnp.arange(5) % 3
    f_lin = ntk_tt.linearize(apply_fn, params)
    grads = jax.grad(lambda p: ntk_tt.mean_loss(f_lin(p, x), y, "mse"))(params)
    lr = 0.7
    f1 = f_lin(jax.tree.map(lambda p, g: p - lr * g, params, grads), x)
    f0 = apply_fn(params, x)
    g_f = (f0 - jax.nn.one_hot(y, 3)).reshape(-1) / 5
    theta = ntk_tt.empirical_ntk(apply_fn, params, x)
    np.testing.assert_allclose(f1.reshape(-1), f0.reshape(-1) - lr * theta @ g_f, rtol=1e-10)


def test_mismatched_params_tree_raises(x64):
    apply_fn, params, x = setup("mlp")
    f_lin = ntk_tt.linearize(apply_fn, params)
    with pytest.raises(ValueError, match="tree structure"):
        f_lin({"w1": params["w1"]}, x)


def test_inputs_of_the_wrong_shape_are_one_clear_error():
    """A fresh user's x of the wrong width was JAX's raw "dot_general requires contracting
    dimensions" TypeError from f_lin (empirical_ntk already said what was wrong)."""
    apply_fn, params, x = setup("mlp")
    f_lin = ntk_tt.linearize(apply_fn, params)
    wide = jnp.concatenate([x, x], axis=1)
    with pytest.raises(ValueError, match=rf"apply_fn\(params0, x\) fails on x of shape "
                                         rf"\({x.shape[0]}, {2 * x.shape[1]}\): .* input shape"):
        f_lin(params, wide)
    np.testing.assert_allclose(f_lin(params, x), apply_fn(params, x), rtol=1e-6)


def test_mismatched_params_tree_is_described_not_dumped():
    """A fresh user: the message dumped both raw PyTreeDefs; it now gives the leaf counts and
    the first key paths that differ."""
    apply_fn, params, x = setup("mlp")
    f_lin = ntk_tt.linearize(apply_fn, params)
    n = len(jax.tree.leaves(params))
    first = sorted(params)[0]
    wrong = {k: v for k, v in params.items() if k != first} | {"extra": params[first]}
    with pytest.raises(ValueError, match=rf"^params must have the tree structure of the params0 "
                                         rf"given to linearize \({n} leaves\), got {n} leaves: "
                                         rf"params lacks \['{first}'\]; params has "
                                         r"\['extra'\], which params0 lacks\. Pass params with "
                                         r"the same keys and nesting") as err:
        f_lin(wrong, x)
    assert "PyTreeDef" not in str(err.value)
    with pytest.raises(ValueError, match=r"got 1 leaf: params lacks .*; params has \(the root: "
                                         r"a single array\), which params0 lacks"):
        f_lin(params[first], x)
    with pytest.raises(ValueError, match="key paths agree but a container type differs"):
        ntk_tt.linearize(lambda p, z: z * p[0], [jnp.ones(2)])((jnp.ones(2),), jnp.ones((1, 2)))
