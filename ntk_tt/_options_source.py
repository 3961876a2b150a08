"""The task's dataset names that need no JAX: the short names and their files, and which
options apply to a fixed file rather than a prepared TFDS dataset (``ntk-tt`` checks them
before importing JAX; ``ntk_tt.data._data`` loads the files the tables name)."""

from __future__ import annotations

from typing import Any

from ntk_tt._defaults import DEFAULTS
from ntk_tt._output_paths import is_dataset_path

# the short dataset names and their files (ntk_tt.data._data loads them): the vendored set in
# ntk_tt/assets/data, the others in ../shared/data (or $NTK_TT_DATA_DIR). Each is one fixed
# set, like an .npz path: the task sampler draws the training and held-out images from it,
# and --split (a TFDS split) and --data-dir (a TFDS folder) do not apply to it
VENDORED_FILES = {"flowers5": "flowers5_32px_200pc.npz"}
SHARED_FILES = {
    "cifar10_source": "cifar10_train_source10k.npz",
    "cifar10_test": "cifar10_test_300pc.npz",
    "mnist_test": "mnist_test.npz",
    "notmnist": "notmnist_sample_test.npz",
    "flowers5_300pc": "flowers5_32px_300pc.npz",
}


def check_tfds_options(name: str, split: Any, data_dir: Any) -> None:
    """``split`` (--split) selects a split of a prepared TFDS dataset only, and ``data_dir``
    (--data-dir) the folder of one: a short name (:data:`VENDORED_FILES`, :data:`SHARED_FILES`)
    or an .npz path is one fixed file, which ``load_dataset`` reads whatever the split or folder, so
    either would be silently ignored: refused."""
    default = DEFAULTS["split"]
    if not isinstance(split, str) or not split:
        raise ValueError(f"split (--split) must be the name of a TFDS split such as "
                         f"{default!r}, got {split!r}.")
    if split != default:
        flag, given = "--split", f"split (--split) {split!r}"
    elif data_dir is not None:
        flag, given = "--data-dir", f"data_dir (--data-dir) {str(data_dir)!r}"
    else:
        return
    if name in VENDORED_FILES:
        what = f"the vendored file {VENDORED_FILES[name]}"
    elif name in SHARED_FILES:
        what = f"the file {SHARED_FILES[name]} of ../shared/data ($NTK_TT_DATA_DIR)"
    elif is_dataset_path(name):
        what = "an .npz file"
    else:
        return
    raise ValueError(f"{given} does not apply to dataset {name!r}: it is {what}, one fixed set "
                     f"from which the n training and the held-out images per class are both "
                     f"drawn; drop {flag} (it selects a prepared TFDS dataset only).")
