"""T_ε on hand-built curves, the smooth version, gradients vs finite differences, wall clock."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _dynamics_helpers import brute_ntk, linear_apply, linear_problem

import ntk_tt
from ntk_tt.dynamics._training_time import NOT_DECREASING, REASONS


def _exp_answer(eps, tau=10.0, steps=100):
    """First integer t with e^(−t/τ) − e^(−T/τ) ≤ ε (1 − e^(−T/τ)), solved by hand."""
    floor = np.exp(-steps / tau)
    return float(np.ceil(-tau * np.log(eps * (1 - floor) + floor)))


@pytest.mark.parametrize("eps", [0.01, 0.1, 0.4])
def test_exponential_decay_without_smoothing(eps):
    curve = np.exp(-np.arange(101) / 10.0)
    assert ntk_tt.training_time(curve, eps, window=1) == _exp_answer(eps)


@pytest.mark.parametrize("eps, expected", [(0.39, 31.0), (0.13, 44.0), (0.01, 51.0)])
def test_ramp_then_plateau_with_smoothing(eps, expected):
    # L_t = 1 − t/100 up to t = 50, then 0.5: L_T = 0.5, drop 0.5. The centred 5-step average
    # is exact on the ramp; at the kink L̃_49 = 0.512, L̃_50 = 0.506, L̃_51 = 0.502 (by hand).
    t = np.arange(101)
    curve = np.where(t <= 50, 1 - t / 100, 0.5)
    assert ntk_tt.training_time(curve, eps) == expected


def test_noisy_curve_is_close_to_the_noiseless_answer():
    rng = np.random.default_rng(0)
    curve = np.exp(-np.arange(101) / 10.0) + 0.01 * rng.standard_normal(101)
    for eps in (0.1, 0.4):
        assert abs(ntk_tt.training_time(curve, eps) - _exp_answer(eps)) <= 3


def test_a_spike_training_recovers_from_leaves_t_eps_defined():
    """A catapult at step 3 (3× L_0) far from the crossing: T_ε is that of the same curve
    without the spike (a fresh user's finding: the spike inflated the noise estimate, so the
    curve counted as flat: NaN, "not clearly positive", though L_T is 1 % of L_0)."""
    tail = np.geomspace(0.5, 0.01, 26)
    spiky = np.concatenate([[1.0, 0.8, 0.9, 3.0, 1.0], tail])
    calm = np.concatenate([[1.0, 0.8, 0.9, 0.95, 1.0], tail])
    for eps in (0.1, 0.4):
        value, reason = ntk_tt.training_time_report(spiky, eps)
        assert reason is None and value == ntk_tt.training_time(calm, eps)
        assert value == ntk_tt.training_time(spiky, eps, window=1)  # no smoothing, no floor


@pytest.mark.parametrize("kind", ["constant", "noisy_flat", "rising"])
def test_flat_or_rising_curves_are_undefined_never_zero(kind):
    rng = np.random.default_rng(1)
    t = np.arange(151)
    curve = {"constant": np.ones(151), "noisy_flat": 1 + 0.05 * rng.standard_normal(151),
             "rising": 1 + t / 150}[kind]
    value, reason = ntk_tt.training_time_report(curve, 0.1)
    assert np.isnan(value) and reason == REASONS[NOT_DECREASING]
    assert np.isnan(ntk_tt.training_time(curve, 0.4))


def _old_smooth(curve, eps, tau, window=5):
    """The smooth T_ε formula written out in numpy (float64), independent of the module:
    Σ_t Π_{s≤t} σ((|L̃_s − L_T| − ε·drop) / (τ·ε·drop)), L̃ the centred moving average."""
    curve = np.asarray(curve, np.float64)
    last, h = len(curve) - 1, window // 2
    sm = np.array([curve[t - min(h, t, last - t): t + min(h, t, last - t) + 1].mean()
                   for t in range(len(curve))])
    l_t = sm[-window:].mean()
    drop = curve[0] - l_t
    z = (np.abs(sm - l_t) - eps * drop) / (tau * eps * drop)
    return float(np.sum(np.cumprod(1.0 / (1.0 + np.exp(-z)))))


@pytest.mark.parametrize("curve", [
    np.full(50, 2.0),                                         # the fresh user's flat curve
    np.concatenate([np.linspace(2.0, 1.0, 20), np.linspace(1.0, 2.0, 20),
                    np.full(10, 2.0)]),                      # dips, back to L_T = L_0
    np.linspace(1.0, 2.0, 50),                                # rising: was a "perfect" 0
    2.0 + 0.01 * np.random.default_rng(0).standard_normal(50),  # noisy flat: was 0 too
])
def test_smooth_training_time_is_nan_where_the_hard_one_is_flat_or_rising(curve):
    """A fresh user's probe: on a flat curve training_time is NaN (reason "flat or rising")
    but smooth_training_time gave NaN from 0/0 on an exactly flat curve (and a NaN gradient)
    and ~0 steps, the best possible time, on a rising or noisy flat one. Both are now NaN
    there, the smooth one with a zero (finite) gradient, also under jit."""
    import warnings

    t, why = ntk_tt.training_time_report(curve, 0.1)
    assert np.isnan(t) and why == REASONS[NOT_DECREASING]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # silent, as training_time on a flat curve
        assert np.isnan(float(ntk_tt.smooth_training_time(curve, 0.1)))
        assert np.isnan(float(jax.jit(ntk_tt.smooth_training_time)(curve, 0.1)))
        grad = jax.grad(ntk_tt.smooth_training_time)(jnp.asarray(curve), 0.1)
    np.testing.assert_array_equal(grad, np.zeros(len(curve)))


def test_smooth_training_time_is_unchanged_where_the_curve_falls():
    """Falling curves (T_ε defined, or never settling) keep the formula's value: the module
    against the same formula in numpy; a curve with a NaN is NaN."""
    rng = np.random.default_rng(2)
    t = np.arange(101)
    curves = [np.exp(-t / 10.0), np.where(t <= 50, 1 - t / 100, 0.5),
              np.exp(-t / 10.0) + 0.01 * rng.standard_normal(101),
              np.concatenate([np.linspace(2.0, 1.0, 25), np.linspace(1.0, 1.9, 25)])]
    with jax.enable_x64(True):
        for curve in curves:
            for eps, tau in ((0.1, 0.05), (0.4, 0.3), (0.01, 0.02)):
                got = float(ntk_tt.smooth_training_time(jnp.asarray(curve), eps,
                                                        temperature=tau))
                np.testing.assert_allclose(got, _old_smooth(curve, eps, tau), rtol=1e-9)
        assert np.isnan(float(ntk_tt.smooth_training_time(
            np.array([1.0, 0.5, np.nan, 0.2, 0.1, 0.1, 0.1]), 0.1)))


def test_smooth_training_time_of_a_diverged_curve_is_nan_with_gradient_zero():
    """A fresh user: a curve with a NaN or inf entry, or a held diverged one (finite but
    rising to 1e36, whose moving average overflows), gave the documented NaN value but a NaN
    gradient, so a jax.grad over a sweep with one diverged learning rate was NaN however it
    was filtered. Now the gradient is 0 there, also under vmap beside a falling curve, whose
    gradient is the same as alone."""
    falling = jnp.exp(-jnp.arange(50) / 10.0)
    diverged = [falling.at[3].set(jnp.nan), falling.at[3].set(jnp.inf),
                jnp.minimum(10.0 ** jnp.arange(50), 1.4e36)]
    grad = jax.grad(ntk_tt.smooth_training_time)
    for curve in diverged:
        assert np.isnan(float(ntk_tt.smooth_training_time(curve, 0.1)))
        np.testing.assert_array_equal(grad(curve, 0.1), np.zeros(50))
    both = jnp.stack([falling, diverged[-1]])
    total = jax.grad(lambda c: jnp.nansum(jax.vmap(ntk_tt.smooth_training_time, (0, None))(
        c, 0.1)))(both)
    alone = grad(falling, 0.1)
    np.testing.assert_allclose(total[0], alone, atol=1e-5 * float(jnp.abs(alone).max()))
    assert not np.asarray(total[1]).any() and np.asarray(total[0]).any()


def test_the_array_forms_refuse_a_window_the_eager_ones_refuse():
    """A fresh user: training_time_array and steps_to_target_array took window 0, an even
    width or one longer than the curve (static arguments) and returned a wrong time with
    code 0 (T_ε 13 or 15 steps for the true 23), and an empty curve failed with an
    IndexError inside JAX. Now each is the eager functions' ValueError, under jit too."""
    curve = jnp.exp(-jnp.arange(50) / 10.0)
    assert float(ntk_tt.training_time_array(curve, 0.1)[0]) == ntk_tt.training_time(
        curve, 0.1) == 23.0
    for window in (0, 4, 51, True):
        for fn, arg in ((ntk_tt.training_time_array, 0.1), (ntk_tt.steps_to_target_array, 0.5)):
            with pytest.raises(ValueError, match=r"window must be an odd int in "
                                                 r"\[1, len\(curve\)\] = \[1, 50\]"):
                jax.jit(fn, static_argnames="window")(curve, arg, window=window)
    with pytest.raises(ValueError, match="1-D curve with >= 1 entry"):
        ntk_tt.training_time_array(curve[:0], 0.1)
    # a second probe: complex input had its imaginary part dropped (a defined code 0) or
    # failed inside jnp.quantile
    wavy = curve.astype(jnp.complex64) + 0.5j
    for call in (lambda: ntk_tt.training_time_array(wavy, 0.1),
                 lambda: ntk_tt.training_time_array(curve, 0.1 + 0.5j),
                 lambda: ntk_tt.steps_to_target_array(curve, 0.5 + 1j),
                 lambda: ntk_tt.steps_to_target_array(wavy, 0.5),
                 lambda: ntk_tt.smooth_training_time(wavy, 0.1)):
        with pytest.raises(ValueError, match="must be real numbers, got the complex dtype"):
            call()


@pytest.mark.parametrize("temperature", [-1.0, 0.0, float("nan"), float("inf"), [0.1, 0.2]])
def test_smooth_training_time_refuses_a_temperature_that_is_not_positive(temperature):
    """A negative τ gave 1.2e-4 steps for a T_ε of 23 (every factor flipped); 0 gave the
    hard value silently while sensitivities refuses it. Concrete values are now checked."""
    with pytest.raises(ValueError, match="temperature must be one finite number > 0"):
        ntk_tt.smooth_training_time(jnp.exp(-jnp.arange(50) / 10.0), 0.1,
                                    temperature=temperature)


def test_a_traced_temperature_that_is_not_positive_is_nan_with_gradient_zero():
    """A fresh user: jit over τ = −1 gave 1.2e-4 steps silently (the eager call refuses it);
    now a traced τ ≤ 0, NaN or inf is NaN, as a traced ε outside (0, 1) is, with gradient 0,
    and a valid τ beside it in the same vmap keeps its eager value."""
    curve = jnp.exp(-jnp.arange(31.0) / 5)
    soft = jax.jit(jax.vmap(lambda t: ntk_tt.smooth_training_time(curve, 0.1, temperature=t)))
    got = soft(jnp.array([-1.0, 0.0, jnp.nan, jnp.inf, 0.05]))
    assert np.isnan(np.asarray(got[:4])).all()
    np.testing.assert_allclose(got[4], ntk_tt.smooth_training_time(curve, 0.1), rtol=1e-6)
    grad = jax.grad(lambda t, c: ntk_tt.smooth_training_time(c, 0.1, temperature=t), (0, 1))
    for tau in (-1.0, 0.0):
        d_tau, d_curve = grad(tau, curve)
        assert float(d_tau) == 0.0 and not np.asarray(d_curve).any()


def test_a_traced_epsilon_outside_the_unit_interval_is_nan_as_the_hard_code_says():
    """A fresh user: vmapped over ε, smooth_training_time gave 50, 0.57, 0.03 and 9e-27 for
    ε = 0, 1, 1.2, −0.5 (eagerly refused), where training_time_array says NaN, INVALID. Now
    NaN there, the valid entry the eager value, and the gradient there 0, not NaN."""
    curve = jnp.exp(-jnp.arange(50) / 10.0) + 0.1
    eps = jnp.array([0.1, 0.0, 1.0, 1.2, -0.5])
    soft = jax.vmap(ntk_tt.smooth_training_time, (None, 0))(curve, eps)
    _, codes = jax.vmap(ntk_tt.training_time_array, (None, 0))(curve, eps)
    assert np.array_equal(np.isnan(soft), np.asarray(codes) == ntk_tt.INVALID)
    assert np.isnan(soft[1:]).all() and codes[0] == 0
    assert float(soft[0]) == pytest.approx(float(ntk_tt.smooth_training_time(curve, 0.1)))
    grads = jax.vmap(jax.grad(ntk_tt.smooth_training_time), (None, 0))(curve, eps)
    assert np.isfinite(grads).all() and not np.asarray(grads[1:]).any()


def test_non_finite_curve_is_undefined():
    value, reason = ntk_tt.training_time_report(np.array([1.0, 0.5, np.nan, 0.1]), 0.1,
                                                window=1)
    assert np.isnan(value) and "NaN" in reason


def test_smooth_training_time_tends_to_hard():
    curve = jnp.exp(-jnp.arange(101) / 10.0)
    hard = ntk_tt.training_time(curve, 0.1)
    soft = jax.jit(partial(ntk_tt.smooth_training_time, curve, 0.1))
    errors = [abs(float(soft(temperature=tmp)) - hard)
              for tmp in (0.2, 0.05, 0.01)]
    assert errors[0] > errors[1] > errors[2] and errors[2] < 0.5


STEPS = 40


@partial(jax.jit, static_argnames="method")
def _final_loss_and_smooth_t(lr, kernel, f0, y, *, method):
    pred = ntk_tt.predict_from_kernel(kernel, f0, y, learning_rate=lr, steps=STEPS,
                                      method=method)
    return pred.loss[-1], ntk_tt.smooth_training_time(pred.loss, 0.1, temperature=0.3)


@pytest.mark.parametrize("method", ["discrete"])
def test_grad_wrt_learning_rate_matches_finite_differences(method):
    with jax.enable_x64(True):
        params, x, y = linear_problem()
        kernel, f0 = brute_ntk(linear_apply, params, x), linear_apply(params, x)
        lr, h = 0.2, 1e-5
        fn = partial(_final_loss_and_smooth_t, kernel=kernel, f0=f0, y=y, method=method)
        grads = jax.jacrev(fn)(lr)  # (d final loss/dη, d smooth T_0.1/dη)
        plus, minus = fn(lr + h), fn(lr - h)
        for grad, up, down in zip(grads, plus, minus, strict=True):
            fd = (up - down) / (2 * h)
            # Tolerance: central differences at h = 1e-5 in x64 (ODE: solver tolerance 1e-6).
            np.testing.assert_allclose(grad, fd, rtol=1e-4 if method == "discrete" else 1e-3)
            assert abs(float(grad)) > 0


@pytest.mark.parametrize("eps", [0.0, 1.0, -0.1, 1.5])
def test_epsilon_outside_unit_interval_raises(eps):
    with pytest.raises(ValueError, match="epsilon"):
        ntk_tt.training_time(np.linspace(1, 0, 20), eps)


def test_bad_curve_or_window_raises():
    with pytest.raises(ValueError, match="1-D"):
        ntk_tt.training_time(np.ones((2, 10)), 0.1)
    with pytest.raises(ValueError, match="odd"):
        ntk_tt.training_time(np.linspace(1, 0, 20), 0.1, window=4)


def test_wall_clock_time():
    np.testing.assert_allclose(ntk_tt.wall_clock_time(np.array([10.0, np.nan]), 0.25),
                               [2.5, np.nan])
    with pytest.raises(ValueError, match="seconds_per_step"):
        ntk_tt.wall_clock_time(10, -1.0)


def test_wall_clock_time_refuses_negative_steps_and_keeps_nan():
    assert ntk_tt.wall_clock_time(20, seconds_per_step=0.5) == 10.0
    assert np.isnan(ntk_tt.wall_clock_time(np.nan, seconds_per_step=0.5))
    out = ntk_tt.wall_clock_time([4, None], np.float32(0.5))  # None (undefined T_ε): NaN
    assert out[0] == 2.0 and np.isnan(out[1])
    with pytest.raises(ValueError, match="steps must be >= 0"):
        ntk_tt.wall_clock_time(-5, seconds_per_step=0.1)


@pytest.mark.parametrize("curve", ["abc", np.array(["1.0", "0.5"]), [[1.0, 0.5], [0.2]]])
def test_a_curve_that_is_not_numbers_is_named(curve):
    """A string, an array of strings or a ragged list as the curve: one ValueError naming
    curve (it was a JAX TypeError, or numpy's, that named no argument)."""
    for fn in (ntk_tt.training_time, ntk_tt.training_time_report):
        with pytest.raises(ValueError, match=r"^curve must be a 1-D array of numbers \(a loss"):
            fn(curve, 0.1)


@pytest.mark.parametrize("kwargs, name", [
    (dict(steps=10, seconds_per_step="a"), "seconds_per_step"),
    (dict(steps=10, seconds_per_step="0.5"), "seconds_per_step"),  # was read as 0.5
    (dict(steps="abc", seconds_per_step=0.1), "steps"),
    (dict(steps=[1.0, [2.0, 3.0]], seconds_per_step=0.1), "steps"),
])
def test_wall_clock_time_names_an_argument_that_is_not_numbers(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name} must be a number or an array of numbers"):
        ntk_tt.wall_clock_time(**kwargs)


@pytest.mark.parametrize("eps", ["0.1", None, True, [0.1]])
def test_epsilon_that_is_not_a_number_is_a_clear_error_before_any_work(eps, monkeypatch):
    """ε as a string (or None, a bool, a list): one ValueError naming epsilon and the type
    expected, raised before the jitted computation (it was a raw JAX TypeError)."""
    from ntk_tt.dynamics import _training_time

    def no_work(*_, **__):
        raise AssertionError("work started before epsilon was checked")

    monkeypatch.setattr(_training_time, "training_time_array", no_work)
    for fn in (ntk_tt.training_time, ntk_tt.training_time_report):
        with pytest.raises(ValueError) as err:
            fn(np.linspace(1, 0, 20), eps)
        msg = str(err.value)
        assert msg.startswith("epsilon must be") and "\n" not in msg, msg
        assert "real number" in msg or "scalar in (0, 1)" in msg, msg
    with pytest.raises(ValueError, match=r"epsilon must be a real number, got str; pass e\.g\. "
                                         r"epsilon=0\.1 \(a float, not a string\)"):
        ntk_tt.training_time(np.linspace(1, 0, 20), "0.1")


def test_nan_curve_warns_and_names_training_time_report():
    curve = np.array([1.0, 0.8, np.nan, 0.3, 0.2, 0.1])
    with pytest.warns(UserWarning, match=r"NaN or inf entries \(the first at step 2\).*"
                                         r"training_time_report\(curve, epsilon\)"):
        assert np.isnan(ntk_tt.training_time(curve, 0.1))


def test_flat_curve_is_nan_without_a_warning_and_the_report_says_why():
    import warnings

    from ntk_tt.dynamics._training_time import NON_FINITE

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isnan(ntk_tt.training_time(np.ones(20), 0.1))
        assert np.isfinite(ntk_tt.training_time(np.linspace(1, 0, 21), 0.1))
        value, why = ntk_tt.training_time_report(np.full(20, np.nan), 0.1)
    assert np.isnan(value) and why == REASONS[NON_FINITE]


def test_training_time_array_stays_jittable_vmappable_and_silent_on_nan():
    """The jittable form is unchanged: under jit and vmap, NaN and code for a NaN or flat
    curve, no warning; the eager training_time refuses a traced curve with the way out."""
    import warnings

    from ntk_tt.dynamics._training_time import NON_FINITE, OK

    curves = jnp.stack([jnp.linspace(1.0, 0.0, 21), jnp.ones(21), jnp.full(21, jnp.nan)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t, code = jax.jit(jax.vmap(lambda c: ntk_tt.training_time_array(c, 0.1)))(curves)
    assert float(t[0]) == ntk_tt.training_time(np.asarray(curves[0]), 0.1) > 0
    assert np.isnan(t[1]) and np.isnan(t[2])
    assert code.tolist() == [OK, NOT_DECREASING, NON_FINITE]
    g = jax.grad(lambda c: ntk_tt.smooth_training_time(c, 0.1))(curves[0])
    assert np.all(np.isfinite(g))
    with pytest.raises(ValueError, match="under jit, vmap or grad use training_time_array"):
        jax.jit(lambda c: ntk_tt.training_time(c, 0.1))(curves[0])


@pytest.mark.parametrize("curve", [np.array([True, False] * 5), [True, False, True],
                                   jnp.array([True, False] * 5)])
def test_a_bool_curve_is_refused(curve):
    """A bool curve was read as 1/0 and gave NaN silently: now one ValueError naming curve."""
    for fn in (ntk_tt.training_time, ntk_tt.training_time_report):
        with pytest.raises(ValueError, match=r"^curve must be real numbers, got booleans"):
            fn(curve, 0.1)


@pytest.mark.parametrize("kwargs, name", [
    (dict(steps=10, seconds_per_step=True), "seconds_per_step"),  # was read as 1.0
    (dict(steps=True, seconds_per_step=0.5), "steps"),
    (dict(steps=np.array([True, False]), seconds_per_step=0.5), "steps"),
])
def test_wall_clock_time_refuses_bools(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name} must be real numbers, got booleans"):
        ntk_tt.wall_clock_time(**kwargs)


def test_smooth_training_time_checks_its_arguments_like_training_time():
    """A string ε or curve gave a raw JAX TypeError / AttributeError: now the same messages as
    training_time; traced arguments still pass (jit, grad)."""
    curve = jnp.exp(-jnp.arange(41) / 10.0)
    with pytest.raises(ValueError, match=r"^epsilon must be a real number, got str"):
        ntk_tt.smooth_training_time(curve, "0.1")
    with pytest.raises(ValueError, match=r"^curve must be a 1-D array of numbers \(a loss"):
        ntk_tt.smooth_training_time("abc", 0.1)
    with pytest.raises(ValueError, match=r"^epsilon must be a scalar in \(0, 1\)"):
        ntk_tt.smooth_training_time(curve, 1.5)
    with pytest.raises(ValueError, match=r"^curve must be real numbers, got booleans"):
        ntk_tt.smooth_training_time(np.array([True, False] * 5), 0.1)
    eager = float(ntk_tt.smooth_training_time(curve, 0.1))
    assert float(jax.jit(ntk_tt.smooth_training_time)(curve, 0.1)) == pytest.approx(eager)
    assert np.isfinite(jax.grad(ntk_tt.smooth_training_time, argnums=1)(curve, 0.1))


def test_training_time_array_out_of_range_epsilon_is_invalid_and_a_vector_is_refused():
    """A fresh user's probe: ε = 2 gave a valid-looking 0 (code OK), ε ≤ 0 the wrong reason,
    and an ε vector a raw broadcasting error. ε ∉ (0, 1) or NaN is NaN with code INVALID (as
    an invalid traced hyperparameter), also under jit; a vector ε is refused; vmap over ε is
    the loop of scalar calls."""
    from ntk_tt.dynamics._training_time import INVALID, OK, training_time_array

    curve = jnp.linspace(1.0, 0.1, 20) ** 2
    for eps in (2.0, 1.0, 0.0, -1.0, float("nan")):
        for fn in (training_time_array, jax.jit(training_time_array)):
            t, code = fn(curve, eps)
            assert np.isnan(float(t)) and int(code) == INVALID, eps
    t, code = training_time_array(curve, 0.1)
    assert int(code) == OK and float(t) == ntk_tt.training_time(np.asarray(curve), 0.1)
    with pytest.raises(ValueError, match="a 1-D curve with >= 1 entry and a scalar epsilon, got"):
        training_time_array(curve, jnp.array([0.1, 0.4]))
    swept = jax.vmap(training_time_array, in_axes=(None, 0))(curve, jnp.array([0.1, 0.4]))
    assert [float(v) for v in swept[0]] == [float(training_time_array(curve, e)[0])
                                            for e in (0.1, 0.4)]


def test_the_default_window_is_predict_s_for_short_curves_too():
    """A fresh user's probe: predict(..., steps=3) gave T_ε, but training_time on its own
    4-entry curve raised "window must be an odd int in [1, len(curve)] ... got 5". The default
    window is now curve_window (5, or 1 below 5 entries), so both agree; an explicit window is
    still checked."""
    params, x, y = linear_problem(n=8, dtype=jnp.float32)
    pred = ntk_tt.predict(linear_apply, params, x, y, learning_rate=0.5, steps=3)
    assert len(pred.loss) == 4
    for eps, value in pred.training_time["loss"].items():
        np.testing.assert_equal(ntk_tt.training_time(pred.loss, eps), value)
    long = np.linspace(1.0, 0.1, 30) ** 2
    assert ntk_tt.training_time(long, 0.1) == ntk_tt.training_time(long, 0.1, window=5)
    with pytest.raises(ValueError, match="window"):
        ntk_tt.training_time(pred.loss, 0.1, window=5)
