"""One optimiser description for prediction and fine-tuning (issue 27).

An :class:`Optimizer` holds the update rule (SGD with heavy-ball or Nesterov momentum, or
Adam), its hyperparameters as array leaves (so ``jit``, ``vmap`` and ``jax.grad`` act on
them), the learning-rate schedule (:mod:`ntk_tt._schedules`), the weight decay and the batch
size. The real fine-tune builds its optax transformation from it (:meth:`Optimizer.to_optax`)
and every predictor reads the same numbers, so prediction and reality cannot disagree on the
rule. Step t (0-based) uses η_t = ``learning_rate(t)``, as optax's ``scale_by_learning_rate``.

Update rules, with g_t the minibatch gradient of the MEAN loss and θ the weights:

* SGD: u_{t+1} = m·u_t + g̃_t; θ_{t+1} = θ_t − η_t·(d_t + λ_d·θ_t), d_t = u_{t+1} (heavy
  ball) or g̃_t + m·u_{t+1} (Nesterov), where g̃_t = g_t + λ_2·θ_t.
* Adam: m_{t+1} = β₁m_t + (1 − β₁)g̃_t, v_{t+1} = β₂v_t + (1 − β₂)g̃_t², d_t =
  m̂/(√v̂ + ε) with the bias corrections m̂ = m_{t+1}/(1 − β₁^{t+1}), v̂ likewise; then
  θ_{t+1} = θ_t − η_t·(d_t + λ_d·θ_t).

Weight decay λ is decoupled (λ_d = λ, λ_2 = 0: optax ``add_decayed_weights`` after the
direction, as ``optax.adamw``; SGDW) or L2 in the loss (λ_2 = λ, λ_d = 0: the penalty
λ/2·‖θ‖² added to the loss, its gradient λθ fed through momentum / Adam). It decays every
parameter (optax's default, no mask).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from ntk_tt._options import DECAY_RANGE, is_decay
from ntk_tt._schedules import Schedule, _concrete, _number, _schedule

RULES = ("sgd", "adam")


class Optimizer(eqx.Module):
    """An optimiser description (build it with :func:`sgd`, :func:`adam` or :func:`adamw`).

    Fields: ``rule`` ("sgd" | "adam", static), ``learning_rate`` (a :class:`Schedule`),
    ``momentum`` (SGD's m; Adam's β₁), ``b2`` and ``eps`` (Adam), ``weight_decay`` λ,
    ``decoupled`` (static: decoupled decay or L2 in the loss), ``nesterov`` (static, SGD),
    ``batch_size`` (static: None = full batch, N).

    Source: ntk_tt's own (issue 27; METHOD.md §11; README "Optimisers"): one description for
    the predictors and for the real run, which trains with its optax transformation.
    """

    rule: str = eqx.field(static=True)
    learning_rate: Schedule
    momentum: jax.Array
    b2: jax.Array
    eps: jax.Array
    weight_decay: jax.Array
    decoupled: bool = eqx.field(static=True, default=True)
    nesterov: bool = eqx.field(static=True, default=False)
    batch_size: int | None = eqx.field(static=True, default=None)

    def learning_rates(self, steps: int) -> jax.Array:
        """η_0 … η_{T−1}, (T,) (T = ``steps``: the number of updates, a static int ≥ 1; the
        hyperparameter leaves may be traced, under ``jit`` / ``vmap`` / ``grad``).

        Raises:
          ValueError: ``steps`` not an int (a bool, a float, a tracer) or < 1.
        """
        return self.learning_rate.values(steps)  # Schedule.values checks steps

    def to_optax(self) -> optax.GradientTransformation:
        """The optax transformation of this rule (what ``finetune`` trains with)."""
        wd = self.weight_decay
        if self.rule == "sgd":
            direction = optax.trace(decay=self.momentum, nesterov=self.nesterov)
        else:
            direction = optax.scale_by_adam(b1=self.momentum, b2=self.b2, eps=self.eps)
        parts = ([optax.add_decayed_weights(wd)] if not self.decoupled else []) + [direction]
        if self.decoupled:
            parts.append(optax.add_decayed_weights(wd))
        parts.append(optax.scale_by_learning_rate(self.learning_rate))
        return optax.chain(*parts)

    @property
    def label(self) -> str:
        """A short human description, e.g. ``adamw(b=50)``."""
        name = ("adamw" if self.decoupled else "adam") if self.rule == "adam" else "sgd"
        return f"{name}(B={'N' if self.batch_size is None else self.batch_size})"


def _batch(batch_size) -> int | None:
    if batch_size is None:
        return None
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int or None (full batch), got "
                         f"{batch_size!r}.")
    return int(batch_size)


def _in_range(value, name, low, high, *, closed_low=True) -> jax.Array:
    """``value`` as a float leaf (:func:`ntk_tt._schedules._number`), its concrete input
    checked in [low, high) (or (low, high)); tracers and arrays pass."""
    leaf = _number(value, name)
    v = _concrete(value)
    if v is not None and not (((low <= v) if closed_low else (low < v)) and v < high):
        bound = "[" if closed_low else "("
        raise ValueError(f"{name} must be in {bound}{low}, {high}), got {v}.")
    return leaf


def _decay_rate(value, name) -> jax.Array:
    """A momentum or Adam decay rate as a float leaf, its concrete input checked in
    ``DECAY_RANGE`` (below 1 in float32 too); tracers and arrays pass."""
    leaf = _number(value, name)
    v = _concrete(value)
    if v is not None and not is_decay(v):
        raise ValueError(f"{name} must be in {DECAY_RANGE}, got {v}.")
    return leaf


def sgd(learning_rate, momentum=0.0, *, nesterov: bool = False, weight_decay=0.0,
        decoupled: bool = True, batch_size: int | None = None) -> Optimizer:
    """SGD / GD with heavy-ball or Nesterov momentum, a learning-rate schedule and weight decay
    (optax ``sgd`` chained with ``add_decayed_weights``; module docstring for the rule).

    Args:
      learning_rate: a number, a schedule (:func:`ntk_tt.warmup_cosine`, ...), any optax
        schedule or callable ``step -> η``.
      momentum: m in [0, 1). nesterov: Nesterov momentum (optax form; needs m > 0).
      weight_decay: λ >= 0. decoupled: True: θ ← θ − η_t·λθ beside the step (SGDW); False:
        λ/2·‖θ‖² in the loss.
      batch_size: B (None: full batch, GD).

    Returns:
      An :class:`Optimizer` with rule "sgd" (``to_optax()`` builds the optax transformation;
      ``learning_rate`` becomes a :class:`ntk_tt.Schedule`, :func:`ntk_tt.schedule`).

    Source: ntk_tt's own (issue 27; METHOD.md §11); the rule is optax's ``trace`` (heavy
    ball / Nesterov), with decoupled decay as SGDW (Loshchilov & Hutter 2019).

    Raises:
      ValueError: one line naming a bad argument (e.g. nesterov=True with momentum 0, a
        callable learning rate that cannot take one step argument), before any work; when
        η_t is first computed, a callable that returns no real η per step.
    """
    return _make("sgd", learning_rate, momentum, 0.999, 1e-8, weight_decay, decoupled,
                 nesterov, batch_size)


def adam(learning_rate, b1=0.9, b2=0.999, eps=1e-8, *, weight_decay=0.0,
         batch_size: int | None = None) -> Optimizer:
    """Adam (optax ``adam``), with L2 weight decay in the loss when ``weight_decay`` > 0
    (use :func:`adamw` for decoupled decay; the predictors refuse Adam with L2 decay, which
    enters the elementwise moments).

    Source: Kingma & Ba 2015 (the rule, as optax ``adam``); the description is ntk_tt's own
    (issue 27; METHOD.md §11).

    Args:
      learning_rate: η_t, as :func:`sgd` (a number, a schedule, or a callable step -> η).
      b1, b2: the moments' decay rates β₁, β₂ in [0, 1). eps: ε > 0 of √v̂ + ε.
      weight_decay: λ >= 0 (λ/2·‖θ‖² in the loss). batch_size: B (None: full batch).

    Returns:
      An :class:`Optimizer` with rule "adam" (``to_optax()`` builds the optax transformation).

    Raises:
      ValueError: one line naming a bad argument, before any work: a learning rate that is
        not a number, schedule or callable of one step argument, or is not finite and > 0;
        b1 or b2 outside [0, 1); eps <= 0; weight_decay < 0; batch_size not None or an
        int >= 1.
    """
    return _make("adam", learning_rate, b1, b2, eps, weight_decay, False, False, batch_size)


def adamw(learning_rate, b1=0.9, b2=0.999, eps=1e-8, *, weight_decay=1e-4,
          batch_size: int | None = None) -> Optimizer:
    """AdamW (optax ``adamw``: decoupled weight decay θ ← θ − η_t·λθ beside the Adam step,
    Loshchilov & Hutter 2019).

    Source: Loshchilov & Hutter 2019 (the rule, as optax ``adamw``); the description is
    ntk_tt's own (issue 27; METHOD.md §11).

    Args:
      learning_rate, b1, b2, eps, batch_size: as :func:`adam`. weight_decay: λ >= 0,
        decoupled (default 1e-4).

    Returns:
      An :class:`Optimizer` with rule "adam" and decoupled decay.

    Raises:
      ValueError: as :func:`adam`.
    """
    return _make("adam", learning_rate, b1, b2, eps, weight_decay, True, False, batch_size)


def _make(rule, learning_rate, momentum, b2, eps, weight_decay, decoupled, nesterov,
          batch_size) -> Optimizer:
    for name, flag in (("nesterov", nesterov), ("decoupled", decoupled)):
        if not isinstance(flag, (bool, np.bool_)):
            raise ValueError(f"{name} must be True or False, got {flag!r}.")
    mom_name = "momentum" if rule == "sgd" else "b1"
    momentum_leaf = _decay_rate(momentum, mom_name)
    if nesterov and _concrete(momentum) == 0.0:
        raise ValueError("Nesterov needs momentum > 0: sgd(..., nesterov=True) with momentum 0 "
                         "is plain (S)GD; pass e.g. momentum=0.9 or drop nesterov=True.")
    b2 = _decay_rate(b2, "b2")
    eps = _in_range(eps, "eps", 0.0, np.inf, closed_low=False)
    weight_decay = _in_range(weight_decay, "weight_decay", 0.0, np.inf)
    with jax.ensure_compile_time_eval():  # constants stay concrete inside jit (tracers pass)
        leaves = [jnp.asarray(v) for v in (momentum_leaf, b2, eps, weight_decay)]
    return Optimizer(rule, _schedule(learning_rate, "learning_rate"), *leaves,
                     bool(decoupled), bool(nesterov), _batch(batch_size))
