"""Frozen-kernel linearised model under any SGD-family :class:`ntk_tt.Optimizer` (issue 27).

METHOD.md §11. For f_lin(θ) = f0 + J(θ − θ0) (J the (N·C) × D Jacobian at θ0, Θ = J Jᵀ),
optax's SGD with momentum m, a schedule η_t and weight decay λ (``Optimizer.to_optax``):

    g̃_t = J_Bᵀ g_B(f_t) + λ_2 θ_t,     u_{t+1} = m u_t + g̃_t,
    d_t = u_{t+1} (heavy ball) or g̃_t + m u_{t+1} (Nesterov),
    θ_{t+1} = θ_t − η_t (d_t + λ_d θ_t)

(λ_2 = λ for L2 in the loss, λ_d = λ for decoupled decay; g_B = ∂L_B/∂f_B of the MEAN loss on
the minibatch B_t) maps exactly to function space: multiply by J and write p_t = J θ_t =
a + (f_t − f0) with a = J θ0 (one ``jax.jvp`` of the network along its own weights,
:func:`weight_tangent`); with h = J u,

    h_{t+1} = m h_t + Θ[:, B] g_B + λ_2 p_t,
    f_{t+1} = f_t − η_t (h_{t+1} + λ_d p_t)                       (heavy ball)
    f_{t+1} = f_t − η_t (Θ[:, B] g_B + λ_2 p_t + m h_{t+1} + λ_d p_t)   (Nesterov).

Held-out logits follow with the cross kernel Θ(x_test, x) and a_test = J(x_test) θ0. No
approximation: the recursion equals optax training of f_lin to rounding. Cost per step
O(N·C·B·C), as :mod:`ntk_tt.dynamics._discrete` (the λ = 0, constant-η case).
Adam is elementwise in weight space and has no such closed form: see
:mod:`ntk_tt.dynamics._adam_head_aware` (fast, approximate) and
:func:`ntk_tt.linearised_reference` (exact, weight space).
"""

from __future__ import annotations

import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._optimizer import Optimizer
from ntk_tt._options import MAX_STEPS, _is_int
from ntk_tt._schedules import FromCallable
from ntk_tt.data._batches import batch_indices
from ntk_tt.data._inputs import _concrete, as_array
from ntk_tt.data._model import check_function, check_model, check_weights
from ntk_tt.dynamics._checks import check_labels, check_warmup, float_logits
from ntk_tt.dynamics._fspace import as_operator, theta_cols_dot, theta_dot
from ntk_tt.dynamics._losses import check_loss, logit_residual


def weight_tangent(fn, params, x) -> jax.Array:
    """J(x)·θ0: the network's tangent along its own weights, one ``jax.jvp``.

    Source: ntk_tt's own (issue 27; METHOD.md §11, "SGD, exact": the a = J θ0 that weight
    decay acts through in function space).

    Args:
      fn: ``fn(params, x) -> out`` (an ``apply_fn``, or a backbone ``feature_fn``).
      params: the weights θ0 (every leaf decays, as optax's ``add_decayed_weights``).
      x: inputs (N, ...).

    Returns:
      ``∂fn(θ, x)/∂θ|θ0 · θ0``, the shape of ``fn(params, x)``: (N, C) for logits (the ``a``
      of :func:`sgd_trajectory`), (N, F) for features (the ``a_h`` of the head-aware
      recursions).

    Raises:
      ValueError: ``fn`` not a function (a flax module: use ``ntk_tt.from_nnx``), ``params``
        not weights (None, a string, a module), ``x`` not an array of numbers; for concrete
        ``x`` and ``params``, :func:`ntk_tt.data._model.check_model`'s refusals (``x`` not a
        batch (N, ...) with N >= 1, non-finite ``x`` or ``params``, ``fn`` failing on ``x``
        or not returning (N, C) / (N, F)), as :func:`ntk_tt.empirical_ntk`.
    """
    check_function(fn, "fn", "fn(params, x) -> logits or features")
    check_weights(params)
    x = as_array(x, "x")
    if not is_traced((params, x)):  # under jit / vmap only the jvp's own shape errors
        check_model(fn, params, x)
    return jax.jvp(lambda p: fn(p, x), (params,), (params,))[1]


def check_optimizer(optimizer, rules=("sgd",), *, where: str) -> None:
    """ValueError unless ``optimizer`` is an :class:`ntk_tt.Optimizer` of one of ``rules``."""
    if not isinstance(optimizer, Optimizer):
        raise ValueError(f"optimizer must be an ntk_tt.Optimizer (ntk_tt.sgd(...), "
                         f"ntk_tt.adamw(...)), got {type(optimizer).__name__}.")
    if optimizer.rule not in rules:
        raise ValueError(
            f"{where} handles the {'/'.join(rules)} rule, got {optimizer.label}; "
            + ("for Adam use ntk_tt.head_aware_adam_trajectory (fast) or "
               "ntk_tt.linearised_reference (exact)." if optimizer.rule == "adam" else
               "for SGD use ntk_tt.sgd_trajectory or ntk_tt.head_aware_sgd_trajectory."))


SHORTHAND = ("learning_rate", "momentum", "nesterov", "batch_size")


def check_shorthand(optimizer, *, where: str, **shorthand) -> None:
    """One ValueError, before any work, for ``optimizer`` given together with any of the
    constant-SGD keywords (``SHORTHAND``, passed by name; None = not given), for an
    ``optimizer`` that is not an :class:`ntk_tt.Optimizer`, or for neither."""
    given = sorted(name for name, value in shorthand.items() if value is not None)
    if optimizer is None:
        if shorthand.get("learning_rate") is None:
            raise ValueError(f"{where} needs the update rule: learning_rate=η (constant-η SGD, "
                             "with momentum, nesterov, batch_size) or optimizer=ntk_tt.sgd(...)"
                             " / ntk_tt.adamw(...).")
        return
    if given:
        raise ValueError(
            f"{where}: optimizer= describes the whole update rule (learning rate and schedule, "
            f"momentum, Nesterov, batch size); drop {', '.join(given)} or put them into the "
            "optimizer, e.g. ntk_tt.sgd(ntk_tt.warmup_cosine(...), 0.9, batch_size=32).")
    check_optimizer(optimizer, ("sgd", "adam"), where=where)


def check_learning_rates(optimizer: Optimizer, steps: int,
                         warn_stacklevel: int | None = None) -> float:
    """The largest η_t over ``steps`` updates, after one ValueError (before any work) when some
    η_t is not finite or < 0 (a user's callable schedule, or ``init``/``end`` < 0) or none is
    > 0, or when a warmup ends at or after the run's end (:func:`ntk_tt.dynamics._checks.
    check_warmup`): :func:`ntk_tt.predict`, :func:`ntk_tt.finetune` and the other callers
    refuse such a schedule; a ValueError too for an optimizer with traced leaves (this check,
    and the callers' peak, need concrete values). Returns None, checking nothing, for
    ``steps`` that is not an int in [1, MAX_STEPS] (the callers' own step check says what is
    wrong with it). With ``warn_stacklevel`` (the public entry points, ``ntk_tt.predict`` and
    ``ntk_tt.finetune``: frames from here to the user's call) a UserWarning when η_t = 0 over
    the last two or more updates, which then change nothing: most likely a schedule built for
    a shorter run (``warmup_cosine(peak, w, 10)`` run for 30 steps holds its end value 0 over
    the last 20)."""
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or not (
            1 <= steps <= MAX_STEPS):
        return None
    if is_traced(optimizer):
        raise ValueError("an optimizer= with traced hyperparameters (inside jit / vmap / grad) "
                         "cannot be checked or predicted by this function: sweep it with "
                         "ntk_tt.predict_from_kernel / ntk_tt.predict_head_aware(optimizer=...)"
                         " on one kernel under jit(vmap), or with "
                         "ntk_tt.divergence_boundary(optimizer=...) / ntk_tt.sensitivities.")
    check_warmup(optimizer.learning_rate, int(steps))
    rates = concrete_values(lambda: optimizer.learning_rates(int(steps)))
    bad = ~np.isfinite(rates) | (rates < 0)
    if bad.any():
        t = int(np.argmax(bad))
        past_end = (" (per-step values indexed with mode='fill' give NaN past their end: "
                    f"then give at least {steps} values, or fewer steps)"
                    ) if np.isnan(rates[t]) else ""
        raise ValueError(f"the optimizer's learning rate must be finite and >= 0 at every step, "
                         f"got η_{t} = {rates[t]}{past_end}; fix the schedule.")
    if not rates.max() > 0:
        raise ValueError(f"the optimizer's learning rate is 0 at all {steps} steps; give a "
                         "schedule with a peak > 0.")
    idle = steps - 1 - int(np.flatnonzero(rates > 0)[-1])  # trailing updates at η = 0
    if warn_stacklevel is not None and idle >= 2:
        warnings.warn(f"the learning rate is 0 from step {steps - idle} on: the last {idle} of "
                      f"the {steps} updates change nothing (a schedule built for "
                      f"{steps - idle} steps? give its decay steps = steps = {steps}).",
                      UserWarning, stacklevel=warn_stacklevel)
    return float(rates.max())


def concrete_values(compute) -> np.ndarray:
    """``compute()`` (a concrete schedule's η_t) as float64 NumPy values for the eager checks.
    Inside an outer ``jit`` (over the kernel, say) the schedule's own nested jit returns
    tracers: only then is it recomputed under ``jax.ensure_compile_time_eval`` (elsewhere that
    would evaluate nested programs eagerly inside the predictors' traces)."""
    out = compute()
    if isinstance(out, jax.core.Tracer):
        with jax.ensure_compile_time_eval():
            out = compute()
    return np.asarray(out, np.float64)


def is_traced(tree) -> bool:
    """Whether any leaf of ``tree`` (an :class:`ntk_tt.Optimizer`) is a tracer (inside
    ``jit`` / ``vmap`` / ``grad``), so that its values cannot be checked eagerly; for an
    Optimizer also whether its callable schedule closes over a tracer (its leaves are concrete
    but its η_t are not: a fresh user's ``vmap`` over per-step arrays met a raw
    TracerArrayConversionError in the eager checks)."""
    if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(tree)):
        return True
    if not isinstance(tree, Optimizer) or not isinstance(tree.learning_rate, FromCallable):
        return False
    try:  # η_0 as concrete_values computes it; a failing schedule is the eager checks' to say
        with jax.ensure_compile_time_eval():
            return isinstance(tree.learning_rates(1), jax.core.Tracer)
    except Exception:
        return False


def valid_hyperparameters(optimizer: Optimizer, steps: int) -> tuple[jax.Array, jax.Array]:
    """``(peak, ok)``: the largest η_t over ``steps`` updates and whether every value the eager
    checks would refuse is fine: η_t finite and ≥ 0 at every step, the schedule's own values
    (:meth:`ntk_tt._schedules.Schedule.valid`), β₂ ∈ [0, 1), ε > 0 and λ ≥ 0 finite
    (m ∈ [0, 1) and peak > 0 are checked by the summary). Traceable: a traced
    optimizer escapes :func:`check_learning_rates`, and its predictions are NaN with code
    INVALID where ``ok`` is False."""
    rates = jnp.asarray(optimizer.learning_rates(int(steps)))
    wd = optimizer.weight_decay
    ok = (jnp.all(jnp.isfinite(rates) & (rates >= 0)) & (optimizer.b2 >= 0)
          & (optimizer.b2 < 1) & (optimizer.eps > 0) & jnp.isfinite(optimizer.eps)
          & (wd >= 0) & jnp.isfinite(wd))
    return jnp.max(rates), ok & optimizer.learning_rate.valid(int(steps))


def decay_needs_tangent(optimizer: Optimizer, tangent, name: str) -> bool:
    """Whether the weight-decay terms run (``tangent`` given). A missing tangent is refused
    unless λ is concretely 0 (a traced λ could be anything)."""
    if tangent is not None:
        return True
    wd = optimizer.weight_decay
    if isinstance(wd, jax.core.Tracer):
        raise ValueError(
            f"weight decay acts on J·θ0, and this optimizer's weight_decay is traced (an "
            f"optimizer passed into jit / vmap as an argument), so it cannot be known to be "
            f"0: pass {name} (ntk_tt.weight_tangent(fn, params, x), one jvp), or build the "
            "optimizer inside the traced function with weight_decay=0.")
    if np.ndim(wd) != 0 or float(wd) != 0.0:
        raise ValueError(
            f"weight decay acts on J·θ0: pass {name} (ntk_tt.weight_tangent(fn, params, x), "
            "one jvp), or use weight_decay=0.")
    return False


def check_tangent(tangent, rows: int, cols: int, name: str, dtype=None):
    """``tangent`` as an array of shape (rows, cols) (in ``dtype``); ValueError naming it
    otherwise, or when a concrete ``tangent`` holds NaN or inf (a traced one is not checked)."""
    if tangent is None:
        return None
    if np.shape(tangent) != (rows, cols):
        raise ValueError(f"{name} must have shape ({rows}, {cols}) (J·θ0 on the same inputs), "
                         f"got {np.shape(tangent)}.")
    tc = _concrete(tangent)
    if tc is not None and not np.isfinite(tc.astype(np.float64)).all():
        raise ValueError(
            f"{name} contains NaN or inf; recompute it with ntk_tt.weight_tangent(fn, params, "
            "x) from finite weights and inputs (a NaN there makes the weight-decay terms, and "
            "every predicted curve, NaN).")
    return jnp.asarray(tangent, dtype)


def resolve_batches(optimizer: Optimizer, n: int, steps: int, key, batches) -> jax.Array:
    """The (T, B) minibatch sequence: ``batches`` if given, else
    ``ntk_tt.batch_indices(key, N, optimizer.batch_size or N, steps)`` (a real run's order)."""
    b = n if optimizer.batch_size is None else optimizer.batch_size
    if not _is_int(steps) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}.")
    if batches is None:
        return batch_indices(key, n, b, steps)
    if np.shape(batches) != (steps, b):
        raise ValueError(f"batches must have shape (steps, B) = ({steps}, {b}), got "
                         f"{np.shape(batches)}.")
    return jnp.asarray(batches, jnp.int32)


def sgd_coefficients(optimizer: Optimizer, dtype) -> tuple:
    """(m, λ_2, λ_d): the momentum, the L2 decay in the gradient and the decoupled decay of an
    SGD-family optimiser, in ``dtype`` (one of the decays is 0)."""
    m = jnp.asarray(optimizer.momentum, dtype)
    wd = jnp.asarray(optimizer.weight_decay, dtype)
    return (m, *((0.0, wd) if optimizer.decoupled else (wd, 0.0)))


def sgd_update(x, u, d, p, lr, m, lam_2, lam_d, nesterov: bool):
    """One ``optax`` SGD step of a block ``x`` with velocity ``u`` (heavy ball, or Nesterov in
    optax's form): ``d`` its loss gradient (or that gradient's image in function space), ``p``
    the decayed quantity (λ_2 in the gradient, λ_d decoupled) or None without decay.
    Returns (x', u')."""
    grad = d if p is None else d + lam_2 * p
    u = m * u + grad
    direction = grad + m * u if nesterov else u
    if p is not None:
        direction = direction + lam_d * p
    return x - lr * direction, u


def sgd_trajectory(kernel, f0, y, optimizer: Optimizer, *, steps: int, key=None, a=None,
                   loss: str = "cross_entropy", kernel_test=None, f0_test=None, a_test=None,
                   batches=None):
    """Logits of the frozen-kernel linearised model trained by an SGD-family optimiser.

    Exact (module docstring): per-step η_t from the schedule, heavy-ball or Nesterov
    momentum, minibatches, decoupled or L2 weight decay. Pure and jittable; ``vmap`` acts
    over the optimiser's array leaves (e.g. ``jax.vmap(lambda lr: sgd_trajectory(...,
    ntk_tt.sgd(lr, 0.9), steps=T)[0])``) and ``jax.grad`` reaches the schedule's peak and
    warmup.

    Source: ntk_tt's own (issue 27; METHOD.md §11, "SGD, exact"), extending the exact discrete
    recursions of METHOD.md §2 (whose continuous limit is Zancato et al. 2020's eq. (1)).

    Args:
      kernel: Θ (N·C, N·C) sample-major, or (N, N) logit-summed (used as (Θ/C) ⊗ I_C).
      f0: logits at θ0 (N, C). y: integer labels (N,).
      optimizer: ``ntk_tt.sgd(...)`` (rule "sgd"). steps: T updates (static).
      key: ``jax.random`` key for the minibatch order (B < N), as ``ntk_tt.finetune``.
      a: J·θ0 (N, C) (:func:`weight_tangent`); needed when weight_decay ≠ 0.
      loss: "cross_entropy" or "mse" (mean over samples).
      kernel_test, f0_test, a_test: held-out cross kernel (N_t·C, N·C) or (N_t, N), logits
        (N_t, C) and tangent (N_t, C) (a_test when weight decay acts).
      batches: (T, B) int indices instead of the key's sequence (e.g. other SGD paths).

    Returns:
      ``(fs, fs_test)``: logits after 0..T updates (T + 1, N, C) and held-out (T + 1, N_t, C)
      or None. Time is in optimiser steps.

    Raises:
      ValueError: an optimiser that is not SGD-family, shapes that do not match, weight decay
        without ``a`` (or ``a_test`` with a test kernel), a concrete ``a`` / ``a_test`` with
        NaN or inf, SGD without a key, bad labels.
    """
    check_optimizer(optimizer, where="sgd_trajectory")
    check_loss(loss)
    if np.ndim(f0) != 2:
        raise ValueError(f"f0 must be logits (N, C), got shape {np.shape(f0)}.")
    n, c = np.shape(f0)
    check_loss(loss, c)
    y = check_labels(y, n, c)
    f0 = float_logits(jnp.asarray(f0), kernel)  # the dtype of the solve (README, "Dtypes")
    dtype = f0.dtype
    op = as_operator(jnp.asarray(kernel, dtype), n, c, name="kernel")
    with_decay = decay_needs_tangent(optimizer, a, "a")
    a = check_tangent(a, n, c, "a", dtype)
    test, test_traced = None, None
    if kernel_test is not None:
        if f0_test is None:
            raise ValueError("kernel_test needs f0_test (N_test, C).")
        nt = np.shape(f0_test)[0]
        if with_decay and a_test is None:
            raise ValueError("weight decay with a held-out kernel needs a_test (N_test, C).")
        tmat, test_traced = as_operator(jnp.asarray(kernel_test, dtype), n, c,
                                        name="kernel_test", rows=nt)
        test = (tmat, jnp.asarray(f0_test, dtype), check_tangent(a_test, nt, c, "a_test", dtype))
    batches = resolve_batches(optimizer, n, steps, key, batches)
    return _sgd_core(op[0], f0, y, optimizer, batches, a, test, traced=op[1],
                     test_traced=test_traced, loss=loss)


@partial(jax.jit, static_argnames=("traced", "test_traced", "loss"))
def _sgd_core(mat, f0, y, optimizer, batches, a, test, *, traced, test_traced, loss):
    steps, b = batches.shape
    n = f0.shape[0]
    dtype = f0.dtype
    lrs = optimizer.learning_rates(steps).astype(dtype)
    m, lam_2, lam_d = sgd_coefficients(optimizer, dtype)
    nesterov = optimizer.nesterov
    with_test = test is not None
    if with_test:
        tmat, ft0, at = test
        tmat_t = tmat.T  # Θ(x_test, x)ᵀ: row gathers of the batch

    def move(f, h, d, f_start, tangent, lr):
        """One function-space SGD update of logits ``f`` with velocity image ``h``, given the
        kernel-gradient product ``d``; ``tangent`` = J·θ0 or None (no decay)."""
        p = None if tangent is None else tangent + (f - f_start)  # J θ_t
        return sgd_update(f, h, d, p, lr, m, lam_2, lam_d, nesterov)

    def step(carry, inputs):
        f, h, ft, ht = carry
        idx, lr = inputs
        if b == n:
            g = logit_residual(f, y, loss) / n
            d = theta_dot(mat, traced, g)
            dt = theta_dot(tmat, test_traced, g) if with_test else None
        else:
            g = logit_residual(f[idx], y[idx], loss) / b
            d = theta_cols_dot(mat, traced, idx, g)
            dt = theta_cols_dot(tmat_t, test_traced, idx, g) if with_test else None
        f, h = move(f, h, d, f0, a, lr)
        if with_test:
            ft, ht = move(ft, ht, dt, ft0, at, lr)
        return (f, h, ft, ht), (f, ft)

    ft_init = ft0 if with_test else None
    init = (f0, jnp.zeros_like(f0), ft_init,
            jnp.zeros_like(ft0) if with_test else None)
    _, (fs, fts) = jax.lax.scan(step, init, (batches, lrs))
    fs = jnp.concatenate([f0[None], fs])
    fts = jnp.concatenate([ft0[None], fts]) if with_test else None
    return fs, fts
