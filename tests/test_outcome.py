"""Outcome prediction from early telemetry: featurisation without leaks, the parametric
baseline against closed forms, fitting on a corpus with a known law, conformal coverage,
save/load round trip, the run-file reader and ``ntk-tt outcome``."""

import dataclasses
import gzip
import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from _scripts import experiment_script, refused

import ntk_tt
from ntk_tt.dynamics._training_time import training_time
from ntk_tt.telemetry._outcome import (
    OutcomePredictor,
    default_outcome_predictor,
    fit_outcome,
    parametric_baseline,
)
from ntk_tt.telemetry._outcome_domain import feature_domain, out_of_domain
from ntk_tt.telemetry._outcome_features import (
    TARGETS,
    check_rows,
    dataset,
    outcome_features,
    run_labels,
)
from ntk_tt.telemetry._runs_file import load_runs
from ntk_tt.telemetry._telemetry import SCHEMA_VERSION, Telemetry

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORPUS = ROOT / "experiments" / "results" / "telemetry" / "corpus.jsonl.gz"

T = 40
SNAPS = np.array([0, 1, 2, 4, 8, 20, 40])


def _telemetry(rng, *, a=2.0, b=0.1, c=0.5, lr=0.01, m=0.0, batch=10, n=50) -> Telemetry:
    """A run whose loss is exactly c + a·exp(−b t), other fields drawn at random."""
    t = np.arange(T + 1.0)
    loss = c + a * np.exp(-b * t)
    return Telemetry(
        learning_rate=lr, momentum=m, nesterov=False, batch_size=batch, steps=T,
        num_train=n, num_classes=5, loss_name="cross_entropy", snr_samples=8, stopped_at=-1,
        loss=loss, accuracy=1 - loss / loss[0] * 0.8, weight_distance=np.sqrt(t) * b,
        weight_norm=10 + t * b, head_norm=1 + t * b, grad_norm=rng.uniform(0.5, 1.5, T),
        grad_snr=rng.uniform(0, 2, T), snapshot_steps=SNAPS,
        max_prob_mean=rng.uniform(0.2, 1, len(SNAPS)),
        saturated_fraction=rng.uniform(0, 1, len(SNAPS)),
        dead_relu_fraction=rng.uniform(0, 1, len(SNAPS)),
        test_loss=rng.uniform(0, 2, len(SNAPS)), test_accuracy=rng.uniform(0, 1, len(SNAPS)))


def _corpus(n_runs, seed=0, noise=0.01):
    """Corpus rows whose divergence is a known function of η and whose final held-out accuracy
    is chance (0.2) when diverged, else a known function of the loss decay rate b (visible in
    the first steps)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_runs):
        b = rng.uniform(0.01, 0.3)
        lr = float(10 ** rng.uniform(-3, 0))
        tele = _telemetry(rng, b=b, c=rng.uniform(0.2, 0.8), lr=lr)
        div = lr > 0.3
        acc = 0.2 if div else float(np.clip(0.2 + 2.5 * b + rng.normal(0, noise), 0, 1))
        t01 = float(training_time(tele.loss, 0.1))
        pred = {"loss": list(tele.loss * 1.1), "error": [0.5] * (T + 1),
                "test_loss": [1.0] * (T + 1), "test_error": [1 - acc] * (T + 1),
                "diverged": bool(div), "spiked_at": -1, "kappa": lr * 100,
                "beyond_edge": False, "training_time": [[t01, t01, t01]] * 2}
        rows.append({
            "run_id": f"r{i}", "task_id": f"task{i % 4}", "dataset": f"d{i % 2}",
            "optimizer": "sgd", "batch_size": 10, "per_class": 10, "momentum": 0.0,
            "kappa_eff": round(lr, 3), "steps": T, "telemetry": tele.to_dict(),
            "prediction": pred,
            "outcome": {"test_accuracy": acc, "diverged": div, "failed": div or acc < 0.25,
                        "training_time": {"0.1": None if div else t01}}})
    return rows


def test_features_read_nothing_past_k():
    rng = np.random.default_rng(0)
    tele = _telemetry(rng)
    k = 4
    garbage = dataclasses.replace(
        tele, loss=np.r_[tele.loss[:k + 1], np.full(T - k, 1e9)],
        grad_norm=np.r_[tele.grad_norm[:k], np.full(T - k, 7e3)],
        test_accuracy=np.where(SNAPS <= k, tele.test_accuracy, 0.123))
    a, b = outcome_features(tele, k), outcome_features(garbage, k)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name] == pytest.approx(b[name], nan_ok=True), name
    # against brute force on the prefix
    assert a["loss_k_rel"] == pytest.approx(tele.loss[k] / tele.loss[0])
    assert a["grad_last"] == pytest.approx(tele.grad_norm[k - 1])
    assert a["grad_first"] == pytest.approx(tele.grad_norm[0])
    assert a["snap_test_accuracy"] == pytest.approx(tele.test_accuracy[SNAPS == 4][0])
    assert a["k_frac"] == pytest.approx(k / T)
    slope = np.polyfit(np.arange(k - k // 2 + 1), np.log(tele.loss[k // 2:k + 1]), 1)[0]
    assert a["loss_logslope"] == pytest.approx(slope)
    # k = 0: no gradient seen yet
    z = outcome_features(tele, 0)
    assert math.isnan(z["grad_last"]) and z["loss_k_rel"] == 1.0


def test_ntk_features_use_the_prediction_and_the_prefix_only():
    rows = _corpus(1)
    tele = Telemetry.from_dict(rows[0]["telemetry"])
    f = outcome_features(tele, 8, rows[0]["prediction"])
    pred_loss = np.asarray(rows[0]["prediction"]["loss"])
    assert f["ntk_real_over_pred_k"] == pytest.approx(tele.loss[8] / pred_loss[8])
    assert f["ntk_loss_T_rel"] == pytest.approx(pred_loss[-1] / pred_loss[0])
    with pytest.raises(ValueError, match="must hold the predicted 'error' curve"):
        outcome_features(tele, 8, {"loss": [1.0]})


@pytest.mark.parametrize("form", ["exp", "power"])
def test_parametric_baseline_recovers_a_known_curve(form):
    t = np.arange(T + 1.0)
    curve = 0.5 + 2.0 * (np.exp(-0.08 * t) if form == "exp" else (t + 1) ** -0.7)
    tele = dataclasses.replace(_telemetry(np.random.default_rng(1)), loss=curve)
    out = parametric_baseline(tele, 10)
    assert out["loss_T_rel"] == pytest.approx(curve[-1] / curve[0], rel=1e-3)
    assert out["t_eps"] == training_time(curve, 0.1)


def test_parametric_baseline_flags_a_non_finite_prefix():
    tele = _telemetry(np.random.default_rng(2))
    bad = dataclasses.replace(tele, loss=np.r_[tele.loss[:3], np.inf, tele.loss[4:]],
                              stopped_at=3)
    assert parametric_baseline(bad, 5)["loss_T_rel"] == math.inf
    for k in (2.7, True, "3"):  # int(k) took 2.7 as 2 and True as 1
        with pytest.raises(ValueError, match=r"k must be an int in \[0, "):
            parametric_baseline(tele, k)


def test_fit_learns_a_known_law_and_intervals_cover():
    train, test = _corpus(240, seed=0), _corpus(120, seed=1)
    model = fit_outcome(train, ntk=False, ks=(0.1,))
    data = dataset(test, ks=(0.1,), ntk=False)
    pred = model.predict_features(data.x)
    y = data.y["test_accuracy"]
    r2 = 1 - np.sum((pred["test_accuracy"] - y) ** 2) / np.sum((y - y.mean()) ** 2)
    assert r2 > 0.9
    half = model.intervals["test_accuracy"]["0.1"]
    coverage = np.mean(np.abs(pred["test_accuracy"] - y) <= half)
    assert 0.8 <= coverage <= 0.99
    div = data.y["diverged"].astype(bool)
    assert pred["diverged"][div].min() > pred["diverged"][~div].max()  # η decides it exactly


def test_fit_outcome_names_the_missing_fields_and_the_row():
    """A fresh user: a row without a needed field gave a bare KeyError ('kappa_eff')."""
    rows = _corpus(6)
    del rows[2]["kappa_eff"], rows[2]["outcome"]["failed"], rows[4]["dataset"]
    with pytest.raises(ValueError, match=r"^rows\[2\] lacks the field\(s\) kappa_eff, "
                                         r"outcome\.failed that fit_outcome needs \(1 more of "
                                         r"the 6 rows lack fields too\); a corpus row .*holds "
                                         r"telemetry, outcome, .*kappa_eff, batch_size \(sgd\), "
                                         r"and outcome: test_accuracy, diverged, failed, "
                                         r"training_time\.$"):
        fit_outcome(rows, ntk=False, ks=(0.1,), folds=2)
    rows = _corpus(6)
    del rows[5]["batch_size"]  # an sgd run needs its batch size
    with pytest.raises(ValueError, match=r"^rows\[5\] lacks the field\(s\) batch_size that"):
        fit_outcome(rows, ntk=False, ks=(0.1,), folds=2)
    # a probe: ntk=True fitted on rows without predictions (every NTK input NaN), silently
    rows = _corpus(6)
    rows[3]["prediction"] = None
    with pytest.raises(ValueError, match=r"ntk=True reads each row's NTK prediction, but "
                                         r"rows\[3\] has none \(1 of the 6 rows\)"):
        fit_outcome(rows, ntk=True, ks=(0.1,), folds=2)
    for bad, match in (("corpus.jsonl.gz", r"rows must be a list of corpus rows \(dicts\), got "
                                           r"str; read .*read_corpus\(path\)"),
                       ([rows[0], 1], r"rows\[1\] is int, not a corpus row \(a dict")):
        with pytest.raises(ValueError, match=match):
            fit_outcome(bad, ntk=False, ks=(0.1,), folds=2)


def test_fit_outcome_refuses_one_row_non_numbers_and_bad_level_or_folds():
    """A fresh user: fit_outcome(rows[0]) said "rows[0] is str"; kappa_eff='abc' gave
    "Unknown format code 'g'"; level='0.9' and folds='5' gave raw TypeErrors."""
    rows = _corpus(6)
    with pytest.raises(ValueError, match=r"^rows is a single dict \(one corpus row\?\), but "
                                         r"fit_outcome takes a list of corpus rows: pass a list, "
                                         r"e\.g\. fit_outcome\(\[row, \.\.\.\]\)"):
        fit_outcome(rows[0], ntk=False, ks=(0.1,), folds=2)
    for field, value, shown in (("kappa_eff", "abc", r"a str \('abc'\)"),
                                ("momentum", None, "None"), ("steps", True, "a bool"),
                                ("per_class", [10], "a list"),
                                ("batch_size", "10", r"a str \('10'\)")):
        bad = _corpus(6)
        bad[3][field] = value
        with pytest.raises(ValueError, match=rf"^rows\[3\]\['{field}'\] must be a real number, "
                                             rf"got {shown}; store kappa_eff, momentum, "
                                             r"per_class, steps, batch_size as numbers"):
            fit_outcome(bad, ntk=False, ks=(0.1,), folds=2)
    for kw, match in (({"level": "0.9"}, r"^level must be a number in \(0, 1\).*got a str "
                                         r"\('0\.9'\)\.$"),
                      ({"level": 1.5}, r"^level must be a number in \(0, 1\).*got 1\.5\.$"),
                      ({"folds": "5"}, r"^folds must be an integer >= 2.*got a str \('5'\)\.$"),
                      ({"folds": 2.0}, r"^folds must be an integer >= 2.*got 2\.0\.$"),
                      ({"folds": 1}, r"^folds must be an integer >= 2.*got 1\.$"),
                      ({"seed": 1.5}, r"^fit_outcome needs seed, an integer in \[0, 2\*\*31\)"
                                      r".*got 1\.5\.$"),
                      ({"seed": -1}, r"^fit_outcome needs seed.*got -1\.$")):
        with pytest.raises(ValueError, match=match):
            fit_outcome(rows, **({"ntk": False, "ks": (0.1,), "folds": 2} | kw))
    gd = _corpus(6)  # a gd row's batch_size may be None
    gd[0] |= {"optimizer": "gd", "batch_size": None}
    assert len(check_rows(gd)) == 6


@pytest.mark.parametrize("path, value, match", [
    (("outcome", "diverged"), "False", r"\['outcome'\]\['diverged'\] must be True or False, "
                                       r"got a str \('False'\)"),
    (("outcome", "diverged"), float("nan"), r"\['diverged'\] must be True or False, got nan"),
    (("outcome", "failed"), 2.0, r"\['failed'\] must be True or False, got 2\.0"),
    (("outcome", "test_accuracy"), 1.5, r"\['test_accuracy'\] must be a fraction in \[0, 1\]"),
    (("outcome", "test_accuracy"), "0.5", r"\['test_accuracy'\] must be a fraction.*a str"),
    (("outcome", "training_time", "0.1"), -5.0, r"\['0\.1'\] must be T_ε in steps within "
                                                r"\[0, steps = 40\]"),
    (("outcome", "training_time", "0.1"), 1e9, r"\['0\.1'\] must be T_ε.*got 1000000000\.0"),
    (("steps",), 0, r"\['steps'\] must be a whole number >= 1, got 0"),
    (("steps",), 7, r"\['steps'\] must be the telemetry's steps \(40\), got 7"),
    (("kappa_eff",), -1.0, r"\['kappa_eff'\] must be a finite number > 0, got -1\.0"),
    (("momentum",), 5.0, r"\['momentum'\] must be in \[0, 1\), got 5\.0"),
    (("per_class",), -3, r"\['per_class'\] must be a whole number >= 1, got -3"),
    (("batch_size",), 0, r"\['batch_size'\] must be a whole number >= 1 \(None for gd\)"),
    # a second fresh user's
    (("outcome", "training_time"), None, r"\['training_time'\] must be a dict \{ε: T_ε in "
                                         r"steps\}, got None"),
    (("outcome", "training_time", "0.1"), float("-inf"), r"\['0\.1'\] must be T_ε.*got -inf"),
    (("outcome", "diverged"), np.array([True]), r"\['diverged'\] must be True or False"),
    (("run_id",), None, r"\['run_id'\] must be a non-empty string \(it groups the rows\)"),
    (("task_id",), ["a"], r"\['task_id'\] must be a non-empty string"),
])
def test_fit_outcome_refuses_row_values_out_of_range(path, value, match):
    """A fresh user: diverged "False" (or NaN) was read as diverged = 1, T_0.1 = -5 or 1e9
    steps of a 40-step run became a label, steps = 0 was a raw ZeroDivisionError, and a
    negative κ̃, m = 5 or B = 0 were fitted. Each is now one line naming row and field, before
    any featurising."""
    rows = _corpus(6)
    *parents, leaf = path
    target = rows[3]
    for key in parents:
        target = target[key]
    target[leaf] = value
    with pytest.raises(ValueError, match=r"^rows\[3\](\['outcome'\])?(\['training_time'\])?"
                                         + match):
        fit_outcome(rows, ntk=False, ks=(0.1,), folds=2)


def test_unknown_accuracy_is_unknown_above_median_and_bad_ks_or_ntk_are_refused():
    """An unknown (NaN) final accuracy gave above_median = 0, a firm label; ks="0.1" was a raw
    TypeError, ks=(0.1, 0.1) duplicated every row, ntk="yes" was taken as True."""
    rows = _corpus(6)
    bad = _corpus(6)
    bad[4]["telemetry"]["steps"] = "40"  # the row is named (a corpus has a thousand)
    with pytest.raises(ValueError, match=r"^rows\[4\]\['telemetry'\]: telemetry field 'steps'"):
        dataset(bad, ks=(0.1,), ntk=False)
    rows[2]["outcome"]["test_accuracy"] = float("nan")
    labels = run_labels(rows)
    assert np.isnan(labels[2]["above_median"])
    assert all(lb["above_median"] in (0.0, 1.0) for i, lb in enumerate(labels) if i != 2)
    for kw, match in (({"ks": "0.1"}, r"^ks must be a non-empty list of distinct prefix "
                                      r"fractions in \[0, 1\].*got a str \('0\.1'\)"),
                      ({"ks": (0.1, 0.1)}, r"^ks must be .*distinct"),
                      ({"ks": ()}, r"^ks must be a non-empty list"),
                      ({"ks": (0.1, 1.5)}, r"^ks must be .* in \[0, 1\].*got \[0\.1, 1\.5\]\.$"),
                      ({"ntk": "yes"}, r"^ntk must be True or False .*got a str \('yes'\)")):
        with pytest.raises(ValueError, match=match):
            fit_outcome(rows, **({"ntk": False, "ks": (0.1,), "folds": 2} | kw))


def test_save_load_round_trip(tmp_path):
    rows = _corpus(80)
    model = fit_outcome(rows, ntk=True, ks=(0.0, 0.1), folds=3)
    data = dataset(rows[:10], ks=(0.1,), ntk=True)
    for name in ("p.json", "p.json.gz"):
        model.save(tmp_path / name)
        back = OutcomePredictor.load(tmp_path / name)
        a, b = model.predict_features(data.x), back.predict_features(data.x)
        for t in TARGETS:
            np.testing.assert_allclose(a[t], b[t], rtol=1e-12, atol=1e-12)
        assert back.columns == model.columns and back.intervals == model.intervals
    assert "not exist" in str(pytest.raises(ValueError, model.save, tmp_path / "no/p").value)
    tele = Telemetry.from_dict(rows[0]["telemetry"])
    one = back.predict(tele, rows[0]["prediction"], k=4)
    assert one["observed_updates"] == 4 and 0 <= one["p_diverged"] <= 1
    lo, hi = one["test_accuracy_interval"]
    assert lo <= one["test_accuracy"] <= hi
    with pytest.raises(ValueError, match="NTK prediction"):
        back.predict(tele, None)
    # a fresh user's predict(telemetry, 3), meaning "the first 3 updates", read them all
    with pytest.raises(ValueError, match="got int; the number of updates to read is k="):
        back.predict(tele, 3)
    plain = fit_outcome(rows, ntk=False, ks=(0.1,), folds=2)
    with pytest.raises(ValueError, match="uses no NTK features .* would be unused"):
        plain.predict(tele, rows[0]["prediction"], k=4)
    assert plain.predict(tele, k=4)["observed_updates"] == 4
    # a third fresh user: p_diverged 0.997 came with a T_0.1 and its interval, while
    # ntk-tt outcome said "none expected"; the API now says None too
    sure = {t: np.array([0.9 if t == "diverged" else 0.5]) for t in TARGETS}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(back, "predict_features", lambda x: sure)
        out = back.predict(tele, rows[0]["prediction"], k=4)
    assert out["p_diverged"] == 0.9
    assert out["t_eps_0.1"] is None and out["t_eps_0.1_interval"] == [None, None]
    # a fourth: a 1-step run was given T_0.1 = 0.58 steps; T_ε and its interval lie in [1, T]
    for log_t, want in ((math.log(0.01), 1.0), (math.log(2.0), float(T)), (math.log(0.5), T / 2)):
        sure = {t: np.array([log_t if t == "log_t_eps" else 0.1]) for t in TARGETS}
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(back, "predict_features", lambda x, sure=sure: sure)
            out = back.predict(tele, rows[0]["prediction"], k=4)
        lo, hi = out["t_eps_0.1_interval"]
        assert out["t_eps_0.1"] == pytest.approx(want) and 1.0 <= lo <= want <= hi <= T
    (tmp_path / "bad.json").write_text("{\"format_version\": 99}")
    with pytest.raises(ValueError, match="format version"):
        OutcomePredictor.load(tmp_path / "bad.json")


def test_load_runs_accepts_both_row_forms_and_names_bad_lines(tmp_path):
    rows = _corpus(2)
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(rows[0]["telemetry"]) + "\n" + json.dumps(rows[1]) + "\n")
    runs = load_runs(path)
    assert [r[0] for r in runs] == [1, 2]  # the line numbers the messages name
    path.write_text("\n" + json.dumps(rows[0]["telemetry"]) + "\n\n" + json.dumps(rows[1]))
    assert [r[0] for r in load_runs(path)] == [2, 4]  # blank lines counted, as in the errors
    path.write_text(json.dumps(rows[0]["telemetry"]) + "\n" + json.dumps(rows[1]) + "\n")
    assert runs[0][2] is None and runs[1][2] == rows[1]["prediction"]
    path.write_text(json.dumps(rows[0]["telemetry"]) + "\n{not json\n")
    with pytest.raises(ValueError, match="line 2: not JSON"):
        load_runs(path)
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION, "loss": [1.0]}))
    with pytest.raises(ValueError, match="row 1: telemetry row fields differ"):
        load_runs(path)
    # a fresh user gave `ntk-tt outcome` an `ntk-tt predict --json` report: it said "schema
    # version None ... re-record the run", which would not help
    path.write_text(json.dumps({"status": "complete", "predicted": {}, "task": {}}))
    with pytest.raises(ValueError, match=r"row 1: not a telemetry row \(no schema_version; keys "
                                         r"\['predicted', 'status', 'task'\]\): give a file "
                                         "that ntk_tt.save_telemetry wrote"):
        load_runs(path)
    path.write_text("")
    with pytest.raises(ValueError, match="holds no runs"):
        load_runs(path)
    # a fresh user: a value nested 100,000 deep was a RecursionError traceback, as the whole
    # file and as the second line of JSON Lines
    deep = '{"kappa": ' + "[" * 100_000 + "]" * 100_000 + "}"
    path.write_text(deep)
    with pytest.raises(ValueError, match="runs.jsonl: JSON nested too deeply to be a run row"):
        load_runs(path)
    path.write_text("{}\n" + deep + "\n")
    with pytest.raises(ValueError, match="line 2: JSON nested too deeply to be a run row"):
        load_runs(path)


@pytest.mark.parametrize("args, match", [
    (["missing.jsonl"], "does not exist"),
    (["RUNS", "--updates", "2", "--fraction", "0.1"], "not both"),
    (["RUNS", "--updates", "-1"], "--updates must be >= 0"),
    (["RUNS", "--fraction", "1.5"], r"--fraction must be in \[0, 1\]"),
    (["RUNS", "--predictor", "nope"], "neither auto, telemetry, ntk nor a file"),
    (["RUNS", "--updates", "99", "--predictor", "P"], r"runs\.jsonl, row 1: 40 recorded "
                                                      r"updates, fewer than the 99 asked for "
                                                      r"\(--updates 99\); ask for at most 40, "
                                                      r"the steps it plans\."),
    (["SHORT", "--fraction", "0.5"], r"short\.jsonl, row 1: 4 recorded updates, fewer than "
                                     r"the 20 asked for \(--fraction 0\.5 of its steps = 40\); "
                                     r"ask for fewer, or give the run's telemetry up to there"),
    (["RUNS", "--predictor", "ntk"], r"runs\.jsonl, row 1: no 'prediction': --predictor ntk"),
    (["BAD"], "line 1: not JSON"),
    (["LIST"], r"expected a JSON object per line \(or a JSON list of objects\), got a list "
               "whose item 1 is int"),
])
def test_outcome_cli_bad_input_is_one_line(args, match, tmp_path, capsys):
    from ntk_tt.cli import main

    rows = _corpus(60)
    runs = tmp_path / "runs.jsonl"
    runs.write_text(json.dumps(rows[0]["telemetry"]) + "\n")
    (tmp_path / "bad.jsonl").write_text("{oops\n")
    (tmp_path / "list.jsonl").write_text("[1,2]\n")
    short = ntk_tt.truncate(Telemetry.from_dict(rows[0]["telemetry"]), 4)  # a run in progress
    (tmp_path / "short.jsonl").write_text(json.dumps(short.to_dict()) + "\n")
    fit_outcome(rows, ntk=False, ks=(0.1,), folds=2).save(tmp_path / "p.json")
    subs = {"RUNS": str(runs), "BAD": str(tmp_path / "bad.jsonl"), "P": str(tmp_path / "p.json"),
            "LIST": str(tmp_path / "list.jsonl"), "SHORT": str(tmp_path / "short.jsonl")}
    with pytest.raises(SystemExit) as exc:
        main(["outcome", *[subs.get(a, a) for a in args]])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and err[0].startswith("ntk-tt: error:")
    assert any(__import__("re").search(match, line) for line in err), err


def test_outcome_cli_prints_and_writes_json(tmp_path, capsys):
    from ntk_tt.cli import main

    rows = _corpus(60)
    runs = tmp_path / "runs.jsonl"
    runs.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    fit_outcome(rows, ntk=True, ks=(0.0, 0.1), folds=2).save(tmp_path / "p.json.gz")
    out = tmp_path / "o.json"
    assert main(["outcome", str(runs), "--fraction", "0.1", "--predictor",
                 str(tmp_path / "p.json.gz"), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.count("4 of 40 updates observed") == 2 and "P(diverges)" in text
    got = json.loads(out.read_text())
    assert len(got) == 2 and all(0 <= g["p_failed"] <= 1 for g in got)
    for row, g in zip(rows[:2], got, strict=True):  # finished runs: their own ending beside
        loss = np.array([np.inf if v is None or v == "inf" else float(v)
                         for v in row["telemetry"]["loss"]])
        tail = loss[1:]
        want = ("diverges" if row["outcome"]["diverged"] or np.any(tail > 10 * loss[0])
                else "catapult" if np.any(tail > loss[0]) else "converges")
        assert g["observed"] == {"final_loss": pytest.approx(loss[-1]), "outcome": want}
        assert (f"observed (the file holds the finished run): final training loss "
                f"{loss[-1]:.4g}, outcome {want}; the predictions below use its first 4 "
                "updates only") in text
    with pytest.raises(SystemExit):  # an existing --json is refused
        main(["outcome", str(runs), "--predictor", str(tmp_path / "p.json.gz"), "--json",
              str(out)])


@pytest.mark.parametrize("field, value, match", [
    ("steps", "40", "'steps' must be an int >= 1"),
    ("learning_rate", None, "'learning_rate' must be a finite number > 0"),
    ("momentum", "0.9", r"'momentum' must be a finite number in \[0, 1\)"),
    # a fresh user (session 41): η = 1e300 was read as a run's and predicted to diverge;
    # runs record float32 values: η in float32's normal range, m below its 1
    ("learning_rate", 1e300, r"'learning_rate' must be a finite number > 0, in \[1\.1754944e-38"
                             r", 3\.4028235e\+38\] \(float32's normal range\), got 1e\+300"),
    ("learning_rate", 1e-50, r"'learning_rate' must be a finite number > 0, in .* got 1e-50"),
    ("momentum", 1 - 1e-10, r"'momentum' must be a finite number in \[0, 1\) and at most "
                            r"0\.99999994"),
    ("batch_size", True, "'batch_size' must be an int >= 1"),
    ("num_classes", 1, r"'num_classes' must be an int >= 2 \(a classifier has at least two"),
    ("loss_name", "hinge", "'loss_name' must be"),
    ("loss", [], "'loss' must have 1 to steps"),
    ("loss", "abc", "'loss' must be a list of numbers"),
    ("loss", [[1.0]] * 41, "'loss' must be a list of numbers"),
    ("grad_norm", [1.0, 2.0], "'grad_norm' has 2 entries"),
    ("test_accuracy", [0.5], "'test_accuracy' has 1 entries"),
    ("loss", [-1.0] * 41,
     r"'loss' must be finite and lie in \[0, 3\.40282e\+38\], got -1 at step 0"),
    # a probe: a falling curve at 1e300 overflowed the float32 features and read as diverged
    ("loss", [1e300] * 41, r"'loss' must be finite and lie in \[0, 3\.40282e\+38\], got "
                           r"1e\+300 at step 0"),
])
def test_malformed_telemetry_rows_are_refused(field, value, match):
    row = _telemetry(np.random.default_rng(0)).to_dict()
    row[field] = value
    with pytest.raises(ValueError, match=match):
        Telemetry.from_dict(row)


def test_outcome_inputs_are_checked():
    tele = _telemetry(np.random.default_rng(0))
    for k in (True, 4.0, "4"):
        with pytest.raises(ValueError, match="k must be an int"):
            outcome_features(tele, k)
    with pytest.raises(ValueError, match="must be an ntk_tt.Telemetry"):
        outcome_features(tele.to_dict(), 4)

    # a fresh user: a Telemetry built directly (dataclasses.replace) skipped from_dict's checks,
    # and a cut loss, accuracy > 1 or η = -1 got confident probabilities
    p = fit_outcome(_corpus(40), ntk=False, ks=(0.1,), folds=2)
    acc = tele.accuracy.copy()
    acc[3] = 1.5
    for bad, match in ((dict(loss=tele.loss[:3]), r"field 'accuracy' has \d+ entries, 'loss' 3"),
                       (dict(accuracy=acc),
                        r"'accuracy' must be finite and lie in \[0, 1\], got 1\.5 at step 3\.$"),
                       (dict(learning_rate=-1.0), "'learning_rate' must be a finite number > 0")):
        with pytest.raises(ValueError, match=match):
            p.predict(dataclasses.replace(tele, **bad))
    # a second fresh user: ntk-tt outcome took an inf loss with stopped_at = -1 and said
    # P(diverges) 0.000; a run holds its last finite loss from stopped_at on
    nonfinite = tele.loss.copy()
    nonfinite[2] = np.inf
    for bad, match in ((dict(loss=nonfinite), r"'loss' must be finite and lie in \[0, "
                                              r"3\.40282e\+38\], got inf at step 2 \(a "
                                              r"diverged run holds its last finite"),
                       (dict(stopped_at=1000), "'stopped_at' is 1000, past the"),
                       (dict(snapshot_steps=tele.snapshot_steps[::-1]),
                        "'snapshot_steps' must increase")):
        with pytest.raises(ValueError, match=match):
            p.predict(dataclasses.replace(tele, **bad))
    # a consistent stopped run is predicted: tests/test_telemetry_checks.py


@pytest.mark.parametrize("field, value, match", [
    ("loss", [], r"'loss' must be a list of steps \+ 1 = 41 numbers, got 0 entries \(empty\)"),
    ("loss", None, r"'loss' must be a list of steps \+ 1 = 41 numbers, got None"),
    ("loss", "x", r"'loss' must be a list of steps \+ 1 = 41 numbers, got a str"),
    ("loss", [2.0, 1.0], r"'loss' must be a list .* got 2 entries \(one per step 0 … T"),
    ("loss", [math.nan] * (T + 1), r"'loss' at step 0 must be finite and >= 0, got nan"),
    ("loss", [1.0] * T + [-1.0], r"'loss' at step 40 must be finite and >= 0, got -1\.0"),
    ("error", [], r"'error' must be a list of steps \+ 1 = 41 numbers, got 0 entries"),
    ("error", [0.5] * T + [1.5], r"'error' at step 40 must be finite and in \[0, 1\]"),
    ("test_error", [0.5] * T + ["a"], r"'test_error' at step 40 must be a number or null, got "
                                      "a str"),
    ("test_error", [0.5] * T + [1.5], r"'test_error' at step 40 must be in \[0, 1\], got 1\.5"),
    ("training_time", [1, 2], r"'training_time' must be 2 × 3 numbers >= 0 or nulls"),
    ("training_time", [[-5, "a", 1]] * 2, r"'training_time' must be 2 × 3 numbers >= 0"),
    ("diverged", 1, r"'diverged' must be true or false, got 1"),
    ("spiked_at", -2, r"'spiked_at' must be an integer step in \[-1, T = 40\] \(-1: none\)"),
    ("spiked_at", 500, r"'spiked_at' must be an integer step in \[-1, T = 40\]"),
    ("loss", [[1.0]] * (T + 1), r"'loss' at step 0 must be a number, got a list"),
    ("loss", [True] * (T + 1), r"'loss' at step 0 must be a number, got a bool"),
    ("kappa", math.inf, r"'kappa' must be a finite number >= 0"),
])
def test_a_damaged_prediction_is_one_error_naming_its_field(field, value, match, tmp_path,
                                                            capsys):
    """A fresh user's find: the telemetry of a corpus row was checked strictly, its NTK
    prediction not at all (an empty or null loss, a 1-D training_time: IndexError / TypeError
    tracebacks; a cut, NaN or negative loss, or a string: silently used or read as missing).
    Each is one ValueError naming the field, in outcome_features and OutcomePredictor.predict,
    and one ``ntk-tt: error:`` line (with the CLI's advice) before any prediction; the row
    as ntk_tt writes it (and nulls in the held-out curves and T_ε) is accepted."""
    from ntk_tt.cli import main

    row = _corpus(1)[0]
    tele = Telemetry.from_dict(row["telemetry"])
    fine = row["prediction"] | {"test_loss": [None, math.inf] + [1.0] * (T - 1),
                                "training_time": [[None, 3.0, 2.0], [4.0, None, 1.0]]}
    assert np.isfinite(list(outcome_features(tele, 4, fine).values())).any()
    bad = row["prediction"] | {field: value}
    with pytest.raises(ValueError, match=match):
        outcome_features(tele, 4, bad)
    predictor = fit_outcome(_corpus(40), ntk=True, ks=(0.1,), folds=2)
    with pytest.raises(ValueError, match=match):
        predictor.predict(tele, bad, k=4)
    runs = tmp_path / "runs.jsonl"
    runs.write_text(json.dumps(row | {"prediction": bad}) + "\n")
    with pytest.raises(SystemExit) as exc:
        main(["outcome", str(runs), "--fraction", "0.1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"ntk-tt: error: {runs}, row 1: prediction '{field}'"), err
    assert err[0].endswith("or use --predictor telemetry."), err


def test_a_prediction_of_arrays_reads_as_its_lists():
    """The Python API: a prediction holding numpy / jax arrays (curves, a 0-d κ) was refused
    as "must be finite, got Array(2.21)"; it gives the features of the same lists."""
    import jax.numpy as jnp

    row = _corpus(1)[0]
    tele = Telemetry.from_dict(row["telemetry"])
    arrays = row["prediction"] | {"loss": jnp.asarray(row["prediction"]["loss"]),
                                  "error": np.asarray(row["prediction"]["error"]),
                                  "kappa": np.asarray(row["prediction"]["kappa"])}
    want = outcome_features(tele, 4, row["prediction"])
    got = outcome_features(tele, 4, arrays)
    assert got.keys() == want.keys()
    np.testing.assert_allclose([got[k] for k in want], [want[k] for k in want], rtol=1e-6)
    # a misspelt optional field was ignored and its feature read as missing (a fresh user's
    # "test_los" moved the predicted accuracy 0.229 -> 0.258); a field of one's own is kept
    typo = {k: v for k, v in row["prediction"].items() if k != "test_loss"} | {
        "test_los": row["prediction"]["test_loss"]}
    with pytest.raises(ValueError, match="has 'test_los', which ntk_tt does not write: did you "
                                         "mean 'test_loss'"):
        outcome_features(tele, 4, typo)
    assert outcome_features(tele, 4, row["prediction"] | {"my_note": "x"}) == want
    column = arrays | {"loss": np.ones((T + 1, 1))}  # not "got 41 entries": its shape
    with pytest.raises(ValueError, match=r"'loss' must be a list .* got an array of shape "
                                         r"\(41, 1\)"):
        outcome_features(tele, 4, column)

@pytest.mark.parametrize("damage", ["no_models", "junk_model", "short_columns"])
def test_damaged_predictor_file_is_one_value_error(damage, tmp_path):
    model = fit_outcome(_corpus(40), ntk=False, ks=(0.1,), folds=2)
    model.save(tmp_path / "p.json")
    doc = json.loads((tmp_path / "p.json").read_text())
    if damage == "no_models":
        del doc["models"]
    elif damage == "junk_model":
        doc["models"]["diverged"] = "not a model"
    else:
        doc["columns"] = doc["columns"][:3]
    (tmp_path / "p.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="damaged outcome predictor file"):
        OutcomePredictor.load(tmp_path / "p.json")


def _scaled(row: dict, factor: float) -> dict:
    """A corpus row whose loss curve is ``factor`` times the row's: another model's run."""
    tele = dict(row["telemetry"], loss=[v * factor for v in row["telemetry"]["loss"]])
    return dict(row, telemetry=tele)


def test_domain_is_the_fitted_rows_range_and_flags_what_leaves_it(tmp_path):
    """The stored range of L_0 is that of the rows' own curves (read directly); a row of the
    fitting set is inside; its loss curve × 100 leaves it by 100·L_0 − max L_0 (reported);
    the domain survives save/load, and a file without one flags nothing (None)."""
    rows = _corpus(60)
    model = fit_outcome(rows, ntk=False, ks=(0.0, 0.1), folds=2)
    l0 = [r["telemetry"]["loss"][0] for r in rows]
    assert model.domain["loss0"] == [min(l0), max(l0), False]
    assert model.domain["num_classes"] == [5.0, 5.0, False]
    tele = Telemetry.from_dict(rows[3]["telemetry"])
    assert model.predict(tele, k=4)["out_of_domain"] == []
    far = Telemetry.from_dict(_scaled(rows[3], 100.0)["telemetry"])
    flags = model.predict(far, k=4)["out_of_domain"]
    assert [f["feature"] for f in flags] == ["loss0"]  # every other input is a ratio
    assert flags[0]["value"] == pytest.approx(100 * l0[3])
    assert flags[0]["by"] == pytest.approx(100 * l0[3] - max(l0))
    assert flags[0]["relative"] == pytest.approx((100 * l0[3] - max(l0)) / (max(l0) - min(l0)))
    model.save(tmp_path / "p.json")
    assert OutcomePredictor.load(tmp_path / "p.json").domain == model.domain
    doc = json.loads((tmp_path / "p.json").read_text())
    del doc["domain"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    assert OutcomePredictor.load(tmp_path / "old.json").predict(far, k=4)["out_of_domain"] is None


def test_out_of_domain_by_hand():
    domain = {"a": [0.0, 1.0, False], "b": [5.0, 5.0, False], "c": [0.0, 2.0, True],
              "d": [-1.0, 1.0, False], "e": [math.nan, math.nan, True]}
    got = out_of_domain({"a": 1.5, "b": 10.0, "c": math.nan, "d": math.nan, "e": 3.0}, domain)
    # farthest first (b: 5 above a one-value range of 5 = 1 width; a: half a width); then
    # a value missing where the rows had one (d) and one present where they had none (e)
    assert got[:3] == [
        {"feature": "b", "value": 10.0, "low": 5.0, "high": 5.0, "by": 5.0, "relative": 1.0},
        {"feature": "a", "value": 1.5, "low": 0.0, "high": 1.0, "by": 0.5, "relative": 0.5},
        {"feature": "d", "value": None, "low": -1.0, "high": 1.0, "by": None, "relative": None}]
    assert len(got) == 4 and (got[3]["feature"], got[3]["value"], got[3]["by"]) == ("e", 3.0,
                                                                                   None)
    assert out_of_domain({"a": 0.0, "b": 5.0, "c": math.nan, "d": 1.0, "e": math.nan},
                         domain) == []
    x = np.array([[0.0, np.nan], [1.0, np.inf], [0.5, 2.0]])
    assert feature_domain(x, ["p", "q"]) == {"p": [0.0, 1.0, False], "q": [2.0, np.inf, True]}


@pytest.mark.skipif(not CORPUS.exists(), reason="no committed telemetry corpus")
def test_shipped_predictors_know_their_corpus_and_flag_another_model(tmp_path):
    """The shipped domains are the ranges of the corpus's features (as fitted); a corpus row
    is inside for both predictors; the same run with its loss curve × 100 (another model) is
    flagged with loss0, in the API, ``ntk-tt outcome``'s lines and its JSON."""
    with gzip.open(CORPUS, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    max_l0 = max(r["telemetry"]["loss"][0] for r in rows)
    row = rows[5]
    for ntk in (False, True):
        model = default_outcome_predictor(ntk=ntk)
        assert model.domain == feature_domain(dataset(rows, ks=model.ks, ntk=ntk).x,
                                              model.columns)
        pred = row["prediction"] if ntk else None
        inside = model.predict(Telemetry.from_dict(row["telemetry"]), pred, k=4)
        assert inside["out_of_domain"] == []
        far = model.predict(Telemetry.from_dict(_scaled(row, 100.0)["telemetry"]), pred, k=4)
        loss0 = next(f for f in far["out_of_domain"] if f["feature"] == "loss0")
        l0 = 100 * row["telemetry"]["loss"][0]
        assert loss0["value"] == pytest.approx(l0) and loss0["by"] == pytest.approx(l0 - max_l0)
    runs = tmp_path / "runs.jsonl"
    runs.write_text(json.dumps(row) + "\n" + json.dumps(_scaled(row, 100.0)) + "\n")
    proc = subprocess.run([sys.executable, "-m", "ntk_tt.cli", "outcome", "runs.jsonl",
                           "--fraction", "0.1", "--json", "out.json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    blocks = proc.stdout.split("run 2:")
    assert "outside the corpus" not in blocks[0]
    line = blocks[1].splitlines()[1]  # right under the run's header: it qualifies the rest
    assert line.startswith("  outside the corpus the predictor was fitted on: ")
    assert f"loss0 = {l0:.4g} (corpus " in line and line.endswith("extrapolations")
    out = json.loads((tmp_path / "out.json").read_text(),  # standard JSON: no Infinity / NaN
                     parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert out[0]["out_of_domain"] == []
    assert "loss0" in [f["feature"] for f in out[1]["out_of_domain"]]


def test_a_real_run_of_another_model_is_flagged():
    """A flax MLP on synthetic 8-D data (not the corpus's CNN on images) fine-tuned for real
    with telemetry: its first 4 updates leave the corpus's ranges (its dead-ReLU fraction,
    gradient norm and initial accuracy), so the result says so instead of only answering."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import ntk_tt

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(8, 64, rngs=rngs)
            self.head = nnx.Linear(64, 5, rngs=rngs)

        def __call__(self, x):
            return self.head(jax.nn.relu(self.l1(x)))

    model = MLP(nnx.Rngs(0))
    apply_fn, params = ntk_tt.from_nnx(model)
    x = jax.random.normal(jax.random.key(0), (300, 8))
    y = jnp.argmax(x[:, :5], 1)
    run = ntk_tt.finetune(apply_fn, params, x[:250], y[:250], learning_rate=0.5, steps=40,
                          batch_size=25, key=jax.random.key(1), x_test=x[250:],
                          y_test=y[250:], telemetry=ntk_tt.TelemetrySpec(
                              features=ntk_tt.model_features(model)))
    first = ntk_tt.truncate(run.telemetry, 4)
    out = default_outcome_predictor().predict(first)
    feats = outcome_features(first)
    domain = default_outcome_predictor().domain
    outside = {name for name, (lo, hi, _) in domain.items() if not lo <= feats[name] <= hi}
    assert {f["feature"] for f in out["out_of_domain"]} == outside
    assert "snap0_dead_relu_fraction" in outside and run.test_accuracy > 0.8


def test_outcome_json_is_standard_json():
    """``ntk-tt outcome --json`` encodes non-finite floats as the telemetry files do: a corpus
    range bound of +inf (diverged runs' gradients) was written as the literal Infinity."""
    from ntk_tt._cli_commands import _json_ready

    got = _json_ready([{"high": float("inf"), "low": -float("inf"), "by": float("nan"),
                        "x": (1.5, 2), "name": "grad_max"}])
    assert got == [{"high": "inf", "low": "-inf", "by": None, "x": [1.5, 2],
                    "name": "grad_max"}]
    json.dumps(got, allow_nan=False)


def test_ablation_script_refuses_an_unusable_out_before_reading(tmp_path, capsys):
    """``experiments/outcome.py`` read (and would evaluate) the corpus before its mkdir of
    ``--out`` failed; now the bad folder is one line first (the corpus here does not exist,
    so reading it would fail otherwise)."""
    (tmp_path / "file").write_text("")
    err = refused(experiment_script("outcome"),
                  [str(tmp_path / "no_corpus.jsonl"), "--out", str(tmp_path / "file")], capsys)
    assert err.split(": error: ", 1)[1] == (f"'{tmp_path / 'file'}' is not a directory; give --out "
                   "a directory path (created if missing).")
