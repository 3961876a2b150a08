"""Head-aware predictor vs real optax training of models that are exactly of its form."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _dynamics_helpers import brute_ntk, train_optax
from flax import nnx

import ntk_tt
from ntk_tt.dynamics._fspace import curves
from ntk_tt.dynamics._losses import mean_loss
from ntk_tt.dynamics._predict_head_aware import (
    head_aware_trajectory,
    initial_eigenvalues,
    predict_head_aware,
)
from ntk_tt.kernels._head_aware import (
    HeadAwareKernel,
    head_aware_kernel,
    initial_kernel,
    split_head,
)
from ntk_tt.prediction._head_aware_refresh import _relinearise, predict_head_aware_refreshed

N, D, F, C, STEPS = 12, 5, 4, 3, 20
F64 = jnp.float64


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


class Net(nnx.Module):
    """Backbone Linear(D, F) (then tanh when ``nonlinear``) and a linear ``head``."""

    def __init__(self, nonlinear, *, rngs):
        self.body = nnx.Linear(D, F, param_dtype=F64, rngs=rngs)
        self.head = nnx.Linear(F, C, param_dtype=F64, rngs=rngs)
        self.nonlinear = nonlinear

    def __call__(self, x):
        h = self.body(x)
        return self.head(jnp.tanh(h) if self.nonlinear else h)


def _problem(nonlinear, seed=0):
    kx, ky = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (N + 4, D), F64)
    y = jax.random.randint(ky, (N + 4,), 0, C)
    model = Net(nonlinear, rngs=nnx.Rngs(seed))
    return model, x[:N], y[:N], x[N:], y[N:]


def _batches(key, batch_size):
    return ntk_tt.batch_indices(key, N, batch_size, STEPS)


HYPER = [  # (η, m, nesterov, batch size, loss)
    (0.5, 0.0, False, N, "cross_entropy"),
    (0.2, 0.9, False, N, "cross_entropy"),
    (0.2, 0.8, True, 4, "cross_entropy"),
    (0.1, 0.5, False, 3, "mse"),
]


@pytest.mark.parametrize("backbone", ["isotropic", "kronecker", "exact"])
@pytest.mark.parametrize("lr,m,nesterov,b,loss", HYPER)
def test_linear_backbone_equals_optax(x64, backbone, lr, m, nesterov, b, loss):
    """h = V x + c is linear in its weights and K_h(i, j) = (x_i·x_j + 1) I_F is exactly
    Kronecker with S = I: every backbone option must reproduce real optax training of
    f = (V x + c) W + b, head and backbone trained together."""
    model, x, y, xt, yt = _problem(False)
    apply_fn, params = ntk_tt.from_nnx(model)
    key = jax.random.key(3)
    hk = head_aware_kernel(split_head(model), x, xt, backbone=backbone)
    out = predict_head_aware(hk, y, learning_rate=lr, momentum=m, steps=STEPS, batch_size=b,
                             nesterov=nesterov, loss=loss, key=key, num_paths=2, y_test=yt)
    real = train_optax(apply_fn, params, x, y, _batches(key, b), jnp.concatenate([x, xt]),
                       lr, m, nesterov=nesterov, loss=loss)
    loss_r, err_r = curves(real[:, :N], y, loss)
    np.testing.assert_allclose(out.loss_paths[0], loss_r, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(out.error_paths[0], err_r, atol=1e-12)
    test_r, _ = curves(real[:, N:], yt, loss)
    if b == N:
        np.testing.assert_allclose(out.test_loss, test_r, rtol=1e-9, atol=1e-10)
    # the loss curve moved, so the agreement is not a trivially flat one
    assert loss_r[0] - loss_r[-1] > 0.05 * loss_r[0]


def _linearised_backbone_training(model, x, y, batches, lr, m, nesterov, loss):
    """Reference: optax trains (θ, W, b) of f = (h_0 + J_h(θ − θ_0)) W + b, J_h·Δθ by jvp."""
    feature_fn, bparams, w0, b0 = split_head(model)

    def apply_fn(p, xx):
        delta = jax.tree.map(jnp.subtract, p["theta"], bparams)
        h0, dh = jax.jvp(lambda q: feature_fn(q, xx), (bparams,), (delta,))
        return (h0 + dh) @ p["w"] + p["b"]

    params = {"theta": bparams, "w": w0, "b": b0}
    return train_optax(apply_fn, params, x, y, batches, x, lr, m, nesterov=nesterov, loss=loss)


@pytest.mark.parametrize("lr,m,nesterov,b,loss", HYPER[1:3])
def test_exact_backbone_equals_linearised_backbone_training(x64, lr, m, nesterov, b, loss):
    """Nonlinear (tanh) backbone: the exact feature kernel reproduces optax training of the
    head-aware model itself (head exact, backbone linearised by jax.jvp)."""
    model, x, y, _, _ = _problem(True, seed=1)
    key = jax.random.key(5)
    hk = head_aware_kernel(split_head(model), x, backbone="exact")
    out = predict_head_aware(hk, y, learning_rate=lr, momentum=m, steps=STEPS, batch_size=b,
                             nesterov=nesterov, loss=loss, key=key, num_paths=2)
    real = _linearised_backbone_training(model, x, y, _batches(key, b), lr, m, nesterov, loss)
    np.testing.assert_allclose(out.loss_paths[0], curves(real, y, loss)[0], rtol=1e-9)


def test_initial_kernel_is_the_empirical_ntk(x64):
    """Θ_0 = (HHᵀ + 1) ⊗ I + (I ⊗ W_0ᵀ) K_h (I ⊗ W_0) equals brute-force J Jᵀ (exact
    backbone, tanh net; Kronecker options on the linear backbone, where they are exact)."""
    for nonlinear, backbones in ((True, ["exact"]), (False, ["exact", "kronecker",
                                                             "isotropic"])):
        model, x, *_ = _problem(nonlinear)
        apply_fn, params = ntk_tt.from_nnx(model)
        want = brute_ntk(apply_fn, params, x)
        for backbone in backbones:
            hk = head_aware_kernel(split_head(model), x, backbone=backbone)
            np.testing.assert_allclose(initial_kernel(hk), want, rtol=1e-9, atol=1e-9)


def _random_kronecker(key, n, f, c, *, psd):
    """A HeadAwareKernel with a random Kronecker backbone k_b (PSD or with a negative
    eigenvalue far beyond rounding) and a random PSD mixing S."""
    ks = jax.random.split(key, 4)
    a = jax.random.normal(ks[0], (n, n), F64)
    kb = a @ a.T / n - (0.0 if psd else 3.0) * jnp.eye(n, dtype=F64)
    s = jax.random.normal(ks[1], (f, f), F64)
    return HeadAwareKernel(jax.random.normal(ks[2], (n, f), F64),
                           jax.random.normal(ks[3], (f, c), F64), jnp.zeros(c, F64), kb,
                           s @ s.T / f)


@pytest.mark.parametrize("psd", [True, False])
def test_initial_eigenvalues_equal_those_of_the_formed_kernel(x64, psd):
    """λ_max and λ_min of Θ_0 from its C blocks A + g_c k_b equal eigvalsh of the formed
    (N·C, N·C) initial_kernel; clamping is flagged exactly when Θ_0 is not PSD; the exact
    feature kernel (no Kronecker structure) agrees too."""
    hk = _random_kronecker(jax.random.key(7), 15, 4, 3, psd=psd)
    want = np.linalg.eigvalsh(np.asarray(initial_kernel(hk)))
    lmin, lmax = jax.jit(initial_eigenvalues)(hk)
    np.testing.assert_allclose(lmax, want[-1], rtol=1e-6)  # 60 power iterations
    if psd:  # inverse iteration: an upper bound on λ_min, close to it
        assert want[0] > 0 and want[0] - 1e-9 <= lmin <= 1.01 * want[0]
    else:
        assert want[0] < -1.0
        np.testing.assert_allclose(lmin, want[0], rtol=1e-8)
    model, x, *_ = _problem(True)
    exact = head_aware_kernel(split_head(model), x, backbone="exact")
    want = np.linalg.eigvalsh(np.asarray(initial_kernel(exact)))
    np.testing.assert_allclose(initial_eigenvalues(exact)[1], want[-1], rtol=1e-6)


def test_head_aware_flags_a_kernel_that_is_not_psd(x64):
    """predict_head_aware reports Θ_0's λ_min and flags clamping from the block spectrum."""
    y = jnp.arange(15) % 3
    for psd in (True, False):
        hk = _random_kronecker(jax.random.key(7), 15, 4, 3, psd=psd)
        out = predict_head_aware(hk, y, learning_rate=1e-4, steps=3)
        assert bool(out.clamped) is (not psd)
        lmin = np.linalg.eigvalsh(np.asarray(initial_kernel(hk)))[0]
        if not psd:
            np.testing.assert_allclose(out.min_eigenvalue, lmin, rtol=1e-8)


def test_head_grows_the_kernel_frozen_linear_does_not(x64):
    """With a fresh small head the backbone's share of Θ grows with ‖W‖²: on the nonlinear
    net, head-aware GD learns faster late than the frozen-kernel prediction."""
    model, x, y, _, _ = _problem(True, seed=2)
    model.head.kernel[...] = 0.1 * model.head.kernel[...]
    apply_fn, params = ntk_tt.from_nnx(model)
    hk = head_aware_kernel(split_head(model), x, backbone="exact")
    kw = dict(learning_rate=2.0, steps=60)
    ha = predict_head_aware(hk, y, **kw)
    lin = ntk_tt.predict_from_kernel(brute_ntk(apply_fn, params, x), apply_fn(params, x), y,
                                     **kw)
    real = train_optax(apply_fn, params, x, y, _batches(None, N)[:1].repeat(60, 0), x, 2.0,
                       0.0, nesterov=False, loss="cross_entropy")
    loss_r = curves(real, y, "cross_entropy")[0]
    assert abs(ha.loss[-1] - loss_r[-1]) < abs(lin.loss[-1] - loss_r[-1])


def test_jit_vmap_over_learning_rate_shares_one_kernel(x64):
    model, x, y, _, _ = _problem(False)
    hk = head_aware_kernel(split_head(model), x, backbone="isotropic")
    lrs = jnp.array([0.1, 0.3])
    many = jax.jit(jax.vmap(lambda lr: predict_head_aware(hk, y, learning_rate=lr,
                                                          steps=STEPS).loss))(lrs)
    for i, lr in enumerate(lrs):
        one = predict_head_aware(hk, y, learning_rate=float(lr), steps=STEPS).loss
        np.testing.assert_allclose(many[i], one, rtol=1e-10)


def test_errors(x64):
    model, x, y, _, _ = _problem(False)
    with pytest.raises(ValueError, match="backbone must be one of"):
        head_aware_kernel(split_head(model), x, backbone="sketch")
    with pytest.raises(ValueError, match="nnx.Linear attribute `head`"):
        split_head(nnx.Linear(2, 2, rngs=nnx.Rngs(0)))
    bare = Net(False, rngs=nnx.Rngs(0))  # a fresh user: the message said "name it `head`"
    bare.head = nnx.Linear(F, C, use_bias=False, param_dtype=F64, rngs=nnx.Rngs(1))
    with pytest.raises(ValueError, match=r"without a bias \(use_bias=False\).*use_bias=True"):
        split_head(bare)
    hk = head_aware_kernel(split_head(model), x, backbone="isotropic")
    bad = HeadAwareKernel(hk.features, hk.head_kernel, hk.head_bias, hk.backbone[:-1],
                          hk.mixing)
    with pytest.raises(ValueError, match="backbone kernel must be"):
        predict_head_aware(bad, y, learning_rate=0.1, steps=3)
    with pytest.raises(ValueError, match="key"):
        predict_head_aware(hk, y, learning_rate=0.1, steps=3, batch_size=4)
    # a held-out kernel of the wrong width gave numbers, silently (a fresh user's find)
    _, x2, _, xt, yt = _problem(False)
    for kind in ("isotropic", "diagonal"):
        good = head_aware_kernel(split_head(model), x2, xt, backbone=kind)
        bad = good._replace(backbone_test=good.backbone_test[:, :-1])
        for opt in ({"learning_rate": 0.1}, {"optimizer": ntk_tt.sgd(0.1)}):
            with pytest.raises(ValueError, match=r"backbone_test must be \(\d+, \d+\), got"):
                predict_head_aware(bad, y, steps=3, y_test=yt, **opt)
    # a fresh user: y_test with a kernel built without x_test was ignored (test_loss None)
    said = r"^y_test given, but the kernel has no held-out features: build it with x_test"
    for opt in ({"learning_rate": 0.1}, {"optimizer": ntk_tt.sgd(0.1)}):
        with pytest.raises(ValueError, match=said):
            predict_head_aware(hk, y, steps=3, y_test=y[:2], **opt)


def test_predict_head_aware_option(x64):
    """``predict(..., head=split_head(model))`` runs the head-aware model (default when a head
    is given; its default feature kernel the diagonal one) and, with the isotropic feature
    kernel, agrees with real optax training on the linear-backbone net (where that kernel is
    exact); ``predictor="linear"`` still gives the frozen-kernel recursion."""
    model, x, y, xt, yt = _problem(False)
    apply_fn, params = ntk_tt.from_nnx(model)
    kw = dict(learning_rate=0.5, steps=STEPS, x_test=xt, y_test=yt)
    default = ntk_tt.predict(apply_fn, params, x, y, head=split_head(model), **kw)
    assert default.kernel == "head_aware:diagonal"
    pred = ntk_tt.predict(apply_fn, params, x, y, head=split_head(model), backbone="isotropic",
                          **kw)
    assert pred.kernel == "head_aware:isotropic"
    real = train_optax(apply_fn, params, x, y, _batches(None, N), jnp.concatenate([x, xt]),
                       0.5, 0.0, nesterov=False, loss="cross_entropy")
    np.testing.assert_allclose(pred.loss, curves(real[:, :N], y, "cross_entropy")[0],
                               rtol=1e-9)
    np.testing.assert_allclose(pred.test_loss, curves(real[:, N:], yt, "cross_entropy")[0],
                               rtol=1e-9)
    lin = ntk_tt.predict(apply_fn, params, x, y, head=split_head(model), predictor="linear",
                         **kw)
    assert lin.kernel == "exact" and not np.allclose(lin.loss, pred.loss, rtol=1e-6)


def test_predict_head_aware_errors_before_work(x64):
    model, x, y, _, _ = _problem(False)
    apply_fn, params = ntk_tt.from_nnx(model)
    split = split_head(model)
    kw = dict(learning_rate=0.1, steps=3)
    for extra, msg in [
        (dict(predictor="head_aware"), "needs head=ntk_tt.split_head"),
        (dict(predictor="best"), "predictor must be one of"),
        (dict(head=split, backbone="sketch"), "backbone must be one of"),
        (dict(head=split, method="ode"), "exact discrete recursion"),
        (dict(head=split, kernel="sketch", key=jax.random.key(0)), "logit-summed"),
        (dict(head=split_head(_problem(False, seed=4)[0])), "does not reproduce apply_fn"),
    ]:
        with pytest.raises(ValueError, match=msg):
            ntk_tt.predict(apply_fn, params, x, y, **kw, **extra)


class _HeadNotLast(nnx.Module):
    """A layer after ``head``: ``split_head`` cannot see it; ``predict`` must say so."""

    def __init__(self, *, rngs):
        self.body = nnx.Linear(D, F, param_dtype=F64, rngs=rngs)
        self.head = nnx.Linear(F, C, param_dtype=F64, rngs=rngs)
        self.post = nnx.Linear(C, C, param_dtype=F64, rngs=rngs)

    def __call__(self, x):
        return self.post(self.head(self.body(x)))


def test_a_layer_after_the_head_is_refused_in_one_line(x64):
    """A fresh user's find: the features (F) reached ``post`` (C inputs) and predict raised
    a raw ``dot_general`` TypeError instead of its 'does not reproduce' message."""
    _, x, y, _, _ = _problem(False)
    model = _HeadNotLast(rngs=nnx.Rngs(0))
    apply_fn, params = ntk_tt.from_nnx(model)
    with pytest.raises(ValueError, match=r"does not reproduce apply_fn.*fails \(.*\): does "
                                         r"a layer follow `head`\?.*last layer"):
        ntk_tt.predict(apply_fn, params, x, y, head=split_head(model), learning_rate=0.1,
                       steps=3)


@pytest.mark.parametrize("lr,m,nesterov,b,loss", HYPER[1:3])
def test_refreshed_on_a_linear_backbone_equals_optax(x64, lr, m, nesterov, b, loss):
    """A linear backbone's Jacobian does not depend on its weights, so re-linearising along
    the predicted path (4 segments, weights moved by the vjp, velocities carried) must still
    reproduce real optax training exactly — a check of the segment hand-over."""
    model, x, y, xt, yt = _problem(False)
    apply_fn, params = ntk_tt.from_nnx(model)
    key = jax.random.key(7)
    out = predict_head_aware_refreshed(split_head(model), x, y, segments=4, learning_rate=lr,
                                       momentum=m, steps=STEPS, batch_size=b,
                                       nesterov=nesterov, loss=loss, key=key, x_test=xt,
                                       y_test=yt, backbone="exact")
    real = train_optax(apply_fn, params, x, y, _batches(key, b), jnp.concatenate([x, xt]),
                       lr, m, nesterov=nesterov, loss=loss)
    np.testing.assert_allclose(out.loss, curves(real[:, :N], y, loss)[0], rtol=1e-8)
    np.testing.assert_allclose(out.test_loss, curves(real[:, N:], yt, loss)[0], rtol=1e-8)


def test_refreshed_moves_the_backbone_like_training(x64):
    """Tanh backbone, exact feature kernel: the weights the refreshed predictor reaches after
    one segment are the head-aware model's (θ_0 − J_hᵀ z equals optax training of the
    jvp-linearised model), and with one segment it is the plain head-aware prediction."""
    model, x, y, _, _ = _problem(True, seed=1)
    split = split_head(model)
    feature_fn, theta0, w0, b0 = split
    kw = dict(learning_rate=1.0, momentum=0.5, steps=10, backbone="exact")
    one = predict_head_aware_refreshed(split, x, y, segments=1, **kw)
    hk = head_aware_kernel(split, x, backbone="exact")
    plain = predict_head_aware(hk, y, learning_rate=1.0, momentum=0.5, steps=10)
    np.testing.assert_allclose(one.loss, plain.loss, rtol=1e-12)
    batches = _batches(None, N)[:10]
    _, _, state = head_aware_trajectory(hk, y, batches, learning_rate=1.0, momentum=0.5,
                                        nesterov=False, loss="cross_entropy")
    moved = _relinearise(feature_fn, theta0, x, state.z)

    def lin_apply(p, xx):
        delta = jax.tree.map(jnp.subtract, p["theta"], theta0)
        h0, dh = jax.jvp(lambda q: feature_fn(q, xx), (theta0,), (delta,))
        return (h0 + dh) @ p["w"] + p["b"]

    p = {"theta": theta0, "w": w0, "b": b0}
    opt = optax.sgd(1.0, 0.5)
    s = opt.init(p)
    for _ in range(10):
        g = jax.grad(lambda q: mean_loss(lin_apply(q, x), y, "cross_entropy"))(p)
        u, s = opt.update(g, s, p)
        p = optax.apply_updates(p, u)
    for a, b in zip(jax.tree.leaves(moved), jax.tree.leaves(p["theta"]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="segments"):
        predict_head_aware_refreshed(split, x, y, segments=11, **kw)


def test_feature_mixing_is_the_sum_of_per_sample_feature_kernels(x64):
    """S = Σ_i J_h(x_i) J_h(x_i)ᵀ normalised to trace F, against jax.jacrev of the features."""
    from ntk_tt.kernels._head_aware import feature_mixing

    model, x, _, _, _ = _problem(nonlinear=True)
    feature_fn, bparams, _, _ = split_head(model)
    s = feature_mixing(feature_fn, bparams, x)
    jac = jax.jacrev(lambda p: feature_fn(p, x))(bparams)  # leaves (N, F, *param_shape)
    rows = jnp.concatenate([j.reshape(N, F, -1) for j in jax.tree.leaves(jac)], axis=-1)
    ref = jnp.einsum("ifp,igp->fg", rows, rows)
    np.testing.assert_allclose(s, ref * (F / jnp.trace(ref)), rtol=1e-10, atol=1e-12)


def test_head_too_small_to_read_k_b_off_theta_is_refused():
    """k_b = (ΣcΘ − C(HHᵀ + 1)) / tr(W_0ᵀW_0): a zero head gives 0/0 and a head so small that
    the backbone's share is below float32 rounding gives noise / tiny (the prediction blew
    up); both are one clear ValueError, and an ordinary head passes. Bad splits and a plain
    matrix for hk are refused too."""
    class Net32(nnx.Module):  # float32, where rounding is the issue
        def __init__(self, rngs):
            self.body, self.head = nnx.Linear(D, F, rngs=rngs), nnx.Linear(F, C, rngs=rngs)

        def __call__(self, x):
            return self.head(jnp.tanh(self.body(x)))

    model = Net32(nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (N, D))
    y = jnp.arange(N) % C
    for scale, match in ((0.0, "non-zero head"), (1e-6, "too small")):
        small = nnx.clone(model)
        small.head.kernel[...] = scale * small.head.kernel[...]
        with pytest.raises(ValueError, match=match):
            head_aware_kernel(split_head(small), x)
    hk = head_aware_kernel(split_head(model), x)
    assert np.all(np.isfinite(hk.backbone))
    with pytest.raises(ValueError, match="split must be ntk_tt.split_head"):
        head_aware_kernel((1, 2), x)
    with pytest.raises(ValueError, match="x \\(feature_fn inputs\\)"):
        head_aware_kernel(split_head(model), jnp.ones((N, D + 1), jnp.float32))
    with pytest.raises(ValueError, match="HeadAwareKernel"):
        predict_head_aware(np.eye(N * C), y, learning_rate=0.1, steps=3)


def test_an_exact_feature_kernel_beyond_half_the_memory_is_refused_before_any_work(
        monkeypatch):
    """The main job's N = 750 with --backbone exact (K_h 48,000², 11.4 GiB with its held-out
    part) peaked at 20.2 GiB of a 23 GiB machine and ran 15 minutes without output. Now
    head_aware_kernel refuses, before any Jacobian, exact kernels needing more than half the
    available memory: here K_h (N·F)² and the cross kernel (N_t·F × N·F) in float32 bytes
    against a limit set just below and just above twice that."""
    import ntk_tt.kernels._ntk as ntk_module

    model, x, _, xt, _ = _problem(True)
    x, xt = x.astype(jnp.float32), xt.astype(jnp.float32)
    nnx.update(model, jax.tree.map(lambda a: a.astype(jnp.float32), nnx.state(model)))
    need = 4 * (N * F) * (N * F + len(xt) * F)
    real = ntk_module.empirical_ntk
    monkeypatch.setattr(ntk_module, "empirical_ntk",
                        lambda *a, **k: pytest.fail("kernel work began"))
    monkeypatch.setenv("NTK_TT_MEMORY_LIMIT", str(2 * need - 1))
    with pytest.raises(ntk_tt.NTKMemoryError, match=rf"backbone='exact' needs the \({N * F}, "
                                                    rf"{N * F}\) feature kernel K_h and its "
                                                    rf"held-out cross kernel \({len(xt) * F}, "
                                                    rf"{N * F}\).*backbone='subspace'"):
        head_aware_kernel(split_head(model), x, xt, backbone="exact")
    monkeypatch.setattr(ntk_module, "empirical_ntk", real)
    monkeypatch.setenv("NTK_TT_MEMORY_LIMIT", str(2 * need + 10**6))  # the guard's own share
    hk = head_aware_kernel(split_head(model), x, xt, backbone="exact")
    assert hk.backbone.shape == (N * F, N * F) and hk.backbone_test.shape == (len(xt) * F, N * F)
