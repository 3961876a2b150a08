"""``ntk_tt.suggest`` and ``ntk-tt suggest``: against closed forms and brute-force grids of the
same predictor, divergence never suggested, surrogate gradient vs finite differences, errors."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import ntk_tt
from ntk_tt.analysis._suggest_curves import (
    _STATIC,
    _surrogate,
    _surrogate_grad,
    soft_time_to_target,
)
from ntk_tt.analysis._suggest_search import _batches
from ntk_tt.cli import main
from ntk_tt.dynamics._divergence import OUTCOMES

# --- a plain linear model whose kernel is diagonal: time to target in closed form ------------


def diag_apply(params, x):
    """f(x) = x W: Θ = (x xᵀ) ⊗ I_C, diagonal for orthogonal rows x_i = √λ_i e_i."""
    return x @ params["w"]


def diag_problem(ratios, c=2, first_residual=1.0):
    """x_i = √(100·r_i) e_i, W = 0, labels alternating: MSE GD has, with κ = η·λ_max/N,
    L_t / L_0 = mean_i (1 − κ r_i)^(2t) (each residual f_i − y_i scales by 1 − η λ_i / N).
    ``first_residual`` < 1 starts sample 0 that close to its label (W's row 0 set)."""
    r = np.asarray(ratios, float)
    n = len(r)
    x = jnp.asarray(np.diag(np.sqrt(100.0 * r)), jnp.float32)
    w = np.zeros((n, c), np.float32)
    w[0, 0] = (1.0 - first_residual) / np.sqrt(100.0 * r[0])
    y = jnp.asarray(np.arange(n) % c, jnp.int32)
    return {"w": jnp.asarray(w)}, x, y


def closed_form_steps(kappa, ratios, fraction, steps):
    """First t ≤ steps with mean_i (1 − κ r_i)^(2t) ≤ fraction (NaN if none), for κ (K,)."""
    kappa = np.atleast_1d(np.asarray(kappa, float))[:, None, None]
    t = np.arange(steps + 1)[None, :, None]
    curve = np.mean((1.0 - kappa * np.asarray(ratios)[None, None, :]) ** (2 * t), axis=-1)
    hit = curve <= fraction
    return np.where(hit.any(1), hit.argmax(1), np.nan).astype(float)


def linear_suggest(ratios, fraction, steps, first_residual=1.0, **kw):
    params, x, y = diag_problem(ratios, first_residual=first_residual)
    kw = dict(target=fraction, target_kind="fraction", steps=steps, loss="mse",
              momenta=(0.0,), seconds_per_step={None: 0.01}) | kw
    return ntk_tt.suggest(diag_apply, params, x, y, **kw)


# interior optimum: two fast samples (r = 1) and six slow ones (r = 0.05); near the edge
# κ = 2 the fast modes stop decaying, so the fastest κ is inside (0, 2)
INTERIOR = [1.0, 1.0] + [0.05] * 6


def test_mse_gd_interior_optimum_equals_the_closed_form():
    s = linear_suggest(INTERIOR, 0.2, 60, refine_steps=12)
    dense = np.linspace(1e-3, 2.0 - 1e-6, 40001)
    t_dense = closed_form_steps(dense, INTERIOR, 0.2, 60)
    best = np.nanmin(t_dense)
    grid = s.grid[s.grid.source == "grid"]
    stable = grid[~grid.beyond_edge]  # the grid's times are the closed form at its κ
    cf = closed_form_steps(stable.kappa.to_numpy(), INTERIOR, 0.2, 60)
    assert np.array_equal(np.nan_to_num(cf, nan=-1), stable.steps.fillna(-1).to_numpy())
    assert s.grid_best["steps"] == np.nanmin(cf) > best  # the coarse grid misses the optimum
    # the refinement finds it: the closed-form optimum over 40,001 κ in (0, 2)
    assert s.found and s.refined and s.steps == best == 8
    assert closed_form_steps(s.kappa, INTERIOR, 0.2, 60)[0] == s.steps
    assert s.seconds == pytest.approx(s.steps * 0.01)
    assert s.learning_rate == pytest.approx(s.kappa * 8 / s.lambda_max)


# edge optimum: one fast sample carries 1/40 of the loss, far below the target's reach, so
# larger κ is faster all the way to the stability edge κ = 2 (MSE, m = 0)
EDGE = [1.0] + [0.01] * 39


def test_mse_gd_edge_optimum_is_the_largest_stable_learning_rate():
    s = linear_suggest(EDGE, 0.5, 80, kappa_range=(0.05, 50.0), num_kappas=10,
                       refine_steps=8)
    dense = np.linspace(1e-3, 2.0 - 1e-6, 40001)
    t_dense = closed_form_steps(dense, EDGE, 0.5, 80)
    best = np.nanmin(t_dense)
    optimal = dense[t_dense == best]  # κ ∈ [1.84, 2): the optimum is the largest stable η
    assert optimal.max() > 1.999 and optimal.min() > 1.8
    assert s.grid_best["kappa"] < 1.1  # the grid's largest stable κ is 1.08
    assert s.grid_best["steps"] > best
    assert s.found and s.refined and s.steps == best
    assert optimal.min() <= s.kappa < 2.0
    assert closed_form_steps(s.kappa, EDGE, 0.5, 80)[0] == s.steps


def test_the_refinement_stays_in_the_kappa_range_asked_for():
    """A fresh user: kappa_range=(0.05, 0.5) gave κ = 3.996, the refinement running on to the
    stability edge. On the edge-optimum problem with kappa_range (0.05, 1): the closed-form
    fastest κ (≈ 2, 18 steps) is outside the range; the suggestion is the range's fastest,
    κ = 1 (34 steps, the closed form), and no refinement candidate leaves [0.05, 1]."""
    s = linear_suggest(EDGE, 0.5, 80, kappa_range=(0.05, 1.0), num_kappas=5, refine_steps=8)
    assert closed_form_steps([1.0, 1.99], EDGE, 0.5, 80).tolist() == [34.0, 18.0]
    assert s.found and s.kappa <= 1.0 and s.kappa == pytest.approx(1.0, rel=1e-9)
    assert s.steps == s.grid_best["steps"] == 34
    assert closed_form_steps(s.kappa, EDGE, 0.5, 80)[0] == s.steps
    assert s.grid.kappa.between(0.05 * (1 - 1e-9), 1.0 * (1 + 1e-9)).all()
    lr_hi = 1.0 * 40 / s.lambda_max  # the range's η: κ·N/λ_max
    assert all(t["log_learning_rate"] <= np.log(lr_hi) + 1e-12 for t in s.refinement)


def refine_bounds(monkeypatch, kappa, m, n, lam, m_range, k_range, kappa_eff_max=None):
    """The ``bounds(u)`` that ``_suggest_refine._refine`` gives ``_descend`` (replaced:
    nothing runs) from a best grid point (κ, m), MSE, N = ``n``, λ_max = ``lam``."""
    from ntk_tt.analysis import _suggest_refine

    seen = {}
    monkeypatch.setattr(_suggest_refine, "_descend",
                        lambda best, u0, evaluate, bounds, *_: seen.update(bounds=bounds))
    best = {"kappa": kappa, "learning_rate": kappa * n / lam, "momentum": m, "b": None}
    _suggest_refine._refine(best, None, {}, lam, n, None, None, None, 8, 0.2, m_range, 0.01,
                            "mse", [], {}, None, k_range, kappa_eff_max)
    return seen["bounds"]


def test_the_constant_sgd_refinement_box_is_the_range_within_the_edge(monkeypatch):
    """The box ``_refine`` projects onto (its ``_descend`` replaced: nothing is run): κ in
    kappa_range ∩ [κ_best·e^(−10 cells), (1 − 1e-3)·edge(m)], and m raised to where that edge
    is above κ_min. MSE (edge 2(1 + m)), kappa_range (2.5, 3), momenta (0, 0.9): m >= 2.5 /
    (0.999·2) − 1; at m = 0.9 κ ∈ [2.5, 3] (the edge 3.796 is beyond the range)."""
    n, lam = 40, 100.0
    bounds = refine_bounds(monkeypatch, 2.8, 0.9, n, lam, (0.0, 0.9), (2.5, 3.0))

    def kappas(m):
        (low, high), m_range = bounds(np.array([0.0, m]))
        return np.exp([low, high]) * lam / n, m_range

    k, m_range = kappas(0.9)
    assert np.allclose(k, [2.5, 3.0], rtol=1e-12)
    m_floor = 2.5 / (0.999 * 2.0) - 1.0
    assert m_range == pytest.approx((m_floor, 0.9), rel=1e-12)
    assert np.allclose(kappas(m_floor)[0], [2.5, 2.5], rtol=1e-12)  # the edge reaches κ_min
    assert np.allclose(kappas(0.5)[0], [2.5, 0.999 * 2 * 1.5], rtol=1e-12)


def test_divergent_and_beyond_edge_configurations_are_never_suggested():
    """Sample 0 (the top eigenvalue) starts 1e-4 from its label: beyond the edge κ = 2 its mode
    grows as (κ − 1)^(2t) from 1e-8, so there the other modes reach the target sooner than at
    any stable κ, and the loss blows up before T."""
    ratios, steps = [1.0] + [0.05] * 7, 40
    for refine in (0, 6):
        s = linear_suggest(ratios, 0.5, steps, first_residual=1e-4, kappa_range=(0.05, 5.0),
                           num_kappas=9, refine_steps=refine, evaluate_beyond_edge=True)
        g = s.grid
        faster_bad = g[(g.steps < s.steps) & g.beyond_edge]
        assert len(faster_bad) >= 1 and faster_bad.diverged.all(), g
        assert s.found and s.kappa < 2.0
        row = g[(g.kappa == s.kappa) & (g.learning_rate == s.learning_rate)]
        assert len(row) == 1 and row.admissible.all() and not row.diverged.any()
        assert s.runners_up.admissible.all() and not s.runners_up.diverged.any()
        # the same configuration through the public predictor: not diverged, within the edge
        params, x, y = diag_problem(ratios, first_residual=1e-4)
        p = ntk_tt.predict_from_kernel(ntk_tt.empirical_ntk(diag_apply, params, x),
                                       diag_apply(params, x), y, learning_rate=s.learning_rate,
                                       momentum=s.momentum, steps=steps, loss="mse")
        assert not bool(p.diverged) and not bool(p.beyond_edge)
        assert np.allclose(np.asarray(p.loss), s.loss, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("sgd_seconds", [0.001, 0.05])
def test_the_batch_size_is_chosen_by_seconds_not_steps(sgd_seconds):
    """GD at 0.01 s/step against B = 4 at a cheap or a dear step: the choice is the least
    steps × seconds per step over both, whatever the steps alone say."""
    s = linear_suggest(INTERIOR, 0.2, 60, refine_steps=0, batch_sizes=(None, 4),
                       key=jax.random.key(0), num_paths=2,
                       seconds_per_step={None: 0.01, 4: sgd_seconds})
    g = s.grid[s.grid.admissible]
    per_b = g.groupby("gd").seconds.min()
    assert s.seconds == per_b.min()
    assert (s.batch_size is None) == (per_b[True] < per_b[False])
    assert (s.batch_size is None) == (sgd_seconds == 0.05)
    assert set(s.seconds_per_step) == {None, 4}


def test_beyond_edge_grid_points_are_listed_but_not_predicted_by_default():
    s = linear_suggest(EDGE, 0.5, 40, refine_steps=0)
    g = s.grid
    assert (~g.evaluated == g.beyond_edge).all() and g.beyond_edge.sum() == 7  # κ > 2 of 16
    assert g[~g.evaluated].steps.isna().all() and not g[~g.evaluated].admissible.any()
    assert g[g.evaluated].final_loss.notna().all()


def test_nothing_reaches_the_target_says_why():
    with pytest.warns(ntk_tt.TargetNotReachedWarning, match="raise the step budget"):
        s = linear_suggest(EDGE, 0.01, 5, refine_steps=0)
    assert not s.found and s.learning_rate is None and s.steps is None
    assert "no configuration of the grid reaches the target" in s.reason
    assert "raise the step budget" in s.reason and len(s.grid) == 16


# --- head-aware: a tanh backbone with a linear head, CE, GD and SGD -------------------------

N, D, F, C = 24, 6, 8, 3


class Net(nnx.Module):
    def __init__(self, rngs, dtype=jnp.float32):
        self.body = nnx.Linear(D, F, param_dtype=dtype, rngs=rngs)
        self.head = nnx.Linear(F, C, param_dtype=dtype, rngs=rngs)

    def __call__(self, x):
        return self.head(jnp.tanh(self.body(x)))


def head_problem(dtype=jnp.float32):
    model = Net(nnx.Rngs(0), dtype)
    x = jax.random.normal(jax.random.key(0), (N, D), dtype)
    y = jax.random.randint(jax.random.key(1), (N,), 0, C)
    apply_fn, params = ntk_tt.from_nnx(model)
    return model, apply_fn, params, x, y


def first_hit(curve, target):
    hit = np.asarray(curve) <= target
    return float(hit.argmax()) if hit.any() else np.nan


@pytest.mark.parametrize("b", [None, 8])
def test_head_aware_suggestion_matches_brute_force_grids(b):
    """GD and SGD (one B per test to keep each under 30 s; the choice between batch sizes is
    tested on the linear model below)."""
    model, apply_fn, params, x, y = head_problem()
    head, key, steps = ntk_tt.split_head(model), jax.random.key(2), 30
    sps = {b: 0.45}
    hk = ntk_tt.head_aware_kernel(head, x)
    # SGD reuses the kernel built here (head_kernel), GD builds its own: the same kernel
    given = dict(head_kernel=hk) if b is not None else {}
    s = ntk_tt.suggest(apply_fn, params, x, y, head=head, target=0.4, target_kind="fraction",
                       steps=steps, batch_sizes=(b,), momenta=(0.0, 0.9), num_kappas=7,
                       refine_steps=0, key=key, num_paths=2, seconds_per_step=sps, **given)
    assert s.predictor == ("head_aware:given" if given else "head_aware:isotropic")
    assert s.found and s.batch_size == b
    coarse = np.geomspace(0.05, 50, 7)
    dense = np.geomspace(0.05, 50, 7 * 8 - 7)  # 8 points per coarse cell
    kappas = np.concatenate([coarse, dense])
    # the public predictor on both grids × m ∈ {0, 0.9}, one compiled vmap
    kk, mm = (a.ravel() for a in np.meshgrid(kappas, [0.0, 0.9], indexing="ij"))
    fn = jax.jit(jax.vmap(lambda lr, m: ntk_tt.predict_head_aware(
        hk, y, learning_rate=lr, momentum=m, steps=steps, batch_size=b, key=key, num_paths=2)))
    out = fn(jnp.asarray(kk * N / s.lambda_max, jnp.float32), jnp.asarray(mm, jnp.float32))
    t = np.array([first_hit(c, s.target) for c in np.asarray(out.loss)])
    ok = ~np.asarray(out.diverged) & ~np.asarray(out.beyond_edge) & np.isfinite(t)
    seconds = np.where(ok, t * sps[b], np.inf).reshape(len(kappas), 2).T  # (m, κ)
    best_coarse = seconds[:, :len(coarse)].min()
    sec = seconds[:, len(coarse):]
    im, i = np.unravel_index(np.argmin(sec), sec.shape)
    # the worst a grid of the coarse resolution can land next to the dense optimum
    near = np.abs(np.log(dense / dense[i])) <= np.log(coarse[1] / coarse[0])
    worst_near = sec[im][near & np.isfinite(sec[im])].max()
    # the grid's best is the brute-force best of the same grid through the public predictor,
    # and within the grid resolution of the dense brute-force optimum (no refinement here:
    # the closed-form tests above check it)
    assert s.grid_best["seconds"] == pytest.approx(best_coarse) == s.seconds
    assert sec.min() <= s.seconds <= worst_near + 1e-9
    # the chosen configuration checked through the public predictor
    p = ntk_tt.predict_head_aware(hk, y, learning_rate=s.learning_rate, momentum=s.momentum,
                                  steps=steps, batch_size=b, key=key, num_paths=2)
    assert np.allclose(np.asarray(p.loss), s.loss, rtol=1e-5, atol=1e-6)
    assert not bool(p.diverged) and not bool(p.beyond_edge)
    assert first_hit(p.loss, s.target) == s.steps
    assert float(p.kappa) == pytest.approx(s.kappa, rel=1e-5)
    assert len(s.runners_up) <= 5 and s.runners_up.admissible.all()
    assert (s.runners_up.seconds >= s.seconds).all()
    # every predicted grid row's outcome and spike step are the public predictor's (a
    # fresh user's probe: suggest chose a catapult without saying so); the choice's too
    codes = np.asarray(out.outcome).reshape(len(kappas), 2)
    spikes = np.asarray(out.spike_step).reshape(len(kappas), 2)
    rows = s.grid[(s.grid.source == "grid") & s.grid.evaluated]
    for _, row in rows.iterrows():
        i, j = int(np.argmin(np.abs(np.log(coarse / row.kappa)))), [0.0, 0.9].index(row.momentum)
        assert (row.outcome, row.spike_step) == (OUTCOMES[codes[i, j]], spikes[i, j]), row
    assert (s.outcome, s.spike_step) == (OUTCOMES[int(p.outcome)], int(p.spike_step))


@pytest.mark.parametrize("b", [None, 4])
def test_surrogate_gradient_matches_finite_differences(b):
    with jax.enable_x64(True):
        model, apply_fn, params, x, y = head_problem(jnp.float64)
        hk = ntk_tt.head_aware_kernel(ntk_tt.split_head(model), x)
        data = (hk, y, _batches(jax.random.key(3), N, b, 12, 2))
        l0 = float(ntk_tt.mean_loss(apply_fn(params, x), y, "cross_entropy"))
        target, tau = jnp.float64(0.6 * l0), jnp.float64(0.1)
        static = dict(kind="head_aware", traced=False, loss="cross_entropy")
        u = jnp.array([np.log(0.5), 0.5])
        (val, _), grad = _surrogate_grad(u, data, target, tau, **static)
        value = jax.jit(lambda v: _surrogate(v, data, target, tau, **static)[0])
        h = 1e-5
        for i in range(2):
            e = jnp.zeros(2).at[i].set(h)
            fd = (value(u + e) - value(u - e)) / (2 * h)
            assert float(grad[i]) == pytest.approx(float(fd), rel=1e-5, abs=1e-8)
        assert 1.0 < float(val) < 13.0 and np.all(np.abs(np.asarray(grad)) > 0)
    assert set(_STATIC) == set(static)


def test_soft_time_tends_to_the_hard_time():
    curve = jnp.asarray(np.exp(-np.arange(41) / 8.0))  # first ≤ 0.3 at t = 10 (e^{-10/8})
    hard = first_hit(curve, 0.3)
    assert hard == 10.0
    soft = [float(soft_time_to_target(curve, 0.3, temperature=t)) for t in (0.1, 0.01, 1e-3)]
    assert abs(soft[-1] - hard) < 0.05 and abs(soft[0] - hard) > abs(soft[-1] - hard)
    never = float(soft_time_to_target(curve, 1e-6, temperature=1e-3))
    assert never == pytest.approx(41.0, abs=0.1)  # T + 1 when never reached


# --- errors: before any work, one clear line ----------------------------------------------


@pytest.fixture
def no_work(monkeypatch):
    def refuse(*_, **__):
        raise AssertionError("work started before the arguments were checked")

    for target in ("ntk_tt.kernels._ntk.empirical_ntk", "ntk_tt.training._finetune.step_time",
                   "ntk_tt.kernels._head_aware.head_aware_kernel"):
        monkeypatch.setattr(target, refuse)


GOOD = dict(target=0.5, target_kind="fraction", steps=10)


@pytest.mark.parametrize("kw,match", [
    (dict(target_kind="relative"), "target_kind must be one of"),
    (dict(target=1.5), "must be in (0, 1) (a fraction of the initial loss L_0)"),
    (dict(target=-1.0, target_kind="absolute"), "must be finite and > 0"),
    (dict(target="0.5"), "target must be a real number"),
    (dict(target=0.9, target_kind="absolute"), "is not below the initial mean training loss"),
    (dict(steps=0), "steps (the budget T_max) must be an integer in [1, 10000]"),
    (dict(steps=10**9), "steps (the budget T_max) must be an integer in [1, 10000]"),
    (dict(batch_sizes=(None, 9)), "integers in [1, N = 8]"),
    (dict(batch_sizes=(None, 8)), "None, N and 8 all name full-batch GD here"),
    (dict(batch_sizes=()), "non-empty list"),
    (dict(batch_sizes=(4,)), "pass key=jax.random.key(seed)"),
    (dict(momenta=(0.0, 1.0)), "momenta entries must be in [0, 1)"),
    # a fresh user: 1 − 1e-10 is 1.0 in float32, and suggest recommended "m = 1"
    (dict(momenta=(1 - 1e-10,)), "momenta entries must be in [0, 1) and at most 0.99999994"),
    (dict(momenta=0.9), "momenta must be a non-empty list"),
    (dict(kappa_range=(0.0, 5.0)), "kappa_range must satisfy 0 < min <= max"),
    (dict(kappa_range=(0.1, 1e300)), "kappa_range must satisfy 0 < min <= max <= 3.4028235e+38 "
                                     "(float32's largest), got (0.1, 1e+300)"),
    (dict(target=1e39, target_kind="absolute"), "must be finite and > 0 (at most 3.4028235e+38"),
    (dict(kappa_range=(1.0, 1.0)), "num_kappas must be an integer in [1, 1024] (1 exactly when"),
    (dict(refine_steps=-1), "refine_steps must be an integer >= 0"),
    (dict(temperature=0.0), "temperature must be finite and > 0"),
    (dict(num_paths=0), "num_paths must be an integer in [1, 4096]"),
    (dict(top=-1), "top must be an integer >= 0"),
    (dict(seconds_per_step={4: 0.1}), "no entry for batch sizes [None]"),
    (dict(seconds_per_step={None: 0.0}), "must be finite and > 0"),
    (dict(loss="hinge"), "loss must be one of"),
    (dict(predictor="head_aware"), "needs head=ntk_tt.split_head(model)"),
    (dict(kernel="sketch"), "kernel must be one of"),
    (dict(key=7), "key must be a jax random key"),
    (dict(head_kernel=np.eye(8)), "head_kernel is for the head-aware predictor"),
])
def test_bad_arguments_are_refused_before_any_work(kw, match, no_work):
    params, x, y = diag_problem(EDGE[:8])
    with pytest.raises(ValueError) as err:
        ntk_tt.suggest(diag_apply, params, x, y, **(GOOD | dict(loss="mse") | kw))
    assert match in str(err.value) and "\n" not in str(err.value)


def test_bad_model_inputs_are_refused(no_work):
    params, x, y = diag_problem(EDGE[:8])
    with pytest.raises(ValueError, match="y must be integer class labels of shape"):
        ntk_tt.suggest(diag_apply, params, x, y[:5], loss="mse", **GOOD)
    with pytest.raises(ValueError, match="x must be an array"):
        ntk_tt.suggest(diag_apply, params, "images", y, loss="mse", **GOOD)


# --- the CLI ------------------------------------------------------------------------------


def cli_no_work(monkeypatch):
    def refuse(**_):
        raise AssertionError("the task was loaded before the options were checked")

    monkeypatch.setattr("ntk_tt.prediction._job.load_task", refuse)


@pytest.mark.parametrize("args,match", [
    (["--target", "1.5"], "target (--target) with --target-kind fraction must be in (0, 1)"),
    (["--target", "0", "--target-kind", "absolute"], "must be finite and > 0"),
    (["-T", "0"], "steps (-T/--max-steps, the budget T_max) must be an integer in"),
    (["-T", "1000000000"], "steps (-T/--max-steps, the budget T_max) must be an integer in"),
    (["-B", "N,abc"], "batch_sizes (-B/--batch-sizes) must be a comma-separated list"),
    (["-B", "-5"], "batch_sizes (-B/--batch-sizes) entries must be positive integers "
                   "(mini-batch sizes B >= 1) or N (full-batch GD), got -5 in '-5'"),
    (["-B", "N,0"], "must be positive integers (mini-batch sizes B >= 1) or N (full-batch "
                    "GD), got 0 in 'N,0'"),
    (["-B", "N,751"], "must be N (full-batch GD) or integers in [1, N = K·n = 5·150 = 750]"),
    (["-K", "2", "-n", "3", "-B", "N,6"], "all name full-batch GD here"),
    (["-m", "0,x"], "momenta (-m/--momenta) must be a comma-separated list of numbers"),
    (["-m", "0,1"], "momenta (-m/--momenta) entries must be in [0, 1)"),
    (["-m", "0.9999999999"], "momenta (-m/--momenta) entries must be in [0, 1) and at most "
                             "0.99999994"),
    (["--kappa-min", "0"], "(--kappa-min, --kappa-max) must satisfy 0 < min <= max"),
    (["--num-kappas", "0"], "num_kappas (--num-kappas) must be an integer in [1, 1024]"),
    # a fresh user: 10⁵ κ asked JAX for 322 GB and ended in a traceback
    (["--num-kappas", "100000"], "num_kappas (--num-kappas) must be an integer in [1, 1024]"),
    (["--refine-steps", "-2"], "refine_steps (--refine-steps) must be an integer >= 0"),
    (["--num-paths", "0"], "num_paths (--num-paths) must be an integer in [1, 4096]"),
    (["-K", "1"], "num_classes (-K) must be an integer >= 2"),
    (["-n", "0"], "per_class (-n) must be an integer >= 1"),
    (["--head-scale", "0"], "head_scale (--head-scale) must be a number in [1e-06, 1e+06]"),
    (["--checkpoint", "/nonexistent/ck"], "is not a directory written by"),
    (["--json", "/nonexistent/dir/s.json"], "does not exist"),
    (["--top", "-1"], "top (--top) must be an integer >= 0"),
    # the cap on κ̃ (tests/test_suggest_cap.py)
    (["--kappa-eff-max", "0"], "kappa_eff_max (--kappa-eff-max) caps the suggestion's"),
    (["--kappa-eff-max", "0.5", "--kappa-min", "1"], "kappa_eff_max (--kappa-eff-max) 0.5 is "
     "below the κ grid's smallest κ, kappa_min (--kappa-min) 1"),
    (["--optimizer", "adamw", "--kappa-eff-max", "12"], "AdamW's step is not sized by κ"),
])
def test_cli_bad_options_are_one_line_before_loading(args, match, capsys, monkeypatch):
    cli_no_work(monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        main(["suggest", "--no-progress", *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("ntk-tt: error: ") and match in err and "Traceback" not in err, err


def test_cli_existing_json_is_refused_unless_overwrite(tmp_path, capsys, monkeypatch):
    cli_no_work(monkeypatch)
    js = tmp_path / "s.json"
    js.write_text("an earlier run")
    with pytest.raises(SystemExit):
        main(["suggest", "--no-progress", "--json", str(js)])
    err = capsys.readouterr().err
    assert "exists (an earlier run's output?)" in err and err.count("\n") == 1
    with pytest.raises(AssertionError, match="the task was loaded"):  # accepted: work starts
        main(["suggest", "--no-progress", "--json", str(js), "--overwrite"])
    assert js.read_text() == "an earlier run"


def test_cli_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["suggest", "-h"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("(default: 0.5)", "(default: fraction)", "(default: N,50)",
                 "(default: 0,0.5,0.9,0.95)", "(default: 150)", "Exit status 0 with a"):
        assert flag in text, flag


def test_cli_tiny_run_writes_json(tmp_path, capsys):
    js = tmp_path / "s.json"
    code = main(["suggest", "--no-progress", "-K", "2", "-n", "3", "-T", "5", "-B", "N",
                 "-m", "0,0.9", "--num-kappas", "4", "--refine-steps", "0", "--json", str(js)])
    out = capsys.readouterr().out
    r = json.loads(js.read_text())
    assert code == (0 if r["found"] else 1)
    assert r["task"]["n_train"] == 6 and len(r["grid"]) == 8
    assert set(r["seconds_per_step"]) == {"N"} and r["seconds_per_step"]["N"] > 0
    if r["found"]:
        s = r["suggestion"]
        assert s["batch_size"] is None and s["steps"] <= 5
        assert s["seconds"] == pytest.approx(s["steps"] * r["seconds_per_step"]["N"])
        assert len(r["curve"]["loss"]) == 6 and "suggestion: B = N (GD)" in out
    assert "seconds per real step" in out and f"json: {js}" in out


def test_cli_says_when_its_choice_catapults(tmp_path, capsys):
    """A fresh user's probe: on the vendored flowers5 (K = 2, n = 10), B = 5, m = 0.95, the
    fastest configuration's predicted loss rises above L_0 before it falls (a catapult, where
    predictions are least reliable) and nothing said so. The choice's outcome and spike step
    are now in the JSON and the text warns; checked against the choice's own curve."""
    js = tmp_path / "s.json"
    code = main(["suggest", "--no-progress", "-K", "2", "-n", "10", "-T", "30", "-B", "5",
                 "-m", "0.95", "--num-kappas", "4", "--refine-steps", "0", "--json", str(js)])
    out, r = capsys.readouterr().out, json.loads(js.read_text())
    assert code == 0 and r["found"]
    s, curve = r["suggestion"], np.asarray(r["curve"]["loss"])
    assert s["outcome"] == "catapult" and s["spike_step"] >= 1
    first_above = int(np.argmax(curve > curve[0]))
    assert curve.max() > curve[0] and first_above == s["spike_step"]
    assert curve[s["steps"]] <= r["target"]["loss"] < curve[s["steps"] - 1]
    warned = [ln for ln in out.splitlines() if "warning: its predicted loss catapults" in ln]
    assert len(warned) == 1 and f"at step {s['spike_step']}" in warned[0]
    # the check it recommends averages the same 4 batch orders (predict's default 32 had
    # smoothed a step-1 spike away and said "converges": a fresh user)
    assert "(the verify line with --num-paths 4, the batch orders" in warned[0]
    # and that line is the suggestion's own command (a fresh user typed the bare
    # "ntk-tt predict --verify" it named, which checks the default configuration)
    from ntk_tt._cli_parser import parse

    (verify,) = [ln.split("verify: ", 1)[1] for ln in out.splitlines() if "  verify: " in ln]
    args, _ = parse(verify.split()[1:])
    assert args.verify and (args.num_classes, args.per_class, args.steps) == (2, 10, 30)
    assert (args.batch_size, args.num_paths) == (s["batch_size"], 4)
    assert args.momentum == pytest.approx(s["momentum"], rel=1e-7)
    assert args.learning_rate == pytest.approx(s["learning_rate"], rel=1e-7)
    assert [float(v) for v in args.loss_targets] == pytest.approx([r["target"]["loss"]], rel=1e-7)
    # suggest's feature kernel (isotropic) is not predict's default (diagonal): it is named
    assert r["predictor"] == "head_aware:isotropic" and args.backbone == "isotropic"
    # the predictor suggest used, and Adam's β's to 8 digits (β₂ = 0.9999999 was printed 1)
    from ntk_tt.analysis._suggest_report import verify_command

    cfg = r["config"] | {"predictor": "linear", "optimizer": "adamw", "weight_decay": 1.2345678e-4,
                         "b1": 0.9, "b2": 0.9999999}
    args, _ = parse(verify_command(cfg, s | {"warmup": 2.0}, 20, 0.5).split()[1:])
    assert (args.predictor, args.b2, args.weight_decay) == ("linear", 0.9999999, 1.2345678e-4)
    rows = [g for g in r["grid"] if g["evaluated"]]
    assert {g["outcome"] for g in rows} <= {"converges", "catapult", "diverges"}
    assert all(g["outcome"] is None and g["spike_step"] == -1 for g in r["grid"]
               if not g["evaluated"])


def test_a_head_kernel_of_other_inputs_is_refused(no_work):
    model, apply_fn, params, x, y = head_problem()
    head = ntk_tt.split_head(model)
    other = ntk_tt.HeadAwareKernel(*(np.zeros((3, 2)),) * 4, None)  # built on 3 inputs
    with pytest.raises(ValueError, match="must be the HeadAwareKernel of head on these N"):
        ntk_tt.suggest(apply_fn, params, x, y, head=head, head_kernel=other, **GOOD)


@pytest.mark.parametrize("args,expected", [([], (None, 50)), (["-n", "10"], (None,)),
                                           (["-n", "10", "-B", "N,10"], (None, 10))])
def test_cli_default_batch_sizes_leave_out_a_b_of_n_or_more(args, expected, monkeypatch):
    """K·n = 50 with the default -B N,50 would name GD twice: the default drops 50 there;
    an explicit -B is passed on as given."""
    seen = {}

    def capture(**opts):
        seen.update(opts)
        raise AssertionError("the task was loaded")

    monkeypatch.setattr("ntk_tt.analysis._suggest_task.suggest_task", capture)
    with pytest.raises(AssertionError, match="the task was loaded"):
        main(["suggest", "--no-progress", *args])
    assert tuple(seen["batch_sizes"]) == expected


class _Stop(Exception):
    pass


def test_python_default_batch_sizes_leave_out_a_b_of_n_or_more(monkeypatch):
    """suggest_task without batch_sizes, N = K·n = 50: the default (None, 50) without 50
    (a batch of N is GD, already a candidate), as the CLI without -B; it was an error."""
    from ntk_tt._options import check_suggest_job, default_batch_sizes

    assert default_batch_sizes(50) == (None,) and default_batch_sizes(51) == (None, 50)
    assert check_suggest_job({"num_classes": 5, "per_class": 10})["batch_sizes"] == (None,)
    assert check_suggest_job({"batch_sizes": None})["batch_sizes"] == (None, 50)  # N = 750
    with pytest.raises(ValueError, match="all name full-batch GD here"):  # given: refused
        check_suggest_job({"num_classes": 5, "per_class": 10, "batch_sizes": (None, 50)})
    seen = {}

    def capture(*_, **kw):
        seen.update(kw)
        raise _Stop

    monkeypatch.setattr("ntk_tt.analysis._suggest_task.suggest", capture)
    with pytest.raises(_Stop):  # the real task of N = 50 is loaded, then suggest is called
        ntk_tt.suggest_task(num_classes=5, per_class=10, progress=False)
    assert seen["batch_sizes"] == (None,)


def test_cli_default_batch_sizes_are_the_python_default(monkeypatch):
    """ntk-tt suggest without -B takes its candidates from the same function as
    suggest_task (ntk_tt._options.default_batch_sizes), not a copy of it."""
    seen = {}

    def capture(**opts):
        seen.update(opts)
        raise _Stop

    monkeypatch.setattr("ntk_tt._options.default_batch_sizes", lambda n: (None, n // 3))
    monkeypatch.setattr("ntk_tt.analysis._suggest_task.suggest_task", capture)
    with pytest.raises(_Stop):
        main(["suggest", "--no-progress", "-K", "2", "-n", "6"])
    assert tuple(seen["batch_sizes"]) == (None, 4)


def test_an_unreachable_target_warns_what_to_try():
    """No configuration reaches an absolute target within the budget: the Suggestion's
    choice fields are None, and suggest says so in a UserWarning naming what to try."""
    params, x, y = diag_problem(EDGE[:8])
    with pytest.warns(UserWarning) as record:
        s = ntk_tt.suggest(diag_apply, params, x, y, target=1e-6, target_kind="absolute",
                           steps=5, loss="mse", momenta=(0.0,), refine_steps=0,
                           seconds_per_step={None: 0.01})
    assert not s.found and s.learning_rate is None and s.steps is None and s.loss is None
    mine = [w for w in record if issubclass(w.category, ntk_tt.TargetNotReachedWarning)]
    assert len(mine) == 1 and issubclass(ntk_tt.TargetNotReachedWarning, UserWarning)
    msg = str(mine[0].message)
    assert "target not reached" in msg and "within T_max = 5 steps" in msg
    assert "raise the step budget" in msg and "raise the target" in msg
    assert "kappa_range" in msg and "choice fields are None" in msg
    assert s.reason in msg


def test_a_reachable_target_does_not_warn():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        s = linear_suggest(EDGE, 0.5, 80, refine_steps=0)
    assert s.found


def test_cli_does_not_repeat_the_not_reached_warning(monkeypatch):
    """ntk-tt suggest says "no suggestion: ..." and exits 1 itself: the Python warning is not
    printed on top."""
    import warnings

    def fake(**_):
        warnings.warn("suggest: target not reached", ntk_tt.TargetNotReachedWarning,
                      stacklevel=2)
        raise _Stop

    monkeypatch.setattr("ntk_tt.analysis._suggest_task.suggest_task", fake)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with pytest.raises(_Stop):
            main(["suggest", "--no-progress", "-K", "2", "-n", "3"])
    assert not [w for w in record if issubclass(w.category, ntk_tt.TargetNotReachedWarning)]


def test_a_head_kernel_of_other_inputs_names_both_n(no_work):
    model, apply_fn, params, x, y = head_problem()
    head = ntk_tt.split_head(model)
    other = ntk_tt.HeadAwareKernel(*(np.zeros((3, 2)),) * 4, None)  # built on 3 inputs
    with pytest.raises(ValueError) as err:
        ntk_tt.suggest(apply_fn, params, x, y, head=head, head_kernel=other, **GOOD)
    msg = str(err.value)
    assert f"these N = {N} inputs of x" in msg and "built on N = 3 inputs" in msg, msg
    assert "ntk_tt.head_aware_kernel(head, x)" in msg and "\n" not in msg
    with pytest.raises(ValueError, match="must be the HeadAwareKernel of head on these N = "
                                         f"{N} inputs .*got ndarray"):
        ntk_tt.suggest(apply_fn, params, x, y, head=head, head_kernel=np.eye(N), **GOOD)


def test_a_predicted_spike_above_ten_l0_is_never_admissible():
    """A fresh user's probe: an AdamW grid row whose predicted loss spiked to 17,147 (L_0 =
    1) had outcome 'diverges' but diverged False (finite, and back below L_0 at T), and was
    suggested. A row is now diverged, and not admissible, when either says so."""
    from types import SimpleNamespace

    from ntk_tt.analysis._suggest_report import _row

    def row(code, flag):
        out = SimpleNamespace(steps=[5.0], diverged=[flag], soft=[5.2], loss=[np.ones(3)],
                              outcome=[code], spike=[2 if code else -1])
        return _row(None, 10, 0.1, 0.0, 1.0, out, 0, 0.01, "cross_entropy", "grid")

    assert OUTCOMES[2] == "diverges" and OUTCOMES[1] == "catapult"
    assert row(0, False)["admissible"] and row(1, False)["admissible"]
    for code, flag in ((2, False), (0, True), (2, True)):
        r = row(code, flag)
        assert r["diverged"] and not r["admissible"], (code, flag)


def test_head_aware_suggest_with_float64_inputs_and_float32_weights():
    """A fresh user's probe: under x64, float64 x with a float32 model made the head-aware
    grid's scan carry change dtype (a raw TypeError). The kernel's fields now share one dtype,
    as predict_head_aware's do, and the choice's curve is predict_head_aware's."""
    model, apply_fn, params, x, y = head_problem()
    head, key = ntk_tt.split_head(model), jax.random.key(2)
    with jax.enable_x64(True):
        x64 = jnp.asarray(x, jnp.float64)
        s = ntk_tt.suggest(apply_fn, params, x64, y, head=head, target=0.5,
                           target_kind="fraction", steps=20, batch_sizes=(None,),
                           momenta=(0.0, 0.9), num_kappas=4, refine_steps=1, key=key,
                           num_paths=1, seconds_per_step={None: 0.01})
        assert s.found and s.loss.dtype == np.float64
        p = ntk_tt.predict_head_aware(ntk_tt.head_aware_kernel(head, x64), y,
                                      learning_rate=s.learning_rate, momentum=s.momentum,
                                      steps=20)
        np.testing.assert_allclose(np.asarray(p.loss), s.loss, rtol=1e-9)


def test_suggest_json_is_claimed_before_the_work_and_settled(tmp_path, monkeypatch):
    """A fresh user's finding: two ``ntk-tt suggest --json P`` started together both did
    the whole search; the first to finish wrote P and the other then threw its result away.
    Now P is claimed first (status "started", as ``ntk-tt predict`` does): a second run is
    refused at once, saying the report is of a run that has not finished; an interrupted
    run removes its own claim; a finished one writes the report with status "complete"."""
    from ntk_tt.analysis import _suggest_task
    from ntk_tt.prediction._report_file import STARTED

    js = tmp_path / "s.json"
    seen = {}

    def work(o, opt_o, progress):
        seen["claim"] = json.loads(js.read_text())
        with pytest.raises(ValueError, match="the report of a run that has not finished"):
            ntk_tt.suggest_task(json_path=js, progress=False)
        return {"found": False}

    monkeypatch.setattr(_suggest_task, "_suggest_report", work)
    report = ntk_tt.suggest_task(json_path=js, progress=False)
    assert seen["claim"]["status"] == STARTED and "config" in seen["claim"]
    assert report == {"found": False}
    assert json.loads(js.read_text()) == {"found": False, "status": "complete"}

    def interrupted(o, opt_o, progress):
        assert json.loads(js2.read_text())["status"] == STARTED
        raise KeyboardInterrupt

    js2 = tmp_path / "t.json"
    monkeypatch.setattr(_suggest_task, "_suggest_report", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ntk_tt.suggest_task(json_path=js2, progress=False)
    assert not js2.exists() and not list(tmp_path.glob(".t.json*"))
