import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ntk_tt
from ntk_tt.data._batches import path_batch_indices


def test_each_epoch_is_a_fresh_permutation_without_the_incomplete_batch():
    n, b, steps = 11, 3, 10  # 3 full batches per epoch, 2 samples dropped per epoch
    idx = np.asarray(ntk_tt.batch_indices(jax.random.key(0), n, b, steps))
    assert idx.shape == (steps, b)
    epochs = [idx[e * 3 : (e + 1) * 3].ravel() for e in range(3)]
    for ep in epochs:
        assert len(set(ep.tolist())) == 9  # no sample twice within an epoch
    assert not np.array_equal(epochs[0], epochs[1])  # fresh permutation each epoch
    # the 10th step opens a 4th epoch
    assert (
        idx[9].tolist()
        == np.asarray(jax.random.permutation(jax.random.fold_in(jax.random.key(0), 3), n))[
            :3
        ].tolist()
    )


def test_same_key_same_sequence_and_gd_ignores_key():
    a = ntk_tt.batch_indices(jax.random.key(1), 20, 5, 9)
    b = ntk_tt.batch_indices(jax.random.key(1), 20, 5, 9)
    c = ntk_tt.batch_indices(jax.random.key(2), 20, 5, 9)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    gd1 = ntk_tt.batch_indices(jax.random.key(1), 7, 7, 4)
    gd2 = ntk_tt.batch_indices(None, 7, 7, 4)
    assert np.array_equal(gd1, gd2) and np.array_equal(gd1[2], np.arange(7))


def test_an_nnx_rngs_for_a_key_is_one_clear_error():
    """A fresh flax user's key=nnx.Rngs(0) was a raw TypeError (its attributes are streams,
    so the key check read a stream for a dtype) in batch_indices, finetune, predict, ...;
    the typed key an Rngs draws (rngs()) is accepted."""
    from flax import nnx

    rngs = nnx.Rngs(0)
    for bad in (rngs, rngs.default):
        with pytest.raises(ValueError, match=r"key must be a jax random key, got Rng\w+; pass "
                                             r"key=jax.random.key\(seed\) \(an nnx.Rngs draws"):
            ntk_tt.batch_indices(bad, 10, 5, 3)
    assert ntk_tt.batch_indices(rngs(), 10, 5, 3).shape == (3, 5)


@pytest.mark.parametrize(
    "n,b,steps,key,match",
    [
        (10, 0, 5, 0, "batch_size"),
        (10, 11, 5, 0, "batch_size"),
        (10, 5, 0, 0, "steps"),
        (10, 5, 5, None, "key"),
        (10, True, 5, 0, "batch_size must be an int"),
        (10, 2.5, 5, 0, "batch_size must be an int"),
        (10, "8", 5, 0, "batch_size must be an int"),
        (10, 5, 2.5, 0, "steps must be an int"),
        (10, 5, 5, "int", "key must be a jax random key"),
        (10, 5, 5, "str", "key must be a jax random key"),
        (10, 5, 5, "float", "key must be a jax random key"),
        (0, 1, 5, 0, r"n \(the number of training samples N\) must be >= 1, got 0"),
    ],
)
def test_bad_arguments_raise(n, b, steps, key, match):
    bad = {"int": 0, "str": "abc", "float": np.zeros(2)}  # not keys
    k = bad[key] if isinstance(key, str) else None if key is None else jax.random.key(key)
    with pytest.raises(ValueError, match=match):
        ntk_tt.batch_indices(k, n, b, steps)


@pytest.mark.parametrize("raw", [False, True])
def test_path_batches_are_each_paths_batch_indices(raw):
    # the SGD predictors' paths: path 0 = a real run's order with `key`, p ≥ 1 that of
    # split(key, P)[p]; checked one path at a time against batch_indices, eager and jitted
    n, b, steps, paths = 11, 3, 10, 4
    key = jax.random.PRNGKey(5) if raw else jax.random.key(5)
    want = [ntk_tt.batch_indices(key, n, b, steps)]
    want += [ntk_tt.batch_indices(k, n, b, steps) for k in jax.random.split(key, paths)[1:]]
    for got in (path_batch_indices(key, n, b, steps, paths),
                jax.jit(path_batch_indices, static_argnums=(1, 2, 3, 4))(key, n, b, steps,
                                                                           paths)):
        assert got.shape == (paths, steps, b) and got.dtype == np.int32
        np.testing.assert_array_equal(got, np.stack(want))
    with pytest.raises(ValueError, match="GD has one path"):
        path_batch_indices(key, n, n, steps, paths)
    for bad in (None, 0, "abc"):
        with pytest.raises(ValueError, match="key"):
            path_batch_indices(bad, n, b, steps, paths)
    with pytest.raises(ValueError, match="batch_size must be an int"):
        path_batch_indices(key, n, 2.5, steps, paths)


def test_a_predictor_on_no_samples_names_them_not_a_batch_size():
    """A fresh user: predict_from_kernel on an empty kernel, no batch_size given, was told
    "batch_size must satisfy 1 <= batch_size <= N = 0"."""
    kernel, f0, y = np.zeros((0, 0)), np.zeros((0, 3)), np.zeros(0, int)
    with pytest.raises(ValueError) as err:
        ntk_tt.predict_from_kernel(kernel, f0, y, learning_rate=0.1, steps=5)
    assert str(err.value).startswith("no training samples: N = 0") and "batch" not in str(
        err.value)


def test_an_array_for_steps_or_batch_size_is_told_to_be_an_int():
    """A fresh user: batch_size=jnp.array(10) with N = 30 was told "must satisfy 1 <= batch_size
    <= N = 30 (an int)", though 10 is in range; the message now says an array is refused and
    how to pass it. The predict_head_aware message for an η array named predict_from_kernel."""
    kernel, f0, y = np.eye(30 * 3), np.zeros((30, 3)), np.arange(30) % 3
    hint = (r" \(an array, not an int: {} is static, it sets the recursion's shapes; pass "
            r"int\({}\)\)")
    with pytest.raises(ValueError, match=r"^batch_size must satisfy 1 <= batch_size <= N = 30 "
                                         r"\(an int\), got Array\(10, .*\)" +
                       hint.format("batch_size", "batch_size") + "; use batch_size=None"):
        ntk_tt.predict_from_kernel(kernel, f0, y, learning_rate=0.1, steps=5,
                                   batch_size=jnp.array(10), key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"^steps must be an int >= 1 .*got array\(30\)" +
                       hint.format("steps", "steps") + r"\.$"):
        ntk_tt.predict_from_kernel(kernel, f0, y, learning_rate=0.1, steps=np.array(30))
    with pytest.raises(ValueError, match=r"^steps must be an int >= 1 .*got 2\.5\.$"):
        ntk_tt.predict_from_kernel(kernel, f0, y, learning_rate=0.1, steps=2.5)  # no hint
    with pytest.raises(ValueError, match=r"learning_rate must be a scalar, got shape \(2,\); to "
                                         r"sweep it, jax\.vmap the prediction over it"):
        ntk_tt.predict_from_kernel(kernel, f0, y, learning_rate=jnp.array([0.1, 0.2]), steps=5)
