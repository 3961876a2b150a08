"""Orbax checkpoints of pre-trained models, and the shipped default checkpoint.

A checkpoint is one orbax directory with two items: ``state`` (the NNX model state: parameters
and, for :class:`~ntk_tt.models.ResNet18`, batch-norm statistics) and ``meta`` (JSON: the
architecture and its arguments, the input shape, the per-channel input normalisation, how it
was pre-trained, and ``weights_sha256``: the SHA-256 of the saved arrays, :func:`weights_digest`).
:func:`read_checked` (and :func:`read_meta`) builds meta's model abstractly (``nnx.eval_shape``),
checks it against the stored arrays' shapes and traces one input of ``input_shape`` through it,
reading no weight; :func:`restore` (:func:`load_checkpoint`) fills it and checks the digest (a
checkpoint saved before the digest existed has none and is not checked).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from ntk_tt._options import a_type
from ntk_tt.data._inputs import check_save_path, check_statistics, json_number, reason
from ntk_tt.data._model import input_shape_problem
from ntk_tt.data._orbax_quiet import _quiet
from ntk_tt.models import ResNet18, SmallResNet

DEFAULT_CHECKPOINT = (Path(__file__).resolve().parents[1] / "assets" / "checkpoints"
                      / "small_resnet_cifar10")
ARCHITECTURES = {"SmallResNet": SmallResNet, "ResNet18": ResNet18}
_FIX = "re-save it with ntk_tt.save_checkpoint, or omit it for the shipped one"
_RESAVE = ("save the checkpoint again with the right input_shape (ntk_tt.save_checkpoint(path, "
           "model, dict(meta, input_shape=[H, W, C]), overwrite=True))")


def _check_meta(path: Path | None, meta: Any, fix: str = _FIX) -> dict[str, Any]:
    """``meta`` as :func:`load_checkpoint` needs it, else one ValueError ending in ``fix``
    (``path`` None: a meta about to be saved)."""
    where = "meta" if path is None else f"checkpoint at {path}: meta"
    if not isinstance(meta, dict):
        raise ValueError(f"{where} is not a JSON object; {fix}.")
    missing = sorted({"architecture", "num_classes", "input_shape", "mean", "std"} - set(meta))
    if missing:
        raise ValueError(f"{where} lacks the keys {missing}; {fix}.")
    arch = meta["architecture"]
    if arch not in ARCHITECTURES:
        raise ValueError(f"{where} names architecture {arch!r}, which ntk_tt does not know; "
                         f"known architectures: {', '.join(sorted(ARCHITECTURES))}.")
    k = meta["num_classes"]
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"{where} has num_classes {k!r}; expected a positive integer; {fix}.")
    shape = meta["input_shape"]
    if not (isinstance(shape, list) and len(shape) == 3
            and all(isinstance(s, int) and s >= 1 for s in shape)):
        raise ValueError(f"{where} has input_shape {shape!r}; expected [H, W, C] (positive "
                         f"integers); {fix}.")
    for key in ("mean", "std"):
        v = meta[key]
        if not (isinstance(v, list) and len(v) == shape[2]
                and all(isinstance(s, (int, float)) and math.isfinite(s) for s in v)):
            count = (f"; they disagree: input_shape or {key} is wrong"
                     if isinstance(v, list) and len(v) != shape[2] else "")
            raise ValueError(f"{where} has {key} {v!r}; expected {shape[2]} finite numbers "
                             f"(one per input channel, input_shape {shape!r}{count}); {fix}.")
    try:  # std > 0, and both in [0, 1] units: what prepare_images will need of them
        check_statistics(meta["mean"], meta["std"])
    except ValueError as err:
        raise ValueError(f"{where}: {str(err).rstrip('.')}; {fix}.") from None
    if not isinstance(meta.get("kwargs", {}), dict):
        raise ValueError(f"{where} has kwargs {meta['kwargs']!r}; expected a JSON object of "
                         f"constructor arguments; {fix}.")
    digest = meta.get("weights_sha256")
    if "weights_sha256" in meta and not (isinstance(digest, str)
                                         and re.fullmatch("[0-9a-f]{64}", digest)):
        raise ValueError(f"{where} has weights_sha256 {digest!r}; expected the 64 hex digits "
                         f"save_checkpoint writes; {fix}.")
    return meta


def weights_digest(weights) -> str:
    """SHA-256 (hex) of a model's arrays: each leaf's dtype, shape and bytes, in the tree's
    leaf order (``weights``: ``nnx.to_pure_dict`` of the state, as saved and restored)."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(weights):
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{a.dtype.str}{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def read_meta(path: str | os.PathLike | None = None) -> tuple[Path, dict[str, Any]]:
    """Read and check a checkpoint's ``meta`` against its stored arrays' shapes, reading no
    weight (milliseconds: the model is built abstractly). Returns:
      ``(path, meta)``: the absolute checkpoint path and its metadata (architecture, kwargs,
      num_classes, input_shape [H, W, C], mean and std (C,), ...).

    Raises:
      ValueError: one line if ``path`` is not a str, os.PathLike or None (its type named, e.g.
        "got a SmallResNet" for a model passed as the path), the directory is missing, has no
        readable ``meta`` or array metadata, or ``meta`` lacks a key, names an unknown
        architecture (the known ones are listed), has a malformed input_shape / mean / std /
        kwargs, or does not match the stored arrays' shapes; an input_shape the weights
        cannot take (other input channels: the ones they take are named) or the model's
        layers shrink to nothing (NaN logits) names input_shape and the fix.
    """
    return read_checked(path)[:2]


def read_checked(path: str | os.PathLike | None):
    """:func:`read_meta`'s checks; ``(path, meta, graphdef, state, target)`` (meta's abstract
    model split, the ShapeDtypeStructs of its weights), which :func:`restore` fills."""
    if path is not None and (not isinstance(path, (str, os.PathLike)) or not str(path).strip()):
        raise ValueError(f"path must be the checkpoint folder's path (str or os.PathLike), or "
                         f"None for the shipped checkpoint; got {a_type(path)}"
                         f"{' (empty)' if isinstance(path, str) else ''}: pass e.g. "
                         "load_checkpoint('my_ckpt').")
    path = Path(path if path is not None else DEFAULT_CHECKPOINT).absolute()
    if not path.is_dir():
        raise ValueError(f"checkpoint {'is a file' if path.exists() else 'not found'}: {path} "
                         "(pass the directory written by ntk_tt.save_checkpoint, or omit it "
                         "for the shipped one).")
    try:
        with _quiet(), ocp.Checkpointer(ocp.JsonCheckpointHandler()) as ckptr:
            meta = ckptr.restore(path / "meta")
    except Exception as err:  # orbax raises many types; the user needs one line.
        raise ValueError(f"checkpoint at {path} is corrupt or not an ntk_tt checkpoint: its "
                         f"meta cannot be read ({reason(err)}); {_FIX}.") from None
    meta = _check_meta(path, meta)
    try:
        abstract = _abstract(meta)
    except Exception as err:  # bad constructor arguments in meta["kwargs"]
        raise ValueError(f"checkpoint at {path}: meta's architecture {meta['architecture']} "
                         f"cannot be built from kwargs {meta.get('kwargs', {})} "
                         f"({reason(err)}); {_FIX}.") from None
    graphdef, state = nnx.split(abstract)
    # Each array on the default device: the stored sharding names the saving machine's devices
    # (a CPU's), which orbax cannot map onto another platform's ("Topology mismatch").
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype,
                                                            sharding=device),
                          nnx.to_pure_dict(state))
    try:
        with _quiet(), ocp.Checkpointer(ocp.StandardCheckpointHandler()) as ckptr:
            stored = ckptr.metadata(path / "state").item_metadata
    except Exception as err:
        raise ValueError(f"checkpoint at {path} is corrupt or not an ntk_tt checkpoint: its "
                         f"state's array metadata cannot be read ({reason(err)}); "
                         f"{_FIX}.") from None
    _check_shapes(path, meta, target, stored.tree if hasattr(stored, "tree") else stored)
    _check_input_shape(f"checkpoint at {path}: ", meta, graphdef, state, _RESAVE)
    return path, meta, graphdef, state, target


def _build(meta: dict[str, Any], *, rngs: nnx.Rngs) -> nnx.Module:
    cls = ARCHITECTURES[meta["architecture"]]
    return cls(int(meta["num_classes"]), in_channels=int(meta["input_shape"][2]), rngs=rngs,
               **meta.get("kwargs", {}))


def _abstract(meta: dict[str, Any]) -> nnx.Module:
    """meta's model built abstractly (``nnx.eval_shape``: shapes only, nothing computed)."""
    return nnx.eval_shape(lambda: _build(meta, rngs=nnx.Rngs(0)))


def _channels(meta: dict[str, Any], want: dict, have: dict, whose: str) -> str | None:
    """If meta's model has the arrays ``have`` (name → shape) once its input_shape has other
    channels: why input_shape is wrong, naming the channels the arrays take; else None."""
    odd = [k for k in sorted(want) if want[k] != have.get(k)]
    if not odd or set(want) != set(have):
        return None
    (h, w, c), k = meta["input_shape"], odd[0]
    for n in sorted({b for a, b in zip(want[k], have[k], strict=False) if a != b} - {c}):
        try:
            alt = _abstract(dict(meta, input_shape=[h, w, n]))
            if _shapes(nnx.to_pure_dict(nnx.state(alt))) == have:
                return (f"meta's input_shape {meta['input_shape']} is wrong: {whose} "
                        f"{n}-channel inputs, not {c} ({k} has shape {have[k]}, not "
                        f"{want[k]}); input_shape must be [H, W, {n}] (H × W the images' size "
                        f"the model was trained on) with mean and std of {n} values each")
        except Exception:  # this channel count does not build the model: not the answer
            continue
    return None


def _check_input_shape(where: str, meta: dict[str, Any], graphdef, state, fix: str) -> None:
    """ValueError naming input_shape unless meta's abstract model maps one input of it to
    logits (traced only: :func:`~ntk_tt.data._model.input_shape_problem`)."""
    def apply_fn(state, x):  # all of state traced: batch-norm statistics included
        model = nnx.merge(graphdef, state)
        model.eval()  # as in prediction (from_nnx)
        return model(x)

    why = input_shape_problem(apply_fn, state, tuple(meta["input_shape"]))
    if why:
        raise ValueError(f"{where}meta's input_shape {meta['input_shape']} does not fit its "
                         f"{meta['architecture']}: given one input of that shape, {why}; "
                         f"{fix}.")


def _shapes(tree) -> dict[str, tuple[int, ...]]:
    """{'blocks/0/conv1/kernel': shape, ...} of a nested dict of arrays or array metadata."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(str(getattr(k, "key", k)) for k in keys): tuple(leaf.shape)
            for keys, leaf in flat}


def _check_shapes(path: Path, meta: dict[str, Any], expected, stored) -> None:
    """meta's model and the stored weights must have the same arrays of the same shapes."""
    want, have = _shapes(expected), _shapes(stored)
    if not have:
        raise ValueError(f"checkpoint at {path} is corrupt or not an ntk_tt checkpoint: its "
                         f"state lists no arrays (damaged or missing array metadata); {_FIX}.")
    said = f"meta (architecture {meta['architecture']}, kwargs {meta.get('kwargs', {})}, " \
           f"num_classes {meta['num_classes']}, input_shape {meta['input_shape']})"
    if set(want) != set(have):
        odd = sorted(set(want) ^ set(have))
        raise ValueError(f"checkpoint at {path}: {said} does not match the stored weights "
                         f"({len(odd)} arrays in one and not the other, e.g. {odd[0]}); "
                         f"{_FIX}.")
    channels = _channels(meta, want, have, "the stored weights take")
    if channels:
        raise ValueError(f"checkpoint at {path}: {channels}; {_RESAVE}.")
    bad = [k for k in sorted(want) if want[k] != have[k]]
    if bad:
        k = bad[0]
        raise ValueError(f"checkpoint at {path}: {said} does not match the stored weights: "
                         f"{k} should have shape {want[k]} but has {have[k]} ({len(bad)} "
                         f"arrays differ); {_FIX}.")


def _check_meta_builds(meta: dict[str, Any], state) -> dict:
    """ValueError unless meta's model (what load_checkpoint rebuilds) has ``state``'s arrays
    and shapes (a model saved after ``replace_head`` with the old meta: load_checkpoint
    refused); else that model's abstract weights (their dtypes are those loaded back)."""
    try:
        abstract = _abstract(meta)
    except Exception as err:  # bad constructor arguments in meta["kwargs"], num_classes, ...
        raise ValueError(f"meta's architecture {meta['architecture']} cannot be built from "
                         f"num_classes {meta['num_classes']!r}, input_shape "
                         f"{meta['input_shape']!r} and kwargs {meta.get('kwargs', {})} "
                         f"({reason(err)}); fix meta.") from None
    want, have = _shapes(nnx.to_pure_dict(nnx.state(abstract))), _shapes(state)
    odd = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
    channels = _channels(meta, want, have, "the model takes")
    if channels:
        raise ValueError(f"{channels}; fix meta before saving (or build the model with "
                         f"in_channels={meta['input_shape'][2]}).")
    if odd:
        k = odd[0]
        head = have.get("head/bias")
        fix = (f"set meta['num_classes'] = {head[0]}, the model's head (meta = dict(meta, "
               "num_classes=K) after ntk_tt.replace_head(model, K))"
               if head and want.get("head/bias") != head else
               "set meta's kwargs (and input_shape's channels) to those the model was built "
               "with")
        raise ValueError(
            f"meta does not describe the model: its {meta['architecture']} (num_classes "
            f"{meta['num_classes']}, kwargs {meta.get('kwargs', {})}) has {k} of shape "
            f"{want.get(k, 'none')}, the model {have.get(k, 'none')} ({len(odd)} arrays "
            f"differ), so load_checkpoint could not rebuild it; {fix}.")
    _check_input_shape("", meta, *nnx.split(abstract), "fix meta before saving")
    return nnx.to_pure_dict(nnx.state(abstract))


def save_checkpoint(path: str | os.PathLike, model: nnx.Module, meta: dict[str, Any], *,
                    overwrite: bool = False) -> Path:
    """Write ``model``'s state and ``meta`` as an orbax checkpoint at ``path``.

    Args:
      path: checkpoint directory (``~`` expanded, symbolic links resolved): new, in an
        existing folder (none is created, as by the package's other save functions), an empty
        folder, or an earlier checkpoint with ``overwrite=True`` (a folder holding anything
        else, or the current folder, is refused: the checkpoint replaces the whole folder).
      overwrite: replace a checkpoint that ``save_checkpoint`` wrote at ``path`` (a bool).
      model: a :mod:`ntk_tt.models` module.
      meta: JSON-able dict with at least ``architecture`` (a key of :data:`ARCHITECTURES`),
        ``num_classes``, ``input_shape`` (H, W, C), ``mean`` and ``std`` (C,), and optional
        ``kwargs`` for the constructor (e.g. ``widths``). ``weights_sha256`` is set to the
        model's :func:`weights_digest` (a given one is replaced).

    Returns:
      The absolute checkpoint path.

    Source: none (a utility: the checkpoint format that :func:`load_checkpoint` reads).

    Raises:
      ValueError: ``path`` not a str or os.PathLike (checked first, its type named: e.g. the
        arguments swapped); ``meta`` not a dict of JSON values, lacking a required key or
        with a malformed one (:func:`_check_meta`); ``meta["architecture"]`` not a known
        architecture (the message names it, the model's class, the known ones and the way
        out) or not the model's class; meta's model (num_classes, input channels, kwargs) not
        buildable or without the model's arrays and shapes (e.g. the old meta after
        ``replace_head``; other input channels name input_shape and those the model takes),
        or unable to take one input of meta's input_shape (shrunk to nothing: NaN logits);
        an optional ``class_names`` list whose length is not num_classes;
        ``path`` a file, in a missing folder, a folder holding other files, or a checkpoint
        without ``overwrite=True`` (:func:`check_save_path`); all before anything is written.
    """
    known = ", ".join(sorted(ARCHITECTURES))
    if not isinstance(path, (str, os.PathLike)):  # e.g. the arguments swapped: before any work
        check_save_path(path)
    if not isinstance(meta, dict):
        raise ValueError(f"meta must be a dict, got {type(meta).__name__}.")
    missing = sorted({"architecture", "num_classes", "input_shape", "mean", "std"} - set(meta))
    if missing:
        raise ValueError(
            f"meta lacks the keys {missing}; it needs architecture (one of {known}), "
            "num_classes, input_shape [H, W, C], mean and std (C,), and optionally kwargs.")
    arch, kind = meta["architecture"], type(model).__name__
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise ValueError(
            f"meta names architecture {arch!r} (the model is a {kind}), which ntk_tt cannot "
            f"rebuild: load_checkpoint builds the model from this name, and the known "
            f"architectures are {known} (ntk_tt.models). Save one of those, or use your own "
            "flax model without a checkpoint: ntk_tt.from_nnx(model) and the Python API "
            "(keep its weights with orbax yourself, e.g. nnx.state(model)).")
    if type(model) is not ARCHITECTURES[arch]:
        raise ValueError(
            f"meta names architecture {arch!r} but the model is a {kind}: load_checkpoint "
            f"would rebuild a {arch}, not this model. Set meta['architecture'] to the "
            f"model's class (one of {known}), or see ntk_tt.from_nnx for other models.")
    try:  # what load_checkpoint will read back
        meta = json.loads(json.dumps(meta, default=json_number))
    except (TypeError, ValueError) as err:
        raise ValueError(f"meta must hold JSON values (numbers, strings, lists, dicts; NumPy "
                         f"arrays are converted), got a value of type {err}; fix meta before "
                         "saving.") from None
    meta.pop("weights_sha256", None)  # replaced below by this model's
    _check_meta(None, meta, "fix meta before saving")
    if isinstance(names := meta.get("class_names"), list) and len(names) != meta["num_classes"]:
        raise ValueError(f"meta's class_names has {len(names)} names but num_classes is "
                         f"{meta['num_classes']} (e.g. the pre-trained meta after replace_head):"
                         " set meta['class_names'] to the new classes' names, or drop it.")
    state = nnx.to_pure_dict(nnx.state(model))
    rebuilt = _check_meta_builds(meta, state)
    # of the arrays as load_checkpoint reads them back: in the rebuilt model's dtypes (a
    # bfloat16 model's weights load as its float32 ones, exactly)
    meta["weights_sha256"] = weights_digest(jax.tree.map(
        lambda a, t: np.asarray(a).astype(t.dtype), state, rebuilt))
    path = check_save_path(path, overwrite)
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
        ckptr.save(path, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
            force=path.exists())  # an empty folder, or a checkpoint to replace
    return path


def load_checkpoint(path: str | os.PathLike | None = None) -> tuple[nnx.Module, dict[str, Any]]:
    """Rebuild the pre-trained model stored at ``path``.

    The shipped checkpoint is a :class:`~ntk_tt.models.SmallResNet` pre-trained on CIFAR-10
    (provenance, command and accuracy in ``ntk_tt/assets/README.md``). The model is built
    abstractly (shapes only, nothing compiled), so loading costs the read of the weights.

    Source: none (a utility; the shipped model stands in for METHOD.md §8's ImageNet ResNets).

    Args:
      path: the checkpoint directory (:func:`save_checkpoint` wrote it; str or os.PathLike),
        or None (default) for the shipped checkpoint.

    Returns:
      ``(model, meta)``: the NNX module with its pre-trained head (use
      :func:`ntk_tt.replace_head` for a target task) and the checkpoint's metadata (a dict:
      architecture, kwargs, num_classes, input_shape [H, W, C], mean and std (C,), ...).

    Raises:
      ValueError: one line (nothing else is printed) if ``path`` is not a str, os.PathLike
        or None (a number, say), the directory is missing or is not a readable ntk_tt
        checkpoint: meta unreadable or malformed (:func:`read_meta`), an unknown architecture
        (the known ones are named), meta's model not matching the stored weights' shapes (a
        wrong input_shape named, with the input channels the weights take), an input_shape
        its layers shrink to nothing (NaN logits), all before any weight is read; or weight
        files that cannot be read (truncated, damaged) or whose arrays differ from those saved
        (meta's ``weights_sha256``: bits changed on disk).
    """
    return restore(read_checked(path))


def restore(checked) -> tuple[nnx.Module, dict[str, Any]]:
    """(model, meta): the weights put into the abstract model of ``read_checked(path)``."""
    path, meta, graphdef, state, target = checked
    try:
        with _quiet(), ocp.Checkpointer(ocp.StandardCheckpointHandler()) as ckptr:
            weights = ckptr.restore(path / "state", args=ocp.args.StandardRestore(target))
    except Exception as err:
        raise ValueError(f"checkpoint at {path} is corrupt: its weights cannot be read, "
                         f"the array files are truncated or damaged ({reason(err)}); "
                         f"{_FIX}.") from None
    if "weights_sha256" in meta and weights_digest(weights) != meta["weights_sha256"]:
        raise ValueError(f"checkpoint at {path} is corrupt: its weights differ from those "
                         "saved (their SHA-256 is not meta's weights_sha256), the array files "
                         f"are damaged; {_FIX}.")
    nnx.replace_by_pure_dict(state, weights)
    return nnx.merge(graphdef, state), meta
