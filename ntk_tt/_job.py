"""The main job as a Python call: checkpoint + real task → predicted (and real) T_ε, figure, JSON.

``ntk-tt predict`` (:mod:`ntk_tt.cli`) is a thin shell over :func:`predict_task`.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from ntk_tt._checkpoint import load_checkpoint
from ntk_tt._compare import compare, predicted_summary
from ntk_tt._data import load_dataset, prepare_images, sample_task
from ntk_tt._finetune import finetune, step_time
from ntk_tt._model import from_nnx, num_params
from ntk_tt._predict import predict
from ntk_tt.models import HEAD_SCALE, replace_head

DEFAULTS = dict(checkpoint=None, dataset="flowers5", data_dir=None, split="train",
                num_classes=5, per_class=150, test_per_class=50, steps=150,
                learning_rate=0.002, batch_size=None, momentum=0.0, nesterov=False,
                loss="cross_entropy", method="auto", kernel="exact", sketch_dim=None,
                num_paths=32, seed=0, resize=True, head_scale=HEAD_SCALE)


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


def check_outputs(figure_path=None, json_path=None) -> None:
    """Fail fast on output paths, before any work: the folder must exist and be writable, the
    figure's extension one matplotlib writes (png, pdf, svg, ...). Empty / None = no output.

    Raises:
      ValueError: one line naming the path and the fix.
    """
    from matplotlib.backend_bases import FigureCanvasBase

    for what, path in (("figure", figure_path), ("json", json_path)):
        if not path:
            continue
        folder = Path(path).expanduser().resolve().parent
        if not folder.is_dir():
            raise ValueError(f"{what} path {str(path)!r}: folder {str(folder)!r} does not "
                             "exist; create it first or choose another path.")
        if not os.access(folder, os.W_OK):
            raise ValueError(f"{what} path {str(path)!r}: folder {str(folder)!r} is not "
                             "writable; choose another path.")
    if figure_path:
        formats = FigureCanvasBase.get_supported_filetypes()
        ext = Path(figure_path).suffix.lower().lstrip(".")
        if ext not in formats:
            raise ValueError(f"figure path {str(figure_path)!r} must end in a format matplotlib "
                             f"writes: {', '.join('.' + f for f in sorted(formats))}.")


def load_task(*, checkpoint=None, dataset="flowers5", data_dir=None, split="train",
              num_classes=5, per_class=150, test_per_class=50, seed=0, resize=True,
              head_scale=HEAD_SCALE):
    """Checkpoint + sampled task → (apply_fn, params, x, y, x_test, y_test, info).

    The model gets a fresh seeded C-output head (``fold_in(key(seed), 1)``, init scale
    ``head_scale``, see :func:`ntk_tt.replace_head`); the task uses
    ``fold_in(key(seed), 0)``; images are converted to the checkpoint's input shape and
    normalisation. Raises ``ValueError`` (one line) on any bad input.
    """
    model, meta = load_checkpoint(checkpoint)
    data = load_dataset(dataset, split=split, data_dir=data_dir)
    key = jax.random.key(seed)
    task = sample_task(data, num_classes=num_classes, per_class=per_class,
                       test_per_class=test_per_class, key=jax.random.fold_in(key, 0))
    shape = tuple(meta["input_shape"])
    prep = dict(mean=np.asarray(meta["mean"]), std=np.asarray(meta["std"]), resize=resize)
    x = prepare_images(task.x_train, shape, **prep)
    x_test = prepare_images(task.x_test, shape, **prep) if len(task.y_test) else None
    model = replace_head(model, num_classes, key=jax.random.fold_in(key, 1), scale=head_scale)
    apply_fn, params = from_nnx(model)
    info = {"checkpoint": str(checkpoint or "shipped"), "architecture": meta["architecture"],
            "num_params": num_params(params), "dataset": dataset, "classes": task.class_names,
            "n_train": len(task.y_train), "n_test": len(task.y_test),
            "test_per_class": len(task.y_test) // num_classes,
            "image_shape": list(np.shape(task.x_train)[1:])}
    y_test = task.y_test if x_test is not None else None
    return apply_fn, params, x, task.y_train, x_test, y_test, info


def figure(path: str | os.PathLike, prediction, run=None, title: str = "") -> Path:
    """PNG: predicted loss / error curves with their band, and the real curves when given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    steps = np.arange(len(prediction.loss))
    for ax, name in zip(axes, ("loss", "error"), strict=True):
        band = getattr(prediction, f"{name}_band")
        if band is not None:
            ax.fill_between(steps, band[0], band[1], alpha=0.25, color="C0",
                            label="predicted 5–95 %")
        ax.plot(steps, getattr(prediction, name), color="C0", label="predicted (NTK)")
        if run is not None:
            ax.plot(steps, getattr(run, name), color="C3", ls="--", label="real fine-tuning")
        t = prediction.training_time[name][0.1]
        if math.isfinite(t):
            ax.axvline(t, color="C0", lw=0.8, ls=":", label="predicted T_0.1")
        ax.set(xlabel="optimiser step", ylabel=f"training {name} (full set)")
        ax.legend()
    fig.suptitle(title, fontsize=9)
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def predict_task(*, verify: bool = False, figure_path=None, json_path=None,
                 progress: bool = True, **options) -> dict[str, Any]:
    """The main job: predict T_ε for a real task (and, with ``verify``, fine-tune for real).

    Options (defaults in :data:`DEFAULTS`): checkpoint, dataset, data_dir, split, num_classes
    (K), per_class (n), test_per_class, steps (T), learning_rate, batch_size (None = GD),
    momentum, nesterov, loss, method, kernel, sketch_dim, num_paths, seed, resize, head_scale.

    Returns:
      A JSON-ready report: ``config``, ``task``, ``predicted`` (training_time, wall_clock,
      test_accuracy, kappa, ...), ``real`` (None without ``verify``), ``relative_error``,
      ``absolute_error``, ``curve_distance``, ``linearisation_gap``, ``seconds`` (predict,
      finetune, ratio, ...), ``diverged``. Writes ``figure_path`` (PNG) and ``json_path``.

    Raises:
      ValueError: one line for any bad input (unknown option, dataset, K, n, checkpoint,
        image shape, hyperparameters, num_paths < 1, output paths); the options and output
        paths are checked before any work.
    """
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown options {sorted(unknown)}; known: {sorted(DEFAULTS)}.")
    o = DEFAULTS | options
    if not (isinstance(o["num_paths"], (int, np.integer)) and o["num_paths"] >= 1):
        raise ValueError(f"num_paths must be an integer >= 1 (SGD noise paths), got "
                         f"{o['num_paths']!r}.")
    check_outputs(figure_path, json_path)
    bar = tqdm(total=3 if verify else 2, disable=not progress, unit="stage",
               bar_format="{desc}: {n}/{total} stages [{elapsed}]")
    bar.set_description("loading checkpoint and task")
    apply_fn, params, x, y, x_test, y_test, info = load_task(
        **{k: o[k] for k in ("checkpoint", "dataset", "data_dir", "split", "num_classes",
                             "per_class", "test_per_class", "seed", "resize", "head_scale")})
    hyper = {k: o[k] for k in ("learning_rate", "batch_size", "momentum", "nesterov", "loss")}
    key = jax.random.fold_in(jax.random.key(o["seed"]), 2)
    bar.set_description("predicting (Jacobians, NTK, dynamics)")
    pred = predict(apply_fn, params, x, y, steps=o["steps"], method=o["method"],
                   kernel=o["kernel"], sketch_dim=o["sketch_dim"], num_paths=o["num_paths"],
                   key=key, x_test=x_test, y_test=y_test, **hyper)
    bar.update()
    run = None
    if verify:
        bar.set_description(f"fine-tuning for real ({o['steps']} steps)")
        run = finetune(apply_fn, params, x, y, steps=o["steps"], key=key, x_test=x_test,
                       y_test=y_test, record_logits=True, progress=progress, **hyper)
        bar.update()
        report = compare(pred, run)
    else:
        bar.set_description("timing a few real training steps")
        sps = step_time(apply_fn, params, x, y, key=key, **hyper)
        report = {
            "predicted": predicted_summary(pred, sps) | {"seconds_per_step": sps},
            "real": None, "relative_error": None, "absolute_error": None,
            "seconds": {"predict": pred.seconds["total"], "predict_stages": pred.seconds,
                        "finetune": None},
            "diverged": {"predicted": pred.diverged, "real": None},
        }
    bar.update()
    bar.close()
    report = _plain({"config": o | {"verify": verify}, "task": info, **report})
    report["curves"] = _plain({"predicted": {"loss": pred.loss, "error": pred.error},
                               "real": None if run is None else
                               {"loss": run.loss, "error": run.error}})
    if figure_path:
        title = (f"{info['dataset']} K={o['num_classes']} n={o['per_class']} "
                 f"η={o['learning_rate']} B={o['batch_size'] or 'N'} m={o['momentum']}")
        figure(figure_path, pred, run, title)
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=1))
    return report
