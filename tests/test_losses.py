import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ntk_tt.dynamics import _losses


@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
def test_logit_residual_is_the_per_sample_gradient(loss):
    logits = jax.random.normal(jax.random.key(0), (6, 4))
    y = jnp.array([0, 1, 2, 3, 1, 0])
    # gradient of the mean loss = residual / N
    grad = jax.grad(lambda f: _losses.mean_loss(f, y, loss))(logits)
    np.testing.assert_allclose(grad, _losses.logit_residual(logits, y, loss) / 6, rtol=1e-5)


def test_loss_values_match_their_definitions():
    logits = jnp.array([[2.0, 0.0, -1.0], [0.5, 0.5, 0.5]])
    y = jnp.array([0, 2])
    p = np.exp(np.asarray(logits)) / np.exp(np.asarray(logits)).sum(1, keepdims=True)
    ce = -np.mean([np.log(p[0, 0]), np.log(p[1, 2])])
    np.testing.assert_allclose(_losses.mean_loss(logits, y, "cross_entropy"), ce, rtol=1e-6)
    onehot = np.eye(3)[[0, 2]]
    mse = np.mean(0.5 * ((np.asarray(logits) - onehot) ** 2).sum(1))
    np.testing.assert_allclose(_losses.mean_loss(logits, y, "mse"), mse, rtol=1e-6)
    assert float(_losses.error_rate(logits, y)) == 0.5  # second row: argmax 0 != 2


def test_unknown_loss_raises():
    with pytest.raises(ValueError, match="loss must be one of"):
        _losses.check_loss("hinge")


def test_single_logit_cross_entropy_is_refused_before_any_work():
    import ntk_tt

    x = jnp.ones((4, 3))
    params = {"w": jnp.ones((3, 1))}
    apply_fn = lambda p, x: x @ p["w"]  # noqa: E731  (one logit: softmax is constant)
    y = jnp.zeros(4, jnp.int32)
    for fn in (ntk_tt.predict, ntk_tt.finetune):
        with pytest.raises(ValueError, match="C >= 2 logits, the model returns C = 1"):
            fn(apply_fn, params, x, y, learning_rate=0.1, steps=3)
    ntk_tt.predict(apply_fn, params, x, y, learning_rate=0.1, steps=3, loss="mse")  # fine
