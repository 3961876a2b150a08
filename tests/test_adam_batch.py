"""One Adam kernel for several batch sizes (``ntk_tt.adam_kernel_for_batch``): the minibatch
K_P against brute-force Jacobians and per-sample gradients (P = 1/(√(κw(λ_ref)) + √κε)), the
rescaled kernel against the one built for that batch size, and the refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _dynamics_helpers import jacobian
from test_optimizers import N, T, _head_problem

import ntk_tt
from ntk_tt.dynamics._adam_batch import shares_reference
from ntk_tt.dynamics._losses import mean_loss

EPS = 1e-3  # large enough for ε's scaling by √κ to show in P


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _adamw(batch_size):
    return ntk_tt.adamw(ntk_tt.warmup_cosine(0.01, 3, T), weight_decay=0.1, eps=EPS,
                        batch_size=batch_size)


def _kernel(split, x, y, xt, batch_size, backbone="exact", **kw):
    return ntk_tt.adam_head_aware_kernel(split, x, y, _adamw(batch_size), xt,
                                         backbone=backbone, variance_samples=N, **kw)


@pytest.mark.parametrize("bsz", [4, 12])
def test_minibatch_kernel_against_brute_force(x64, bsz):
    """B of N = 16: v̄ = κ·w(λ_ref) from g_0 and all N per-sample gradients, λ_ref =
    max(λ_B, 1/2) (λ_B = 0.75 at B = 4, 0.25 at 12), P = 1/(√v̄ + √κ·ε), K_P = J_h P J_hᵀ (the
    exact form) with J_h by jacrev."""
    _, split, x, y, xt, _, _ = _head_problem()
    feature_fn, bparams, w0, b0 = split

    def grad(xs, ys):  # the mean loss's gradient over the rows xs, flattened
        g = jax.grad(lambda p: mean_loss(feature_fn(p, xs) @ w0 + b0, ys, "cross_entropy"))(
            bparams)
        return jnp.concatenate([leaf.reshape(-1) for leaf in jax.tree.leaves(g)])

    g0 = grad(x, y)
    per_sample = jax.vmap(lambda xi, yi: grad(xi[None], yi[None]))(x, y)  # (N, D)
    sigma2 = jnp.mean((per_sample - g0) ** 2, 0)
    big_g, total = jnp.sum(g0**2), jnp.sum(sigma2)
    noise = (N - bsz) / (bsz * (N - 1)) * total
    lam_b, kappa = noise / (big_g + noise), 1.0 + noise / big_g
    lam = max(float(lam_b), 0.5)
    vbar = kappa * ((1 - lam) * g0**2 + lam * big_g * sigma2 / total)
    p = 1.0 / (jnp.sqrt(vbar) + jnp.sqrt(kappa) * EPS)
    ak = _kernel(split, x, y, xt, bsz)
    j, jt = jacobian(feature_fn, bparams, x), jacobian(feature_fn, bparams, xt)
    np.testing.assert_allclose(ak.drift.kappa, kappa, rtol=1e-10)
    np.testing.assert_allclose(ak.drift.noise, total / big_g, rtol=1e-10)
    np.testing.assert_allclose(ak.drift.ref, lam, rtol=1e-10)
    np.testing.assert_allclose(ak.precond.backbone, (j * p) @ j.T, rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose(ak.precond.backbone_test, (jt * p) @ j.T, rtol=1e-9, atol=1e-13)


@pytest.mark.parametrize("backbone", ["diagonal", "exact"])
def test_rescaled_kernel_equals_the_built_one(x64, backbone):
    """GD's kernel rescaled to B = 12 (and back) equals the kernel built for B = 12 (both
    λ_B below the floor 1/2), and so do the predicted logits."""
    _, split, x, y, xt, a_h, a_ht = _head_problem()
    gd, mini = _kernel(split, x, y, xt, None, backbone), _kernel(split, x, y, xt, 12, backbone)
    assert float(mini.drift.ref) == 0.5 and float(mini.drift.kappa) > 1.1
    for source, target in ((gd, mini), (mini, gd)):
        assert shares_reference(source, target.batch_size)
        got = ntk_tt.adam_kernel_for_batch(source, None if target is gd else 12)
        assert got.batch_size == target.batch_size
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(target), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-13)
    opt, key = _adamw(12), jax.random.key(3)
    fs = [ntk_tt.head_aware_adam_trajectory(k, y, opt, steps=T, key=key, a_h=a_h,
                                            a_h_test=a_ht)
          for k in (mini, ntk_tt.adam_kernel_for_batch(gd, 12))]
    np.testing.assert_allclose(fs[1][0], fs[0][0], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(fs[1][1], fs[0][1], rtol=1e-9, atol=1e-12)
    assert float(jnp.max(jnp.abs(fs[0][0][-1] - fs[0][0][0]))) > 0.05  # the logits moved


def test_refusals(x64):
    """Another reference profile (λ_B above the floor, or the source's own λ_B at it), the
    frozen profile, a bad batch size, not an AdamKernel, a traced kernel: clear errors."""
    _, split, x, y, xt, _, _ = _head_problem()
    low = _kernel(split, x, y, None, None, "diagonal", min_ref_mix=0.01)
    assert _kernel(split, x, y, None, 1, "diagonal", min_ref_mix=0.01).drift.ref > 0.01
    assert not shares_reference(low, 1)
    with pytest.raises(ValueError, match="another reference profile"):
        ntk_tt.adam_kernel_for_batch(low, 1)
    above = _kernel(split, x, y, None, 1, "isotropic")  # min_ref_mix 0: λ_ref = λ_B
    assert not shares_reference(above, None) and shares_reference(above, 1)
    frozen = _kernel(split, x, y, None, None, "isotropic", profile="frozen")
    with pytest.raises(ValueError, match="frozen"):
        ntk_tt.adam_kernel_for_batch(frozen, 4)
    for bad in (0, N + 1, 2.5, True, "4"):
        with pytest.raises(ValueError, match=r"batch_size must be None .* \[1, N = 16\]"):
            ntk_tt.adam_kernel_for_batch(low, bad)
    with pytest.raises(ValueError, match="must be an AdamKernel"):
        ntk_tt.adam_kernel_for_batch(low.hk, 4)
    edits = {"doubled κ": dict(drift=low.drift._replace(kappa=low.drift.kappa * 2)),
             "NaN ν": dict(drift=low.drift._replace(noise=low.drift.noise * np.nan)),
             "batch size 0": dict(batch_size=0), "batch size None": dict(batch_size=None)}
    for edit in edits.values():  # an edited kernel is refused, not rescaled into a wrong one
        with pytest.raises(ValueError, match="does not match its batch size"):
            ntk_tt.adam_kernel_for_batch(low._replace(**edit), 4)
    with pytest.raises(ValueError, match=r"batch size 16 .*adam_kernel_for_batch\(ak, 4\)"):
        ntk_tt.head_aware_adam_trajectory(low, y, _adamw(4), steps=T, key=jax.random.key(0),
                                          a_h=jnp.zeros_like(low.hk.features))
    with pytest.raises(ValueError, match="must be the DriftTable"):
        ntk_tt.adam_kernel_for_batch(low._replace(drift=tuple(low.drift)), 4)
    with pytest.raises(ValueError, match="outside jax.jit"):
        jax.jit(lambda k: ntk_tt.adam_kernel_for_batch(k, 4).precond.backbone)(low)


@pytest.mark.parametrize("wide", [True, False], ids=["float64", "float32"])
def test_a_kernel_above_its_floor_is_never_shared(wide):
    """λ_B above the floor is λ_ref itself: the kernel serves no other batch size, whatever
    the rounding of λ_B recomputed from ν (a helper's probe found it accepted for GD in
    float32 when λ_ref was compared with λ_B instead of the stored floor)."""
    with jax.enable_x64(wide):
        _, split, x, y, _, _, _ = _head_problem()
        for bsz in (1, 2, 3, 4):  # λ_B 0.6-0.9
            ak = _kernel(split, x, y, None, bsz, "diagonal")
            assert float(ak.drift.ref) > 0.5 == float(ak.drift.floor)
            for other in (None, 12, 7):
                assert not shares_reference(ak, other)
