"""Python inputs that are not arrays: convert the unambiguous ones, refuse the rest.

Every public entry point (``predict``, ``predict_from_kernel``, ``finetune``,
``empirical_ntk``) passes its array arguments, scalar hyperparameters and random key through
these helpers before any work (``save_checkpoint`` its path and meta's NumPy values). Error
messages name the argument, its type and shape, never its contents (a long list would flood
the terminal).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._frames import user_stacklevel
from ntk_tt._keys import check_key as check_key  # models.py (base) checks keys too
from ntk_tt._options import _describe, a_type
from ntk_tt._options import check_real as check_real  # importable without JAX

_NUMERIC = "biuf"  # numpy dtype kinds of bool, int, unsigned and float arrays


def as_array(value: Any, name: str) -> Any:
    """``value`` as an array: arrays (and tracers) unchanged, nested lists / tuples of numbers
    converted with ``np.asarray`` (ints stay ints: a list of labels becomes an int array).

    Raises:
      ValueError: a ragged list, a list or numpy array of non-numbers (strings, objects,
        dates), a string, a dict or another object; a complex array or list (kernels, losses
        and dynamics are real).
    """
    if isinstance(value, (np.ndarray, jax.Array)):
        _check_not_complex(value.dtype, name)
        if np.dtype(value.dtype).kind in "USOMm":  # strings, objects, dates (bfloat16: "V")
            raise ValueError(f"{name} must hold numbers, got an array of shape {value.shape} "
                             f"and numpy dtype {value.dtype}; pass a numeric array"
                             + (" of class indices 0 … C − 1." if name[0] == "y" else "."))
        return value
    if not isinstance(value, (list, tuple)):
        raise ValueError(
            f"{name} must be an array (numpy or jax), got {_describe(value)}; convert it with "
            "np.asarray."
        )
    try:
        arr = np.asarray(value)
    except ValueError:
        raise ValueError(
            f"{name} is a ragged {type(value).__name__} (rows of different lengths, "
            f"{len(value)} at the top level); pass a rectangular array."
        ) from None
    _check_not_complex(arr.dtype, name)
    if arr.dtype.kind not in _NUMERIC:
        raise ValueError(
            f"{name} must hold numbers, got a {type(value).__name__} of shape {arr.shape} "
            f"whose entries are not all numbers (numpy dtype {arr.dtype}); pass a numeric array."
        )
    return arr


def _check_not_complex(dtype, name: str) -> None:
    if np.dtype(dtype).kind == "c":
        raise ValueError(
            f"{name} is complex ({np.dtype(dtype)}), but ntk_tt's kernels, losses and dynamics "
            "are real-valued: pass a real array (complex inputs e.g. as their real and "
            "imaginary parts, concatenated along the feature axis)."
        )


def at_least_float32(tree: Any) -> Any:
    """``tree`` (params, inputs or a ``split_head`` tuple) with its bfloat16 / float16 array
    leaves cast to float32 (exactly: every such value is a float32); other leaves unchanged.
    ``predict`` builds Θ from the cast params and inputs, as Θ's eigenvalues and the
    recursion need more than 8 (11) mantissa bits (README, "Dtypes")."""
    def up(leaf):
        dtype = getattr(leaf, "dtype", None)
        if dtype is not None and jnp.issubdtype(dtype, jnp.floating) \
                and jnp.finfo(dtype).bits < 32:
            return jnp.asarray(leaf, jnp.float32)
        return leaf

    return jax.tree.map(up, tree)


def warn_raw_pixels(x) -> None:
    """UserWarning when the model inputs ``x`` are uint8: raw image pixels most likely, which
    make κ huge (a fresh user's raw pixels were "diverges at κ = 17,398"); it names the user's
    line (:func:`ntk_tt._frames.user_stacklevel`)."""
    if np.dtype(x.dtype) == np.uint8:
        warnings.warn("x is uint8, raw image pixels most likely: normalise them as in "
                      "pre-training first (ntk_tt.prepare_images(images, input_shape, mean=, "
                      "std=)); unnormalised inputs make κ huge.", UserWarning,
                      stacklevel=user_stacklevel())


def _concrete(value):
    """``value`` as a numpy array, or None when it is a tracer."""
    return None if isinstance(value, jax.core.Tracer) else np.asarray(value)


def _check_finite(kernel, name, computed: bool = False):
    """ValueError if a concrete ``kernel`` has NaN or inf entries; ``computed``: built here
    from the model and x (not given by the user), so the message points at them."""
    kc = _concrete(kernel)
    if kc is None or np.all(np.isfinite(kc)):
        return
    if computed:
        raise ValueError(
            f"the {name} computed from the model has NaN or inf entries: its Jacobians "
            f"overflow {kc.dtype} (e.g. inputs of order 1e30) or are not finite; check the "
            "scale of the inputs (normalise them, e.g. ntk_tt.prepare_images) and of the "
            "weights.")
    raise ValueError(f"{name} contains NaN or inf; recompute it (e.g. in float64 or with a "
                     "smaller block_size) before predicting.")


def check_normalisation(images, input_shape, mean, std) -> None:
    """The checks :func:`ntk_tt.prepare_images` adds to its own: ``input_shape`` (H', W', C'),
    images not one image of exactly that shape without a batch axis, pixels finite in
    [0, 255], ``mean`` finite and ``std`` finite > 0 in [0, 1] units (mean above 1 or std
    above 1: 0..255 units, which would leave near-constant inputs).

    Raises:
      ValueError: naming the argument and what to pass instead.
    """
    if len(tuple(input_shape)) != 3 or not all(
            isinstance(v, int | np.integer) and v >= 1 for v in tuple(input_shape)):
        raise ValueError(f"input_shape must be the model's (H, W, C), three integers >= 1, got "
                         f"{tuple(input_shape)}; e.g. (32, 32, 3) (the checkpoint's meta).")
    x = np.asarray(images)
    if x.shape == tuple(input_shape):  # (H, W, C) would be read as H grey W×C images
        h, w, c = x.shape
        raise ValueError(
            f"images have shape {x.shape} = input_shape: this looks like one image without a "
            f"batch axis (it would be read as {h} grey {w}×{c} images); prepare_images takes "
            f"a batch (N, H, W, C): pass images[None], of shape {(1, h, w, c)}.")
    if x.dtype.kind not in "uif" or (x.size and not (np.all(np.isfinite(x)) and x.min() >= 0
                                                     and x.max() <= 255)):
        raise ValueError("images must be finite pixel values in [0, 255] (uint8, or float in "
                         "the same units); got values outside it (or NaN / inf, or not "
                         "numbers).")
    check_statistics(mean, std)


def check_statistics(mean, std) -> None:
    """ValueError unless ``mean`` is finite and ``std`` finite > 0, both in [0, 1] units (what
    :func:`ntk_tt.prepare_images` and a checkpoint's meta need)."""
    for name, stat in (("mean", mean), ("std", std)):
        s = np.asarray(stat, np.float64)
        if not np.all(np.isfinite(s)) or (name == "std" and np.any(s <= 0)):
            raise ValueError(f"{name} must be finite{' and > 0' if name == 'std' else ''} per "
                             f"channel, got {np.ravel(s).tolist()}.")
        if np.any(np.abs(s) > 1):
            raise ValueError(f"{name} {np.ravel(s).tolist()} looks like 0..255 units; "
                             "prepare_images divides the pixels by 255 first, so pass the "
                             f"statistics in [0, 1] units ({name} / 255).")


def check_task_args(data, num_classes, per_class, test_per_class, key) -> None:
    """The argument types :func:`ntk_tt.sample_task` needs before its own checks: ``data`` a
    :class:`ntk_tt.Dataset` (images, labels, class_names) with one integer label in
    [0, len(class_names)) per image, the counts integers (K, n ≥ 1, test_per_class ≥ 0) and
    ``key`` a jax random key (not None).

    Raises:
      ValueError: naming the argument.
    """
    if not all(hasattr(data, a) for a in ("images", "labels", "class_names")):
        raise ValueError(f"data must be an ntk_tt.Dataset (ntk_tt.load_dataset(...)), got "
                         f"{_describe(data)}.")
    labels, k_all = np.asarray(data.labels), len(data.class_names)
    if len(data.images) != len(labels):
        raise ValueError(f"the dataset's images ({len(data.images)}) and labels ({len(labels)}) "
                         "differ in length; give one label per image.")
    if labels.dtype.kind not in "iu" or labels.ndim != 1:
        raise ValueError(f"the dataset's labels have dtype {labels.dtype} and shape "
                         f"{labels.shape}; expected integer class indices, shape (N,).")
    if len(labels) and (labels.min() < 0 or labels.max() >= k_all):
        raise ValueError(f"the dataset's labels must be integers in [0, K) with K = "
                         f"len(class_names) = {k_all}; got values from {labels.min()} to "
                         f"{labels.max()}.")
    for name, value, low in (("num_classes", num_classes, 2), ("per_class", per_class, 1),
                             ("test_per_class", test_per_class, 0)):
        # (K < 2 and n < 1 have sample_task's own messages)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or (
                name == "test_per_class" and value < low):
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}.")
    if key is None:
        raise ValueError("key must be a jax random key; pass key=jax.random.key(seed).")
    check_key(key)


def dataset_name(name: Any) -> tuple[str, bool]:
    """``(name, is_path)`` for :func:`ntk_tt.load_dataset`: a str as given (False), an
    os.PathLike as its str path (True: always a file, never a short or TFDS name).

    Raises:
      ValueError: ``name`` neither a str nor an os.PathLike of a str path.
    """
    if isinstance(name, str):
        return name, False
    path = os.fspath(name) if isinstance(name, os.PathLike) else None
    if not isinstance(path, str):
        raise ValueError(f"name must be a dataset name (str, e.g. 'flowers5') or the path of an "
                         f".npz file (str or os.PathLike, e.g. pathlib.Path('data.npz')), got "
                         f"{a_type(name)}{' of a bytes path' if path is not None else ''}.")
    return path, True


def check_npz_layout(path, images: np.ndarray, names: np.ndarray) -> tuple[str, ...]:
    """The ``class_names`` of an .npz dataset as a tuple of str, after checking that they are
    strings and that ``images`` are not channels-first (``_load_npz`` checks the rest).

    Raises:
      ValueError: integer class names (saying how to store them as strings); class names
        not a non-empty 1-D string array; bytes names that are not UTF-8; a name repeated, or
        empty / whitespace only; images of shape (N, C, H, W) with C in {1, 3, 4} (saying how
        to transpose them to (N, H, W, C)).
    """
    out = _npz_class_names(path, names)
    _check_channels_last(path, images)
    return out


def _npz_class_names(path, names: np.ndarray) -> tuple[str, ...]:
    """``class_names``: 1-D, non-empty, ``str`` or UTF-8 ``bytes`` (decoded), each name
    distinct and not blank."""
    if names.ndim == 1 and len(names) and names.dtype.kind in "iu":
        raise ValueError(f"class_names of {path} are integers ({names.dtype}, e.g. "
                         f"{names[0]}); store the K class names as strings, in label order "
                         "(class_names[i] names label i), e.g. np.array([str(c) for c in "
                         "class_names]), or the real names such as np.array(['cat', 'dog']).")
    if names.ndim != 1 or len(names) == 0 or names.dtype.kind not in "US":
        raise ValueError(f"class_names of {path} has shape {names.shape} and dtype {names.dtype}; "
                         "store the K class names as a 1-D string array, "
                         "np.array(names, dtype=str).")
    out = []
    for i, c in enumerate(names.tolist()):
        try:
            out.append(c.decode("utf-8") if isinstance(c, bytes) else str(c))
        except UnicodeDecodeError:
            raise ValueError(f"class_names of {path} are bytes, and class_names[{i}] is not "
                             "UTF-8; store the class names as UTF-8 strings, e.g. np.array("
                             "[b.decode('latin-1') for b in class_names]) (str, with the bytes' "
                             "own encoding), or the names encoded with .encode('utf-8')."
                             ) from None
        if not out[i].strip():
            raise ValueError(f"class_names of {path} has an empty or blank name, "
                             f"class_names[{i}] = {out[i]!r}; give every class a non-empty "
                             "name (it labels the class in reports).")
        if out[i] in out[:i]:
            raise ValueError(f"class_names of {path} repeat {out[i]!r} (class_names["
                             f"{out.index(out[i])}] and class_names[{i}]); give each class a "
                             "distinct name (labels index class_names: classes with one name "
                             "cannot be told apart), or merge their labels.")
    return tuple(out)


def _check_channels_last(path, images: np.ndarray) -> None:
    """Refuse images that look channels-first: (N, C, H, W) with C in {1, 3, 4} (grey, RGB,
    RGBA) and a last axis that cannot be a colour axis (not 1, 3 or 4), where (N, H, W, C) is
    expected. Channels-last images with C in {1, 3, 4} always pass, whatever H; H = W (square
    images) is only named in the message, not required."""
    shape = images.shape
    if images.ndim == 4 and shape[1] in (1, 3, 4) and shape[3] not in (1, 3, 4):
        fixed = (shape[0], shape[2], shape[3], shape[1])
        square = f", H = W = {shape[2]} (square)" if shape[2] == shape[3] else ""
        raise ValueError(f"images of {path} have shape {shape}, which looks channels-first "
                         f"(N, C, H, W) with C = {shape[1]}{square}; load_dataset expects "
                         f"channels-last (N, H, W, C): store images.transpose(0, 2, 3, 1) "
                         f"(shape {fixed}).")


def reason(err: BaseException) -> str:
    """The first sentence of an exception's message, whole (never cut mid-sentence)."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    sentence = text.split(". ")[0].rstrip(".")
    return f"{type(err).__name__}: {sentence}" if sentence else type(err).__name__


def json_number(value):
    """NumPy / JAX numbers and arrays in a meta as JSON numbers and lists; TypeError for
    anything else."""
    if isinstance(value, (np.ndarray, np.generic, jax.Array)):
        return np.asarray(value).tolist()
    raise TypeError(type(value).__name__)


_CHECKPOINT_ENTRIES = frozenset({"_CHECKPOINT_METADATA", "_METADATA", "commit_success.txt",
                                 "meta", "state"})


def check_save_path(path: str | os.PathLike, overwrite: bool = False) -> Path:
    """The checkpoint directory ``path`` (``~`` expanded, symbolic links resolved) if
    ``ntk_tt.save_checkpoint`` may write it: new (in an existing folder: none is created), an
    empty folder, or (``overwrite=True``) a checkpoint that ``save_checkpoint`` wrote, which
    is replaced whole (files added inside it included).

    Raises:
      ValueError: ``path`` not a str or os.PathLike, or a file; ``overwrite`` not a bool; its
        parent folder missing or a file (create it first); the current folder or one above it
        (orbax removes and recreates the folder); a folder holding anything but a checkpoint
        (saving would delete it); a checkpoint and ``overwrite`` False.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path must be the checkpoint folder's path (str or os.PathLike), got "
                         f"{a_type(path)}: call save_checkpoint(path, model, meta).")
    if not isinstance(overwrite, bool):
        raise ValueError(f"overwrite must be True or False, got {overwrite!r}.")
    path = Path(path).expanduser().resolve()
    if path.exists() and not path.is_dir():
        raise ValueError(f"checkpoint path {path} is a file; give a new or empty folder.")
    if not path.parent.is_dir():  # as the package's other save functions: none creates folders
        what = "is a file, not a folder" if path.parent.exists() else "does not exist"
        raise ValueError(f"checkpoint path {path}: folder {path.parent} {what}; create it "
                         "first or choose another path.")
    here = Path.cwd().resolve()
    if path == here or path in here.parents:
        raise ValueError(f"checkpoint path {path} is the current folder or holds it: saving "
                         "removes and recreates the folder; give a new folder inside it.")
    entries = sorted(e.name for e in path.iterdir()) if path.is_dir() else []
    if not entries:
        return path
    others = [e for e in entries if e not in _CHECKPOINT_ENTRIES]
    ours = (not others and "_CHECKPOINT_METADATA" in entries
            and all((path / d).is_dir() for d in ("meta", "state")))
    if not ours:
        shown = ", ".join((others or entries)[:3]) + (", ..." if len(others or entries) > 3
                                                      else "")
        raise ValueError(f"checkpoint path {path} is a folder holding other files ({shown}), "
                         "not a checkpoint that save_checkpoint wrote: a checkpoint replaces "
                         "its whole folder, so saving would delete them; give a new or empty "
                         "folder.")
    if not overwrite:
        raise ValueError(f"checkpoint path {path} already holds a checkpoint: pass "
                         "overwrite=True to replace it (the whole folder), or give a new one.")
    return path
