"""When a loss curve DIVERGED or SPIKED: one rule for real fine-tuning runs and predictions.

Above the linear model's stability edge a real network can spike and then converge (the
catapult phase, Lewkowycz et al. 2020), so a loss far above L_0 at some step is not
divergence. A curve (T + 1,) of full-training-set mean losses, index t = after t updates:

* DIVERGED iff some L_t is non-finite, or it has not recovered by the end of the budget:
  L_T > L_0. Strictly above: a run that ends where it started (e.g. a learning rate too small
  to move float32 weights) has not blown up. Below the stability edge the full-batch loss
  falls at every step, so ending above the start means an instability training has not undone
  within T steps; the one benign case the rule would also flag is SGD noise around a start
  that is already at the noise floor, which a fine-tune of a fresh head never is.
  ``diverged_at`` = the step its final excursion above L_0 began: 1 + the last step before
  the first non-finite one (or ≤ T when all are finite) with L_t ≤ L_0; −1 if not diverged.
* SPIKED at the first step t ≥ 1 with L_t > ``SPIKE_FACTOR``·L_0 (a non-finite L_t counts);
  −1 if none. Independent of ``diverged``: spiked and not diverged = spiked and recovered.

A PREDICTION's verdict on the real run (:func:`verdict`, ``VERDICTS``) is tri-state: "yes" when
the predicted curve diverged; "no" when it did not and κ = η·λ_max/N is within the linearised
model's stability edge (``_predict_kernel._edge``: 2(1 + m)/h, h = 1 for MSE, ½ for
cross-entropy); "unknown" when it did not but κ is beyond that edge. Beyond the edge the
linearised dynamics no longer bound the real ones, and a "no" there would be a guess: in the
committed benchmark and telemetry corpus no real run within the edge diverged (0 of 140 and 0
of 640), beyond it 9 of 76 and 150 of 384 did, from 1.3 times the edge on (m = 0.9), and the
predictors' "no" missed 8 of the benchmark's 9 (README, "Divergence"). The frozen-kernel
cross-entropy recursion cannot diverge at all (its gradient softmax − y is bounded), so its
curve beyond the edge is no evidence either way.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

SPIKE_FACTOR = 10.0
NO, YES, UNKNOWN = 0, 1, 2
VERDICTS = ("no", "yes", "unknown")  # indexed by the codes of :func:`verdict`


class Divergence(NamedTuple):
    """Result of :func:`divergence`: ``diverged`` bool, ``diverged_at`` and ``spiked_at``
    int32 steps (−1 for none), each with the leading axes of the curves given."""

    diverged: jax.Array
    diverged_at: jax.Array
    spiked_at: jax.Array


def first_nonfinite(curve: jax.Array) -> jax.Array:
    """First step whose entry of ``curve`` (..., T + 1) is non-finite; T + 1 if none (int32)."""
    bad = ~jnp.isfinite(curve)
    return jnp.where(jnp.any(bad, -1), jnp.argmax(bad, -1), curve.shape[-1]).astype(jnp.int32)


def divergence(loss_curve: jax.Array) -> Divergence:
    """Apply the module's rule to loss curves (..., T + 1); pure and jittable.

    Args:
      loss_curve: mean losses, index t = after t updates, AS COMPUTED: a step that blew up
        must be non-finite (not held at a previous value); what follows it is ignored.

    Returns:
      :class:`Divergence` with the shape ``loss_curve.shape[:-1]``.
    """
    curve = jnp.asarray(loss_curve)
    l0 = curve[..., :1]
    t = jnp.arange(curve.shape[-1])
    nonfinite_at = first_nonfinite(curve)
    within = (curve <= l0) & (t < nonfinite_at[..., None])
    diverged = (nonfinite_at < curve.shape[-1]) | ~(curve[..., -1] <= l0[..., 0])
    last_within = jnp.max(jnp.where(within, t, -1), -1)
    spiked = ~(curve <= SPIKE_FACTOR * l0) & (t >= 1)
    return Divergence(
        diverged=diverged,
        diverged_at=jnp.where(diverged, last_within + 1, -1).astype(jnp.int32),
        spiked_at=jnp.where(jnp.any(spiked, -1), jnp.argmax(spiked, -1), -1).astype(jnp.int32))


def hold_from(curve: jax.Array, step: jax.Array) -> jax.Array:
    """``curve`` (T + 1,) with the entries from ``step`` (≥ 1) on replaced by ``curve[step −
    1]``; unchanged when ``step`` > T. Curves past a non-finite loss keep the last finite one."""
    t = jnp.arange(curve.shape[0])
    return jnp.where(t < step, curve, curve[jnp.clip(step - 1, 0, curve.shape[0] - 1)])


def verdict(diverged: jax.Array, beyond_edge: jax.Array) -> jax.Array:
    """The module's tri-state verdict of a prediction on the real run, as int32 codes
    (``VERDICTS[code]``): YES (1) where ``diverged``, else UNKNOWN (2) where ``beyond_edge``
    (κ beyond the linearised model's stability edge), else NO (0). Pure and jittable; the two
    bool arrays broadcast."""
    return jnp.where(diverged, YES, jnp.where(beyond_edge, UNKNOWN, NO)).astype(jnp.int32)
