"""One Adam kernel for several batch sizes (issue 27: the fast Adam predictor's cost).

With the drifting profile (:mod:`ntk_tt.dynamics._adam_drift`) the preconditioned kernel of
batch size B is K_P(B) = K(λ_ref)/√κ_B, K(λ) = J_h diag(1/(√w(λ) + ε)) J_hᵀ, with
κ_B = 1 + c_B·ν, λ_B = c_B·ν/κ_B, c_B = (N − B)/(B(N − 1)), ν = Σσ²/‖g_0‖² and
λ_ref = max(λ_B, min_ref_mix) (``adam_head_aware_kernel`` scales Adam's ε by √κ_B so that
this holds exactly). Every batch size whose λ_B is at or below the floor has the same λ_ref,
so its kernel is another's times √(κ_B/κ_B'): no second empirical NTK. With the default
diagonal K_P (floor 1/2) that covers B = 50 and GD on the benchmark's tasks at N = 250 and
750 and on the unseen tasks (λ_B = 0.09–0.37 at B = 50).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt.dynamics._adam_drift import DriftTable
from ntk_tt.dynamics._adam_head_aware import AdamKernel
from ntk_tt.kernels._head_aware import HeadAwareKernel

__all__ = ["adam_kernel_for_batch"]


def _mix(table: DriftTable, n: int, batch_size: int) -> tuple[float, float]:
    """(κ_B, λ_B) of batch size B from the table's ν (module docstring)."""
    c_b = 0.0 if batch_size == n else (n - batch_size) / (batch_size * (n - 1))
    kappa = 1.0 + c_b * float(table.noise)
    return kappa, c_b * float(table.noise) / kappa


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _checked(ak, batch_size) -> tuple[AdamKernel, int, int]:
    """(ak, N, B) after the argument checks of :func:`adam_kernel_for_batch`: ``ak``'s table
    consistent with its batch size (κ = 1 + c_Bν, λ_ref = max(λ_B, floor)), so a hand-edited
    kernel is refused rather than rescaled into a wrong one."""
    rebuild = "build it with ntk_tt.adam_head_aware_kernel(..., optimizer)."
    if not isinstance(ak, AdamKernel) or not isinstance(ak.precond, HeadAwareKernel):
        raise ValueError(f"ak must be an AdamKernel (ntk_tt.adam_head_aware_kernel(...)), got "
                         f"{type(ak).__name__}" + ("" if not isinstance(ak, AdamKernel) else
                                                   " whose precond is not a HeadAwareKernel") +
                         ".")
    if ak.drift is None:
        raise ValueError("ak was built with profile='frozen', whose v̄ = g_0² + c_B·σ² has no "
                         "reference profile shared between batch sizes: " + rebuild)
    if not isinstance(ak.drift, DriftTable):
        raise ValueError(f"ak.drift must be the DriftTable of adam_head_aware_kernel, got "
                         f"{type(ak.drift).__name__}: " + rebuild)
    leaves = (*ak.drift, ak.hk.features, ak.batch_size, batch_size)
    if any(isinstance(v, jax.core.Tracer) for v in leaves):
        raise ValueError("adam_kernel_for_batch needs a concrete AdamKernel and batch size (they "
                         "decide whether the kernel is shared): call it outside jax.jit / vmap "
                         "/ grad.")
    n = int(np.shape(ak.hk.features)[0])
    bsz = n if batch_size is None else batch_size
    if not _is_int(bsz) or not 1 <= bsz <= n:
        raise ValueError(f"batch_size must be None (full batch) or an integer in [1, N = {n}], "
                         f"got {batch_size!r}.")
    own = ak.batch_size
    table = ak.drift
    scalars = [float(np.asarray(v)) for v in (table.noise, table.kappa, table.ref, table.floor)]
    ok = _is_int(own) and 1 <= own <= n and all(np.isfinite(scalars)) and scalars[0] >= 0 \
        and 0.0 <= scalars[3] <= 1.0
    if ok:
        kappa, lam = _mix(table, n, int(own))
        ok = np.isclose(scalars[1], kappa, rtol=1e-4) \
            and np.isclose(scalars[2], max(lam, scalars[3]), rtol=1e-4, atol=1e-6)
    if not ok:
        raise ValueError(f"ak's table does not match its batch size {own!r} (κ = 1 + c_B·ν, "
                         f"λ_ref = max(λ_B, floor) in [0, 1], ν >= 0; got κ = {scalars[1]:.6g}, "
                         f"λ_ref = {scalars[2]:.6g}, ν = {scalars[0]:.6g}, floor = "
                         f"{scalars[3]:.6g}): an edited AdamKernel; " + rebuild)
    return ak, n, int(bsz)


def shares_reference(ak: AdamKernel, batch_size: int | None) -> bool:
    """Whether :func:`adam_kernel_for_batch` can give ``ak``'s kernel for ``batch_size``: the
    same B, or both ``ak``'s λ_B and the new one at or below the floor (``ak``'s λ_ref is its
    floor, stored: a λ_B above it is λ_ref itself, whatever the rounding).

    Raises:
      ValueError: as :func:`adam_kernel_for_batch`'s argument checks.
    """
    return _shares(*_checked(ak, batch_size))


def _shares(ak: AdamKernel, n: int, bsz: int) -> bool:
    """:func:`shares_reference` for checked arguments."""
    if bsz == ak.batch_size:
        return True
    floor = float(ak.drift.floor)
    return float(ak.drift.ref) == floor and _mix(ak.drift, n, bsz)[1] <= floor


def adam_kernel_for_batch(ak: AdamKernel, batch_size: int | None) -> AdamKernel:
    """``ak`` (built for one batch size) for another batch size, without a new empirical NTK:
    K_P and its held-out cross kernel scaled by √(κ_B/κ_B'), the table's κ replaced, the rest
    (plain kernel, calibration γ, ε, loss, labels, σ² estimate) kept. Equal, to rounding, to
    ``ntk_tt.adam_head_aware_kernel(..., optimizer with batch_size)`` on the same inputs with
    the same ``min_ref_mix``, ``variance_samples`` and ``key`` (module docstring).

    Source: ntk_tt's own (issue 27; METHOD.md §11, "Adam, approximate").

    Args:
      ak: an :class:`ntk_tt.AdamKernel` with the drifting profile (the default).
      batch_size: B' (int in [1, N]) or None for full batch.

    Returns:
      :class:`ntk_tt.AdamKernel` with ``batch_size`` B' (N for None).

    Raises:
      ValueError: ``ak`` not an AdamKernel, built with ``profile="frozen"``, traced, or with
        a table that does not match its batch size (an edited kernel); ``batch_size`` not
        None or an integer in [1, N]; B' whose λ_B' = c_B'ν/κ_B' is above ``ak``'s floor, or
        ``ak``'s own λ_B is (then K_P's profile differs: build it with
        ``ntk_tt.adam_head_aware_kernel``).
    """
    ak, n, bsz = _checked(ak, batch_size)
    if not _shares(ak, n, bsz):
        lam = _mix(ak.drift, n, bsz)[1]
        raise ValueError(
            f"batch size {bsz} needs K_P at another reference profile than ak's (batch size "
            f"{ak.batch_size}: λ_ref = {float(ak.drift.ref):.3g}, floor "
            f"{float(ak.drift.floor):.3g}; λ_B = {lam:.3g} for {bsz}): build it with "
            f"ntk_tt.adam_head_aware_kernel(..., optimizer with batch_size={bsz}).")
    kappa = _mix(ak.drift, n, bsz)[0]
    scale = float(np.sqrt(float(ak.drift.kappa) / kappa))
    hp = ak.precond
    hp = hp._replace(backbone=hp.backbone * scale, backbone_test=None
                     if hp.backbone_test is None else hp.backbone_test * scale)
    drift = ak.drift._replace(kappa=jnp.asarray(kappa, ak.drift.kappa.dtype))
    return ak._replace(precond=hp, batch_size=bsz, drift=drift)
