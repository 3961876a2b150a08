"""The telemetry corpus generator: one crash-safe row per run, resumable, the real run and its
NTK prediction identical to direct ``finetune`` / ``predict_head_aware`` calls."""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest

import ntk_tt
from ntk_tt.dynamics._fspace import top_eigenvalue
from ntk_tt.kernels._head_aware import initial_kernel
from ntk_tt.sweep._corpus import (
    CorpusSpec,
    _run_key,
    failed,
    load_corpus_task,
    run_corpus,
)
from ntk_tt.sweep._corpus_files import read_corpus
from ntk_tt.telemetry._prediction_checks import check_prediction

# N = 50 and B = 10: the shapes of the outcome test's real runs (the smallest task and batch of
# the shipped predictor's corpus), so the second test reuses this one's compiled programs.
SPEC = CorpusSpec(datasets=("flowers5",), per_class=(10,), seeds=(0,), batch_sizes=((10,),),
                  sgd_seeds=(1,), task_seeds=None, momenta=(0.0,), kappas=(2.0,), steps=4,
                  test_per_class=2, snapshot_steps=(0, 2), num_paths=2)  # and T = 4


@pytest.fixture(scope="module")
def kernel():
    """The task's training images and their head-aware kernel (no held-out block), shared:
    ``sample_task`` trains on the first n images of each class whatever ``test_per_class``."""
    _, _, x, _, _, _, split, _ = load_corpus_task(SPEC.tasks()[0], SPEC)
    return x, ntk_tt.head_aware_kernel(split, x)


def test_corpus_rows_resume_and_match_direct_calls(tmp_path, kernel):
    assert run_corpus(SPEC, tmp_path, progress=lambda s: None) == {"written": 1,
                                                                   "already_present": 0}
    assert run_corpus(SPEC, tmp_path, progress=lambda s: None) == {"written": 0,
                                                                   "already_present": 1}
    rows = {r["config_id"]: r for r in read_corpus(tmp_path)}
    assert sorted(rows) == ["b10-m0-k2-r0"]
    sgd = rows["b10-m0-k2-r0"]
    check_prediction(sgd["prediction"], sgd["telemetry"]["steps"])  # a written row passes
    # T is a snapshot whatever the grid's list (a fresh user's --steps 2 under snapshots
    # (0, 1, 3, 6) had none at T, its last held-out accuracy the step-1 one)
    assert sgd["telemetry"]["snapshot_steps"] == [0, 2, 4]
    task = SPEC.tasks()[0]
    apply_fn, params, x, y, xt, yt, _, _ = load_corpus_task(task, SPEC)
    np.testing.assert_array_equal(kernel[0], x)
    key = _run_key(task, 0)
    run = ntk_tt.finetune(apply_fn, params, x, y, learning_rate=sgd["learning_rate"],
                          steps=SPEC.steps, batch_size=10, key=key, x_test=xt, y_test=yt)
    np.testing.assert_allclose(sgd["telemetry"]["loss"], run.loss, rtol=1e-6)
    assert sgd["outcome"]["test_accuracy"] == pytest.approx(run.test_accuracy)
    assert sgd["telemetry"]["test_accuracy"][-1] == pytest.approx(run.test_accuracy)
    hk = kernel[1]  # the training-set loss needs no held-out kernel
    pred = ntk_tt.predict_head_aware(hk, y, learning_rate=sgd["learning_rate"], steps=SPEC.steps,
                                     batch_size=10, key=key, num_paths=2)
    np.testing.assert_allclose(sgd["prediction"]["loss"], pred.loss, rtol=1e-4)
    # the κ̃ → η rule: η = κ̃·N/λ_max(Θ_0), λ_max of the head-aware model's initial kernel
    assert sgd["lambda_max"] == pytest.approx(float(top_eigenvalue(initial_kernel(hk))),
                                              rel=1e-6)
    assert sgd["learning_rate"] == pytest.approx(2.0 * x.shape[0] / sgd["lambda_max"], rel=1e-5)
    assert sgd["outcome"]["failed"] == failed(run.test_accuracy, run.diverged, 5)
    other = dataclasses.replace(SPEC, steps=5)
    with pytest.raises(ValueError, match="different grid"):
        run_corpus(other, tmp_path)
    json.loads((tmp_path / "spec.json").read_text())


def test_an_interrupted_invocation_is_kept_in_the_log(tmp_path, monkeypatch):
    """A fresh user: an invocation stopped by SIGTERM left no entry in invocations.json (it
    was written at the end only), so the corpus's recorded time lost it. The log is rewritten
    as runs are written: the stopped invocation keeps its runs, unfinished; a finished one
    says so."""
    import ntk_tt.sweep._corpus as corpus

    def one_then_stop(task, spec, runs, done, progress):
        (runs / "x.json").write_text("{}")
        progress("one run")
        raise KeyboardInterrupt

    monkeypatch.setattr(corpus, "run_corpus_task", one_then_stop)
    with pytest.raises(KeyboardInterrupt):
        run_corpus(SPEC, tmp_path, progress=lambda s: None)
    (log,) = json.loads((tmp_path / "invocations.json").read_text())
    assert log["runs_written"] == 1 and log["finished"] is False and log["seconds"] >= 0
    (tmp_path / "runs" / "x.json").unlink()  # not a run: the resume's check would refuse it
    monkeypatch.setattr(corpus, "run_corpus_task", lambda *a, **k: 0)
    assert run_corpus(SPEC, tmp_path, progress=lambda s: None)["written"] == 0
    calls = json.loads((tmp_path / "invocations.json").read_text())
    assert [c["finished"] for c in calls] == [False, True]


def test_failure_label_and_spec_checks():
    assert failed(0.9, True, 5) and failed(0.24, False, 5) and failed(None, False, 5)
    assert not failed(0.26, False, 5)
    with pytest.raises(ValueError, match="equal"):
        CorpusSpec(datasets=("a",), per_class=(10,), batch_sizes=((None,), (5,)))
    two = CorpusSpec(datasets=("a", "b"), per_class=(10, 50), seeds=(0, 1, 2),
                     task_seeds=(3, 1))
    assert [(t.dataset, t.per_class, t.seed) for t in two.tasks()] == [
        ("a", 10, 0), ("a", 10, 1), ("a", 10, 2), ("b", 10, 0), ("b", 10, 1), ("b", 10, 2),
        ("a", 50, 0), ("b", 50, 0)]
    with pytest.raises(ValueError, match=r"must be in \[1, N\)"):
        CorpusSpec(datasets=("a",), per_class=(2,), batch_sizes=((10,),), sgd_seeds=(1,),
                   task_seeds=None)
    assert jax.random.key_data(_run_key(SPEC.tasks()[0], 1)).shape == (2,)


def test_shipped_outcome_predictor_reads_real_runs(tmp_path, capsys, kernel):
    """The shipped (corpus-fitted) predictor, through ``ntk-tt outcome``, on two real
    fine-tunes of the vendored flowers5 set it never saw: one far past the divergence edge
    (κ̃ = 300, it diverges for real) and one at κ̃ = 3 (it does not). SGD with B = 10 on
    N = 50: the smallest batch and task size of the predictor's corpus (GD's recorded run took
    2.5× the CPU time)."""
    from ntk_tt.cli import main
    from ntk_tt.sweep._grid import Task

    spec = dataclasses.replace(SPEC, test_per_class=10, steps=40)
    apply_fn, params, x, y, xt, yt, _, feats = load_corpus_task(Task("flowers5", 10, 0), spec)
    np.testing.assert_array_equal(kernel[0], x)
    lam = float(top_eigenvalue(initial_kernel(kernel[1])))
    tspec = ntk_tt.TelemetrySpec(features=feats, snr_samples=8,
                                 snapshot_steps=(0, 1, 2, 4, 8, 20, 40))
    runs = [ntk_tt.finetune(apply_fn, params, x, y, learning_rate=k * x.shape[0] / lam,
                            steps=40, batch_size=10, key=jax.random.key(0), x_test=xt,
                            y_test=yt, telemetry=tspec) for k in (300, 3)]
    assert runs[0].diverged and not runs[1].diverged
    ntk_tt.save_telemetry(tmp_path / "runs.jsonl", [r.telemetry for r in runs])
    assert main(["outcome", str(tmp_path / "runs.jsonl"), "--fraction", "0.1", "--json",
                 str(tmp_path / "out.json")]) == 0
    out = json.loads((tmp_path / "out.json").read_text())
    assert [o["observed_updates"] for o in out] == [4, 4]
    assert [o["out_of_domain"] for o in out] == [[], []]  # inside the corpus it was fit on
    assert out[0]["p_diverged"] > 0.9 and out[1]["p_diverged"] < 0.1
    assert out[0]["test_accuracy"] < out[1]["test_accuracy"]
    assert "will likely diverge" in capsys.readouterr().out


def test_read_corpus_reads_both_forms_and_refuses_what_is_not_a_corpus(tmp_path):
    """``ntk_tt.read_corpus`` (was private, and a mistyped path gave [] silently, a bad line a
    raw JSONDecodeError): the directory form and a .jsonl.gz of the same rows read alike; a
    missing path, a folder without runs/, an empty file and a line that is not a JSON object
    are one ValueError naming the path (and line)."""
    import gzip

    rows = [{"run_id": f"r{i}", "value": i} for i in range(3)]
    (tmp_path / "dir" / "runs").mkdir(parents=True)
    for r in rows:
        (tmp_path / "dir" / "runs" / f"{r['run_id']}.json").write_text(json.dumps(r))
    packed = tmp_path / "rows.jsonl.gz"
    with gzip.open(packed, "wt") as fh:
        fh.write("".join(json.dumps(r) + "\n\n" for r in rows))  # blank lines are skipped
    assert ntk_tt.read_corpus(tmp_path / "dir") == rows == ntk_tt.read_corpus(str(packed))
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\n[1, 2]\n')
    (tmp_path / "broken.jsonl").write_text('{"a": 1}\n{"a": \n')
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "plain.gz").write_text("not gzip")
    (tmp_path / "latin" / "runs").mkdir(parents=True)
    (tmp_path / "latin" / "runs" / "x.json").write_bytes(b'{"a": "\xff"}')
    (tmp_path / "folder" / "runs" / "x.json").mkdir(parents=True)
    for path, match in ((tmp_path / "typo.jsonl.gz", r"typo\.jsonl\.gz' does not exist"),
                        (tmp_path, r"is a directory without runs/"),
                        (tmp_path / "bad.jsonl", r"bad\.jsonl, line 2: a corpus row is a JSON "
                                                 r"object, got list"),
                        (tmp_path / "broken.jsonl", r"broken\.jsonl, line 2: not JSON"),
                        (tmp_path / "empty.jsonl", r"holds no rows"),
                        (tmp_path / "plain.gz", r"plain\.gz: not a corpus file"),
                        (tmp_path / "latin", r"x\.json: not a corpus row file"),
                        (tmp_path / "folder", r"x\.json: not a corpus row file"),
                        ("", r"needs the path of a corpus directory .*got ''"),
                        (None, r"got None"), (3, r"got 3"),
                        ("~nosuchuser_ntk_tt/c.jsonl", r"corpus '~nosuchuser_ntk_tt/c\.jsonl'")):
        with pytest.raises(ValueError, match=match):
            ntk_tt.read_corpus(path)


def _corpus_script(monkeypatch):
    """experiments/telemetry_corpus.py as a module, its run_corpus failing the test if called."""
    from _scripts import experiment_script

    module = experiment_script("telemetry_corpus")
    monkeypatch.setattr(module, "run_corpus", lambda *a, **k: pytest.fail("work started"))
    return module


def test_corpus_script_packs_only_into_a_new_file_and_whole(tmp_path, capsys, monkeypatch):
    """A fresh user: --pack onto the committed corpus replaced its 1,024 runs by 4 without a
    word; --pack into a missing folder was a traceback, of an --out without runs an empty file
    ("0 runs", status 0), and a damaged run file a traceback after a partial file. Each is now
    one error line with nothing written; --overwrite replaces a file, the rows read back."""
    from _scripts import refused
    from test_outcome import _corpus

    module = _corpus_script(monkeypatch)
    rows = [r | {"value": i + 0.123456789} for i, r in enumerate(_corpus(3))]  # run_id r0 ...
    (tmp_path / "c" / "runs").mkdir(parents=True)
    for r in rows:
        (tmp_path / "c" / "runs" / f"{r['run_id']}.json").write_text(json.dumps(r))
    out, pack = str(tmp_path / "c"), tmp_path / "p.jsonl"
    pack.write_text("kept\n")
    for argv, said in (
            ([pack], f"--pack {str(pack)!r} exists; give a new path, or --overwrite"),
            ([tmp_path / "no" / "p.jsonl"], "the folder"),
            ([""], "--pack '' is not a file path"),
            ([tmp_path / "q.jsonl", "--steps", "8"], "--pack only packs the runs of --out; "
                                                     "--steps set a grid to run: drop them")):
        line = refused(module, ["--out", out, "--pack", *map(str, argv)], capsys)
        assert said in line, line
    assert refused(module, ["--out", str(tmp_path / "none"), "--pack", str(tmp_path / "q.jsonl")],
                   capsys).endswith("holds no runs (no " + str(tmp_path / "none") +
                                    "/runs/*.json): run the corpus there first, without --pack")
    # a third probe: a pack inside --out (runs/new.json, spec.json) wrecked the corpus
    for inside in (tmp_path / "c" / "runs" / "new.json", tmp_path / "c" / "spec.json"):
        assert "is inside --out" in refused(module, ["--out", out, "--pack", str(inside),
                                                     "--overwrite"], capsys)
    assert pack.read_text() == "kept\n" and not (tmp_path / "q.jsonl").exists()
    assert module.main(["--out", out, "--pack", str(pack), "--overwrite"]) == 0
    assert [r["value"] for r in ntk_tt.read_corpus(pack)] == [
        float(f"{r['value']:.7g}") for r in rows]  # floats to 7 significant digits
    assert [r["telemetry"]["loss"][:3] for r in ntk_tt.read_corpus(pack)] == [
        [float(f"{v:.7g}") for v in r["telemetry"]["loss"][:3]] for r in rows]
    umask = os.umask(0)
    os.umask(umask)
    assert pack.stat().st_mode & 0o777 == 0o666 & ~umask  # as any file here (was 0600)
    # damaged from outside: not JSON, {}, another run_id, a cut or impossible telemetry
    r1 = tmp_path / "c" / "runs" / "r1.json"
    cut = rows[1] | {"telemetry": rows[1]["telemetry"] | {"loss": [1.0, 0.9, 0.8]}}
    negative = rows[1] | {"telemetry": rows[1]["telemetry"] | {
        "loss": [-5.0, *rows[1]["telemetry"]["loss"][1:]]}}
    for text, said in (("x\n", "r1.json: not JSON"),
                       ("{}", "r1.json: not the run its name says (run_id None)"),
                       (json.dumps(rows[1] | {"run_id": "zzz"}), "(run_id 'zzz')"),
                       (json.dumps(cut), "r1.json: telemetry field 'accuracy' has"),
                       (json.dumps(negative), "r1.json: telemetry field 'loss' must be")):
        r1.write_text(text)
        line = refused(module, ["--out", out, "--pack", str(tmp_path / "q.jsonl")], capsys)
        assert said in line and not (tmp_path / "q.jsonl").exists(), (said, line)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_corpus_script_refuses_another_grid_a_damaged_run_and_repeated_values(
        tmp_path, capsys, monkeypatch):
    """Resuming with another grid was run_corpus's ValueError as a traceback, not naming what
    differs; a damaged run file counted as finished; --seeds 0 0 ran every task twice and -1
    or 2**32 were taken (2**32 is seed 0's key); flowers5 and its own .npz path were two data
    sets. Each is one line now, before any work."""
    from _scripts import refused

    from ntk_tt.data._data import VENDORED

    module = _corpus_script(monkeypatch)
    out = tmp_path / "c"
    (out / "runs").mkdir(parents=True)
    smoke = module.PRESETS["smoke"]
    (out / "spec.json").write_text(json.dumps(dataclasses.asdict(smoke)))
    line = refused(module, ["--out", str(out), "--preset", "smoke", "--steps", "8"], capsys)
    assert line.endswith(f"{out} holds a corpus of a different grid ({out / 'spec.json'}; it "
                         "differs in steps); resume it with the same options or choose a new "
                         "--out.")
    # a spec.json that is not a JSON object was said to differ in every field of the grid
    for text, why in (("{\"steps\": 8", "not readable JSON: Expecting"),
                      ("[1, 2]", "a JSON list, not an object")):
        (out / "spec.json").write_text(text)
        line = refused(module, ["--out", str(out), "--preset", "smoke"], capsys)
        assert f"{out / 'spec.json'} is damaged ({why}" in line and "differs in" not in line
    (out / "spec.json").write_text(json.dumps(dataclasses.asdict(smoke)))
    (out / "runs" / "x.json").write_text("[1]")
    assert "x.json: a corpus row is a JSON object, got list" in refused(
        module, ["--out", str(out), "--preset", "smoke"], capsys)
    for extra, said in ((["--seeds", "0", "0"], "error: --seeds names a value twice"),
                        (["--seeds", str(2**32)], "error: --seeds must be integers in "
                                                   "[0, 2**32)"),
                        (["--datasets", "flowers5", str(VENDORED["flowers5"])],
                         "are the same dataset; give it once"),
                        (["--pres", "smoke"], "unrecognized arguments: --pres smoke"),
                        (["--preset", "smok"], "argument --preset: invalid choice: 'smok'")):
        assert said in refused(module, ["--out", str(tmp_path / "new"), *extra], capsys), extra
    assert not (tmp_path / "new").exists()
