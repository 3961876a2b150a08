"""predict / predict_from_kernel: end to end, sweeps without retracing, clamping, errors."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _dynamics_helpers import brute_ntk, linear_apply, linear_problem
from flax import nnx

import ntk_tt
from ntk_tt.dynamics._predict_kernel import resolve_method

STEPS = 20


class _MLP(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(6, 16, rngs=rngs)
        self.l2 = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x):
        return self.l2(jnp.tanh(self.l1(x)))


@pytest.fixture(scope="module")
def model():
    apply_fn, params = ntk_tt.from_nnx(_MLP(nnx.Rngs(0)))
    x = jax.random.normal(jax.random.key(1), (24, 6))
    y = jax.random.randint(jax.random.key(2), (24,), 0, 3)
    return apply_fn, params, x[:20], y[:20], x[20:], y[20:]


def test_predict_matches_predict_from_kernel_on_brute_force_kernel(model):
    apply_fn, params, x, y, xt, yt = model
    # κ ≈ 4.6, within the heavy-ball edge 4(1 + m) = 6 (beyond it T_ε is undefined)
    pred = ntk_tt.predict(apply_fn, params, x, y, learning_rate=1.5, steps=STEPS,
                          momentum=0.5, x_test=xt, y_test=yt)
    assert pred.method == "discrete" and pred.kernel == "exact"  # auto with m > 0
    ref = ntk_tt.predict_from_kernel(
        brute_ntk(apply_fn, params, x), apply_fn(params, x), y, learning_rate=1.5,
        momentum=0.5, steps=STEPS, kernel_test=brute_ntk(apply_fn, params, xt, x),
        f0_test=apply_fn(params, xt), y_test=yt)
    # float32 kernels from two routes: 1e-4 relative.
    np.testing.assert_allclose(pred.loss, ref.loss, rtol=1e-4)
    np.testing.assert_allclose(pred.test_loss, ref.test_loss, rtol=1e-4)
    assert pred.loss.shape == pred.error.shape == (STEPS + 1,)
    assert pred.loss_band is None and pred.error_band is None
    assert set(pred.training_time) == {"loss", "error"}
    assert set(pred.training_time["loss"]) == {0.01, 0.1, 0.4}
    assert 0 < pred.training_time["loss"][0.4] <= pred.training_time["loss"][0.1]
    assert set(pred.seconds) == {"setup", "kernel", "noise", "logits", "solve", "compile",
                                 "total"}
    assert pred.seconds["compile"] > 0.0  # first call of this configuration compiled
    assert not pred.diverged and pred.diverged_at is None
    np.testing.assert_allclose(pred.kappa, 1.5 * np.linalg.eigvalsh(
        np.asarray(brute_ntk(apply_fn, params, x), np.float64))[-1] / 20, rtol=1e-3)


def test_predict_sgd_on_traced_kernel_has_a_band(model):
    apply_fn, params, x, y, _, _ = model
    pred = ntk_tt.predict(apply_fn, params, x, y, learning_rate=2.0, steps=STEPS,
                          batch_size=5, kernel="traced", num_paths=8, key=jax.random.key(0))
    assert pred.method == "discrete" and pred.kernel == "traced"
    assert pred.loss_band.shape == pred.error_band.shape == (2, STEPS + 1)
    assert np.all(pred.loss_band[0] <= pred.loss_band[1])


def test_auto_method():
    assert resolve_method("auto") == "discrete"
    assert resolve_method("closed_form") == "closed_form"


def test_sweep_over_32_learning_rates_compiles_once(model):
    apply_fn, params, x, y, _, _ = model
    kernel, f0 = brute_ntk(apply_fn, params, x), apply_fn(params, x)
    traces = []

    def curve(lr, m):
        traces.append(1)  # runs only while tracing
        return ntk_tt.predict_from_kernel(kernel, f0, y, learning_rate=lr, momentum=m,
                                          steps=STEPS).loss

    sweep = jax.jit(jax.vmap(curve))
    lrs = jnp.geomspace(0.01, 2.0, 32)
    first = sweep(lrs, jnp.zeros(32))
    second = sweep(lrs * 1.1, jnp.full(32, 0.5, jnp.float32))
    assert len(traces) == 1, f"retraced {len(traces) - 1} times"
    assert first.shape == second.shape == (32, STEPS + 1)
    single = ntk_tt.predict_from_kernel(kernel, f0, y, learning_rate=lrs[7], steps=STEPS)
    np.testing.assert_allclose(first[7], single.loss, rtol=1e-5)


def test_non_psd_float32_kernel_is_clamped_and_reported():
    rng = np.random.default_rng(0)
    n, c = 10, 2
    basis = np.linalg.qr(rng.standard_normal((n * c, n * c)))[0]
    lam = np.linspace(-2.0, 10.0, n * c)  # significant negative eigenvalues
    kernel = ((basis * lam) @ basis.T).astype(np.float32)
    clamped = ((basis * np.maximum(lam, 0)) @ basis.T).astype(np.float32)
    f0 = jnp.zeros((n, c), jnp.float32)
    y = jnp.arange(n) % c
    kw = dict(learning_rate=0.5, steps=STEPS, loss="mse")
    pred = ntk_tt.predict_from_kernel(kernel, f0, y, **kw)
    ref = ntk_tt.predict_from_kernel(clamped, f0, y, **kw)
    assert bool(pred.clamped) and not bool(ref.clamped)
    assert float(pred.min_eigenvalue) < -1.0
    np.testing.assert_allclose(pred.loss, ref.loss, rtol=1e-4)
    assert np.all(np.isfinite(pred.loss))


@pytest.mark.parametrize("neg, clamped", [(-0.01, True), (-0.05, True), (0.001, False)])
def test_min_eigenvalue_found_under_a_cluster_near_zero(neg, clamped):
    # 56 eigenvalues at 0.02 just above the sought one: power iteration on λ_max·I − Θ
    # reported +0.019 (not clamped) for −0.01, and −0.02 for −0.05
    basis = np.linalg.qr(np.random.default_rng(0).standard_normal((60, 60)))[0]
    lam = np.array([1.0, 0.5, 0.2] + [0.02] * 56 + [neg])
    kernel = ((basis * lam) @ basis.T).astype(np.float32)
    pred = ntk_tt.predict_from_kernel(kernel, jnp.zeros((60, 1)), jnp.zeros(60, int),
                                      learning_rate=0.5, steps=STEPS, loss="mse")
    assert abs(float(pred.min_eigenvalue) - neg) < 1e-4
    assert bool(pred.clamped) is clamped


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(learning_rate=0.0), "learning_rate"), (dict(learning_rate=-1.0), "learning_rate"),
     (dict(momentum=1.0), "momentum"), (dict(momentum=-0.1), "momentum"),
     (dict(batch_size=0), "batch_size"), (dict(batch_size=21), "batch_size"),
     (dict(batch_size=True), "batch_size must satisfy .*(an int)"),
     (dict(batch_size=2.5), "batch_size must satisfy .*(an int)"),
     (dict(batch_size="8"), "batch_size must satisfy .*(an int)"),
     (dict(nesterov="no", momentum=0.5), "nesterov must be True or False"),
     (dict(steps=0), "steps"), (dict(method="euler"), "method"), (dict(loss="hinge"), "loss"),
     (dict(kernel="random"), "kernel"), (dict(batch_size=5), "key"),
     (dict(method="closed_form"), "closed_form"), (dict(num_paths=0), "num_paths"),
     (dict(learning_rate=jnp.array([0.1, 0.2])), "scalar")],
)
def test_predict_rejects_bad_arguments_before_any_work(model, kwargs, match):
    apply_fn, params, x, y, _, _ = model
    args = dict(learning_rate=0.1, steps=STEPS) | kwargs
    with pytest.raises(ValueError, match=match):
        ntk_tt.predict(apply_fn, params, x, y, **args)


def test_sketch_dim_without_a_sketch_or_sde_is_refused_not_ignored(model):
    """sketch_dim with the default kernel="exact" (and no SDE) was silently ignored; now one
    ValueError naming the option it applies to, with the constant-η keywords and optimizer=
    (the CLI refuses --sketch-dim the same way, tests/test_cli.py)."""
    apply_fn, params, x, y, _, _ = model
    for kw in (dict(learning_rate=0.1), dict(optimizer=ntk_tt.sgd(0.1)),
               dict(learning_rate=0.1, kernel="traced", method="ode")):
        with pytest.raises(ValueError, match="sketch_dim only applies to kernel='sketch'.*"
                                             "got sketch_dim=8 with kernel="):
            ntk_tt.predict(apply_fn, params, x, y, steps=STEPS, sketch_dim=8, **kw)


def test_a_sketch_larger_than_the_model_is_refused_before_any_work(model, monkeypatch):
    """sketch_dim=10**6 on a small model ran for over 10 minutes (a fresh user's find; the
    CLI refused it at once): now one ValueError naming D, for the sketched kernel (also its
    default D' = 256 on a model smaller than that) and the SDE noise sketch, with the
    constant-η keywords and optimizer=."""
    apply_fn, params, x, y, _, _ = model
    d = ntk_tt.num_params(params)

    def refuse(*_, **__):
        raise AssertionError("a sketch was drawn before the refusal")

    monkeypatch.setattr("ntk_tt.sketched_ntk", refuse)
    key = jax.random.key(0)
    cases = [(dict(kernel="sketch", sketch_dim=10**6), "1000000 exceeds", "kernel='exact', or "),
             (dict(method="sde", sketch_dim=d + 1), f"{d + 1} exceeds", "use sketch_dim <=")]
    if d < 256:
        cases.append((dict(kernel="sketch"), r"256 \(the default\) exceeds", "kernel='exact'"))
    for kw, size, advice in cases:
        for rule in (dict(learning_rate=0.1), dict(optimizer=ntk_tt.sgd(0.1))):
            with pytest.raises(ValueError, match=rf"sketch_dim D' = {size} the model's D = "
                                                 rf"{d} parameters.*{advice}"):
                ntk_tt.predict(apply_fn, params, x, y, steps=STEPS, key=key, **kw, **rule)
    with pytest.raises(ValueError, match="Adam has no frozen-kernel predictor"):  # Adam's first
        ntk_tt.predict(apply_fn, params, x, y, steps=STEPS, key=key, kernel="sketch",
                       sketch_dim=d + 1, optimizer=ntk_tt.adamw(1e-3))
    monkeypatch.undo()  # D' = D is allowed (the SDE noise draws its sketch)
    small = ntk_tt.predict(apply_fn, params, x, y, steps=STEPS, key=key, learning_rate=0.1,
                           method="sde", sketch_dim=d, num_paths=2)
    assert np.isfinite(small.loss).all()
    assert d < 256  # the SDE noise's default D' is min(256, D): no warning, the D' = D sketch
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        default = ntk_tt.predict(apply_fn, params, x, y, steps=STEPS, key=key,
                                 learning_rate=0.1, method="sde", num_paths=2)
        # optimizer= resolved its default D' as 256 and warned from the noise sketch
        rule = ntk_tt.predict(apply_fn, params, x, y, steps=STEPS, key=key,
                              optimizer=ntk_tt.sgd(0.1), method="sde", num_paths=2)
    np.testing.assert_array_equal(default.loss, small.loss)
    np.testing.assert_array_equal(rule.loss, small.loss)
    for pred in (small, default, rule):  # the D' used is in the prediction's record
        assert pred.hyperparameters["noise_dim"] == d
        assert "sketch_dim" not in pred.hyperparameters
    both = ntk_tt.predict(apply_fn, params, x, y, steps=STEPS, key=key, learning_rate=0.1,
                          method="sde", kernel="sketch", sketch_dim=d // 2, num_paths=2)
    assert both.hyperparameters["noise_dim"] == both.hyperparameters["sketch_dim"] == d // 2
    assert "noise_dim" not in ntk_tt.predict(apply_fn, params, x, y, steps=STEPS,
                                             learning_rate=0.1).hyperparameters


def test_predict_rejects_labels_not_matching_n_or_c(model):
    apply_fn, params, x, y, _, _ = model
    with pytest.raises(ValueError, match="shape"):
        ntk_tt.predict(apply_fn, params, x, y[:-1], learning_rate=0.1, steps=STEPS)
    with pytest.raises(ValueError, match="outside"):
        ntk_tt.predict(apply_fn, params, x, y.at[0].set(3), learning_rate=0.1, steps=STEPS)


def test_predict_from_kernel_rejects_bad_kernels():
    f0, y = jnp.zeros((4, 2)), jnp.array([0, 1, 0, 1])
    good = jnp.eye(8)
    with pytest.raises(ValueError, match="NaN or inf"):
        ntk_tt.predict_from_kernel(good.at[0, 1].set(jnp.nan), f0, y, learning_rate=0.1,
                                   steps=5)
    with pytest.raises(ValueError, match="shape"):
        ntk_tt.predict_from_kernel(jnp.eye(6), f0, y, learning_rate=0.1, steps=5)
    with pytest.raises(ValueError, match="noise_features"):
        ntk_tt.predict_from_kernel(good, f0, y, learning_rate=0.1, steps=5, method="sde",
                                   batch_size=2, key=jax.random.key(0))
    with pytest.raises(ValueError, match="labels"):
        ntk_tt.predict_from_kernel(good, f0, jnp.eye(4, 2), learning_rate=0.1, steps=5)


def test_a_cross_or_negated_kernel_is_refused_not_clamped(model):
    """Θ(x, x2) of two input sets of one size, or −Θ, are square and finite but not J Jᵀ:
    refused (before, they were symmetrised or clamped into a plausible, wrong curve). The
    kernel of the same inputs passes, and so does one asymmetric at float32 rounding."""
    apply_fn, params, x, y, xt, _ = model
    theta = brute_ntk(apply_fn, params, x)
    cross = brute_ntk(apply_fn, params, jnp.concatenate([xt, xt, xt, xt, xt]), x)
    assert cross.shape == theta.shape
    kw = dict(learning_rate=0.1, steps=5)
    f0 = apply_fn(params, x)
    with pytest.raises(ValueError, match="not symmetric.*kernel_test"):
        ntk_tt.predict_from_kernel(cross, f0, y, **kw)
    with pytest.raises(ValueError, match="negative diagonal entry"):
        ntk_tt.predict_from_kernel(-theta, f0, y, **kw)
    traced = theta.reshape(20, 3, 20, 3).trace(axis1=1, axis2=3)
    with pytest.raises(ValueError, match="negative diagonal entry"):
        ntk_tt.predict_from_kernel(-traced, f0, y, **kw)
    # a fresh user's Θ = 0 gave a flat curve called "converges"
    for zero in (0 * theta, 0 * traced):
        with pytest.raises(ValueError, match="kernel is zero everywhere: no weight moves"):
            ntk_tt.predict_from_kernel(zero, f0, y, **kw)
    noise = 1e-6 * float(jnp.max(theta)) * jax.random.normal(jax.random.key(3), theta.shape)
    ok = ntk_tt.predict_from_kernel(theta + noise, f0, y, **kw)
    ref = ntk_tt.predict_from_kernel(theta, f0, y, **kw)
    np.testing.assert_allclose(ok.loss, ref.loss, rtol=1e-4)


def test_continuous_time_beyond_the_edge_warns(model):
    """The ODE converges at any κ; beyond the stability edge the real run does not, so an
    eager ODE prediction there warns (κ in the message); within the edge, or traced, none."""
    apply_fn, params, x, y, _, _ = model
    theta = brute_ntk(apply_fn, params, x)
    lam_max = float(np.linalg.eigvalsh(np.asarray(theta))[-1])
    f0 = apply_fn(params, x)
    kw = dict(steps=STEPS, loss="mse", method="ode")
    with pytest.warns(ntk_tt.BeyondEdgeWarning,
                      match=r"κ = η·λ_max/N = 1000 is beyond .*method='ode'"):
        pred = ntk_tt.predict_from_kernel(theta, f0, y, learning_rate=1e3 * 20 / lam_max, **kw)
    assert bool(pred.beyond_edge) and not bool(pred.diverged)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ntk_tt.predict_from_kernel(theta, f0, y, learning_rate=0.5 * 20 / lam_max, **kw)
        jax.jit(lambda lr: ntk_tt.predict_from_kernel(theta, f0, y, learning_rate=lr,
                                                      **kw).loss)(1e3 * 20 / lam_max)


def test_divergent_learning_rate_has_no_training_time(model):
    """Far beyond the stability edge the default method predicts divergence, and T_ε is
    undefined with the reason "diverged" (the held curve must not produce a fake T_ε).
    MSE: there the linear recursion grows without bound (a cross-entropy one can spike and
    come back below L_0, which is not divergence)."""
    apply_fn, params, x, y, _, _ = model
    lam_max = float(np.linalg.eigvalsh(np.asarray(brute_ntk(apply_fn, params, x)))[-1])
    lr = 1e4 * 20 / lam_max  # κ = 1e4, far beyond the MSE edge κ = 2
    pred = ntk_tt.predict(apply_fn, params, x, y, learning_rate=lr, steps=STEPS, loss="mse")
    assert pred.method == "discrete" and pred.beyond_edge and pred.diverged
    assert np.all(np.isfinite(pred.loss)) and np.all(np.isfinite(pred.error))
    for curve in ("loss", "error"):
        assert all(np.isnan(t) for t in pred.training_time[curve].values())
        assert all("diverged" in r for r in pred.training_time_reasons[curve].values())


def test_python_lists_are_converted_and_other_inputs_refused_in_one_short_line(model):
    apply_fn, params, x, y, _, _ = model
    args = dict(learning_rate=0.5, steps=STEPS)
    ref = ntk_tt.predict(apply_fn, params, x, y, **args)
    pred = ntk_tt.predict(apply_fn, params, np.asarray(x).tolist(), [int(v) for v in y], **args)
    np.testing.assert_allclose(pred.loss, ref.loss, rtol=1e-6)
    kernel, f0 = brute_ntk(apply_fn, params, x), apply_fn(params, x)
    from_lists = ntk_tt.predict_from_kernel(np.asarray(kernel).tolist(),
                                            np.asarray(f0).tolist(), np.asarray(y).tolist(),
                                            **args)
    np.testing.assert_allclose(from_lists.loss,
                               ntk_tt.predict_from_kernel(kernel, f0, y, **args).loss,
                               rtol=1e-6)
    long_labels = ["label"] * 20
    for kwargs, message in [
        (dict(learning_rate="0.1"), "learning_rate must be a real number, got str"),
        (dict(momentum="0.9"), "momentum must be a real number, got str"),
        (dict(key=0), "key must be a jax random key, got int; pass key=jax.random.key(seed)."),
        (dict(y=long_labels), "y must hold numbers, got a list of shape (20,)"),
        (dict(x=[[0.0] * 6] * 19 + [[0.0] * 5]), "x is a ragged list"),
        (dict(x="images.npz"), "x must be an array (numpy or jax), got str"),
        # numpy arrays of strings or objects passed as arrays (a fresh user: JAX's raw
        # TypeError printed the whole label array)
        (dict(y=np.array(long_labels)), "y must hold numbers, got an array of shape (20,) "
                                        "and numpy dtype <U5"),
        (dict(y=np.array([1] * 20, dtype=object)), "y must hold numbers, got an array of "
                                                   "shape (20,) and numpy dtype object"),
        (dict(x=np.full((20, 6), "label")), "x must hold numbers, got an array of shape "
                                            "(20, 6) and numpy dtype <U5"),
    ]:
        call = dict(x=x, y=y) | args | kwargs
        with pytest.raises(ValueError) as err:
            ntk_tt.predict(apply_fn, params, call.pop("x"), call.pop("y"), **call)
        assert str(err.value).startswith(message) and "\n" not in str(err.value)
        assert "label" not in str(err.value) and len(str(err.value)) < 250
    with pytest.raises(ValueError, match="key must be a jax random key, got int"):
        ntk_tt.predict_from_kernel(kernel, f0, y, key=3, batch_size=5, **args)


@pytest.mark.parametrize("kernel,f0,expected", [
    (np.eye(18), np.zeros((6, 2)), "f0 has shape (6, 2), but the kernel (18, 18) and the 6 "
                                   "labels y imply initial logits of shape (6, 3)"),
    (np.eye(18), np.zeros((6, 4)), "imply initial logits of shape (6, 3) (N = 6 samples, "
                                   "C = 18 / 6 = 3 logits each)"),
    (np.eye(18), np.zeros((5, 3)), "f0 has shape (5, 3), but the kernel (18, 18)"),
    (np.eye(6), np.zeros((6, 2)), "f0 has shape (6, 2): C = 2 logits per sample, but the "
                                  "labels y go up to 2: expected f0 of shape (6, C) with C >= 3"),
])
def test_a_wrong_width_f0_is_an_f0_shape_error_not_a_label_error(kernel, f0, expected):
    """f0 with another number of logits (or samples) than the kernel and the labels imply:
    the message names f0, the expected and the given shape (it was a label error)."""
    y = np.arange(6) % 3
    with pytest.raises(ValueError) as err:
        ntk_tt.predict_from_kernel(kernel, f0, y, learning_rate=0.1, steps=5)
    msg = str(err.value)
    assert expected in msg and "pass f0 = apply_fn(params, x)" in msg, msg
    assert "labels outside" not in msg and "\n" not in msg
    with pytest.raises(ValueError, match="f0 has shape"):  # the what-if functions too
        ntk_tt.sensitivities(kernel, y, f0=f0, learning_rate=0.1, steps=5)


def test_labels_beyond_a_matching_kernel_and_f0_are_still_a_label_error():
    f0, y = np.zeros((6, 2)), np.arange(6) % 3  # kernel and f0 agree on C = 2: y is wrong
    with pytest.raises(ValueError, match=r"y has labels outside \[0, C\) = \[0, 2\)"):
        ntk_tt.predict_from_kernel(np.eye(12), f0, y, learning_rate=0.1, steps=5)


@pytest.mark.parametrize("kernel", [np.eye(18), np.eye(6)])  # full and logit-summed
def test_a_transposed_f0_is_said_to_be_transposed(kernel):
    """f0 of shape (C, N) (the model's logits transposed): the message says so and gives the
    shape to pass (it was a y-shape error for the full kernel)."""
    y = np.arange(6) % 3
    with pytest.raises(ValueError) as err:
        ntk_tt.predict_from_kernel(kernel, np.zeros((3, 6)), y, learning_rate=0.1, steps=5)
    msg = str(err.value)
    assert msg.startswith("f0 looks transposed: it has shape (3, 6) = (C, N)"), msg
    assert "pass f0 of shape (N, C) = (6, 3) (f0.T)" in msg and "y must be" not in msg, msg
    with pytest.raises(ValueError, match="f0 looks transposed"):  # the what-if functions too
        ntk_tt.sensitivities(kernel, y, f0=np.zeros((3, 6)), learning_rate=0.1, steps=5)


@pytest.mark.parametrize("dtype", [int, np.int32, bool])
def test_integer_or_bool_f0_is_cast_to_the_kernel_float_dtype(dtype):
    """f0 = np.zeros((N, C), int) crashed deep in the discrete scan (int32 carry vs float32):
    integer / bool f0 and f0_test are read as floats, giving the float f0's prediction."""
    n, c = 20, 3
    rng = np.random.default_rng(0)
    a = rng.normal(size=(n * c, n * c)).astype(np.float32)
    kernel, y = a @ a.T / (n * c), np.arange(n) % c
    kt = a[: 4 * c] @ a.T / (n * c)
    kw = dict(learning_rate=0.1, steps=5, kernel_test=kt, y_test=np.arange(4) % c)
    got = ntk_tt.predict_from_kernel(kernel, np.zeros((n, c), dtype), y,
                                     f0_test=np.zeros((4, c), dtype), **kw)
    want = ntk_tt.predict_from_kernel(kernel, np.zeros((n, c), np.float32), y,
                                      f0_test=np.zeros((4, c), np.float32), **kw)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        if hasattr(g, "dtype"):
            assert g.dtype == w.dtype
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)
    sens = ntk_tt.sensitivities(kernel, y, f0=np.zeros((n, c), dtype), learning_rate=0.1,
                                steps=5)
    assert sens is not None


@pytest.mark.parametrize("make", [lambda m: jnp.eye(m, dtype=jnp.int32),
                                  lambda m: 3 * np.eye(m, dtype=np.int64),
                                  lambda m: np.tril(np.ones((m, m), np.int32)) @
                                  np.tril(np.ones((m, m), np.int32)).T])
def test_an_integer_kernel_is_cast_to_float_and_predicts_as_its_float_copy(make):
    """A fresh user's probe: is an integer Θ (jnp.eye(10, dtype=jnp.int32), an int64 one)
    computed in integer arithmetic? No: as integer f0, it is cast to the float dtype of the
    solve (solve_dtype: float32 here) where it enters, so every predictor that takes a
    kernel gives the float32 copy's prediction exactly, in float32."""
    n, c = 5, 2
    f0 = (0.1 * np.random.default_rng(0).standard_normal((n, c))).astype(np.float32)
    y = np.arange(n) % c
    kernel = make(n * c)
    as_float = np.asarray(kernel, np.float32)
    calls = {
        "discrete": lambda k: ntk_tt.predict_from_kernel(k, f0, y, learning_rate=0.3,
                                                         steps=8).loss,
        "ode": lambda k: ntk_tt.predict_from_kernel(k, f0, y, learning_rate=0.3, steps=8,
                                                    method="ode").loss,
        "closed_form": lambda k: ntk_tt.predict_from_kernel(
            k, f0, y, learning_rate=0.3, steps=8, loss="mse", method="closed_form").loss,
        "optimizer": lambda k: ntk_tt.predict_from_kernel(k, f0, y, optimizer=ntk_tt.sgd(
            0.3, momentum=0.5), steps=8).loss,
        "sgd_trajectory": lambda k: ntk_tt.sgd_trajectory(k, f0, y, ntk_tt.sgd(0.3),
                                                          steps=8)[0],
        "sensitivities": lambda k: ntk_tt.sensitivities(k, y, f0=f0, learning_rate=0.3,
                                                        steps=8).final_loss,
    }
    for name, call in calls.items():
        got, want = np.asarray(call(kernel)), np.asarray(call(as_float))
        assert got.dtype == np.float32, name
        np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("kernel", [-np.eye(6, dtype=np.int64),
                                    np.triu(np.ones((6, 6), np.int32))],
                         ids=["negative_diagonal", "asymmetric"])
def test_an_integer_kernel_that_is_no_gram_matrix_is_refused_as_its_float_copy(kernel):
    """check_gram skipped every non-floating kernel, so an int64 −I or an asymmetric int32
    kernel gave a curve while its float32 copy is refused: both are refused alike now."""
    f0, y = np.zeros((3, 2), np.float32), np.arange(3) % 2
    messages = []
    for k in (kernel, kernel.astype(np.float32)):
        with pytest.raises(ValueError, match="not symmetric|negative diagonal") as err:
            ntk_tt.predict_from_kernel(k, f0, y, learning_rate=0.3, steps=4)
        messages.append(str(err.value))
    assert messages[0] == messages[1]


def test_non_finite_f0_is_refused_with_the_count_when_concrete():
    from ntk_tt.dynamics._checks import check_finite_logits

    f0, y, kernel = np.zeros((4, 2)), np.array([0, 1, 0, 1]), np.eye(8)
    bad = f0.copy()
    bad[0, 0], bad[1, 1], bad[3, 0] = np.nan, np.inf, -np.inf
    with pytest.raises(ValueError, match=r"^f0 has 3 non-finite entries \(NaN or inf\) of 8"):
        ntk_tt.predict_from_kernel(kernel, bad, y, learning_rate=0.1, steps=5)
    with pytest.raises(ValueError, match=r"^f0 has 3 non-finite entries"):
        ntk_tt.sensitivities(kernel, y, f0=bad, learning_rate=0.1, steps=5)
    with pytest.raises(ValueError, match=r"^f0_test has 1 non-finite entries .* of 4"):
        ntk_tt.predict_from_kernel(kernel, f0, y, learning_rate=0.1, steps=5,
                                   kernel_test=np.ones((4, 8)), f0_test=bad[2:],
                                   y_test=np.array([0, 1]))
    # traced (under jit): not checked, no error while tracing
    jax.make_jaxpr(lambda f: (check_finite_logits(f), f)[1])(jnp.asarray(bad))


def test_verdict_and_beyond_edge_training_time_under_jit_vmap(model):
    """Issue 25: one compiled sweep over η gives each prediction's verdict code
    (``_divergence.VERDICTS``). Cross-entropy on the frozen kernel: "no" with T_ε within the
    edge κ ≤ 4, "unknown" with T_ε NaN (code BEYOND_EDGE) beyond it, where its recursion does
    not blow up, and "yes" from κ ≥ ``KAPPA_MAX`` on (issue 26; T_ε NaN, code
    CALLED_DIVERGES); MSE: the linear recursion
    itself diverges beyond its edge κ = 2 ("yes"). κ
    from an independent float64 eigendecomposition."""
    from ntk_tt.dynamics._divergence import VERDICTS
    from ntk_tt.dynamics._training_time import BEYOND_EDGE, CALLED_DIVERGES, DIVERGED

    apply_fn, params, x, y, _, _ = model
    kernel, f0 = brute_ntk(apply_fn, params, x), apply_fn(params, x)
    lam = float(np.linalg.eigvalsh(np.asarray(kernel, np.float64))[-1])
    kappas = np.array([0.5, 3.9, 4.2, 50.0, 1e4])
    lrs = jnp.asarray(kappas * 20 / lam, jnp.float32)

    def sweep(loss):
        return jax.jit(jax.vmap(lambda lr: ntk_tt.predict_from_kernel(
            kernel, f0, y, learning_rate=lr, steps=STEPS, loss=loss)))(lrs)

    ce = sweep("cross_entropy")
    np.testing.assert_allclose(ce.kappa, kappas, rtol=1e-3)
    assert not np.any(ce.diverged)  # the bounded-gradient recursion never blows up here
    assert [VERDICTS[int(v)] for v in ce.divergence] == ["no", "no", "unknown", "unknown",
                                                         "yes"]  # κ ≥ KAPPA_MAX = 68: "yes"
    t, codes = np.asarray(ce.training_time), np.asarray(ce.training_time_code)
    assert np.all(np.isfinite(t[:2, 0])) and np.all(codes[:2, 0] == 0)  # loss curve's T_ε
    assert np.all(np.isnan(t[2:])) and np.all(codes[2:4] == BEYOND_EDGE)
    assert np.all(codes[4] == CALLED_DIVERGES)  # "yes": predicted to diverge, no T_ε either
    mse = sweep("mse")  # its edge is κ = 2
    assert [VERDICTS[int(v)] for v in mse.divergence] == ["no", "yes", "yes", "yes", "yes"]
    assert np.all(np.asarray(mse.training_time_code)[1:] == DIVERGED)
    with pytest.warns(ntk_tt.BeyondEdgeWarning):  # continuous time, cross-entropy: the same
        ode = ntk_tt.predict_from_kernel(kernel, f0, y, learning_rate=lrs[3], steps=STEPS,
                                         method="ode")
    assert int(ode.divergence) == 2 and np.all(np.asarray(ode.training_time_code) == BEYOND_EDGE)


class _HeadMLP(_MLP):
    """_MLP with its classifier named ``head`` (the head-aware predictor's convention)."""

    def __init__(self, rngs):
        super().__init__(rngs)
        self.head = self.l2

    def __call__(self, x):
        return self.head(jnp.tanh(self.l1(x)))


class _ReluHeadMLP(_HeadMLP):
    """_HeadMLP with ReLU: its input-layer Jacobian grows with x (tanh's saturates)."""

    def __call__(self, x):
        return self.head(nnx.relu(self.l1(x)))


@pytest.mark.parametrize("how", [dict(), dict(predictor="linear"),
                                 dict(predictor="linear", kernel="traced")],
                         ids=["head_aware", "linear", "traced"])
def test_a_kernel_that_overflows_is_said_to_come_from_the_inputs(how):
    """A fresh user's x·1e30: the kernel predict built overflowed float32 and the message
    said "traced_kernel contains NaN or inf; recompute it (... smaller block_size)", of a
    kernel never given. It now names the computed kernel and points at the inputs' scale;
    the same inputs at ordinary scale predict."""
    net = _ReluHeadMLP(nnx.Rngs(0))
    apply_fn, params = ntk_tt.from_nnx(net)
    x = jax.random.normal(jax.random.key(1), (12, 6))
    y = jnp.arange(12) % 3
    kw = dict(learning_rate=0.01, steps=STEPS, head=ntk_tt.split_head(net)) | how
    assert np.isfinite(ntk_tt.predict(apply_fn, params, x, y, **kw).loss).all()
    assert np.isfinite(apply_fn(params, x * 1e30)).all()  # the logits alone are finite
    with pytest.raises(ValueError, match=r"empirical NTK Θ\(x, x\) computed from the model "
                                         r"has NaN or inf entries: its Jacobians overflow "
                                         r"float32 .*check the scale of the inputs"):
        ntk_tt.predict(apply_fn, params, x * 1e30, y, **kw)


@pytest.mark.parametrize("entry", ["predict", "predict_from_kernel", "predict_head_aware",
                                   "suggest"])
def test_labels_of_one_class_are_refused_before_any_work(entry, monkeypatch):
    """As ``ntk-tt`` refuses -K 1: training labels of one class are one ValueError, raised
    before a kernel is built; held-out labels of one class are fine."""
    net = _HeadMLP(nnx.Rngs(0))
    apply_fn, params = ntk_tt.from_nnx(net)
    x = jax.random.normal(jax.random.key(1), (12, 6))
    one = jnp.full((12,), 2)

    hk = ntk_tt.head_aware_kernel(ntk_tt.split_head(net), x)  # set-up, not the call tested

    def no_kernel(*_, **__):
        raise AssertionError("a kernel was built")

    monkeypatch.setattr(ntk_tt, "empirical_ntk", no_kernel)
    monkeypatch.setattr(ntk_tt, "head_aware_kernel", no_kernel)
    kw = dict(learning_rate=0.1, steps=STEPS)
    calls = {
        "predict": lambda: ntk_tt.predict(apply_fn, params, x, one, **kw),
        "predict_from_kernel": lambda: ntk_tt.predict_from_kernel(
            jnp.eye(36), jnp.zeros((12, 3)), one, **kw),
        "predict_head_aware": lambda: ntk_tt.predict_head_aware(hk, one, **kw),
        "suggest": lambda: ntk_tt.suggest(apply_fn, params, x, one, target=0.5,
                                          steps=STEPS, batch_sizes=(None,)),
    }
    with pytest.raises(ValueError, match=r"^y holds labels of one class only \(all 2, N = 12\)"
                                         r": a task needs at least two classes") as err:
        calls[entry]()
    assert "\n" not in str(err.value)
    if entry == "predict":  # held-out labels of one class are a fine held-out set
        monkeypatch.undo()
        two = jnp.arange(12) % 3
        pred = ntk_tt.predict(apply_fn, params, x[:9], two[:9], x_test=x[9:], y_test=one[9:],
                              **kw)
        assert pred.test_error.shape == (STEPS + 1,)


def test_raw_uint8_pixels_are_warned_about():
    """A second fresh user passed raw uint8 images to predict and got only "diverges at
    κ = 17,398"; now a UserWarning names the likely cause and the fix (prepare_images).
    Float inputs give no warning."""
    params, x, y = linear_problem(n=8, dtype=jnp.float32)
    raw = jnp.asarray(np.clip(np.abs(np.asarray(x)) * 100, 0, 255).astype(np.uint8))
    with pytest.warns(UserWarning, match=r"x is uint8, raw image pixels most likely: "
                                         r"normalise them .*ntk_tt\.prepare_images"):
        ntk_tt.predict(linear_apply, params, raw, y, learning_rate=1e-4, steps=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        ntk_tt.predict(linear_apply, params, x, y, learning_rate=0.1, steps=3)
    # predict_from_subset said nothing (a fresh user: κ = 4,853, "training diverged")
    kw = dict(subset_size=4, learning_rate=1e-4, steps=3, key=jax.random.key(0))
    labels = jnp.arange(8) % 2
    with pytest.warns(UserWarning, match=r"x is uint8, raw image pixels most likely") as got:
        ntk_tt.predict_from_subset(linear_apply, params, raw, labels, **kw)
    assert any(w.filename == __file__ for w in got if "uint8" in str(w.message))
    with warnings.catch_warnings(record=True) as got:  # (N' = 4 warns of its small subset)
        warnings.simplefilter("always")
        ntk_tt.predict_from_subset(linear_apply, params, x, labels, **kw)
    assert got and not [w for w in got if "uint8" in str(w.message)]
    with warnings.catch_warnings(record=True) as got:  # predict(subset=) warns once, not twice
        warnings.simplefilter("always")
        ntk_tt.predict(linear_apply, params, raw, labels, loss="mse", subset=4, steps=3,
                       learning_rate=1e-4, key=jax.random.key(0))
    assert [w.filename for w in got if "uint8" in str(w.message)] == [__file__]


@pytest.mark.parametrize("kwargs,message", [
    (dict(batch_size=4), "batch_size=4 < N = 12 draws minibatch orders: pass key="),
    (dict(kernel="sketch"), "kernel='sketch' draws sketch directions: pass key="),
])
def test_missing_key_names_only_the_random_source_that_applies(kwargs, message):
    """A fresh user's minibatch run without a key was told "kernel='exact', method='discrete',
    batch_size=10 draws random numbers (sketch directions, Brownian paths or minibatch
    orders)": the message names what is random in this call only."""
    params, x, y = linear_problem(12)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        ntk_tt.predict(linear_apply, params, x, y, learning_rate=0.1, steps=3, **kwargs)


def test_held_out_samples_of_another_shape_are_refused_before_any_kernel(monkeypatch):
    """A fresh user (session 41): a model that pools over space took 4×4 held-out images
    beside 8×8 training ones with the sketch kernel without a word, and with the exact
    kernel failed after Θ(x, x) naming an x2 they never passed."""
    import ntk_tt.kernels._ntk as ntk_module

    def pooled(p, x):
        return jnp.tanh(x @ p["c"]).mean(axis=(1, 2)) @ p["w"]

    params = {"c": jnp.ones((3, 4)) / 3, "w": jax.random.normal(jax.random.key(2), (4, 2))}
    x = jax.random.normal(jax.random.key(0), (6, 8, 8, 3))
    xt = jax.random.normal(jax.random.key(1), (4, 4, 4, 3))
    y, yt = jnp.arange(6) % 2, jnp.arange(4) % 2
    monkeypatch.setattr(ntk_module, "empirical_ntk", lambda *a, **k: pytest.fail("work began"))
    for kw in (dict(learning_rate=0.1), dict(optimizer=ntk_tt.sgd(0.1))):
        with pytest.raises(ValueError, match=r"x_test's samples have shape \(4, 4, 3\), x's "
                                             r"\(8, 8, 3\): prepare the held-out inputs"):
            ntk_tt.predict(pooled, params, x, y, x_test=xt, y_test=yt, steps=3, **kw)
