"""A sweep task's data: the pre-trained model with a fresh seeded head, its sampled training
images and its run key; checkpoints, data sets and ``apply_fn`` shared across tasks.
:func:`check_datasets` loads and checks the data sets of a grid before any work."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import ntk_tt
from ntk_tt.data._checkpoint import load_checkpoint
from ntk_tt.data._data import (
    SHARED,
    VENDORED,
    load_dataset,
    prepare_images,
    sample_task,
    shared_data_dir,
)
from ntk_tt.kernels._head_aware import split_head
from ntk_tt.models import replace_head
from ntk_tt.sweep._finetune import TaskData
from ntk_tt.sweep._grid import SweepSpec, Task, dataset_tag


def _task_key(task: Task) -> jax.Array:
    """The task's run key: the SGD batch order of both the prediction and the fine-tune."""
    return jax.random.fold_in(jax.random.key(task.seed), 7919)


@functools.lru_cache(maxsize=2)
def _checkpoint(path: str | None):
    return load_checkpoint(path)


@functools.lru_cache(maxsize=8)
def _dataset(name: str):
    return load_dataset(name)


def check_datasets(datasets, per_class, classes: int, *, meta: dict | None = None) -> None:
    """Load every dataset once (missing, corrupt or malformed sets fail here, before any
    work), check it has ``classes`` classes with at least ``max(per_class)`` images each, and
    refuse two names for one file (they would share task ids). With a checkpoint's ``meta``
    (:func:`ntk_tt.data._checkpoint.read_meta`: no weight is read), also check that the
    model takes its images (:func:`ntk_tt.data._data.prepare_images`, the check ``ntk-tt
    predict`` makes, on no image: shapes only, channels the model's or 1, grey).

    Raises:
      ValueError: the first problem, as one line that says how to fix it (a dataset whose
        images the model cannot take is named with ``prepare_images``' reason).
    """
    seen = {}
    need = max(per_class)
    for name in datasets:
        data = _dataset(name)
        if meta is not None:
            try:
                prepare_images(data.images[:0], tuple(meta["input_shape"]),
                               mean=np.asarray(meta["mean"]), std=np.asarray(meta["std"]))
            except ValueError as err:
                raise ValueError(f"dataset {name!r}: {err}") from None
        counts = np.bincount(np.asarray(data.labels))
        enough = int(np.sum(counts >= need))
        if enough < classes:
            raise ValueError(f"dataset {name!r} has {enough} classes with at least {need} "
                             f"images (the largest --per-class), a task needs {classes}; use "
                             "a smaller --per-class or another dataset.")
        tag = _same_file(name)
        if tag in seen:
            raise ValueError(f"--datasets {seen[tag]!r} and {name!r} are the same dataset; "
                             "give it once.")
        seen[tag] = name


def _same_file(name: str) -> str:
    """What identifies a data set's images: a short name's file (vendored or shared, resolved)
    when it has one, so that ``flowers5`` and the path to its vendored .npz are one data set;
    else :func:`dataset_tag` (a path's resolved file, a TFDS name as it is)."""
    file = VENDORED.get(name) or (shared_data_dir() / SHARED[name] if name in SHARED else None)
    return dataset_tag(str(file.resolve()) if file is not None and file.is_file() else name)


def load_task(task: Task, spec: SweepSpec) -> TaskData:
    """The shipped (or ``spec.checkpoint``) pre-trained model with a fresh seeded head, and the
    task's training images sampled from ``task.dataset`` (resized to the model's input).

    The task seed fixes the classes, the images and the head; the same task always gives the
    same data and initial logits.
    """
    model, meta = _checkpoint(spec.checkpoint)
    key = jax.random.key(task.seed)
    sampled = sample_task(_dataset(task.dataset), num_classes=task.classes,
                          per_class=task.per_class, test_per_class=0,
                          key=jax.random.fold_in(key, 0))
    x = prepare_images(sampled.x_train, tuple(meta["input_shape"]), mean=np.asarray(meta["mean"]),
                       std=np.asarray(meta["std"]))
    module = replace_head(model, task.classes, key=jax.random.fold_in(key, 1))
    apply_fn, params = _shared_apply(module)
    feature_fn, bparams, w0, b0 = split_head(module)
    feature_fn = _APPLY.setdefault(("features", nnx.graphdef(module)), feature_fn)
    return TaskData(apply_fn, params, x, jnp.asarray(sampled.y_train, jnp.int32),
                    (feature_fn, bparams, w0, b0))


_APPLY: dict = {}


def _shared_apply(module):
    """``ntk_tt.from_nnx(module)``, reusing one ``apply_fn`` for every module of the same graph
    without non-parameter state, so compiled predictions and fine-tunes are shared by tasks."""
    graphdef, _, rest = nnx.split(module, nnx.Param, ...)
    apply_fn, params = ntk_tt.from_nnx(module)
    if jax.tree.leaves(rest):
        return apply_fn, params
    return _APPLY.setdefault(graphdef, apply_fn), params
