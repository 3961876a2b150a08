"""One optimiser description everywhere (issue 27): ``step_time``, ``predict_from_kernel`` and
``predict_head_aware`` take ``optimizer=``; the constant-η-only predictors refuse it in one
line; a warmup that ends at or after the run's end is refused.

References: hand-written optax updates (``optax.adamw`` / ``optax.sgd`` with their own
schedules, not ``Optimizer.to_optax``), real ``finetune(optimizer=)`` of models linear in
their weights (where the recursions are exact), ``ntk_tt.predict(optimizer=)``, and the
public trajectory with the loss computed by hand.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _dynamics_helpers import linear_apply, linear_problem
from flax import nnx

import ntk_tt
from ntk_tt.dynamics._losses import LOSSES
from ntk_tt.training import _finetune

N, T, C = 16, 12, 3


def _ce(logits, y):
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def _tiny():
    params, x, y = linear_problem(n=N + 6, dtype=jnp.float32)
    return params, x[:N], y[:N], x[N:], y[N:]


# --- step_time(optimizer=) -----------------------------------------------------------------

STEP_CASES = [
    (lambda: ntk_tt.adamw(ntk_tt.warmup_cosine(0.05, 3, 10, init=0.01), 0.8, 0.99,
                          weight_decay=0.1, batch_size=4),
     lambda: optax.adamw(optax.warmup_cosine_decay_schedule(0.01, 0.05, 3, 10), b1=0.8,
                         b2=0.99, eps=1e-8, weight_decay=0.1)),
    (lambda: ntk_tt.sgd(ntk_tt.exponential(0.3, 0.9), 0.9, nesterov=True, weight_decay=0.05,
                        decoupled=False, batch_size=4),
     lambda: optax.chain(optax.add_decayed_weights(0.05),
                         optax.sgd(optax.exponential_decay(0.3, 1, 0.9), 0.9, nesterov=True))),
]


@pytest.mark.parametrize("make,reference", STEP_CASES, ids=["adamw_cosine", "sgd_nesterov_l2"])
def test_step_time_times_the_optimizers_real_update(monkeypatch, make, reference):
    """The step ``step_time(optimizer=)`` times, run twice from the state it times from, moves
    the weights exactly as a hand-written optax optimiser does on the same two minibatches
    (η_0 then η_1 of the schedule; ``batch_indices(key, N, 4, 5)``)."""
    params, x, y, _, _ = _tiny()
    key, seen = jax.random.key(4), {}
    real = _finetune._time_steps

    def spy(train_jit, apply_fn, p, state, xx, yy, batches, hyper, statics):
        seen.update(train=train_jit, state=state, batches=batches, hyper=hyper,
                    statics=statics)
        return real(train_jit, apply_fn, p, state, xx, yy, batches, hyper, statics)

    monkeypatch.setattr(_finetune, "_time_steps", spy)
    seconds = ntk_tt.step_time(linear_apply, params, x, y, optimizer=make(), key=key)
    assert np.isfinite(seconds) and seconds > 0
    np.testing.assert_array_equal(seen["batches"], ntk_tt.batch_indices(key, N, 4, 5))
    p, s = params, seen["state"]
    for idx in seen["batches"][:2]:
        p, s = seen["train"](linear_apply, p, s, x, y, idx, *seen["hyper"], **seen["statics"])
    tx = reference()
    q, st = params, tx.init(params)
    for idx in seen["batches"][:2]:
        g = jax.grad(lambda w, idx=idx: _ce(linear_apply(w, x[idx]), y[idx]))(q)
        upd, st = tx.update(g, st, q)
        q = optax.apply_updates(q, upd)
    for name in ("w", "b"):
        np.testing.assert_allclose(p[name], q[name], rtol=2e-6, atol=1e-7)
    assert float(jnp.abs(q["w"] - params["w"]).max()) > 1e-3  # the steps moved the weights


def test_step_time_refuses_bad_combinations_before_work(monkeypatch):
    def boom(*_, **__):
        raise AssertionError("work started before the arguments were checked")

    monkeypatch.setattr(_finetune, "_time_steps", boom)
    params, x, y, _, _ = _tiny()
    opt, key = ntk_tt.sgd(0.1, 0.9, batch_size=4), jax.random.key(0)
    for kw, match in ((dict(optimizer=opt, learning_rate=0.1, key=key), "drop learning_rate"),
                      (dict(optimizer=opt, momentum=0.9, key=key), "drop momentum"),
                      (dict(optimizer=opt, batch_size=4, key=key), "drop batch_size"),
                      (dict(optimizer=opt, nesterov=False, key=key), "drop nesterov"),
                      ({}, "step_time needs the update rule"),
                      (dict(optimizer="adamw"), "must be an ntk_tt.Optimizer"),
                      (dict(optimizer=ntk_tt.sgd(0.1, batch_size=N + 1), key=key),
                       "batch_size"),
                      (dict(optimizer=opt), "key")):
        with pytest.raises(ValueError, match=match):
            ntk_tt.step_time(linear_apply, params, x, y, **kw)


# --- predict_from_kernel / predict_head_aware with optimizer= -------------------------------


def test_predict_from_kernel_with_an_optimizer_is_predict_and_the_real_run():
    """SGDW + warmup-cosine, B = 4, on f = x w + b (its own linearisation): the curves of
    ``predict_from_kernel(optimizer=)`` are those of ``predict(optimizer=)``, and path 0 (the
    real batch order) is ``finetune(optimizer=)`` to float32 rounding."""
    params, x, y, xt, yt = _tiny()
    opt = ntk_tt.sgd(ntk_tt.warmup_cosine(0.5, 4, T), 0.9, weight_decay=0.05, batch_size=4)
    key = jax.random.key(1)
    kw = dict(optimizer=opt, steps=T, key=key, num_paths=3)
    pred = ntk_tt.predict(linear_apply, params, x, y, x_test=xt, y_test=yt, **kw)
    out = ntk_tt.predict_from_kernel(
        ntk_tt.empirical_ntk(linear_apply, params, x), linear_apply(params, x), y,
        kernel_test=ntk_tt.empirical_ntk(linear_apply, params, xt, x),
        f0_test=linear_apply(params, xt), y_test=yt,
        a=ntk_tt.weight_tangent(linear_apply, params, x),
        a_test=ntk_tt.weight_tangent(linear_apply, params, xt), **kw)
    for name in ("loss", "error", "test_loss", "test_error"):
        np.testing.assert_allclose(getattr(out, name), getattr(pred, name), rtol=1e-6)
    assert float(out.kappa) == pytest.approx(pred.kappa, rel=1e-6)
    run = ntk_tt.finetune(linear_apply, params, x, y, optimizer=opt, steps=T, key=key)
    np.testing.assert_allclose(out.loss_paths[0], run.loss, rtol=1e-5, atol=1e-6)
    assert run.loss[0] - run.loss[-1] > 0.2 * run.loss[0]  # it trained


class LinearNet(nnx.Module):
    """Backbone Linear(5, 4) (linear in its weights) and a linear ``head``."""

    def __init__(self, *, rngs):
        self.body = nnx.Linear(5, 4, rngs=rngs)
        self.head = nnx.Linear(4, C, rngs=rngs)

    def __call__(self, x):
        return self.head(self.body(x))


def _head_problem():
    kx, ky = jax.random.split(jax.random.key(0))
    x, y = jax.random.normal(kx, (N, 5)), jax.random.randint(ky, (N,), 0, C)
    model = LinearNet(rngs=nnx.Rngs(0))
    apply_fn, params = ntk_tt.from_nnx(model)
    return model, apply_fn, params, x, y


def test_predict_head_aware_with_sgd_is_predict_and_the_real_run():
    """h = V x + c is linear in its weights, so the head-aware SGD recursion is the network:
    ``predict_head_aware(hk, optimizer=SGDW, B = 4)`` path 0 equals ``finetune``, its mean
    curves those of ``predict(head=, optimizer=)``."""
    model, apply_fn, params, x, y = _head_problem()
    head, key = ntk_tt.split_head(model), jax.random.key(2)
    opt = ntk_tt.sgd(ntk_tt.warmup_cosine(0.1, 4, T), 0.9, weight_decay=0.05, batch_size=4)
    out = ntk_tt.predict_head_aware(ntk_tt.head_aware_kernel(head, x), y, optimizer=opt,
                                    steps=T, key=key, num_paths=2,
                                    a_h=ntk_tt.weight_tangent(head[0], head[1], x))
    pred = ntk_tt.predict(apply_fn, params, x, y, optimizer=opt, steps=T, key=key,
                          num_paths=2, head=head)
    np.testing.assert_allclose(out.loss, pred.loss, rtol=1e-6)
    np.testing.assert_allclose(out.error, pred.error, rtol=1e-6)
    run = ntk_tt.finetune(apply_fn, params, x, y, optimizer=opt, steps=T, key=key)
    np.testing.assert_allclose(out.loss_paths[0], run.loss, rtol=1e-5, atol=1e-6)
    assert run.loss[0] - run.loss[-1] > 0.1 * run.loss[0]


def test_predict_head_aware_with_adamw_is_its_trajectory_and_predict():
    """AdamW (GD) on an AdamKernel: the loss curve is the mean cross-entropy of
    ``head_aware_adam_trajectory``'s logits, computed here by hand, and ``predict``'s."""
    model, apply_fn, params, x, y = _head_problem()
    head = ntk_tt.split_head(model)
    opt = ntk_tt.adamw(ntk_tt.warmup_cosine(1e-2, 3, T), weight_decay=0.1)
    ak = ntk_tt.adam_head_aware_kernel(head, x, y, opt)
    a_h = ntk_tt.weight_tangent(head[0], head[1], x)
    out = ntk_tt.predict_head_aware(ak, y, optimizer=opt, steps=T, a_h=a_h)
    fs, _ = ntk_tt.head_aware_adam_trajectory(ak, y, opt, steps=T, a_h=a_h)
    np.testing.assert_allclose(out.loss, jax.vmap(lambda f: _ce(f, y))(fs), rtol=1e-6)
    pred = ntk_tt.predict(apply_fn, params, x, y, optimizer=opt, steps=T, head=head,
                          head_kernel=ak)
    np.testing.assert_allclose(out.loss, pred.loss, rtol=1e-6)
    assert out.loss[-1] < 0.9 * out.loss[0]


# --- refusals: one ValueError before any work ------------------------------------------------


@pytest.fixture
def no_solve(monkeypatch):
    def boom(*_, **__):
        raise AssertionError("work started before the arguments were checked")

    from ntk_tt.dynamics import _optim_predict

    for name in ("sgd_trajectory", "head_aware_sgd_trajectory", "head_aware_adam_trajectory",
                 "clamp_psd"):
        monkeypatch.setattr(_optim_predict, name, boom)
    return boom


def test_optimizer_refusals(no_solve):
    params, x, y, _, _ = _tiny()
    kernel = ntk_tt.empirical_ntk(linear_apply, params, x)
    f0, key = linear_apply(params, x), jax.random.key(0)
    sgd, adamw = ntk_tt.sgd(0.1, 0.9), ntk_tt.adamw(1e-2)
    model, _, _, hx, hy = _head_problem()
    hk = ntk_tt.head_aware_kernel(ntk_tt.split_head(model), hx)
    kern = dict(kernel=kernel, f0=f0, y=y, steps=T)
    for kw, match in (
            (dict(optimizer=sgd, learning_rate=0.1), "drop learning_rate"),
            (dict(optimizer=sgd, momentum=0.9), "drop momentum"),
            (dict(optimizer=adamw), "Adam has no frozen-kernel predictor.*predict_head_aware"),
            (dict(optimizer=sgd, method="sde", key=key), "needs noise_features"),
            (dict(optimizer=sgd, method="closed_form"), "closed_form' exists for loss='mse'"),
            (dict(optimizer=ntk_tt.sgd(0.1, batch_size=4)), "pass key="),
            (dict(optimizer=ntk_tt.sgd(0.1, weight_decay=0.1)), "pass a "),
            (dict(learning_rate=0.1, a=f0), "drop them with the constant-η keywords")):
        with pytest.raises(ValueError, match=match):
            ntk_tt.predict_from_kernel(**kern | kw)
    for kernel_, kw, match in (
            (hk, dict(optimizer=adamw), "needs hk = ntk_tt.adam_head_aware_kernel"),
            (hk, dict(optimizer=sgd, nesterov=True), "drop nesterov"),
            (hk, dict(optimizer=ntk_tt.sgd(0.1, weight_decay=0.1)), "pass a_h"),
            (ntk_tt.adam_head_aware_kernel(ntk_tt.split_head(model), hx, hy, adamw),
             dict(optimizer=sgd), "of an AdamKernel pass its .hk")):
        with pytest.raises(ValueError, match=match):
            ntk_tt.predict_head_aware(kernel_, hy, steps=T, **kw)


def test_non_finite_tangents_are_refused_before_work(no_solve):
    """A NaN / inf in a, a_test (predict_from_kernel) or a_h (predict_head_aware) gave NaN
    curves silently, while a NaN f0 was refused; now one ValueError before any work (a
    traced tangent, under vmap, is not checked and still runs)."""
    params, x, y, xt, _ = _tiny()
    kernel = ntk_tt.empirical_ntk(linear_apply, params, x)
    f0, opt = linear_apply(params, x), ntk_tt.sgd(0.1, weight_decay=0.1)
    a = ntk_tt.weight_tangent(linear_apply, params, x)
    held = dict(kernel_test=ntk_tt.empirical_ntk(linear_apply, params, xt, x),
                f0_test=linear_apply(params, xt), y_test=jnp.zeros(len(xt), int))
    a_test = ntk_tt.weight_tangent(linear_apply, params, xt)
    for method in ("discrete", "ode"):
        with pytest.raises(ValueError, match="a contains NaN or inf.*weight_tangent"):
            ntk_tt.predict_from_kernel(kernel, f0, y, optimizer=opt, steps=T, method=method,
                                       a=a.at[0, 0].set(jnp.nan))
        with pytest.raises(ValueError, match="a_test contains NaN or inf"):
            ntk_tt.predict_from_kernel(kernel, f0, y, optimizer=opt, steps=T, method=method,
                                       a=a, a_test=a_test.at[1].set(jnp.inf), **held)
    model, _, _, hx, hy = _head_problem()
    split = ntk_tt.split_head(model)
    hk = ntk_tt.head_aware_kernel(split, hx)
    a_h = ntk_tt.weight_tangent(split[0], split[1], hx)
    with pytest.raises(ValueError, match="a_h contains NaN or inf"):
        ntk_tt.predict_head_aware(hk, hy, steps=T, optimizer=opt, a_h=a_h.at[0].set(jnp.nan))
    with pytest.raises(AssertionError, match="work started"):  # traced: no eager check
        jax.vmap(lambda t: ntk_tt.predict_from_kernel(kernel, f0, y, optimizer=opt, steps=T,
                                                      a=t).loss)(jnp.stack([a, a]))


def test_an_adam_kernel_of_another_eps_is_refused(no_solve):
    """P = 1/(√v̄ + ε): a kernel built for ε = 1e-8 gave a silently wrong curve for an
    optimizer with ε = 0.1 (a fresh user's finding); now refused by every entry point, and an
    SGD optimizer with an Adam kernel is named as such."""
    model, apply_fn, params, x, y = _head_problem()
    head = ntk_tt.split_head(model)
    ak = ntk_tt.adam_head_aware_kernel(head, x, y, ntk_tt.adamw(1e-2))
    assert ak.eps == pytest.approx(1e-8)
    other = ntk_tt.adamw(1e-2, eps=0.1, weight_decay=0.0)
    msg = "built for Adam's ε = 1e-08.*optimizer's is 0.1"
    with pytest.raises(ValueError, match=msg):
        ntk_tt.predict_head_aware(ak, y, optimizer=other, steps=T)
    with pytest.raises(ValueError, match=msg):
        ntk_tt.predict(apply_fn, params, x, y, optimizer=other, steps=T, head=head,
                       head_kernel=ak)
    with pytest.raises(ValueError, match=msg):
        ntk_tt.divergence_boundary(ak, y, optimizer=other, momenta=[0.9],
                                   learning_rates=[1e-3, 1e-2], steps=T)
    with pytest.raises(ValueError, match="is an Adam kernel.*optimizer is sgd.*pass its .hk"):
        ntk_tt.predict(apply_fn, params, x, y, optimizer=ntk_tt.sgd(0.1), steps=T, head=head,
                       head_kernel=ak)


def test_an_adam_kernel_of_another_loss_and_impossible_kernels_are_refused(no_solve,
                                                                           monkeypatch):
    """v̄ and the calibration hold one loss's gradients: a cross-entropy Adam kernel gave a
    silently wrong MSE curve (a fresh user's finding: T_0.1 10 against 12 steps); now refused
    by every entry point. B > N and Adam's L2 decay are refused before any kernel."""
    model, apply_fn, params, x, y = _head_problem()
    head = ntk_tt.split_head(model)
    opt = ntk_tt.adamw(1e-2)
    ak = ntk_tt.adam_head_aware_kernel(head, x, y, opt)
    assert LOSSES[ak.loss] == "cross_entropy"
    # the kernel stays a pytree of numbers: a jitted function may take it as an argument
    np.testing.assert_allclose(jax.jit(lambda k: k.precond.backbone.sum())(ak),
                               ak.precond.backbone.sum(), rtol=1e-6)
    msg = "built for loss='cross_entropy'.*prediction's is 'mse'.*loss='mse'"
    with pytest.raises(ValueError, match=msg):
        ntk_tt.predict_head_aware(ak, y, optimizer=opt, steps=T, loss="mse")
    with pytest.raises(ValueError, match=msg):
        ntk_tt.predict(apply_fn, params, x, y, optimizer=opt, steps=T, head=head,
                       head_kernel=ak, loss="mse")
    with pytest.raises(ValueError, match=msg):
        ntk_tt.sensitivities(ak, y, optimizer=opt, steps=T, loss="mse")
    from ntk_tt.dynamics import _adam_head_aware

    monkeypatch.setattr(_adam_head_aware, "head_aware_kernel", no_solve)  # no kernel built
    n = x.shape[0]
    with pytest.raises(ValueError, match=f"1 <= batch_size <= N = {n}, got {n + 1}"):
        ntk_tt.adam_head_aware_kernel(head, x, y, ntk_tt.adamw(1e-2, batch_size=n + 1))
    with pytest.raises(ValueError, match="needs decoupled weight decay.*adamw"):
        ntk_tt.adam_head_aware_kernel(head, x, y, ntk_tt.adam(1e-2, weight_decay=0.1))


def test_constant_eta_only_predictors_refuse_an_optimizer():
    """Each names what it predicts and where an optimiser goes, before touching the model."""
    def boom(*_):
        raise AssertionError("the model was called")

    params, x, y, _, _ = _tiny()
    opt = ntk_tt.adamw(1e-3)
    split = (boom, params, jnp.zeros((4, C)), jnp.zeros(C))
    spectrum = ntk_tt.Spectrum(jnp.ones(3), jnp.ones(3), N)
    for call, match in (
            (lambda: ntk_tt.predict_head_aware_refreshed(split, x, y, segments=2, steps=T,
                                                         optimizer=opt),
             "predict_head_aware_refreshed predicts constant-η SGD .*learning_rate=.*"
             "one linearisation: ntk_tt.predict\\(..., head=split, optimizer=opt\\)"),
            (lambda: ntk_tt.predict_from_subset(boom, params, x, y, subset_size=6, steps=T,
                                                optimizer=opt),
             "predict_from_subset predicts constant-η full-batch GD.*predict_from_kernel"),
            (lambda: ntk_tt.predict_curve_from_spectrum(spectrum, steps=T, optimizer=opt),
             "predict_curve_from_spectrum predicts constant-η full-batch GD.*optimizer=opt")):
        with pytest.raises(ValueError, match=match):
            call()


# --- a warmup that ends at or after the run's end -------------------------------------------


def test_a_warmup_past_the_horizon_is_refused_before_work():
    def boom(*_):
        raise AssertionError("the model was called")

    params, x, y, _, _ = _tiny()
    for sched, match in ((ntk_tt.warmup_cosine(0.1, 500, 600), "peak 0.1 at step 500"),
                         (ntk_tt.warmup_cosine(0.1, 12, 20), "at step 12, but a run of "
                          "steps = 12 updates ends before it.*<= 11 steps .* or raise "
                          "steps to > 12"),
                         (ntk_tt.warmup_stable_decay(0.1, 11.5, 15, 5), "at step 12")):
        for fn in (ntk_tt.predict, ntk_tt.finetune):
            with pytest.raises(ValueError, match=match):
                fn(boom, params, x, y, optimizer=ntk_tt.sgd(sched), steps=T)
        with pytest.raises(ValueError, match=match):  # shares the check
            ntk_tt.sensitivities(np.eye(N), y, f0=np.zeros((N, C)),
                                 optimizer=ntk_tt.sgd(sched), steps=T)


def test_a_warmup_that_ends_on_the_last_step_or_a_callable_is_accepted():
    """warmup = T − 1: the last update trains at the peak (the recorded peak η_t is it); a
    callable ramp has no warmup to check (its largest η_t over T steps is recorded)."""
    params, x, y, _, _ = _tiny()
    for lr, peak in ((ntk_tt.warmup_cosine(0.1, T - 1, 30), 0.1),
                     (lambda t: 0.1 * jnp.minimum(1.0, t / 500), 0.1 * (T - 1) / 500),
                     (ntk_tt.warmup_cosine(0.1, 50, 60, init=0.1), 0.1)):
        pred = ntk_tt.predict(linear_apply, params, x, y, optimizer=ntk_tt.sgd(lr), steps=T)
        assert pred.hyperparameters["learning_rate"] == pytest.approx(peak, rel=1e-6)
        assert pred.loss[-1] < pred.loss[0]


def test_a_non_finite_warmup_smoothing_is_refused():
    """The smoothing length (steps) of a warmup's relaxation must be a finite number >= 0:
    NaN or inf passed the ``< 0`` check and gave NaN learning rates."""
    for make in (lambda s: ntk_tt.warmup_cosine(0.1, 3, 9, smoothing=s),
                 lambda s: ntk_tt.warmup_stable_decay(0.1, 3, 5, 4, smoothing=s)):
        for bad in (float("nan"), float("inf"), -1.0):
            with pytest.raises(ValueError, match="smoothing must be a finite number >= 0"):
                make(bad)
        assert np.isfinite(make(2.0).values(12)).all()
        # a fresh user's jax.grad over smoothing was told 0.7 is not a finite number >= 0
        for transform in (jax.grad, lambda f: jax.vmap(f)):
            arg = 0.7 if transform is jax.grad else jnp.array([0.5, 1.0])
            with pytest.raises(ValueError, match="^smoothing is static"):
                transform(lambda s, make=make: make(s).values(12).sum())(arg)


def test_a_head_kernel_where_none_is_used_is_refused_as_unused(no_solve):
    """``head_kernel=`` with segments > 1 (kernels rebuilt along the path) or the linear
    predictor: the message said the kernel did not match the inputs; it matches, it is
    unused."""
    model, apply_fn, params, x, y = _head_problem()
    head = ntk_tt.split_head(model)
    hk = ntk_tt.head_aware_kernel(head, x)
    for kw in (dict(head=head, segments=2), dict(predictor="linear")):
        for opt in (None, ntk_tt.sgd(0.1)):
            rule = dict(learning_rate=0.1) if opt is None else dict(optimizer=opt)
            with pytest.raises(ValueError, match="head_kernel is used only by the head-aware "
                               "predictor with one segment.*drop head_kernel="):
                ntk_tt.predict(apply_fn, params, x, y, steps=T, head_kernel=hk, **rule, **kw)
