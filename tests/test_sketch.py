"""Sketched empirical NTK: unbiasedness, error law, determinism of P, routes, validation."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _ntk_models import brute_ntk, inputs, setup

import ntk_tt

NUM_KEYS = 64


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _sketches(distribution, sketch_dim):
    apply_fn, params, x = setup("mlp", n=6)
    theta = np.asarray(brute_ntk(apply_fn, params, x))
    kernels = np.stack(
        [
            ntk_tt.sketched_ntk(
                apply_fn,
                params,
                x,
                sketch_dim=sketch_dim,
                key=jax.random.key(100 + s),
                distribution=distribution,
            ).kernel
            for s in range(NUM_KEYS)
        ]
    )
    return theta, kernels


@pytest.mark.parametrize("distribution", ["achlioptas", "gaussian"])
def test_sketch_is_unbiased_and_error_matches_theory(x64, distribution):
    sketch_dim = 16
    theta, kernels = _sketches(distribution, sketch_dim)
    # Var Θ̂_ab = (Θ_aa Θ_bb + Θ_ab²)/D' for both distributions (fourth moment 3).
    diag = np.diag(theta)
    var = (np.outer(diag, diag) + theta**2) / sketch_dim
    z = (kernels.mean(0) - theta) / np.sqrt(var / NUM_KEYS)
    upper = np.triu_indices_from(theta)
    mean_z2 = float(np.mean(z[upper] ** 2))
    # 78 correlated entries: the mean of z² is 1 in expectation; [0.5, 1.6] is a wide band.
    assert 0.5 < mean_z2 < 1.6, mean_z2
    err2 = np.mean(np.sum((kernels - theta) ** 2, axis=(1, 2)))
    theory = (np.sum(theta**2) + np.trace(theta) ** 2) / sketch_dim
    assert abs(err2 / theory - 1) < 0.2, (err2, theory)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_routes_and_block_sizes_give_the_same_features(x64, kind):
    apply_fn, params, x = setup(kind)
    key = jax.random.key(5)
    sketch_dim = 40  # not a multiple of the direction block
    feats = [
        ntk_tt.sketched_ntk(
            apply_fn, params, x, sketch_dim=sketch_dim, key=key, route=route, block_size=bs
        ).features
        for route, bs in [("forward", None), ("reverse", None), ("reverse", 2), ("forward", 2)]
        if kind == "mlp" or bs is None or route == "reverse"
    ]
    assert feats[0].shape == (15, sketch_dim)
    for f in feats[1:]:
        np.testing.assert_allclose(f, feats[0], rtol=1e-10, atol=1e-12)
    shorter = ntk_tt.sketched_ntk(
        apply_fn, params, x, sketch_dim=20, key=key, route="reverse"
    ).features
    np.testing.assert_allclose(shorter * math.sqrt(20), feats[0][:, :20] * math.sqrt(40))


def test_features_of_a_subset_are_rows_of_the_joint_features(x64):
    apply_fn, params, x = setup("cnn")
    x_test = inputs("cnn", jax.random.key(9), 3)
    key = jax.random.key(2)
    joint = ntk_tt.sketched_ntk(
        apply_fn, params, jnp.concatenate([x, x_test]), sketch_dim=8, key=key
    ).features
    alone = ntk_tt.sketched_ntk(apply_fn, params, x, sketch_dim=8, key=key).features
    np.testing.assert_allclose(joint[:15], alone, rtol=1e-10)


def test_param_scale_sketches_column_rescaled_jacobian(x64):
    # J·diag(s) is the Jacobian of g(q) = f(s ∘ q) at q = w / s.
    apply_fn, params, x = setup("mlp")
    scale = jax.tree.map(lambda p: 0.5 + jnp.abs(p), params)

    def g(q, x):
        return apply_fn(jax.tree.map(jnp.multiply, scale, q), x)

    q = jax.tree.map(jnp.divide, params, scale)
    key = jax.random.key(4)
    for route in ("forward", "reverse"):
        scaled = ntk_tt.sketched_ntk(
            apply_fn, params, x, sketch_dim=24, key=key, route=route, param_scale=scale
        )
        reparam = ntk_tt.sketched_ntk(g, q, x, sketch_dim=24, key=key, route=route)
        np.testing.assert_allclose(scaled.features, reparam.features, rtol=1e-10, atol=1e-12)


def _directions(distribution, key, size=300, sketch_dim=64):
    """P itself: the sketch of a model whose Jacobian is the identity (features = P/√D')."""

    def identity(p, x):
        return p["v"][None, :] * x

    params = {"v": jnp.ones(size)}
    s = ntk_tt.sketched_ntk(
        identity,
        params,
        jnp.ones((1, 1)),
        sketch_dim=sketch_dim,
        key=key,
        distribution=distribution,
        route="forward",
    )
    return np.asarray(s.features) * math.sqrt(sketch_dim)


def test_achlioptas_and_gaussian_entries_have_the_stated_law():
    p = _directions("achlioptas", jax.random.key(0))
    values, counts = np.unique(np.round(p, 5), return_counts=True)
    np.testing.assert_allclose(values, [-math.sqrt(3), 0, math.sqrt(3)], atol=1e-4)
    # 19,200 entries: frequency std ≈ 0.003; band ±0.015.
    np.testing.assert_allclose(counts / p.size, [1 / 6, 2 / 3, 1 / 6], atol=0.015)
    g = _directions("gaussian", jax.random.key(0))
    assert abs(g.mean()) < 0.03 and abs(g.var() - 1) < 0.05
    assert abs(np.mean(g**4) - 3) < 0.3
    np.testing.assert_array_equal(p, _directions("achlioptas", jax.random.key(0)))
    assert not np.array_equal(p, _directions("achlioptas", jax.random.key(1)))


def test_bad_arguments_raise_value_error():
    apply_fn, params, x = setup("mlp")
    key = jax.random.key(0)
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match="sketch_dim"):
            ntk_tt.sketched_ntk(apply_fn, params, x, sketch_dim=bad, key=key)
    with pytest.raises(ValueError, match="distribution"):
        ntk_tt.sketched_ntk(apply_fn, params, x, sketch_dim=4, key=key, distribution="rademacher")
    with pytest.raises(ValueError, match="route"):
        ntk_tt.sketched_ntk(apply_fn, params, x, sketch_dim=4, key=key, route="sideways")
    with pytest.raises(ValueError, match="block_size"):
        ntk_tt.sketched_ntk(apply_fn, params, x, sketch_dim=4, key=key, block_size=0)
    with pytest.raises(ValueError, match="key"):
        ntk_tt.sketched_ntk(apply_fn, params, x, sketch_dim=4, key=0)
    with pytest.raises(ValueError, match=r"single jax random key, got an array of 3 keys"):
        ntk_tt.sketched_ntk(apply_fn, params, x, sketch_dim=4, key=jax.random.split(key, 3))
    with pytest.raises(ValueError, match="key must be a jax.random key.*got None"):
        ntk_tt.sketched_ntk(apply_fn, params, x, sketch_dim=4, key=None)
    with pytest.raises(ValueError, match="param_scale"):
        ntk_tt.sketched_ntk(
            apply_fn, params, x, sketch_dim=4, key=key, param_scale={"w1": params["w1"]}
        )
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        ntk_tt.sketched_ntk(apply_fn, params, x[0], sketch_dim=4, key=key)
    d = sum(int(np.size(p)) for p in jax.tree.leaves(params))
    with pytest.raises(ValueError, match=f"exceeds the number of parameters D = {d}: that "
                       "sketch costs more than the exact kernel"):  # 10**6 ran for minutes
        ntk_tt.sketched_ntk(apply_fn, params, x, sketch_dim=d + 1, key=key)
    with pytest.raises(ntk_tt.NTKMemoryError, match="sketch_dim"):
        ntk_tt.sketched_ntk(apply_fn, params, x, sketch_dim=4, key=key, memory_limit=100)
    with pytest.raises(ntk_tt.NTKMemoryError, match=r"the route is already 'forward'"):
        ntk_tt.sketched_ntk(apply_fn, params, x, sketch_dim=4, key=key, memory_limit=100,
                            route="forward")  # told to use route='forward' before
    with pytest.raises(ValueError, match=r"sketched_ntk .*cannot run under jax\.jit"):
        jax.jit(lambda xx: ntk_tt.sketched_ntk(apply_fn, params, xx, sketch_dim=4,
                                               key=key).features)(x)


def _costly_warnings(apply_fn, params, x, sketch_dim, **kw):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ntk_tt.sketched_ntk(apply_fn, params, x, sketch_dim=sketch_dim, key=jax.random.key(0),
                            **kw)
    return [str(w.message) for w in caught if "sketch_dim D'" in str(w.message)]


def test_a_sketch_wider_than_half_of_d_warns_that_the_exact_kernel_is_cheaper():
    """A fresh user's probe: D/2 < D' < D was accepted without a word, though the sketch
    (N·C·D·D' to project, (N·C)²·D' for Θ̂) then costs more than the exact Θ ((N·C)²·D)
    when D >= N·C. It warns from just above D/2 (not at D/2) to D; above D the earlier
    warning alone (with a param_scale; without one D' > D is refused); not with a param_scale
    (the SDE noise: no exact kernel to advise), nor when D < N·C (where such a sketch is the
    cheaper estimate)."""
    apply_fn, params, x = setup("mlp")  # D = 80 > N·C = 5·3
    d = sum(int(np.size(p)) for p in jax.tree.leaves(params))
    nc = x.shape[0] * apply_fn(params, x).shape[1]
    assert d % 2 == 0 and nc <= d
    half = (f"sketch_dim D' = {d // 2 + 1} is more than half the number of parameters D = {d} "
            f"(with N·C = {nc} <= D): there the exact kernel (kernel='exact' in "
            "ntk_tt.predict, --kernel exact, or ntk_tt.empirical_ntk) is cheaper than the "
            f"sketch and has no sampling error; use it, or sketch_dim <= {d // 2}.")
    assert _costly_warnings(apply_fn, params, x, d // 2) == []
    assert _costly_warnings(apply_fn, params, x, d // 2 + 1) == [half]
    assert _costly_warnings(apply_fn, params, x, d) == [
        half.replace(f"D' = {d // 2 + 1}", f"D' = {d}")]
    scale = jax.tree.map(jnp.ones_like, params)  # the SDE's noise features: D' > D warns
    above = _costly_warnings(apply_fn, params, x, d + 1, param_scale=scale)
    assert len(above) == 1 and above[0].startswith(
        f"sketch_dim D' = {d + 1} exceeds the number of parameters D = {d}")
    assert _costly_warnings(apply_fn, params, x, d - 1, param_scale=scale) == []
    many = inputs("mlp", jax.random.key(2), d // 3 + 1)  # N·C = 3·27 = 81 > D = 80
    assert _costly_warnings(apply_fn, params, many, d - 1) == []
