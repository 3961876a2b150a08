"""Real fine-tunes of a sweep task's configurations (the ground truth each row compares with)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

import ntk_tt
from ntk_tt._finetune import DIVERGENCE_FACTOR, train_step
from ntk_tt._losses import mean_loss
from ntk_tt.sweep._compile import _compiled, _timed


class TaskData(NamedTuple):
    """Everything one task needs: the model with its fresh head, the training set, and the
    model split into backbone features and head (``ntk_tt.split_head``; None: no head-aware
    prediction)."""

    apply_fn: Callable
    params: Any
    x: jax.Array
    y: jax.Array
    split: Any = None


def _evaluate(apply_fn, params, x, y):
    """Full-training-set mean loss (the curve; measurement, not training)."""
    return mean_loss(apply_fn(params, x), y, "cross_entropy")


def _finetune_group(data: TaskData, key, lrs, moms, *, steps, batch_size, vmapped=None):
    """Real fine-tunes of G configurations sharing a batch size.

    Same conventions as ``ntk_tt.finetune`` (optax ``sgd``, mean cross-entropy,
    ``ntk_tt.batch_indices(key, N, B, T)``, full-set loss after every step, divergence when
    the loss is non-finite or above 10·L_0, curves hold the last value after it). The steps
    run as a host loop over one compiled step: XLA:CPU ran this CNN's training step about 50×
    slower inside ``lax.scan`` (``finetune_core``) than as a single call (N = 50: 1.15 s vs
    0.02 s a step). ``vmapped`` (default: on any backend but CPU) runs the G configurations
    as one ``vmap`` over (η, m); on CPU they run one after another through one compiled
    single-configuration step, because vmapping over the weights turns every convolution
    into a grouped one that XLA:CPU ran 3–5× slower per configuration (measured here, G = 6:
    N = 150, 2.09 s vs 0.67 s for the six steps; N = 750, 10.2 s vs 1.9 s). Only training
    steps are timed (the per-step full-set evaluation is measurement).

    Returns loss curves (G, T + 1), divergence flags (G,), seconds per fine-tune (G,) and
    compile seconds.
    """
    n, g = data.x.shape[0], len(lrs)
    if vmapped is None:
        vmapped = jax.default_backend() != "cpu"
    batches = ntk_tt.batch_indices(key, n, n if batch_size is None else batch_size, steps)
    step_fn = functools.partial(train_step, data.apply_fn)
    eval_fn = functools.partial(_evaluate, data.apply_fn)
    params, lr_args, mom_args = data.params, lrs, moms
    if vmapped:
        params = jax.tree.map(lambda a: jnp.broadcast_to(a, (g, *a.shape)), data.params)
        step_fn = jax.vmap(step_fn, in_axes=(0, 0, None, None, None, 0, 0))
        eval_fn = jax.vmap(eval_fn, in_axes=(0, None, None))
    else:
        lr_args, mom_args = lrs[0], moms[0]
    state = (jax.vmap(optax.sgd(0.1, 0.9).init) if vmapped else optax.sgd(0.1, 0.9).init)(
        params)
    tag = (id(data.apply_fn), batch_size, vmapped)
    step, cs = _compiled(("train", tag), step_fn, params, state, data.x, data.y, batches[0],
                         lr_args, mom_args)
    ev, ce = _compiled(("eval", tag), eval_fn, params, data.x, data.y)
    if vmapped:
        return (*_host_loop(step, ev, params, state, data, batches, lrs, moms, g), cs + ce)
    parts = [_host_loop(step, ev, params, state, data, batches, lrs[i], moms[i], 1)
             for i in range(g)]
    return (*(np.concatenate(a) for a in zip(*parts, strict=True)), cs + ce)


def _host_loop(step, ev, params, state, data: TaskData, batches, lrs, moms, g):
    """T compiled steps of ``g`` configurations (stacked when g > 1 or vmapped): loss curves
    (g, T + 1), divergence flags (g,), summed training-step seconds per configuration (g,)."""
    steps = len(batches)
    losses = np.empty((g, steps + 1))
    losses[:, 0] = np.asarray(ev(params, data.x, data.y))
    div_at = np.full(g, -1)
    train_s = np.zeros(g)
    for t in range(steps):
        (params, state), sec = _timed(step, params, state, data.x, data.y, batches[t], lrs,
                                      moms)
        live = div_at < 0
        train_s[live] += sec / g
        loss_t = np.asarray(ev(params, data.x, data.y)).reshape(g)
        bad = live & (~np.isfinite(loss_t) | (loss_t > DIVERGENCE_FACTOR * losses[:, 0]))
        div_at[bad] = t + 1
        losses[:, t + 1] = np.where(div_at < 0, loss_t, losses[:, t])
        if np.all(div_at >= 0):  # every configuration diverged: the curves only hold
            losses[:, t + 2:] = losses[:, t + 1:t + 2]
            break
    return losses, div_at >= 0, train_s
