"""``ntk_tt.suggest(optimizer=...)`` and ``ntk-tt suggest --optimizer``: the peak learning rate
× warmup of a warmup-cosine schedule against a brute force of independent
``ntk_tt.predict(..., optimizer=...)`` calls over the same grid; the refinement; refusals."""

import functools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import ntk_tt
from ntk_tt.analysis._suggest import TargetNotReachedWarning
from ntk_tt.cli import main

N, D, F, C, T = 24, 6, 8, 3, 30
ROOT = str(Path(__file__).resolve().parents[1])  # on PYTHONPATH of the program run


class Net(nnx.Module):
    def __init__(self, rngs):
        self.body = nnx.Linear(D, F, rngs=rngs)
        self.head = nnx.Linear(F, C, rngs=rngs)

    def __call__(self, x):
        return self.head(jnp.tanh(self.body(x)))


@functools.cache
def problem():
    model = Net(nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (N, D))
    y = jax.random.randint(jax.random.key(1), (N,), 0, C)
    apply_fn, params = ntk_tt.from_nnx(model)
    return model, apply_fn, params, x, y


def first_hit(curve, target):
    hit = np.asarray(curve) <= target
    return float(hit.argmax()) if hit.any() else math.nan


def brute_force(s, predict_one, adam):
    """Steps to target, admissibility and loss curve of every predicted grid row through the
    public predictor."""
    grid = s.grid[(s.grid.source == "grid") & s.grid.evaluated]
    steps, ok, curves = [], [], {}
    for peak, w in zip(grid.learning_rate, grid.warmup, strict=True):
        p = predict_one(ntk_tt.warmup_cosine(float(peak), float(w), T))
        t = first_hit(p.loss, s.target)
        steps.append(t)
        # Adam has no κ edge; beyond weight travel ρ = 1 predict abstains (outcome "unknown")
        ok.append(math.isfinite(t) and not bool(p.diverged)
                  and (p.outcome != "unknown" if adam else not bool(p.beyond_edge)))
        curves[peak, w] = np.asarray(p.loss)
    return grid, np.array(steps), np.array(ok), curves


def check_choice(s, curves, predict_one, adam):
    """The suggestion's own Optimizer (its schedule) and its predicted curve and steps through
    the public predictor (the grid's prediction when the choice is a grid point)."""
    sched = s.optimizer.learning_rate
    assert float(sched.peak) == pytest.approx(s.learning_rate, rel=1e-6)
    assert float(sched.warmup) == pytest.approx(s.warmup, abs=1e-6)
    assert float(sched.decay_steps) == T
    if s.refined:
        p = predict_one(sched)
        assert not bool(p.diverged) and (adam or not bool(p.beyond_edge))
        loss = np.asarray(p.loss)
    else:
        loss = curves[s.learning_rate, s.warmup]
    assert first_hit(loss, s.target) == s.steps
    assert np.allclose(loss, s.loss, rtol=1e-4, atol=1e-6)
    assert s.steps <= s.grid_best["steps"]  # the refinement is never worse than the grid


def test_sgdw_suggestion_is_the_brute_force_argmin_of_predict():
    """SGD-momentum + decoupled weight decay, B = 8, frozen-kernel predictor: the grid's κ
    from λ_max of Θ (eigvalsh), every grid row's steps equal to predict(optimizer=...)'s, the
    grid best the brute-force argmin, the (refined) choice checked through predict."""
    _, apply_fn, params, x, y = problem()
    key = jax.random.key(2)
    opt = ntk_tt.sgd(0.1, 0.9, weight_decay=1e-2, batch_size=8)
    s = ntk_tt.suggest(apply_fn, params, x, y, target=0.4, target_kind="fraction", steps=T,
                       optimizer=opt, kappa_range=(0.1, 10.0), num_kappas=3,
                       warmups=(0.0, 0.2), refine_steps=6, key=key, num_paths=2,
                       seconds_per_step={8: 0.01})
    lam = np.linalg.eigvalsh(np.asarray(ntk_tt.empirical_ntk(apply_fn, params, x))).max()
    assert s.lambda_max == pytest.approx(lam, rel=1e-4)
    grid = s.grid[s.grid.source == "grid"]
    peaks = np.geomspace(0.1, 10.0, 3) * N / lam
    assert np.allclose(np.unique(grid.learning_rate), peaks, rtol=1e-4)
    assert sorted(set(grid.warmup)) == [0.0, 6.0] and len(grid) == 6
    # κ_peak = η_peak·λ_max/N beyond the heavy-ball edge 2(1 + m)/h, h = ½ for CE: listed,
    # never predicted nor suggested
    beyond = grid.learning_rate * lam / N > 2 * 1.9 / 0.5
    assert beyond.sum() == 2 and (grid.beyond_edge == beyond).all()
    assert not (grid.evaluated | grid.admissible)[beyond].any()

    def predict_one(sched):
        o = ntk_tt.sgd(sched, 0.9, weight_decay=1e-2, batch_size=8)
        return ntk_tt.predict(apply_fn, params, x, y, optimizer=o, steps=T, key=key,
                              num_paths=2)

    grid, steps, ok, curves = brute_force(s, predict_one, adam=False)
    assert np.array_equal(np.nan_to_num(steps, nan=-1), grid.steps.fillna(-1))
    assert np.array_equal(ok, grid.admissible.to_numpy()) and ok.any() and not ok.all()
    assert s.found and s.grid_best["steps"] == steps[ok].min()
    assert s.batch_size == 8 and s.momentum == pytest.approx(0.9)
    assert float(s.optimizer.weight_decay) == pytest.approx(1e-2) and s.optimizer.decoupled
    check_choice(s, curves, predict_one, adam=False)
    assert s.seconds == pytest.approx(s.steps * 0.01)


def test_adamw_suggestion_is_the_brute_force_argmin_of_predict():
    """AdamW (head-aware fast Adam predictor, GD), η_peak on a log grid: as above, without
    the refinement (its compile is the file's dearest; the SGD test checks it). Adam has no κ
    edge: its rows are beyond_edge where the weight travel ρ > 1, where predict abstains
    (outcome "unknown"; here peak 0.06, ρ ≈ 2.2, the only peak to reach 0.6·L_0), and their
    ρ is predict's own ``hyperparameters["weight_travel"]``."""
    model, apply_fn, params, x, y = problem()
    head = ntk_tt.split_head(model)
    opt = ntk_tt.adamw(1e-3, 0.9, 0.99, weight_decay=1e-2)
    s = ntk_tt.suggest(apply_fn, params, x, y, head=head, target=0.72, target_kind="fraction",
                       steps=T, optimizer=opt, num_kappas=3, learning_rate_range=(0.01, 0.06),
                       warmups=(0.0, 0.2), refine_steps=0, seconds_per_step={None: 0.02})
    assert s.predictor == "head_aware_adam:isotropic"
    grid = s.grid[s.grid.source == "grid"]
    assert np.allclose(np.unique(grid.learning_rate), [0.01, 0.06 ** 0.5 * 0.1, 0.06],
                       rtol=1e-6)
    assert (grid.beyond_edge == (grid.weight_travel > 1)).all()
    assert grid.beyond_edge.any() and not grid.beyond_edge.all()

    def predict_one(sched):  # suggest's feature kernel (isotropic), not predict's default
        o = ntk_tt.adamw(sched, 0.9, 0.99, weight_decay=1e-2)
        return ntk_tt.predict(apply_fn, params, x, y, optimizer=o, steps=T, head=head,
                              backbone="isotropic")

    for _, row in grid.iterrows():
        p = predict_one(ntk_tt.warmup_cosine(row.learning_rate, row.warmup, T))
        assert row.weight_travel == pytest.approx(p.hyperparameters["weight_travel"], rel=1e-5)
        assert row.outcome == p.outcome and row.beyond_edge == bool(p.beyond_edge)
    grid, steps, ok, curves = brute_force(s, predict_one, adam=True)
    assert np.isfinite(steps[grid.beyond_edge.to_numpy()]).any()  # reached, not admissible
    assert np.array_equal(np.nan_to_num(steps, nan=-1), grid.steps.fillna(-1))
    assert np.array_equal(ok, grid.admissible.to_numpy()) and ok.any() and not ok.all()
    assert s.found and s.grid_best["steps"] == steps[ok].min()
    assert s.optimizer.rule == "adam" and float(s.optimizer.b2) == pytest.approx(0.99)
    assert not s.refined
    check_choice(s, curves, predict_one, adam=True)
    # nothing reaches an unreachable target: the reason speaks of peak η and warmup, not of
    # κ, m and an edge that Adam does not have (a second fresh user); the same compiled grid
    with pytest.warns(TargetNotReachedWarning):
        none = ntk_tt.suggest(apply_fn, params, x, y, head=head, target=1e-6,
                              target_kind="fraction", steps=T, optimizer=opt, num_kappas=3,
                              learning_rate_range=(0.01, 0.06), warmups=(0.0, 0.2),
                              refine_steps=0, seconds_per_step={None: 0.02})
    assert not none.found and ("without predicted divergence or weight travel ρ > 1 (lowest "
                               "final loss") in none.reason
    assert "peak η = " in none.reason and "κ" not in none.reason and "edge" not in none.reason


# --- refusals: one line, before any work ------------------------------------------------


@pytest.fixture
def no_work(monkeypatch):
    def refuse(*_, **__):
        raise AssertionError("work started before the arguments were checked")

    # imported unpatched first: a module that binds empirical_ntk at import (the Adam drift's)
    # and is first imported by a refused call would otherwise keep ``refuse`` for later tests
    import ntk_tt.dynamics._adam_drift  # noqa: F401
    for target in ("ntk_tt.kernels._ntk.empirical_ntk", "ntk_tt.training._finetune.step_time",
                   "ntk_tt.training._finetune._time_steps",
                   "ntk_tt.kernels._head_aware.head_aware_kernel",
                   "ntk_tt.dynamics._adam_drift.empirical_ntk"):
        monkeypatch.setattr(target, refuse)


SGD = ntk_tt.sgd(0.1, 0.9)


@pytest.mark.parametrize("kw,match", [
    (dict(optimizer=SGD, batch_sizes=(None,)), "optimizer= fixes the batch size and momentum"),
    (dict(optimizer=SGD, momenta=(0.9,)), "drop momenta or put them into the optimizer"),
    (dict(optimizer="sgd"), "optimizer must be an ntk_tt.Optimizer"),
    (dict(warmups=(0.1,)), "pass optimizer=ntk_tt.sgd(...)"),
    (dict(learning_rate_range=(1e-3, 1e-1)), "pass optimizer=ntk_tt.sgd(...)"),
    (dict(optimizer=ntk_tt.sgd(ntk_tt.exponential(0.1, 0.9))), "searches warmup-cosine"),
    (dict(optimizer=ntk_tt.sgd(ntk_tt.warmup_cosine(0.1, 2, 10, smoothing=1.0))),
     "searches the exact warmup (smoothing=0)"),
    (dict(optimizer=ntk_tt.adamw(1e-3)), "Adam has no frozen-kernel predictor"),
    (dict(optimizer=ntk_tt.adam(1e-3, weight_decay=0.1), head="head"),
     "needs decoupled weight decay"),
    (dict(optimizer=ntk_tt.adamw(1e-3), head="head", kappa_range=(0.1, 1.0)),
     "kappa_range sizes SGD's grid"),
    (dict(optimizer=SGD, kappa_range=(0.1, 1.0), learning_rate_range=(1e-3, 1e-1)),
     "not both"),
    (dict(optimizer=SGD, warmups=(0.0, 1.0)), "warmups entries must be fractions of steps"),
    (dict(optimizer=SGD, warmups=(0.0, 0.99)),
     "warmups entry 0.99 rounds to a warmup of 10 steps, not below steps 10"),
    (dict(optimizer=SGD, warmups=()), "warmups must be a non-empty list"),
    (dict(optimizer=SGD, learning_rate_range=(0.0, 1.0)), "must satisfy 0 < min <= max"),
    # a fresh user's 1e300 (--lr-max) made a grid up to float32 inf, with numpy's warning
    (dict(optimizer=SGD, learning_rate_range=(1e-3, 1e300)),
     "learning_rate_range must satisfy 0 < min <= max <= 3.4028235e+38 (float32's largest;"),
    # (0.1, 0.1) was kept once, silently, where momenta=(0.5, 0.5) is refused
    (dict(optimizer=SGD, warmups=(0.1, 0.0, 0.1)),
     "warmups [0.1, 0.0, 0.1] names 0.1 twice; give each once."),
    # a second probe: 0.1 and 0.11 of 30 steps both gave 3 (the CLI refused it by then)
    (dict(optimizer=SGD, warmups=(0.0, 0.1, 0.11), steps=30),
     "warmups entries 0.1 and 0.11 both round to a 3-step warmup at steps = 30: the search "
     "would try it once"),
    (dict(optimizer=ntk_tt.sgd(0.1, batch_size=8)), "pass key=jax.random.key(seed)"),
    (dict(optimizer=ntk_tt.sgd(0.1, batch_size=99)), "exceeds N = 24"),
])
def test_bad_optimizer_arguments_are_refused_before_any_work(kw, match, no_work):
    model, apply_fn, params, x, y = problem()
    if kw.get("head") == "head":
        kw["head"] = ntk_tt.split_head(model)
    with pytest.raises(ValueError) as err:
        ntk_tt.suggest(apply_fn, params, x, y, target=0.5, target_kind="fraction",
                       **{"steps": 10} | kw)
    assert match in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_warmup_that_rounds_to_steps_is_refused_before_any_work(no_work):
    """A fresh user: warmups=(0.99,) with steps=20 suggested a 20-step warmup, which
    ``predict`` / ``finetune`` then refused (the run ends before the peak). Refused now, before
    any work, naming the fraction, the warmup it rounds to and the largest fraction allowed
    (0.97 rounds to 19 steps and passes; 0.975 rounds to 20)."""
    from ntk_tt.analysis._suggest_optimizer import check_search

    model, apply_fn, params, x, y = problem()
    with pytest.raises(ValueError) as err:
        ntk_tt.suggest(apply_fn, params, x, y, head=ntk_tt.split_head(model), steps=20,
                       key=jax.random.key(2), num_kappas=4, num_paths=2, target=0.7,
                       target_kind="fraction", optimizer=SGD, warmups=(0.99,),
                       refine_steps=0)
    assert str(err.value) == (
        "warmups entry 0.99 rounds to a warmup of 20 steps, not below steps 20: the run would "
        "end before η reaches its peak (predict and finetune refuse that schedule); the "
        "largest fraction allowed is just below 0.975 = (steps − ½)/steps (0.95 gives 19 "
        "steps): lower it or raise steps.")
    args = dict(n=N, steps=20, key=None, head_aware=True, kappa_range=None,
                learning_rate_range=None, num_kappas=4)
    assert check_search(SGD, warmups=(0.97, 0.0), **args)["warmups"] == [19.0, 0.0]
    with pytest.raises(ValueError, match="entry 0.975 rounds to a warmup of 20 steps"):
        check_search(SGD, warmups=(0.975,), **args)


def test_the_refinement_keeps_the_warmup_below_steps():
    """From the longest warmup allowed (0.95 of T = 20: 19 steps) the refinement's warmups
    stay <= 19 = T − 1, and the suggested Optimizer is one ``predict`` accepts, with the
    suggestion's steps to target (refined from the grid's 8 to 6)."""
    model, apply_fn, params, x, y = problem()
    head = ntk_tt.split_head(model)
    s = ntk_tt.suggest(apply_fn, params, x, y, head=head, steps=20, target=0.7,
                       target_kind="fraction", optimizer=SGD, num_kappas=4, warmups=(0.95,),
                       refine_steps=6, seconds_per_step={None: 0.01})
    assert set(s.grid[s.grid.source == "grid"].warmup) == {19.0}
    refined = s.grid[s.grid.source == "refine"]
    assert len(refined) and (refined.warmup <= 19.0).all() and (refined.warmup >= 1.0).all()
    assert s.found and s.refined and s.grid_best["steps"] == 8 and s.steps == 6
    assert 1.0 <= s.warmup < 19.0
    p = ntk_tt.predict(apply_fn, params, x, y, optimizer=s.optimizer, steps=20, head=head,
                       backbone="isotropic")  # suggest's feature kernel
    assert first_hit(p.loss, s.target) == s.steps
    assert np.allclose(np.asarray(p.loss), s.loss, rtol=1e-4, atol=1e-6)


def test_the_warmup_refinement_box_ends_before_steps(monkeypatch):
    """The box of the (log η_peak, w) refinement (its ``_descend`` replaced: nothing is run):
    w within [1, T − 1] even from a grid warmup of T (which the grid no longer makes), and
    η_peak within learning_rate_range (here also below the SGD edge's η, 18.2)."""
    from ntk_tt.analysis import _suggest_optimizer as so

    seen = {}
    monkeypatch.setattr(so, "_descend",
                        lambda best, u0, evaluate, bounds, *_: seen.update(bounds=bounds(u0)))
    spec = so.check_search(SGD, n=N, steps=20, key=None, head_aware=True, warmups=(0.0, 0.5),
                           kappa_range=None, learning_rate_range=(1e-3, 1e-1), num_kappas=4)
    best = {"learning_rate": 0.05, "warmup": 20.0, "b": None}
    so._refine(best, None, spec["unit"], {}, 10.0, N, None, None, None, 6, 0.5, [0.0, 20.0],
               0.01, "cross_entropy", 7.6, [], {}, None, (1e-3, 1e-1))
    (low, high), span = seen["bounds"]
    assert span == (1.0, 19.0)
    assert np.exp([low, high]) == pytest.approx([1e-3, 1e-1], rel=1e-12)


def test_the_refinement_stays_in_the_learning_rate_range_asked_for():
    """A fresh user: AdamW with learning_rate_range=(1e-3, 1e-2) was refined to η_peak = 0.154.
    Now the refinement moves the warmup (3 → 1 steps, 8 → 7 steps to target) with η_peak held
    at the range's top, 1e-2 exactly; the choice checked through ``predict``."""
    model, apply_fn, params, x, y = problem()
    head = ntk_tt.split_head(model)
    s = ntk_tt.suggest(apply_fn, params, x, y, head=head, steps=12, target=0.9,
                       target_kind="fraction", optimizer=ntk_tt.adamw(1e-3), num_kappas=2,
                       learning_rate_range=(1e-3, 1e-2), warmups=(0.25,), refine_steps=4,
                       seconds_per_step={None: 0.01})
    assert s.grid.learning_rate.between(1e-3, 1e-2).all() and (
        s.grid.source == "refine").sum() == 3
    assert all(np.exp(t["log_learning_rate"]) <= 1e-2 * (1 + 1e-12) for t in s.refinement)
    assert s.found and s.refined and s.learning_rate == 1e-2
    assert (s.grid_best["steps"], s.steps, s.warmup) == (8, 7, 1.0)
    p = ntk_tt.predict(apply_fn, params, x, y, optimizer=s.optimizer, steps=12, head=head,
                       backbone="isotropic")  # suggest's feature kernel
    assert first_hit(p.loss, s.target) == s.steps


# --- the CLI ------------------------------------------------------------------------------


def cli_no_work(monkeypatch):
    def refuse(**_):
        raise AssertionError("the task was loaded before the options were checked")

    monkeypatch.setattr("ntk_tt.prediction._job.load_task", refuse)


@pytest.mark.parametrize("args,match", [
    (["--optimizer", "adamw", "-m", "0.9"], "momenta (-m/--momenta): not an option of "
                                            "optimizer adamw"),
    (["--optimizer", "sgd", "--b1", "0.8"], "b1 (--b1): not an option of optimizer sgd"),
    (["--optimizer", "sgd", "-m", "0,0.9"], "is the template's one momentum"),
    (["--optimizer", "sgd", "-B", "N,50"], "is the template's one batch size"),
    (["--b1", "0.8"], "b1 (--b1) is an option of the optimizer template's search: give "
                      "optimizer (--optimizer sgd|adamw) too, or drop it."),
    (["--lr-min", "1e-3", "--b2", "0.99"], "b2 (--b2), lr_min (--lr-min) are options of the "
                                           "optimizer template's search"),
    (["--optimizer", "adamw", "--kappa-min", "0.1"], "sizes SGD's grid"),
    (["--optimizer", "sgd", "--lr-min", "0.1"], "with sgd give both lr_min (--lr-min) and "
                                                 "lr_max"),
    # a second fresh user: AdamW's one bound alone takes the other's default (-h shows both)
    (["--optimizer", "adamw", "--lr-max", "1e-5"], "0 < min <= max (min == max exactly when "
                                                   "--num-kappas is 1), got 0.0001 (AdamW's "
                                                   "default --lr-min), 1e-05"),
    (["--optimizer", "adamw", "--lr-max", "nan"],
     "lr_max (--lr-max) must be in [1.1754944e-38, 3.4028235e+38] (float32's normal range), "
     "got nan"),
    (["--optimizer", "sgd", "--lr-min", "0.1", "--lr-max", "1", "--kappa-max", "5"],
     "not both"),
    (["--optimizer", "adamw", "--warmups", "0,1"], "warmups (--warmups) entries must be"),
    (["-T", "20", "--optimizer", "adamw", "--warmups", "0,0.99"],
     "warmups (--warmups) entry 0.99 rounds to a warmup of 20 steps, not below steps (-T) 20"),
    (["--optimizer", "sgd", "--warmups", "0.997"],  # -T 150 by default
     "entry 0.997 rounds to a warmup of 150 steps, not below steps (-T) 150"),
    (["--optimizer", "adamw", "--weight-decay", "-1"], "weight_decay (--weight-decay) must be"),
    # a fresh user: 0.1 and 0.11 of T = 30 both gave 3 steps, merged silently ("× 1 warmups")
    (["-T", "30", "--optimizer", "adamw", "--warmups", "0.1,0.11"],
     "warmups (--warmups) entries 0.1 and 0.11 both round to a 3-step warmup at -T 30"),
    (["--optimizer", "adam"], "invalid choice: 'adam'"),
])
def test_cli_bad_optimizer_options_are_one_line_before_loading(args, match, capsys,
                                                                monkeypatch):
    cli_no_work(monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        main(["suggest", "--no-progress", *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and match in err and "Traceback" not in err, err
    assert err.count("\n") == 1 or "usage:" in err, err


def test_cli_optimizer_options_are_checked_before_jax_is_imported(tmp_path):
    """A fresh interpreter: the optimiser flags' errors end the CLI (one line, status 2)
    before JAX is imported."""
    cases = [["suggest", "--optimizer", "adamw", "-m", "0.9"],
             ["suggest", "--optimizer", "sgd", "--warmups", "0,2"],
             ["suggest", "--weight-decay", "0.1"],
             ["suggest", "-T", "20", "--optimizer", "adamw", "--warmups", "0.99"]]
    code = ("import json, sys\nfrom ntk_tt.cli import main\nout = []\n"
            f"for args in {cases!r}:\n"
            "    try:\n        main(args)\n    except SystemExit as e:\n"
            "        out.append([e.code, 'jax' in sys.modules])\n"
            "print(json.dumps(out))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=os.environ | {"PYTHONPATH": ROOT}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == [[2, False]] * 4
    lines = proc.stderr.splitlines()
    assert len(lines) == 4 and all(x.startswith("ntk-tt: error: ") for x in lines), lines
    assert "not an option of optimizer adamw" in lines[0] and "[0, 1)" in lines[1]
    assert "give optimizer (--optimizer sgd|adamw) too" in lines[2]
    assert "rounds to a warmup of 20 steps, not below steps (-T) 20" in lines[3]


class _Stop(Exception):
    pass


@pytest.mark.parametrize("args,family", [
    (["--optimizer", "adamw", "--b1", "0.8", "--weight-decay", "0.01", "-B", "4",
      "--warmups", "0,0.5", "--lr-min", "1e-3", "--lr-max", "1e-2"], "adamw"),
    (["--optimizer", "sgd", "-m", "0.8"], "sgd"),
])
def test_cli_builds_the_template_the_flags_describe(args, family, monkeypatch):
    """The Optimizer and grid that ntk-tt suggest --optimizer hands to suggest (the task
    loader and suggest replaced: nothing is computed)."""
    seen = {}

    def capture(*_, **kw):
        seen.update(kw)
        raise _Stop

    monkeypatch.setattr("ntk_tt.prediction._job.load_task",
                        lambda **_: (None, None, np.zeros((6, 1)), None, None, None, {}, None))
    monkeypatch.setattr("ntk_tt.analysis._suggest_task.suggest", capture)
    with pytest.raises(_Stop):
        main(["suggest", "--no-progress", "-K", "2", "-n", "3", *args])
    o = seen["optimizer"]
    assert "batch_sizes" not in seen and "momenta" not in seen
    if family == "adamw":
        assert o.rule == "adam" and o.decoupled and o.batch_size == 4
        assert (float(o.momentum), float(o.b2), float(o.weight_decay)) == pytest.approx(
            (0.8, 0.999, 0.01))
        assert seen["warmups"] == (0.0, 0.5) and seen["learning_rate_range"] == (1e-3, 1e-2)
        assert seen["kappa_range"] is None
    else:
        assert o.rule == "sgd" and o.batch_size is None and not o.nesterov
        assert (float(o.momentum), float(o.weight_decay)) == pytest.approx((0.8, 0.0))
        assert seen["kappa_range"] == (0.05, 50.0) and seen["learning_rate_range"] is None
        assert seen["warmups"] == (0.0, 0.05, 0.1, 0.2)


def test_one_peak_learning_rate_is_accepted_for_the_eta_grid():
    """A second fresh user: ``suggest --optimizer adamw --num-kappas 1 --lr-min X --lr-max X``
    was refused by the check of SGD's κ range (0.05, 50), which the η_peak grid does not use.
    Now one peak passes the job's checks (sgd with --lr-min/--lr-max too); one peak with
    AdamW's default range is refused naming the flags, before any work; SGD's κ grid keeps
    its own rule."""
    from ntk_tt._options import check_suggest_job
    from ntk_tt._options_suggest import split_optimizer_options

    for family in ("adamw", "sgd"):
        opt_o, rest = split_optimizer_options(
            {"optimizer": family, "num_kappas": 1, "lr_min": 1e-3, "lr_max": 1e-3})
        assert opt_o["learning_rate_range"] == (1e-3, 1e-3)
        check_suggest_job(rest)
    with pytest.raises(ValueError, match=r"lr_min, lr_max \(--lr-min, --lr-max\) must satisfy "
                                         r".*got 0\.0001 \(AdamW's default --lr-min\), 0\.1 "
                                         r"\(AdamW's default --lr-max\) with num_kappas 1"):
        split_optimizer_options({"optimizer": "adamw", "num_kappas": 1})
    _, rest = split_optimizer_options({"optimizer": "sgd", "num_kappas": 1})
    with pytest.raises(ValueError, match=r"num_kappas .*\(1 exactly when min == max"):
        check_suggest_job(rest)


def test_adamw_one_peak_bound_takes_the_other_from_its_default():
    """``-h`` gives --lr-min and --lr-max each an AdamW default, so one alone is the range
    [given, default] or [default, given] (a second fresh user was told to give both)."""
    from ntk_tt._options_suggest import ADAM_LEARNING_RATE_RANGE, _lr_range

    lo, hi = ADAM_LEARNING_RATE_RANGE
    assert _lr_range({"lr_min": None, "lr_max": 0.01}, {}, "adamw") == (lo, 0.01)
    assert _lr_range({"lr_min": 1e-3, "lr_max": None}, {}, "adamw") == (1e-3, hi)
    assert _lr_range({"lr_min": None, "lr_max": None}, {}, "adamw") == (lo, hi)
    assert _lr_range({"lr_min": None, "lr_max": None}, {}, "sgd") is None
