"""``suggest``: the (η, m, B) that reach a target loss soonest in wall-clock time, without training.

For a target mean training loss L* (an absolute value, or a fraction of the initial loss L_0),
a step budget T_max and candidate batch sizes, the predicted wall-clock time to the target of a
configuration (η, m, B) is

    seconds(η, m, B) = t*(η, m, B) × s(B),    t* = min { t ≤ T_max : L̂_t(η, m, B) ≤ L* },

with L̂ the predicted mean training-loss curve (head-aware predictor with ``head=``, METHOD.md
§10; the frozen-kernel linear predictor without, §2) and s(B) the measured seconds per real
optimiser step at batch size B (:func:`ntk_tt.step_time`, once per B, compile excluded;
METHOD.md §6, paper Sec. 5: wall-clock time = steps × time per step). A configuration is
admissible when its prediction does not diverge (``ntk_tt.dynamics._divergence``) and κ =
η·λ_max/N is within the linearised model's stability edge (``beyond_edge`` false).

Search: a log grid of κ × a set of momenta for every B, all through ONE kernel, one compiled
``jit(vmap)`` per B; then the best admissible grid point is refined in (log η, m) by a few
projected steps of ``jax.grad`` of a differentiable surrogate of t* (a soft count of the steps
before the hit, built like :func:`ntk_tt.smooth_training_time`), kept only if the hard
predicted time improves and the configuration stays admissible. With ``optimizer=`` (an SGD
or Adam/AdamW template) the search is over the peak learning rate × warmup of a warmup-cosine
schedule instead (``_suggest_optimizer``). This module checks the arguments and runs the job;
in ``ntk_tt.analysis``, the curves and their surrogate are ``_suggest_curves``, the search
``_suggest_search``, the refinement ``_suggest_refine``, the result ``_suggest_report``, the
``ntk-tt suggest`` job ``_suggest_task``.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence

import jax.numpy as jnp
import numpy as np

# the argument checks need no JAX: ntk-tt suggest runs them before importing it
from ntk_tt._options import (
    _check_batch_sizes,
    _check_momenta,
    _check_scalars,
    _check_target,
)
from ntk_tt._options_suggest import check_kappa_eff_max
from ntk_tt.analysis._suggest_report import Suggestion, _result
from ntk_tt.analysis._suggest_search import _check_seconds, _search
from ntk_tt.data._inputs import as_array, at_least_float32, check_key
from ntk_tt.dynamics._checks import check_kernel_inputs
from ntk_tt.dynamics._losses import check_loss, mean_loss
from ntk_tt.dynamics._regime import warn_travel, weight_travel

MOMENTA = (0.0, 0.5, 0.9, 0.95)
KAPPA_RANGE = (0.05, 50.0)
NUM_KAPPAS = 16
LINEAR_KERNELS = ("exact", "traced")


class TargetNotReachedWarning(UserWarning):
    """:func:`suggest` found no admissible configuration reaching the target within the step
    budget: its :class:`Suggestion` has ``found`` False and None choice fields; the message
    (= ``Suggestion.reason``) says what to try. ``ntk-tt suggest`` says it and exits 1.

    Source: ntk_tt's own (README "Choosing hyperparameters without training")."""


def suggest(apply_fn, params, x, y, *, target, steps, target_kind: str = "absolute",
            batch_sizes: Sequence | None = None, head=None, predictor: str = "auto",
            momenta: Sequence | None = None, kappa_range: Sequence | None = None,
            num_kappas: int = NUM_KAPPAS, refine_steps: int = 8, temperature: float = 0.05,
            loss: str = "cross_entropy", key=None, num_paths: int = 8,
            seconds_per_step: Mapping | None = None, kernel: str = "exact",
            backbone: str | None = None, top: int = 5, evaluate_beyond_edge: bool = False,
            head_kernel=None, progress: bool = False, optimizer=None,
            warmups: Sequence | None = None, learning_rate_range: Sequence | None = None,
            kappa_eff_max: float | None = None) -> Suggestion:
    """The (η, m, B) that minimise the predicted wall-clock time to a target training loss.

    seconds(η, m, B) = (first step t ≤ ``steps`` with predicted mean loss L̂_t ≤ target) ×
    (measured seconds per real step at B), over configurations whose prediction does not
    diverge and whose κ = η·λ_max/N is within the stability edge (METHOD.md §6 wall-clock,
    §10 head-aware; paper Sec. 5). Grid: ``num_kappas`` κ log-spaced over ``kappa_range`` ×
    ``momenta`` × ``batch_sizes``, one kernel, one compiled ``jit(vmap)`` per B; then
    ``refine_steps`` projected gradient steps of ``soft_time_to_target`` (``_suggest_curves``)
    in (log η, m) from the best grid point (B fixed), kept only if the hard predicted time
    improves; projected onto ``kappa_range`` (as η; with ``optimizer=``, η_peak onto the grid's
    range, ``learning_rate_range`` when given) below the stability edge, so the suggestion lies
    in the range asked for. ``kappa_eff_max`` caps the effective κ̃ = κ/(1 − m) as well (the
    region where the predictions were benchmarked: κ̃ <= 12, README "Benchmark sweep").

    Source: ntk_tt's own search (README "Choosing hyperparameters without training") on the
    predicted curves (METHOD.md §2, §10, §11) and the wall-clock time of METHOD.md §6.

    Example:
      >>> s = ntk_tt.suggest(apply_fn, params, x, y, head=ntk_tt.split_head(model),
      ...                    target=0.5, target_kind="fraction", steps=150,
      ...                    batch_sizes=(None, 50), key=jax.random.key(0))
      >>> s.learning_rate, s.momentum, s.batch_size, s.steps, s.seconds
      >>> s = ntk_tt.suggest(..., optimizer=ntk_tt.adamw(1e-3, weight_decay=0.01))
      >>> s.optimizer, s.learning_rate, s.warmup   # the template with the best schedule

    With ``optimizer=`` (``_suggest_optimizer``): the template's rule, momentum (β₁, β₂, ε),
    weight decay and batch size are kept; η_t = warmup_cosine(η_peak, w, ``steps``) with the
    template's init/peak and end/peak ratios, searched over ``num_kappas`` η_peak (log grid:
    κ_peak over ``kappa_range`` for SGD; η_peak over ``learning_rate_range``, default
    (1e-4, 1e-1), for Adam, or for SGD when given) × ``warmups`` (fractions of ``steps``,
    rounded to whole steps, each below ``steps``), one kernel and one compiled ``jit(vmap)``,
    then refined in (log η_peak, w) through the exact schedule (w stays below ``steps``, as
    ``predict`` and ``finetune`` need). Adam needs ``head``.

    Args:
      apply_fn, params: the model with its new head, ``apply_fn(params, x)`` → logits (N, C);
        its real training step is timed per batch size.
      x: training inputs (N, ...). y: integer labels (N,).
      target, target_kind: the target mean training loss (``"absolute"``, 0 < target < L_0)
        or a fraction of L_0 in (0, 1) (``"fraction"``).
      steps: the step budget T_max (optimiser updates).
      batch_sizes: candidate B (default (None,)): None (or N) = full-batch GD, integers in
        [1, N) = SGD with the batch order of ``ntk_tt.batch_indices`` (the predicted curve is
        the mean over ``num_paths`` orders, path 0 = the order a real run with ``key`` uses).
      head: ``ntk_tt.split_head(model)`` for the head-aware predictor (the default when given);
        None = the frozen-kernel linear predictor. kernel: its Θ, "exact" (N·C×N·C) or "traced".
      predictor: "auto", "head_aware" or "linear". backbone: head-aware feature kernel (None:
        "isotropic", the kernel suggest's checks were measured with; ``predict``'s own default
        is "diagonal" for the SGD family, so the report's ``verify:`` line names it).
      momenta: heavy-ball m of the grid, each in [0, 1) (default (0, 0.5, 0.9, 0.95)).
        kappa_range, num_kappas: the κ grid's (min, max) (default (0.05, 50)) and size.
      refine_steps: gradient evaluations of the refinement (0: none). temperature: τ of the
        surrogate. loss: "cross_entropy" or "mse" (mean over samples). key: jax.random key
        (needed when some B < N). num_paths: SGD batch orders averaged.
      seconds_per_step: {B: seconds} to use instead of measuring (e.g. from an earlier run).
      top: runner-up rows. evaluate_beyond_edge: also predict the grid points beyond the
        stability edge (never suggested; by default listed in ``grid`` unpredicted, which saves
        a third of the default grid's work). head_kernel: a :class:`ntk_tt.HeadAwareKernel`
        of ``head`` on ``x`` already built (``ntk_tt.head_aware_kernel``) to reuse instead of
        building one (its backbone kernel replaces ``backbone``; with Adam it must be of the
        form ``backbone`` names). progress: a tqdm bar over the stages.
      optimizer: an :class:`ntk_tt.Optimizer` template (``ntk_tt.sgd``, ``adamw``; its
        schedule a constant or an unsmoothed ``warmup_cosine``); not with ``batch_sizes`` or
        ``momenta``. warmups: fractions of ``steps`` in [0, 1) (default (0, 0.05, 0.1, 0.2)).
        learning_rate_range: (min, max) η_peak of the log grid (not with ``kappa_range``).
      kappa_eff_max: None, or the largest effective κ̃ = κ/(1 − m) (SGD; with ``optimizer=``
        κ_peak/(1 − m)) a suggestion may have: grid points above it are treated like those
        beyond the stability edge (``beyond_edge``, never suggested, not predicted unless
        ``evaluate_beyond_edge``) and the refinement stays below it. Not for Adam.

    Returns:
      :class:`Suggestion`.

    Warns:
      TargetNotReachedWarning: (a ``UserWarning``) when no admissible configuration reaches
        the target within ``steps``: the Suggestion then has ``found`` False and None choice
        fields; the message (= ``reason``) says what to try (a larger ``steps``, a looser
        target, a wider ``kappa_range``). LinearRegimeWarning: an Adam choice whose weight
        travel ρ (``Suggestion.weight_travel``) exceeds 0.07 (``ntk_tt.dynamics._regime``).

    Raises:
      ValueError: before any work, for every bad argument (the message says how to fix it):
        x, y, model or head as in :func:`ntk_tt.predict`; target or target_kind; steps < 1;
        batch sizes not None / int in [1, N] or repeated; momenta outside [0, 1);
        kappa_range not 0 < min <= max; num_kappas, refine_steps, num_paths, top; a
        temperature <= 0; seconds_per_step missing a B or not > 0; a missing key for SGD;
        ``optimizer`` not an Optimizer, or given with batch_sizes or momenta, or its schedule
        not a constant / unsmoothed warmup_cosine, Adam without ``head`` or with L2 decay,
        Adam with kappa_range or kappa_eff_max; kappa_eff_max not a finite number > 0 or
        below the κ grid's minimum; warmups or learning_rate_range without ``optimizer`` or out of
        range, or a warmups fraction that rounds to a warmup of ``steps`` or more (the
        message gives the largest fraction allowed); unknown loss, predictor, kernel or
        backbone; a head_kernel that is not a HeadAwareKernel, given without head, or built on
        another N than x (both N named).
        After one forward pass (before the kernel): an absolute target not below L_0. After
        the kernel: λ_max ≤ 0 (outputs that do not depend on the parameters).
    """
    from tqdm import tqdm

    from ntk_tt.data._model import check_model
    from ntk_tt.dynamics._checks import check_labels
    from ntk_tt.prediction._predict_checks import _check_predictor
    from ntk_tt.training._timing import Stopwatch

    if optimizer is not None:
        from ntk_tt.dynamics._optim_linear import check_optimizer

        given = [k for k, v in (("batch_sizes", batch_sizes), ("momenta", momenta))
                 if v is not None]
        if given:
            raise ValueError(f"suggest: optimizer= fixes the batch size and momentum (the search "
                             f"is over its peak learning rate and warmup); drop "
                             f"{' and '.join(given)} or put them into the optimizer, e.g. "
                             "ntk_tt.sgd(0.1, 0.9, batch_size=32).")
        check_optimizer(optimizer, ("sgd", "adam"), where="suggest")
    elif warmups is not None or learning_rate_range is not None:
        raise ValueError("warmups and learning_rate_range search an optimizer's schedule: pass "
                         "optimizer=ntk_tt.sgd(...) / ntk_tt.adamw(...) too (the constant-η "
                         "grid is kappa_range × momenta × batch_sizes).")
    check_loss(loss)
    check_key(key)
    target_value = _check_target(target, target_kind)
    kappas = KAPPA_RANGE if kappa_range is None else kappa_range
    if kappa_range is None and optimizer is not None and (
            learning_rate_range is not None or optimizer.rule == "adam"):
        kappas = (1.0, 1.0) if num_kappas == 1 else kappas  # no κ grid: check_search's range
    lo, hi, tau = _check_scalars(steps, kappas, num_kappas, refine_steps, temperature,
                                 num_paths, top)
    adam = optimizer is not None and optimizer.rule == "adam"
    if adam and kappa_eff_max is not None:
        raise ValueError("kappa_eff_max caps SGD's effective κ̃ = κ/(1 − m); Adam's step is not "
                         "sized by κ: drop it (bound learning_rate_range instead).")
    kappa_eff_max = check_kappa_eff_max(kappa_eff_max, None if optimizer is not None and (
        learning_rate_range is not None or adam) else lo)  # None: an η grid, no κ_min
    if kernel not in LINEAR_KERNELS:
        raise ValueError(f"kernel must be one of {LINEAR_KERNELS}, got {kernel!r}.")
    x = as_array(x, "x")
    params, x, head = at_least_float32((params, x, head))  # as predict (README, "Dtypes")
    n, c = check_model(apply_fn, params, x)
    check_loss(loss, c)
    y = check_labels(y, n, c)
    if optimizer is None:
        bsizes = _check_batch_sizes((None,) if batch_sizes is None else batch_sizes, n)
        moms = _check_momenta(MOMENTA if momenta is None else momenta)
    if key is None and optimizer is None and any(b is not None for b in bsizes):
        raise ValueError("SGD batch sizes (B < N) are random: pass key=jax.random.key(seed).")
    head_aware = _check_predictor(predictor, head, backbone, "discrete", "exact", apply_fn,
                                  params, x)
    backbone = "isotropic" if backbone is None else backbone  # suggest's (docstring)
    if optimizer is not None:
        from ntk_tt._options_suggest import WARMUPS
        from ntk_tt.analysis._suggest_optimizer import check_search

        spec = check_search(optimizer, n=n, steps=steps, key=key, head_aware=head_aware,
                            warmups=WARMUPS if warmups is None else warmups,
                            kappa_range=kappa_range, learning_rate_range=learning_rate_range,
                            num_kappas=num_kappas)
        bsizes = [spec["b"]]
    sps_given = _check_seconds(seconds_per_step, bsizes, n)
    if head_kernel is not None:
        from ntk_tt.kernels._head_aware import HeadAwareKernel

        if not head_aware:
            raise ValueError("head_kernel is for the head-aware predictor: pass head="
                             "ntk_tt.split_head(model) too (or drop head_kernel).")
        if not isinstance(head_kernel, HeadAwareKernel):
            raise ValueError("head_kernel must be the HeadAwareKernel of head on these N = "
                             f"{n} inputs (ntk_tt.head_aware_kernel(head, x)), got "
                             f"{type(head_kernel).__name__}.")
        n_hk = np.shape(head_kernel.features)[0] if np.ndim(head_kernel.features) else None
        if n_hk != n:
            raise ValueError("head_kernel must be the HeadAwareKernel of head on these N = "
                             f"{n} inputs of x, but it was built on N = {n_hk} inputs "
                             f"(features of shape {np.shape(head_kernel.features)}): build it "
                             "with ntk_tt.head_aware_kernel(head, x) on the same x, or drop "
                             "head_kernel.")
        check_kernel_inputs(head_kernel, head, x, rows=None)  # every row: a search's cost

    f0 = apply_fn(params, jnp.asarray(x))
    l0 = float(mean_loss(f0, y, loss))
    target_abs = target_value * l0 if target_kind == "fraction" else target_value
    if not target_abs < l0:
        raise ValueError(f"target {target_value:g} is not below the initial mean training loss "
                         f"L_0 = {l0:.6g}: it is reached at step 0; choose a lower target (or "
                         "target_kind='fraction' with a value in (0, 1)).")

    stages = 2 + len(bsizes) + (refine_steps > 0)
    bar = tqdm(total=stages, disable=not progress, unit="stage",
               bar_format="{desc}: {n}/{total} stages [{elapsed}]")
    timings: dict = {}
    try:
        with Stopwatch() as total:
            common = (target_abs, steps, lo, hi, num_kappas, tau, refine_steps, loss, key,
                      num_paths, kernel, backbone, timings, bar, bool(evaluate_beyond_edge),
                      head_kernel, kappa_eff_max)
            if optimizer is None:
                found = _search(apply_fn, params, x, y, f0, head if head_aware else None, n, c,
                                bsizes, moms, sps_given, *common)
            else:
                from ntk_tt.analysis._suggest_optimizer import schedule_at, search

                found = search(apply_fn, params, x, y, f0, head if head_aware else None, n, c,
                               spec, sps_given, *common)
    except BaseException:
        bar.leave = False  # clear the bar: the caller's message starts a clean line
        raise
    finally:
        bar.close()
    timings["total"], timings["compile"] = total.seconds, total.compile_seconds
    rows, ranked, best, choice, curves, refinement, sps, name, lam = found
    widen = f"kappa_range {(lo, hi)}"
    extra = {}
    if optimizer is not None:
        rng = spec["lr_range"]
        widen = (f"learning_rate_range {rng}" if rng is not None else widen) + (
            f" or try other warmups than {tuple(int(w) for w in spec['warmups'])} steps")
        extra["optimizer_of"] = lambda r: schedule_at(spec["unit"], r["learning_rate"],
                                                      r["warmup"])
    if kappa_eff_max is not None:
        widen += f", or raise kappa_eff_max {kappa_eff_max:.7g}"
    s = _result(rows, ranked, best, choice, curves, refinement, sps, target_abs, l0,
                target_kind, target_value, name, lam, n, steps, top, timings, widen,
                kappa_eff_max=kappa_eff_max, **extra)
    if not s.found:
        warnings.warn(f"suggest: target not reached: {s.reason} (Suggestion.found is False and "
                      "its choice fields are None; Suggestion.grid lists every configuration "
                      "tried).", TargetNotReachedWarning, stacklevel=2)
    elif s.optimizer.rule == "adam":  # README "Where the Adam predictor holds"
        s = dataclasses.replace(s, weight_travel=weight_travel(
            s.optimizer.learning_rates(steps), head[1]))
        warn_travel(s.weight_travel, stacklevel=3)
    return s
