"""``ntk-tt predict --optimizer/--schedule/...`` (issue 27 item 1): bad flags are one line before
JAX is imported; a tiny ``--verify`` run with AdamW + warmup-cosine predicts what
``ntk_tt.predict(optimizer=)`` predicts and fine-tunes what ``ntk_tt.finetune(optimizer=)``
trains with the same optimiser; constant-η SGD keeps the numbers of the constant-η keywords."""

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from _cli_tiny import cli_before_jax, tiny_task

import ntk_tt
from ntk_tt.cli import main
from ntk_tt.prediction import _job

ROOT = str(Path(__file__).resolve().parents[1])  # on PYTHONPATH of the programs run

BEFORE_JAX = [
    (["--optimizer", "adam", "-m", "0.9"], "momentum (-m) and nesterov (--nesterov) are SGD's"),
    (["--b1", "0.5"], "b1 (--b1) is Adam's: use it with --optimizer adam or adamw (SGD's "
                      "momentum is -m), or drop it."),
    # a fresh user: ε's refusal named SGD's momentum, which only β₁ has a twin in
    (["--adam-eps", "1e-3"], "adam_eps (--adam-eps) is Adam's: use it with --optimizer adam or "
                             "adamw, or drop it."),
    (["--optimizer", "adamw", "--b2", "1"], "b2 (--b2) must be a finite number in [0, 1)"),
    # a fresh user: --b2 0.99999999 (1.0 in float32) printed κ = inf, then blamed the data;
    # --b1 0.99999999 was refused as SGD's "momentum"
    (["--optimizer", "adamw", "--b2", "0.99999999"], "b2 (--b2) must be a finite number in "
                                                     "[0, 1) and at most 0.99999994"),
    (["--optimizer", "adamw", "--b1", "0.99999999"], "b1 (--b1) must be a finite number in "
                                                     "[0, 1) and at most 0.99999994"),
    (["--optimizer", "adamw", "--adam-eps", "0"], "adam_eps (--adam-eps) must be a finite"),
    (["--schedule", "exponential"], "needs decay_rate (--decay-rate R in (0, 1]"),
    (["--schedule", "exponential", "--decay-rate", "1.5"],
     "decay_rate (--decay-rate) must be a finite number in (0, 1]"),
    (["--schedule", "warmup-cosine", "--warmup", "200"],
     "warmup (--warmup) 200 must be <= decay_end (--decay-end; default T, the -T steps) 150"),
    (["--schedule", "warmup-stable-decay", "--warmup", "5", "--decay-start", "3"],
     "decay_start (--decay-start) 3 must be in [warmup, decay_end] = [5, 150]"),
    (["--warmup", "5"], "warmup (--warmup) applies to --schedule warmup-cosine or"),
    (["--schedule", "warmup-cosine", "--decay-rate", "0.9"],
     "decay_rate (--decay-rate) applies to --schedule exponential only"),
    (["--schedule", "warmup-cosine", "--end-lr", "0.01"],
     "end_lr (--end-lr) must be a finite number in [0, --lr = 0.002]"),
    (["--schedule", "warmup-cosine", "--warmup", "1", "-T", "1"],
     "warmup (--warmup) 1 must be < steps (-T) 1: the run would end before η reaches --lr"),
    (["--schedule", "warmup-cosine", "--warmup", "200", "--decay-end", "300"],
     "warmup (--warmup) 200 must be < steps (-T) 150: the run would end before η reaches"),
    (["--schedule", "warmup-stable-decay", "--warmup", "150", "--decay-end", "400"],
     "warmup (--warmup) 150 must be < steps (-T) 150: the run would end before η reaches"),
    (["--optimizer", "adamw", "--l2"], "l2 (--l2) applies to --optimizer sgd only"),
    (["--l2"], "l2 (--l2) puts the weight decay into the loss: give weight_decay"),
    (["--optimizer", "adam", "--weight-decay", "0.01"], "use --optimizer adamw"),
    (["--weight-decay", "-1"], "weight_decay (--weight-decay) must be a finite number >= 0"),
    (["--optimizer", "adamw", "--method", "ode"],
     "method (--method) 'ode' takes --optimizer sgd only: --optimizer adamw has no"),
    (["--optimizer", "adamw", "--schedule", "warmup-cosine", "--loss", "mse", "--subset",
      "100"], "subset (--subset) predicts --optimizer sgd only: --optimizer adamw's"),
    (["--optimizer", "adamw", "--segments", "2"], "segments (--segments) re-linearises"),
    (["--optimizer", "adamw", "--predictor", "linear"],
     "by the head-aware predictor only (Adam has no frozen-kernel form): drop --predictor "
     "linear."),
    (["--optimizer", "adam", "--kernel", "sketch"],
     "by the head-aware predictor only (Adam has no frozen-kernel form): drop --kernel sketch."),
    (["--backbone", "subspace", "--segments", "2"],
     "backbone (--backbone) subspace is not re-linearised"),
    (["--subspace-dim", "8", "--segments", "2"],
     "with segments > 1 (--segments) the default feature kernel is the isotropic one"),
    (["--subspace-dim", "8", "--backbone", "isotropic"],
     "subspace_dim (--subspace-dim) sets the k of the subspace and diagonal backbones "
     "(backbone='subspace' or 'diagonal', --backbone) only, got backbone 'isotropic'"),
    (["--subspace-dim", "8", "--predictor", "linear"],
     "--subspace-dim 8 applies to the head-aware predictor only"),
    (["--backbone", "diagonal", "--segments", "2"],
     "backbone (--backbone) diagonal is not re-linearised"),
    # a fresh user: this refusal sent them to --predictor head_aware, which then refused
    # --kernel sketch; it now names what chose the linear predictor
    (["--backbone", "subspace", "--kernel", "sketch"],
     "--backbone subspace applies to the head-aware predictor only, and --kernel sketch selects "
     "the linear predictor (only it has that option): drop --backbone subspace, or drop "
     "--kernel sketch"),
    (["--optimizer", "adamw", "--kernel", "traced"],
     "--optimizer adamw is predicted by the head-aware predictor only (Adam has no frozen-kernel "
     "form): drop --kernel traced."),
    (["--backbone", "subspace", "--subspace-dim", "0"],
     "subspace_dim (--subspace-dim) must be an int >= 1"),
]


def test_bad_optimizer_flags_are_one_line_before_jax_is_imported(tmp_path):
    """One fresh interpreter runs every case: status 2, one ``ntk-tt: error:`` line naming
    the flag, and ``jax`` still not imported after it."""
    cases = [["predict", *args] for args, _ in BEFORE_JAX]
    results, lines, stderr = cli_before_jax(cases, tmp_path)
    assert len(lines) == len(BEFORE_JAX), stderr  # one line per case, nothing else
    for (args, match), (status, jax_imported), line in zip(BEFORE_JAX, results, lines,
                                                           strict=True):
        assert status == 2 and jax_imported is False, (args, status)
        assert line.startswith("ntk-tt: error: ") and match in line, (args, line)
    assert not list(tmp_path.iterdir())  # nothing written


def test_predict_task_refuses_an_unknown_optimizer_before_loading(monkeypatch, tmp_path):
    def refuse(**_):
        raise AssertionError("work started before the options were checked")

    monkeypatch.setattr("ntk_tt.prediction._job.load_task", refuse)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"optimizer \(--optimizer\) must be one of"):
        ntk_tt.predict_task(optimizer="rmsprop")
    with pytest.raises(ValueError, match=r"schedule \(--schedule\) must be one of"):
        ntk_tt.predict_task(schedule="cosine")


def test_job_optimizer_schedules_against_optax_and_numpy():
    """The options → Optimizer map: η_t of each schedule against optax / a numpy formula, the
    peak = --lr, the horizon = T unless --decay-end, WSD's default decay start (the last
    20 %), adamw's default λ, SGD's --l2, Adam's β defaults."""
    from ntk_tt.prediction._job_optimizer import job_optimizer

    base = _job.DEFAULTS | dict(steps=20, learning_rate=0.1)
    t = np.arange(20)
    opt = job_optimizer(base | dict(optimizer="adamw", schedule="warmup_cosine", warmup=4))
    want = optax.warmup_cosine_decay_schedule(0.0, 0.1, 4, 20, 0.0)(t)
    np.testing.assert_allclose(opt.learning_rates(20), want, rtol=1e-5, atol=1e-8)
    assert (opt.rule, opt.decoupled, float(opt.weight_decay)) == ("adam", True,
                                                                  pytest.approx(1e-4))
    assert float(opt.momentum) == pytest.approx(0.9) and float(opt.b2) == pytest.approx(0.999)
    opt = job_optimizer(base | dict(schedule="warmup_stable_decay", warmup=2, end_lr=0.01,
                                    decay_end=15, weight_decay=0.5, l2=True, momentum=0.5,
                                    batch_size=5))
    start = 12  # floor(0.8 · 15): decays over steps 12-15, then 0.01
    eta = np.minimum(t / 2, 1) * 0.1 + (0.01 - 0.1) * np.clip((t - start) / (15 - start), 0, 1)
    np.testing.assert_allclose(opt.learning_rates(20), eta, rtol=1e-5, atol=1e-8)
    assert (opt.rule, opt.decoupled, opt.batch_size) == ("sgd", False, 5)
    assert float(opt.weight_decay) == 0.5 and float(opt.momentum) == 0.5
    opt = job_optimizer(base | dict(schedule="exponential", decay_rate=0.9, optimizer="adam",
                                    b1=0.8))
    np.testing.assert_allclose(opt.learning_rates(20),
                               optax.exponential_decay(0.1, 1, 0.9)(t), rtol=1e-5)
    assert (opt.decoupled, float(opt.weight_decay)) == (False, 0.0)
    assert float(opt.momentum) == pytest.approx(0.8)


STEPS, LR, WARMUP, DECAY = 12, 0.05, 3, 0.01


@pytest.fixture(scope="module")
def task():
    return tiny_task()


def _cli(task, folder, args):
    """``ntk-tt predict`` on the tiny task (the job's own code from the task on) in
    ``folder``: (exit status, stdout, the JSON report, the figure titles drawn)."""
    titles = []

    def figure(path, pred, run, title, overwrite):
        titles.append(title)
        return real_figure(path, pred, run, title, overwrite=overwrite)

    real_figure = _job.figure
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("ntk_tt.prediction._job.load_task", lambda **_: task)
        mp.setattr("ntk_tt.prediction._job.figure", figure)
        mp.chdir(folder)
        with contextlib.redirect_stdout(io.StringIO()) as out:
            code = main(["predict", "--no-progress", "-K", "3", "-n", "8", "--test-per-class",
                         "2", "--json", "r.json", *args])
    return code, out.getvalue(), json.loads((folder / "r.json").read_text()), titles


ADAMW = ["-T", str(STEPS), "--lr", str(LR), "--optimizer", "adamw", "--schedule",
         "warmup-cosine", "--warmup", str(WARMUP), "--weight-decay", str(DECAY)]


@pytest.fixture(scope="module")
def adamw_run(task, tmp_path_factory):
    """One tiny ``--verify`` run with AdamW (decoupled λ) and a warmup-cosine schedule (GD:
    the batch size is the options → Optimizer map's, tested above)."""
    return _cli(task, tmp_path_factory.mktemp("adamw"), ["--verify", *ADAMW, "--figure",
                                                         "f.png"])


def _curves(side):
    return {k: np.array([np.nan if v is None else v for v in side[k]]) for k in side}


def test_adamw_verify_run_is_predict_and_finetune_with_that_optimizer(task, adamw_run):
    apply_fn, params, x, y, xt, yt, _, head = task
    code, _, r, _ = adamw_run
    assert code == 0 and r["status"] == "complete"
    opt = ntk_tt.adamw(ntk_tt.warmup_cosine(LR, WARMUP, STEPS), weight_decay=DECAY)
    key = jax.random.fold_in(jax.random.key(0), 2)  # the job's key for seed 0
    pred = ntk_tt.predict(apply_fn, params, x, y, optimizer=opt, steps=STEPS, key=key,
                          x_test=xt, y_test=yt, head=head)
    run = ntk_tt.finetune(apply_fn, params, x, y, optimizer=opt, steps=STEPS, key=key,
                          x_test=xt, y_test=yt)
    got_pred, got_real = _curves(r["curves"]["predicted"]), _curves(r["curves"]["real"])
    for name in ("loss", "error"):
        np.testing.assert_array_equal(got_pred[name], np.asarray(getattr(pred, name), float))
        np.testing.assert_array_equal(got_real[name], np.asarray(getattr(run, name), float))
    assert got_real["loss"][-1] < 0.9 * got_real["loss"][0]  # it trained
    assert r["predicted"]["kernel"] == "head_aware_adam:diagonal"  # the default since session 35


def test_adamw_run_records_and_names_its_optimizer(adamw_run):
    code, out, r, titles = adamw_run
    h = r["optimizer"]
    assert r["config"]["optimizer"] == "adamw" and r["config"]["schedule"] == "warmup_cosine"
    assert (h["optimizer"], h["schedule"], h["batch_size"]) == ("adamw", "warmup_cosine", 24)
    assert h["weight_decay"] == pytest.approx(DECAY) and h["decoupled"] is True
    assert h["schedule_parameters"] == pytest.approx(
        {"peak": LR, "warmup": WARMUP, "decay_steps": STEPS, "init": 0.0, "end": 0.0,
         "smoothing": 0.0})
    etas = optax.warmup_cosine_decay_schedule(0.0, LR, WARMUP, STEPS, 0.0)(np.arange(STEPS))
    assert h["learning_rate_mean"] == pytest.approx(float(np.mean(etas)), rel=1e-5)
    assert r["predicted"]["hyperparameters"]["optimizer"] == "adamw"
    words = (f"adamw (β₁ 0.9, β₂ 0.999, ε 1e-08), weight decay {DECAY:g} decoupled, B = "
             f"24; warmup_cosine: η 0 → {LR:g} over {WARMUP} steps, cosine to 0 at step "
             f"{STEPS}")
    assert f"optimiser: {words}; weight travel ρ = {h['weight_travel']:.2g}" in out.splitlines()
    assert titles == [f"tiny K=3 n=8 {words.replace('B = ', 'B=').replace('; ', chr(10))}"]


def test_adamw_run_reports_its_weight_travel_and_warns_beyond_the_linear_regime(task,
                                                                              adamw_run):
    """ρ = Σ η_t / rms(θ_0) of the backbone in the report; beyond ``LINEAR_TRAVEL`` the
    prediction's LinearRegimeWarning is a "warning:" line and in ``predicted.warnings``."""
    from ntk_tt.dynamics._regime import LINEAR_TRAVEL

    code, out, r, _ = adamw_run
    opt = ntk_tt.adamw(ntk_tt.warmup_cosine(LR, WARMUP, STEPS), weight_decay=DECAY)
    rho = ntk_tt.weight_travel(opt.learning_rates(STEPS), task[-1][1])
    assert r["predicted"]["hyperparameters"]["weight_travel"] == pytest.approx(rho, rel=1e-6)
    assert r["optimizer"]["weight_travel"] == pytest.approx(rho, rel=1e-6)  # beside its rule
    assert rho > LINEAR_TRAVEL  # this run is beyond the regime
    said = [w for w in r["predicted"]["warnings"] if w.startswith("Adam's schedule")]
    assert len(said) == 1 and f"ρ = Σ η_t / rms(θ_0) = {rho:.2g}" in said[0]
    assert f"warning: {said[0]}" in out.splitlines()
    # κ is printed with what it is for Adam (a fresh user read it as Adam's stability)
    line = next(ln for ln in out.splitlines() if ln.startswith("prediction: "))
    kappa = r["predicted"]["kappa"]
    assert f"κ = η·λ_max/N = {kappa:.3g} (plain GD's number: Adam's edge is its weight " \
        "travel ρ); " in line


def test_suggest_adamw_reports_the_choices_weight_travel(task, tmp_path):
    """``ntk-tt suggest --optimizer adamw``: the suggestion's ρ (its schedule over T_max, the
    backbone's θ_0) in the JSON report, and a warning line beyond ``LINEAR_TRAVEL``."""
    from ntk_tt.dynamics._regime import LINEAR_TRAVEL

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("ntk_tt.prediction._job.load_task", lambda **_: task)
        mp.chdir(tmp_path)
        with contextlib.redirect_stdout(io.StringIO()) as out:
            main(["suggest", "--no-progress", "-K", "3", "-n", "8", "-T", "10",
                  "--optimizer", "adamw", "--num-kappas", "2", "--lr-min", "0.05",
                  "--lr-max", "0.1", "--warmups", "0", "--refine-steps", "0", "--target",
                  "0.9", "--json", "s.json"])
    r = json.loads((tmp_path / "s.json").read_text())
    s = r["suggestion"]
    peak = s["learning_rate"]
    etas = optax.cosine_decay_schedule(peak, 10)(np.arange(10))
    rho = ntk_tt.weight_travel(etas, task[-1][1])
    assert s["weight_travel"] == pytest.approx(rho, rel=1e-5) and rho > LINEAR_TRAVEL
    assert any(line.startswith("  warning: Adam's schedule lets the backbone's weights move "
                               f"by up to ρ = {rho:.2g}") for line in out.getvalue().splitlines())


def test_python_suggest_adamw_records_the_travel_and_warns(task):
    """A second fresh user: ``ntk_tt.suggest(optimizer=adamw(...))`` chose peak 0.1 (ρ ≈ 5)
    and said nothing; it now records ``Suggestion.weight_travel`` and warns beyond 0.07."""
    apply_fn, params, x, y, _, _, _, head = task
    opt = ntk_tt.adamw(ntk_tt.warmup_cosine(1e-3, 0, 10), weight_decay=0.01)
    with pytest.warns(ntk_tt.LinearRegimeWarning, match="beyond the linearised regime") as got:
        s = ntk_tt.suggest(apply_fn, params, x, y, head=head, optimizer=opt, target=0.9,
                           target_kind="fraction", steps=10, num_kappas=2, warmups=(0.0,),
                           learning_rate_range=(0.05, 0.1), refine_steps=0)
    assert got[0].filename == __file__
    etas = optax.cosine_decay_schedule(s.learning_rate, 10)(np.arange(10))
    assert s.weight_travel == pytest.approx(ntk_tt.weight_travel(etas, head[1]), rel=1e-5)


@pytest.mark.parametrize("momentum, noted", [("0.95", True), ("0", False)])
def test_suggest_notes_an_effective_kappa_beyond_the_benchmark_grid(task, tmp_path, momentum,
                                                                    noted):
    """The issue's complaint: suggest picks configurations near the stability edge, where the
    predictor is least tested. A suggestion with κ̃ = κ/(1 − m) > 12 (here κ ∈ [1, 1.9] with
    m = 0.95: κ̃ = 20-38) says so; with m = 0 (κ̃ <= 1.9) it does not."""
    from ntk_tt.analysis._suggest_report import TESTED_KAPPA

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("ntk_tt.prediction._job.load_task", lambda **_: task)
        mp.chdir(tmp_path)
        with contextlib.redirect_stdout(io.StringIO()) as out:
            main(["suggest", "--no-progress", "-K", "3", "-n", "8", "-T", "20", "-m",
                  momentum, "-B", "N", "--kappa-min", "1", "--kappa-max", "1.9",
                  "--num-kappas", "2", "--refine-steps", "0", "--target", "0.9", "--json",
                  "s.json"])
    s = json.loads((tmp_path / "s.json").read_text())["suggestion"]
    keff = s["kappa"] / (1 - s["momentum"])
    assert (keff > TESTED_KAPPA) == noted
    said = [line for line in out.getvalue().splitlines() if line.startswith("  note: its "
                                                                            "effective κ̃")]
    assert said == ([f"  note: its effective κ̃ = κ/(1 − m) = {keff:.3g} is beyond the "
                     "benchmark sweep's main grid (κ̃ <= 12; T_ε p95 30-37 % at κ̃ = 12, larger "
                     "κ̃ checked for divergence only): check it with a real run (the verify "
                     "line)"] if noted else [])


@pytest.fixture(scope="module")
def sgd_runs(task, tmp_path_factory):
    """Prediction-only runs: the default (constant-η SGD) and the same spelled out."""
    args = ["-T", "6", "--lr", "0.5", "-m", "0.5", "--nesterov", "-B", "8", "--num-paths",
            "2", "--figure", ""]
    return (_cli(task, tmp_path_factory.mktemp("default"), args),
            _cli(task, tmp_path_factory.mktemp("spelled"),
                 [*args, "--optimizer", "sgd", "--schedule", "constant"]))


def test_constant_sgd_spelled_out_is_the_default_run_and_the_shorthand(task, sgd_runs):
    """``--optimizer sgd --schedule constant`` is the default run, whose predicted curves are
    exactly those of ``ntk_tt.predict``'s constant-η keywords (the job before optimizers)."""
    apply_fn, params, x, y, xt, yt, _, head = task
    (c1, out1, default, _), (c2, out2, spelled, _) = sgd_runs
    assert c1 == c2 == 0
    for side in ("curves", "optimizer"):
        assert default[side] == spelled[side]
    for name in ("training_time", "kappa", "hyperparameters", "test_accuracy", "interval_90"):
        assert default["predicted"][name] == spelled["predicted"][name]
    pred = ntk_tt.predict(apply_fn, params, x, y, learning_rate=0.5, momentum=0.5,
                          nesterov=True, batch_size=8, steps=6, num_paths=2, x_test=xt,
                          y_test=yt, head=head, key=jax.random.fold_in(jax.random.key(0), 2))
    got = _curves(default["curves"]["predicted"])
    for name in ("loss", "error"):
        np.testing.assert_array_equal(got[name], np.asarray(getattr(pred, name), float))
    h = default["optimizer"]
    assert (h["optimizer"], h["schedule"], h["nesterov"], h["batch_size"]) == (
        "sgd", "constant", True, 8)
    assert "optimiser: sgd (m 0.5, Nesterov), B = 8; constant: η 0.5" in out1.splitlines()


def test_adamw_prediction_only_times_a_real_adamw_step(task, adamw_run, tmp_path):
    """Without --verify the wall clock is T_ε × the measured time of a real AdamW step; the
    prediction is the --verify run's."""
    code, _, r, _ = _cli(task, tmp_path, [*ADAMW, "--figure", ""])
    assert code == 0 and r["real"] is None and r["figure"] is None
    assert r["curves"]["predicted"] == adamw_run[2]["curves"]["predicted"]
    sps = r["predicted"]["seconds_per_step"]
    assert 0 < sps < 10
    for eps, t in r["predicted"]["training_time"]["loss"].items():
        wall = r["predicted"]["wall_clock"]["loss"][eps]
        assert (t is None and wall is None) or wall == pytest.approx(t * sps)
    assert r["predicted"]["training_time"]["loss"]["0.4"] is not None


def test_suggest_adamw_with_the_linear_predictor_speaks_cli(tmp_path):
    """A fresh user's probe: ``ntk-tt suggest --optimizer adamw --predictor linear`` said
    "pass head=ntk_tt.split_head(model) ..., not predictor='linear'" (the API's words); it
    says which flag to drop, in one line, before JAX is imported."""
    code = ("import sys\nfrom ntk_tt.cli import main\n"
            "try:\n    main(['suggest', '--optimizer', 'adamw', '--predictor', 'linear'])\n"
            "except SystemExit as e:\n    print(e.code, 'jax' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=os.environ | {"PYTHONPATH": ROOT}, cwd=tmp_path)
    assert proc.stdout.split() == ["2", "False"], proc.stderr
    assert proc.stderr == ("ntk-tt: error: predictor (--predictor) linear cannot predict AdamW "
                           "(Adam has no frozen-kernel form): drop --predictor linear (AdamW "
                           "needs the head-aware predictor, the default).\n")
    assert not list(tmp_path.iterdir())


def test_decay_flags_help_says_their_defaults_in_words(capsys, monkeypatch):
    """--decay-end's help read "(None: T, -T)", then "(None: T = -T, the last step)"; it says
    the default is the run's last step (the -T flag), and
    --decay-start's says the default decay is the last 20 % of it."""
    monkeypatch.setenv("COLUMNS", "400")  # one line per flag: no break inside a flag name
    with pytest.raises(SystemExit):
        main(["predict", "-h"])
    text = " ".join(capsys.readouterr().out.split())
    assert "reaches --end-lr (None: the run's last step, -T)" in text
    assert "(None: 80 % of --decay-end rounded down, at least --warmup: the last 20 % decays)" \
        in text
    assert "(None: T, -T)" not in text and "T = -T" not in text
