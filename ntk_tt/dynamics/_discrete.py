"""Exact discrete linearised dynamics in function space: GD, heavy ball, Nesterov, SGD.

METHOD.md §2 (exactness note). For the linear model f_lin(w) = f(w0) + J (w − w0), optax's
``sgd(η, m, nesterov)`` maps weight updates to function-space updates exactly (Θ = J Jᵀ):

    d_t = Θ[:, B_t] g_{B_t}(f_t)          g_B = ∂L_B/∂f_B, L_B the MEAN loss over the batch
    h_{t+1} = m h_t + d_t                 (h = Θ·u, u optax's velocity; h_0 = 0)
    f_{t+1} = f_t − η h_{t+1}             (heavy ball; m = 0 is GD / SGD)
    f_{t+1} = f_t − η (d_t + m h_{t+1})   (Nesterov, optax form)

Each step costs O(N·C · B·C). Held-out logits follow the same recursion with the cross
kernel Θ(x_test, x) in place of Θ. Time is in optimiser steps.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ntk_tt.data._batches import path_batch_indices
from ntk_tt.dynamics._fspace import theta_cols_dot, theta_dot
from ntk_tt.dynamics._losses import logit_residual


def discrete_trajectory(
    op, f0, y, batches, *, learning_rate, momentum, nesterov, loss, test_op=None, f0_test=None
):
    """Run the exact recursion over a batch-index sequence.

    Args:
      op: training kernel ``(mat, traced)`` (see ``_fspace``).
      f0: initial logits (N, C). y: integer labels (N,).
      batches: (steps, B) int32 from :func:`ntk_tt.batch_indices`; B = N means GD.
      learning_rate, momentum: scalars (may be traced). nesterov, loss: static.
      test_op, f0_test: optional cross kernel ``(mat, traced)`` and logits (N_test, C).

    Returns:
      ``(fs, fs_test)``: logits after 0..steps updates, (steps + 1, N, C), and the held-out
      logits (steps + 1, N_test, C) or None.
    """
    full_batch = batches.shape[1] == f0.shape[0]
    with_test = test_op is not None
    zeros_test = jnp.zeros_like(f0_test) if with_test else None
    test_t = (test_op[0].T, test_op[1]) if with_test else None  # Θ(x_test, x)ᵀ, row gathers

    def step(carry, idx):
        f, h, ft, ht = carry
        mat, traced = op
        if full_batch:
            g = logit_residual(f, y, loss) / f.shape[0]
            d = theta_dot(mat, traced, g)
            dt = theta_dot(*test_op, g) if with_test else None
        else:
            g_b = logit_residual(f[idx], y[idx], loss) / idx.shape[0]
            d = theta_cols_dot(mat, traced, idx, g_b)  # Θ symmetric: Θᵀ = Θ
            dt = theta_cols_dot(*test_t, idx, g_b) if with_test else None
        h = momentum * h + d
        f = f - learning_rate * (d + momentum * h if nesterov else h)
        if with_test:
            ht = momentum * ht + dt
            ft = ft - learning_rate * (dt + momentum * ht if nesterov else ht)
        return (f, h, ft, ht), (f, ft)

    init = (f0, jnp.zeros_like(f0), f0_test, zeros_test)
    _, (fs, fts) = jax.lax.scan(step, init, batches)
    fs = jnp.concatenate([f0[None], fs])
    fts = jnp.concatenate([f0_test[None], fts]) if with_test else None
    return fs, fts


def discrete_paths(
    op, f0, y, *, key, num_paths, batch_size, steps, test_op=None, f0_test=None, **kwargs
):
    """The recursion for ``num_paths`` minibatch orders, vmapped. Path 0 uses
    ``batch_indices(key, N, B, steps)``, exactly the sequence of a real run with the same key;
    path p ≥ 1 uses ``batch_indices(jax.random.split(key, num_paths)[p], N, B, steps)``.

    Returns ``(fs, fs_test)`` with a leading path axis (num_paths, steps + 1, ...).
    """
    n = f0.shape[0]
    batches = path_batch_indices(key, n, batch_size, steps, num_paths)

    def one(b):
        return discrete_trajectory(op, f0, y, b, test_op=test_op, f0_test=f0_test, **kwargs)

    return jax.vmap(one)(batches)
