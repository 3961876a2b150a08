"""The spectrum predictors' linear algebra and argument checks (split from
:mod:`ntk_tt.prediction._extrapolate`, whose module docstring states the method): the operator
a full or traced kernel acts as, its eigendecomposition with the residual's projections, and
the power-law tail that carries the missing residual mass (App. D, METHOD.md §7).
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

from ntk_tt._options import _describe, check_real


def _shown(value) -> str:
    """A scalar argument's repr, an array's type and shape (never its contents)."""
    return repr(value) if np.ndim(value) == 0 else _describe(value)


def _operator(kernel, residual, name):
    """(matrix acting on the sample-major residual, traced flag) after shape checks."""
    if np.ndim(residual) != 2:
        raise ValueError(
            f"{name}'s residual must be f0 − onehot(y) of shape (N, C), got shape "
            f"{np.shape(residual)}."
        )
    n, c = np.shape(residual)
    if n == 0:  # an empty kernel was blamed on k0, which the user never passed
        raise ValueError(f"{name} and its residual hold no samples (residual of shape "
                         f"{np.shape(residual)}): pass the kernel of at least 2 samples.")
    shape = tuple(np.shape(kernel))
    if shape == (n * c, n * c):
        return np.asarray(kernel, np.float64), False
    if shape == (n, n):
        return np.asarray(kernel, np.float64) / c, True
    raise ValueError(
        f"{name} must be ({n * c}, {n * c}) (full Θ) or ({n}, {n}) (trace_logits=True) for a "
        f"residual of shape ({n}, {c}), got {shape}."
    )


def check_slope_correction(alpha) -> None:
    """ValueError unless α is a real scalar, finite and >= 0 (App. D's steepening term)."""
    check_real(alpha, "slope_correction")
    if np.ndim(alpha) or not (np.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"slope_correction α must be finite and >= 0 (it steepens the tail as "
                         f"N/N' grows; α < 0 makes it rise), got {_shown(alpha)}.")


def check_rcond(rcond) -> None:
    """ValueError unless ``rcond`` is a real scalar in (0, 1) (Nyström's cut-off)."""
    check_real(rcond, "rcond")
    if np.ndim(rcond) or not 0 < rcond < 1:
        raise ValueError(f"rcond must be in (0, 1) (Θ_MM's eigenvalues below rcond·σ_max are "
                         f"dropped; >= 1 drops them all), got {_shown(rcond)}; e.g. 1e-6.")


def _check_finite(name, value):
    if not np.all(np.isfinite(np.asarray(value))):
        raise ValueError(f"{name} contains NaN or inf; recompute it before extrapolating.")


def _eig(mat, residual, traced):
    """Descending eigenvalues and projections p_k of a symmetric PSD operator (float64)."""
    lam, v = np.linalg.eigh(0.5 * (mat + mat.T))
    lam, v = np.maximum(lam[::-1], 0.0), v[:, ::-1]
    a = v.T @ (residual if traced else residual.reshape(-1))
    p = np.sum(a**2, axis=1) if traced else a**2
    return lam, p


def _check_range(fit_range, size):
    try:  # (1, 2, 3) was "too many values to unpack"
        lo, hi = fit_range
    except (TypeError, ValueError):
        raise ValueError(f"fit_range must be two integers (lo, hi), got {fit_range!r}.") from None
    for v in (lo, hi):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"fit_range must be two integers (lo, hi), got {fit_range!r}.")
    if not 1 <= lo < hi <= size:
        raise ValueError(
            f"fit_range (lo, hi) must satisfy 1 <= lo < hi <= {size} (1-based eigenvalue "
            f"indices, inclusive), got {fit_range!r}."
        )


def tail_start(k0, fit_range, k_sub: int) -> tuple[int, tuple[int, int]]:
    """``extrapolate_spectrum``'s k0 (None: min(100, K'/4)) and fit range (None: (k0, K'/2)),
    checked against K' = ``k_sub``."""
    k0 = max(1, min(100, k_sub // 4)) if k0 is None else k0
    if isinstance(k0, bool) or not isinstance(k0, (int, np.integer)) or not 1 <= k0 <= k_sub:
        raise ValueError(f"k0 must be an integer in [1, K'] = [1, {k_sub}], got {k0!r}.")
    if fit_range is None and k0 == k_sub:  # a fresh user's k0 = K' read as a bad fit_range
        raise ValueError(f"k0 = K' = {k_sub} leaves the default fit range (k0, K'/2) one "
                         f"eigenvalue, and a power law needs two: take k0 <= {k_sub - 1}, or "
                         f"pass fit_range=(lo, hi) with 1 <= lo < hi <= {k_sub}.")
    fit_range = (k0, max(k0 + 1, k_sub // 2)) if fit_range is None else fit_range
    _check_range(fit_range, k_sub)
    return k0, tuple(fit_range)


def _tail_exponent(anchor, k0, size, target):
    """b with Σ_{k=k0}^{size} anchor·(k/k0)^(−b) = target, by bisection (the sum falls with b)."""
    logk = np.log(np.arange(k0, size + 1, dtype=np.float64) / k0)

    def total(b):
        return np.log(anchor) + logsumexp(-b * logk)

    lo, hi, goal = -50.0, 200.0, np.log(target)
    if not total(hi) <= goal <= total(lo):
        raise ValueError(
            f"no power-law tail from k0 = {k0} to K = {size} carries the missing residual mass "
            f"{target:.4g} from the anchor p_k0 = {anchor:.4g}; choose another k0."
        )
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if total(mid) > goal else (lo, mid)
    return 0.5 * (lo + hi)
