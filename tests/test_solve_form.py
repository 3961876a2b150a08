"""The diagonal kernel's block form in the recursions (``solve_form``) and Θ_0's spectrum
computed once per kernel (``initial_eigenvalues_once``): the same numbers as the dense
(N·k)² products and a fresh factorisation, which are the independent references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_head_aware import STEPS, _problem

import ntk_tt
from ntk_tt.dynamics._adam_head_aware import head_aware_adam_trajectory
from ntk_tt.dynamics._optim_head_aware import head_aware_sgd_trajectory
from ntk_tt.dynamics._predict_head_aware import (
    head_aware_trajectory,
    initial_eigenvalues,
    initial_eigenvalues_once,
    predict_head_aware,
)
from ntk_tt.kernels._diagonal import solve_form
from ntk_tt.kernels._head_aware import head_aware_kernel, split_head

K = 3  # of F = 4 features


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _kernels():
    model, x, y, xt, yt = _problem(True, seed=1)
    split = split_head(model)
    return split, x, y, xt, yt, head_aware_kernel(split, x, xt, backbone="diagonal",
                                                  subspace_dim=K)


def test_blocks_are_the_dense_kernels_diagonal_blocks(x64):
    """Block a is K_Z[(i, a), (j, a)] (training and held-out); everything else is returned as
    it is: a subspace, isotropic or k = 1 kernel, and a diagonal one under a trace."""
    split, x, _, xt, _, hk = _kernels()
    got = solve_form(hk)
    n, nt = x.shape[0], xt.shape[0]
    dense = np.asarray(hk.backbone).reshape(n, K, n, K)
    dense_t = np.asarray(hk.backbone_test).reshape(nt, K, n, K)
    for a in range(K):
        np.testing.assert_array_equal(np.asarray(got.backbone)[a], dense[:, a, :, a])
        np.testing.assert_array_equal(np.asarray(got.backbone_test)[a], dense_t[:, a, :, a])
    assert got.backbone.shape == (K, n, n) and got.basis is hk.basis
    for other in (head_aware_kernel(split, x, backbone="subspace", subspace_dim=K),
                  head_aware_kernel(split, x),
                  head_aware_kernel(split, x, backbone="diagonal", subspace_dim=1)):
        assert solve_form(other) is other
    seen = []
    jax.jit(lambda k: seen.append(solve_form(k).backbone.ndim) or 0.0)(hk)
    assert seen == [2]


@pytest.mark.parametrize("batch_size", [None, 4])
def test_block_recursions_equal_the_dense_ones(x64, batch_size):
    """SGD-momentum with a schedule and decay, AdamW, and constant η: the trajectories on the
    blocks (a concrete kernel) equal those on the dense (N·k)² kernel (the same call with the
    kernel traced under jit, which keeps it dense), training and held-out logits."""
    split, x, y, xt, _, hk = _kernels()
    key = jax.random.key(3)
    a_h = ntk_tt.weight_tangent(split[0], split[1], x)
    a_ht = ntk_tt.weight_tangent(split[0], split[1], xt)
    sgd = ntk_tt.sgd(ntk_tt.warmup_cosine(0.3, 3, STEPS), 0.9, weight_decay=0.01,
                     batch_size=batch_size)
    adamw = ntk_tt.adamw(ntk_tt.warmup_cosine(0.02, 3, STEPS), weight_decay=0.1,
                         batch_size=batch_size)
    ak = ntk_tt.adam_head_aware_kernel(split, x, y, adamw, xt, hk=hk, backbone="diagonal")
    runs = [(head_aware_sgd_trajectory, hk, sgd), (head_aware_adam_trajectory, ak, adamw)]
    for fn, kernel, opt in runs:
        def run(k, fn=fn, opt=opt):
            return fn(k, y, opt, steps=STEPS, key=key, a_h=a_h, a_h_test=a_ht)

        blocks, dense = run(kernel), jax.jit(run)(kernel)
        for got, want in zip(blocks, dense, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    bsz = x.shape[0] if batch_size is None else batch_size
    batches = ntk_tt.batch_indices(key, x.shape[0], bsz, STEPS)
    want, _, _ = head_aware_trajectory(hk, y, batches, learning_rate=0.4, momentum=0.5,
                                       nesterov=False, loss="cross_entropy")  # dense
    got = predict_head_aware(hk._replace(features_test=None, backbone_test=None), y,
                             learning_rate=0.4, momentum=0.5, steps=STEPS, key=key,
                             batch_size=bsz, num_paths=1)
    np.testing.assert_allclose(got.loss, jax.vmap(
        lambda f: ntk_tt.mean_loss(f, y, "cross_entropy"))(want), rtol=1e-10)


def test_spectrum_is_computed_once_per_kernel(x64):
    """The stored (λ_min, λ_max) comes back for the same arrays only: a kernel with another
    backbone of the same shapes gets its own (a fresh factorisation's), and a freed kernel's
    entry does not match a new one."""
    _, _, _, _, _, hk = _kernels()
    first = initial_eigenvalues_once(hk)
    assert initial_eigenvalues_once(hk) is first
    np.testing.assert_allclose(first, initial_eigenvalues(hk), rtol=1e-12)
    other = hk._replace(backbone=2.0 * hk.backbone)
    got = initial_eigenvalues_once(other)
    np.testing.assert_allclose(got, initial_eigenvalues(other), rtol=1e-12)
    assert float(got[1]) > float(first[1]) * (1 + 1e-6)
    del other
    again = hk._replace(backbone=3.0 * hk.backbone)
    np.testing.assert_allclose(initial_eigenvalues_once(again), initial_eigenvalues(again),
                               rtol=1e-12)
    traced = jax.jit(lambda k: jnp.stack(initial_eigenvalues_once(k)))(hk)
    np.testing.assert_allclose(traced, jnp.stack(first), rtol=1e-12)
    fresh = hk._replace(backbone=4.0 * hk.backbone)  # concrete, inside a caller's jit: the
    inside = jax.jit(lambda s: s * jnp.stack(initial_eigenvalues_once(fresh)))(1.0)  # tracers
    np.testing.assert_allclose(inside, jnp.stack(initial_eigenvalues(fresh)), rtol=1e-12)
    np.testing.assert_allclose(initial_eigenvalues_once(fresh), inside, rtol=1e-12)  # not kept
