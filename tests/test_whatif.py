"""What-if: sensitivities vs central differences, the predicted divergence boundary vs the
linear model's closed-form stability edge, the figure, and input validation."""

from functools import partial

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import pytest
from _dynamics_helpers import brute_ntk, linear_apply, train_optax

import ntk_tt
from ntk_tt.analysis import _whatif, _whatif_boundary
from ntk_tt.dynamics._divergence import DIVERGES, VERDICTS
from ntk_tt.kernels._head_aware import HeadAwareKernel

matplotlib.use("Agg")

N, NT, STEPS, EPS = 16, 6, 60, 0.1
TAU = 0.02  # sensitivities' default temperature of smooth_training_time
F64 = jnp.float64


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _plain_problem():
    """Linear model (its linearisation is exact): Θ, f0, held-out cross kernel and logits."""
    rng = np.random.default_rng(0)  # numpy draws: no per-op compilation in the tests
    c = 3
    x = jnp.asarray(rng.normal(size=(N + NT, 6)))
    y = jnp.asarray(rng.integers(0, c, N + NT))
    params = {"w": jnp.asarray(0.3 * rng.normal(size=(6, c))), "b": jnp.zeros(c, x.dtype)}
    xtr, ytr, xte, yte = x[:N], y[:N], x[N:], y[N:]
    # f = x w + b: Θ[(i, c), (j, c')] = (x_i·x_j + 1) δ_cc' (test_kernel_is_brute_force_ntk)
    return dict(params=params, x=xtr, y=ytr, xt=xte, yt=yte,
                kernel=jnp.kron(xtr @ xtr.T + 1.0, jnp.eye(c, dtype=x.dtype)),
                f0=linear_apply(params, xtr),
                kernel_test=jnp.kron(xte @ xtr.T + 1.0, jnp.eye(c, dtype=x.dtype)),
                f0_test=linear_apply(params, xte))


def test_kernel_is_brute_force_ntk(x64):
    p = _plain_problem()
    np.testing.assert_allclose(p["kernel"], brute_ntk(linear_apply, p["params"], p["x"]),
                               rtol=1e-12)
    np.testing.assert_allclose(p["kernel_test"],
                               brute_ntk(linear_apply, p["params"], p["xt"], p["x"]),
                               rtol=1e-12)


def _lam_max(kernel):
    return float(np.linalg.eigvalsh(np.asarray(kernel))[-1])


def _soft_accuracy(logits, y, tau):
    """Independent re-statement of the smoothed accuracy: mean σ(margin / τ)."""
    logits = np.asarray(logits)
    true = logits[np.arange(len(y)), np.asarray(y)]
    other = np.where(np.eye(logits.shape[1], dtype=bool)[np.asarray(y)], -np.inf,
                     logits).max(axis=1)
    return float(np.mean(1.0 / (1.0 + np.exp(-(true - other) / tau))))


def _central(fn, lr, m, h_lr, h_m):
    """Central differences of fn(lr, m) -> array of quantities: (d/dη, d/dm)."""
    d_lr = (np.asarray(fn(lr + h_lr, m)) - np.asarray(fn(lr - h_lr, m))) / (2 * h_lr)
    d_m = (np.asarray(fn(lr, m + h_m)) - np.asarray(fn(lr, m - h_m))) / (2 * h_m)
    return d_lr, d_m


_train = jax.jit(train_optax, static_argnums=0, static_argnames=("nesterov", "loss"))
_smooth_t = jax.jit(ntk_tt.smooth_training_time)


def test_plain_kernel_sensitivities_match_central_differences(x64):
    """Derivatives wrt η and m of T_ε (smooth), L_T and the smoothed held-out accuracy, at a
    point with momentum, against central differences of independent references: the public
    predict_from_kernel (T_ε, L_T) and real optax training of the linear model (held-out
    logits, whose linearisation is exact); elasticity = the log-log central difference.
    Values: smooth T_ε within 1 step of the hard training_time of the predicted curve."""
    p = _plain_problem()
    lr, m = 0.6 * N / _lam_max(p["kernel"]), 0.3
    kw = dict(f0=p["f0"], kernel_test=p["kernel_test"], f0_test=p["f0_test"], y_test=p["yt"])
    s = ntk_tt.sensitivities(p["kernel"], p["y"], learning_rate=lr, momentum=m, steps=STEPS,
                             epsilon=EPS, **kw)
    assert not bool(s.diverged)

    def reference(lr_, m_):  # eager: predict_from_kernel's own compiled core
        pred = ntk_tt.predict_from_kernel(p["kernel"], p["f0"], p["y"], learning_rate=lr_,
                                          momentum=m_, steps=STEPS)
        return jnp.stack([_smooth_t(pred.loss, EPS, temperature=TAU), pred.loss[-1]])

    batches = jnp.broadcast_to(jnp.arange(N), (STEPS, N))

    def held_out(lr_, m_):
        return _train(linear_apply, p["params"], p["x"], p["y"], batches, p["xt"], lr_, m_,
                      nesterov=False, loss="cross_entropy")[-1]

    def accuracy(lr_, m_):
        return _soft_accuracy(held_out(lr_, m_), p["yt"], 0.1)

    h_lr, h_m = 1e-6 * lr, 1e-6
    (dt_lr, dl_lr), (dt_m, dl_m) = _central(reference, lr, m, h_lr, h_m)
    da_lr, da_m = _central(accuracy, lr, m, h_lr, h_m)
    pairs = [(s.d_training_time_d_lr, dt_lr), (s.d_training_time_d_momentum, dt_m),
             (s.d_final_loss_d_lr, dl_lr), (s.d_final_loss_d_momentum, dl_m),
             (s.d_test_accuracy_d_lr, da_lr), (s.d_test_accuracy_d_momentum, da_m)]
    for got, want in pairs:
        # central differences at h = 1e-6 relative in float64: ~1e-9 relative truncation
        np.testing.assert_allclose(float(got), want, rtol=1e-5)
        assert abs(float(got)) > 0
    # values agree with the public predictor and the real linear-model run
    loss = ntk_tt.predict_from_kernel(p["kernel"], p["f0"], p["y"], learning_rate=lr,
                                      momentum=m, steps=STEPS).loss
    hard = ntk_tt.training_time(np.asarray(loss), EPS)
    assert float(s.training_time_hard) == hard
    assert abs(float(s.training_time) - hard) <= 1.0
    np.testing.assert_allclose(float(s.final_loss), float(loss[-1]), rtol=1e-12)
    real_logits = np.asarray(held_out(lr, m))
    # error_rate's mean of booleans is float32 even under x64: compare to float32 rounding
    np.testing.assert_allclose(float(s.test_accuracy),
                               np.mean(real_logits.argmax(1) == np.asarray(p["yt"])), atol=1e-7)
    np.testing.assert_allclose(float(s.soft_test_accuracy), accuracy(lr, m), rtol=1e-9)
    # elasticity d log T / d log η against the log-log central difference
    g = 1e-6
    t_up, t_down = reference(lr * np.exp(g), m)[0], reference(lr * np.exp(-g), m)[0]
    np.testing.assert_allclose(float(s.training_time_elasticity),
                               float(np.log(t_up) - np.log(t_down)) / (2 * g), rtol=1e-5)
    np.testing.assert_allclose(float(s.final_loss_elasticity),
                               lr * float(s.d_final_loss_d_lr) / float(s.final_loss))


@pytest.mark.parametrize("lr_kappa,m", [(0.3, 0.0), (1.0, 0.5), (2.0, 0.9)])
def test_smooth_training_time_within_one_step_of_hard(x64, lr_kappa, m):
    """At several (κ, m): the smooth T_ε is within 1 step of training_time on the predicted
    curve, and the hard one equals it (cross-entropy, no held-out data: accuracies None)."""
    p = _plain_problem()
    lr = lr_kappa * N / _lam_max(p["kernel"])
    s = ntk_tt.sensitivities(p["kernel"], p["y"], learning_rate=lr, momentum=m, steps=STEPS,
                             epsilon=EPS, f0=p["f0"])
    curve = ntk_tt.predict_from_kernel(p["kernel"], p["f0"], p["y"], learning_rate=lr,
                                       momentum=m, steps=STEPS).loss
    hard = ntk_tt.training_time(np.asarray(curve), EPS)
    assert np.isfinite(hard) and float(s.training_time_hard) == hard
    assert abs(float(s.training_time) - hard) <= 1.0
    for field in ("test_accuracy", "soft_test_accuracy", "d_test_accuracy_d_lr",
                  "d_test_accuracy_d_momentum", "test_accuracy_elasticity"):
        assert getattr(s, field) is None, field


def test_diverged_prediction_has_nan_derivatives(x64):
    """MSE GD beyond the edge (κ = 3 > 2): diverged, T_ε and every derivative NaN."""
    p = _plain_problem()
    lr = 3.0 * N / _lam_max(p["kernel"])
    s = ntk_tt.sensitivities(p["kernel"], p["y"], learning_rate=lr, steps=STEPS, f0=p["f0"],
                             loss="mse")
    assert bool(s.diverged) and bool(s.beyond_edge)
    assert int(s.training_time_code) == 4
    for field in ("training_time", "training_time_hard", "d_training_time_d_lr",
                  "d_final_loss_d_lr", "d_final_loss_d_momentum", "training_time_elasticity"):
        assert np.isnan(float(getattr(s, field))), field


def test_a_traced_point_the_checks_refuse_is_nan_and_invalid(x64):
    """A fresh user: under jax.jit, η = −0.1, η = 0 or m = 1 gave a NaN L_T beside finite
    derivatives (dL/dη = −225) and code NON_FINITE. Now every value and derivative is NaN and
    the code INVALID with outcome "unknown", as predict_from_kernel says; a valid traced point
    equals the eager one."""
    p = _plain_problem()
    lr = 0.5 * N / _lam_max(p["kernel"])
    run = jax.jit(lambda eta, m: ntk_tt.sensitivities(
        p["kernel"], p["y"], learning_rate=eta, momentum=m, steps=STEPS, f0=p["f0"],
        kernel_test=p["kernel_test"], f0_test=p["f0_test"], y_test=p["yt"]))
    for eta, m in ((-lr, 0.0), (0.0, 0.0), (lr, 1.0)):
        s = run(eta, m)
        assert int(s.training_time_code) == ntk_tt.INVALID and s.divergence == "unknown"
        for field in ("training_time", "training_time_hard", "final_loss", "test_accuracy",
                      "d_training_time_d_lr", "d_training_time_d_momentum", "d_final_loss_d_lr",
                      "d_final_loss_d_momentum", "d_test_accuracy_d_lr",
                      "training_time_elasticity", "final_loss_elasticity"):
            assert np.isnan(float(getattr(s, field))), field
    traced, eager = run(lr, 0.5), ntk_tt.sensitivities(
        p["kernel"], p["y"], learning_rate=lr, momentum=0.5, steps=STEPS, f0=p["f0"],
        kernel_test=p["kernel_test"], f0_test=p["f0_test"], y_test=p["yt"])
    assert int(traced.training_time_code) == int(eager.training_time_code) == 0
    for field in ("training_time", "d_training_time_d_lr", "d_final_loss_d_momentum"):
        assert float(getattr(traced, field)) == pytest.approx(float(getattr(eager, field)),
                                                              rel=1e-9), field


def test_a_vmapped_sensitivities_reads_its_calls_per_entry(x64):
    """A fresh user: jax.vmap(sensitivities) over η returned its numbers, but .divergence and
    .training_time_reason raised a bare TypeError; they are now object arrays holding each
    entry's eager value. A traced steps says it cannot be traced (it said "got JitTracer")."""
    p = _plain_problem()
    lam = _lam_max(p["kernel"])
    lrs = jnp.array([0.5 * N / lam, 3.0 * N / lam])  # trains; MSE beyond the edge: diverges

    def one(eta):
        return ntk_tt.sensitivities(p["kernel"], p["y"], learning_rate=eta, steps=STEPS,
                                    f0=p["f0"], loss="mse")

    batch = jax.vmap(one)(lrs)
    eager = [one(float(eta)) for eta in lrs]
    assert batch.divergence.shape == batch.training_time_reason.shape == (2,)
    assert list(batch.divergence) == [e.divergence for e in eager] == ["no", "yes"]
    assert list(batch.training_time_reason) == [e.training_time_reason for e in eager]
    assert batch.training_time_reason[0] is None and "diverged" in batch.training_time_reason[1]
    assert list(batch.divergence_reason) == [e.divergence_reason for e in eager]
    with pytest.raises(ValueError, match=r"^steps cannot be traced \(jit / vmap / grad over "
                                         r"it\): it sets the recursion's length"):
        jax.jit(lambda t: ntk_tt.sensitivities(p["kernel"], p["y"], learning_rate=lrs[0],
                                               steps=t, f0=p["f0"], loss="mse"))(STEPS)


def _head_apply(params, x):
    """f = (x V + c) W + b: a linear backbone under a linear head, of exactly the head-aware
    form (its feature kernel is K_h(i, j) = (x_i·x_j + 1) I_F, isotropic)."""
    return (x @ params["v"] + params["c"]) @ params["w"] + params["b"]


def _head_problem(d=5, f=4, c=3, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(N + NT, d)))
    y = jnp.asarray(rng.integers(0, c, N + NT))
    params = {"v": jnp.asarray(rng.normal(size=(d, f)) / np.sqrt(d)), "c": jnp.zeros(f, F64),
              "w": jnp.asarray(0.3 * rng.normal(size=(f, c))), "b": jnp.zeros(c, F64)}
    xs, xts = x[:N], x[N:]
    hk = HeadAwareKernel(xs @ params["v"] + params["c"], params["w"], params["b"],
                         xs @ xs.T + 1.0, jnp.eye(f, dtype=F64),
                         xts @ params["v"] + params["c"], xts @ xs.T + 1.0)
    return params, x, y, hk


def test_head_aware_sgd_sensitivities_match_central_differences(x64):
    """Head-aware kernel, SGD (B = 4, one batch order = the real run's), heavy ball: d/dη and
    d/dm of T_ε (smooth), L_T and the smoothed held-out accuracy against central differences
    of real optax SGD on a linear-backbone network of exactly the head-aware form (so its
    real curves are the predicted ones: checked to 1e-9), and T_ε within 1 step of the hard
    training_time of that curve."""
    b, steps = 4, 40
    params, x, yy, hk = _head_problem()
    y, yt = yy[:N], yy[N:]
    key = jax.random.key(3)
    lr, m = 0.2, 0.5
    s = ntk_tt.sensitivities(hk, y, learning_rate=lr, momentum=m, epsilon=EPS, steps=steps,
                             batch_size=b, key=key, num_paths=1, y_test=yt)
    assert not bool(s.diverged)
    batches = ntk_tt.batch_indices(key, N, b, steps)

    def real(lr_, m_):
        fs = _train(_head_apply, params, x[:N], y, batches, x, lr_, m_, nesterov=False,
                    loss="cross_entropy")
        curve = jax.vmap(lambda f: ntk_tt.mean_loss(f[:N], y, "cross_entropy"))(fs)
        return np.array([float(_smooth_t(curve, EPS, temperature=TAU)), float(curve[-1]),
                         _soft_accuracy(fs[-1, N:], yt, 0.1)]), np.asarray(curve)

    h_lr, h_m = 1e-6 * lr, 1e-6
    d_lr, d_m = _central(lambda a, b_: real(a, b_)[0], lr, m, h_lr, h_m)
    got_lr = [s.d_training_time_d_lr, s.d_final_loss_d_lr, s.d_test_accuracy_d_lr]
    got_m = [s.d_training_time_d_momentum, s.d_final_loss_d_momentum,
             s.d_test_accuracy_d_momentum]
    for got, want in zip(got_lr + got_m, list(d_lr) + list(d_m), strict=True):
        np.testing.assert_allclose(float(got), want, rtol=1e-5)
        assert abs(float(got)) > 0
    values, curve = real(lr, m)
    np.testing.assert_allclose([float(s.training_time), float(s.final_loss),
                                float(s.soft_test_accuracy)], values, rtol=1e-9)
    hard = ntk_tt.training_time(curve, EPS)
    assert float(s.training_time_hard) == hard and abs(float(s.training_time) - hard) <= 1.0


MOMENTA = np.array([0.0, 0.3, 0.6, 0.9])
KAPPAS = np.geomspace(1.0, 5.0, 162)  # 1.0 % apart, >= 0.34 % from every edge 2(1 + m)


@pytest.fixture(scope="module")
def mse_grid():
    with jax.enable_x64(True):
        p = _plain_problem()
        lam = _lam_max(p["kernel"])
        lrs = KAPPAS * N / lam
        grid = ntk_tt.divergence_boundary(p["kernel"], p["y"], f0=p["f0"], momenta=MOMENTA,
                                          learning_rates=lrs, steps=300, loss="mse")
        return grid, p, lam


def test_divergence_boundary_is_the_closed_form_edge(mse_grid):
    """MSE, full-batch heavy ball on a plain kernel: the linear model diverges iff
    η·λ_max/N > 2(1 + m) (λ_max by numpy's eigvalsh, mean loss, h = 1). On a grid ~1 % apart
    with no point within 0.3 % of an edge, the diverged flags are exactly those above the
    closed form for every m, and the boundary is the grid point just below it, except where
    heavy ball's transient growth just below the edge spikes above 10·L_0 (the call
    "diverges": real networks did not survive that): there the boundary stops below the first
    such η, whose curve (predict_from_kernel's, checked) does rise above 10·L_0."""
    grid, p, lam = mse_grid
    lrs = grid.learning_rates
    assert grid.diverged.shape == grid.training_time.shape == grid.final_loss.shape == (4, 162)
    spiking = 0
    for i, m in enumerate(MOMENTA):
        edge = 2 * (1 + m) * N / lam
        assert np.min(np.abs(lrs / edge - 1)) > 3e-3  # the grid does not straddle the edge
        np.testing.assert_array_equal(grid.diverged[i], lrs > edge)
        said = grid.outcome[i] == DIVERGES
        assert said[lrs > edge].all()
        early = lrs[said & (lrs < edge)]
        stop = early.min() if early.size else edge
        assert grid.boundary[i] == lrs[lrs < stop].max(), (m, grid.boundary[i] * lam / N)
        for lr in early[:1]:
            with jax.enable_x64(True):
                loss = np.asarray(ntk_tt.predict_from_kernel(
                    p["kernel"], p["f0"], p["y"], learning_rate=lr, momentum=m, steps=300,
                    loss="mse").loss)
            assert loss.max() > 10 * loss[0] and loss[-1] < loss[0], (m, lr * lam / N)
            spiking += 1
    assert spiking <= 1  # only heavy ball's m = 0.9 spikes before its edge here
    assert grid.boundary_inside.all() and grid.monotone.all()
    called = grid.outcome == DIVERGES  # diverged, or (m = 0.9) a spike above 10·L_0
    assert np.all(np.isnan(grid.training_time[grid.diverged | called]))  # as predict's
    assert np.all(np.isfinite(grid.training_time[~called]))
    assert np.all(np.isnan(grid.test_accuracy))  # no held-out data given
    np.testing.assert_allclose(grid.kappa, KAPPAS, rtol=1e-6)


def test_grid_points_equal_single_predictions(mse_grid):
    """A few grid cells equal predict_from_kernel at the same (η, m): T_ε and L_T."""
    grid, p, _ = mse_grid
    with jax.enable_x64(True):
        for i, j in [(0, 10), (2, 50), (3, 90)]:
            pred = ntk_tt.predict_from_kernel(
                p["kernel"], p["f0"], p["y"], learning_rate=grid.learning_rates[j],
                momentum=MOMENTA[i], steps=300, loss="mse")
            np.testing.assert_allclose(grid.final_loss[i, j], float(pred.loss[-1]),
                                       rtol=1e-10)
            np.testing.assert_equal(grid.training_time[i, j],
                                    ntk_tt.training_time(np.asarray(pred.loss), EPS))


def test_a_bare_number_is_a_grid_of_one(mse_grid):
    """A fresh user's divergence_boundary(learning_rates=0.1) was told to convert it with
    np.asarray, whose 0-D result was refused too: a number is a grid of one, the same cell as
    the full grid's."""
    grid, p, _ = mse_grid
    with jax.enable_x64(True):
        one = ntk_tt.divergence_boundary(p["kernel"], p["y"], f0=p["f0"],
                                         momenta=float(MOMENTA[2]),
                                         learning_rates=float(grid.learning_rates[50]),
                                         steps=300, loss="mse")
    assert one.final_loss.shape == (1, 1)
    np.testing.assert_allclose(one.final_loss[0, 0], grid.final_loss[2, 50], rtol=1e-10)
    np.testing.assert_equal(one.training_time[0, 0], grid.training_time[2, 50])
    # a second probe: np.float64(...) and a 0-D array (what the message advised) were refused
    # ("must be a 1-D array ... got shape ()"); every 0-D number is a grid of one as well
    with jax.enable_x64(True):
        for as_zero_d in (np.float64, np.asarray, jnp.asarray):
            same = ntk_tt.divergence_boundary(
                p["kernel"], p["y"], f0=p["f0"], momenta=as_zero_d(float(MOMENTA[2])),
                learning_rates=as_zero_d(float(grid.learning_rates[50])), steps=300,
                loss="mse")
            np.testing.assert_array_equal(same.final_loss, one.final_loss)


def test_divergence_boundary_under_a_callers_jit_is_one_clear_error(mse_grid):
    """A fresh user's jax.jit over divergence_boundary's kernel ended in a raw
    TracerArrayConversionError: it is eager (numpy grid, its own compiled sweep), and now
    says so, naming the traced argument and the jittable functions, before any work."""
    grid, p, _ = mse_grid

    def boundary(kernel, lrs):
        return ntk_tt.divergence_boundary(kernel, p["y"], f0=p["f0"], momenta=MOMENTA,
                                          learning_rates=lrs, steps=300, loss="mse").boundary

    with jax.enable_x64(True):
        for traced, run in (("kernel", lambda k: boundary(k, grid.learning_rates)),
                            ("learning_rates", lambda lrs: boundary(p["kernel"], lrs))):
            arg = p["kernel"] if traced == "kernel" else jnp.asarray(grid.learning_rates)
            with pytest.raises(ValueError, match=rf"cannot run under jax.jit, vmap or grad "
                                                 rf"\({traced} traced\).*call it eagerly"):
                jax.jit(run)(arg)


def test_head_aware_grid_cells_equal_single_predictions(x64):
    """A HeadAwareKernel grid (cross-entropy, held-out data): cells equal predict_head_aware
    at the same (η, m), held-out accuracy included."""
    _, _, yy, hk = _head_problem()
    y, yt = yy[:N], yy[N:]
    lrs, ms = np.array([0.05, 0.5, 5.0]), np.array([0.0, 0.9])
    grid = ntk_tt.divergence_boundary(hk, y, momenta=ms, learning_rates=lrs, steps=20,
                                      y_test=yt)
    assert grid.diverged.shape == grid.test_accuracy.shape == (2, 3)
    for i, j in [(0, 1), (1, 0), (1, 2)]:
        pred = ntk_tt.predict_head_aware(hk, y, learning_rate=lrs[j], momentum=ms[i],
                                         steps=20, y_test=yt)
        assert grid.diverged[i, j] == bool(pred.diverged)
        np.testing.assert_allclose(grid.final_loss[i, j], float(pred.loss[-1]), rtol=1e-10)
        want = np.nan if pred.diverged else 1.0 - float(pred.test_error[-1])
        np.testing.assert_allclose(grid.test_accuracy[i, j], want)


def test_plot_whatif_returns_labelled_figure(mse_grid):
    from matplotlib.figure import Figure

    grid = mse_grid[0]
    fig = ntk_tt.plot_whatif(grid)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "learning rate η (log scale)"
    assert ax.get_ylabel() == "momentum m"
    assert ax.get_xscale() == "log"
    assert fig.axes[1].get_ylabel() == "predicted T_ε (optimiser steps)"  # colour bar
    line = ax.get_lines()[0]
    np.testing.assert_array_equal(line.get_xdata(), grid.boundary)
    fig2 = Figure()
    ax2 = fig2.add_subplot()
    assert ntk_tt.plot_whatif(grid, ax=ax2) is fig2
    with pytest.raises(ValueError, match="WhatIfGrid"):
        ntk_tt.plot_whatif({"diverged": grid.diverged})
    with pytest.raises(ValueError, match=r"ax must be a matplotlib Axes .*got str"):
        ntk_tt.plot_whatif(grid, ax="foo")  # was an AttributeError


def test_plot_whatif_draws_no_boundary_where_the_grid_has_none(mse_grid):
    """A fresh user's find: with no diverging η in the grid, ``boundary`` is the largest grid
    η (``boundary_inside`` False) and the plot drew it as the predicted divergence boundary."""
    grid, p, lam = mse_grid
    with jax.enable_x64(True):
        low = ntk_tt.divergence_boundary(p["kernel"], p["y"], f0=p["f0"], momenta=MOMENTA,
                                         learning_rates=np.array([0.1, 0.5]) * N / lam,
                                         steps=30, loss="mse")
    assert not low.boundary_inside.any()
    ax = ntk_tt.plot_whatif(low).axes[0]
    assert ax.get_lines() == [] and ax.get_legend() is None
    assert "no η of the grid is predicted to diverge" in ax.get_title()
    part = grid._replace(boundary_inside=np.array([True, False, True, True]))
    xs = ntk_tt.plot_whatif(part).axes[0].get_lines()[0].get_xdata()
    assert np.isnan(xs[1]) and np.array_equal(xs[[0, 2, 3]], grid.boundary[[0, 2, 3]])
    # a second: a one-point grid that diverges has boundary NaN, inside True, and the legend
    # named a boundary that was not drawn; cells of outcome "unknown" (beyond a frozen
    # cross-entropy Θ's edge) were white, like cells with no T_ε, and unexplained
    nan = grid._replace(boundary=np.full(len(MOMENTA), np.nan))
    ax = ntk_tt.plot_whatif(nan).axes[0]
    assert ax.get_lines() == [] and ax.get_legend() is None and "grey" in ax.get_title()
    unknown = low._replace(outcome=np.full(low.diverged.shape, 3))  # OUTCOMES[3]: "unknown"
    assert ntk_tt.OUTCOMES[3] == "unknown"
    legend = ntk_tt.plot_whatif(unknown).axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [
        "outcome unknown (beyond the predictor's edge)"]


def _tiny():
    """Valid numpy inputs for the validation tests (no JAX work to build them)."""
    return dict(kernel=np.eye(N * 3), f0=np.zeros((N, 3)), y=np.arange(N) % 3)


BAD_POINT = [
    (dict(learning_rate=0.0), "learning_rate must be in \\(0, inf\\).*positive float"),
    (dict(learning_rate=-1e-3), "learning_rate must be in"),
    (dict(learning_rate="0.1"), "learning_rate must be a real number"),
    (dict(learning_rate=np.array([0.1, 0.2])), "scalar.*divergence_boundary"),
    (dict(momentum=1.0), "momentum must be in \\[0, 1\\).*0.0 for plain"),
    (dict(momentum=-0.1), "momentum must be in"),
    (dict(epsilon=0.0), "epsilon must be in \\(0, 1\\).*0.1 for 10"),
    (dict(epsilon=1.5), "epsilon must be in"),
    (dict(temperature=0.0), "temperature must be in"),
    (dict(window=4), "window must be an odd int"),
    # steps 1..3 and the default window=5 the user never passed: say what to do
    (dict(steps=2), "steps = 2 is too short for the T_ε smoothing window \\(window = 5.*"
                    "use steps >= 4, or pass an odd window <= 3"),
    (dict(steps=0), "steps must be an int >= 1"),
    (dict(f0=None), "needs f0.*apply_fn"),
    (dict(kernel=np.eye(5)), "kernel must have shape"),
    (dict(f0=np.zeros((N, 3, 1))), "f0 must be the initial logits"),
    (dict(batch_size=4), "pass key"),
    (dict(batch_size=N + 1), "batch_size must satisfy"),
    (dict(y_test=np.zeros(NT, int)), "held-out data need all three"),
    # a fresh user: "no" (truthy) ran as Nesterov, as predict_from_kernel refuses it
    (dict(momentum=0.5, nesterov="no"), "nesterov must be True or False"),
]


@pytest.mark.parametrize("bad,match", BAD_POINT)
def test_sensitivities_refuses_bad_input_before_any_work(monkeypatch, bad, match):
    p = _tiny()

    def no_work(*a, **k):
        raise AssertionError("work started before validation")

    monkeypatch.setattr(_whatif, "_sensitivity_core", no_work)
    kw = dict(kernel=p["kernel"], y=p["y"], learning_rate=0.1, steps=10, f0=p["f0"]) | bad
    with pytest.raises(ValueError, match=match):
        ntk_tt.sensitivities(kw.pop("kernel"), kw.pop("y"), **kw)


def test_head_aware_refuses_f0(x64):
    hk = _head_problem()[3]._replace(features_test=None, backbone_test=None)
    y = jnp.arange(N, dtype=jnp.int32) % 3  # two classes or more: one is refused first
    with pytest.raises(ValueError, match="drop f0"):
        ntk_tt.sensitivities(hk, y, learning_rate=0.1, steps=5, f0=jnp.zeros((N, 3)))
    with pytest.raises(ValueError, match="no held-out features"):
        ntk_tt.divergence_boundary(hk, y, momenta=[0.0], learning_rates=[0.1], steps=5,
                                   y_test=y[:3])


BAD_GRID = [
    (dict(learning_rates=[0.2, 0.1]), "strictly increasing"),
    (dict(learning_rates=[0.0, 0.1]), r"learning_rates\[0\] = 0 is outside.*positive"),
    # a fresh user: np.float64(-0.1) in the message, and 1e-50 refused later as "learning_rate"
    (dict(learning_rates=np.array([-0.1, 0.1])), r"learning_rates\[0\] = -0\.1 is outside "),
    (dict(learning_rates=[1e-50, 0.1]), r"learning_rates\[0\] = 1e-50 is outside \[1\.1754944e-38, "
                                        r"3\.4028235e\+38\] \(float32's normal range\)"),
    (dict(learning_rates=[0.1, 1e300]), r"learning_rates\[1\] = 1e\+300 is outside"),
    (dict(learning_rates=np.ones((2, 2))), "1-D array"),
    (dict(learning_rates=[]), "at least one"),
    (dict(momenta=[0.0, 1.0]), r"momenta\[1\] = 1 is outside \[0, 1\)"),
    (dict(momenta=[-0.5]), r"momenta\[0\] = -0\.5 is outside"),
    (dict(epsilon=1.0), "epsilon must be in"),
    (dict(window=2), "window must be an odd int"),
    # issue 27: optimizer= is taken (tests/test_boundary_optimizer.py); Adam needs an AdamKernel
    (dict(optimizer=ntk_tt.adamw(1e-3)), r"pass kernel=ntk_tt.adam_head_aware_kernel"),
    (dict(nesterov=2), "nesterov must be True or False"),
]


@pytest.mark.parametrize("bad,match", BAD_GRID)
def test_divergence_boundary_refuses_bad_input_before_any_work(monkeypatch, bad, match):
    p = _tiny()

    def no_work(*a, **k):
        raise AssertionError("work started before validation")

    monkeypatch.setattr(_whatif, "_grid_core", no_work)
    kw = dict(momenta=[0.0, 0.5], learning_rates=[0.1, 0.2], steps=10, f0=p["f0"]) | bad
    with pytest.raises(ValueError, match=match):
        ntk_tt.divergence_boundary(p["kernel"], p["y"], **kw)


def test_grid_compiles_once_for_new_values(x64):
    """One jit(vmap(vmap)) per static configuration and shapes: new η / m values of the same
    grid shape reuse the compiled sweep."""
    p = _plain_problem()
    run = partial(ntk_tt.divergence_boundary, p["kernel"], p["y"], f0=p["f0"], steps=20,
                  loss="mse")
    run(momenta=[0.0, 0.5], learning_rates=[0.1, 0.2, 0.3])
    size = _whatif._grid_core._cache_size()
    out = run(momenta=[0.1, 0.7], learning_rates=[0.05, 0.5, 5.0])
    assert _whatif._grid_core._cache_size() == size
    assert out.diverged.shape == (2, 3) and out.boundary.shape == (2,)


def test_a_head_aware_kernel_of_other_inputs_names_both_n(x64, monkeypatch):
    """A HeadAwareKernel built on N = 16 inputs with labels of N = 10: refused before any
    work, the message naming both N (it was a label-shape error)."""
    hk = _head_problem()[3]._replace(features_test=None, backbone_test=None)

    def no_work(*a, **k):
        raise AssertionError("work started before validation")

    monkeypatch.setattr(_whatif, "_sensitivity_core", no_work)
    monkeypatch.setattr(_whatif, "_grid_core", no_work)
    y = jnp.zeros(10, jnp.int32)
    calls = (lambda: ntk_tt.sensitivities(hk, y, learning_rate=0.1, steps=5),
             lambda: ntk_tt.divergence_boundary(hk, y, momenta=[0.0], learning_rates=[0.1],
                                                steps=5))
    for call in calls:
        with pytest.raises(ValueError) as err:
            call()
        msg = str(err.value)
        assert f"built on N = {N} inputs" in msg and "y has N = 10 labels" in msg, msg
        assert "head_aware_kernel(split, x)" in msg


def test_divergence_boundary_prints_plain_numbers_and_keeps_its_types():
    """repr of the result: numbers without array(...) / np.float64(...) wrappers; the fields
    are still numpy arrays, epsilon and steps Python scalars (even when given as numpy)."""
    p = _tiny()
    grid = ntk_tt.divergence_boundary(p["kernel"], p["y"], f0=p["f0"], loss="mse",
                                      momenta=[0.0, 0.5], learning_rates=[0.5, 50.0],
                                      steps=np.int64(20), epsilon=np.float64(0.1))
    text = repr(grid)
    assert "np." not in text and "array(" not in text and "dtype" not in text, text
    assert text.startswith("WhatIfGrid(learning_rates=[ 0.5, 50. ], momenta=[0. , 0.5]"), text
    assert "boundary=[0.5, 0.5]" in text, text
    assert text.endswith("epsilon=0.1, steps=20, momentum_name='momentum m')"), text
    assert str(grid) == text
    assert type(grid.steps) is int and type(grid.epsilon) is float
    assert all(isinstance(grid[i], np.ndarray) for i in range(11))
    np.testing.assert_array_equal(grid.boundary, [0.5, 0.5])
    assert grid.diverged.tolist() == [[False, True], [False, True]]


@pytest.mark.parametrize("optimizer", [None, ntk_tt.sgd(0.1)], ids=["constant", "optimizer"])
def test_an_empty_kernel_is_named_not_a_batch_size(monkeypatch, optimizer):
    """A fresh user's probe: N = 0 said "batch_size must satisfy 1 <= batch_size <= N = 0"
    though no batch_size was given; it names the empty kernel / labels, before any work."""
    def no_work(*a, **k):
        raise AssertionError("work started before validation")

    monkeypatch.setattr(_whatif, "_sensitivity_core", no_work)
    monkeypatch.setattr(_whatif, "optimizer_sensitivities", no_work)
    p = _tiny()
    rule = dict(learning_rate=0.1) if optimizer is None else dict(optimizer=optimizer)
    with pytest.raises(ValueError) as err:
        ntk_tt.sensitivities(p["kernel"][:0, :0], p["y"][:0], f0=p["f0"][:0], steps=50, **rule)
    assert str(err.value).startswith("the kernel / labels are empty (N = 0: kernel of shape "
                                     "(0, 0), y of shape (0,))")
    assert "batch_size" not in str(err.value)


@pytest.mark.parametrize("kappa,verdict", [(10.0, "unknown"), (100.0, "yes")])
def test_the_divergence_call_is_predict_s(x64, kappa, verdict):
    """A fresh user's probe: beyond the edge, sensitivities said diverged False with T_ε NaN
    and no reason, while predict called divergence. Cross-entropy GD on a plain Θ at κ = 10
    (beyond the edge 4, below KAPPA_MAX = 68: the frozen recursion cannot tell, "unknown")
    and κ = 100 (≥ 68: "yes"): the outcome, T_ε code and κ are predict_from_kernel's (κ by
    numpy's eigvalsh); the reasons say why; no held-out data: no accuracy entries."""
    p = _plain_problem()
    lr = kappa * N / _lam_max(p["kernel"])
    s = ntk_tt.sensitivities(p["kernel"], p["y"], learning_rate=lr, steps=STEPS, f0=p["f0"])
    pred = ntk_tt.predict_from_kernel(p["kernel"], p["f0"], p["y"], learning_rate=lr,
                                      steps=STEPS)
    np.testing.assert_allclose(float(s.kappa), kappa, rtol=1e-9)
    assert int(s.outcome) == int(pred.outcome) and s.divergence == verdict
    assert VERDICTS[int(pred.divergence)] == verdict
    if not bool(s.diverged):  # the frozen CE recursion: no T_ε beyond the edge, as predict;
        # called divergent (κ ≥ 68): none either, for that reason
        code = 5 if verdict == "unknown" else 7
        assert int(s.training_time_code) == int(pred.training_time_code[0, 1]) == code
        assert s.training_time_reason.startswith("beyond the stability edge" if code == 5
                                                 else "predicted to diverge")
    assert np.isnan(float(s.training_time)) and np.isnan(float(s.d_training_time_d_lr))
    reason = s.divergence_reason
    if verdict == "unknown":
        assert reason.startswith("κ = η·λ_max/N = 10 is beyond the linearised model's")
    elif not bool(s.diverged):
        assert reason.startswith("κ = η·λ_max/N = 100 ≥ 68")
    assert s.test_accuracy is None and s.d_test_accuracy_d_lr is None


def test_cross_entropy_grid_far_beyond_the_edge_says_what_predict_says(x64):
    """A fresh user's probe: cross-entropy on a frozen Θ at κ ≈ 10⁴, far beyond the edge,
    where the linearised curve spikes to thousands of L_0 and comes back: predict's T_ε is NaN
    (BEYOND_EDGE) and its call "diverges", but the grid gave a finite T_ε and put the
    boundary at that η. Now every cell's T_ε, flag and call are predict_from_kernel's and the
    boundary stops below it."""
    p = _plain_problem()
    lam = _lam_max(p["kernel"])
    lrs = np.array([0.5, 1e4]) * N / lam
    grid = ntk_tt.divergence_boundary(p["kernel"], p["y"], f0=p["f0"], momenta=[0.0],
                                      learning_rates=lrs, steps=60)
    for j, lr in enumerate(lrs):
        pred = ntk_tt.predict_from_kernel(p["kernel"], p["f0"], p["y"], learning_rate=lr,
                                          steps=60)
        assert grid.diverged[0, j] == bool(pred.diverged)
        assert grid.outcome[0, j] == int(pred.outcome)
        defined = np.isfinite(float(pred.training_time[0, 1]))  # loss T_0.1 of predict
        t = ntk_tt.training_time(np.asarray(pred.loss), EPS) if defined else np.nan
        np.testing.assert_equal(grid.training_time[0, j], t)
    loss = np.asarray(ntk_tt.predict_from_kernel(p["kernel"], p["f0"], p["y"],
                                                 learning_rate=lrs[1], steps=60).loss)
    assert loss.max() > 10 * loss[0] and not grid.diverged[0, 1]  # spiked, came back
    assert ntk_tt.OUTCOMES[grid.outcome[0, 1]] == "diverges"
    assert np.isnan(grid.training_time[0, 1]) and np.isfinite(grid.training_time[0, 0])
    assert grid.boundary[0] == lrs[0] and grid.boundary_inside[0]



@pytest.mark.parametrize("optimizer", [None, ntk_tt.sgd(0.1)], ids=["constant", "optimizer"])
def test_a_kernel_f0_pair_as_kernel_says_where_each_goes(monkeypatch, optimizer):
    """A fresh user passed (K, f0) as kernel: sensitivities (with or without f0=) and
    divergence_boundary gave numpy's raw "setting an array element with a sequence ... an
    inhomogeneous shape"; now predict_from_kernel's ragged-kernel message and the fix (Θ as
    kernel, the logits as f0=), for a full (N·C, N·C) or logit-summed (N, N) Θ, before any
    work. Two arrays of one shape (N = C, an (N, N) Θ) stack to 3-D: the same fix."""
    def no_work(*a, **k):
        raise AssertionError("work started before validation")

    for module, name in ((_whatif, "_sensitivity_core"), (_whatif, "_grid_core"),
                         (_whatif, "optimizer_sensitivities"),
                         (_whatif_boundary, "_optimizer_grid_core")):
        monkeypatch.setattr(module, name, no_work)
    p = _tiny()
    rule = dict(learning_rate=0.1) if optimizer is None else dict(optimizer=optimizer)
    grid = dict(momenta=[0, .9], learning_rates=[.01, .1, 10.], steps=20)
    grid = grid if optimizer is None else grid | dict(optimizer=optimizer)
    fix = ("It looks like a (Θ, f0) pair (shapes {} and {}): pass Θ as kernel and the "
           "initial logits as f0=, e.g. sensitivities(kernel, y, f0=f0, ...) or "
           "divergence_boundary(kernel, y, f0=f0, ...).")
    for theta in (p["kernel"], np.eye(N)):
        said = ("kernel is a ragged {} (rows of different lengths, 2 at the top level); pass "
                "a rectangular array. " + fix.format(theta.shape, (N, 3)))
        calls = ((ntk_tt.sensitivities, (theta, p["f0"]), dict(steps=20, **rule)),
                 (ntk_tt.sensitivities, [theta, p["f0"]], dict(f0=p["f0"], steps=20, **rule)),
                 (ntk_tt.divergence_boundary, (theta, p["f0"]), grid))
        for call, kernel, kw in calls:
            with pytest.raises(ValueError) as err:
                call(kernel, p["y"], **kw)
            assert str(err.value) == said.format(type(kernel).__name__)
    with pytest.raises(ValueError) as err:  # N = C = 3: an (N, N) Θ and f0 of one shape
        ntk_tt.sensitivities((np.eye(3), np.zeros((3, 3))), np.arange(3), steps=20, **rule)
    assert str(err.value) == "kernel is a tuple of two arrays, not one Θ. " + fix.format(
        (3, 3), (3, 3))


def test_nesterov_at_momentum_zero_is_refused_in_the_what_ifs(mse_grid):
    """A fresh user: sensitivities(nesterov=True) at m = 0 was NaN throughout with reasons
    "beyond the stability edge" and "under jit / vmap", and divergence_boundary with Nesterov
    over momenta holding 0 gave that row all "unknown" and its boundary the grid's largest η
    (inside False: "nothing diverges"). Both are refused, as predict_from_kernel refuses m = 0
    with Nesterov; a grid of momenta > 0 with Nesterov still runs."""
    _, p, lam = mse_grid
    kw = dict(f0=p["f0"], loss="mse", steps=20)
    lrs = np.array([0.5, 1.0, 3.0]) * N / lam
    with jax.enable_x64(True):
        for call in (
                lambda: ntk_tt.sensitivities(p["kernel"], p["y"], learning_rate=lrs[0],
                                             nesterov=True, **kw),
                lambda: ntk_tt.divergence_boundary(p["kernel"], p["y"], nesterov=True,
                                                   momenta=np.array([0.0, 0.5]),
                                                   learning_rates=lrs, **kw),
                lambda: ntk_tt.divergence_boundary(
                    p["kernel"], p["y"], optimizer=ntk_tt.sgd(lrs[0], 0.5, nesterov=True),
                    momenta=np.array([0.0, 0.5]), learning_rates=lrs, **kw)):
            with pytest.raises(ValueError, match="^Nesterov needs momentum > 0"):
                call()
        grid = ntk_tt.divergence_boundary(p["kernel"], p["y"], nesterov=True,
                                          momenta=np.array([0.3, 0.5]), learning_rates=lrs,
                                          **kw)
        assert np.isfinite(grid.boundary).all()


def test_held_out_arrays_without_the_held_out_kernel_are_refused():
    """predict_from_kernel silently dropped y_test (or f0_test) given without kernel_test:
    no held-out curve and no error, where predict refuses y_test without x_test."""
    p = _plain_problem()
    for rule in (dict(learning_rate=0.1), dict(optimizer=ntk_tt.sgd(0.1))):
        for extra, said in ((dict(y_test=p["y"][:3]), "y_test"),
                            (dict(f0_test=p["f0"][:3]), "f0_test")):
            with pytest.raises(ValueError, match=f"^{said} without kernel_test: the held-out "):
                ntk_tt.predict_from_kernel(p["kernel"], p["f0"], p["y"], steps=5, **rule,
                                           **extra)
