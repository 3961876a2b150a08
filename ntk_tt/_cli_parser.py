"""The ``ntk-tt`` argument parser: its commands, options, defaults and help (no JAX)."""

from __future__ import annotations

import argparse
import difflib

from ntk_tt._cli_argparse import NEGATIVE_NUMBER, DefaultsFormatter, Parser
from ntk_tt._defaults import DEFAULTS
from ntk_tt._options import BACKBONES
from ntk_tt._options_optimizer import ADAM_DEFAULTS, ADAMW_WEIGHT_DECAY, OPTIMIZERS, SCHEDULES

DESCRIPTION = ("ntk-tt: predict fine-tuning training time from the empirical NTK, without "
               "training.")

# a negative number (-0.001, -1e-3, -.5E+2, -inf) or a comma list starting with one
# (-0.5,0.5; -inf,0.5) is a value, never a flag: argparse's own pattern (Python 3.11's) takes
# plain decimals only, and read --lr-min -1e-3 as a flag missing its argument (the usage block and
# "expected one argument") instead of passing -0.001 on to the range check
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


def _choice(names: tuple[str, ...], spelling: str = "_"):
    """A choice option's ``type=`` and ``metavar=``: the value as the options spell it, hyphens
    or underscores accepted (``--loss cross-entropy``, ``--schedule warmup_cosine``); a
    misspelt one is echoed as typed beside the names as ``-h`` and README spell them (with
    ``spelling`` between words; argparse's ``choices`` echoed it as converted)."""
    shown = [n.replace("_", spelling) for n in names]

    def name(text: str) -> str:
        if (value := text.replace("-", "_")) not in names:
            raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from "
                                             f"{', '.join(shown)})")
        return value

    return {"type": name, "metavar": "{" + ",".join(shown) + "}"}


_schedule_name = _choice(SCHEDULES, "-")["type"]


def _add_optimizer_options(q: argparse.ArgumentParser, d: dict) -> None:
    """``predict``'s optimiser (``ntk_tt._options_optimizer``): rule, schedule, weight decay,
    batch size; ``--lr`` is the schedule's peak."""
    q.add_argument("--optimizer", default=d["optimizer"], choices=OPTIMIZERS,
                   help="update rule: sgd (with -m, --nesterov), adam or adamw (--b1, --b2, "
                   "--adam-eps; predicted by the head-aware predictor and --method "
                   "auto/discrete only)")
    q.add_argument("--schedule", default=d["schedule"], **_choice(SCHEDULES, "-"),
                   help="learning-rate schedule over the steps (with --subset: sgd without "
                   "--weight-decay)")
    q.add_argument("--lr", type=float, default=d["learning_rate"], dest="learning_rate",
                   help="η, the schedule's peak learning rate (constant: every step's; "
                   "exponential: η_0)")
    q.add_argument("--warmup", type=int, default=d["warmup"], metavar="STEPS",
                   help="warmup-cosine, warmup-stable-decay: linear warmup from η = 0 over "
                   "this many steps (None: 0)")
    q.add_argument("--decay-start", type=int, default=d["decay_start"], metavar="STEP",
                   help="warmup-stable-decay: η stays at --lr until this step (None: 80 "
                   "%% of --decay-end rounded down, at least --warmup: the last 20 %% decays)")
    q.add_argument("--decay-end", type=int, default=d["decay_end"], metavar="STEP",
                   help="warmup-cosine, warmup-stable-decay: the step at which the decay "
                   "reaches --end-lr (None: the run's last step, -T)")
    q.add_argument("--end-lr", type=float, default=d["end_lr"],
                   help="warmup-cosine, warmup-stable-decay: η at --decay-end and after, in "
                   "[0, --lr] (None: 0)")
    q.add_argument("--decay-rate", type=float, default=d["decay_rate"], metavar="R",
                   help="exponential (needed there): η_t = --lr·R^t, R in (0, 1]")
    q.add_argument("--weight-decay", type=float, default=d["weight_decay"], metavar="LAMBDA",
                   help="weight decay λ >= 0, decoupled (θ ← θ − η_t·λθ; None: 0 for sgd, "
                   f"{ADAMW_WEIGHT_DECAY:g} for adamw; adam takes none)")
    q.add_argument("--l2", action="store_true",
                   help="sgd: weight decay as λ/2·‖θ‖² in the loss instead of decoupled")
    q.add_argument("-B", "--batch-size", type=int, default=None,
                   help="mini-batch size (None: N, full-batch GD)")
    q.add_argument("-m", "--momentum", type=float, default=d["momentum"],
                   help="sgd: heavy-ball momentum in [0, 1) (Adam's β₁ is --b1)")
    q.add_argument("--nesterov", action="store_true",
                   help="sgd: Nesterov momentum (needs -m > 0)")
    for flag, key, what in (("--b1", "b1", "β₁"), ("--b2", "b2", "β₂"),
                            ("--adam-eps", "adam_eps", "ε")):
        q.add_argument(flag, type=float, default=d[key],
                       help=f"adam, adamw: {what} (None: {ADAM_DEFAULTS[key]:g})")


def _parser() -> argparse.ArgumentParser:
    from ntk_tt import __version__

    p = Parser(prog="ntk-tt", description=DESCRIPTION, allow_abbrev=False)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command")
    q = sub.add_parser("predict", help="predict T_ε for a task (and --verify it for real)",
                       formatter_class=DefaultsFormatter,
                       allow_abbrev=False)
    d = DEFAULTS
    _add_task_options(q, d)
    q.add_argument("--test-per-class", type=int, default=d["test_per_class"],
                   help="held-out images per class (>= 0; fewer, with a note, when the class "
                   "has not that many left after n)")
    q.add_argument("-T", "--steps", type=int, default=d["steps"],
                   help="T, optimiser steps predicted (and fine-tuned with --verify)")
    _add_optimizer_options(q, d)
    q.add_argument("--loss", default=d["loss"], **_choice(("cross_entropy", "mse")),
                   help="training loss")
    q.add_argument("--method", default=d["method"],
                   **_choice(("auto", "closed_form", "ode", "sde", "discrete")),
                   help="dynamics solver (auto = discrete, exact for the linearised model; "
                   "closed_form needs --loss mse and no -B; closed_form, ode and sde take "
                   "--optimizer sgd with any schedule and weight decay, not adam/adamw)")
    q.add_argument("--kernel", default=d["kernel"], choices=("exact", "traced", "sketch"),
                   help="how the empirical NTK is computed")
    q.add_argument("--predictor", default=d["predictor"],
                   **_choice(("auto", "head_aware", "linear")),
                   help="head_aware: fresh head exact, backbone linearised (its kernel grows "
                   "with the head, the most accurate measured); linear: the whole network "
                   "linearised, Θ frozen at w0 (paper Sec. 3); auto: head_aware unless "
                   "--method/--kernel ask for what only linear has")
    q.add_argument("--backbone", default=d["backbone"],
                   choices=BACKBONES,
                   help="head-aware feature kernel (default: diagonal, isotropic with "
                   "--segments > 1): diagonal: the features' k = 5 leading principal "
                   "directions, without the blocks between them, k blocks N² (the cost of Θ; "
                   "Adam's K_P in the same form); isotropic k_b⊗I, kronecker k_b⊗S, exact "
                   "(N·F)² (small N only), subspace: exact on the features' k = min(16, F) "
                   "leading principal directions, (N·k)² (not with --segments > 1)")
    q.add_argument("--subspace-dim", type=int, default=d["subspace_dim"], metavar="K",
                   help="with --backbone subspace / diagonal: its k feature directions "
                   "(default 16 / 5; cost grows as k² / k)")
    q.add_argument("--segments", type=int, default=d["segments"],
                   help="head-aware: re-linearise the backbone along the predicted path this "
                   "many times (one kernel each)")
    q.add_argument("--subset", type=int, default=None, metavar="N'",
                   help="predict from the logit-summed kernel of a class-balanced subset of "
                   "N' images (App. D: no N×N kernel); only with --loss mse and no -B (sgd, any "
                   "--schedule and -m, no --weight-decay); the loss curve only (None: the "
                   "full kernel)")
    q.add_argument("--subset-method", default=d["subset_method"],
                   **_choice(("power_law", "nystrom")),
                   help="with --subset: power_law (App. D power-law tails from Θ(X', X')) or "
                   "nystrom (the cross kernel Θ(X, X'), N·N' entries)")
    q.add_argument("--sketch-dim", type=int, default=None,
                   help="D' of the random projection; only with --kernel sketch or --method sde "
                   "(default there: 256)")
    q.add_argument("--num-paths", type=int, default=argparse.SUPPRESS,
                   help="SGD batch orders (or SDE paths) averaged, with -B < N only; path 0 is "
                   "the --verify run's order (same --seed), so 1 predicts that very run "
                   f"(default there: {d['num_paths']})")
    for flag, dest, what in (
            ("--loss-target", "loss_targets", "mean training loss L* > 0"),
            ("--error-target", "error_targets", "training error rate e* in [0, 1]"),
            ("--accuracy-target", "accuracy_targets", "held-out accuracy A in (0, 1], i.e. "
             "held-out error <= 1 - A (needs --test-per-class >= 1)")):
        q.add_argument(flag, action="append", dest=dest, metavar="X[,X...]",
                       help=f"absolute target: report the steps (and wall-clock time) until the "
                       f"{what} is reached, predicted and with --verify real; repeat it or "
                       "give a comma list")
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
    s = _suggest_parser(sub)
    o = sub.add_parser("outcome", help="predict how runs end from their first steps' telemetry",
                       formatter_class=DefaultsFormatter,
                       allow_abbrev=False)
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
    p.commands = {"predict": q, "suggest": s, "outcome": o}
    return p


# predict's schedule flags given to suggest, whose optimizer search has a fixed schedule
SUGGEST_SCHEDULE = {
    "--schedule": "is always warmup-cosine with --optimizer (constant η without); it searches "
                  "the peak --lr-min/--lr-max and the warmup fraction --warmups",
    **{flag: "is not searched: suggest's schedule is constant η, or with --optimizer a "
             "warmup-cosine decaying to 0 at T_max"
       for flag in ("--end-lr", "--decay-end", "--decay-start", "--decay-rate")},
}


def parse(argv: list[str]) -> tuple[argparse.Namespace, argparse.ArgumentParser]:
    """``(args, parser)`` of ``argv``. An unrecognised argument of a command (abbreviations
    are refused on purpose: ``--opt``) is that command's error, with its usage line and the
    option meant when one is close (argparse's own reports the top-level usage). Flags before
    any command (``ntk-tt --lr 0.01``) are an error that says to name the command first."""
    parser = _parser()
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version", "--"):
        _flags_first(parser, argv)
    args, rest = parser.parse_known_args(argv)
    if rest:
        command = parser.commands.get(args.command, parser)
        flags = [f for a in command._actions for f in a.option_strings if f.startswith("--")]
        close = [m for r in rest if r.startswith("-") and r != "--"
                 for m in ([f for f in flags if f.startswith(r.split("=")[0])]
                           or difflib.get_close_matches(r.split("=")[0], flags, n=1))]
        hint = f" (did you mean {' or '.join(dict.fromkeys(close))}?)" if close else ""
        typed = [r.split("=")[0] for r in rest]  # the flag, or 5+ characters of it
        others = {f: name for name, c in parser.commands.items() if name != args.command
                  for a in c._actions for f in a.option_strings if f.startswith("--")}
        if elsewhere := [t for t in typed if t in others]:  # not a near miss of this command's
            hint = f" ({elsewhere[0]} is an option of {others[elsewhere[0]]}, not of " \
                   f"{args.command})"
        fixed = [f for t in typed for f in SUGGEST_SCHEDULE
                 if f == t or (len(t) >= 5 and f.startswith(t))]
        if args.command == "suggest" and fixed:  # not a near miss: suggest has no such flag
            hint = f" (suggest's schedule is not chosen: {fixed[0]} {SUGGEST_SCHEDULE[fixed[0]]})"
        command.error(f"unrecognized arguments: {' '.join(rest)}{hint}")
    return args, parser


def _flags_first(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """The error for flags given before the command: the command line to type instead (the
    command named later in ``argv``, else the first of predict, suggest, outcome that has the
    first flag) when every flag given is that command's; else which flag it lacks."""
    def has(command: str, token: str) -> bool:
        flag = token.split("=")[0]
        flags = [f for a in parser.commands[command]._actions for f in a.option_strings]
        return any(flag == f or (len(f) == 2 and flag.startswith(f)) for f in flags)

    named = [a for a in argv if a in parser.commands]
    command = named[0] if named else next(
        (c for c in parser.commands if has(c, argv[0])), "predict")
    rest = [a for a in argv if a != command] if named else argv
    flags = [a for a in rest if a.startswith("-") and not NEGATIVE_NUMBER.match(a)]
    if lacking := [f for f in flags if not has(command, f)]:
        parser.error(f"unrecognized argument {lacking[0]!r} for 'ntk-tt {command}': give the "
                     f"command first ('ntk-tt {command} -h' lists its flags; commands: predict, "
                     "suggest, outcome).")
    parser.error(f"name the command before its flags, e.g. 'ntk-tt {command} "
                 f"{' '.join(rest)}' (commands: predict, suggest, outcome; 'ntk-tt' alone "
                 "runs predict --verify).")


def _suggest_parser(sub) -> argparse.ArgumentParser:
    from ntk_tt._defaults import SUGGEST_DEFAULTS as d
    from ntk_tt._options_suggest import (
        ADAM_LEARNING_RATE_RANGE,
        FAMILIES,
        FAMILY_DEFAULTS,
        WARMUPS,
    )

    q = sub.add_parser(
        "suggest", help="choose (η, m, B) minimising the predicted wall-clock time to a target "
        "loss, without training", formatter_class=DefaultsFormatter,
        allow_abbrev=False,
        description="Predict the loss curve of every configuration of a grid of κ = η·λ_max/N "
        "× momenta × batch sizes from one kernel, refine the best by jax.grad, and print the "
        "(η, m, B) whose predicted curve reaches the target in the least wall-clock time (steps "
        "× measured seconds per real step), without predicted divergence. With --optimizer, "
        "the grid is the peak learning rate × warmup of a warmup-cosine schedule for an "
        "SGD-momentum or AdamW template. Exit status 0 with a "
        "suggestion, 1 when no configuration reaches the target, 2 on bad input.")
    _add_task_options(q, d)
    q.add_argument("--target", type=float, default=d["target"],
                   help="target mean training loss: a fraction of the initial loss L_0 in (0, 1) "
                   "(--target-kind fraction) or an absolute value below L_0 (absolute)")
    q.add_argument("--target-kind", default=d["target_kind"], choices=("fraction", "absolute"),
                   help="how --target is read")
    q.add_argument("-T", "--max-steps", type=int, default=d["steps"], dest="steps",
                   help="T_max, the step budget: the target must be reached within it")
    q.add_argument("-B", "--batch-sizes", default=None, action="append",
                   help="candidate batch sizes, comma-separated (or -B repeated); N = "
                   "full-batch GD (default: N,50); without -B, 50 is left out when N = K·n <= 50")
    q.add_argument("-m", "--momenta", default=argparse.SUPPRESS, action="append",
                   help="heavy-ball momenta of the grid, comma-separated (or -m repeated), each "
                   "in [0, 1); with "
                   "--optimizer sgd one value, the template's momentum (there "
                   f"{FAMILY_DEFAULTS['sgd']['momentum']:g} if not given) (default: "
                   f"{','.join(f'{m:g}' for m in d['momenta'])})")
    q.add_argument("--kappa-min", type=float, default=argparse.SUPPRESS,
                   help="smallest κ = η·λ_max/N of the log grid and of the refinement "
                   f"(default: {d['kappa_min']:g})")
    q.add_argument("--kappa-max", type=float, default=argparse.SUPPRESS,
                   help="largest κ of the log grid and of the refinement (beyond the "
                   f"stability edge is never suggested) (default: {d['kappa_max']:g})")
    q.add_argument("--kappa-eff-max", type=float, default=None, metavar="KAPPA",
                   help="largest effective κ̃ = κ/(1 − m) a suggestion may have (with "
                   "--optimizer sgd: κ_peak/(1 − m)), e.g. 12, where the benchmark measured "
                   "the predictions (default: no cap; not with --optimizer adamw)")
    q.add_argument("--num-kappas", type=int, default=d["num_kappas"],
                   help="κ values of the log grid (with --optimizer: peak learning rates)")
    q.add_argument("--optimizer", default=None, choices=FAMILIES,
                   help="search the peak learning rate × warmup of a warmup-cosine schedule "
                   "(cosine to -T) for this optimiser instead of constant-η (η, m, B): sgd "
                   "(heavy ball, -m one momentum, decoupled --weight-decay) or adamw (--b1, "
                   "--b2; head-aware predictor); -B at most one batch size (None: N)")
    q.add_argument("--weight-decay", type=float, default=None, metavar="LAMBDA",
                   help="with --optimizer: weight decay λ >= 0, decoupled (None: "
                   f"{FAMILY_DEFAULTS['sgd']['weight_decay']:g} for sgd, "
                   f"{FAMILY_DEFAULTS['adamw']['weight_decay']:g} for adamw)")
    for flag, key in (("--b1", "b1"), ("--b2", "b2")):
        q.add_argument(flag, type=float, default=None,
                       help=f"--optimizer adamw: β{key[1]} (None: "
                       f"{FAMILY_DEFAULTS['adamw'][key]:g})")
    q.add_argument("--warmups", default=None, metavar="F[,F...]", action="append",
                   help="with --optimizer: warmup lengths of the grid (comma-separated, or the "
                   "flag repeated) as fractions of -T in "
                   "[0, 1), rounded to whole steps, each below -T (None: "
                   f"{','.join(f'{w:g}' for w in WARMUPS)})")
    q.add_argument("--lr-min", type=float, default=None,
                   help="with --optimizer: smallest peak η of the log grid and of the "
                   "refinement (sgd: with --lr-max; "
                   "None: sgd the κ grid, adamw "
                   f"{ADAM_LEARNING_RATE_RANGE[0]:g})")
    q.add_argument("--lr-max", type=float, default=None,
                   help="with --optimizer: largest peak η of the log grid and of the "
                   "refinement (sgd: with --lr-min; None: sgd the κ "
                   f"grid, adamw {ADAM_LEARNING_RATE_RANGE[1]:g})")
    q.add_argument("--refine-steps", type=int, default=d["refine_steps"],
                   help="jax.grad evaluations refining the best grid point in (log η, m) (with "
                   "--optimizer: (log peak η, warmup)); 0: none")
    q.add_argument("--num-paths", type=int, default=argparse.SUPPRESS,
                   help="SGD batch orders averaged in each predicted SGD curve, with a -B < N "
                   f"only (default there: {d['num_paths']})")
    q.add_argument("--loss", default=d["loss"], **_choice(("cross_entropy", "mse")),
                   help="training loss")
    q.add_argument("--predictor", default=d["predictor"],
                   **_choice(("auto", "head_aware", "linear")),
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
    return q
