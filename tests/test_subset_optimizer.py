"""``predict(..., subset=N', optimizer=ntk_tt.sgd(schedule, m))`` and ``ntk-tt predict --subset
N' --schedule ... -m`` (issue 27): the subset predictor takes the full-batch SGD family (each
eigenmode's exact recursion on the predicted spectrum); Adam, weight decay, B < N and the
closed form with a schedule or momentum stay refused, in one line, before any kernel."""

import contextlib
import io
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _cli_tiny import tiny_task
from _dynamics_helpers import linear_apply, linear_problem

import ntk_tt
from ntk_tt.cli import main

N, T, WARMUP, LR, M, SUBSET = 40, 30, 5, 0.05, 0.9, 12


def _linear_task(dtype=jnp.float64):
    """f = xW + b (6 features, N = 40, C = 3): Θ = (xxᵀ + 1) ⊗ I_C has rank 7, so 12 Nyström
    landmarks span it (the subset's spectrum is exact) and the model is its linearisation."""
    params, x, _ = linear_problem(n=N, d=6, c=3, dtype=dtype)
    return params, x, np.arange(N) % 3


@pytest.mark.parametrize("nesterov", [False, True])
def test_predict_subset_with_optimizer_equals_the_full_kernel_and_real_training(nesterov):
    """Nyström on a rank-7 kernel is exact, so the subset curve is the full kernel's discrete
    recursion with the same optimiser, and (the model being linear) the real run's loss."""
    opt = ntk_tt.sgd(ntk_tt.warmup_cosine(LR, WARMUP, T), M, nesterov=nesterov)
    with jax.enable_x64(True):
        params, x, y = _linear_task()
        pred = ntk_tt.predict(linear_apply, params, x, y, optimizer=opt, steps=T, loss="mse",
                              subset=SUBSET, subset_method="nystrom", key=jax.random.key(0))
        ref = ntk_tt.predict(linear_apply, params, x, y, optimizer=opt, steps=T, loss="mse",
                             method="discrete")
        run = ntk_tt.finetune(linear_apply, params, x, y, optimizer=opt, steps=T, loss="mse")
    np.testing.assert_allclose(pred.loss, np.asarray(ref.loss), rtol=1e-9)
    np.testing.assert_allclose(pred.loss, np.asarray(run.loss), rtol=1e-6)
    assert pred.loss[-1] < 0.5 * pred.loss[0]  # it trains: not a flat curve
    assert pred.kappa == pytest.approx(float(ref.kappa), rel=1e-9)
    assert pred.method == "discrete" and pred.kernel == f"traced:subset{SUBSET}:nystrom"
    hp = pred.hyperparameters
    assert (hp["optimizer"], hp["schedule"], hp["nesterov"]) == ("sgd", "warmup_cosine", nesterov)
    assert hp["momentum"] == pytest.approx(M) and hp["learning_rate"] == pytest.approx(LR)
    assert hp["schedule_parameters"]["warmup"] == WARMUP and hp["batch_size"] == N
    assert (hp["subset_size"], hp["subset_method"], hp["steps"]) == (SUBSET, "nystrom", T)
    assert np.all(np.isnan(pred.error))  # the loss curve only, as with learning_rate=


def _model_untouched(monkeypatch):
    def refuse(*_, **__):
        raise AssertionError("kernel work started before validation")

    monkeypatch.setattr("ntk_tt.prediction._subset.empirical_ntk", refuse)


SCHED = ntk_tt.warmup_cosine(LR, WARMUP, T)


@pytest.mark.parametrize("kw, match", [
    (dict(optimizer=ntk_tt.adamw(1e-3)),
     r"predict\(subset=...\) predicts .* only, got adamw\(B=N\): Adam's elementwise moments"),
    (dict(optimizer=ntk_tt.sgd(SCHED, M, weight_decay=1e-3)),
     "weight decay acts on J·θ0, whose projections on the kernel's eigenvectors"),
    (dict(optimizer=ntk_tt.sgd(SCHED, M, batch_size=8)),
     "full-batch training only .*got batch_size=8: minibatches couple the eigenmodes"),
    (dict(optimizer=ntk_tt.sgd(SCHED, M), method="closed_form"),
     "each eigenmode's exact recursion .*method must be 'auto' or 'discrete', got "
     "'closed_form'"),
    (dict(learning_rate=LR, nesterov=True),
     r"keywords are plain GD .*optimizer=ntk_tt.sgd\(learning_rate, momentum=m, nesterov=True"),
])
def test_predict_subset_refusals_come_before_any_kernel(kw, match, monkeypatch):
    _model_untouched(monkeypatch)
    params, x, y = _linear_task(jnp.float32)
    with pytest.raises(ValueError, match=match):
        ntk_tt.predict(linear_apply, params, x, y, steps=T, loss="mse", subset=SUBSET,
                       subset_method="nystrom", key=jax.random.key(0), **kw)


def test_constant_sgd_optimizer_is_the_closed_form_of_the_keywords():
    """ntk_tt.sgd(η) under subset= gives the learning_rate=η curve bit for bit, labelled as
    the closed form, and accepts method='closed_form' as the keywords do."""
    with jax.enable_x64(True):
        params, x, y = _linear_task()
        kw = dict(steps=T, loss="mse", subset=SUBSET, subset_method="nystrom",
                  key=jax.random.key(1), method="closed_form")
        a = ntk_tt.predict(linear_apply, params, x, y, learning_rate=LR, **kw)
        b = ntk_tt.predict(linear_apply, params, x, y, optimizer=ntk_tt.sgd(LR), **kw)
    assert np.array_equal(a.loss, b.loss) and a.method == b.method == "closed_form"
    assert b.hyperparameters["schedule"] == "constant" and b.hyperparameters["momentum"] == 0.0


# ---- ntk-tt predict --subset with the optimiser flags --------------------------------------

STEPS, CLI_LR, CLI_WARMUP, CLI_SUBSET = 12, 0.05, 3, 18  # the tiny task: 6 to 9 per class


@pytest.fixture(scope="module")
def task():
    return tiny_task()


def _cli(task, folder, args):
    """``ntk-tt predict`` on the tiny task in ``folder``: (exit status, the JSON report)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("ntk_tt.prediction._job.load_task", lambda **_: task)
        mp.chdir(folder)
        with contextlib.redirect_stdout(io.StringIO()):
            code = main(["predict", "--no-progress", "-K", "3", "-n", "8", "--test-per-class",
                         "2", "--figure", "", "--json", "r.json", "--loss", "mse", "--subset",
                         str(CLI_SUBSET), "--subset-method", "nystrom", "-T", str(STEPS),
                         "--lr", str(CLI_LR), *args])
    return code, json.loads((folder / "r.json").read_text())


@pytest.mark.parametrize("flags, schedule, name, m, nesterov", [
    (["--schedule", "warmup-cosine", "--warmup", str(CLI_WARMUP), "-m", "0.9"],
     ntk_tt.warmup_cosine(CLI_LR, CLI_WARMUP, STEPS), "warmup_cosine", 0.9, False),
    (["-m", "0.5", "--nesterov"], ntk_tt.constant(CLI_LR), "constant", 0.5, True),
])
def test_cli_subset_with_optimiser_flags_predicts_the_api_s_curve(task, tmp_path, flags,
                                                                   schedule, name, m, nesterov):
    """The report's loss curve is ``ntk_tt.predict(..., subset=18, optimizer=)``'s on the same
    task and key (the old CLI refused these flags with --subset), with the optimiser recorded
    as on the other paths."""
    apply_fn, params, x, y, _, _, _, _ = task
    code, r = _cli(task, tmp_path, flags)
    assert code == 0 and r["status"] == "complete"
    opt = ntk_tt.sgd(schedule, m, nesterov=nesterov)
    pred = ntk_tt.predict(apply_fn, params, x, y, optimizer=opt, steps=STEPS, loss="mse",
                          subset=CLI_SUBSET, subset_method="nystrom",
                          key=jax.random.fold_in(jax.random.key(0), 2))
    got = np.array(r["curves"]["predicted"]["loss"], float)
    np.testing.assert_array_equal(got, np.asarray(pred.loss, float))
    assert got[-1] < 0.95 * got[0]  # a curve that falls
    for h in (r["optimizer"], r["predicted"]["hyperparameters"]):
        assert (h["optimizer"], h["nesterov"], h["batch_size"]) == ("sgd", nesterov, 24)
        assert h["momentum"] == pytest.approx(m) and h["schedule"] == name
    assert r["predicted"]["hyperparameters"]["subset_size"] == CLI_SUBSET
    assert r["predicted"]["kernel"] == f"traced:subset{CLI_SUBSET}:nystrom"


@pytest.mark.parametrize("flags, match", [
    (["--weight-decay", "0.01"], "subset (--subset) predicts training without weight decay: "
                                 "decay acts on J·θ0"),
    (["--weight-decay", "0.01", "--l2"], "drop --weight-decay (and --l2), or drop --subset"),
    (["--optimizer", "adamw"], "subset (--subset) predicts --optimizer sgd only"),
    (["--schedule", "warmup-cosine", "--method", "closed_form"],
     "subset (--subset) with --schedule warmup-cosine runs each eigenmode's exact recursion"),
    (["--schedule", "warmup-cosine", "-m", "0.9", "-B", "12"],
     "subset (--subset) predicts full-batch GD only: drop -B"),
])
def test_cli_subset_refusals_are_one_line_before_the_task(flags, match, tmp_path, capsys,
                                                          monkeypatch):
    def no_task(**_):
        raise AssertionError("the task was loaded before validation")

    monkeypatch.setattr("ntk_tt.prediction._job.load_task", no_task)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["predict", "--no-progress", "-K", "3", "-n", "8", "--figure", "", "--loss", "mse",
              "--subset", str(CLI_SUBSET), *flags])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("ntk-tt: error:") and match in err, err
    assert not list(tmp_path.iterdir())
