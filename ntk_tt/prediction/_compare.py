"""Prediction vs reality: T_ε errors, curve distance, linearisation gap, accuracy, wall time.

One definition of every quantity for both sides (paper Sec. 5, Alg. 1): T_ε comes from
:func:`ntk_tt.training_time` applied to the predicted and to the measured curve alike; the
predicted wall-clock time is T̂_ε × the real run's measured seconds per training step; the
prediction's time is its Jacobians + kernel + solve, the fine-tuning's time its training
steps only (the per-step full-set evaluation is measurement, and compile time is apart).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from ntk_tt.dynamics._divergence import outcome
from ntk_tt.dynamics._predict_kernel import EPSILONS
from ntk_tt.dynamics._targets import curve_targets
from ntk_tt.dynamics._training_time import (
    curve_window,
    training_time_report,
    wall_clock_time,
)
from ntk_tt.prediction._intervals import CalibrationRangeWarning, intervals
from ntk_tt.prediction._result import Prediction, outcome_fields
from ntk_tt.training._finetune import FineTuneRun
from ntk_tt.training._optimizer_run import optimizer_hyperparameters

CURVES = ("loss", "error")


def _num(v: Any) -> float | None:
    """JSON-friendly float: NaN / inf become None."""
    v = float(v)
    return v if math.isfinite(v) else None


def real_training_time(run: FineTuneRun) -> tuple[dict, dict]:
    """T_ε of the measured curves: ({curve: {ε: steps or None}}, {curve: {ε: reason}}).

    A diverged run has no T_ε (its held curve has no meaningful L_T): every entry is None
    with the reason ``"diverged at step k"``.
    """
    times, reasons = {}, {}
    for name in CURVES:
        times[name], reasons[name] = {}, {}
        for eps in EPSILONS:
            if run.diverged:
                times[name][eps] = None
                reasons[name][eps] = f"diverged at step {run.diverged_at}"
                continue
            curve = getattr(run, name)
            t, why = training_time_report(curve, eps, window=curve_window(len(curve)))
            times[name][eps] = _num(t)
            if why:
                reasons[name][eps] = why
    return times, reasons


NOT_RECORDED = ("not recorded: the run has no held-out curve (finetune(..., x_test=..., "
                "record_test_curves=True) records one)")


def real_steps_to_target(run: FineTuneRun, targets: dict) -> tuple[dict, dict]:
    """Steps to the absolute ``targets`` ({curve: (target, ...)}) on the measured curves, by
    the definition of the prediction's (:func:`ntk_tt.steps_to_target`, window
    ``curve_window``): ({curve: {target: steps or None}}, {curve: {target: reason}}). A
    diverged run has none, with the reason "diverged at step k" (as its T_ε); a held-out
    curve the run did not record has none, with the reason ``NOT_RECORDED``."""
    curves = {"loss": run.loss, "error": run.error,
              "test_loss": NOT_RECORDED if run.test_loss is None else run.test_loss,
              "test_error": NOT_RECORDED if run.test_error is None else run.test_error}
    steps, reasons = curve_targets(
        curves, targets, window=curve_window(len(run.loss)),
        undefined=f"diverged at step {run.diverged_at}" if run.diverged else None)
    return {c: {t: _num(v) for t, v in per.items()} for c, per in steps.items()}, reasons


def _curve_distance(pred: np.ndarray, real: np.ndarray) -> dict[str, float | None]:
    """max and RMS |pred − real| over steps, and the max relative to the real fall L_0 − L_T."""
    diff = np.abs(np.asarray(pred, float) - np.asarray(real, float))
    fall = float(real[0] - real[-1])
    return {"max_abs": _num(diff.max()), "rms": _num(np.sqrt(np.mean(diff**2))),
            "real_fall": _num(fall),
            "max_rel_to_fall": _num(diff.max() / fall) if fall > 0 else None}


def linearisation_gap(run: FineTuneRun) -> dict[str, list] | None:
    """‖f_t − f_lin(w_t)‖ along the real weight path, when the run recorded its logits.

    ``rms``: root mean square over samples of ‖f_t − f_lin(w_t)‖₂ per step (logit units);
    ``relative``: ‖f_t − f_lin(w_t)‖_F / ‖f_t − f_0‖_F (0 at t = 0 by convention). f_lin is
    the first-order Taylor model at w0 (paper Sec. 3), the model the predictor integrates.
    """
    if run.logits is None or run.linear_logits is None:
        return None
    gap = run.logits - run.linear_logits
    moved = np.linalg.norm((run.logits - run.logits[:1]).reshape(len(gap), -1), axis=1)
    norm = np.linalg.norm(gap.reshape(len(gap), -1), axis=1)
    rel = np.divide(norm, moved, out=np.zeros_like(norm), where=moved > 0)
    rms = np.sqrt(np.mean(np.sum(gap**2, axis=-1), axis=-1))
    return {"rms": [float(v) for v in rms], "relative": [float(v) for v in rel]}


def _clock(times: dict, seconds_per_step: float) -> dict:
    return {c: {e: None if t is None else float(wall_clock_time(t, seconds_per_step))
                for e, t in per.items()} for c, per in times.items()}


def _no_run(prediction: Prediction) -> bool:
    """The prediction diverged, or calls the real run divergent (``outcome`` "diverges"): its
    curve predicts no run to compare (no T_ε, accuracy or curve distance)."""
    return bool(prediction.diverged) or prediction.outcome == "diverges"


def predicted_summary(prediction: Prediction, seconds_per_step: float) -> dict[str, Any]:
    """The prediction's half of a report, JSON-ready.

    ``training_time`` {curve: {ε: steps or None}}, ``interval_90`` {curve: {ε: [lo, hi] steps
    or None}} (90 % conformal interval for the real T_ε, :func:`ntk_tt.intervals` with the
    shipped calibrator; None for error-curve T_ε and undefined predictions),
    ``interval_warnings`` (its N or T outside the calibration table's, [] if none),
    ``wall_clock``
    {curve: {ε: seconds}} (T_ε × ``seconds_per_step``, a measured real step),
    ``training_time_reasons``,
    ``test_accuracy`` at T (None without a held-out set, or when the prediction diverged or
    calls the real run divergent), ``diverged``, ``diverged_at``,
    ``spiked_at`` (first step with loss above 10·L_0, None if none), ``steps_to_target``
    {curve: {target: steps or None}} with ``steps_to_target_reasons`` and
    ``target_wall_clock`` {curve: {target: seconds}} (the prediction's absolute targets,
    {} for none), ``kappa``,
    ``beyond_edge``, ``divergence`` ("yes" / "no" / "unknown": the verdict on the real run)
    and ``divergence_reason``, ``outcome`` and ``spike_step`` (the call on the real run:
    converges / catapult / diverges / unknown, ``ntk_tt.dynamics._divergence``), ``method``,
    ``kernel``, ``hyperparameters`` (η, m, Nesterov, B, T, loss: what was predicted).
    """
    pred_t = {c: {e: _num(prediction.training_time[c][e]) for e in EPSILONS} for c in CURVES}
    with warnings.catch_warnings():  # recorded in "interval_warnings" instead
        warnings.simplefilter("ignore", CalibrationRangeWarning)
        iv = intervals(prediction, level=0.9)
    to_target = {c: {t: _num(v) for t, v in per.items()}
                 for c, per in prediction.steps_to_target.items()}
    return {"training_time": pred_t,
            "interval_90": {c: {e: None if iv[c][e] is None else [_num(v) for v in iv[c][e]]
                                for e in EPSILONS} for c in CURVES},
            "interval_warnings": iv["warnings"],
            "wall_clock": _clock(pred_t, seconds_per_step),
            "training_time_reasons": prediction.training_time_reasons,
            "steps_to_target": to_target,
            "steps_to_target_reasons": prediction.steps_to_target_reasons,
            "target_wall_clock": _clock(to_target, seconds_per_step),
            "test_accuracy": None if prediction.test_error is None or _no_run(prediction)
            else 1.0 - float(prediction.test_error[-1]),
            "diverged": prediction.diverged, "diverged_at": prediction.diverged_at,
            "spiked_at": prediction.spiked_at,
            "kappa": prediction.kappa, "beyond_edge": bool(prediction.beyond_edge),
            "divergence": prediction.divergence,
            "divergence_reason": prediction.divergence_reason,
            "outcome": prediction.outcome, "spike_step": prediction.spike_step,
            "method": prediction.method, "kernel": prediction.kernel,
            "hyperparameters": dict(prediction.hyperparameters)}


def _check_same_training(prediction: Prediction, run: FineTuneRun) -> None:
    if not isinstance(prediction, Prediction) or not isinstance(run, FineTuneRun):
        raise ValueError(
            "compare(prediction, run) takes a Prediction from ntk_tt.predict and a FineTuneRun "
            f"from ntk_tt.finetune, in that order; got {type(prediction).__name__} and "
            f"{type(run).__name__}.")
    hp = prediction.hyperparameters
    names = {"num_train": "N (training samples)", "loss_name": "loss"}
    pairs = [("num_train", "num_train"), ("loss", "loss_name"), ("steps", "steps"),
             ("learning_rate", "learning_rate"), ("momentum", "momentum"),
             ("nesterov", "nesterov"), ("batch_size", "batch_size")]
    wrong = []
    for mine, theirs in pairs:
        a, b = hp[mine], getattr(run, theirs)
        same = a == b if isinstance(a, str) else np.isclose(float(a), float(b), rtol=1e-6,
                                                           atol=0)
        if not same:
            wrong.append(f"{names.get(theirs, mine)}: predicted {_shown(a)}, fine-tuned "
                         f"{_shown(b)}")
        if mine == "num_train" and not same:
            break  # a different training set: the batch-size default differs too
    # the rest of the rule: schedule, weight decay, Adam (issue 27)
    real = (optimizer_hyperparameters(run.optimizer, run.steps, run.num_train)
            if run.optimizer is not None else _constant_sgd(run.learning_rate))
    said = hp if "optimizer" in hp else _constant_sgd(hp["learning_rate"])
    # coupled or decoupled only matters when both decay (the shorthand has no such key)
    keys = OPTIMIZER_KEYS + (("decoupled",) if said["weight_decay"] and real["weight_decay"]
                             else ())
    wrong += [f"{name}: predicted {_shown(said[name])}, fine-tuned {_shown(real[name])}"
              for name in keys if not _same(said[name], real[name])]
    if wrong:
        raise ValueError("the prediction and the fine-tuning run describe different training ("
                         + "; ".join(wrong) + "); predict and fine-tune on the same data with "
                         "the same hyperparameters.")
    a, b = float(prediction.loss[0]), float(run.loss[0])
    if not np.isclose(a, b, rtol=L0_RTOL, atol=0, equal_nan=True):
        raise ValueError(
            f"the prediction and the fine-tuning run start from different losses (L_0 = loss at "
            f"step 0: predicted {a:.6g}, fine-tuned {b:.6g}), so they were made on different "
            "data or weights; predict and fine-tune with the same model, weights and training "
            "data (x, y).")
    if prediction.test_loss is not None and run.test_loss is not None:
        a, b = float(prediction.test_loss[0]), float(run.test_loss[0])
        if not np.isclose(a, b, rtol=L0_RTOL, atol=0, equal_nan=True):
            raise ValueError(
                f"the prediction and the fine-tuning run start from different held-out losses "
                f"(test_loss at step 0: predicted {a:.6g}, fine-tuned {b:.6g}), so their "
                "held-out sets differ: pass the same x_test, y_test to predict and finetune.")


# the prediction's step-0 loss is the model's loss at θ0, so with the same model, weights and
# data both L_0 agree to float32 rounding (measured: <= 4e-7 relative for the exact, head-aware,
# ODE, closed-form and subset predictors); other data or weights differ by O(1)
L0_RTOL = 1e-3


# what an optimiser adds to (η_peak, m, Nesterov, B); "decoupled" matters only when both decay
OPTIMIZER_KEYS = ("optimizer", "schedule", "schedule_parameters", "learning_rate_mean",
                  "learning_rate_last", "weight_decay", "b2", "eps")


def _constant_sgd(learning_rate) -> dict:
    """The optimiser keys of the constant-η SGD shorthand (``learning_rate=``)."""
    lr = float(learning_rate)
    return {"optimizer": "sgd", "schedule": "constant", "schedule_parameters": {"value": lr},
            "learning_rate_mean": lr, "learning_rate_last": lr, "weight_decay": 0.0,
            "b2": None, "eps": None}


def _shown(v) -> str:
    """``repr`` with floats to 7 significant digits: a float32 leaf's η = 1e-3 reads 0.001, not
    0.0010000000474974513 (dicts entry by entry)."""
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k!r}: {_shown(x)}" for k, x in v.items()) + "}"
    return repr(float(f"{v:.7g}")) if isinstance(v, float) else repr(v)


def _same(a, b) -> bool:
    """Equal descriptions: numbers to float32 rounding (rtol 1e-5), dicts entry by entry."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float):
        return bool(np.isclose(a, b, rtol=1e-5, atol=0))
    return a == b


def compare(prediction: Prediction, run: FineTuneRun) -> dict[str, Any]:
    """Put a prediction and the real fine-tuning run it predicts side by side.

    Source: Zancato et al. 2020 (arXiv 2008.12478), Sec. 5 (the error |T̂_ε − T_ε|, relative
    to T_ε); METHOD.md §6. The other entries are ntk_tt's own.

    Args:
      prediction: from :func:`ntk_tt.predict` (same task, hyperparameters, steps and key).
      run: from :func:`ntk_tt.finetune`.

    Returns:
      A JSON-ready dict. ``predicted`` / ``real``: ``training_time`` {curve: {ε: steps}},
      ``wall_clock`` {curve: {ε: seconds}} (T_ε × the run's ``seconds_per_step``),
      ``test_accuracy`` at T, ``diverged``, ``diverged_at``, ``spiked_at`` (both sides use
      the rule of
      ``ntk_tt.dynamics._divergence``: diverged = a non-finite loss or L_T > L_0; a real
      run's spike above 10·L_0 that recovers is not divergence and keeps its T_ε, while a
      prediction whose call is "diverges" (such a spike, or κ ≥ 68) has none; both sides also have
      ``outcome`` and ``spike_step`` (the real run's own, the prediction's call); ``predicted``
      also
      ``kappa`` and ``beyond_edge``: κ beyond the linearised model's stability edge, where the
      predicted curve is not trustworthy; a diverged real run has every T_ε None with the
      reason "diverged at step k"). ``absolute_error`` and
      ``relative_error`` {curve: {ε: ...}} (relative = |T̂_ε − T_ε| / T_ε); the absolute
      targets of the prediction (``predict(..., targets=...)``): ``steps_to_target`` {curve:
      {target: steps}} on both sides (the real one from the run's curves by the same
      definition, :func:`real_steps_to_target`; held-out targets need a run fine-tuned with
      ``record_test_curves=True``), with ``steps_to_target_reasons`` and
      ``target_wall_clock``, and ``target_error`` {curve: {target: |ŝ − s| / s}} (None when
      either is undefined or s = 0); ``curve_distance``
      {curve: {max_abs, rms, real_fall, max_rel_to_fall}} (None when either side diverged,
      or the prediction calls divergence: not meaningful), ``linearisation_gap`` (None
      without recorded logits or when the run diverged), a diverged side's (or a prediction
      called divergent) ``test_accuracy`` is None,
      ``seconds`` {predict, finetune, compile_predict, compile_finetune,
      ratio = finetune / predict}, and
      ``diverged`` {predicted, real}. Undefined numbers are None.

    Raises:
      ValueError: arguments not a (Prediction, FineTuneRun) pair, or the two differ in N,
        loss, steps, learning rate, momentum, Nesterov or batch size (the message names each
        mismatch), or in the rest of the optimiser (``optimizer=``: the rule, its schedule,
        mean and last η_t, weight decay, Adam's b2 and eps; the constant-η keywords are
        ``ntk_tt.sgd(η, m)`` without decay) — they would not describe the same training;
        or (the rest alike) their initial losses L_0 (``loss[0]``) differ by more than
        ``L0_RTOL`` = 1e-3 relative: made on other data or weights (the same ones agree to
        float32 rounding); likewise their held-out losses at step 0 when both have a held-out
        curve (the run's needs ``record_test_curves=True``; without one the held-out sets
        are not compared).
    """
    _check_same_training(prediction, run)
    real_t, real_why = real_training_time(run)
    predicted = predicted_summary(prediction, run.seconds_per_step)
    pred_t = predicted["training_time"]
    abs_err, rel_err = {}, {}
    for c in CURVES:
        abs_err[c], rel_err[c] = {}, {}
        for e in EPSILONS:
            p, r = pred_t[c][e], real_t[c][e]
            ok = p is not None and r is not None
            abs_err[c][e] = abs(p - r) if ok else None
            rel_err[c][e] = abs(p - r) / r if ok and r > 0 else None
    targets = {c: tuple(per) for c, per in prediction.steps_to_target.items()}
    real_s, real_s_why = real_steps_to_target(run, targets)
    pred_s = predicted["steps_to_target"]
    target_err: dict = {}
    for c, per in targets.items():
        target_err[c] = {}
        for t in per:
            p, r = pred_s[c][t], real_s[c][t]
            ok = p is not None and r is not None and r > 0
            target_err[c][t] = abs(p - r) / r if ok else None

    t_pred = float(prediction.seconds["total"])
    return {
        "predicted": predicted,
        "real": {"training_time": real_t, "wall_clock": _clock(real_t, run.seconds_per_step),
                 "training_time_reasons": real_why,
                 "steps_to_target": real_s, "steps_to_target_reasons": real_s_why,
                 "target_wall_clock": _clock(real_s, run.seconds_per_step),
                 "test_accuracy": None if run.diverged else run.test_accuracy,
                 "diverged": run.diverged, "diverged_at": run.diverged_at,
                 "spiked_at": run.spiked_at,
                 **outcome_fields(outcome(run.loss, run.diverged, -1 if run.spiked_at is None
                                          else run.spiked_at)),
                 "seconds_per_step": run.seconds_per_step},
        "absolute_error": abs_err,
        "relative_error": rel_err,
        "target_error": target_err,
        "curve_distance": None if _no_run(prediction) or run.diverged else {
            c: _curve_distance(getattr(prediction, c), getattr(run, c)) for c in CURVES},
        "linearisation_gap": None if run.diverged else linearisation_gap(run),
        "seconds": {"predict": t_pred, "predict_stages": dict(prediction.seconds),
                    "finetune": run.seconds["finetune"],
                    "compile_finetune": run.seconds["compile"],
                    "compile_predict": prediction.seconds["compile"],
                    "ratio": run.seconds["finetune"] / t_pred if t_pred > 0 else None},
        "diverged": {"predicted": prediction.diverged, "real": run.diverged},
    }
