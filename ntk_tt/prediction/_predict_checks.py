"""Checks of :func:`ntk_tt.predict`'s kernel, predictor and sketch options, made before any
kernel work (shared with the optimizer path and ``suggest``)."""

from __future__ import annotations

import numpy as np

from ntk_tt._options import KERNELS, PREDICTORS
from ntk_tt.data._model import num_params
from ntk_tt.kernels._head_aware import BACKBONES, check_head_reproduces

DEFAULT_SKETCH_DIM = 256


def _check_kinds(kernel, sketch_dim, key, method, batch_size, n):
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}.")
    if sketch_dim is not None and (not isinstance(sketch_dim, (int, np.integer))
                                   or sketch_dim < 1):
        raise ValueError(f"sketch_dim must be a positive int (D'), got {sketch_dim!r}.")
    if sketch_dim is not None and kernel != "sketch" and method != "sde":
        raise ValueError(
            f"sketch_dim only applies to kernel='sketch' (and the SGD noise of method='sde'), "
            f"got sketch_dim={sketch_dim!r} with kernel={kernel!r}, method={method!r}: drop "
            "sketch_dim, or pass kernel='sketch' for a sketched kernel.")
    why = [w for w, on in (("kernel='sketch' draws sketch directions", kernel == "sketch"),
                           ("method='sde' draws Brownian paths", method == "sde"),
                           (f"batch_size={batch_size} < N = {n} draws minibatch orders",
                            batch_size < n)) if on]
    if why and key is None:  # only the sources that apply (a fresh user was told kernel='exact')
        raise ValueError(f"{' and '.join(why)}: pass key=jax.random.key(seed).")


def check_sketch_size(kernel, sketch_dim, params) -> None:
    """ValueError when the linear predictor's sketch (``kernel="sketch"``, its default D'
    included, or an explicit ``sketch_dim`` for the SDE noise) has D' above the model's D
    parameters: it costs more than the exact kernel (10**6 on a small model was a hang)."""
    d, given = num_params(params), sketch_dim is not None
    if (kernel == "sketch" or given) and (d_sketch := sketch_dim or DEFAULT_SKETCH_DIM) > d:
        exact = "kernel='exact', or " if kernel == "sketch" else ""  # else the SDE noise's
        raise ValueError(
            f"sketch_dim D' = {d_sketch}{'' if given else ' (the default)'} exceeds the "
            f"model's D = {d} parameters: that sketch costs more than the exact kernel and "
            f"is still an estimate; use {exact}sketch_dim <= D/2 = {d // 2}, where it saves "
            "work.")


def sketch_sizes(kernel: str, method: str, d_sketch: int) -> dict:
    """The sketch sizes a linear-predictor prediction used, for its ``hyperparameters``:
    ``sketch_dim`` (the kernel's D', ``kernel="sketch"``) and ``noise_dim`` (the SDE noise
    features' D', ``method="sde"``); the same D' serves both when both apply."""
    return ({"sketch_dim": int(d_sketch)} if kernel == "sketch" else {}) | (
        {"noise_dim": int(d_sketch)} if method == "sde" else {})


def _check_predictor(predictor, head, backbone, method, kernel, apply_fn, params, x) -> bool:
    """Validate the predictor options; True for the head-aware predictor."""
    if predictor not in PREDICTORS:
        raise ValueError(f"predictor must be one of {PREDICTORS}, got {predictor!r}.")
    if backbone is not None and backbone not in BACKBONES:  # None: the default
        raise ValueError(f"backbone must be one of {BACKBONES} or None (the default), got "
                         f"{backbone!r}.")
    if predictor == "linear" or (predictor == "auto" and head is None):
        if backbone is not None:  # it would be unused (the CLI refuses it too)
            raise ValueError(f"backbone={backbone!r} sets the head-aware predictor's feature "
                             "kernel; the linear predictor (predictor='linear', or no head=) "
                             "has none: drop backbone, or pass head=ntk_tt.split_head(model).")
        return False
    if head is None:
        raise ValueError(
            "predictor='head_aware' needs head=ntk_tt.split_head(model) (backbone features "
            "and the linear head); with a bare apply_fn use predictor='linear'.")
    if method != "discrete":
        raise ValueError(
            f"the head-aware predictor uses the exact discrete recursion, got method="
            f"{method!r}; use method='auto' or predictor='linear'.")
    if kernel == "sketch":
        raise ValueError("the head-aware predictor takes k_b from the exact logit-summed "
                         "kernel; use kernel='exact' or predictor='linear' with a sketch.")
    if not (isinstance(head, tuple) and len(head) == 4 and callable(head[0])):
        raise ValueError("head must be (feature_fn, backbone_params, head_kernel, head_bias) "
                         "as returned by ntk_tt.split_head(model).")
    check_head_reproduces(head, apply_fn, params, x)
    return True
