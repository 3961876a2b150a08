"""The "diagonal" feature kernel (issue 26): the per-logit blocks of the empirical NTK
against brute-force Jacobians, and the head-aware prediction on the diagonal kernel against
optax training of a weight-space model where it is exact (each principal direction moved by
its own copy of the backbone's weights)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _ntk_models import brute_ntk, cnn, inputs, mlp
from test_head_aware import HYPER, STEPS, _problem
from test_head_aware_subspace import matches_training

import ntk_tt
from ntk_tt.dynamics._predict_head_aware import predict_head_aware
from ntk_tt.kernels._diagonal import logit_blocks
from ntk_tt.kernels._head_aware import backbone_kind, feature_basis, head_aware_kernel, split_head

K = 3  # of F = 4 features


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("block_size", [None, 3])
def test_logit_blocks_are_the_brute_force_diagonal_blocks(x64, kind, block_size):
    """Θ_c = J_c J_cᵀ for every logit c, symmetric and cross, one block or several (7 rows in
    blocks of 3: a padded last block): the diagonal blocks of brute-force Θ; their sum is the
    logit-summed kernel."""
    apply_fn, params = (mlp if kind == "mlp" else cnn)(jax.random.key(0))
    x, x2 = inputs(kind, jax.random.key(1), 7), inputs(kind, jax.random.key(2), 5)
    for rows, cols in ((x, None), (x2, x)):
        got = np.asarray(logit_blocks(apply_fn, params, rows, cols, block_size=block_size))
        full = np.asarray(brute_ntk(apply_fn, params, rows, cols))
        c = got.shape[0]
        want = full.reshape(rows.shape[0], c, -1, c).diagonal(axis1=1, axis2=3)
        np.testing.assert_allclose(got, want.transpose(2, 0, 1), rtol=1e-10, atol=1e-12)
    traced = ntk_tt.empirical_ntk(apply_fn, params, x, trace_logits=True)
    np.testing.assert_allclose(np.asarray(logit_blocks(apply_fn, params, x)).sum(0), traced,
                               rtol=1e-10)


def _diagonal_model(model, x):
    """Reference (apply_fn, params): f = (h_0 + Σ_a (z_aᵀ J_h (θ_a − θ_0)) z_aᵀ) W + b, one copy
    θ_a of the backbone's weights per principal direction z_a (k = K), J_h Δθ by jax.jvp: the
    directions share no weight, so the kernel between them is zero and within one it is
    z_aᵀ K_h z_a, the diagonal kernel exactly."""
    feature_fn, bparams, w0, b0 = split_head(model)
    z = feature_basis(feature_fn(bparams, x), K)

    def apply_fn(p, xx):
        h0 = feature_fn(bparams, xx)
        moved = 0.0
        for a, theta in enumerate(p["thetas"]):
            delta = jax.tree.map(jnp.subtract, theta, bparams)
            dh = jax.jvp(lambda q: feature_fn(q, xx), (bparams,), (delta,))[1]
            moved = moved + (dh @ z[:, a])[:, None] * z[:, a][None, :]
        return (h0 + moved) @ p["w"] + p["b"]

    return apply_fn, {"thetas": [bparams] * K, "w": w0, "b": b0}


@pytest.mark.parametrize("lr,m,nesterov,b,loss", HYPER)
def test_diagonal_equals_weight_space_training_of_its_model(x64, lr, m, nesterov, b, loss):
    """tanh backbone, k = 3 of F = 4: the function-space recursion on the diagonal kernel
    reproduces optax training of the per-direction model above, training and held-out curves;
    dropping the blocks between directions matters (the subspace kernel's curve differs)."""
    model, x, y, xt, yt = _problem(True, seed=1)
    key = jax.random.key(5)
    hk = head_aware_kernel(split_head(model), x, xt, backbone="diagonal", subspace_dim=K)
    assert backbone_kind(hk) == "diagonal"
    want = matches_training(hk, _diagonal_model(model, x), (x, y, xt, yt), key,
                            (lr, m, nesterov, b, loss))
    sub = head_aware_kernel(split_head(model), x, backbone="subspace", subspace_dim=K)
    assert backbone_kind(sub) == "subspace"
    other = predict_head_aware(sub, y, learning_rate=lr, momentum=m, steps=STEPS, batch_size=b,
                               nesterov=nesterov, loss=loss, key=key, num_paths=2)
    assert np.max(np.abs(other.loss_paths[0] - want)) > 1e-6


def test_predict_with_the_diagonal_backbone(x64):
    """predict(backbone="diagonal") is the recursion on head_aware_kernel's diagonal kernel
    (default k = 5 > F = 4: every direction), labelled so, with its k recorded; refused with
    Adam (before any kernel) and with segments, as the CLI refuses both."""
    model, x, y, _, _ = _problem(True, seed=1)
    apply_fn, params = ntk_tt.from_nnx(model)
    split = split_head(model)
    kw = dict(learning_rate=0.2, steps=STEPS, head=split)
    pred = ntk_tt.predict(apply_fn, params, x, y, backbone="diagonal", subspace_dim=K, **kw)
    assert pred.kernel == "head_aware:diagonal" and pred.hyperparameters["subspace_dim"] == K
    hk = head_aware_kernel(split, x, backbone="diagonal", subspace_dim=K)
    np.testing.assert_allclose(pred.loss, predict_head_aware(
        hk, y, learning_rate=0.2, steps=STEPS).loss, rtol=1e-12)
    default = ntk_tt.predict(apply_fn, params, x, y, backbone="diagonal", **kw)
    assert default.hyperparameters["subspace_dim"] == 4  # min(5, F)
    with pytest.raises(ValueError, match="the diagonal backbone is not re-linearised"):
        ntk_tt.predict(apply_fn, params, x, y, backbone="diagonal", segments=2, **kw)
    # one direction: the diagonal and subspace kernels are one, and a k = 1 diagonal kernel
    # passed back was refused as "a 'subspace' kernel" (a fresh user's find)
    one = head_aware_kernel(split, x, backbone="diagonal", subspace_dim=1)
    back = ntk_tt.predict(apply_fn, params, x, y, backbone="diagonal", head_kernel=one, **kw)
    np.testing.assert_allclose(back.loss, ntk_tt.predict(
        apply_fn, params, x, y, backbone="diagonal", subspace_dim=1, **kw).loss, rtol=1e-12)
    from ntk_tt._defaults import DEFAULTS
    from ntk_tt._options_predict import check_options  # the CLI's

    check_options(dict(DEFAULTS, backbone="diagonal", optimizer="adamw"))  # since session 35
    check_options(dict(DEFAULTS, subspace_dim=2, optimizer="adamw"))  # Adam's default: diagonal
    # subspace_dim where the default kernel is isotropic (segments) says so, and the
    # linear predictor refuses it (a fresh user was told to choose a backbone it refuses)
    from ntk_tt._options_predict import DEFAULT_ISOTROPIC_K

    with pytest.raises(ValueError, match=re.escape(DEFAULT_ISOTROPIC_K)):
        ntk_tt.predict(apply_fn, params, x, y, steps=STEPS, head=split, subspace_dim=2,
                       learning_rate=0.2, segments=2)
    with pytest.raises(ValueError, match=re.escape(DEFAULT_ISOTROPIC_K)):
        check_options(dict(DEFAULTS, subspace_dim=2, segments=2))
    for extra in (dict(optimizer=ntk_tt.sgd(0.2)), dict(learning_rate=0.2)):
        with pytest.raises(ValueError, match="the linear predictor .* has none"):
            ntk_tt.predict(apply_fn, params, x, y, steps=STEPS, subspace_dim=2, **extra)
