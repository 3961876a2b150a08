"""Real image data: a loader by name, the K-class × n-per-class task sampler, preprocessing.

Datasets are numpy arrays (images uint8 (N, H, W, C), integer labels (N,)) from three places:

* vendored in the package (``ntk_tt/assets/data``, see its README): the default target set;
* the offline real image sets of ``../shared/data`` (or ``$NTK_TT_DATA_DIR``), by short name;
* any tensorflow-datasets name (e.g. ``cifar10``) already *prepared* in a TFDS ``data_dir``
  (array_record format). TFDS cannot download here, so the prepared folder is looked for first
  and a missing one is reported at once (calling into TFDS would hang on DNS for minutes).

Tasks follow the paper's protocol (Sec. 5, App. B): K random classes × n images per class
plus a held-out split from the remaining images of the same classes.
"""

from __future__ import annotations

import os
import warnings
import zipfile
import zlib
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._options_source import SHARED_FILES, VENDORED_FILES
from ntk_tt._output_paths import is_dataset_path
from ntk_tt.data._inputs import check_normalisation, check_npz_layout, check_task_args, dataset_name
from ntk_tt.data._npz_checks import _check_images, _check_labels

ASSETS = Path(__file__).resolve().parents[1] / "assets"
VENDORED = {name: ASSETS / "data" / file for name, file in VENDORED_FILES.items()}
SHARED = SHARED_FILES  # short name → file name in shared_data_dir()


class Dataset(NamedTuple):
    """images uint8 (N, H, W, C) (float in [0, 255] if an .npz stores float); labels int64
    (N,) indexing ``class_names``.

    Source: none (the container :func:`load_dataset` returns).
    """

    images: np.ndarray
    labels: np.ndarray
    class_names: tuple[str, ...]


class Task(NamedTuple):
    """A sampled task: K classes relabelled 0..K−1, n training images per class (grouped by
    class), and a held-out split (``x_test``/``y_test``, possibly empty) from the same classes.

    Source: Zancato et al. 2020 (arXiv 2008.12478), Sec. 5, App. B (the task protocol);
    METHOD.md §8.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    class_names: tuple[str, ...]


def shared_data_dir() -> Path:
    """``$NTK_TT_DATA_DIR`` if set, else ``../shared/data`` next to the repository."""
    env = os.environ.get("NTK_TT_DATA_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "data"


def known_datasets() -> list[str]:
    """Short names loadable right now (vendored ones always; shared ones when present).

    Returns:
      The vendored names (sorted), then those of :data:`SHARED` whose file is in
      :func:`shared_data_dir`: the short names :func:`load_dataset` accepts.

    Source: none (a utility).

    Raises:
      Nothing of its own (it takes no argument); PermissionError (an OSError) if the shared
      data folder cannot be searched (from :meth:`pathlib.Path.is_file`).
    """
    shared = [k for k, f in SHARED.items() if (shared_data_dir() / f).is_file()]
    return sorted(VENDORED) + shared


def _tfds_dir(name: str, data_dir: str | os.PathLike | None) -> Path:
    root = Path(data_dir or os.environ.get("TFDS_DATA_DIR", "~/tensorflow_datasets"))
    return root.expanduser() / name


def _prepared_version(folder: Path) -> Path | None:
    """The newest prepared version folder (one holding dataset_info.json), if any."""
    found = sorted(p.parent for p in folder.glob("*/dataset_info.json")) if folder.is_dir() else []
    return found[-1] if found else None


NPZ_FORMAT = ("an .npz archive (numpy.savez) with keys images (uint8, N×H×W×C or N×H×W; float "
              "in [0, 255] is accepted too), labels (integers in [0, K), N) and class_names "
              "(K strings)")


def _load_npz(path: Path) -> Dataset:
    """Read and check an .npz dataset (see :func:`load_dataset` for what is rejected)."""
    try:
        archive = np.load(path)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        raise ValueError(f"{path} is not a numpy .npz archive ({type(err).__name__}); "
                         f"expected {NPZ_FORMAT}.") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"{path} holds a single array, not a numpy .npz archive; "
                         f"expected {NPZ_FORMAT}.")
    with archive as d:
        missing = [k for k in ("images", "labels", "class_names") if k not in d.files]
        if missing:
            raise ValueError(f"{path} lacks the keys {missing} (has {d.files}); expected "
                             f"{NPZ_FORMAT}.")
        arrays = {}
        for key in ("images", "labels", "class_names"):
            try:
                arrays[key] = d[key]
            except ValueError as err:
                if "allow_pickle" not in str(err):
                    raise ValueError(f"{key} of {path} cannot be read ({err}); expected "
                                     f"{NPZ_FORMAT}.") from None
                fix = ("np.array(names, dtype=str)" if key == "class_names"
                       else "a numeric numpy array")
                raise ValueError(f"{key} of {path} is an object (pickled) array, which is not "
                                 f"loaded; store it as {fix}.") from None
            except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as err:
                raise ValueError(f"{key} of {path} cannot be read ({type(err).__name__}: the "
                                 f"archive is corrupt); rewrite the file as {NPZ_FORMAT}."
                                 ) from None
    names = check_npz_layout(path, arrays["images"], arrays["class_names"])
    images = _check_images(path, arrays["images"])
    labels = _check_labels(path, arrays["labels"], len(names))
    if len(images) != len(labels):
        raise ValueError(f"images ({len(images)}) and labels ({len(labels)}) of {path} differ in "
                         "length; store one label per image.")
    if images.ndim == 3:
        images = images[..., None]
    return Dataset(images, labels, names)


def _tfds_read(name: str, version_dir: Path, read):
    """``read()``, with any failure of tensorflow-datasets on a damaged prepared folder (a
    truncated or emptied ``dataset_info.json``, missing record files) as one ValueError that
    names the folder; TFDS's own messages ("Invalid version ''") did not."""
    try:
        return read()
    except Exception as err:  # TFDS and protobuf raise many unrelated types here
        raise ValueError(
            f"the TFDS dataset {name!r} prepared in {version_dir} cannot be read "
            f"({type(err).__name__}: {str(err)[:200]}); prepare it again there (tfds build, "
            "or download_and_prepare) or remove that version folder.") from None


def _load_tfds(name: str, version_dir: Path, split: str) -> Dataset:
    import tensorflow_datasets as tfds

    builder = _tfds_read(name, version_dir, lambda: tfds.builder_from_directory(str(version_dir)))
    if split not in builder.info.splits:
        raise ValueError(
            f"split {split!r} not in TFDS dataset {name!r}; available: "
            f"{sorted(builder.info.splits)}."
        )

    def read():
        source = builder.as_data_source(split)
        return [source[i] for i in range(len(source))], builder.info.features["label"]

    records, label = _tfds_read(name, version_dir, read)
    images = np.stack([np.asarray(r["image"], np.uint8) for r in records])
    labels = np.asarray([int(r["label"]) for r in records], np.int64)
    names = tuple(getattr(label, "names", None) or (str(i) for i in range(labels.max() + 1)))
    return Dataset(images if images.ndim == 4 else images[..., None], labels, names)


def load_dataset(name: str | os.PathLike, *, split: str = "train",
                 data_dir: str | os.PathLike | None = None) -> Dataset:
    """Load a real image set by name as numpy arrays.

    Args:
      name: a short name from :func:`known_datasets` (``flowers5`` is vendored; the others
        live in ``../shared/data``), a path (str, or os.PathLike: always a path) to an ``.npz``
        file with the keys ``images``, ``labels`` and ``class_names`` (the format of
        ``../shared/data``), or a tensorflow-datasets name prepared offline in ``data_dir``.
      split: TFDS split (ignored for the short names and .npz files, one fixed set each;
        :func:`ntk_tt.predict_task`, :func:`ntk_tt.suggest_task` and ``ntk-tt`` refuse a
        split other than "train" for them).
      data_dir: TFDS data directory (default ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``).

    Source: none (a utility: the loader of the three places in the module docstring).

    An ``.npz`` file's images are uint8, or any integer or float numbers in [0, 255] (kept
    as stored). Float images whose largest value is ≤ 1 are taken to be in [0, 1] units and
    rejected: multiply them by 255 (or store uint8). Labels may be stored as floats if every
    value is a whole number.

    Returns:
      :class:`Dataset` with images uint8 (N, H, W, C) (grey images get C = 1) and labels (N,).

    Raises:
      ValueError: ``name`` not a str or os.PathLike; unknown name (the known ones listed); a
        path (os.PathLike, ends in ``.npz`` or contains ``/``) that is not a file, not an .npz
        archive (corrupt included) or lacks a key; in an .npz file: an object (pickled) array;
        images not (N, H, W[, C]), empty, not numbers, outside [0, 255], non-finite, or float
        with max ≤ 1; labels not 1-D (one-hot), not numbers, non-integer floats, or outside
        [0, K) with K = len(class_names); class_names not a 1-D array of strings (integers
        included: store str names), not UTF-8, duplicated or blank; images channels-first,
        (N, C, H, W) with C in {1, 3, 4} (transpose to (N, H, W, C)); images and labels of
        different lengths. A TFDS name not prepared in ``data_dir`` (TFDS cannot download
        here), or prepared in a folder TFDS cannot read (a damaged ``dataset_info.json`` or
        missing record files; the folder named); an unknown split.
    """
    name, is_path = dataset_name(name)
    if name in VENDORED and not is_path:
        return _load_npz(VENDORED[name])
    if is_path or is_dataset_path(name):
        if not Path(name).is_file():
            what = "is a folder, not a file" if Path(name).is_dir() else "not found"
            raise ValueError(f"dataset file {what}: {name!r}; pass an existing path to "
                             f"{NPZ_FORMAT}, or a short name: {', '.join(known_datasets())}.")
        return _load_npz(Path(name))
    if name in SHARED and (shared_data_dir() / SHARED[name]).is_file():
        return _load_npz(shared_data_dir() / SHARED[name])
    version_dir = _prepared_version(_tfds_dir(name, data_dir))
    if version_dir is not None:
        return _load_tfds(name, version_dir, split)
    known = ", ".join(known_datasets())
    if name in SHARED:
        raise ValueError(
            f"dataset {name!r} needs {SHARED[name]} in {shared_data_dir()} (not found); set "
            f"NTK_TT_DATA_DIR to the folder holding it, or use one of: {known}."
        )
    import tensorflow_datasets as tfds

    try:
        tfds.builder_cls(name)
    except Exception:  # TFDS's registry says it does not know the name either.
        raise ValueError(f"unknown dataset {name!r}; known datasets: {known}.") from None
    raise ValueError(
        f"TFDS dataset {name!r} is not prepared in {_tfds_dir(name, data_dir).parent} and TFDS "
        f"cannot download here (no network); prepare it on a connected machine (array_record "
        f"format), copy the folder and pass --data-dir, or use one of: {known}."
    )


def sample_task(data: Dataset, *, num_classes: int = 5, per_class: int = 150,
                test_per_class: int = 50, key: jax.Array) -> Task:
    """Sample K random classes × n images per class, plus a held-out split.

    Classes are drawn without replacement from the classes with at least ``per_class`` images
    and relabelled 0..K−1 in ascending original-label order. Within each class the images are
    permuted once (from ``key``); the first n train, the next ``min(test_per_class, smallest
    remainder)`` are held out, so every class has the same count in both splits.

    Source: Zancato et al. 2020 (arXiv 2008.12478), Sec. 5, App. B (the task protocol);
    METHOD.md §8.

    Args:
      data: the dataset to sample from.
      num_classes: K ≥ 2.
      per_class: n ≥ 1 training images per class.
      test_per_class: held-out images per class wanted (≥ 0); fewer are left when a chosen
        class has fewer than n + test_per_class images (a ``UserWarning`` says so).
      key: ``jax.random`` key; the same key gives the same task.

    Returns:
      :class:`Task` with uint8 images; x_train has K·n rows grouped by class.

    Raises:
      ValueError: ``data`` not a Dataset, counts not integers, ``key`` not a jax random key;
        ``data`` has images and labels of different lengths or labels outside
        [0, len(class_names)); K < 2 or above the classes with images; fewer than 2 classes
        in ``data``; n < 1 or above the images per class.
    """
    check_task_args(data, num_classes, per_class, test_per_class, key)
    counts = np.bincount(data.labels, minlength=len(data.class_names))
    present = int(np.count_nonzero(counts))
    if num_classes < 2:
        raise ValueError(f"num_classes (K) must be >= 2 (a task needs at least two classes), "
                         f"got {num_classes}.")
    if present < 2:
        raise ValueError(f"the dataset has only {present} class with images; at least 2 are "
                         "needed: use another dataset.")
    if num_classes > present:
        raise ValueError(
            f"num_classes (K) = {num_classes} is more than the {present} classes available"
            + ("; choose a smaller K or another dataset." if present == len(counts) else
               f": only {present} of the {len(counts)} class_names have images; choose K <= "
               f"{present} or another dataset.")
        )
    if per_class < 1:
        raise ValueError(f"per_class (n) must be >= 1 training image per class, got {per_class}.")
    eligible = np.flatnonzero(counts >= per_class)
    if len(eligible) < num_classes:
        raise ValueError(
            f"per_class (n) = {per_class} images is more than {num_classes} classes have "
            f"(images per class: min {counts.min()}, max {counts.max()}); choose n <= "
            f"{np.sort(counts)[-num_classes]}."
        )
    k_cls, k_img = jax.random.split(key)
    chosen = np.sort(np.asarray(jax.random.choice(k_cls, eligible, (num_classes,), replace=False)))
    n_test = int(min(max(test_per_class, 0), counts[chosen].min() - per_class))
    if n_test < test_per_class:
        warnings.warn(f"sample_task: {n_test} held-out images per class, fewer than the "
                      f"test_per_class = {test_per_class} asked for: a chosen class has "
                      f"{counts[chosen].min()} images and {per_class} of them train.",
                      stacklevel=2)
    train, test = [], []
    for c, k in zip(chosen, jax.random.split(k_img, num_classes), strict=True):
        idx = np.flatnonzero(data.labels == c)[np.asarray(jax.random.permutation(k, counts[c]))]
        train.append(idx[:per_class])
        test.append(idx[per_class:per_class + n_test])
    classes = np.arange(num_classes)
    return Task(
        data.images[np.concatenate(train)], np.repeat(classes, per_class),
        data.images[np.concatenate(test)], np.repeat(classes, n_test),
        tuple(data.class_names[c] for c in chosen),
    )


def prepare_images(images: np.ndarray, input_shape: tuple[int, int, int], *,
                   mean: np.ndarray, std: np.ndarray, resize: bool = True) -> jax.Array:
    """uint8 images → float32 model inputs: grey → RGB, resize, per-channel normalisation.

    Args:
      images: uint8 (N, H, W, C) or (N, H, W), values 0..255 (float images must be in the
        same 0..255 units, not [0, 1]).
      input_shape: the model's (H', W', C') (stored with the checkpoint).
      mean, std: per-channel statistics of the pre-training images in [0, 1] units, shape (C',)
        (or one value for every channel, shape () or (1,)).
      resize: resize H×W to H'×W' (bilinear, antialiased) when they differ, e.g. 28 → 32 px.

    Source: none (a utility: the pre-training input normalisation; no augmentation, as
    METHOD.md §1 requires of both the prediction and the real run).

    Returns:
      float32 (N, H', W', C') array ``(images / 255 − mean) / std``.

    Raises:
      ValueError: channels neither C' nor 1 (grey, repeated to C'; channels-first images
        are said to be); mean or std of a shape other than (C',) or () / (1,) (one value
        for every channel); H×W ≠ H'×W' with ``resize=False``; float images whose largest
        value is ≤ 1 ([0, 1] units: divided by 255 twice); pixels outside [0, 255] or not
        finite; ``input_shape`` not three integers >= 1; mean or std not finite, std ≤ 0,
        or either above 1 (0..255 units); one image of shape ``input_shape`` without a batch
        axis (pass ``images[None]``).
    """
    check_normalisation(images, input_shape, mean, std)
    x = np.asarray(images)
    x = x[..., None] if x.ndim == 3 else x
    h, w, c = input_shape
    if x.ndim != 4 or x.shape[-1] not in (1, c):
        first = x.ndim == 4 and x.shape[1] in (1, c)  # (N, C, H, W): channels first
        raise ValueError(
            f"images have shape {x.shape[1:]} but the model expects (H, W, C) = {input_shape}; "
            + ("they look channels-first (N, C, H, W): transpose them to (N, H, W, C), e.g. "
               "images.transpose(0, 2, 3, 1)." if first else
               # a grey model: nothing converts to 1 channel ("converted, to 1 channels")
               f"the model takes grey (1-channel) images, and {x.shape[-1]}-channel ones are "
               "not converted to grey: convert them first (e.g. np.round(images.mean(axis=-1))"
               ".astype(np.uint8)) or use a checkpoint made for these images." if c == 1 else
               f"only grey (1-channel) images are converted, to {c} channels: use {c}-channel "
               "data or a checkpoint made for these images."))
    for name, stat in (("mean", mean), ("std", std)):
        if np.shape(stat) not in ((), (1,), (c,)):
            raise ValueError(f"{name} must hold one value per channel of the model's input, "
                             f"shape ({c},), got shape {np.shape(stat)}.")
    if x.shape[1:3] != (h, w) and not resize:
        raise ValueError(
            f"images are {x.shape[1]}×{x.shape[2]} px but the model expects {h}×{w}; allow "
            "resizing (resize=True, drop --no-resize) or use a matching checkpoint."
        )
    if x.dtype.kind == "f" and x.size and x.max() <= 1:
        raise ValueError(
            f"images are float with max {x.max()}, i.e. in [0, 1] units, but 0..255 is expected "
            "(they would be divided by 255 twice); pass uint8 in [0, 255] (e.g. "
            "np.round(images * 255).astype(np.uint8)) or float in [0, 255]."
        )
    out = jnp.asarray(x, jnp.float32) / 255.0
    out = jnp.broadcast_to(out, (*out.shape[:3], c))
    if out.shape[1:3] != (h, w):
        out = jax.image.resize(out, (out.shape[0], h, w, c), "linear", antialias=True)
    return (out - jnp.asarray(mean, jnp.float32)) / jnp.asarray(std, jnp.float32)
