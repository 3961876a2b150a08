"""``experiments/kernel_evolution.py`` and ``extrapolate.py`` refuse bad arguments in one line
before any kernel is built (a fresh user's ``--kappas -1`` and ``--momenta 1.0`` built the
kernel and trained for real, then failed with a traceback about a learning rate they never
passed; extrapolate's ``--per-class -1`` was blamed on N', its ``--kappas 0`` failed after the
kernel)."""

import re

import pytest
from _scripts import EXPERIMENTS, experiment_script, refused

ke = experiment_script("kernel_evolution")
ex = experiment_script("extrapolate")
BASE = ["--datasets", "flowers5", "--per-class", "10", "--kappas", "12", "--momenta", "0",
        "--steps", "10", "--checkpoints", "0", "10", "--subset", "10"]


@pytest.mark.parametrize("extra, said", [
    (["--kappas", "-1"], r"kappas \(--kappas\) must be finite numbers > 0"),
    (["--momenta", "1.0"], r"momenta \(--momenta\) must lie in \[0, 1\)"),
    (["--per-class", "0"], r"per_class \(--per-class\) must be integers >= 1"),
    (["--steps", "0"], r"steps \(--steps\) must be >= 1"),
    (["--datasets", "nosuch"], r"--datasets nosuch: not a target set here; known: .*flowers5"),
    (["--subset", "1000"], r"--subset must be in \[1, N\] = \[1, 50\]"),
    (["--feature-kernel-kappas", "7"], r"must be among --kappas \[12.0\]"),
    (["--checkpoints", "0", "-3", "10"], r"include 0 and lie in \[0, --steps\] = \[0, 10\]"),
    (["--checkpoints", "5", "10"], r"--checkpoints must include 0"),
])
def test_bad_arguments_are_one_line_before_any_work(extra, said, capsys, monkeypatch):
    monkeypatch.setattr(ke, "run_dataset", lambda *a: pytest.fail("work began"))
    line = refused(ke, BASE + extra, capsys)
    assert line.startswith("kernel_evolution.py: error: ")
    assert re.search(said, line), line


def test_the_default_feature_kernel_kappas_are_those_of_the_grid():
    """--kappas 12 alone: the default K_h,T runs are κ̃ = 12's (4 is not in the grid), not an
    error; the arguments of the committed run keep 4 and 12."""
    args = ke.argparse.Namespace(datasets=["flowers5"], per_class=10, seed=0, kappas=[12.0],
                                 momenta=[0.0], steps=10, checkpoints=[0, 10], subset=10,
                                 feature_kernel_kappas=None)
    ke.check_args(None, args)
    assert args.feature_kernel_kappas == [12.0]
    args.kappas, args.feature_kernel_kappas = [1.0, 4.0, 12.0], None
    ke.check_args(None, args)
    assert args.feature_kernel_kappas == [4.0, 12.0]


EX_BASE = ["--out", "unused.csv", "--dataset", "flowers5", "--classes", "5", "--per-class",
           "20", "--subsets", "25", "--seeds", "1", "--kappas", "1", "--steps", "20"]


@pytest.mark.parametrize("extra, said", [
    (["--per-class", "-1"], r"--per-class must be an integer >= 2, got -1"),
    (["--kappas", "0"], r"--kappas must be finite numbers > 0 .*got 0"),
    (["--kappas", "1,x"], r"--kappas must be comma-separated numbers"),
    (["--steps", "0"], r"--steps must be an integer >= 1"),
    (["--seeds", "-2"], r"--seeds must be integers >= 0"),
    (["--dataset", "nosuch"], r"--dataset nosuch: not a target set here; known: .*flowers5"),
    (["--subsets", "23"], r"N' = 23 \(--subsets\) must be a multiple of K = 5 .*\[5, 100\)"),
    (["--subsets", "100"], r"N' = 100 .*\[5, 100\)"),
])
def test_extrapolate_refuses_bad_arguments_before_any_work(extra, said, capsys, monkeypatch):
    monkeypatch.setattr(ex.ntk_tt, "load_checkpoint", lambda *a: pytest.fail("work began"))
    line = refused(ex, EX_BASE + extra, capsys)
    assert line.startswith("extrapolate: error: ") and re.search(said, line), line


def test_subset_check_names_missing_target_sets_before_any_work(capsys, tmp_path):
    sc = experiment_script("subset_check")
    line = refused(sc, ["--datasets", "flowers5,nosuch", "--out", str(tmp_path / "o")], capsys)
    assert line.startswith("subset_check.py: error: target sets nosuch are not here (known: ")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name, argv, work", [
    ("closing_note", ["--out", "{nodir}/x.csv"], "load_task"),
    ("bench_cost", ["--csv", "{nodir}/x.csv"], "load_task"),
    ("divergence_rules", ["--out", "{nodir}/x.csv"], "corpus_frame"),
    ("adam_travel_edge", ["--out", "{nodir}/x.json"], "warmup_cosine"),
    ("relinearise", ["row", "--csv", "{nodir}/x.csv"], "read_table"),
    ("bench_ntk", ["--csv", "{nodir}/x.csv", "--nets", "cnn"], "pretrain"),
])
def test_an_output_in_a_missing_folder_is_refused_before_the_work(name, argv, work, tmp_path,
                                                                  capsys, monkeypatch):
    """A fresh user's closing_note.py --out into a missing folder built its kernel, predicted
    and fine-tuned for 73 s, then failed in pandas and lost everything; five more scripts
    wrote only at the end. Now the folder is checked first."""
    module = experiment_script(name)
    target = module.ntk_tt if work == "warmup_cosine" else module
    monkeypatch.setattr(target, work, lambda *a, **k: pytest.fail("work began"))
    nodir = tmp_path / "nodir"
    line = refused(module, [a.format(nodir=nodir) for a in argv], capsys)
    flag = "--out" if "--out" in argv else "--csv"  # (prog is pytest's here, the script's run)
    assert line.split(": error: ")[1] == (f"{flag} path "
                    f"'{nodir}/x.{'json' if name == 'adam_travel_edge' else 'csv'}': folder "
                    f"'{nodir}' does not exist; create it first or choose another path.")


def test_closing_note_checks_steps_and_learning_rate_before_the_kernel(capsys, monkeypatch,
                                                                        tmp_path):
    """--steps 0 and --lr -1 failed after the kernel (50 s), and the jitted predictor took
    η = −1 without a word (traced values are not refused: NaN)."""
    module = experiment_script("closing_note")
    monkeypatch.setattr(module, "load_task", lambda *a, **k: pytest.fail("work began"))
    out = ["--out", str(tmp_path / "x.csv")]
    assert refused(module, out + ["--steps", "0"], capsys).endswith(
        ": error: --steps must be an integer >= 1, got 0.")
    assert refused(module, out + ["--lr", "-1"], capsys).endswith(
        ": error: --lr must be a finite number > 0, got -1.0.")


@pytest.mark.parametrize("extra, said", [
    (["--lr", "-1"], "--lr must be a finite number > 0, got -1.0."),
    (["--epochs", "0"], "--epochs must be an integer >= 1, got 0."),
    (["--batch-size", "0"], "--batch-size must be an integer >= 1, got 0."),
    (["--widths", "16,abc"], "--widths takes a comma list of integers >= 1, got '16,abc'."),
])
def test_pretrain_refuses_bad_hyperparameters_before_loading_data(extra, said, tmp_path,
                                                                   capsys, monkeypatch):
    """A fresh user's --lr -1 trained and saved a checkpoint (exit 0); --epochs 0 and
    --batch-size 0 were optax / ZeroDivision tracebacks after the data loaded."""
    module = experiment_script("pretrain")
    monkeypatch.setattr(module, "load_dataset", lambda *a, **k: pytest.fail("work began"))
    line = refused(module, ["--out", str(tmp_path / "ck"), *extra], capsys)
    assert line.split(": error: ")[1] == said
    assert not (tmp_path / "ck").exists()


def test_pretrain_names_an_unknown_data_set_and_a_batch_larger_than_it(tmp_path, capsys):
    module = experiment_script("pretrain")
    line = refused(module, ["--out", str(tmp_path / "ck"), "--dataset", "nosuch"], capsys)
    assert "nosuch" in line.split(": error: ")[1]
    line = refused(module, ["--out", str(tmp_path / "ck"), "--dataset", "flowers5",
                            "--test-dataset", "flowers5", "--batch-size", "100000"], capsys)
    assert line.split(": error: ")[1].startswith("--batch-size 100000 exceeds the ")


@pytest.mark.parametrize("name, argv, said", [
    ("feature_subspace", ["--per-class", "-5"],
     "no row of the committed table has --per-class [-5]: pick values of its grid."),
    ("subspace_bases", ["--per-class", "0"],
     "no row of the committed table has --per-class [0]: pick values of its grid."),
    ("state_split", ["--per-class", "7"], "no row of the committed table has --per-class 7 "
     "and --kappas [4.0, 12.0] among its GD rows: pick values of its grid."),
    ("subspace_preset", ["--per-class", "7"], "has --per-class [7]: pick values of its grid."),
    ("subspace_preset", ["--json", "{tmp}/s.json"],
     "--json writes the report's figures: it needs --report."),
    ("backbone_order", ["--summary", "{tmp}/s.json"],
     "--summary writes the report's summary: it needs --report."),
    ("backbone_order", ["--kappas", "-1"], "--kappas [-1.0]: pick values of its grid."),
    ("backbone_order", ["bogus_row"], ": bogus_row"),
])
def test_a_selection_of_nothing_or_a_report_option_without_report_is_refused(
        name, argv, said, tmp_path, capsys):
    """A fresh user's --per-class 7 or --kappas -1 exited 0 without a word (some scripts
    leaving an empty --out file), and --summary / --json without --report were ignored while
    the whole default run started. Now one line, exit 2, and no --out file."""
    module = experiment_script(name)
    out = tmp_path / "rows.jsonl"
    with pytest.raises(SystemExit) as ended:
        module.main(["--out", str(out), *[a.format(tmp=tmp_path) for a in argv]])
    err = capsys.readouterr().err.strip().splitlines()
    assert ended.value.code == 2 and len(err) == 1 and err[0].endswith(said), err
    assert not out.exists()


@pytest.mark.parametrize("extra, said", [
    (["--lr", "-1"], "--lr must be a finite number > 0, got -1.0."),
    (["--lr", "nan"], "--lr must be a finite number > 0, got nan."),
    (["--steps", "0"], "--steps must be an integer >= 1, got 0."),
    (["--per-class", ""], "--per-class takes a comma list of integers >= 1, got []."),
    (["--per-class", "0"], "--per-class takes a comma list of integers >= 1, got [0]."),
    (["--dataset", "flowers5"], "--dataset flowers5 has 5 classes; scale.py samples K = 10."),
    (["--dataset", "bogus"], "--dataset bogus: not a target set here; known: "),
])
def test_scale_checks_its_arguments_before_the_pilot_and_config(extra, said, tmp_path,
                                                                 monkeypatch, capsys):
    """A fresh user's --lr -1 and --steps 0 wrote config.json (after a 16 s pilot for the
    latter) and failed in the child process with two tracebacks; --per-class 0 was blamed on
    --subset; a 5-class --dataset failed in the child. One line, exit status 2 (it was 1)."""
    module = experiment_script("scale")
    monkeypatch.setattr(module, "_pilot_lr", lambda *a: pytest.fail("work began"))
    out = tmp_path / "sc"
    base = ["--out", str(out), "--per-class", "20", "--subset", "100", "--methods", "nystrom",
            "--full-per-class", ""]
    with pytest.raises(SystemExit) as ended:
        module.main(base + extra)
    err = capsys.readouterr().err.splitlines()
    assert ended.value.code == 2 and len(err) == 1, (ended.value.code, err)
    assert err[0].startswith(f"scale.py: error: {said}"), err
    assert not out.exists()


def test_evolving_check_checks_segments_and_rows_before_loading_the_task(capsys, monkeypatch):
    """--segments 0 failed after the data and a one-segment prediction (26 s), a config id
    not in the table was a KeyError after the data loaded."""
    module = experiment_script("evolving_check")
    monkeypatch.setattr(module, "load_task", lambda *a, **k: pytest.fail("work began"))
    table = ["--table", str(EXPERIMENTS / "results" / "sweep")]
    line = refused(module, ["flowers5_300pc", "50", "bN-m0-kappa1", "--segments", "0", *table],
                   capsys)
    assert line.endswith(": error: --segments must be an integer >= 1, got 0.")
    line = refused(module, ["flowers5", "10", "bogus_cfg", *table], capsys)
    assert line.endswith(f": error: rows not in {table[1]}: "
                         "flowers5-k5-n10-s0__bogus_cfg (configuration ids such as "
                         "bN-m0-kappa12 of a task it holds).")


@pytest.mark.parametrize("argv, said", [
    (["--datasets", "bogus"], "no row of the committed table has --datasets ['bogus'], "),
    (["--kappas", "-1"], "--kappas [-1.0] and --configs"),
    (["--steps", "-5"], "--steps must be an integer >= 1, got -5."),
    (["--report"], "rows, which does not exist: run without --report first."),
])
def test_error_budget_checks_its_arguments_before_any_work(argv, said, tmp_path, capsys,
                                                           monkeypatch):
    """--datasets bogus and --kappas -1 were a KeyError (an empty selection read as columns),
    --steps -5 a traceback after the kernel, --report on a missing folder a pandas error."""
    module = experiment_script("error_budget")
    monkeypatch.setattr(module, "collect", lambda *a: pytest.fail("work began"))
    out = tmp_path / "eb"
    line = refused(module, ["--out", str(out), *argv], capsys)
    assert said in line.split(": error: ")[1], line
    assert not out.exists()
    (tmp_path / "file").write_text("")
    line = refused(module, ["--out", str(tmp_path / "file")], capsys)
    assert line.endswith("file is a file; give a folder (it holds rows/ and the table).")


@pytest.mark.parametrize("argv, said", [
    (["--steps", "0"], "--steps must be an integer >= 1, got 0."),
    (["--peak", "-1"], "peak must be > 0"),
    (["--per-class", "0"], "--per-class must be an integer >= 1, got 0."),
    (["--batch-size", "-3"], "--batch-size must be an integer >= 0, got -3."),
    (["--warmup", "200", "--steps", "10"], "--warmup must be in [0, --steps) = [0, 10), got 200."),
    (["--batch-size", "500"], "--batch-size 500 exceeds N = 5 × --per-class = 100"),
])
def test_optimizer_example_checks_its_arguments_before_loading_data(argv, said, capsys,
                                                                    monkeypatch):
    """Every bad value was a library traceback after the data loaded, in the library's names
    ("decay_steps (0.0) must be >= warmup (10.0)" for --steps 0)."""
    module = experiment_script("optimizer_example")
    monkeypatch.setattr(module, "load_task", lambda *a, **k: pytest.fail("work began"))
    assert said in refused(module, argv, capsys).split(": error: ")[1]


@pytest.mark.parametrize("argv, said", [
    (["--per-class", "7"], "no task of "),
    (["--num-paths", "0"], "--num-paths must be an integer >= 1, got 0."),
    (["--fractions", "1.5"], "--fractions takes numbers in (0, 1) (targets q·L_0), got '1.5'."),
    (["--kappa-eff-max", "-1"], "--kappa-eff-max must be a finite number > 0, got -1.0."),
    (["--replot"], "suggest_check.csv, which does not exist: run without --replot first."),
    (["--verify-report", "/nonexistent.json"], "--verify-report /nonexistent.json: no such"),
])
def test_suggest_check_checks_its_arguments_before_any_work(argv, said, tmp_path, capsys,
                                                            monkeypatch):
    """--per-class 7 wrote an empty table and failed in pandas; the others were library
    tracebacks after --out was created."""
    module = experiment_script("suggest_check")
    monkeypatch.setattr(module, "check_task", lambda *a, **k: pytest.fail("work began"))
    out = tmp_path / "sg"
    corpus = ["--corpus", str(EXPERIMENTS / "results" / "telemetry")]
    assert said in refused(module, ["--out", str(out), *corpus, *argv], capsys)
    assert not out.exists()


ROW_SCRIPTS = ("feature_projector", "feature_shrinkage", "feature_subspace", "kernel_growth",
               "subspace_preset", "subspace_bases", "backbone_order")


@pytest.mark.parametrize("name", ROW_SCRIPTS)
def test_a_rows_file_is_checked_before_any_work(name, tmp_path, capsys):
    """--report on a missing --out was a traceback (max() of an empty sequence, a KeyError),
    an --out that is a directory an IsADirectoryError, one in a missing folder an error after
    the first row's work."""
    module = experiment_script(name)
    missing = tmp_path / "none.jsonl"
    line = refused(module, ["--out", str(missing), "--report"], capsys)
    assert line.endswith(f": error: --report reads --out {missing}, which is not a file: run "
                         "without --report first.")
    line = refused(module, ["--out", str(tmp_path)], capsys)
    assert line.endswith(f": error: --out path '{tmp_path}' is a directory; give a file name "
                         "inside it.")
    line = refused(module, ["--out", str(tmp_path / "no" / "rows.jsonl")], capsys)
    assert line.endswith(f"folder '{tmp_path / 'no'}' does not exist; create it first or "
                         "choose another path.")


@pytest.mark.parametrize("name, argv, said", [
    ("adam_ceiling", ["bogus"], "datasets bogus: not a target set here; known: "),
    # (the data-set-free cases name a vendored set: no ../shared/data needed)
    ("adam_ceiling", ["flowers5", "--per-class", "0"], "--per-class must be an integer >= 1, got"),
    ("adam_ceiling", ["flowers5", "--table", "/nonexistent"], "--table /nonexistent: no such"),
    ("adam_ceiling", ["flowers5", "--out", "{file}"], "is a file; give a folder (created if"),
    ("adam_path_form", ["bogus"], "datasets bogus: not a target set here"),
    ("adam_path_form", ["--decompose", "/nonexistent"], "--decompose /nonexistent: no such"),
    ("adam_batch_gap", ["--benchmark", "bogus"], "--benchmark bogus: not a target set here"),
    ("adam_batch_gap", ["--out", "{file}"], "is a file; give a folder (created if missing)."),
    ("edge_spectrum", ["--table", "/nonexistent"], "--table /nonexistent: no results.parquet"),
    ("outcome", ["/nonexistent.jsonl.gz"], "corpus '/nonexistent.jsonl.gz' does not exist"),
    ("outcome_domain", ["/nonexistent.jsonl.gz"], "corpus '/nonexistent.jsonl.gz' does not"),
    ("subspace_compile", ["--repeats", "0"], "--repeats must be an integer >= 1, got 0."),
])

def test_names_and_paths_are_one_line_before_any_work(name, argv, said, tmp_path, capsys):
    """Wrong names and paths were tracebacks, and three scripts made an empty --out folder
    first."""
    module = experiment_script(name)
    (tmp_path / "file").write_text("")
    argv = [a.format(file=tmp_path / "file") for a in argv]
    out = [] if "--out" in argv or name in ("edge_spectrum", "outcome_domain",
                                            "subspace_compile") else [
        "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as ended:
        (module.parse_args if name == "adam_batch_gap" else module.main)([*argv, *out])
    err = capsys.readouterr().err.strip().splitlines()
    assert ended.value.code == 2 and len(err) == 1 and said in err[0], err
    assert not (tmp_path / "out").exists()
