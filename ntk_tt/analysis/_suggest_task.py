"""``suggest_task``: the job behind ``ntk-tt suggest`` (the task of ``ntk-tt predict``, its
report file and JSON-ready report) around :func:`ntk_tt.suggest`."""

from __future__ import annotations

from pathlib import Path

import jax

from ntk_tt._options import check_suggest_job
from ntk_tt.analysis._suggest import suggest


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
        kappa_max, num_kappas, refine_steps, num_paths, loss, predictor, top, kappa_eff_max
        (``suggest``'s cap on κ̃ = κ/(1 − m)); and the optimiser search
        (``ntk_tt._options_suggest.split_optimizer_options``): optimizer ("sgd" | "adamw" |
        None), weight_decay, momentum, b1, b2, warmups, lr_min, lr_max.

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
                num_paths=o["num_paths"], top=o["top"], progress=progress,
                kappa_eff_max=o["kappa_eff_max"], **grid)
    n = int(x.shape[0])
    report = _plain({
        "config": o | opt_o, "task": info,
        "target": {"loss": s.target, "initial_loss": s.initial_loss, "kind": s.target_kind,
                   "value": s.target_value, "steps_max": s.steps_max},
        "found": s.found, "reason": s.reason,
        "suggestion": None if not s.found else {
            "learning_rate": s.learning_rate, "momentum": s.momentum,
            "batch_size": s.batch_size, "kappa": s.kappa, "steps": s.steps,
            "kappa_eff": (None if s.optimizer.rule == "adam"
                          else s.kappa / (1.0 - s.momentum)),
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
