"""``predict_from_kernel(optimizer=)`` and ``predict_head_aware(optimizer=)`` (issue 27).

METHOD.md §10–§11. The same curves and summary as :func:`ntk_tt.predict` with ``optimizer=``
(which calls these), from a kernel already built:

* frozen kernel Θ, rule "sgd": :func:`ntk_tt.sgd_trajectory` on Θ clamped to PSD (as the
  constant-η predictor does). Exact for the linearised model.
* :class:`ntk_tt.HeadAwareKernel`, rule "sgd": :func:`ntk_tt.head_aware_sgd_trajectory`.
  Exact for a backbone linear in its weights.
* :class:`ntk_tt.AdamKernel` (``ntk_tt.adam_head_aware_kernel``), rule "adam":
  :func:`ntk_tt.head_aware_adam_trajectory` (fast, approximate). Adam has no frozen-kernel
  form: ``predict_from_kernel`` refuses it.

* frozen kernel Θ, rule "sgd", ``method`` "closed_form" / "ode" / "sde": the continuous
  methods with the schedule η(t), momentum through η(t)/(1 − m) and the effective weight decay
  λ_2 + (1 − m) λ_d (:mod:`ntk_tt.dynamics._ode`, :mod:`~ntk_tt.dynamics._sde`,
  :func:`ntk_tt.dynamics._closed_form.mse_schedule_closed_form`). A :class:`ntk_tt.Constant`
  schedule without decay is the constant-η shorthand, whose curves it returns. Adam has no
  continuous-time form: refused with these methods.

SGD (B < N) runs ``num_paths`` batch orders, path 0 = ``ntk_tt.batch_indices(key, N, B, T)``
(the order of ``ntk_tt.finetune(optimizer=)`` with the same key); the curves are their mean
with 5–95 % bands. κ = η_peak·λ_max(Θ_0)/N with the schedule's peak η_t over the T steps and
the stability edge of momentum m (for Adam the plain-GD number, which does not measure Adam's
stability: its call comes from the curve alone, not κ ≥ 68).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._options import MAX_STEPS, _is_int, resolve_method
from ntk_tt._schedules import Constant, FromCallable
from ntk_tt.data._batches import path_batch_indices
from ntk_tt.data._inputs import _check_finite, as_array, check_key
from ntk_tt.dynamics._adam_head_aware import (
    AdamKernel,
    _maybe_nonzero,
    head_aware_adam_trajectory,
)
from ntk_tt.dynamics._checks import (
    _check_method_inputs,
    check_adam_kernel,
    check_f0_shape,
    check_gram,
    check_hyper,
    check_labels,
    check_num_paths,
    check_problem,
    check_test_kernel,
    float_logits,
    solve_dtype_fields,
)
from ntk_tt.dynamics._closed_form import mse_schedule_closed_form
from ntk_tt.dynamics._edge_warnings import warn_method_edges
from ntk_tt.dynamics._fspace import clamp_psd
from ntk_tt.dynamics._losses import check_loss
from ntk_tt.dynamics._ode import ode_trajectory
from ntk_tt.dynamics._optim_head_aware import head_aware_sgd_trajectory
from ntk_tt.dynamics._optim_linear import (
    check_learning_rates,
    check_optimizer,
    check_tangent,
    concrete_values,
    decay_needs_tangent,
    is_traced,
    sgd_trajectory,
    valid_hyperparameters,
)
from ntk_tt.dynamics._predict_head_aware import initial_eigenvalues_once
from ntk_tt.dynamics._predict_kernel import (
    KernelPrediction,
    _summarise,
    predict_from_kernel,
)
from ntk_tt.dynamics._sde import sde_paths
from ntk_tt.kernels._head_aware import HeadAwareKernel

_summary = jax.jit(_summarise, static_argnames=("size", "nesterov", "loss", "stochastic",
                                                "frozen", "method", "kappa_rule",
                                                "feature_subspace"))


def check_run(optimizer, n: int, steps, method="discrete", noise_features=None,
              loss=None) -> int:
    """The options that make sense with an optimiser, ValueErrors before any work: ``steps``
    an int in [1, MAX_STEPS], ``method`` the exact per-step recursion ("auto" or "discrete")
    for Adam, any method for SGD ("closed_form": ``loss`` "mse" and B = N; ``noise_features``
    with "sde" only), the schedule (finite, ≥ 0, some η_t > 0, a warmup that ends before the
    run does; a callable that takes real t for the continuous methods), m and B ∈ [1, N].
    Returns B (N for full batch)."""
    if not _is_int(steps) or not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be an int >= 1 and <= {MAX_STEPS:,} (optimiser updates), "
                         f"got {steps!r}.")
    method = resolve_method(method)
    if method != "discrete" and optimizer.rule != "sgd":
        raise ValueError(f"{optimizer.label} has no continuous-time predictor (Adam's "
                         f"elementwise moments have no function-space flow): method={method!r} "
                         "takes the SGD family (ntk_tt.sgd(...)) only; use method='discrete' "
                         "(or 'auto').")
    if noise_features is not None and method != "sde":
        raise ValueError(f"noise_features serve method='sde' only, got method={method!r}; "
                         "drop noise_features.")
    bs = n if optimizer.batch_size is None else optimizer.batch_size
    if method == "closed_form" and ((loss is not None and loss != "mse") or bs < n):
        raise ValueError("method='closed_form' exists for loss='mse' with full-batch GD only "
                         "(optimizer batch_size=None); use method='ode' (cross-entropy) or "
                         "'discrete' / 'sde' (SGD).")
    if is_traced(optimizer):  # values checked in the result (_summarise_paths: INVALID)
        if method != "discrete":
            raise ValueError(f"an optimizer= with traced hyperparameters (jit / vmap / grad) "
                             f"is predicted by method='discrete' (or 'auto'), got "
                             f"method={method!r}; sweep the constant-η keywords "
                             "(learning_rate=, momentum=) for the continuous methods.")
        check_hyper(1.0, optimizer.momentum, steps, bs, n)
        return bs
    peak = check_learning_rates(optimizer, steps)
    if method != "discrete":
        _check_real_time(optimizer.learning_rate, steps)
    check_hyper(peak, optimizer.momentum, steps, bs, n)
    return bs


def _check_real_time(schedule, steps: int) -> None:
    """ValueError unless a callable schedule gives finite η ≥ 0 at real t (half steps over
    [0, T]): the continuous methods evaluate η(t) between the steps. The package's schedule
    classes are defined at real t."""
    if not isinstance(schedule, FromCallable):
        return
    fix = ("the closed form, ODE and SDE evaluate the learning-rate schedule at real t (in "
           "optimiser steps): pass a callable that accepts a float step, or use "
           "method='discrete'")
    try:
        rates = concrete_values(lambda: jax.vmap(schedule)(jnp.arange(2 * steps + 1) / 2.0))
    except (TypeError, IndexError, ValueError) as err:
        raise ValueError(f"{fix} (calling it with t = 0.5 failed: {err}).") from err
    if not np.all(np.isfinite(rates) & (rates >= 0)):
        raise ValueError(f"{fix}; it gives η(t) < 0 or non-finite between the steps.")


def _paths(run, n: int, bs: int, steps: int, num_paths: int, key):
    """Logits (P, T + 1, N, C) and held-out ones (or None) of ``run(batches=...)`` over the
    ``num_paths`` batch orders of ``key`` (one full-batch path when B = N)."""
    if bs == n:
        fs, fts = run()
        return fs[None], None if fts is None else fts[None]
    return jax.vmap(lambda bt: run(batches=bt))(path_batch_indices(key, n, bs, steps,
                                                                   num_paths))


def _summarise_paths(fs, fts, y, y_test, optimizer, steps, lams, size, loss, frozen,
                     method="discrete", feature_subspace=False):
    peak, ok = valid_hyperparameters(optimizer, steps)
    return _summary(fs, fts, y, y_test, size=size, lr=jnp.where(ok, peak, jnp.nan),
                    m=optimizer.momentum,
                    lams=lams, nesterov=optimizer.nesterov, loss=loss,
                    stochastic=fs.shape[0] > 1 or method == "sde", frozen=frozen,
                    method=method, kappa_rule=optimizer.rule != "adam",
                    feature_subspace=feature_subspace)


def kernel_prediction(kernel, f0, y, optimizer, *, steps, loss, method="discrete", key=None,
                      noise_features=None, num_paths=32, kernel_test=None, f0_test=None,
                      y_test=None, a=None, a_test=None) -> KernelPrediction:
    """:func:`ntk_tt.predict_from_kernel` with ``optimizer=`` (module docstring). Arguments as
    there; ``a``, ``a_test``: J·θ0 (N, C), (N_test, C) (``ntk_tt.weight_tangent``), needed
    when the optimiser's weight decay λ ≠ 0. Raises ValueError before any work."""
    if getattr(optimizer, "rule", None) == "adam":
        raise ValueError(
            "Adam has no frozen-kernel predictor (its elementwise moments have no "
            "function-space form): use ntk_tt.predict_head_aware(ntk_tt.adam_head_aware_"
            "kernel(split, x, y, optimizer), y, optimizer=...) or ntk_tt.predict(..., head="
            "split, optimizer=...) with method='discrete' (the closed-form/ODE/SDE methods "
            "take ntk_tt.sgd(...) only); ntk_tt.linearised_reference is the exact reference.")
    check_optimizer(optimizer, ("sgd",), where="predict_from_kernel")
    if (resolve_method(method) != "discrete" and isinstance(optimizer.learning_rate, Constant)
            and a is None and a_test is None and not _maybe_nonzero(optimizer.weight_decay)):
        return predict_from_kernel(  # the constant-η shorthand: the same curves, bit for bit
            kernel, f0, y, learning_rate=optimizer.learning_rate.value,
            momentum=optimizer.momentum, nesterov=optimizer.nesterov,
            batch_size=optimizer.batch_size, steps=steps, loss=loss, method=method, key=key,
            noise_features=noise_features, num_paths=num_paths, kernel_test=kernel_test,
            f0_test=f0_test, y_test=y_test)
    check_loss(loss)
    kernel, f0 = as_array(kernel, "kernel"), as_array(f0, "f0")
    check_key(key)
    check_f0_shape(kernel, f0, y)
    f0 = float_logits(f0, kernel)
    n, c, _, y = check_problem(f0, y, loss, 1.0, 0.0, 1, None)  # f0, loss and labels
    bs = check_run(optimizer, n, steps, method, noise_features, loss)
    method = resolve_method(method)
    check_num_paths(num_paths)
    if method == "sde":
        _check_method_inputs(method, loss, bs == n, key, noise_features, n * c)
    if bs < n and key is None and method != "ode":
        raise ValueError("SGD (batch_size < N) is random: pass key=jax.random.key(seed).")
    _check_finite(kernel, "kernel")
    check_gram(kernel)
    with_decay = decay_needs_tangent(optimizer, a, "a")
    if with_decay and kernel_test is not None and a_test is None:
        raise ValueError("weight decay with a held-out kernel needs a_test (N_test, C) "
                         "(ntk_tt.weight_tangent(apply_fn, params, x_test)).")
    test_mat, test_traced, f0_test, y_test = check_test_kernel(kernel_test, f0_test, y_test,
                                                               n, c, f0.dtype)
    decay = None  # (λ', a, a_test), checked before the kernel's eigenvalues
    if with_decay:
        nt = None if kernel_test is None else f0_test.shape[0]
        decay = (_effective_decay(optimizer, f0.dtype), check_tangent(a, n, c, "a", f0.dtype),
                 None if nt is None else check_tangent(a_test, nt, c, "a_test", f0.dtype))
    mat, (lmin, lmax) = jax.jit(clamp_psd)(jnp.asarray(kernel, f0.dtype))
    traced = mat.shape[0] == n and c > 1  # the logit-summed (N, N) kernel, used as Θ/C
    lams = (lmin / c, lmax / c) if traced else (lmin, lmax)
    if method == "discrete":
        run = partial(sgd_trajectory, mat, f0, y, optimizer, steps=steps, a=a, loss=loss,
                      kernel_test=kernel_test, f0_test=f0_test, a_test=a_test)
        fs, fts = _paths(run, n, bs, steps, num_paths, key)
        return _summarise_paths(fs, fts, y, y_test, optimizer, steps, lams, mat.shape[0], loss,
                                frozen=True)
    test = None if kernel_test is None else (test_mat, f0_test)
    if noise_features is not None:
        noise_features = jnp.asarray(noise_features, f0.dtype)
    fs, fts = _continuous(
        mat / c if traced else mat, f0, y, optimizer.learning_rate,
        jnp.asarray(optimizer.momentum, f0.dtype), decay, key, noise_features, test,
        traced=traced, test_traced=None if test is None else test_traced, method=method,
        steps=steps, batch_size=bs, loss=loss, num_paths=num_paths)
    out = _summarise_paths(fs, fts, y, y_test, optimizer, steps, lams, mat.shape[0], loss,
                           frozen=True, method=method)
    warn_method_edges(out, method, optimizer.momentum, optimizer.nesterov)
    return out


def _effective_decay(optimizer, dtype):
    """λ' = λ_2 + (1 − m) λ_d: the weight decay of the continuous-time limit (METHOD.md §11;
    L2 in the loss goes through the momentum trace, decoupled decay does not)."""
    wd, m = jnp.asarray(optimizer.weight_decay, dtype), jnp.asarray(optimizer.momentum, dtype)
    return (1.0 - m) * wd if optimizer.decoupled else wd


@partial(jax.jit, static_argnames=("traced", "test_traced", "method", "steps", "batch_size",
                                   "loss", "num_paths"))
def _continuous(mat, f0, y, schedule, m, decay, key, noise_features, test, *, traced,
                test_traced, method, steps, batch_size, loss, num_paths):
    """Logits (P, T + 1, N, C) and held-out ones (or None) of the closed form, ODE or SDE with
    a schedule and the effective decay ``decay`` = (λ', a, a_test) or None (validated)."""
    op = (mat, traced)
    test_op, f0_test = (None, None) if test is None else ((test[0], test_traced), test[1])
    common = dict(test_op=test_op, f0_test=f0_test, decay=decay)
    if method == "sde":
        return sde_paths(op, f0, y, noise_features, key=key, num_paths=num_paths,
                         learning_rate=schedule, momentum=m, batch_size=batch_size, steps=steps,
                         loss=loss, **common)
    if method == "ode":
        fs, fts = ode_trajectory(op, f0, y, learning_rate=schedule, momentum=m, steps=steps,
                                 loss=loss, **common)
    else:
        rates = jnp.asarray(schedule.values(steps), f0.dtype) / (1.0 - m)
        fs, fts, _ = mse_schedule_closed_form(op, f0, y, rates=rates, **common)
    return fs[None], None if fts is None else fts[None]


def head_aware_prediction(hk, y, optimizer, *, steps, loss, key=None, num_paths=32,
                          y_test=None, a_h=None, a_h_test=None) -> KernelPrediction:
    """:func:`ntk_tt.predict_head_aware` with ``optimizer=`` (module docstring): ``hk`` a
    :class:`ntk_tt.HeadAwareKernel` for rule "sgd", an :class:`ntk_tt.AdamKernel` of the
    optimiser's B for rule "adam"; ``a_h``, ``a_h_test``: J_h θ_0 (N, F), (N_test, F)
    (``ntk_tt.weight_tangent(feature_fn, backbone_params, x)``), needed when λ ≠ 0. Raises
    ValueError before any work."""
    check_optimizer(optimizer, ("sgd", "adam"), where="predict_head_aware")
    adam = optimizer.rule == "adam"
    kind = AdamKernel if adam else HeadAwareKernel
    if not isinstance(hk, kind):
        raise ValueError(
            f"predict_head_aware with {optimizer.label} needs hk = " + (
                "ntk_tt.adam_head_aware_kernel(split, x, y, optimizer, x_test) (an AdamKernel)"
                if adam else "ntk_tt.head_aware_kernel(split, x, x_test) (a HeadAwareKernel; "
                "of an AdamKernel pass its .hk)") + f", got {type(hk).__name__}.")
    check_loss(loss)
    base, _ = solve_dtype_fields(hk.hk if adam else hk)
    n, c = base.features.shape[0], base.head_kernel.shape[1]
    y = check_labels(y, n, c)
    bs = check_run(optimizer, n, steps)
    if adam:
        check_adam_kernel(hk, optimizer, bs, "hk", loss, y)
        if isinstance(optimizer.eps, jax.core.Tracer):
            raise ValueError("Adam's ε is built into the AdamKernel (P = 1/(√v̄ + ε)) and "
                             "cannot be traced: build one kernel per ε (ntk_tt.adam_head_aware"
                             "_kernel(split, x, y, optimizer)) and sweep the learning rate, "
                             "b1, b2 or weight decay under jit / vmap.")
    check_num_paths(num_paths)
    if bs < n and key is None:
        raise ValueError("SGD (batch_size < N) is random: pass key=jax.random.key(seed).")
    if decay_needs_tangent(optimizer, a_h, "a_h"):
        if base.features_test is not None and a_h_test is None:
            raise ValueError("weight decay with held-out features needs a_h_test (N_test, F) "
                             "(ntk_tt.weight_tangent(feature_fn, backbone_params, x_test)).")
        check_tangent(a_h, n, base.features.shape[1], "a_h")  # shapes and NaN: before work
        if base.features_test is not None:
            check_tangent(a_h_test, *base.features_test.shape, "a_h_test")
    if base.features_test is not None:
        if y_test is None:
            raise ValueError("hk has held-out features: pass y_test (N_test,).")
        y_test = check_labels(y_test, base.features_test.shape[0], c, name="y_test")
    elif y_test is not None:  # a fresh user: y_test was ignored, test_loss None, silently
        raise ValueError("y_test given, but the kernel has no held-out features: build it with "
                         "x_test (head_aware_kernel(split, x, x_test)) or drop y_test.")
    run = partial(head_aware_adam_trajectory if adam else head_aware_sgd_trajectory, hk, y,
                  optimizer, steps=steps, key=key, a_h=a_h, a_h_test=a_h_test, loss=loss)
    fs, fts = _paths(run, n, bs, steps, num_paths, key)
    return _summarise_paths(fs, fts, y, y_test, optimizer, steps,
                            initial_eigenvalues_once(base), n * c, loss, frozen=False,
                            feature_subspace=base.basis is not None)
