"""Checks of the jobs' options that need no JAX: ``ntk-tt`` runs them before importing it.

:func:`ntk_tt._options_predict.check_predict_job` (``ntk-tt predict``) and
:func:`check_suggest_job` (``ntk-tt suggest``) check every option value that plain Python and
numpy can check (types, ranges, comma lists, choices, paths that must exist, output paths), so
a bad value ends the CLI with one line before JAX is imported and any data or weights are read;
the jobs call the same functions. Here: the option names and limits shared with the heavy
modules, the scalar checks, the task source, ``suggest``'s argument checks and job."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ntk_tt._defaults import SUGGEST_DEFAULTS
from ntk_tt._options_source import check_tfds_options
from ntk_tt._output_paths import check_outputs, is_dataset_path, job_inputs

LOSSES = ("cross_entropy", "mse")
METHODS = ("closed_form", "ode", "sde", "discrete", "auto")
KERNELS = ("exact", "traced", "sketch")
PREDICTORS = ("auto", "linear", "head_aware")
SUBSET_METHODS = ("power_law", "nystrom")
# the head-aware feature kernels (ntk_tt.kernels._head_aware imports them from here)
BACKBONES = ("isotropic", "kronecker", "exact", "subspace", "diagonal")
TARGET_KINDS = ("absolute", "fraction")
MAX_STEPS = 1_000_000  # curves are (T + 1)-long arrays; int32 step counters inside jit
# suggest: a whole grid's predicted trajectories are held in memory at once
SUGGEST_MAX_STEPS = 10_000
# the jobs' grids: a fresh user's --num-paths 10⁶ took 17.5 GB for N = 10, T = 20 and
# --num-kappas 10⁵ asked for 322 GB; 4096 paths resolve the 5–95 % band to ~1 %, and 1024
# log-spaced κ over the widest range are < 2 % apart
MAX_PATHS, MAX_KAPPAS = 4096, 1024
HEAD_SCALES = (1e-6, 1e6)  # --head-scale: float32 weights overflow beyond, vanish below
# η, κ, weight decay, ε, loss targets: at most MAX (inf in float32); η, ε at least TINY (1e-50 is 0)
FLOAT32_MAX, FLOAT32_TINY = float(np.finfo(np.float32).max), float(np.finfo(np.float32).tiny)
# m, β₁, β₂: below 1 in float32 too, where predictions and fine-tunes run (a fresh user's
# -m 0.9999999999 is 1.0 there: NaN predictions, a crashed report, suggest's "m = 1")
DECAY_MAX = 1.0 - 2.0**-24  # float32's largest number below 1
DECAY_RANGE = f"[0, 1) and at most {DECAY_MAX:.8g} (float32's largest number below 1)"


def is_decay(value) -> bool:
    """Whether a concrete momentum or Adam decay rate (scalar or array) lies in
    ``DECAY_RANGE``: nearer 1 it is 1.0 in float32."""
    v = np.asarray(value, np.float64)
    return bool(np.all(np.isfinite(v)) and np.all((v >= 0) & (v <= DECAY_MAX)))


def _describe(value: Any) -> str:
    """Type name, with the shape for numpy and jax arrays (never the contents)."""
    jax = sys.modules.get("jax")  # a jax array exists only once jax is imported
    is_array = isinstance(value, np.ndarray) or (jax is not None
                                                 and isinstance(value, jax.Array))
    return type(value).__name__ + (f" of shape {np.shape(value)}" if is_array else "")


def a_type(value: Any) -> str:
    """``value``'s type with an article, for one-line messages ("a list", "an int", "None"):
    never its contents (a repr can be long, span lines or be cut mid-bracket)."""
    name = type(value).__name__
    return "None" if value is None else ("an " if name[0] in "aeiouAEIOU" else "a ") + name


def file_path(path: Any, what: str, example: str) -> Path:
    """``path`` (str or os.PathLike) as a Path with ``~`` expanded, for a save or load function.

    Raises:
      ValueError: ``path`` is anything else (its type named; an int or bool would be taken by
        ``open`` as an open file descriptor, read or written, and closed), with ``example``, a
        call that works.
    """
    if isinstance(path, (str, os.PathLike)):
        return Path(path).expanduser()
    raise ValueError(f"the {what} path must be a str or os.PathLike, got {a_type(path)} (an "
                     f"int would be taken for an open file descriptor); call e.g. {example}.")


def check_real(value: Any, name: str) -> None:
    """ValueError unless ``value`` is a real number (Python int/float, numpy or jax array of
    int/float dtype, or a tracer); strings such as ``"0.1"`` and booleans are refused."""
    dtype = getattr(value, "dtype", None)
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
            value, (bool, np.bool_)):
        return
    if dtype is not None and np.dtype(dtype).kind in "iuf":
        return
    raise ValueError(f"{name} must be a real number, got {_describe(value)}; pass e.g. "
                     f"{name}=0.1 (a float, not a string).")


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


def is_real(v) -> bool:
    """Whether ``v`` is one real number: an int or float (numpy scalars too), not a bool."""
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(
        v, (bool, np.bool_))


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
            shown = ", ".join("N" if v is None else str(v) for v in batch_sizes)
            why = f" (None, N and {n} all name full-batch GD here)" if b is None else ""
            raise ValueError(f"batch_sizes ({shown}) names a batch size twice{why}; give each "
                             "once.")
        out.append(b)
    return out


def _check_momenta(momenta) -> list[float]:
    if isinstance(momenta, (str, bytes)) or not isinstance(momenta, Sequence) or not momenta:
        raise ValueError(f"momenta must be a non-empty list of numbers in [0, 1), got "
                         f"{momenta!r}; e.g. momenta=(0.0, 0.9).")
    out = []
    for m in momenta:
        m = _real_scalar(m, "momenta entry")
        if not is_decay(m):
            raise ValueError(f"momenta entries must be in {DECAY_RANGE} (heavy ball; 0 = "
                             f"plain (S)GD), got {m!r}.")
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
    if target_kind == "absolute" and not 0 < t <= FLOAT32_MAX:
        raise ValueError(f"target (an absolute mean training loss) must be finite and > 0 (at "
                         f"most {FLOAT32_MAX:.8g}, float32's largest), got {target!r}; or pass "
                         "target_kind='fraction' with a value in (0, 1).")
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
    if not 0 < lo <= hi <= FLOAT32_MAX:
        raise ValueError(f"kappa_range must satisfy 0 < min <= max <= {FLOAT32_MAX:.8g} "
                         f"(float32's largest), got {kappa_range!r}.")
    if not _is_int(num_kappas) or not 1 <= num_kappas <= MAX_KAPPAS or (
            num_kappas > 1 and lo == hi) or (num_kappas == 1 and lo != hi):
        raise ValueError(f"num_kappas must be an integer in [1, {MAX_KAPPAS}] (1 exactly when "
                         f"min == max of kappa_range, >= 2 otherwise), got {num_kappas!r} for "
                         f"kappa_range {kappa_range!r}.")
    if not _is_int(refine_steps) or refine_steps < 0:
        raise ValueError(f"refine_steps must be an integer >= 0 (0: no gradient refinement), "
                         f"got {refine_steps!r}.")
    tau = _real_scalar(temperature, "temperature")
    if not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"temperature must be finite and > 0 (relative to L_0 − target), got "
                         f"{temperature!r}.")
    if not _is_int(num_paths) or not 1 <= num_paths <= MAX_PATHS:
        raise ValueError(f"num_paths must be an integer in [1, {MAX_PATHS}] (SGD batch orders "
                         f"averaged), got {num_paths!r}.")
    if not _is_int(top) or top < 0:
        raise ValueError(f"top must be an integer >= 0 (runner-up rows), got {top!r}.")
    return lo, hi, tau


def check_head_scale(scale: float | None, given: Any) -> None:
    """ValueError unless the fresh head's init scale ``scale`` (read from ``given``; None if
    none) is in ``HEAD_SCALES``: float32 weights overflow beyond, vanish below."""
    lo, hi = HEAD_SCALES
    if scale is None or not (math.isfinite(scale) and lo <= scale <= hi):
        raise ValueError(f"head_scale (--head-scale) must be a number in [{lo:g}, {hi:g}] (the "
                         f"fresh head's init scale × LeCun normal; 1 = flax's default), got "
                         f"{given!r}.")


# --- the task's source (both jobs) ---------------------------------------------------------


def _check_source(o: dict[str, Any]) -> None:
    """``seed``, ``dataset``, ``split`` and ``data_dir`` as far as they can be checked without
    reading data: the seed an integer, a dataset path (a name ending in ``.npz`` or holding a
    ``/``) an existing file, the split a string and the default ``"train"`` and no
    ``data_dir`` unless the dataset is a TFDS name (``_options_source.check_tfds_options``), a
    ``data_dir`` an existing folder."""
    seed = o["seed"]
    if not _is_int(seed) or not 0 <= seed < 2**32:  # key(2**32) = key(0), key(-1) = key(2**32-1)
        raise ValueError(f"seed (--seed) must be an integer in [0, 2**32) (jax.random.key keeps "
                         f"32 bits: 2**32 would draw seed 0's task), got {seed!r}.")
    name = o["dataset"]
    if not isinstance(name, str):
        raise ValueError(f"dataset (--dataset) must be a string: a short name such as "
                         f"'flowers5', a prepared TFDS name or the path of an .npz file, got "
                         f"{type(name).__name__}; pass str(path) for a path.")
    if is_dataset_path(name):
        if Path(name).expanduser().is_dir():
            raise ValueError(f"dataset {name!r} is a folder; pass the .npz file in it.")
        if not Path(name).expanduser().is_file():
            raise ValueError(f"dataset file not found: {name!r}; pass an existing path to an "
                             ".npz file with keys images, labels and class_names, or a short "
                             "name (ntk_tt.known_datasets(), e.g. 'flowers5').")
    data_dir = o["data_dir"]
    check_tfds_options(name, o["split"], data_dir)
    if data_dir is not None and not Path(data_dir).expanduser().is_dir():
        raise ValueError(f"data_dir (--data-dir) {str(data_dir)!r} is not a directory; pass "
                         "the TFDS data_dir holding prepared sets, or omit it "
                         "($TFDS_DATA_DIR or ~/tensorflow_datasets).")


# --- suggest_task / ntk-tt suggest ----------------------------------------------------------


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
    check_outputs(None, json_path, overwrite, inputs=job_inputs(o))
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
        from ntk_tt._options_suggest import check_kappa_eff_max  # (it imports this module)
        check_kappa_eff_max(o["kappa_eff_max"], None, cli=True)  # vs κ_min: split_optimizer_
    except (ValueError, TypeError) as err:
        raise ValueError(_flagged(str(err), nn, k, n)) from None
    check_loss(o["loss"])
    if o["predictor"] not in ("auto", "head_aware", "linear"):
        raise ValueError(f"predictor (--predictor) must be auto, head_aware or linear, got "
                         f"{o['predictor']!r}.")
    scale = o["head_scale"]
    check_head_scale(float(scale) if is_real(scale) else None, scale)
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
