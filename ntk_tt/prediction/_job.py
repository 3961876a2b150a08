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

from ntk_tt._defaults import DEFAULTS
from ntk_tt.data._checkpoint import load_checkpoint, read_meta
from ntk_tt.data._data import load_dataset, prepare_images, sample_task
from ntk_tt.data._model import from_nnx, num_params
from ntk_tt.dynamics._losses import check_loss
from ntk_tt.dynamics._predict_kernel import MAX_STEPS, resolve_method
from ntk_tt.kernels._head_aware import split_head
from ntk_tt.models import HEAD_SCALE, replace_head
from ntk_tt.prediction._predict import KERNELS, predict
from ntk_tt.training._compare import compare, predicted_summary
from ntk_tt.training._finetune import finetune, step_time


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


def check_outputs(figure_path=None, json_path=None, overwrite: bool = False) -> None:
    """Fail fast on output paths, before any work: each must name a file (not a directory) in
    an existing folder where a file can be created, and the figure's extension must be one
    matplotlib writes (png, pdf, svg, ...). An existing file is refused unless ``overwrite``
    (then it must be writable): two runs in one folder never replace each other's outputs
    silently. Empty / None = no output.

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
        if target.exists() and not overwrite:
            raise ValueError(f"{what} path {str(path)!r} exists (an earlier run's output?) and "
                             "is not replaced; choose another path, or pass --overwrite "
                             "(overwrite=True) to replace it.")
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
    if not _is_int(steps) or steps < 1 or steps > MAX_STEPS:
        raise ValueError(f"steps (-T) must be an integer >= 1 and <= {MAX_STEPS:,} (optimiser "
                         f"updates), got {steps!r}.")
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
    full_batch = b is None or (_is_int(k) and _is_int(n) and b == k * n)
    _check_subset_options(o, m, full_batch)
    if method == "closed_form" and (o["loss"] != "mse" or not full_batch):
        raise ValueError(f"method 'closed_form' (--method closed_form) exists for loss 'mse' "
                         f"(--loss mse) with full-batch GD only, got loss {o['loss']!r} and "
                         f"batch_size (-B) {b!r}; use --loss mse without -B, or method 'ode' "
                         "(cross-entropy) or 'discrete' (SGD).")
    if o["kernel"] not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {o['kernel']!r}.")
    _check_predictor_options(o, method)
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


def _check_subset_options(o: dict[str, Any], momentum: float, full_batch: bool) -> None:
    """``subset`` (--subset N') and ``subset_method``: the subset predictor exists for the
    MSE loss of full-batch GD only (Prop. 2 on the predicted spectrum, App. D)."""
    from ntk_tt.prediction._subset import SUBSET_METHODS

    sub, how = o["subset"], o["subset_method"]
    if how not in SUBSET_METHODS:
        raise ValueError(f"subset_method (--subset-method) must be one of {SUBSET_METHODS}, "
                         f"got {how!r}.")
    if sub is None:
        if how != "power_law":
            raise ValueError(f"subset_method (--subset-method) {how!r} applies with subset "
                             "(--subset N') only; add --subset N' or drop --subset-method.")
        return
    k, n = o["num_classes"], o["per_class"]
    if not _is_int(sub) or sub < 1:
        raise ValueError(f"subset (--subset) must be an integer N' >= 1 (samples whose kernel "
                         f"is built), got {sub!r}.")
    if _is_int(k) and _is_int(n) and k >= 2 and n >= 1 and not (
            k <= sub < k * n and sub % k == 0):
        raise ValueError(f"subset (--subset) N' = {sub} must be a multiple of K = {k} classes "
                         f"with K <= N' < N = K·n = {k}·{n} = {k * n} (N'/K images per "
                         f"class); e.g. --subset {max(k, (k * n // 4) // k * k)}.")
    if o["loss"] != "mse":
        raise ValueError(f"subset (--subset) predicts the MSE loss of full-batch GD only "
                         f"(Prop. 2 on the predicted spectrum, App. D): pass --loss mse, got "
                         f"loss {o['loss']!r}.")
    if not full_batch:
        raise ValueError(f"subset (--subset) predicts full-batch GD only: drop -B (got "
                         f"batch_size {o['batch_size']!r}).")
    if momentum != 0.0:
        raise ValueError(f"subset (--subset) predicts plain GD: drop -m (got momentum "
                         f"{o['momentum']!r}).")
    if o["method"] not in ("auto", "closed_form"):
        raise ValueError(f"subset (--subset) uses the closed form on the predicted spectrum: "
                         f"drop --method (got {o['method']!r}) or use --method closed_form.")
    if o["kernel"] == "sketch":
        raise ValueError("subset (--subset) builds the exact logit-summed kernel of the "
                         "subset: drop --kernel sketch (exact and traced are the same here).")
    if o["predictor"] == "head_aware":
        raise ValueError("subset (--subset) is the frozen-kernel linear predictor: drop "
                         "--predictor head_aware (or use --predictor linear).")


def _preprocessing(image_shape: tuple[int, ...], input_shape: tuple[int, ...]) -> str:
    """What :func:`prepare_images` does to images of ``image_shape`` (H, W, C), in words."""
    (h, w, c), (h2, w2, c2) = image_shape, input_shape
    done = []
    if c != c2:
        done.append(f"grey → {'RGB' if c2 == 3 else f'{c2} channels'} (channel repeated)")
    if (h, w) != (h2, w2):
        done.append(f"resized from {h}×{w} to {h2}×{w2} px (bilinear, antialiased)")
    return "; ".join(done) or "none (images already match the model's input)"


def resolve_predictor(o: dict[str, Any]) -> str:
    """The predictor the job runs: ``predictor`` unless "auto", which is the head-aware model
    (the best measured, README) except with options only the frozen-kernel linear predictor
    has (``method`` other than auto/discrete, ``kernel="sketch"``, ``subset``)."""
    if o["predictor"] != "auto":
        return o["predictor"]
    if o.get("subset") is not None:
        return "linear"
    linear_only = resolve_method(o["method"]) != "discrete" or o["kernel"] == "sketch"
    return "linear" if linear_only else "head_aware"


def _check_predictor_options(o: dict[str, Any], method: str) -> None:
    from ntk_tt.kernels._head_aware import BACKBONES
    from ntk_tt.prediction._predict import PREDICTORS

    if o["predictor"] not in PREDICTORS:
        raise ValueError(f"predictor (--predictor) must be one of {PREDICTORS}, got "
                         f"{o['predictor']!r}.")
    if o["backbone"] not in BACKBONES:
        raise ValueError(f"backbone (--backbone) must be one of {BACKBONES}, got "
                         f"{o['backbone']!r}.")
    seg, steps = o["segments"], o["steps"]
    if not _is_int(seg) or seg < 1 or (_is_int(steps) and seg > steps):
        raise ValueError(f"segments (--segments) must be an integer in [1, steps], got "
                         f"{seg!r}.")
    if o["predictor"] == "head_aware" and (method != "discrete" or o["kernel"] == "sketch"):
        raise ValueError(f"the head-aware predictor (--predictor head_aware) uses the exact "
                         f"discrete recursion and the exact logit-summed kernel, got method "
                         f"{o['method']!r} and kernel {o['kernel']!r}; use --predictor linear "
                         "for other methods or a sketch.")
    if resolve_predictor(o) == "linear" and (seg != 1 or o["backbone"] != "isotropic"):
        raise ValueError("--segments and --backbone apply to the head-aware predictor only; "
                         "drop them or use --predictor head_aware.")


def load_task(*, checkpoint=None, dataset="flowers5", data_dir=None, split="train",
              num_classes=5, per_class=150, test_per_class=50, seed=0, resize=True,
              head_scale=HEAD_SCALE):
    """Checkpoint + sampled task → (apply_fn, params, x, y, x_test, y_test, info, head), with
    ``head = ntk_tt.split_head(model)`` for the head-aware predictor.

    Everything that needs no weights is checked first: the checkpoint's ``meta``, the
    dataset (present, prepared, readable, labels), K and n against it, and the images against
    the model's input shape; only then are the weights read. The model gets a fresh seeded
    C-output head (``fold_in(key(seed), 1)``, init scale ``head_scale``, see
    :func:`ntk_tt.replace_head`); the task uses ``fold_in(key(seed), 0)``; images are converted
    to the checkpoint's input shape and normalisation, and ``info["preprocessing"]`` says how
    (grey → RGB, resized from H×W). Raises ``ValueError`` (one line) on any bad input.
    """
    path, meta = read_meta(checkpoint)
    data = load_dataset(dataset, split=split, data_dir=data_dir)
    key = jax.random.key(seed)
    task = sample_task(data, num_classes=num_classes, per_class=per_class,
                       test_per_class=test_per_class, key=jax.random.fold_in(key, 0))
    shape = tuple(meta["input_shape"])
    prep = dict(mean=np.asarray(meta["mean"]), std=np.asarray(meta["std"]), resize=resize)
    x = prepare_images(task.x_train, shape, **prep)
    x_test = prepare_images(task.x_test, shape, **prep) if len(task.y_test) else None
    model, _ = load_checkpoint(path)
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


def _y_range(curves: list[tuple[np.ndarray, int | None]]) -> tuple[float, float]:
    """y-axis range of the curves up to their divergence (a diverged curve is then cut)."""
    kept = [np.asarray(c, float)[: len(c) if at is None else at + 1] for c, at in curves]
    kept = np.concatenate([c[np.isfinite(c)] for c in kept])
    alive = np.concatenate([np.asarray(c, float)[:at] for c, at in curves if at is not None]
                           + [np.asarray(c, float) for c, at in curves if at is None])
    alive = alive[np.isfinite(alive)]
    base = alive if alive.size else kept
    lo, hi = (float(base.min()), float(base.max())) if base.size else (0.0, 1.0)
    pad = 0.1 * (hi - lo) or 0.1 * abs(hi) or 0.1
    return min(lo, 0.0) - pad * (lo < 0), hi + 3 * pad


def figure(path: str | os.PathLike, prediction, run=None, title: str = "",
           overwrite: bool = True) -> Path:
    """Predicted loss / error curves with their band, and the real curves when given.

    A diverged curve is drawn up to its divergence and marked there (vertical line and
    text); the y-axis spans the curves before any divergence, so a blown-up value does not
    flatten the rest. The format follows the extension (png, pdf, svg, ...). Without
    ``overwrite`` an existing file is not replaced (``FileExistsError``).
    """
    from matplotlib.figure import Figure  # no pyplot: no global backend, nothing left open

    fig = Figure(figsize=(10, 4), constrained_layout=True)
    axes = fig.subplots(1, 2)
    steps = np.arange(len(prediction.loss))
    sides = [("predicted (NTK)", "prediction", prediction, "C0", "-")]
    if run is not None:
        sides.append(("real fine-tuning", "real run", run, "C3", "--"))
    for ax, name in zip(axes, ("loss", "error"), strict=True):
        band = getattr(prediction, f"{name}_band")
        if band is not None:
            ax.fill_between(steps, band[0], band[1], alpha=0.25, color="C0",
                            label="predicted 5–95 %")
        for label, who, side, color, ls in sides:
            curve, at = np.asarray(getattr(side, name), float), side.diverged_at
            end = len(curve) if at is None else at + 1
            ax.plot(steps[:end], curve[:end], color=color, ls=ls, label=label)
            if at is not None:
                ax.axvline(at, color=color, lw=1.2, ls="-.")
                ax.annotate(f"{who} diverged\nat step {at}", (at, 0.97),
                            xycoords=("data", "axes fraction"), ha="right", va="top",
                            fontsize=8, color=color, rotation=90)
        t = prediction.training_time[name][0.1]
        if math.isfinite(t):
            ax.axvline(t, color="C0", lw=0.8, ls=":", label="predicted T_0.1")
        if any(side.diverged_at is not None for *_, side, _, _ in sides):
            ax.set_ylim(*_y_range([(getattr(side, name), side.diverged_at)
                                   for *_, side, _, _ in sides]))
        ax.set(xlabel="optimiser step", ylabel=f"training {name} (full set)",
               xlim=(0, len(steps) - 1))
        ax.legend()
    fig.suptitle(title, fontsize=9)
    path = Path(path)
    with open(path, "wb" if overwrite else "xb") as f:
        fig.savefig(f, dpi=110, format=path.suffix.lstrip(".").lower())
    return path


def _write_json(path: Path, report: dict, *, create: bool) -> None:
    """Write the report atomically (a reader or an interrupt never sees half a file);
    ``create``: the file must not exist yet (``FileExistsError``: another run's output)."""
    if create:
        open(path, "x").close()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(report, indent=1))
    os.replace(tmp, path)


def _report(o, verify, info, body, pred, run, status) -> dict[str, Any]:
    report = _plain({"config": o | {"verify": verify}, "task": info, "status": status,
                     **body})
    report["curves"] = _plain({"predicted": {"loss": pred.loss, "error": pred.error},
                               "real": None if run is None else
                               {"loss": run.loss, "error": run.error}})
    return report


def predict_task(*, verify: bool = False, figure_path=None, json_path=None,
                 progress: bool = True, overwrite: bool = False, **options) -> dict[str, Any]:
    """The main job: predict T_ε for a real task (and, with ``verify``, fine-tune for real).

    Options (defaults in :data:`DEFAULTS`): checkpoint, dataset, data_dir, split, num_classes
    (K), per_class (n), test_per_class, steps (T), learning_rate, batch_size (None = GD),
    momentum, nesterov, loss, method, kernel, sketch_dim, num_paths, seed, resize, head_scale,
    predictor, backbone, segments, subset (N': predict the MSE GD loss from a subset's kernel,
    App. D; held-out curves are then not predicted), subset_method ("power_law" | "nystrom").

    Order: the options, output paths, checkpoint meta, dataset, task and images are checked
    (:func:`load_task`) before the weights are read and before any progress output; the
    prediction follows. With ``verify`` and ``json_path``, the JSON is written as soon as the
    prediction exists (``status`` "prediction done; real fine-tuning running") and rewritten
    when the fine-tuning ends ("complete"), is interrupted (``KeyboardInterrupt``:
    "interrupted during the real fine-tuning") or fails ("failed after the prediction
    (...)"); the exception is then re-raised.

    Returns:
      A JSON-ready report: ``config``, ``task`` (with ``preprocessing``: what was done to the
      images), ``status``, ``predicted`` (training_time, wall_clock, test_accuracy, kappa,
      ...), ``real`` (None without ``verify``), ``relative_error``, ``absolute_error``,
      ``curve_distance``, ``linearisation_gap``, ``seconds`` (predict, finetune, ratio,
      ...), ``diverged``, ``curves``. Writes ``figure_path`` (any matplotlib format) and
      ``json_path``.

    Raises:
      ValueError: one line for any bad input (unknown option, dataset, K, n, checkpoint,
        image shape, hyperparameters, num_paths < 1, output paths, an existing output without
        ``overwrite``, an output that cannot be written at the end); everything that needs
        no weights is checked before the checkpoint's weights are read.
    """
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown options {sorted(unknown)}; known: {sorted(DEFAULTS)}.")
    o = DEFAULTS | options
    if not (isinstance(o["num_paths"], (int, np.integer)) and o["num_paths"] >= 1):
        raise ValueError(f"num_paths must be an integer >= 1 (SGD noise paths), got "
                         f"{o['num_paths']!r}.")
    check_options(o)
    check_outputs(figure_path, json_path, overwrite)
    apply_fn, params, x, y, x_test, y_test, info, head = load_task(
        **{k: o[k] for k in ("checkpoint", "dataset", "data_dir", "split", "num_classes",
                             "per_class", "test_per_class", "seed", "resize", "head_scale")})
    hyper = {k: o[k] for k in ("learning_rate", "batch_size", "momentum", "nesterov", "loss")}
    key = jax.random.fold_in(jax.random.key(o["seed"]), 2)
    json_file = Path(json_path).expanduser() if json_path else None
    bar = tqdm(total=2, disable=not progress, unit="stage",
               bar_format="{desc}: {n}/{total} stages [{elapsed}]")
    try:
        bar.set_description("predicting (Jacobians, NTK, dynamics)")
        # the subset predictor gives the training loss only: no held-out prediction
        held_out = (None, None) if o["subset"] is not None else (x_test, y_test)
        pred = predict(apply_fn, params, x, y, steps=o["steps"], method=o["method"],
                       kernel=o["kernel"], sketch_dim=o["sketch_dim"],
                       num_paths=o["num_paths"], key=key, x_test=held_out[0],
                       y_test=held_out[1], predictor=resolve_predictor(o), head=head,
                       backbone=o["backbone"], segments=o["segments"], subset=o["subset"],
                       subset_method=o["subset_method"], **hyper)
        bar.update()
        run = None
        if verify:
            if json_file:
                # wall clock = T_ε × a real step's time, not measured yet: None until the end
                early = {"predicted": predicted_summary(pred, 1.0) | {"wall_clock": None},
                         "real": None,
                         "seconds": {"predict": pred.seconds["total"],
                                     "predict_stages": pred.seconds},
                         "diverged": {"predicted": pred.diverged, "real": None}}
                _output(_write_json, json_file, _report(
                    o, verify, info, early, pred, None,
                    "prediction done; real fine-tuning running"), create=not overwrite)
            bar.set_description(f"fine-tuning for real ({o['steps']} steps)")
            try:
                run = finetune(apply_fn, params, x, y, steps=o["steps"], key=key,
                               x_test=x_test, y_test=y_test, record_logits=True,
                               progress=progress, **hyper)
                body = compare(pred, run)
            except (KeyboardInterrupt, Exception) as err:
                if json_file:
                    status = ("interrupted during the real fine-tuning"
                              if isinstance(err, KeyboardInterrupt) else
                              f"failed after the prediction ({type(err).__name__}: {err})")
                    _output(_write_json, json_file, _report(o, verify, info, early, pred,
                                                            None, status), create=False)
                raise
        else:
            bar.set_description("timing a few real training steps")
            sps = step_time(apply_fn, params, x, y, key=key, **hyper)
            body = {
                "predicted": predicted_summary(pred, sps) | {"seconds_per_step": sps},
                "real": None, "relative_error": None, "absolute_error": None,
                "seconds": {"predict": pred.seconds["total"], "predict_stages": pred.seconds,
                            "finetune": None},
                "diverged": {"predicted": pred.diverged, "real": None},
            }
        bar.update()
    except BaseException:
        bar.leave = False  # clear the bar: the caller's message starts a clean line
        raise
    finally:
        bar.close()
    report = _report(o, verify, info, body, pred, run, "complete")
    if json_file:
        _output(_write_json, json_file, report, create=not (overwrite or verify))
    if figure_path:
        title = (f"{info['dataset']} K={o['num_classes']} n={o['per_class']} "
                 f"η={o['learning_rate']} B={o['batch_size'] or 'N'} m={o['momentum']}")
        _output(figure, Path(figure_path).expanduser(), pred, run, title, overwrite=overwrite)
    return report


def _output(write, path: Path, *args, **kwargs) -> None:
    """Run ``write(path, ...)``; an output that appeared meanwhile or cannot be written is a
    one-line ``ValueError`` (checked up front; this catches another run writing the same file
    during the work, and a folder removed or filled)."""
    try:
        write(path, *args, **kwargs)
    except FileExistsError:
        raise ValueError(f"{path} was created by another run while this one worked; it is not "
                         "replaced: rerun with another path, or with --overwrite "
                         "(overwrite=True).") from None
    except OSError as err:
        raise ValueError(f"could not write {err.filename or path!s}: "
                         f"{err.strerror or type(err).__name__}.") from None
