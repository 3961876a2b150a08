"""The :class:`Prediction` that :func:`ntk_tt.predict` returns, and its making from a
kernel predictor's result (T_ε per ε with the reasons it is undefined)."""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from ntk_tt.dynamics._divergence import KAPPA_MAX, KAPPA_MAX_DIVERGED, OUTCOMES, Outcome
from ntk_tt.dynamics._edge_warnings import edge_words
from ntk_tt.dynamics._predict_kernel import EPSILONS
from ntk_tt.dynamics._regime import UNKNOWN_TRAVEL
from ntk_tt.dynamics._targets import curve_targets
from ntk_tt.dynamics._training_time import (
    BEYOND_EDGE,
    CALLED_DIVERGES,
    DIVERGED,
    NOT_DECREASING,
    NOT_SETTLED,
    REASONS,
    curve_window,
)
from ntk_tt.training._timing import Stopwatch

STAGES = ("setup", "kernel", "noise", "logits", "solve")  # Prediction.seconds' stages


class Prediction(NamedTuple):
    """Result of :func:`ntk_tt.predict` (T = steps; curves indexed by optimiser steps taken).

    loss, error: predicted mean training loss (MEAN over samples) and error rate (T + 1,);
      ``error`` is all NaN when not predicted (``subset=N'``: the loss curve only).
    loss_band, error_band: 5–95 % band over paths/seeds (2, T + 1), None if deterministic.
    test_loss, test_error: held-out curves (T + 1,) when ``x_test`` was given, else None.
    training_time: {"loss": {ε: T_ε}, "error": {ε: T_ε}} in steps, ε ∈ (0.01, 0.1, 0.4);
      NaN when undefined, with the reason in training_time_reasons[curve][ε]; NaN also
      whenever ``outcome`` is "diverges" (reason "predicted to diverge ...": a run called
      divergent has no training time, though ``loss`` keeps the linearised curve).
    diverged, diverged_at: whether the predicted loss diverged (non-finite, or L_T > L_0; the
      rule of ``ntk_tt.dynamics._divergence``, shared with :func:`ntk_tt.finetune`) and the step its
      final rise above L_0 began (None if not diverged).
    spiked_at: first step the loss exceeded 10·L_0 (None if never); with ``diverged`` False
      the curve spiked and recovered, and its call is still "diverges" (below): no T_ε.
    kappa: η·λ_max(Θ)/N; beyond_edge: κ beyond the linear model's stability edge (for an Adam
      prediction: its weight travel ρ beyond ``_regime.UNKNOWN_TRAVEL`` = 1).
    outcome, spike_step: the call on the real run (``ntk_tt.dynamics._divergence.call``):
      "diverges" (the predicted curve diverged or spiked above 10·L_0, or κ ≥ 68, where the
      real constant-η runs measured diverged; not for Adam; a feature-subspace kernel's,
      ``backbone="subspace"`` or ``"diagonal"``, curve that diverges below κ = 68 is called
      "catapult": its linearised backbone blows up where the real network self-stabilises,
      ``_divergence.call``), "unknown" (κ beyond the edge
      and a predictor that cannot blow up there: frozen kernel with cross-entropy, or
      ODE/SDE; or an Adam prediction whose weight travel ρ exceeds
      ``_regime.UNKNOWN_TRAVEL`` = 1 and whose curve does not diverge; or
      ``method="closed_form"`` with m > 0 at 2(1 − m) ≤ κ ≤ 2(1 + m), where its η/(1 − m) GD
      model is unstable and heavy ball is not, whatever its curve), else "catapult" (the
      predicted curve rises above L_0 and recovers) or "converges"; the first step above L_0
      (None if none). None only for a Prediction built by hand.
    divergence (property): the call as a verdict on the real run, "yes" (outcome
      "diverges"), "unknown" (outcome "unknown") or "no", with ``divergence_reason`` (None
      for "no"; for "yes": the step the predicted loss diverged at, or the spike or κ).
      ``diverged`` stays the predicted curve's own flag. A frozen-kernel cross-entropy
      prediction (no ``head``) beyond the edge also has no T_ε (NaN, reason "beyond the
      stability edge: the linearised model cannot tell").
    clamped, min_eigenvalue: whether Θ had significant negative eigenvalues (set to 0).
    method, kernel: what was actually used (``"traced:subset<N'>:<subset_method>"`` for
      ``subset=N'``).
    hyperparameters: what was predicted: {"learning_rate": η, "momentum": m, "nesterov",
      "batch_size": B (N for GD), "steps": T, "num_train": N, "loss"}, with the linear
      predictor's sketch sizes where drawn: "sketch_dim" (the kernel's D', ``kernel="sketch"``)
      and "noise_dim" (the SDE noise features' D', ``method="sde"``; default min(256, D));
      :func:`ntk_tt.compare` checks them against the fine-tuning run.
    seconds: wall time per stage (``STAGES``: "setup" = validation, the schedule and
      assembling the result, i.e. the call's time outside the other stages; "kernel",
      "noise", "logits", "solve") and "total" (the whole call = the sum of the stages), all
      WITHOUT JAX compilation (tracing, lowering, XLA compile), whose seconds during the
      whole call are summed apart in "compile". With ``subset=N'``: "kernel" is the subset
      (power law) or cross (Nyström) kernel, "logits" f0 on all N, "solve" = "spectrum" +
      "curve".
    steps_to_target: {curve: {target: steps}} for the ``targets`` asked of
      :func:`ntk_tt.predict` ({} for none): the first optimiser step at which the smoothed
      predicted curve ("loss", "error", "test_loss", "test_error") is ≤ the target
      (:func:`ntk_tt.steps_to_target`, window ``curve_window``); NaN when undefined, with the
      reason in steps_to_target_reasons[curve][target] (never reached within T, or, as for
      T_ε, the prediction diverged, is called divergent, or cannot tell beyond the stability
      edge).

    Source: ntk_tt's own container of :func:`ntk_tt.predict`'s result (T_ε: METHOD.md §6;
    the divergence rule and outcome: METHOD.md §2).
    """

    loss: np.ndarray
    error: np.ndarray
    loss_band: np.ndarray | None
    error_band: np.ndarray | None
    test_loss: np.ndarray | None
    test_error: np.ndarray | None
    training_time: dict
    training_time_reasons: dict
    diverged: bool
    diverged_at: int | None
    spiked_at: int | None
    kappa: float
    beyond_edge: bool
    clamped: bool
    min_eigenvalue: float
    method: str
    kernel: str
    hyperparameters: dict
    seconds: dict
    steps_to_target: dict = {}  # never mutated (with_targets makes a new Prediction)
    steps_to_target_reasons: dict = {}
    outcome: str | None = None
    spike_step: int | None = None

    @property
    def divergence(self) -> str:
        """"yes", "no" or "unknown" (see the class docstring)."""
        return {"diverges": "yes", "unknown": "unknown"}.get(self.outcome, "no")

    @property
    def divergence_reason(self) -> str | None:
        """Why the verdict is "yes" or "unknown" (None for "no")."""
        if self.divergence == "yes" and self.diverged:
            at = "" if self.diverged_at is None else f" at step {self.diverged_at}"
            spike = ("" if self.spiked_at is None else
                     f", above 10·L_0 from step {self.spiked_at}")
            return (f"the predicted loss diverged (non-finite, or ending above L_0): its final "
                    f"rise began{at}{spike} (README, \"Diverged means\")")
        if self.divergence == "yes" and not self.diverged:
            why = []
            if self.spiked_at is not None:
                why.append(f"the predicted loss spiked above 10·L_0 at step {self.spiked_at}, "
                           "and every real run measured that did was destroyed (README, "
                           "\"Diverged means\")")
            if self.kappa >= KAPPA_MAX and self.hyperparameters.get("optimizer") not in (
                    "adam", "adamw"):  # Adam's call is its curve's (κ is not its edge)
                why.append(f"κ = η·λ_max/N = {self.kappa:.3g} ≥ {KAPPA_MAX:g}, where the real "
                           f"runs measured diverged ({KAPPA_MAX_DIVERGED}; README, \"Diverged "
                           "means\")")
            return "; ".join(why) + ", though the predicted curve did not end above L_0"
        if self.divergence != "unknown":
            return None
        travel = self.hyperparameters.get("weight_travel") or 0.0
        if travel > UNKNOWN_TRAVEL:
            return (f"Adam's weight travel ρ = Σ η_t / rms(θ_0) = {travel:.3g} > "
                    f"{UNKNOWN_TRAVEL:g}: the backbone's weights may move by more than their "
                    "RMS, where real runs measured spiked or were destroyed while the "
                    "linearised model's loss fell to 0; lower the peak learning rate or the "
                    "steps for a verdict")
        m = self.hyperparameters.get("momentum") or 0.0
        if self.method == "closed_form" and m > 0 and not self.beyond_edge:
            return (f"κ = η·λ_max/N = {self.kappa:.3g} ≥ 2(1 − m) = {2 * (1 - m):.3g}, where "
                    "the closed form's GD model with η/(1 − m) is unstable while "
                    f"{edge_words(m, bool(self.hyperparameters.get('nesterov')))}: its curve "
                    "cannot tell whether the real run diverges; use method='discrete' (exact "
                    "momentum)")
        return (f"κ = η·λ_max/N = {self.kappa:.3g} is beyond the linearised model's stability "
                "edge and the prediction did not diverge: the linearised model cannot tell "
                "whether the real run diverges (README, \"Diverged means\"); lower the learning "
                "rate for a verdict")


LINEARISED_CATAPULT = ("the linearised curve diverges below κ = 68, where the real run is called "
                       "a catapult (it spikes and recovers, which the linearised backbone "
                       "cannot follow): no training time")


def _to_prediction(out, method, kernel, hyper, seconds) -> Prediction:
    t_eps, codes = np.asarray(out.training_time), np.asarray(out.training_time_code)
    names = ("loss", "error")
    times = {nm: {e: float(t_eps[i, j]) for j, e in enumerate(EPSILONS)}
             for i, nm in enumerate(names)}
    reasons = {nm: {e: REASONS[int(codes[i, j])] for j, e in enumerate(EPSILONS)
                    if codes[i, j]} for i, nm in enumerate(names)}

    def arr(a):  # + 0.0: a loss or error rate that rounds to 0 is 0, not −0
        return None if a is None else np.asarray(a) + 0.0

    at, spike = int(out.diverged_at), int(out.spiked_at)
    said = outcome_fields(Outcome(out.outcome, out.spike_step))
    if said["outcome"] == "catapult" and bool(out.diverged):  # a feature-subspace kernel's
        reasons = {nm: {e: LINEARISED_CATAPULT if r == REASONS[DIVERGED] else r
                        for e, r in per.items()} for nm, per in reasons.items()}
    return Prediction(
        loss=arr(out.loss), error=arr(out.error), loss_band=arr(out.loss_band),
        error_band=arr(out.error_band), test_loss=arr(out.test_loss),
        test_error=arr(out.test_error), training_time=times, training_time_reasons=reasons,
        diverged=bool(out.diverged), diverged_at=None if at < 0 else at,
        spiked_at=None if spike < 0 else spike,
        kappa=float(out.kappa), beyond_edge=bool(out.beyond_edge), clamped=bool(out.clamped),
        min_eigenvalue=float(out.min_eigenvalue), method=method, kernel=kernel,
        hyperparameters=hyper, seconds=seconds, **said,
    )


def outcome_fields(said: Outcome) -> dict:
    """A call (``ntk_tt.dynamics._divergence.call``) as :class:`Prediction` fields:
    ``outcome`` (a name of ``OUTCOMES``) and ``spike_step`` (None for none)."""
    step = int(said.spike_step)
    return {"outcome": OUTCOMES[int(said.outcome)], "spike_step": None if step < 0 else step}


def with_targets(pred: Prediction, targets: dict) -> Prediction:
    """``pred`` with ``steps_to_target`` / ``steps_to_target_reasons`` for ``targets``
    ({curve: (target, ...)}, checked by ``ntk_tt._options_targets.check_targets``) on its own
    curves. Undefined wherever its T_ε is for the whole prediction: a diverged prediction
    (reason "training diverged"), one called divergent (the kernel predictors' T_ε code
    ``CALLED_DIVERGES``; :func:`withhold_called_divergent` for the subset's), or a
    frozen-kernel cross-entropy one beyond the stability edge (it cannot tell)."""
    if not targets:
        return pred
    blind = REASONS[DIVERGED] if pred.diverged else next(
        (why for why in pred.training_time_reasons["loss"].values()
         if why in (REASONS[BEYOND_EDGE], REASONS[CALLED_DIVERGES])), None)
    curves = {name: getattr(pred, name) for name in ("loss", "error", "test_loss",
                                                      "test_error")}
    steps, reasons = curve_targets(curves, targets, window=curve_window(len(pred.loss)),
                                   undefined=blind)
    return pred._replace(steps_to_target=steps, steps_to_target_reasons=reasons)


def withhold_called_divergent(pred: Prediction) -> Prediction:
    """``pred`` without T_ε (NaN, reason ``CALLED_DIVERGES``) where its call on the real run
    is "diverges" (a spike above 10·L_0, or κ ≥ 68) though its own curve did not diverge: a
    run predicted to diverge has no training time, whatever the linearised curve, which stays
    in ``loss`` / ``error`` for inspection. A diverged curve already has none. For the
    subset predictor, whose T_ε come from a spectrum; the kernel predictors' do so in
    ``ntk_tt.dynamics._predict_kernel._summarise``."""
    if pred.outcome != "diverges" or pred.diverged:
        return pred
    shape = (None, REASONS[NOT_DECREASING], REASONS[NOT_SETTLED])  # the curve's own reasons
    reasons = pred.training_time_reasons
    hit = {c: [e for e in per if reasons.get(c, {}).get(e) in shape]
           for c, per in pred.training_time.items()}
    return pred._replace(
        training_time={c: per | dict.fromkeys(hit[c], float("nan"))
                       for c, per in pred.training_time.items()},
        training_time_reasons={c: reasons.get(c, {}) | dict.fromkeys(hit[c],
                                                                     REASONS[CALLED_DIVERGES])
                               for c in pred.training_time})


def account_seconds(seconds: dict, whole: Stopwatch) -> dict:
    """``seconds`` of the named stages completed with the whole call's ``Stopwatch``:
    "setup" = the call's wall time without compilation minus the other ``STAGES``,
    "compile" = all compilation during the call, "total" = the sum of ``STAGES``."""
    named = sum(seconds.get(stage, 0.0) for stage in STAGES[1:])
    out = {k: v for k, v in seconds.items() if k not in ("compile", "total")}
    out["setup"] = max(whole.seconds - named, 0.0)
    return out | {"compile": whole.compile_seconds, "total": out["setup"] + named}


def timed_prediction(fn):
    """Decorator: ``fn`` (:func:`ntk_tt.predict`) run under one ``Stopwatch``; its
    :class:`Prediction`'s ``seconds`` completed by :func:`account_seconds`."""

    @functools.wraps(fn)
    def timed(*args, **kwargs) -> Prediction:
        with Stopwatch() as whole:
            pred = fn(*args, **kwargs)
        return pred._replace(seconds=account_seconds(pred.seconds, whole))

    return timed
