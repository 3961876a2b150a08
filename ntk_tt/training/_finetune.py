"""Real fine-tuning with optax, recorded the way the predictor reports its curves.

The baseline every prediction is compared against (paper Sec. 5). Conventions are those of the
predictor (dynamics issue): loss = mean over the batch of
:func:`ntk_tt.dynamics._losses.per_sample_loss`;
optimiser = ``optax.sgd(learning_rate, momentum, nesterov)``; minibatches =
:func:`ntk_tt.batch_indices` for the same key; curves have ``steps + 1`` entries, index t =
the full-training-set loss / error after t updates (not the minibatch loss).

:func:`finetune` is the eager entry point that validates, dispatches one compiled step at a
time (``ntk_tt.training._steps``: fast on CPU, see ``finetune_core`` there) and times. A run
trains through loss spikes (the catapult phase) and stops updating only when it becomes
non-finite; whether it DIVERGED or SPIKED is decided on the whole curve by the rule shared
with the predictor (:mod:`ntk_tt.dynamics._divergence`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

from ntk_tt._aot import compiled
from ntk_tt._optimizer import Optimizer
from ntk_tt._options import DECAY_RANGE, is_decay
from ntk_tt._schedule_checks import RATE_RANGE, is_rate
from ntk_tt.data._batches import batch_indices, check_sizes
from ntk_tt.data._inputs import _concrete, as_array, check_key
from ntk_tt.data._model import ApplyFn, check_model
from ntk_tt.dynamics._checks import check_nesterov, flag
from ntk_tt.dynamics._losses import check_loss, error_rate
from ntk_tt.dynamics._optim_linear import is_traced
from ntk_tt.telemetry._recorder import Recorder
from ntk_tt.telemetry._telemetry import Telemetry, TelemetrySpec
from ntk_tt.training import _optimizer_run as optimizer_run
from ntk_tt.training._finetune_checks import _check_hyper, _labels
from ntk_tt.training._steps import (
    _evaluate_jit,
    _init_jit,
    _linear_jit,
    _step_jit,
    _train_jit,
    _verdict,
)

TIMING_STEPS = 5


def _time_steps(train_jit, apply_fn, params, opt_state, x, y, batches, hyper,
                statics) -> tuple[float, float]:
    """(seconds per warm training step of ``train_jit`` (the constant-SGD or the optimiser
    step) over the first ≤ 5 batches, compile seconds)."""
    k = min(TIMING_STEPS, batches.shape[0])
    t0 = time.perf_counter()
    fn, _ = compiled(train_jit, params, opt_state, x, y, batches[0], *hyper,
                     static=(apply_fn,), **statics)
    t1 = time.perf_counter()
    p, s = jax.block_until_ready(fn(params, opt_state, x, y, batches[0], *hyper))  # warm-up
    t2 = time.perf_counter()
    for i in range(k):
        p, s = jax.block_until_ready(fn(p, s, x, y, batches[i], *hyper))
    return (time.perf_counter() - t2) / k, t1 - t0


@dataclasses.dataclass(frozen=True)
class FineTuneRun:
    """Result of :func:`finetune`. Curves are numpy (steps+1,), index t = after t updates.

    ``seconds``: ``compile`` (all jitted functions, reported apart), ``timing`` (the warm
    steps timed for ``seconds_per_step``), ``run`` (the recorded run: training plus per-step
    full-set evaluation, which is measurement),
    ``finetune`` (training steps only: ``seconds_per_step`` × steps taken, the number compared
    with the prediction's time). ``logits``, ``linear_logits``: (steps+1, N, C) trajectories
    of the network and of its linearisation at the same weights, when recorded.
    ``diverged``, ``diverged_at``, ``spiked_at``: the rule shared with the predictor
    (:mod:`ntk_tt.dynamics._divergence`): diverged = a non-finite loss or parameter at some step, or
    L_T > L_0 (not recovered by the end); ``diverged_at`` = the step its final rise above L_0
    began; ``spiked_at`` = the first step with loss above 10·L_0 (None if none): spiked and
    not diverged = spiked and recovered (the catapult phase). ``telemetry``: the
    :class:`ntk_tt.Telemetry` row when recorded (``finetune(telemetry=...)``), else None.
    ``test_loss``, ``test_error``: held-out mean loss and error rate (steps+1,) after every
    step, held like ``loss`` past a stop, when recorded (``record_test_curves=True``), else
    None. ``optimizer``: the :class:`ntk_tt.Optimizer` of ``finetune(optimizer=...)``, else
    None (constant-η SGD); with one, ``learning_rate`` is its peak η_t over the steps,
    ``momentum`` its m (Adam: β₁).

    Source: ntk_tt's own container of a real run, measured as the prediction is (Zancato et
    al. 2020 (arXiv 2008.12478), Sec. 5; METHOD.md §2 "Divergence", §6, §8).
    """

    loss: np.ndarray
    error: np.ndarray
    test_accuracy: float | None
    seconds_per_step: float
    seconds: dict[str, float]
    diverged: bool
    diverged_at: int | None
    spiked_at: int | None
    learning_rate: float
    momentum: float
    nesterov: bool
    batch_size: int
    steps: int
    num_train: int
    loss_name: str
    params: Any = dataclasses.field(repr=False)
    logits: np.ndarray | None = dataclasses.field(default=None, repr=False)
    linear_logits: np.ndarray | None = dataclasses.field(default=None, repr=False)
    telemetry: Telemetry | None = dataclasses.field(default=None, repr=False)
    test_loss: np.ndarray | None = dataclasses.field(default=None, repr=False)
    test_error: np.ndarray | None = dataclasses.field(default=None, repr=False)
    optimizer: Optimizer | None = dataclasses.field(default=None, repr=False)


def finetune(apply_fn: ApplyFn, params: Any, x: Any, y: Any, *,
             learning_rate: float | None = None, steps: int, batch_size: int | None = None,
             momentum: float | None = None, nesterov: bool | None = None,
             loss: str = "cross_entropy", key: jax.Array | None = None,
             x_test: Any = None, y_test: Any = None, record_logits: bool = False,
             telemetry: bool | TelemetrySpec = False, progress: bool = False,
             record_test_curves: bool = False,
             optimizer: Optimizer | None = None) -> FineTuneRun:
    """Fine-tune for real with ``optax.sgd`` (or ``optimizer.to_optax()``) and record
    full-training-set curves (paper Sec. 5).

    Same conventions as :func:`ntk_tt.predict`: mean loss, optax SGD semantics, the batch
    sequence ``ntk_tt.batch_indices(key, N, B, steps)`` (GD, B = N, ignores ``key``), curves of
    ``steps + 1`` entries in units of optimiser steps. The time per step is measured on
    ``min(5, steps)`` warm training steps without evaluation; compile time is reported apart.

    Source: the real fine-tuning that Zancato et al. 2020 (arXiv 2008.12478), Sec. 5, compare
    their predictions with (METHOD.md §1, §8); telemetry: arXiv 2608.03709 (METHOD.md §9).

    Args:
      apply_fn, params: the model, e.g. from :func:`ntk_tt.from_nnx`.
      x: training inputs (N, ...); y: integer labels (N,).
      learning_rate: η > 0. steps: T ≥ 1. batch_size: B (None = N, gradient descent).
      momentum: m ∈ [0, 1) (None: 0); nesterov: optax's Nesterov form (None: False). These
        four are the constant-η SGD shorthand; ``optimizer`` replaces all of them.
      optimizer: an :class:`ntk_tt.Optimizer` (``ntk_tt.sgd``, ``adam``, ``adamw``: schedule,
        momentum or Adam, weight decay, batch size), trained with ``optimizer.to_optax()``
        on the same batch sequence (``batch_indices(key, N, optimizer.batch_size or N,
        steps)``) that :func:`ntk_tt.predict` with the same optimizer and key assumes.
      loss: "cross_entropy" or "mse". key: ``jax.random`` key, required when B < N.
      x_test, y_test: optional held-out split for the final accuracy.
      record_logits: keep the (steps+1, N, C) logits trajectory (linearisation gap).
      telemetry: record early-training telemetry
        (:mod:`ntk_tt.telemetry._telemetry`: gradient norm and
        SNR per update, weight norms per step, saturation and held-out snapshots) into
        ``FineTuneRun.telemetry``; True = ``TelemetrySpec()``. Off (False): no extra work.
        Never changes the run. Costs per update one more minibatch gradient and
        ``snr_samples`` per-sample gradients, plus the snapshots' forward passes.
      progress: show a tqdm progress bar over the steps.
      record_test_curves: also evaluate the held-out set after every step into
        ``FineTuneRun.test_loss`` / ``test_error`` (needs ``x_test``; measurement, not counted
        in the training time): the real side of held-out steps-to-target
        (:func:`ntk_tt.compare`).

    Returns:
      :class:`FineTuneRun`. Training goes on through loss spikes; it stops only at the first
      step whose loss or parameters are non-finite, from which the curves hold the last finite
      values (``steps + 1`` finite entries) and ``params`` and the logits trajectories are
      those of the last finite step. ``seconds["finetune"]`` counts the steps taken.

    Warns:
      UserWarning: the ``optimizer``'s η_t is 0 over the last two or more updates (a schedule
        built for a shorter run: they change nothing).

    Raises:
      ValueError: ``optimizer`` together with learning_rate, momentum, nesterov or
        batch_size, or neither optimizer nor learning_rate, an optimizer schedule whose
        warmup ends at or after ``steps`` (η_t never reaches its peak), or telemetry with an
        optimizer (the telemetry rows describe constant-η SGD runs); bad shapes or labels
        (training labels of one class included), x or y not arrays (lists of numbers are
        converted), η or m not a real scalar (a string, or an array such as a per-step
        schedule: use optimizer=) or traced (jit / vmap / grad), η ≤ 0, m ∉ [0, 1), Nesterov
        with m = 0, nesterov not True / False / None, steps < 1, B not an int in [1, N]
        (10.5 or True included), missing key for SGD or a key that is neither
        ``jax.random.key(seed)`` nor a legacy ``jax.random.PRNGKey(seed)``, unknown loss,
        x_test without y_test, record_test_curves without x_test, telemetry neither a bool
        nor a :class:`ntk_tt.TelemetrySpec`, ``TelemetrySpec.features`` not returning (N, F).
    """
    optimizer_run.check_shorthand(optimizer, where="finetune", learning_rate=learning_rate,
                                  momentum=momentum, nesterov=nesterov, batch_size=batch_size)
    if not isinstance(telemetry, bool | TelemetrySpec):
        raise ValueError(f"telemetry must be a bool or an ntk_tt.TelemetrySpec, got "
                         f"{type(telemetry).__name__}.")
    if optimizer is not None and telemetry is not False:
        raise ValueError("telemetry records constant-η SGD runs (the outcome model's rows); "
                         "use learning_rate=... or telemetry=False with optimizer=.")
    momentum, nesterov = 0.0 if momentum is None else momentum, flag(nesterov)
    if is_traced((learning_rate, momentum)):
        raise ValueError("finetune is eager (it checks the model and the values and times the "
                         "steps), so learning_rate and momentum cannot be traced (jit / vmap / "
                         "grad): call it once per value; sweep predictions with ntk_tt."
                         "predict_from_kernel or ntk_tt.predict_head_aware under jit(vmap).")
    if optimizer is None:
        _check_hyper(learning_rate, momentum)
        if not is_rate(learning_rate):
            raise ValueError(f"learning_rate must be finite and {RATE_RANGE}, got "
                             f"{learning_rate}.")
        if not is_decay(momentum):
            raise ValueError(f"momentum must be in {DECAY_RANGE}, got {momentum!r}; use 0.0 "
                             "for plain (S)GD.")
        check_nesterov(nesterov, _concrete(momentum))
    else:
        optimizer_run.check_learning_rates(optimizer, steps, warn_stacklevel=3)
    check_key(key)
    x = as_array(x, "x")
    n, c = check_model(apply_fn, params, x)
    y = _labels(y, n, c, "y")
    check_loss(loss, c)
    if (x_test is None) != (y_test is None):
        raise ValueError("pass both x_test and y_test, or neither.")
    if x_test is not None:
        x_test = as_array(x_test, "x_test")
        m, _ = check_model(apply_fn, params, x_test, name="x_test")
        y_test = _labels(y_test, m, c, "y_test")
    if record_test_curves and x_test is None:
        raise ValueError("record_test_curves=True records the held-out curves: pass x_test "
                         "and y_test too.")
    if optimizer is not None:
        batch_size = optimizer.batch_size
    check_sizes(steps, batch_size, n)  # B = 10.5 or True was truncated to 10 or 1
    b = n if batch_size is None else int(batch_size)
    batches = batch_indices(key, n, b, steps)
    x = jnp.asarray(x)
    dtype = jnp.result_type(*jax.tree_util.tree_leaves(params))
    if optimizer is None:
        hyper = (jnp.asarray(learning_rate, dtype), jnp.asarray(momentum, dtype))
        statics = dict(nesterov=nesterov, loss=loss)
        step_jit, train_jit = _step_jit, _train_jit
    else:
        hyper, statics = (optimizer_run.in_dtype(optimizer, dtype),), dict(loss=loss)
        step_jit, train_jit = optimizer_run._step_jit, optimizer_run._train_jit

    t0 = time.perf_counter()
    state = (_init_jit(apply_fn, params, x, y, hyper[1], loss=loss) if optimizer is None
             else optimizer_run._init_jit(apply_fn, params, x, y, hyper[0], loss=loss))
    step, _ = compiled(step_jit, state, x, y, batches[0], jnp.int32(1), *hyper,
                       static=(apply_fn,), **statics)
    lin = (compiled(_linear_jit, params, state.logits, params, x, static=(apply_fn,))[0]
           if record_logits else None)
    test_eval = None
    if record_test_curves:
        x_test = jnp.asarray(x_test)
        test_eval = compiled(_evaluate_jit, params, x_test, y_test, static=(apply_fn,),
                             loss=loss)[0]
    rec_t = None
    if telemetry is not False:
        spec = TelemetrySpec() if telemetry is True else telemetry
        xt = None if x_test is None else jnp.asarray(x_test)
        rec_t = Recorder(spec, apply_fn, params, x, y, xt, y_test, steps=int(steps),
                         batch_size=b, loss=loss)
        rec_t.compile(state, batches[0])
    t1 = time.perf_counter()
    seconds_per_step, compile_timing = _time_steps(train_jit, apply_fn, params,
                                                   state.opt_state, x, y, batches, hyper,
                                                   statics)
    t2 = time.perf_counter()
    rec = {"loss": [state.loss], "error": [state.error], "logits": [state.logits],
           "linear": [state.logits]}
    if test_eval is not None:
        test_loss, test_error, _ = test_eval(state.params, x_test, y_test)
        rec["test_loss"], rec["test_error"] = [test_loss], [test_error]
    if rec_t is not None:
        rec_t.after_update(0, state)
    for t in tqdm(range(1, int(steps) + 1), desc="fine-tuning", unit="step", leave=False,
                  disable=not progress):
        if rec_t is not None:
            rec_t.before_update(state, batches[t - 1])
        state = step(state, x, y, batches[t - 1], jnp.int32(t), *hyper)
        rec["loss"].append(state.loss)
        rec["error"].append(state.error)
        if test_eval is not None:  # at the last finite weights once stopped, as the loss
            test_loss, test_error, _ = test_eval(state.params, x_test, y_test)
            rec["test_loss"].append(test_loss)
            rec["test_error"].append(test_error)
        if rec_t is not None:
            rec_t.after_update(t, state)
        if int(state.stopped_at) >= 0:
            break
        if record_logits:
            rec["logits"].append(state.logits)
            rec["linear"].append(lin(params, rec["logits"][0], state.params, x))
    jax.block_until_ready(state)
    t3 = time.perf_counter()

    stop = int(state.stopped_at)
    held = {k: np.stack(v + v[-1:] * (int(steps) + 1 - len(v))) for k, v in rec.items()}
    div, spike = (int(a) for a in _verdict(jnp.asarray(held["loss"]), stop)[1:])
    if optimizer is not None:
        learning_rate = float(jnp.max(optimizer.learning_rates(int(steps))))
        momentum, nesterov = float(optimizer.momentum), optimizer.nesterov
    hp = dict(learning_rate=float(learning_rate), momentum=float(momentum),
              nesterov=bool(nesterov), batch_size=b, steps=int(steps), num_train=n)
    tele = None if rec_t is None else rec_t.finish(
        state, held["loss"], held["error"], stop, hp | dict(num_classes=c, loss_name=loss))
    acc = None
    if x_test is not None and len(y_test):
        acc = float(error_rate(apply_fn(state.params, jnp.asarray(x_test)), y_test))
        acc = 1.0 - acc
    return FineTuneRun(
        loss=held["loss"].astype(float), error=held["error"].astype(float), test_accuracy=acc,
        seconds_per_step=seconds_per_step,
        seconds={"compile": t1 - t0 + compile_timing, "timing": t2 - t1 - compile_timing,
                 "run": t3 - t2,
                 "finetune": seconds_per_step * (stop if stop >= 0 else int(steps))},
        diverged=div >= 0, diverged_at=div if div >= 0 else None,
        spiked_at=spike if spike >= 0 else None,
        **hp, loss_name=loss, params=state.params,
        logits=held["logits"] if record_logits else None,
        linear_logits=held["linear"] if record_logits else None, telemetry=tele,
        **{k: held[k].astype(float) for k in ("test_loss", "test_error") if k in held},
        optimizer=optimizer,
    )


def step_time(apply_fn: ApplyFn, params: Any, x: Any, y: Any, *,
              learning_rate: float | None = None, batch_size: int | None = None,
              momentum: float | None = None, nesterov: bool | None = None,
              loss: str = "cross_entropy", key: jax.Array | None = None,
              optimizer: Optimizer | None = None) -> float:
    """Measured seconds per real training step, without fine-tuning to the end.

    Compiles the optimiser step of :func:`finetune` (same arguments and semantics: the
    constant-η ``optax.sgd`` of the four shorthand keywords, or ``optimizer.to_optax()`` on
    ``optimizer.batch_size``) and times 5 warm steps from a fresh optimiser state on the
    first batches of ``ntk_tt.batch_indices(key, N, B, 5)``, compile time excluded. Multiply a
    predicted T_ε by it for the predicted wall-clock time.

    Source: METHOD.md §6 (wall-clock time = T_ε × measured time per step).

    Args:
      apply_fn: the model, ``apply_fn(params, x)`` → logits (N, C).
      params: its weights (the step runs in their dtype).
      x: training inputs (N, ...).
      y: integer labels (N,).
      learning_rate: η > 0, a real scalar (the constant-η SGD shorthand).
      batch_size: B (None = N, gradient descent).
      momentum: m ∈ [0, 1) (None: 0).
      nesterov: optax's Nesterov form (None: False).
      loss: "cross_entropy" or "mse", the mean over the minibatch.
      key: ``jax.random.key(seed)`` of the batch order, required when B < N.
      optimizer: an :class:`ntk_tt.Optimizer`, instead of the four shorthand keywords.

    Returns:
      Their mean wall time, a Python float in seconds per optimiser step.

    Raises:
      ValueError: as :func:`finetune`: ``optimizer`` with any of learning_rate, momentum,
        nesterov, batch_size (or neither), an ``optimizer`` that is not an
        :class:`ntk_tt.Optimizer`, B ∉ [1, N], SGD (B < N) without a key, bad labels or loss —
        before anything is compiled.
    """
    optimizer_run.check_shorthand(optimizer, where="step_time", learning_rate=learning_rate,
                                  momentum=momentum, nesterov=nesterov, batch_size=batch_size)
    momentum = 0.0 if momentum is None else momentum
    if optimizer is None:
        _check_hyper(learning_rate, momentum)
    else:
        batch_size = optimizer.batch_size
    check_key(key)
    x = as_array(x, "x")
    n, c = check_model(apply_fn, params, x)
    y = _labels(y, n, c, "y")
    check_loss(loss, c)
    batches = batch_indices(key, n, n if batch_size is None else batch_size, TIMING_STEPS)
    dtype = jnp.result_type(*jax.tree_util.tree_leaves(params))
    if optimizer is None:
        hyper = (jnp.asarray(learning_rate, dtype), jnp.asarray(momentum, dtype))
        train, state = _train_jit, optax.sgd(1.0, hyper[1]).init(params)
        statics = dict(nesterov=bool(nesterov), loss=loss)
    else:
        hyper = (optimizer_run.in_dtype(optimizer, dtype),)
        train, state = optimizer_run._train_jit, hyper[0].to_optax().init(params)
        statics = dict(loss=loss)
    return _time_steps(train, apply_fn, params, state, jnp.asarray(x), y, batches, hyper,
                       statics)[0]
