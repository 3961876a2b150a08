"""Head-aware model under any SGD-family :class:`ntk_tt.Optimizer`: schedules, weight decay.

METHOD.md §10–§11. The model f = (h_0 + φ) W + b, φ = J_h (θ − θ_0), of
:mod:`ntk_tt.dynamics._predict_head_aware`, trained by ``Optimizer.to_optax()`` with rule
"sgd": step t uses η_t of the schedule, heavy-ball or Nesterov momentum m on each of W, b, θ,
and weight decay λ on all three (optax's ``add_decayed_weights`` decays every parameter).
With g = ∂L_B/∂f (B, C) on the minibatch and q = g Wᵀ,

    grad_W = h_Bᵀ g + λ_2 W,   grad_b = Σ_B g + λ_2 b,
    J_h grad_θ = Σ_{j∈B} K_h(·, j) q_j + λ_2 J_h θ_t,    J_h θ_t = a_h + φ_t,

with a_h = J_h θ_0 (N, F) one ``jax.jvp`` of the backbone along its own weights
(:func:`ntk_tt.dynamics._optim_linear.weight_tangent`). The head is decayed exactly
(W ← W − η_t(d_W + λ_d W)); the backbone's decoupled decay in feature space is
φ ← φ − η_t (J_h d_θ + λ_d (a_h + φ)), and L2 (λ_2) enters the momentum through the
gradient. Exact for a backbone linear in its weights (then f is the network itself) and
equal to optax training of the head-aware model for any backbone (tests). Held-out
features follow with the cross kernel and a_h on the held-out inputs. Cost per step as
:func:`ntk_tt.predict_head_aware` plus O(N·F) for the decay.

With decay the backbone's displacement is c·θ_k − J_hᵀz (a scalar c), which
:func:`ntk_tt.predict_head_aware_refreshed` carries across its re-linearisations.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._optimizer import Optimizer
from ntk_tt.dynamics._checks import check_labels, solve_dtype_fields
from ntk_tt.dynamics._losses import check_loss, logit_residual
from ntk_tt.dynamics._optim_linear import (
    check_optimizer,
    check_tangent,
    decay_needs_tangent,
    resolve_batches,
    sgd_coefficients,
    sgd_update,
)
from ntk_tt.dynamics._predict_head_aware import _backbone_step
from ntk_tt.kernels._diagonal import solve_form
from ntk_tt.kernels._head_aware import HeadAwareKernel, check_head_aware


class SgdHeadState(NamedTuple):
    """Head W (F, C), b (C,), features' displacement φ (N, F) and their optax velocities
    (u_W, u_b; v_φ = J_h u_θ); φ_test, v_φ_test (N_test, F) or None."""

    w: jax.Array
    b: jax.Array
    phi: jax.Array
    uw: jax.Array
    ub: jax.Array
    vphi: jax.Array
    phit: jax.Array | None
    vphit: jax.Array | None


def validate_head(hk, y, optimizer, *, rules, where, loss, a_h, a_h_test):
    """Shared checks of the head-aware optimiser recursions (ValueErrors before any work).
    Returns ``(hk, y, a_h, a_h_test, with_decay)`` with every array in the solve's dtype."""
    if not isinstance(hk, HeadAwareKernel):
        raise ValueError(f"hk must be a HeadAwareKernel (ntk_tt.head_aware_kernel(split, x)), "
                         f"got {type(hk).__name__}.")
    check_optimizer(optimizer, rules, where=where)
    check_loss(loss)
    n, f = np.shape(hk.features)
    c = np.shape(hk.head_bias)[0] if np.ndim(hk.head_bias) == 1 else 0
    check_loss(loss, c)
    check_head_aware(hk, n, c)
    y = check_labels(y, n, c)
    hk, dtype = solve_dtype_fields(hk)
    with_decay = decay_needs_tangent(optimizer, a_h, "a_h")
    a_h = check_tangent(a_h, n, f, "a_h", dtype)
    if hk.features_test is not None and with_decay:
        if a_h_test is None:
            raise ValueError("weight decay with held-out features needs a_h_test (N_test, F) "
                             "(weight_tangent(feature_fn, backbone_params, x_test)).")
        a_h_test = check_tangent(a_h_test, hk.features_test.shape[0], f, "a_h_test", dtype)
    else:
        a_h_test = None
    return hk, y, a_h, a_h_test, with_decay


def decay_in_span(hk: HeadAwareKernel, a_h, a_h_test):
    """(a_h, a_h_test) as the recursions use them: a subspace / diagonal kernel's features
    move in span(Z) only, so does the decay's J_h θ_0 (projected on Z Zᵀ); unchanged
    without a basis. Every caller of the recursion cores gets it (``predict``, ``suggest``,
    ``sensitivities``, ``divergence_boundary``)."""
    if hk.basis is None:
        return a_h, a_h_test
    return tuple(None if a is None else a @ hk.basis @ hk.basis.T for a in (a_h, a_h_test))


def head_aware_sgd_trajectory(hk: HeadAwareKernel, y, optimizer: Optimizer, *, steps: int,
                              key=None, a_h=None, a_h_test=None, loss: str = "cross_entropy",
                              batches=None):
    """Logits of the head-aware model trained by an SGD-family optimiser (module docstring).

    Pure and jittable; ``vmap`` over the optimiser's array leaves and ``jax.grad`` with
    respect to a schedule's peak and warmup work (the kernel is shared).

    Source: ntk_tt's own (issues 9 and 27; METHOD.md §10, §11 "SGD, exact"): the head-aware
    model of §10 under the exact SGD-family recursion of §11.

    Args:
      hk: :class:`ntk_tt.HeadAwareKernel` (isotropic, Kronecker, exact or subspace feature kernel).
      y: labels (N,). optimizer: ``ntk_tt.sgd(...)``. steps: T updates (static).
      key: minibatch order (B < N), the order of ``ntk_tt.finetune`` with the same key.
      a_h, a_h_test: J_h θ_0 on the training inputs (N, F) and on the held-out ones (N_test, F)
        (when ``hk`` has them): needed when weight_decay ≠ 0 (``weight_tangent(feature_fn,
        backbone_params, x)``).
      loss: "cross_entropy" or "mse". batches: (T, B) indices instead of the key's.

    Returns:
      ``(fs, fs_test)``: logits after 0..T updates (T + 1, N, C) and held-out logits
      (T + 1, N_test, C) or None.

    Raises:
      ValueError: not an SGD-family optimiser, shapes of ``hk`` not matching, weight decay
        without ``a_h`` (or ``a_h_test``), SGD without a key, bad labels or loss.
    """
    hk, y, a_h, a_h_test, _ = validate_head(hk, y, optimizer, rules=("sgd",),
                                            where="head_aware_sgd_trajectory", loss=loss,
                                            a_h=a_h, a_h_test=a_h_test)
    batches = resolve_batches(optimizer, hk.features.shape[0], steps, key, batches)
    return _head_sgd_core(solve_form(hk), y, optimizer, batches, a_h, a_h_test, loss=loss)


def head_sgd_step(state: SgdHeadState, idx, lr, hk: HeadAwareKernel, y, optimizer, a_h,
                  a_h_test, *, loss) -> SgdHeadState:
    """One ``optimizer.to_optax()`` step (rule "sgd", learning rate ``lr``) of the head-aware
    model on the minibatch ``idx`` (B,); ``a_h`` None: no weight decay."""
    dtype = state.w.dtype
    m, lam_2, lam_d = sgd_coefficients(optimizer, dtype)
    n = hk.features.shape[0]
    hb = (hk.features + state.phi)[idx]
    g = logit_residual(hb @ state.w + state.b, y[idx], loss) / idx.shape[0]  # (B, C)
    q = g @ state.w.T  # (B, F): ∂L/∂h on the batch

    def move(x, u, d, p):
        """optax SGD on one parameter block: ``d`` its loss gradient (image), ``p`` the
        decayed quantity (the block, or J_h θ_t for φ), None without decay."""
        return sgd_update(x, u, d, p, lr, m, lam_2, lam_d, optimizer.nesterov)

    decay = a_h is not None
    w, uw = move(state.w, state.uw, hb.T @ g, state.w if decay else None)
    b, ub = move(state.b, state.ub, jnp.sum(g, axis=0), state.b if decay else None)
    dphi = _backbone_step(hk.backbone, hk.mixing, idx, g, state.w, q, n, hk.basis)
    phi, vphi = move(state.phi, state.vphi, dphi, a_h + state.phi if decay else None)
    phit, vphit = state.phit, state.vphit
    if phit is not None:
        dphit = _backbone_step(hk.backbone_test, hk.mixing, idx, g, state.w, q, phit.shape[0],
                               hk.basis)
        phit, vphit = move(phit, vphit, dphit, a_h_test + phit if decay else None)
    return SgdHeadState(w, b, phi, uw, ub, vphi, phit, vphit)


def head_logits(hk: HeadAwareKernel, w, b, phi, phit):
    """Training logits (N, C) and held-out ones (N_test, C) or None."""
    test = None if phit is None else (hk.features_test + phit) @ w + b
    return (hk.features + phi) @ w + b, test


@partial(jax.jit, static_argnames="loss")
def _head_sgd_core(hk, y, optimizer, batches, a_h, a_h_test, *, loss):
    a_h, a_h_test = decay_in_span(hk, a_h, a_h_test)
    lrs = optimizer.learning_rates(batches.shape[0]).astype(hk.features.dtype)
    zf = jnp.zeros_like(hk.features)
    zt = None if hk.features_test is None else jnp.zeros_like(hk.features_test)
    w, b = hk.head_kernel, hk.head_bias
    state0 = SgdHeadState(w, b, zf, jnp.zeros_like(w), jnp.zeros_like(b), zf, zt, zt)

    def step(state, inputs):
        idx, lr = inputs
        state = head_sgd_step(state, idx, lr, hk, y, optimizer, a_h, a_h_test, loss=loss)
        return state, head_logits(hk, state.w, state.b, state.phi, state.phit)

    _, (fs, fts) = jax.lax.scan(step, state0, (batches, lrs))
    f0, ft0 = head_logits(hk, w, b, zf, zt)
    fs = jnp.concatenate([f0[None], fs])
    fts = None if ft0 is None else jnp.concatenate([ft0[None], fts])
    return fs, fts
