"""The checks of a run's NTK prediction as the outcome predictor reads it (a corpus row's
``"prediction"``, ``experiments/telemetry_corpus.py``; :func:`outcome_features`): every field
of the right type, length and range, so that a damaged row is one clear error instead of an
IndexError deep in the features or a feature silently read as missing (a fresh user's find).

What a prediction written by ntk_tt holds (all 1,024 rows of the shipped corpus pass):

* ``loss`` and ``error``: the predicted training curves, T + 1 finite numbers each (T = the
  run's planned ``steps``; a predicted curve holds its last finite value after a
  divergence), the loss ≥ 0, the error in [0, 1];
* ``test_loss`` and ``test_error`` (optional, None without held-out data): T + 1 numbers or
  nulls each (NaN, inf or null where the held-out curve was not finite), ≥ 0, the error ≤ 1
  where finite;
* ``training_time`` (optional): 2 × 3 numbers or nulls (loss / error × ε ∈ {0.01, 0.1,
  0.4}; null where T_ε is undefined), ≥ 0 where finite;
* ``diverged`` and ``beyond_edge`` (optional): true / false; ``spiked_at`` (optional): an
  integer in [−1, T] or null; ``kappa`` (optional): a number ≥ 0 or null.

Other fields are kept and ignored, except one that looks like a misspelt optional field the
prediction lacks (``test_los``): refused, as its feature would silently read as missing.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ntk_tt._options import _is_int, a_type, is_real

_OPTIONAL = ("test_loss", "test_error", "training_time", "diverged", "beyond_edge", "spiked_at",
             "kappa")
# with what the corpus rows also hold (ignored by the features)
_FIELDS = frozenset(("loss", "error", *_OPTIONAL, "method", "seconds_kernel", "seconds_solve",
                     "num_paths"))
_FIX = ("write the row again from the run's prediction (experiments/telemetry_corpus.py), or "
        "pass prediction=None for the telemetry-only features")


def _entries(v: Any) -> list:
    """A 1-D curve's entries as a list: a JSON list as it is; a numpy or jax array (the Python
    API) as Python floats when numeric, else as its objects (refused below)."""
    if isinstance(v, (list, tuple)):
        return list(v)
    arr = np.asarray(v)
    return arr.astype(float).tolist() if arr.dtype.kind in "iuf" else list(arr.astype(object))


def _curve(prediction: Mapping, name: str, steps: int, top: float, finite: bool) -> None:
    """``prediction[name]``: a list (or 1-D array) of ``steps`` + 1 numbers in [0, ``top``]
    (nulls and non-finite values allowed unless ``finite``)."""
    v = prediction[name]
    what = f"prediction '{name}' must be a list of steps + 1 = {steps + 1} numbers"
    if not isinstance(v, (list, tuple)) and not hasattr(v, "__array__"):  # a str, set, ...
        raise ValueError(f"{what}, got {a_type(v)}; {_FIX}.")
    if not isinstance(v, (list, tuple)) and np.ndim(v) != 1:
        raise ValueError(f"{what}, got an array of shape {np.shape(v)}; {_FIX}.")
    entries = _entries(v)
    if len(entries) != steps + 1:
        raise ValueError(f"{what}, got {len(v)} entries{'' if len(v) else ' (empty)'} "
                         f"(one per step 0 … T of the run's T = {steps} planned steps); "
                         f"{_FIX}.")
    for i, a in enumerate(entries):
        if a is None or is_real(a) and math.isnan(a):
            ok = not finite
        elif not is_real(a):
            raise ValueError(f"prediction '{name}' at step {i} must be a number"
                             f"{'' if finite else ' or null'}, got {a_type(a)}; {_FIX}.")
        elif math.isinf(a):  # +inf only where there is no upper bound (a held-out loss)
            ok = not finite and a > 0 and top == math.inf
        else:
            ok = 0 <= a <= top
        if not ok:
            rng = "in [0, 1]" if top == 1 else ">= 0"
            kind = "finite and " if finite else ""
            raise ValueError(f"prediction '{name}' at step {i} must be {kind}{rng}, got {a!r}; "
                             f"{_FIX}.")


def check_prediction(prediction: Any, steps: int) -> None:
    """ValueError naming the field, unless ``prediction`` is a run's NTK prediction as ntk_tt
    writes it for a run of ``steps`` planned updates (the module docstring)."""
    if not isinstance(prediction, Mapping):
        raise ValueError(f"prediction must be a JSON object / dict (a corpus row's "
                         f"'prediction'), got {a_type(prediction)}; {_FIX}.")
    for name in ("loss", "error"):
        if name not in prediction:
            raise ValueError(f"prediction must hold the predicted '{name}' curve (a corpus "
                             f"row's 'prediction'); {_FIX}.")
    for key in prediction:  # a misspelt optional field was ignored, the feature read missing
        near = difflib.get_close_matches(str(key), [f for f in _OPTIONAL if f not in prediction],
                                         n=1, cutoff=0.8)
        if key not in _FIELDS and near:
            raise ValueError(f"prediction has {key!r}, which ntk_tt does not write: did you "
                             f"mean {near[0]!r}? (misspelt, it would be ignored); {_FIX}.")
    _curve(prediction, "loss", steps, math.inf, finite=True)
    _curve(prediction, "error", steps, 1.0, finite=True)
    for name, top in (("test_loss", math.inf), ("test_error", 1.0)):
        if prediction.get(name) is not None:
            _curve(prediction, name, steps, top, finite=False)
    tt = prediction.get("training_time")
    if tt is not None:
        arr = np.asarray(tt, dtype=object)
        if arr.shape != (2, 3) or not all(a is None or is_real(a) and not a < 0
                                          for a in arr.ravel()):
            raise ValueError("prediction 'training_time' must be 2 × 3 numbers >= 0 or nulls "
                             f"(loss / error × ε = 0.01, 0.1, 0.4), got {tt!r:.80}; {_FIX}.")
    for name in ("diverged", "beyond_edge"):
        if name in prediction and not isinstance(prediction[name], (bool, np.bool_)):
            raise ValueError(f"prediction '{name}' must be true or false, got "
                             f"{prediction[name]!r:.40}; {_FIX}.")
    spike = prediction.get("spiked_at")
    if spike is not None and not (_is_int(spike) and -1 <= spike <= steps):
        raise ValueError(f"prediction 'spiked_at' must be an integer step in [-1, T = {steps}] "
                         f"(-1: none) or null, got {spike!r:.40}; {_FIX}.")
    kappa = prediction.get("kappa")
    if hasattr(kappa, "__array__") and np.ndim(kappa) == 0:  # a 0-d numpy or jax array
        kappa = np.asarray(kappa).item()
    if kappa is not None and not (is_real(kappa) and 0 <= kappa < math.inf):
        raise ValueError(f"prediction 'kappa' must be a finite number >= 0 (κ = η·λ_max/N) or "
                         f"null, got {kappa!r:.40}; {_FIX}.")
