"""The optimiser options of :func:`ntk_tt.predict_task` / ``ntk-tt predict`` (issue 27), without
JAX: their checks, the arguments of the :class:`ntk_tt.Optimizer` and schedule they describe,
and the words the report and the figure use for an optimiser.

Options (flags): ``optimizer`` (--optimizer: "sgd", "adam", "adamw"), ``schedule``
(--schedule: "constant", "warmup_cosine", "warmup_stable_decay", "exponential"; the CLI also
takes the hyphenated names), ``warmup`` (--warmup W < T steps, from η = 0; default 0),
``decay_start`` (--decay-start S, WSD: η stays at the peak until step S; default the last 20 %
of the decay horizon, at least W), ``decay_end`` (--decay-end E: the step at which the decay
reaches ``end_lr``; default T = ``steps``), ``end_lr`` (--end-lr, default 0), ``decay_rate``
(--decay-rate R in (0, 1], exponential: η_t = η·R^t; required there), ``weight_decay``
(--weight-decay λ >= 0; default 0 for sgd and adam, :data:`ADAMW_WEIGHT_DECAY` for adamw),
``l2`` (--l2: SGD's decay as λ/2·‖θ‖² in the loss instead of decoupled), ``b1``, ``b2``,
``adam_eps`` (--b1, --b2, --adam-eps: Adam's β₁, β₂, ε; defaults :data:`ADAM_DEFAULTS`).
``learning_rate`` (--lr) is the schedule's PEAK (constant: every step's η; exponential: η_0),
``momentum`` (-m) and ``nesterov`` SGD's, ``batch_size`` (-B) the optimiser's B.
"""

from __future__ import annotations

import math
from typing import Any

from ntk_tt._options import (
    DECAY_RANGE,
    FLOAT32_MAX,
    FLOAT32_TINY,
    _is_int,
    _real_or_none,
    is_decay,
    resolve_method,
)

OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("constant", "warmup_cosine", "warmup_stable_decay", "exponential")
ADAMW_WEIGHT_DECAY = 1e-4  # ntk_tt.adamw's (and optax.adamw's) default λ
ADAM_DEFAULTS = {"b1": 0.9, "b2": 0.999, "adam_eps": 1e-8}  # ntk_tt.adam's defaults
WSD_DECAY_FRACTION = 0.2  # WSD without --decay-start: the last 20 % of the horizon decays
# option → (flag, the schedules or optimisers it applies to)
_SCHEDULE_ONLY = {"warmup": ("--warmup", ("warmup_cosine", "warmup_stable_decay")),
                  "decay_start": ("--decay-start", ("warmup_stable_decay",)),
                  "decay_end": ("--decay-end", ("warmup_cosine", "warmup_stable_decay")),
                  "end_lr": ("--end-lr", ("warmup_cosine", "warmup_stable_decay")),
                  "decay_rate": ("--decay-rate", ("exponential",))}
_ADAM_ONLY = {"b1": "--b1", "b2": "--b2", "adam_eps": "--adam-eps"}


def constant_sgd(o: dict[str, Any]) -> bool:
    """Whether the options describe constant-η SGD without weight decay: the job then predicts
    and fine-tunes with the constant-η keywords (the same rule as ``ntk_tt.sgd(η, m)``), which
    every method and ``segments`` know (``subset`` with momentum 0 only: with momentum it
    goes through ``ntk_tt.sgd(η, m)``)."""
    return (o["optimizer"] == "sgd" and o["schedule"] == "constant"
            and not weight_decay(o))


def weight_decay(o: dict[str, Any]) -> float:
    """λ: ``weight_decay``, or its default (0; :data:`ADAMW_WEIGHT_DECAY` for adamw)."""
    if o["weight_decay"] is not None:
        return float(o["weight_decay"])
    return ADAMW_WEIGHT_DECAY if o["optimizer"] == "adamw" else 0.0


def check_optimizer_options(o: dict[str, Any]) -> None:
    """The optimiser options (module docstring) of checked ``steps``, ``learning_rate`` and
    ``momentum``: their values, the flags that do not apply to the chosen optimiser or
    schedule, the schedule's step order, and the options the optimiser predictor does not
    have (Adam: ``segments`` > 1, a method other than the discrete recursion, the linear
    predictor, a sketched kernel). The SGD family takes every method
    (``predict(optimizer=, method=)``, METHOD.md §11) and ``segments``; ``subset`` takes it
    without weight decay (:func:`_check_subset`).

    Raises:
      ValueError: one line naming the option, its flag and the fix.
    """
    name, kind = o["optimizer"], o["schedule"]
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer (--optimizer) must be one of {OPTIMIZERS}, got "
                         f"{_named_value(name)}.")
    if kind not in SCHEDULES:
        raise ValueError(f"schedule (--schedule) must be one of {SCHEDULES} (the CLI also takes "
                         f"warmup-cosine, warmup-stable-decay), got {kind!r}.")
    for key, (flag, where) in _SCHEDULE_ONLY.items():
        if o[key] is not None and kind not in where:
            raise ValueError(f"{key} ({flag}) applies to --schedule "
                             f"{' or '.join(w.replace('_', '-') for w in where)} only, got "
                             f"schedule {kind!r}: drop {flag} or choose that schedule.")
    adam = name != "sgd"
    for key, flag in _ADAM_ONLY.items():
        if o[key] is not None and not adam:
            sgd_twin = " (SGD's momentum is -m)" if key == "b1" else ""
            raise ValueError(f"{key} ({flag}) is Adam's: use it with --optimizer adam or adamw"
                             f"{sgd_twin}, or drop it.")
    if adam and (o["momentum"] != 0.0 or o["nesterov"]):
        raise ValueError(f"momentum (-m) and nesterov (--nesterov) are SGD's; --optimizer "
                         f"{name} takes β₁ as --b1 (default {ADAM_DEFAULTS['b1']}): drop them.")
    _check_values(o)
    _check_decay(o, name)
    _check_order(o, kind)
    _check_subset(o, name, kind)
    if not constant_sgd(o):
        _check_predictor(o, name, kind)


def _check_values(o: dict[str, Any]) -> None:
    for key, flag, low in (("warmup", "--warmup", 0), ("decay_start", "--decay-start", 0),
                           ("decay_end", "--decay-end", 1)):
        v = o[key]
        if v is not None and (not _is_int(v) or v < low):
            raise ValueError(f"{key} ({flag}) must be an integer >= {low} (optimiser steps), "
                             f"got {v!r}.")
    lr, top = float(o["learning_rate"]), f" (at most {FLOAT32_MAX:.8g}, float32's largest)"
    for key, flag, ok, want in (
            ("end_lr", "--end-lr", lambda v: 0 <= v <= lr, f"in [0, --lr = {lr:g}]"),
            ("decay_rate", "--decay-rate", lambda v: 0 < v <= 1, "in (0, 1] (η_t = η·R^t)"),
            ("weight_decay", "--weight-decay", lambda v: 0 <= v <= FLOAT32_MAX, ">= 0" + top),
            ("b1", "--b1", is_decay, f"in {DECAY_RANGE}"),
            ("b2", "--b2", is_decay, f"in {DECAY_RANGE}"),
            ("adam_eps", "--adam-eps", lambda v: FLOAT32_TINY <= v <= FLOAT32_MAX,
             f"> 0 (in [{FLOAT32_TINY:.8g}, {FLOAT32_MAX:.8g}], float32's normal range)")):
        if o[key] is None:
            continue
        v = _real_or_none(o[key])
        if v is None or not math.isfinite(v) or not ok(v):
            raise ValueError(f"{key} ({flag}) must be a finite number {want}, got {o[key]!r}.")
    if not isinstance(o["l2"], bool):
        raise ValueError(f"l2 (--l2) must be True or False, got {o['l2']!r}.")


def _check_decay(o: dict[str, Any], name: str) -> None:
    """Weight decay: L2 (``l2``) for SGD only, and only with λ > 0; none with adam."""
    lam = weight_decay(o)
    if o["l2"] and name != "sgd":
        raise ValueError(f"l2 (--l2) applies to --optimizer sgd only: {name}'s weight decay is "
                         + ("decoupled by definition" if name == "adamw" else
                            "already L2, and predicted only without decay") + "; drop --l2.")
    if o["l2"] and lam == 0:
        raise ValueError("l2 (--l2) puts the weight decay into the loss: give weight_decay "
                         "(--weight-decay) > 0 with it, or drop --l2.")
    if name == "adam" and lam > 0:
        raise ValueError(f"weight_decay (--weight-decay) {lam:g} with --optimizer adam is L2 "
                         "decay inside Adam's moments, which the Adam predictor cannot "
                         "follow: use --optimizer adamw (decoupled decay), or drop it.")


def _check_order(o: dict[str, Any], kind: str) -> None:
    """The schedule's steps: warmup < steps (the run reaches the peak --lr) and warmup <=
    decay_start <= decay_end, and a decay rate for exponential."""
    if kind == "exponential" and o["decay_rate"] is None:
        raise ValueError("schedule 'exponential' (--schedule exponential) needs decay_rate "
                         "(--decay-rate R in (0, 1]: η_t = --lr·R^t), e.g. --decay-rate 0.99.")
    if kind not in ("warmup_cosine", "warmup_stable_decay"):
        return
    warmup, end_at = o["warmup"] or 0, _decay_end(o)
    if warmup > end_at:
        raise ValueError(f"warmup (--warmup) {warmup} must be <= decay_end (--decay-end; "
                         f"default T, the -T steps) {end_at}: lower --warmup or raise "
                         "--decay-end.")
    if warmup >= o["steps"]:
        raise ValueError(f"warmup (--warmup) {warmup} must be < steps (-T) {o['steps']}: the "
                         "run would end before η reaches --lr (it would train on the ramp "
                         "only); lower --warmup or raise -T.")
    if kind == "warmup_stable_decay" and not warmup <= decay_start(o) <= end_at:
        raise ValueError(f"decay_start (--decay-start) {o['decay_start']} must be in [warmup, "
                         f"decay_end] = [{warmup}, {end_at}] (--warmup; --decay-end, default "
                         "T, the -T steps).")


def _check_subset(o: dict[str, Any], name: str, kind: str) -> None:
    """``subset`` (--subset N'): the spectrum predictor (``ntk_tt.predict_from_subset(
    optimizer=)``) takes the SGD family (schedule, momentum, Nesterov) without weight decay,
    by each eigenmode's exact recursion (method auto / discrete; closed_form: constant η, m = 0
    only, as ``ntk_tt.predict(subset=)``). Full batch (no -B < N) and the other methods are
    checked with the other subset options (``ntk_tt._options_predict``)."""
    if o["subset"] is None:
        return
    if name != "sgd":
        raise ValueError(f"subset (--subset) predicts --optimizer sgd only: --optimizer "
                         f"{name}'s elementwise moments mix the kernel's eigenmodes, which a "
                         "spectrum cannot follow; drop --subset (the head-aware Adam "
                         "predictor uses the full kernel) or use --optimizer sgd.")
    if weight_decay(o) > 0:
        raise ValueError("subset (--subset) predicts training without weight decay: decay acts "
                         "on J·θ0, whose projections on the kernel's eigenvectors a spectrum "
                         "does not have; drop --weight-decay (and --l2), or drop --subset.")
    if o["method"] == "closed_form" and (_real_or_none(o["momentum"]) or kind != "constant"):
        what = ("momentum (-m)" if kind == "constant" else
                f"--schedule {kind.replace('_', '-')}")
        raise ValueError(f"subset (--subset) with {what} runs each eigenmode's exact "
                         "recursion on the predicted spectrum, not the closed form (constant "
                         "η, no momentum): drop --method closed_form (auto) or use --method "
                         "discrete.")


def _check_predictor(o: dict[str, Any], name: str, kind: str) -> None:
    """What the optimiser predictor (``predict(optimizer=)``) does not have; the methods as
    ``ntk_tt.dynamics._optim_predict.check_run``: any for the SGD family, the discrete
    recursion for Adam."""
    why = (f"--optimizer {name}" if name != "sgd" else f"--schedule {kind.replace('_', '-')}"
           if kind != "constant" else "--weight-decay")  # the first thing that is not it
    if _is_int(o["segments"]) and o["segments"] > 1 and name != "sgd":  # 0, -1: the range
        raise ValueError(f"segments (--segments) re-linearises the SGD-family recursion "
                         f"only: drop it with {why}.")
    if name != "sgd" and resolve_method(o["method"]) != "discrete":
        raise ValueError(f"method (--method) {o['method']!r} takes --optimizer sgd only: "
                         f"--optimizer {name} has no continuous-time predictor (Adam's "
                         "elementwise moments have no function-space flow); drop --method "
                         "(auto: the exact discrete recursion) or use --method discrete.")
    given = [f for f, on in (("--predictor linear", o["predictor"] == "linear"),
                             (f"--kernel {o['kernel']}", o["kernel"] in ("sketch", "traced")))
             if on]
    if name != "sgd" and given:  # only the flags given (a fresh user was told to drop both)
        raise ValueError(f"--optimizer {name} is predicted by the head-aware predictor only "
                         f"(Adam has no frozen-kernel form): drop {' and '.join(given)}.")


def _decay_end(o: dict[str, Any]) -> int:
    return o["steps"] if o["decay_end"] is None else o["decay_end"]


def decay_start(o: dict[str, Any]) -> int:
    """WSD's ``decay_start``, or its default: the last :data:`WSD_DECAY_FRACTION` of the
    horizon, not before the end of the warmup."""
    if o["decay_start"] is not None:
        return o["decay_start"]
    end_at = _decay_end(o)
    return max(o["warmup"] or 0, math.floor((1 - WSD_DECAY_FRACTION) * end_at))


def schedule_arguments(o: dict[str, Any]) -> tuple[str, dict[str, float]]:
    """(the ``ntk_tt`` schedule function, e.g. "warmup_cosine", its keyword arguments) of
    checked options: ``learning_rate`` is the peak, the decay horizon ``decay_end`` (default
    ``steps``)."""
    lr, kind = float(o["learning_rate"]), o["schedule"]
    if kind == "constant":
        return kind, {"value": lr}
    if kind == "exponential":
        return kind, {"init": lr, "rate": float(o["decay_rate"])}
    warmup, end_at = o["warmup"] or 0, _decay_end(o)
    end = 0.0 if o["end_lr"] is None else float(o["end_lr"])
    if kind == "warmup_cosine":
        return kind, {"peak": lr, "warmup": warmup, "decay_steps": end_at, "end": end}
    start = decay_start(o)
    return kind, {"peak": lr, "warmup": warmup, "decay_start": start,
                  "decay_steps": end_at - start, "end": end}


def optimizer_arguments(o: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(the ``ntk_tt`` optimiser function, "sgd" | "adam" | "adamw", its keyword arguments
    besides the learning rate) of checked options."""
    name, lam, b = o["optimizer"], weight_decay(o), o["batch_size"]
    if name == "sgd":
        return name, {"momentum": float(o["momentum"]), "nesterov": bool(o["nesterov"]),
                      "weight_decay": lam, "decoupled": not o["l2"], "batch_size": b}
    adam = {k: float(ADAM_DEFAULTS[k] if o[k] is None else o[k]) for k in ADAM_DEFAULTS}
    return name, {"b1": adam["b1"], "b2": adam["b2"], "eps": adam["adam_eps"],
                  "weight_decay": lam, "batch_size": b}


def describe_optimizer(h: dict[str, Any], short: bool = False) -> str:
    """Words for an optimiser description (``ntk_tt.training._optimizer_run.
    optimizer_hyperparameters``), e.g. "adamw (β₁ 0.9, β₂ 0.999, ε 1e-08), weight decay
    0.0001 decoupled, B = 20; warmup_cosine: η 0 → 0.001 over 10 steps, cosine to 0 at step
    100"; ``short``: a figure title's two lines (a line break instead of "; ", "B=20")."""
    name, p, b = h["optimizer"], h["schedule_parameters"], h["batch_size"]
    if name == "sgd":
        rule = f"sgd (m {h['momentum']:.3g}{', Nesterov' if h['nesterov'] else ''})"
    else:
        rule = f"{name} (β₁ {h['b1']:.4g}, β₂ {h['b2']:.4g}, ε {h['eps']:.3g})"
    if h["weight_decay"]:
        rule += (f", weight decay {h['weight_decay']:.3g} "
                 f"{'decoupled' if h['decoupled'] else 'L2'}")
    kind = h["schedule"]

    def warm():
        return (f"η {p.get('init', 0.0):.3g} → {p['peak']:.4g} over {p['warmup']:g} steps"
                if p["warmup"] else f"η {p['peak']:.4g}")

    sched = {
        "constant": lambda: f"η {h['learning_rate']:.4g}",
        "warmup_cosine": lambda: (f"{warm()}, cosine to {p['end']:.3g} at step "
                                  f"{p['decay_steps']:g}"),
        "warmup_stable_decay": lambda: (f"{warm()}, stable to step {p['decay_start']:g}, "
                                        f"linear to {p['end']:.3g} at step "
                                        f"{p['decay_start'] + p['decay_steps']:g}"),
        "exponential": lambda: f"η_t = {p['init']:.4g}·{p['rate']:.4g}^t",
    }[kind]()
    if short:
        return f"{rule}, B={b}\n{kind}: {sched}"
    travel = h.get("weight_travel")  # Adam's ρ, in a prediction's report only
    return f"{rule}, B = {b}; {kind}: {sched}" + (
        f"; weight travel ρ = {travel:.2g}" if travel is not None else "")


def _named_value(value) -> str:
    """``value`` for an error message: an ntk_tt.Optimizer object (passed to the CLI's
    ``predict_task`` / ``suggest_task``, which take its name and flags) is named with where
    it belongs instead of its repr."""
    if type(value).__name__ == "Optimizer" and hasattr(value, "to_optax"):
        return (f"an ntk_tt.Optimizer ({value.rule}): predict_task and suggest_task take the "
                "CLI's values (optimizer='adamw', learning_rate=..., schedule=...); pass the "
                "object to ntk_tt.predict / finetune / suggest(optimizer=...) instead")
    return repr(value)
