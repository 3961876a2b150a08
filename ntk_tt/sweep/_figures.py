"""The paper's figures and Table 1, drawn from the results table alone.

* Fig. 1: predicted vs real T_ε (steps), GD and SGD, per dataset, with ±13 % / ±20 % bands and
  each dataset's least-squares slope through the origin.
* Table 1: mean |relative T_ε error| by optimiser × dataset × ε × learning-rate regime (CSV).
* Fig. 2: real and predicted loss curves of momentum pairs at equal effective learning rate.
* Fig. 5: wall time of prediction vs real fine-tuning, per configuration and per task sweep.
* Fig. 6: |relative T_ε error| vs learning rate (κ̃), batch size and dataset size.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pandas as pd
from matplotlib.figure import Figure  # no pyplot: no global backend, nothing left open

from ntk_tt.sweep._errors import POOLED, epsilons, row_errors, t_col
from ntk_tt.sweep._summary import task_times


def _subplots(*grid, figsize, **kw):
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(*grid, **kw)


FIGURES = ("fig1_scatter.png", "fig2_equal_elr.png", "fig5_walltime.png", "fig6_factors.png")
TABLE1 = "table1.csv"


def _lr_label(frame: pd.DataFrame) -> pd.Series:
    return frame["lr_kind"].map({"kappa": "κ̃=", "eta": "η="}) + frame["lr_value"].map("{:g}".format)


def fig1_scatter(frame: pd.DataFrame, path: pathlib.Path) -> None:
    """Paper Fig. 1: predicted vs real T_ε (steps), ε ∈ {0.1, 0.4}, GD and SGD panels, one
    colour per dataset with its least-squares slope, ±13 % / ±20 % bands; writes a PNG."""
    fig, axes = _subplots(1, 2, figsize=(10, 4.6))
    for ax, opt, band in zip(axes, ("gd", "sgd"), (0.13, 0.20), strict=True):
        rows = frame[(frame["optimizer"] == opt) & ~frame["real_diverged"].astype(bool)]
        top = 1.0
        for k, (name, sub) in enumerate(rows.groupby("dataset")):
            real = np.concatenate([sub[t_col("real", e)].to_numpy(float) for e in POOLED])
            pred = np.concatenate([sub[t_col("pred", e)].to_numpy(float) for e in POOLED])
            ok = np.isfinite(real) & np.isfinite(pred)
            if not ok.any():
                continue
            slope = float(real[ok] @ pred[ok] / max(real[ok] @ real[ok], 1e-12))
            ax.scatter(real[ok], pred[ok], s=10, alpha=0.6, color=f"C{k}",
                       label=f"{name} (slope {slope:.2f})")
            top = max(top, real[ok].max(), pred[ok].max())
        t = np.linspace(0, top * 1.05, 50)
        ax.plot(t, t, "k-", lw=1)
        ax.fill_between(t, t * (1 - band), t * (1 + band), color="grey", alpha=0.2,
                        label=f"±{band:.0%}")
        ax.set(title=f"{opt.upper()}: T_ε, ε ∈ {{0.1, 0.4}}", xlabel="real T_ε (steps)",
               ylabel="predicted T_ε (steps)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table1(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean |relative T_ε error| by optimiser, dataset, ε and learning-rate regime."""
    parts = []
    for e in epsilons(frame):
        abs_err, _, _ = row_errors(frame, "ntk", e)
        parts.append(pd.DataFrame({
            "optimizer": frame["optimizer"], "dataset": frame["dataset"], "eps": e,
            "lr": _lr_label(frame), "abs_err": abs_err,
        }))
    long = pd.concat(parts).dropna(subset=["abs_err"])
    return (long.groupby(["optimizer", "dataset", "eps", "lr"])["abs_err"]
            .agg(mean_abs_err="mean", n="size").reset_index())


def fig2_equal_elr(frame: pd.DataFrame, path: pathlib.Path) -> None:
    """Paper Fig. 2: real and predicted loss curves (per step) of m = 0 vs m = 0.9 runs at
    equal effective learning rate η/(1 − m), one GD task; writes a PNG."""
    gd = frame[(frame["optimizer"] == "gd") & (frame["lr_kind"] == "kappa")]
    task = gd["task_id"].iloc[0] if len(gd) else None
    rows = gd[gd["task_id"] == task]
    kappas = sorted(rows["lr_value"].unique())
    fig, axes = _subplots(1, max(len(kappas), 1), figsize=(4 * max(len(kappas), 1), 3.6),
                           squeeze=False)
    for ax, kap in zip(axes[0], kappas, strict=False):
        pair = rows[rows["lr_value"] == kap].sort_values("momentum")
        for j, (_, r) in enumerate(pair.iterrows()):
            lab = f"m={r['momentum']:g}, η={r['learning_rate']:.3g}"
            ax.plot(np.asarray(r["real_loss"]), color=f"C{j}", label=f"real {lab}")
            ax.plot(np.asarray(r["pred_loss"]), color=f"C{j}", ls="--", label=f"pred {lab}")
        ax.set(title=f"{task}\nGD, κ̃ = {kap:g}", xlabel="step", ylabel="training loss")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def fig5_walltime(frame: pd.DataFrame, path: pathlib.Path) -> None:
    """Paper Fig. 5: wall time (s, compile excluded) of prediction vs real fine-tuning, per
    configuration and per whole task sweep (one kernel + all predictions); writes a PNG."""
    tasks = task_times(frame)
    panels = (
        ("one configuration", [(opt.upper(), sub) for opt, sub in frame.groupby("optimizer")],
         "seconds_finetune", None),
        ("whole task sweep", [(f"{len(tasks)} tasks", tasks)], "task_seconds_finetune",
         "task_seconds_kernel"),
    )
    fig, axes = _subplots(1, 2, figsize=(10, 4.4))
    for ax, (title, groups, xcol, kcol) in zip(axes, panels, strict=True):
        values = []
        for k, (label, sub) in enumerate(groups):
            x = sub[xcol].to_numpy(float)
            y = (sub["seconds_predict"] if kcol is None
                 else sub[kcol] + sub["task_seconds_predict"]).to_numpy(float)
            ax.scatter(x, y, s=12, color=f"C{k}", label=label)
            values += [x, y]
        v = np.concatenate(values)
        lo, hi = v[v > 0].min() / 3, v.max() * 3
        t = np.geomspace(lo, hi, 20)
        for ratio, ls in ((1, "-"), (10, "--"), (100, ":")):
            ax.plot(t, t / ratio, "k", ls=ls, lw=0.8, label=f"{ratio}× cheaper")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), title=title,
               xlabel="real fine-tuning, training steps only (s)",
               ylabel="prediction incl. kernel (s)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _categories(data: pd.DataFrame, col: str, order: list[str]) -> list:
    return list(data.sort_values(order)[col].drop_duplicates())


def fig6_factors(frame: pd.DataFrame, path: pathlib.Path) -> None:
    """Paper Fig. 6: median and p95 relative T_ε error against learning rate, batch size and
    dataset size; one value per (row, ε ∈ {0.1, 0.4}), pooled as in the summary's headline
    and breakdown; writes a PNG."""
    sgd = frame["optimizer"] == "sgd"
    base = frame.assign(lr=_lr_label(frame),
                        batch=frame["batch_size"].astype(str).where(sgd, "GD"),
                        batch_order=frame["batch_size"].where(sgd, 0))
    data = pd.concat([base.assign(abs_err=row_errors(frame, "ntk", e)[0]) for e in POOLED],
                     ignore_index=True)
    axes_spec = (("lr", ["lr_kind", "lr_value"], "learning rate"),
                 ("batch", ["batch_order"], "batch size"),
                 ("per_class", ["per_class"], "images per class"))
    fig, axes = _subplots(1, 3, figsize=(13, 3.8))
    for ax, (col, order, title) in zip(axes, axes_spec, strict=True):
        cats = _categories(data, col, order)
        for k, (opt, sub) in enumerate(data.groupby("optimizer")):
            g = sub.groupby(col)["abs_err"]
            med, p95 = g.median().reindex(cats), g.quantile(0.95).reindex(cats)
            x = np.arange(len(cats)) + 0.25 * k
            ax.bar(x, p95, width=0.25, color=f"C{k}", alpha=0.35, label=f"{opt.upper()} p95")
            ax.plot(x, med, "o", color=f"C{k}", label=f"{opt.upper()} median")
        ax.set_xticks(np.arange(len(cats)) + 0.125, [str(c) for c in cats], fontsize=7)
        ax.set(title=f"|rel. T_ε error| vs {title}", ylabel="|error| (ε ∈ {0.1, 0.4})")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def make_figures(frame: pd.DataFrame, out: str | pathlib.Path) -> list[pathlib.Path]:
    """Write Fig. 1, 2, 5, 6 (PNG) and Table 1 (CSV) into ``out``; return their paths."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in FIGURES]
    for draw, path in zip((fig1_scatter, fig2_equal_elr, fig5_walltime, fig6_factors), paths,
                          strict=True):
        draw(frame, path)
    table1(frame).to_csv(out / TABLE1, index=False, float_format="%.4f")
    return [*paths, out / TABLE1]
