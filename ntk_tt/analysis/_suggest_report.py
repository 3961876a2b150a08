"""What :func:`ntk_tt.suggest` returns and ``ntk-tt suggest`` prints: the rows of the
configurations tried, the :class:`Suggestion` made from them, and its text."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ntk_tt.analysis._suggest_curves import _edge
from ntk_tt.dynamics._divergence import OUTCOMES
from ntk_tt.dynamics._regime import LINEAR_TRAVEL

TESTED_KAPPA = 12.0
"""The largest effective κ̃ = κ/(1 − m) of the benchmark sweep's main grid (README "Benchmark
sweep": T_ε p95 30.5 / 36.5 % there, GD / SGD); beyond it only divergence calls were
checked against real runs."""


def effective_kappa_note(keff: float) -> str:
    """The words of ``ntk-tt suggest`` / ``predict`` for an effective κ̃ above TESTED_KAPPA."""
    return (f"effective κ̃ = κ/(1 − m) = {keff:.3g} is beyond the benchmark sweep's main grid "
            f"(κ̃ <= {TESTED_KAPPA:g}; T_ε p95 30-37 % at κ̃ = 12, larger κ̃ checked for "
            "divergence only)")


@dataclasses.dataclass(frozen=True)
class Suggestion:
    """Result of :func:`ntk_tt.suggest`. Time is in optimiser steps and seconds; losses are MEAN
    training losses over the N samples.

    found: an admissible configuration reaches the target within ``steps_max``; when False the
      choice fields (learning_rate, momentum, batch_size, kappa, steps, seconds, loss,
      grid_best) are None, ``reason`` says why and what to try, :func:`ntk_tt.suggest`
      warns (:class:`ntk_tt.TargetNotReachedWarning`) with the same reason, and the grid is
      still there.
    learning_rate, momentum, batch_size (None = full-batch GD), kappa (η·λ_max/N): the choice
      (with ``optimizer=``: the PEAK η, the template's momentum (Adam: β₁) and batch size).
    steps: predicted steps to target: the first step with L̂_t ≤ target (int), on the raw curve
      (``ntk_tt.steps_to_target(loss, target, window=1)``; ``predict(targets=...)`` smooths
      over ``curve_window`` steps, which can put the hit a step or two later).
      seconds: steps × seconds_per_step[B].
    loss: the choice's predicted mean loss curve (steps_max + 1,) (mean over SGD paths).
    target: the absolute target loss; initial_loss: L_0; target_kind, target_value: as given.
    refined: the gradient refinement improved on the best grid point (else the choice is it).
    grid_best: the best grid point (dict of the ``grid`` row).
    runners_up: pandas DataFrame of the best admissible grid configuration of every other
      (B, m) pair (with ``optimizer=``: every other warmup) (and the next best of the choice's
      own), ≤ ``top`` rows, best first, columns as ``grid``.
    grid: pandas DataFrame, one row per grid configuration and per refinement candidate
      (``source`` "grid" or "refine"): batch_size (N for GD), gd, momentum,
      learning_rate, kappa, kappa_eff = κ/(1 − m), steps (NaN: target not reached), seconds,
      soft_steps, final_loss, diverged (non-finite, ending above L_0 or spiking above 10·L_0),
      beyond_edge, admissible, source, evaluated (False: a
      grid point beyond the stability edge, not predicted; its steps etc. are NaN); with
      ``optimizer=`` also warmup (steps), learning_rate and kappa are the peak's; Adam rows
      (κ does not measure Adam's stability) have weight_travel ρ and are beyond_edge where
      ρ > 1 (``_regime.UNKNOWN_TRAVEL``: ``predict`` abstains there).
    seconds_per_step: {B (None = GD): seconds per real step}, measured or as given.
    refinement: one dict per refinement evaluation (log η, m (``optimizer=``: log peak η,
      warmup), soft steps, steps, accepted).
    predictor: "head_aware:<backbone>" ("head_aware:given" with ``head_kernel``) or
    "linear:<kernel>"; lambda_max: λ_max of Θ_0.
    num_train: N. steps_max: T_max. reason: why nothing was found (None when found).
    timings: wall seconds per stage ("kernel", "step_time", "grid", "refine", "total") without
      JAX compilation, which is summed apart in "compile".
    optimizer: the choice as an :class:`ntk_tt.Optimizer` (``ntk_tt.sgd(η, m, batch_size=B)``
      for the constant-η search; the template with the chosen warmup-cosine with
      ``optimizer=``), to pass to ``predict``/``finetune``; None when not found.
    warmup: the chosen warmup in steps (``optimizer=`` only; else None).
    weight_travel: Adam's ρ = Σ η_t / rms(θ_0) of the choice over ``steps_max`` (the
      backbone of ``head``; ``ntk_tt.weight_travel``), None for SGD or when nothing is found;
      beyond ``LINEAR_TRAVEL`` = 0.07 ``suggest`` warns ``LinearRegimeWarning``.
    outcome: the choice's predicted outcome, "converges" or "catapult" (its mean curve rises
      above L_0, at ``spike_step``, then falls: the predictor is least reliable there); None
      when not found. ``grid`` has both columns per configuration (None / −1 if not predicted).

    Source: ntk_tt's own (README "Choosing hyperparameters without training").
    """

    found: bool
    learning_rate: float | None
    momentum: float | None
    batch_size: int | None
    kappa: float | None
    steps: int | None
    seconds: float | None
    loss: np.ndarray | None
    target: float
    initial_loss: float
    target_kind: str
    target_value: float
    refined: bool
    grid_best: dict | None
    runners_up: Any
    grid: Any
    seconds_per_step: dict
    refinement: list
    predictor: str
    lambda_max: float
    num_train: int
    steps_max: int
    reason: str | None
    timings: dict
    optimizer: Any = None
    warmup: float | None = None
    outcome: str | None = None
    spike_step: int | None = None
    weight_travel: float | None = None


def _order(rows):
    """Admissible rows by (seconds, soft seconds), best first."""
    ok = [r for r in rows if r["admissible"]]
    return sorted(ok, key=lambda r: (r["seconds"], r["soft_steps"] * r["sps"]))


def _skipped(b, n, lr, m, lam, sps) -> dict:
    """A grid row beyond the stability edge that was not predicted."""
    kappa = lr * lam / n
    return {"batch_size": n if b is None else b, "gd": b is None, "b": b, "momentum": m,
            "learning_rate": lr, "kappa": kappa, "kappa_eff": kappa / (1 - m),
            "steps": math.nan, "seconds": math.nan, "sps": sps, "soft_steps": math.nan,
            "final_loss": math.nan, "diverged": False, "beyond_edge": True,
            "admissible": False, "source": "grid", "evaluated": False, "outcome": None,
            "spike_step": -1}


def _row(b, n, lr, m, lam, out, i, sps, loss, source, kappa_eff_max=None) -> dict:
    kappa = lr * lam / n
    steps = float(out.steps[i])
    beyond = kappa > _edge(m, loss, kappa_eff_max)
    # the flag (non-finite, or L_T > L_0) or the outcome (a spike above 10·L_0) diverges
    outcome = OUTCOMES[int(out.outcome[i])]
    diverged = bool(out.diverged[i]) or outcome == "diverges"
    reached = math.isfinite(steps)
    return {"batch_size": n if b is None else b, "gd": b is None, "b": b, "momentum": m,
            "learning_rate": lr, "kappa": kappa, "kappa_eff": kappa / (1 - m),
            "steps": steps if reached else math.nan,
            "seconds": steps * sps if reached else math.nan, "sps": sps,
            "soft_steps": float(out.soft[i]), "final_loss": float(out.loss[i][-1]),
            "diverged": diverged, "beyond_edge": bool(beyond),
            "admissible": reached and not diverged and not beyond, "source": source,
            "evaluated": True, "outcome": outcome,
            "spike_step": int(out.spike[i])}


_COLUMNS = ("batch_size", "gd", "momentum", "learning_rate", "kappa", "kappa_eff", "steps",
            "seconds", "soft_steps", "final_loss", "diverged", "beyond_edge", "admissible",
            "source", "evaluated", "outcome", "spike_step")


def _columns(rows) -> tuple:
    return _COLUMNS + tuple(c for c in ("warmup", "weight_travel") if rows and c in rows[0])


def _frame(rows, columns=_COLUMNS):
    import pandas as pd

    return pd.DataFrame([{k: r[k] for k in columns} for r in rows], columns=list(columns))


def _constant_sgd(row):
    from ntk_tt._optimizer import sgd

    return sgd(row["learning_rate"], row["momentum"], batch_size=row["b"])


def _result(rows, ranked, best, choice, curves, refinement, sps, target_abs, l0, target_kind,
            target_value, name, lam, n, steps_max, top, timings, widen,
            optimizer_of=_constant_sgd, kappa_eff_max=None) -> Suggestion:
    """The :class:`Suggestion` of the rows; ``widen``: what grid option to widen (the reason
    when nothing is found); ``optimizer_of(row)``: the choice's Optimizer; ``kappa_eff_max``:
    the cap on κ̃ (named in the reason)."""
    cols = _columns(rows)
    common = dict(target=target_abs, initial_loss=l0, target_kind=target_kind,
                  target_value=target_value, grid=_frame(rows, cols), seconds_per_step=sps,
                  refinement=refinement, predictor=name, lambda_max=lam, num_train=n,
                  steps_max=steps_max, timings=timings)
    if choice is None:
        grid = [r for r in rows if not r["diverged"] and not r["beyond_edge"]]
        closest = min(grid, key=lambda r: r["final_loss"]) if grid else None
        adam = bool(rows) and optimizer_of(rows[0]).rule == "adam"  # no κ edge for Adam
        why = (f"no configuration of the grid reaches the target loss {target_abs:.4g} within "
               f"T_max = {steps_max} steps without predicted divergence"
               + (" or weight travel ρ > 1" if adam else " or κ beyond the stability edge")
               + ("" if kappa_eff_max is None else
                  f" or κ̃ = κ/(1 − m) above kappa_eff_max = {kappa_eff_max:.7g}"))
        if closest is not None and adam:
            why += (f" (lowest final loss {closest['final_loss']:.4g} at peak η = "
                    f"{closest['learning_rate']:.3g}, warmup {closest['warmup']:g} steps)")
        elif closest is not None:
            why += (f" (lowest final loss within the edge {closest['final_loss']:.4g} at "
                    f"κ = {closest['kappa']:.3g}, m = {closest['momentum']:g})")
        why += f"; raise the step budget (steps, -T), raise the target, or widen {widen}"
        return Suggestion(found=False, learning_rate=None, momentum=None, batch_size=None,
                          kappa=None, steps=None, seconds=None, loss=None, refined=False,
                          grid_best=None, runners_up=_frame([], cols), reason=why, **common)
    others, seen = [], set()
    group = ((lambda r: r["warmup"]) if "warmup" in cols
             else (lambda r: (r["b"], r["momentum"])))
    for r in _order([r for r in rows if r["source"] == "grid"]):
        if r is not choice and group(r) not in seen:
            seen.add(group(r))
            others.append(r)
    return Suggestion(
        found=True, learning_rate=choice["learning_rate"], momentum=choice["momentum"],
        batch_size=choice["b"], kappa=choice["kappa"], steps=int(choice["steps"]),
        seconds=choice["seconds"], loss=curves[id(choice)], refined=choice is not best,
        grid_best={k: best[k] for k in cols}, runners_up=_frame(others[:top], cols),
        reason=None, optimizer=optimizer_of(choice), warmup=choice.get("warmup"),
        outcome=choice["outcome"], spike_step=choice["spike_step"], **common)


def _b(b, n=None) -> str:
    return "N (GD)" if b is None or b == n else str(b)


def _grid_text(cfg, size) -> str:
    """The grid's description: κ × m × B, or (``optimizer=``) peak η × warmups."""
    kappas = f"in [{cfg['kappa_min']:g}, {cfg['kappa_max']:g}]"
    if not cfg.get("optimizer"):
        total = size["kappas"] * size["momenta"] * size["batch_sizes"]
        return (f"{size['kappas']} κ {kappas} × {size['momenta']} m × {size['batch_sizes']} B "
                f"= {total} configurations")
    rng = cfg["learning_rate_range"]
    peaks = (f"κ_peak {kappas}" if rng is None else f"η_peak in [{rng[0]:g}, {rng[1]:g}]")
    return (f"{cfg['optimizer']} warmup-cosine, {size['kappas']} {peaks} × {size['warmups']} "
            f"warmups = {size['kappas'] * size['warmups']} configurations")


def verify_command(cfg: dict, s: dict, n: int, target_loss: float,
                   predictor: str | None = None) -> str:
    """The ``ntk-tt predict --verify`` command that fine-tunes the suggestion ``s`` for real on
    the task of ``cfg`` (flags where they differ from predict's defaults) up to T_max, with
    the target loss as ``--loss-target`` and the predictor suggest used: a fresh user typed
    the bare ``ntk-tt predict --verify`` the report named, which checked the default
    configuration instead. Numbers to 8 significant digits (β₂ = 0.9999999 printed as 1 was
    refused); a suggested warmup is rounded to whole steps (``--warmup`` takes an
    integer). ``predictor``: the report's (e.g. "head_aware:isotropic"): a feature kernel
    other than predict's default for the optimiser is passed as ``--backbone``."""
    import shlex

    from ntk_tt._defaults import DEFAULTS
    from ntk_tt._options import BACKBONES
    from ntk_tt._options_predict import default_backbone

    out = ["ntk-tt predict --verify"]
    for key, flag in (("dataset", "--dataset"), ("checkpoint", "--checkpoint"),
                      ("data_dir", "--data-dir"), ("split", "--split"), ("num_classes", "-K"),
                      ("per_class", "-n"), ("seed", "--seed"), ("head_scale", "--head-scale"),
                      ("loss", "--loss"), ("predictor", "--predictor")):
        if cfg.get(key, DEFAULTS[key]) != DEFAULTS[key]:  # a path with spaces stays one word
            out.append(f"{flag} {shlex.quote(str(cfg[key]))}")
    if not cfg.get("resize", True):
        out.append("--no-resize")
    kind, _, backbone = (predictor or "").partition(":")
    if kind in ("head_aware", "head_aware_adam") and backbone in BACKBONES \
            and backbone != default_backbone():  # not "given" (a head_kernel)
        out.append(f"--backbone {backbone}")
    out.append(f"-T {cfg['steps']}")
    if s["batch_size"] is not None and s["batch_size"] != n:
        out.append(f"-B {s['batch_size']} --num-paths {cfg['num_paths']}")
    opt = cfg.get("optimizer")
    if opt:
        out.append(f"--optimizer {opt} --schedule warmup-cosine --lr {s['learning_rate']:.8g} "
                   f"--warmup {round(s['warmup'])} --weight-decay {cfg['weight_decay']:.8g}")
        out += ([f"-m {s['momentum']:.8g}"] if opt == "sgd" and s["momentum"] else []) + (
            [f"--b1 {cfg['b1']:.8g} --b2 {cfg['b2']:.8g}"] if opt != "sgd" else [])
    else:
        out += [f"-m {s['momentum']:.8g}"] if s["momentum"] else []
        out.append(f"--lr {s['learning_rate']:.8g}")
    out.append(f"--loss-target {target_loss:.8g}")
    return " ".join(out)


def format_suggestion(r: dict) -> str:
    """Human-readable text of a :func:`ntk_tt.suggest_task` report."""
    t, tg, sec = r["task"], r["target"], r["seconds"]
    n = t["n_train"]
    cfg = r["config"]
    lines = [
        f"task: {t['dataset']}, classes {', '.join(t['classes'])}; N = {n} train; model "
        f"{t['architecture']} (D = {t['num_params']})",
        f"target: mean training loss <= {tg['loss']:.4g} ("
        + (f"{tg['value']:g} × L_0, L_0 = {tg['initial_loss']:.4g}" if tg["kind"] == "fraction"
           else f"L_0 = {tg['initial_loss']:.4g}")
        + f") within T_max = {tg['steps_max']} steps",
        f"predictor: {r['predictor']}, λ_max = {r['lambda_max']:.4g}; grid "
        f"{_grid_text(cfg, r['grid_size'])}; kernel {sec['kernel']:.1f} s, "
        f"grid {sec['grid']:.1f} s, refinement {sec['refine']:.1f} s, total {sec['total']:.1f} s "
        f"(compile {sec['compile']:.1f} s apart)",
        "seconds per real step (measured, 5 warm steps, compile excluded): "
        + ", ".join(f"B = {'N (GD)' if b == 'N' else b} {v * 1e3:.1f} ms"
                    for b, v in r["seconds_per_step"].items()),
    ]
    if not r["found"]:
        lines.append(f"no suggestion: {r['reason']}")
        return "\n".join(lines)
    s, g = r["suggestion"], r["grid_best"]
    opt = cfg.get("optimizer")
    what = (f"B = {_b(s['batch_size'])}, m = {s['momentum']:.3g}, η = {s['learning_rate']:.4g}"
            if not opt else
            f"{opt} (B = {_b(s['batch_size'])}"
            + (f", m = {s['momentum']:.3g}" if opt == "sgd" else "")
            + f", λ = {cfg['weight_decay']:g}), peak η = "
            f"{s['learning_rate']:.4g}, warmup {s['warmup']:.3g} steps, cosine to T_max")
    capped = ("" if cfg.get("kappa_eff_max") is None or s.get("kappa_eff") is None
              else f", κ̃ = {s['kappa_eff']:.3g}")  # the capped quantity, beside its cap
    lines.append(
        f"suggestion: {what} (κ = {s['kappa']:.3g}{capped}): {s['steps']} predicted "
        f"step{'' if s['steps'] == 1 else 's'} to "
        f"target (first step with the raw predicted loss <= {tg['loss']:.4g}), "
        f"{s['seconds']:.3g} s of training")
    lines.append(f"  verify: {verify_command(cfg, s, n, tg['loss'], r['predictor'])}")
    if s.get("outcome") == "catapult":  # a fresh user: predict's 32 orders smoothed it away
        paths = ("" if s["batch_size"] is None or s["batch_size"] == n else
                 f" with --num-paths {cfg['num_paths']}, the batch orders this curve "
                 "averages: more can smooth a one-order spike away")
        lines.append(f"  warning: its predicted loss catapults (above L_0 at step "
                     f"{s['spike_step']}, then falls): predictions are least reliable there; "
                     f"check it with a real run (the verify line{paths}) or take a "
                     "runner-up")
    keff = (s["kappa"] / (1.0 - s["momentum"])
            if opt not in ("adam", "adamw") and s["momentum"] < 1.0 else None)
    if keff is not None and keff > TESTED_KAPPA:
        lines.append(f"  note: its {effective_kappa_note(keff)}: check it with a real run "
                     "(the verify line)")
    if (s.get("weight_travel") or 0.0) > LINEAR_TRAVEL:
        lines.append(f"  warning: Adam's schedule lets the backbone's weights move by up to "
                     f"ρ = {s['weight_travel']:.2g} of their RMS (> {LINEAR_TRAVEL:g}), beyond "
                     "the linearised regime, where the real loss falls later and then far "
                     "lower than predicted: check it with a real run (the verify line)")
    if s["refined"]:
        was = (f"m = {g['momentum']:g}, η = {g['learning_rate']:.4g}" if not opt else
               f"peak η = {g['learning_rate']:.4g}, warmup {g['warmup']:g}")
        lines.append(f"  (refined by jax.grad from the grid's best: {was}, {g['steps']:.0f} "
                     f"steps, {g['seconds']:.3g} s)")
    elif cfg.get("refine_steps") == 0:
        lines.append("  (the grid's best; no refinement: --refine-steps 0)")
    else:
        lines.append("  (the grid's best; the gradient refinement did not improve the hard "
                     "predicted time)")
    if r["runners_up"]:
        first = ("B", "m") if not opt else ("warmup", "")
        lines.append(f"runners-up: {first[0]:>7} {first[1]:>5} {'η':>10} {'κ':>7} {'steps':>6} "
                     f"{'seconds':>8}")
        for row in r["runners_up"]:
            lead = (f"{_b(row['batch_size'], n):>7} {row['momentum']:>5g}" if not opt else
                    f"{row['warmup']:>7g} {'':>5}")
            lines.append(f"            {lead} {row['learning_rate']:>10.4g} {row['kappa']:>7.3g} "
                         f"{row['steps']:>6.0f} {row['seconds']:>8.3g}")
    grid = [row for row in r["grid"] if row["source"] == "grid"]
    ok = sum(row["admissible"] for row in grid)
    edge = sum(row["beyond_edge"] for row in grid)
    div = sum(row["diverged"] and not row["beyond_edge"] for row in grid)
    skipped = sum(not row.get("evaluated", True) for row in grid)
    cap = cfg.get("kappa_eff_max")
    where = ("beyond weight travel ρ = 1" if any("weight_travel" in row for row in grid)
             else "beyond the stability edge" + (f" or κ̃ > {cap:.7g}" if cap else ""))
    lines.append(f"admissible: {ok} of {len(grid)} grid configurations reach the target "
                 f"({edge} {where}"
                 + (f", {skipped} of them not predicted" if skipped else "")
                 + f", {div} more diverged, "
                 f"{len(grid) - ok - edge - div} too slow)")
    return "\n".join(lines)
