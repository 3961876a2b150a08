"""What the outcome predictors refuse or flag about their corpus and inputs: a loss other
than the fitting runs' is out of domain (the shipped corpus is all cross-entropy), and
``fit_outcome`` refuses a corpus too small for its trees or folds, or with one class of a
classification target (it fitted silently and then said P(diverged) = 0 for every run)."""

import dataclasses
import gzip
import json
import pathlib

import numpy as np
import pytest
from test_outcome import _corpus

import ntk_tt.telemetry._outcome as outcome_module
from ntk_tt.telemetry._outcome import OutcomePredictor, default_outcome_predictor, fit_outcome
from ntk_tt.telemetry._outcome_features import TARGETS, dataset, run_labels
from ntk_tt.telemetry._outcome_fit import check_fit_labels
from ntk_tt.telemetry._telemetry import Telemetry

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORPUS = ROOT / "experiments" / "results" / "telemetry" / "corpus.jsonl.gz"


def _with_loss(rows, name):
    return [dict(r, telemetry=dict(r["telemetry"], loss_name=name)) for r in rows]


def test_a_loss_other_than_the_corpus_s_is_out_of_domain(tmp_path, capsys):
    """The shipped predictor (fitted on cross-entropy runs), and one whose file keeps no loss
    names (written before they were kept), flag an MSE run first and not a cross-entropy
    one; a predictor fitted on MSE runs keeps its loss names through save/load and flags a
    cross-entropy run; a mixed corpus flags neither; so does ntk-tt outcome's line."""
    from ntk_tt.cli import main

    rows = _corpus(40)
    ce = Telemetry.from_dict(rows[0]["telemetry"])
    mse = dataclasses.replace(ce, loss_name="mse")
    shipped = default_outcome_predictor()
    assert shipped.info["loss_names"] == ["cross_entropy"]
    # a file written before the loss names were kept was fitted on cross-entropy runs
    legacy = dataclasses.replace(shipped, info={k: v for k, v in shipped.info.items()
                                                if k != "loss_names"})
    for predictor in (shipped, legacy):
        assert all(f["feature"] != "loss_is_mse"
                   for f in predictor.predict(ce, k=4)["out_of_domain"])
        flag = predictor.predict(mse, k=4)["out_of_domain"][0]
        assert flag == {"feature": "loss_is_mse", "value": 1.0, "low": 0.0, "high": 0.0,
                        "by": 1.0, "relative": None}
    fitted = fit_outcome(_with_loss(rows, "mse"), ntk=False, ks=(0.1,), folds=2)
    fitted.save(tmp_path / "p.json")
    back = OutcomePredictor.load(tmp_path / "p.json")
    assert back.info["loss_names"] == ["mse"]
    assert back.predict(mse, k=4)["out_of_domain"] == []
    assert back.predict(ce, k=4)["out_of_domain"][0] == {
        "feature": "loss_is_mse", "value": 0.0, "low": 1.0, "high": 1.0, "by": 1.0,
        "relative": None}
    mixed = fit_outcome(rows[:20] + _with_loss(rows[20:], "mse"), ntk=False, ks=(0.1,),
                        folds=2)
    assert mixed.info["loss_names"] == ["cross_entropy", "mse"]
    for t in (ce, mse):
        assert all(f["feature"] != "loss_is_mse" for f in mixed.predict(t, k=4)["out_of_domain"])
    runs = tmp_path / "runs.jsonl"
    runs.write_text(json.dumps(mse.to_dict()) + "\n")
    assert main(["outcome", str(runs), "--updates", "4", "--predictor", "telemetry"]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line.startswith("  outside the corpus the predictor was fitted on: loss_is_mse = 1 "
                           "(corpus 0 to 0)")


@pytest.mark.parametrize("pick, kw, match", [
    ("none_diverged", {}, r"^fit_outcome needs runs of both classes of 'diverged', but 0 of "
                          r"the 30 runs diverge: its classifier would give every run P = 0; "
                          r"add runs that diverge \(e\.g\. larger learning rates\)\.$"),
    ("all_diverged", {}, r"^fit_outcome needs runs of both classes of 'diverged', but 7 of the "
                         r"7 runs diverge: its classifier would give every run P = 1; add runs "
                         r"that do not diverge\.$"),
    ("all_failed", {}, r"both classes of 'failed', but 30 of the 30 runs fail: its classifier "
                       r"would give every run P = 1; add runs that do not fail\.$"),
    ("few_runs", {"folds": 5}, r"^fit_outcome got 3 runs, fewer than folds = 5: every "
                               r"cross-validation fold needs a run; give more corpus rows or "
                               r"fewer folds\.$"),
    ("few_runs", {"ks": (0.1,)}, r"^fit_outcome got 3 rows \(runs × prefix fractions\), fewer "
                                 r"than 20: its trees need 10 rows a leaf and could not split "
                                 r"at all; give more corpus rows or more prefix fractions "
                                 r"\(ks\)\.$"),
])
def test_fit_outcome_refuses_a_corpus_it_cannot_learn_from(pick, kw, match, monkeypatch):
    """Refused from the rows' labels, before any featurising (``dataset`` is never called)
    or fitting; the same for an already featurised Dataset."""
    rows = _corpus(200)
    div = [r for r in rows if r["outcome"]["diverged"]]
    keep = [r for r in rows if not r["outcome"]["diverged"]]
    chosen = {"none_diverged": keep[:30], "all_diverged": div[:7], "few_runs": rows[:3],
              "all_failed": [dict(r, outcome=dict(r["outcome"], failed=True))
                             for r in div[:5] + keep[:25]]}[pick]
    data = dataset(chosen, ks=kw.get("ks", (0.0, 0.05, 0.1, 0.2)), ntk=False)
    args = {"ntk": False, "folds": 2} | kw
    with pytest.raises(ValueError, match=match):
        fit_outcome(data, **args)
    monkeypatch.setattr(outcome_module, "dataset", lambda *a, **k: pytest.fail("featurised"))
    with pytest.raises(ValueError, match=match):
        fit_outcome(chosen, **args)


def test_a_corpus_of_both_classes_still_fits_and_learns_divergence():
    """The smallest corpus the checks let through fits, and its classifier tells a diverging
    run from one that trains (the refused five-row corpus said 0.0 for both)."""
    rows = _corpus(40)
    labels = [r["outcome"]["diverged"] for r in rows]
    assert 0 < sum(labels) < len(rows)
    p = fit_outcome(rows, ntk=False, ks=(0.1,), folds=2)
    div = Telemetry.from_dict(rows[labels.index(True)]["telemetry"])
    ok = Telemetry.from_dict(rows[labels.index(False)]["telemetry"])
    assert p.predict(div, k=4)["p_diverged"] > 0.5 > p.predict(ok, k=4)["p_diverged"]


@pytest.mark.skipif(not CORPUS.exists(), reason="no committed telemetry corpus")
def test_the_shipped_corpus_passes_the_fit_checks():
    with gzip.open(CORPUS, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    lab = run_labels(rows)
    y = {t: np.asarray([lb[t] for lb in lab]) for t in TARGETS}
    ids = np.asarray([r["run_id"] for r in rows])
    check_fit_labels(y, ids, len(rows) * 4, 5)  # fit_outcome's defaults: 4 ks, 5 folds
    assert {r["telemetry"]["loss_name"] for r in rows} == {"cross_entropy"}
    with pytest.raises(ValueError, match="0 of the 5 runs diverge"):  # its first five
        check_fit_labels({t: v[:5] for t, v in y.items()}, ids[:5], 20, 5)


def test_fit_models_and_predict_models_refuse_what_is_not_a_dataset():
    """The public model-level calls took anything: a y of lists compared ``list == 1`` as one
    bool, so the accuracy regressor silently fitted the last row only; a missing target, rows
    of another length or a wrong x gave a raw KeyError or IndexError. Each is now one
    ValueError naming the argument; a well-formed (x, y) still fits and predicts."""
    from ntk_tt.telemetry._outcome_fit import fit_models, predict_models

    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 3))
    y = {t: (rng.uniform(size=60) < 0.4).astype(float) for t in TARGETS}
    y["test_accuracy"], y["log_t_eps"] = rng.uniform(size=60), rng.normal(size=60)
    bad_fits = [(x[:, 0], y, r"x, the feature matrix \(R, F\)"),
                (x[:0], {t: v[:0] for t, v in y.items()}, "R >= 1 rows"),
                (np.full((60, 3), "a"), y, r"real numbers.*got .*shape \(60, 3\) of dtype <U1"),
                (np.ones((60, 3), complex), y, "of dtype complex128"),
                (x[:, :0], y, r"F >= 1 features.*shape \(60, 0\)"),
                (x, dict(y, failed=y["failed"].astype(str)), r"y\['failed'\].*of dtype <U"),
                (x, [1.0, 2.0], "y, a dict target"),
                (x, {t: v for t, v in y.items() if t != "failed"}, r"y\['failed'\].*got none"),
                (x, dict(y, diverged=y["diverged"][:5]), r"y\['diverged'\].*shape \(5,\)")]
    for xs, ys, match in bad_fits:
        with pytest.raises(ValueError, match=match):
            fit_models(xs, ys)
    # labels outside their target's range, and seeds LightGBM would take raw or refuse late
    bad_labels = [("diverged", 2.0, r"y\['diverged'\] to be 0 or 1.*got 2\.0"),
                  ("failed", -1.0, r"y\['failed'\] to be 0 or 1"),
                  ("test_accuracy", 1.5, r"y\['test_accuracy'\] to be a fraction in \[0, 1\]"),
                  ("log_t_eps", np.inf, r"y\['log_t_eps'\] to be a finite number.*inf")]
    for target, value, match in bad_labels:
        with pytest.raises(ValueError, match=match):
            fit_models(x, dict(y, **{target: np.where(np.arange(60) == 7, value, y[target])}))
    with pytest.raises(ValueError, match=r"at least one known label of y\['test_accuracy'\], "
                                         r"got NaN \(unknown\) in all 60 rows"):
        fit_models(x, dict(y, test_accuracy=np.full(60, np.nan)))  # predicted NaN silently
    for seed in (1.5, True, -1, 2**31, "0"):
        with pytest.raises(ValueError, match=r"fit_models needs seed, an integer in \[0, 2\*\*"):
            fit_models(x, y, seed)
    unknown = dict(y, diverged=np.where(np.arange(60) < 3, np.nan, y["diverged"]))
    assert set(fit_models(x, unknown, np.int64(3))[0]) == set(TARGETS)  # NaN = unknown: kept
    models, consts = fit_models(x, {t: list(v) for t, v in y.items()})  # lists: now arrays
    same = fit_models(x, y)
    p = predict_models(models, consts, x[:4])
    np.testing.assert_allclose(p["test_accuracy"], predict_models(*same, x[:4])["test_accuracy"])
    assert set(p) == set(TARGETS) and all(v.shape == (4,) for v in p.values())
    for args, match in [(({}, consts, x), r"models as fit_models returns it.*lacks"),
                        ((models, {k: v for k, v in consts.items() if k != "acc_diverged"}, x),
                         r"consts .*lacks \['acc_diverged'\]"),
                        ((models, consts, x[:, :2].ravel()), r"x, the feature matrix"),
                        (({t: "junk" for t in models}, consts, x), r"models\['test_accuracy'\] is "
                                                                   r"str and"),
                        ((models, dict(consts, failed="0.5"), x), r"consts\['failed'\] str\.")]:
        with pytest.raises(ValueError, match=match):
            predict_models(*args)


def test_save_refuses_an_existing_file_unless_overwrite(tmp_path):
    """A fresh user: OutcomePredictor.save replaced an existing file silently, while
    save_telemetry and save_checkpoint refuse it without overwrite=True. Now it refuses it
    too (the file left as it was; True only, as save_telemetry), and overwrite=True replaces
    it with a file that loads back to the same predictor."""
    shipped = default_outcome_predictor()
    path = tmp_path / "p.json.gz"
    path.write_text("mine")
    for flag in ({}, {"overwrite": False}, {"overwrite": 1}):
        with pytest.raises(ValueError) as err:
            shipped.save(path, **flag)
        assert str(err.value) == (f"outcome predictor path {path} exists; pass overwrite=True "
                                  "to replace it, or give a new file name. Nothing was written.")
        assert path.read_text() == "mine"
    shipped.save(path, overwrite=True)
    back = OutcomePredictor.load(path)
    assert (back.columns, back.ks, back.constants) == (shipped.columns, shipped.ks,
                                                       shipped.constants)
