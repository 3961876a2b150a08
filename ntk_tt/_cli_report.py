"""The text ``ntk-tt predict`` prints: the table of a :func:`ntk_tt.predict_task` report."""

from __future__ import annotations

import math
import re

from ntk_tt._options_optimizer import describe_optimizer
from ntk_tt._options_predict import NO_INTERVAL

ADAM_KAPPA = " (plain GD's number: Adam's edge is its weight travel ρ)"


def _fmt(v, unit=""):
    return "undefined" if v is None else f"{v:.1f}{unit}" if unit else f"{v:g}"


# short forms of the reasons a T_ε is undefined (ntk_tt.dynamics._training_time.REASONS, and
# "diverged at step k" for a real run), matched by a phrase each contains
_SHORT_REASONS = (("predicted to diverge", "diverges"), ("diverged", "diverged"),
                  ("NaN or inf", "curve not finite"),
                  ("flat or rising", "curve not falling"),
                  ("no step comes within", "never within ε of L_T"),
                  ("not predicted: the subset", "not predicted (--subset: loss curve only)"),
                  ("beyond the stability edge", "beyond the stability edge: cannot tell"),
                  ("does not reach the target", "not reached within T"),
                  ("not recorded", "not recorded"))


def _predicted_verdict(r: dict):
    """The prediction's call on the real run for the report's last line (its ``divergence``,
    ``ntk_tt.dynamics._divergence.call``): True / False, True with why when the predicted
    curve itself did not diverge (κ ≥ 68), or "unknown" with why (beyond the stability edge,
    a predictor that cannot blow up there; or Adam's weight travel ρ > 1)."""
    from ntk_tt.dynamics._regime import UNKNOWN_TRAVEL  # after the work: JAX is loaded

    said = r["predicted"].get("divergence")
    travel = r["predicted"].get("hyperparameters", {}).get("weight_travel") or 0.0
    if said == "unknown" and travel > UNKNOWN_TRAVEL:
        return (f"unknown (Adam's weight travel ρ = {travel:.2g} > {UNKNOWN_TRAVEL:g}: the "
                "linearised model cannot tell)")
    if said == "unknown":
        return "unknown (beyond the stability edge: the linearised model cannot tell)"
    if said is None:  # a report written before the call existed
        return r["diverged"]["predicted"]
    why = r["predicted"].get("divergence_reason")
    return f"{said == 'yes'}" + (f" ({why})" if why else "")


def _real_verdict(r: dict):
    """The real run's side of the report's last line: its flag (non-finite, or L_T > L_0;
    README "Diverged means"), with why its outcome is "diverges" nonetheless after a spike
    above 10·L_0 that fell back (a fresh user read "real False" beside "outcome: ... real
    diverges" as a contradiction)."""
    real, flag = r["real"], r["diverged"]["real"]
    if not flag and real.get("outcome") == "diverges" and real.get("spiked_at") is not None:
        return (f"False (but it spiked above 10·L_0 at step {real['spiked_at']} and fell back: "
                "outcome diverges)")
    return flag


def _outcome_line(r: dict) -> list[str]:
    """"outcome: predicted X, real Y" (converges / catapult / diverges / unknown, with the
    first step above L_0); [] for a report without outcomes."""
    sides = [(name, side) for name, side in (("predicted", r["predicted"]), ("real", r["real"]))
             if side and side.get("outcome")]
    if not sides:
        return []
    return ["outcome: " + ", ".join(
        f"{name} {side['outcome']}" + ("" if side.get("spike_step") is None
                                       else f" (first above L_0 at step {side['spike_step']})")
        for name, side in sides)]


def _short(reason: str | None) -> str:
    if not reason:
        return "no reason given"
    return next((short for key, short in _SHORT_REASONS if key in reason), reason)


def _why_undefined(side: dict, curve: str, eps: str) -> str | None:
    """Short reason for an undefined T_ε on one side of the report (None when defined)."""
    if side["training_time"][curve][eps] is not None:
        return None
    return _short((side.get("training_time_reasons") or {}).get(curve, {}).get(eps))


def _real_cells(steps, wall, rel) -> str:
    """The real columns of a table row: steps, wall-clock time, relative error."""
    return (f" {_fmt(steps):>9} {_fmt(wall, ' s'):>10} "
            f"{'n/a' if rel is None else f'{100 * rel:.0f} %':>10}")


def _target_name(curve: str, target: str) -> str:
    """"loss ≤ 0.5", "error ≤ 0.2", "held-out accuracy ≥ 0.9" (the held-out error ≤ 0.1)."""
    if curve == "test_error":
        return f"held-out accuracy ≥ {round(1.0 - float(target), 12):g}"
    return f"{curve.replace('test_', 'held-out ')} ≤ {float(target):g}"


def _target_lines(r: dict) -> list[str]:
    """The "steps to target" section: predicted (and real) steps and wall-clock time to each
    absolute target, the relative error, the short reason of an undefined one; [] without
    targets."""
    pred, real = r["predicted"], r["real"]
    targets = pred.get("steps_to_target") or {}
    if not targets:
        return []
    width = max(len(_target_name(c, t)) for c, per in targets.items() for t in per)
    clock = pred.get("target_wall_clock")  # None: no real step timed yet
    head = (f"{'steps to target':{width}} {'predicted':>9}"
            + (f" {'pred. wall-clock':>17}" if clock else "")
            + (f" {'real':>9} {'real wall':>10} {'rel. error':>10}" if real else ""))
    lines = [head]
    for c, per in targets.items():
        for t, steps in per.items():
            row = (f"{_target_name(c, t):{width}} {_fmt(steps):>9}"
                   + (f" {_fmt(clock[c][t], ' s'):>17}" if clock else ""))
            if real:
                row += _real_cells(real["steps_to_target"][c][t],
                                   real["target_wall_clock"][c][t], r["target_error"][c][t])
            why = [f"{name}: {_short(side['steps_to_target_reasons'].get(c, {}).get(t))}"
                   for name, side in (("predicted", pred), ("real", real))
                   if side and side["steps_to_target"][c][t] is None]
            if why:
                row += f"  ({'; '.join(why)})"
            lines.append(row)
    return lines


def _lower(r: dict) -> str:
    """What to lower for a run that diverged: --lr, and --weight-decay when it is on (a fresh
    user: --weight-decay 1e10 was told to lower --lr only)."""
    decay = (r.get("optimizer") or {}).get("weight_decay") or 0.0
    return "lower --lr or --weight-decay" if decay > 0 else "lower --lr"


def _diverged_lines(r: dict) -> list[str]:
    """Plain-language lines for a prediction or real run that diverged, or spiked and
    recovered."""
    pred, real, lines = r["predicted"], r["real"], []
    fix = _lower(r)
    if pred["diverged"]:  # closed_form warns only of its η/(1 − m) model's edge (m > 0)
        own = (pred["method"] == "closed_form" and pred.get("warnings")
               and not pred.get("beyond_edge"))
        lines.append(f"prediction diverged at step {pred['diverged_at']}: no predicted T_ε "
                     + ("(the closed form's GD model with η/(1 − m) diverged, not heavy ball: "
                        "use --method discrete)" if own else f"({fix})"))
    elif _called_divergent(pred):
        lines.append("prediction: the real run is predicted to diverge "
                     f"({pred['divergence_reason']}): no predicted T_ε, steps to target or "
                     f"comparison ({fix})")
    if real and real["diverged"]:
        lines.append(f"real run diverged at step {real['diverged_at']}: no real T_ε ({fix})")
    if real and not real["diverged"] and real.get("spiked_at") is not None:
        lines.append(f"real run spiked above 10·L_0 at step {real['spiked_at']} and "
                     "recovered below L_0 (outcome diverges: every measured real run "
                     f"that did ended untrained; {_spiked_training_time(real)})")
    return lines


def _called_divergent(pred: dict) -> bool:
    """A prediction whose curve did not diverge but whose call on the real run is
    "diverges" (a spike above 10·L_0, or κ ≥ 68): it predicts no run to compare."""
    return not pred["diverged"] and pred.get("outcome") == "diverges"


def _spiked_training_time(side: dict) -> str:
    """What the T_ε rows say of a curve that spiked and recovered: measured as usual (the
    curve ends below its start), or which are undefined and why (the spike can leave the
    fall L_0 − L_T within the curve's noise: "curve not falling")."""
    times = side["training_time"]
    undefined = [(c, e) for c in times for e in times[c] if times[c][e] is None]
    if not undefined:
        return "T_ε measured as usual"
    why = ", ".join(dict.fromkeys(_why_undefined(side, c, e) for c, e in undefined))
    if len(undefined) == sum(len(per) for per in times.values()):
        return f"no T_ε: {why}"
    return f"T_ε measured as usual where the table gives one; the others: {why}"


def _comparison_lines(r: dict) -> list[str]:
    """Loss-curve distance and held-out accuracy, or why they are not meaningful."""
    pred, real, t = r["predicted"], r["real"], r["task"]
    who = [name for name, side in (("prediction", pred), ("real run", real))
           if side["diverged"]]
    if who:
        lines = [f"loss curves: not compared ({' and '.join(who)} diverged: the distance "
                 "is not meaningful)"]
    elif _called_divergent(pred):
        lines = ["loss curves: not compared (the prediction calls the real run divergent: "
                 "its linearised curve is no prediction of it)"]
    else:
        dist = r["curve_distance"]["loss"]
        rel = dist["max_rel_to_fall"]
        share = (f"{100 * rel:.3g} % of the real fall {dist['real_fall']:.4g}"
                 if rel is not None else
                 f"real fall {dist['real_fall']:.4g}: not positive, no relative distance")
        lines = [f"loss curves: max |predicted − real| = {dist['max_abs']:.3g} ({share})"]
    if not t["n_test"]:
        lines.append("held-out accuracy at T: no held-out images (--test-per-class 0)")
    else:
        acc = [f"{name} " + ("not meaningful (diverged)" if side["diverged"]
                             else "not meaningful (predicted to diverge)"
                             if side is pred and _called_divergent(pred)
                             else "n/a (--subset: not predicted)"
                             if side["test_accuracy"] is None
                             else f"{side['test_accuracy']:.3f}")
               for name, side in (("predicted", pred), ("real", real))]
        lines.append(f"held-out accuracy at T: {', '.join(acc)}")
    return lines


def _ratio(r: dict) -> str:
    """The fine-tuning / prediction wall-time ratio, or why it means nothing."""
    pred, real = r["predicted"], r["real"]
    if real["diverged"]:
        return (f"not meaningful (the real run diverged: its loss rose from step "
                f"{real['diverged_at']} on and did not come back)")
    if pred["diverged"]:
        return "not meaningful (the prediction diverged: it predicts no T_ε to compare)"
    if _called_divergent(pred):
        return "not meaningful (the prediction calls divergence: it predicts no T_ε to compare)"
    return f"{r['seconds']['ratio']:.3g}"


def _interval(pred: dict, curve: str, eps: str) -> str:
    """The 90 % interval of a predicted T_ε as "lo–hi" whole steps (widened outwards, past
    float rounding: 17.999995 reads 18; an unbounded side is 0 or ∞), "n/a" when there is none
    (error curve, undefined T_ε, an abstaining prediction, or a report written before
    intervals existed)."""
    iv = (pred.get("interval_90") or {}).get(curve, {}).get(eps)
    return "n/a" if iv is None else steps_interval(*iv)


def steps_interval(lo: float | None, hi: float | None) -> str:
    """An interval of steps as "lo–hi" whole steps, widened outwards (past float rounding:
    17.999995 reads 18; None, an unbounded side, 0 or ∞): ``predict``'s T_ε and ``outcome``'s
    T_0.1 alike (``outcome`` rounded to the nearest step, so 3.67–5.09 read 4–5)."""
    return (f"{0 if lo is None else math.floor(lo * (1 + 1e-6))}–"
            f"{'∞' if hi is None else math.ceil(hi * (1 - 1e-6))}")


# a report's κ of None: the JSON holds a non-finite κ as None, and its η is finite and > 0
# and λ_max finite, so None is κ beyond float32's range
KAPPA_OVERFLOW = "inf (η·λ_max overflows float32)"


def _g(value, none: str = "n/a") -> str:
    """A number to 3 significant digits, ``none`` where the report holds None (NaN in JSON)."""
    return none if value is None else f"{value:.3g}"


def _prediction_only(r: dict, interrupted: bool) -> str:
    """The line of a report made before any real step was timed (``predict_task``'s
    ``on_prediction`` report, or its --verify JSON before the fine-tuning ended): what is
    missing and why."""
    if r["config"].get("verify"):
        done = ("real fine-tuning interrupted before it ended" if interrupted else
                f"real fine-tuning not done ({r['status']})")
        missing = "no real T_ε or comparison; "
    else:
        done = ("interrupted while a few real training steps were timed" if interrupted else
                f"real training steps not timed yet ({r['status']})")
        missing = ""
    return (f"{done}: the table above is the prediction only ({missing}no predicted "
            "wall-clock time, which needs a real step's time)")


def _sizes(pred: dict) -> str:
    """The sketch sizes and subspace k a prediction used (its ``hyperparameters``), e.g.
    " (sketch D' = 256, noise D' = 256)"; "" when it drew none (a fresh user found them in
    neither the report nor the JSON's config, which records the flags, None for defaults)."""
    hp = pred.get("hyperparameters") or {}
    parts = [f"{what} = {hp[key]}" for key, what in (("sketch_dim", "sketch D'"),
                                                      ("noise_dim", "noise D'"),
                                                      ("subspace_dim", "k"))
             if hp.get(key) is not None]
    return f" ({', '.join(parts)})" if parts else ""


def format_report(r: dict, *, interrupted: bool = False) -> str:
    """Human-readable table of a :func:`ntk_tt.predict_task` report.

    The optimiser line names the rule, weight decay, batch size and learning-rate schedule;
    each BeyondEdgeWarning of the prediction (``predicted.warnings``) is a "warning:" line, and
    so is an N or T outside the range the 90 % intervals were calibrated on
    (``ntk_tt.intervals``'s CalibrationRangeWarning, e.g. "warning: N = 2000 training samples
    is outside the calibration table's N = 50–750 (...)"); why a prediction has no interval
    at all (``ntk_tt.intervals``' note) is a "note:" line, unless it calls divergence (said
    on its own line).
    An undefined T_ε has its short reason at the end of its row; a diverged prediction or
    real run is said in words, and comparisons it makes meaningless are not printed as
    numbers. A report of the prediction alone (no real run and ``predicted.wall_clock``
    None: ``predict_task``'s ``on_prediction`` report) has no wall-clock column and a line
    that says so; ``interrupted``: the line says the run was interrupted after the
    prediction (``ntk-tt`` prints it then).
    """
    from ntk_tt.dynamics._predict_kernel import EPSILONS

    t, pred, real = r["task"], r["predicted"], r["real"]
    lines = [
        f"task: {t['dataset']}, classes {', '.join(t['classes'])}; N = {t['n_train']} train, "
        f"{t['n_test']} held out; model {t['architecture']} (D = {t['num_params']})",
        f"images: {'×'.join(map(str, t['image_shape']))} → "
        f"{'×'.join(map(str, t['model_input_shape']))}, preprocessing: {t['preprocessing']}",
        f"prediction: method {pred['method']}, kernel {pred['kernel']}{_sizes(pred)}, "
        f"κ = η·λ_max/N = {_g(pred['kappa'], KAPPA_OVERFLOW)}"
        f"{ADAM_KAPPA if str(pred['kernel']).startswith('head_aware_adam') else ''}; "
        f"{r['seconds']['predict']:.1f} s "
        f"(compile {r['seconds']['predict_stages']['compile']:.1f} s apart)",
    ]
    if r.get("optimizer"):  # a report written before the optimiser options has none
        lines.append(f"optimiser: {describe_optimizer(r['optimizer'])}")
    noted = pred.get("warnings") or []  # the prediction's BeyondEdgeWarnings, with flags
    lines += ["warning: " + re.sub(r"method='(\w+)'", r"--method \1", w) for w in noted]
    said_diverges = pred["diverged"] or _called_divergent(pred)  # said on its own line
    lines += [("note: " if w.startswith(NO_INTERVAL) else "warning: ") + w  # no interval: n/a
              for w in pred.get("interval_warnings") or []
              if not (said_diverges and w.startswith(NO_INTERVAL))]
    if pred.get("beyond_edge") and not noted and not _called_divergent(pred):
        # (a warning of the prediction says it better; a call of divergence has its own line)
        lines.append(f"warning: κ = {_g(pred['kappa'], KAPPA_OVERFLOW)} is beyond the "
                     "linearised model's stability edge, where the real run may diverge or "
                     "spike and recover "
                     "(there 18 of 174 benchmark runs and 151 of 384 corpus runs diverged, "
                     "README) and the predicted curve and T_ε are least reliable: check it "
                     "with --verify, or lower --lr")
    sgd = (r.get("optimizer") or {}).get("optimizer") == "sgd"  # Adam: κ does not size it
    if sgd and not said_diverges and not pred.get("beyond_edge") and pred["kappa"] is not None:
        from ntk_tt.analysis._suggest_report import TESTED_KAPPA, effective_kappa_note

        keff = pred["kappa"] / (1.0 - r["optimizer"]["momentum"])
        if keff > TESTED_KAPPA:
            lines.append("note: " + effective_kappa_note(keff)
                         + (": the real run is compared below" if real else
                            ": check it with a real run (--verify)"))
    asked = r["config"]["test_per_class"]
    if t["test_per_class"] < asked:
        lines.append(f"note: {t['test_per_class']} held-out images per class, fewer than the "
                     f"{asked} asked for (only that many are left after n per class)")
    clock = pred["wall_clock"]  # None: no real step timed yet
    head = (f"{'curve':6} {'ε':>5} {'predicted T_ε':>14} {'90 % interval':>14}"
            + (f" {'pred. wall-clock':>17}" if clock else ""))
    if real:
        head += f" {'real T_ε':>9} {'real wall':>10} {'rel. error':>10}"
    lines.append(head)
    for c in ("loss", "error"):
        for e in EPSILONS:
            k = str(e)
            row = (f"{c:6} {e:>5g} {_fmt(pred['training_time'][c][k]):>14} "
                   f"{_interval(pred, c, k):>14}"
                   + (f" {_fmt(clock[c][k], ' s'):>17}" if clock else ""))
            if real:
                row += _real_cells(real["training_time"][c][k], real["wall_clock"][c][k],
                                   r["relative_error"][c][k])
            why = [f"{name}: {w}" for name, side in (("predicted", pred), ("real", real))
                   if side and (w := _why_undefined(side, c, k))]
            if why:
                row += f"  ({'; '.join(why)})"
            lines.append(row)
    lines += _target_lines(r)
    lines += _diverged_lines(r)
    if real:
        s = r["seconds"]
        lines.append(
            f"real fine-tuning: {real['seconds_per_step'] * 1e3:.0f} ms/step, training "
            f"{s['finetune']:.1f} s (compile {s['compile_finetune']:.1f} s apart); "
            f"fine-tuning / prediction wall time = {_ratio(r)}")
        lines += _comparison_lines(r)
        lines += _outcome_line(r)
        lines.append(f"diverged: predicted {_predicted_verdict(r)}, real {_real_verdict(r)}")
    else:
        if not clock:
            lines.append(_prediction_only(r, interrupted))
        lines += _outcome_line(r)
        lines.append(f"diverged: predicted {_predicted_verdict(r)}")
    return "\n".join(lines)
