"""The what-if figure: predicted T_ε over η × m with the predicted divergence boundary."""

from __future__ import annotations

from typing import Any

import numpy as np

from ntk_tt.analysis._whatif_core import WhatIfGrid
from ntk_tt.dynamics._divergence import ABSTAINS, DIVERGES


def plot_whatif(grid_result: WhatIfGrid, ax: Any = None):
    """Heat map of the predicted T_ε over η × m with the predicted divergence boundary.

    x axis: learning rate η (log scale); y axis: momentum m (Adam's β₁ for an Adam
    grid: ``grid_result.momentum_name``); colour: T_ε in optimiser steps
    (``grid_result.training_time``), cells predicted to diverge grey (``diverged`` or the
    call "diverges", as the boundary), cells where T_ε is otherwise undefined (flat, not
    settled) left white, and cells whose outcome is "unknown" (beyond the predictor's edge,
    e.g. a frozen cross-entropy Θ's) light grey with a legend entry; the boundary (per m, the
    largest grid η below the first diverging one) is drawn as a line with markers, with a
    gap at a momentum where no grid η diverges (``boundary_inside`` False) or none lies below
    the first (``boundary`` NaN; no line, and the title says so, when there is none). Uses
    matplotlib's object API (no pyplot state, no backend change); a new figure has a colour
    bar (unless no cell has a T_ε).

    Source: ntk_tt's own figure (issue 13; README "What-if"); what it shows is defined in
    METHOD.md §2 ("Divergence", the heavy-ball stability edge) and §6 (T_ε; Zancato et al.
    2020, Sec. 5, Alg. 1).

    Args:
      grid_result: a :class:`ntk_tt.WhatIfGrid` from :func:`ntk_tt.divergence_boundary`.
      ax: a matplotlib Axes to draw on (default: a new Figure with one Axes).

    Returns:
      The ``matplotlib.figure.Figure`` drawn on.

    Raises:
      ValueError: ``grid_result`` is not a :class:`ntk_tt.WhatIfGrid` or its arrays do not have the
        shapes (G_m, G_η), (G_m,), (G_η,); pass the result of ``divergence_boundary``. ``ax``
        not a matplotlib Axes (or None).
    """
    if not isinstance(grid_result, WhatIfGrid):
        raise ValueError(f"grid_result must be the WhatIfGrid returned by "
                         f"divergence_boundary, got {type(grid_result).__name__}.")
    lrs, ms = np.asarray(grid_result.learning_rates), np.asarray(grid_result.momenta)
    shape = (ms.shape[0], lrs.shape[0])
    t = np.asarray(grid_result.training_time, float)
    said = np.asarray(grid_result.outcome)
    div = np.asarray(grid_result.diverged, bool)
    if (lrs.ndim != 1 or ms.ndim != 1 or t.shape != shape or div.shape != shape
            or said.shape != shape
            or np.shape(grid_result.boundary) != (shape[0],)):
        raise ValueError(f"grid_result arrays do not match its grid {shape} (momenta × "
                         "learning rates); pass the result of divergence_boundary unchanged.")
    div = div | (said == DIVERGES)  # predict's divergence "yes", as the boundary
    from matplotlib.axes import Axes
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure

    if ax is not None and not isinstance(ax, Axes):
        raise ValueError(f"ax must be a matplotlib Axes (e.g. fig.add_subplot()) or None for a "
                         f"new figure, got {type(ax).__name__}.")

    new = ax is None
    if new:
        fig = Figure(figsize=(6.4, 4.2), constrained_layout=True)
        ax = fig.add_subplot()
    fig = ax.figure
    x_edges, y_edges = _edges(lrs, log=True), np.clip(_edges(ms, log=False), 0.0, 1.0)
    mesh = ax.pcolormesh(x_edges, y_edges, np.ma.masked_invalid(t), cmap="viridis",
                         shading="flat")
    if div.any():
        ax.pcolormesh(x_edges, y_edges, np.ma.masked_where(~div, np.ones(shape)),
                      cmap=ListedColormap(["0.7"]), shading="flat")
    handles = []
    unknown = (said == ABSTAINS) & ~div  # a fresh user read these white cells as safe
    if unknown.any():
        from matplotlib.patches import Patch

        ax.pcolormesh(x_edges, y_edges, np.ma.masked_where(~unknown, np.ones(shape)),
                      cmap=ListedColormap(["0.88"]), shading="flat")
        handles.append(Patch(facecolor="0.88", edgecolor="0.5",
                             label="outcome unknown (beyond the predictor's edge)"))
    # a momentum with no diverging η (or none below the first: a one-point grid) has no
    # boundary in the grid: a gap
    b = np.where(np.asarray(grid_result.boundary_inside, bool),
                 np.asarray(grid_result.boundary, float), np.nan)
    inside = np.isfinite(b)
    if inside.any():
        handles[:0] = ax.plot(b, ms, "o-", color="crimson", lw=2, ms=4,
                              label="predicted divergence boundary")
    ax.set_xscale("log")
    ax.set_xlim(x_edges[0], x_edges[-1])
    ax.set_ylim(y_edges[0], y_edges[-1])
    ax.set_xlabel("learning rate η (log scale)")
    ax.set_ylabel(grid_result.momentum_name)
    ax.set_title(f"predicted T_{grid_result.epsilon:g} (loss, steps of {grid_result.steps}); "
                 + ("grey: predicted to diverge" if div.any() else
                    "no η of the grid is predicted to diverge"), fontsize=9)
    if handles:
        ax.legend(handles=handles, loc="lower left", fontsize=8)
    if new and np.isfinite(t).any():
        fig.colorbar(mesh, ax=ax, label="predicted T_ε (optimiser steps)")
    return fig


def _edges(centres: np.ndarray, *, log: bool) -> np.ndarray:
    """Cell edges around grid ``centres`` (midpoints; geometric when ``log``)."""
    v = np.log(centres) if log else np.asarray(centres, float)
    if v.shape[0] == 1:
        half = 0.1 if log else 0.05
        e = np.array([v[0] - half, v[0] + half])
    else:
        mid = 0.5 * (v[1:] + v[:-1])
        e = np.concatenate([[2 * v[0] - mid[0]], mid, [2 * v[-1] - mid[-1]]])
    return np.exp(e) if log else e
