"""Recording a fine-tune's telemetry: the statistics of one step, computed by separate
compiled functions on the run's parameters (so the run itself is unchanged), and the
:class:`Recorder` that ``ntk_tt.finetune`` feeds. Fields, shapes and units of what is
recorded: ``ntk_tt.telemetry._telemetry``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._aot import compiled
from ntk_tt.dynamics._losses import mean_loss, per_sample_loss
from ntk_tt.telemetry._telemetry import _SNAPSHOT, Telemetry, TelemetrySpec, snapshot_steps


def model_features(model) -> Callable[[Any, jax.Array], jax.Array]:
    """``features(params, x) -> h`` (N, F) for :class:`TelemetrySpec`, from an NNX model with
    a linear ``head`` (:func:`ntk_tt.split_head`).

    Source: none (a utility for the dead-ReLU fraction, one of the activation signals of
    arXiv 2608.03709; METHOD.md §9).

    Args:
      model: the NNX model that is fine-tuned, its classifier an ``nnx.Linear`` attribute
        ``head`` with a bias.

    Returns:
      ``features(params, x)``: ``params`` the full model's (``ntk_tt.from_nnx(model)[1]``,
      as ``apply_fn`` takes; the head's entry is dropped), x inputs (N, ...); gives the
      head's inputs h, (N, F).

    Raises:
      ValueError: ``model`` is not an NNX module with an ``nnx.Linear`` attribute ``head``
        with a bias (the split :func:`ntk_tt.split_head` makes), naming the telemetry
        feature that needs it (the dead-ReLU fraction) and the fixes.
    """
    from flax import nnx

    from ntk_tt.kernels._head_aware import split_head

    head = getattr(model, "head", None)
    if not isinstance(model, nnx.Module) or not isinstance(head, nnx.Linear) \
            or head.bias is None:
        raise ValueError(
            "model_features needs an NNX model whose classifier is an nnx.Linear attribute "
            "`head` with a bias (the head's input is the backbone features h(x) that the "
            f"telemetry's dead_relu_fraction reads), got {type(model).__name__}; name the "
            "classifier layer `head` (ntk_tt.replace_head makes one), or pass your own "
            "TelemetrySpec(features=lambda params, x: h) or none (dead_relu_fraction is then "
            "NaN).")
    feature_fn = split_head(model)[0]

    def features(params, x):
        return feature_fn(nnx.State({k: v for k, v in params.items() if k != "head"}), x)

    return features


def _norm(tree) -> jax.Array:
    return jnp.sqrt(sum(jnp.sum(jnp.square(a)) for a in jax.tree_util.tree_leaves(tree)))


def _head_kernel(params):
    try:
        return jax.tree_util.tree_leaves(params["head"]["kernel"])[0]
    except (KeyError, TypeError, IndexError):
        return None


def gradient_stats(apply_fn, params, x, y, idx, *, loss: str, samples: int):
    """(‖g‖, SNR) at ``params`` on the minibatch ``idx`` (B,): g = ∇ mean_{i∈idx} ℓ_i, and the
    SNR of the per-sample gradients on ``idx[:samples]`` (module docstring). Scalars."""
    g = jax.grad(lambda q: mean_loss(apply_fn(q, x[idx]), y[idx], loss))(params)
    sub = idx[:samples]

    def one(xi, yi):
        return jax.grad(lambda q: per_sample_loss(apply_fn(q, xi[None]), yi[None], loss)[0])(
            params)

    per = jax.vmap(one)(x[sub], y[sub])
    mean = jax.tree.map(lambda a: jnp.mean(a, axis=0), per)
    signal = _norm(mean) ** 2
    noise = sum(jnp.sum(jnp.square(a - m)) for a, m in
                zip(jax.tree_util.tree_leaves(per), jax.tree_util.tree_leaves(mean),
                    strict=True)) / sub.shape[0]
    snr = jnp.where((sub.shape[0] >= 2) & (noise > 0), signal / noise, jnp.nan)
    return _norm(g), snr


def weight_stats(params, params0):
    """(‖w − w0‖, ‖w‖, ‖W_head‖ or NaN): scalars."""
    head = _head_kernel(params)
    dtype = jnp.result_type(*jax.tree_util.tree_leaves(params))
    return (_norm(jax.tree.map(jnp.subtract, params, params0)), _norm(params),
            jnp.asarray(jnp.nan, dtype) if head is None else jnp.linalg.norm(head))


def snapshot(apply_fn, features, params, logits, x, x_test, y_test, *, loss: str,
             saturation: float):
    """(mean max-probability, saturated fraction, dead-ReLU fraction, held-out loss,
    held-out accuracy) at ``params`` with training logits ``logits`` (N, C); NaN for the
    missing ``features`` / held-out split."""
    p = jnp.max(jax.nn.softmax(logits), axis=-1)
    nan = jnp.asarray(jnp.nan, logits.dtype)
    dead = nan if features is None else jnp.mean(features(params, x) == 0, dtype=nan.dtype)
    if x_test is None:
        tl = ta = nan
    else:
        ft = apply_fn(params, x_test)
        tl = mean_loss(ft, y_test, loss)
        ta = jnp.mean(jnp.argmax(ft, axis=-1) == y_test, dtype=nan.dtype)
    return jnp.mean(p), jnp.mean(p > saturation, dtype=nan.dtype), dead, tl, ta


_gradient_jit = jax.jit(gradient_stats, static_argnums=0, static_argnames=("loss", "samples"))


_weight_jit = jax.jit(weight_stats)


_snapshot_jit = jax.jit(snapshot, static_argnums=(0, 1), static_argnames=("loss", "saturation"))


class Recorder:
    """Telemetry of one :func:`ntk_tt.finetune` run, fed by its host loop: compile with
    :meth:`compile` (counted as compile time), then :meth:`before_update` (gradient
    statistics at w_{t−1}) and :meth:`after_update` (weights, snapshots at w_t, the held
    parameters at a stop) around each update, and :meth:`finish`."""

    def __init__(self, spec: TelemetrySpec, apply_fn, params0, x, y, x_test, y_test, *,
                 steps: int, batch_size: int, loss: str):
        if spec.features is not None:
            h = jax.eval_shape(spec.features, params0, x)
            if getattr(h, "ndim", None) != 2 or h.shape[0] != x.shape[0]:
                raise ValueError(f"TelemetrySpec.features must return (N, F) = "
                                 f"({x.shape[0]}, F) features, got {getattr(h, 'shape', h)}.")
        self.params0, self.data = params0, (x, y, x_test, y_test)
        self.steps_at = snapshot_steps(spec, steps)
        self.samples = min(batch_size, spec.snr_samples)
        self.grad: list[tuple] = []
        self.weights: list[tuple] = []
        self.snaps: dict[int, tuple] = {}
        self._static = (apply_fn, spec.features, loss, spec.saturation)
        self._fns = None

    def compile(self, state, idx) -> None:
        """Compile the three statistics for the shapes of ``state`` and a batch ``idx``
        (reused by later runs of equal shapes and settings, :mod:`ntk_tt._aot`)."""
        apply_fn, features, loss, saturation = self._static
        x, y, x_test, y_test = self.data
        self._fns = (
            compiled(_gradient_jit, state.params, x, y, idx, static=(apply_fn,), loss=loss,
                     samples=self.samples)[0],
            compiled(_weight_jit, state.params, self.params0)[0],
            compiled(_snapshot_jit, state.params, state.logits, x, x_test, y_test,
                     static=(apply_fn, features), loss=loss, saturation=saturation)[0])

    def before_update(self, state, idx) -> None:
        """Gradient statistics of the next update, at the current parameters."""
        x, y, _, _ = self.data
        self.grad.append(self._fns[0](state.params, x, y, idx))

    def after_update(self, t: int, state) -> None:
        """Weight statistics at w_t, and the snapshot when t is a snapshot step."""
        self.weights.append(self._fns[1](state.params, self.params0))
        if t in set(self.steps_at.tolist()):
            self.snaps[t] = self._snapshot(state)

    def _snapshot(self, state):
        x, _, x_test, y_test = self.data
        return self._fns[2](state.params, state.logits, x, x_test, y_test)

    def finish(self, state, run_loss, run_error, stopped_at: int, hyper: dict) -> Telemetry:
        """The :class:`Telemetry` row. ``state``: the final (held) state; ``run_loss``,
        ``run_error`` (T+1,): the run's held curves. Steps after a stop hold the last values
        (snapshots taken at the held parameters), updates never attempted are NaN."""
        steps = len(run_loss) - 1
        weights = np.asarray(jax.device_get(self.weights), np.float64).reshape(-1, 3)
        weights = np.concatenate([weights, np.repeat(weights[-1:], steps + 1 - len(weights),
                                                     0)])
        grad = np.full((steps, 2), np.nan)
        grad[:len(self.grad)] = np.asarray(jax.device_get(self.grad), np.float64).reshape(-1, 2)
        missing = [t for t in self.steps_at.tolist() if t not in self.snaps]
        if missing:
            held = self._snapshot(state)
            self.snaps |= dict.fromkeys(missing, held)
        snaps = np.asarray(jax.device_get([self.snaps[t] for t in self.steps_at.tolist()]),
                           np.float64).reshape(-1, 5)
        return Telemetry(
            **hyper, snr_samples=self.samples, stopped_at=stopped_at,
            loss=np.asarray(run_loss, np.float64),
            accuracy=1.0 - np.asarray(run_error, np.float64),
            weight_distance=weights[:, 0], weight_norm=weights[:, 1], head_norm=weights[:, 2],
            grad_norm=grad[:, 0], grad_snr=grad[:, 1], snapshot_steps=self.steps_at,
            **{f: snaps[:, i] for i, f in enumerate(_SNAPSHOT)})
