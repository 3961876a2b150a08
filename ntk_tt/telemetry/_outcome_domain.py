"""The domain of an outcome predictor: where its fitting corpus lies.

A predictor keeps the range of every input over the rows it was fitted on
(:func:`feature_domain`: smallest and largest value, and whether any was missing); a run
whose inputs leave it (:func:`out_of_domain`: another model, data set or number of classes,
a prefix longer than the fitted ones; :func:`loss_out_of_domain`: another loss) is flagged in
:meth:`ntk_tt.OutcomePredictor.predict`, since trees do not extrapolate: they answer as for
the nearest corpus runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ntk_tt.telemetry._outcome_features import _f


def feature_domain(x: np.ndarray, columns: Sequence[str]) -> dict[str, list]:
    """The range of each input over fitting rows: {column: [low, high, missing]} from a
    feature matrix ``x`` (R, F) in ``columns`` order, low/high the smallest and largest
    non-NaN value (±inf kept: diverged runs have them; NaN when the column is all NaN) and
    missing whether any row is NaN there."""
    x = np.asarray(x, np.float64)
    out = {}
    for j, name in enumerate(columns):
        col = x[:, j]
        seen = col[~np.isnan(col)]
        lo, hi = (float(seen.min()), float(seen.max())) if seen.size else (math.nan, math.nan)
        out[name] = [lo, hi, bool(seen.size < col.size)]
    return out


def out_of_domain(features: dict[str, float], domain: dict[str, list]) -> list[dict]:
    """The inputs of one run (:func:`ntk_tt.outcome_features`) outside a predictor's ``domain``
    (:func:`feature_domain`), farthest first.

    Returns:
      one dict per flagged input: ``feature``, ``value`` (None when missing), ``low`` and
      ``high`` (the fitting rows' range), ``by`` (how far outside it, in the feature's units)
      and ``relative`` (``by`` in units of the range's width, of the bound's magnitude when
      the rows held one value); ``by`` and ``relative`` are None when missing or infinite.
      An input is outside when it is below ``low`` or above ``high``, missing (NaN) where no
      fitting row was, or present where every fitting row was missing.
    """
    flagged = []
    for name, (lo, hi, missing) in domain.items():
        v = _f(features.get(name, math.nan))
        if math.isnan(v) or math.isnan(lo):
            if math.isnan(v) == math.isnan(lo) or (math.isnan(v) and missing):
                continue
            by = rel = math.nan
        elif lo <= v <= hi:
            continue
        else:
            bound = lo if v < lo else hi
            by = abs(v - bound)
            width = hi - lo
            rel = by / (width if math.isfinite(width) and width > 0 else max(abs(bound), 1e-12))
        flagged.append({"feature": name, "value": None if math.isnan(v) else v, "low": lo,
                        "high": hi, "by": by, "relative": rel})
    flagged.sort(key=lambda e: -1.0 if math.isnan(e["relative"]) else -e["relative"] - 1.0)
    for e in flagged:
        e["by"], e["relative"] = (None if not math.isfinite(e[k]) else e[k]
                                  for k in ("by", "relative"))
    return flagged


def fitted_losses(info: dict) -> list[str] | None:
    """The losses (``loss_name``) of the runs a predictor was fitted on, from its ``info``:
    ``info["loss_names"]``; a file written before they were kept holds none and was fitted
    on the issue-11 corpus, all cross-entropy runs; None: unknown (fitted on a
    :class:`ntk_tt.telemetry._outcome_features.Dataset` without them)."""
    return info.get("loss_names", ["cross_entropy"])


def loss_out_of_domain(loss_name: str, info: dict) -> list[dict]:
    """[one flag] when a run's loss is not among those the predictor was fitted on
    (:func:`fitted_losses`), else []: an input ``loss_is_mse`` (1 for MSE, 0 for
    cross-entropy) outside the fitting runs' range, in the form of :func:`out_of_domain`."""
    names = fitted_losses(info)
    if not isinstance(names, list) or not names or loss_name in names:
        return []
    seen = [float(n == "mse") for n in names]
    value = float(loss_name == "mse")
    return [{"feature": "loss_is_mse", "value": value, "low": min(seen), "high": max(seen),
             "by": 1.0, "relative": None}]


def _domain(doc, columns: Sequence[str]) -> dict[str, list] | None:
    """A predictor file's ``domain`` checked against its columns (None when absent)."""
    if doc is None:
        return None
    if not isinstance(doc, dict) or set(doc) != set(columns) or not all(
            isinstance(v, list) and len(v) == 3 for v in doc.values()):
        raise ValueError("domain is not {column: [low, high, missing]} for every column")
    return {c: [float(doc[c][0]), float(doc[c][1]), bool(doc[c][2])] for c in columns}
