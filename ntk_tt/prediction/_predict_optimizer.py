"""``predict(..., optimizer=...)``: curves and T_ε for any :class:`ntk_tt.Optimizer` (issue 27).

METHOD.md §11. The optimiser describes the whole update rule: the learning-rate schedule η_t,
momentum (heavy ball or Nesterov) or Adam's moments, decoupled or L2 weight decay and the
batch size. The predictor is chosen as in :func:`ntk_tt.predict`:

* rule "sgd", no ``head`` (or ``predictor="linear"``): the frozen-kernel recursion
  :func:`ntk_tt.sgd_trajectory` on the empirical NTK ("exact", "traced" or "sketch"; Θ
  clamped to PSD as ``predict_from_kernel`` does). Exact for the linearised model. With
  ``method`` "closed_form" / "ode" / "sde", those methods with the schedule and decay
  (:mod:`ntk_tt.dynamics._optim_predict`; the SDE's noise features as the constant-η
  ``predict``'s).
* rule "sgd" with ``head``: the head-aware recursion :func:`ntk_tt.head_aware_sgd_trajectory`
  (head exact, backbone linearised). Exact for a backbone linear in its weights.
* rule "adam" with ``head``: the fast Adam predictor (:func:`ntk_tt.adam_head_aware_kernel`,
  :func:`ntk_tt.head_aware_adam_trajectory`): approximate (frozen per-parameter second-moment
  profile rescaled by the gradient norm). Adam has no frozen-kernel form, so without a head
  it is refused (``ntk_tt.linearised_reference`` is the exact, weight-space reference).
* ``subset=N'`` (MSE, the SGD family at full batch without weight decay): the loss curve from
  the subset's predicted spectrum, each eigenmode's exact recursion with η_t and momentum
  (:func:`ntk_tt.predict_from_subset`, METHOD.md §7).

Weight decay needs J·θ0 (``ntk_tt.weight_tangent``: one jvp on the training and one on the
held-out inputs), computed only when λ ≠ 0. SGD (B < N) runs ``num_paths`` batch orders,
path 0 = ``ntk_tt.batch_indices(key, N, B, T)``, the order of ``ntk_tt.finetune`` with the
same optimizer and key; the curves are their mean (5–95 % bands), as the constant-η
predictors. The summary (divergence, outcome, T_ε and reasons) is the one of
``predict_from_kernel`` / ``predict_head_aware``, with κ = η_peak·λ_max(Θ_0)/N from the
schedule's PEAK learning rate over the T steps (its largest step: the one that decides
stability for SGD) and the edge of momentum m. For Adam, κ is the plain-GD number with
η_peak: Adam's step is η/√v̂ per parameter, so κ does not measure Adam's stability; its
``beyond_edge`` is the weight travel ρ = Σ η_t / rms(θ_0) > 1 (``_regime.UNKNOWN_TRAVEL``),
where its outcome is "unknown" unless its curve diverges, and otherwise its call comes from
the predicted curve (not κ ≥ 68, which was measured on constant-η SGD runs).
"""

from __future__ import annotations

from functools import partial

import jax

from ntk_tt._options import _is_int, resolve_method
from ntk_tt._options_predict import check_no_subspace_dim, default_backbone
from ntk_tt.data._model import num_params
from ntk_tt.dynamics._adam_head_aware import (
    AdamKernel,
    _maybe_nonzero,
    adam_head_aware_kernel,
)
from ntk_tt.dynamics._checks import check_adam_kernel, check_head_kernel
from ntk_tt.dynamics._noise import noise_features
from ntk_tt.dynamics._optim_linear import weight_tangent
from ntk_tt.dynamics._optim_predict import check_run, head_aware_prediction, kernel_prediction
from ntk_tt.dynamics._regime import (
    abstain_beyond_travel,
    backbone_rms,
    warn_travel,
    weight_travel,
)
from ntk_tt.kernels._head_aware import backbone_kind, head_aware_kernel
from ntk_tt.prediction._predict import _kernels, _logits, check_test
from ntk_tt.prediction._predict_checks import (
    DEFAULT_SKETCH_DIM,
    _check_kinds,
    _check_predictor,
    check_sketch_size,
    sketch_sizes,
)
from ntk_tt.prediction._predict_subset import predict_subset
from ntk_tt.prediction._result import Prediction, _to_prediction, with_targets
from ntk_tt.training._optimizer_run import optimizer_hyperparameters
from ntk_tt.training._timing import timed_stage


def _check(optimizer, n, steps, method, subset_method, segments, loss) -> int:
    """The options that make sense with an optimiser on the full kernel (ValueErrors before
    any work); returns the batch size B (N for full batch)."""
    if subset_method != "power_law":
        raise ValueError(f"subset_method applies with subset=N' only, got subset_method="
                         f"{subset_method!r} and subset=None.")
    if segments != 1 and optimizer.rule != "sgd":
        raise ValueError(f"segments > 1 re-linearises the SGD-family recursion only, not "
                         f"{optimizer.label}'s moments: use segments=1 (the fast head-aware "
                         "Adam predictor, one linearisation).")
    return check_run(optimizer, n, steps, method, loss=loss)


def predict_with_optimizer(apply_fn, params, x, y, optimizer, *, shape, steps, loss,
                           method, kernel, sketch_dim, num_paths, key, x_test, y_test, predictor,
                           head, backbone, segments, subset, subset_method,
                           targets, head_kernel=None, subspace_dim=None) -> Prediction:
    """:func:`ntk_tt.predict` with ``optimizer=`` (module docstring). Arguments as there,
    already checked up to the labels and ``targets`` ({curve: targets}), ``subspace_dim`` an
    int k or None (``SUBSPACE_DIM``); ``shape``: (N, C) of
    the model's logits. ``seconds`` has the stages "kernel", "logits" (f0 and J·θ0) and
    "solve"; :func:`ntk_tt.predict` adds "setup", "compile" and "total".

    Returns:
      :class:`ntk_tt.Prediction` with ``method`` the one used ("auto": "discrete"),
      ``kernel`` as ``predict``'s (``"head_aware_adam:<backbone>"`` for Adam) and
      ``hyperparameters`` = :func:`ntk_tt.training._optimizer_run.optimizer_hyperparameters`
      plus "steps", "num_train", "loss" and, for Adam, "weight_travel" (ρ = Σ η_t /
      rms(θ_0) of the backbone, :func:`ntk_tt.dynamics._regime.weight_travel`) and, with the
      drifting profile, "reference_mix" (λ_ref of K_P's profile, ``AdamKernel.drift.ref``).

    Warns:
      LinearRegimeWarning: Adam with ρ > ``LINEAR_TRAVEL`` (``ntk_tt.dynamics._regime``).

    With ``subset`` (N'): :func:`ntk_tt.prediction._predict_subset.predict_subset`, the loss
    curve from the subset's spectrum (the SGD family at full batch without weight decay).

    Raises:
      ValueError: before any kernel: ``subset`` with Adam, weight decay, B < N or the other
        options :func:`~ntk_tt.prediction._predict_subset.predict_subset` refuses (with
        their messages), ``subset_method`` without ``subset``, ``segments`` > 1 with Adam or
        without ``head``, Adam with a method other than the discrete recursion,
        "closed_form" without MSE and B = N, a schedule that is never > 0 or whose warmup
        ends at or after ``steps``, B > N, Adam without ``head`` (or with
        ``predictor="linear"``), Adam with L2 weight decay, and the predictor, kernel, key
        and held-out checks of ``predict``.
    """
    n, c = shape
    if subset is not None:
        return with_targets(predict_subset(
            apply_fn, params, x, y, subset, subset_method, learning_rate=None, steps=steps,
            batch_size=None, momentum=0.0, nesterov=False, loss=loss, method=method,
            kernel=kernel, sketch_dim=sketch_dim, key=key, x_test=x_test, y_test=y_test,
            predictor=predictor, segments=segments, optimizer=optimizer, head=head), targets)
    bs = _check(optimizer, n, steps, method, subset_method, segments, loss)
    method = resolve_method(method)
    _check_kinds(kernel, sketch_dim, key, method, bs, n)
    head_aware = _check_predictor(predictor, head, backbone, method, kernel, apply_fn,
                                  params, x)
    if not _is_int(segments) or not 1 <= segments <= steps or (segments > 1 and not head_aware):
        raise ValueError(f"segments must be an int in [1, steps] and > 1 only with the "
                         f"head-aware predictor, got {segments!r}.")
    adam = optimizer.rule == "adam"
    if adam and not head_aware:
        raise ValueError(
            "Adam has no frozen-kernel predictor (its elementwise moments have no "
            "function-space form): pass head=ntk_tt.split_head(model) for the fast head-aware "
            "Adam predictor, or use ntk_tt.linearised_reference(...) (exact, weight space).")
    if not head_aware:  # after Adam's refusal (a second probe was sent to another sketch)
        check_no_subspace_dim(subspace_dim)
        check_sketch_size(kernel, sketch_dim, params)
    if backbone is None:  # the default feature kernel (a given head_kernel's is its own)
        backbone = default_backbone(segments)
    decay = _maybe_nonzero(optimizer.weight_decay)
    if adam and decay and not optimizer.decoupled:
        raise ValueError("the fast Adam predictor needs decoupled weight decay: L2 decay enters "
                         "Adam's elementwise moments, which have no feature-space form; use "
                         "ntk_tt.adamw(...), or ntk_tt.linearised_reference for L2.")
    x_test = check_test(apply_fn, params, x_test, y_test, c, x)
    check_head_kernel(head_kernel, head_aware and segments == 1, n, x_test, head, x)
    if isinstance(head_kernel, AdamKernel):
        if not adam:
            raise ValueError(f"head_kernel is an Adam kernel (adam_head_aware_kernel) and the "
                             f"optimizer is {optimizer.label}: pass its .hk for SGD.")
        check_adam_kernel(head_kernel, optimizer, bs, "head_kernel", loss, y)
    # kernels and the sketch from keys folded from ``key``; the batches from ``key`` itself
    kernel_key = None if key is None else jax.random.fold_in(key, 1)
    seconds = {"noise": 0.0}
    common = dict(steps=steps, loss=loss, key=key, num_paths=num_paths, y_test=y_test)
    basis = None  # a subspace kernel's Z (F, k): its k is recorded (the intervals match on it)
    sizes = {}  # the linear predictor's sketch / noise D' (sketch_sizes)
    if head_aware and segments > 1:
        from ntk_tt.prediction._head_aware_refresh import predict_head_aware_refreshed

        out = timed_stage(seconds, "solve", predict_head_aware_refreshed, head, x, y,
                          segments=int(segments), optimizer=optimizer, steps=steps, loss=loss,
                          key=key, x_test=x_test, y_test=y_test, backbone=backbone)
        seconds["kernel"] = 0.0  # the kernels are rebuilt inside the solve, one per segment
        label = f"head_aware:{backbone}:refresh{segments}"
    elif head_aware:
        feature_fn, bparams = head[0], head[1]
        if head_kernel is not None:  # the kernel decides K_P's form and names the label
            backbone = backbone_kind(getattr(head_kernel, "hk", head_kernel))

        def build():
            if isinstance(head_kernel, AdamKernel):
                return head_kernel
            hk = head_kernel if head_kernel is not None else head_aware_kernel(
                head, x, x_test, backbone=backbone, key=kernel_key, subspace_dim=subspace_dim)
            return (adam_head_aware_kernel(head, x, y, optimizer, x_test, backbone=backbone,
                                           loss=loss, hk=hk, key=kernel_key) if adam else hk)

        kernels = timed_stage(seconds, "kernel", build)
        a_h, a_h_test = timed_stage(seconds, "logits", _tangents, feature_fn, bparams, x,
                                    x_test, decay)
        out = timed_stage(seconds, "solve", head_aware_prediction, kernels, y, optimizer,
                          a_h=a_h, a_h_test=a_h_test, **common)
        label = f"head_aware_adam:{backbone}" if adam else f"head_aware:{backbone}"
        basis = getattr(getattr(kernels, "hk", kernels), "basis", None)  # Adam: its .hk's
    else:
        d_sketch = (min(DEFAULT_SKETCH_DIM, num_params(params)) if sketch_dim is None
                    else sketch_dim)
        k, kt = timed_stage(seconds, "kernel", _kernels, apply_fn, params, x, x_test, kernel,
                            d_sketch, kernel_key)
        feats = None
        if method == "sde":  # as the constant-η predict: directions from fold_in(key, 2)
            feats = timed_stage(seconds, "noise", noise_features, apply_fn, params, x, y,
                                loss=loss, sketch_dim=d_sketch, key=jax.random.fold_in(key, 2))
        (f0, f0t), (a, a_test) = timed_stage(
            seconds, "logits", lambda: (_logits(apply_fn, params, x, x_test),
                                        _tangents(apply_fn, params, x, x_test, decay)))
        out = timed_stage(seconds, "solve", kernel_prediction, k, f0, y, optimizer,
                          kernel_test=kt, f0_test=f0t, a=a, a_test=a_test, method=method,
                          noise_features=feats, **common)
        label = kernel
        sizes = sketch_sizes(kernel, method, d_sketch)
    hyper = optimizer_hyperparameters(optimizer, steps, n) | {
        "steps": int(steps), "num_train": int(n), "num_classes": int(c), "loss": loss}
    hyper |= sizes
    if basis is not None:
        hyper["subspace_dim"] = int(basis.shape[1])
    if adam:
        hyper["weight_travel"] = weight_travel(optimizer.learning_rates(int(steps)), head[1])
        if kernels.drift is not None:  # λ_ref of K_P's second-moment profile
            hyper["reference_mix"] = float(kernels.drift.ref)
        warn_travel(hyper["weight_travel"], stacklevel=5)  # the user's predict call
        # κ does not measure Adam's stability: its edge is the weight travel, where the call
        # abstains (the kernel-level routes' mechanism, _regime)
        out = abstain_beyond_travel(out, optimizer, steps, backbone_rms(head[1]))
    return with_targets(_to_prediction(out, method, label, hyper, seconds), targets)


def _tangents(fn, params, x, x_test, decay):
    """(J·θ0 on x, on x_test or None), or (None, None) without weight decay."""
    if not decay:
        return None, None
    return _tangent(fn, params, x), None if x_test is None else _tangent(fn, params, x_test)


# one compiled jvp per network and input shape (``fn`` is static: the same apply_fn or
# feature_fn object on every call), not one dispatch (and compile) per operation
_tangent = partial(jax.jit, static_argnums=0)(weight_tangent)
