"""Kernel-evolution diagnostics (issue 9, item 1): which part of the empirical NTK grows
during fine-tuning, and why.

Tasks are built exactly as the sweep builds them (``ntk_tt.sweep._load.load_task``: shipped
checkpoint, fresh head from the task seed, ``classes`` × ``per_class`` images). For each
(dataset, κ̃, m), with η = κ̃·N(1 − m)/λ_max(Θ_0) (λ_max by the sweep's power iteration),
three full-batch GD paths of T steps on the mean cross-entropy:

* ``real``: optax ``sgd(η, m)`` through
  ``ntk_tt.training._steps.train_step`` (one jitted step in a
  host loop, as ``sweep._finetune._finetune_group``). At each checkpoint t the exact Θ_t
  (N·C × N·C) of the full model at the real weights w_t, its head part
  Θ_head,t = (H_t H_tᵀ + 1) ⊗ I_C (H_t = backbone features at w_t) and backbone part
  Θ_b,t = Θ_t − Θ_head,t.
* ``head_aware``: ``ntk_tt.dynamics._predict_head_aware.head_aware_step`` rolled with the same η, m
  (Kronecker feature kernel k_b, S of the sweep); its implied kernel
  Θ̂_t = ((H_0 + φ_t)(H_0 + φ_t)ᵀ + 1) ⊗ I_C + k_b ⊗ (W_tᵀ S W_t).
* ``linear``: the frozen-kernel recursion on the exact Θ_0 (heavy ball in function space);
  its kernel is Θ_0 at every t BY CONSTRUCTION; its head weights move by the linearised
  model's update W_{t+1} = W_t − η u_t, u_t = m u_{t−1} + H_0ᵀ g_t. Its loss is checked
  against ``ntk_tt.predict_from_kernel``.

Per checkpoint: loss, ‖W_t‖_F, λ_max (``numpy.linalg.eigvalsh``), ‖Θ_t‖_F, ‖Θ_head,t‖_F,
‖Θ_b,t‖_F, ‖Θ_t − Θ_0‖_F/‖Θ_0‖_F (against the path's own Θ_0), kernel–target alignment
A(Θ, Y) = yᵀΘy / (‖Θ‖_F ‖y‖²) with y the one-hot labels flattened sample-major, uncentred
(``align``) and centred per sample, y − 1/C (``align_centred``). For real rows, the test of
"the backbone part grows because the head grows": Θ_b,t against the Kronecker model at the
real head k_b ⊗ (W_tᵀ S W_t) (k_b, S from t = 0), and, on a subset of ``--subset`` samples
only (the exact feature kernel on all N is (N·F)² numbers), against the exact feature
kernel of t = 0 at the real head (I ⊗ W_tᵀ) K_h,0 (I ⊗ W_t). ``*_unexpl`` =
‖Θ_b,t − model_t‖/‖Θ_b,t − Θ_b,0‖; ``*_unexpl_delta`` removes the model's own t = 0 error:
‖(Θ_b,t − Θ_b,0) − (model_t − model_0)‖/‖Θ_b,t − Θ_b,0‖. Head-aware rows also give
``vs_real`` = ‖Θ̂_t − Θ_t‖/‖Θ_t − Θ_0‖ (Θ_t the real kernel at the same t).

Writes ``kernel_evolution.csv`` (one row per dataset, κ̃, m, path, t), ``curves.csv`` (the
three loss curves), ``summary.json`` and ``kernel_evolution.png`` into ``--out``.

    PYTHONPATH=. python experiments/kernel_evolution.py            # the committed results
    PYTHONPATH=. python experiments/kernel_evolution.py --per-class 10 --steps 20 \\
        --checkpoints 0 5 20 --out /tmp/ke                         # a quick smoke run

``--feature-kernel-kappas``: runs that also get, at the last checkpoint and on the subset,
the exact feature kernel K_h,T at the real backbone, splitting the backbone part's change
into "the head grows" (W_TᵀK_h,0W_T − W_0ᵀK_h,0W_0) and "the features' kernel changes"
(W_Tᵀ(K_h,T − K_h,0)W_T), with the identity check W_TᵀK_h,TW_T = Θ_b,T (``split_check``).
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd
from _args import fail, known_sets  # experiments/_args.py, beside this script

import ntk_tt
from ntk_tt.dynamics._fspace import mean_grad, top_eigenvalue
from ntk_tt.dynamics._losses import mean_loss
from ntk_tt.dynamics._predict_head_aware import head_aware_step, initial_state
from ntk_tt.sweep._grid import SweepSpec, Task
from ntk_tt.sweep._load import _task_key, load_task
from ntk_tt.sweep._predictions import _kronecker
from ntk_tt.training._steps import train_step

LOSS = "cross_entropy"


def _backbone_params(params, bparams):
    """The backbone part of the full params pytree, in ``split_head``'s structure: every leaf
    of the full model's params outside its ``head`` (the feature model's head is an identity
    without parameters), checked leaf path by leaf path against ``bparams``."""
    full = jax.tree_util.tree_flatten_with_path(params)[0]
    kept = [(jax.tree_util.keystr(k), v) for k, v in full
            if "head" not in jax.tree_util.keystr(k[:1])]
    want, treedef = jax.tree_util.tree_flatten_with_path(bparams)
    if [k for k, _ in kept] != [jax.tree_util.keystr(k) for k, _ in want]:
        raise ValueError("backbone params do not match split_head's structure")
    return jax.tree.unflatten(treedef, [v for _, v in kept])


def _fro(a):
    return float(np.linalg.norm(np.asarray(a)))


def _alignment(theta, yv):
    return float(yv @ theta @ yv / (np.linalg.norm(theta) * (yv @ yv)))


def _head_part(h, c):
    return np.kron(h @ h.T + 1.0, np.eye(c, dtype=h.dtype))


def _kernel_stats(theta, head, w, yv, yc, theta_ref):
    """The quantities every path reports for one kernel (numpy, float64 reductions)."""
    theta = np.asarray(theta, np.float64)
    head = np.asarray(head, np.float64)
    return {
        "lam_max": float(np.linalg.eigvalsh(theta)[-1]),
        "theta_fro": _fro(theta), "head_fro": _fro(head), "back_fro": _fro(theta - head),
        "w_fro": _fro(w), "rel_change": _fro(theta - theta_ref) / _fro(theta_ref),
        "align": _alignment(theta, yv), "align_centred": _alignment(theta, yc),
    }


def _unexplained(back, back0, model, model0):
    d = _fro(back - back0)
    return _fro(back - model) / d, _fro((back - back0) - (model - model0)) / d


def _feature_kernel_change(feature_fn, bparams, xs, kh0, w, w0, back, back0):
    """At the real backbone of step T, on the subset: the exact feature kernel K_h,T and the
    split of the backbone part's change ΔΘ_b = [W_TᵀK_0W_T − W_0ᵀK_0W_0] (the head grows,
    features frozen) + [W_Tᵀ(K_T − K_0)W_T] (the feature kernel changes). ``split_check`` =
    ‖W_TᵀK_TW_T − Θ_b,T‖/‖Θ_b,T‖ must be ≈ 0 (the identity Θ_b = (I⊗Wᵀ)K_h(I⊗W))."""
    m, f = xs.shape[0], kh0.shape[1]
    kht = np.asarray(ntk_tt.empirical_ntk(feature_fn, bparams, xs), np.float64)
    kht = kht.reshape(m, f, m, f)

    def sandwich(k, ww):
        c = ww.shape[1]
        return np.einsum("fc,ifjg,gd->icjd", ww, k, ww).reshape(m * c, m * c)

    w0 = np.asarray(w0, np.float64)
    d = _fro(back - back0)
    head_term = sandwich(kh0, w) - sandwich(kh0, w0)
    feat_term = sandwich(kht - kh0, w)
    diag0 = np.einsum("ifif->", kh0)
    return {"kh_rel_change": _fro(kht - kh0) / _fro(kh0),
            "kh_trace_ratio": float(np.einsum("ifif->", kht) / diag0),
            "dback_head_term": _fro(head_term) / d, "dback_feature_term": _fro(feat_term) / d,
            "split_check": _fro(sandwich(kht, w) - back) / _fro(back)}


def _real_run(data, key, lr, mom, steps, checkpoints):
    """Real optax GD: full loss curve (T + 1,) and params at the checkpoints."""
    n = data.x.shape[0]
    batches = ntk_tt.batch_indices(key, n, n, steps)
    step = _jit_step(data.apply_fn)
    ev = _jit_eval(data.apply_fn)
    params = data.params
    state = optax.sgd(0.1, 0.9).init(params)
    lr, mom = jnp.float32(lr), jnp.float32(mom)
    curve = [float(ev(params, data.x, data.y))]
    saved = {0: params}
    for t in range(1, steps + 1):
        params, state = step(params, state, data.x, data.y, batches[t - 1], lr, mom)
        curve.append(float(ev(params, data.x, data.y)))
        if t in checkpoints:
            saved[t] = params
    return np.array(curve), saved


@functools.cache
def _jit_step(apply_fn):
    return jax.jit(functools.partial(train_step, apply_fn))


@functools.cache
def _jit_eval(apply_fn):
    return jax.jit(lambda p, x, y: mean_loss(apply_fn(p, x), y, LOSS))


@functools.partial(jax.jit, static_argnames="steps")
def _head_aware_path(hk, y, lr, mom, *, steps):
    """States (W, b, φ) after 0..T steps (stacked) and the loss curve of the head-aware model."""
    s0 = initial_state(hk)
    idx = jnp.arange(hk.features.shape[0], dtype=jnp.int32)

    def body(s, _):
        s = head_aware_step(s, idx, hk, y, learning_rate=lr, momentum=mom, nesterov=False,
                            loss=LOSS, track_backbone=False)
        return s, (s.w, s.b, s.phi)

    _, (ws, bs, phis) = jax.lax.scan(body, s0, None, length=steps)
    ws, bs, phis = (jnp.concatenate([a[None], b]) for a, b in zip((s0.w, s0.b, s0.phi),
                                                                   (ws, bs, phis), strict=True))
    fs = jnp.einsum("tnf,tfc->tnc", hk.features[None] + phis, ws) + bs[:, None]
    return ws, phis, jax.vmap(lambda f: mean_loss(f, y, LOSS))(fs)


@functools.partial(jax.jit, static_argnames="steps")
def _linear_path(theta, f0, h0, w0, y, lr, mom, *, steps):
    """Frozen-kernel heavy ball in function space, and the linearised model's head weights."""
    n, c = f0.shape

    def body(s, _):
        f, v, w, u = s
        g = mean_grad(f, y, LOSS)  # (N, C)
        v = mom * v + g.reshape(-1)
        u = mom * u + h0.T @ g
        f = f - lr * (theta @ v).reshape(n, c)
        w = w - lr * u
        return (f, v, w, u), (f, w)

    s0 = (f0, jnp.zeros(n * c), w0, jnp.zeros_like(w0))
    _, (fs, ws) = jax.lax.scan(body, s0, None, length=steps)
    fs = jnp.concatenate([f0[None], fs])
    ws = jnp.concatenate([w0[None], ws])
    return ws, jax.vmap(lambda f: mean_loss(f, y, LOSS))(fs)


def run_dataset(dataset, args, rows, curves, log):
    task = Task(dataset, args.per_class, args.seed)
    spec = SweepSpec(datasets=(dataset,), per_class=(args.per_class,), seeds=(args.seed,),
                     steps=args.steps)
    data = load_task(task, spec)
    key = _task_key(task)
    feature_fn, bparams0, w0, b0 = data.split
    n, c = data.x.shape[0], w0.shape[1]
    t0 = time.perf_counter()
    theta0 = ntk_tt.empirical_ntk(data.apply_fn, data.params, data.x)
    lam_power = float(top_eigenvalue(theta0))
    hk = _kronecker(data, theta0, key)  # k_b, S exactly as the sweep's Kronecker variant
    h0 = np.asarray(hk.features)
    kb, s_mix = np.asarray(hk.backbone, np.float64), np.asarray(hk.mixing, np.float64)
    sub = np.sort(np.asarray(jax.random.choice(jax.random.fold_in(key, 5), n,
                                               (min(args.subset, n),), replace=False)))
    subc = (sub[:, None] * c + np.arange(c)).reshape(-1)  # (sample, logit) rows of the subset
    kh0 = np.asarray(ntk_tt.empirical_ntk(feature_fn, bparams0, data.x[sub]), np.float64)
    f_dim = h0.shape[1]
    kh0 = kh0.reshape(len(sub), f_dim, len(sub), f_dim)
    log(f"{dataset}: Θ_0, head-aware kernel, K_h,0 on {len(sub)} samples "
        f"({time.perf_counter() - t0:.0f} s); λ_max(Θ_0) = {lam_power:.4g}")

    y = data.y
    yv = np.asarray(jax.nn.one_hot(y, c), np.float64).reshape(-1)
    yc = yv - 1.0 / c
    th0 = np.asarray(theta0, np.float64)
    head0 = _head_part(h0.astype(np.float64), c)
    back0 = th0 - head0

    def kron_model(w):
        w = np.asarray(w, np.float64)
        return np.kron(kb, w.T @ s_mix @ w)

    def exact_sub_model(w):
        w = np.asarray(w, np.float64)
        return np.einsum("fc,ifjg,gd->icjd", w, kh0, w).reshape(len(sub) * c, len(sub) * c)

    kron0, exact0 = kron_model(w0), exact_sub_model(w0)
    kron0_sub = kron0[np.ix_(subc, subc)]
    ha_theta0 = head0 + kron0
    f0 = data.apply_fn(data.params, data.x)
    thetas_real = {}
    for kappa in args.kappas:
        for mom in args.momenta:
            lr = kappa * n * (1.0 - mom) / lam_power
            base = {"dataset": dataset, "N": n, "kappa_eff": kappa, "momentum": mom,
                    "eta": lr, "lam0_power": lam_power}
            t1 = time.perf_counter()
            curve, saved = _real_run(data, key, lr, mom, args.steps, set(args.checkpoints))
            log(f"  κ̃={kappa} m={mom}: real run {time.perf_counter() - t1:.0f} s, "
                f"L_0={curve[0]:.3f} L_T={curve[-1]:.3f}")
            ha_w, ha_phi, ha_loss = _head_aware_path(hk, y, jnp.float32(lr), jnp.float32(mom),
                                                     steps=args.steps)
            lin_w, lin_loss = _linear_path(theta0, f0, hk.features, w0, y, jnp.float32(lr),
                                           jnp.float32(mom), steps=args.steps)
            ref = ntk_tt.predict_from_kernel(theta0, f0, y, learning_rate=lr, momentum=mom,
                                             steps=args.steps)
            lin_check = float(jnp.max(jnp.abs(ref.loss - lin_loss)))
            for t in range(args.steps + 1):
                curves.append({**base, "t": t, "real": curve[t], "head_aware": float(ha_loss[t]),
                               "linear": float(lin_loss[t])})
            for t in args.checkpoints:
                p = saved[t]
                bp = _backbone_params(p, bparams0)
                h = np.asarray(feature_fn(bp, data.x), np.float64)
                w = np.asarray(p["head"]["kernel"][...], np.float64)
                split_err = float(np.max(np.abs(
                    h @ w + np.asarray(p["head"]["bias"][...]) - data.apply_fn(p, data.x))))
                theta = th0 if t == 0 else np.asarray(
                    ntk_tt.empirical_ntk(data.apply_fn, p, data.x), np.float64)
                thetas_real[t] = theta
                head = _head_part(h, c)
                back = theta - head
                row = {**base, "path": "real", "t": t, "loss": curve[t], "split_err": split_err,
                       **_kernel_stats(theta, head, w, yv, yc, th0)}
                if t == 0:  # the models' own error at t = 0 (exact model: a check, ≈ 0)
                    row["kron_err0"] = _fro(back0 - kron0) / _fro(back0)
                    row["exact_sub_err0"] = _fro(back0[np.ix_(subc, subc)] - exact0) / _fro(
                        back0[np.ix_(subc, subc)])
                if t > 0:
                    row["kron_unexpl"], row["kron_unexpl_delta"] = _unexplained(
                        back, back0, kron_model(w), kron0)
                    bs, bs0 = back[np.ix_(subc, subc)], back0[np.ix_(subc, subc)]
                    row["exact_sub_unexpl"], row["exact_sub_unexpl_delta"] = _unexplained(
                        bs, bs0, exact_sub_model(w), exact0)
                    row["kron_sub_unexpl"], row["kron_sub_unexpl_delta"] = _unexplained(
                        bs, bs0, kron_model(w)[np.ix_(subc, subc)], kron0_sub)
                if t == max(args.checkpoints) and kappa in args.feature_kernel_kappas:
                    row.update(_feature_kernel_change(feature_fn, bp, data.x[sub], kh0, w, w0,
                                                      back[np.ix_(subc, subc)],
                                                      back0[np.ix_(subc, subc)]))
                rows.append(row)

                wa = np.asarray(ha_w[t], np.float64)
                ha_h = h0.astype(np.float64) + np.asarray(ha_phi[t], np.float64)
                ha_head = _head_part(ha_h, c)
                ha_theta = ha_head + kron_model(wa)
                ha_row = {**base, "path": "head_aware", "t": t, "loss": float(ha_loss[t]),
                          **_kernel_stats(ha_theta, ha_head, wa, yv, yc, ha_theta0)}
                if t > 0:
                    ha_row["vs_real"] = _fro(ha_theta - theta) / _fro(theta - th0)
                    ha_row["vs_real_delta"] = _fro((ha_theta - ha_theta0) - (theta - th0)) / _fro(
                        theta - th0)
                rows.append(ha_row)
                rows.append({**base, "path": "linear", "t": t, "loss": float(lin_loss[t]),
                             **_kernel_stats(th0, head0, lin_w[t], yv, yc, th0),
                             "lin_check": lin_check})
            log(f"    diagnostics done ({time.perf_counter() - t1:.0f} s); "
                f"linear vs predict_from_kernel max |ΔL| = {lin_check:.2e}")


def figure(frame: pd.DataFrame, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(frame.dataset))
    fig, axes = plt.subplots(2, len(datasets), figsize=(5.5 * len(datasets), 8.5),
                             squeeze=False)
    colours = dict(zip(sorted(frame.kappa_eff.unique()), ("tab:blue", "tab:orange", "tab:red",
                                                          "tab:green", "tab:purple"),
                       strict=False))
    markers = {0.0: "o", 0.9: "s"}
    for j, ds in enumerate(datasets):
        d = frame[frame.dataset == ds]
        ax = axes[0, j]
        for (kappa, mom), g in d.groupby(["kappa_eff", "momentum"]):
            for kind, style in (("real", "-"), ("head_aware", "--")):
                q = g[g.path == kind].sort_values("t")
                lam0 = q.lam_max.iloc[0]
                ax.plot(q.t, q.lam_max / lam0, style, marker=markers.get(mom, "^"),
                        color=colours[kappa], ms=4,
                        label=f"κ̃={kappa:g}, m={mom:g}" if kind == "real" else None)
        ax.axhline(1.0, color="k", ls=":", lw=1, label="linear (Θ frozen at Θ_0)")
        ax.set_yscale("log")
        ax.set_title(f"{ds}: λ_max(Θ_t)/λ_max(Θ_0)\nsolid real, dashed head-aware")
        ax.set_xlabel("step t")
        ax.legend(fontsize=7, ncol=2)
        ax = axes[1, j]
        for (kappa, mom), g in d.groupby(["kappa_eff", "momentum"]):
            q = g[g.path == "real"].sort_values("t")
            mk = markers.get(mom, "^")
            ax.plot(q.t, q.back_fro, "-", marker=mk, color=colours[kappa], ms=4,
                    label=f"κ̃={kappa:g}, m={mom:g}")
            ax.plot(q.t, q.head_fro, ":", marker=mk, color=colours[kappa], ms=3)
        ax.set_yscale("log")
        ax.set_title(f"{ds} (real): ‖Θ_b,t‖_F solid, ‖Θ_head,t‖_F dotted")
        ax.set_xlabel("step t")
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summarise(frame: pd.DataFrame, wall: float, args) -> dict:
    """Ratios to t = 0 at the last checkpoint, per (dataset, κ̃, m, path)."""
    out = {"wall_seconds": wall, "args": vars(args), "final": []}
    last = max(args.checkpoints)
    for (ds, kappa, mom, path), g in frame.groupby(["dataset", "kappa_eff", "momentum",
                                                    "path"]):
        a, b = g[g.t == 0].iloc[0], g[g.t == last].iloc[0]
        rec = {"dataset": ds, "kappa_eff": kappa, "momentum": mom, "path": path, "t": last,
               "loss_0": a["loss"], "loss_t": b["loss"],
               "lam_ratio": b["lam_max"] / a["lam_max"],
               "back_ratio": b["back_fro"] / a["back_fro"],
               "head_ratio": b["head_fro"] / a["head_fro"],
               "w_ratio": b["w_fro"] / a["w_fro"], "rel_change": b["rel_change"],
               "align_0": a["align"], "align_t": b["align"],
               "align_centred_0": a["align_centred"], "align_centred_t": b["align_centred"],
               "back_share_0": a["back_fro"] / a["theta_fro"],
               "back_share_t": b["back_fro"] / b["theta_fro"]}
        for k in ("kron_unexpl", "kron_unexpl_delta", "exact_sub_unexpl",
                  "exact_sub_unexpl_delta", "kron_sub_unexpl", "vs_real", "vs_real_delta",
                  "kh_rel_change", "kh_trace_ratio", "dback_head_term", "dback_feature_term",
                  "split_check"):
            if k in g and np.isfinite(b.get(k, np.nan)):
                rec[k] = b[k]
        out["final"].append({k: (float(v) if isinstance(v, (np.floating, float)) else v)
                             for k, v in rec.items()})
    return out


def check_args(ap: argparse.ArgumentParser, args) -> None:
    """Every argument, before any kernel is built (a fresh user's --kappas -1 and --momenta
    1.0 built the kernel and trained, then failed on a learning rate never passed): one
    ``kernel_evolution.py: error:`` line, exit 2 (``experiments/_args.py``)."""
    try:  # κ̃, m, per-class count, steps and seed by the sweep's own rules
        SweepSpec(datasets=tuple(args.datasets), per_class=(args.per_class,),
                  seeds=(args.seed,), kappas=tuple(args.kappas), momenta=tuple(args.momenta),
                  steps=args.steps)
    except ValueError as err:
        fail(ap, str(err).replace("SweepSpec.", ""))
    known_sets(ap, args.datasets, "--datasets")
    if args.feature_kernel_kappas is None:  # the default: those of 4 and 12 in the grid
        args.feature_kernel_kappas = [k for k in (4.0, 12.0) if k in args.kappas]
    if not set(args.feature_kernel_kappas) <= set(args.kappas):
        fail(ap, f"--feature-kernel-kappas {args.feature_kernel_kappas} must be among --kappas "
             f"{args.kappas} (they pick runs of the grid).")
    n = Task(args.datasets[0], args.per_class, args.seed).num_train
    if not 1 <= args.subset <= n:
        fail(ap, f"--subset must be in [1, N] = [1, {n}] (N = 5 classes × --per-class), got "
             f"{args.subset}.")
    if 0 not in args.checkpoints or not 0 <= min(args.checkpoints) <= max(
            args.checkpoints) <= args.steps:
        fail(ap, f"--checkpoints must include 0 and lie in [0, --steps] = [0, {args.steps}], got "
             f"{args.checkpoints}.")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="kernel_evolution.py",  # its name when imported too
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["cifar10_test", "flowers5_300pc"])
    ap.add_argument("--per-class", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kappas", type=float, nargs="+", default=[1.0, 4.0, 12.0])
    ap.add_argument("--momenta", type=float, nargs="+", default=[0.0, 0.9])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--checkpoints", type=int, nargs="+", default=[0, 15, 50, 100, 150])
    ap.add_argument("--subset", type=int, default=50,
                    help="samples for the exact feature kernel K_h,0 comparison")
    ap.add_argument("--feature-kernel-kappas", type=float, nargs="*",
                    help="κ̃ among --kappas whose runs also get the exact feature kernel K_h,T "
                         "on the subset at the last checkpoint (about 40 s each on 2 busy CPU "
                         "cores; default: 4 and 12 where --kappas has them; none: no values)")
    ap.add_argument("--out", default="experiments/results/kernel_evolution")
    args = ap.parse_args(argv)
    check_args(ap, args)
    args.checkpoints = sorted(set(args.checkpoints))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rows, curves = [], []
    for ds in args.datasets:
        run_dataset(ds, args, rows, curves, lambda s: print(s, flush=True))
    wall = time.perf_counter() - t0
    frame = pd.DataFrame(rows)
    frame.to_csv(out / "kernel_evolution.csv", index=False, float_format="%.6g")
    pd.DataFrame(curves).to_csv(out / "curves.csv", index=False, float_format="%.6g")
    summary = summarise(frame, wall, args)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    figure(frame, out / "kernel_evolution.png")
    print(f"wrote {out} in {wall:.0f} s", flush=True)


if __name__ == "__main__":
    main()
