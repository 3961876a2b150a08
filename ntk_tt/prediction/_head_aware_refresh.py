"""Evolving kernel without jumps: the head-aware model re-linearised along its own path.

METHOD.md §10. The horizon is cut into segments; at each boundary the backbone weights move by
the head-aware model's own update (one vjp), the feature kernel is rebuilt there, and the
prediction continues from its own features, head and velocities. With an SGD-family
:class:`ntk_tt.Optimizer` (METHOD.md §11) each segment continues the schedule at its global
step, and the backbone weights and velocity are tracked as

    θ_t = c_t θ_k − J_hᵀ z_t,     u_t = α_t θ_k + J_hᵀ u_q,t

(θ_k the segment's linearisation point, J_h = J_h(θ_k); c ≠ 1 only with weight decay, α ≠ 0
only with L2 decay): the re-linearisation point is θ_s = c θ_k − J_hᵀ z (one vjp), the decay's
image there a_h = J_h(θ_s) θ_s (one jvp), and the velocity, (α/c) θ_s + J_hᵀ(u_q + (α/c) z),
is carried as the constant-η path carries J_hᵀ u_q: seen through the new kernel.

Once the prediction has diverged by the project's rule (``ntk_tt.dynamics._divergence``: its
loss curve so far spiked above ``SPIKE_FACTOR``·L_0 or became non-finite, so its outcome is
"diverges" whatever follows) or a state or the next point θ_s is non-finite, no kernel is
built there: the remaining segments continue in the last kernel, as one segment would, and the
curves are held from their first non-finite step on like every predictor's.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt.data._batches import batch_indices
from ntk_tt.dynamics._adam_head_aware import _maybe_nonzero
from ntk_tt.dynamics._checks import check_labels, flag
from ntk_tt.dynamics._divergence import divergence
from ntk_tt.dynamics._fspace import curves
from ntk_tt.dynamics._losses import check_loss, logit_residual
from ntk_tt.dynamics._optim_head_aware import (
    SgdHeadState,
    head_logits,
    head_sgd_step,
    validate_head,
)
from ntk_tt.dynamics._optim_linear import check_shorthand, resolve_batches, sgd_coefficients
from ntk_tt.dynamics._optim_predict import _summarise_paths, check_run, head_aware_prediction
from ntk_tt.dynamics._predict_head_aware import (
    _feature_kernel_dot,
    head_aware_trajectory,
    initial_eigenvalues,
    initial_state,
    predict_head_aware,
    validate,
)
from ntk_tt.dynamics._predict_kernel import _summarise
from ntk_tt.kernels._head_aware import head_aware_kernel
from ntk_tt.prediction._predict_optimizer import _tangents

WHERE = "predict_head_aware_refreshed"


def predict_head_aware_refreshed(split, x, y, *, segments, learning_rate=None, momentum=None,
                                 steps, batch_size=None, nesterov=None, loss="cross_entropy",
                                 key=None, x_test=None, y_test=None, backbone="isotropic",
                                 mixing_samples=32, optimizer=None):
    """Head-aware prediction with the backbone re-linearised along the PREDICTED path.

    The evolving-kernel predictor (issue 9): the horizon is cut into ``segments`` equal
    pieces; each runs :func:`head_aware_step` on a feature kernel built at the backbone
    weights the prediction itself has reached, θ_{k+1} = θ_k − J_h(θ_k)ᵀ z (one vjp; z
    accumulates η·(optax update direction) in sample-feature space, so this is the weight
    update of the head-aware model exactly), with the head (W, b) carried. No jumps: the
    predicted features stay continuous (the new segment starts from h_0 + φ, not from the
    network's h(θ_{k+1})), velocities are carried (the backbone's through the new kernel), so
    only the kernel is refreshed. ``segments=1`` is :func:`predict_head_aware`. A prediction
    that diverges (its loss above 10·L_0 or non-finite, or a non-finite state or θ_{k+1})
    stops re-linearising and runs on in its last kernel (module docstring). Each segment
    costs one kernel (``head_aware_kernel``) and one vjp; a sweep pays that per
    configuration, because each configuration has its own path. One path: GD, or SGD with
    the batch order ``ntk_tt.batch_indices(key, N, B, steps)`` of a real run with ``key``.

    ``optimizer=ntk_tt.sgd(...)`` (an SGD-family :class:`ntk_tt.Optimizer`) instead of the
    constant-η keywords: each segment runs :func:`ntk_tt.head_aware_sgd_trajectory`'s step with
    η_t of its global steps s … s + T/K − 1, the head's and backbone's momentum carried as
    above; weight decay (decoupled or L2) moves the re-linearisation point by the decay too,
    θ_s = c θ_k − J_hᵀ z (module docstring), and the new segment decays toward 0 through
    a_h = J_h(θ_s) θ_s (one more jvp per segment, on x and x_test). Exact for a backbone
    linear in its weights (then it is the network trained by ``optimizer.to_optax()``);
    ``segments=1`` is ``ntk_tt.predict(..., head=split, optimizer=, num_paths=1)``.

    Source: ntk_tt's own (issue 9; METHOD.md §10, "Evolving kernel without jumps"; with
    ``optimizer``, issue 27 and METHOD.md §11).

    Args:
      split: ``ntk_tt.split_head(model)``. x: training inputs (N, ...). y: labels (N,).
      segments: int ≥ 1, at most ``steps``. optimizer: an SGD-family ``ntk_tt.Optimizer``
        or None (then ``learning_rate``, ...).
      learning_rate, momentum, steps, batch_size, nesterov, loss, key: as
        :func:`predict_head_aware` (steps: T optimiser updates in all, over every segment).
      x_test, y_test: an optional held-out set (N_test, ...) and its labels (N_test,).
      backbone, mixing_samples: as :func:`head_aware_kernel`, for every segment's kernel.

    Returns:
      :class:`ntk_tt.KernelPrediction` (κ and λ_min of the initial Θ_0; with an optimiser κ
      uses the schedule's peak η_t).

    Raises:
      ValueError: ``segments`` not an int in [1, steps], and as :func:`predict_head_aware`;
        ``optimizer`` with any constant-η keyword; Adam/AdamW (its moments are not
        re-linearised: use ``predict(..., head=split, optimizer=opt)``, one linearisation),
        ``backbone="subspace"`` or ``"diagonal"``, before any work.
    """
    check_shorthand(optimizer, where=WHERE, learning_rate=learning_rate, momentum=momentum,
                    nesterov=nesterov, batch_size=batch_size)
    if optimizer is not None and optimizer.rule != "sgd":
        raise ValueError(
            f"{WHERE} predicts constant-η SGD (learning_rate=, momentum=, nesterov=, "
            f"batch_size=) or the SGD family (optimizer=ntk_tt.sgd(...)), not "
            f"{optimizer.label}: Adam's moments are not re-linearised; for Adam use one "
            "linearisation: ntk_tt.predict(..., head=split, optimizer=opt) (the fast "
            "head-aware Adam predictor).")
    if optimizer is not None:
        check_run(optimizer, np.shape(x)[0], steps)
    if isinstance(segments, bool) or not isinstance(segments, int) or not 1 <= segments:
        raise ValueError(f"segments must be an int >= 1, got {segments!r}.")
    if backbone in ("subspace", "diagonal"):
        raise ValueError(f"the {backbone} backbone is not re-linearised (its feature basis "
                         "would change at every segment): use one segment, or the isotropic, "
                         "kronecker or exact backbone.")
    if isinstance(steps, int) and segments > steps:
        raise ValueError(f"segments ({segments}) must not exceed steps ({steps}).")
    if optimizer is not None:
        return _with_optimizer(split, x, y, optimizer, segments=segments, steps=steps,
                               loss=loss, key=key, x_test=x_test, y_test=y_test,
                               backbone=backbone, mixing_samples=mixing_samples)
    momentum, nesterov = 0.0 if momentum is None else momentum, flag(nesterov)
    feature_fn, theta, _, _ = split
    hk = head_aware_kernel(split, x, x_test, backbone=backbone, mixing_samples=mixing_samples,
                           key=None if key is None else jax.random.fold_in(key, 1))
    if segments == 1:
        return predict_head_aware(hk, y, learning_rate=learning_rate, momentum=momentum,
                                  steps=steps, batch_size=batch_size, nesterov=nesterov,
                                  loss=loss, key=key, num_paths=1, y_test=y_test)
    y, y_test, bs = validate(hk, y, y_test, learning_rate=learning_rate, momentum=momentum,
                             steps=steps, batch_size=batch_size, loss=loss, key=key,
                             num_paths=1, nesterov=nesterov)
    n = hk.features.shape[0]
    lams = initial_eigenvalues(hk)  # κ and λ_min refer to Θ_0, as in predict_head_aware
    batches = batch_indices(key, n, bs, steps)
    ends = np.linspace(0, steps, segments + 1).round().astype(int)
    kw = dict(learning_rate=jnp.asarray(learning_rate, hk.features.dtype),
              momentum=jnp.asarray(momentum, hk.features.dtype), nesterov=nesterov,
              loss=loss)
    fs, fts, state, frozen = [], [], initial_state(hk), False
    for k in range(segments):
        if k and not frozen:
            theta, frozen = _next_point(fs, y, loss, state, feature_fn, theta, x, state.z)
        if k and not frozen:
            h = hk.features + state.phi
            ht = None if x_test is None else hk.features_test + state.phit
            new = head_aware_kernel((feature_fn, theta, state.w, state.b), x, x_test,
                                    backbone=backbone, mixing_samples=mixing_samples,
                                    key=None if key is None else jax.random.fold_in(key, 1))
            hk = new._replace(features=h, features_test=ht)
            state = initial_state(hk, state.w, state.b, (state.uw, state.ub, state.u_q))
        f, ft, state = _segment(hk, y, batches[ends[k]:ends[k + 1]], state, **kw)
        fs.append(f if k == 0 else f[1:])
        fts.append(None if ft is None else (ft if k == 0 else ft[1:]))
    fs = jnp.concatenate(fs)[None]
    fts = None if x_test is None else jnp.concatenate(fts)[None]
    return _summarise(fs, fts, y, y_test, n * hk.head_kernel.shape[1], kw["learning_rate"],
                      kw["momentum"], lams, nesterov=nesterov, loss=loss, stochastic=False)


@partial(jax.jit, static_argnames=("nesterov", "loss"))
def _segment(hk, y, batches, state, **kw):
    return head_aware_trajectory(hk, y, batches, state0=state, **kw)


def _next_point(fs, y, loss, state, feature_fn, theta, x, z, c=None):
    """(θ_s, False): the next linearisation point (:func:`_relinearise`), or (θ_k, True) when
    the prediction has diverged (module docstring): the logits so far ``fs`` (list of
    (t, N, C)) give a loss curve that spiked above ``SPIKE_FACTOR``·L_0 or is non-finite, a
    leaf of ``state`` is non-finite, or θ_s is; then no kernel is built at θ_s."""
    spiked = divergence(curves(jnp.concatenate(fs), y, loss)[0]).spiked_at >= 0
    if bool(spiked) or not _finite(state):
        return theta, True
    new = _relinearise(feature_fn, theta, x, z, c)
    return (theta, True) if not _finite(new) else (new, False)


def _finite(tree):
    return all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(tree))


def _relinearise(feature_fn, theta, x, z, c=None):
    """c·θ − J_h(θ)ᵀ z (c None: 1): the head-aware model's backbone weights after a
    segment."""
    _, vjp = jax.vjp(lambda p: feature_fn(p, x), theta)
    (jt_z,) = vjp(z)
    if c is None:
        return jax.tree.map(jnp.subtract, theta, jt_z)
    return jax.tree.map(lambda t, j: c.astype(t.dtype) * t - j, theta, jt_z)


class Backbone(NamedTuple):
    """The head-aware model's backbone in a segment linearised at θ_k (module docstring):
    weights c θ_k − J_hᵀ z and optax velocity α θ_k + J_hᵀ u_q; c, α scalars, z, u_q (N, F)."""

    c: jax.Array
    z: jax.Array
    alpha: jax.Array
    u_q: jax.Array


def _with_optimizer(split, x, y, optimizer, *, segments, steps, loss, key, x_test, y_test,
                    backbone, mixing_samples):
    """:func:`predict_head_aware_refreshed` with an SGD-family ``optimizer`` (already checked:
    rule, schedule, steps, segments)."""
    feature_fn, theta, _, head_bias = split
    n, c = np.shape(x)[0], np.shape(head_bias)[0]
    check_loss(loss, c)
    y = check_labels(y, n, c)
    bs = n if optimizer.batch_size is None else optimizer.batch_size
    if bs < n and key is None:
        raise ValueError("SGD (batch_size < N) is random: pass key=jax.random.key(seed).")
    if (x_test is None) != (y_test is None):
        raise ValueError("x_test and y_test come together (the held-out set): pass both or "
                         "neither.")
    if y_test is not None:
        y_test = check_labels(y_test, np.shape(x_test)[0], c, name="y_test")
    kernel_key = None if key is None else jax.random.fold_in(key, 1)

    def kernel(head):
        return head_aware_kernel(head, x, x_test, backbone=backbone,
                                 mixing_samples=mixing_samples, key=kernel_key)

    decay = _maybe_nonzero(optimizer.weight_decay)
    hk = kernel(split)
    a_h, a_h_test = _tangents(feature_fn, theta, x, x_test, decay)
    if segments == 1:
        return head_aware_prediction(hk, y, optimizer, steps=steps, loss=loss, key=key,
                                     num_paths=1, y_test=y_test, a_h=a_h, a_h_test=a_h_test)
    hk, y, a_h, a_h_test, _ = validate_head(hk, y, optimizer, rules=("sgd",), where=WHERE,
                                            loss=loss, a_h=a_h, a_h_test=a_h_test)
    lams = initial_eigenvalues(hk)  # κ and λ_min refer to Θ_0, as with one segment
    dtype = hk.features.dtype
    batches = resolve_batches(optimizer, n, steps, key, None)
    rates = optimizer.learning_rates(steps).astype(dtype)
    ends = np.linspace(0, steps, segments + 1).round().astype(int)
    zf = jnp.zeros_like(hk.features)
    zt = None if x_test is None else jnp.zeros_like(hk.features_test)
    w, b = hk.head_kernel, hk.head_bias
    state = SgdHeadState(w, b, zf, jnp.zeros_like(w), jnp.zeros_like(b), zf, zt, zt)
    one, zero = jnp.ones((), dtype), jnp.zeros((), dtype)
    track = Backbone(one, zf, zero, zf)
    fs, fts, frozen = [], [], False
    for k in range(segments):
        if k and not frozen:
            theta, frozen = _next_point(fs, y, loss, (state, track), feature_fn, theta, x,
                                        track.z, track.c)
        if k and not frozen:
            new = kernel((feature_fn, theta, state.w, state.b))
            a_h, a_h_test = _tangents(feature_fn, theta, x, x_test, decay)
            new, _, a_h, a_h_test, _ = validate_head(
                new, y, optimizer, rules=("sgd",), where=WHERE, loss=loss, a_h=a_h,
                a_h_test=a_h_test)
            hk = new._replace(features=hk.features + state.phi,
                              features_test=None if zt is None else
                              hk.features_test + state.phit)
            # the velocity about θ_s (θ_k = (θ_s + J_hᵀ z)/c); α = 0 without L2 decay
            alpha = jnp.where(track.alpha == 0, 0.0, track.alpha / track.c)
            state, track = _restart(hk, state, a_h, a_h_test, alpha,
                                    track.u_q + alpha * track.z, one)
        f, ft, state, track = _optim_segment(
            hk, y, optimizer, batches[ends[k]:ends[k + 1]], rates[ends[k]:ends[k + 1]],
            state, track, a_h, a_h_test, loss=loss)
        fs.append(f if k == 0 else f[1:])
        fts.append(None if ft is None else (ft if k == 0 else ft[1:]))
    fs = jnp.concatenate(fs)[None]
    fts = None if x_test is None else jnp.concatenate(fts)[None]
    return _summarise_paths(fs, fts, y, y_test, optimizer, steps, lams,
                            n * hk.head_kernel.shape[1], loss, frozen=False)


def _restart(hk, state, a_h, a_h_test, alpha, u_q, one):
    """The state at the start of a segment linearised at θ_s: φ = 0, the head and its
    velocities carried, the backbone's velocity α θ_s + J_hᵀ u_q seen through ``hk``:
    v_φ = α a_h + K_h u_q (a_h None: no decay, α = 0)."""
    every = jnp.arange(hk.features.shape[0])

    def velocity(kernel, a, rows):
        v = _feature_kernel_dot(kernel, hk.mixing, every, u_q, rows)
        return v if a is None else v + alpha * a

    zf = jnp.zeros_like(hk.features)
    vphi = velocity(hk.backbone, a_h, zf.shape[0])
    phit = vphit = None
    if hk.features_test is not None:
        phit = jnp.zeros_like(hk.features_test)
        vphit = velocity(hk.backbone_test, a_h_test, phit.shape[0])
    state = SgdHeadState(state.w, state.b, zf, state.uw, state.ub, vphi, phit, vphit)
    return state, Backbone(one, zf, alpha, u_q)


@partial(jax.jit, static_argnames="loss")
def _optim_segment(hk, y, optimizer, batches, rates, state, track, a_h, a_h_test, *, loss):
    """Logits after 0..T_k steps of one segment (T_k + 1, N, C), held-out ones or None, and
    the final :class:`SgdHeadState` and :class:`Backbone`."""

    def step(carry, inputs):
        state, track = carry
        idx, lr = inputs
        track = _track(track, state, idx, lr, hk, y, optimizer, loss)
        state = head_sgd_step(state, idx, lr, hk, y, optimizer, a_h, a_h_test, loss=loss)
        return (state, track), head_logits(hk, state.w, state.b, state.phi, state.phit)

    f0, ft0 = head_logits(hk, state.w, state.b, state.phi, state.phit)
    (state, track), (fs, fts) = jax.lax.scan(step, (state, track), (batches, rates))
    fs = jnp.concatenate([f0[None], fs])
    fts = None if ft0 is None else jnp.concatenate([ft0[None], fts])
    return fs, fts, state, track


def _track(track, state, idx, lr, hk, y, optimizer, loss):
    """One ``optimizer.to_optax()`` step of the backbone's weights and velocity in the
    :class:`Backbone` form, from the state before the step (as :func:`head_sgd_step`)."""
    m, lam_2, lam_d = sgd_coefficients(optimizer, track.z.dtype)
    hb = (hk.features + state.phi)[idx]
    g = logit_residual(hb @ state.w + state.b, y[idx], loss) / idx.shape[0]
    q = jnp.zeros_like(track.z).at[idx].add(g @ state.w.T)  # J_h grad_θ = K_h q
    grad_a, grad_q = lam_2 * track.c, q - lam_2 * track.z  # + λ_2 θ_t
    alpha = m * track.alpha + grad_a
    u_q = m * track.u_q + grad_q
    dir_a, dir_q = (grad_a + m * alpha, grad_q + m * u_q) if optimizer.nesterov else (alpha, u_q)
    dir_a, dir_q = dir_a + lam_d * track.c, dir_q - lam_d * track.z  # + λ_d θ_t
    return Backbone(track.c - lr * dir_a, track.z + lr * dir_q, alpha, u_q)
