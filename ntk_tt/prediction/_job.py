"""The main job as a Python call: checkpoint + real task → predicted (and real) T_ε, figure, JSON.

``ntk-tt predict`` (:mod:`ntk_tt.cli`) is a thin shell over :func:`predict_task`.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from ntk_tt._defaults import DEFAULTS as DEFAULTS  # experiments import it from here
from ntk_tt._frames import PACKAGE_DIR
from ntk_tt._options_optimizer import constant_sgd, describe_optimizer  # no JAX
from ntk_tt._options_predict import check_predict_job, resolve_predictor  # no JAX
from ntk_tt._options_targets import job_targets  # no JAX
from ntk_tt._output_paths import replaceable  # no JAX
from ntk_tt.data._checkpoint import read_checked, restore
from ntk_tt.data._data import load_dataset, prepare_images, sample_task
from ntk_tt.data._model import from_nnx, num_params
from ntk_tt.dynamics._edge_warnings import BeyondEdgeWarning
from ntk_tt.kernels._head_aware import split_head
from ntk_tt.models import HEAD_SCALE, replace_head
from ntk_tt.prediction._compare import compare, predicted_summary
from ntk_tt.prediction._figure import figure
from ntk_tt.prediction._job_optimizer import job_optimizer
from ntk_tt.prediction._predict import predict
from ntk_tt.prediction._predict_checks import check_sketch_size
from ntk_tt.prediction._report_file import (
    COMPLETE,
    RUNNING,
    _output,
    _write_json,
    claimed_report,
)
from ntk_tt.training._finetune import finetune, step_time
from ntk_tt.training._optimizer_run import optimizer_hyperparameters

# the status of the report ``on_prediction`` gets without ``verify`` (never written: the
# JSON of a run without ``verify`` is written once, when the work is done)
TIMING = "prediction done; timing a few real training steps"


def _plain(obj: Any) -> Any:
    """JSON-ready copy: numpy → lists/floats, NaN → None, dict keys → str."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _plain(obj.tolist())
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def _preprocessing(image_shape: tuple[int, ...], input_shape: tuple[int, ...]) -> str:
    """What :func:`prepare_images` does to images of ``image_shape`` (H, W, C), in words."""
    (h, w, c), (h2, w2, c2) = image_shape, input_shape
    done = []
    if c != c2:
        done.append(f"grey → {'RGB' if c2 == 3 else f'{c2} channels'} (channel repeated)")
    if (h, w) != (h2, w2):
        done.append(f"resized from {h}×{w} to {h2}×{w2} px (bilinear, antialiased)")
    return "; ".join(done) or "none (images already match the model's input)"


def load_task(*, checkpoint=None, dataset="flowers5", data_dir=None, split="train",
              num_classes=5, per_class=150, test_per_class=50, seed=0, resize=True,
              head_scale=HEAD_SCALE, need_test=False):
    """Checkpoint + sampled task → (apply_fn, params, x, y, x_test, y_test, info, head), with
    ``head = ntk_tt.split_head(model)`` for the head-aware predictor.

    Everything that needs no weights is checked first: the checkpoint's ``meta``, the
    dataset (present, prepared, readable, labels), K and n against it, and the images against
    the model's input shape; only then are the weights read. The model gets a fresh seeded
    C-output head (``fold_in(key(seed), 1)``, init scale ``head_scale``, see
    :func:`ntk_tt.replace_head`); the task uses ``fold_in(key(seed), 0)``; images are converted
    to the checkpoint's input shape and normalisation, and ``info["preprocessing"]`` says how
    (grey → RGB, resized from H×W). Raises ``ValueError`` (one line) on any bad input, and
    (``need_test``: held-out accuracy targets) when no held-out images are left after n.
    """
    checked = read_checked(checkpoint)  # meta checked, no weight read yet
    meta = checked[1]
    data = load_dataset(dataset, split=split, data_dir=data_dir)
    key = jax.random.key(seed)
    with warnings.catch_warnings():  # fewer held-out images: the report has its own note
        warnings.filterwarnings("ignore", "sample_task: ", UserWarning)
        task = sample_task(data, num_classes=num_classes, per_class=per_class,
                           test_per_class=test_per_class, key=jax.random.fold_in(key, 0))
    if need_test and not len(task.y_test):
        raise ValueError(f"--accuracy-target needs held-out images, but n = {per_class} "
                         f"(-n) training images per class leave none in {dataset!r} for the "
                         f"{num_classes} classes drawn: lower -n, or use --loss-target / "
                         "--error-target (training curves).")
    shape = tuple(meta["input_shape"])
    prep = dict(mean=np.asarray(meta["mean"]), std=np.asarray(meta["std"]), resize=resize)
    x = prepare_images(task.x_train, shape, **prep)
    x_test = prepare_images(task.x_test, shape, **prep) if len(task.y_test) else None
    model, _ = restore(checked)  # the same checks are not made twice
    model = replace_head(model, num_classes, key=jax.random.fold_in(key, 1), scale=head_scale)
    apply_fn, params = from_nnx(model)
    head = split_head(model)
    image_shape = tuple(np.shape(task.x_train)[1:])
    info = {"checkpoint": str(checkpoint or "shipped"), "architecture": meta["architecture"],
            "num_params": num_params(params), "dataset": dataset, "classes": task.class_names,
            "n_train": len(task.y_train), "n_test": len(task.y_test),
            "test_per_class": len(task.y_test) // num_classes,
            "image_shape": list(image_shape), "model_input_shape": list(shape),
            "preprocessing": _preprocessing(image_shape, shape)}
    y_test = task.y_test if x_test is not None else None
    return apply_fn, params, x, task.y_train, x_test, y_test, info, head


def _report(o, verify, info, body, pred, run, status) -> dict[str, Any]:
    report = _plain({"config": o | {"verify": verify}, "task": info, "status": status,
                     **body})
    report["curves"] = _plain({"predicted": {"loss": pred.loss, "error": pred.error},
                               "real": None if run is None else
                               {"loss": run.loss, "error": run.error}})
    return report


PACKAGE = Path(PACKAGE_DIR).resolve()


def reported(w: warnings.WarningMessage) -> bool:
    """Whether a warning of ``predict`` goes into the report's ``predicted.warnings`` (and is a
    "warning:" line of ``ntk-tt predict``): a :class:`BeyondEdgeWarning`, or any other
    ``UserWarning`` raised inside the package (e.g. a subset with under 4 samples per class)."""
    return issubclass(w.category, BeyondEdgeWarning) or (
        issubclass(w.category, UserWarning) and Path(w.filename).resolve().is_relative_to(
            PACKAGE))


def predict_task(*, verify: bool = False, figure_path=None, json_path=None,
                 progress: bool = True, overwrite=False, on_prediction=None,
                 **options) -> dict[str, Any]:
    """The main job: predict T_ε for a real task (and, with ``verify``, fine-tune for real).

    Options (defaults in :data:`DEFAULTS`): checkpoint, dataset, data_dir, split, num_classes
    (K), per_class (n), test_per_class, steps (T), learning_rate (the schedule's peak),
    batch_size (None = GD), momentum, nesterov, the optimiser (optimizer "sgd" | "adam" |
    "adamw", schedule, warmup, decay_start, decay_end, end_lr, decay_rate, weight_decay, l2,
    b1, b2, adam_eps: :mod:`ntk_tt._options_optimizer`; predicted with ``predict(optimizer=,
    method=)``, any method for SGD, the discrete recursion for Adam, and, with ``verify``,
    fine-tuned with ``finetune(optimizer=)`` of the same :class:`ntk_tt.Optimizer`, except
    constant-η SGD without decay, which goes through the constant-η keywords, the same rule),
    loss, method, kernel, sketch_dim, num_paths, seed, resize, head_scale, predictor,
    backbone, subspace_dim, segments, subset (N': predict the MSE loss of full-batch SGD without
    weight decay, any schedule and momentum, from a subset's kernel, App. D; held-out curves
    are then not predicted), subset_method ("power_law" | "nystrom"),
    loss_targets (L*), error_targets (training error e*), accuracy_targets (held-out accuracy
    A: the held-out error ≤ 1 − A): absolute targets, whose steps the report gives as
    ``steps_to_target`` {curve: {target: steps}} ("loss", "error", "test_error").

    Order: the options and output paths are checked, ``json_path`` is claimed (written with
    ``status`` :data:`STARTED`, unless ``overwrite`` lets it be replaced: a second run with
    the same path refuses before its work), then the checkpoint meta, dataset, task and
    images are checked (:func:`load_task`) before the weights are read and before any
    progress output; the prediction follows (then ``on_prediction``). With ``verify`` and
    ``json_path``, the JSON is rewritten as soon as the prediction exists (:data:`RUNNING`)
    and when the fine-tuning ends (:data:`COMPLETE`), is interrupted (``KeyboardInterrupt``:
    :data:`INTERRUPTED`) or fails ("failed after the prediction (...)"); the exception is
    then re-raised. A claimed JSON that holds no result is removed when the job ends early
    (bad input, interruption, error). An explicit figure that another run created while this
    one worked is not replaced: this run's figure is kept beside it as ``name.1.png`` (``.2``,
    ...), and ``report["figure"]`` says where.

    Source: none (the ``ntk-tt predict`` job around :func:`ntk_tt.predict`; README "The main job").

    Args:
      verify: also fine-tune for real and compare. progress: progress bars on stderr.
      figure_path, json_path: the figure (any matplotlib format) and the JSON report, or None.
      overwrite: True replaces existing outputs, False refuses them (before any work); or a
        list naming those that may be replaced, e.g. ``("figure",)``
        (:func:`ntk_tt._output_paths.replaceable`).
      on_prediction: None, or a callable given the report of the prediction alone as soon
        as the prediction exists, before the real fine-tuning (``verify``) or the timing of
        a few real steps: with ``verify`` the report the JSON holds meanwhile (status
        :data:`RUNNING`), without it the same with status :data:`TIMING`; ``real`` None,
        ``predicted.wall_clock`` and ``predicted.target_wall_clock`` None (no real step's
        time yet). ``ntk-tt predict`` formats it there, to print the prediction if the rest
        is interrupted (:func:`ntk_tt.cli.main`). It should be quick; an exception it
        raises ends the job as one of the work would.

    Returns:
      A JSON-ready report: ``config``, ``task`` (with ``preprocessing``: what was done to the
      images), ``optimizer`` (the optimiser's description,
      :func:`ntk_tt.training._optimizer_run.optimizer_hyperparameters`; with Adam also
      ``weight_travel``, ρ = Σ η_t / rms(θ_0) of the backbone), ``status``,
      ``figure`` (the path written, None without one or when it could not be written:
      then ``figure_error`` says why, and the rest of the report and the JSON are whole),
      ``predicted`` (training_time, wall_clock, kappa, warnings: the warnings ``predict``
      raised that :func:`reported` keeps, re-raised after it, ...), ``real`` (None without
      ``verify``), ``relative_error``, ``absolute_error``, ``target_error`` (steps to the
      absolute targets, predicted vs real: ``predict``'s ``steps_to_target``; None without
      ``verify``), ``curve_distance``, ``linearisation_gap``, ``seconds`` (predict,
      finetune, ratio, ...), ``diverged``, ``curves``; ``figure_path`` and ``json_path`` written.

    Raises:
      ValueError: one line for any bad input (unknown option, dataset, a split other than
        "train" for a short name or .npz file (one fixed set each), K, n, seed,
        checkpoint, data_dir, image shape, hyperparameters, the optimiser options (a value,
        a flag the optimiser or schedule does not have, a method / subset / segments /
        predictor its predictor does not have), num_paths < 1, output paths, an
        existing output without ``overwrite``, an output that cannot be written at the end);
        the option values (:func:`ntk_tt._options_predict.check_predict_job`, no JAX needed, which
        ``ntk-tt predict`` runs before importing JAX) and then everything else that needs no
        weights are checked before the checkpoint's weights are read.
    """
    o = check_predict_job(options, figure_path, json_path, overwrite)
    replace = replaceable(overwrite)
    json_file = Path(json_path).expanduser() if json_path else None
    with claimed_report(json_file, "json" not in replace, o | {"verify": verify}):
        report, pred, run, info = _work(o, verify, json_file, progress, on_prediction)
        report["figure"] = None
        try:  # a figure that cannot be written (a full disk) loses none of the results
            report["figure"] = str(_output(
                _keep_figure, Path(figure_path).expanduser(), "figure" in replace, pred, run,
                f"{info['dataset']} K={o['num_classes']} n={o['per_class']} "
                + describe_optimizer(report["optimizer"], short=True))) if figure_path else None
        except ValueError as err:
            report["figure_error"] = str(err)
        if json_file:
            _output(_write_json, json_file, report, create=False)
    return report


def _work(o, verify, json_file, progress, on_prediction=None):
    """The task, the prediction and (``verify``) the real fine-tuning of
    :func:`predict_task`: (report, prediction, run, task info)."""
    apply_fn, params, x, y, x_test, y_test, info, head = load_task(
        **{k: o[k] for k in ("checkpoint", "dataset", "data_dir", "split", "num_classes",
                             "per_class", "test_per_class", "seed", "resize", "head_scale")},
        need_test=bool(o["accuracy_targets"]))
    if resolve_predictor(o) == "linear":  # before any kernel (the CLI words it in flags)
        check_sketch_size(o["kernel"], o["sketch_dim"], params)
    opt = job_optimizer(o)  # predicted and fine-tuned with: the same object
    described = {"optimizer": optimizer_hyperparameters(opt, o["steps"], len(y))}
    # constant-η SGD without decay: the constant-η keywords, the same rule as ``opt``, which
    # every method and segments know (and the numbers of the job before optimizers); subset's
    # keywords are GD's closed form, so with momentum or "discrete" it takes ``opt`` (each
    # eigenmode's recursion; for GD the same curve)
    keywords = constant_sgd(o) and (o["subset"] is None or (
        float(o["momentum"]) == 0 and o["method"] != "discrete"))
    hyper = ({k: o[k] for k in ("learning_rate", "batch_size", "momentum", "nesterov", "loss")}
             if keywords else {"optimizer": opt, "loss": o["loss"]})
    key = jax.random.fold_in(jax.random.key(o["seed"]), 2)
    bar = tqdm(total=2, disable=not progress, unit="stage",
               bar_format="{desc}: {n}/{total} stages [{elapsed}]")
    try:
        bar.set_description("predicting (Jacobians, NTK, dynamics)")
        # the subset predictor gives the training loss only: no held-out prediction
        held_out = (None, None) if o["subset"] is not None else (x_test, y_test)
        targets = job_targets(o)
        with warnings.catch_warnings(record=True) as caught:  # the report keeps them too
            warnings.simplefilter("always", BeyondEdgeWarning)
            pred = predict(apply_fn, params, x, y, steps=o["steps"], method=o["method"],
                           kernel=o["kernel"], sketch_dim=o["sketch_dim"],
                           num_paths=o["num_paths"], key=key, x_test=held_out[0],
                           y_test=held_out[1], predictor=resolve_predictor(o), head=head,
                           backbone=o["backbone"], subspace_dim=o["subspace_dim"],
                           segments=o["segments"],
                           subset=o["subset"], subset_method=o["subset_method"],
                           targets=targets, **hyper)
        for w in caught:  # the caller's filters decide (ntk-tt ignores BeyondEdgeWarning)
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
        noted = [str(w.message) for w in caught if reported(w)]
        if "weight_travel" in pred.hyperparameters:  # Adam's ρ beside the rule it belongs to
            described["optimizer"]["weight_travel"] = float(pred.hyperparameters["weight_travel"])
        bar.update()
        run = None
        if verify or on_prediction:  # the prediction's report, before any real step
            # wall clock = T_ε × a real step's time, not measured yet: None until the end
            early = {"predicted": predicted_summary(pred, 1.0) | {
                         "wall_clock": None, "target_wall_clock": None, "warnings": noted},
                     "real": None,
                     "seconds": {"predict": pred.seconds["total"],
                                 "predict_stages": pred.seconds},
                     "diverged": {"predicted": pred.diverged, "real": None}}
            early = _report(o, verify, info, early | described, pred, None,
                            RUNNING if verify else TIMING)
            if verify and json_file:
                _output(_write_json, json_file, early, create=False)
            if on_prediction:
                on_prediction(early)
        if verify:
            bar.set_description(f"fine-tuning for real ({o['steps']} steps)")
            run = finetune(apply_fn, params, x, y, steps=o["steps"], key=key, x_test=x_test,
                           y_test=y_test, record_logits=True, progress=progress,
                           record_test_curves="test_error" in targets, **hyper)
            body = compare(pred, run)
        else:
            bar.set_description("timing a few real training steps")
            sps = step_time(apply_fn, params, x, y, key=key, **hyper)
            body = {
                "predicted": predicted_summary(pred, sps) | {"seconds_per_step": sps},
                "real": None, "relative_error": None, "absolute_error": None,
                "target_error": None,
                "seconds": {"predict": pred.seconds["total"], "predict_stages": pred.seconds,
                            "finetune": None},
                "diverged": {"predicted": pred.diverged, "real": None},
            }
        body["predicted"]["warnings"] = noted  # the prediction's warnings (reported)
        bar.update()
    except BaseException:
        bar.leave = False  # clear the bar: the caller's message starts a clean line
        raise
    finally:
        bar.close()
    return _report(o, verify, info, body | described, pred, run, COMPLETE), pred, run, info


def _keep_figure(path: Path, replace: bool, pred, run, title: str) -> Path:
    """Write the figure at ``path``; one that another run created meanwhile (and ``replace``
    does not allow replacing) is kept, and this one goes beside it as ``name.1.ext`` (the
    first free of .1, .2, ...). Returns the path written."""
    target, k = path, 0
    while True:
        try:
            return figure(target, pred, run, title, overwrite=replace)
        except FileExistsError:
            k += 1
            target = path.with_name(f"{path.stem}.{k}{path.suffix}")
