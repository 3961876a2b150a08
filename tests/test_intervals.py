"""Conformal T_ε intervals (``prediction._intervals``): quantile rule, coverage, grouping, I/O."""

import dataclasses
import json
import math
import pathlib
import sys
import warnings
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from _scripts import experiment_script, refused

import ntk_tt
from ntk_tt.prediction._intervals import CalibrationRangeWarning, conformal_quantile, kappa_bin
from ntk_tt.prediction._result import Prediction

ROOT = pathlib.Path(__file__).resolve().parents[1]
SWEEP = ROOT / "experiments" / "results" / "sweep"
# per (κ̃, optimiser): (location, scale) of the log residual log(T_real / T_pred)
TRUTH = {(1.0, "gd"): (0.05, 0.02), (1.0, "sgd"): (0.1, 0.05),
         (12.0, "gd"): (0.3, 0.3), (12.0, "sgd"): (0.2, 0.5)}


def brute_quantile(scores, q):
    """Smallest score s with #{scores ≤ s} ≥ (n + 1)·q, in exact arithmetic; +inf if none."""
    need = (len(scores) + 1) * Fraction(str(q))
    for s in sorted(scores):
        if sum(v <= s for v in scores) >= need:
            return s
    return math.inf


@pytest.mark.parametrize("q", [0.5, 0.9, 0.95, 0.975, 0.05])
def test_quantile_rule_matches_brute_force(q):
    rng = np.random.default_rng(0)
    for n in list(range(1, 60)) + [99, 199]:
        scores = [float(v) for v in rng.integers(0, 7, n)]  # ties on purpose
        assert conformal_quantile(scores, q) == brute_quantile(scores, q), (n, q)


def test_quantile_edges():
    # (n + 1)·q = 19 exactly: the 19th of 19, not +inf
    assert conformal_quantile(np.arange(19.0), 0.95) == 18.0
    assert conformal_quantile(np.arange(18.0), 0.95) == math.inf
    assert conformal_quantile([], 0.9) == math.inf


def synthetic(rng, n_per, datasets=("a",)):
    """A sweep table whose residuals follow TRUTH (normal in log space) at ε ∈ {0.1, 0.4}."""
    rows = []
    for d in datasets:
        for (k, opt), (loc, sc) in TRUTH.items():
            for _ in range(n_per):
                pred = rng.uniform(10, 100, 2)
                real = pred * np.exp(loc + sc * rng.standard_normal(2))
                rows.append({"dataset": d, "kappa_eff": k, "optimizer": opt,
                             "real_diverged": False, "pred_diverged": False,
                             "pred_T0.1": pred[0], "real_T0.1": real[0],
                             "pred_T0.4": pred[1], "real_T0.4": real[1]})
    return pd.DataFrame(rows)


def test_mondrian_coverage_per_group_on_a_known_distribution():
    """Split conformal with n = 39 per group at 90 %: the bounds are the 2nd smallest and 2nd
    largest residual, so coverage is exactly (38 − 2)/40 = 0.9 in expectation over the
    calibration draw, in every group; checked over many random splits."""
    rng = np.random.default_rng(1)
    splits, level = 300, 0.9
    covered = {g: [] for g in TRUTH}
    for _ in range(splits):
        cal = ntk_tt.fit_intervals(synthetic(rng, 39), level,
                                   by=("kappa", "optimizer", "eps"), min_count=20)
        for (k, opt), (loc, sc) in TRUTH.items():
            pred = 50.0
            real = pred * np.exp(loc + sc * rng.standard_normal(20))
            lo, hi = cal.interval(pred, k, 0.1, opt)
            covered[(k, opt)] += list((lo <= real) & (real <= hi))
    # sd of the mean coverage: ~0.0035 (Beta(36, 4) per split over 300 splits, + binomial)
    for g, c in covered.items():
        assert abs(np.mean(c) - level) <= 0.015, (g, np.mean(c))


def test_interval_is_the_group_quantiles_and_grouping_is_respected():
    rng = np.random.default_rng(2)
    frame = synthetic(rng, 30)
    cal = ntk_tt.fit_intervals(frame, 0.8, by=("kappa", "optimizer", "eps"))
    sub = frame[(frame["kappa_eff"] == 12.0) & (frame["optimizer"] == "sgd")]
    r = np.log(sub["real_T0.4"] / sub["pred_T0.4"]).tolist()
    lo, hi = cal.interval(40.0, 12.0, 0.4, "sgd")
    assert hi == pytest.approx(40 * math.exp(brute_quantile(r, 0.9)))
    assert lo == pytest.approx(40 * math.exp(-brute_quantile([-v for v in r], 0.9)))
    assert cal.group(12.0, 0.4, "sgd") == ({"kappa": ">8", "optimizer": "sgd", "eps": "0.4"},
                                           30)
    # a narrow group's interval is narrower than the wide group's
    lo1, hi1 = cal.interval(40.0, 1.0, 0.4, "gd")
    assert hi1 - lo1 < (hi - lo) / 5


def test_small_groups_fall_back_to_coarser_ones():
    rng = np.random.default_rng(3)
    frame = synthetic(rng, 15)  # 15 per (κ̃, optimiser, ε): under min_count
    cal = ntk_tt.fit_intervals(frame, 0.9, by=("kappa", "eps", "optimizer"), min_count=20)
    assert cal.group(1.0, 0.1, "gd") == ({"kappa": "<=2", "eps": "0.1"}, 30)
    sub = frame[frame["kappa_eff"] == 1.0]
    r = np.log(sub["real_T0.1"] / sub["pred_T0.1"]).tolist()
    assert cal.interval(1.0, 1.0, 0.1, "gd")[1] == pytest.approx(
        math.exp(brute_quantile(r, 0.95)))
    # an ε never calibrated falls back to κ̃ alone; a κ̃ bin never seen to everything pooled
    assert cal.group(1.0, 0.2, "gd") == ({"kappa": "<=2"}, 60)
    assert cal.group(4.0, 0.1, "gd") == ({}, 120)
    # at 99 % no group of 30 gives a finite bound: the pooled 120 do not either, so ±inf
    assert cal.group(1.0, 0.1, "gd", level=0.99) == ({}, 120)
    assert cal.interval(1.0, 1.0, 0.1, "gd", level=0.99) == (0.0, math.inf)


def test_kappa_bins_are_right_closed():
    assert [kappa_bin(k) for k in (0.5, 2.0, 2.01, 8.0, 8.5)] == [
        "<=2", "<=2", "(2, 8]", "(2, 8]", ">8"]


def test_diverged_and_undefined_rows_are_skipped():
    frame = synthetic(np.random.default_rng(4), 5)
    n = ntk_tt.fit_intervals(frame).source["residuals"]
    bad = frame.iloc[:4].copy()
    bad["real_diverged"] = [True, False, False, False]
    bad["pred_diverged"] = [False, True, False, False]
    bad.loc[bad.index[2], "real_T0.1"] = np.nan
    bad.loc[bad.index[3], "pred_T0.4"] = np.nan
    cal = ntk_tt.fit_intervals(pd.concat([frame, bad]))
    assert cal.source["residuals"] == n + 2  # rows 3 and 4 keep their other ε


def test_save_load_round_trip(tmp_path):
    cal = ntk_tt.fit_intervals(synthetic(np.random.default_rng(5), 10), 0.8)
    cal.save(tmp_path / "c.json")
    back = ntk_tt.IntervalCalibrator.load(tmp_path / "c.json")
    assert back == cal and back.to_json() == cal.to_json()
    for case in [(30.0, 1.0, 0.1, "gd"), (30.0, 12.0, 0.4, "sgd"), (7.0, 5.0, 0.01, "sgd")]:
        assert back.interval(*case) == cal.interval(*case)  # exact: residuals kept in full
    (tmp_path / "x.json").write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="not an interval calibrator"):
        ntk_tt.IntervalCalibrator.load(tmp_path / "x.json")
    for broken in ('{"format": "ntk_tt.intervals/1", "level": 0.9', '{"format": '
                   '"ntk_tt.intervals/1"}'):  # broken JSON, fields missing
        (tmp_path / "x.json").write_text(broken)
        with pytest.raises(ValueError, match=r"x.json is not an interval calibrator \(a JSON "
                                             r"file of format 'ntk_tt.intervals/1'"):
            ntk_tt.IntervalCalibrator.load(tmp_path / "x.json")
    with pytest.raises(ValueError, match=r"calibrator path .*: folder .*nowhere' does not "
                                         r"exist; create it first"):
        cal.save(tmp_path / "nowhere" / "c.json")


@pytest.mark.parametrize("kw,match", [({"level": 1.0}, "level"), ({"level": "0.9"}, "level"),
                                      ({"by": ("kappa", "seed")}, "by must"),
                                      ({"min_count": 0}, "min_count"),
                                      *[({"kappa_edges": e}, r"kappa_edges must be finite "
                                         r"positive .* increasing order")
                                        for e in [(8.0, 2.0), (2.0, 2.0), (2.0, math.inf),
                                                  (0.0, 8.0), (), "2, 8"]]])
def test_bad_arguments_raise(kw, match):
    with pytest.raises(ValueError, match=match):
        ntk_tt.fit_intervals(synthetic(np.random.default_rng(6), 2), **kw)


def test_bad_table_and_prediction_raise():
    with pytest.raises(ValueError, match="lacks columns"):
        ntk_tt.fit_intervals(pd.DataFrame({"real_T0.1": [1.0]}))
    # a fresh user: a NaN κ̃ went to the '>8' bin, "False" strings counted as diverged, and a
    # column real_T0_1 was read as ε = 1 (float("0_1")), real_T1.5 made groups at ε = 1.5
    good = synthetic(np.random.default_rng(8), 10)
    nan_kappa = good.copy()
    nan_kappa.loc[0, "kappa_eff"] = np.nan
    strings = good.assign(real_diverged=good["real_diverged"].astype(str))
    for frame, match in ((nan_kappa, r"kappa_eff must be a finite number >= 0 in every row .*"
                                     r"got nan in row 0"),
                         (strings, r"column real_diverged must hold bools, got dtype (object|str)"),
                         (good.rename(columns={"real_T0.1": "real_T0_1"}),
                          r"column real_T0_1: its ε must be a decimal number in \(0, 1\)"),
                         (good.rename(columns={"real_T0.1": "real_T1.5"}), r"real_T1\.5"),
                         # a T_ε of 0 or inf was dropped without a word (session 41)
                         (good.assign(**{"pred_T0.1": good["pred_T0.1"].where(
                             good.index != 3, np.inf)}), r"column pred_T0.1 holds inf in row 3: "
                          r"a T_ε is a finite number of steps > 0"),
                         (good.assign(**{"real_T0.1": good["real_T0.1"].where(
                             good.index != 0, 0.0)}), r"column real_T0.1 holds 0.0 in row 0")):
        with pytest.raises(ValueError, match=match):
            ntk_tt.fit_intervals(frame)
    cal = ntk_tt.fit_intervals(synthetic(np.random.default_rng(7), 10))
    # a fresh user fitted 5 rows and got (0, T) from every interval without a word
    few = synthetic(np.random.default_rng(7), 10).iloc[:5]
    n = sum(len(v) for v in ntk_tt.fit_intervals(few, 0.5).groups.values())
    assert 0 < n < 19
    with pytest.warns(ntk_tt.CalibrationRangeWarning, match=rf"fit_intervals on 5 rows: level "
                                                            rf"0\.9 needs more residuals .*"
                                                            rf"\({n}, all pooled\)"):
        ntk_tt.fit_intervals(few)
    assert ntk_tt.fit_intervals(good, by="kappa").by == ("kappa",)  # not ('k', 'a', 'p', ...)
    with pytest.raises(ValueError, match="positive"):
        cal.interval(0.0, 1.0, 0.1, "gd")
    with pytest.raises(ValueError, match="takes a Prediction from ntk_tt.predict, got "
                                         "NoneType"):
        ntk_tt.intervals(None, cal)
    # a third fresh user: wrong types were AttributeErrors, a missing file a pathlib error
    with pytest.raises(ValueError, match="fit_intervals takes the sweep's results table"):
        ntk_tt.fit_intervals([1, 2, 3])
    for missing in ("/nonexistent/c.json", "/tmp"):
        with pytest.raises(ValueError, match="is not a file"):
            ntk_tt.IntervalCalibrator.load(missing)
    with pytest.raises(ValueError, match="is not a file"):
        ntk_tt.OutcomePredictor.load("/nonexistent/p.json")
    with pytest.raises(ValueError, match="calibrated_for takes a Prediction .* got NoneType "
                                         "and IntervalCalibrator"):
        ntk_tt.calibrated_for(None, cal)
    pred = fake_prediction(1.0, 0.0, 100, {0.1: 10.0})
    for bad in (None, "x"):
        with pytest.raises(ValueError, match="and an IntervalCalibrator"):
            ntk_tt.calibrated_for(pred, bad)
    # a third fresh user: a NaN or negative κ̃, ε = 0.77 outside (0, 1)... were silently
    # binned or pooled, an unknown optimiser silently fell back
    for args in [(float("nan"), 0.1, "gd"), (-1.0, 0.1, "gd"), (1.0, 1.5, "gd"),
                 (1.0, 0.1, "adam")]:
        with pytest.raises(ValueError, match="kappa_eff must be a finite number >= 0"):
            cal.interval(10.0, *args)


def fake_prediction(kappa, momentum, batch_size, times, *, method="discrete",
                    kernel="head_aware:diagonal", loss="cross_entropy", num_train=100,
                    steps=150):
    return Prediction(
        loss=None, error=None, loss_band=None, error_band=None, test_loss=None,
        test_error=None, training_time={"loss": times, "error": dict(times)},
        training_time_reasons={}, diverged=False, diverged_at=None, spiked_at=None,
        kappa=kappa, beyond_edge=False, clamped=False, min_eigenvalue=0.0,
        method=method, kernel=kernel,
        hyperparameters={"momentum": momentum, "batch_size": batch_size,
                         "num_train": num_train, "steps": steps, "loss": loss}
        | ({"subspace_dim": 5} if kernel == "head_aware:diagonal" else {}),  # the default k
        seconds={})


def test_intervals_of_a_prediction_use_effective_kappa_and_optimizer():
    cal = ntk_tt.fit_intervals(synthetic(np.random.default_rng(8), 20),
                               by=("kappa", "optimizer"))
    pred = fake_prediction(1.2, 0.9, 50, {0.1: 40.0, 0.4: float("nan")})  # κ̃ = 12, SGD
    out = ntk_tt.intervals(pred, cal)
    assert out["loss"][0.1] == cal.interval(40.0, 12.0, 0.1, "sgd")
    assert out["loss"][0.1] != cal.interval(40.0, 1.2, 0.1, "sgd")
    assert out["loss"][0.4] is None and out["error"] == {0.1: None, 0.4: None}
    gd = ntk_tt.intervals(fake_prediction(1.0, 0.0, 100, {0.1: 40.0}), cal, level=0.5)
    assert gd["loss"][0.1] == cal.interval(40.0, 1.0, 0.1, "gd", level=0.5)


def as_shipped(cal) -> dict:
    """``cal.to_json()`` with residuals rounded to 6 decimals: the precision the shipped
    calibrators were written at (``save`` rounded them then; it now writes them exactly)."""
    data = cal.to_json()
    for group in data["groups"]:
        group["residuals"] = [round(v, 6) for v in group["residuals"]]
    return data


@pytest.mark.skipif(not (SWEEP / "results.parquet").exists(), reason="no committed table")
def test_fitted_saved_and_loaded_calibrators_are_equal_and_give_the_same_intervals(tmp_path):
    """A fresh user: save rounded residuals to 6 decimals, so a calibrator fitted on the
    committed table came back from load unequal (residuals ~5e-7 apart, bounds ~1e-5
    relative). Now every float is written in full (its repr reads back to the same float): the
    loaded calibrator equals the fitted one, residual by residual, and gives the same
    intervals bit for bit; a shipped calibrator survives load → save → load unchanged."""
    cal = ntk_tt.fit_intervals(pd.read_parquet(SWEEP / "results.parquet"), 0.9)
    cal.save(tmp_path / "c.json")
    back = ntk_tt.IntervalCalibrator.load(tmp_path / "c.json")
    assert back == cal
    assert all(back.groups[g] == r and all(type(v) is float for v in back.groups[g])
               for g, r in cal.groups.items())
    cases = [(t, k, e, o) for t in (3.0, 41.5, 140.0) for k in (0.5, 4.0, 30.0)
             for e in (0.01, 0.1, 0.4) for o in ("gd", "sgd")]
    for case in cases:
        assert back.interval(*case) == cal.interval(*case)
        assert back.interval(*case, level=0.8, steps=150) == cal.interval(*case, level=0.8,
                                                                          steps=150)
    assert max(abs(round(v, 6) - v) for r in cal.groups.values() for v in r) > 1e-7  # was lost
    for rule in ("sgd", "adam", "subspace"):
        shipped = ntk_tt.default_calibrator(rule)
        shipped.save(tmp_path / f"{rule}.json")
        assert ntk_tt.IntervalCalibrator.load(tmp_path / f"{rule}.json") == shipped


def test_save_refuses_an_existing_file_unless_overwrite(tmp_path):
    """A fresh user: IntervalCalibrator.save replaced an existing file silently, while
    save_telemetry and save_checkpoint refuse it without overwrite=True. Now save refuses it
    too (the file left as it was), and overwrite=True replaces it."""
    cal = ntk_tt.fit_intervals(synthetic(np.random.default_rng(5), 10), 0.8)
    path = tmp_path / "c.json"
    path.write_text("mine")
    with pytest.raises(ValueError) as err:
        cal.save(path)
    assert str(err.value) == (f"calibrator path {path} exists; pass overwrite=True to replace "
                              "it, or give a new file name. Nothing was written.")
    assert path.read_text() == "mine"
    with pytest.raises(ValueError, match="exists; pass overwrite=True"):
        cal.save(path, overwrite=1)  # True only, as save_telemetry
    cal.save(path, overwrite=True)
    assert ntk_tt.IntervalCalibrator.load(path) == cal
    other = ntk_tt.fit_intervals(synthetic(np.random.default_rng(6), 10), 0.8)
    other.save(path, overwrite=True)
    assert ntk_tt.IntervalCalibrator.load(path) == other != cal


def test_interval_refuses_a_nan_or_non_number_t_pred_and_one_beyond_the_horizon():
    """A fresh user: a NaN t_pred gave (nan, nan) while a negative one was refused, a string
    κ̃ "1.0" was read as 1.0, and t_pred = 50 with steps = 20 gave (20, 20) silently: a
    T̂_ε predicted over T steps is at most T (T_ε is the first step of a T-step curve to
    settle), so a larger one was made over another horizon. Each is now one ValueError;
    t_pred = T is accepted, its interval capped at T; intervals() still gives None for an
    undefined (NaN) T̂_ε."""
    cal = ntk_tt.fit_intervals(synthetic(np.random.default_rng(7), 10))
    with pytest.raises(ValueError) as err:
        cal.interval(float("nan"), 1.0, 0.1, "gd")
    assert str(err.value) == (
        "t_pred is NaN: an undefined predicted T_ε (never reached, or the prediction "
        "diverged) has no interval; skip it (ntk_tt.intervals gives None there) and pass "
        "only defined T_ε, in steps.")
    for bad in (math.inf, -math.inf, -3.0, 0.0):
        with pytest.raises(ValueError, match="t_pred must be a positive finite number of "
                                             "steps"):
            cal.interval(bad, 1.0, 0.1, "gd")
    for args, name in (((np.float64("nan"), 1.0, 0.1, "gd"), "t_pred is NaN"),
                       (("10", 1.0, 0.1, "gd"), "t_pred must be a real number, got str"),
                       ((True, 1.0, 0.1, "gd"), "t_pred must be a real number, got bool"),
                       ((np.ones(2), 1.0, 0.1, "gd"), r"t_pred must be one number, got an "
                                                      r"array of shape \(2,\)"),
                       ((10.0, "1.0", 0.1, "gd"), "kappa_eff must be a real number, got str"),
                       ((10.0, 1.0, None, "gd"), "eps must be a real number, got NoneType")):
        with pytest.raises(ValueError, match=name):
            cal.interval(*args)
    for steps in (0, -5, math.nan, math.inf, "20", False):
        with pytest.raises(ValueError, match="steps must be"):
            cal.interval(10.0, 1.0, 0.1, "gd", steps=steps)
    with pytest.raises(ValueError) as err:
        cal.interval(50.0, 1.0, 0.1, "gd", steps=20)
    assert str(err.value) == (
        "t_pred = 50.0 lies beyond the horizon steps = 20: a T_ε predicted over T steps is at "
        "most T (it is undefined, NaN, when the curve has not settled by then); pass the "
        "horizon the prediction was made over, or steps=None for no cap.")
    lo, hi = cal.interval(20.0, 1.0, 0.1, "gd")  # uncapped
    assert cal.interval(20.0, 1.0, 0.1, "gd", steps=np.int64(20)) == (min(lo, 20.0),
                                                                      min(hi, 20.0))
    assert cal.interval(50.0, 1.0, 0.1, "gd") == cal.interval(50.0, 1.0, 0.1, "gd", steps=None)
    pred = fake_prediction(1.0, 0.0, 100, {0.1: float("nan"), 0.4: 20.0}, steps=150)
    assert ntk_tt.intervals(pred, cal)["loss"] == {
        0.1: None, 0.4: cal.interval(20.0, 1.0, 0.4, "gd", steps=150)}


def test_intervals_are_capped_at_the_horizon():
    """T_ε ≤ T by definition, so a bound past T is cut to T; one inside T is left alone."""
    cal = ntk_tt.fit_intervals(synthetic(np.random.default_rng(8), 20),
                               by=("kappa", "optimizer"))
    raw = cal.interval(140.0, 12.0, 0.1, "gd")
    assert raw[0] < 140.0 < 150.0 < raw[1]  # κ̃ = 12's residuals are wide (TRUTH)
    pred = fake_prediction(12.0, 0.0, 100, {0.1: 140.0, 0.4: 20.0}, steps=150)
    out = ntk_tt.intervals(pred, cal)["loss"]
    assert out[0.1] == (raw[0], 150.0)
    assert out[0.4] == cal.interval(20.0, 12.0, 0.4, "gd") and out[0.4][1] < 150.0


def test_a_level_the_table_cannot_resolve_is_said():
    """n pooled residuals give finite conformal bounds up to level 1 − 2/(n + 1) exactly
    (⌈(n + 1)(1 − α/2)⌉ <= n); above it the interval is (0, T), and ``intervals`` says so."""
    cal = ntk_tt.fit_intervals(synthetic(np.random.default_rng(8), 20), by=("kappa",))
    n = sum(len(r) for r in cal.groups.values())
    pred = fake_prediction(1.0, 0.0, 100, {0.1: 40.0}, steps=150)
    edge = 1 - 2 / (n + 1)
    ok = ntk_tt.intervals(pred, cal, level=edge)
    assert 0 < ok["loss"][0.1][0] < 40.0 < ok["loss"][0.1][1] < 150.0
    assert not any("residuals" in w for w in ok["warnings"])
    with pytest.warns(ntk_tt.CalibrationRangeWarning, match=f"more residuals .*\\({n}, all"):
        out = ntk_tt.intervals(pred, cal, level=1 - 1.5 / (n + 1))
    assert out["loss"][0.1] == (0.0, 150.0)
    assert any(f"levels up to {edge:.3f}" in w for w in out["warnings"])


@pytest.mark.skipif(not (SWEEP / "results.parquet").exists(), reason="no committed table")
def test_shipped_calibrator_is_the_fit_on_the_committed_table():
    from ntk_tt.sweep._summary import promote
    from ntk_tt.sweep._table import read_table

    primary = json.loads((SWEEP / "summary.json").read_text())["primary"]  # the default
    table = read_table(SWEEP)
    if primary["promoted_variant"]:  # the table's primary is not the default predictor
        table = promote(table, primary["promoted_variant"], primary["demoted_primary_as"])
    fitted = ntk_tt.fit_intervals(table, 0.9)
    fitted = dataclasses.replace(fitted, source=fitted.source | {"subspace_dim": 5})  # k = 5
    shipped = ntk_tt.default_calibrator()
    assert fitted.source["num_train"] == [50, 750] and fitted.source["steps"] == [150, 150]
    # written exactly since session 34; refitted with pandas 3.1 / numpy 2.4, 11 of the 18
    # groups' residuals differ from it by 1 ulp (at most 2.8e-17), so they are compared to
    # float64 rounding and everything else exactly
    got, want = shipped.to_json(), fitted.to_json()
    for g, w in zip(got["groups"], want["groups"], strict=True):
        np.testing.assert_allclose(g.pop("residuals"), w.pop("residuals"), rtol=1e-12,
                                   atol=1e-15)
    assert got == want
    # the isotropic kernel's (the default before): the previous table's fit, 6 decimals
    iso = ntk_tt.default_calibrator("isotropic")
    assert iso.source["pred_kernel"] == ["isotropic"] and iso.source["residuals"] == 1080
    assert all(round(v, 6) == v for g in iso.to_json()["groups"] for v in g["residuals"])
    pred = fake_prediction(0.4, 0.9, 100, {0.01: 140.0, 0.1: 60.0, 0.4: 20.0})
    out = ntk_tt.intervals(pred)
    for eps, t in pred.training_time["loss"].items():
        capped = [min(b, 150.0) for b in fitted.interval(t, 4.0, eps, "gd")]  # T = 150
        assert out["loss"][eps] == pytest.approx(capped, rel=1e-5)


def test_no_interval_for_a_predictor_the_residuals_are_not_of():
    """The shipped residuals are the default head-aware predictor's (discrete recursion,
    cross-entropy): a frozen-kernel, subset, ODE or MSE prediction gets no interval, and a
    calibrator that does not name its predictor matches any discrete cross-entropy one."""
    times = {0.01: 140.0, 0.1: 60.0, 0.4: 20.0}
    shipped = ntk_tt.default_calibrator()
    assert shipped.source["pred_method"] == ["head_aware"]
    assert all(ntk_tt.intervals(fake_prediction(0.4, 0.0, 100, times))["loss"].values())
    k3 = fake_prediction(0.4, 0.0, 100, times)  # the diagonal kernel with another k
    k3 = k3._replace(hyperparameters=k3.hyperparameters | {"subspace_dim": 3})
    with pytest.warns(CalibrationRangeWarning, match="with k = 3 feature directions"):
        assert not any(ntk_tt.intervals(k3)["loss"].values())
    for other in (dict(kernel="exact"), dict(kernel="traced:subset150:power_law"),
                  dict(kernel="head_aware:isotropic:refresh4"), dict(method="ode"),
                  dict(loss="mse")):
        with pytest.warns(CalibrationRangeWarning) as said:  # it said nothing of why
            out = ntk_tt.intervals(fake_prediction(0.4, 0.0, 100, times, **other))
        why = ("no T_ε interval: the calibration table's residuals are of the "
               "head_aware:diagonal predictor with k = 5 feature directions (method "
               "discrete, loss cross_entropy); this prediction's kernel is ")
        assert out["loss"] == dict.fromkeys(times) and out["error"] == dict.fromkeys(times)
        assert len(out["warnings"]) == 1 and out["warnings"][0].startswith(why), out
        assert [str(w.message) for w in said] == out["warnings"]
    unnamed = ntk_tt.fit_intervals(synthetic(np.random.default_rng(10), 20))
    assert "pred_method" not in unnamed.source
    pred = fake_prediction(1.0, 0.0, 100, {0.1: 40.0}, kernel="exact")
    assert ntk_tt.intervals(pred, unnamed)["loss"][0.1] == unnamed.interval(40.0, 1.0, 0.1, "gd")
    with pytest.warns(CalibrationRangeWarning, match="residuals are of discrete-recursion "
                      r"predictions .* kernel is head_aware:diagonal \(method discrete, "
                      r"loss mse\): fit"):
        out = ntk_tt.intervals(fake_prediction(1.0, 0.0, 100, {0.1: 40.0}, loss="mse"),
                               unnamed)
    assert out["loss"][0.1] is None
    # a prediction that calls divergence has no T_ε: the note says so (it said nothing)
    diverges = fake_prediction(1.0, 0.0, 100, {0.1: math.nan})._replace(outcome="diverges")
    with pytest.warns(CalibrationRangeWarning):
        out = ntk_tt.intervals(diverges)
    assert out["loss"] == {0.1: None} and out["warnings"] == [
        "no T_ε interval: the prediction calls divergence (outcome diverges: "
        f"{diverges.divergence_reason}), so it has no T_ε to bound"]


def test_leave_one_set_out_script(tmp_path):
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import intervals as script
    finally:
        sys.path.pop(0)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    frame = synthetic(np.random.default_rng(9), 12, datasets=("a", "b", "c"))
    frame.to_parquet(sweep / "results.parquet")
    script.main([str(sweep), "--out", str(tmp_path / "out")])
    table = pd.read_csv(tmp_path / "out" / "coverage.csv")
    pooled = table[(table["held_out"] == "pooled") & (table["eps"] == "all")]
    assert set(pooled["grouping"]) == set(script.GROUPINGS)
    assert (pooled["n"] == len(frame) * 2).all()
    kappa = pooled[pooled["grouping"] == "kappa"].iloc[0]
    assert 0.75 <= kappa["coverage"] <= 1.0 and kappa["median_rel_width"] > 0
    back = ntk_tt.IntervalCalibrator.load(tmp_path / "out" / "calibrator.json")
    assert back.source["dataset"] == ["a", "b", "c"] and back.by == ("kappa",)


def ranged_calibrator(seed=11):
    """A calibrator fitted on a table of N ∈ {50, 250} and T = 150 (the committed sweep's kind),
    plus rows with no residual (diverged) at N = 5000, T = 900: they calibrate nothing."""
    rng = np.random.default_rng(seed)
    frame = synthetic(rng, 20)
    frame["num_train"] = rng.choice([50, 250], len(frame))
    frame["steps"] = 150
    dead = frame.iloc[:3].copy()
    dead["real_diverged"], dead["num_train"], dead["steps"] = True, 5000, 900
    return ntk_tt.fit_intervals(pd.concat([frame, dead]), 0.9)


def test_calibrator_records_the_n_and_t_it_was_fitted_on(tmp_path):
    cal = ranged_calibrator()
    assert cal.source["num_train"] == [50, 250] and cal.source["steps"] == [150, 150]
    cal.save(tmp_path / "c.json")
    back = ntk_tt.IntervalCalibrator.load(tmp_path / "c.json")
    assert back.source["num_train"] == [50, 250] and back.to_json() == cal.to_json()
    # a calibrator written before the ranges were recorded (the shipped one) loads, flags nothing
    data = json.loads((tmp_path / "c.json").read_text())
    del data["source"]["num_train"], data["source"]["steps"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    old = ntk_tt.IntervalCalibrator.load(tmp_path / "old.json")
    assert old.range_warnings(10**6, 10**6) == [] and old.groups == back.groups


def test_intervals_refuses_a_bad_calibrator_and_bad_recorded_ranges(tmp_path):
    """A fresh user: intervals(pred, calibrator='x') blamed calibrated_for; a recorded
    source["num_train"] that is not a [min, max] pair loaded; range_warnings('10') compared a
    string with numbers."""
    pred = fake_prediction(1.0, 0.0, 100, {0.1: 10.0})
    for bad, kind in (("x", "a str"), (ntk_tt.default_calibrator().to_json(), "a dict")):
        with pytest.raises(ValueError, match=r"^calibrator must be an IntervalCalibrator "
                                             r"\(IntervalCalibrator\.load\(path\)\) or None "
                                             rf"\(the shipped one\), got {kind}\.$"):
            ntk_tt.intervals(pred, calibrator=bad)
    with pytest.raises(ValueError, match=r"^level must be a number in \(0, 1\)"):
        ntk_tt.intervals(fake_prediction(1.0, 0.0, 100, {}), level="0.9")
    cal = ranged_calibrator()
    cal.save(tmp_path / "c.json")
    data = json.loads((tmp_path / "c.json").read_text())
    for field, value, shown in (("num_train", [250, 50], r"\[250, 50\]"),
                                ("steps", [150], r"\[150\]"), ("num_train", "50-250", "a str"),
                                ("steps", ["1", "2"], r'\["1", "2"\]'),
                                ("steps", None, "None"), ("num_train", [1, 2, 3], "a list")):
        (tmp_path / "bad.json").write_text(json.dumps(
            data | {"source": data["source"] | {field: value}}))
        with pytest.raises(ValueError, match=rf"bad\.json: source\['{field}'\] must be a "
                                             r"\[min, max\] pair of numbers with min <= max, "
                                             rf"got {shown}; fix or delete it, or refit\.$"):
            ntk_tt.IntervalCalibrator.load(tmp_path / "bad.json")
    (tmp_path / "bad.json").write_text(json.dumps(data | {"source": [1, 2]}))
    with pytest.raises(ValueError, match="is not an interval calibrator"):
        ntk_tt.IntervalCalibrator.load(tmp_path / "bad.json")
    for kw, field in (({"num_train": "10"}, "num_train"), ({"steps": [150]}, "steps")):
        with pytest.raises(ValueError, match=rf"^{field} must be a number \([NT], .*\) or None, "
                                             r"got a (str|list); pass e\.g\."):
            cal.range_warnings(**kw)
    assert cal.range_warnings(np.int64(50), 150.0) == []


def test_intervals_flag_n_outside_the_calibration_table():
    """N = 2000 when the calibration table had N = 50–250: the interval is still given, and
    the result and a CalibrationRangeWarning (a BeyondEdgeWarning: ntk-tt predict prints it)
    say it is an extrapolation; T = 150 is inside, so only N is named."""
    cal = ranged_calibrator()
    pred = fake_prediction(1.0, 0.0, 2000, {0.1: 40.0, 0.4: 10.0}, num_train=2000)
    with pytest.warns(CalibrationRangeWarning, match="N = 2000 training samples") as said:
        out = ntk_tt.intervals(pred, cal)
    assert out["loss"][0.1] == cal.interval(40.0, 1.0, 0.1, "gd")
    assert out["warnings"] == [
        "N = 2000 training samples is outside the calibration table's N = 50–250 (the T_ε "
        "intervals are an extrapolation there: their coverage is not measured)"]
    assert len(said) == 1 and issubclass(said[0].category, ntk_tt.BeyondEdgeWarning)
    # T outside too (and N below the range): one message each, N first
    both = fake_prediction(1.0, 0.0, 20, {0.1: 40.0}, num_train=20, steps=300)
    with pytest.warns(CalibrationRangeWarning):
        out = ntk_tt.intervals(both, cal)
    assert [w.split(" is outside")[0] for w in out["warnings"]] == [
        "N = 20 training samples", "T = 300 steps"]
    assert "calibration table's T = 150 (" in out["warnings"][1]


def test_intervals_inside_the_calibration_table_are_not_flagged():
    cal = ranged_calibrator()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationRangeWarning)
        for n in (50, 120, 250):  # the range's ends included
            out = ntk_tt.intervals(fake_prediction(1.0, 0.0, n, {0.1: 40.0}, num_train=n), cal)
            assert out["warnings"] == [] and out["loss"][0.1] is not None
        # no interval given for an undefined T_ε: no range flag
        pred = fake_prediction(1.0, 0.0, 9000, {0.1: math.nan}, num_train=9000)
        assert ntk_tt.intervals(pred, cal)["warnings"] == []
    # nor for a predictor the residuals are not of: only the note that says why
    mse = fake_prediction(1.0, 0.0, 9000, {0.1: 40.0}, num_train=9000, loss="mse")
    with pytest.warns(CalibrationRangeWarning):
        said = ntk_tt.intervals(mse, cal)["warnings"]
    assert len(said) == 1 and said[0].startswith("no T_ε interval"), said


def test_intervals_flag_an_update_rule_the_calibration_table_lacks(tmp_path):
    """The benchmark table is constant η, λ = 0, heavy-ball (a table without those columns is
    taken as such): a warmup-cosine, weight-decayed or Nesterov prediction gets its interval
    with one message per field; the same rule as the table's gets none. The hyperparameters
    are ``predict``'s own (``optimizer_hyperparameters``), so the key names are pinned."""
    from ntk_tt.training._optimizer_run import optimizer_hyperparameters

    cal = ranged_calibrator()
    assert (cal.source["schedule"], cal.source["weight_decay"], cal.source["nesterov"]) == (
        ["constant"], [0.0, 0.0], [False])
    assert ntk_tt.default_calibrator().source["schedule"] == ["constant"]

    def pred(optimizer):
        p = fake_prediction(1.0, 0.0, 100, {0.1: 40.0})
        p.hyperparameters.update(optimizer_hyperparameters(optimizer, 150, 100))
        return p

    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationRangeWarning)
        assert ntk_tt.intervals(pred(ntk_tt.sgd(0.1, 0.9)), cal)["warnings"] == []
    odd = pred(ntk_tt.sgd(ntk_tt.warmup_cosine(0.1, 10, 150), 0.9, nesterov=True,
                          weight_decay=0.01))
    with pytest.warns(CalibrationRangeWarning) as said:
        out = ntk_tt.intervals(odd, cal)
    tail = "(the T_ε intervals are an extrapolation there: their coverage is not measured)"
    assert out["warnings"] == [
        f"the warmup_cosine learning-rate schedule is outside the calibration table's "
        f"schedules (constant) {tail}",
        f"weight decay λ = 0.01 is outside the calibration table's λ = 0 {tail}",
        f"Nesterov momentum is outside the calibration table's (heavy-ball momentum only) "
        f"{tail}"]
    kappa_eff = 1.0 / (1.0 - odd.hyperparameters["momentum"])  # κ̃ = κ/(1 − m), m = 0.9
    assert len(said) == 3 and out["loss"][0.1] == cal.interval(40.0, kappa_eff, 0.1, "gd")
    # a table that has the columns records them: λ inside [0, 0.02] is not flagged
    frame = synthetic(np.random.default_rng(3), 20)
    frame["schedule"] = np.where(np.arange(len(frame)) % 2, "constant", "warmup_cosine")
    frame["weight_decay"], frame["nesterov"] = np.linspace(0, 0.02, len(frame)), True
    wide = ntk_tt.fit_intervals(frame)
    assert wide.source["schedule"] == ["constant", "warmup_cosine"]
    assert ntk_tt.intervals(odd, wide)["warnings"] == []
    # a calibrator file with a bad recorded rule is refused on load
    wide.save(tmp_path / "c.json")
    data = json.loads((tmp_path / "c.json").read_text())
    for field, value in (("schedule", "constant"), ("nesterov", [0]), ("weight_decay", [1, 0])):
        (tmp_path / "bad.json").write_text(json.dumps(
            data | {"source": data["source"] | {field: value}}))
        with pytest.raises(ValueError, match=rf"bad\.json: source\['{field}'\] must be a "):
            ntk_tt.IntervalCalibrator.load(tmp_path / "bad.json")


def test_report_records_and_the_cli_prints_the_range_warning():
    """``predict_task``'s report keeps ``intervals``'s warnings (``interval_warnings``) and
    ``ntk-tt predict``'s table prints each as a "warning:" line (the CLI ignores the Python
    warning and prints the report's). The shipped calibrator covers N = 50–750, T = 150."""
    from test_cli import fake_report

    from ntk_tt._cli_report import format_report
    from ntk_tt.prediction._compare import predicted_summary

    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationRangeWarning)  # recorded, not warned
        times = {0.01: 90.0, 0.1: 40.0, 0.4: 10.0}
        inside = predicted_summary(fake_prediction(1.0, 0.0, 250, times, num_train=250), 1.0)
        outside = predicted_summary(fake_prediction(1.0, 0.0, 10, times, num_train=10,
                                                    steps=300), 1.0)
    assert inside["interval_warnings"] == []
    said = ["N = 10 training samples is outside the calibration table's N = 50–750 (the T_ε "
            "intervals are an extrapolation there: their coverage is not measured)",
            "T = 300 steps is outside the calibration table's T = 150 (the T_ε intervals are "
            "an extrapolation there: their coverage is not measured)"]
    assert outside["interval_warnings"] == said
    r = fake_report(verify=False, pred_diverged=False, real_diverged=False)
    r["predicted"]["interval_warnings"] = said
    lines = format_report(r).splitlines()
    assert all(f"warning: {w}" in lines for w in said)
    r["predicted"]["interval_warnings"] = []
    assert not any("calibration table" in ln for ln in format_report(r).splitlines())


def test_leave_one_set_out_script_refuses_an_unusable_out_before_reading(tmp_path, capsys):
    """``--out`` inside a file was found only after the sweep table was read (a traceback
    from mkdir); now one line first: the sweep directory here does not even exist."""
    (tmp_path / "file").write_text("")
    err = refused(experiment_script("intervals"),
                  [str(tmp_path / "no_sweep"), "--out", str(tmp_path / "file" / "out")], capsys)
    assert err.split(": error: ", 1)[1] == (f"'{tmp_path / 'file' / 'out'}' is inside "
                   f"{tmp_path / 'file'}, which is not a directory; give --out a directory "
                   "path (created if missing).")


def test_leave_one_set_out_script_refuses_a_bad_level_and_a_missing_table_in_one_line(
        tmp_path, capsys):
    """A fresh user (session 41): --level 1.5 / nan were fit_intervals' traceback after the
    table was read, a missing sweep folder a pandas traceback."""
    script = experiment_script("intervals")
    sweep = str(ROOT / "experiments" / "results" / "sweep")
    out = ["--out", str(tmp_path / "out")]
    for level in ("1.5", "nan"):
        err = refused(script, [sweep, "--level", level, *out], capsys)
        assert err.split(": error: ", 1)[1] == (f"--level must be a number in (0, 1), e.g. "
                                                f"0.9; got {float(level)}.")
    err = refused(script, [str(tmp_path / "none"), *out], capsys)
    assert err.split(": error: ", 1)[1] == (f"no results.parquet in {tmp_path / 'none'}: give "
                                            "a sweep's output folder.")


def test_leave_one_set_out_script_refuses_family_misuse_with_status_2(tmp_path, capsys):
    """--family on the constant-η sweep's folder, an unknown family, and two folders without
    --family exited with status 1 (``SystemExit(message)``); now argparse's 2, one line."""
    script = experiment_script("intervals")
    results = ROOT / "experiments" / "results"
    out = ["--out", str(tmp_path / "out")]
    err = refused(script, [str(results / "sweep"), "--family", "adamw_cosine", *out], capsys)
    assert "hold no optimiser-benchmark table (no family column)" in err
    err = refused(script, [str(results / "optimizers"), "--family", "bogus", *out], capsys)
    assert err.split(": error: ", 1)[1].startswith("no 'bogus' row in ")
    err = refused(script, [str(results / "sweep"), str(results / "sweep"), *out], capsys)
    assert err.split(": error: ", 1)[1] == ("give one sweep directory (several only with "
                                            "--family)")
