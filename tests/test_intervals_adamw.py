"""T_ε intervals of the fast AdamW predictor: the shipped calibrator fitted on the optimiser
benchmark's AdamW rows, chosen for an Adam prediction, and its recorded update rule."""

import dataclasses
import json
import math
import pathlib
import sys
import warnings

import numpy as np
import pandas as pd
import pytest

import ntk_tt
from ntk_tt.prediction._intervals import CalibrationRangeWarning, conformal_quantile
from ntk_tt.prediction._result import Prediction
from ntk_tt.training._optimizer_run import optimizer_hyperparameters

ROOT = pathlib.Path(__file__).resolve().parents[1]
# the default (diagonal) and the isotropic fast AdamW predictors' tables (N = 250 and 750)
TABLES = {"adam": [ROOT / "experiments" / "results" / d for d in (
              "optimizers_adamw_diagonal", "optimizers_750_adamw_diagonal")],
          "adam_isotropic": [ROOT / "experiments" / "results" / d for d in (
              "optimizers", "optimizers_750")]}
TAIL = "(the T_ε intervals are an extrapolation there: their coverage is not measured)"


@pytest.fixture(scope="module")
def script():
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import intervals
    finally:
        sys.path.pop(0)
    return intervals


def adam_prediction(optimizer, times, *, kernel="head_aware_adam:diagonal", n=250, kappa=0.3):
    """A Prediction as ``ntk_tt.predict`` makes one for ``optimizer`` (its hyperparameters are
    ``optimizer_hyperparameters``'; the default diagonal kernel's k = 5), with the given
    loss-curve T_ε."""
    hyper = optimizer_hyperparameters(optimizer, 150, n) | {
        "steps": 150, "num_train": n, "loss": "cross_entropy"}
    if kernel.endswith(":diagonal"):
        hyper["subspace_dim"] = 5
    return Prediction(
        loss=None, error=None, loss_band=None, error_band=None, test_loss=None,
        test_error=None, training_time={"loss": times, "error": dict(times)},
        training_time_reasons={}, diverged=False, diverged_at=None, spiked_at=None,
        kappa=kappa, beyond_edge=False, clamped=False, min_eigenvalue=0.0,
        method="discrete", kernel=kernel, hyperparameters=hyper, seconds={})


def adamw(peak=1e-3, decay=0.01, batch_size=50):
    return ntk_tt.adamw(ntk_tt.warmup_cosine(peak, 15, 150), weight_decay=decay,
                        batch_size=batch_size)


@pytest.mark.parametrize("rule,kernel", [("adam", "diagonal"), ("adam_isotropic", "isotropic")])
def test_shipped_adamw_calibrator_is_the_fit_on_the_committed_optimizer_tables(script, rule,
                                                                             kernel):
    frame = script.family_table(TABLES[rule], "adamw_cosine")
    fitted = ntk_tt.fit_intervals(frame, 0.9, by=("optimizer",))
    shipped = ntk_tt.default_calibrator(rule)
    if kernel == "diagonal":  # experiments/intervals.py records the default's k
        fitted = dataclasses.replace(fitted, source=fitted.source | {"subspace_dim": 5})
    assert shipped.groups.keys() == fitted.groups.keys()
    for group, residuals in fitted.groups.items():  # the isotropic file kept 6 decimals
        np.testing.assert_allclose(shipped.groups[group], residuals, rtol=0, atol=5e-7)
    assert shipped == dataclasses.replace(fitted, groups=shipped.groups)
    src = shipped.source
    assert (src["pred_method"], src["pred_kernel"], src["schedule"]) == (
        ["head_aware_adam"], [kernel], ["warmup_cosine"])
    assert src["num_train"] == [250, 750] and src["weight_decay"] == [0.01, 0.1]
    assert src["learning_rate"] == pytest.approx([1e-4, 1e-3], rel=1e-6)
    # one residual log(real / predicted T_ε) per defined (row, ε) of the 96 rows
    real, pred = (frame[[f"{s}_T{e}" for e in ("0.01", "0.1", "0.4")]].to_numpy(float)
                  for s in ("real", "pred"))
    ok = np.isfinite(real) & np.isfinite(pred) & (real > 0) & (pred > 0)
    assert len(frame) == 96 and src["residuals"] == ok.sum()


def test_an_adamw_prediction_gets_the_adamw_interval():
    """Its residual group (B = 50: "sgd") of the shipped AdamW residuals, by the conformal
    rule computed here from the group, capped at T; no extrapolation warning inside the
    table's rule (η and λ float32-rounded as ``predict`` stores them)."""
    cal = ntk_tt.default_calibrator("adam")
    times = {0.1: 60.0, 0.4: 25.0}
    pred = adam_prediction(adamw(), times)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationRangeWarning)
        out = ntk_tt.intervals(pred)
    assert out["warnings"] == [] and out["error"] == {0.1: None, 0.4: None}
    group = np.array([v for (_, _, opt), r in cal.groups.items() if opt == "sgd" for v in r])
    assert len(group) >= cal.min_count
    for eps, t in times.items():
        lo = -conformal_quantile(-group, 0.95)
        hi = conformal_quantile(group, 0.95)
        assert out["loss"][eps] == pytest.approx(
            (min(t * math.exp(lo), 150.0), min(t * math.exp(hi), 150.0)), rel=1e-9)
    # the same T_ε from the constant-η predictor gets the other calibrator's interval
    sgd_like = adam_prediction(adamw(), times, kernel="head_aware:isotropic")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationRangeWarning)
        other = ntk_tt.intervals(sgd_like)
    assert other["loss"][0.1] != out["loss"][0.1]
    assert ntk_tt.calibrated_for(pred, cal) and not ntk_tt.calibrated_for(sgd_like, cal)
    # the isotropic Adam kernel's prediction gets its own calibrator's, another k none
    iso = adam_prediction(adamw(), times, kernel="head_aware_adam:isotropic")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationRangeWarning)
        assert ntk_tt.intervals(iso)["loss"] == ntk_tt.intervals(
            iso, ntk_tt.default_calibrator("adam_isotropic"))["loss"] != out["loss"]
    assert not ntk_tt.calibrated_for(iso, cal)
    other_k = pred._replace(hyperparameters=pred.hyperparameters | {"subspace_dim": 8})
    with pytest.warns(CalibrationRangeWarning):
        assert ntk_tt.intervals(other_k)["loss"] == {0.1: None, 0.4: None}


def test_adamw_interval_flags_a_peak_or_decay_outside_the_table():
    with pytest.warns(CalibrationRangeWarning) as said:
        out = ntk_tt.intervals(adam_prediction(adamw(peak=1e-2, decay=0.3), {0.1: 30.0}))
    assert out["warnings"] == [
        f"weight decay λ = 0.3 is outside the calibration table's λ = 0.01–0.1 {TAIL}",
        f"the peak learning rate η = 0.01 is outside the calibration table's "
        f"η = 0.0001–0.001 {TAIL}"]
    assert len(said) == 2 and out["loss"][0.1] is not None
    for bad in ("adamw", ["sgd"], {"rule": "adam"}, None):  # a list was a TypeError
        with pytest.raises(ValueError, match=r"rule must be one of \['adam', 'adam_isotropic', "
                                             r"'diagonal', "
                                             r"'isotropic', 'sgd', 'subspace'\]"):
            ntk_tt.default_calibrator(bad)


def test_no_interval_for_an_abstaining_prediction_and_numpy_levels():
    """A second fresh user: a prediction that abstains (outcome "unknown", Adam's ρ > 1) got a
    90 % interval; a NumPy level was refused. The CLI read a bound of 17.999995 as 17."""
    from ntk_tt._cli_report import _interval

    pred = adam_prediction(adamw(), {0.1: 60.0})
    abstains = pred._replace(outcome="unknown")
    with pytest.warns(CalibrationRangeWarning):
        out = ntk_tt.intervals(abstains)
    assert out["loss"] == {0.1: None} and out["error"] == {0.1: None}
    assert out["warnings"] == ["no T_ε interval: the prediction abstains (outcome unknown: "
                               f"{abstains.divergence_reason}), so it has no T_ε to bound"]
    assert ntk_tt.intervals(pred, level=np.float32(0.8))["loss"] == ntk_tt.intervals(
        pred, level=0.8)["loss"]
    report = {"interval_90": {"loss": {"0.4": [17.999995541023257, 42.0000004]}}}
    assert _interval(report, "loss", "0.4") == "18–42"
    report["interval_90"]["loss"]["0.4"] = [17.5, 41.2]
    assert _interval(report, "loss", "0.4") == "17–42"  # widened outwards


def test_family_mode_of_the_leave_one_set_out_script(script, tmp_path, capsys):
    """``experiments/intervals.py DIR --family F`` on a synthetic optimiser-benchmark table:
    only F's rows, the groupings by ε and optimiser, the calibrator by optimiser with the
    table's predictor and rule recorded."""
    rng = np.random.default_rng(4)
    rows = []
    for d in ("a", "b", "c"):
        for fam in ("adamw_cosine", "sgdm_cosine"):
            for i in range(24):
                pred = rng.uniform(10, 100, 2)
                real = pred * np.exp(-0.1 + 0.1 * rng.standard_normal(2))
                rows.append({"dataset": d, "family": fam, "optimizer": ("gd", "sgd")[i % 2],
                             "pred_kernel": f"head_aware{'_adam' * (fam[0] == 'a')}:isotropic",
                             "kappa": 0.1, "momentum": 0.9, "real_diverged": False,
                             "pred_diverged": False, "num_train": 250, "steps": 150,
                             "peak_learning_rate": (1e-4, 1e-3)[i % 3 == 0],
                             "weight_decay": 0.01, "pred_T0.1": pred[0], "real_T0.1": real[0],
                             "pred_T0.4": pred[1], "real_T0.4": real[1]})
    (tmp_path / "opt").mkdir()
    pd.DataFrame(rows).to_parquet(tmp_path / "opt" / "results.parquet")
    script.main([str(tmp_path / "opt"), "--family", "adamw_cosine", "--out", str(tmp_path)])
    table = pd.read_csv(tmp_path / "coverage_adamw_cosine.csv")
    pooled = table[(table["held_out"] == "pooled") & (table["eps"] == "all")]
    assert set(pooled["grouping"]) == set(script.FAMILY_GROUPINGS)
    assert (pooled["n"] == 3 * 24 * 2).all()  # the adamw rows only, two ε each
    cal = ntk_tt.IntervalCalibrator.load(tmp_path / "calibrator_adamw_cosine.json")
    assert cal.by == ("optimizer",) and cal.source["pred_method"] == ["head_aware_adam"]
    assert cal.source["learning_rate"] == [1e-4, 1e-3]
    # the reported constant stretch: the held-out sets' shift is the others' median log
    # residual, here drawn around −0.1, and it makes the median error smaller
    stretch = json.loads((tmp_path / "stretch_adamw_cosine.json").read_text())
    assert set(stretch["shift_log_by_held_out"]) == {"a", "b", "c"}
    assert all(abs(v + 0.1) < 0.05 for v in stretch["shift_log_by_held_out"].values())
    assert stretch["cases"] == 3 * 24 * 2  # the adamw rows × ε ∈ {0.1, 0.4}
    assert stretch["median_stretched"] < stretch["median_as_predicted"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        script.main([str(tmp_path / "opt"), "--family", "adam", "--out", str(tmp_path)])
    assert ended.value.code == 2  # argparse's status for a usage error, one line
    assert capsys.readouterr().err == (f"intervals.py: error: no 'adam' row in "
                                       f"{[str(tmp_path / 'opt')]}\n")
