"""``ntk-tt``: predict fine-tuning training time from the empirical NTK, without training.

    ntk-tt                      # the embedded default end to end (= ntk-tt predict --verify)
    ntk-tt predict [options]    # predicted T_ε and wall-clock time; --verify also fine-tunes
    ntk-tt suggest [options]    # the (η, m, B) predicted to reach a target loss soonest
    ntk-tt outcome RUNS.jsonl   # how runs will end, from their first steps' telemetry

Bad input ends with one ``ntk-tt: error: ...`` line (exit status 2), never a traceback;
option values that need no data are checked before JAX is imported (``ntk_tt._options``).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path

from ntk_tt._defaults import DEFAULTS

# JAX and the job are imported only after the arguments are parsed and checked (``ntk-tt -h``
# is instant, and so is a bad option value)

_JOB_ARGS = ("verify", "figure_path", "json_path", "progress", "overwrite")  # not options
# ntk-tt predict's own figure: replaced by each run (no --overwrite needed); a --figure given
# that exists is refused before any work unless --overwrite
DEFAULT_FIGURE = "ntk_tt_predict.png"


def _add_task_options(q: argparse.ArgumentParser, d: dict) -> None:
    """The task options ``predict`` and ``suggest`` share (checkpoint, dataset, K, n, seed,
    resizing, head scale), with their defaults from ``d``."""
    q.add_argument("--checkpoint", default=None,
                   help="orbax checkpoint dir written by ntk_tt.save_checkpoint (None: the "
                   "shipped SmallResNet pre-trained on CIFAR-10)")
    q.add_argument("--dataset", default=d["dataset"],
                   help="short name (ntk_tt.known_datasets()), a prepared TFDS name, or a "
                   "path to an .npz file with keys images (N×H×W×C or N×H×W, uint8 or float in "
                   "[0, 255]), labels (integers in [0, K), N) and class_names (K strings); "
                   "grey images are repeated to RGB and other sizes resized to the model's "
                   "input (the report says so)")
    q.add_argument("--data-dir", default=None,
                   help="TFDS data_dir holding prepared sets (None: $TFDS_DATA_DIR or "
                   "~/tensorflow_datasets)")
    q.add_argument("--split", default=d["split"], help="TFDS split")
    q.add_argument("-K", "--classes", type=int, default=d["num_classes"], dest="num_classes",
                   help="K, classes in the task (>= 2)")
    q.add_argument("-n", "--per-class", type=int, default=d["per_class"],
                   help="n, training images per class (N = K·n)")
    q.add_argument("--seed", type=int, default=d["seed"],
                   help="seed of the task sample, the fresh head and SGD batches")
    q.add_argument("--no-resize", action="store_false", dest="resize",
                   help="fail instead of resizing images to the model's input size "
                   "(resize=%(default)s unless this flag is given)")
    q.add_argument("--head-scale", type=float, default=d["head_scale"],
                   help="init scale of the fresh head (× LeCun normal)")


def _parser() -> argparse.ArgumentParser:
    from ntk_tt import __version__

    p = argparse.ArgumentParser(prog="ntk-tt", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command")
    q = sub.add_parser("predict", help="predict T_ε for a task (and --verify it for real)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = DEFAULTS
    _add_task_options(q, d)
    q.add_argument("--test-per-class", type=int, default=d["test_per_class"],
                   help="held-out images per class (>= 0; fewer, with a note, when the class "
                   "has not that many left after n)")
    q.add_argument("-T", "--steps", type=int, default=d["steps"],
                   help="T, optimiser steps predicted (and fine-tuned with --verify)")
    q.add_argument("--lr", type=float, default=d["learning_rate"], dest="learning_rate",
                   help="η, learning rate")
    q.add_argument("-B", "--batch-size", type=int, default=None,
                   help="SGD mini-batch size (None: N, full-batch GD)")
    q.add_argument("-m", "--momentum", type=float, default=d["momentum"],
                   help="heavy-ball momentum in [0, 1)")
    q.add_argument("--nesterov", action="store_true", help="Nesterov momentum (needs -m > 0)")
    q.add_argument("--loss", default=d["loss"], choices=("cross_entropy", "mse"),
                   help="training loss")
    q.add_argument("--method", default=d["method"],
                   choices=("auto", "closed_form", "ode", "sde", "discrete"),
                   help="dynamics solver (auto = discrete, exact for the linearised model; "
                   "closed_form needs --loss mse and no -B)")
    q.add_argument("--kernel", default=d["kernel"], choices=("exact", "traced", "sketch"),
                   help="how the empirical NTK is computed")
    q.add_argument("--predictor", default=d["predictor"],
                   choices=("auto", "head_aware", "linear"),
                   help="head_aware: fresh head exact, backbone linearised (its kernel grows "
                   "with the head, the most accurate measured); linear: the whole network "
                   "linearised, Θ frozen at w0 (paper Sec. 3); auto: head_aware unless "
                   "--method/--kernel ask for what only linear has")
    q.add_argument("--backbone", default=d["backbone"],
                   choices=("isotropic", "kronecker", "exact"),
                   help="head-aware feature kernel: isotropic k_b⊗I, kronecker k_b⊗S, exact "
                   "(N·F)² (small N only)")
    q.add_argument("--segments", type=int, default=d["segments"],
                   help="head-aware: re-linearise the backbone along the predicted path this "
                   "many times (one kernel each)")
    q.add_argument("--subset", type=int, default=None, metavar="N'",
                   help="predict from the logit-summed kernel of a class-balanced subset of "
                   "N' images (App. D: no N×N kernel); only with --loss mse and no -B; the "
                   "loss curve only (None: the full kernel)")
    q.add_argument("--subset-method", default=d["subset_method"],
                   choices=("power_law", "nystrom"),
                   help="with --subset: power_law (App. D power-law tails from Θ(X', X')) or "
                   "nystrom (the cross kernel Θ(X, X'), N·N' entries)")
    q.add_argument("--sketch-dim", type=int, default=None,
                   help="D' of the random projection; only with --kernel sketch or --method sde "
                   "(default there: 256)")
    q.add_argument("--num-paths", type=int, default=d["num_paths"],
                   help="SGD noise paths averaged (with -B < N)")
    q.add_argument("--verify", action="store_true",
                   help="also fine-tune for real and compare (the --json report gets the "
                   "prediction as soon as it exists, and is completed at the end)")
    q.add_argument("--figure", default=argparse.SUPPRESS, dest="figure_path",
                   help="figure file, any matplotlib format by its extension (in the current "
                   "directory unless a folder is given; '' for none) (default: "
                   f"{DEFAULT_FIGURE}, replaced by each run)")
    q.add_argument("--json", default=None, dest="json_path",
                   help="also write the report here (None: no JSON); created when the work "
                   "starts, so a second run given the same path refuses at once")
    q.add_argument("--overwrite", action="store_true",
                   help="replace an existing --figure / --json file; without it an existing "
                   "one is an error before any work, so two runs never overwrite each "
                   "other's outputs silently")
    q.add_argument("--no-progress", action="store_false", dest="progress",
                   help="no progress bars on stderr (progress=%(default)s unless this flag "
                   "is given)")
    _suggest_parser(sub)
    o = sub.add_parser("outcome", help="predict how runs end from their first steps' telemetry",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    o.add_argument("runs", help="JSON Lines (or JSON, .gz too) file of runs: each a telemetry "
                   "row (ntk_tt.save_telemetry; a run in progress may hold fewer steps than "
                   "its planned 'steps') or a corpus row {\"telemetry\": ..., \"prediction\": "
                   "...}")
    o.add_argument("--updates", type=int, default=None,
                   help="use only the first K updates of each run (None: all recorded)")
    o.add_argument("--fraction", type=float, default=None,
                   help="use only the first fraction of each run's planned steps, in [0, 1]")
    o.add_argument("--predictor", default="auto",
                   help="'telemetry' (shipped, telemetry only), 'ntk' (shipped, also reads "
                   "the run's NTK prediction), 'auto' (ntk when a row has a prediction), or "
                   "a file written by OutcomePredictor.save")
    o.add_argument("--json", default=None, dest="json_path",
                   help="also write the predictions here as a JSON list")
    o.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    return p


def _suggest_parser(sub) -> None:
    from ntk_tt._defaults import SUGGEST_DEFAULTS as d

    q = sub.add_parser(
        "suggest", help="choose (η, m, B) minimising the predicted wall-clock time to a target "
        "loss, without training", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Predict the loss curve of every configuration of a grid of κ = η·λ_max/N "
        "× momenta × batch sizes from one kernel, refine the best by jax.grad, and print the "
        "(η, m, B) whose predicted curve reaches the target in the least wall-clock time (steps "
        "× measured seconds per real step), without predicted divergence. Exit status 0 with a "
        "suggestion, 1 when no configuration reaches the target, 2 on bad input.")
    _add_task_options(q, d)
    q.add_argument("--target", type=float, default=d["target"],
                   help="target mean training loss: a fraction of the initial loss L_0 in (0, 1) "
                   "(--target-kind fraction) or an absolute value below L_0 (absolute)")
    q.add_argument("--target-kind", default=d["target_kind"], choices=("fraction", "absolute"),
                   help="how --target is read")
    q.add_argument("-T", "--max-steps", type=int, default=d["steps"], dest="steps",
                   help="T_max, the step budget: the target must be reached within it")
    q.add_argument("-B", "--batch-sizes", default=None,
                   help="candidate batch sizes, comma-separated; N = full-batch GD "
                   "(default: N,50); without -B, 50 is left out when N = K·n <= 50")
    q.add_argument("-m", "--momenta", default=",".join(f"{m:g}" for m in d["momenta"]),
                   help="heavy-ball momenta of the grid, comma-separated, each in [0, 1)")
    q.add_argument("--kappa-min", type=float, default=d["kappa_min"],
                   help="smallest κ = η·λ_max/N of the log grid")
    q.add_argument("--kappa-max", type=float, default=d["kappa_max"],
                   help="largest κ of the log grid (beyond the stability edge is never "
                   "suggested)")
    q.add_argument("--num-kappas", type=int, default=d["num_kappas"],
                   help="κ values of the log grid")
    q.add_argument("--refine-steps", type=int, default=d["refine_steps"],
                   help="jax.grad evaluations refining the best grid point in (log η, m); 0: none")
    q.add_argument("--num-paths", type=int, default=d["num_paths"],
                   help="SGD batch orders averaged in each predicted SGD curve")
    q.add_argument("--loss", default=d["loss"], choices=("cross_entropy", "mse"),
                   help="training loss")
    q.add_argument("--predictor", default=d["predictor"],
                   choices=("auto", "head_aware", "linear"),
                   help="head_aware (fresh head exact, backbone linearised) or linear (frozen "
                   "Θ); auto = head_aware")
    q.add_argument("--top", type=int, default=d["top"], help="runner-up rows printed")
    q.add_argument("--json", default=None, dest="json_path",
                   help="also write the report here (None: no JSON)")
    q.add_argument("--overwrite", action="store_true",
                   help="replace an existing --json file (without it an existing file is an "
                   "error before any work)")
    q.add_argument("--no-progress", action="store_false", dest="progress",
                   help="no progress bar on stderr (progress=%(default)s unless this flag is "
                   "given)")


def _options_only(opts: dict) -> dict:
    """The job options of ``opts`` (the parsed arguments without the output / run flags)."""
    return {k: v for k, v in opts.items() if k not in _JOB_ARGS}


def _suggest(args, parser, run: dict) -> int:
    """``ntk-tt suggest``: options checked (before JAX is imported), task loaded,
    :func:`ntk_tt.suggest_task` run (``run``: see :func:`_guard_interrupts`)."""
    from ntk_tt._options import check_suggest_job, parse_batch_sizes, parse_floats

    opts = vars(args)
    opts.pop("command")
    try:  # without -B: None, which check_suggest_job reads as the default (default_batch_sizes)
        if opts["batch_sizes"] is not None:
            opts["batch_sizes"] = parse_batch_sizes(opts["batch_sizes"])
        opts["momenta"] = parse_floats(opts["momenta"], "momenta (-m/--momenta)")
        checked = check_suggest_job(_options_only(opts), opts["json_path"], opts["overwrite"])
    except ValueError as err:
        parser.exit(2, f"ntk-tt: error: {err}\n")
    opts["batch_sizes"] = checked["batch_sizes"]
    from ntk_tt.analysis._suggest import TargetNotReachedWarning, format_suggestion, suggest_task

    run.update(progress=opts["progress"], working=True)
    try:
        with warnings.catch_warnings():  # the CLI says it itself ("no suggestion: ...", exit 1)
            warnings.simplefilter("ignore", TargetNotReachedWarning)
            report = suggest_task(**opts)
    except ValueError as err:
        parser.exit(2, f"ntk-tt: error: {err}\n")
    print(format_suggestion(report))
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
        fail(f"runs file {args.runs!r} does not exist (or is not a file).")
    if args.json_path:
        if os.path.isdir(args.json_path):
            fail(f"--json {args.json_path!r} is a directory; give a file name.")
        if os.path.exists(args.json_path) and not args.overwrite:
            fail(f"--json {args.json_path!r} exists; pass --overwrite to replace it.")
        folder = os.path.dirname(os.path.abspath(args.json_path))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            fail(f"--json folder {folder!r} does not exist or is not writable.")
    named = args.predictor in ("auto", "telemetry", "ntk")
    if not named and not os.path.isfile(args.predictor):
        fail(f"--predictor {args.predictor!r} is neither auto, telemetry, ntk nor a file.")
    from ntk_tt.telemetry._outcome import OutcomePredictor, default_outcome_predictor, load_runs

    try:
        runs = load_runs(args.runs)
        fixed = None if named else OutcomePredictor.load(args.predictor)
        cache = {}
        out = []
        for i, (tele, pred) in enumerate(runs, 1):
            if fixed is not None:
                model = fixed
            else:
                use_ntk = args.predictor == "ntk" or (args.predictor == "auto"
                                                      and pred is not None)
                if use_ntk and pred is None:
                    fail(f"run {i} has no 'prediction': --predictor ntk needs corpus rows "
                         "{\"telemetry\", \"prediction\"}; use --predictor telemetry.")
                model = cache.setdefault(use_ntk, default_outcome_predictor(ntk=use_ntk))
            have = len(tele.loss) - 1
            k = (args.updates if args.updates is not None else
                 int(round(args.fraction * tele.steps)) if args.fraction is not None else have)
            if k > have:
                fail(f"run {i} has {have} recorded updates, fewer than the {k} asked for.")
            try:
                res = model.predict(tele, pred if model.ntk else None, k=k)
            except ValueError as err:
                raise ValueError(f"run {i}: {err}") from None
            res["predictor"] = "ntk" if model.ntk else "telemetry"
            out.append(res)
    except ValueError as err:
        fail(str(err))
    for i, r in enumerate(out, 1):
        lo, hi = r["test_accuracy_interval"]
        tlo, thi = r["t_eps_0.1_interval"]
        print(f"run {i}: {r['observed_updates']} of {r['steps']} updates observed "
              f"({r['predictor']} predictor)\n"
              f"  final held-out accuracy {r['test_accuracy']:.3f} (90 % interval "
              f"{lo:.3f}–{hi:.3f})\n"
              f"  P(diverges) {r['p_diverged']:.3f}, P(fails) {r['p_failed']:.3f}, "
              f"P(beats its task's median run) {r['p_above_median']:.3f}\n"
              + (f"  loss T_0.1 {r['t_eps_0.1']:.0f} steps (90 % interval {tlo:.0f}–{thi:.0f})"
                 if r["p_diverged"] < 0.5 else
                 "  loss T_0.1: none expected (the run will likely diverge)"))
        if r.get("out_of_domain"):
            print(_outside_corpus(r["out_of_domain"]))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(out, indent=1))
        print(f"json: {args.json_path}")
    return 0


def _fmt(v, unit=""):
    return "undefined" if v is None else f"{v:.1f}{unit}" if unit else f"{v:g}"


# short forms of the reasons a T_ε is undefined (ntk_tt.dynamics._training_time.REASONS, and
# "diverged at step k" for a real run), matched by a phrase each contains
_SHORT_REASONS = (("diverged", "diverged"), ("NaN or inf", "curve not finite"),
                  ("flat or rising", "curve not falling"),
                  ("no step comes within", "never within ε of L_T"),
                  ("not predicted: the subset", "not predicted (--subset: loss curve only)"),
                  ("beyond the stability edge", "beyond the stability edge: cannot tell"))


def _outside_corpus(flags: list[dict]) -> str:
    """``ntk-tt outcome``'s line for a run whose inputs leave the predictor's corpus (the
    result's ``out_of_domain``, farthest first)."""
    def one(e):
        value = "missing" if e["value"] is None else f"{e['value']:.4g}"
        return f"{e['feature']} = {value} (corpus {e['low']:.4g} to {e['high']:.4g})"
    more = f" and {len(flags) - 3} more" if len(flags) > 3 else ""
    return (f"  outside the corpus the predictor was fitted on: "
            f"{', '.join(one(e) for e in flags[:3])}{more}; these numbers are extrapolations")


def _predicted_verdict(r: dict):
    """The prediction's divergence verdict for the report's last line: True / False, or
    "unknown" with why (κ beyond the stability edge, not diverged)."""
    if r["predicted"].get("divergence") == "unknown":
        return "unknown (beyond the stability edge: the linearised model cannot tell)"
    return r["diverged"]["predicted"]


def _short(reason: str | None) -> str:
    if not reason:
        return "no reason given"
    return next((short for key, short in _SHORT_REASONS if key in reason), reason)


def _why_undefined(side: dict, curve: str, eps: str) -> str | None:
    """Short reason for an undefined T_ε on one side of the report (None when defined)."""
    if side["training_time"][curve][eps] is not None:
        return None
    return _short((side.get("training_time_reasons") or {}).get(curve, {}).get(eps))


def _diverged_lines(r: dict) -> list[str]:
    """Plain-language lines for a prediction or real run that diverged, or spiked and
    recovered."""
    pred, real, lines = r["predicted"], r["real"], []
    if pred["diverged"]:
        lines.append(f"prediction diverged at step {pred['diverged_at']}: no predicted T_ε "
                     "(lower --lr)")
    if real and real["diverged"]:
        lines.append(f"real run diverged at step {real['diverged_at']}: no real T_ε "
                     "(lower --lr)")
    for name, side in (("prediction", pred), ("real run", real)):
        if side and not side["diverged"] and side.get("spiked_at") is not None:
            lines.append(f"{name} spiked above 10·L_0 at step {side['spiked_at']} and "
                         "recovered (not divergence; T_ε as usual)")
    return lines


def _comparison_lines(r: dict) -> list[str]:
    """Loss-curve distance and held-out accuracy, or why they are not meaningful."""
    pred, real, t = r["predicted"], r["real"], r["task"]
    who = [name for name, side in (("prediction", pred), ("real run", real))
           if side["diverged"]]
    if who:
        lines = [f"loss curves: not compared ({' and '.join(who)} diverged: the distance "
                 "is not meaningful)"]
    else:
        dist = r["curve_distance"]["loss"]
        rel = dist["max_rel_to_fall"]
        share = (f"{_fmt(100 * rel)} % of the real fall {_fmt(dist['real_fall'])}"
                 if rel is not None else
                 f"real fall {_fmt(dist['real_fall'])}: not positive, no relative distance")
        lines = [f"loss curves: max |predicted − real| = {_fmt(dist['max_abs'])} ({share})"]
    if not t["n_test"]:
        lines.append("held-out accuracy at T: no held-out images (--test-per-class 0)")
    else:
        acc = [f"{name} " + ("not meaningful (diverged)" if side["diverged"]
                             else "n/a (--subset: not predicted)"
                             if side["test_accuracy"] is None
                             else _fmt(side["test_accuracy"]))
               for name, side in (("predicted", pred), ("real", real))]
        lines.append(f"held-out accuracy at T: {', '.join(acc)}")
    return lines


def _ratio(r: dict) -> str:
    """The fine-tuning / prediction wall-time ratio, or why it means nothing."""
    pred, real = r["predicted"], r["real"]
    if real["diverged"]:
        return (f"not meaningful (the real run diverged at step {real['diverged_at']} and "
                "stopped there)")
    if pred["diverged"]:
        return "not meaningful (the prediction diverged: it predicts no T_ε to compare)"
    return _fmt(r["seconds"]["ratio"])


def _interval(pred: dict, curve: str, eps: str) -> str:
    """The 90 % interval of a predicted T_ε as "lo–hi" whole steps (widened outwards; an
    unbounded side is 0 or ∞), "n/a" when there is none (error curve, undefined T_ε, or a
    report written before intervals existed)."""
    iv = (pred.get("interval_90") or {}).get(curve, {}).get(eps)
    if iv is None:
        return "n/a"
    lo, hi = iv
    return (f"{0 if lo is None else math.floor(lo)}–"
            f"{'∞' if hi is None else math.ceil(hi)}")


def _g(value) -> str:
    """A number to 3 significant digits, "n/a" where the report holds None (NaN in JSON)."""
    return "n/a" if value is None else f"{value:.3g}"


def format_report(r: dict) -> str:
    """Human-readable table of a :func:`ntk_tt.predict_task` report.

    An undefined T_ε has its short reason at the end of its row; a diverged prediction or
    real run is said in words, and comparisons it makes meaningless are not printed as
    numbers.
    """
    from ntk_tt.dynamics._predict_kernel import EPSILONS

    t, pred, real = r["task"], r["predicted"], r["real"]
    lines = [
        f"task: {t['dataset']}, classes {', '.join(t['classes'])}; N = {t['n_train']} train, "
        f"{t['n_test']} held out; model {t['architecture']} (D = {t['num_params']})",
        f"images: {'×'.join(map(str, t['image_shape']))} → "
        f"{'×'.join(map(str, t['model_input_shape']))}, preprocessing: {t['preprocessing']}",
        f"prediction: method {pred['method']}, kernel {pred['kernel']}, "
        f"κ = η·λ_max/N = {_g(pred['kappa'])}; {r['seconds']['predict']:.1f} s "
        f"(compile {r['seconds']['predict_stages']['compile']:.1f} s apart)",
    ]
    if pred.get("beyond_edge"):
        lines.append(f"warning: κ = {_g(pred['kappa'])} is beyond the linearised model's "
                     "stability edge: the real run will likely diverge or oscillate; the "
                     "predicted curve and T_ε are not trustworthy; lower --lr")
    asked = r["config"]["test_per_class"]
    if t["test_per_class"] < asked:
        lines.append(f"note: {t['test_per_class']} held-out images per class, fewer than the "
                     f"{asked} asked for (only that many are left after n per class)")
    head = (f"{'curve':6} {'ε':>5} {'predicted T_ε':>14} {'90 % interval':>14} "
            f"{'pred. wall-clock':>17}")
    if real:
        head += f" {'real T_ε':>9} {'real wall':>10} {'rel. error':>10}"
    lines.append(head)
    for c in ("loss", "error"):
        for e in EPSILONS:
            k = str(e)
            row = (f"{c:6} {e:>5g} {_fmt(pred['training_time'][c][k]):>14} "
                   f"{_interval(pred, c, k):>14} {_fmt(pred['wall_clock'][c][k], ' s'):>17}")
            if real:
                rel = r["relative_error"][c][k]
                row += (f" {_fmt(real['training_time'][c][k]):>9} "
                        f"{_fmt(real['wall_clock'][c][k], ' s'):>10} "
                        f"{'n/a' if rel is None else f'{100 * rel:.0f} %':>10}")
            why = [f"{name}: {w}" for name, side in (("predicted", pred), ("real", real))
                   if side and (w := _why_undefined(side, c, k))]
            if why:
                row += f"  ({'; '.join(why)})"
            lines.append(row)
    lines += _diverged_lines(r)
    if real:
        s = r["seconds"]
        lines.append(
            f"real fine-tuning: {real['seconds_per_step'] * 1e3:.0f} ms/step, training "
            f"{s['finetune']:.1f} s (compile {s['compile_finetune']:.1f} s apart); "
            f"fine-tuning / prediction wall time = {_ratio(r)}")
        lines += _comparison_lines(r)
        lines.append(f"diverged: predicted {_predicted_verdict(r)}, "
                     f"real {r['diverged']['real']}")
    else:
        lines.append(f"diverged: predicted {_predicted_verdict(r)}")
    return "\n".join(lines)


_EXITING = threading.Lock()
GRACE_S = 3.0  # after Ctrl-C, the main thread's own exit path gets this long
_STOPPED = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated (SIGTERM)"}


def _interrupted(run: dict) -> None:
    """Ctrl-C or SIGTERM: one line, exit status 128 + the signal number (130, 143), at once.

    A --json report the job left saying the fine-tuning is running is marked interrupted,
    one that holds no result yet is removed (:func:`ntk_tt.prediction._job.settle`); the
    line names a report that keeps the prediction. ``os._exit`` skips the interpreter's
    teardown, where JAX / orbax threads interrupted mid-work can crash (segmentation fault)
    or print tracebacks. Called by the main thread (``KeyboardInterrupt``, or the signal
    handler before the work starts) or by the watcher of :func:`_guard_interrupts`,
    whichever comes first; the other one waits for the exit.
    """
    if not _EXITING.acquire(blocking=False):
        threading.Event().wait()  # the other caller is exiting the process
    signum = run.get("signal", signal.SIGINT)
    try:
        job = sys.modules.get("ntk_tt.prediction._job")  # imported if a report was written
        kept = run.get("json_path") if job and run.get("json_path") else None
        note = (f" (the prediction is kept in {kept})"
                if kept and job.settle(Path(kept).expanduser()) else "")
        clear = "\r\033[K" if run.get("progress") and sys.stderr.isatty() else ""
        sys.stdout.flush()
        sys.stderr.write(f"{clear}ntk-tt: {_STOPPED[signum]}{note}\n")
        sys.stderr.flush()
    finally:
        os._exit(128 + signum)


def _guard_interrupts(run: dict) -> None:
    """Make Ctrl-C and SIGTERM end the program with one line, whatever it is doing.

    ``run`` says what an interruption needs: ``working`` (set once the imports are done and
    the job starts), ``json_path``, ``progress``; the handler adds ``signal``. Before the
    work (arguments, checks, the imports of numpy, matplotlib and JAX) the handler exits at
    once: nothing is written yet, and a ``KeyboardInterrupt`` inside an import surfaces as
    an ``ImportError`` or a traceback. During the work it raises ``KeyboardInterrupt``, so
    the job records the interruption in its JSON report. Python runs the handler only
    between bytecodes of the main thread: not during a long XLA compilation, and a
    ``KeyboardInterrupt`` raised inside a garbage-collection or ``__del__`` callback is
    printed ("Exception ignored in ...") and dropped, so the run went on. The C-level
    handler also writes the signal number to a wake-up pipe at once; a watcher thread reads
    it, gives the main thread's own path :data:`GRACE_S` seconds, then exits itself. Dropped
    ``KeyboardInterrupt`` reports are silenced (the watcher ends the run). A signal ignored
    when the program starts (e.g. SIGINT of a job started in the background) stays ignored.
    """
    handled = [sig for sig, default in ((signal.SIGINT, signal.default_int_handler),
                                        (signal.SIGTERM, signal.SIG_DFL))
               if signal.getsignal(sig) is default]
    if not handled:
        return

    def handler(signum, frame):
        if _EXITING.locked():  # a second Ctrl-C while exiting: the exit goes on
            return
        run.setdefault("signal", signum)
        if not run.get("working"):
            _interrupted(run)
        raise KeyboardInterrupt

    for sig in handled:
        signal.signal(sig, handler)
    read, write = os.pipe()
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write)
    previous = sys.unraisablehook

    def hook(unraisable):
        if not issubclass(unraisable.exc_type, KeyboardInterrupt):
            previous(unraisable)

    sys.unraisablehook = hook

    def watch():
        while (signum := os.read(read, 1)[0]) not in handled:
            pass
        run.setdefault("signal", signum)
        time.sleep(GRACE_S)
        _interrupted(run)

    threading.Thread(target=watch, name="ntk-tt-interrupt", daemon=True).start()


def _caused_by_interrupt(err: BaseException) -> bool:
    """Whether a KeyboardInterrupt is in the cause/context chain of ``err``."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


def main(argv: list[str] | None = None) -> int:
    """Console entry point; with no arguments runs ``predict --verify`` on the defaults.

    Exit status: 0 done, 2 bad input (one ``ntk-tt: error: ...`` line on stderr), 130
    interrupted (Ctrl-C: one ``ntk-tt: interrupted`` line; a --json report that holds the
    prediction is kept and says so), 143 terminated (SIGTERM, as Ctrl-C). As the program
    (``argv`` None), the signals are handled from the start of ``main`` and end the run
    within :data:`GRACE_S` seconds even during a compilation (:func:`_guard_interrupts`).
    """
    run: dict = {}
    if argv is None:  # the ntk-tt process itself (not a call from Python)
        _guard_interrupts(run)
    try:
        return _main(sys.argv[1:] if argv is None else argv, run)
    except KeyboardInterrupt:
        _interrupted(run)
    except ImportError as err:  # Ctrl-C while numpy/jax import: numpy re-raises it this way
        if not _caused_by_interrupt(err):
            raise
        _interrupted(run)


def _main(argv: list[str], run: dict) -> int:
    parser = _parser()
    args = parser.parse_args(argv or ["predict", "--verify"])
    if args.command == "outcome":
        return _outcome(args, parser)
    if args.command == "suggest":
        return _suggest(args, parser, run)
    if args.command != "predict":
        parser.error("choose a command: predict, suggest or outcome")
    opts = vars(args)
    opts.pop("command")
    if "figure_path" not in opts:  # the default figure: this tool's own, replaced
        opts["figure_path"] = DEFAULT_FIGURE
        opts["overwrite"] = opts["overwrite"] or ["figure"]
    try:
        from ntk_tt._options import check_predict_job

        check_predict_job(_options_only(opts), opts["figure_path"], opts["json_path"],
                          opts["overwrite"])
    except ValueError as err:
        parser.exit(2, f"ntk-tt: error: {err}\n")
    from ntk_tt.dynamics._predict_kernel import BeyondEdgeWarning
    from ntk_tt.prediction._job import predict_task

    run.update(json_path=opts["json_path"], progress=opts["progress"], working=True)
    try:
        with warnings.catch_warnings():  # the report says it itself ("warning: κ = ...")
            warnings.simplefilter("ignore", BeyondEdgeWarning)
            report = predict_task(**opts)
    except ValueError as err:
        parser.exit(2, f"ntk-tt: error: {err}\n")
    print(format_report(report))
    if report["figure"]:
        moved = report["figure"] != str(Path(opts["figure_path"]).expanduser())
        print(f"figure: {report['figure']}" + (f" ({opts['figure_path']} was created by "
                                                "another run meanwhile and is kept)"
                                                if moved else ""))
    if opts["json_path"]:
        print(f"json: {opts['json_path']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
