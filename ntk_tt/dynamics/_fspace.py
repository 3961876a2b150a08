"""Function-space building blocks shared by every dynamics solver (METHOD.md §2).

The state is the (N, C) matrix of training logits f_t. A kernel is carried as ``(mat, traced)``:

* ``traced=False``: the full empirical NTK Θ of shape (N·C, N·C), sample-major (row i*C + c);
* ``traced=True``: Θ_tr of shape (N, N), already divided by C, acting as Θ_tr ⊗ I_C.

Cross-kernels Θ(x_test, x) use the same two layouts with N_test rows. Gradients are with
respect to f of the MEAN loss, g = logit_residual / n (n = N for GD, B for a minibatch).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt.dynamics._losses import error_rate, logit_residual, mean_loss


def as_operator(kernel: jax.Array, n: int, c: int, *, name: str, rows: int | None = None):
    """Normalise a kernel argument to ``(mat, traced)``; shapes checked, values untouched.

    ``rows`` is the number of row samples (N for the training kernel, N_test for a cross
    kernel). An (rows, N) kernel is the logit-SUMMED kernel and is divided by C here.
    """
    rows = n if rows is None else rows
    shape = tuple(np.shape(kernel))
    if shape == (rows * c, n * c):
        return jnp.asarray(kernel), False
    if shape == (rows, n):
        return jnp.asarray(kernel) / c, True
    raise ValueError(
        f"{name} must have shape ({rows * c}, {n * c}) (full empirical NTK, sample-major) or "
        f"({rows}, {n}) (logit-summed kernel, trace_logits=True), got {shape}; check that it "
        "was built on the same inputs as f0 / f0_test."
    )


def theta_dot(mat: jax.Array, traced: bool, g: jax.Array) -> jax.Array:
    """Θ·g for g of shape (N, C); returns (rows, C)."""
    if traced:
        return mat @ g
    return (mat @ g.reshape(-1)).reshape(-1, g.shape[-1])


def theta_cols_dot(mat_t: jax.Array, traced: bool, idx: jax.Array, g_b: jax.Array) -> jax.Array:
    """Θ[:, B]·g_B for a batch of sample indices ``idx`` (B,) and g_B (B, C): O(N·C·B·C).

    Takes the TRANSPOSED kernel ``mat_t`` (= Θ itself for the symmetric training kernel), so
    the batch is a gather of contiguous rows, which stays cheap under ``vmap`` over seeds.
    """
    if traced:
        return mat_t[idx].T @ g_b
    c = g_b.shape[-1]
    rows = mat_t.reshape(mat_t.shape[0] // c, c, -1)[idx]
    return jnp.einsum("bcm,bc->m", rows, g_b).reshape(-1, c)


def mean_grad(f: jax.Array, y: jax.Array, loss: str) -> jax.Array:
    """∇_f L for the mean loss over all N samples: (N, C)."""
    return logit_residual(f, y, loss) / f.shape[0]


def curves(fs: jax.Array, y: jax.Array, loss: str) -> tuple[jax.Array, jax.Array]:
    """Loss and error curves (T + 1,) from logits trajectories (T + 1, N, C)."""
    loss_c = jax.vmap(lambda f: mean_loss(f, y, loss))(fs)
    err_c = jax.vmap(lambda f: error_rate(f, y))(fs).astype(loss_c.dtype)
    return loss_c, err_c


def _unit(size: int, dtype) -> jax.Array:
    """The unit vector (1, …, 1)/√size in ``dtype``: the iterations' start. (Dividing by the
    float64 ``np.sqrt(size)`` would promote a float32 start to float64 under x64.)"""
    return jnp.full(size, 1.0 / np.sqrt(size), dtype)


def top_eigenvalue(mat: jax.Array, iters: int = 60) -> jax.Array:
    """λ_max of a symmetric PSD-ish matrix by power iteration (deterministic start), in
    ``mat``'s dtype."""
    v0 = _unit(mat.shape[0], mat.dtype)

    def body(_, v):
        w = mat @ v
        return w / jnp.maximum(jnp.linalg.norm(w), jnp.finfo(mat.dtype).tiny)

    v = jax.lax.fori_loop(0, iters, body, v0)
    return v @ (mat @ v)


def clamp_psd(mat: jax.Array, size: int | None = None,
              ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """Symmetrise Θ and clamp its negative eigenvalues to zero when they are significant.

    A float32 Θ = J Jᵀ has rounding-level negative eigenvalues; those are harmless. PSD-ness
    is decided by a Cholesky factorisation of Θ + s·I with s = N·eps·λ_max (the tolerance of
    :func:`negative_significant`), which succeeds iff λ_min ≥ −s up to rounding, whatever the
    spectrum's shape (power iteration on λ_max·I − Θ does not converge when many eigenvalues
    cluster near 0). Only when it fails is the (costly) eigendecomposition done, inside
    ``lax.cond``: it gives the exact λ_min and the clamped Θ. When it succeeds, λ_min is
    estimated by 30 steps of inverse iteration with that factor (an upper bound on λ_min).
    Θ does not depend on the swept hyperparameters, so under ``vmap`` over η and m both run
    once.

    Args:
      mat: Θ, a square (M, M) matrix, M = N·C (or N for the traced kernel).
      size: the size in the tolerance s = size·eps·λ_max (default M). A diagonal block of a
        larger kernel passes the whole kernel's size, so that its verdict is the kernel's.

    Returns:
      ``(mat, (min_eigenvalue, max_eigenvalue))``: the symmetrised (and clamped if needed)
      (M, M) kernel and two scalars; clamping happened iff
      ``negative_significant(min_eigenvalue, max_eigenvalue, M)``.
    """
    mat = 0.5 * (mat + mat.T)
    size = mat.shape[0] if size is None else size
    lmax = top_eigenvalue(mat)
    shift = size * jnp.finfo(mat.dtype).eps * jnp.abs(lmax)
    chol = jnp.linalg.cholesky(mat + shift * jnp.eye(mat.shape[0], dtype=mat.dtype))

    def clamp(m, _chol, _shift):
        w, v = jnp.linalg.eigh(m)
        return (v * jnp.maximum(w, 0.0)) @ v.T, w[0]

    mat, lmin = jax.lax.cond(jnp.all(jnp.isfinite(chol)), _keep, clamp, mat, chol, shift)
    return mat, (lmin, lmax)


def _keep(mat: jax.Array, chol: jax.Array, shift: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``mat`` unchanged and its λ_min by inverse iteration with ``chol`` (Θ + s·I = L Lᵀ)."""
    v0 = _unit(mat.shape[0], mat.dtype)

    def body(_, v):
        w = jax.scipy.linalg.cho_solve((chol, True), v)
        return w / jnp.maximum(jnp.linalg.norm(w), jnp.finfo(mat.dtype).tiny)

    v = jax.lax.fori_loop(0, 30, body, v0)
    # Θ + s·I factorised, so λ_min ≥ −s: a rounding-level estimate below it is not significant
    return mat, jnp.maximum(v @ (mat @ v), -shift)


def negative_significant(lmin: jax.Array, lmax: jax.Array, size: int) -> jax.Array:
    """True when λ_min < −size·eps·|λ_max|: beyond float rounding of a PSD Θ = J Jᵀ."""
    return lmin < -size * jnp.finfo(lmax.dtype).eps * jnp.abs(lmax)
