"""``suggest(kappa_eff_max=...)`` / ``ntk-tt suggest --kappa-eff-max``: the effective
κ̃ = κ/(1 − m) capped, against the uncapped brute-force grid filtered by hand and the closed
form of MSE gradient descent on a diagonal kernel (``test_suggest``'s problems)."""

import json

import jax
import numpy as np
import pytest
from test_suggest import (
    EDGE,
    GOOD,
    closed_form_steps,
    diag_apply,
    diag_problem,
    linear_suggest,
    no_work,  # noqa: F401 (the fixture)
    refine_bounds,
)

import ntk_tt
from ntk_tt.cli import main

MOMENTA = (0.0, 0.5, 0.9)


def _edge_mse(m):
    """The heavy-ball stability edge of κ for MSE: 2(1 + m)."""
    return 2.0 * (1.0 + np.asarray(m))


def test_the_capped_choice_is_the_best_grid_point_at_or_below_the_cap():
    """Without a cap the fastest configuration (every grid point predicted) has κ̃ > 4; with
    kappa_eff_max = 4 the choice is the fastest admissible row of that same uncapped grid with
    κ/(1 − m) <= 4, and exactly the rows above the cap or the edge are beyond_edge."""
    kw = dict(momenta=MOMENTA, refine_steps=0)
    free = linear_suggest(EDGE, 0.5, 80, evaluate_beyond_edge=True, **kw)
    assert free.found and free.kappa / (1 - free.momentum) > 4.0  # the cap binds
    capped = linear_suggest(EDGE, 0.5, 80, kappa_eff_max=4.0, **kw)
    g = free.grid
    ok = g[g.admissible & (g.kappa / (1 - g.momentum) <= 4.0)]
    best = ok.sort_values(["seconds", "soft_steps"]).iloc[0]
    assert capped.found and capped.kappa == best.kappa and capped.momentum == best.momentum
    assert capped.steps == best.steps and capped.steps > free.steps
    cg = capped.grid
    above = (cg.kappa / (1 - cg.momentum) > 4.0) | (cg.kappa > _edge_mse(cg.momentum))
    assert (cg.beyond_edge == above).all() and (cg.evaluated == ~above).all()
    assert not cg[above].admissible.any() and capped.runners_up.kappa_eff.le(4.0).all()
    # m = 0: κ̃ = κ, so the choice is the closed form's fastest grid κ <= 4 within the edge
    at0 = g[(g.momentum == 0) & (g.kappa <= 2.0)]
    assert np.array_equal(np.nan_to_num(closed_form_steps(at0.kappa.to_numpy(), EDGE, 0.5, 80),
                                        nan=-1), at0.steps.fillna(-1).to_numpy())


def test_the_refinement_stays_at_or_below_the_cap():
    """m = 0, cap 1 on the edge-optimum problem (fastest κ ≈ 2 without it): every refinement
    point has κ <= 1, and the choice's steps are the closed form at its κ, no later than the
    grid's best below the cap."""
    s = linear_suggest(EDGE, 0.5, 80, kappa_eff_max=1.0, refine_steps=8)
    assert s.found and s.kappa <= 1.0
    assert s.steps == closed_form_steps(s.kappa, EDGE, 0.5, 80)[0] <= s.grid_best["steps"]
    assert closed_form_steps(1.99, EDGE, 0.5, 80)[0] < s.steps  # the cap costs steps
    lr_cap = 1.0 * len(EDGE) / s.lambda_max
    assert all(t["log_learning_rate"] <= np.log(lr_cap) + 1e-12 for t in s.refinement)
    assert s.grid.kappa_eff.le(1.0 + 1e-12)[s.grid.admissible].all()


def test_the_refinement_box_with_a_cap(monkeypatch):
    """The (log η, m) box ``_refine`` projects onto (``_descend`` replaced: nothing runs):
    κ <= 0.999·min(2(1 + m), cap·(1 − m)) for MSE, and m lowered to where cap·(1 − m) is above
    κ_min. kappa_range (0.5, 50), momenta (0, 0.95), cap 4: m <= 1 − 0.5/(0.999·4)."""
    n, lam = 40, 100.0
    bounds = refine_bounds(monkeypatch, 1.0, 0.5, n, lam, (0.0, 0.95), (0.5, 50.0), 4.0)
    for m, top in ((0.0, 2.0), (0.5, 2.0), (0.8, 0.8)):
        (_, high), m_range = bounds(np.array([0.0, m]))
        assert np.exp(high) * lam / n == pytest.approx(0.999 * top, rel=1e-8)  # the cap: 1e-9
    assert m_range == pytest.approx((0.0, 1.0 - 0.5 / (0.999 * 4.0)), rel=1e-12)


def test_an_sgd_template_is_capped_at_its_momentum():
    """suggest(optimizer=sgd(m = 0.9)) with cap 2: every admissible peak has κ_peak <= 0.2
    (= 2·(1 − 0.9), below the heavy-ball edge 3.8 of MSE), the rows above it beyond_edge."""
    params, x, y = diag_problem(EDGE[:8])
    kw = dict(target=0.5, target_kind="fraction", steps=80, loss="mse", refine_steps=4,
              seconds_per_step={None: 0.01}, num_kappas=8, warmups=(0.0, 0.1))
    s = ntk_tt.suggest(diag_apply, params, x, y, optimizer=ntk_tt.sgd(0.1, 0.9),
                       kappa_eff_max=2.0, **kw)
    g = s.grid
    assert s.found and s.kappa <= 0.2 * (1 + 1e-9)
    assert (g.beyond_edge == (g.kappa > 0.2)).all() and g.beyond_edge.any()
    assert g[g.admissible].kappa.le(0.2 * (1 + 1e-9)).all()


@pytest.mark.parametrize("kw,match", [
    (dict(kappa_eff_max=0.0), "kappa_eff_max caps the suggestion's effective"),
    (dict(kappa_eff_max=float("nan")), "a finite number > 0, got nan"),
    (dict(kappa_eff_max="12"), "kappa_eff_max must be a real number"),
    (dict(kappa_eff_max=0.01), "kappa_eff_max 0.01 is below the κ grid's smallest κ, "
                               "kappa_range[0] 0.05"),
])
@pytest.mark.usefixtures("no_work")
def test_bad_caps_are_refused_before_any_work(kw, match):
    params, x, y = diag_problem(EDGE[:8])
    with pytest.raises(ValueError) as err:
        ntk_tt.suggest(diag_apply, params, x, y, **(GOOD | dict(loss="mse") | kw))
    assert match in str(err.value) and "\n" not in str(err.value)


@pytest.mark.usefixtures("no_work")
def test_adam_refuses_a_cap():
    params, x, y = diag_problem(EDGE[:8])
    with pytest.raises(ValueError, match="Adam's step is not sized by κ"):
        ntk_tt.suggest(diag_apply, params, x, y, loss="mse", optimizer=ntk_tt.adamw(1e-3),
                       kappa_eff_max=12.0, key=jax.random.key(0), **GOOD)


def test_cli_cap_reaches_the_search_and_the_report(tmp_path, capsys):
    """A tiny real task: the report's config holds the cap, every admissible grid row has
    κ̃ <= it and the text's count names it."""
    js = tmp_path / "s.json"
    code = main(["suggest", "--no-progress", "-K", "2", "-n", "3", "-T", "30", "-B", "N",
                 "-m", "0,0.9", "--num-kappas", "4", "--refine-steps", "0",
                 "--kappa-eff-max", "2", "--json", str(js)])
    out, r = capsys.readouterr().out, json.loads(js.read_text())
    assert code == 0 and r["found"] and r["config"]["kappa_eff_max"] == 2.0
    s = r["suggestion"]
    assert s["kappa"] / (1 - s["momentum"]) <= 2.0
    assert all(g["kappa"] / (1 - g["momentum"]) <= 2.0 for g in r["grid"] if g["admissible"])
    assert any(g["beyond_edge"] and g["kappa"] < 2.0 for g in r["grid"])  # m = 0.9 rows
    assert "beyond the stability edge or κ̃ > 2" in out


def test_a_grid_point_at_the_cap_is_within_it():
    """A fresh user: with the default grid (κ = 0.5 at its 6th point) and m = 0.9 a cap of 5
    excluded that point, κ̃ = 5.0000000000000009 by float rounding; it is within the cap."""
    s = linear_suggest(EDGE, 0.5, 80, momenta=(0.0, 0.9), kappa_eff_max=5.0, refine_steps=0)
    at = s.grid[(s.grid.momentum == 0.9) & np.isclose(s.grid.kappa, 0.5, rtol=1e-12)]
    assert len(at) == 1 and at.evaluated.all() and not at.beyond_edge.any()
    above = s.grid[(s.grid.momentum == 0.9) & (s.grid.kappa > 0.5 * (1 + 1e-6))]
    assert above.beyond_edge.all()


def test_a_cap_below_a_learning_rate_grid_is_named_as_the_cause():
    """suggest(optimizer=sgd, learning_rate_range=...) has no κ_min to check the cap against
    before the kernel; when the cap leaves nothing, the reason says to raise it (a fresh user
    saw only "widen learning_rate_range")."""
    params, x, y = diag_problem(EDGE[:8])
    with pytest.warns(ntk_tt.TargetNotReachedWarning):
        s = ntk_tt.suggest(diag_apply, params, x, y, target=0.5, target_kind="fraction",
                           steps=40, loss="mse", optimizer=ntk_tt.sgd(0.1, 0.5),
                           learning_rate_range=(1.0, 3.0), kappa_eff_max=0.01, num_kappas=4,
                           seconds_per_step={None: 0.01})
    assert not s.found and s.grid.beyond_edge.all()
    assert "above kappa_eff_max = 0.01" in s.reason and "or raise kappa_eff_max 0.01" in s.reason
    assert "or try other warmups than (0, 2, 4, 8) steps" in s.reason  # whole steps, not 2.0


def test_cli_a_cap_with_a_learning_rate_grid_is_not_held_to_the_kappa_grid():
    """ntk-tt suggest --optimizer sgd --lr-min/--lr-max has no κ grid: a cap below the default
    --kappa-min passes the options check (a fresh user was refused); with the κ grid it does
    not."""
    from ntk_tt._options import check_suggest_job
    from ntk_tt._options_suggest import split_optimizer_options

    lr_grid = dict(optimizer="sgd", momenta=(0.5,), lr_min=1e-6, lr_max=1e-2,
                   kappa_eff_max=0.01)
    check_suggest_job(split_optimizer_options(lr_grid)[1])
    for opts in ({"kappa_eff_max": 0.01}, {"optimizer": "sgd", "kappa_eff_max": 0.01}):
        with pytest.raises(ValueError, match="below the κ grid's smallest κ, kappa_min"):
            check_suggest_job(split_optimizer_options(opts)[1])
