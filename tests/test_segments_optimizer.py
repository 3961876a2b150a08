"""``segments=K`` with an SGD-family optimiser (issue 27): the head-aware model re-linearised
every T/K steps under a schedule, momentum, weight decay and the run's minibatch order.

References: real optax training of a network whose backbone is linear in its weights (where
re-linearising changes nothing), and, for a tanh backbone, optax training in weight space of
the head-aware model re-linearised at the weights it reaches, built here from jax.jvp and the
Jacobian (the velocity carried across a boundary as the predictor's convention states it:
u ↦ J_newᵀ (J_old J_oldᵀ)⁻¹ J_old u, i.e. its sample-feature coefficients seen through the new
Jacobian).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _dynamics_helpers import LinearHeadNet, train_tx
from flax import nnx
from jax.flatten_util import ravel_pytree

import ntk_tt
from ntk_tt._defaults import DEFAULTS
from ntk_tt._options_optimizer import check_optimizer_options
from ntk_tt.dynamics._fspace import curves
from ntk_tt.dynamics._losses import mean_loss

F64 = jnp.float64
N, T, D, FEAT, C = 16, 20, 5, 4, 3


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def Net(*, rngs):  # noqa: N802 (used as the model class)
    """Backbone Linear(D, F) (linear in its weights) and a linear ``head``."""
    return LinearHeadNet(D, FEAT, C, rngs=rngs)


def _data(n, seed=0):
    kx, ky = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (n + 4, D), F64)
    y = jax.random.randint(ky, (n + 4,), 0, C)
    return x[:n], y[:n], x[n:], y[n:]


SGD_CASES = {  # the brief's case first: warmup-cosine, heavy ball, decoupled decay, B < N
    "sgdw_cosine_b4": lambda: ntk_tt.sgd(ntk_tt.warmup_cosine(0.1, 4, T), 0.9,
                                         weight_decay=0.05, batch_size=4),
    "nesterov_l2_gd": lambda: ntk_tt.sgd(ntk_tt.warmup_cosine(0.3, 3, T, end=0.05), 0.8,
                                         nesterov=True, weight_decay=0.1, decoupled=False),
}


@pytest.mark.parametrize("case,backbone", [("sgdw_cosine_b4", "exact"),
                                          ("nesterov_l2_gd", "isotropic")])
def test_linear_backbone_segments_equal_optax_training(x64, case, backbone):
    """h = V x + c: re-linearising changes nothing, so four segments (the schedule continued
    at each segment's global step, momentum and head carried, the decay's image a_h = J_h θ_s
    at each new point) are the network trained by ``optimizer.to_optax()`` in the run's batch
    order."""
    opt = SGD_CASES[case]()
    x, y, xt, yt = _data(N)
    model = Net(rngs=nnx.Rngs(0))
    apply_fn, params = ntk_tt.from_nnx(model)
    key = jax.random.key(3)
    pred = ntk_tt.predict_head_aware_refreshed(
        ntk_tt.split_head(model), x, y, segments=4, optimizer=opt, steps=T, key=key,
        x_test=xt, y_test=yt, backbone=backbone)
    batches = ntk_tt.batch_indices(key, N, opt.batch_size or N, T)
    real = train_tx(apply_fn, params, x, y, opt.to_optax(), batches, jnp.concatenate([x, xt]),
                    "cross_entropy")
    loss, err = curves(real[:, :N], y, "cross_entropy")
    test_loss, test_err = curves(real[:, N:], yt, "cross_entropy")
    np.testing.assert_allclose(pred.loss, loss, rtol=1e-9)
    np.testing.assert_allclose(pred.test_loss, test_loss, rtol=1e-9)
    np.testing.assert_array_equal(pred.error, err)
    np.testing.assert_array_equal(pred.test_error, test_err)
    assert loss[-1] < 0.8 * loss[0]  # it trained


# --- tanh backbone: the reference in weight space ---------------------------------------------

NT, HIDDEN = 8, 8  # D_backbone = 5·8 + 8 + 8·4 = 80 ≥ N·F = 32: J_hᵀ is injective
PEAK = 0.1  # the tanh run's peak η: it trains (loss 1.9 → 5e-4) without leaving the stable range


def _tanh_features(p, x):
    return jnp.tanh(x @ p["v1"] + p["c1"]) @ p["v2"]


def _tanh_split():
    k1, k2, k3, k4 = jax.random.split(jax.random.key(7), 4)
    theta = {"v1": jax.random.normal(k1, (D, HIDDEN), F64) / np.sqrt(D),
             "c1": 0.3 * jax.random.normal(k2, (HIDDEN,), F64),
             "v2": jax.random.normal(k3, (HIDDEN, FEAT), F64) / np.sqrt(HIDDEN)}
    return (_tanh_features, theta, jax.random.normal(k4, (FEAT, C), F64), jnp.zeros(C, F64))


def _relinearised_optax(split, x, y, xt, opt, batches, ends):
    """Logits (T + 1, N + N_test, C) of optax's ``opt`` training (W, b, θ) of the head-aware
    model f = (h_k + J_h(θ_k)(θ − θ_k)) W + b, re-linearised at ``ends`` at the weights θ_k it
    reached, h_k its own features there (continuous), the optax state carried (the schedule's
    count, the head's velocity), the backbone's velocity mapped as the module docstring says."""
    feature_fn, theta, w, b = split
    xs = jnp.concatenate([x, xt])
    tx = opt.to_optax()
    p = {"theta": theta, "w": w, "b": b}
    state = tx.init(p)
    _, unravel = ravel_pytree(theta)

    def jac(point):  # J_h on the training inputs, (N·F, D)
        return jax.jacfwd(lambda v: feature_fn(unravel(v), x).reshape(-1))(ravel_pytree(point)[0])

    def feats(theta, point, h):
        return h + jax.jvp(lambda t: feature_fn(t, xs), (point,), (
            jax.tree.map(jnp.subtract, theta, point),))[1]

    @jax.jit
    def step(p, state, point, h, idx):
        def batch_loss(q):
            f = feats(q["theta"], point, h)[idx] @ q["w"] + q["b"]
            return mean_loss(f, y[idx], "cross_entropy")

        updates, state = tx.update(jax.grad(batch_loss)(p), state, p)
        p = optax.apply_updates(p, updates)
        return p, state, feats(p["theta"], point, h) @ p["w"] + p["b"]

    point, h = theta, feature_fn(theta, xs)
    out = [h @ w + b]
    (trace_at,) = [i for i, s in enumerate(state) if isinstance(s, optax.TraceState)]
    for k in range(len(ends) - 1):
        if k:
            h, j_old, point = feats(p["theta"], point, h), jac(point), p["theta"]
            j_new = jac(point)
            u = ravel_pytree(state[trace_at].trace["theta"])[0]
            u_q = jnp.linalg.solve(j_old @ j_old.T, j_old @ u)
            trace = dict(state[trace_at].trace, theta=unravel(j_new.T @ u_q))
            state = (*state[:trace_at], optax.TraceState(trace=trace), *state[trace_at + 1:])
        for t in range(ends[k], ends[k + 1]):
            p, state, f = step(p, state, point, h, batches[t])
            out.append(f)
    return jnp.stack(out)


def test_tanh_backbone_segments_equal_relinearised_optax_training(x64):
    """A nonlinear backbone: the predictor (exact feature kernel) is the head-aware model
    re-linearised at its own weights, trained by optax with the schedule, heavy-ball momentum,
    decoupled decay and the run's minibatches; and it differs from one linearisation."""
    opt = ntk_tt.sgd(ntk_tt.warmup_cosine(PEAK, 4, T), 0.9, weight_decay=0.05, batch_size=3)
    split = _tanh_split()
    x, y, xt, yt = _data(NT, seed=1)
    key = jax.random.key(5)
    kw = dict(optimizer=opt, steps=T, key=key, x_test=xt, y_test=yt, backbone="exact")
    pred = ntk_tt.predict_head_aware_refreshed(split, x, y, segments=4, **kw)
    batches = ntk_tt.batch_indices(key, NT, 3, T)
    ends = np.linspace(0, T, 5).round().astype(int)
    ref = _relinearised_optax(split, x, y, xt, opt, batches, ends)
    loss = curves(ref[:, :NT], y, "cross_entropy")[0]
    test_loss = curves(ref[:, NT:], yt, "cross_entropy")[0]
    np.testing.assert_allclose(pred.loss, loss, rtol=1e-8)
    np.testing.assert_allclose(pred.test_loss, test_loss, rtol=1e-8)
    frozen = _relinearised_optax(split, x, y, xt, opt, batches, [0, T])  # one linearisation
    frozen_loss = curves(frozen[:, :NT], y, "cross_entropy")[0]
    assert np.max(np.abs(frozen_loss - loss)) > 1e-3 * loss[0]  # re-linearising matters


def test_optimizer_without_decay_equals_the_constant_eta_path(x64):
    """Constant η, momentum, no decay: the optimiser path and the constant-η keywords are the
    same re-linearised model (tanh backbone, SGD)."""
    split = _tanh_split()
    x, y, xt, yt = _data(NT, seed=2)
    kw = dict(segments=4, steps=T, key=jax.random.key(1), x_test=xt, y_test=yt,
              backbone="exact")
    a = ntk_tt.predict_head_aware_refreshed(
        split, x, y, optimizer=ntk_tt.sgd(0.2, 0.9, nesterov=True, batch_size=3), **kw)
    b = ntk_tt.predict_head_aware_refreshed(split, x, y, learning_rate=0.2, momentum=0.9,
                                            nesterov=True, batch_size=3, **kw)
    for name in ("loss", "error", "test_loss", "test_error"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-12,
                                   atol=1e-14, err_msg=name)


def test_one_segment_and_predict_route_bit_for_bit(x64):
    """segments=1 is predict(optimizer=, head=) with one path; predict(segments=K,
    optimizer=) is predict_head_aware_refreshed(segments=K, optimizer=)."""
    opt = ntk_tt.sgd(ntk_tt.warmup_cosine(0.5, 4, T), 0.9, weight_decay=0.05, batch_size=4)
    x, y, xt, yt = _data(N)
    model = Net(rngs=nnx.Rngs(1))
    apply_fn, params = ntk_tt.from_nnx(model)
    split = ntk_tt.split_head(model)
    kw = dict(optimizer=opt, steps=T, key=jax.random.key(4), x_test=xt, y_test=yt,
              backbone="exact")
    for k in (1, 4):
        ref = ntk_tt.predict_head_aware_refreshed(split, x, y, segments=k, **kw)
        pred = ntk_tt.predict(apply_fn, params, x, y, head=split, segments=k, num_paths=1, **kw)
        for name in ("loss", "error", "test_loss", "test_error", "kappa"):
            np.testing.assert_array_equal(getattr(pred, name), getattr(ref, name), name)
        assert pred.kernel == "head_aware:exact" + ("" if k == 1 else ":refresh4")


# --- refusals ------------------------------------------------------------------------------------

def test_adam_and_misplaced_segments_are_refused_before_work(x64):
    def boom(*_):
        raise AssertionError("the model was called")

    x, y, _, _ = _data(N)
    split = (boom, {"v": jnp.ones((D, FEAT))}, jnp.ones((FEAT, C)), jnp.zeros(C))
    params = {"w": jnp.ones((D, C))}
    adam = ntk_tt.adamw(1e-2)
    with pytest.raises(ValueError, match=r"not adamw\(B=N\): Adam's moments are not "
                       r"re-linearised; for Adam use one linearisation: ntk_tt.predict\("):
        ntk_tt.predict_head_aware_refreshed(split, x, y, segments=2, steps=T, optimizer=adam)
    with pytest.raises(ValueError, match=r"SGD-family recursion only, not adamw\(B=N\)'s "
                       "moments: use segments=1"):  # the head's feature_fn is never called
        ntk_tt.predict(lambda p, x: x @ p["w"], params, x, y, optimizer=adam, steps=T,
                       head=split, segments=2)
    sgd = ntk_tt.sgd(0.1, 0.9)
    with pytest.raises(ValueError, match="drop learning_rate"):
        ntk_tt.predict_head_aware_refreshed(split, x, y, segments=2, steps=T, optimizer=sgd,
                                            learning_rate=0.1)
    with pytest.raises(ValueError, match=r"segments \(21\) must not exceed steps \(20\)"):
        ntk_tt.predict_head_aware_refreshed(split, x, y, segments=21, steps=T, optimizer=sgd)
    with pytest.raises(ValueError, match="batch_size < N.*pass key"):
        ntk_tt.predict_head_aware_refreshed(split, x, y, segments=2, steps=T,
                                            optimizer=ntk_tt.sgd(0.1, batch_size=4))


def test_segments_without_head_are_refused_with_an_optimizer(x64):
    x, y, _, _ = _data(N)
    params = {"w": jax.random.normal(jax.random.key(0), (D, C), F64)}
    with pytest.raises(ValueError, match="segments must be an int in .1, steps. and > 1 only "
                       "with the head-aware predictor, got 2"):
        ntk_tt.predict(lambda p, x: x @ p["w"], params, x, y, optimizer=ntk_tt.sgd(0.1),
                       steps=T, segments=2)


def test_cli_takes_segments_with_the_sgd_family_only():
    """--weight-decay / --schedule with --segments 2 pass the option checks (before any
    JAX); --optimizer adamw with --segments 2 is refused with the flag named."""
    base = DEFAULTS | {"segments": 2}
    check_optimizer_options(base | {"weight_decay": 0.01})
    check_optimizer_options(base | {"schedule": "warmup_cosine", "warmup": 10, "momentum": 0.9})
    with pytest.raises(ValueError, match=r"segments \(--segments\) re-linearises the "
                       "SGD-family recursion only: drop it with --optimizer adamw"):
        check_optimizer_options(base | {"optimizer": "adamw"})


@pytest.mark.parametrize("bad", [0, -1])
def test_cli_adamw_with_segments_out_of_range_gets_the_range_error(bad):
    """--optimizer adamw --segments 0 is the range error (what is wrong with the value), not
    the advice to drop a re-linearisation that was never asked for."""
    from ntk_tt._options_predict import check_predict_job

    with pytest.raises(ValueError, match=r"segments \(--segments\) must be an integer in "
                       rf"\[1, steps\], got {bad}"):
        check_predict_job(DEFAULTS | {"segments": bad, "optimizer": "adamw"})
