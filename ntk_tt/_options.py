"""Checks of the jobs' options that need no JAX: ``ntk-tt`` runs them before importing it.

:func:`check_predict_job` (:func:`ntk_tt.predict_task`, ``ntk-tt predict``) and
:func:`check_suggest_job` (:func:`ntk_tt.suggest_task`, ``ntk-tt suggest``) check every
option value that plain Python and numpy can check (types, ranges, comma lists, choices,
paths that must exist, output paths), so a bad value ends the CLI with one line at once,
before JAX is imported and before any data or weights are read. The jobs call the same
functions. The option names shared with the heavy modules (losses, methods, kernels,
predictors, subset methods, step limits) are defined here, once.
"""

from __future__ import annotations

import math
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ntk_tt._defaults import DEFAULTS, SUGGEST_DEFAULTS

LOSSES = ("cross_entropy", "mse")
METHODS = ("closed_form", "ode", "sde", "discrete", "auto")
KERNELS = ("exact", "traced", "sketch")
PREDICTORS = ("auto", "linear", "head_aware")
SUBSET_METHODS = ("power_law", "nystrom")
# the head-aware feature kernels (ntk_tt.kernels._head_aware imports them from here)
BACKBONES = ("isotropic", "kronecker", "exact")
TARGET_KINDS = ("absolute", "fraction")
MAX_STEPS = 1_000_000  # curves are (T + 1)-long arrays; int32 step counters inside jit
# suggest: a whole grid's predicted trajectories are held in memory at once
SUGGEST_MAX_STEPS = 10_000
# the short dataset names and their files (ntk_tt.data._data loads them): the vendored set in
# ntk_tt/assets/data, the others in ../shared/data (or $NTK_TT_DATA_DIR). Each is one fixed
# set, like an .npz path: the task sampler draws the training and held-out images from it,
# and --split (a TFDS split) does not apply to it
VENDORED_FILES = {"flowers5": "flowers5_32px_200pc.npz"}
SHARED_FILES = {
    "cifar10_source": "cifar10_train_source10k.npz",
    "cifar10_test": "cifar10_test_300pc.npz",
    "mnist_test": "mnist_test.npz",
    "notmnist": "notmnist_sample_test.npz",
    "flowers5_300pc": "flowers5_32px_300pc.npz",
}


def _describe(value: Any) -> str:
    """Type name, with the shape for numpy and jax arrays (never the contents)."""
    jax = sys.modules.get("jax")  # a jax array exists only once jax is imported
    is_array = isinstance(value, np.ndarray) or (jax is not None
                                                 and isinstance(value, jax.Array))
    return type(value).__name__ + (f" of shape {np.shape(value)}" if is_array else "")


def check_real(value: Any, name: str) -> None:
    """ValueError unless ``value`` is a real number (Python int/float, numpy or jax array of
    int/float dtype, or a tracer); strings such as ``"0.1"`` and booleans are refused."""
    dtype = getattr(value, "dtype", None)
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
            value, (bool, np.bool_)):
        return
    if dtype is not None and np.dtype(dtype).kind in "iuf":
        return
    raise ValueError(
        f"{name} must be a real number, got {_describe(value)}; pass e.g. {name}=0.1 (a float, "
        "not a string)."
    )


def check_loss(loss: str, num_classes: int | None = None) -> None:
    """Raise ``ValueError`` unless ``loss`` is one of :data:`LOSSES` and, when the number of
    logits C is given, C ≥ 2 for cross-entropy (a softmax over one logit is constant)."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}.")
    if loss == "cross_entropy" and num_classes is not None and num_classes < 2:
        raise ValueError(
            f"cross-entropy needs C >= 2 logits, the model returns C = {num_classes}: a "
            "softmax over one logit is constant (loss 0, nothing to predict); give the head "
            "one logit per class or use loss='mse'."
        )


def resolve_method(method) -> str:
    """"auto" is the exact discrete recursion: exact for the linearised model at any η (so it
    predicts divergence, which the ODE/SDE small-η limits cannot), and the cheapest at usual
    horizons — T steps cost T·(N·C)² against (N·C)³ for the closed form's eigendecomposition
    (N·C = 3750: 1.2 s against 74 s, README). Other methods are used when asked for."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}.")
    return "discrete" if method == "auto" else method


def _real_or_none(v) -> float | None:
    """``v`` as a float, or None when it is not a real number."""
    if isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _real_scalar(v, name) -> float:
    check_real(v, name)
    if np.ndim(v) != 0:
        raise ValueError(f"{name} must be a scalar, got shape {np.shape(v)}.")
    return float(v)


def _check_batch_sizes(batch_sizes, n: int) -> list[int | None]:
    if isinstance(batch_sizes, (str, bytes)) or not isinstance(batch_sizes, Sequence) \
            or not batch_sizes:
        raise ValueError(f"batch_sizes must be a non-empty list of None (full-batch GD) and "
                         f"integers in [1, N = {n}], got {batch_sizes!r}; e.g. "
                         "batch_sizes=(None, 50).")
    out = []
    for b in batch_sizes:
        if b is not None and (not _is_int(b) or not 1 <= b <= n):
            raise ValueError(f"batch_sizes entries must be None (full-batch GD) or integers in "
                             f"[1, N = {n}], got {b!r}.")
        b = None if b is None or b == n else int(b)
        if b in out:
            raise ValueError(f"batch_sizes {list(batch_sizes)!r} names a batch size twice "
                             f"(None and N = {n} are both full-batch GD); give each once.")
        out.append(b)
    return out


def _check_momenta(momenta) -> list[float]:
    if isinstance(momenta, (str, bytes)) or not isinstance(momenta, Sequence) or not momenta:
        raise ValueError(f"momenta must be a non-empty list of numbers in [0, 1), got "
                         f"{momenta!r}; e.g. momenta=(0.0, 0.9).")
    out = []
    for m in momenta:
        m = _real_scalar(m, "momenta entry")
        if not 0.0 <= m < 1.0:
            raise ValueError(f"momenta entries must be in [0, 1) (heavy ball; 0 = plain "
                             f"(S)GD), got {m!r}.")
        if m in out:
            raise ValueError(f"momenta {list(momenta)!r} names {m} twice; give each once.")
        out.append(m)
    return out


def _check_target(target, target_kind) -> float:
    if target_kind not in TARGET_KINDS:
        raise ValueError(f"target_kind must be one of {TARGET_KINDS}, got {target_kind!r}: "
                         "'absolute' = a mean training loss, 'fraction' = a fraction of the "
                         "initial loss L_0.")
    t = _real_scalar(target, "target")
    if target_kind == "fraction" and not 0.0 < t < 1.0:
        raise ValueError(f"target with target_kind='fraction' must be in (0, 1) (a fraction of "
                         f"the initial loss L_0), got {target!r}; e.g. target=0.5.")
    if target_kind == "absolute" and not (math.isfinite(t) and t > 0):
        raise ValueError(f"target (an absolute mean training loss) must be finite and > 0, got "
                         f"{target!r}; or pass target_kind='fraction' with a value in (0, 1).")
    return t


def _check_scalars(steps, kappa_range, num_kappas, refine_steps, temperature, num_paths,
                   top):
    if not _is_int(steps) or not 1 <= steps <= SUGGEST_MAX_STEPS:
        raise ValueError(f"steps (the budget T_max) must be an integer in [1, {SUGGEST_MAX_STEPS}] "
                         f"optimiser updates (a whole grid's predicted trajectories are held "
                         f"in memory at once), got {steps!r}.")
    if not (isinstance(kappa_range, Sequence) and len(kappa_range) == 2):
        raise ValueError(f"kappa_range must be (min, max) of κ = η·λ_max/N, got "
                         f"{kappa_range!r}; e.g. (0.05, 50).")
    lo, hi = (_real_scalar(k, "kappa_range entry") for k in kappa_range)
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi):
        raise ValueError(f"kappa_range must satisfy 0 < min <= max (finite), got "
                         f"{kappa_range!r}.")
    if not _is_int(num_kappas) or num_kappas < 1 or (num_kappas > 1 and lo == hi) or (
            num_kappas == 1 and lo != hi):
        raise ValueError(f"num_kappas must be an integer >= 1 (1 exactly when min == max of "
                         f"kappa_range, >= 2 otherwise), got {num_kappas!r} for kappa_range "
                         f"{kappa_range!r}.")
    if not _is_int(refine_steps) or refine_steps < 0:
        raise ValueError(f"refine_steps must be an integer >= 0 (0: no gradient refinement), "
                         f"got {refine_steps!r}.")
    tau = _real_scalar(temperature, "temperature")
    if not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"temperature must be finite and > 0 (relative to L_0 − target), got "
                         f"{temperature!r}.")
    if not _is_int(num_paths) or num_paths < 1:
        raise ValueError(f"num_paths must be an integer >= 1 (SGD batch orders averaged), got "
                         f"{num_paths!r}.")
    if not _is_int(top) or top < 0:
        raise ValueError(f"top must be an integer >= 0 (runner-up rows), got {top!r}.")
    return lo, hi, tau




# --- predict_task / ntk-tt predict ----------------------------------------------------------


OUTPUTS = frozenset({"figure", "json"})


def replaceable(overwrite) -> frozenset[str]:
    """The outputs ``overwrite`` lets a job replace: every one for True, none for False, or
    those named in a list / set of "figure" and "json" (``ntk-tt predict`` replaces its
    default figure without --overwrite: ``overwrite=("figure",)``).

    Raises:
      ValueError: anything else.
    """
    if isinstance(overwrite, (bool, np.bool_)):
        return OUTPUTS if overwrite else frozenset()
    names = frozenset(overwrite) if isinstance(overwrite, (list, tuple, set, frozenset)) else None
    if names is None or not names <= OUTPUTS:
        raise ValueError(f"overwrite must be True, False or a list of the outputs it may "
                         f"replace, {sorted(OUTPUTS)}, got {overwrite!r}.")
    return names


def check_outputs(figure_path=None, json_path=None, overwrite=False) -> None:
    """Fail fast on output paths, before any work: each must name a file (not a directory) in
    an existing folder where a file can be created, and the figure's extension must be one
    matplotlib writes (png, pdf, svg, ...). An existing file is refused unless ``overwrite``
    names it (:func:`replaceable`; then it must be writable): two runs in one folder never
    replace each other's outputs silently. Empty / None = no output.

    Raises:
      ValueError: one line naming the path and the fix.
    """
    from matplotlib.backend_bases import FigureCanvasBase

    replace = replaceable(overwrite)
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
        if target.exists() and what not in replace:
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


def check_options(o: dict[str, Any]) -> None:
    """Fail fast on the options of :func:`ntk_tt.predict_task`, before loading anything (and
    without JAX): K, n, seed, the dataset path, split and data_dir (:func:`_check_source`),
    the hyperparameters, the method / kernel / predictor / subset combinations, the
    checkpoint folder. K against the dataset's classes, n against its images and the images
    against the model need the data: :func:`ntk_tt.prediction._job.load_task` checks them.

    Each message names the option as in Python and, in parentheses, its ``ntk-tt predict``
    flag. N = K·n is known before loading, so the batch size is checked against it here.

    Raises:
      ValueError: one line naming the option, the value and the fix.
    """
    k, n = o["num_classes"], o["per_class"]
    if not _is_int(k) or k < 2:
        raise ValueError(f"num_classes (K) must be >= 2 (-K: an integer number of classes; a "
                         f"task needs at least two), got {k!r}.")
    if not _is_int(n) or n < 1:
        raise ValueError(f"per_class (n) must be >= 1 training image per class (-n: an "
                         f"integer), got {n!r}.")
    _check_source(o)
    steps = o["steps"]
    if not _is_int(steps) or steps < 1 or steps > MAX_STEPS:
        raise ValueError(f"steps (-T) must be an integer >= 1 and <= {MAX_STEPS:,} (optimiser "
                         f"updates), got {steps!r}.")
    lr = _real_or_none(o["learning_rate"])
    if lr is None or not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"learning_rate (--lr) must be a finite number > 0, got "
                         f"{o['learning_rate']!r}.")
    m = _real_or_none(o["momentum"])
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
    scale = _real_or_none(o["head_scale"])
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


def _check_source(o: dict[str, Any]) -> None:
    """``seed``, ``dataset``, ``split`` and ``data_dir`` as far as they can be checked without
    reading data: the seed an integer, a dataset path (a name ending in ``.npz`` or holding a
    ``/``) an existing file, the split a string and the default ``"train"`` unless the
    dataset is a TFDS name (:func:`_check_split`), a ``data_dir`` an existing folder."""
    seed = o["seed"]
    if not _is_int(seed) or not -2**63 <= seed < 2**63:
        raise ValueError(f"seed (--seed) must be an integer that fits in 64 bits "
                         f"(-2**63 <= seed < 2**63, as jax.random.key takes), got {seed!r}.")
    name = o["dataset"]
    if not isinstance(name, str):
        raise ValueError(f"dataset (--dataset) must be a string: a short name such as "
                         f"'flowers5', a prepared TFDS name or the path of an .npz file, got "
                         f"{type(name).__name__}; pass str(path) for a path.")
    if name.endswith(".npz") or "/" in name or os.sep in name:
        if not Path(name).expanduser().is_file():
            raise ValueError(f"dataset file not found: {name!r}; pass an existing path to an "
                             ".npz file with keys images, labels and class_names, or a short "
                             "name (ntk_tt.known_datasets(), e.g. 'flowers5').")
    _check_split(name, o["split"])
    data_dir = o["data_dir"]
    if data_dir is not None and not Path(data_dir).expanduser().is_dir():
        raise ValueError(f"data_dir (--data-dir) {str(data_dir)!r} is not a directory; pass "
                         "the TFDS data_dir holding prepared sets, or omit it "
                         "($TFDS_DATA_DIR or ~/tensorflow_datasets).")


def _check_split(name: str, split: Any) -> None:
    """``split`` (--split) selects a split of a prepared TFDS dataset only: a short name
    (:data:`VENDORED_FILES`, :data:`SHARED_FILES`) or an .npz path is one fixed file, which
    ``load_dataset`` reads whatever the split, so a split other than the default "train"
    would be silently ignored: refused."""
    default = DEFAULTS["split"]
    if not isinstance(split, str) or not split:
        raise ValueError(f"split (--split) must be the name of a TFDS split such as "
                         f"{default!r}, got {split!r}.")
    if split == default:
        return
    if name in VENDORED_FILES:
        what = f"the vendored file {VENDORED_FILES[name]}"
    elif name in SHARED_FILES:
        what = f"the file {SHARED_FILES[name]} of ../shared/data ($NTK_TT_DATA_DIR)"
    elif name.endswith(".npz") or "/" in name or os.sep in name:
        what = "an .npz file"
    else:
        return
    raise ValueError(f"split (--split) {split!r} does not apply to dataset {name!r}: it is "
                     f"{what}, one fixed set from which the n training and the held-out "
                     f"images per class are both drawn; drop --split (it selects a split of "
                     f"a prepared TFDS dataset only).")


def check_predict_job(options: dict[str, Any], figure_path=None, json_path=None,
                      overwrite=False) -> dict[str, Any]:
    """Every check of :func:`ntk_tt.predict_task` that reads no data: unknown options,
    ``num_paths``, :func:`check_options`, :func:`check_outputs`. Returns the options with
    their defaults (``DEFAULTS | options``).

    Raises:
      ValueError: one line naming the option, the value and the fix.
    """
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown options {sorted(unknown)}; known: {sorted(DEFAULTS)}.")
    o = DEFAULTS | options
    if not (_is_int(o["num_paths"]) and o["num_paths"] >= 1):
        raise ValueError(f"num_paths must be an integer >= 1 (SGD noise paths), got "
                         f"{o['num_paths']!r}.")
    check_options(o)
    check_outputs(figure_path, json_path, overwrite)
    return o


def _check_subset_options(o: dict[str, Any], momentum: float, full_batch: bool) -> None:
    """``subset`` (--subset N') and ``subset_method``: the subset predictor exists for the
    MSE loss of full-batch GD only (Prop. 2 on the predicted spectrum, App. D)."""
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



# --- suggest_task / ntk-tt suggest ----------------------------------------------------------


def parse_batch_sizes(text: str) -> tuple:
    """"N,50,100" → (None, 50, 100); "N" (or "gd") = full-batch GD.

    Raises:
      ValueError: an entry that is neither N nor an integer; an integer entry < 1 (the
        message names it: a batch size is a positive integer, N is full-batch GD).
    """
    out = []
    for tok in str(text).split(","):
        tok = tok.strip()
        if tok.lower() in ("n", "gd", "none"):
            out.append(None)
        elif re.fullmatch(r"[+-]?\d+", tok):
            if int(tok) < 1:
                raise ValueError(f"batch_sizes (-B/--batch-sizes) entries must be positive "
                                 f"integers (mini-batch sizes B >= 1) or N (full-batch GD), got "
                                 f"{tok} in {text!r}; e.g. N,50.")
            out.append(int(tok))
        else:
            raise ValueError(f"batch_sizes (-B/--batch-sizes) must be a comma-separated list of "
                             f"N (full-batch GD) and integers, e.g. N,50; got {text!r}.")
    return tuple(out)


def parse_floats(text: str, what: str) -> tuple:
    """"0,0.5,0.9" → (0.0, 0.5, 0.9).

    Raises:
      ValueError: an entry that is not a number.
    """
    try:
        return tuple(float(tok) for tok in str(text).split(","))
    except ValueError:
        raise ValueError(f"{what} must be a comma-separated list of numbers, e.g. 0,0.9; got "
                         f"{text!r}.") from None


def default_batch_sizes(n_train: int) -> tuple:
    """The default candidate batch sizes of :func:`ntk_tt.suggest_task` and ``ntk-tt
    suggest`` for N = K·n training images: ``SUGGEST_DEFAULTS["batch_sizes"]`` (None = GD,
    50) without the sizes >= N (a batch of N or more is full-batch GD, already a candidate).
    """
    return tuple(b for b in SUGGEST_DEFAULTS["batch_sizes"] if b is None or b < n_train)


def check_suggest_job(options: dict[str, Any], json_path=None,
                      overwrite: bool = False) -> dict[str, Any]:
    """Every check of :func:`ntk_tt.suggest_task` that reads no data: unknown options,
    :func:`check_task_options`, the ``json_path``. Returns the options with their defaults
    (``SUGGEST_DEFAULTS | options``), ``batch_sizes`` None or omitted replaced by
    :func:`default_batch_sizes` of N = K·n.

    Raises:
      ValueError: one line naming the option, the value and the fix.
    """
    unknown = set(options) - set(SUGGEST_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown options {sorted(unknown)}; known: "
                         f"{sorted(SUGGEST_DEFAULTS)}.")
    o = SUGGEST_DEFAULTS | options
    if options.get("batch_sizes") is None and _is_int(o["num_classes"]) and _is_int(
            o["per_class"]):
        o["batch_sizes"] = default_batch_sizes(o["num_classes"] * o["per_class"])
    check_task_options(o)
    check_outputs(None, json_path, overwrite)
    return o


def check_task_options(o: dict) -> None:
    """Fail fast on the options of :func:`ntk_tt.suggest_task`, before loading anything and
    without JAX (each message names the Python option and its ``ntk-tt suggest`` flag): K,
    n, seed, dataset path, split, data_dir, target, budget, grid, batch sizes (explicit ones
    as given), momenta, loss, predictor, head scale, checkpoint folder.

    Raises:
      ValueError: one line naming the option, the value and the fix.
    """
    k, n = o["num_classes"], o["per_class"]
    for name, flag, v in (("num_classes", "-K", k), ("per_class", "-n", n)):
        if not _is_int(v) or v < (2 if name == "num_classes" else 1):
            raise ValueError(f"{name} ({flag}) must be an integer >= "
                             f"{2 if name == 'num_classes' else 1}, got {v!r}.")
    _check_source(o)
    nn = k * n
    try:
        _check_target(o["target"], o["target_kind"])
        _check_scalars(o["steps"], (o["kappa_min"], o["kappa_max"]), o["num_kappas"],
                       o["refine_steps"], 0.05, o["num_paths"], o["top"])
        _check_batch_sizes(list(o["batch_sizes"]), nn)
        _check_momenta(list(o["momenta"]))
    except (ValueError, TypeError) as err:
        raise ValueError(_flagged(str(err), nn, k, n)) from None
    check_loss(o["loss"])
    if o["predictor"] not in ("auto", "head_aware", "linear"):
        raise ValueError(f"predictor (--predictor) must be auto, head_aware or linear, got "
                         f"{o['predictor']!r}.")
    scale = o["head_scale"]
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (
            math.isfinite(scale) and scale > 0):
        raise ValueError(f"head_scale (--head-scale) must be a finite number > 0, got "
                         f"{scale!r}.")
    if o["checkpoint"] is not None:
        ck = Path(o["checkpoint"]).expanduser()
        if not ck.is_dir():
            raise ValueError(f"checkpoint {str(ck)!r} is not a directory written by "
                             "ntk_tt.save_checkpoint (omit it for the shipped one).")


_FLAGS = (("target_kind must", "target_kind (--target-kind) must"),
          ("target with target_kind='fraction'", "target (--target) with --target-kind fraction"),
          ("target (an absolute mean training loss)",
           "target (--target, with --target-kind absolute: a mean training loss)"),
          ("steps (the budget T_max)", "steps (-T/--max-steps, the budget T_max)"),
          ("kappa_range must be (min, max)", "kappa_min, kappa_max (--kappa-min, --kappa-max)"),
          ("kappa_range must satisfy", "kappa_min, kappa_max (--kappa-min, --kappa-max) must "
           "satisfy"),
          ("num_kappas must", "num_kappas (--num-kappas) must"),
          ("refine_steps must", "refine_steps (--refine-steps) must"),
          ("num_paths must", "num_paths (--num-paths) must"),
          ("top must", "top (--top) must"),
          ("batch_sizes", "batch_sizes (-B/--batch-sizes)"),
          ("momenta", "momenta (-m/--momenta)"))


def _flagged(msg: str, nn: int, k: int, n: int) -> str:
    """A :func:`suggest` argument message with the ``ntk-tt suggest`` flag named."""
    for prefix, flagged in _FLAGS:
        if msg.startswith(prefix):
            msg = flagged + msg[len(prefix):]
            break
    for python, flag in (("kappa_range", "(--kappa-min, --kappa-max)"),
                         ("e.g. target=0.5", "e.g. --target 0.5"),
                         ("target_kind='fraction'", "--target-kind fraction"),
                         ("None (full-batch GD)", "N (full-batch GD)")):
        msg = msg.replace(python, flag)
    return msg.replace(f"N = {nn}]", f"N = K·n = {k}·{n} = {nn}]")


