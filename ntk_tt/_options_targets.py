"""Absolute targets (steps to a loss ≤ L* or an error ≤ e*), checked without JAX: the
``targets=`` argument of :func:`ntk_tt.predict` and the ``--loss-target``, ``--error-target``
and ``--accuracy-target`` options of ``ntk-tt predict`` (:func:`ntk_tt.predict_task`'s
``loss_targets``, ``error_targets``, ``accuracy_targets``), before any data or weights are read.
The steps themselves: ``ntk_tt.dynamics._targets``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ntk_tt._options import FLOAT32_MAX

# the curves a target can be set on, named as the Prediction's attributes: mean losses (a
# target L* > 0) and error rates (a target e* in [0, 1]); test_*: the held-out set
TARGET_CURVES = ("loss", "error", "test_loss", "test_error")


def _number(value: Any) -> float | None:
    """``value`` as a float when it is one real number (not a bool or a string), else None."""
    if isinstance(value, (bool, np.bool_, str, bytes)) or np.ndim(value) != 0:
        return None
    if getattr(value, "dtype", np.dtype(float)).kind not in "iuf":
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def check_targets(targets: Any) -> dict[str, tuple[float, ...]]:
    """``targets`` of :func:`ntk_tt.predict` as {curve: (target, ...)}, in the order given,
    each target once ({} for None).

    ``targets`` maps a curve of :data:`TARGET_CURVES` to one number or a sequence of numbers:
    "loss" / "test_loss" a mean loss L* (finite, > 0), "error" / "test_error" an error rate
    e* in [0, 1] (held-out accuracy ≥ A is "test_error" ≤ 1 − A).

    Raises:
      ValueError: not a mapping, an unknown curve (the known ones named), a target that is not
        a real number (a string, a bool, a nested list), not finite, a loss target ≤ 0, an
        error target outside [0, 1], or an empty list of targets for a curve.
    """
    if targets is None:
        return {}
    if not isinstance(targets, Mapping):
        raise ValueError(f"targets must be a dict {{curve: target or list of targets}} with "
                         f"curves among {TARGET_CURVES}, got {type(targets).__name__}; e.g. "
                         "targets={'loss': 0.5, 'test_error': [0.2, 0.1]}.")
    out = {}
    for curve, values in targets.items():
        if curve not in TARGET_CURVES:
            raise ValueError(f"targets has an unknown curve {curve!r}; the curves are "
                             f"{TARGET_CURVES} (held-out accuracy >= A is 'test_error' <= "
                             "1 - A).")
        many = (isinstance(values, Sequence) and not isinstance(values, (str, bytes))) or (
            isinstance(values, np.ndarray) and values.ndim == 1)
        kept: list[float] = []
        for value in (values if many else (values,)):
            v = _number(value)
            if v is None or not math.isfinite(v):
                raise ValueError(f"targets[{curve!r}] must be finite real numbers, got "
                                 f"{value!r}; e.g. targets={{{curve!r}: 0.5}}.")
            if curve.endswith("loss") and not v > 0:
                raise ValueError(f"targets[{curve!r}] is a mean loss L*: it must be > 0, got "
                                 f"{v!r}.")
            if curve.endswith("error") and not 0.0 <= v <= 1.0:
                raise ValueError(f"targets[{curve!r}] is an error rate e*: it must be in "
                                 f"[0, 1], got {v!r} (an accuracy A is the error 1 - A).")
            if v not in kept:
                kept.append(v)
        if not kept:
            raise ValueError(f"targets[{curve!r}] is empty: give at least one target, e.g. "
                             f"targets={{{curve!r}: 0.5}}, or leave the curve out.")
        out[curve] = tuple(kept)
    return out


# ``ntk-tt predict`` / predict_task: the job option, its flag, the curve it sets and how a
# value of the option becomes a target on that curve
JOB_TARGETS = (("loss_targets", "--loss-target", "loss"),
               ("error_targets", "--error-target", "error"),
               ("accuracy_targets", "--accuracy-target", "test_error"))


def _as_error(accuracy: float) -> float:
    """Held-out accuracy ≥ A as the error target 1 − A (rounded: 1 − 0.9 is 0.1, not
    0.09999999999999998)."""
    return round(1.0 - accuracy, 12)


def check_job_targets(o: dict[str, Any]) -> None:
    """The target options of :func:`ntk_tt.predict_task` (each a sequence of numbers, empty
    for none): loss targets L* > 0 (``--loss-target``), training-error targets e* in [0, 1]
    (``--error-target``) and held-out accuracy targets A in (0, 1] (``--accuracy-target``,
    the held-out error ≤ 1 − A; needs held-out images, ``--test-per-class`` ≥ 1, and no
    ``--subset``, which predicts the loss curve only; so do error targets).

    Raises:
      ValueError: one line naming the option, its flag, the value and the fix.
    """
    for name, flag, _ in JOB_TARGETS:
        values = o[name]
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise ValueError(f"{name} ({flag}) must be a list of numbers, got {values!r}.")
        for v in values:
            x = _number(v)
            ok = x is not None and math.isfinite(x) and (
                0 < x <= FLOAT32_MAX if name == "loss_targets" else
                0.0 <= x <= 1.0 if name == "error_targets" else 0.0 < x <= 1.0)
            if not ok:
                what = {"loss_targets": f"a mean training loss L* > 0 (at most "
                                        f"{FLOAT32_MAX:.8g}, float32's largest)",
                        "error_targets": "a training error rate in [0, 1], e.g. 0.1",
                        "accuracy_targets": "a held-out accuracy in (0, 1], e.g. 0.9"}[name]
                raise ValueError(f"{name} ({flag}) entries must each be {what}, got {v!r}.")
    if o["subset"] is not None and (o["error_targets"] or o["accuracy_targets"]):
        raise ValueError("--error-target and --accuracy-target need the error curves, which "
                         "--subset does not predict (the loss curve only): use --loss-target, "
                         "or drop --subset.")
    if o["accuracy_targets"] and o["test_per_class"] == 0:
        raise ValueError("accuracy_targets (--accuracy-target) are held-out accuracies: they "
                         "need held-out images, --test-per-class >= 1 (got 0).")


def job_targets(o: dict[str, Any]) -> dict[str, tuple[float, ...]]:
    """The checked target options of the job as :func:`ntk_tt.predict`'s ``targets``:
    {"loss": L*s, "error": e*s, "test_error": 1 − A for each accuracy A}."""
    out: dict[str, list[float]] = {}
    for name, _, curve in JOB_TARGETS:
        for v in o[name]:
            out.setdefault(curve, []).append(
                _as_error(float(v)) if name == "accuracy_targets" else float(v))
    return check_targets(out)
