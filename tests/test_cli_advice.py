"""``ntk-tt predict``'s advice: ``--subset`` takes exactly the methods ``ntk_tt.predict(subset=,
optimizer=)`` takes (auto / discrete always, closed_form for constant η with m = 0), and a
refusal never advises a method that is refused in turn; the prediction's BeyondEdgeWarning
(the closed form with momentum beyond its η/(1 − m) model's edge) is a "warning:" line and
``predicted.warnings`` in the JSON, and a divergence of that model is told to use --method
discrete (which converges there), not to lower --lr."""

import contextlib
import io
import json
import re
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest
from _cli_tiny import cli_before_jax, tiny_task

import ntk_tt
from ntk_tt._options_predict import check_predict_job
from ntk_tt.cli import main

ROOT = str(Path(__file__).resolve().parents[1])  # on PYTHONPATH of the programs run
T, LR, SUBSET = 10, 0.1, 18  # the tiny task: K = 3, n = 8, N = 24
METHODS = ("auto", "discrete", "closed_form", "ode", "sde")
# update rule → (its ntk-tt flags, its job options, its ntk_tt.Optimizer)
RULES = {"gd": ([], {}, ntk_tt.sgd(LR)),
         "momentum": (["-m", "0.5"], {"momentum": 0.5}, ntk_tt.sgd(LR, 0.5)),
         "schedule": (["--schedule", "warmup-cosine", "--warmup", "2"],
                      {"schedule": "warmup_cosine", "warmup": 2},
                      ntk_tt.sgd(ntk_tt.warmup_cosine(LR, 2, T)))}


@pytest.fixture(scope="module")
def task():
    return tiny_task()


def _cli_accepts(rule: str, method: str) -> bool:
    """Whether ``ntk-tt predict --subset`` takes ``method`` with ``rule`` (its check before
    JAX, the one the command runs)."""
    options = dict(num_classes=3, per_class=8, steps=T, learning_rate=LR, loss="mse",
                   subset=SUBSET, subset_method="nystrom", method=method) | RULES[rule][1]
    try:
        check_predict_job(options)
    except ValueError:
        return False
    return True


@pytest.fixture(scope="module")
def api_accepts(task):
    """{(rule, method): whether ``ntk_tt.predict(subset=, optimizer=, method=)`` takes it},
    from the API itself: its checks run before ``predict_from_subset``, replaced here by a
    stop."""
    import ntk_tt.prediction._subset as subset_module

    class Reached(Exception):
        pass

    def stop(*_, **__):
        raise Reached

    apply_fn, params, x, y, *_ = task
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(subset_module, "predict_from_subset", stop)
        for rule, (_, _, opt) in RULES.items():
            for method in METHODS:
                try:
                    ntk_tt.predict(apply_fn, params, x, y, optimizer=opt, steps=T, loss="mse",
                                   subset=SUBSET, subset_method="nystrom", method=method,
                                   key=jax.random.key(0))
                except Reached:
                    out[rule, method] = True
                except ValueError:
                    out[rule, method] = False
    return out


def test_cli_subset_takes_the_methods_predict_takes(api_accepts):
    """The CLI's accepted (rule, method) pairs are the API's, all 15 (the old CLI refused
    --method discrete always, and the API's auto/discrete is the rule here)."""
    cli = {(rule, method): _cli_accepts(rule, method) for rule in RULES for method in METHODS}
    assert cli == api_accepts
    assert sorted(k for k, v in cli.items() if v) == sorted(
        [(r, "auto") for r in RULES] + [(r, "discrete") for r in RULES] + [("gd", "closed_form")])


def _advised(line: str) -> set[str]:
    """The methods a refusal advises: "use --method X", "--method must be A, B or C here"."""
    named = re.findall(r"use --method (\w+)", line)
    listed = re.search(r"--method must be (.+?) here", line)
    return set(named) | (set(re.split(r", | or ", listed.group(1))) if listed else set())


def test_cli_subset_refusals_advise_only_accepted_methods(tmp_path):
    """Every refused --subset method, before JAX is imported: one line whose advised methods
    are the ones the CLI then accepts, all of them (the old CLI advised --method closed_form
    with -m, which it refused, and refused the --method discrete it did not advise)."""
    refused = [(rule, m) for rule in RULES for m in METHODS if not _cli_accepts(rule, m)]
    cases = [["predict", "--no-progress", "-K", "3", "-n", "8", "-T", str(T), "--lr", str(LR),
              "--figure", "", "--loss", "mse", "--subset", str(SUBSET), *RULES[rule][0],
              "--method", m] for rule, m in refused]
    results, lines, stderr = cli_before_jax(cases, tmp_path)
    assert len(refused) == 8 and len(lines) == len(refused), stderr
    for (rule, method), (status, jax_imported), line in zip(refused, results, lines,
                                                           strict=True):
        assert status == 2 and jax_imported is False, (rule, method, status)
        assert line.startswith("ntk-tt: error: subset (--subset)"), line
        accepted = {m for m in METHODS if _cli_accepts(rule, m)} - {"auto"}
        assert _advised(line) - {"auto"} == accepted, (rule, method, line)
        assert f"drop --method{'' if method != 'closed_form' else ' closed_form'}" in line
    assert not list(tmp_path.iterdir())


def _cli(task, folder, args):
    """``ntk-tt predict`` on the tiny task in ``folder``: (exit status, stdout, JSON)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("ntk_tt.prediction._job.load_task", lambda **_: task)
        mp.chdir(folder)
        with contextlib.redirect_stdout(io.StringIO()) as out:
            code = main(["predict", "--no-progress", "-K", "3", "-n", "8", "--test-per-class",
                         "2", "--figure", "", "--json", "r.json", "--loss", "mse", *args])
    return code, out.getvalue(), json.loads((folder / "r.json").read_text())


@pytest.mark.parametrize("rule", ["momentum", "gd"])
def test_cli_subset_discrete_predicts_the_api_s_curve(task, tmp_path, rule):
    """--subset with --method discrete (refused by the old CLI): the report's loss curve and
    method are ``ntk_tt.predict(subset=, optimizer=, method="discrete")``'s on the same task
    and key (with m = 0 that is the closed form, the keywords' curve)."""
    apply_fn, params, x, y, *_ = task
    code, _, r = _cli(task, tmp_path, ["-T", str(T), "--lr", str(LR), "--subset", str(SUBSET),
                                       "--subset-method", "nystrom", *RULES[rule][0],
                                       "--method", "discrete"])
    assert code == 0 and r["status"] == "complete"
    pred = ntk_tt.predict(apply_fn, params, x, y, optimizer=RULES[rule][2], steps=T,
                          loss="mse", subset=SUBSET, subset_method="nystrom", method="discrete",
                          key=jax.random.fold_in(jax.random.key(0), 2))
    got = np.array(r["curves"]["predicted"]["loss"], float)
    np.testing.assert_array_equal(got, np.asarray(pred.loss, float))
    assert got[-1] < 0.95 * got[0]  # a curve that falls
    assert r["predicted"]["method"] == pred.method == (
        "discrete" if rule == "momentum" else "closed_form")
    assert r["optimizer"]["momentum"] == pytest.approx(RULES[rule][1].get("momentum", 0.0))


def test_cli_closed_form_momentum_warns_and_advises_discrete(task, tmp_path):
    """-m 0.5 --method closed_form at κ ≈ 1.67 (between the η/(1 − m) model's edge 2(1 − m) = 1
    and heavy ball's 2(1 + m) = 3): the API warns (BeyondEdgeWarning) and its curve diverges;
    the report prints that warning, keeps it in the JSON, and says to use --method discrete,
    whose prediction converges (the old report said nothing and advised lowering --lr). Its
    outcome is "unknown", not "diverges": the approximation cannot tell."""
    apply_fn, params, x, y, *_ = task
    lr, steps = 0.6, 20
    code, out, r = _cli(task, tmp_path, ["-T", str(steps), "--lr", str(lr), "-m", "0.5",
                                         "--method", "closed_form"])
    assert code == 0
    key = jax.random.fold_in(jax.random.key(0), 2)
    kw = dict(learning_rate=lr, momentum=0.5, steps=steps, loss="mse", key=key)
    with pytest.warns(ntk_tt.BeyondEdgeWarning) as caught:
        closed = ntk_tt.predict(apply_fn, params, x, y, method="closed_form", **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ntk_tt.BeyondEdgeWarning)  # none for the recursion
        exact = ntk_tt.predict(apply_fn, params, x, y, method="discrete", **kw)
    assert 1.0 <= closed.kappa < 3.0 and closed.diverged and not closed.beyond_edge
    assert not exact.diverged and exact.loss[-1] < exact.loss[0]  # the advice converges
    said = [str(w.message) for w in caught]
    assert r["predicted"]["warnings"] == said and len(said) == 1
    assert r["predicted"]["diverged"] and r["predicted"]["diverged_at"] == closed.diverged_at
    lines = out.splitlines()
    warned = [ln for ln in lines if ln.startswith("warning:")]
    assert warned == ["warning: " + said[0].replace("method='closed_form'", "--method closed_form")
                      .replace("method='discrete'", "--method discrete")]
    assert "use --method discrete (exact heavy ball)" in warned[0]
    # the JSON keeps why there is no interval; the table's divergence line already says it
    # and its call on the real run is "unknown" (it was "diverges"), saying why
    assert r["predicted"]["outcome"] == closed.outcome == "unknown"
    assert r["predicted"]["interval_warnings"][0].startswith(
        "no T_ε interval: the prediction abstains (outcome unknown: κ = η·λ_max/N = 1.67 ≥ "
        "2(1 − m) = 1, where the closed form's GD model")
    assert not [ln for ln in lines if ln.startswith("note: no T_ε interval")]
    diverged = [ln for ln in lines if ln.startswith("prediction diverged at step")]
    assert len(diverged) == 1 and diverged[0].endswith("use --method discrete)"), diverged
    assert "lower --lr" not in out


def test_messages_name_the_flag_and_fit_the_mistake(tmp_path):
    """A fresh user's probe: --num-paths 0 was not named as the flag, --subset with
    cross-entropy said 'full-batch GD only' (it takes SGD schedules and momentum), and labels
    of the wrong length were told 'not one-hot vectors'. Each message now fits; one-hot
    labels still get the one-hot advice."""
    base = ["predict", "--no-progress", "-K", "3", "-n", "8", "-T", "10", "--figure", ""]
    cases = [base + ["--num-paths", "0"], base + ["--subset", "6"]]
    results, lines, stderr = cli_before_jax(cases, tmp_path)
    assert [status for status, _ in results] == [2, 2], stderr
    assert lines[0].startswith("ntk-tt: error: num_paths (--num-paths) must be an integer")
    assert "predicts the MSE loss only" in lines[1] and "full-batch" not in lines[1]
    from ntk_tt.dynamics._checks import check_labels

    with pytest.raises(ValueError, match=r"shape \(6,\).*give one label per input \(8 "):
        check_labels(np.zeros(6, int), 8, 3)
    with pytest.raises(ValueError, match="not one-hot vectors"):
        check_labels(np.eye(3, dtype=int)[np.arange(8) % 3], 8, 3)
    with pytest.raises(ValueError, match=r"cast the float(32|64) class indices to int, e\.g\. "):
        check_labels(np.arange(8.0) % 3, 8, 3)  # a second fresh user: was told "not one-hot"
    with pytest.raises(ValueError, match=r"cast the bool class indices to int, e\.g\. "):
        check_labels(np.arange(8) % 2 == 0, 8, 3)  # a third: bool labels were called float
    # a fourth: labels + 0.5 were told y.astype(int), which truncates them to other classes
    with pytest.raises(ValueError, match=r"dtype float32; 8 of them are not whole numbers "
                                         r"\(e\.g\. 0\.5\): class labels are the integers 0 "):
        check_labels(np.arange(8, dtype=np.float32) % 3 + 0.5, 8, 3)
    from ntk_tt.training._finetune_checks import _labels  # finetune's (a second probe)

    for labels in (check_labels, lambda y, n, c: _labels(y, n, c, "y")):
        with pytest.raises(ValueError, match=r"2 of them are not whole numbers \(e\.g\. inf\)"):
            labels(np.array([0.0, 1.0, 2.0, np.inf] * 2), 8, 3)
        with pytest.raises(ValueError, match=r"8 of them are not whole numbers \(e\.g\. 0\.5\)"):
            labels(np.arange(8.0) % 3 + 0.5, 8, 3)


def test_a_figure_that_cannot_be_written_loses_no_result(task, tmp_path, capsys, monkeypatch):
    """A fresh user: a full disk when the figure was written ended the run with one error line
    and nothing else: the report was not printed, the --json report said "failed" with no
    real run although the fine-tune had finished, and a truncated PNG was left. Now the figure
    is written whole or not at all, and the report and JSON are complete without it."""
    from matplotlib.figure import Figure

    def full_disk(self, fname, **_):
        Path(fname).write_bytes(b"\x89PNG half an image")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full_disk)
    monkeypatch.setattr("ntk_tt.prediction._job.load_task", lambda **_: task)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["predict", "--no-progress", "-K", "3", "-n", "8", "--test-per-class", "2",
              "-T", str(T), "--lr", str(LR), "--verify", "--figure", "f.png", "--json",
              "r.json"])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2
    assert err == ("ntk-tt: error: could not write f.png: No space left on device. (no figure; "
                   "the report above is complete)\n"), err
    assert "real T_ε" in out and "json: r.json" in out and "figure:" not in out
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["status"] == "complete" and r["real"] is not None and r["figure"] is None
    assert r["figure_error"] == "could not write f.png: No space left on device."
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # no half PNG, no temp


def test_cli_prints_a_package_user_warning_as_a_warning_line(task, tmp_path):
    """A fresh user: ``--subset`` with under 4 samples per class printed Python's raw
    "…/_predict_subset.py:113: UserWarning: …" and its source line on stderr; every warning the
    package raises is now a "warning:" line and in ``predicted.warnings``, and none escapes."""
    with warnings.catch_warnings(record=True) as escaped:
        warnings.simplefilter("always")
        code, out, r = _cli(task, tmp_path, ["-T", str(T), "--lr", str(LR), "--subset", "6",
                                             "--subset-method", "nystrom"])
    assert code == 0
    said = [w for w in r["predicted"]["warnings"] if w.startswith("the subset of N' = 6")]
    assert len(said) == 1 and "2 of each of the K = 3 classes" in said[0]
    assert f"warning: {said[0]}" in out.splitlines()
    assert not [w for w in escaped if "subset of N'" in str(w.message)]


@pytest.mark.parametrize("case", ["given", "default", "sde"])
def test_cli_refuses_a_sketch_larger_than_the_model(task, tmp_path, capsys, case):
    """A fresh user's --sketch-dim 200000 on the 120,901-parameter model ran for minutes: once
    the model is loaded, before any kernel, a sketch dimension above D is one error line
    naming D, exit status 2 (the API refuses it too). Without --sketch-dim the default
    D' = 256 is checked (a later fresh user: a TypeError traceback comparing None with D);
    an explicit one for the SDE noise is checked too, and its advice is no other kernel (a
    second probe: it got the API's wording)."""
    d = ntk_tt.num_params(task[1])
    assert d < 256  # the tiny model: the default sketch exceeds it
    flags = {"given": ["--kernel", "sketch", "--sketch-dim", str(d + 1)],
             "default": ["--kernel", "sketch"],
             "sde": ["--method", "sde", "-B", "4", "--sketch-dim", str(d + 1)]}[case]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("ntk_tt.prediction._job.load_task", lambda **_: task)
        mp.setattr("ntk_tt.kernels._sketch.sketched_ntk", None)  # no kernel may start
        mp.chdir(tmp_path)
        with pytest.raises(SystemExit) as stop:
            main(["predict", "--no-progress", "-K", "3", "-n", "8", "-T", str(T), "--lr",
                  str(LR), "--figure", "", *flags])
    assert stop.value.code == 2
    shown = "256 (the default)" if case == "default" else f"{d + 1}"
    advice = "" if case == "sde" else "--kernel exact, or "
    assert (f"ntk-tt: error: sketch_dim (--sketch-dim) {shown} exceeds the model's D = {d} "
            f"parameters: that sketch costs more than the exact kernel and is still an "
            f"estimate; use {advice}--sketch-dim <= D/2 = {d // 2}, where it saves work."
            ) in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
