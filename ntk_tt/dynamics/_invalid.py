"""Entries of a traced prediction that the eager checks would refuse (issue 13 and later).

Under ``jax.jit`` / ``vmap`` / ``grad`` the hyperparameters and data are traced, so the eager
``ValueError`` cannot run. Such an entry is marked here instead, and every predictor's result
(``_predict_kernel._summarise``) blanks it: NaN curves, κ and T_ε, code ``INVALID``,
outcome "unknown", never a divergence or a convergence.

Source: ntk_tt's own (README "Predicting training time": traced invalid entries).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._schedule_checks import rate_ok


def invalid(lr, m, nesterov: bool, fs, fts, y, y_test, lam_max) -> jax.Array:
    """True where the eager checks refuse: η ≤ 0, NaN or inf; m ∉ [0, 1); Nesterov at m = 0;
    labels outside [0, C) (training or held-out); non-finite initial logits; or a kernel whose
    λ_max is NaN or negative. ``fs``, ``fts``: logits (paths, T + 1, N, C) and held-out ones
    or None."""
    c = fs.shape[-1]
    ok = rate_ok(lr) & (m >= 0) & (m < 1) & ~(nesterov & (m == 0))
    ok = ok & jnp.all((y >= 0) & (y < c)) & jnp.all(jnp.isfinite(fs[:, 0])) & (lam_max >= 0)
    if fts is not None:
        ok = ok & jnp.all((y_test >= 0) & (y_test < c)) & jnp.all(jnp.isfinite(fts[:, 0]))
    return ~ok


def unless(bad, value, a):
    """``a`` (None, or an array whose dtype is kept) with ``value`` wherever ``bad``. A NaN
    ``value`` multiplies a float ``a`` instead, so that ``jax.grad`` through a bad entry is NaN
    too, not the 0 of ``jnp.where``'s other branch (a good entry is ``a``·1, exactly ``a``)."""
    if a is None:
        return None
    if jnp.issubdtype(a.dtype, jnp.floating) and np.isnan(value):
        return a * jnp.where(bad, jnp.nan, 1.0).astype(a.dtype)
    return jnp.where(bad, value, a).astype(a.dtype)
