"""Orbax checkpoints of pre-trained models, and the shipped default checkpoint.

A checkpoint is one orbax directory with two items: ``state`` (the NNX model state: parameters
and, for :class:`~ntk_tt.models.ResNet18`, batch-norm statistics) and ``meta`` (JSON: the
architecture and its arguments, the input shape, the per-channel input normalisation, and how
it was pre-trained). The model is rebuilt from ``meta`` before the state is restored into it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from flax import nnx

from ntk_tt.models import ResNet18, SmallResNet

DEFAULT_CHECKPOINT = Path(__file__).parent / "assets" / "checkpoints" / "small_resnet_cifar10"
ARCHITECTURES = {"SmallResNet": SmallResNet, "ResNet18": ResNet18}


def _build(meta: dict[str, Any]) -> nnx.Module:
    cls = ARCHITECTURES[meta["architecture"]]
    kwargs = dict(meta.get("kwargs", {}))
    return cls(int(meta["num_classes"]), in_channels=int(meta["input_shape"][2]),
               rngs=nnx.Rngs(0), **kwargs)


def save_checkpoint(path: str | os.PathLike, model: nnx.Module, meta: dict[str, Any]) -> Path:
    """Write ``model``'s state and ``meta`` as an orbax checkpoint at ``path`` (overwrites).

    Args:
      path: checkpoint directory.
      model: a :mod:`ntk_tt.models` module.
      meta: JSON-able dict with at least ``architecture`` (a key of :data:`ARCHITECTURES`),
        ``num_classes``, ``input_shape`` (H, W, C), ``mean`` and ``std`` (C,), and optional
        ``kwargs`` for the constructor (e.g. ``widths``).

    Returns:
      The absolute checkpoint path.

    Raises:
      ValueError: ``meta`` lacks a required key or names an unknown architecture.
    """
    missing = {"architecture", "num_classes", "input_shape", "mean", "std"} - set(meta)
    if missing or meta.get("architecture") not in ARCHITECTURES:
        raise ValueError(
            f"meta needs keys architecture (one of {sorted(ARCHITECTURES)}), num_classes, "
            f"input_shape, mean, std; missing {sorted(missing)}."
        )
    path = Path(path).absolute()
    state = nnx.to_pure_dict(nnx.state(model))
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
        ckptr.save(path, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
    return path


def load_checkpoint(path: str | os.PathLike | None = None) -> tuple[nnx.Module, dict[str, Any]]:
    """Rebuild the pre-trained model stored at ``path`` (default: the shipped checkpoint).

    The shipped checkpoint is a :class:`~ntk_tt.models.SmallResNet` pre-trained on CIFAR-10
    (provenance, command and accuracy in ``ntk_tt/assets/README.md``).

    Returns:
      ``(model, meta)``: the NNX module with its pre-trained head (use
      :func:`ntk_tt.replace_head` for a target task) and the checkpoint's metadata.

    Raises:
      ValueError: one line if the directory is missing or is not a readable ntk_tt checkpoint.
    """
    path = Path(path if path is not None else DEFAULT_CHECKPOINT).absolute()
    if not path.is_dir():
        raise ValueError(f"checkpoint not found: {path} (pass the directory written by "
                         "experiments/pretrain.py, or omit it for the shipped one).")
    try:
        with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
            meta = ckptr.restore(path, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
            model = _build(meta)
            abstract = nnx.state(model)
            target = jax.tree.map(ocp.utils.to_shape_dtype_struct, nnx.to_pure_dict(abstract))
            state = ckptr.restore(path, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target)))["state"]
        nnx.replace_by_pure_dict(abstract, state)
        nnx.update(model, abstract)
    except Exception as err:  # orbax raises many types; the user needs one line.
        reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise ValueError(f"checkpoint at {path} is corrupt or not an ntk_tt checkpoint "
                         f"({type(err).__name__}: {reason}).") from None
    return model, meta
