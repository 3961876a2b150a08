"""The values a telemetry row may hold (``ntk_tt.telemetry._telemetry_checks``): a fresh
user's probes of ``ntk-tt outcome`` (negative norms, NaN / inf diagnostics of a healthy run, a
``stopped_at`` contradicted by the curves) are refused with one line, while what real runs
hold (a diverged run's overflowed norms, NaN of what was not measured, held values from
``stopped_at`` on) is still accepted."""

import dataclasses
import gzip
import json
import pathlib
import re

import numpy as np
import pytest
from test_outcome import _corpus, _telemetry

import ntk_tt
from ntk_tt.telemetry._outcome import fit_outcome
from ntk_tt.telemetry._telemetry import Telemetry, check_telemetry, truncate

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORPUS = ROOT / "experiments" / "results" / "telemetry" / "corpus.jsonl.gz"
T = 40
BLOWN = ("the run had not blown up by then: a non-finite value belongs to a run whose training "
         "loss rose above its step-0 value, or from step stopped_at - 1 on")


def _base() -> Telemetry:
    """A healthy run: loss falling from L_0, every diagnostic finite and measured."""
    return _telemetry(np.random.default_rng(0))


def _with(tele: Telemetry, **entries) -> Telemetry:
    """``tele`` with single entries replaced: field=(index, value) or field=array."""
    kw = {}
    for f, v in entries.items():
        if isinstance(v, tuple):
            arr = getattr(tele, f).copy()
            arr[v[0]] = v[1]
            v = arr
        kw[f] = v
    return dataclasses.replace(tele, **kw)


def _stopped(tele: Telemetry, stop: int) -> Telemetry:
    """``tele`` as a run that stopped at update ``stop``: per-step fields held at their
    step ``stop`` − 1 values, no gradients from update ``stop`` + 1 on."""
    held = {f: np.r_[getattr(tele, f)[:stop], np.full(T + 1 - stop, getattr(tele, f)[stop - 1])]
            for f in ("loss", "accuracy", "weight_distance", "weight_norm", "head_norm")}
    held |= {f: np.r_[getattr(tele, f)[:stop], np.full(T - stop, np.nan)]
             for f in ("grad_norm", "grad_snr")}
    return dataclasses.replace(tele, stopped_at=stop, **held)


def _refused(tele: Telemetry, match: str):
    """Refused alike by from_dict (files, the CLI) and check_telemetry (API objects)."""
    for check in (lambda: Telemetry.from_dict(tele.to_dict()), lambda: check_telemetry(tele)):
        with pytest.raises(ValueError, match=match) as err:
            check()
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("entries, match", [
    (dict(grad_norm=(1, np.nan)), rf"^telemetry field 'grad_norm' is nan at update 2, but "
                                  rf"{re.escape(BLOWN)}.*; give the measured value\.$"),
    (dict(head_norm=(1, np.inf)), r"'head_norm' is inf at step 1, but the run had not blown up"
                                  r".* or to a run without a head \(NaN at every step\)"),
    (dict(head_norm=(3, np.nan)), r"'head_norm' is nan at step 3, but the run had not"),
    (dict(weight_distance=(2, -3.0)),
     r"^telemetry field 'weight_distance' must lie in \[0, inf\], got -3 at step 2\.$"),
    (dict(weight_norm=(5, np.inf)), r"'weight_norm' is inf at step 5, but the run had not"),
    (dict(test_accuracy=(1, np.nan)),
     r"'test_accuracy' is nan at snapshot step 1, but the run had not blown up.* or to a run "
     r"without a held-out split \(NaN at every snapshot\)"),
    (dict(test_loss=(2, np.inf)), r"'test_loss' is inf at snapshot step 2, but the run had"),
    (dict(test_loss=(2, -0.5)), r"'test_loss' must lie in \[0, inf\], got -0\.5 at snapshot "
                                r"step 2\.$"),
    (dict(grad_norm=np.full(T, -1.0)), r"'grad_norm' must lie in \[0, inf\], got -1 at update "
                                       r"1\.$"),
    (dict(grad_snr=(1, -5.0)), r"'grad_snr' must lie in \[0, inf\], got -5 at update 2\.$"),
    (dict(grad_snr=(1, np.inf)), r"'grad_snr' is inf at update 2, but the run had not"),
    (dict(max_prob_mean=(0, 1.5)), r"'max_prob_mean' must lie in \[0, 1\], got 1\.5 at snapshot "
                                   r"step 0\.$"),
    (dict(saturated_fraction=(3, np.nan)), r"'saturated_fraction' is nan at snapshot step 4"),
    (dict(dead_relu_fraction=(1, -0.1)), r"'dead_relu_fraction' must lie in \[0, 1\]"),
])
def test_impossible_diagnostics_are_refused(entries, match):
    """Each probe refused, naming the field, the value and where; the healthy base run and
    the same field's legitimate form are accepted (below)."""
    base = _base()
    check_telemetry(base)
    _refused(_with(base, **entries), match)


def test_what_real_runs_hold_is_accepted():
    """NaN of what was not measured (no head, no features, no held-out split, an SNR without
    spread) anywhere, and non-finite norms, gradients and snapshots once the loss rose above
    L_0 (a spike) or at the parameters of the update that went non-finite (w_{stop - 1})."""
    base = _base()
    nan_t, nan_s = np.full(T + 1, np.nan), np.full(len(base.snapshot_steps), np.nan)
    for ok in (_with(base, head_norm=nan_t), _with(base, dead_relu_fraction=nan_s),
               _with(base, test_loss=nan_s, test_accuracy=nan_s),
               _with(base, grad_snr=(1, np.nan))):
        assert Telemetry.from_dict(ok.to_dict()).loss[0] == base.loss[0]
        check_telemetry(ok)
    spiked = _with(base, loss=(3, 5 * base.loss[0]))  # above L_0 from step 3 (a catapult)
    for entries in (dict(grad_norm=(3, np.nan)), dict(grad_norm=(3, np.inf)),
                    dict(weight_norm=(3, np.inf)), dict(head_norm=(7, np.inf)),
                    dict(test_loss=(4, np.nan)), dict(max_prob_mean=(4, np.nan))):
        check_telemetry(_with(spiked, **entries))
        _refused(_with(base, **entries), "but the run had not blown up")  # not before
    with pytest.raises(ValueError, match=r"'grad_norm' is nan at update 3, but"):
        check_telemetry(_with(spiked, grad_norm=(2, np.nan)))  # update 3 is at w_2: before
    stopped = _stopped(base, 6)
    check_telemetry(stopped)
    # update 6 (at w_5) went non-finite: its gradient, and w_5's norms (held), may overflow
    check_telemetry(_with(stopped, grad_norm=(5, np.inf), grad_snr=(4, np.nan)))
    inf_from_5 = np.r_[stopped.weight_norm[:5], np.full(T - 4, np.inf)]
    check_telemetry(_with(stopped, weight_norm=inf_from_5))
    _refused(_with(stopped, grad_norm=(4, np.inf)), r"'grad_norm' is inf at update 5, but")


@pytest.mark.skipif(not CORPUS.exists(), reason="no committed telemetry corpus")
def test_every_corpus_run_and_prefix_is_still_accepted():
    """The shipped corpus's diverged runs hold inf / NaN gradient norms, SNRs, weight and head
    norms before their stop and NaN held-out losses after it: all accepted, at every k."""
    with gzip.open(CORPUS, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    odd = 0
    for row in rows:
        tele = Telemetry.from_dict(row["telemetry"])
        stop = tele.stopped_at
        if stop > 0:
            before = np.r_[tele.grad_norm[:stop - 1], tele.weight_norm[:stop - 1]]
            odd += not np.isfinite(before).all()
        for k in (0, 2, 4, 8, stop - 1, stop, T):
            if 0 <= k <= T:
                check_telemetry(truncate(tele, k))
    assert odd > 10  # the exemption is exercised by real runs, not only allowed


def test_stopped_at_must_agree_with_the_curves():
    """stopped_at = 2 on a run whose loss kept falling was accepted (the CLI then printed
    "outcome diverges" beside P(diverges) 0.000): a stopped run holds its step-1 values."""
    base = _base()
    _refused(dataclasses.replace(base, stopped_at=2),
             r"^telemetry field 'loss' changes after stopped_at = 2 \(\S+ at step 2, \S+ at step "
             r"1\), but a run holds its last finite values from stopped_at on; set stopped_at to "
             r"the first update whose loss or parameters were non-finite, or -1\.$")
    good = _stopped(base, 2)
    check_telemetry(good)
    p = fit_outcome(_corpus(40), ntk=False, ks=(0.1,), folds=2)
    assert 0 <= p.predict(good)["p_diverged"] <= 1
    moved = good.weight_norm.copy()
    moved[9] += 1.0
    _refused(dataclasses.replace(good, weight_norm=moved),
             r"'weight_norm' changes after stopped_at = 2 \(\S+ at step 9, \S+ at step 1\)")
    _refused(_with(good, grad_snr=(2, 0.5)),
             r"^telemetry field 'grad_snr' is 0\.5 at update 3, after stopped_at = 2, but a "
             r"stopped run makes no more updates \(NaN from update stopped_at \+ 1 on\); set "
             r"stopped_at to")
    _refused(dataclasses.replace(base, stopped_at=0),
             r"^telemetry field 'stopped_at' is 0, but step 0 holds the initial parameters and "
             r"their finite loss; set stopped_at to the first update")
    assert truncate(good, 1).stopped_at == -1  # a prefix before the stop: a healthy run
    check_telemetry(truncate(good, 1))


def test_hyperparameters_and_start_no_run_records_are_refused():
    """A fresh user's run files: Nesterov with m = 0 (``sgd`` and ``finetune`` refuse it), more
    SNR samples than the batch or one sample of a batch of 10 (a run records min(B, s ≥ 2)),
    and a nonzero ‖w_0 − w_0‖ were accepted and fed to the outcome predictor."""
    base = _base()  # B = 10, snr_samples = 8, m = 0
    _refused(dataclasses.replace(base, nesterov=True),
             r"^telemetry field 'nesterov' is true with momentum 0, which no run records "
             r"\(Nesterov needs m > 0\); give the run's momentum or set nesterov to false\.$")
    check_telemetry(dataclasses.replace(base, nesterov=True, momentum=0.9))
    for s in (11, 1):
        _refused(dataclasses.replace(base, snr_samples=s),
                 rf"^telemetry field 'snr_samples' is {s}, but a run of batch_size 10 records "
                 r"min\(B, TelemetrySpec\.snr_samples\) per-sample gradients, 2 to 10; give")
    for b, s in ((10, 10), (10, 2), (1, 1)):  # B = 1: one sample, grad_snr NaN throughout
        check_telemetry(dataclasses.replace(base, batch_size=b, snr_samples=s,
                                            grad_snr=np.full(T, np.nan)))
    _refused(_with(base, weight_distance=(0, 0.25)),
             r"^telemetry field 'weight_distance' starts at 0\.25, but at step 0 "
             r"\|\|w_0 - w_0\|\| = 0; give the distances from the initial parameters\.$")


@pytest.mark.parametrize("entries, match", [
    (dict(grad_norm=(1, None)), "'grad_norm' is nan at update 2"),
    (dict(stopped_at=2), "'loss' changes after stopped_at = 2"),
    (dict(num_classes=1), r"'num_classes' must be an int >= 2"),
])
def test_outcome_cli_refuses_them_with_one_line(entries, match, tmp_path, capsys):
    from ntk_tt.cli import main

    row = _base().to_dict()
    for f, v in entries.items():
        if isinstance(v, tuple):
            row[f][v[0]] = v[1]
        else:
            row[f] = v
    runs = tmp_path / "runs.jsonl"
    runs.write_text(json.dumps(row) + "\n")
    with pytest.raises(SystemExit) as exc:
        main(["outcome", str(runs), "--updates", "4", "--predictor", "telemetry"])
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and err[0].startswith("ntk-tt: error: ")
    assert match in err[0] and "P(diverges)" not in captured.out


def test_outcome_cli_widens_the_t_eps_interval_outwards_as_predict_does(tmp_path, capsys):
    """A fresh user: ``outcome`` printed the T_0.1 interval [3.67, 5.09] as "4–5" (nearest),
    ``predict`` [7.0, 8.05] as "7–9" (outwards); both widen outwards now: the printed whole
    steps hold the JSON's interval."""
    import math

    from ntk_tt.cli import main

    runs, out = tmp_path / "runs.jsonl", tmp_path / "out.json"
    runs.write_text(json.dumps(_base().to_dict()) + "\n")
    assert main(["outcome", str(runs), "--updates", "4", "--predictor", "telemetry", "--json",
                 str(out)]) == 0
    lo, hi = json.loads(out.read_text())[0]["t_eps_0.1_interval"]
    assert lo != math.floor(lo) and hi != math.ceil(hi)  # fractional: rounding would show
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "loss T_0.1" in ln)
    assert line.endswith(f"(90 % interval {math.floor(lo)}–{math.ceil(hi)})"), (line, lo, hi)


def test_strings_of_numbers_and_what_load_refuses_are_refused_by_the_api_too(tmp_path):
    """A fresh user (session 41): a Telemetry whose loss was an array of strings was
    predicted on (from_dict refuses strings in a row), and save_telemetry wrote an all-NaN
    loss that load_telemetry and ``ntk-tt outcome`` then refused. Now check_telemetry refuses
    non-numeric arrays, and save_telemetry refuses what load_telemetry would, writing
    nothing."""
    base = _base()
    for field in ("loss", "grad_norm", "test_loss"):
        text = dataclasses.replace(base, **{field: np.asarray(getattr(base, field)).astype(str)})
        with pytest.raises(ValueError, match=rf"telemetry field '{field}' must be an array of "
                                             r"numbers, got dtype <U"):
            check_telemetry(text)
    with pytest.raises(ValueError, match="'snapshot_steps' must be an array of whole step"):
        check_telemetry(dataclasses.replace(base, snapshot_steps=np.asarray(
            base.snapshot_steps, float)))
    out = tmp_path / "runs.jsonl"
    nan_loss = _with(base, loss=np.full(T + 1, np.nan))
    with pytest.raises(ValueError, match=r"^item 1 of runs: telemetry field 'loss' must be "
                                         r"finite .* Nothing was written\.$"):
        ntk_tt.save_telemetry(out, [base, nan_loss])
    with pytest.raises(ValueError, match=r"^runs: telemetry field 'loss' must be finite"):
        ntk_tt.save_telemetry(out, nan_loss)
    assert not out.exists()
    ntk_tt.save_telemetry(out, [base])
    assert ntk_tt.load_telemetry(out)[0].loss[0] == base.loss[0]
