"""divergence_boundary(optimizer=) (issue 27): every grid cell against an independent
predict_from_kernel / predict_head_aware(optimizer=) built directly at that peak and momentum
(frozen-kernel SGDW with warmup-cosine, GD and a minibatch; head-aware SGD with Nesterov and
L2 decay; AdamW on an AdamKernel; a callable schedule), the constant-schedule MSE GD boundary
against the closed-form heavy-ball edge and the constant-η grid, and the refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _ntk_models import mlp_problem, mlp_split_problem

import ntk_tt
from ntk_tt.analysis import _whatif, _whatif_boundary
from ntk_tt.dynamics._divergence import outcome
from ntk_tt.kernels._head_aware import HeadAwareKernel

N, NT, C, T, EPS = 16, 6, 3, 30, 0.1


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def _plain():
    return mlp_problem(N, NT, C)


def _split():
    return mlp_split_problem(N, NT, C)


def _check_cells(grid, reference, adam=False):
    """Every cell (i, j) of ``grid`` against ``reference(peak, m)``, a KernelPrediction."""
    for i, m in enumerate(grid.momenta):
        for j, peak in enumerate(grid.learning_rates):
            pred = reference(float(peak), float(m))
            div = bool(pred.diverged)
            where = f"m = {m}, peak = {peak}"
            assert grid.diverged[i, j] == div, where
            # predict_head_aware abstains beyond Adam's weight travel ρ = 1 ("unknown"); the
            # grid, which looks for the divergence edge, keeps the curve's own call there
            own = (int(outcome(jnp.asarray(pred.loss)).outcome)
                   if adam and bool(pred.beyond_edge) else int(pred.outcome))
            assert grid.outcome[i, j] == own, where
            # T_ε NaN where predict's is: diverged, or a frozen cross-entropy Θ beyond the edge
            blind = not np.isfinite(np.asarray(pred.training_time)).any()
            hard = np.nan if div or blind else ntk_tt.training_time(np.asarray(pred.loss), EPS)
            np.testing.assert_equal(grid.training_time[i, j], hard, err_msg=where)
            np.testing.assert_allclose(grid.final_loss[i, j], float(pred.loss[-1]), rtol=1e-9,
                                       err_msg=where)
            acc = np.nan if div or pred.test_error is None else 1 - float(pred.test_error[-1])
            # the error rate is a float32 mean of booleans even under x64
            np.testing.assert_allclose(grid.test_accuracy[i, j], acc, atol=1e-7,
                                       err_msg=where)
            np.testing.assert_allclose(grid.kappa[j], float(pred.kappa), rtol=1e-12)
            assert grid.beyond_edge[i, j] == (False if adam else bool(pred.beyond_edge)), where


@pytest.mark.parametrize("batch_size,loss", [(None, "mse"), (4, "cross_entropy")])
def test_plain_kernel_sgdw_cells_are_predict_from_kernel(batch_size, loss):
    """Frozen Θ, SGDW with warmup-cosine (init and end 10 % / 5 % of the peak), GD (MSE) and
    B = 4 over two batch orders of one key (cross-entropy), held-out data: each cell is
    predict_from_kernel(optimizer=sgd(warmup_cosine(p, 5, T, init=0.1p, end=0.05p), m,
    weight_decay=0.05, batch_size=B)); peaks at κ = 0.5, 2.5, 8 straddle the edges."""
    kernel, f0, y, held, tangents = _plain()
    key = jax.random.key(7)

    def make(peak, m):
        sched = ntk_tt.warmup_cosine(peak, 5, T, init=0.1 * peak, end=0.05 * peak)
        return ntk_tt.sgd(sched, m, weight_decay=0.05, batch_size=batch_size)

    peaks = np.array([0.5, 2.5, 8.0]) * N / np.linalg.eigvalsh(np.asarray(kernel))[-1]
    grid = ntk_tt.divergence_boundary(kernel, y, f0=f0, optimizer=make(1.0, 0.9),
                                      momenta=[0.0, 0.5], learning_rates=peaks, steps=T,
                                      key=key, num_paths=2, loss=loss, **held, **tangents)
    assert grid.diverged.shape == grid.test_accuracy.shape == (2, 3)
    _check_cells(grid, lambda p, m: ntk_tt.predict_from_kernel(
        kernel, f0, y, optimizer=make(p, m), steps=T, key=key, num_paths=2, loss=loss,
        **held, **tangents))
    if loss == "mse":  # the grid crosses the boundary
        assert grid.diverged.any() and not grid.diverged.all()


def test_head_aware_sgd_and_adamw_cells_are_predict_head_aware():
    """A HeadAwareKernel of the MLP: Nesterov SGD with L2 decay, B = 4 over two batch orders
    (cells = predict_head_aware(optimizer=) at each peak and m); then AdamW on the
    AdamKernel built for the template (cells at each peak and β₁; beyond_edge False, κ as
    predict's)."""
    split, x, y, xt, yt, tangents = _split()
    hk = ntk_tt.head_aware_kernel(split, x, xt)
    key = jax.random.key(3)

    def sgd(peak, m):
        return ntk_tt.sgd(ntk_tt.warmup_cosine(peak, 4, T), m, nesterov=True,
                          weight_decay=0.05, decoupled=False, batch_size=4)

    lrs = [0.05, 0.5, 5.0]
    grid = sgd_grid = ntk_tt.divergence_boundary(
        hk, y, optimizer=sgd(1.0, 0.5), momenta=[0.3, 0.8], learning_rates=lrs, steps=T,
        key=key, num_paths=2, y_test=yt, a=tangents["a_h"], a_test=tangents["a_h_test"])
    _check_cells(grid, lambda p, m: ntk_tt.predict_head_aware(
        hk, y, optimizer=sgd(p, m), steps=T, key=key, num_paths=2, y_test=yt, **tangents))

    def adamw(peak, b1):
        return ntk_tt.adamw(ntk_tt.warmup_cosine(peak, 3, T), b1, 0.99, weight_decay=0.1)

    ak = ntk_tt.adam_head_aware_kernel(split, x, y, adamw(1e-2, 0.9), xt, hk=hk)
    grid = ntk_tt.divergence_boundary(ak, y, optimizer=adamw(1e-2, 0.9), momenta=[0.0, 0.9],
                                      learning_rates=[1e-3, 3e-2, 1.0], steps=T, y_test=yt,
                                      a=tangents["a_h"], a_test=tangents["a_h_test"])
    _check_cells(grid, lambda p, b1: ntk_tt.predict_head_aware(
        ak, y, optimizer=adamw(p, b1), steps=T, y_test=yt, **tangents), adam=True)
    assert np.isfinite(grid.final_loss).all() and grid.final_loss[1, 1] < 0.9 * np.log(C)
    # its figure's y axis names β₁ (it said "momentum m"); SGD grids keep m
    assert ntk_tt.plot_whatif(grid).axes[0].get_ylabel() == "Adam β₁"
    assert grid.momentum_name == "Adam β₁" and sgd_grid.momentum_name == "momentum m"


def test_a_callable_schedule_is_scaled_to_each_peak():
    """sgd(lambda t: 0.2·0.95^t): the grid at peak p is the exponential schedule p·0.95^t."""
    kernel, f0, y, _, _ = _plain()
    grid = ntk_tt.divergence_boundary(kernel, y, f0=f0, optimizer=ntk_tt.sgd(
        lambda t: 0.2 * 0.95 ** t), momenta=[0.3], learning_rates=[0.05, 0.5], steps=T)
    _check_cells(grid, lambda p, m: ntk_tt.predict_from_kernel(
        kernel, f0, y, optimizer=ntk_tt.sgd(ntk_tt.exponential(p, 0.95), m), steps=T))


MOMENTA = np.array([0.0, 0.5, 0.9])
EDGES = 2 * (1 + MOMENTA)  # heavy ball, MSE (h = 1): κ = η·λ_max/N = 2(1 + m)
KAPPAS = np.sort(np.concatenate([[1.0, 1.5, 2.5, 3.4, 4.5], 0.98 * EDGES, 1.02 * EDGES]))


def test_constant_schedule_gd_boundary_is_the_heavy_ball_edge_and_the_constant_grid():
    """MSE, full-batch GD, a constant schedule on a plain Θ: for each m the boundary is the
    grid point 2 % below the closed-form edge 2(1 + m)·N/λ_max (λ_max by numpy's eigvalsh),
    the diverged flags are exactly the points above it, and the whole grid is the constant-η
    divergence_boundary's; a warmup-cosine template of the same T reuses the compiled grid."""
    kernel, f0, y, _, _ = _plain()
    lam = np.linalg.eigvalsh(np.asarray(kernel))[-1]
    lrs = KAPPAS * N / lam
    common = dict(f0=f0, loss="mse", steps=300, momenta=MOMENTA, learning_rates=lrs)
    grid = ntk_tt.divergence_boundary(kernel, y, optimizer=ntk_tt.sgd(0.1), **common)
    for i, edge in enumerate(EDGES * N / lam):
        assert grid.boundary[i] == lrs[lrs < edge].max(), (MOMENTA[i], grid.boundary[i])
        np.testing.assert_array_equal(grid.diverged[i], lrs > edge)
        np.testing.assert_array_equal(grid.beyond_edge[i], lrs > edge)
    assert grid.boundary_inside.all() and grid.monotone.all()
    np.testing.assert_allclose(grid.kappa, KAPPAS, rtol=1e-10)
    old = ntk_tt.divergence_boundary(kernel, y, **common)
    for name, value in old._asdict().items():  # bit for bit (NaN where NaN)
        np.testing.assert_array_equal(getattr(grid, name), value, err_msg=name)
    size = _whatif_boundary._optimizer_grid_core._cache_size()
    other = ntk_tt.divergence_boundary(
        kernel, y, optimizer=ntk_tt.sgd(ntk_tt.warmup_cosine(1.0, 20, 300)),
        **common | dict(learning_rates=lrs * 1.1))
    assert _whatif_boundary._optimizer_grid_core._cache_size() == size
    assert not np.array_equal(other.final_loss, grid.final_loss)


def _adam_kernel():
    rng = np.random.default_rng(0)
    hk = HeadAwareKernel(rng.normal(size=(N, 4)), rng.normal(size=(4, C)), np.zeros(C),
                         np.eye(N), np.eye(4))
    return ntk_tt.AdamKernel(hk, hk, N, None, 1e-8)


BAD = [
    (dict(batch_size=4), "divergence_boundary: optimizer= describes the whole update rule.*"
     "drop batch_size"),
    (dict(nesterov=True), "drop nesterov"),
    (dict(learning_rates=[0.2, 0.1]), "learning_rates must be strictly increasing"),
    (dict(momenta=[0.0, 1.0]), r"momenta\[1\] = 1 is outside \[0, 1\)"),
    (dict(optimizer="sgd"), "optimizer must be an ntk_tt.Optimizer"),
    (dict(optimizer=ntk_tt.adamw(1e-3)), "pass kernel=ntk_tt.adam_head_aware_kernel"),
    (dict(optimizer=ntk_tt.sgd(0.1, weight_decay=0.1)), "weight decay acts on J·θ0: pass a"),
    (dict(optimizer=ntk_tt.sgd(0.1, batch_size=4)), "pass key=jax.random.key"),
    (dict(optimizer=ntk_tt.sgd(ntk_tt.warmup_cosine(0.1, 12, 20))), "warmup is 12 steps"),
    (dict(optimizer=ntk_tt.sgd(lambda t: -0.1 + 0.0 * t)), "finite and >= 0 at every step"),
    (dict(optimizer=None, a=np.zeros((N, C))),
     r"a belong\(s\) to divergence_boundary\(\.\.\., optimizer=\)"),
    (dict(kernel="adam"), "AdamKernel is for an Adam optimizer"),
    (dict(kernel="adam", optimizer=ntk_tt.adamw(0.1, batch_size=4), key=jax.random.key(0)),
     "built for batch size 16"),
    (dict(kernel="adam", optimizer=ntk_tt.adamw(0.1, eps=0.1)), "built for Adam's ε = 1e-08"),
    (dict(kernel=np.eye(N * C) + np.eye(N * C, k=1)), "not symmetric"),  # predict's check
]


@pytest.mark.parametrize("bad,match", BAD)
def test_bad_input_is_refused_before_any_work(monkeypatch, bad, match):
    def no_work(*a, **k):
        raise AssertionError("work started before validation")

    monkeypatch.setattr(_whatif_boundary, "_optimizer_grid_core", no_work)
    monkeypatch.setattr(_whatif, "_grid_core", no_work)
    kw = dict(kernel=np.eye(N * C), f0=np.zeros((N, C)), optimizer=ntk_tt.sgd(0.1),
              momenta=[0.0, 0.5], learning_rates=[0.1, 0.2], steps=10) | bad
    if isinstance(kw["kernel"], str):
        kw |= dict(kernel=_adam_kernel(), f0=None)
    with pytest.raises(ValueError, match=match):
        ntk_tt.divergence_boundary(kw.pop("kernel"), np.arange(N) % C, **kw)
