"""experiments/backbone_order.py: the head-aware model with an order-1 or order-2 backbone,
trained exactly in weight space, against real optax training of a network where that order is
exact (issue 26's error budget)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _dynamics_helpers import train_tx
from _scripts import experiment_script
from flax import nnx

import ntk_tt
from ntk_tt.dynamics._losses import mean_loss

bo = experiment_script("backbone_order")


class QuadraticNet(nnx.Module):
    """Features h = (xA) ⊙ (xB): bilinear in (A, B), so exactly quadratic in the backbone
    weights; a linear ``head``. float64."""

    def __init__(self, d, f, c, *, rngs):
        kw = {"param_dtype": jnp.float64, "use_bias": False, "rngs": rngs}
        self.a = nnx.Linear(d, f, **kw)
        self.b = nnx.Linear(d, f, **kw)
        self.head = nnx.Linear(f, c, param_dtype=jnp.float64, rngs=rngs)

    def __call__(self, x):
        return self.head(self.a(x) * self.b(x))


@pytest.fixture
def problem():
    with jax.enable_x64(True):
        yield _problem()


def _problem():
    model = QuadraticNet(6, 8, 3, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (24, 6), jnp.float64)
    y = jax.random.randint(jax.random.key(2), (24,), 0, 3)
    apply_fn, params = ntk_tt.from_nnx(model)
    return model, apply_fn, params, x, y


@pytest.mark.parametrize("batch_size", [None, 8])
def test_order_two_is_real_training_of_a_quadratic_backbone(problem, batch_size):
    """Order 2 is exact for a quadratic backbone: its loss curve equals real optax training
    (heavy-ball SGD, the same minibatch order) to rounding; order 1 does not."""
    model, apply_fn, params, x, y = problem
    opt = ntk_tt.sgd(0.1, 0.9, batch_size=batch_size)
    key, steps = jax.random.key(3), 30
    batches = ntk_tt.batch_indices(key, x.shape[0], batch_size or x.shape[0], steps)
    fs = train_tx(apply_fn, params, x, y, optax.sgd(0.1, momentum=0.9), batches, x,
                  "cross_entropy")
    real = np.asarray(jax.vmap(lambda f: mean_loss(f, y, "cross_entropy"))(fs))
    split = ntk_tt.split_head(model)
    two = bo.taylor_reference(split, x, y, opt, steps=steps, key=key, order=2)
    one = bo.taylor_reference(split, x, y, opt, steps=steps, key=key, order=1)
    np.testing.assert_allclose(two["loss"], real, rtol=1e-9, atol=1e-12)
    assert two["stopped_at"] is None and two["outcome"] == "converges"
    assert np.max(np.abs(one["loss"] - real)) > 1e-3  # the curvature matters here


def test_a_blow_up_is_held_and_called_diverges(problem):
    """At an η where the quadratic model blows up, the curve holds its last finite value from
    the first non-finite update on, and the outcome is "diverges"."""
    model, _, _, x, y = problem
    ref = bo.taylor_reference(ntk_tt.split_head(model), x, y, ntk_tt.sgd(1e6), steps=40,
                              order=2)
    assert ref["stopped_at"] is not None and ref["outcome"] == "diverges"
    assert np.all(np.isfinite(ref["loss"])) and ref["loss"].shape == (41,)
    assert np.all(ref["loss"][ref["stopped_at"]:] == ref["loss"][ref["stopped_at"] - 1])


def test_order_must_be_one_or_two(problem):
    model, _, _, x, y = problem
    with pytest.raises(ValueError, match="order must be 1 or 2"):
        bo.taylor_reference(ntk_tt.split_head(model), x, y, ntk_tt.sgd(0.1), steps=2, order=3)


def test_rank_one_term_is_order_two_along_its_direction(problem):
    """With a direction d, the features are order 2 for Δθ ∥ d and order 1 for Δθ ⊥ d (the
    quadratic backbone's own features h(θ_0 + Δθ) are the order-2 reference, exact here);
    ``adam_direction`` is the unit sign-like first Adam step, g_0/(|g_0| + ε) normalised."""
    model, _, _, x, y = problem
    feature_fn, bp0, w0, b0 = ntk_tt.split_head(model)
    d = bo.adam_direction((feature_fn, bp0, w0, b0), x, y, 1e-8)
    g = jax.grad(lambda p: mean_loss(feature_fn(p, x) @ w0 + b0, y, "cross_entropy"))(bp0)
    flat_d, flat_g = (jnp.concatenate([a.ravel() for a in jax.tree.leaves(t)]) for t in (d, g))
    np.testing.assert_allclose(jnp.linalg.norm(flat_d), 1.0, rtol=1e-12)
    np.testing.assert_allclose(flat_d * jnp.linalg.norm(flat_g / (jnp.abs(flat_g) + 1e-8)),
                               flat_g / (jnp.abs(flat_g) + 1e-8), rtol=1e-10)
    rank_one = bo.taylor_features(feature_fn, bp0, 2, direction=d)
    one = bo.taylor_features(feature_fn, bp0, 1)
    along = jax.tree.map(lambda p, a: p + 0.7 * a, bp0, d)
    np.testing.assert_allclose(rank_one(along, x), feature_fn(along, x), rtol=1e-10, atol=1e-12)
    leaves, tree = jax.tree.flatten(d)
    other = jax.tree.unflatten(tree, [jax.random.normal(jax.random.key(5 + i), a.shape, a.dtype)
                                      for i, a in enumerate(leaves)])
    dot = sum(jnp.vdot(a, b) for a, b in zip(jax.tree.leaves(other), leaves, strict=True))
    ortho = jax.tree.map(lambda p, o, a: p + 0.7 * (o - dot * a), bp0, other, d)
    np.testing.assert_allclose(rank_one(ortho, x), one(ortho, x), rtol=1e-10, atol=1e-12)
    assert np.max(np.abs(feature_fn(ortho, x) - one(ortho, x))) > 1e-2  # curvature off d
