"""``ntk-tt``: predict fine-tuning training time from the empirical NTK, without training.

    ntk-tt                      # the embedded default end to end (= ntk-tt predict --verify)
    ntk-tt predict [options]    # predicted T_ε and wall-clock time; --verify also fine-tunes

Bad input ends with one ``ntk-tt: error: ...`` line (exit status 2), never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from ntk_tt._job import DEFAULTS, predict_task
from ntk_tt._predict_kernel import EPSILONS


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ntk-tt", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command")
    q = sub.add_parser("predict", help="predict T_ε for a task (and --verify it for real)")
    d = DEFAULTS
    q.add_argument("--checkpoint", default=None, help="orbax checkpoint dir (default: shipped)")
    q.add_argument("--dataset", default=d["dataset"],
                   help="short name (ntk_tt.known_datasets()), a prepared TFDS name, or a "
                   "path to an .npz file with keys images (N×H×W×C or N×H×W, uint8 or float in "
                   "[0, 255]), labels (integers in [0, K), N) and class_names (K strings)")
    q.add_argument("--data-dir", default=None, help="TFDS data_dir holding prepared sets")
    q.add_argument("--split", default=d["split"], help="TFDS split")
    q.add_argument("-K", "--classes", type=int, default=d["num_classes"], dest="num_classes")
    q.add_argument("-n", "--per-class", type=int, default=d["per_class"])
    q.add_argument("--test-per-class", type=int, default=d["test_per_class"],
                   help="held-out images per class (>= 0; fewer, with a note, when the class "
                   "has not that many left after n)")
    q.add_argument("-T", "--steps", type=int, default=d["steps"])
    q.add_argument("--lr", type=float, default=d["learning_rate"], dest="learning_rate")
    q.add_argument("-B", "--batch-size", type=int, default=None, help="default: N (GD)")
    q.add_argument("-m", "--momentum", type=float, default=d["momentum"])
    q.add_argument("--nesterov", action="store_true", help="Nesterov momentum (needs -m > 0)")
    q.add_argument("--loss", default=d["loss"], choices=("cross_entropy", "mse"))
    q.add_argument("--method", default=d["method"],
                   choices=("auto", "closed_form", "ode", "sde", "discrete"))
    q.add_argument("--kernel", default=d["kernel"], choices=("exact", "traced", "sketch"))
    q.add_argument("--sketch-dim", type=int, default=None,
                   help="D' of the random projection; only with --kernel sketch or --method sde")
    q.add_argument("--num-paths", type=int, default=d["num_paths"])
    q.add_argument("--seed", type=int, default=d["seed"])
    q.add_argument("--no-resize", action="store_false", dest="resize",
                   help="fail instead of resizing images to the model's input size")
    q.add_argument("--head-scale", type=float, default=d["head_scale"],
                   help="init scale of the fresh head (× LeCun normal)")
    q.add_argument("--verify", action="store_true", help="also fine-tune for real and compare")
    q.add_argument("--figure", default="ntk_tt_predict.png", dest="figure_path",
                   help="figure file, any matplotlib format by its extension (default: "
                   "ntk_tt_predict.png in the current directory; '' for none)")
    q.add_argument("--json", default=None, dest="json_path", help="also write the report here")
    q.add_argument("--no-progress", action="store_false", dest="progress")
    return p


def _fmt(v, unit=""):
    return "undefined" if v is None else f"{v:.1f}{unit}" if unit else f"{v:g}"


# short forms of the reasons a T_ε is undefined (ntk_tt._training_time.REASONS, and
# "diverged at step k" for a real run), matched by a phrase each contains
_SHORT_REASONS = (("diverged", "diverged"), ("NaN or inf", "curve not finite"),
                  ("flat or rising", "curve not falling"),
                  ("no step comes within", "never within ε of L_T"))


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
                             else _fmt(side["test_accuracy"]))
               for name, side in (("predicted", pred), ("real", real))]
        lines.append(f"held-out accuracy at T: {', '.join(acc)}")
    return lines


def format_report(r: dict) -> str:
    """Human-readable table of a :func:`ntk_tt.predict_task` report.

    An undefined T_ε has its short reason at the end of its row; a diverged prediction or
    real run is said in words, and comparisons it makes meaningless are not printed as
    numbers.
    """
    t, pred, real = r["task"], r["predicted"], r["real"]
    lines = [
        f"task: {t['dataset']}, classes {', '.join(t['classes'])}; N = {t['n_train']} train, "
        f"{t['n_test']} held out; model {t['architecture']} (D = {t['num_params']})",
        f"prediction: method {pred['method']}, kernel {pred['kernel']}, "
        f"κ = η·λ_max/N = {pred['kappa']:.3g}; {r['seconds']['predict']:.1f} s "
        f"(compile {r['seconds']['predict_stages']['compile']:.1f} s apart)",
    ]
    if pred.get("beyond_edge"):
        lines.append(f"warning: κ = {pred['kappa']:.3g} is beyond the linearised model's "
                     "stability edge: the real run will likely diverge or oscillate; the "
                     "predicted curve and T_ε are not trustworthy; lower --lr")
    asked = r["config"]["test_per_class"]
    if t["test_per_class"] < asked:
        lines.append(f"note: {t['test_per_class']} held-out images per class, fewer than the "
                     f"{asked} asked for (only that many are left after n per class)")
    head = f"{'curve':6} {'ε':>5} {'predicted T_ε':>14} {'pred. wall-clock':>17}"
    if real:
        head += f" {'real T_ε':>9} {'real wall':>10} {'rel. error':>10}"
    lines.append(head)
    for c in ("loss", "error"):
        for e in EPSILONS:
            k = str(e)
            row = (f"{c:6} {e:>5g} {_fmt(pred['training_time'][c][k]):>14} "
                   f"{_fmt(pred['wall_clock'][c][k], ' s'):>17}")
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
            f"fine-tuning / prediction wall time = {_fmt(s['ratio'])}")
        lines += _comparison_lines(r)
        lines.append(f"diverged: predicted {r['diverged']['predicted']}, "
                     f"real {r['diverged']['real']}")
    else:
        lines.append(f"diverged: predicted {r['diverged']['predicted']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Console entry point; with no arguments runs ``predict --verify`` on the defaults."""
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    args = parser.parse_args(argv or ["predict", "--verify"])
    if args.command != "predict":
        parser.error("choose a command: predict")
    opts = vars(args)
    opts.pop("command")
    try:
        report = predict_task(**opts)
    except ValueError as err:
        parser.exit(2, f"ntk-tt: error: {err}\n")
    print(format_report(report))
    if opts["figure_path"]:
        print(f"figure: {opts['figure_path']}")
    if opts["json_path"]:
        print(f"json: {opts['json_path']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
