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
from ntk_tt.dynamics._divergence import divergence, first_nonfinite, hold_from
from ntk_tt.dynamics._losses import error_rate, mean_loss
from ntk_tt.sweep._compile import _compiled, _timed
from ntk_tt.training._steps import train_step


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
    """Full-training-set mean loss and error rate (the curves; measurement, not training)."""
    f = apply_fn(params, x)
    return mean_loss(f, y, "cross_entropy"), error_rate(f, y).astype(f.dtype)


def _finetune_group(data: TaskData, key, lrs, moms, *, steps, batch_size, vmapped=None):
    """Real fine-tunes of G configurations sharing a batch size.

    Same conventions as ``ntk_tt.finetune`` (optax ``sgd``, mean cross-entropy,
    ``ntk_tt.batch_indices(key, N, B, T)``, full-set loss after every step, training through
    spikes, a configuration stops at its first non-finite loss and its curve holds the last
    finite value from there; divergence and spikes by ``ntk_tt.dynamics._divergence``). The steps
    run as a host loop over one compiled step: XLA:CPU ran this CNN's training step about 50×
    slower inside ``lax.scan`` (``finetune_core``) than as a single call (N = 50: 1.15 s vs
    0.02 s a step). ``vmapped`` (default: on any backend but CPU) runs the G configurations
    as one ``vmap`` over (η, m); on CPU they run one after another through one compiled
    single-configuration step, because vmapping over the weights turns every convolution
    into a grouped one that XLA:CPU ran 3–5× slower per configuration (measured here, G = 6:
    N = 150, 2.09 s vs 0.67 s for the six steps; N = 750, 10.2 s vs 1.9 s). Only training
    steps are timed (the per-step full-set evaluation is measurement).

    Returns loss curves (G, T + 1), divergence flags (G,), first spike steps (G,) int (−1 for
    none), seconds per fine-tune (G,), compile seconds and training-error curves (G, T + 1)
    (held like the loss).
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
        held, div, spike, secs, err = _host_loop(step, ev, params, state, data, batches, lrs,
                                                 moms, g)
    else:
        parts = [_host_loop(step, ev, params, state, data, batches, lrs[i], moms[i], 1)
                 for i in range(g)]
        held, div, spike, secs, err = (np.concatenate(a) for a in zip(*parts, strict=True))
    return held, div, spike, secs, cs + ce, err


def _host_loop(step, ev, params, state, data: TaskData, batches, lrs, moms, g):
    """T compiled steps of ``g`` configurations (stacked when g > 1 or vmapped): loss curves
    (g, T + 1) held from each one's first non-finite loss on, divergence flags (g,), first
    spike steps (g,) (−1 for none), summed training-step seconds per configuration (g,),
    error curves (g, T + 1) held like the loss."""
    steps = len(batches)
    raw = np.full((g, steps + 1), np.nan)
    err = np.full((g, steps + 1), np.nan)
    loss_0, err_0 = ev(params, data.x, data.y)
    raw[:, 0], err[:, 0] = np.asarray(loss_0), np.asarray(err_0)
    stopped = np.zeros(g, bool)
    train_s = np.zeros(g)
    for t in range(steps):
        (params, state), sec = _timed(step, params, state, data.x, data.y, batches[t], lrs,
                                      moms)
        train_s[~stopped] += sec / g
        loss_t, err_t = (np.asarray(a).reshape(g) for a in ev(params, data.x, data.y))
        stopped |= ~np.isfinite(loss_t)
        raw[~stopped, t + 1] = loss_t[~stopped]
        err[~stopped, t + 1] = err_t[~stopped]
        if np.all(stopped):  # every configuration is non-finite: nothing left to record
            break
    verdict = divergence(raw)
    stop = first_nonfinite(raw)
    held = np.asarray(jax.vmap(hold_from)(raw, stop))
    return (held, np.asarray(verdict.diverged), np.asarray(verdict.spiked_at), train_s,
            np.asarray(jax.vmap(hold_from)(err, stop)))
