"""The spectrum's MSE curve under a full-batch SGD-family optimiser (issue 27; METHOD.md §7).

For the mean MSE loss and B = N, :func:`ntk_tt.sgd_trajectory`'s recursion
(:mod:`ntk_tt.dynamics._optim_linear`, METHOD.md §11) without weight decay is linear in the
residual r_t = f_t − Y with the operator Θ/N, so in Θ's eigenbasis (Θ/N = Σ_k μ_k v_k v_kᵀ) each
mode k follows its own scalar second-order recursion, exactly (no η/(1 − m) approximation):

    d_t = μ_k r_t,   h_{t+1} = m h_t + d_t,   h_0 = 0,
    r_{t+1} = r_t − η_t h_{t+1}               (heavy ball; m = 0 is GD)
    r_{t+1} = r_t − η_t (d_t + m h_{t+1})     (Nesterov, optax form),

with η_t = ``optimizer.learning_rates(T)[t]``, the schedule as the real run steps it. Run from
r_0 = 1 it gives ρ_{t,k}, with r_{t,k} = ρ_{t,k} (v_k · δy), so L_t = (1/2N) Σ_k ρ_{t,k}² p_k
(O(K) memory, O(K·T) work). A constant η with m = 0 is the constant-η keyword path
(:func:`constant_rate`), whose closed form (1 − η μ_k)^(2t) it returns bit for bit.

Refused, because a spectrum (exact, extrapolated or Nyström) does not carry what they need:
weight decay (it acts on J·θ0, whose projections on the eigenvectors are unknown), minibatches
(Θ[:, B] is not diagonal in Θ's eigenbasis: the modes couple) and Adam (elementwise moments
mix the modes). ``ntk_tt.predict(..., optimizer=opt)`` predicts those from the full kernel.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._options import MAX_STEPS, _is_int
from ntk_tt._schedules import Constant, _concrete
from ntk_tt.dynamics._adam_head_aware import _maybe_nonzero
from ntk_tt.dynamics._optim_linear import check_learning_rates, check_shorthand, sgd_update

SUPPORTS = ("constant-η full-batch GD (learning_rate=) and the SGD family at full batch without "
            "weight decay (optimizer=ntk_tt.sgd(schedule, momentum, nesterov=...))")
FULL_KERNEL = "ntk_tt.predict(..., optimizer=opt), which uses the full kernel"


def check_real_field(value, name: str) -> None:
    """ValueError naming ``name`` (e.g. "spectrum.eigenvalues") unless ``value`` holds real
    numbers (int or float dtype, concrete or traced): a complex array (numpy would drop the
    imaginary part with a ComplexWarning) or strings and objects are refused before any work.
    """
    dtype = value.dtype if isinstance(value, jax.core.Tracer) else np.asarray(value).dtype
    if dtype.kind not in "iuf" and not jnp.issubdtype(dtype, jnp.floating):  # bfloat16: 'V'
        raise ValueError(f"{name} must be real numbers, got " + (
            f"complex values ({dtype}): take the real part, np.real(...), if the imaginary "
            "parts are rounding (a symmetric kernel's eigh gives real eigenvalues, eig may not)"
            if dtype.kind == "c" else f"dtype {dtype} (not all numbers): pass a float array")
            + "; ntk_tt.kernel_spectrum(kernel, residual) builds a Spectrum.")


def check_spectrum_optimizer(optimizer, num_samples: int, steps, *, where: str,
                             **shorthand) -> float:
    """One ValueError, before any work, unless ``optimizer`` is an SGD-family
    :class:`ntk_tt.Optimizer` at full batch (B None or N = ``num_samples``) without weight
    decay, given without the constant-η keywords (``shorthand``, by name; None = not given),
    with ``steps`` an int in [1, MAX_STEPS] and a valid schedule over them
    (:func:`ntk_tt.dynamics._optim_linear.check_learning_rates`). Returns the peak η_t."""
    check_shorthand(optimizer, where=where, **shorthand)
    if optimizer.rule != "sgd":
        raise ValueError(
            f"{where} predicts {SUPPORTS} only, got {optimizer.label}: Adam's elementwise "
            "moments mix the eigenmodes, so neither a spectrum nor a frozen kernel "
            "(ntk_tt.predict_from_kernel) carries it; use ntk_tt.predict(..., "
            "head=ntk_tt.split_head(model), optimizer=opt) (the head-aware Adam predictor).")
    if _maybe_nonzero(optimizer.weight_decay):
        raise ValueError(
            f"{where} predicts {SUPPORTS} only: weight decay acts on J·θ0, whose projections "
            "on the kernel's eigenvectors a spectrum does not have; use weight_decay=0, or "
            f"{FULL_KERNEL}.")
    b = optimizer.batch_size
    if b is not None and b != num_samples:
        raise ValueError(
            f"{where} predicts full-batch training only (B = N = {num_samples}), got "
            f"batch_size={b}: minibatches couple the eigenmodes (Θ[:, B] is not diagonal in "
            f"Θ's eigenbasis); use batch_size=None, or {FULL_KERNEL} (its SGD paths).")
    if not _is_int(steps) or not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be an int >= 1 and <= {MAX_STEPS:,} (optimiser updates), "
                         f"got {steps!r}.")
    return check_learning_rates(optimizer, int(steps))


def constant_rate(optimizer) -> float | None:
    """η of a constant schedule with momentum 0 (plain GD: the keyword path's closed form, bit
    for bit), else None."""
    if isinstance(optimizer.learning_rate, Constant) and _concrete(optimizer.momentum) == 0.0:
        return float(optimizer.learning_rate.value)
    return None


def sgd_spectrum_curve(eigenvalues, projections, num_samples: int, optimizer,
                       steps: int) -> jax.Array:
    """L_t = (1/2N) Σ_k ρ_{t,k}² p_k, t = 0..T, for a checked ``optimizer`` (module docstring).

    Args:
      eigenvalues: μ_k = λ_k / N, (K,). projections: p_k, (K,), the same dtype.
      num_samples: N. optimizer: checked by :func:`check_spectrum_optimizer`. steps: T.

    Returns:
      The mean MSE loss curve (T + 1,) in the spectrum's dtype; non-finite once a mode's
      recursion overflows (beyond the stability edge).
    """
    dtype = eigenvalues.dtype
    rates = jnp.asarray(optimizer.learning_rates(steps), dtype)
    curve = _mode_curve(eigenvalues, projections, rates, jnp.asarray(optimizer.momentum, dtype),
                        nesterov=optimizer.nesterov)
    return curve / (2 * num_samples)


@partial(jax.jit, static_argnames="nesterov")
def _mode_curve(mu, p, rates, m, *, nesterov):
    """Σ_k ρ_{t,k}² p_k for t = 0..T (T = len(rates)), ρ_0 = 1, h_0 = 0."""

    def step(carry, lr):
        r, h = carry
        r, h = sgd_update(r, h, mu * r, None, lr, m, 0.0, 0.0, nesterov)  # d_t = μ_k r_t
        return (r, h), (r * r) @ p

    _, tail = jax.lax.scan(step, (jnp.ones_like(mu), jnp.zeros_like(mu)), rates)
    return jnp.concatenate([jnp.sum(p)[None], tail])

