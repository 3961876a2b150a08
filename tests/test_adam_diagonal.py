"""The fast Adam predictor on the "diagonal" feature kernel (issues 26 / 27): K_P's diagonal
blocks on the features' k leading principal directions, z_aᵀ J_h P J_hᵀ z_a, against
brute-force Jacobians; its calibration along g_0 against the weight-space sum; predict's
plumbing and default. The recursion against the same on the lifted (N·F)² kernels and predict
with it: tests/test_adam_subspace.py; against a real AdamW fine-tune of the shipped backbone:
tests/test_adam_ref_profile.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _dynamics_helpers import jacobian
from test_optimizers import FEAT, N, T, _head_problem

import ntk_tt
from ntk_tt.dynamics._losses import logit_residual, mean_loss
from ntk_tt.kernels._head_aware import feature_basis

K = 3  # of FEAT = 4 features


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _block_diagonal(kernel, rows, k):
    """``kernel`` (rows·k, N·k) with the blocks between different directions set to 0."""
    kz = np.asarray(kernel).reshape(rows, k, -1, k)
    return (kz * np.eye(k)[None, :, None, :]).reshape(rows * k, -1)


def test_diagonal_preconditioned_kernel_against_brute_force(x64):
    """K_P's blocks z_aᵀ J_h P J_hᵀ z_a (zero between directions) with J_h by brute force and
    P = 1/(|g_0| + ε) (GD, ``min_ref_mix=0``), training and held-out; γ_0 = Σ g_0² P over
    ‖g_0‖² in the diagonal K_P (the directions' squared norms summed), which is not 1 even
    at k = F (the cross-direction blocks are dropped)."""
    _, split, x, y, xt, _, _ = _head_problem()
    opt = ntk_tt.adamw(0.1, eps=1e-3)
    feature_fn, bparams, w0, b0 = split
    grad = jax.grad(lambda p: mean_loss(feature_fn(p, x) @ w0 + b0, y, "cross_entropy"))(
        bparams)
    g0 = jnp.concatenate([g.reshape(-1) for g in jax.tree.leaves(grad)])
    p_diag = 1.0 / (jnp.abs(g0) + 1e-3)
    z = feature_basis(feature_fn(bparams, x), K)

    def jz(rows):  # (rows, k, D): the Jacobians of the features' coordinates in span(Z)
        return jnp.einsum("ifd,fk->ikd", jacobian(feature_fn, bparams, rows).reshape(
            rows.shape[0], FEAT, -1), z)

    j, jt = jz(x), jz(xt)
    hk = ntk_tt.head_aware_kernel(split, x, xt, backbone="diagonal", subspace_dim=K)
    ak = ntk_tt.adam_head_aware_kernel(split, x, y, opt, xt, backbone="diagonal", hk=hk,
                                       variance_samples=N, min_ref_mix=0)  # g_0²'s profile
    np.testing.assert_allclose(ak.precond.basis, z, rtol=1e-12)
    full = (j.reshape(N * K, -1) * p_diag) @ j.reshape(N * K, -1).T
    np.testing.assert_allclose(ak.precond.backbone, _block_diagonal(full, N, K), rtol=1e-10,
                               atol=1e-14)
    cross = (jt.reshape(-1, j.shape[-1]) * p_diag) @ j.reshape(N * K, -1).T
    np.testing.assert_allclose(ak.precond.backbone_test,
                               _block_diagonal(cross, xt.shape[0], K), rtol=1e-10, atol=1e-14)
    assert np.max(np.abs(full - ak.precond.backbone)) > 1e-3  # the dropped blocks are not 0
    q = logit_residual(feature_fn(bparams, x) @ w0 + b0, y, "cross_entropy") @ w0.T @ z / N
    norm = sum(jnp.sum(jnp.einsum("i,id->d", q[:, a], j[:, a]) ** 2 * p_diag)
               for a in range(K))
    np.testing.assert_allclose(ak.drift.calibration[0], jnp.sum(g0**2 * p_diag) / norm,
                               rtol=1e-9)


def test_diagonal_kernels_are_refused_for_another_form_and_are_adams_default(x64):
    """A subspace hk is refused for the diagonal K_P and the other way round (at k = 1 the two
    are one); the default kernel of predict for Adam/AdamW since session 35 is the diagonal
    one, k = min(5, F), and subspace_dim sets its k (the curves of
    ``tests/test_adam_subspace.py``'s hand-built kernel)."""
    model, split, x, y, _, a_h, _ = _head_problem()
    opt = ntk_tt.adamw(ntk_tt.warmup_cosine(0.005, 3, T), weight_decay=0.1)  # ρ < 1
    apply_fn, params = ntk_tt.from_nnx(model)
    hk = ntk_tt.head_aware_kernel(split, x, backbone="diagonal", subspace_dim=K)
    sub = ntk_tt.head_aware_kernel(split, x, backbone="subspace", subspace_dim=K)
    with pytest.raises(ValueError, match="hk must be the 'diagonal' HeadAwareKernel"):
        ntk_tt.adam_head_aware_kernel(split, x, y, opt, hk=sub, backbone="diagonal")
    with pytest.raises(ValueError, match="hk must be the 'subspace' HeadAwareKernel"):
        ntk_tt.adam_head_aware_kernel(split, x, y, opt, hk=hk, backbone="subspace")
    one = ntk_tt.head_aware_kernel(split, x, backbone="subspace", subspace_dim=1)
    ntk_tt.adam_head_aware_kernel(split, x, y, opt, hk=one, backbone="diagonal")  # k = 1: one
    default = ntk_tt.predict(apply_fn, params, x, y, optimizer=opt, steps=T, head=split)
    assert default.kernel == "head_aware_adam:diagonal"
    assert default.hyperparameters["subspace_dim"] == FEAT
    given = ntk_tt.predict(apply_fn, params, x, y, optimizer=opt, steps=T, head=split,
                           subspace_dim=K)
    fs, _ = ntk_tt.head_aware_adam_trajectory(
        ntk_tt.adam_head_aware_kernel(split, x, y, opt, backbone="diagonal", hk=hk), y, opt,
        steps=T, a_h=a_h)
    np.testing.assert_allclose(given.loss, jax.vmap(
        lambda f: mean_loss(f, y, "cross_entropy"))(fs), rtol=1e-8)
