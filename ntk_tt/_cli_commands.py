"""The ``ntk-tt`` commands: ``predict``, ``suggest`` and ``outcome``, each from its parsed
arguments to its exit status. Option values are checked before JAX is imported; JAX and the
jobs are imported inside the commands."""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

from ntk_tt._cli_parser import DEFAULT_FIGURE
from ntk_tt._cli_report import format_report, steps_interval

_JOB_ARGS = ("verify", "figure_path", "json_path", "progress", "overwrite")  # not options


# Python-API advice in a message from the work, said as the CLI's flags (a fresh user was
# told "ntk_tt.replace_head" and "predictor='linear'" by ntk-tt predict)
_CLI_TERMS = (("initialise the head with non-zero weights of ordinary size (ntk_tt.replace_head)",
               "give --head-scale nearer 1"), ("backbone='exact'", "--backbone exact"),
              ("Use backbone='subspace'", "Use --backbone subspace"),
              ("or the default 'diagonal', or fewer samples", "or the default diagonal, or "
               "fewer samples (-n)"),
              ("predictor='linear'", "--predictor linear"),
              ("allow resizing (resize=True, drop --no-resize)", "drop --no-resize"),
              ("widen kappa_range", "widen --kappa-min/--kappa-max"),
              ("widen learning_rate_range", "widen --lr-min/--lr-max"),
              ("target_kind='fraction'", "--target-kind fraction"),
              ("sketch_dim D' = ", "sketch_dim (--sketch-dim) "),
              ("kernel='exact', or sketch_dim <=", "--kernel exact, or --sketch-dim <="),
              ("use sketch_dim <=", "use --sketch-dim <="),
              ("raise kappa_eff_max", "raise --kappa-eff-max"),
              ("pass prediction=None for the telemetry-only features",
               "use --predictor telemetry"))


def cli_terms(message: str) -> str:
    """``message`` with the Python-API advice it gives replaced by ``ntk-tt`` flags."""
    for python, flags in _CLI_TERMS:
        message = message.replace(python, flags)
    return message


def _options_only(opts: dict) -> dict:
    """The job options of ``opts`` (the parsed arguments without the output / run flags)."""
    return {k: v for k, v in opts.items() if k not in _JOB_ARGS}


def _suggest(args, parser, run: dict) -> int:
    """``ntk-tt suggest``: options checked (before JAX is imported), task loaded,
    :func:`ntk_tt.suggest_task` run (``run``: see
    :func:`ntk_tt.cli._guard_interrupts`)."""
    from ntk_tt._options import check_suggest_job
    from ntk_tt._options_suggest import split_optimizer_options

    opts = vars(args)  # -m, --kappa-min/max are absent unless given (--optimizer refuses some)
    opts.pop("command")
    try:  # without -B: None, which check_suggest_job reads as the default (default_batch_sizes)
        # a list flag given twice (-B 10 -B 50) adds to its list, as a comma would
        if opts["batch_sizes"] is not None:
            opts["batch_sizes"] = parse_batch_sizes(",".join(opts["batch_sizes"]))
        if "momenta" in opts:
            opts["momenta"] = parse_floats(",".join(opts["momenta"]), "momenta (-m/--momenta)")
        if opts["warmups"] is not None:
            opts["warmups"] = parse_floats(",".join(opts["warmups"]), "warmups (--warmups)",
                                           "0,0.1,0.2")
        _, rest = split_optimizer_options(_options_only(opts))
        checked = check_suggest_job(rest, opts["json_path"], opts["overwrite"])
        n_train = checked["num_classes"] * checked["per_class"]
        if "num_paths" in opts and all(b is None or b >= n_train for b in checked["batch_sizes"]):
            raise ValueError("num_paths (--num-paths) averages SGD batch orders and the batch "
                             f"sizes searched are full-batch GD only (-B N, N = {n_train}): "
                             f"{'give' if opts['optimizer'] else 'add'} a -B < N, or drop "
                             "--num-paths.")
    except ValueError as err:
        parser.exit(2, f"ntk-tt: error: {cli_terms(str(err))}\n")
    opts["batch_sizes"] = checked["batch_sizes"]
    from ntk_tt.analysis._suggest import TargetNotReachedWarning
    from ntk_tt.analysis._suggest_report import format_suggestion
    from ntk_tt.analysis._suggest_task import suggest_task
    from ntk_tt.dynamics._regime import LinearRegimeWarning

    run.update(progress=opts["progress"], working=True)
    try:
        with warnings.catch_warnings():  # the CLI says them itself ("no suggestion: ...",
            warnings.simplefilter("ignore", TargetNotReachedWarning)  # exit 1; a ρ warning)
            warnings.simplefilter("ignore", LinearRegimeWarning)
            report = suggest_task(**opts)
    except ValueError as err:
        parser.exit(2, f"ntk-tt: error: {cli_terms(str(err))}\n")
    print(cli_terms(format_suggestion(report)))
    if opts["json_path"]:
        print(f"json: {opts['json_path']}")
    return 0 if report["found"] else 1


def _outcome(args, parser) -> int:
    """``ntk-tt outcome``: one block of predicted outcome per run."""
    import json
    from pathlib import Path

    def fail(msg):
        parser.exit(2, f"ntk-tt: error: {msg}\n")

    if args.updates is not None and args.fraction is not None:
        fail("give --updates or --fraction, not both.")
    if args.updates is not None and args.updates < 0:
        fail(f"--updates must be >= 0, got {args.updates}.")
    if args.fraction is not None and not 0.0 <= args.fraction <= 1.0:
        fail(f"--fraction must be in [0, 1], got {args.fraction}.")
    if not os.path.isfile(args.runs):
        what = "is a directory" if os.path.isdir(args.runs) else "does not exist (or is not a file)"
        fail(f"runs file {args.runs!r} {what}: give the JSON Lines file of telemetry rows.")
    named = args.predictor in ("auto", "telemetry", "ntk")
    if args.json_path:  # the checks of predict's and suggest's --json (a file is created)
        from importlib.resources import files

        from ntk_tt._output_paths import check_outputs

        shipped = [("shipped outcome predictor", str(files("ntk_tt") / "assets" / name))
                   for name in ("outcome_ntk.json.gz", "outcome_telemetry.json.gz")]
        try:
            check_outputs(None, args.json_path, args.overwrite,
                          inputs=(("runs file", args.runs), *(shipped if named else ()),
                                  ("predictor file", None if named else args.predictor)))
        except ValueError as err:
            fail(str(err))
    if not named and not os.path.isfile(args.predictor):
        fail(f"--predictor {args.predictor!r} is neither auto, telemetry, ntk nor a file.")
    from ntk_tt.telemetry._outcome import OutcomePredictor, default_outcome_predictor
    from ntk_tt.telemetry._runs_file import load_runs

    try:
        runs = load_runs(args.runs)
        fixed = None if named else OutcomePredictor.load(args.predictor)
        cache = {}
        out = []
        for row, tele, pred in runs:  # row: the line number load_runs' messages name too
            if fixed is not None:
                model = fixed
            else:
                use_ntk = args.predictor == "ntk" or (args.predictor == "auto"
                                                      and pred is not None)
                if use_ntk and pred is None:
                    fail(f"{args.runs}, row {row}: no 'prediction': --predictor ntk needs "
                         "corpus rows {\"telemetry\", \"prediction\"}; use --predictor "
                         "telemetry.")
                model = cache.setdefault(use_ntk, default_outcome_predictor(ntk=use_ntk))
            have = len(tele.loss) - 1
            k = (args.updates if args.updates is not None else
                 int(round(args.fraction * tele.steps)) if args.fraction is not None else have)
            if k > have:
                asked = (f"--updates {k}" if args.updates is not None else
                         f"--fraction {args.fraction:g} of its steps = {tele.steps}")
                fix = (f"ask for at most {tele.steps}, the steps it plans" if k > tele.steps
                       else "ask for fewer, or give the run's telemetry up to there")
                fail(f"{args.runs}, row {row}: {have} recorded updates, fewer than the {k} "
                     f"asked for ({asked}); {fix}.")
            try:
                res = model.predict(tele, pred if model.ntk else None, k=k)
            except ValueError as err:
                raise ValueError(f"{args.runs}, row {row}: {err}") from None
            res["predictor"] = "ntk" if model.ntk else "telemetry"
            if have == tele.steps:  # the whole run is in the file: what it did, beside
                res["observed"] = _observed(tele)
            out.append(res)
    except ValueError as err:
        fail(cli_terms(str(err)))
    for i, r in enumerate(out, 1):
        lo, hi = r["test_accuracy_interval"]
        tlo, thi = r["t_eps_0.1_interval"]
        print(f"run {i}: {r['observed_updates']} of {r['steps']} updates observed "
              f"({r['predictor']} predictor)")
        if r.get("out_of_domain"):  # first: it qualifies every number below
            print(_outside_corpus(r["out_of_domain"]))
        if r.get("observed"):
            o = r["observed"]
            print(f"  observed (the file holds the finished run): final training loss "
                  f"{o['final_loss']:.4g}, outcome {o['outcome']}; the predictions below use "
                  f"its first {r['observed_updates']} updates only")
        print(f"  predicted final held-out accuracy {r['test_accuracy']:.3f} (90 % interval "
              f"{lo:.3f}–{hi:.3f})\n"
              f"  P(diverges) {r['p_diverged']:.3f}, P(fails) {r['p_failed']:.3f}, "
              f"P(beats its task's median run) {r['p_above_median']:.3f}\n"
              + (f"  loss T_0.1 {r['t_eps_0.1']:.0f} steps (90 % interval "
                 f"{steps_interval(tlo, thi)})"
                 if r["p_diverged"] < 0.5 else
                 "  loss T_0.1: none expected (the run will likely diverge)"))
    if args.json_path:  # standard JSON, as save_telemetry: NaN -> null, ±inf -> "inf"/"-inf"
        Path(args.json_path).write_text(json.dumps(_json_ready(out), indent=1,
                                                   allow_nan=False))
        print(f"json: {args.json_path}")
    return 0


def _observed(tele) -> dict:
    """A finished run's own ending: its last training loss and its outcome by the rule of
    ``ntk_tt.dynamics._divergence`` (the curve as computed: non-finite from ``stopped_at``)."""
    import numpy as np

    from ntk_tt.dynamics._divergence import OUTCOMES, outcome

    loss = np.asarray(tele.loss, np.float64).copy()
    if tele.stopped_at >= 0:
        loss[tele.stopped_at:] = np.inf
    return {"final_loss": float(tele.loss[-1]), "outcome": OUTCOMES[int(outcome(loss)[0])]}


def _json_ready(x):
    """``x`` with every float through the telemetry files' encoding (NaN → None, ±∞ →
    "inf" / "-inf"), so ``json.dumps(..., allow_nan=False)`` writes standard JSON."""
    from ntk_tt.telemetry._telemetry import _encode

    if isinstance(x, dict):
        return {k: _json_ready(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_ready(v) for v in x]
    return _encode(x) if isinstance(x, float) else x


def _outside_corpus(flags: list[dict]) -> str:
    """``ntk-tt outcome``'s line for a run whose inputs leave the predictor's corpus (the
    result's ``out_of_domain``, farthest first)."""
    def one(e):
        value = "missing" if e["value"] is None else f"{e['value']:.4g}"
        return f"{e['feature']} = {value} (corpus {e['low']:.4g} to {e['high']:.4g})"
    more = f" and {len(flags) - 3} more" if len(flags) > 3 else ""
    return (f"  outside the corpus the predictor was fitted on: "
            f"{', '.join(one(e) for e in flags[:3])}{more}; these numbers are extrapolations")


def _predict(args, parser, run: dict) -> int:
    """``ntk-tt predict``: options and output paths checked (before JAX is imported),
    :func:`ntk_tt.predict_task` run, its report printed (``run``: see
    :func:`ntk_tt.cli._guard_interrupts`; ``run["prediction"]`` is the prediction's table,
    formatted as soon as it exists, which an interruption prints when no --json report
    keeps it; a ValueError after the prediction, e.g. in the fine-tuning, prints it too
    without --json)."""
    opts = vars(args)
    opts.pop("command")
    if "figure_path" not in opts:  # the default figure: this tool's own, replaced
        opts["figure_path"] = DEFAULT_FIGURE
        opts["overwrite"] = opts["overwrite"] or ["figure"]
    try:
        from ntk_tt._options_predict import check_predict_job
        from ntk_tt._options_targets import JOB_TARGETS

        for name, flag, _ in JOB_TARGETS:  # repeated flags and comma lists: one tuple
            opts[name] = tuple(v for text in opts[name] or ()
                               for v in parse_floats(text, f"{name} ({flag})", "0.5,0.2"))
        check_predict_job(_options_only(opts), opts["figure_path"], opts["json_path"],
                          opts["overwrite"])
    except ValueError as err:
        parser.exit(2, f"ntk-tt: error: {err}\n")
    from ntk_tt.dynamics._edge_warnings import BeyondEdgeWarning
    from ntk_tt.prediction._job import PACKAGE, predict_task

    def keep(early: dict) -> None:  # formatted now: an interruption only prints it
        run["prediction"] = format_report(early, interrupted=True)
        run["early"] = early

    run.update(json_path=opts["json_path"], progress=opts["progress"], working=True)
    try:
        with warnings.catch_warnings():  # the report prints them (predicted.warnings)
            warnings.simplefilter("ignore", BeyondEdgeWarning)
            warnings.filterwarnings("ignore", category=UserWarning,  # raised in the package
                                    module=re.escape(str(PACKAGE)))
            report = predict_task(**opts, on_prediction=keep)
    except ValueError as err:
        if "early" in run and not opts["json_path"]:  # failed after the prediction: keep it
            print(format_report(run["early"] | {"status": "failed after the prediction"}))
        parser.exit(2, f"ntk-tt: error: {cli_terms(str(err))}\n")
    text = format_report(report)
    run.pop("prediction", None)  # the whole report follows: not the prediction again
    print(text)
    if report["figure"]:
        moved = report["figure"] != str(Path(opts["figure_path"]).expanduser())
        print(f"figure: {report['figure']}" + (f" ({opts['figure_path']} was created by "
                                                "another run meanwhile and is kept)"
                                                if moved else ""))
    if opts["json_path"]:
        print(f"json: {opts['json_path']}")
    if report.get("figure_error"):  # the results above are whole; only the figure is missing
        parser.exit(2, f"ntk-tt: error: {report['figure_error']} (no figure; the report above "
                       "is complete)\n")
    return 0


def parse_batch_sizes(text: str) -> tuple:
    """"N,50,100" → (None, 50, 100); "N" (or "gd") = full-batch GD.

    Raises:
      ValueError: an entry that is neither N nor an integer; an integer entry < 1 (the
        message names it: a batch size is a positive integer, N is full-batch GD).
    """
    out = []
    for tok in str(text).split(","):
        tok = tok.strip()
        if tok.lower() in ("n", "gd", "none"):
            out.append(None)
        elif re.fullmatch(r"[+-]?\d+", tok):
            if int(tok) < 1:
                raise ValueError(f"batch_sizes (-B/--batch-sizes) entries must be positive "
                                 f"integers (mini-batch sizes B >= 1) or N (full-batch GD), got "
                                 f"{tok} in {text!r}; e.g. N,50.")
            out.append(int(tok))
        else:
            raise ValueError(f"batch_sizes (-B/--batch-sizes) must be a comma-separated list of "
                             f"N (full-batch GD) and integers, e.g. N,50; got {text!r}.")
    return tuple(out)


def parse_floats(text: str, what: str, example: str = "0,0.9") -> tuple:
    """"0,0.5,0.9" → (0.0, 0.5, 0.9); ``example`` is the list the message shows.

    Raises:
      ValueError: an entry that is not a number.
    """
    try:
        return tuple(float(tok) for tok in str(text).split(","))
    except ValueError:
        raise ValueError(f"{what} must be a comma-separated list of numbers, e.g. {example}; "
                         f"got {text!r}.") from None
