"""The "subspace" feature kernel (issue 26): K_h exact on the features' leading principal
directions Z, against optax training of the head-aware model whose feature displacement is
projected on span(Z), brute-force Jacobians, and the exact feature kernel (k = F)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _dynamics_helpers import brute_ntk, train_optax, train_tx
from _scripts import experiment_script
from test_head_aware import HYPER, STEPS, N, _batches, _problem

import ntk_tt
from ntk_tt.dynamics._fspace import curves
from ntk_tt.dynamics._predict_head_aware import predict_head_aware
from ntk_tt.kernels._head_aware import (
    backbone_kind,
    feature_basis,
    head_aware_kernel,
    initial_kernel,
    split_head,
)

K = 2  # of F = 4 features


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _projected_model(model, x):
    """Reference (apply_fn, params): f = (h_0 + (J_h Δθ) Z Zᵀ) W + b with Z the k = K leading
    principal directions of the training features; J_h Δθ by jax.jvp."""
    feature_fn, bparams, w0, b0 = split_head(model)
    z = feature_basis(feature_fn(bparams, x), K)

    def apply_fn(p, xx):
        delta = jax.tree.map(jnp.subtract, p["theta"], bparams)
        h0, dh = jax.jvp(lambda q: feature_fn(q, xx), (bparams,), (delta,))
        return (h0 + dh @ z @ z.T) @ p["w"] + p["b"]

    return apply_fn, {"theta": bparams, "w": w0, "b": b0}


def matches_training(hk, reference, data, key, hyper):
    """Assert the recursion on ``hk`` reproduces optax training of ``reference`` (apply_fn,
    params) on ``data`` (x, y, x_test, y_test) at ``hyper`` (η, m, nesterov, B, loss): the
    training curve, and at B = N the held-out one. Returns the real training loss curve."""
    (x, y, xt, yt), (lr, m, nesterov, b, loss) = data, hyper
    out = predict_head_aware(hk, y, learning_rate=lr, momentum=m, steps=STEPS, batch_size=b,
                             nesterov=nesterov, loss=loss, key=key, num_paths=2, y_test=yt)
    real = train_optax(*reference, x, y, _batches(key, b), jnp.concatenate([x, xt]), lr, m,
                       nesterov=nesterov, loss=loss)
    want = curves(real[:, :N], y, loss)[0]
    np.testing.assert_allclose(out.loss_paths[0], want, rtol=1e-9, atol=1e-12)
    if b == N:
        np.testing.assert_allclose(out.test_loss, curves(real[:, N:], yt, loss)[0],
                                   rtol=1e-9, atol=1e-12)
    return want


@pytest.mark.parametrize("lr,m,nesterov,b,loss", HYPER)
def test_subspace_equals_projected_weight_space_training(x64, lr, m, nesterov, b, loss):
    """tanh backbone, k = 2 of F = 4: the function-space recursion on K_Z reproduces optax
    training of the head-aware model with its feature displacement projected on span(Z),
    training and held-out curves; the projection matters (the exact kernel differs)."""
    model, x, y, xt, yt = _problem(True, seed=1)
    key = jax.random.key(5)
    hk = head_aware_kernel(split_head(model), x, xt, backbone="subspace", subspace_dim=K)
    want = matches_training(hk, _projected_model(model, x), (x, y, xt, yt), key,
                            (lr, m, nesterov, b, loss))
    exact = predict_head_aware(head_aware_kernel(split_head(model), x, backbone="exact"), y,
                               learning_rate=lr, momentum=m, steps=STEPS, batch_size=b,
                               nesterov=nesterov, loss=loss, key=key, num_paths=2)
    assert np.max(np.abs(exact.loss_paths[0] - want)) > 1e-6


def test_subspace_kernel_is_the_projected_feature_kernel(x64):
    """K_Z = (I ⊗ Zᵀ) K_h (I ⊗ Z) from brute-force Jacobians; Θ_0 of the subspace model is
    the brute-force NTK of the projected reference model; Z has orthonormal columns."""
    model, x, *_ = _problem(True, seed=2)
    split = split_head(model)
    hk = head_aware_kernel(split, x, backbone="subspace", subspace_dim=K)
    z = np.asarray(hk.basis)
    np.testing.assert_allclose(z.T @ z, np.eye(K), atol=1e-12)
    f = z.shape[0]
    kh = np.asarray(brute_ntk(split[0], split[1], x)).reshape(N, f, N, f)
    want = np.einsum("ak,iajb,bl->ikjl", z, kh, z).reshape(N * K, N * K)
    np.testing.assert_allclose(hk.backbone, want, rtol=1e-9, atol=1e-12)
    apply_fn, params = _projected_model(model, x)
    np.testing.assert_allclose(initial_kernel(hk), brute_ntk(apply_fn, params, x),
                               rtol=1e-9, atol=1e-10)
    assert backbone_kind(hk) == "subspace"


def test_all_directions_are_the_exact_kernel(x64):
    """k = F spans every feature direction: the same curves as backbone='exact'."""
    model, x, y, _, _ = _problem(True, seed=1)
    key, (lr, m, nesterov, b, loss) = jax.random.key(7), HYPER[2]
    kw = dict(learning_rate=lr, momentum=m, steps=STEPS, batch_size=b, nesterov=nesterov,
              loss=loss, key=key, num_paths=2)
    full = head_aware_kernel(split_head(model), x, backbone="subspace", subspace_dim=4)
    exact = head_aware_kernel(split_head(model), x, backbone="exact")
    np.testing.assert_allclose(predict_head_aware(full, y, **kw).loss_paths,
                               predict_head_aware(exact, y, **kw).loss_paths, rtol=1e-9)


def test_predict_labels_the_subspace_kernel(x64):
    model, x, y, _, _ = _problem(True, seed=1)
    apply_fn, params = ntk_tt.from_nnx(model)
    pred = ntk_tt.predict(apply_fn, params, x, y, learning_rate=0.2, steps=STEPS,
                          head=split_head(model), backbone="subspace")
    assert pred.kernel == "head_aware:subspace"
    # the default k = 16 exceeds F = 4: every feature direction, so the exact kernel's curve
    exact = ntk_tt.predict(apply_fn, params, x, y, learning_rate=0.2, steps=STEPS,
                           head=split_head(model), backbone="exact")
    np.testing.assert_allclose(pred.loss, exact.loss, rtol=1e-9)


def test_predict_takes_the_subspace_dimension(x64):
    """predict(subspace_dim=k) is the recursion on head_aware_kernel(subspace_dim=k) (it had
    no way to set k); k given where it sets nothing is refused before any kernel work."""
    model, x, y, _, _ = _problem(True, seed=1)
    apply_fn, params = ntk_tt.from_nnx(model)
    split = split_head(model)
    kw = dict(learning_rate=0.2, steps=STEPS, head=split)
    pred = ntk_tt.predict(apply_fn, params, x, y, backbone="subspace", subspace_dim=K, **kw)
    hk = head_aware_kernel(split, x, backbone="subspace", subspace_dim=K)
    np.testing.assert_allclose(pred.loss, predict_head_aware(
        hk, y, learning_rate=0.2, steps=STEPS).loss, rtol=1e-12)
    full = ntk_tt.predict(apply_fn, params, x, y, backbone="subspace", **kw)  # k = 16 ≥ F
    assert np.max(np.abs(pred.loss - full.loss)) > 1e-6  # k = 2 of F = 4 is another kernel
    sgd = ntk_tt.predict(apply_fn, params, x, y, optimizer=ntk_tt.sgd(0.2, 0.5), steps=STEPS,
                         head=split, backbone="subspace", subspace_dim=K)
    np.testing.assert_allclose(sgd.loss, predict_head_aware(
        hk, y, learning_rate=0.2, momentum=0.5, steps=STEPS).loss, rtol=1e-9)
    # with a kernel given, "drop subspace_dim" whatever the backbone (a fresh user was told to
    # choose the subspace backbone first, then to drop subspace_dim)
    for bad, said in ((dict(backbone="isotropic"), "only, got backbone 'isotropic'"),
                      (dict(backbone="subspace", head_kernel=hk), "built with its own k"),
                      (dict(head_kernel=hk), "built with its own k")):
        with pytest.raises(ValueError, match=f"subspace_dim .*{said}"):
            ntk_tt.predict(apply_fn, params, x, y, subspace_dim=K, **kw, **bad)
    # the linear predictor has no feature kernel: a backbone there was silently unused
    for linear in (dict(predictor="linear", head=split), {}):
        with pytest.raises(ValueError, match="backbone='subspace' sets the head-aware "
                                             "predictor's feature kernel; the linear"):
            ntk_tt.predict(apply_fn, params, x, y, learning_rate=0.2, steps=STEPS,
                           backbone="subspace", **linear)


@pytest.mark.parametrize("bad", [0, -3, True, 2.0, "8"])
def test_bad_subspace_dim(x64, bad):
    model, x, *_ = _problem(True)
    with pytest.raises(ValueError, match=r"subspace_dim \(--subspace-dim\) must be an int >= 1"):
        head_aware_kernel(split_head(model), x, backbone="subspace", subspace_dim=bad)


@pytest.mark.parametrize("backbone", ["isotropic", "kronecker", "exact"])
def test_subspace_dim_with_another_backbone_is_refused(x64, backbone):
    """head_aware_kernel(subspace_dim=k) sets the subspace kernel's k only: with another
    backbone it was silently ignored (a fresh user's find); predict refused it already."""
    model, x, *_ = _problem(True)
    with pytest.raises(ValueError, match=f"got backbone {backbone!r}: drop it"):
        head_aware_kernel(split_head(model), x, backbone=backbone, subspace_dim=4)


def test_subspace_is_refused_where_it_has_no_form(x64):
    """The re-linearised predictor refuses it, before work (Adam takes it:
    tests/test_adam_subspace.py)."""
    model, x, y, _, _ = _problem(True)
    split = split_head(model)
    with pytest.raises(ValueError, match="subspace backbone is not re-linearised"):
        ntk_tt.predict_head_aware_refreshed(split, x, y, segments=2, learning_rate=0.1,
                                            steps=4, backbone="subspace")


@pytest.mark.parametrize("decoupled", [True, False])
def test_weight_decay_moves_the_features_in_the_subspace(x64, decoupled):
    """Weight decay (decoupled and L2, momentum, minibatches, a schedule): the decay's
    feature-space term J_h θ is projected on span(Z) as the kernel is; the curves equal optax
    training of the projected model with the same optimiser."""
    model, x, y, _, _ = _problem(True, seed=1)
    key = jax.random.key(9)
    opt = ntk_tt.sgd(ntk_tt.warmup_cosine(0.3, 5, STEPS), 0.5, weight_decay=0.5,
                     decoupled=decoupled, batch_size=4)
    split = split_head(model)
    hk = head_aware_kernel(split, x, backbone="subspace", subspace_dim=K)
    a_h = ntk_tt.weight_tangent(split[0], split[1], x)
    out = predict_head_aware(hk, y, optimizer=opt, steps=STEPS, key=key, num_paths=2, a_h=a_h)
    apply_fn, params = _projected_model(model, x)
    real = train_tx(apply_fn, params, x, y, opt.to_optax(), _batches(key, 4), x,
                    "cross_entropy")
    np.testing.assert_allclose(out.loss_paths[0], curves(real, y, "cross_entropy")[0],
                               rtol=1e-9, atol=1e-12)


def test_every_direction_when_there_are_fewer_samples_than_features(x64):
    """N = 3 < F = 4: the centred features have rank ≤ 2, and k = F still spans every
    direction, so the curve is the exact kernel's."""
    model, x, y, _, _ = _problem(True, seed=1)
    x, y = x[:3], y[:3]
    kw = dict(learning_rate=1.0, steps=STEPS, num_paths=1)
    full = head_aware_kernel(split_head(model), x, backbone="subspace", subspace_dim=4)
    assert full.basis.shape == (4, 4)
    exact = head_aware_kernel(split_head(model), x, backbone="exact")
    np.testing.assert_allclose(predict_head_aware(full, y, **kw).loss,
                               predict_head_aware(exact, y, **kw).loss, rtol=1e-9)


def test_nested_blocks_are_the_smaller_subspace_kernel(x64, monkeypatch):
    """experiments/feature_subspace.py reads k < k_max off one kernel: the leading (k × k)
    blocks of K_Z and Z's first k columns equal the kernel built for k itself."""
    from _scripts import EXPERIMENTS

    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    fs = experiment_script("feature_subspace")
    model, x, *_ = _problem(True, seed=2)
    big = head_aware_kernel(split_head(model), x, backbone="subspace", subspace_dim=4)
    small = head_aware_kernel(split_head(model), x, backbone="subspace", subspace_dim=K)
    got = fs.nested(big, K)
    np.testing.assert_allclose(got.basis, small.basis, atol=1e-12)
    np.testing.assert_allclose(got.backbone, small.backbone, rtol=1e-9, atol=1e-12)


def test_a_backbone_other_than_the_given_kernels_is_refused(x64):
    """predict(head_kernel=<isotropic>, backbone="subspace") ran the isotropic kernel and
    said nothing (a fresh user's find); the default backbone, or the kernel's own, pass."""
    model, x, y, _, _ = _problem(True, seed=1)
    apply_fn, params = ntk_tt.from_nnx(model)
    split = split_head(model)
    iso = head_aware_kernel(split, x)
    kw = dict(learning_rate=0.2, steps=STEPS, head=split)
    with pytest.raises(ValueError, match="backbone='subspace', but the head_kernel given is "
                                         "of the 'isotropic' form"):
        ntk_tt.predict(apply_fn, params, x, y, head_kernel=iso, backbone="subspace", **kw)
    assert ntk_tt.predict(apply_fn, params, x, y, head_kernel=iso, **kw).kernel == \
        "head_aware:isotropic"
    sub = head_aware_kernel(split, x, backbone="subspace", subspace_dim=K)
    assert ntk_tt.predict(apply_fn, params, x, y, head_kernel=sub, backbone="subspace",
                          **kw).kernel == "head_aware:subspace"
