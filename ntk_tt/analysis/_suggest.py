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
``_suggest_search``, the refinement ``_suggest_refine``, the result ``_suggest_report``.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

# the argument checks need no JAX: ntk-tt suggest runs them before importing it
from ntk_tt._options import (
    _check_batch_sizes,
    _check_momenta,
    _check_scalars,
    _check_target,
    check_suggest_job,
)
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
            backbone: str = "isotropic", top: int = 5, evaluate_beyond_edge: bool = False,
            head_kernel=None, progress: bool = False, optimizer=None,
            warmups: Sequence | None = None,
            learning_rate_range: Sequence | None = None) -> Suggestion:
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
    in the range asked for.

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
      predictor: "auto", "head_aware" or "linear". backbone: head-aware feature kernel.
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
        Adam with kappa_range; warmups or learning_rate_range without ``optimizer`` or out of
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
                      head_kernel)
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
            f" or try other warmups than {tuple(spec['warmups'])} steps")
        extra["optimizer_of"] = lambda r: schedule_at(spec["unit"], r["learning_rate"],
                                                      r["warmup"])
    s = _result(rows, ranked, best, choice, curves, refinement, sps, target_abs, l0,
                target_kind, target_value, name, lam, n, steps, top, timings, widen, **extra)
    if not s.found:
        warnings.warn(f"suggest: target not reached: {s.reason} (Suggestion.found is False and "
                      "its choice fields are None; Suggestion.grid lists every configuration "
                      "tried).", TargetNotReachedWarning, stacklevel=2)
    elif s.optimizer.rule == "adam":  # README "Where the Adam predictor holds"
        s = dataclasses.replace(s, weight_travel=weight_travel(
            s.optimizer.learning_rates(steps), head[1]))
        warn_travel(s.weight_travel, stacklevel=3)
    return s


# --- the task job behind ``ntk-tt suggest`` ------------------------------------------------


def suggest_task(*, json_path=None, progress: bool = True, overwrite: bool = False,
                 **options) -> dict:
    """``ntk-tt suggest`` as a call: load the task like ``ntk-tt predict`` (shipped checkpoint
    and vendored flowers5 by default, fresh seeded head), run :func:`suggest`, return a
    JSON-ready report.

    Source: none (the ``ntk-tt suggest`` job around :func:`suggest`; README "Choosing
    hyperparameters without training").

    Args:
      json_path: None, or the report's JSON file (``~`` expanded): claimed first unless
        ``overwrite`` (status "started", removed if the job fails or is interrupted), then
        the report with status "complete".
      progress: tqdm bars over :func:`suggest`'s stages.
      overwrite: True replaces an existing ``json_path``; False (default) refuses it.
      **options: the job's options (defaults in ``ntk_tt._defaults.SUGGEST_DEFAULTS``):
        checkpoint, dataset, data_dir, split, num_classes (K), per_class (n), seed, resize,
        head_scale, target, target_kind, steps (T_max), batch_sizes (candidate B, None entries
        = GD; omitted or None: ``ntk_tt._options.default_batch_sizes(K·n)``, i.e. (None, 50)
        without 50 when N = K·n <= 50, as ``ntk-tt suggest`` without -B), momenta, kappa_min,
        kappa_max, num_kappas, refine_steps, num_paths, loss, predictor, top; and the
        optimiser search (``ntk_tt._options_suggest.split_optimizer_options``): optimizer
        ("sgd" | "adamw" | None), weight_decay, momentum, b1, b2, warmups, lr_min, lr_max.

    Returns:
      The JSON-ready report (``json_path``'s, less ``status``): ``config``, ``task``, ``target``,
      ``found``, ``reason``, ``suggestion`` (None unless found) and :func:`suggest`'s other results.

    Warns:
      TargetNotReachedWarning: as :func:`suggest`, when nothing reaches the target (the report
        has ``found`` False and its ``reason``).

    Raises:
      ValueError: one line for any bad option (values, the dataset path, data_dir and
        checkpoint that must exist, a split other than "train" for a short name or .npz file)
        or output path, before JAX work and before the checkpoint's weights are read
        (:func:`ntk_tt._options.check_suggest_job`).
    """
    from ntk_tt._options_suggest import split_optimizer_options
    from ntk_tt.prediction._report_file import COMPLETE, _output, _write_json, claimed_report

    opt_o, options = split_optimizer_options(options)
    o = check_suggest_job(options, json_path, overwrite)
    json_file = None if not json_path else Path(json_path).expanduser()
    with claimed_report(json_file, not overwrite, o | opt_o):  # as ntk-tt predict's --json
        report = _suggest_report(o, opt_o, progress)
        if json_file:
            _output(_write_json, json_file, report | {"status": COMPLETE}, create=False)
    return report


def _suggest_report(o, opt_o, progress) -> dict:
    """The work of :func:`suggest_task` on checked options: the JSON-ready report."""
    from ntk_tt.prediction._job import _plain, load_task
    from ntk_tt.training._optimizer_run import optimizer_hyperparameters

    apply_fn, params, x, y, _, _, info, head = load_task(
        **{k: o[k] for k in ("checkpoint", "dataset", "data_dir", "split", "num_classes",
                             "per_class", "seed", "resize", "head_scale")}, test_per_class=0)
    key = jax.random.fold_in(jax.random.key(o["seed"]), 2)
    kappa = (o["kappa_min"], o["kappa_max"])
    grid = dict(batch_sizes=tuple(o["batch_sizes"]), momenta=tuple(o["momenta"]),
                kappa_range=kappa)
    if opt_o:
        from ntk_tt._optimizer import adamw, sgd

        b = o["batch_sizes"][0]
        template = (sgd(1.0, opt_o["momentum"], weight_decay=opt_o["weight_decay"],
                        batch_size=b) if opt_o["optimizer"] == "sgd" else
                    adamw(1.0, opt_o["b1"], opt_o["b2"], weight_decay=opt_o["weight_decay"],
                          batch_size=b))  # the peak and warmup are searched
        rng = opt_o["learning_rate_range"]
        grid = dict(optimizer=template, warmups=opt_o["warmups"], learning_rate_range=rng,
                    kappa_range=kappa if rng is None and opt_o["optimizer"] == "sgd" else None)
    s = suggest(apply_fn, params, x, y, target=o["target"], target_kind=o["target_kind"],
                steps=o["steps"], head=head if o["predictor"] != "linear" else None,
                predictor=o["predictor"], num_kappas=o["num_kappas"],
                refine_steps=o["refine_steps"], loss=o["loss"], key=key,
                num_paths=o["num_paths"], top=o["top"], progress=progress, **grid)
    n = int(x.shape[0])
    report = _plain({
        "config": o | opt_o, "task": info,
        "target": {"loss": s.target, "initial_loss": s.initial_loss, "kind": s.target_kind,
                   "value": s.target_value, "steps_max": s.steps_max},
        "found": s.found, "reason": s.reason,
        "suggestion": None if not s.found else {
            "learning_rate": s.learning_rate, "momentum": s.momentum,
            "batch_size": s.batch_size, "kappa": s.kappa, "steps": s.steps,
            "seconds": s.seconds, "refined": s.refined, "warmup": s.warmup,
            "outcome": s.outcome, "spike_step": s.spike_step,
            "optimizer": optimizer_hyperparameters(s.optimizer, o["steps"], n),
            "weight_travel": s.weight_travel},
        "grid_best": s.grid_best, "predictor": s.predictor, "lambda_max": s.lambda_max,
        "seconds_per_step": {("N" if b is None else str(b)): v
                             for b, v in s.seconds_per_step.items()},
        "runners_up": s.runners_up.to_dict("records"), "grid": s.grid.to_dict("records"),
        "refinement": s.refinement, "seconds": s.timings,
        "curve": None if s.loss is None else {"loss": s.loss},
        "grid_size": {"kappas": o["num_kappas"], "momenta": len(o["momenta"]),
                      "batch_sizes": len(o["batch_sizes"]),
                      "warmups": (len(set(s.grid[s.grid.source == "grid"].warmup))
                                  if opt_o else 1)},
    })
    return report
