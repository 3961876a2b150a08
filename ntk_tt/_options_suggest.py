"""The optimiser options of :func:`ntk_tt.suggest_task` and ``ntk-tt suggest --optimizer``,
checked without JAX (before the task is loaded): the template's family, weight decay, β₁/β₂
or momentum, batch size, and the grid of peak learning rates and warmups that
``suggest(optimizer=...)`` searches (``ntk_tt.analysis._suggest_optimizer``)."""

from __future__ import annotations

import math
from typing import Any

from ntk_tt._defaults import SUGGEST_DEFAULTS
from ntk_tt._options import FLOAT32_MAX, FLOAT32_TINY, _is_int, check_real, is_real
from ntk_tt._options_optimizer import ADAM_DEFAULTS, ADAMW_WEIGHT_DECAY, _named_value

WARMUPS = (0.0, 0.05, 0.1, 0.2)  # fractions of the step budget T_max
ADAM_LEARNING_RATE_RANGE = (1e-4, 1e-1)  # η_peak of Adam's default log grid
FAMILIES = ("sgd", "adamw")
# the optimiser options (None: not given); the family defaults are in FAMILY_DEFAULTS
OPTIMIZER_OPTIONS = ("optimizer", "weight_decay", "momentum", "b1", "b2", "warmups", "lr_min",
                     "lr_max")
# (λ and β₁, β₂ as ``ntk-tt predict``'s; SGD's momentum the usual SGD-momentum 0.9)
FAMILY_DEFAULTS = {"sgd": {"momentum": 0.9, "weight_decay": 0.0},
                   "adamw": {"b1": ADAM_DEFAULTS["b1"], "b2": ADAM_DEFAULTS["b2"],
                             "weight_decay": ADAMW_WEIGHT_DECAY}}
_FLAG = {"optimizer": "--optimizer", "weight_decay": "--weight-decay", "momentum": "-m",
         "b1": "--b1", "b2": "--b2", "warmups": "--warmups", "lr_min": "--lr-min",
         "lr_max": "--lr-max", "momenta": "-m/--momenta", "kappa_min": "--kappa-min",
         "kappa_max": "--kappa-max", "batch_sizes": "-B/--batch-sizes"}


def _named(keys) -> str:
    return ", ".join(f"{k} ({_FLAG[k]})" for k in keys)


def _number(o, name, low, high=FLOAT32_MAX) -> float:
    """``o[name]`` as a float in [low, high), or without ``high`` in [low, ``FLOAT32_MAX``]."""
    v = o[name]
    check_real(v, f"{name} ({_FLAG[name]})")
    v = float(v)
    top = high == FLOAT32_MAX
    if not (low <= v and (v <= high if top else v < high)):
        span = "normal range" if low == FLOAT32_TINY else "largest"
        bound = f"{high:.8g}] (float32's {span})" if top else f"{high:g})"
        raise ValueError(f"{name} ({_FLAG[name]}) must be in [{low:.8g}, {bound}, got {v!r}.")
    return v


def split_optimizer_options(options: dict[str, Any]) -> tuple[dict, dict]:
    """(the optimiser options resolved, the other options for ``check_suggest_job``).

    Without ``optimizer`` (None) the first is {} and the optimiser options must not be given.
    With ``optimizer`` "sgd" (SGD, heavy ball, decoupled decay) or "adamw": ``momentum``
    (SGD; also given as one value of ``momenta``, -m), ``b1``, ``b2`` (AdamW), ``weight_decay``
    λ >= 0 (defaults ``FAMILY_DEFAULTS``), ``warmups`` (fractions of T_max in [0, 1), each
    rounding to a warmup below T_max, ``steps``; default ``WARMUPS``) and ``lr_min``,
    ``lr_max`` (η_peak grid; default: SGD the κ grid, AdamW ``ADAM_LEARNING_RATE_RANGE``);
    ``batch_sizes`` at most one (default GD); the other options' ``momenta`` becomes (m,)
    (β₁ for AdamW: Optimizer.momentum).

    Raises:
      ValueError: one line naming the option, its flag and the fix (e.g. AdamW with
        ``predictor`` "linear").
    """
    o = {k: options.get(k) for k in OPTIMIZER_OPTIONS}
    rest = {k: v for k, v in options.items() if k not in OPTIMIZER_OPTIONS}
    family = o["optimizer"]
    cap, kmin = rest.get("kappa_eff_max"), rest.get("kappa_min", SUGGEST_DEFAULTS["kappa_min"])
    if family is None:
        if cap is not None and is_real(kmin):  # a κ grid: the cap must reach its κ_min
            check_kappa_eff_max(cap, float(kmin), cli=True)
        given = [k for k in OPTIMIZER_OPTIONS if o[k] is not None]
        if given:
            one = len(given) == 1
            raise ValueError(f"{_named(given)} {'is an option' if one else 'are options'} of "
                             "the optimizer template's search: give optimizer (--optimizer "
                             f"sgd|adamw) too, or drop {'it' if one else 'them'}.")
        return {}, rest
    if family not in FAMILIES:
        raise ValueError(f"optimizer (--optimizer) must be one of {FAMILIES}, got "
                         f"{_named_value(family)}.")
    if family == "adamw" and rest.get("kappa_eff_max") is not None:
        raise ValueError("kappa_eff_max (--kappa-eff-max) caps SGD's effective κ̃ = κ/(1 − m); "
                         "AdamW's step is not sized by κ: drop it (bound --lr-max instead).")
    if family == "adamw" and rest.get("predictor") == "linear":
        raise ValueError("predictor (--predictor) linear cannot predict AdamW (Adam has no "
                         "frozen-kernel form): drop --predictor linear (AdamW needs the "
                         "head-aware predictor, the default).")
    momenta = rest.get("momenta")
    other = "b1" if family == "sgd" else "momentum"
    wrong = [k for k in (other, "b2" if family == "sgd" else None) if k and o[k] is not None]
    if family == "adamw" and momenta is not None:
        wrong.append("momenta")
    if wrong:
        raise ValueError(f"{_named(wrong)}: not an option of optimizer {family} (SGD takes -m, "
                         f"one momentum; AdamW --b1 and --b2).")
    if family == "sgd" and momenta is not None:
        if o["momentum"] is not None or len(momenta) != 1:
            raise ValueError(f"momenta (-m/--momenta) with optimizer sgd is the template's one "
                             f"momentum, got {momenta!r}; the search is over the peak learning "
                             "rate and warmup.")
        o["momentum"] = momenta[0]
    o = {k: (FAMILY_DEFAULTS[family].get(k) if o[k] is None else o[k]) for k in o}
    out = {"optimizer": family, "weight_decay": _number(o, "weight_decay", 0.0)}
    for k in (("momentum",) if family == "sgd" else ("b1", "b2")):
        out[k] = _number(o, k, 0.0, 1.0)
    rest["momenta"] = (out["momentum"] if family == "sgd" else out["b1"],)
    sizes = rest.get("batch_sizes")
    if sizes is not None and len(sizes) != 1:
        raise ValueError(f"batch_sizes (-B/--batch-sizes) with an optimizer is the template's "
                         f"one batch size (N = full-batch GD), got {tuple(sizes)!r}.")
    rest["batch_sizes"] = (None,) if sizes is None else tuple(sizes)
    warm = WARMUPS if o["warmups"] is None else o["warmups"]
    if isinstance(warm, (str, bytes)) or not hasattr(warm, "__len__") or not warm:
        raise ValueError(f"warmups (--warmups) must be a non-empty list of fractions of the "
                         f"step budget in [0, 1), got {warm!r}; e.g. 0,0.05,0.1,0.2.")
    steps = rest.get("steps", SUGGEST_DEFAULTS["steps"])
    seen, rounded = [], {}
    for f in warm:
        check_real(f, "warmups (--warmups) entry")
        if not 0.0 <= float(f) < 1.0:
            raise ValueError(f"warmups (--warmups) entries must be fractions of the step "
                             f"budget in [0, 1), got {f!r}.")
        if float(f) in seen:  # as -m
            raise ValueError(f"warmups (--warmups) {list(warm)!r} names {float(f)} twice; give "
                             "each once.")
        seen.append(float(f))
        if _is_int(steps) and steps >= 1:  # a bad -T is check_suggest_job's to name
            add_warmup(rounded, float(f), steps, warm, cli=True)
    out["warmups"] = tuple(float(f) for f in warm)
    out["learning_rate_range"] = _lr_range(o, rest, family)
    if cap is not None and out["learning_rate_range"] is None and is_real(kmin):  # a κ grid
        check_kappa_eff_max(cap, float(kmin), cli=True)
    if out["learning_rate_range"] is not None:  # the η_peak grid: the κ range is not used, so
        # check_suggest_job's num_kappas / κ-range rule must not refuse one peak (min == max)
        rest = {k: v for k, v in rest.items() if k not in ("kappa_min", "kappa_max")}
        if rest.get("num_kappas") == 1:
            rest["kappa_min"] = rest["kappa_max"] = SUGGEST_DEFAULTS["kappa_min"]
    return out, rest


def check_kappa_eff_max(value, kappa_min: float | None, cli: bool = False) -> float | None:
    """``suggest``'s ``kappa_eff_max`` (None: no cap) as a float, after a ValueError unless it
    is a finite real > 0 and, with a κ grid (``kappa_min`` its smallest κ, else None), at least
    ``kappa_min``: κ̃ = κ/(1 − m) >= κ, so below it no grid point could be chosen. ``cli``: the
    message names the flags."""
    if value is None:
        return None
    name, kmin = (("kappa_eff_max (--kappa-eff-max)", "kappa_min (--kappa-min)") if cli else
                  ("kappa_eff_max", "kappa_range[0]"))
    check_real(value, name)
    if not (math.isfinite(float(value)) and float(value) > 0):
        raise ValueError(f"{name} caps the suggestion's effective κ̃ = κ/(1 − m): a finite "
                         f"number > 0, got {value!r}; e.g. 12, the benchmark's main grid.")
    if kappa_min is not None and float(value) < kappa_min:
        raise ValueError(f"{name} {float(value):g} is below the κ grid's smallest κ, {kmin} "
                         f"{kappa_min:g}: κ̃ = κ/(1 − m) >= κ, so no configuration could be "
                         f"chosen; raise {name.split(' ')[0]} or lower {kmin.split(' ')[0]}.")
    return float(value)


def add_warmup(grid: dict, fraction: float, steps: int, fractions, cli: bool = False) -> float:
    """Add ``fraction``'s warmup, :func:`warmup_steps`, to ``grid`` (warmup steps → the first
    fraction giving it) and return it, after a ValueError when an earlier one of the user's
    ``fractions`` rounds to the same whole steps (the search would try it once, silently; the
    default ``WARMUPS`` merge at a short T). ``cli``: the message names the flags."""
    w = warmup_steps(fraction, steps, cli)
    if w in grid and tuple(float(f) for f in fractions) != WARMUPS:
        name, budget = (("warmups (--warmups)", f"-T {steps}") if cli else
                        ("warmups", f"steps = {steps}"))
        raise ValueError(f"{name} entries {grid[w]:g} and {fraction:g} both round to a "
                         f"{w:g}-step warmup at {budget}: the search would try it once; give "
                         f"fractions that differ by at least 1/{steps} = {1 / steps:.3g}.")
    grid.setdefault(w, fraction)
    return w


def warmup_steps(fraction: float, steps: int, cli: bool = False) -> float:
    """A warmup of ``suggest(optimizer=...)``'s grid in whole steps, round(fraction·steps),
    after a ValueError when that is not below ``steps`` (the run would end on the ramp, before
    η reaches its peak: ``predict`` and ``finetune`` refuse such a schedule). ``cli``: the
    message names the flags."""
    w = float(round(fraction * steps))
    if w >= steps:
        name, budget, raise_it = (("warmups (--warmups)", "steps (-T)", "-T") if cli else
                                  ("warmups", "steps", "steps"))
        raise ValueError(f"{name} entry {fraction:g} rounds to a warmup of {w:g} steps, not "
                         f"below {budget} {steps}: the run would end before η reaches its "
                         f"peak (predict and finetune refuse that schedule); the largest "
                         f"fraction allowed is just below {(steps - 0.5) / steps:g} = (steps "
                         f"− ½)/steps ({(steps - 1) / steps:g} gives {steps - 1} steps): lower "
                         f"it or raise {raise_it}.")
    return w


def _lr_range(o, rest, family):
    """(lr_min, lr_max) or None (SGD's κ grid)."""
    given = [k for k in ("lr_min", "lr_max") if o[k] is not None]
    kappa = [k for k in ("kappa_min", "kappa_max") if k in rest]
    if family == "adamw" and kappa:
        raise ValueError(f"{_named(kappa)} {'sizes' if len(kappa) == 1 else 'size'} SGD's grid "
                         "(κ = η·λ_max/N); AdamW's is --lr-min/--lr-max (peak learning rates).")
    if given and kappa:
        raise ValueError("give --kappa-min/--kappa-max (κ grid) or --lr-min/--lr-max (peak η "
                         "grid), not both.")
    if len(given) == 1 and family != "adamw":  # AdamW takes the other from its default
        raise ValueError("with sgd give both lr_min (--lr-min) and lr_max (--lr-max) for a "
                         "peak-η grid, or neither for the κ grid.")
    if not given and family != "adamw":
        return None
    lo, hi = (_number(o, k, FLOAT32_TINY) if o[k] is not None else default  # 1e-50 is 0
              for k, default in zip(("lr_min", "lr_max"), ADAM_LEARNING_RATE_RANGE, strict=True))
    num = rest.get("num_kappas", SUGGEST_DEFAULTS["num_kappas"])
    if not lo <= hi or (_is_int(num) and (num == 1) != (lo == hi)):
        shown = [f"{v:g}" + ("" if o[k] is not None else f" (AdamW's default {_FLAG[k]})")
                 for k, v in (("lr_min", lo), ("lr_max", hi))]
        raise ValueError(f"lr_min, lr_max (--lr-min, --lr-max) must satisfy 0 < min <= max "
                         f"(min == max exactly when --num-kappas is 1), got {', '.join(shown)} "
                         f"with num_kappas {num!r}.")
    return lo, hi
