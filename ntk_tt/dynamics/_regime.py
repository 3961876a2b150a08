"""Where an Adam prediction leaves the linearised regime: the weight-travel bound (issue 27).

Adam moves every weight by about η_t per step whatever its gradient's size (|m̂_t/√v̂_t| is
of order 1), so over T steps no backbone weight moves by more than about Σ_{t<T} η_t. Against
the backbone's RMS weight that bounds the relative weight change, the usual measure of
whether a network stays in its linearised ("lazy") regime (Chizat, Oyallon & Bach 2019;
Lee et al. 2019, arXiv 1902.06720):

    ρ = Σ_{t<T} η_t / rms(θ_0),   rms(θ_0) = ‖θ_0‖ / √D  over the backbone's D weights.

The head-aware Adam predictor keeps the head exact and linearises the backbone, so ρ says how
far the backbone may leave its linearisation. On the optimiser benchmark (README "Optimiser
benchmark": the shipped SmallResNet, AdamW warmup + cosine, T = 150, four target sets at
N = 250) the T_ε error pooled over ε ∈ {0.1, 0.4} has p95 18 % at ρ = 0.058 and 26, 32, 37,
35, 32 % at ρ = 0.087, 0.12, 0.17, 0.29, 0.58: beyond ρ ≈ 0.07 the real loss falls later
than predicted, then accelerates and ends far lower (median final loss 0.6× the predicted
at ρ = 0.17, 0.07× at 0.58). :data:`LINEAR_TRAVEL` is that measured threshold, not a law:
other backbones and schedules may leave the regime earlier or later (at N = 750 the same
ρ = 0.058 gave p95 23 %).

Beyond :data:`UNKNOWN_TRAVEL` (ρ = 1: the backbone's weights may move by more than their own
RMS) a prediction abstains: its outcome is "unknown" (``ntk_tt.predict``). On the shipped
checkpoint with flowers5 (N = 50, AdamW warmup + cosine, T = 60; ``python
experiments/adam_travel_edge.py``) the predictor called "converges" within 22 % of the real
T_0.1 at ρ = 0.23 and 0.70, and at ρ = 2.3, 7.0 and 23 predicted the loss falling to 2e-4,
2e-6 and 2e-9, while the real runs spiked (catapult: T_0.1 59 and 86 % later than predicted)
or were destroyed (ρ = 23: a spike above 10·L_0, then the loss of a uniform guess, ln K).
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._schedules import _concrete
from ntk_tt.dynamics._edge_warnings import BeyondEdgeWarning

LINEAR_TRAVEL = 0.07
"""ρ above which an Adam prediction warns (:class:`LinearRegimeWarning`); README "Optimiser
benchmark" has the measurements it rests on."""


class LinearRegimeWarning(BeyondEdgeWarning):
    """An Adam-family prediction whose schedule lets the backbone's weights move by more than
    :data:`LINEAR_TRAVEL` of their RMS (ρ = Σ η_t / rms(θ_0)): the real run can leave the
    linearised regime (on the benchmark its loss fell later, then lower than predicted; beyond
    :data:`UNKNOWN_TRAVEL` runs spiked or were destroyed, and the prediction abstains). A
    subclass of :class:`BeyondEdgeWarning`, so ``ntk-tt predict`` prints it as a warning line
    and its ``--json`` report keeps it.

    Source: ntk_tt's own (issue 27; METHOD.md §11; README "Where the Adam predictor holds"):
    the threshold is measured, not derived."""


UNKNOWN_TRAVEL = 1.0
"""ρ above which an Adam prediction's outcome is "unknown" (module docstring: between the
largest ρ measured to converge as predicted, 0.70, and the smallest measured not to, 2.3)."""


def weight_travel(learning_rates, params) -> float:
    """ρ = Σ_t η_t / rms(θ_0): Adam's bound on the backbone's relative weight change.

    Source: ntk_tt's own (issue 27; METHOD.md §11, "Where the Adam predictor holds"), after
    the lazy-regime measure of Chizat, Oyallon & Bach 2019 and Lee et al. 2019.

    Args:
      learning_rates: η_t ≥ 0 for the T steps (T,) (``Optimizer.learning_rates(T)``), per
        step.
      params: the backbone's weights θ_0 (a pytree; ``split_head(model)[1]``). Only its
        floating-point array leaves are weights: integer, boolean and PRNG-key leaves (a step
        counter, an RNG state) and None are skipped.

    Returns:
      ρ as a float (dimensionless; ``inf`` when every weight is 0 and Σ η_t > 0, 0 when
      Σ η_t = 0).

    Raises:
      ValueError: ``learning_rates`` not a 1-D array of finite real numbers ≥ 0; ``params``
        with no floating-point leaves or with NaN or inf weights.
    """
    try:
        lrs = np.asarray(learning_rates)
        ok = lrs.ndim == 1 and lrs.dtype.kind in "biuf"
        lrs = lrs.astype(np.float64) if ok else None
    except (TypeError, ValueError):
        lrs = None
    if lrs is None or not np.all(np.isfinite(lrs)) or np.any(lrs < 0):
        if lrs is None:
            shape = getattr(learning_rates, "shape", None)  # (a ragged list has none)
            got = type(learning_rates).__name__ + ("" if shape is None else f" of shape {shape}")
        else:  # the first bad entry, not the whole schedule (thousands of steps)
            t = int(np.argmax(~np.isfinite(lrs) | (lrs < 0)))
            got = f"η_{t} = {lrs[t]:g} (of {lrs.size} steps)"
        raise ValueError(f"weight_travel needs learning_rates as a 1-D array of finite real "
                         f"numbers >= 0 (η_t per step: Optimizer.learning_rates(T)), got {got}.")
    return _ratio(float(np.sum(lrs)), backbone_rms(params))


def backbone_rms(params) -> float:
    """rms(θ_0) = ‖θ_0‖ / √D of the backbone's weights, the scale :func:`weight_travel`
    divides by (and ``AdamKernel.weight_rms``).

    Args:
      params: the backbone's weights θ_0 (a pytree; ``split_head(model)[1]``). Only its
        floating-point array leaves are weights (D their total size): integer, boolean and
        PRNG-key leaves and None are skipped.

    Returns:
      rms(θ_0) ≥ 0 as a float.

    Raises:
      ValueError: ``params`` with no floating-point leaves or with NaN or inf weights.
    """
    leaves = [np.asarray(leaf, np.float64) for leaf in jax.tree.leaves(params)
              if _is_weight(leaf)]
    size = sum(leaf.size for leaf in leaves)
    if size == 0:
        raise ValueError("ρ needs the backbone's weights (a pytree of floating-point arrays, "
                         "split_head(model)[1]); got no floating-point leaves.")
    if not all(np.all(np.isfinite(leaf)) for leaf in leaves):
        raise ValueError("the backbone's weights hold NaN or inf; pass the pre-trained "
                         "weights θ_0 (split_head(model)[1]).")
    return float(np.sqrt(sum(float(np.sum(v ** 2)) for v in leaves) / size))


def _ratio(total: float, rms: float) -> float:
    """ρ = Σ η_t / rms: ``inf`` for rms = 0 and Σ η_t > 0, 0 for Σ η_t = 0."""
    return total / rms if rms > 0 else (float("inf") if total > 0 else 0.0)


def kernel_travel(optimizer, steps: int, weight_rms, stacklevel: int) -> float | None:
    """ρ of an Adam-family ``optimizer`` over ``steps`` from the backbone's
    ``weight_rms`` (``AdamKernel.weight_rms``), warned as :func:`warn_travel`;
    ``stacklevel`` as in a ``warnings.warn`` in the caller of this function (2: the
    caller's caller).

    The kernel-level Adam entry points (``predict_head_aware``, ``sensitivities``) never see
    the backbone's weights; the AdamKernel carries their RMS instead. Returns None (and warns
    nothing) for SGD, a ``weight_rms`` of None, or a traced learning rate or ``weight_rms``
    (``jit`` / ``vmap`` / ``grad`` over the call: the values are unknown there).
    """
    rms = None if weight_rms is None else _concrete(weight_rms)
    if getattr(optimizer, "rule", None) != "adam" or rms is None:
        return None
    with jax.ensure_compile_time_eval():  # a schedule closed over by jit is still concrete
        lrs = optimizer.learning_rates(int(steps))
    if isinstance(lrs, jax.core.Tracer):
        return None
    travel = _ratio(float(np.sum(np.asarray(lrs, np.float64))), rms)
    warn_travel(travel, stacklevel=stacklevel + 2)  # + this and warn_travel
    return travel


def abstain_beyond_travel(result, optimizer, steps: int, weight_rms):
    """``result`` (a NamedTuple with int32 ``outcome`` and bool ``beyond_edge``, and maybe
    ``spike_step``: a KernelPrediction or OptimizerSensitivities) of an Adam-family
    ``optimizer`` over ``steps`` as ``ntk_tt.predict`` reports it: ``beyond_edge`` is
    ρ = Σ η_t / ``weight_rms`` > :data:`UNKNOWN_TRAVEL` (κ does not measure Adam), and there,
    unless its own curve diverges, the outcome is "unknown" (``ABSTAINS``, spike_step −1).
    Computed in JAX, so it holds under ``jit`` / ``vmap`` / ``grad`` with a traced schedule or
    ``weight_rms`` too. Unchanged for SGD or a ``weight_rms`` of None."""
    if getattr(optimizer, "rule", None) != "adam" or weight_rms is None:
        return result
    from ntk_tt.dynamics._divergence import ABSTAINS, DIVERGES

    lrs = jnp.asarray(optimizer.learning_rates(int(steps)))
    beyond = jnp.sum(lrs) / jnp.asarray(weight_rms, lrs.dtype) > UNKNOWN_TRAVEL  # Σ/0: inf
    abstains = beyond & (result.outcome != DIVERGES)  # its own curve blew up: that call stands
    out = result._replace(
        beyond_edge=jnp.broadcast_to(beyond, jnp.shape(result.beyond_edge)),
        outcome=jnp.where(abstains, ABSTAINS, result.outcome).astype(result.outcome.dtype))
    if hasattr(result, "spike_step"):
        out = out._replace(spike_step=jnp.where(abstains, -1, result.spike_step).astype(
            result.spike_step.dtype))
    return out


def _is_weight(leaf) -> bool:
    """A floating-point array leaf (not an integer counter, a bool, a PRNG key or a string)."""
    dtype = getattr(leaf, "dtype", None)
    if dtype is None:
        return isinstance(leaf, float)
    return jax.dtypes.issubdtype(dtype, np.floating)


def warn_travel(travel: float, stacklevel: int) -> None:
    """:class:`LinearRegimeWarning` when ``travel`` (ρ) exceeds :data:`LINEAR_TRAVEL`; beyond
    :data:`UNKNOWN_TRAVEL` it says the prediction abstains."""
    if travel > UNKNOWN_TRAVEL:
        what = (f" Beyond ρ = {UNKNOWN_TRAVEL:g} the prediction abstains (outcome \"unknown\") "
                "unless its own curve diverges: real runs measured there spiked or were "
                "destroyed while the linearised model's loss fell to 0, so whether this run "
                "trains, stalls or diverges is not predicted.")
    elif travel > LINEAR_TRAVEL:
        what = (" On the optimiser benchmark (ρ up to 0.58) T_ε was then 17-21 % off at the "
                "95th percentile with the default diagonal kernel (isotropic: 26-37 %), against "
                "13 % (18 %) below 0.07, and the real loss ended up to 7 times lower than "
                "predicted.")
    else:
        return
    warnings.warn(
        f"Adam's schedule lets the backbone's weights move by up to ρ = Σ η_t / rms(θ_0) = "
        f"{travel:.2g} of their RMS, beyond the linearised regime (ρ > {LINEAR_TRAVEL:g}): the "
        f"real loss curve can depart from the predicted one.{what} Check it with a short real "
        "run, or lower the peak learning rate or the steps.", LinearRegimeWarning,
        stacklevel=stacklevel)
