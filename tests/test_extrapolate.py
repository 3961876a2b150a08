"""Larger N from a subset (App. D): power-law fit, tail normalisation, Nyström, Prop. 2 curve."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _dynamics_helpers import brute_ntk, linear_apply, linear_problem

import ntk_tt
from ntk_tt.dynamics._closed_form import mse_closed_form
from ntk_tt.dynamics._fspace import curves


def _normal(key, shape):
    with jax.enable_x64(True):
        return np.asarray(jax.random.normal(key, shape, jnp.float64))


def _orthogonal(key, n):
    return np.linalg.qr(_normal(key, (n, n)))[0]


def _power_law_kernel(n, c, s, key):
    """Traced (n, n) kernel with normalised spectrum exactly c·k^(−s), and its eigenvectors."""
    v = _orthogonal(key, n)
    lam = n * c * np.arange(1, n + 1, dtype=np.float64) ** -s
    return (v * lam) @ v.T, v


def _closed_form_loss(kernel, f0, y, lr, steps):
    with jax.enable_x64(True):
        n, c = f0.shape
        traced = kernel.shape == (n, n)
        op = (jnp.asarray(kernel) / (c if traced else 1), traced)
        fs, _, _ = mse_closed_form(op, jnp.asarray(f0), jnp.asarray(y), learning_rate=lr,
                                   momentum=0.0, steps=steps)
        return np.asarray(curves(fs, jnp.asarray(y), "mse")[0])


def _residual(f0, y):
    return f0 - np.eye(f0.shape[1])[y]


def test_fit_recovers_exact_power_law():
    k = np.arange(1, 301, dtype=np.float64)
    c_fit, s_fit = ntk_tt.fit_power_law(3.7 * k**-1.3, (5, 200))
    assert abs(c_fit - 3.7) < 1e-6 * 3.7 and abs(s_fit - 1.3) < 1e-6


@pytest.mark.parametrize("alpha", [0.0, 0.1])
def test_extrapolated_spectrum_on_exact_power_law(alpha):
    """Subset kernel with μ'_k = c k^(−s) exactly: the prediction is c k^(−s_N) from k0 on,
    the subset's own μ'_k before, and Σ p_k = ‖δy‖² of the full set exactly."""
    n_sub, n, c, k0 = 60, 240, 3, 10
    kern, v = _power_law_kernel(n_sub, 2.0, 1.2, jax.random.key(0))
    kern = kern * c  # the traced kernel is used as Θ/C: spectrum of Θ/C is the power law
    r_sub = _normal(jax.random.key(1), (n_sub, c))
    r_full = _normal(jax.random.key(2), (n, c))
    with jax.enable_x64(True):
        sp = ntk_tt.extrapolate_spectrum(kern, r_sub, r_full, k0=k0, fit_range=(k0, 40),
                                         slope_correction=alpha)
    k = np.arange(1, n + 1, dtype=np.float64)
    expect = 2.0 * k ** -(1.2 + alpha * (n / n_sub - 1))
    expect[: k0 - 1] = 2.0 * k[: k0 - 1] ** -1.2
    np.testing.assert_allclose(sp.eigenvalues, expect, rtol=1e-6)
    p = np.asarray(sp.projections)
    total = np.sum(r_full**2)
    assert sp.num_samples == n and p.shape == (n,)
    np.testing.assert_allclose(p.sum(), total, rtol=1e-10)
    # head: the subset's projections rescaled by ‖δy‖²/‖δy'‖²; tail continuous at k0
    p_sub = np.sum((v.T @ r_sub) ** 2, axis=1) * total / np.sum(r_sub**2)
    np.testing.assert_allclose(p[:k0], p_sub[:k0], rtol=1e-8)
    # the tail is one power law: log p linear in log k from k0 on
    slope = np.diff(np.log(p[k0 - 1 :])) / np.diff(np.log(k[k0 - 1 :]))
    np.testing.assert_allclose(slope, slope[0], rtol=1e-6)


@pytest.mark.parametrize("traced", [False, True])
def test_curve_from_exact_spectrum_equals_closed_form(traced):
    """N' = N: the Prop. 2 curve of the exact spectrum is mse_closed_form's loss, at κ = 1.5
    (1 − η μ < 0 for the top direction: the squared form must not go NaN)."""
    with jax.enable_x64(True):
        params, x, y = linear_problem(n=24, d=10, c=3)
        kern = np.asarray(brute_ntk(linear_apply, params, x))
        if traced:
            kern = kern.reshape(24, 3, 24, 3).trace(axis1=1, axis2=3)
        f0 = np.asarray(linear_apply(params, x))
        r = _residual(f0, np.asarray(y))
        sp = ntk_tt.extrapolate_spectrum(kern, r, r)  # N = N': the exact spectrum
        lr = 1.5 / float(sp.eigenvalues[0])
        curve = ntk_tt.predict_curve_from_spectrum(sp, learning_rate=lr, steps=40)
    ref = _closed_form_loss(kern, f0, y, lr, 40)
    np.testing.assert_allclose(curve, ref, rtol=1e-6)
    assert sp.eigenvalues.shape == ((24,) if traced else (72,))
    assert ntk_tt.training_time(curve, 0.1) == ntk_tt.training_time(ref, 0.1)


@pytest.mark.parametrize("traced", [False, True])
def test_nystrom_exact_when_landmarks_span_the_kernel(traced):
    """Linear model: Θ has rank D·C (D = 6 features), so 10 landmark samples span it and the
    Nyström curve equals the full kernel's closed form."""
    with jax.enable_x64(True):
        params, x, y = linear_problem(n=40, d=6, c=3)
        kern = np.asarray(brute_ntk(linear_apply, params, x))
        f0 = np.asarray(linear_apply(params, x))
    if traced:
        kern = kern.reshape(40, 3, 40, 3).trace(axis1=1, axis2=3)
    idx = np.arange(0, 40, 4)
    cols = idx if traced else (idx[:, None] * 3 + np.arange(3)).reshape(-1)
    r = _residual(f0, np.asarray(y))
    with jax.enable_x64(True):
        sp = ntk_tt.nystrom_spectrum(kern[:, cols], kern[np.ix_(cols, cols)], r)
        lr = 1.0 / float(sp.eigenvalues[0])
        curve = ntk_tt.predict_curve_from_spectrum(sp, learning_rate=lr, steps=30)
    np.testing.assert_allclose(np.sum(sp.projections), np.sum(r**2), rtol=1e-6)
    np.testing.assert_allclose(curve, _closed_form_loss(kern, f0, y, lr, 30), rtol=1e-6)


def test_bad_input_raises_value_error():
    kern, _ = _power_law_kernel(20, 1.0, 1.0, jax.random.key(0))
    r = np.ones((20, 2))
    with pytest.raises(ValueError, match="kernel_subset must be"):
        ntk_tt.extrapolate_spectrum(kern[:10, :10], r, np.ones((40, 2)))
    with pytest.raises(ValueError, match="residual_full"):
        ntk_tt.extrapolate_spectrum(kern, r, np.ones((10, 2)))
    with pytest.raises(ValueError, match="k0"):
        ntk_tt.extrapolate_spectrum(kern, r, np.ones((40, 2)), k0=21)
    # a fresh user's k0 = K' (allowed) was refused as a fit_range they never gave
    with pytest.raises(ValueError, match=r"k0 = K' = 20 leaves the default fit range .* take "
                                         r"k0 <= 19, or pass fit_range"):
        ntk_tt.extrapolate_spectrum(kern, r, np.ones((40, 2)), k0=20)

    with pytest.raises(ValueError, match="fit_range"):
        ntk_tt.extrapolate_spectrum(kern, r, np.ones((40, 2)), k0=2, fit_range=(5, 5))
    # a fresh user (session 41): "too many values to unpack", and an empty kernel blamed on k0
    for bad in ((1, 2, 3), 5, "ab"):
        with pytest.raises(ValueError, match=r"fit_range must be two integers \(lo, hi\), got"):
            ntk_tt.extrapolate_spectrum(kern, r, np.ones((40, 2)), fit_range=bad)
    with pytest.raises(ValueError, match=r"kernel_subset and its residual hold no samples \("
                                         r"residual of shape \(0, 5\)\)"):
        ntk_tt.extrapolate_spectrum(np.zeros((0, 0)), np.zeros((0, 5)), np.zeros((0, 5)))
    with pytest.raises(ValueError, match="> 0"):
        ntk_tt.fit_power_law(np.array([1.0, 0.5, 0.0]), (1, 3))
    with pytest.raises(ValueError, match="kernel_cross"):
        ntk_tt.nystrom_spectrum(kern[:, :5], kern[:6, :6], r)
    sp = ntk_tt.kernel_spectrum(kern, r)
    with pytest.raises(ValueError, match="learning_rate"):
        ntk_tt.predict_curve_from_spectrum(sp, learning_rate=0.0, steps=10)
    with pytest.raises(ValueError, match="steps"):
        ntk_tt.predict_curve_from_spectrum(sp, learning_rate=0.1, steps=0)


def test_an_asymmetric_kernel_is_refused_as_predict_from_kernel_does():
    """extrapolate_spectrum (and kernel_spectrum) symmetrised any square kernel, so a cross
    kernel or a corrupted Θ gave eigenvalues of another matrix, silently; now check_gram's
    ValueError, as predict_from_kernel."""
    kern, _ = _power_law_kernel(20, 1.0, 1.0, jax.random.key(0))
    bad = kern + 10 * np.triu(np.ones_like(kern))
    r = np.ones((20, 2))
    with pytest.raises(ValueError, match="kernel_subset is not symmetric.*Θ\\(x, x\\)") as err:
        ntk_tt.extrapolate_spectrum(bad, r, np.ones((40, 2)))
    # it named kernel_test (with f0_test and y_test), which extrapolate_spectrum has not
    assert "kernel_test" not in str(err.value) and "nystrom_spectrum's kernel_cross" in str(
        err.value)
    with pytest.raises(ValueError, match="kernel_subset is not symmetric"):
        ntk_tt.extrapolate_spectrum(bad, r, r)  # N = N': the subset's own spectrum
    with pytest.raises(ValueError, match="kernel is not symmetric"):
        ntk_tt.kernel_spectrum(bad, r)
    with pytest.raises(ValueError, match="kernel is not symmetric"):
        ntk_tt.predict_from_kernel(bad, np.zeros((20, 2)), np.arange(20) % 2,
                                   learning_rate=0.1, steps=5)
    assert ntk_tt.extrapolate_spectrum(kern, r, np.ones((40, 2))).eigenvalues.shape == (40,)


def test_zero_residual_is_refused_before_the_eigendecomposition(monkeypatch):
    """All-zero residuals gave 'no power-law tail ... residual mass nan ... choose another
    k0' after the eigendecomposition; now a ValueError saying there is nothing to
    extrapolate, before it."""
    import ntk_tt.prediction._extrapolate as ex

    kern, _ = _power_law_kernel(30, 1.0, 1.0, jax.random.key(0))
    r = np.ones((30, 3))

    def no_eig(*args):
        raise AssertionError("eigendecomposition reached")

    monkeypatch.setattr(ex, "_eig", no_eig)
    with pytest.raises(ValueError, match="residual_full is zero everywhere.*no residual to "
                                         "extrapolate"):
        ntk_tt.extrapolate_spectrum(kern, np.zeros((30, 3)), np.zeros((60, 3)))
    with pytest.raises(ValueError, match="residual_full is zero everywhere"):
        ntk_tt.extrapolate_spectrum(kern, r, np.zeros((60, 3)))
    with pytest.raises(ValueError, match="residual_subset is zero everywhere.*nothing to "
                                         "extrapolate"):
        ntk_tt.extrapolate_spectrum(kern, np.zeros((30, 3)), np.ones((60, 3)))
    with pytest.raises(ValueError, match="residual_full contains NaN"):
        ntk_tt.extrapolate_spectrum(kern, r, np.full((60, 3), np.nan))
    monkeypatch.undo()
    # N = N': the exact (all-zero) spectrum of a zero residual, as kernel_spectrum gives
    sp = ntk_tt.extrapolate_spectrum(kern, np.zeros((30, 3)), np.zeros((30, 3)))
    assert float(jnp.sum(sp.projections)) == 0.0


def test_curve_from_spectrum_refuses_a_tuple_and_says_optimizer_for_a_missing_rate():
    """A third fresh user: a (eigenvalues, projections) tuple gave an AttributeError, and
    learning_rate=None did not mention optimizer=."""
    with pytest.raises(ValueError, match="spectrum must be an ntk_tt.Spectrum .* got tuple"):
        ntk_tt.predict_curve_from_spectrum((np.ones(3), np.ones(3)), learning_rate=0.1,
                                           steps=10)
    spec = ntk_tt.Spectrum(eigenvalues=np.ones(2), projections=np.ones(2), num_samples=2)
    with pytest.raises(ValueError, match=r"or pass optimizer=ntk_tt.sgd"):
        ntk_tt.predict_curve_from_spectrum(spec, learning_rate=None, steps=10)


@pytest.mark.parametrize("field,value,match", [
    ("eigenvalues", [0.5, np.nan, 0.1], r"spectrum\.eigenvalues must be finite and >= 0 .*got "
                                        r"nan at k = 1; recompute the spectrum"),
    ("eigenvalues", [0.5, 0.2, -1e-3], r"spectrum\.eigenvalues must be finite and >= 0 .*got "
                                       r"-0\.001 at k = 2;.*np\.maximum\(values, 0\)"),
    ("projections", [1.0, -2.0, 0.5], r"spectrum\.projections must be finite and >= 0 .*got -2 "
                                      r"at k = 1"),
    ("projections", [1.0, 0.5], r"spectrum\.eigenvalues and spectrum\.projections must be 1-D of "
                                r"one length K .*got shapes \(3,\) and \(2,\); build both from "
                                "the same eigendecomposition"),
    ("eigenvalues", [1.0, 0.5, 0.1 + 1j], r"^spectrum\.eigenvalues must be real numbers, got "
                                         r"complex values \(complex128\): take the real part"),
    ("projections", [1.0, 0.5 + 0j, 0.1], r"^spectrum\.projections must be real numbers, got "
                                         r"complex values"),
    ("eigenvalues", [1.0, "a", 0.1], r"^spectrum\.eigenvalues must be real numbers, got dtype "
                                     r"<U32 \(not all numbers\): pass a float array; "
                                     r"ntk_tt\.kernel_spectrum"),
    ("projections", [1.0, None, 0.1], r"^spectrum\.projections must be real numbers, got dtype "
                                      r"object"),
    ("num_samples", 0, r"spectrum\.num_samples must be N, an int >= 1, got 0"),
    ("num_samples", "40", r"spectrum\.num_samples must be N, an int >= 1, got '40'"),
])
def test_curve_from_spectrum_refuses_bad_spectrum_values(field, value, match):
    """A fresh user: a NaN or negative eigenvalue (or projection) gave a NaN or growing curve
    silently; now one ValueError before any work, for the constant-η and optimiser paths."""
    good = dict(eigenvalues=np.array([0.5, 0.2, 0.1]), projections=np.ones(3), num_samples=4)
    spec = ntk_tt.Spectrum(**(good | {field: np.asarray(value) if field != "num_samples"
                                      else value}))
    for kw in (dict(learning_rate=0.1), dict(optimizer=ntk_tt.sgd(0.1, momentum=0.9))):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a complex spectrum gave a ComplexWarning first
            with pytest.raises(ValueError, match=match):
                ntk_tt.predict_curve_from_spectrum(spec, steps=10, **kw)
    r = np.random.default_rng(0).normal(size=(6, 3))  # kernel_spectrum, a third fresh user:
    ints = ntk_tt.kernel_spectrum(np.eye(18, dtype=int), r)  # worked in integers (μ = 0)
    floats = ntk_tt.kernel_spectrum(np.eye(18), r)
    assert ints.eigenvalues.dtype.kind == "f"
    np.testing.assert_allclose(ints.eigenvalues, floats.eigenvalues)
    np.testing.assert_allclose(ints.projections, floats.projections, rtol=1e-6)
    with pytest.raises(ValueError, match=r"needs N >= 1 samples"):  # an empty Spectrum
        ntk_tt.kernel_spectrum(np.zeros((0, 0)), np.zeros((0, 3)))
    with pytest.raises(ValueError, match=r"kernel_spectrum .*cannot run under jax\.jit"):
        jax.jit(ntk_tt.kernel_spectrum)(np.eye(18), r)  # was a TracerArrayConversionError
    empty = ntk_tt.Spectrum(np.zeros(0), np.zeros(0), 4)  # was an all-zero curve
    with pytest.raises(ValueError, match=r"of one length K >= 1 .*got shapes \(0,\) and \(0,\)"):
        ntk_tt.predict_curve_from_spectrum(empty, steps=10, learning_rate=0.1)
    ok = ntk_tt.Spectrum(**good)
    curve = jax.jit(lambda s: ntk_tt.predict_curve_from_spectrum(s, learning_rate=0.1,
                                                                 steps=10))(ok)
    np.testing.assert_allclose(curve, ntk_tt.predict_curve_from_spectrum(ok, learning_rate=0.1,
                                                                         steps=10), rtol=1e-6)


@pytest.mark.parametrize("rcond", [1.0, 10.0, 0.0, -1e-6, np.nan, "1e-6", np.array([1e-6])])
def test_nystrom_rcond_outside_0_1_is_one_line(rcond):
    """A fresh user: rcond = 1.0 or 10.0 dropped every eigenvalue of Θ_MM and numpy raised
    "zero-size array to reduction operation maximum"; now a ValueError naming (0, 1)."""
    kern, _ = _power_law_kernel(20, 1.0, 1.0, jax.random.key(0))
    r = np.ones((20, 2))
    match = (r"^rcond must be a real number" if isinstance(rcond, str) else
             r"^rcond must be in \(0, 1\) .*>= 1 drops them all\), got "
             + ("ndarray of shape \\(1,\\)" if np.ndim(rcond) else ""))
    with pytest.raises(ValueError, match=match):
        ntk_tt.nystrom_spectrum(kern[:, :5], kern[:5, :5], r, rcond=rcond)
    with pytest.raises(ValueError, match=r"^kernel_subset has trace <= 0"):
        ntk_tt.nystrom_spectrum(np.zeros((20, 5)), np.zeros((5, 5)), r)
    assert ntk_tt.nystrom_spectrum(kern[:, :5], kern[:5, :5], r, rcond=0.5).num_samples == 20


def test_lists_of_numbers_are_converted_and_non_numbers_are_named():
    """A fresh user: K.tolist() gave a raw TypeError 'Cannot determine dtype of [[101.69…'
    (printing the data). Lists of numbers now give what the arrays give; non-numbers one
    'must hold numbers' line, never the contents."""
    kern, _ = _power_law_kernel(20, 1.0, 1.0, jax.random.key(0))
    r_sub, r_full = _normal(jax.random.key(1), (20, 2)), _normal(jax.random.key(2), (40, 2))
    cross = np.vstack([kern[:, :5], kern[:5, :5] + 0.1])
    calls = {
        "extrapolate": (ntk_tt.extrapolate_spectrum, (kern, r_sub, r_full)),
        "nystrom": (ntk_tt.nystrom_spectrum, (cross[:20], kern[:5, :5], r_sub)),
        "kernel": (ntk_tt.kernel_spectrum, (kern, r_sub)),
    }
    for fn, args in calls.values():
        want, got = fn(*args), fn(*(a.tolist() for a in args))
        for a, b in zip(want[:2], got[:2], strict=True):
            np.testing.assert_array_equal(a, b)
        assert want.num_samples == got.num_samples
        for i in range(len(args)):
            bad = list(args)
            bad[i] = np.full(np.shape(args[i]), "abc").tolist()
            with pytest.raises(ValueError, match=r"must hold numbers, got a list of shape "
                                                 r"\(\d+, \d+\) whose entries are not all "
                                                 r"numbers") as err:
                fn(*bad)
            assert "abc" not in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("alpha", [-5.0, -1e-3, np.inf, np.nan, "0.1", np.array([0.1])])
def test_negative_slope_correction_is_refused(alpha):
    """A fresh user: α = −5 made the tail rise (largest μ 4.1e6 from μ'_1 ≈ 4) and the loss
    diverge; the correction steepens the slope (α >= 0, METHOD.md §7), so α < 0 is refused."""
    kern, _ = _power_law_kernel(20, 1.0, 1.0, jax.random.key(0))
    match = (r"^slope_correction must be a real number" if isinstance(alpha, str) else
             r"^slope_correction α must be finite and >= 0 \(it steepens the tail")
    with pytest.raises(ValueError, match=match):
        ntk_tt.extrapolate_spectrum(kern, np.ones((20, 2)), np.ones((40, 2)),
                                    slope_correction=alpha)


def test_a_slope_correction_given_as_a_jax_scalar_is_the_float():
    """α = jnp.array(0.5) raised JAX's "arrays are immutable" error (a second fresh user)."""
    kern, _ = _power_law_kernel(20, 1.0, 1.0, jax.random.key(0))
    r_sub, r_full = np.ones((20, 2)), np.ones((40, 2))
    want = ntk_tt.extrapolate_spectrum(kern, r_sub, r_full, slope_correction=0.5)
    got = ntk_tt.extrapolate_spectrum(kern, r_sub, r_full, slope_correction=jnp.array(0.5))
    np.testing.assert_array_equal(got.eigenvalues, want.eigenvalues)
    np.testing.assert_array_equal(got.projections, want.projections)


def test_an_extrapolated_tail_can_start_above_the_kept_head():
    """α >= 0 and s >= 0 (a descending spectrum) keep the tail falling from k0 on, but a head
    flat up to k0 and falling fast beyond (concave in log-log) makes the fit overshoot at k0:
    μ_2 = 4.1 > μ_1 = 1 here. So the largest eigenvalue is max μ_k (what κ uses), not μ_1."""
    n = 30
    k = np.arange(1, n + 1, dtype=np.float64)
    mu = np.where(k <= 10, 1.0, np.exp(-(k - 10)))
    v = _orthogonal(jax.random.key(0), n)
    kern = (v * (2 * n * mu)) @ v.T  # traced, C = 2: the spectrum of Θ/C is mu
    sp = ntk_tt.extrapolate_spectrum(kern, _normal(jax.random.key(1), (n, 2)),
                                     _normal(jax.random.key(2), (60, 2)), k0=2)
    eig = np.asarray(sp.eigenvalues)
    np.testing.assert_allclose(eig[0], 1.0, rtol=1e-5)
    assert eig.max() > 4 * eig[0] and np.all(np.diff(eig[1:]) <= 0)


@pytest.mark.parametrize("source", ["extrapolate", "nystrom"])
def test_curve_from_spectrum_is_differentiable_and_vmappable_in_eta(source):
    """A fresh user: jax.grad / vmap over learning_rate gave a raw TracerArrayConversionError.
    The constant-η curve is a sum of exponentials in η: grad equals a central difference,
    vmap and jit equal the eager calls, a traced η ≤ 0 or NaN gives NaN, curve and gradient
    (it cannot be refused), and a gradient at η·μ_k = 1 exactly is finite."""
    with jax.enable_x64(True):
        kern, _ = _power_law_kernel(20, 1.0, 1.0, jax.random.key(0))
        r_sub, r_full = _normal(jax.random.key(1), (20, 2)), _normal(jax.random.key(2), (40, 2))
        cross = np.vstack([kern[:, :6], _normal(jax.random.key(3), (20, 6))])
        sp = (ntk_tt.extrapolate_spectrum(kern, r_sub, r_full) if source == "extrapolate"
              else ntk_tt.nystrom_spectrum(cross, kern[:6, :6], r_full))
        lr0 = 1.0 / float(np.max(sp.eigenvalues))

        def curve(lr):
            return ntk_tt.predict_curve_from_spectrum(sp, learning_rate=lr, steps=10)

        for lr in (0.3 * lr0, 1.5 * lr0):
            g = jax.grad(lambda e: curve(e)[-1])(lr)
            h = 1e-6 * lr
            fd = (curve(lr + h)[-1] - curve(lr - h)[-1]) / (2 * h)
            np.testing.assert_allclose(g, fd, rtol=1e-5)
        assert np.all(np.isfinite(jax.jacrev(curve)(lr0)))  # (1 − η μ_1)² = 0 at t = 0
        lrs = jnp.array([0.2, 0.7, 1.9]) * lr0
        batched = jax.jit(jax.vmap(curve))(lrs)
        for row, lr in zip(batched, lrs, strict=True):
            np.testing.assert_allclose(row, curve(float(lr)), rtol=1e-12)
        bad = jax.vmap(curve)(jnp.array([0.5 * lr0, 0.0, -lr0, jnp.nan]))
        assert np.all(np.isfinite(bad[0])) and np.all(np.isnan(bad[1:]))
        etas = jnp.array([0.5 * lr0, 0.0, -lr0, jnp.nan, jnp.inf])
        for diff in (jax.grad, jax.jacfwd):  # reverse and forward mode: was 0 at a bad η
            grads = jax.vmap(diff(lambda e: curve(e)[-1]))(etas)
            assert np.isfinite(grads[0]) and np.all(np.isnan(grads[1:])), diff
