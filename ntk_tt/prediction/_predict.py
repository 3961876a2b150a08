"""``predict``: the eager entry point from a model to predicted curves and T_ε.

Pipeline: validate → logits f0 → empirical NTK (exact | traced | sketch) →
SGD noise (SDE only) → ``predict_from_kernel`` → T_ε per ε with reasons. Each stage is timed.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ntk_tt._options import KERNELS as KERNELS  # one list each, importable without JAX
from ntk_tt._options import PREDICTORS as PREDICTORS
from ntk_tt._options_predict import (
    check_default_subspace_dim,
    check_no_subspace_dim,
    check_subspace_dim,
    default_backbone,
)
from ntk_tt._options_targets import check_targets
from ntk_tt.data._inputs import (
    _check_finite,
    as_array,
    at_least_float32,
    check_key,
    warn_raw_pixels,
)
from ntk_tt.data._model import ApplyFn, check_model, num_params
from ntk_tt.dynamics._checks import (
    check_head_kernel,
    check_hyper,
    check_labels,
    check_num_paths,
    flag,
)
from ntk_tt.dynamics._losses import check_loss
from ntk_tt.dynamics._optim_linear import is_traced
from ntk_tt.dynamics._predict_kernel import predict_from_kernel, resolve_method
from ntk_tt.kernels._head_aware import check_kernel_backbone
from ntk_tt.prediction._predict_checks import DEFAULT_SKETCH_DIM as DEFAULT_SKETCH_DIM
from ntk_tt.prediction._predict_checks import (
    _check_kinds,
    _check_predictor,
    check_sketch_size,
    sketch_sizes,
)
from ntk_tt.prediction._predict_subset import predict_subset
from ntk_tt.prediction._result import Prediction, _to_prediction, timed_prediction, with_targets
from ntk_tt.training._optimizer_run import check_learning_rates, check_shorthand
from ntk_tt.training._timing import timed_stage


def check_test(apply_fn, params, x_test, y_test, c, x=None):
    """The held-out inputs (float32 at least) checked with their labels, or None; with the
    training inputs ``x``, samples of x's shape (a pooling model took others without a word,
    or failed after Θ(x, x) naming x2)."""
    if (x_test is None) != (y_test is None):
        raise ValueError("pass x_test and y_test together (or neither).")
    if x_test is not None:
        x_test = at_least_float32(as_array(x_test, "x_test"))
        nt, _ = check_model(apply_fn, params, x_test, name="x_test")
        check_labels(y_test, nt, c, name="y_test")
        if x is not None and np.shape(x_test)[1:] != np.shape(x)[1:]:
            raise ValueError(f"x_test's samples have shape {np.shape(x_test)[1:]}, x's "
                             f"{np.shape(x)[1:]}: prepare the held-out inputs as the training "
                             "ones (ntk_tt.prepare_images with the same input_shape).")
    return x_test


def _logits(apply_fn, params, x, x_test):
    return apply_fn(params, x), None if x_test is None else apply_fn(params, x_test)


def _kernels(apply_fn, params, x, x_test, kind, sketch_dim, key):
    """Θ(x, x) and Θ(x_test, x) (or None) of the requested kind; one ValueError that points
    at x and the weights when Θ overflows (it said "recompute it with a smaller block_size"
    of a kernel the user never gave)."""
    from ntk_tt import empirical_ntk, sketched_ntk

    if kind == "sketch":
        feats = sketched_ntk(apply_fn, params, x, sketch_dim=sketch_dim, key=key).features
        feats_t = None if x_test is None else sketched_ntk(
            apply_fn, params, x_test, sketch_dim=sketch_dim, key=key).features
        k, kt = feats @ feats.T, None if feats_t is None else feats_t @ feats.T
    else:
        traced = kind == "traced"
        k = empirical_ntk(apply_fn, params, x, trace_logits=traced)
        kt = None if x_test is None else empirical_ntk(apply_fn, params, x_test, x,
                                                       trace_logits=traced)
    for name, value in (("empirical NTK Θ(x, x)", k), ("held-out NTK Θ(x_test, x)", kt)):
        if value is not None:
            _check_finite(value, name, computed=True)
    return k, kt


@timed_prediction
def predict(
    apply_fn: ApplyFn, params: Any, x, y, *, learning_rate: float | None = None, steps: int,
    batch_size: int | None = None, momentum: float | None = None, nesterov: bool | None = None,
    loss: str = "cross_entropy", method: str = "auto", kernel: str = "exact",
    sketch_dim: int | None = None, num_paths: int = 32, key: jax.Array | None = None,
    x_test=None, y_test=None, predictor: str = "auto", head=None,
    backbone: str | None = None, segments: int = 1, subset: int | None = None,
    subset_method: str = "power_law", targets=None, optimizer=None, head_kernel=None,
    subspace_dim: int | None = None,
) -> Prediction:
    """Predict fine-tuning curves and T_ε of ``apply_fn`` at ``params`` without training.

    Linearises the network at the pre-trained weights (Sec. 3), builds the empirical NTK
    (eq. 2; ``kernel="traced"`` uses the logit-summed N×N kernel as (Θ/C) ⊗ I_C, "sketch" the
    Achlioptas random projection of Sec. 4 with ``sketch_dim`` D', default 256) and integrates
    the function-space dynamics (Prop. 1/2, eq. 1) for ``steps`` optimiser updates of optax's
    ``sgd(learning_rate, momentum, nesterov)`` on the MEAN loss. ``method="auto"`` is the
    exact discrete recursion (exact for the linearised model, predicts divergence).
    ``method="sde"`` estimates σ_w² at ``params`` and uses ``noise_features`` with D'.

    ``predictor="head_aware"`` (the default when ``head`` is given) keeps the fresh task head
    exact and linearises only the backbone (``ntk_tt.predict_head_aware``, METHOD.md §10): its
    kernel grows with the head as the real network's does, which the frozen Θ of
    ``predictor="linear"`` cannot follow (full benchmark: README). It needs the model split
    ``head = ntk_tt.split_head(model)`` and uses the exact discrete recursion; ``backbone``
    chooses the feature kernel (None, the default: "diagonal" with one segment, for the SGD
    family and Adam / AdamW alike (Adam's K_P in the same form), "isotropic" for ``segments``
    > 1,
    ``ntk_tt._options_predict.default_backbone``; "diagonal": the feature kernel's blocks on
    the features' k = 5 leading principal directions, without the blocks between them, at the
    cost of the logit-summed Θ; "isotropic", the cheapest: K_h(i, j) = k_b(i, j)·I_F with k_b
    from the logit-summed Θ; "kronecker": the same with a mixing S from the feature kernel of
    32 inputs; "exact": the (N·F)² feature kernel, small N only; "subspace": the feature kernel
    exact on the features' k = min(16, F) leading principal directions, (N·k)²); ``kernel``
    "exact" and "traced" give the same k_b (only the logit-summed Θ is needed).

    ``subset=N'`` predicts the MSE loss of full-batch GD on all N samples from the
    logit-summed kernel of a class-balanced subset of N' of them (App. D, METHOD.md §7; the
    frozen-kernel linear model; ``ntk_tt.predict_from_subset`` with ``subset_method``
    "power_law" or "nystrom", the subset drawn from ``key``): no N × N kernel is built.
    It needs ``loss="mse"``, full batch (``batch_size`` None or N), ``momentum`` 0 and
    ``method`` "auto" or "closed_form" — or ``optimizer=ntk_tt.sgd(schedule, m, nesterov=)``
    without weight decay (each eigenmode's exact recursion; ``method`` "auto" or "discrete") —
    ``kernel`` "exact" or "traced" (the same here: only the logit-summed kernel is used), no
    sketch, no held-out set and a key. Only the loss curve is predicted: ``error`` is NaN and
    its T_ε undefined, with the reason.

    ``optimizer=ntk_tt.sgd(...)`` / ``ntk_tt.adamw(...)`` (an :class:`ntk_tt.Optimizer`:
    schedule, momentum or Adam, weight decay, batch size) replaces ``learning_rate``,
    ``momentum``, ``nesterov`` and ``batch_size`` (the constant-η SGD shorthand): exact per-step
    recursions for SGD (or with ``method`` "closed_form" / "ode" / "sde": the MSE closed form,
    the ODE and SDE with the schedule η(t)), the fast head-aware Adam predictor for Adam (it
    needs ``head``);
    :func:`ntk_tt.prediction._predict_optimizer.predict_with_optimizer`, METHOD.md §11.

    Source: Zancato et al. 2020 (arXiv 2008.12478), Secs. 3–5 and App. D (METHOD.md §1–§7);
    the head-aware predictor and the optimisers are ntk_tt's own (METHOD.md §10, §11).

    Example:
      >>> pred = ntk_tt.predict(apply_fn, params, x, y, learning_rate=1e-3, steps=150)
      >>> pred.training_time["loss"][0.1]          # T_0.1 in steps (NaN if undefined)
      >>> pred = ntk_tt.predict(..., x_test=xt, y_test=yt,
      ...                       targets={"loss": 0.5, "test_error": 0.1})
      >>> pred.steps_to_target["test_error"][0.1]  # steps to 90 % held-out accuracy

    Args:
      apply_fn, params: the pre-trained model with its new head, ``apply_fn(params, x)`` →
        logits (N, C). x: inputs (N, ...). y: integer labels (N,).
      learning_rate: η > 0. steps: T ≥ 1. batch_size: B ∈ [1, N], None = N (GD).
      momentum: m ∈ [0, 1) (None: 0). nesterov: optax's Nesterov form (None: False).
      optimizer: an :class:`ntk_tt.Optimizer` instead of those four. loss: "cross_entropy" |
        "mse".
      method: "auto" | "closed_form" | "ode" | "sde" | "discrete". kernel: "exact" |
        "traced" | "sketch". sketch_dim: D' for the sketch / SDE noise (None: 256, for
        the SDE noise min(256, D) on a model of D parameters). num_paths: seeds or
        Brownian paths for SGD (unused, whatever its value, by full-batch GD and the
        deterministic ``method`` "ode" / "closed_form", which ``ntk-tt`` refuses it with).
        key: jax.random key (needed for SGD, SDE and sketches); with SGD, seed 0 uses the
        batch order ``ntk_tt.batch_indices(key, N, B, steps)`` of a real run with the same key.
      x_test, y_test: optional held-out set, predicted with the cross kernel Θ(x_test, x).
      predictor: "auto" (head-aware when ``head`` is given, else linear), "linear" (frozen
        Θ at w0, Sec. 3) or "head_aware". head: ``(feature_fn, backbone_params, head_kernel
        (F, C), head_bias (C,))`` from ``ntk_tt.split_head(model)``, with
        ``apply_fn(params, x) = feature_fn(backbone_params, x) @ head_kernel + head_bias``.
        backbone: "kronecker" | "isotropic" | "exact" | "subspace" (head-aware feature
          kernel; ``ntk_tt.head_aware_kernel``; "subspace" not with segments > 1).
        subspace_dim: with ``backbone="subspace"``, its k feature directions (an int ≥ 1;
          None: ``SUBSPACE_DIM`` = 16; measured k = 8 / 16 / 24 in README "Error budget").
        segments: head-aware only: > 1 re-linearises the backbone along the predicted path
          that many times (``ntk_tt.predict_head_aware_refreshed``: one kernel per segment,
          one path; SGD follows the real run's batch order ``key``).
      subset: N' (int in [K, N), a multiple of the K classes in y) to predict from a subset's
        kernel (see above), or None for the full kernel. subset_method: "power_law" (App. D)
        or "nystrom" (cross kernel Θ(X, X')); only with ``subset``.
      targets: absolute targets, {curve: target or [targets]} with curves "loss",
        "test_loss" (a mean loss L* > 0), "error", "test_error" (an error rate in [0, 1];
        held-out accuracy ≥ A is "test_error" ≤ 1 − A); the test curves need ``x_test``.
        Steps to each are in ``steps_to_target`` (first step with the smoothed predicted
        curve ≤ target, :func:`ntk_tt.steps_to_target`; NaN with the reason when undefined).
      head_kernel: head-aware only: the :class:`ntk_tt.HeadAwareKernel` of ``head`` on (x,
        x_test) with ``backbone`` already built (``ntk_tt.head_aware_kernel``; for Adam also an
        ``ntk_tt.adam_head_aware_kernel`` of the same B and ε), reused instead of rebuilt.

    Dtypes: bfloat16 / float16 leaves of ``params``, ``head`` and ``x``, ``x_test`` are cast
    to float32 first, so Θ, f0 and the curves are float32 (float64 with x64 and float64
    params); ``ntk_tt.finetune`` trains in the params' own dtype (README, "Dtypes").

    Returns:
      :class:`Prediction`; ``kernel`` is ``"head_aware:<backbone>"`` for the head-aware
      predictor; a subspace one records its k in ``hyperparameters["subspace_dim"]``.

    Warns:
      UserWarning: ``x`` is uint8, raw image pixels most likely: a pre-trained model expects
        its pre-training normalisation (``ntk_tt.prepare_images``); unnormalised, κ is huge
        and the run is called divergent. Also when the ``optimizer``'s η_t is 0 over the last
        two or more updates (a schedule built for a shorter run: they change nothing).
      LinearRegimeWarning: (a :class:`BeyondEdgeWarning`) an Adam-family ``optimizer`` whose
        schedule lets the backbone's weights move by more than 0.07 of their RMS (ρ = Σ η_t /
        rms(θ_0), in ``hyperparameters["weight_travel"]``): the real run can leave the
        linearised regime (``ntk_tt.dynamics._regime``).
      UserWarning: ``kernel="sketch"`` with D' > D, or D/2 < D' ≤ D with D ≥ N·C (the exact
        kernel is cheaper: :func:`ntk_tt.sketched_ntk`); ``subset`` of fewer than 4 samples
        per class (T_ε scatters between draws: :func:`ntk_tt.predict_from_subset`).

    Raises:
      ValueError: ``optimizer`` with any of learning_rate, momentum, nesterov, batch_size (or
        neither optimizer nor learning_rate), an optimizer schedule whose warmup ends at or
        after ``steps`` (η_t never reaches its peak), bad model output or inputs (x, y, x_test,
        y_test not arrays: nested lists of numbers are converted, anything else refused;
        complex x or x_test; x_test's samples of another shape than x's), ``apply_fn``
        coupling the samples of a batch, η or m not a real number (a string included), a key
        that is not ``jax.random.key(seed)``, labels not matching N or C or (training
        labels, C ≥ 2) of one class only, η ≤ 0, num_paths < 1,
        m ∉ [0, 1) (or 0 with Nesterov), nesterov not True / False / None, B ∉ [1, N],
        steps < 1, unknown method / loss /
        kernel, missing key,
        ``sketch_dim`` without kernel='sketch' or method='sde' (it would be unused), a
        sketch dimension D' above the model's D parameters (kernel='sketch', also at the
        default 256; an explicit one for the SDE noise: it costs more than the exact kernel),
        closed form with cross-entropy or SGD, non-finite Θ, an unknown predictor or backbone,
        a backbone other than "isotropic" for the linear predictor (it would be unused),
        ``subspace_dim`` without ``backbone="subspace"`` or with ``head_kernel`` (built with
        its own k) or not an int ≥ 1, a non-default ``backbone`` other than the given
        ``head_kernel``'s own,
        a head-aware prediction without ``head`` or with a method other than the discrete
        recursion or a sketched kernel, a ``head`` that does not reproduce ``apply_fn``,
        ``subset`` with anything but MSE full-batch GD or a full-batch SGD-family optimizer
        without weight decay (or with a sketch, an SDE/ODE method, a discrete one with the
        keywords, head-aware predictor, held-out set, no key) or a bad N', bad ``targets``
        (unknown curve, not finite, a loss target ≤ 0, an error target outside [0, 1], a
        held-out target without ``x_test``, an error target with ``subset``) — all before
        the kernel is built.
    """
    check_shorthand(optimizer, where="predict", learning_rate=learning_rate, momentum=momentum,
                    nesterov=nesterov, batch_size=batch_size)
    if head is not None and predictor != "linear":  # the linear one refuses it later
        check_default_subspace_dim(subspace_dim, backbone, segments)
    sub_k = None if head is None or predictor == "linear" else check_subspace_dim(
        subspace_dim, default_backbone(segments) if backbone is None else backbone,
        head_kernel)
    check_kernel_backbone(backbone, head_kernel)
    if is_traced((learning_rate, momentum)):
        raise ValueError("predict is eager (it builds the kernel, times its stages and checks "
                         "the values), so learning_rate and momentum cannot be traced (jit / "
                         "vmap / grad): build the kernel once and sweep ntk_tt."
                         "predict_from_kernel or ntk_tt.predict_head_aware under jit(vmap).")
    if optimizer is not None:  # predict is wrapped (timed_prediction): 4 frames to the user
        check_learning_rates(optimizer, steps, warn_stacklevel=4)
    check_loss(loss)
    check_key(key)
    x = as_array(x, "x")
    warn_raw_pixels(x)
    # bfloat16 / float16 params and inputs: Θ and f0 in float32 (README, "Dtypes")
    params, x, head = at_least_float32((params, x, head))
    n, c = check_model(apply_fn, params, x)
    check_loss(loss, c)
    y = check_labels(y, n, c)
    check_num_paths(num_paths)
    targets = check_targets(targets)
    missing = [name for name in targets if name.startswith("test_")] if x_test is None else []
    if missing or (subset is not None and set(targets) - {"loss"}):
        raise ValueError(f"targets on {missing or sorted(set(targets) - {'loss'})} need "
                         + ("x_test and y_test (the held-out curves)" if missing else
                            "curves that subset=N' does not predict (the error and held-out "
                            "curves; it predicts the training loss only)")
                         + "; drop them or pass what they need.")
    if optimizer is not None:
        from ntk_tt.prediction._predict_optimizer import predict_with_optimizer

        return predict_with_optimizer(
            apply_fn, params, x, y, optimizer, shape=(n, c), steps=steps, loss=loss,
            method=method, kernel=kernel, sketch_dim=sketch_dim, num_paths=num_paths, key=key,
            x_test=x_test, y_test=y_test, predictor=predictor, head=head, backbone=backbone,
            segments=segments, subset=subset, subset_method=subset_method, targets=targets,
            head_kernel=head_kernel,  # the linear predictor gets the user's, to refuse it
            subspace_dim=None if subspace_dim is None else subspace_dim if sub_k is None
            else sub_k)
    momentum, nesterov = 0.0 if momentum is None else momentum, flag(nesterov)
    bs = n if batch_size is None else batch_size
    check_hyper(learning_rate, momentum, steps, bs, n,  # subset=: its own Nesterov advice
                nesterov and subset is None)
    if subset is not None:
        pred = predict_subset(apply_fn, params, x, y, subset, subset_method,
                              learning_rate=learning_rate, steps=steps,
                              batch_size=batch_size, momentum=momentum, nesterov=nesterov,
                              loss=loss, method=method, kernel=kernel,
                              sketch_dim=sketch_dim, key=key, x_test=x_test,
                              y_test=y_test, predictor=predictor, segments=segments,
                              head=head)
        return with_targets(pred, targets)
    if subset_method != "power_law":
        raise ValueError(f"subset_method applies with subset=N' only, got subset_method="
                         f"{subset_method!r} and subset=None.")
    method = resolve_method(method)
    if method == "closed_form" and (loss != "mse" or bs < n):
        raise ValueError("method='closed_form' needs loss='mse' and batch_size=None (GD).")
    _check_kinds(kernel, sketch_dim, key, method, bs, n)
    head_aware = _check_predictor(predictor, head, backbone, method, kernel, apply_fn, params,
                                  x)
    if not head_aware:
        check_no_subspace_dim(subspace_dim)
        check_sketch_size(kernel, sketch_dim, params)
    if isinstance(segments, bool) or not isinstance(segments, (int, np.integer)) \
            or not 1 <= segments <= steps or (segments > 1 and not head_aware):
        raise ValueError(
            f"segments must be an int in [1, steps] and > 1 only with the head-aware "
            f"predictor, got {segments!r}.")
    x_test = check_test(apply_fn, params, x_test, y_test, c, x)
    check_head_kernel(head_kernel, head_aware and segments == 1, n, x_test, head, x)
    # the default D' for the SDE noise is capped at the model's D (a larger sketch costs more
    # than the exact J·diag(σ_w) it estimates); kernel="sketch" above D was refused above
    d_sketch = min(DEFAULT_SKETCH_DIM, num_params(params)) if sketch_dim is None else sketch_dim
    # the dynamics use ``key`` itself, so SGD path 0 has the batch order of a real run with
    # the same key (ntk_tt.batch_indices); sketch and noise directions use keys folded from it
    keys = [None] * 3 if key is None else [jax.random.fold_in(key, 1),
                                           jax.random.fold_in(key, 2), key]
    seconds = {"noise": 0.0}
    hyper = {"learning_rate": float(learning_rate), "momentum": float(momentum),
             "nesterov": bool(nesterov), "batch_size": int(bs), "steps": int(steps),
             "num_train": int(n), "num_classes": int(c), "loss": loss}
    if backbone is None:  # the default feature kernel (a given head_kernel's is its own)
        backbone = default_backbone(segments)
    if head_aware and segments > 1:
        from ntk_tt.prediction._head_aware_refresh import predict_head_aware_refreshed

        out = timed_stage(seconds, "solve", predict_head_aware_refreshed, head, x, y,
                     segments=int(segments), learning_rate=learning_rate, momentum=momentum,
                     steps=steps, batch_size=batch_size, nesterov=nesterov, loss=loss,
                     key=key, x_test=x_test, y_test=y_test, backbone=backbone)
        seconds["kernel"] = 0.0  # the kernels are rebuilt inside the solve, one per segment
        return with_targets(_to_prediction(
            out, "discrete", f"head_aware:{backbone}:refresh{segments}", hyper, seconds),
            targets)
    if head_aware:
        from ntk_tt.dynamics._predict_head_aware import predict_head_aware
        from ntk_tt.kernels._head_aware import backbone_kind, head_aware_kernel

        hk = head_kernel if head_kernel is not None else timed_stage(
            seconds, "kernel", head_aware_kernel, head, x, x_test, backbone=backbone, key=keys[0],
            subspace_dim=sub_k)
        out = timed_stage(seconds, "solve", predict_head_aware, hk, y, learning_rate=learning_rate,
                     momentum=momentum, steps=steps, batch_size=batch_size, nesterov=nesterov,
                     loss=loss, key=keys[2], num_paths=num_paths, y_test=y_test)
        if head_kernel is not None:  # the label names the kernel actually used
            backbone = backbone_kind(head_kernel)
        if hk.basis is not None:  # the subspace kernel's k (its intervals match on it)
            hyper["subspace_dim"] = int(hk.basis.shape[1])
        return with_targets(_to_prediction(out, "discrete", f"head_aware:{backbone}", hyper,
                                           seconds), targets)
    k, kt = timed_stage(seconds, "kernel", _kernels, apply_fn, params, x, x_test, kernel, d_sketch,
                   keys[0])
    feats = None
    if method == "sde":
        from ntk_tt.dynamics._noise import noise_features

        feats = timed_stage(seconds, "noise", noise_features, apply_fn, params, x, y, loss=loss,
                       sketch_dim=d_sketch, key=keys[1])
    f0, f0t = timed_stage(seconds, "logits", _logits, apply_fn, params, x, x_test)
    out = timed_stage(
        seconds, "solve", predict_from_kernel, k, f0, y, learning_rate=learning_rate,
        momentum=momentum, steps=steps, batch_size=batch_size, nesterov=nesterov, loss=loss,
        method=method, key=keys[2], noise_features=feats, num_paths=num_paths, kernel_test=kt,
        f0_test=f0t, y_test=y_test)
    hyper |= sketch_sizes(kernel, method, d_sketch)
    return with_targets(_to_prediction(out, method, kernel, hyper, seconds), targets)
