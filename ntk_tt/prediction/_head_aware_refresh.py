"""Evolving kernel without jumps: the head-aware model re-linearised along its own path.

METHOD.md §10. The horizon is cut into segments; at each boundary the backbone weights move by
the head-aware model's own update (one vjp), the feature kernel is rebuilt there, and the
prediction continues from its own features, head and velocities.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt.data._batches import batch_indices
from ntk_tt.dynamics._checks import refuse_optimizer
from ntk_tt.dynamics._predict_head_aware import (
    head_aware_trajectory,
    initial_eigenvalues,
    initial_state,
    predict_head_aware,
    validate,
)
from ntk_tt.dynamics._predict_kernel import _summarise
from ntk_tt.kernels._head_aware import head_aware_kernel


def predict_head_aware_refreshed(split, x, y, *, segments, learning_rate=None, momentum=0.0,
                                 steps, batch_size=None, nesterov=False, loss="cross_entropy",
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
    only the kernel is refreshed. ``segments=1`` is :func:`predict_head_aware`. Each segment
    costs one kernel (``head_aware_kernel``) and one vjp; a sweep pays that per
    configuration, because each configuration has its own path. One path: GD, or SGD with
    the batch order ``ntk_tt.batch_indices(key, N, B, steps)`` of a real run with ``key``.

    Args:
      split: ``ntk_tt.split_head(model)``. x: training inputs (N, ...). y: labels (N,).
      segments: int ≥ 1, at most ``steps``. Other arguments as :func:`predict_head_aware`
        and :func:`head_aware_kernel`; ``x_test``/``y_test`` optional held-out set.

    Returns:
      :class:`ntk_tt.KernelPrediction` (κ and λ_min of the initial Θ_0).

    Raises:
      ValueError: ``segments`` not an int in [1, steps], and as :func:`predict_head_aware`;
        any ``optimizer`` (the re-linearisation carries the constant-η SGD state only: use
        ``predict_head_aware(..., optimizer=)`` or ``predict(head=, optimizer=)``, one
        linearisation), before any work.
    """
    refuse_optimizer(optimizer, where="predict_head_aware_refreshed",
                     supports="constant-η SGD (learning_rate=, momentum=, nesterov=, "
                     "batch_size=)", instead="for an optimiser use one linearisation: "
                     "ntk_tt.predict(..., head=split, optimizer=opt) or ntk_tt.predict_head_"
                     "aware(ntk_tt.head_aware_kernel(split, x), y, optimizer=opt)")
    if isinstance(segments, bool) or not isinstance(segments, int) or not 1 <= segments:
        raise ValueError(f"segments must be an int >= 1, got {segments!r}.")
    if isinstance(steps, int) and segments > steps:
        raise ValueError(f"segments ({segments}) must not exceed steps ({steps}).")
    feature_fn, theta, _, _ = split
    hk = head_aware_kernel(split, x, x_test, backbone=backbone, mixing_samples=mixing_samples,
                           key=None if key is None else jax.random.fold_in(key, 1))
    if segments == 1:
        return predict_head_aware(hk, y, learning_rate=learning_rate, momentum=momentum,
                                  steps=steps, batch_size=batch_size, nesterov=nesterov,
                                  loss=loss, key=key, num_paths=1, y_test=y_test)
    y, y_test, bs = validate(hk, y, y_test, learning_rate=learning_rate, momentum=momentum,
                             steps=steps, batch_size=batch_size, loss=loss, key=key,
                             num_paths=1)
    n = hk.features.shape[0]
    lams = initial_eigenvalues(hk)  # κ and λ_min refer to Θ_0, as in predict_head_aware
    batches = batch_indices(key, n, bs, steps)
    ends = np.linspace(0, steps, segments + 1).round().astype(int)
    kw = dict(learning_rate=jnp.asarray(learning_rate, hk.features.dtype),
              momentum=jnp.asarray(momentum, hk.features.dtype), nesterov=nesterov,
              loss=loss)
    fs, fts, state = [], [], initial_state(hk)
    for k in range(segments):
        if k:
            theta = _relinearise(feature_fn, theta, x, state.z)
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


def _relinearise(feature_fn, theta, x, z):
    """θ − J_h(θ)ᵀ z: the head-aware model's backbone weights after a segment."""
    _, vjp = jax.vjp(lambda p: feature_fn(p, x), theta)
    (jt_z,) = vjp(z)
    return jax.tree.map(jnp.subtract, theta, jt_z)
