"""``predict`` / ``finetune`` / ``compare`` with ``optimizer=`` (issue 27, phase B).

References: real ``finetune(optimizer=...)`` training of models linear in their weights (where
the frozen-kernel and head-aware recursions are exact), ``ntk_tt.linearised_reference`` (exact
Adam on the linearised model, weight space) for the fast Adam predictor. The gradient of a
prediction's final loss with respect to a schedule's peak and warmup through the pure path
is tested against central differences in ``tests/test_optimizers.py``
(``test_final_loss_gradient_wrt_peak_and_warmup``), not repeated here.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _dynamics_helpers import linear_apply, linear_problem
from _ntk_models import TanhHeadNet
from flax import nnx

import ntk_tt

N, T = 16, 25
D, FEAT, C = 5, 4, 3


class LinearNet(nnx.Module):
    """Backbone Linear(D, F) (linear in its weights) and a linear ``head``."""

    def __init__(self, *, rngs):
        self.body = nnx.Linear(D, FEAT, rngs=rngs)
        self.head = nnx.Linear(FEAT, C, rngs=rngs)

    def __call__(self, x):
        return self.head(self.body(x))


def _sgdw(peak):
    return ntk_tt.sgd(ntk_tt.warmup_cosine(peak, 5, T), 0.9, weight_decay=0.05, batch_size=4)


def _check_same(pred, run, opt, peak):
    """Curves to float32 rounding; equal T_ε; compare() accepts the pair."""
    np.testing.assert_allclose(pred.loss, run.loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pred.test_loss, run.test_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(pred.error, run.error)
    assert run.loss[0] - run.loss[-1] > 0.2 * run.loss[0]  # it trained
    report = ntk_tt.compare(pred, run)
    assert all(v == 0 for per in report["absolute_error"].values() for v in per.values())
    hp = pred.hyperparameters
    assert (hp["optimizer"], hp["schedule"], hp["batch_size"]) == ("sgd", "warmup_cosine", 4)
    np.testing.assert_allclose([hp["learning_rate"], hp["weight_decay"], hp["momentum"]],
                               [peak, 0.05, 0.9], rtol=1e-6)
    assert run.optimizer is opt and run.learning_rate == pytest.approx(peak)


def test_frozen_kernel_prediction_equals_finetune_of_a_linear_model():
    """f = x w + b is its own linearisation: predict(optimizer=SGDW + warmup-cosine, B = 4)
    must equal finetune(optimizer=same) on the same batches (num_paths=1: the real order)."""
    params, x, y = linear_problem(n=N + 6, dtype=jnp.float32)
    x, xt, y, yt = x[:N], x[N:], y[:N], y[N:]
    opt, key = _sgdw(0.5), jax.random.key(1)
    pred = ntk_tt.predict(linear_apply, params, x, y, optimizer=opt, steps=T, key=key,
                          num_paths=1, x_test=xt, y_test=yt)
    run = ntk_tt.finetune(linear_apply, params, x, y, optimizer=opt, steps=T, key=key,
                          x_test=xt, y_test=yt, record_test_curves=True)
    assert pred.kernel == "exact" and pred.outcome == "converges"
    _check_same(pred, run, opt, 0.5)


def test_a_schedule_that_ends_before_the_run_warns_once_at_the_users_call():
    """A fresh user's warmup_cosine(0.1, 5, 10) run for 30 steps was accepted silently with
    η = 0 over the last 20 updates (optax's convention: ``end`` from ``decay_steps`` on), which
    change nothing: the real run's loss is flat there. predict and finetune now warn, once,
    pointing at the caller's line; a schedule that ends at the run's last update or one before
    it (one idle update) does not."""
    import warnings

    params, x, y = linear_problem(n=N, dtype=jnp.float32)
    short = ntk_tt.sgd(ntk_tt.warmup_cosine(0.5, 2, 10), 0.0)
    calls = {"predict": lambda opt: ntk_tt.predict(linear_apply, params, x, y, optimizer=opt,
                                                   steps=T),
             "finetune": lambda opt: ntk_tt.finetune(linear_apply, params, x, y, optimizer=opt,
                                                     steps=T)}
    for name, call in calls.items():
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            out = call(short)
        idle = [w for w in seen if "learning rate is 0" in str(w.message)]
        assert [str(w.message) for w in idle] == [
            f"the learning rate is 0 from step 10 on: the last {T - 10} of the {T} updates "
            f"change nothing (a schedule built for 10 steps? give its decay steps = steps = "
            f"{T})."], name
        assert idle[0].filename == __file__, name
        np.testing.assert_allclose(out.loss[10:], out.loss[10], rtol=1e-6)  # flat: no update
        assert out.loss[10] < out.loss[0]
        for decay in (T, T - 1):
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                call(ntk_tt.sgd(ntk_tt.warmup_cosine(0.5, 2, decay), 0.0))
            assert not [w for w in seen if "learning rate is 0" in str(w.message)], (name, decay)


def test_head_aware_prediction_equals_finetune_of_a_linear_backbone():
    """h = V x + c is linear in its weights: the head-aware recursion (the isotropic feature
    kernel, K_h(i, j) = (x_i·x_j + 1)·I_F exactly here) is the network."""
    kx, ky = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (N + 6, D))
    y = jax.random.randint(ky, (N + 6,), 0, C)
    model = LinearNet(rngs=nnx.Rngs(0))
    apply_fn, params = ntk_tt.from_nnx(model)
    opt, key = _sgdw(0.1), jax.random.key(2)
    pred = ntk_tt.predict(apply_fn, params, x[:N], y[:N], optimizer=opt, steps=T, key=key,
                          num_paths=1, head=ntk_tt.split_head(model), backbone="isotropic",
                          x_test=x[N:], y_test=y[N:])
    run = ntk_tt.finetune(apply_fn, params, x[:N], y[:N], optimizer=opt, steps=T, key=key,
                          x_test=x[N:], y_test=y[N:], record_test_curves=True)
    assert pred.kernel == "head_aware:isotropic"  # exact for h = V x + c
    _check_same(pred, run, opt, 0.1)


# measured (N = 32, T = 60, AdamW λ = 0.1, warmup 10 + cosine, exact feature kernel): max
# relative distance of the predicted loss curve to the linearised-model reference with the
# drifting second-moment profile (the default) 0.9 % (GD, peak 3e-3), 32 % (GD, peak 2e-2)
# and 0.7 % (B = 8, peak 1e-2); T_ε within 1 / 6 / 1 steps. With K_P on g_0²'s profile
# (min_ref_mix=0, the default before the shipped backbone's small-N overshoot) GD at 2e-2 was
# 9.6 % (T_ε within 3 steps): on this 112-weight tanh layer the gradient stays near g_0, where
# the mixed profile is the worse one (README "The subspace kernel with AdamW"). The frozen
# profile (profile="frozen") misses GD by 2.5 % and 41 %: the full-batch gradient turns away
# from g_0, and parameters whose g_0 nearly cancels get far too large steps. Tolerances ~1.5×.
ADAM_CASES = [(None, 3e-3, None, 0.015, 2), (None, 2e-2, None, 0.45, 8),
              (8, 1e-2, None, 0.011, 2), (None, 2e-2, 0.0, 0.15, 4)]


@pytest.mark.parametrize("batch_size,peak,mix,rtol,steps_tol", ADAM_CASES,
                         ids=["gd", "gd-fast", "b8", "gd-fast-g0-profile"])
def test_fast_adamw_prediction_is_close_to_the_linearised_reference(batch_size, peak, mix,
                                                                     rtol, steps_tol):
    kx, ky = jax.random.split(jax.random.key(0))
    x, y = jax.random.normal(kx, (32, 6)), jax.random.randint(ky, (32,), 0, C)
    model = TanhHeadNet(rngs=nnx.Rngs(0))
    apply_fn, params = ntk_tt.from_nnx(model)
    opt = ntk_tt.adamw(ntk_tt.warmup_cosine(peak, 10, 60), weight_decay=0.1,
                       batch_size=batch_size)
    key = jax.random.key(3)
    split = ntk_tt.split_head(model)
    ak = ntk_tt.adam_head_aware_kernel(split, x, y, opt, backbone="exact", min_ref_mix=mix)
    pred = ntk_tt.predict(apply_fn, params, x, y, optimizer=opt, steps=60, key=key,
                          num_paths=1, head=split, backbone="exact", head_kernel=ak)
    ref = ntk_tt.linearised_reference(apply_fn, params, x, y, opt, steps=60, key=key)
    assert pred.kernel == "head_aware_adam:exact"
    hp = pred.hyperparameters
    assert hp["optimizer"] == "adamw" and (hp["b1"], hp["b2"]) == pytest.approx((0.9, 0.999))
    np.testing.assert_array_less(np.abs(pred.loss - ref.loss) / ref.loss, rtol)
    assert ref.loss[0] - ref.loss[-1] > 0.15 * ref.loss[0]  # it trained
    for eps in (0.01, 0.1, 0.4):
        assert abs(pred.training_time["loss"][eps] - ntk_tt.training_time(ref.loss, eps)) \
            <= steps_tol


def test_errors_before_work():
    params, x, y = linear_problem(n=N, dtype=jnp.float32)
    opt = ntk_tt.sgd(0.1)

    def boom(p, xx):  # any model call would fail: every error below comes first
        raise AssertionError("the model was called")

    for fn in (ntk_tt.predict, ntk_tt.finetune):
        with pytest.raises(ValueError, match="drop batch_size, momentum or put them into"):
            fn(boom, params, x, y, optimizer=opt, steps=T, momentum=0.9, batch_size=4)
        with pytest.raises(ValueError, match="needs the update rule: learning_rate="):
            fn(boom, params, x, y, steps=T)
    with pytest.raises(ValueError, match="Adam has no frozen-kernel predictor.*head=ntk_tt"
                                         r".split_head\(model\).*linearised_reference"):
        ntk_tt.predict(linear_apply, params, x, y, optimizer=ntk_tt.adamw(0.01), steps=T)
    run = ntk_tt.finetune(linear_apply, params, x, y, optimizer=ntk_tt.adamw(0.01), steps=3)
    pred = ntk_tt.predict(linear_apply, params, x, y, optimizer=ntk_tt.sgd(0.01), steps=3)
    with pytest.raises(ValueError, match="optimizer: predicted 'sgd', fine-tuned 'adamw'.*"
                                         "weight_decay: predicted 0.0"):
        ntk_tt.compare(pred, run)
    # the constant-η keywords are sgd(η) without decay: the same training as optimizer=sgd(η)
    same = ntk_tt.finetune(linear_apply, params, x, y, learning_rate=0.01, steps=3)
    ntk_tt.compare(pred, same)
    # a fresh user: a weight-decayed prediction against the shorthand run was a KeyError
    # ('decoupled'), the other way round the ValueError below; both orders now say it
    decayed = ntk_tt.sgd(0.01, weight_decay=1e-3)
    pred_wd = ntk_tt.predict(linear_apply, params, x, y, optimizer=decayed, steps=3)
    run_wd = ntk_tt.finetune(linear_apply, params, x, y, optimizer=decayed, steps=3)
    for p, r, said in ((pred_wd, same, "predicted 0.001, fine-tuned 0.0"),
                       (pred, run_wd, "predicted 0.0, fine-tuned 0.001")):
        with pytest.raises(ValueError, match=f"describe different training \\(weight_decay: "
                                             f"{said}\\)"):
            ntk_tt.compare(p, r)
    ntk_tt.compare(pred_wd, run_wd)


def test_learning_rates_that_do_not_descend_are_refused():
    """A fresh user's probes (issue 25's check): finetune(optimizer=) trained on a negative or
    NaN η_t (gradient ascent) while predict refused it, and exponential(0.1, −0.5) flipped
    η_t's sign every step in both. Constructors refuse learning-rate numbers ≤ 0; predict and
    finetune refuse a schedule with a non-finite or negative η_t at any step, before the
    model is called."""
    params, x, y = linear_problem(n=N, dtype=jnp.float32)

    def boom(p, xx):
        raise AssertionError("the model was called")

    for make in (lambda: ntk_tt.sgd(-0.1), lambda: ntk_tt.adamw(0.0),
                 lambda: ntk_tt.constant(-0.1), lambda: ntk_tt.warmup_cosine(-1e-3, 10, 100),
                 lambda: ntk_tt.warmup_stable_decay(0.0, 1, 2, 3),
                 lambda: ntk_tt.exponential(0.1, -0.5), lambda: ntk_tt.exponential(-0.1, 0.9),
                 lambda: ntk_tt.sgd(1e-40)):  # subnormal: 0 in XLA's float32 (a fresh user)
        with pytest.raises(ValueError, match=r"must be > 0, in \[1\.1754944e-38, "
                                             r"3\.4028235e\+38\] \(float32's normal range\), got"):
            make()
    for sched, what in ((ntk_tt.schedule(lambda t: jnp.nan * t), "η_0 = nan"),
                        (ntk_tt.schedule(lambda t: 0.1 - 0.1 * t), "η_2 = -0.1"),
                        (ntk_tt.schedule(optax.warmup_cosine_decay_schedule(
                            0.0, 0.1, 2, 4, end_value=-0.05)), "η_4 = -0.05")):
        for fn in (ntk_tt.predict, ntk_tt.finetune):
            with pytest.raises(ValueError, match=f"finite and >= 0 at every step, got {what}"):
                fn(boom, params, x, y, optimizer=ntk_tt.sgd(sched), steps=T)


def test_learning_rates_outside_float32s_normal_range_are_refused_or_nan_when_traced():
    """Two fresh users: learning_rate=1e-40 passed every API check ("> 0") and is 0 in
    float32 (predict reported κ = 0; the spectrum curve was NaN eagerly, flat under jit), and
    1e39 is inf there (finetune trained on, predict said κ nan, code INVALID, nothing traced).
    Outside [float32's smallest normal, largest] η is refused eagerly, as ``--lr`` is, and a
    traced one gives NaN and code INVALID (a flat curve before); the bounds themselves pass."""
    params, x, y = linear_problem(n=N, dtype=jnp.float32)
    kernel, f0 = jnp.eye(N), jnp.zeros((N, int(y.max()) + 1))
    spectrum = ntk_tt.Spectrum(jnp.array([4.0, 2.0]), jnp.array([1.0, 0.5]), 2)

    def boom(p, xx):
        raise AssertionError("the model was called")

    calls = (lambda lr: ntk_tt.predict_from_kernel(kernel, f0, y, learning_rate=lr, steps=3),
             lambda lr: ntk_tt.finetune(boom, params, x, y, learning_rate=lr, steps=3),
             lambda lr: ntk_tt.predict_curve_from_spectrum(spectrum, learning_rate=lr, steps=3))
    tiny, big = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)
    for call in calls:
        for lr in (1e-40, 1e-39, 0.0, 1e39):
            with pytest.raises(ValueError, match=r"learning_rate must be .*finite.* > 0, in "
                                                 r"\[1\.1754944e-38, 3\.4028235e\+38\]"):
                call(lr)
    assert np.isfinite(calls[2](tiny)).all() and ntk_tt.sgd(big) is not None  # the bounds
    traced = jax.jit(jax.vmap(calls[0]))(jnp.array([1e-2, 1e-40, 0.0]))
    codes = np.asarray(traced.training_time_code)
    assert (codes[0] != ntk_tt.INVALID).all() and (codes[1:] == ntk_tt.INVALID).all()
    assert np.isfinite(traced.kappa[0]) and np.isnan(np.asarray(traced.kappa[1:])).all()
    curve = jax.jit(lambda e: calls[2](e)[-1])
    assert np.isfinite(curve(1e-2)) and np.isnan(curve(1e-40))  # was a flat L_0 under jit
    assert np.isnan(jax.jit(jax.grad(curve))(1e-40))


def test_decay_rates_that_are_1_in_float32_are_refused_as_the_cli_refuses_them():
    """A fresh user's momentum 1 − 1e-8 passed every check (< 1 in float64) and is 1.0 in
    float32, where predictions and fine-tunes run: predict returned NaN everywhere, L_0
    included, with outcome "unknown"; suggest recommended "m = 1"; AdamW's b2 = 0.99999999
    gave κ = inf. m, β₁ and β₂ above 1 − 2⁻²⁴ (float32's largest number below 1) are refused
    before any work, as the CLI refuses them; the bound itself passes, and its prediction is a
    finite curve (heavy ball at m = 1 − 2⁻²⁴ on Θ = I: L_t falls), not NaN."""
    params, x, y = linear_problem(n=N, dtype=jnp.float32)
    kernel, f0 = jnp.eye(N), jnp.zeros((N, int(y.max()) + 1))
    top, up = 1 - 2.0**-24, 1 - 2.0**-25  # up: the smallest number float32 rounds up to 1
    assert np.float32(top) < 1 and np.float32(up) == 1 and np.float32(np.nextafter(up, 0)) < 1

    def boom(p, xx):
        raise AssertionError("the model was called")

    def predict(m):
        return ntk_tt.predict_from_kernel(kernel, f0, y, learning_rate=0.1, momentum=m, steps=8)

    calls = {"momentum": (predict,
                          lambda m: ntk_tt.finetune(boom, params, x, y, learning_rate=0.1,
                                                    momentum=m, steps=3),
                          lambda m: ntk_tt.sgd(0.1, m)),
             "b1": (lambda b: ntk_tt.adamw(1e-3, b1=b),),
             "b2": (lambda b: ntk_tt.adam(1e-3, b2=b), lambda b: ntk_tt.adamw(1e-3, b2=b))}
    for name, fns in calls.items():
        for fn in fns:
            for v in (up, 1 - 1e-10, 1.0):
                with pytest.raises(ValueError, match=rf"^{name} must be in \[0, 1\) and at most "
                                                     r"0\.99999994 \(float32's largest"):
                    fn(v)
    assert float(ntk_tt.sgd(0.1, top).momentum) == np.float32(top)
    assert float(ntk_tt.adamw(1e-3, b1=top, b2=top).b2) == np.float32(top)
    edge = predict(top).loss
    assert np.isfinite(edge).all() and edge[-1] < edge[0] - 0.02


def test_an_integer_or_bfloat16_spectrum_is_read_as_numbers():
    """A fresh user: integer eigenvalues cast η = 0.1 to 0 (a NaN curve; with an optimiser a
    flat one), and a bfloat16 spectrum was refused as "not all numbers"; both now give the
    float32 spectrum's curve (bfloat16 to its precision)."""
    floats = ntk_tt.Spectrum(jnp.array([2.0, 1.0]), jnp.array([1.0, 1.0]), 4)
    ints = ntk_tt.Spectrum(jnp.array([2, 1]), jnp.array([1, 1]), 4)
    halves = ntk_tt.Spectrum(*(jnp.asarray(v, jnp.bfloat16) for v in floats[:2]), 4)
    for kw in (dict(learning_rate=0.1), dict(optimizer=ntk_tt.sgd(0.1, momentum=0.5))):
        want = ntk_tt.predict_curve_from_spectrum(floats, steps=3, **kw)
        np.testing.assert_allclose(ntk_tt.predict_curve_from_spectrum(ints, steps=3, **kw), want)
        np.testing.assert_allclose(np.asarray(ntk_tt.predict_curve_from_spectrum(
            halves, steps=3, **kw), np.float32), want, rtol=1e-2)


def test_schedules_refuse_what_the_cli_refuses():
    """Issue 25: the API took what ``ntk-tt predict`` refuses (--end-lr outside [0, --lr],
    --decay-rate outside (0, 1]): a warmup_cosine / warmup_stable_decay ending (or starting)
    below 0 or above its peak, an exponential that grows (η_t = init·rate^t unbounded). Each
    is one ValueError naming the argument and the fix; the bounds themselves pass and give
    optax's values."""
    for make, match in (
            (lambda: ntk_tt.warmup_cosine(0.1, 2, 10, end=-0.01),
             r"end must be in \[0, peak = 0.1\] .*got -0.01: raise end to >= 0"),
            (lambda: ntk_tt.warmup_cosine(0.1, 2, 10, end=0.2),
             r"end must be in \[0, peak = 0.1\] .*got 0.2: lower end or raise peak"),
            (lambda: ntk_tt.warmup_cosine(0.1, 2, 10, init=0.5),
             r"init must be in \[0, peak = 0.1\] \(the learning rate the schedule starts at"),
            (lambda: ntk_tt.warmup_stable_decay(0.1, 2, 5, 5, end=0.3),
             r"end must be in \[0, peak = 0.1\]"),
            (lambda: ntk_tt.exponential(0.1, 1.01),
             r"rate must be in \(0, 1\] .*got 1.01: a rate > 1 grows η_t without bound; for "
             r"a growing η_t pass a callable, e.g. optax.exponential_decay")):
        with pytest.raises(ValueError, match=match):
            make()
    for ours, ref in ((ntk_tt.warmup_cosine(0.1, 2, 10, init=0.1, end=0.1),
                       optax.warmup_cosine_decay_schedule(0.1, 0.1, 2, 10, 0.1)),
                      (ntk_tt.warmup_stable_decay(0.1, 2, 5, 5, end=0.0),
                       optax.join_schedules([optax.linear_schedule(0.0, 0.1, 2),
                                             optax.constant_schedule(0.1),
                                             optax.linear_schedule(0.1, 0.0, 5)], [2, 5])),
                      (ntk_tt.exponential(0.1, 1.0), optax.constant_schedule(0.1))):
        np.testing.assert_allclose(ours.values(12), [ref(t) for t in range(12)], rtol=1e-6,
                                   atol=1e-9)
    # suggest rebuilds its template as r·peak in float32: the bound passes within 1e-6
    assert float(ntk_tt.warmup_cosine(0.1, 0, 10, end=np.float32(0.1)).end) == \
        pytest.approx(0.1)


def test_hyperparameters_name_adam_s_b1_and_the_report_rounds_float32():
    """Issue 25: Adam's β₁ was recorded only under "momentum" (kept: compare and the
    intervals read it); it is "b1" too (None for SGD, like "b2"). The CLI's optimiser line
    prints the float32 leaves rounded (0.85 stored as 0.8500000238418579); JSON keeps them."""
    from ntk_tt._options_optimizer import describe_optimizer
    from ntk_tt.training._optimizer_run import optimizer_hyperparameters

    h = optimizer_hyperparameters(ntk_tt.adamw(ntk_tt.exponential(3e-3, 0.97), b1=0.85, b2=0.99,
                                               eps=1e-7, weight_decay=0.02), 10, 20)
    assert h["b1"] == float(np.float32(0.85)) != 0.85 and h["momentum"] == h["b1"]
    assert (h["b2"], h["eps"]) == (float(np.float32(0.99)), float(np.float32(1e-7)))
    assert describe_optimizer(h) == ("adamw (β₁ 0.85, β₂ 0.99, ε 1e-07), weight decay 0.02 "
                                     "decoupled, B = 20; exponential: η_t = 0.003·0.97^t")
    s = optimizer_hyperparameters(ntk_tt.sgd(0.1, 0.9, nesterov=True), 10, 20)
    assert (s["b1"], s["b2"], s["eps"], s["momentum"]) == (None, None, None,
                                                          float(np.float32(0.9)))
    assert describe_optimizer(s) == "sgd (m 0.9, Nesterov), B = 20; constant: η 0.1"


def test_a_reused_head_kernel_gives_the_prediction_that_builds_it():
    """``head_kernel=``: the kernels built once (as a sweep over optimisers does) and passed
    in give the curves ``predict`` computes when it builds them itself; a kernel of other
    inputs, an Adam kernel of another batch size, or one without ``head`` are refused."""
    kx, ky = jax.random.split(jax.random.key(0))
    x, y = jax.random.normal(kx, (32, 6)), jax.random.randint(ky, (32,), 0, C)
    model = TanhHeadNet(rngs=nnx.Rngs(0))
    apply_fn, params = ntk_tt.from_nnx(model)
    head, key = ntk_tt.split_head(model), jax.random.key(3)
    hk = ntk_tt.head_aware_kernel(head, x)
    adamw = ntk_tt.adamw(ntk_tt.warmup_cosine(1e-2, 5, 20), weight_decay=0.1, batch_size=8)
    ak = ntk_tt.adam_head_aware_kernel(head, x, y, adamw, hk=hk)
    kw = dict(steps=20, key=key, num_paths=2, head=head)
    dk = ntk_tt.head_aware_kernel(head, x, backbone="diagonal")  # SGD's default feature kernel
    dak = ntk_tt.adam_head_aware_kernel(head, x, y, adamw, hk=dk, backbone="diagonal")
    for opt, kernel, backbone in ((_sgdw(0.3), hk, "isotropic"), (_sgdw(0.3), dk, None),
                                  (adamw, hk, "isotropic"), (adamw, ak, "isotropic"),
                                  (adamw, dk, None), (adamw, dak, None)):  # Adam's default too
        own = ntk_tt.predict(apply_fn, params, x, y, optimizer=opt, backbone=backbone, **kw)
        reused = ntk_tt.predict(apply_fn, params, x, y, optimizer=opt, head_kernel=kernel, **kw)
        np.testing.assert_allclose(reused.loss, own.loss, rtol=1e-6)
        np.testing.assert_array_equal(reused.error, own.error)
        assert reused.kernel == own.kernel
    own = ntk_tt.predict(apply_fn, params, x, y, learning_rate=0.3, **kw)
    reused = ntk_tt.predict(apply_fn, params, x, y, learning_rate=0.3, head_kernel=dk, **kw)
    np.testing.assert_allclose(reused.loss, own.loss, rtol=1e-6)
    for bad, opt, match in ((ntk_tt.head_aware_kernel(head, x[:16]), adamw, "N rows"),
                            (ak, ntk_tt.adamw(ntk_tt.warmup_cosine(1e-2, 5, 20),
                                              weight_decay=0.1, batch_size=4),
                             "built for batch size 8.*optimizer's is 4"),
                            (ak, _sgdw(0.3), "is an Adam kernel.*pass its .hk for SGD")):
        with pytest.raises(ValueError, match=match):
            ntk_tt.predict(apply_fn, params, x, y, optimizer=opt, head_kernel=bad, **kw)
    with pytest.raises(ValueError, match="used only by the head-aware predictor.*drop head_kernel"):
        ntk_tt.predict(apply_fn, params, x, y, learning_rate=0.3, steps=20, head_kernel=hk)


def test_a_head_kernel_of_other_inputs_or_another_head_is_refused():
    """A fresh user's probe: the kernel of x reused for other inputs x2 of the same shape gave
    a curve starting at the wrong loss (1.188 against the real 0.925), silently. Now the
    features of spread rows and the head weights are compared, in predict (both paths),
    with held-out inputs too, and in suggest; the kernel of these very inputs still passes."""
    kx, k2, ky = jax.random.split(jax.random.key(0), 3)
    x, x2 = jax.random.normal(kx, (32, 6)), jax.random.normal(k2, (32, 6))
    y = jax.random.randint(ky, (32,), 0, C)
    model = TanhHeadNet(rngs=nnx.Rngs(0))
    apply_fn, params = ntk_tt.from_nnx(model)
    head = ntk_tt.split_head(model)
    other = ntk_tt.split_head(ntk_tt.replace_head(model, C, key=jax.random.key(9)))
    kw = dict(steps=10, head=head, key=jax.random.key(3), num_paths=2)
    cases = [(ntk_tt.head_aware_kernel(head, x), x2, None, "features of x differ"),
             (ntk_tt.head_aware_kernel(other, x2), x2, None, "head weights differ"),
             (ntk_tt.head_aware_kernel(head, x2, x), x2, x2, "features of x_test differ")]
    for hk, inputs, x_test, match in cases:
        test = {} if x_test is None else dict(x_test=x_test, y_test=y)
        for how in (dict(learning_rate=0.3), dict(optimizer=_sgdw(0.3))):
            with pytest.raises(ValueError, match="built for other inputs or another head.*"
                               + match):
                ntk_tt.predict(apply_fn, params, inputs, y, head_kernel=hk, **how, **kw, **test)
    # an Adam kernel holds its labels' loss gradients (v̄): other labels were used silently
    adamw = ntk_tt.adamw(ntk_tt.warmup_cosine(1e-2, 3, 10), weight_decay=0.1)
    ak = ntk_tt.adam_head_aware_kernel(head, x2, y, adamw)
    y2 = (y + 1) % C
    for call in (lambda: ntk_tt.predict(apply_fn, params, x2, y2, head=head, head_kernel=ak,
                                        optimizer=adamw, steps=10),
                 lambda: ntk_tt.predict_head_aware(ak, y2, optimizer=adamw, steps=10),
                 lambda: ntk_tt.divergence_boundary(ak, y2, optimizer=adamw, momenta=[0.9],
                                                    learning_rates=[1e-3, 1e-2], steps=10),
                 lambda: ntk_tt.sensitivities(ak, y2, optimizer=adamw, steps=10)):
        with pytest.raises(ValueError, match="built for other labels y .*for these labels"):
            call()
    with pytest.raises(ValueError, match="AdamKernel serves optimizer=.*pass its .hk"):
        ntk_tt.predict(apply_fn, params, x2, y, head=head, head_kernel=ak, learning_rate=0.3,
                       steps=10)
    with pytest.raises(ValueError, match="features of x differ"):
        ntk_tt.suggest(apply_fn, params, x2, y, head=head, steps=10, target=0.5,
                       head_kernel=ntk_tt.head_aware_kernel(head, x))
    loss0 = optax.softmax_cross_entropy_with_integer_labels(apply_fn(params, x2), y).mean()
    reused = ntk_tt.predict(apply_fn, params, x2, y, head_kernel=ntk_tt.head_aware_kernel(
        head, x2), learning_rate=0.3, **kw)
    assert reused.loss[0] == pytest.approx(float(loss0), rel=1e-5)
    # a kernel of the wrong form says which condition failed (a fresh user's probe)
    for hk, test, why in ((ntk_tt.head_aware_kernel(head, x2, x), {}, "it has held-out "
                           "features but no x_test was given"),
                          (ntk_tt.head_aware_kernel(head, x2), dict(x_test=x, y_test=y),
                           "x_test was given but it has no held-out features"),
                          (ntk_tt.head_aware_kernel(head, x2[:16]), {},
                           "it has 16 training rows, x has 32")):
        with pytest.raises(ValueError, match=f"or None to build it: {why}\\.$"):
            ntk_tt.predict(apply_fn, params, x2, y, head_kernel=hk, learning_rate=0.3, **kw,
                           **test)



def test_a_reused_kernel_is_labelled_by_its_own_backbone():
    """A fresh user's probe: a Kronecker (or exact) head_kernel was used but the prediction was
    labelled head_aware:isotropic (predict's default backbone). The label now names the kernel
    used, and the curve is the one predict builds with that backbone."""
    kx, ky = jax.random.split(jax.random.key(0))
    x, y = jax.random.normal(kx, (32, 6)), jax.random.randint(ky, (32,), 0, C)
    model = TanhHeadNet(rngs=nnx.Rngs(0))
    apply_fn, params = ntk_tt.from_nnx(model)
    head = ntk_tt.split_head(model)
    for kind in ("kronecker", "exact", "isotropic"):
        hk = ntk_tt.head_aware_kernel(head, x, backbone=kind)
        for how in (dict(learning_rate=0.3), dict(optimizer=ntk_tt.sgd(
                ntk_tt.warmup_cosine(0.3, 3, 10), 0.9, weight_decay=0.05))):
            reused = ntk_tt.predict(apply_fn, params, x, y, head=head, head_kernel=hk, steps=10,
                                    **how)
            own = ntk_tt.predict(apply_fn, params, x, y, head=head, backbone=kind, steps=10,
                                 **how)
            assert reused.kernel == own.kernel == f"head_aware:{kind}"
            np.testing.assert_allclose(reused.loss, own.loss, rtol=1e-6)


def test_nesterov_without_momentum_is_refused_as_the_cli_refuses_it(monkeypatch, tmp_path):
    """A fresh user's probe: sgd(0.1, nesterov=True) (m = 0: plain GD) was accepted while
    ``ntk-tt predict --nesterov`` without -m is refused; now the same advice, at once. With
    m > 0 it is optax's Nesterov SGD (one update against optax.sgd)."""
    def refuse(**_):
        raise AssertionError("work started before the options were checked")

    monkeypatch.setattr("ntk_tt.prediction._job.load_task", refuse)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"^Nesterov needs momentum > 0: nesterov "):
        ntk_tt.predict_task(nesterov=True)  # the CLI's check
    for make in (lambda: ntk_tt.sgd(0.1, nesterov=True),
                 lambda: ntk_tt.sgd(ntk_tt.warmup_cosine(0.1, 2, 10), 0.0, nesterov=True)):
        with pytest.raises(ValueError, match=r"^Nesterov needs momentum > 0: sgd\(\.\.\., "
                                             r"nesterov=True\) with momentum 0 is plain \(S\)GD; "
                                             r"pass e\.g\. momentum=0\.9 or drop nesterov=True"):
            make()
    # the keyword forms too (a second fresh user: predict, finetune and predict_from_kernel
    # ran it silently as plain GD); a traced m = 0 (a sweep over momenta) is an INVALID entry,
    # NaN (a third: it was plain GD with code 0), the m > 0 entries beside it computed
    p, x, y = linear_problem(n=8, dtype=jnp.float32)
    theta, f0 = ntk_tt.empirical_ntk(linear_apply, p, x), linear_apply(p, x)
    for call in (lambda: ntk_tt.predict(linear_apply, p, x, y, learning_rate=0.1, steps=5,
                                        nesterov=True),
                 lambda: ntk_tt.finetune(linear_apply, p, x, y, learning_rate=0.1, steps=5,
                                         momentum=0.0, nesterov=True),
                 lambda: ntk_tt.predict_from_kernel(theta, f0, y, learning_rate=0.1, steps=5,
                                                    momentum=0.0, nesterov=True)):
        with pytest.raises(ValueError, match=r"^Nesterov needs momentum > 0: nesterov=True "
                                             r"with momentum 0 is plain gradient descent"):
            call()
    swept = jax.vmap(lambda m: ntk_tt.predict_from_kernel(
        theta, f0, y, learning_rate=0.1, steps=5, momentum=m, nesterov=True).loss)(
        jnp.array([0.0, 0.5]))
    assert np.isnan(np.asarray(swept[0])).all() and np.isfinite(np.asarray(swept[1])).all()
    grads, params = {"w": jnp.array([1.0, -2.0])}, {"w": jnp.zeros(2)}
    ours, ref = ntk_tt.sgd(0.1, 0.5, nesterov=True).to_optax(), optax.sgd(0.1, 0.5, nesterov=True)
    np.testing.assert_allclose(ours.update(grads, ours.init(params), params)[0]["w"],
                               ref.update(grads, ref.init(params), params)[0]["w"], rtol=1e-7)


def test_adam_with_l2_decay_is_refused_by_predict_and_trained_by_finetune(monkeypatch):
    """One rule for Adam with L2 decay in its moments (``adam(..., weight_decay=)``), as
    ``ntk-tt predict --optimizer adam --weight-decay`` refuses it: ``predict`` refuses it
    (pointing to adamw and linearised_reference) before any kernel is built, head or not;
    ``finetune`` runs it, equal to optax.adam on the loss plus λ/2·‖θ‖² (a hand-written
    full-batch loop)."""
    from ntk_tt.prediction import _predict_optimizer

    def no_kernel(*a, **k):
        raise AssertionError("a kernel was built before the refusal")

    monkeypatch.setattr(_predict_optimizer, "head_aware_kernel", no_kernel)
    monkeypatch.setattr(_predict_optimizer, "adam_head_aware_kernel", no_kernel)
    kx, ky = jax.random.split(jax.random.key(0))
    x, y = jax.random.normal(kx, (N, 6)), jax.random.randint(ky, (N,), 0, C)
    model = TanhHeadNet(rngs=nnx.Rngs(0))
    apply_fn, params = ntk_tt.from_nnx(model)
    lr, lam, steps = 1e-2, 0.1, 5
    opt = ntk_tt.adam(lr, weight_decay=lam)
    with pytest.raises(ValueError, match=r"needs decoupled weight decay.*use ntk_tt\.adamw"
                                         r"\(\.\.\.\), or ntk_tt\.linearised_reference for L2"):
        ntk_tt.predict(apply_fn, params, x, y, optimizer=opt, steps=steps,
                       head=ntk_tt.split_head(model))
    with pytest.raises(ValueError, match=r"linearised_reference"):
        ntk_tt.predict(apply_fn, params, x, y, optimizer=opt, steps=steps)
    run = ntk_tt.finetune(apply_fn, params, x, y, optimizer=opt, steps=steps)

    def loss(p):
        return ntk_tt.mean_loss(apply_fn(p, x), y, "cross_entropy")

    def penalised(p):
        return loss(p) + 0.5 * lam * sum(jnp.sum(v ** 2) for v in jax.tree.leaves(p))

    ref, p = optax.adam(lr), params
    state, curve = ref.init(p), [float(loss(p))]
    for _ in range(steps):
        updates, state = ref.update(jax.grad(penalised)(p), state, p)
        p = optax.apply_updates(p, updates)
        curve.append(float(loss(p)))
    np.testing.assert_allclose(run.loss, curve, rtol=2e-5)
    assert curve[0] - curve[-1] > 0.01 * curve[0]  # it trained


def test_schedule_names_its_argument_and_the_accepted_forms():
    """A fresh user's probe: schedule("abc") said "learning_rate must be a real number";
    schedule's argument is named and the accepted forms listed; sgd's keeps its name."""
    forms = (r"must be a number \(a constant η\), a schedule \(ntk_tt\.warmup_cosine\(\.\.\.\), "
             r"any optax schedule\) or a callable step -> η, got ")
    for bad, shown in (("abc", "'abc'"), (None, "None"), (True, "True")):
        with pytest.raises(ValueError, match=r"^schedule's value " + forms + shown):
            ntk_tt.schedule(bad)
    with pytest.raises(ValueError, match=r"^learning_rate " + forms + "'abc'"):
        ntk_tt.sgd("abc")
    with pytest.raises(ValueError, match=r"array of shape \(2,\); per-step values v: lambda t: "
                                         r"v\.at\[t\]\.get\(mode='fill', fill_value=jnp\.nan\)"):
        ntk_tt.schedule([0.1, 0.2])
    np.testing.assert_allclose(ntk_tt.schedule(0.3).values(3), [0.3] * 3, rtol=1e-7)


@pytest.mark.parametrize("build, name", [
    (lambda v: ntk_tt.warmup_cosine(v, 5, 30), "peak"),
    (lambda v: ntk_tt.warmup_cosine(0.1, v * 50, 30), "warmup"),
    (lambda v: ntk_tt.warmup_stable_decay(0.1, 2, 20, 30, end=v * 0.1), "end"),
    (lambda v: ntk_tt.exponential(0.1, v + 0.5), "rate"),
    (ntk_tt.constant, "learning_rate"),
    (lambda v: ntk_tt.sgd(0.1, weight_decay=v), "weight_decay"),
    (lambda v: ntk_tt.sgd(0.1, momentum=v), "momentum"),
    (lambda v: ntk_tt.adamw(0.1, b1=v), "b1"),
    (lambda v: ntk_tt.adamw(0.1, b2=v + 0.5), "b2"),
])
def test_an_array_for_one_number_is_refused_naming_it(build, name):
    """A fresh user: warmup_cosine(jnp.array([0.1, 0.2]), 5, 30), sgd(0.1, weight_decay=array)
    and adamw(b1=array) were accepted and failed deep in the predictor ("The truth value of an
    array ... is ambiguous", broadcasting errors), also under jit; now the constructor names
    the argument and the way to sweep it, and the vmap that message advises works."""
    v = jnp.array([0.1, 0.2])
    said = (rf"^{name} must be a scalar, got shape \(2,\); to sweep it, build the schedule or "
            r"optimizer inside a function of one value and jax\.vmap that over the values\.")
    with pytest.raises(ValueError, match=said + "$"):
        build(v)
    with pytest.raises(ValueError, match=said):  # a traced (2,) array under jit: its shape
        jax.jit(build)(v)
    leaves = jax.vmap(lambda a: jax.tree.leaves(build(a)))(v)
    assert any(np.shape(leaf) == (2,) for leaf in leaves)


def test_the_suggested_per_step_idiom_refuses_too_few_values():
    """A fresh user: the message's idiom was lambda t: jnp.asarray(values)[t], which JAX clamps
    past the end, so 15 values for 20 steps ran on at the last value (κ 10× too large, every
    T_ε NaN) without a word. The idiom now suggested gives NaN past the end, which predict and
    finetune refuse by step, before any work; enough values give exactly those η_t."""
    v = jnp.linspace(0.1, 0.2, 15)
    opt = ntk_tt.sgd(lambda t: v.at[t].get(mode="fill", fill_value=jnp.nan))
    np.testing.assert_array_equal(opt.learning_rates(15), v)
    kernel, f0, y = 2.0 * jnp.eye(6), jnp.zeros((6, 3)), jnp.arange(6) % 3
    said = (r"got η_15 = nan \(per-step values indexed with mode='fill' give NaN past their "
            r"end: then give at least 20 values, or fewer steps\)")
    with pytest.raises(ValueError, match=said):
        ntk_tt.predict_from_kernel(kernel, f0, y, optimizer=opt, steps=20)
    with pytest.raises(ValueError, match=said):
        ntk_tt.finetune(lambda p, x: x @ p, jnp.zeros((4, 3)), jnp.ones((6, 4)), y,
                        optimizer=opt, steps=20)
    assert ntk_tt.predict_from_kernel(kernel, f0, y, optimizer=opt, steps=15).kappa > 0


def test_an_optimizer_object_given_to_the_cli_jobs_says_where_it_belongs(monkeypatch, tmp_path):
    """A fresh user's probe: predict_task(optimizer=ntk_tt.sgd(0.1)) dumped the object's repr
    as the "got" of "must be one of ('sgd', 'adam', 'adamw')"; the CLI jobs take its name
    and flags, and the message now says so and where the object goes — before any work."""
    monkeypatch.setattr("ntk_tt.prediction._job.load_task",
                        lambda **_: pytest.fail("work started before the options were checked"))
    monkeypatch.chdir(tmp_path)
    for job in (ntk_tt.predict_task, ntk_tt.suggest_task):
        with pytest.raises(ValueError) as err:
            job(optimizer=ntk_tt.adamw(1e-3))
        assert "got an ntk_tt.Optimizer (adam): predict_task and suggest_task take the CLI's " \
               "values" in str(err.value) and "Optimizer(" not in str(err.value), job
