"""Why the fast AdamW predictor is too fast at B = 50 (cifar10 task, λ = 0.01): a diagnosis.

Builds the optimiser sweep's cifar10_test task (50 per class, K = 5, N = 250, seed 0; the
sweep's loader, head, key and ``OptimSpec.optimizer``) and, for AdamW warmup 15 + cosine,
T = 150, peak ∈ {1e-3, 1e-4}, B ∈ {50, N}:

1. the fast predictor as the sweep runs it (``ntk_tt.predict(head_kernel=AdamKernel)``), with
   num_paths = 1 (path 0 = ``batch_indices(key)``, the real run's order; checked) and the
   sweep's num_paths = 8; the head-aware reference: optax AdamW (``Optimizer.to_optax()``) on
   (θ, W, b) of f = (h_0 + J_h(θ − θ_0)) W + b, same batch order; the stored real curves.
2. Along the reference's own path (B = 50 and GD, peak 1e-3) the backbone's first-order loss
   decrease per step, ⟨∇_θ L_full, d_t⟩, exact (Adam's m̂/(√v̂ + ε)) against the predictor's
   formulas evaluated on the same state, split into its factors.
3. Candidate fixes (``_adam_core`` re-traced with K_P's action swapped,
   :func:`patched_core`), T_ε with and without.

    python experiments/adam_batch_gap.py [--out DIR]    # everything, ~5 min on 2 CPU cores
        # (--quick: only B = 50, peak 1e-3; --kronecker: the Kronecker K_h, K_P form)
    python experiments/adam_batch_gap.py --logit [--out DIR]
        # Θ_P against the isotropic K_P on the stored reference paths (needs the default
        # run's DIR/diag_p0.001_b{50,N}.npz); writes logit_forms.json
    python experiments/adam_batch_gap.py --benchmark [DATASET ...] [--out DIR]
        # every AdamW row of the committed benchmark at N = 250 (default: its 4 target sets):
        # the sweep's prediction recomputed (checked against the stored one) and fix B's,
        # scored against the stored real curves; kernel timings. Resumes per task from
        # DIR/benchmark_rows.json; writes benchmark_summary.json.
Outputs go to DIR (--out, default /tmp/adam_gap): summary.json, logit_forms.json,
benchmark_summary.json and the large diag_*.npz / benchmark_rows.json. The small JSON
results are committed in experiments/results/adam_batch_gap/.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd
from _args import known_sets, out_dir  # experiments/_args.py, beside this script

import ntk_tt
from ntk_tt.dynamics import _adam_head_aware as aha
from ntk_tt.dynamics._adam_drift import (
    _on_grid,
    drift_scale,
    gradient_profiles,
    quadratic_form,
)
from ntk_tt.dynamics._losses import logit_residual, mean_loss
from ntk_tt.dynamics._predict_head_aware import _backbone_step, initial_eigenvalues
from ntk_tt.dynamics._regime import LinearRegimeWarning
from ntk_tt.sweep._grid import SweepSpec, Task
from ntk_tt.sweep._load import _task_key, load_task
from ntk_tt.sweep._optimizers import OptimConfig, OptimSpec, row_id

# set from the command line by cli()
OUT = pathlib.Path("/tmp/adam_gap")
QUICK = False          # only B = 50, peak 1e-3 (development)
FORM = "isotropic"     # K_h, K_P form ("kronecker" with --kronecker)
TAG = ""               # "_kron" with --kronecker
ROOT = pathlib.Path(__file__).resolve().parents[1]
LOSS = "cross_entropy"
EPS_T = (0.1, 0.4)
tmap = jax.tree.map


def tsum(fn, *trees):
    return sum(jnp.sum(fn(*ls)) for ls in zip(*(jax.tree.leaves(t) for t in trees), strict=True))


def t_eps(curve):
    return [float(ntk_tt.training_time(np.asarray(curve), e)) for e in EPS_T]


# ---------------------------------------------------------------- the head-aware reference
def reference(data, opt, steps, key, *, diag=None):
    """Exact optax Adam(W) on (θ, W, b) of (h_0 + J_h(θ − θ_0)) W + b (linear backbone
    features). Returns the full-set loss curve (T + 1,) and, with ``diag`` (a dict of the
    predictor's quantities), per-step diagnostics of the backbone's loss decrease."""
    feature_fn, bp0, w0, b0 = data.split
    x, y = data.x, data.y
    n = x.shape[0]
    bsz = n if opt.batch_size is None else opt.batch_size
    batches = ntk_tt.batch_indices(key, n, bsz, steps)
    h0 = feature_fn(bp0, x)
    tx = opt.to_optax()
    params = (bp0, w0, b0)
    state = tx.init(params)
    lrs = np.asarray(opt.learning_rates(steps))

    @jax.jit
    def step(params, state, phi, idx, bp0, x, h0, y):
        _, w, b = params
        hb = h0[idx] + phi[idx]
        g = logit_residual(hb @ w + b, y[idx], LOSS) / idx.shape[0]
        q = g @ w.T
        gth = jax.vjp(lambda p: feature_fn(p, x[idx]), bp0)[1](q)[0]
        updates, state = tx.update((gth, hb.T @ g, g.sum(0)), state, params)
        params = optax.apply_updates(params, updates)
        delta = tmap(jnp.subtract, params[0], bp0)
        phi = jax.jvp(lambda p: feature_fn(p, x), (bp0,), (delta,))[1]
        return params, state, phi

    @jax.jit
    def full_grad(params, phi, bp0, x, h0, y):  # ∂L_full/∂h (N, F), backbone full gradient
        _, w, b = params
        r = logit_residual((h0 + phi) @ w + b, y, LOSS) / n
        gq = r @ w.T
        return gq, jax.vjp(lambda p: feature_fn(p, x), bp0)[1](gq)[0]

    phi = jnp.zeros_like(h0)
    losses = [float(mean_loss(h0 @ w0 + b0, y, LOSS))]
    rec = []
    if diag is not None:
        dg = Diag(diag, data, opt, bsz)
    for t in range(steps):
        idx = batches[t]
        if diag is not None:
            gq_full, gfull = full_grad(params, phi, bp0, x, h0, y)
            w_t, b_t = params[1], params[2]
        params_new, state, phi_new = step(params, state, phi, idx, bp0, x, h0, y)
        if diag is not None:
            rec.append(dg.record(t, params, phi, w_t, b_t, idx, gq_full, gfull, state))
        params, phi = params_new, phi_new
        losses.append(float(mean_loss((h0 + phi) @ params[1] + params[2], y, LOSS)))
    out = {"loss": np.asarray(losses), "lrs": lrs}
    if diag is not None:
        out |= {k: np.asarray([r[k] for r in rec]) for k in rec[0]}
        out |= {"r_full": np.stack(dg.r_full_list), "r_hat": np.stack(dg.r_hat_list),
                "w_t": np.stack(dg.w_list)}
    return out


class Diag:
    """The predictor's formulas on the reference's state, step by step (module docstring 2)."""

    def __init__(self, d, data, opt, bsz):
        self.bsz = bsz
        feature_fn, bp0, w0, b0 = data.split
        self.feature_fn, self.bp0, self.x, self.y = feature_fn, bp0, data.x, data.y
        n = data.x.shape[0]
        ak = d["ak"]
        hk, hp, table = ak.hk, ak.precond, ak.drift
        self.hk, self.hp, self.table = hk, hp, table
        self.b1, self.b2, self.eps = (float(v) for v in (opt.momentum, opt.b2, opt.eps))
        g0sq, sigma2, g0 = d["g0sq"], d["sigma2"], d["g0"]
        c_b = 0.0 if bsz == n else (n - bsz) / (bsz * (n - 1))
        self.g0, self.g0sq = g0, g0sq
        self.G = float(tsum(lambda a: a, g0sq))
        tot = float(tsum(lambda a: a, sigma2))
        self.u = tmap(lambda s: s / tot, sigma2)
        self.pref = tmap(lambda g, s: 1.0 / (jnp.sqrt(g + c_b * s) + self.eps), g0sq, sigma2)
        # the predictor's function-space z = K_h vec(Q_0), ‖g_0‖²_{K_h}
        f0 = hk.features @ hk.head_kernel + hk.head_bias
        g_all = logit_residual(f0, data.y, LOSS) / n
        q_all = g_all @ hk.head_kernel.T
        self.z = _backbone_step(hk.backbone, hk.mixing, jnp.arange(n), g_all, hk.head_kernel,
                                q_all, n)
        self.bigg_k = float(jnp.sum(q_all * self.z))
        fix = rank_one_fix(ak, data.y)
        self.zp, self.alpha, self.gam0 = fix["zp"], fix["alpha"], fix["gam0"]
        self.table_fix = fix["table"]
        self.mu = 0.0                 # EMA of z_P[B]·q_B (the K_P-projection of Q̄ on x_0)
        self.mom_f = jnp.zeros(2)     # (A, E) of the fixed predictor (same as mom_k)
        self.r_ema = jnp.zeros((data.x.shape[0], w0.shape[1]))   # EMA of scattered g_B
        self.r_full_list, self.r_hat_list, self.w_list = [], [], []
        self.mom_k = jnp.zeros(2)   # predictor's (A, E), K_h forms
        self.mom_w = jnp.zeros(2)   # the same from weight-space forms
        self.big_m = jnp.zeros_like(hk.features)   # predictor's M = EMA of K_P[:, B] Q_B
        self._jit()

    def _jit(self):
        feature_fn, bp0, x = self.feature_fn, self.bp0, self.x
        eps, g0, pref = self.eps, self.g0, self.pref

        @jax.jit
        def wgrad(idx, q, bp0, x):
            return jax.vjp(lambda p: feature_fn(p, x[idx]), bp0)[1](q)[0]
        self.wgrad = partial(wgrad, bp0=bp0, x=x)

        @jax.jit
        def sums(gfull, gb, mhat, vhat, s_w, lam_w, s_k, lam_k, g0sq, u, g0, pref):
            def wl(lam):
                return tmap(lambda g, uu: (1 - lam) * g + lam * self.G * uu, g0sq, u)
            # Adam's moments are over (θ, W, b); the backbone's part θ pairs with gfull
            mb, vb = mhat[0], vhat[0]
            true = tsum(lambda g, m, v: g * m / (jnp.sqrt(v) + eps), gfull, mb, vb)
            model_w = tsum(lambda g, m, w: g * m / (jnp.sqrt(s_w * w) + eps), gfull, mb,
                           wl(lam_w))
            model_k = tsum(lambda g, m, w: g * m / (jnp.sqrt(s_k * w) + eps), gfull, mb,
                           wl(lam_k))
            pref_sum = tsum(lambda g, m, p: g * m * p, gfull, mb, pref)
            # the realised minibatch's squared gradient against the model's profile
            gb2 = tsum(lambda a: a * a, gb)
            along_w = tsum(lambda a, b: a * b, gb, g0) / self.G
            gf2 = tsum(lambda a: a * a, gfull)
            along_f = tsum(lambda a, b: a * b, gfull, g0) / self.G
            vsum = tsum(lambda v: v, vhat)
            # mhat's component along the full gradient (the part that decreases L_full)
            return dict(true=true, model_w=model_w, model_k=model_k, pref=pref_sum, gb2=gb2,
                        along_w=along_w, gf2=gf2, along_f=along_f, vsum=vsum)
        self.sums = partial(sums, g0sq=self.g0sq, u=self.u, g0=g0, pref=pref)

    def record(self, t, params, phi, w, b, idx, gq_full, gfull, state):
        hk, hp, table = self.hk, self.hp, self.table
        b1, b2 = self.b1, self.b2
        c1, c2 = 1 - b1 ** (t + 1), 1 - b2 ** (t + 1)
        hb = (hk.features + phi)[idx]
        g = logit_residual(hb @ w + b, self.y[idx], LOSS) / self.bsz
        q = g @ w.T
        gb = self.wgrad(idx, q)
        # predictor's drift quantities with K_h forms (exactly as _adam_core)
        along_k = jnp.sum(q * self.z[idx]) / self.bigg_k
        rest_k = jnp.maximum(quadratic_form(hk, idx, q) - along_k**2 * self.bigg_k, 0.0)
        tiny = jnp.finfo(jnp.float32).tiny
        self.mom_k, size_k = drift_scale(table, self.mom_k, along_k, rest_k, self.bigg_k, b2,
                                         c2, tiny)
        s_k = float(jnp.sum(self.mom_k) / c2)
        lam_k = float(self.mom_k[1] / jnp.sum(self.mom_k))
        lamnow_k = float(rest_k / (along_k**2 * self.bigg_k + rest_k))
        # the same with exact weight-space forms
        adam = state[0]
        mhat = tmap(lambda m: m / c1, adam.mu)
        vhat = tmap(lambda v: v / c2, adam.nu)
        tmp = self.sums(gfull, gb, mhat, vhat, 1.0, 0.0, 1.0, 0.0)
        along_w = float(tmp["along_w"])
        rest_w = max(float(tmp["gb2"]) - along_w**2 * self.G, 0.0)
        self.mom_w, size_w = drift_scale(table, self.mom_w, jnp.asarray(along_w),
                                         jnp.asarray(rest_w), self.G, b2, c2, tiny)
        s_w = float(jnp.sum(self.mom_w) / c2)
        lam_w = float(self.mom_w[1] / jnp.sum(self.mom_w))
        lamnow_w = rest_w / (along_w**2 * self.G + rest_w)
        sm = self.sums(gfull, gb, mhat, vhat, s_w, lam_w, s_k, lam_k)
        # the predictor's feature-space step on this state: M EMA of K_P[:, B] q_B
        self.big_m = b1 * self.big_m + (1 - b1) * _backbone_step(
            hp.backbone, hp.mixing, idx, g, w, q, phi.shape[0])
        pred_dec = float(jnp.sum(gq_full * self.big_m) * size_k / c1)
        n = phi.shape[0]
        r_full = logit_residual((hk.features + phi) @ w + b, self.y, LOSS) / n
        self.r_ema = b1 * self.r_ema + (1 - b1) * jnp.zeros((n, g.shape[1])).at[idx].set(g)
        self.r_full_list.append(np.asarray(r_full))
        self.r_hat_list.append(np.asarray(self.r_ema / c1))
        self.w_list.append(np.asarray(w))
        # candidate fix: K' = K_P − (1 − γ_0) z_P z_Pᵀ/α, c_t with K'-forms (γ_0' = 1, γ_1')
        self.mu = b1 * self.mu + (1 - b1) * float(jnp.sum(self.zp[idx] * q))
        self.mom_f, size_f = drift_scale(self.table_fix, self.mom_f, along_k, rest_k,
                                         self.bigg_k, b2, c2, tiny)
        kfix_m = (float(jnp.sum(gq_full * self.big_m))
                  - (1 - self.gam0) * float(jnp.sum(gq_full * self.zp)) * self.mu / self.alpha
                  ) / c1
        g_along = float(jnp.sum(gq_full * self.zp)) / self.alpha  # G's K_P-projection on x_0
        # decomposition: c_t pieces (K_h forms, as the predictor)
        t0, t1 = _on_grid(table, lam_k)
        r0, r1 = _on_grid(table, table.ref)
        gam0, gam1 = table.calibration
        num = (1 - lamnow_k) * t0 + lamnow_k * t1
        den_cal = (1 - lamnow_k) * r0 / gam0 + lamnow_k * r1 / gam1
        den_raw = (1 - lamnow_k) * r0 + lamnow_k * r1
        kp_m = float(jnp.sum(gq_full * self.big_m) / c1)   # ⟨G, K_P Q̂⟩ (isotropic K_P)
        out = dict(
            true=float(sm["true"]), pred=pred_dec, pred_fix=float(size_f) * kfix_m,
            kfix_m=kfix_m, size_f=float(size_f), g_along=g_along, mu=self.mu / c1,
            model_w=float(sm["model_w"]), model_k=float(sm["model_k"]),
            pref=float(sm["pref"]), kp_m=kp_m,
            size_k=float(size_k), size_w=float(size_w),
            s_k=s_k, s_w=s_w, lam_k=lam_k, lam_w=lam_w, lamnow_k=lamnow_k, lamnow_w=lamnow_w,
            num=float(num), den_cal=float(den_cal), den_raw=float(den_raw),
            along_k=float(along_k), along_w=along_w, rest_k=float(rest_k), rest_w=rest_w,
            gf2=float(sm["gf2"]), along_f=float(sm["along_f"]), gb2=float(sm["gb2"]),
            vsum=float(sm["vsum"]))
        return out


# ---------------------------------------------------------------- candidate fix
def rank_one_fix(ak, y):
    """The calibrated operator K' = K_P − (1 − γ_0) z_P z_Pᵀ/α (z_P = K_P vec(Q_0),
    α = vec(Q_0)ᵀ z_P = ‖g_0‖²_{K_P}): its form along g_0 is Σ g_0²P (γ_0' = 1), forms
    K_P-orthogonal to vec(Q_0) unchanged; PSD for γ_0 > 0. γ_1' recomputed on K'-forms.
    Isotropic / Kronecker K_P only (mixing not None)."""
    hk, hp, table = ak.hk, ak.precond, ak.drift
    n = hk.features.shape[0]
    f0 = hk.features @ hk.head_kernel + hk.head_bias
    r = logit_residual(f0, y, LOSS)
    q = r @ hk.head_kernel.T                     # per-sample q_i (N, F)
    g_all = r / n
    zp = _backbone_step(hp.backbone, hp.mixing, jnp.arange(n), g_all, hk.head_kernel, q / n, n)
    alpha = jnp.sum((q / n) * zp)
    gam0, gam1 = table.calibration
    per_sample = jnp.diagonal(hp.backbone) * jnp.einsum("if,fg,ig->i", q, hp.mixing, q)
    across_k = jnp.mean(per_sample) - alpha
    across_w = gam1 * across_k                   # Σ σ² P (the original calibration's sums)
    per_fix = per_sample - (1 - gam0) * jnp.sum(zp * q, axis=1) ** 2 / alpha
    across_fix = jnp.mean(per_fix) - gam0 * alpha
    gam1_fix = across_w / across_fix
    tab = table._replace(calibration=jnp.stack([jnp.ones_like(gam0), gam1_fix]))
    return {"zp": zp, "alpha": alpha, "gam0": float(gam0),
            "gam1": float(gam1), "gam1_fix": float(gam1_fix), "table": tab}


def logit_fix(ak, data, opt, bsz, g0sq, sigma2):
    """Candidate fix B: K' exact on span(W_0) in both arguments, K'(i, j) = k_P(i, j)(I − Π)
    + W_0 A⁻¹ Θ_P(i, j) A⁻¹ W_0ᵀ (A = W_0ᵀW_0, Π = W_0 A⁻¹ W_0ᵀ, Θ_P the preconditioned
    backbone's full logit kernel through W_0, (N·C)², one more empirical NTK without the
    trace); c_t's calibration recomputed on K'-forms. Training set only (no held-out)."""
    from jax.tree_util import Partial

    from ntk_tt.dynamics._adam_drift import _Preconditioned
    from ntk_tt.dynamics._noise import _zeros
    from ntk_tt.kernels._ntk import empirical_ntk
    feature_fn, bp0, w0, b0 = data.split
    hk, hp, table = ak.hk, ak.precond, ak.drift
    n, c = data.x.shape[0], w0.shape[1]
    c_b = 0.0 if bsz is None else (n - bsz) / (bsz * (n - 1))
    root = tmap(lambda g, v: (jnp.sqrt(g + c_b * v) + opt.eps) ** -0.5, g0sq, sigma2)
    fn = Partial(_Preconditioned(feature_fn, with_head=True), bp0, root, w0)
    th4 = empirical_ntk(fn, _zeros(bp0), data.x).reshape(n, c, n, c)
    ainv = jnp.linalg.inv(w0.T @ w0)
    coord = w0 @ ainv                       # q ↦ q W_0 A⁻¹: span coordinates (F, C)
    back = ainv @ w0.T                      # (C, F)
    proj = w0 @ ainv @ w0.T                 # Π (F, F)
    kp = hp.backbone

    def apply(idx, q):                      # Σ_{j∈idx} K'(·, j) q_j: (N, F)
        perp = kp[:, idx] @ (q - q @ proj)
        par = jnp.einsum("icjd,jd->ic", th4[:, :, idx, :], q @ coord) @ back
        return perp + par

    f0 = hk.features @ w0 + b0
    r = logit_residual(f0, data.y, LOSS)
    q = r @ w0.T
    along_iso = quadratic_form(hp, jnp.arange(n), q / n)
    per_iso = jnp.diagonal(kp) * jnp.einsum("if,fg,ig->i", q, hp.mixing, q)
    gam0, gam1 = table.calibration
    along_w, across_w = gam0 * along_iso, gam1 * (jnp.mean(per_iso) - along_iso)
    along_f = jnp.sum((q / n) * apply(jnp.arange(n), q / n))
    rc = q @ coord
    per_f = jnp.einsum("ic,icd,id->i", rc, th4[jnp.arange(n), :, jnp.arange(n), :], rc) \
        + jnp.diagonal(kp) * jnp.sum((q - q @ proj) ** 2, axis=1)
    g0f, g1f = along_w / along_f, across_w / (jnp.mean(per_f) - along_f)
    tab = table._replace(calibration=jnp.stack([g0f, g1f]).astype(table.grid.dtype))
    return {"apply": apply, "table": tab, "gam": [float(g0f), float(g1f)], "th4": th4,
            "coord": coord, "back": back, "proj": proj}


def patched_core(kp_step, fixed_table):
    """``_adam_core`` with K_P's action Σ_{j∈idx} K_P(·, j) q_j replaced by ``kp_step(kernel,
    mixing, idx, g, w, q, rows)`` (K_h's action, for z and the norms, kept) and the drift
    table by ``fixed_table``: the original core re-traced with ``_backbone_step`` swapped for K_P
    only. Training set only (no held-out kernel)."""
    orig_step = aha._backbone_step
    core0 = aha._adam_core.__wrapped__

    @partial(jax.jit, static_argnames="loss")
    def core(hk, hp, y, optimizer, batches, a_h, a_h_test, *, loss, table=None):
        if hp.backbone_test is not None:
            raise ValueError("patched core: training set only")
        aha._backbone_step = lambda kernel, *rest: (
            kp_step(kernel, *rest) if kernel is hp.backbone else orig_step(kernel, *rest))
        try:
            return core0(hk, hp, y, optimizer, batches, a_h, a_h_test, loss=loss,
                         table=fixed_table)
        finally:
            aha._backbone_step = orig_step

    return core


def make_logit_core(fix):
    """``_adam_core`` with the backbone's step through the logit-exact K' (fix B)."""
    th4, coord, back, proj = fix["th4"], fix["coord"], fix["back"], fix["proj"]

    def kp_step(kp, mixing, idx, g, w, q, rows):
        return kp[:, idx] @ (q - q @ proj) + jnp.einsum(
            "icjd,jd->ic", th4[:, :, idx, :], q @ coord) @ back

    return patched_core(kp_step, fix["table"])


def make_fixed_core(fix):
    """``_adam_core`` with the backbone's step through K' = K_P − (1 − γ_0) z_P z_Pᵀ/α
    (fix A, :func:`rank_one_fix`) and its recalibrated table."""
    zp, alpha, corr = fix["zp"], fix["alpha"], 1.0 - fix["gam0"]
    orig_step = aha._backbone_step

    def kp_step(kp, mixing, idx, g, w, q, rows):
        return (orig_step(kp, mixing, idx, g, w, q, rows)
                - corr * zp * jnp.sum(zp[idx] * q) / alpha)

    return patched_core(kp_step, fix["table"])


def predict_fixed(data, opt, spec, key, ak, num_paths):
    """``predict`` with ``_adam_core`` monkeypatched to the K' core (restored after)."""
    fix = rank_one_fix(ak, data.y)
    orig = aha._adam_core
    aha._adam_core = make_fixed_core(fix)
    try:
        return predict(data, opt, spec, key, ak, num_paths)
    finally:
        aha._adam_core = orig


# ---------------------------------------------------------------- the sweep's task and rows
def build(spec, task):
    data = load_task(task, SweepSpec(datasets=(task.dataset,), per_class=(task.per_class,),
                                     seeds=(task.seed,), checkpoint=spec.checkpoint))
    hk = ntk_tt.head_aware_kernel(data.split, data.x, backbone=FORM)
    lam = float(initial_eigenvalues(hk)[1])
    return data, hk, lam


def predict(data, opt, spec, key, ak, num_paths):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LinearRegimeWarning)
        pred = ntk_tt.predict(data.apply_fn, data.params, data.x, data.y, optimizer=opt,
                              steps=spec.steps, head=data.split, key=key,
                              num_paths=num_paths, head_kernel=ak)
    return np.asarray(pred.loss, float)


def record(res: dict, name: str, curve: np.ndarray) -> np.ndarray:
    """``res[name]`` = the curve's (T_0.1, T_0.4), ``res[name + "_final"]`` its last loss."""
    res[name], res[name + "_final"] = t_eps(curve), float(curve[-1])
    return curve


def stored(table="experiments/results/optimizers"):
    """{row id: row} of an optimiser-benchmark table (a folder holding results.parquet,
    relative to the repository)."""
    d = pd.read_parquet(ROOT / table / "results.parquet")
    return {r["row_id"]: r for r in d.to_dict("records")}


def logit_analysis():
    """The preconditioned backbone's exact logit kernel through W_0, Θ_P (N·C)², against the
    isotropic K_P's k_P(i, j)·W_0ᵀW_0, on the bilinear forms ⟨G_t, K_P R̂_t⟩ of the stored
    reference path (B = 50 and GD, peak 1e-3; G_t the full-set residual/N, R̂_t the
    bias-corrected EMA of the scattered minibatch residuals)."""
    from jax.tree_util import Partial

    from ntk_tt.dynamics._adam_drift import _Preconditioned
    from ntk_tt.dynamics._noise import _zeros
    from ntk_tt.kernels._ntk import empirical_ntk
    spec = OptimSpec(datasets=("cifar10_test",), per_class=(50,))
    task = Task("cifar10_test", 50, 0, 5)
    n = task.num_train
    data, hk, lam = build(spec, task)
    feature_fn, bp0, w0, b0 = data.split
    g0sq, sigma2 = gradient_profiles(feature_fn, bp0, w0, b0, data.x, data.y, LOSS, 64, None)
    out = {}
    for bsz in (50, None):
        if "r_full" not in np.load(OUT / f"diag_p0.001_b{bsz or 'N'}.npz"):
            print(f"B={bsz}: no stored path (run the main stage first)")
            continue
        cfg = OptimConfig("adamw_cosine", 1e-3, 0.01, bsz)
        opt = spec.optimizer(cfg, lam, n)
        ak = ntk_tt.adam_head_aware_kernel(data.split, data.x, data.y, opt, hk=hk)
        c_b = 0.0 if bsz is None else (n - bsz) / (bsz * (n - 1))
        root = tmap(lambda g, v, c_b=c_b, eps=opt.eps: (jnp.sqrt(g + c_b * v) + eps) ** -0.5,
                    g0sq, sigma2)
        fn = Partial(_Preconditioned(feature_fn, with_head=True), bp0, root, w0)
        theta = empirical_ntk(fn, _zeros(bp0), data.x)          # (N·C, N·C)
        c = w0.shape[1]
        th4 = np.asarray(theta).reshape(n, c, n, c)
        kp = np.asarray(ak.precond.backbone)
        ww = np.asarray(w0.T @ w0)
        # the isotropic kernel is the trace of Θ_P over the logits / tr(W_0ᵀW_0)
        trace_check = float(np.max(np.abs(np.einsum("icjc->ij", th4) / np.trace(ww) - kp))
                            / np.max(np.abs(kp)))
        d = np.load(OUT / f"diag_p0.001_b{bsz or 'N'}.npz")
        ex, iso, iso_t = [], [], []
        for t in range(d["r_full"].shape[0]):
            g, r = d["r_full"][t], d["r_hat"][t]
            wt = d["w_t"][t]
            ex.append(np.einsum("ic,icjd,jd->", g, th4, r))
            iso.append(np.einsum("ij,ic,cd,jd->", kp, g, ww, r))
            iso_t.append(np.einsum("ij,ic,cd,jd->", kp, g, wt.T @ wt, r))
        ex, iso, iso_t = map(np.asarray, (ex, iso, iso_t))
        # the same at θ_0 along g_0 (residual/N with itself): 1/γ_0 of the W_0-form
        r0 = np.asarray(logit_residual(hk.features @ w0 + b0, data.y, LOSS)) / n
        along = (np.einsum("ic,ij,cd,jd->", r0, kp, ww, r0)
                 / np.einsum("ic,icjd,jd->", r0, th4, r0))
        # per-sample (across) forms: diag blocks
        rr = np.asarray(logit_residual(hk.features @ w0 + b0, data.y, LOSS))
        ps_ex = np.einsum("ic,icd,id->i", rr, th4[np.arange(n), :, np.arange(n), :], rr)
        ps_iso = np.diag(kp) * np.einsum("ic,cd,id->i", rr, ww, rr)
        lrs = d["lrs"]
        win = {}
        for a, b in [(1, 16), (16, 31), (31, 61), (61, 150), (1, 41)]:
            wgt = lrs[a:b]
            win[f"{a}-{b}"] = {
                "iso/exact (W_0)": float(np.sum(wgt * iso[a:b]) / np.sum(wgt * ex[a:b])),
                "iso(W_t)/iso(W_0)": float(np.sum(wgt * iso_t[a:b]) / np.sum(wgt * iso[a:b])),
                "kp_m/pref (weight space, W_t)": float(np.sum(wgt * d["kp_m"][a:b])
                                                        / np.sum(wgt * d["pref"][a:b]))}
        out[f"b{bsz or 'N'}"] = {"trace_check_rel": trace_check,
                                 "iso/exact along g_0 at θ_0": float(along),
                                 "iso/exact per-sample mean": float(ps_iso.mean() / ps_ex.mean()),
                                 "windows": win}
        np.savez(OUT / f"logit_forms_b{bsz or 'N'}.npz", ex=ex, iso=iso, iso_t=iso_t)
        print(json.dumps(out[f"b{bsz or 'N'}"], indent=1), flush=True)
    (OUT / "logit_forms.json").write_text(json.dumps(out, indent=1))

# ---------------------------------------------------------------- benchmark mode
BENCH_TARGETS = ("cifar10_test", "mnist_test", "notmnist", "flowers5_300pc")


def _timed_call(fn):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - t0


def _cold_warm(fn, repeats=3):
    """(result, cold seconds (the first call: compilation included where this process has
    not compiled it yet), warm seconds (median of ``repeats`` further identical calls: the
    2 shared cores make single timings noisy))."""
    _, cold = _timed_call(fn)
    warm = []
    for _ in range(repeats):
        out, w = _timed_call(fn)
        warm.append(w)
    return out, cold, float(np.median(warm))


def predict_logitfix(data, opt, spec, key, ak, num_paths, core):
    orig = aha._adam_core
    aha._adam_core = core
    try:
        return predict(data, opt, spec, key, ak, num_paths)
    finally:
        aha._adam_core = orig


def benchmark_task(spec, task, rows):
    """Every AdamW row of ``task``: the sweep's prediction (recomputed) and the logit fix's,
    with the sweep's num_paths (8 for B < N, 1 for GD), and the kernel timings."""
    n = task.num_train
    t0 = time.perf_counter()
    data = load_task(task, SweepSpec(datasets=(task.dataset,), per_class=(task.per_class,),
                                     seeds=(task.seed,), checkpoint=spec.checkpoint))
    hk, hk_cold, hk_warm = _cold_warm(lambda: ntk_tt.head_aware_kernel(data.split, data.x))
    lam = float(initial_eigenvalues(hk)[1])
    feature_fn, bp0, w0, b0 = data.split
    (g0sq, sigma2), prof_cold, prof_warm = _cold_warm(lambda: gradient_profiles(
        feature_fn, bp0, w0, b0, data.x, data.y, LOSS, 64, None))
    cfgs = [c for c in spec.configs(task) if c.family == "adamw_cosine"]
    timing = {"head_aware_kernel_cold": hk_cold, "head_aware_kernel_warm": hk_warm,
              "profiles_cold": prof_cold, "profiles_warm": prof_warm}
    aks, cores, gams = {}, {}, {}
    for bsz in dict.fromkeys(c.batch_size for c in cfgs):
        opt = spec.optimizer(next(c for c in cfgs if c.batch_size == bsz), lam, n)
        ak, c_ak, w_ak = _cold_warm(lambda o=opt: ntk_tt.adam_head_aware_kernel(
            data.split, data.x, data.y, o, hk=hk))
        lf, c_lf, w_lf = _cold_warm(lambda a=ak, o=opt, b=bsz: logit_fix(
            a, data, o, b, g0sq, sigma2))
        tag = f"b{bsz or 'N'}"
        timing |= {f"adam_kernel_cold_{tag}": c_ak, f"adam_kernel_warm_{tag}": w_ak,
                   f"logit_fix_cold_{tag}": c_lf, f"logit_fix_warm_{tag}": w_lf}
        aks[bsz], cores[bsz], gams[tag] = ak, make_logit_core(lf), lf["gam"]
        print(f"  {tag}: Adam kernel {c_ak:.1f}/{w_ak:.1f}s (cold/warm), logit fix "
              f"{c_lf:.1f}/{w_lf:.1f}s, γ' = {lf['gam']}", flush=True)
    out = before_after_rows(spec, task, data, lam, rows, aks, cores)
    timing["task_total"] = time.perf_counter() - t0
    return {"rows": out, "timing": timing, "gamma_logit_fix": gams}


def before_after_rows(spec, task, data, lam, rows, aks, cores):
    """The AdamW rows of ``task``: the sweep's prediction recomputed ("before", with the
    ``AdamKernel`` ``aks[B]``) and with ``_adam_core`` swapped for ``cores[B]`` ("after"),
    the sweep's num_paths (8 for B < N, 1 for GD), scored with :func:`score_curves` against
    the stored real curve of ``rows``."""
    key, n = _task_key(task), task.num_train
    out = []
    for cfg in (c for c in spec.configs(task) if c.family == "adamw_cosine"):
        opt = spec.optimizer(cfg, lam, n)
        paths = spec.num_paths if cfg.batch_size else 1
        rid = row_id(task, cfg)
        r = rows[rid]
        before = predict(data, opt, spec, key, aks[cfg.batch_size], paths)
        after = predict_logitfix(data, opt, spec, key, aks[cfg.batch_size], paths,
                                 cores[cfg.batch_size])
        rec = {"row_id": rid, "task_id": task.id, "optimizer": "gd" if cfg.batch_size is None
               else "sgd", "peak": cfg.peak, "weight_decay": cfg.weight_decay,
               "max_abs_dloss_vs_stored": float(np.max(np.abs(before - r["pred_loss"])))}
        rec |= score_curves({"real": np.asarray(r["real_loss"], float), "before": before,
                             "after": after, "stored": np.asarray(r["pred_loss"], float)},
                            bool(r["real_diverged"]))
        for e in EPS_T:
            rec[f"stored_col_T{e:g}"] = float(r[f"pred_T{e:g}"])
        for q in (0.5, 0.25):
            rec[f"stored_col_L{q:g}"] = float(r[f"pred_steps_loss{q:g}"])
        rec["curves"] = {"before": before.tolist(), "after": after.tolist()}
        out.append(rec)
        print(f"  {rid}: T0.1/T0.4 stored {r['pred_T0.1']:.0f}/{r['pred_T0.4']:.0f} "
              f"before {rec['before_T0.1']:.0f}/{rec['before_T0.4']:.0f} after "
              f"{rec['after_T0.1']:.0f}/{rec['after_T0.4']:.0f} real {rec['real_T0.1']:.0f}/"
              f"{rec['real_T0.4']:.0f}  max|Δ| {rec['max_abs_dloss_vs_stored']:.1e}", flush=True)
    return out


def score_curves(curves: dict, real_diverged: bool) -> dict:
    """Per named loss curve (``curves["real"]`` the real run's): ``{name}_diverged``,
    ``{name}_T0.1`` / ``_T0.4`` (NaN when diverged or never reached) and the steps to the
    absolute losses 0.5·L_0 and 0.25·L_0 of the real curve (``{name}_L0.5`` / ``_L0.25``,
    the sweep's ``target_columns``), with ``real_diverged`` the real run's outcome."""
    from ntk_tt.sweep._targets import target_columns
    rec = {}
    for name, curve in curves.items():
        div = real_diverged if name == "real" else not np.all(np.isfinite(curve))
        rec[f"{name}_diverged"] = div
        for e in EPS_T:
            t = np.nan if div else float(ntk_tt.training_time(curve, e))
            rec[f"{name}_T{e:g}"] = t if t >= 0 else np.nan
        tc = target_columns(curves["real"], curve, real_diverged, div)
        for q in (0.5, 0.25):
            rec[f"{name}_L{q:g}"] = tc[f"pred_steps_loss{q:g}"]
            rec[f"real_L{q:g}"] = tc[f"real_steps_loss{q:g}"]
    return rec


def _rel(pred, real):
    """The sweep's row errors (ntk_tt.sweep._errors.row_errors, no divergence here):
    signed (T̂ − T)/max(T, 1); |·|, 1.0 where the real target is reached and the predicted
    one is not; rows with an undefined real target dropped."""
    pred, real = np.asarray(pred, float), np.asarray(real, float)
    ok = np.isfinite(real)
    pred, real = pred[ok], real[ok]
    signed = np.where(np.isfinite(pred), (pred - real) / np.maximum(real, 1.0), np.nan)
    return np.where(np.isfinite(pred), np.abs(signed), 1.0), signed


def bench_stats(recs):
    frame = pd.DataFrame([{k: v for k, v in r.items() if k != "curves"} for r in recs])
    groups = {"all": frame}
    for opt in ("gd", "sgd"):
        sub = frame[frame.optimizer == opt]
        groups[opt] = sub
        for p in sorted(sub.peak.unique()):
            groups[f"{opt}_peak{p:g}"] = sub[sub.peak == p]
    out = {}
    for g, sub in groups.items():
        block = {}
        for target, cols in (("T_eps", [f"T{e:g}" for e in EPS_T]), ("L_star", ["L0.5", "L0.25"])):
            for side in ("stored", "before", "after"):
                a, s = zip(*[_rel(sub[f"{side}_{c}"], sub[f"real_{c}"]) for c in cols], strict=True)
                a, s = np.concatenate(a), np.concatenate(s)
                block[f"{target}_{side}"] = {
                    "n": int(a.size), "p95": float(np.percentile(a, 95)) if a.size else None,
                    "median_abs": float(np.median(a)) if a.size else None,
                    "median_signed": float(np.nanmedian(s)) if np.isfinite(s).any() else None}
        out[g] = block
    return out


def print_stats(stats: dict) -> None:
    """One line per group of :func:`bench_stats`: p95 and signed median before / after."""
    for g, b in stats.items():
        line = [f"{g:14s}"]
        for target in ("T_eps", "L_star"):
            for side in ("before", "after"):
                s = b[f"{target}_{side}"]
                if s["n"]:
                    line.append(f"{target} {side} n={s['n']} p95 {100 * s['p95']:.1f}% "
                                f"med {100 * (s['median_signed'] or np.nan):+.1f}%")
        print(" | ".join(line))


def benchmark(datasets=BENCH_TARGETS):
    OUT.mkdir(parents=True, exist_ok=True)
    spec = OptimSpec(datasets=datasets, per_class=(50,))
    rows = stored()
    res_path = OUT / "benchmark_rows.json"
    done = json.loads(res_path.read_text()) if res_path.exists() else {}
    for task in spec.tasks():
        if task.id in done:
            print(f"{task.id}: done (in {res_path})")
            continue
        print(task.id, flush=True)
        done[task.id] = benchmark_task(spec, task, rows)
        res_path.write_text(json.dumps(done))
    recs = [r for t in done.values() for r in t["rows"]]
    repro = {"n_rows": len(recs),
             "max_abs_dloss_vs_stored": max(r["max_abs_dloss_vs_stored"] for r in recs),
             "T_mismatch_rows": [(r["row_id"], e, r[f"before_T{e:g}"], r[f"stored_col_T{e:g}"])
                                 for r in recs for e in EPS_T
                                 if not (r[f"before_T{e:g}"] == r[f"stored_col_T{e:g}"]
                                         or (np.isnan(r[f"before_T{e:g}"])
                                             and np.isnan(r[f"stored_col_T{e:g}"])))],
             "L_mismatch_rows": [(r["row_id"], q, r[f"before_L{q:g}"], r[f"stored_col_L{q:g}"])
                                 for r in recs for q in (0.5, 0.25)
                                 if not (r[f"before_L{q:g}"] == r[f"stored_col_L{q:g}"]
                                         or (np.isnan(r[f"before_L{q:g}"])
                                             and np.isnan(r[f"stored_col_L{q:g}"])))]}
    summary = {"tasks": list(done), "reproduction": repro, "stats": bench_stats(recs),
               "timing": {t: d["timing"] for t, d in done.items()},
               "gamma_logit_fix": {t: d["gamma_logit_fix"] for t, d in done.items()}}
    (OUT / "benchmark_summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(repro, indent=1))
    print_stats(summary["stats"])
    for t, d in summary["timing"].items():
        print(t, {k: round(v, 2) for k, v in d.items()})


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    t00 = time.time()
    spec = OptimSpec(datasets=("cifar10_test",), per_class=(50,))
    task = Task("cifar10_test", 50, 0, 5)
    key = _task_key(task)
    n = task.num_train
    data, hk, lam = build(spec, task)
    rows = stored()
    feature_fn, bp0, w0, b0 = data.split
    # path 0 of the predictor is the real run's order
    from ntk_tt.data._batches import path_batch_indices
    same = bool(jnp.all(path_batch_indices(key, n, 50, spec.steps, 8)[0]
                        == ntk_tt.batch_indices(key, n, 50, spec.steps)))
    print(f"path 0 == batch_indices(key): {same}")
    g0sq, sigma2 = gradient_profiles(feature_fn, bp0, w0, b0, data.x, data.y, LOSS, 64, None)
    from ntk_tt.dynamics._noise import _mean_grad
    from ntk_tt.kernels._head_aware import _WithHead
    g0 = _mean_grad(_WithHead(feature_fn), (bp0, w0, b0), data.x, data.y, LOSS)[0]
    summary = {"path0_is_real_order": same, "rows": {}}
    aks = {}
    diag_rows = {(1e-3, 50), (1e-3, None)}
    for bsz in (50, None):
        for peak in (1e-3, 1e-4):
            if QUICK and (peak, bsz) != (1e-3, 50):
                continue
            cfg = OptimConfig("adamw_cosine", peak, 0.01, bsz)
            opt = spec.optimizer(cfg, lam, n)
            if bsz not in aks:
                aks[bsz] = ntk_tt.adam_head_aware_kernel(data.split, data.x, data.y, opt, hk=hk,
                                                         backbone=FORM)
                print(f"B={bsz}: calibration γ = {np.asarray(aks[bsz].drift.calibration)}, "
                      f"λ_ref = {float(aks[bsz].drift.ref):.3f}, κ = "
                      f"{float(aks[bsz].drift.kappa):.3f}")
            ak = aks[bsz]
            rid = row_id(task, cfg)
            res = {"stored_real": t_eps(rows[rid]["real_loss"]),
                   "stored_pred": t_eps(rows[rid]["pred_loss"]),
                   "stored_real_final": float(rows[rid]["real_loss"][-1]),
                   "stored_pred_final": float(rows[rid]["pred_loss"][-1])}
            fixinfo = rank_one_fix(ak, data.y)
            res["gamma"] = [fixinfo["gam0"], fixinfo["gam1"], fixinfo["gam1_fix"]]
            p1 = record(res, "pred_1path", predict(data, opt, spec, key, ak, 1))
            pf = record(res, "fixed_1path", predict_fixed(data, opt, spec, key, ak, 1))
            if not summary.get("noop_checked"):  # the patch mechanism: a no-op patch = original
                noop = dict(fixinfo, gam0=1.0, table=ak.drift)
                orig = aha._adam_core
                aha._adam_core = make_fixed_core(noop)
                try:
                    p0 = predict(data, opt, spec, key, ak, 1)
                finally:
                    aha._adam_core = orig
                summary["noop_checked"] = float(np.max(np.abs(p0 - p1)))
                print(f"no-op patch max |Δloss| = {summary['noop_checked']:.2e}")
            lf = logit_fix(ak, data, opt, bsz, g0sq, sigma2)
            res["gamma_logit_fix"] = lf["gam"]
            orig = aha._adam_core
            aha._adam_core = make_logit_core(lf)
            try:
                pl = record(res, "logitfix_1path", predict(data, opt, spec, key, ak, 1))
            finally:
                aha._adam_core = orig
            if bsz is not None and not QUICK:
                record(res, "pred_8path", predict(data, opt, spec, key, ak, 8))
                record(res, "fixed_8path", predict_fixed(data, opt, spec, key, ak, 8))
            dg = None
            if (peak, bsz) in diag_rows:
                dg = {"ak": ak, "g0sq": g0sq, "sigma2": sigma2, "g0": g0}
            ref = reference(data, opt, spec.steps, key, diag=dg)
            res["reference"] = t_eps(ref["loss"])
            res["reference_final"] = float(ref["loss"][-1])
            np.savez(OUT / f"diag_p{peak:g}_b{bsz or 'N'}{TAG}.npz", pred_curve=p1,
                     fixed_curve=pf, logitfix_curve=pl, **ref,
                     real=np.asarray(rows[rid]["real_loss"]))
            summary["rows"][rid] = res
            print(rid, json.dumps(res), f"{time.time() - t00:.0f}s", flush=True)
    (OUT / (("summary_quick" if QUICK else "summary") + TAG + ".json")).write_text(
        json.dumps(summary, indent=1))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--quick", action="store_true",
                   help="default mode: only B = 50, peak 1e-3 (development)")
    p.add_argument("--kronecker", action="store_true",
                   help="default mode: the Kronecker K_h, K_P form (outputs tagged _kron)")
    p.add_argument("--logit", action="store_true",
                   help="Θ_P against the isotropic K_P on the stored reference paths")
    p.add_argument("--benchmark", nargs="*", metavar="DATASET", default=None,
                   help=f"every AdamW row at N = 250 (default: {' '.join(BENCH_TARGETS)})")
    p.add_argument("--out", type=pathlib.Path, default=OUT, metavar="DIR",
                   help=f"output directory (default {OUT})")
    args = p.parse_args(argv)
    out_dir(p, args.out)  # an existing file, or an unknown --benchmark name, were tracebacks
    known_sets(p, args.benchmark or (), "--benchmark")
    return args


def cli(argv=None):
    global OUT, QUICK, FORM, TAG
    args = parse_args(argv)
    OUT, QUICK = args.out, args.quick
    FORM = "kronecker" if args.kronecker else "isotropic"
    TAG = "" if FORM == "isotropic" else "_kron"
    if args.benchmark is not None:   # --benchmark takes precedence over --logit, as before
        return benchmark(tuple(args.benchmark) or BENCH_TARGETS)
    return logit_analysis() if args.logit else main()


if __name__ == "__main__":
    sys.exit(cli())
