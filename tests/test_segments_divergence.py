"""``segments=K`` on a diverging setting: the prediction stops re-linearising and reports the
divergence as one segment does (no kernel at a non-finite or blown-up point), and a converging
run still re-linearises at every boundary.

References: the one-segment prediction of the same call (before the first boundary the same
recursion in the same kernel, and here, where the curve blows up within the first segment,
the whole curve), the held-curve rule of ``ntk_tt.dynamics._divergence`` written out, and for
a converging run on a backbone linear in its weights (re-linearising changes nothing) the
one-segment prediction again.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import ntk_tt
from ntk_tt.prediction import _head_aware_refresh

N, D, F, C, T = 24, 8, 16, 3, 20


class Mlp(nnx.Module):
    """Linear 8 → 16, tanh (or none: a backbone linear in its weights), ``head`` Linear
    16 → 3 (float32)."""

    def __init__(self, act=jnp.tanh, *, rngs):
        self.body = nnx.Linear(D, F, rngs=rngs)
        self.head = nnx.Linear(F, C, rngs=rngs)
        self.act = act

    def __call__(self, x):
        return self.head(self.act(self.body(x)))


def _data():
    kx, ky = jax.random.split(jax.random.key(0))
    return jax.random.normal(kx, (N, D)), jax.random.randint(ky, (N,), 0, C)


def _kernel_points(monkeypatch):
    """Record, for each feature kernel the refreshed predictor builds, whether its
    linearisation point (backbone weights and head) is finite."""
    seen = []
    build = _head_aware_refresh.head_aware_kernel

    def spy(split, *args, **kwargs):
        leaves = jax.tree.leaves((split[1], split[2], split[3]))
        seen.append(all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in leaves))
        return build(split, *args, **kwargs)

    monkeypatch.setattr(_head_aware_refresh, "head_aware_kernel", spy)
    return seen


DIVERGING = {  # η = 200: the curve passes 10·L_0 at step 1 and is non-finite from step 10
    "optimizer": lambda: dict(optimizer=ntk_tt.sgd(ntk_tt.exponential(200.0, 0.99), 0.9)),
    "keywords": lambda: dict(learning_rate=200.0, momentum=0.9),
}


@pytest.mark.parametrize("path", sorted(DIVERGING))
def test_diverging_segments_report_divergence_like_one_segment(monkeypatch, path):
    """K = 2 (the first boundary, step 10, after the loss became non-finite) and K = 4 (step
    5, loss ~10¹⁵·L_0 but finite): both used to refuse the next kernel with a misleading
    'head too small' ValueError. Now: no kernel past the first, the rest run in it, so the
    curve is the one-segment prediction's, held from its first non-finite step; diverged."""
    model = Mlp(rngs=nnx.Rngs(0))
    apply_fn, params = ntk_tt.from_nnx(model)
    x, y = _data()
    kw = DIVERGING[path]()

    def run(segments):
        return ntk_tt.predict(apply_fn, params, x, y, head=ntk_tt.split_head(model),
                              segments=segments, steps=T, backbone="isotropic", **kw)

    one = run(1)
    seen = _kernel_points(monkeypatch)
    for segments in (2, 4):
        seen.clear()
        pred = run(segments)
        assert seen == [True]  # the initial kernel only, at a finite point
        # the first segment is the same computation, and the rest runs on in its kernel
        np.testing.assert_allclose(pred.loss, one.loss, rtol=1e-6)
        np.testing.assert_allclose(pred.error, one.error, rtol=1e-6)
        loss = np.asarray(pred.loss)
        assert np.all(np.isfinite(loss))
        # held: the last finite value (step 9) from the first non-finite step (10) on
        np.testing.assert_array_equal(loss[10:], loss[9])
        assert np.all(np.diff(loss[:10]) > 0) and loss[9] > 1e30 * loss[0]
        assert bool(pred.diverged) and int(pred.diverged_at) == 1
        assert pred.divergence == "yes" and pred.outcome == "diverges"
        assert all(np.isnan(v) for curve in pred.training_time.values()
                   for v in curve.values())
        assert pred.training_time_reasons == one.training_time_reasons


def test_refreshed_diverging_direct_call(monkeypatch):
    """:func:`ntk_tt.predict_head_aware_refreshed` itself, SGD-family optimiser, K = 4."""
    model = Mlp(rngs=nnx.Rngs(0))
    x, y = _data()
    opt = ntk_tt.sgd(ntk_tt.exponential(200.0, 0.99), 0.9)
    seen = _kernel_points(monkeypatch)
    out = ntk_tt.predict_head_aware_refreshed(ntk_tt.split_head(model), x, y, segments=4,
                                              optimizer=opt, steps=T)
    assert seen == [True]
    one = ntk_tt.predict_head_aware_refreshed(ntk_tt.split_head(model), x, y, segments=1,
                                              optimizer=opt, steps=T)
    np.testing.assert_allclose(out.loss, one.loss, rtol=1e-6)
    assert bool(out.diverged) and np.all(np.isnan(np.asarray(out.training_time)))


CONVERGING = {
    "optimizer": lambda: dict(optimizer=ntk_tt.sgd(ntk_tt.exponential(0.2, 0.98), 0.5)),
    "keywords": lambda: dict(learning_rate=0.2, momentum=0.5),
}


@pytest.mark.parametrize("path", ["optimizer"])  # the keyword path shares _next_point
def test_converging_segments_still_relinearise(monkeypatch, path):
    """A converging run re-linearises at every boundary (K kernels, all at finite points), and
    on a backbone linear in its weights the K-segment curve is the one-segment one."""
    model = Mlp(lambda h: h, rngs=nnx.Rngs(0))
    x, y = _data()
    split = ntk_tt.split_head(model)
    kw = CONVERGING[path]()
    one = ntk_tt.predict_head_aware_refreshed(split, x, y, segments=1, steps=T, **kw)
    seen = _kernel_points(monkeypatch)
    out = ntk_tt.predict_head_aware_refreshed(split, x, y, segments=4, steps=T, **kw)
    assert seen == [True] * 4
    assert not bool(out.diverged) and int(out.outcome) == 0  # converges
    assert out.loss[-1] < 0.9 * out.loss[0]
    np.testing.assert_allclose(out.loss, one.loss, rtol=1e-5)
    np.testing.assert_array_equal(out.error, one.error)
