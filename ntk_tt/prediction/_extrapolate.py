"""Predicting the MSE curve on N samples from a kernel on N' < N of them (paper Sec. 4, App. D).

METHOD.md §7. Everything is stated for the mean MSE loss of ``_losses``,
L = (1/N) Σ_i ½‖f_i − y_i‖², and full-batch GD with step η. For the linearised model the residual
r_t = f_t − Y obeys r_{t+1} = (I − (η/N) Θ) r_t (``_closed_form``), so with Θ = Σ_k λ_k v_k v_kᵀ,
μ_k = λ_k / N (the *normalised* eigenvalues) and p_k = (v_k · δy)² (δy = r_0):

    L_t = (1 / 2N) Σ_k (1 − η μ_k)^(2t) p_k,        Σ_k p_k = ‖δy‖²  so  L_0 = ‖δy‖² / 2N.

A traced kernel Θ_tr (N × N, ``trace_logits=True``) acts as (Θ_tr / C) ⊗ I_C: its eigenvalues
are those of Θ_tr / C and p_k = Σ_c (v_k · δy[:, c])², so there are K = N directions instead of
N·C. A :class:`Spectrum` holds (μ_k, p_k, N) and :func:`predict_curve_from_spectrum` turns it
into the curve; the spectrum of the N-sample kernel comes from

* :func:`kernel_spectrum`: the exact eigendecomposition of a kernel (the reference);
* :func:`extrapolate_spectrum`: the paper's App. D recipe from the N'-sample kernel alone;
* :func:`nystrom_spectrum`: the Nyström approximation from the cross kernel Θ(X, X'), which
  costs N·N' kernel entries instead of N².

A full-batch SGD-family optimiser (schedule η_t, heavy-ball or Nesterov momentum) keeps the
modes decoupled: :mod:`ntk_tt.prediction._spectrum_sgd` runs each mode's exact recursion.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._options import is_real
from ntk_tt._schedule_checks import RATE_RANGE, is_rate, rate_ok
from ntk_tt.data._inputs import as_array
from ntk_tt.data._model import check_concrete
from ntk_tt.dynamics._checks import check_gram
from ntk_tt.prediction._spectrum_linalg import (
    _check_finite,
    _check_range,
    _eig,
    _operator,
    _shown,
    _tail_exponent,
    check_rcond,
    check_slope_correction,
    tail_start,
)
from ntk_tt.prediction._spectrum_sgd import (
    check_real_field,
    check_spectrum_optimizer,
    constant_rate,
    sgd_spectrum_curve,
)


class Spectrum(NamedTuple):
    """Normalised eigenvalues and residual projections of an N-sample kernel (mean MSE loss).

    eigenvalues: μ_k = λ_k / N, shape (K,), descending but for an extrapolated tail that
      starts above the kept head (take max μ_k, not μ_1); K = N·C (full Θ) or N (traced Θ,
      eigenvalues of Θ_tr / C). projections: p_k = (v_k · δy)², shape (K,), Σ_k p_k = ‖δy‖².
    num_samples: N, the number of samples the loss is averaged over.

    Source: Zancato et al. 2020 (arXiv 2008.12478), Prop. 2 (the eigenvalues and projections
    that set an MSE curve); METHOD.md §4, §7.
    """

    eigenvalues: jax.Array
    projections: jax.Array
    num_samples: int


def kernel_spectrum(kernel, residual) -> Spectrum:
    """Exact normalised spectrum and residual projections of a kernel (Prop. 2, METHOD.md §4).

    Source: Zancato et al. 2020 (arXiv 2008.12478), Prop. 2; METHOD.md §4.

    Args:
      kernel: Θ on N samples, (N·C, N·C) sample-major or (N, N) logit-summed.
      residual: δy = f0 − onehot(y), shape (N, C) (the sign does not matter).

    Returns:
      :class:`Spectrum` with K = N·C (full) or N (traced) entries; negative eigenvalues
      (float rounding of Θ = J Jᵀ) are clamped to zero.

    Raises:
      ValueError: arguments that are not arrays or lists of numbers, shapes that do not match,
        no samples, non-finite entries, a traced argument (no jit / vmap / grad), or a kernel
        that is not symmetric (or has a negative diagonal entry): not an empirical NTK.
    """
    check_concrete("kernel_spectrum", takes="predict_curve_from_spectrum", kernel=kernel,
                   residual=residual)
    kernel, residual = as_array(kernel, "kernel"), as_array(residual, "residual")
    if np.size(residual) == 0:
        raise ValueError(f"kernel_spectrum needs N >= 1 samples, got residual of shape "
                         f"{np.shape(residual)}.")
    mat, traced = _operator(kernel, residual, "kernel")
    _check_finite("kernel", mat)
    check_gram(kernel, cross="a cross kernel Θ(x, x_subset) goes in nystrom_spectrum's "
               "kernel_cross")
    _check_finite("residual", residual)
    n = np.shape(residual)[0]
    lam, p = _eig(mat, np.asarray(residual, np.float64), traced)
    dtype = jnp.result_type(float, kernel, residual)  # an integer kernel: floats, not ints
    return Spectrum(jnp.asarray(lam / n, dtype), jnp.asarray(p, dtype), n)


def fit_power_law(eigenvalues, fit_range) -> tuple[float, float]:
    """Least-squares fit of log μ_k = log c − s log k over k = lo..hi (App. D, METHOD.md §7).

    Source: Zancato et al. 2020 (arXiv 2008.12478), App. D (λ_k ≈ c·k^(−s)); METHOD.md §7.

    Args:
      eigenvalues: descending normalised eigenvalues μ_k, shape (K,); index k is 1-based.
      fit_range: ``(lo, hi)``, inclusive 1-based indices with 1 <= lo < hi <= K.

    Returns:
      ``(c, s)`` with μ_k ≈ c·k^(−s).

    Raises:
      ValueError: a bad range, or an eigenvalue ≤ 0 or non-finite inside it.
    """
    mu = np.asarray(eigenvalues, np.float64)
    if mu.ndim != 1:
        raise ValueError(f"eigenvalues must be 1-D (K,), got shape {mu.shape}.")
    _check_range(fit_range, mu.shape[0])
    lo, hi = fit_range
    part = mu[lo - 1 : hi]
    if not np.all(np.isfinite(part) & (part > 0)):
        raise ValueError(
            f"eigenvalues {lo}..{hi} must be finite and > 0 to fit a power law in log-log; "
            "lower hi below the numerically zero part of the spectrum."
        )
    logk = np.log(np.arange(lo, hi + 1, dtype=np.float64))
    slope, intercept = np.polyfit(logk, np.log(part), 1)
    return float(np.exp(intercept)), float(-slope)


def extrapolate_spectrum(
    kernel_subset, residual_subset, residual_full, *, k0=None, fit_range=None,
    slope_correction=0.0,
) -> Spectrum:
    """Spectrum of the N-sample kernel predicted from the kernel on N' of them (App. D).

    Eigenvalues: the normalised μ'_k = λ'_k / N' of the subset kernel converge as N' grows
    (App. D), so μ_k = μ'_k is kept for k < k0; from k0 on, μ_k = c·k^(−s_N) up to
    k = K (K = N·C, or N for a traced kernel), where c, s are the least-squares power law of
    μ'_k over ``fit_range`` (:func:`fit_power_law`) and s_N = s + α·(N/N' − 1) with
    α = ``slope_correction`` (the paper's steepening term; its constant is not recoverable from
    the seed; default α = 0 because on real data the fitted slope did not steepen with N:
    s = 1.07, 1.06, 1.09 at N = 100, 250, 500, README). Keeping the top μ'_k matters: a power
    law through the whole spectrum misses the isolated top eigenvalue (20× above the fit) and
    its T_ε was off by up to 5× on real data.
    Projections: p'_k = (v'_k · δy')² rescaled by ‖δy‖² / ‖δy'‖² (each grows like the number
    of samples) are kept for k < k0; from k0 on the tail is a·k^(−b), continuous at k0
    (a·k0^(−b) = the rescaled p'_k0), with b solved so that Σ_k p_k = ‖δy‖² of the FULL set
    exactly (so the predicted L_0 is exact).
    The tail falls from k0 on (s ≥ 0 for descending μ'_k, α ≥ 0) but can start above μ'_1
    where the fit overshoots at k0 (a head flat up to k0): the largest μ_k is max μ_k.
    With N = N' the subset's own exact spectrum is returned (nothing to extrapolate).

    Source: Zancato et al. 2020 (arXiv 2008.12478), Sec. 4, App. D; METHOD.md §7, with
    ntk_tt's measured changes (top μ'_k kept, p'_k rescaled by ‖δy‖²/‖δy'‖², α = 0).

    Args:
      kernel_subset: Θ' on the N' subset samples, (N'·C, N'·C) or (N', N') traced.
      residual_subset: δy' = f0 − onehot(y) on the subset, (N', C).
      residual_full: δy on all N samples, (N, C), N ≥ N' (labels and one forward pass).
      k0: first index of the power-law tails, integer in [1, K'] (K' = N'·C or N'; at most
        K' − 1 with the default ``fit_range``); None =
        min(100, K'/4) (the paper's 100, capped so the tail starts inside the subset's
        well-resolved part).
      fit_range: ``(lo, hi)`` inclusive 1-based indices of the fit; default (k0, K'/2): the
        lower half of the subset spectrum falls off faster than a power law (finite N').
      slope_correction: α >= 0 (finite), added slope per unit of N/N' − 1 (it steepens the
        tail; α < 0 would make it rise).

    Returns:
      :class:`Spectrum` of K entries for N samples.

    Raises:
      ValueError: arguments that are not arrays or lists of numbers, mismatched shapes,
        N < N', non-finite inputs, a ``kernel_subset`` that is not symmetric (or has a
        negative diagonal entry: not Θ = J Jᵀ), bad k0 / fit_range, α < 0 or not finite,
        an all-zero ``residual_subset`` or ``residual_full`` when N > N'
        (no residual to extrapolate), or no tail exponent reaching ‖δy‖² (raised after the
        eigendecomposition).
    """
    kernel_subset, residual_subset, residual_full = (as_array(v, nm) for v, nm in (
        (kernel_subset, "kernel_subset"), (residual_subset, "residual_subset"),
        (residual_full, "residual_full")))
    mat, traced = _operator(kernel_subset, residual_subset, "kernel_subset")
    n_sub, c = np.shape(residual_subset)
    if np.ndim(residual_full) != 2 or np.shape(residual_full)[1] != c or (
            np.shape(residual_full)[0] < n_sub):
        raise ValueError(
            f"residual_full must be δy on all N >= N' = {n_sub} samples, shape (N, {c}), got "
            f"{np.shape(residual_full)}."
        )
    k_sub = mat.shape[0]
    k0, fit_range = tail_start(k0, fit_range, k_sub)
    check_slope_correction(slope_correction)
    slope_correction = float(slope_correction)  # a 0-d jax array too (NumPy arithmetic below)
    for name, value in (("kernel_subset", mat), ("residual_subset", residual_subset),
                        ("residual_full", residual_full)):
        _check_finite(name, value)
    check_gram(kernel_subset, "kernel_subset", "a cross kernel Θ(x, x_subset) goes in "
               "nystrom_spectrum's kernel_cross, not here")
    n = np.shape(residual_full)[0]
    if n == n_sub:
        return kernel_spectrum(kernel_subset, residual_subset)
    if not np.any(np.asarray(residual_full)):
        raise ValueError(
            "residual_full is zero everywhere: f0 = onehot(y) on all N samples, so the MSE "
            "loss is 0 at every step and there is no residual to extrapolate; pass δy = f0 − "
            "onehot(y) of the model's initial logits.")
    if not np.any(np.asarray(residual_subset)):
        raise ValueError(
            "residual_subset is zero everywhere: the subset's projections p'_k = (v'_k · δy')², "
            "which shape the extrapolated ones, are all 0, so there is nothing to extrapolate "
            "from; pass δy' = f0 − onehot(y) on the subset's samples (their rows of "
            "residual_full).")
    lam, p_sub = _eig(mat, np.asarray(residual_subset, np.float64), traced)
    mu_sub = lam / n_sub
    c_fit, s = fit_power_law(mu_sub, fit_range)
    size = n * (1 if traced else c)
    k = np.arange(1, size + 1, dtype=np.float64)
    mu = c_fit * k ** -(s + slope_correction * (n / n_sub - 1.0))
    mu[: k0 - 1] = mu_sub[: k0 - 1]
    total = float(np.sum(np.asarray(residual_full, np.float64) ** 2))
    p_sub = p_sub * (total / p_sub.sum())
    b = _tail_exponent(p_sub[k0 - 1], k0, size, total - p_sub[: k0 - 1].sum())
    p = np.concatenate([p_sub[: k0 - 1], p_sub[k0 - 1] * (k[k0 - 1 :] / k0) ** -b])
    dtype = jnp.result_type(kernel_subset)
    return Spectrum(jnp.asarray(mu, dtype), jnp.asarray(p, dtype), n)


def nystrom_spectrum(kernel_cross, kernel_subset, residual_full, *, rcond=1e-6) -> Spectrum:
    """Nyström spectrum of the N-sample kernel from its columns on N' landmark samples.

    Θ ≈ Θ_NM Θ_MM⁺ Θ_NMᵀ (Williams & Seeger 2001), the alternative to App. D's power law a
    kernel person would try: it needs the cross kernel Θ(X, X') (N·N' entries, e.g.
    ``empirical_ntk(apply_fn, params, x, x_subset)``) instead of the N² of Θ. With
    Θ_MM = U diag(σ) Uᵀ (σ below ``rcond``·σ_max dropped) and B = Θ_NM U diag(σ^(−1/2)),
    the nonzero eigenpairs of BBᵀ come from the small (K', K') matrix BᵀB = Q diag(λ) Qᵀ:
    v_k = B q_k / √λ_k. The residual mass outside their span, ‖δy‖² − Σ_k p_k, is one more
    entry with eigenvalue 0 (it does not decay), so Σ_k p_k = ‖δy‖² and L_0 is exact. Exact
    when the landmarks span Θ's column space (e.g. X' = X, or rank Θ ≤ K').

    Source: Williams & Seeger 2001 (the Nyström method): ntk_tt's alternative to App. D of
    Zancato et al. 2020 (arXiv 2008.12478); METHOD.md §7.

    Args:
      kernel_cross: Θ(X, X'), (N·C, N'·C) sample-major or (N, N') traced.
      kernel_subset: Θ(X', X'), (N'·C, N'·C) or (N', N') traced (same layout).
      residual_full: δy on all N samples, (N, C).
      rcond: relative cut-off in (0, 1) for the pseudo-inverse of Θ_MM.

    Returns:
      :class:`Spectrum` with K' + 1 entries (the last one eigenvalue 0).

    Raises:
      ValueError: arguments that are not arrays or lists of numbers, mismatched shapes or
        layouts, non-finite inputs, rcond not in (0, 1), a ``kernel_subset`` of trace ≤ 0.
    """
    kernel_cross, kernel_subset, residual_full = (as_array(v, nm) for v, nm in (
        (kernel_cross, "kernel_cross"), (kernel_subset, "kernel_subset"),
        (residual_full, "residual_full")))
    if np.ndim(residual_full) != 2:
        raise ValueError(f"residual_full must be (N, C), got shape {np.shape(residual_full)}.")
    n, c = np.shape(residual_full)
    shape_x, shape_s = tuple(np.shape(kernel_cross)), tuple(np.shape(kernel_subset))
    traced = len(shape_x) == 2 and shape_x[0] == n
    rows = n if traced else n * c
    if len(shape_s) != 2 or shape_s[0] != shape_s[1] or shape_x != (rows, shape_s[0]) or (
            not traced and shape_s[0] % c):
        raise ValueError(
            f"kernel_cross must be ({n}, N') traced or ({n * c}, N'·C) full and kernel_subset "
            f"the matching square (N', N') or (N'·C, N'·C); got {shape_x} and {shape_s}."
        )
    check_rcond(rcond)
    for name, value in (("kernel_cross", kernel_cross), ("kernel_subset", kernel_subset),
                        ("residual_full", residual_full)):
        _check_finite(name, value)
    scale = c if traced else 1
    knm = np.asarray(kernel_cross, np.float64) / scale
    kmm = np.asarray(kernel_subset, np.float64) / scale
    if not np.trace(kmm) > 0:
        raise ValueError("kernel_subset has trace <= 0: Θ(X', X') = J Jᵀ has a diagonal >= 0, "
                         "zero only without gradients; pass the landmarks' kernel itself.")
    sig, u = np.linalg.eigh(0.5 * (kmm + kmm.T))
    keep = sig > rcond * sig.max()
    b = knm @ (u[:, keep] / np.sqrt(sig[keep]))
    lam, q = np.linalg.eigh(b.T @ b)
    lam, q = np.maximum(lam[::-1], 0.0), q[:, ::-1]
    pos = lam > rcond * lam.max()
    v = b @ (q[:, pos] / np.sqrt(lam[pos]))
    r = np.asarray(residual_full, np.float64)
    a = v.T @ (r if traced else r.reshape(-1))
    p = np.sum(a**2, axis=1) if traced else a**2
    rest = max(float(np.sum(r**2)) - float(p.sum()), 0.0)
    dtype = jnp.result_type(kernel_cross)
    return Spectrum(jnp.asarray(np.append(lam[pos] / n, 0.0), dtype),
                    jnp.asarray(np.append(p, rest), dtype), n)


def _check_spectrum(spectrum) -> None:
    """ValueError unless ``spectrum`` is a :class:`Spectrum` with N an int >= 1, two 1-D real
    arrays of one length K >= 1 and (when concrete) finite values, μ_k >= 0, p_k >= 0."""
    if not isinstance(spectrum, Spectrum):
        raise ValueError(f"spectrum must be an ntk_tt.Spectrum (kernel_spectrum, "
                         f"extrapolate_spectrum), got {type(spectrum).__name__}.")
    mu, p, n = spectrum
    if not isinstance(n, jax.core.Tracer) and (isinstance(n, bool) or np.ndim(n) != 0 or (
            np.asarray(n).dtype.kind not in "iu") or n < 1):
        raise ValueError(f"spectrum.num_samples must be N, an int >= 1, got {n!r}.")
    if np.ndim(mu) != 1 or np.shape(mu) != np.shape(p) or np.size(mu) == 0:
        raise ValueError(f"spectrum.eigenvalues and spectrum.projections must be 1-D of one "
                         f"length K >= 1 (one p_k = (v_k · δy)² per μ_k), got shapes "
                         f"{np.shape(mu)} and {np.shape(p)}; build both from the same "
                         "eigendecomposition.")
    for name, value in (("eigenvalues", mu), ("projections", p)):
        check_real_field(value, f"spectrum.{name}")
        if isinstance(value, jax.core.Tracer):
            continue
        v = np.asarray(value, np.float64)
        if not np.all(np.isfinite(v)) or np.any(v < 0):
            k = int(np.flatnonzero(~(np.isfinite(v) & (v >= 0)))[0])
            raise ValueError(f"spectrum.{name} must be finite and >= 0 (μ_k = λ_k / N of a PSD "
                             f"kernel, p_k = (v_k · δy)²), got {v[k]:g} at k = {k}; recompute "
                             "the spectrum (kernel_spectrum clamps rounding negatives to 0, or "
                             "np.maximum(values, 0)).")


def predict_curve_from_spectrum(spectrum: Spectrum, *, learning_rate=None, steps,
                                optimizer=None) -> jax.Array:
    """Mean MSE loss curve of full-batch GD on the linearised model (Prop. 2, discrete time).

    L_t = (1 / 2N) Σ_k (1 − η μ_k)^(2t) p_k for t = 0..T, the exact discrete-GD form of
    ``_closed_form.mse_closed_form`` for the loss convention of ``_losses`` (mean over the N
    samples of ½‖f − onehot(y)‖²); feed it to :func:`ntk_tt.training_time` for T_ε. With
    ``optimizer=ntk_tt.sgd(schedule, momentum, nesterov=...)`` (full batch, no weight decay)
    each mode follows the optimiser's exact scalar recursion instead, with the schedule's η_t
    and heavy-ball or Nesterov momentum (:mod:`ntk_tt.prediction._spectrum_sgd`, METHOD.md §7);
    ``sgd(η)`` (constant, m = 0) gives the ``learning_rate=η`` curve bit for bit. With
    ``learning_rate`` it is pure JAX in η and the spectrum: ``jit``, ``vmap`` and ``grad``
    over η work (a traced η that is not finite and > 0 gives a NaN curve and a NaN
    gradient, as it is not checked); a traced ``optimizer`` is refused.

    Source: Zancato et al. 2020 (arXiv 2008.12478), Prop. 2, in discrete time; METHOD.md §7
    (with ``optimizer``, ntk_tt's own: issue 27, METHOD.md §7 and §11).

    Args:
      spectrum: :class:`Spectrum` (μ_k = λ_k / N, p_k, N).
      learning_rate: η > 0 (scalar, may be traced), constant-η GD; or None with
        ``optimizer``.
      steps: T >= 1 optimiser steps.
      optimizer: an SGD-family :class:`ntk_tt.Optimizer` at full batch (``batch_size`` None
        or N) with ``weight_decay`` 0, instead of ``learning_rate``.

    Returns:
      The loss curve, shape (T + 1,), index = steps taken, in mean-loss units; it
      overflows to inf past a divergence (GD: η·μ_max > 2), where ``training_time`` says so.

    Raises:
      ValueError: η not a real scalar or (when concrete) not finite and > 0, steps not an
        integer >= 1; ``spectrum`` not a :class:`Spectrum`, its eigenvalues and projections
        not 1-D of one length, complex or not numbers (the field named), a NaN, inf or
        negative eigenvalue or projection (checked when concrete, not under ``jit``), or
        num_samples not an int >= 1; with ``optimizer``: Adam, weight decay ≠ 0,
        batch_size < N, ``learning_rate`` given too, a bad schedule, or traced
        hyperparameters (inside jit / vmap / grad) (all before any work).
    """
    _check_spectrum(spectrum)
    if optimizer is None:
        dtype = getattr(learning_rate, "dtype", None)  # traced η: checked for type only
        real = is_real(learning_rate) or (dtype is not None and np.ndim(learning_rate) == 0
                                          and np.dtype(dtype).kind in "iuf")
        if not real or not (isinstance(learning_rate, jax.core.Tracer) or (
                is_rate(learning_rate))):
            raise ValueError(f"learning_rate must be a finite scalar {RATE_RANGE} (or pass "
                             f"optimizer=ntk_tt.sgd(...)), got {_shown(learning_rate)}.")
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
            raise ValueError(f"steps must be an int >= 1 (optimiser updates), got {steps!r}.")
    else:
        check_spectrum_optimizer(optimizer, spectrum.num_samples, steps,
                                 where="predict_curve_from_spectrum",
                                 learning_rate=learning_rate)
        learning_rate = constant_rate(optimizer)
    floats = jnp.result_type(float, spectrum.eigenvalues, spectrum.projections)  # ints: 0.1 → 0
    mu, p = (jnp.asarray(v, floats) for v in (spectrum.eigenvalues, spectrum.projections))
    if learning_rate is None:  # a schedule or momentum: the per-mode recursion
        return sgd_spectrum_curve(mu, p, spectrum.num_samples, optimizer, int(steps))
    bad = jnp.where(rate_ok(learning_rate), 0.0, jnp.nan)  # a traced bad η: NaN
    eta = jnp.asarray(learning_rate, mu.dtype)  # traceable: jit / vmap / grad over η
    eta = eta + bad  # added, not selected with where: NaN derivatives in both modes
    t = jnp.arange(steps + 1, dtype=mu.dtype)[:, None]
    base = jnp.where(t == 0, 1.0, (1.0 - eta * mu) ** 2)  # >= 0: no NaN at η·μ > 1, and no
    decay = base ** t  # NaN gradient of 0^0 at η·μ = 1
    return decay @ p / (2 * spectrum.num_samples) + bad  # L_0 NaN too
