"""predict_from_kernel / predict_head_aware(optimizer=) under jit, vmap and grad (issue 27
item 1): an optimizer whose hyperparameters are traced (a schedule's peak and warmup, m, β₁,
β₂, λ) gives, entry by entry, the eager call's prediction (itself tested against optax
training of the linearised model), its gradient matches central differences of eager calls,
an invalid traced entry is NaN with code INVALID (not a divergence), and what cannot be
traced is refused with one clear error."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _ntk_models import labelled_mlp, mlp_problem, mlp_split_problem

import ntk_tt

N, NT, C, T = 16, 6, 3, 30


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def _plain():
    """Θ, f0, y and the held-out and weight-decay arguments in one dict."""
    kernel, f0, y, held, tangents = mlp_problem(N, NT, C)
    return kernel, f0, y, held | tangents


def _split():
    split, x, y, xt, yt, tangents = mlp_split_problem(N, NT, C)
    return split, x, y, xt, dict(y_test=yt, **tangents)


FIELDS = ("loss", "error", "test_loss", "test_error", "kappa", "loss_band")


def _same(swept, i, eager):
    """Entry ``i`` of a vmapped KernelPrediction against the eager one."""
    for name in FIELDS:
        if getattr(eager, name) is None:  # full batch: no band; no held-out data
            assert getattr(swept, name) is None, name
            continue
        np.testing.assert_allclose(np.asarray(getattr(swept, name)[i]),
                                   np.asarray(getattr(eager, name)), rtol=1e-9, atol=1e-12,
                                   err_msg=name)
    np.testing.assert_array_equal(swept.training_time[i], eager.training_time)
    np.testing.assert_array_equal(swept.training_time_code[i], eager.training_time_code)
    for name in ("diverged", "outcome", "beyond_edge", "spiked_at"):
        assert int(getattr(swept, name)[i]) == int(getattr(eager, name)), name


def test_frozen_kernel_sgdw_schedule_sweep_is_the_eager_calls():
    """jit(vmap) over a warmup-cosine peak, m and a decoupled λ (B = 4, two batch orders,
    held-out data): every entry equals predict_from_kernel called eagerly with those
    numbers; the peaks straddle the stability edge."""
    kernel, f0, y, extra = _plain()
    key = jax.random.key(5)

    def run(peak, m, wd):
        opt = ntk_tt.sgd(ntk_tt.warmup_cosine(peak, 5, T, init=0.1 * peak), m,
                         weight_decay=wd, batch_size=4)
        return ntk_tt.predict_from_kernel(kernel, f0, y, optimizer=opt, steps=T, key=key,
                                          num_paths=2, **extra)

    peaks, ms, wds = [0.05, 0.5, 0.5, 40.0], [0.0, 0.5, 0.9, 0.9], [0.0, 0.05, 0.3, 0.05]
    swept = jax.jit(jax.vmap(run))(jnp.array(peaks), jnp.array(ms), jnp.array(wds))
    for i, args in enumerate(zip(peaks, ms, wds, strict=True)):
        _same(swept, i, run(*args))
    assert bool(swept.beyond_edge[3]) and not np.asarray(swept.beyond_edge[:3]).any()


def test_a_callable_schedule_closing_over_a_vmapped_array_is_the_eager_calls():
    """A fresh user vmapped over README's per-step schedule, ``ntk_tt.schedule(lambda t:
    v.at[t].get(mode='fill', fill_value=nan))`` with v traced: the optimizer's leaves are
    concrete, so the eager checks ran and JAX raised TracerArrayConversionError. Such a
    schedule now counts as traced: every entry equals the eager call with that v (a
    closure over a traced scalar too)."""
    kernel, f0, y, extra = _plain()
    key = jax.random.key(5)

    def per_step(v):
        opt = ntk_tt.sgd(ntk_tt.schedule(
            lambda t: v.at[t].get(mode="fill", fill_value=jnp.nan)), 0.5, batch_size=4)
        return ntk_tt.predict_from_kernel(kernel, f0, y, optimizer=opt, steps=T, key=key,
                                          num_paths=2, **extra)

    rates = jnp.stack([jnp.linspace(0.5, 0.05, T), jnp.full(T, 0.2), jnp.full(T, 40.0)])
    swept = jax.vmap(per_step)(rates)
    for i in range(len(rates)):
        _same(swept, i, per_step(rates[i]))

    def decaying(peak):
        opt = ntk_tt.sgd(ntk_tt.schedule(lambda t: peak * 0.95 ** t), 0.0)
        return ntk_tt.predict_from_kernel(kernel, f0, y, optimizer=opt, steps=T, **extra)

    peaks = jnp.array([0.1, 0.8])
    swept = jax.vmap(decaying)(peaks)
    for i in range(len(peaks)):
        _same(swept, i, decaying(peaks[i]))


def test_head_aware_sgd_and_adamw_sweeps_are_the_eager_calls():
    """Head-aware Nesterov SGD with L2 decay (vmap over peak and m) and AdamW on its
    AdamKernel (vmap over peak, β₁, β₂ and λ): every entry equals the eager call."""
    split, x, y, xt, extra = _split()
    hk = ntk_tt.head_aware_kernel(split, x, xt)
    key = jax.random.key(2)

    def sgd(peak, m):
        opt = ntk_tt.sgd(ntk_tt.warmup_cosine(peak, 4, T), m, nesterov=True, weight_decay=0.05,
                         decoupled=False, batch_size=4)
        return ntk_tt.predict_head_aware(hk, y, optimizer=opt, steps=T, key=key, num_paths=2,
                                         **extra)

    peaks, ms = [0.05, 0.5, 2.0], [0.3, 0.8, 0.5]
    swept = jax.jit(jax.vmap(sgd))(jnp.array(peaks), jnp.array(ms))
    for i, args in enumerate(zip(peaks, ms, strict=True)):
        _same(swept, i, sgd(*args))

    template = ntk_tt.adamw(ntk_tt.warmup_cosine(1e-2, 3, T), 0.9, 0.99, weight_decay=0.1)
    ak = ntk_tt.adam_head_aware_kernel(split, x, y, template, xt, hk=hk)

    def adamw(peak, b1, b2, wd):
        opt = ntk_tt.adamw(ntk_tt.warmup_cosine(peak, 3, T), b1, b2, weight_decay=wd)
        return ntk_tt.predict_head_aware(ak, y, optimizer=opt, steps=T, **extra)

    grid = ([1e-3, 1e-2, 3e-2], [0.9, 0.0, 0.5], [0.99, 0.999, 0.9], [0.1, 0.0, 0.01])
    swept = jax.jit(jax.vmap(adamw))(*map(jnp.array, grid))
    for i, args in enumerate(zip(*grid, strict=True)):
        _same(swept, i, adamw(*args))
    assert float(swept.loss[1, -1]) < 0.9 * float(swept.loss[1, 0])


@pytest.mark.parametrize("head_aware", [False, True])
def test_gradients_match_central_differences(head_aware):
    """d L_T / d(peak), d(warmup) (smoothing 2 steps), d(m) and d(λ) of a warmup-cosine SGDW
    prediction, by jax.grad, against central differences of eager calls."""
    if head_aware:
        split, x, y, _, extra = _split()
        hk = ntk_tt.head_aware_kernel(split, x)
        extra = dict(a_h=extra["a_h"])

        def final(peak, warmup, m, wd):
            return ntk_tt.predict_head_aware(hk, y, optimizer=_sgdw(peak, warmup, m, wd),
                                             steps=T, **extra).loss[-1]
    else:
        kernel, f0, y, extra = _plain()

        def final(peak, warmup, m, wd):
            return ntk_tt.predict_from_kernel(kernel, f0, y, optimizer=_sgdw(peak, warmup, m,
                                                                            wd),
                                              steps=T, a=extra["a"]).loss[-1]

    point = (0.4, 6.0, 0.5, 0.05)
    grads = jax.grad(final, argnums=(0, 1, 2, 3))(*point)
    for i, g in enumerate(grads):
        h = 1e-5 * max(1.0, abs(point[i]))
        up, down = list(point), list(point)
        up[i] += h
        down[i] -= h
        fd = (float(final(*up)) - float(final(*down))) / (2 * h)
        np.testing.assert_allclose(float(g), fd, rtol=1e-5, atol=1e-9, err_msg=f"argument {i}")
    assert abs(float(grads[0])) > 1e-3 and abs(float(grads[1])) > 1e-5


def _sgdw(peak, warmup, m, wd):
    return ntk_tt.sgd(ntk_tt.warmup_cosine(peak, warmup, T, smoothing=2.0), m, weight_decay=wd)


def test_invalid_traced_entries_are_nan_and_invalid_not_diverged():
    """Entries the eager checks refuse (peak −1 or NaN, m = 1, λ < 0; AdamW β₂ = 1) come back
    NaN with code INVALID, outcome 'unknown' (3) and diverged False; the valid entry of the
    same sweep equals its eager call."""
    kernel, f0, y, extra = _plain()

    def run(peak, m, wd):
        opt = ntk_tt.sgd(ntk_tt.warmup_cosine(peak, 5, T), m, weight_decay=wd)
        return ntk_tt.predict_from_kernel(kernel, f0, y, optimizer=opt, steps=T, a=extra["a"])

    peaks = jnp.array([0.5, -1.0, jnp.nan, 0.5, 0.5])
    ms, wds = jnp.array([0.5, 0.5, 0.5, 1.0, 0.0]), jnp.array([0.05, 0.05, 0.05, 0.0, -0.1])
    swept = jax.jit(jax.vmap(run))(peaks, ms, wds)
    _same(swept, 0, run(0.5, 0.5, 0.05))
    for i in range(1, 5):
        assert np.isnan(np.asarray(swept.loss[i])).all() and np.isnan(float(swept.kappa[i]))
        assert (np.asarray(swept.training_time_code[i]) == ntk_tt.INVALID).all()
        assert int(swept.outcome[i]) == 3 and not bool(swept.diverged[i])
        assert ntk_tt.OUTCOMES[int(swept.outcome[i])] == "unknown"  # the public names
        assert "jit / vmap" in ntk_tt.REASONS[int(swept.training_time_code[i, 0, 0])]
    split, x, y, _, _ = _split()
    template = ntk_tt.adamw(1e-2, weight_decay=0.0)
    ak = ntk_tt.adam_head_aware_kernel(split, x, y, template)
    swept = jax.vmap(lambda b2: ntk_tt.predict_head_aware(
        ak, y, optimizer=ntk_tt.adamw(1e-2, 0.9, b2, weight_decay=0.0), steps=T))(
        jnp.array([0.999, 1.0]))
    assert np.isfinite(np.asarray(swept.loss[0])).all()
    assert np.isnan(np.asarray(swept.loss[1])).all() and int(swept.outcome[1]) == 3


def test_invalid_traced_schedule_shapes_are_invalid_too():
    """A fresh user's probe: traced warmups of −1, T or more, a decay_steps below the warmup
    and an init above the peak gave finite curves with code 0, though each is refused
    eagerly; they are now INVALID (NaN), for both predictors, the valid entry unchanged."""
    kernel, f0, y, _ = _plain()
    split, x, _, _, _ = _split()
    hk = ntk_tt.head_aware_kernel(split, x)

    def sched(warmup, decay, init):
        return ntk_tt.sgd(ntk_tt.warmup_cosine(0.5, warmup, decay, init=init))

    cases = jnp.array([[5.0, T, 0.0], [-1.0, T, 0.0], [T, T, 0.0], [35.0, 40.0, 0.0],
                       [5.0, 3.0, 0.0], [5.0, T, 0.6]])
    for eager in ((5.0, T, 0.6), (5.0, 3.0, 0.0), (-1.0, T, 0.0)):
        with pytest.raises(ValueError):
            sched(*eager)
    for run in (lambda w, d, i: ntk_tt.predict_from_kernel(kernel, f0, y, steps=T,
                                                          optimizer=sched(w, d, i)),
                lambda w, d, i: ntk_tt.predict_head_aware(hk, y, steps=T,
                                                          optimizer=sched(w, d, i))):
        swept = jax.jit(jax.vmap(run))(*cases.T)
        _same(swept, 0, run(5.0, T, 0.0))
        for i in range(1, len(cases)):
            assert (np.asarray(swept.training_time_code[i]) == ntk_tt.INVALID).all(), i
            assert np.isnan(np.asarray(swept.loss[i])).all(), i
    with pytest.raises(ValueError, match="warmup is 30 steps"):
        run(float(T), float(T), 0.0)


def test_what_cannot_be_traced_is_one_clear_error():
    """A traced optimizer with a schedule and a continuous method (a constant one takes the
    constant-η keywords' path, which traces), a traced Adam ε (built into the
    AdamKernel), and a traced optimizer passed to ntk_tt.predict (which checks the schedule
    eagerly) are each refused with a ValueError naming the way out."""
    kernel, f0, y, _ = _plain()
    with pytest.raises(ValueError, match="traced hyperparameters .*method='discrete'"):
        jax.vmap(lambda p: ntk_tt.predict_from_kernel(
            kernel, f0, y, optimizer=ntk_tt.sgd(ntk_tt.warmup_cosine(p, 5, T)), steps=T,
            method="ode", loss="mse").loss)(jnp.array([0.1, 0.2]))
    split, x, y, _, _ = _split()
    ak = ntk_tt.adam_head_aware_kernel(split, x, y, ntk_tt.adamw(1e-2, weight_decay=0.0))
    with pytest.raises(ValueError, match="ε is built into the AdamKernel"):
        jax.vmap(lambda e: ntk_tt.predict_head_aware(
            ak, y, optimizer=ntk_tt.adamw(1e-2, eps=e, weight_decay=0.0), steps=T).loss)(
            jnp.array([1e-8, 1e-6]))
    (apply_fn, params, x, y, _, _), _ = labelled_mlp(N, NT, C)
    with pytest.raises(ValueError, match="traced hyperparameters .*predict_from_kernel"):
        jax.vmap(lambda p: ntk_tt.predict(apply_fn, params, x, y, optimizer=ntk_tt.sgd(p),
                                          steps=T).loss)(jnp.array([0.1, 0.2]))
    kernel, f0, y, _ = _plain()  # B and T fix the recursion's shapes (a fresh user vmapped B
    for name, values in (("batch_size", [2, 4]), ("steps", [5, 10])):  # and was told 1 <= B <= N)
        with pytest.raises(ValueError, match=f"^{name} cannot be traced \\(jit / vmap / grad"):
            jax.vmap(lambda v, name=name: ntk_tt.predict_from_kernel(
                kernel, f0, y, learning_rate=0.1, key=jax.random.key(0),
                **{"steps": T, "batch_size": None} | {name: v}).loss)(jnp.array(values))


def test_an_optimizer_passed_into_jit_says_why_it_needs_the_tangent():
    """A fresh user's probe: jit(lambda o: predict_from_kernel(..., optimizer=o))(sgd(...))
    traces weight_decay = 0 too, and was told 'or use weight_decay=0'; the message now says
    the λ is traced and how to keep it concrete, which works."""
    kernel, f0, y, extra = _plain()
    opt = ntk_tt.sgd(ntk_tt.warmup_cosine(0.5, 5, T))
    with pytest.raises(ValueError, match="weight_decay is traced .*build the optimizer inside"):
        jax.jit(lambda o: ntk_tt.predict_from_kernel(kernel, f0, y, optimizer=o,
                                                     steps=T).loss)(opt)
    inside = jax.jit(lambda p: ntk_tt.predict_from_kernel(
        kernel, f0, y, optimizer=ntk_tt.sgd(ntk_tt.warmup_cosine(p, 5, T)), steps=T).loss)
    with_a = jax.jit(lambda o: ntk_tt.predict_from_kernel(kernel, f0, y, optimizer=o, steps=T,
                                                          a=extra["a"]).loss)
    eager = ntk_tt.predict_from_kernel(kernel, f0, y, optimizer=opt, steps=T).loss
    np.testing.assert_allclose(inside(0.5), eager, rtol=1e-9)
    np.testing.assert_allclose(with_a(opt), eager, rtol=1e-9)


@pytest.mark.parametrize("method", ["discrete", "ode"])
def test_a_concrete_schedule_inside_jit_over_the_kernel_is_the_eager_call(method):
    """A helper's probe: jit over the kernel (or anything else) with a concrete scheduled
    optimizer raised JAX's TracerArrayConversionError: the schedule's values, computed by a
    nested jit, came back traced to the eager checks. A schedule of concrete numbers (and a
    callable one) now stays concrete; the jitted prediction equals the eager one."""
    kernel, f0, y, _ = _plain()
    for sched in (ntk_tt.warmup_cosine(0.05, 3, T, end=0.005),
                  ntk_tt.schedule(lambda t: 0.05 * 0.97 ** t)):
        opt = ntk_tt.sgd(sched, 0.5)
        eager = ntk_tt.predict_from_kernel(kernel, f0, y, optimizer=opt, steps=T,
                                           method=method)
        jitted = jax.jit(lambda k, o=opt: ntk_tt.predict_from_kernel(
            k, f0, y, optimizer=o, steps=T, method=method).loss)(kernel)
        np.testing.assert_allclose(np.asarray(jitted), np.asarray(eager.loss), rtol=1e-9)
        assert eager.loss[-1] < 0.9 * eager.loss[0]  # it trained
