"""from_nnx adapter (batch-norm statistics frozen, not differentiated) and check_model errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import ntk_tt
from ntk_tt.data._model import check_model


class _BNNet(nnx.Module):
    def __init__(self, rngs):
        self.lin1 = nnx.Linear(4, 6, rngs=rngs)
        self.bn = nnx.BatchNorm(6, rngs=rngs)
        self.lin2 = nnx.Linear(6, 3, rngs=rngs)

    def __call__(self, x):
        return self.lin2(jax.nn.relu(self.bn(self.lin1(x))))


def _bn_model():
    model = _BNNet(nnx.Rngs(0))
    model.bn.mean[...] = jnp.linspace(-0.5, 0.5, 6)  # non-trivial frozen statistics
    model.bn.var[...] = jnp.linspace(0.5, 2.0, 6)
    return model, jax.random.normal(jax.random.key(1), (5, 4))


def test_params_are_trainable_leaves_only_and_stats_get_no_gradient():
    model, x = _bn_model()
    _, stats = nnx.state(model, nnx.Param, nnx.BatchStat)
    apply_fn, params = ntk_tt.from_nnx(model)
    n_param = sum(p.size for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert ntk_tt.num_params(params) == n_param
    stat_leaves = {id(s) for s in jax.tree.leaves(stats)}
    assert not stat_leaves & {id(p) for p in jax.tree.leaves(params)}
    grads = jax.grad(lambda p: jnp.sum(apply_fn(p, x) ** 2))(params)
    assert jax.tree.structure(grads) == jax.tree.structure(params)
    assert all(bool(jnp.any(g != 0)) for g in jax.tree.leaves(grads))
    before = [np.asarray(s) for s in jax.tree.leaves(stats)]
    apply_fn(params, x)
    after = jax.tree.leaves(nnx.state(model, nnx.BatchStat))
    for b, a in zip(before, after, strict=True):
        np.testing.assert_array_equal(b, a)


def test_eval_mode_makes_samples_independent_and_uses_frozen_stats():
    model, x = _bn_model()
    apply_fn, params = ntk_tt.from_nnx(model)
    assert model.bn.use_running_average is False  # the caller's module stays in train mode
    np.testing.assert_allclose(apply_fn(params, x)[:2], apply_fn(params, x[:2]), rtol=1e-6)
    h = model.lin1(x)
    bn = model.bn
    normed = (h - bn.mean[...]) / jnp.sqrt(bn.var[...] + bn.epsilon)
    expected = model.lin2(jax.nn.relu(normed * bn.scale[...] + bn.bias[...]))
    np.testing.assert_allclose(apply_fn(params, x), expected, rtol=1e-5)


def test_num_params_refuses_what_is_not_weights():
    """A model passed as the weights counted its batch-norm statistics and RNG state too (a
    flax module is a pytree), and None, a string or a string leaf gave 0 or 1 silently: each
    is one ValueError naming the argument (or the leaf) and from_nnx. Weights still count,
    an empty pytree as 0 (check_model's "holds no parameters" error is unchanged)."""
    model, _ = _bn_model()
    for bad, match in ((model, "got _BNNet"), (None, "got NoneType"), ("w", "got str"),
                       ({"w": jnp.ones(3), "name": "fc"}, r"leaf \['name'\] \(str\)")):
        with pytest.raises(ValueError, match=match + ".*from_nnx"):
            ntk_tt.num_params(bad)
    # a second fresh user: a string array, a bool leaf or True alone counted 1
    for bad in ({"a": np.array(["x"])}, {"a": np.array([True])}, True):
        with pytest.raises(ValueError, match="not a numeric array or a number"):
            ntk_tt.num_params(bad)
    assert ntk_tt.num_params({"w": jnp.ones((2, 3)), "b": np.zeros(3), "s": 1.0}) == 10
    assert ntk_tt.num_params({"h": jnp.ones(4, jnp.bfloat16), "i": np.int32(2)}) == 5
    assert ntk_tt.num_params({}) == 0


def test_ntk_of_batchnorm_model_matches_jacobian_over_params_only():
    model, x = _bn_model()
    apply_fn, params = ntk_tt.from_nnx(model)
    flat, unravel = jax.flatten_util.ravel_pytree(params)
    jac = jax.jacrev(lambda w: apply_fn(unravel(w), x).reshape(-1))(flat)
    theta = ntk_tt.empirical_ntk(apply_fn, params, x)
    np.testing.assert_allclose(theta, jac @ jac.T, rtol=1e-4, atol=1e-5)


def test_from_nnx_rejects_non_modules():
    with pytest.raises(TypeError, match="nnx.Module"):
        ntk_tt.from_nnx(lambda x: x)


@pytest.mark.parametrize(
    "out_fn, match",
    [
        (lambda f: f[:, 0], r"shape \(N, C\)"),
        (lambda f: f[..., None], r"shape \(N, C\)"),
        (lambda f: jnp.concatenate([f, f]), r"shape \(N, C\)"),
        # a fresh user's model returning (logits, logits): a raw AttributeError before
        (lambda f: (f, f), r"must return one array of logits \(N, C\), got a tuple .*"
                           r"return the logits alone"),
        (lambda f: {"logits": f}, r"got a dict"),
    ],
)
def test_check_model_rejects_outputs_not_n_by_c(out_fn, match):
    model, x = _bn_model()
    apply_fn, params = ntk_tt.from_nnx(model)
    with pytest.raises(ValueError, match=match):
        check_model(lambda p, x: out_fn(apply_fn(p, x)), params, x)
    assert check_model(apply_fn, params, x) == (5, 3)


def test_a_non_callable_apply_fn_is_named_as_such():
    """predict(3, params, ...) blamed x's shape and params (JAX's "Expected a callable");
    now the message says apply_fn is not a function, before anything is traced."""
    model, x = _bn_model()
    _, params = ntk_tt.from_nnx(model)
    for bad in (3, params, "apply"):
        with pytest.raises(ValueError, match=r"apply_fn must be a function .* got "
                                             f"{type(bad).__name__};"):
            check_model(bad, params, x)
    with pytest.raises(ValueError, match="apply_fn must be a function"):
        ntk_tt.predict(3, params, x, jnp.zeros(5, int), learning_rate=0.1, steps=5)


def test_a_flax_module_or_none_where_a_function_goes_is_one_clear_error():
    """A flax module passed as apply_fn (empirical_ntk, linearize), None as the function or
    params0, and a string x for weight_tangent gave raw TypeErrors or were accepted; each is
    now one ValueError naming the argument and from_nnx. A plain function still works: its
    tangent along its own weights equals J·θ0 by hand (x·w for a linear map)."""
    model, x = _bn_model()
    _, params = ntk_tt.from_nnx(model)
    calls = [(ntk_tt.empirical_ntk, (model, params, x), "apply_fn must be a function"),
             (ntk_tt.linearize, (model, params), "apply_fn must be a function"),
             (ntk_tt.linearize, (None, params), "apply_fn must be a function"),
             (ntk_tt.linearize, (lambda p, z: z, None), "params0 must be the weights"),
             (ntk_tt.linearize, (lambda p, z: z, "p"), "params0 must be the weights"),
             (ntk_tt.linearize, (lambda p, z: z, model), "params0 must be the weights"),
             (ntk_tt.weight_tangent, (lambda p, z: z, None, x), "params must be the weights"),
             (ntk_tt.weight_tangent, (lambda p, z: z, model, x), "params must be the weights"),
             (ntk_tt.linearize(lambda p, z: z @ p, jnp.ones(3)), (jnp.ones(3), None),
              "x must be an array"),
             (ntk_tt.weight_tangent, (None, params, x), "fn must be a function"),
             (ntk_tt.weight_tangent, (lambda p, z: z @ p, jnp.ones(3), "abc"),
              "x must be an array")]
    for fn, args, match in calls:
        with pytest.raises(ValueError, match=match + ".*"
                           + ("from_nnx" if "must be the" in match else "")):
            fn(*args)
    w, z = jnp.array([[1.0], [-2.0], [0.5]]), jnp.array([[1.0, 2.0, 3.0], [0.0, 1.0, 4.0]])
    np.testing.assert_allclose(ntk_tt.weight_tangent(lambda p, v: v @ p, w, z), z @ w)
    with pytest.raises(ValueError, match="predict is eager .*predict_from_kernel"):
        jax.vmap(lambda lr: ntk_tt.predict(lambda p, v: v @ p, jnp.ones((3, 2)), z,
                                           jnp.array([0, 1]), learning_rate=lr,
                                           steps=5).loss)(jnp.array([0.1, 0.2]))
    # a fresh user: jit over finetune gave a 59-line TracerArrayConversionError from the
    # model check
    with pytest.raises(ValueError, match="finetune is eager .*cannot be traced .*jit"):
        jax.jit(lambda lr: ntk_tt.finetune(lambda p, v: v @ p, jnp.ones((3, 2)), z,
                                           jnp.array([0, 1]), learning_rate=lr,
                                           steps=5).loss)(0.1)


def test_weight_tangent_checks_x_as_empirical_ntk():
    """weight_tangent returned a (C,) row for a 1-D x, NaN rows for a NaN x and raw
    TypeErrors for a scalar x or a wrong feature size; each is now check_model's ValueError
    (as empirical_ntk), and a traced x (under jit) or a backbone's features still work."""
    model, x = _bn_model()
    apply_fn, params = ntk_tt.from_nnx(model)
    for bad, match in ((x[0], "at least 2 dimensions.*x\\[None\\]"),
                       (jnp.float32(1.0), "at least 2 dimensions"),
                       (jnp.ones((4, 5)), "fails on x of shape \\(4, 5\\).*input shape"),
                       (x.at[0, 0].set(jnp.nan), "x contains NaN or inf")):
        with pytest.raises(ValueError, match=match):
            ntk_tt.weight_tangent(apply_fn, params, bad)
    a = ntk_tt.weight_tangent(apply_fn, params, x)
    np.testing.assert_allclose(jax.jit(lambda v: ntk_tt.weight_tangent(apply_fn, params, v))(x),
                               a, rtol=1e-6)
    feature_fn = lambda p, v: jax.nn.relu(v @ p["w"])  # noqa: E731 (a backbone: (N, F))
    assert ntk_tt.weight_tangent(feature_fn, {"w": jnp.ones((4, 7))}, x).shape == (5, 7)


def test_check_model_rejects_bad_x():
    model, x = _bn_model()
    apply_fn, params = ntk_tt.from_nnx(model)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        check_model(apply_fn, params, x[0])
    with pytest.raises(ValueError, match="empty"):
        check_model(apply_fn, params, x[:0])
    with pytest.raises(ValueError, match="NaN or inf"):
        check_model(apply_fn, params, x.at[0, 0].set(jnp.inf))
    with pytest.raises(ValueError, match=r"fails on x of shape \(5, 7\).*input shape"):
        check_model(apply_fn, params, jnp.ones((5, 7)))  # the model expects 4 features


def test_params_of_the_wrong_structure_are_named_not_only_x():
    """params not the pytree apply_fn was built with: the message said only "Check that x
    has the input shape", blaming x; it now names params (and from_nnx) too."""
    model, x = _bn_model()
    apply_fn, _ = ntk_tt.from_nnx(model)
    for fn in (lambda: check_model(apply_fn, {"a": jnp.ones(3)}, x),
               lambda: ntk_tt.empirical_ntk(apply_fn, {"a": jnp.ones(3)}, x)):
        with pytest.raises(ValueError) as err:
            fn()
        msg = str(err.value)
        assert msg.startswith("apply_fn(params, x) fails on x of shape (5, 4)"), msg
        assert "or that params is the pytree apply_fn was built with (from_nnx returns both)" \
            in msg, msg


@pytest.mark.parametrize("couple, match", [
    # centring over the batch: Θ was all zero, silently
    (lambda x: x - x.mean(axis=0), r"couples the samples of a batch: .*eval mode"),
    # squeezing the batch axis of a batch of one: an internal reshape TypeError
    (jnp.squeeze, r"apply_fn\(params, x\[:1\]\) gives \(3,\), not .* \(1, 3\).*squeeze"),
])
def test_models_coupling_the_samples_of_a_batch_are_refused_before_any_work(
        couple, match, monkeypatch):
    model, x = _bn_model()
    apply_fn, params = ntk_tt.from_nnx(model)

    def coupled(p, x):
        return apply_fn(p, couple(x))

    def no_jacobians(*args, **kwargs):
        raise AssertionError("a Jacobian was computed before the model check")

    monkeypatch.setattr(ntk_tt.kernels._ntk, "structured_jacobian", no_jacobians)
    with pytest.raises(ValueError, match=match):
        ntk_tt.empirical_ntk(coupled, params, x)
    with pytest.raises(ValueError, match=match):
        ntk_tt.finetune(coupled, params, x, jnp.arange(5) % 3, learning_rate=0.1, steps=2)
    assert check_model(apply_fn, params, x) == (5, 3)  # the same model, per sample: accepted


def test_the_per_sample_check_runs_at_full_matmul_precision():
    """On an H200 the default (TF32) matmuls rounded a batch's and one sample's logits apart by
    ~1e-3 of their size at re-linearised weights, and the check called the model coupled. A
    model that is off by that much in a batch unless traced at the "highest" precision (as a
    GPU's TF32 would be) is accepted: the check compares at full precision."""
    model, x = _bn_model()
    apply_fn, params = ntk_tt.from_nnx(model)

    def tf32_like(p, xs):
        out = apply_fn(p, xs)
        if jax.config.jax_default_matmul_precision != "highest" and xs.shape[0] > 1:
            out = out * (1.0 + 1e-3)
        return out

    assert check_model(tf32_like, params, x) == (5, 3)


def test_nan_logits_are_named_as_such_not_as_coupled_samples():
    """A third fresh user: NaN logits were reported as "apply_fn couples the samples", which
    sent them to debug batch-norm."""
    model, x = _bn_model()
    apply_fn, params = ntk_tt.from_nnx(model)
    with pytest.raises(ValueError, match=r"returns NaN or inf logits: check the weights"):
        ntk_tt.empirical_ntk(lambda p, x: apply_fn(p, x) * jnp.nan, params, x)


def test_a_single_sample_is_checked_by_shapes_only(monkeypatch):
    # one sample is its own batch: the together-vs-alone passes would compare a pass with
    # itself, so check_model traces shapes only (a 1-sample kernel costs less than the passes)
    import ntk_tt.data._model as model_module

    model, x = _bn_model()
    apply_fn, params = ntk_tt.from_nnx(model)
    runs = []
    real = model_module._together_and_alone

    def counting(fn, p, xs):
        runs.append(xs.shape[0])
        return real(fn, p, xs)

    monkeypatch.setattr(model_module, "_together_and_alone", counting)
    assert check_model(apply_fn, params, x[:1]) == (1, 3)
    assert runs == []  # traced (eval_shape), never run
    assert check_model(apply_fn, params, x[:2]) == (2, 3)
    assert runs == [2]  # two samples: run together and one at a time


@pytest.mark.parametrize("reason", ["the layer wants 5 input features.",
                                    "the layer wants 5 input features"])
def test_apply_fn_failure_message_has_one_period_between_sentences(reason):
    """apply_fn's own message ends in a period or not: one period before "Check" (it was
    "features.. Check")."""

    def apply_fn(params, x):
        raise TypeError(reason)

    with pytest.raises(ValueError) as err:
        check_model(apply_fn, {"w": jnp.ones(3)}, jnp.ones((4, 7)))
    msg = str(err.value)
    assert "fails on x of shape (4, 7): the layer wants 5 input features. Check that x" in msg
    assert ".." not in msg, msg
