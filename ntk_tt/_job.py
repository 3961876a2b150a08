"""The main job as a Python call: checkpoint + real task → predicted (and real) T_ε, figure, JSON.

``ntk-tt predict`` (:mod:`ntk_tt.cli`) is a thin shell over :func:`predict_task`.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from ntk_tt._checkpoint import load_checkpoint
from ntk_tt._compare import compare, predicted_summary
from ntk_tt._data import load_dataset, prepare_images, sample_task
from ntk_tt._finetune import finetune, step_time
from ntk_tt._losses import check_loss
from ntk_tt._model import from_nnx, num_params
from ntk_tt._predict import KERNELS, predict
from ntk_tt._predict_kernel import resolve_method
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
    """Fail fast on output paths, before any work: each must name a file (not a directory) in
    an existing folder where a file can be created, an existing file must be writable, and the
    figure's extension must be one matplotlib writes (png, pdf, svg, ...). Empty / None = no
    output.

    Raises:
      ValueError: one line naming the path and the fix.
    """
    from matplotlib.backend_bases import FigureCanvasBase

    given = [(what, path) for what, path in (("figure", figure_path), ("json", json_path))
             if path]
    for what, path in given:
        target = Path(path).expanduser()
        if target.is_dir():
            raise ValueError(f"{what} path {str(path)!r} is a directory; give a file name "
                             "inside it.")
        folder = target.resolve().parent
        if not folder.is_dir():
            raise ValueError(f"{what} path {str(path)!r}: folder {str(folder)!r} does not "
                             "exist; create it first or choose another path.")
        if target.exists() and not (target.is_file() and os.access(target, os.W_OK)):
            raise ValueError(f"{what} path {str(path)!r} exists and is not a writable file; "
                             "choose another path.")
        try:  # os.access alone says yes for root on read-only or virtual file systems
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as err:
            raise ValueError(f"{what} path {str(path)!r}: cannot create a file in folder "
                             f"{str(folder)!r} ({err.strerror or type(err).__name__}); "
                             "choose another path.") from None
    if len(given) == 2 and (Path(figure_path).expanduser().resolve()
                            == Path(json_path).expanduser().resolve()):
        raise ValueError(f"the figure and the json report would both be written to "
                         f"{str(figure_path)!r}; give them different paths.")
    if figure_path:
        formats = FigureCanvasBase.get_supported_filetypes()
        ext = Path(figure_path).suffix.lower().lstrip(".")
        if ext not in formats:
            raise ValueError(f"figure path {str(figure_path)!r} must end in a format matplotlib "
                             f"writes: {', '.join('.' + f for f in sorted(formats))}.")


def _real(v) -> float | None:
    """``v`` as a float, or None when it is not a real number."""
    if isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def check_options(o: dict[str, Any]) -> None:
    """Fail fast on the options of :func:`predict_task`, before loading anything.

    Each message names the option as in Python and, in parentheses, its ``ntk-tt predict``
    flag. N = K·n is known before loading, so the batch size is checked against it here.

    Raises:
      ValueError: one line naming the option, the value and the fix.
    """
    steps = o["steps"]
    if not _is_int(steps) or steps < 1:
        raise ValueError(f"steps (-T) must be an integer >= 1 (optimiser updates), got "
                         f"{steps!r}.")
    lr = _real(o["learning_rate"])
    if lr is None or not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"learning_rate (--lr) must be a finite number > 0, got "
                         f"{o['learning_rate']!r}.")
    m = _real(o["momentum"])
    if m is None or not 0.0 <= m < 1.0:
        raise ValueError(f"momentum (-m) must be in [0, 1), got {o['momentum']!r}; use 0 for "
                         "plain (S)GD.")
    if o["nesterov"] and m == 0.0:
        raise ValueError("Nesterov needs momentum > 0: nesterov (--nesterov) with momentum "
                         "(-m) 0 is plain (S)GD; pass e.g. -m 0.9 or drop --nesterov.")
    k, n, b = o["num_classes"], o["per_class"], o["batch_size"]
    if b is not None:
        if not _is_int(b) or b < 1:
            raise ValueError(f"batch_size (-B) must be an integer >= 1, got {b!r}; omit it "
                             "(None) for full-batch gradient descent.")
        if _is_int(k) and _is_int(n) and k >= 2 and n >= 1 and b > k * n:
            raise ValueError(f"batch_size (-B) = {b} is more than the N = K·n = {k}·{n} = "
                             f"{k * n} training images; choose B <= {k * n}, or omit it for "
                             "full-batch gradient descent.")
    scale = _real(o["head_scale"])
    if scale is None or not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"head_scale (--head-scale) must be a finite number > 0 (the fresh "
                         f"head's init scale × LeCun normal; 1 = flax's default), got "
                         f"{o['head_scale']!r}.")
    tpc = o["test_per_class"]
    if not _is_int(tpc) or tpc < 0:
        raise ValueError(f"test_per_class (--test-per-class) must be an integer >= 0 held-out "
                         f"images per class (0 for none), got {tpc!r}.")
    check_loss(o["loss"])
    method = resolve_method(o["method"])
    if o["kernel"] not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {o['kernel']!r}.")
    d = o["sketch_dim"]
    if d is not None:
        if not _is_int(d) or d < 1:
            raise ValueError(f"sketch_dim (--sketch-dim) must be an integer >= 1 (D'), got "
                             f"{d!r}.")
        if o["kernel"] != "sketch" and method != "sde":
            raise ValueError(f"sketch_dim (--sketch-dim) only applies to kernel 'sketch' "
                             f"(--kernel sketch) or method 'sde' (--method sde); got kernel "
                             f"{o['kernel']!r}, method {o['method']!r}: drop it or choose one "
                             "of those.")
    if o["checkpoint"] is not None:
        ck = Path(o["checkpoint"]).expanduser()
        if ck.exists() and not ck.is_dir():
            raise ValueError(f"checkpoint {str(ck)!r} is a file; pass the directory written "
                             "by ntk_tt.save_checkpoint (or omit it for the shipped one).")
        if not ck.exists():
            raise ValueError(f"checkpoint not found: {ck.absolute()} (pass the directory "
                             "written by ntk_tt.save_checkpoint, or omit it for the shipped "
                             "one).")


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
        image shape, hyperparameters, num_paths < 1, output paths, an output that cannot be
        written at the end); the options (:func:`check_options`) and output paths
        (:func:`check_outputs`) are checked before any work.
    """
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown options {sorted(unknown)}; known: {sorted(DEFAULTS)}.")
    o = DEFAULTS | options
    if not (isinstance(o["num_paths"], (int, np.integer)) and o["num_paths"] >= 1):
        raise ValueError(f"num_paths must be an integer >= 1 (SGD noise paths), got "
                         f"{o['num_paths']!r}.")
    check_options(o)
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
    try:  # checked up front; this catches a folder removed or filled during the work
        if json_path:
            Path(json_path).expanduser().write_text(json.dumps(report, indent=1))
        if figure_path:
            title = (f"{info['dataset']} K={o['num_classes']} n={o['per_class']} "
                     f"η={o['learning_rate']} B={o['batch_size'] or 'N'} m={o['momentum']}")
            figure(Path(figure_path).expanduser(), pred, run, title)
    except OSError as err:
        raise ValueError(f"could not write {err.filename or 'an output'!s}: "
                         f"{err.strerror or type(err).__name__}.") from None
    return report
