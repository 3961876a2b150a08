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


def test_the_error_rate_is_float64_for_a_float64_network_and_float32_otherwise():
    """A fresh user's float64 predictions had error curves of float32 values (1/60 read
    0.01666666753590107): ``jnp.mean`` of booleans is float32 even under x64. The error rate is
    now the exact count / N in float64 for float64 logits, float32 for float32, bfloat16 and
    float16 ones."""
    y = jnp.ones(60, jnp.int32).at[0].set(0)
    with jax.enable_x64(True):
        logits = jnp.zeros((60, 3), jnp.float64).at[:, 1].set(1.0)
        err = _losses.error_rate(logits, y)
        assert err.dtype == jnp.float64 and float(err) == 1 / 60
        for low in (jnp.float32, jnp.bfloat16, jnp.float16):
            err = _losses.error_rate(logits.astype(low), y)
            assert err.dtype == jnp.float32 and float(err) == float(np.float32(1 / 60))


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


def test_losses_check_shapes_and_labels_eagerly_and_stay_traceable():
    """Mismatched shapes gave a raw broadcast error, labels outside [0, C) a NaN loss or a
    silently wrong error rate; now ValueErrors saying what to pass. Shapes and dtypes are
    static, so they are checked under jit too; label values only when concrete."""
    f = jnp.array([[2.0, 0.0, -1.0], [0.0, 3.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    ok = jnp.array([0, 1, 2, 0])
    for fn in (lambda f, y: _losses.mean_loss(f, y, "cross_entropy"),
               lambda f, y: _losses.mean_loss(f, y, "mse"), _losses.error_rate):
        for y, match in ((jnp.array([0, 1, 2]), r"shape \(4,\) matching the logits \(4, 3\), "
                                                r"got shape \(3,\).*one label per row"),
                         (jax.nn.one_hot(ok, 3), "not one-hot vectors"),
                         (ok.astype(jnp.float32), r"integer class indices, e.g. y.astype"),
                         (jnp.array([0, 1, 2, 5]), r"labels outside \[0, C\) = \[0, 3\) "
                                                   r"\(min 0, max 5\)"),
                         (jnp.array([-1, 1, 2, 0]), r"outside \[0, C\).*min -1")):
            with pytest.raises(ValueError, match=match):
                fn(f, y)
        with pytest.raises(ValueError, match=r"logits must be a float array of shape \(N, C\)"):
            fn(f[0], ok[:1])
        with pytest.raises(ValueError, match="matching the logits"):  # static: under jit too
            jax.jit(fn)(f, ok[:3])
        with pytest.raises(ValueError, match="labels outside"):  # concrete labels inside jit
            jax.jit(lambda f, fn=fn: fn(f, np.array([0, 1, 2, 3])))(f)
        # traced labels: no value check, the computation as before
        np.testing.assert_allclose(jax.jit(fn)(f, ok), fn(f, ok), rtol=1e-6)
        assert jax.vmap(fn, (0, None))(jnp.stack([f, f]), ok).shape == (2,)
    assert float(_losses.error_rate(f, ok)) == 0.0
    assert float(_losses.error_rate(f, [0, 1, 2, 1])) == 0.25  # a list of labels is fine
    with pytest.raises(ValueError, match="loss must be one of"):
        _losses.mean_loss(f, ok, "hinge")


def test_loss_docstrings_give_shapes_normalisation_and_errors():
    for fn in (_losses.mean_loss, _losses.error_rate, _losses.per_sample_loss):
        doc = fn.__doc__
        for part in ("(N, C)", "(N,)", "Raises:", "ValueError", "[0, C)"):
            assert part in doc, (fn.__name__, part)
    assert "(1/N) Σ_i" in _losses.mean_loss.__doc__ and "nats" in _losses.mean_loss.__doc__
