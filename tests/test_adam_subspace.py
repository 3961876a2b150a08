"""The fast Adam predictor on the "subspace" feature kernel (issues 26 / 27): K_P exact on the
features' leading principal directions Z, against brute-force Jacobians, the same predictor on
the exact kernels lifted from the subspace ones, and the exact kernels themselves (k = F)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _dynamics_helpers import jacobian
from test_optimizers import FEAT, N, T, _head_problem

import ntk_tt
from ntk_tt.dynamics._losses import mean_loss
from ntk_tt.kernels._head_aware import feature_basis

K = 2  # of FEAT = 4 features


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _lift(hk):
    """The exact-form kernels (I ⊗ Z) K_Z (I ⊗ Zᵀ) (N·F, N·F) and (N_test·F, N·F) of a
    subspace kernel: no basis."""
    z = hk.basis
    (f, k), n = z.shape, hk.features.shape[0]

    def lift(kernel):
        rows = kernel.shape[0] // k
        full = jnp.einsum("ak,ikjl,bl->iajb", z, kernel.reshape(rows, k, n, k), z)
        return full.reshape(rows * f, n * f)

    return hk._replace(backbone=lift(hk.backbone), backbone_test=lift(hk.backbone_test),
                       basis=None)


def test_subspace_preconditioned_kernel_against_brute_force(x64):
    """K_P on span(Z): (I ⊗ Zᵀ) J_h P J_hᵀ (I ⊗ Z) with J_h by brute force and P = 1/(|g_0| + ε)
    (GD, ``min_ref_mix=0``; the default profile is tested on the exact K_P); its calibration
    (γ_0, γ_1) is (1, 1) at k = F, where the subspace is every direction, and not at k < F."""
    _, split, x, y, _, _, _ = _head_problem()
    opt = ntk_tt.adamw(0.1, eps=1e-3)
    feature_fn, bparams, w0, b0 = split
    grad = jax.grad(lambda p: mean_loss(feature_fn(p, x) @ w0 + b0, y, "cross_entropy"))(
        bparams)
    p_diag = 1.0 / (jnp.abs(jnp.concatenate([g.reshape(-1) for g in jax.tree.leaves(grad)]))
                    + 1e-3)
    jh = jacobian(feature_fn, bparams, x).reshape(N, FEAT, -1)  # (N, F, D)
    z = feature_basis(feature_fn(bparams, x), K)
    jz = jnp.einsum("ifd,fk->ikd", jh, z).reshape(N * K, -1)
    hk = ntk_tt.head_aware_kernel(split, x, backbone="subspace", subspace_dim=K)
    ak = ntk_tt.adam_head_aware_kernel(split, x, y, opt, backbone="subspace", hk=hk,
                                       variance_samples=N, min_ref_mix=0)  # g_0²'s profile
    np.testing.assert_allclose(ak.precond.basis, z, rtol=1e-12)
    np.testing.assert_allclose(ak.precond.backbone, (jz * p_diag) @ jz.T, rtol=1e-10)
    assert np.max(np.abs(np.asarray(ak.drift.calibration) - 1.0)) > 0.01
    full = ntk_tt.adam_head_aware_kernel(split, x, y, opt, backbone="subspace",
                                         variance_samples=N, hk=ntk_tt.head_aware_kernel(
                                             split, x, backbone="subspace",
                                             subspace_dim=FEAT))
    np.testing.assert_allclose(full.drift.calibration, [1.0, 1.0], rtol=1e-8)


@pytest.mark.parametrize("backbone", ["subspace", "diagonal"])
@pytest.mark.parametrize("batch_size", [None, 5])
def test_subspace_adam_equals_the_lifted_exact_kernels(x64, batch_size, backbone):
    """The recursion on (N·k)² kernels (gradient norms, drift, steps, AdamW's decay through
    a_h) equals the same recursion on the (N·F)² kernels (I ⊗ Z) K_Z (I ⊗ Zᵀ) with a_h Z Zᵀ,
    training and held-out logits; at k = F it equals the exact kernels' prediction. The
    diagonal kernels (K_Z's and K_P's blocks between directions zero) run the same recursion,
    and differ from the full subspace kernels' (those blocks matter)."""
    _, split, x, y, xt, a_h, a_ht = _head_problem()
    opt = ntk_tt.adamw(ntk_tt.warmup_cosine(0.05, 3, T), weight_decay=0.1,
                       batch_size=batch_size)
    key = jax.random.key(3)

    def run(ak, a_h=a_h, a_ht=a_ht):
        return ntk_tt.head_aware_adam_trajectory(ak, y, opt, steps=T, key=key, a_h=a_h,
                                                 a_h_test=a_ht)

    hk = ntk_tt.head_aware_kernel(split, x, xt, backbone=backbone, subspace_dim=K)
    ak = ntk_tt.adam_head_aware_kernel(split, x, y, opt, xt, backbone=backbone, hk=hk)
    fs, fts = run(ak)
    zz = hk.basis @ hk.basis.T  # the decay's J_h θ_0 moves the features in span(Z) too
    lifted = run(ak._replace(hk=_lift(ak.hk), precond=_lift(ak.precond)), a_h @ zz, a_ht @ zz)
    np.testing.assert_allclose(fs, lifted[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(fts, lifted[1], rtol=1e-10, atol=1e-12)
    if backbone == "diagonal":
        sub = run(ntk_tt.adam_head_aware_kernel(split, x, y, opt, xt, backbone="subspace",
                                                hk=ntk_tt.head_aware_kernel(
                                                    split, x, xt, backbone="subspace",
                                                    subspace_dim=K)))
        assert np.max(np.abs(fs - sub[0])) > 1e-3
        return
    exact = run(ntk_tt.adam_head_aware_kernel(split, x, y, opt, xt, backbone="exact"))
    assert np.max(np.abs(fs - exact[0])) > 1e-3  # the projection matters at k < F
    hk_f = ntk_tt.head_aware_kernel(split, x, xt, backbone="subspace", subspace_dim=FEAT)
    every = run(ntk_tt.adam_head_aware_kernel(split, x, y, opt, xt, backbone="subspace",
                                              hk=hk_f))
    np.testing.assert_allclose(every[0], exact[0], rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(every[1], exact[1], rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("backbone", ["subspace", "diagonal"])
def test_predict_with_adam_on_the_subspace_kernel(x64, backbone):
    """predict(optimizer=adamw, backbone="subspace" or "diagonal", subspace_dim=k): the curves
    of the kernel built by hand, the label and the k recorded; no calibrated interval (the
    shipped AdamW calibrators are the diagonal kernel's at k = 5 and the isotropic one's)."""
    model, split, x, y, _, a_h, _ = _head_problem()
    opt = ntk_tt.adamw(ntk_tt.warmup_cosine(0.005, 3, T), weight_decay=0.1)  # ρ < 1
    apply_fn, params = ntk_tt.from_nnx(model)
    pred = ntk_tt.predict(apply_fn, params, x, y, optimizer=opt, steps=T, head=split,
                          backbone=backbone, subspace_dim=K)
    assert pred.kernel == f"head_aware_adam:{backbone}"
    assert pred.hyperparameters["subspace_dim"] == K
    hk = ntk_tt.head_aware_kernel(split, x, backbone=backbone, subspace_dim=K)
    fs, _ = ntk_tt.head_aware_adam_trajectory(
        ntk_tt.adam_head_aware_kernel(split, x, y, opt, backbone=backbone, hk=hk), y, opt,
        steps=T, a_h=a_h)
    want = jax.vmap(lambda f: mean_loss(f, y, "cross_entropy"))(fs)
    np.testing.assert_allclose(pred.loss, want, rtol=1e-8)
    with pytest.warns(ntk_tt.CalibrationRangeWarning, match=f"head_aware_adam:{backbone}"):
        bounds = ntk_tt.intervals(pred)
    assert all(v is None for v in bounds["loss"].values())
    if backbone == "diagonal":  # a diagonal hk passed as head_kernel sets K_P's form
        back = ntk_tt.predict(apply_fn, params, x, y, optimizer=opt, steps=T, head=split,
                              head_kernel=hk)
        assert back.kernel == "head_aware_adam:diagonal"
        np.testing.assert_allclose(back.loss, want, rtol=1e-8)


def test_mismatched_subspace_kernels_are_refused(x64):
    """A subspace hk for another backbone, an isotropic hk for the subspace, and an Adam kernel
    whose K_P has another basis than its K_h: one ValueError each, before the work."""
    _, split, x, y, _, a_h, _ = _head_problem()
    opt = ntk_tt.adamw(1e-3)
    sub = ntk_tt.head_aware_kernel(split, x, backbone="subspace", subspace_dim=K)
    iso = ntk_tt.head_aware_kernel(split, x)
    with pytest.raises(ValueError, match="hk must be the 'exact' HeadAwareKernel"):
        ntk_tt.adam_head_aware_kernel(split, x, y, opt, hk=sub, backbone="exact")
    with pytest.raises(ValueError, match="hk must be the 'subspace' HeadAwareKernel"):
        ntk_tt.adam_head_aware_kernel(split, x, y, opt, hk=iso, backbone="subspace")
    ak = ntk_tt.adam_head_aware_kernel(split, x, y, opt, hk=sub, backbone="subspace")
    other = ntk_tt.adam_head_aware_kernel(split, x, y, opt, backbone="subspace",
                                          hk=ntk_tt.head_aware_kernel(
                                              split, x, backbone="subspace", subspace_dim=3))
    with pytest.raises(ValueError, match="ak.precond must be built on the inputs and basis"):
        ntk_tt.head_aware_adam_trajectory(ak._replace(precond=other.precond), y, opt,
                                          steps=T, a_h=a_h)


def test_an_hk_of_other_inputs_is_refused(x64, monkeypatch):
    """An hk of the same size and form built on other images (its basis Z and features h_0
    another set's) is refused before K_P is built; a head with other weights too."""
    from ntk_tt.dynamics import _adam_head_aware

    _, split, x, y, _, _, _ = _head_problem()
    opt = ntk_tt.adamw(1e-3)
    other = ntk_tt.head_aware_kernel(split, x[::-1], backbone="subspace", subspace_dim=K)
    ntk_tt.adam_head_aware_kernel(split, x[::-1], y, opt, hk=other, backbone="subspace")

    def refuse(*args, **kwargs):
        raise AssertionError("K_P was built before the refusal")

    monkeypatch.setattr(_adam_head_aware, "precond_kernel", refuse)
    with pytest.raises(ValueError, match="hk was built for other inputs or another head.*"
                       "features of x differ"):
        ntk_tt.adam_head_aware_kernel(split, x, y, opt, hk=other, backbone="subspace")
    moved = (split[0], split[1], split[2] * 1.5, split[3])
    with pytest.raises(ValueError, match="head weights differ"):
        ntk_tt.adam_head_aware_kernel(moved, x, y, opt, hk=other, backbone="subspace")


def test_a_plain_subspace_kernel_passed_for_adam_sets_k_p_form(x64):
    """predict(optimizer=adamw, head_kernel=<a plain head-aware kernel>) without backbone=:
    the kernel decides K_P's form too (a fresh user's find: a subspace kernel was refused as
    "not the 'isotropic' kernel"; a Kronecker one got an isotropic K_P), so the curves equal
    those of the Adam kernel built with that backbone."""
    model, split, x, y, _, a_h, _ = _head_problem()
    opt = ntk_tt.adamw(ntk_tt.warmup_cosine(0.005, 3, T), weight_decay=0.1)
    apply_fn, params = ntk_tt.from_nnx(model)
    backbone = "subspace"
    hk = ntk_tt.head_aware_kernel(split, x, backbone=backbone, subspace_dim=K)
    pred = ntk_tt.predict(apply_fn, params, x, y, optimizer=opt, steps=T, head=split,
                          head_kernel=hk)
    assert pred.kernel == f"head_aware_adam:{backbone}"
    ak = ntk_tt.adam_head_aware_kernel(split, x, y, opt, backbone=backbone, hk=hk)
    fs, _ = ntk_tt.head_aware_adam_trajectory(ak, y, opt, steps=T, a_h=a_h)
    want = jax.vmap(lambda f: mean_loss(f, y, "cross_entropy"))(fs)
    np.testing.assert_allclose(pred.loss, want, rtol=1e-8)
