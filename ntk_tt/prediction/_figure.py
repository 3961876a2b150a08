"""The main job's figure: predicted (and real) loss and error curves, divergences and
recovered spikes marked (``ntk-tt predict --figure``)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from ntk_tt.prediction._report_file import write_atomic


def _y_range(curves: list[tuple[np.ndarray, int | None, float]]) -> tuple[float, float]:
    """y-axis range of the curves up to their divergence (a diverged curve is then cut), each
    value above its curve's ``cap`` left off the chart (a spike that recovered)."""
    kept = [np.asarray(c, float)[: len(c) if at is None else at + 1] for c, at, _ in curves]
    kept = np.concatenate([c[np.isfinite(c)] for c in kept])
    alive = np.concatenate([np.asarray(c, float)[: len(c) if at is None else at]
                            for c, at, _ in curves])
    caps = np.concatenate([np.full(len(c) if at is None else at, cap) for c, at, cap in curves])
    alive = alive[np.isfinite(alive) & (alive <= caps)]
    base = alive if alive.size else kept
    lo, hi = (float(base.min()), float(base.max())) if base.size else (0.0, 1.0)
    pad = 0.1 * (hi - lo) or 0.1 * abs(hi) or 0.1
    return min(lo, 0.0) - pad * (lo < 0), hi + 3 * pad


def _drawn_end(curve: np.ndarray, at: int | None) -> int:
    """How much of a curve the figure draws: all of it, or for a diverged one up to its last
    finite value, the held tail cut. A real run's ``diverged_at`` is where its final rise
    began and it trains on, rising, until a value is non-finite (a fresh user's run rose
    from step 1 to 4.7·10⁷ at step 4 and was drawn to step 1 only); a prediction's is where
    its curve is held. Either way the values before the tail are drawn (off the chart where
    they blow up: the y-axis spans the curves before the divergence)."""
    if at is None:
        return len(curve)
    changes = np.flatnonzero(curve[:-1] != curve[-1])  # the tail: the held last value
    return max(at + 1, int(changes[-1]) + 2 if changes.size else 0)


def _recovered_spike(side) -> int | None:
    """The step a curve spiked above 10·L_0 when it recovered (``spiked_at`` without
    ``diverged_at``), else None."""
    return getattr(side, "spiked_at", None) if side.diverged_at is None else None


def _cap(side, name: str) -> float:
    """10·L_0 for the loss of a curve that spiked and recovered (its spike off the chart),
    else inf."""
    if name != "loss" or _recovered_spike(side) is None:
        return np.inf
    return 10.0 * float(np.asarray(side.loss, float)[0])


def _events(sides) -> dict[tuple[int, str], list[tuple[str, str]]]:
    """{(step, what): [(who, colour), ...]}: each side's divergence, or its recovered spike
    above 10·L_0, one entry per step."""
    events: dict[tuple[int, str], list[tuple[str, str]]] = {}
    for _, who, side, color, _ in sides:
        if side.diverged_at is not None:
            events.setdefault((side.diverged_at, "diverged"), []).append((who, color))
        elif (spike := _recovered_spike(side)) is not None:
            events.setdefault((spike, "spiked"), []).append((who, color))
    return dict(sorted(events.items()))


def figure(path: str | os.PathLike, prediction, run=None, title: str = "",
           overwrite: bool = True) -> Path:
    """Predicted loss / error curves with their band, and the real curves when given.

    A diverged curve is drawn up to its last finite value and marked where its divergence
    began (vertical line and text), and a loss that spiked above 10·L_0 and recovered is
    marked at its spike; the y-axis spans the curves before any divergence and, for the
    loss, below 10·L_0 of a spiked curve, so a blown-up value does not flatten the rest.
    The format follows the extension (png, pdf, svg, ...). Without ``overwrite`` an existing
    file is not replaced (``FileExistsError``). Written whole or not at all
    (``write_atomic``: a full disk leaves no truncated image).
    """
    from matplotlib.figure import Figure  # no pyplot: no global backend, nothing left open

    fig = Figure(figsize=(10, 4), constrained_layout=True)
    axes = fig.subplots(1, 2)
    steps = np.arange(len(prediction.loss))
    sides = [("predicted (NTK)", "prediction", prediction, "C0", "-")]
    if run is not None:
        sides.append(("real fine-tuning", "real run", run, "C3", "--"))
    for ax, name in zip(axes, ("loss", "error"), strict=True):
        band = getattr(prediction, f"{name}_band")
        if band is not None:
            ax.fill_between(steps, band[0], band[1], alpha=0.25, color="C0",
                            label="predicted 5–95 %")
        for label, _, side, color, ls in sides:
            curve = np.asarray(getattr(side, name), float)
            end = _drawn_end(curve, side.diverged_at)
            ax.plot(steps[:end], curve[:end], color=color, ls=ls, label=label)
        events = _events(sides)
        # one label per step (both sides at one step: one label, not two on top of each
        # other, a fresh user's find)
        for (at, what), who in events.items():
            ax.axvline(at, color=who[0][1] if len(who) == 1 else "k", lw=1.2, ls="-.")
            text = ("diverged\nat step {}" if what == "diverged"
                    else "spiked above 10·L_0\nat step {}, recovered").format(at)
            ax.annotate(f"{' and '.join(w for w, _ in who)} {text}", (at, 0.97),
                        xycoords=("data", "axes fraction"), va="top", fontsize=8,
                        ha="right" if at > 0.1 * len(steps) else "left",  # clear of the y axis
                        color=who[0][1] if len(who) == 1 else "k", rotation=90)
        t = prediction.training_time[name][0.1]
        if math.isfinite(t):
            ax.axvline(t, color="C0", lw=0.8, ls=":", label="predicted T_0.1")
        if events:
            ax.set_ylim(*_y_range([(getattr(side, name), side.diverged_at, _cap(side, name))
                                   for *_, side, _, _ in sides]))
        ax.set(xlabel="optimiser step", ylabel=f"training {name} (full set)",
               xlim=(0, len(steps) - 1))
        ax.legend()
    fig.suptitle(title, fontsize=9)
    path = Path(path)
    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110,
                                               format=path.suffix.lstrip(".").lower()),
                 create=not overwrite)
    return path
