"""A sweep task's kernels and predictions: the primary kernel (the diagonal head-aware one,
``ntk_tt.predict``'s default; isotropic before session 34) and the exact Θ, the variants'
kernels, η from κ̃, and one compiled ``jit(vmap)`` over (η, m) per predictor and batch size
(``ntk_tt.sweep._run``). A variant whose predictions are all reused from an earlier sweep
(``ntk_tt.sweep._reuse``) has no kernel built."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import ntk_tt
from ntk_tt.dynamics._fspace import top_eigenvalue
from ntk_tt.dynamics._predict_head_aware import initial_eigenvalues
from ntk_tt.kernels._head_aware import HeadAwareKernel, head_aware_kernel
from ntk_tt.sweep._compile import _compiled, _timed
from ntk_tt.sweep._finetune import TaskData
from ntk_tt.sweep._grid import SweepSpec


class Variant(NamedTuple):
    """An extra prediction recorded beside the primary one (head-aware, diagonal feature
    kernel); ``kernel`` is a :class:`HeadAwareKernel` for head-aware variants."""

    kernel: jax.Array | HeadAwareKernel
    label: str
    continuous: bool
    noise: jax.Array | None = None


PRIMARY = ("head_aware", "diagonal")  # ntk_tt.predict's default (default_backbone)


MIXING_SAMPLES = 32


def _predict_group(kernel, f0, y, key, lrs, moms, noise, *, steps, batch_size, method,
                   num_paths):
    """Predicted mean loss curves (G, T + 1), divergence flags (G,), first spike steps (G,)
    (−1 for none), seconds, compile seconds, and the predicted mean training-error curves
    (G, T + 1) (the absolute error targets, ``ntk_tt.sweep._targets``).

    ``kernel`` is Θ (``predict_from_kernel``) or a :class:`HeadAwareKernel`
    (``predict_head_aware``; ``f0`` and ``noise`` unused)."""
    head_aware = isinstance(kernel, HeadAwareKernel)

    def one(kernel, f0, y, key, noise, lr, m):
        if head_aware:
            out = ntk_tt.predict_head_aware(
                kernel, y, learning_rate=lr, momentum=m, steps=steps, batch_size=batch_size,
                key=key, num_paths=num_paths)
        else:
            out = ntk_tt.predict_from_kernel(
                kernel, f0, y, learning_rate=lr, momentum=m, steps=steps,
                batch_size=batch_size, method=method, key=key, noise_features=noise,
                num_paths=num_paths,
            )
        return out.loss, out.diverged, out.spiked_at, out.error

    batched = jax.vmap(one, in_axes=(None, None, None, None, None, 0, 0))
    args = (kernel, f0, y, key, noise, lrs, moms)
    name = ("predict", head_aware, steps, batch_size, method, num_paths)
    compiled, compile_s = _compiled(name, batched, *args)
    (loss, div, spike, error), seconds = _timed(compiled, *args)
    return (np.asarray(loss), np.asarray(div), np.asarray(spike), seconds, compile_s,
            np.asarray(error))


def _t_eps(curve: np.ndarray, eps: float) -> float:
    """T_ε in steps from ``ntk_tt.training_time_report`` (the one definition, no warning on a
    non-finite curve); NaN where undefined."""
    return float(ntk_tt.training_time_report(np.asarray(curve), eps)[0])


_KERNEL_SHAPES: set = set()


def _kernel(data: TaskData, key):
    """Exact Θ (N·C, N·C), initial logits, λ_max(Θ), the primary kernel (the diagonal
    head-aware kernel; None without ``data.split``) and the wall time of the PRIMARY
    predictor's kernel work, in seconds.

    The primary's kernel work is what a user of ``ntk_tt.predict`` pays: the head-aware kernel
    (for the diagonal one the features, their principal directions and the per-direction
    blocks; for the isotropic one the logit-summed empirical NTK and k_b) and λ_max of its
    Θ_0 (``initial_eigenvalues``, what turns a κ̃ into η).
    The exact Θ is computed apart, untimed: the variants need it and the grid's η comes from
    its λ_max (power iteration, as ``predict_from_kernel`` uses for κ), as in every sweep
    since issue 5, so that real runs stay comparable. Without a split the primary is the
    frozen exact Θ and its time is the exact kernel's.

    The first task of each input shape is computed once untimed, so compile time is never in
    the prediction's wall time (the same rule as for the solves and the fine-tunes).
    """

    def exact():
        theta = ntk_tt.empirical_ntk(data.apply_fn, data.params, data.x)
        return theta, data.apply_fn(data.params, data.x), top_eigenvalue(theta)

    def primary():
        traced = (ntk_tt.empirical_ntk(data.apply_fn, data.params, data.x, trace_logits=True)
                  if PRIMARY[1] in ("isotropic", "kronecker") else None)
        hk = head_aware_kernel(data.split, data.x, backbone=PRIMARY[1], traced_kernel=traced)
        return hk, initial_eigenvalues(hk)[1]

    if (id(data.apply_fn), data.x.shape) not in _KERNEL_SHAPES:
        jax.block_until_ready((exact(), None if data.split is None else primary()))
        _KERNEL_SHAPES.add((id(data.apply_fn), data.x.shape))
    (theta, f0, lam), seconds = _timed(exact)
    hk = None
    if data.split is not None:
        (hk, _), seconds = _timed(primary)
    return theta, f0, float(lam), hk, seconds


def _kronecker(data: TaskData, theta, key):
    """The task's Kronecker head-aware kernel (the variant; its mixing S from
    ``MIXING_SAMPLES`` inputs), k_b from the logit trace of its exact Θ (None without a
    split)."""
    if data.split is None:
        return None
    n, c = data.x.shape[0], data.split[2].shape[1]
    return head_aware_kernel(
        data.split, data.x, backbone="kronecker", mixing_samples=MIXING_SAMPLES,
        key=jax.random.fold_in(key, 3),
        traced_kernel=theta.reshape(n, c, n, c).trace(axis1=1, axis2=3))


def variant_labels(spec: SweepSpec) -> dict[str, str]:
    """The variants :func:`_variants` records for ``spec`` (for a model with a ``head``; the
    head-aware ones are dropped without one), name → label (the rows' ``var_<name>_label``: a
    reused prediction must carry the same one). Checked before a sweep's work
    (``--primary``)."""
    out = {"linear": "discrete recursion, exact kernel frozen at w0 (the primary before "
                     "issue 9)",
           "traced": "discrete recursion, traced kernel (1/C)ΣcΘ ⊗ I_C",
           "head_aware_kronecker": f"head-aware, Kronecker feature kernel, S from "
                                   f"{MIXING_SAMPLES} inputs",
           "head_aware_isotropic": "head-aware, isotropic feature kernel (the primary before "
                                   "session 34)"}
    out |= {f"sketch{d}": f"discrete recursion, sketched kernel D'={d}"
            for d in spec.sketch_dims}
    if spec.noise_dim:
        out["continuous"] = (f"GD: diffrax ODE (m via η/(1−m)); SGD: diffrax SDE, "
                             f"{spec.num_paths} paths, noise sketch D'={spec.noise_dim}; exact "
                             "kernel")
    return out


def variant_names(spec: SweepSpec) -> tuple[str, ...]:
    """The names of :func:`variant_labels`."""
    return tuple(variant_labels(spec))


def _variants(data: TaskData, spec: SweepSpec, key, theta, f0,
              names=None) -> dict[str, Variant]:
    """The frozen-kernel recursion on Θ (``linear``) and on the traced kernel (derived from
    Θ), the Kronecker and the isotropic head-aware models (their k_b from the logit trace
    of Θ), one sketch per D', and the ODE/SDE on the exact Θ; only those in ``names`` (None:
    all)."""
    n, c = f0.shape
    labels = variant_labels(spec)
    names = set(labels if names is None else names)
    out = {}
    if "linear" in names:
        out["linear"] = Variant(theta, labels["linear"], False)
    if "traced" in names:
        out["traced"] = Variant(theta.reshape(n, c, n, c).trace(axis1=1, axis2=3),
                                labels["traced"], False)
    if "head_aware_kronecker" in names and data.split is not None:
        out["head_aware_kronecker"] = Variant(_kronecker(data, theta, key),
                                              labels["head_aware_kronecker"], False)
    if "head_aware_isotropic" in names and data.split is not None:
        out["head_aware_isotropic"] = Variant(
            head_aware_kernel(data.split, data.x, backbone="isotropic",
                              traced_kernel=theta.reshape(n, c, n, c).trace(axis1=1, axis2=3)),
            labels["head_aware_isotropic"], False)
    for d in spec.sketch_dims:
        if f"sketch{d}" in names:
            sk = ntk_tt.sketched_ntk(data.apply_fn, data.params, data.x, sketch_dim=d,
                                     key=jax.random.fold_in(key, d))
            out[f"sketch{d}"] = Variant(sk.kernel, labels[f"sketch{d}"], False)
    if "continuous" in names and spec.noise_dim:
        noise = ntk_tt.noise_features(data.apply_fn, data.params, data.x, data.y,
                                      sketch_dim=spec.noise_dim, key=jax.random.fold_in(key, 1))
        out["continuous"] = Variant(theta, labels["continuous"], True, noise)
    return out


def _hyper(configs, lam, n):
    etas = np.array([c.learning_rate(lam, n) for c in configs])
    moms = np.array([c.momentum for c in configs])
    return jnp.asarray(etas, jnp.float32), jnp.asarray(moms, jnp.float32)
