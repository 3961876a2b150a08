"""Checks of an .npz image set's images and labels (split from :mod:`ntk_tt.data._data`,
whose ``_load_npz`` reads the archive): each raises one ValueError naming the file, what is
wrong and how to store it instead.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _check_images(path: Path, images: np.ndarray) -> np.ndarray:
    """Images of an .npz file: (N, H, W) or (N, H, W, C), uint8 or numbers in [0, 255].

    Float images must be in 0..255 units, like uint8: a float array whose largest value is
    ≤ 1 is taken to be in [0, 1] units and rejected (it would reach the model divided by 255
    twice, as near-black inputs). Integer and float images are kept as they are.
    """
    where = f"images of {path}"
    if images.ndim not in (3, 4):
        raise ValueError(f"{where} have shape {images.shape}; expected (N, H, W, C) or (N, H, W) "
                         "(grey), e.g. uint8 (N, 32, 32, 3).")
    if len(images) == 0:
        raise ValueError(f"{where} are empty (shape {images.shape}); store at least one image "
                         "per class.")
    kind = images.dtype.kind
    if kind not in "uif":
        raise ValueError(f"{where} have dtype {images.dtype}; store uint8 pixel values in "
                         "[0, 255] (or float in [0, 255]).")
    if images.dtype == np.uint8:
        return images
    lo, hi = images.min(), images.max()
    if kind == "f" and not np.isfinite(images).all():
        raise ValueError(f"{where} contain NaN or infinite values; store finite uint8 pixel "
                         "values in [0, 255].")
    if lo < 0 or hi > 255:
        raise ValueError(f"{where} have values in [{lo}, {hi}], outside [0, 255]; store uint8 "
                         "pixel values in [0, 255] (or float in [0, 255]).")
    if kind == "f" and hi <= 1:
        raise ValueError(f"{where} are float with max {hi}, i.e. in [0, 1] units, but [0, 255] "
                         "is expected (they would be divided by 255 twice); store uint8 in "
                         "[0, 255] (e.g. np.round(images * 255).astype(np.uint8)) or float "
                         "in [0, 255].")
    return images


def _check_labels(path: Path, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Labels of an .npz file as int64 (N,), each a class index in [0, num_classes)."""
    where = f"labels of {path}"
    if labels.ndim != 1:
        hint = (" (one-hot? store labels.argmax(1))" if labels.ndim == 2 else "")
        raise ValueError(f"{where} have shape {labels.shape}; expected one integer class index "
                         f"per image, shape (N,){hint}.")
    kind = labels.dtype.kind
    if kind not in "uif":
        raise ValueError(f"{where} have dtype {labels.dtype}; store integer indices into "
                         "class_names (0 for class_names[0], ...), and the names in class_names.")
    if kind == "f":
        bad = labels[~(np.isfinite(labels) & (labels == np.round(labels)))]
        if len(bad):
            raise ValueError(f"{where} are float with non-integer values (e.g. {bad[0]}); store "
                             "integer class indices in [0, K) with K = len(class_names).")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(
            f"{where} must be integers in [0, K) with K = len(class_names) = {num_classes}; got "
            f"values from {labels.min():g} to {labels.max():g}: fix the labels or list every "
            "class in class_names.")
    return labels.astype(np.int64)
