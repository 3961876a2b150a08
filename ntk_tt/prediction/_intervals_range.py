"""The N and T a T_ε interval calibrator was fitted on, and the check of a new prediction's.

A calibrator (:class:`ntk_tt.IntervalCalibrator`) may record, in its ``source``,
``"num_train"`` and ``"steps"``: the [min, max] N and T (optimiser steps) of the benchmark
rows that gave it residuals (:func:`ntk_tt.fit_intervals`). A prediction outside them gets an
interval whose coverage was never measured: :func:`range_messages` says so, and
:func:`ntk_tt.intervals` warns :class:`CalibrationRangeWarning`. Calibrators written before
the ranges were recorded have none and flag nothing.
"""

from __future__ import annotations

import json

from ntk_tt._options import a_type, is_real
from ntk_tt.dynamics._predict_kernel import BeyondEdgeWarning

RANGES = (("num_train", "N", "training samples"), ("steps", "T", "steps"))


class CalibrationRangeWarning(BeyondEdgeWarning):
    """A T_ε interval for an N or T outside the calibration table's (:func:`ntk_tt.intervals`)."""


def range_messages(source: dict, num_train=None, steps=None) -> list[str]:
    """One message per quantity, N = ``num_train`` or T = ``steps``, outside ``source``'s
    recorded [min, max] ("N = 2000 training samples is outside the calibration table's
    N = 50–750 (...)"); none for a quantity that is None or has no recorded range.

    Raises:
      ValueError: ``num_train`` or ``steps`` neither None nor a number.
    """
    out = []
    for (field, sym, unit), v in zip(RANGES, (num_train, steps), strict=True):
        if v is None:
            continue
        if not is_real(v):
            raise ValueError(f"{field} must be a number ({sym}, {unit}) or None, got "
                             f"{a_type(v)}; pass e.g. {field}=250, not a string.")
        if field not in source:  # no range recorded: never outside
            continue
        lo, hi = source[field]
        if not lo <= v <= hi:
            shown = f"{lo:g}" if lo == hi else f"{lo:g}–{hi:g}"
            out.append(f"{sym} = {v:g} {unit} is outside the calibration table's {sym} = "
                       f"{shown} (the T_ε intervals are an extrapolation there: their "
                       "coverage is not measured)")
    return out


def check_ranges(path, source: dict) -> None:
    """ValueError unless each recorded range of a calibrator file's ``source`` is a [min, max]
    pair of numbers with min <= max (an absent one is fine: an older file)."""
    for field, _, _ in RANGES:
        if field not in source:
            continue
        r = source[field]
        if not (isinstance(r, list) and len(r) == 2 and all(map(is_real, r)) and r[0] <= r[1]):
            shown = json.dumps(r) if isinstance(r, list) and len(r) <= 2 else a_type(r)
            raise ValueError(f"{path}: source[{field!r}] must be a [min, max] pair of numbers "
                             f"with min <= max, got {shown}; fix or delete it, or refit.")
