"""T_ε intervals of the subspace feature kernel (issue 26): the shipped calibrator is the fit
on the committed subspace predictions, a ``backbone="subspace"`` prediction gets its interval
(the conformal quantiles of its ε group, by brute force), and one of another k gets none; its
divergence call is flagged as the over-call it is at large κ."""

import dataclasses
import json
import math
import pathlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _scripts import EXPERIMENTS, experiment_script, refused
from flax import nnx

import ntk_tt
from ntk_tt.prediction._intervals import CalibrationRangeWarning

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
SETS = ["sweep", "sweep_unseen_n250", "sweep_unseen_n750"]
SCHEDULES = ["optimizers_subspace", "optimizers_750_sgdm_subspace"]  # SGD-momentum, cosine


@pytest.fixture
def script(monkeypatch):
    """experiments/subspace_intervals.py as a module, run from the repository root (the T_ε
    table names its sweep directories from there)."""
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    monkeypatch.chdir(ROOT)
    return experiment_script("subspace_intervals")


class Net(nnx.Module):
    """F = 16 tanh features (the shipped k) and a linear head of C = 5 (the tables')."""

    def __init__(self, rngs):
        self.body = nnx.Linear(6, 16, rngs=rngs)
        self.head = nnx.Linear(16, 5, rngs=rngs)

    def __call__(self, x):
        return self.head(jnp.tanh(self.body(x)))


def test_shipped_subspace_calibrator_is_the_fit_on_the_committed_predictions(tmp_path,
                                                                           script):
    """experiments/subspace_intervals.py on the committed T_ε table, sweep tables and
    subspace optimiser-benchmark tables gives back the shipped file, grouped by ε, recording
    k = 16, every task's N and T, and the schedules and weight decays calibrated."""
    t_eps = str(RESULTS / "subspace_preset" / "t_eps.csv")
    args = [a for s in SETS for a in ("--set", t_eps, f"experiments/results/{s}")]
    args += [a for d in SCHEDULES for a in ("--schedule-set", f"experiments/results/{d}")]
    script.main([*args, "--out", str(tmp_path), "--t-eps", str(tmp_path / "t.csv")])
    fitted = ntk_tt.IntervalCalibrator.load(tmp_path / "calibrator_subspace.json")
    shipped = ntk_tt.default_calibrator("subspace")
    rounded = {g: tuple(round(v, 6) for v in r) for g, r in fitted.groups.items()}
    assert shipped == dataclasses.replace(fitted, groups=rounded)  # the file's 6 decimals
    assert (tmp_path / "t.csv").read_text() == pathlib.Path(t_eps).read_text()
    src = shipped.source
    assert shipped.by == ("eps",) and src["subspace_dim"] == 16
    assert (src["pred_method"], src["pred_kernel"]) == (["head_aware"], ["subspace"])
    assert src["rows"] == 168 + 72 + 72 + 48 + 48 and src["num_train"] == [50, 750]
    assert src["schedule"] == ["constant", "warmup_cosine"] and src["weight_decay"] == [0, 5e-4]
    assert src["kappa_eff"] == [1.0, 12.0]  # main-grid rows only: beyond, a prediction is flagged
    cov = (tmp_path / "coverage_subspace.csv").read_text()
    assert "eps,pooled,all,1224," in cov  # 408 rows × 3 ε, each left out with its target set


def _problem():
    model = Net(nnx.Rngs(3))
    kx, ky = jax.random.split(jax.random.key(4))
    x = jax.random.normal(kx, (50, 6))  # N and T inside the table's: no range note
    y = jax.random.randint(ky, (50,), 0, 5)
    apply_fn, params = ntk_tt.from_nnx(model)
    return apply_fn, params, x, y, ntk_tt.split_head(model)


def _brute_interval(t, eps, steps):
    """[T̂·exp(q_lo), T̂·exp(q_hi)] at 90 % from the shipped ε group, ranks by hand."""
    cal = ntk_tt.default_calibrator("subspace")
    r = np.sort([v for (_, e, _), res in cal.groups.items() if e == f"{eps:g}" for v in res])
    rank = math.ceil((len(r) + 1) * 0.95)  # the ⌈(n + 1)(1 − α/2)⌉-th smallest / largest
    return min(t * math.exp(r[len(r) - rank]), steps), min(t * math.exp(r[rank - 1]), steps)


@pytest.mark.parametrize("optimizer", [False, True])
def test_a_subspace_prediction_gets_the_subspace_interval(optimizer):
    apply_fn, params, x, y, split = _problem()
    kw = dict(steps=150, head=split)
    lr = 0.5 * 4.0 / ntk_tt.predict(apply_fn, params, x, y, learning_rate=0.5, **kw).kappa
    hyper = dict(optimizer=ntk_tt.sgd(lr)) if optimizer else dict(learning_rate=lr)
    pred = ntk_tt.predict(apply_fn, params, x, y, backbone="subspace", **hyper, **kw)
    assert 2.0 < pred.kappa < 8.0  # inside the table's κ̃ = 1–12 (κ is its kernel's: 3.9)
    assert pred.kernel == "head_aware:subspace" and pred.hyperparameters["subspace_dim"] == 16
    out = ntk_tt.intervals(pred)
    times = {e: t for e, t in pred.training_time["loss"].items() if np.isfinite(t)}
    assert times and out["warnings"] == []
    for eps, t in times.items():
        assert out["loss"][eps] == pytest.approx(_brute_interval(t, eps, 150), rel=1e-6)
    iso = ntk_tt.predict(apply_fn, params, x, y, backbone="isotropic", **hyper, **kw)
    assert "subspace_dim" not in iso.hyperparameters  # and it keeps its own intervals
    assert ntk_tt.intervals(iso)["loss"] != out["loss"]
    default = ntk_tt.predict(apply_fn, params, x, y, **hyper, **kw)  # the diagonal kernel: k=5
    assert default.hyperparameters["subspace_dim"] == 5
    assert ntk_tt.intervals(default)["loss"] not in (out["loss"], ntk_tt.intervals(iso)["loss"])
    # beyond the table's κ̃ the interval is an extrapolation, and said to be
    with pytest.warns(CalibrationRangeWarning) as said:
        far = ntk_tt.intervals(pred._replace(kappa=24.0))
    assert far["warnings"] == ["κ̃ = 24 is outside the calibration table's κ̃ = 1–12 (the T_ε "
                               "intervals are an extrapolation there: their coverage is not "
                               "measured)"] == [str(w.message) for w in said]
    assert far["loss"] == out["loss"]  # ε-grouped: the same residuals


def test_another_k_gets_no_interval():
    """The residuals are of k = 16: a k = 4 prediction is another predictor; the note says so."""
    apply_fn, params, x, y, split = _problem()
    pred = ntk_tt.predict(apply_fn, params, x, y, learning_rate=0.5, steps=150, head=split,
                          backbone="subspace", subspace_dim=4)
    assert pred.hyperparameters["subspace_dim"] == 4
    cal = ntk_tt.default_calibrator("subspace")
    assert not ntk_tt.calibrated_for(pred, cal)
    with pytest.warns(CalibrationRangeWarning, match="no T_ε interval: the calibration "
                      "table's residuals are of the head_aware:subspace predictor with k = 16 "
                      "feature directions .*; this prediction's kernel is head_aware:subspace "
                      "with k = 4 feature directions"):
        out = ntk_tt.intervals(pred)
    assert set(out["loss"].values()) == {None}


def test_the_cli_prints_a_subspace_interval(tmp_path, capsys):
    """ntk-tt predict --backbone subspace: the interval column and the report's interval_90
    hold the subspace calibrator's interval (it said n/a), with the range notes of a tiny N."""
    from test_cli import grey_digits, run_cli

    js = tmp_path / "r.json"
    code, out = run_cli(["--dataset", grey_digits(tmp_path), "-K", "2", "-n", "3", "-T", "4",
                         "--backbone", "subspace", "--json", str(js), "--figure", ""], capsys)
    r = json.loads(js.read_text())["predicted"]
    assert code == 0 and r["kernel"] == "head_aware:subspace"
    given = {e: v for e, v in r["interval_90"]["loss"].items() if v is not None}
    assert given and not [ln for ln in out.out.splitlines() if "no T_ε interval" in ln]
    assert any(w.startswith("N = 6 training samples is outside") for w in r["interval_warnings"])
    t = r["training_time"]["loss"]
    for eps, (lo, hi) in given.items():
        assert (lo, hi) == pytest.approx(_brute_interval(t[eps], float(eps), 4), rel=1e-5)


def test_a_scheduled_subspace_prediction_is_calibrated_and_a_larger_decay_is_flagged():
    """SGD-momentum + warmup-cosine + λ = 5e-4 (the calibrated optimiser-benchmark rows): an
    interval and no note; λ = 0.01 lies outside the table's λ = 0–5e-4 and is said."""
    apply_fn, params, x, y, split = _problem()
    kw = dict(steps=150, head=split, backbone="subspace")
    peak = 0.05 * 0.4 / ntk_tt.predict(apply_fn, params, x, y, learning_rate=0.05, **kw).kappa

    def opt(decay):
        return ntk_tt.sgd(ntk_tt.warmup_cosine(peak, 15, 150), momentum=0.9, weight_decay=decay)

    pred = ntk_tt.predict(apply_fn, params, x, y, optimizer=opt(5e-4), **kw)
    assert pred.kappa / (1 - 0.9) == pytest.approx(4.0, rel=1e-3)  # κ̃ = 4: inside the table's
    out = ntk_tt.intervals(pred)
    assert out["warnings"] == [] and any(out["loss"].values())
    with pytest.warns(CalibrationRangeWarning, match="weight decay λ = 0.01 is outside the "
                      "calibration table's λ = 0–0.0005"):
        far = ntk_tt.intervals(ntk_tt.predict(apply_fn, params, x, y, optimizer=opt(0.01),
                                              **kw))
    assert any(far["loss"].values())
    # L2 decay in the loss (decoupled=False): the tables' decay is decoupled (a fresh user's
    # find: it got an interval without a note)
    l2 = ntk_tt.sgd(ntk_tt.warmup_cosine(peak, 15, 150), momentum=0.9, weight_decay=5e-4,
                    decoupled=False)
    with pytest.warns(CalibrationRangeWarning, match=r"L2 \(in the loss\) weight decay is "
                      r"outside the calibration table's \(decoupled decay only\)"):
        ntk_tt.intervals(ntk_tt.predict(apply_fn, params, x, y, optimizer=l2, **kw))


def test_another_number_of_classes_is_flagged():
    """The tables' tasks have C = 5 classes; a fresh user's C = 2 intervals covered 5 of 12
    real T_ε without a note. Every shipped calibrator records C and flags another."""
    model = Net(nnx.Rngs(3))
    model.head = nnx.Linear(16, 2, rngs=nnx.Rngs(4))
    apply_fn, params = ntk_tt.from_nnx(model)
    x = jax.random.normal(jax.random.key(4), (50, 6))
    y = jnp.arange(50) % 2
    for rule in ("sgd", "adam", "subspace"):
        assert ntk_tt.default_calibrator(rule).source["num_classes"] == [5, 5]
    pred = ntk_tt.predict(apply_fn, params, x, y, learning_rate=0.05, steps=150,
                          head=ntk_tt.split_head(model), backbone="subspace")
    assert pred.hyperparameters["num_classes"] == 2
    with pytest.warns(CalibrationRangeWarning, match="C = 2 classes is outside the calibration "
                      "table's C = 5 "):
        ntk_tt.intervals(pred)


@pytest.mark.parametrize("backbone", ["subspace", "diagonal"])
def test_a_feature_subspace_curve_that_diverges_below_kappa_max_is_called_a_catapult(backbone):
    """backbone="subspace" / "diagonal": a predicted curve that diverges below κ = 68 is
    called "catapult" (on the full preset every such call of the diagonal kernel, 15 at
    κ̃ = 32–48, was a real catapult), with no T_ε (its curve diverged) and no warning; at
    κ ≥ 68 the κ rule calls "diverges"; the default keeps its curve's call."""
    apply_fn, params, x, y, split = _problem()
    kw = dict(steps=150, head=split)
    lr = 0.05 * 30.0 / ntk_tt.predict(apply_fn, params, x, y, learning_rate=0.05, **kw).kappa
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pred = ntk_tt.predict(apply_fn, params, x, y, learning_rate=lr, backbone=backbone,
                              **kw)
    assert pred.diverged and pred.kappa < 68 and pred.outcome == "catapult"
    assert pred.divergence == "no" and pred.spike_step is not None
    assert all(np.isnan(v) for v in pred.training_time["loss"].values())
    from ntk_tt.prediction._result import LINEARISED_CATAPULT  # the reason says why

    assert set(pred.training_time_reasons["loss"].values()) == {LINEARISED_CATAPULT}
    with pytest.warns(CalibrationRangeWarning) as said:  # intervals were silent: []
        out = ntk_tt.intervals(pred)
    assert not any(out["loss"].values()) and out["warnings"]
    assert out["warnings"][0].startswith("no T_ε interval") and len(said) == 1
    iso = ntk_tt.predict(apply_fn, params, x, y, learning_rate=lr, backbone="isotropic", **kw)
    assert iso.diverged and iso.outcome == "diverges"  # the isotropic kernel's own call
    far = ntk_tt.predict(apply_fn, params, x, y, learning_rate=lr * 3, backbone=backbone, **kw)
    assert far.kappa >= 68 and far.outcome == "diverges" and far.divergence == "yes"


def test_bad_inputs_are_one_line_and_nothing_is_written(tmp_path, capsys, script):
    """A fresh user: a failing run had already rewritten the committed T_ε table (dropping
    rows), and bad paths were tracebacks."""
    t_eps = str(RESULTS / "subspace_preset" / "t_eps.csv")
    before = pathlib.Path(t_eps).read_text()
    out = ["--out", str(tmp_path / "out"), "--t-eps", str(tmp_path / "t.csv")]
    sweep = ["--set", t_eps, "experiments/results/sweep"]
    for args, said in [
            (["--set", str(tmp_path / "none.csv"), "experiments/results/sweep"], "is not a file"),
            (["--set", t_eps, str(tmp_path / "nodir")], "no results table"),
            ([*sweep, "--schedule-set", "experiments/results/sweep"],
             "is not an optimizer_sweep.py directory"),
            ([*sweep, "--schedule-set", "experiments/results/optimizers"],
             "holds ['isotropic'] predictions: pass a benchmark run with --backbone subspace"),
            ([*sweep, "--schedule-set", str(tmp_path)], "holds no results.parquet")]:
        line = refused(script, [*args, *out], capsys)
        assert said in line, line
    assert not (tmp_path / "out").exists() and not (tmp_path / "t.csv").exists()
    assert pathlib.Path(t_eps).read_text() == before


def test_a_shipped_calibrator_edited_by_one_caller_is_not_edited_for_the_next():
    """default_calibrator returned the cached object: setting its source["subspace_dim"]
    to 8 made every later intervals() of a k = 16 prediction give none (a fresh user)."""
    mine = ntk_tt.default_calibrator("subspace")
    mine.source["subspace_dim"] = 8
    mine.groups.clear()
    again = ntk_tt.default_calibrator("subspace")
    assert again.source["subspace_dim"] == 16 and again.groups


def test_a_t_eps_that_would_drop_rows_a_bad_level_and_other_spellings(tmp_path, capsys,
                                                                      script):
    """A second fresh user: --t-eps onto the T_ε table with one --set of its three exited 0
    and dropped 144 rows; --level 1.5 and an unwritable --t-eps were tracebacks after --out
    was made; a trailing slash on the sweep directory matched no row."""
    t_eps = str(RESULTS / "subspace_preset" / "t_eps.csv")
    before = pathlib.Path(t_eps).read_text()
    one = ["--set", t_eps, "experiments/results/sweep", "--out", str(tmp_path / "out")]
    for args, said in [(["--t-eps", t_eps], "rewriting it would drop their rows"),
                       (["--level", "1.5"], "--level must lie in (0, 1)"),
                       (["--t-eps", str(tmp_path / "no" / "t.csv")], "existing folder")]:
        assert said in refused(script, [*one, *args], capsys)
    assert not (tmp_path / "out").exists() and pathlib.Path(t_eps).read_text() == before
    assert not (tmp_path / "t.csv").exists()
    slash = script.subspace_table(t_eps, "experiments/results/sweep/")
    assert len(slash) == len(script.subspace_table(t_eps, str(RESULTS / "sweep"))) == 168
