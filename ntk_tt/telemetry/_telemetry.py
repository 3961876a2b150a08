"""Early-training telemetry of a real fine-tune (issue 11, METHOD.md §9).

Recorded by ``ntk_tt.finetune(..., telemetry=True | TelemetrySpec(...))``, off by default (no
extra work at all when off). Opt-in recording never changes the run: every statistic is
computed by separate functions on the run's parameters, so the loss curve, the batches and
the final parameters are bit-identical with and without it. This module holds the
schema, its checks and JSON form; the recording is ``ntk_tt.telemetry._recorder``.

Schema (:data:`SCHEMA_VERSION` 1): one :class:`Telemetry` row per run, arrays per step.
T = ``steps`` (the planned horizon), K = the number of snapshot steps; "after t updates" means
at the parameters w_t, t = 0 … T (w_0 = the initial ones). Norms are Euclidean over all
parameters flattened (Frobenius for a matrix). NaN marks a value that does not exist.

Hyperparameters (scalars): ``learning_rate`` η (float), ``momentum`` m (float),
``nesterov`` (bool), ``batch_size`` B (int), ``steps`` T (int), ``num_train`` N (int),
``num_classes`` C (int), ``loss`` ("cross_entropy" | "mse"), ``snr_samples`` s (int: the
per-sample gradients behind ``grad_snr``, min(B, spec.snr_samples)), ``stopped_at`` (int: the
first step whose loss or parameters were non-finite, ≥ 1, −1 for none; from it on the per-step
fields hold their last finite values, as the run's curves, and the gradient fields are NaN).
Norms and the held-out metrics are finite until the run blows up (loss above L_0, or the
update that went non-finite); which values are refused: ``ntk_tt.telemetry._telemetry_checks``.

Per step, (T+1,), index t = after t updates:
  ``loss``: full-training-set mean loss (the run's curve, nats for cross-entropy).
  ``accuracy``: full-training-set accuracy, in [0, 1].
  ``weight_distance``: ‖w_t − w_0‖. ``weight_norm``: ‖w_t‖.
  ``head_norm``: ‖W_head‖ of ``params["head"]["kernel"]`` (an ``nnx.Linear`` head, e.g.
  from :func:`ntk_tt.replace_head`), NaN for every step when the parameters have none.

Per update, (T,), index t − 1 = update t, evaluated at w_{t−1} on update t's minibatch I_t:
  ``grad_norm``: ‖g_t‖, g_t = ∇_w mean_{i∈I_t} ℓ_i (the gradient optax receives).
  ``grad_snr``: gradient signal-to-noise ratio ‖ḡ‖² / mean_i ‖g_i − ḡ‖² (dimensionless) of
  the per-sample gradients g_i = ∇_w ℓ_i of ALL parameters (``jax.vmap(jax.grad)``) on the
  first s samples of I_t (I_t is a random draw, so they are a random subset; s = B when
  B ≤ ``snr_samples``, and then ḡ = g_t), ḡ = mean_i g_i. NaN when s < 2 (B = 1) or when
  the s gradients coincide (zero spread).

Snapshots, (K,), at ``snapshot_steps`` (int, ascending; default {0, 1, 2, 5, 10, 20, 50, T}
∩ [0, T]):
  ``max_prob_mean``: softmax saturation, mean over the N training samples of max_c
  softmax(f(x_i; w_t))_c, in [1/C, 1] (softmax of the logits, for MSE too).
  ``saturated_fraction``: fraction of training samples whose max probability exceeds
  ``spec.saturation`` (default 0.99).
  ``dead_relu_fraction``: fraction of exact zeros in the backbone features h(x_i; w_t)
  (N, F) of the training set (inactive ReLU units), NaN without ``spec.features``.
  ``test_loss``, ``test_accuracy``: mean loss and accuracy on the held-out split, NaN
  without ``x_test``.

JSON form (:meth:`Telemetry.to_dict`): lists and scalars; NaN → ``None``, ±∞ → ``"inf"`` /
``"-inf"``, so the text is standard JSON. :func:`save_telemetry` writes JSON Lines (one row a
line); :func:`truncate` keeps the first k updates only (the input of outcome prediction).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ntk_tt._options import a_type, file_path
from ntk_tt._output_paths import require_folder
from ntk_tt.telemetry._telemetry_checks import (
    _PER_STEP,
    _PER_UPDATE,
    _SCALARS,
    _SNAPSHOT,
    _check_lengths,
    _check_scalars,
    _check_values,
)

SCHEMA_VERSION = 1
DEFAULT_SNAPSHOTS = (0, 1, 2, 5, 10, 20, 50)


@dataclasses.dataclass(frozen=True)
class TelemetrySpec:
    """What :func:`ntk_tt.finetune` records beyond the defaults (``telemetry=True``).

    features: ``features(params, x) -> h`` (N, F), the backbone features of the same
      ``params`` that ``apply_fn`` takes (e.g. :func:`ntk_tt.model_features`), for the
      dead-ReLU fraction; None: that field is NaN.
    snapshot_steps: steps of the snapshots (a list of ints, else ValueError), intersected
      with [0, T]; None: {0, 1, 2, 5, 10, 20, 50, T}.
    snr_samples: at most this many per-sample gradients (≥ 2) per update for ``grad_snr``;
      they are held at once (memory: snr_samples × the number of parameters).
    saturation: max-probability threshold of ``saturated_fraction``, in (0, 1).

    Source: the early-telemetry signals of arXiv 2608.03709 (METHOD.md §9), as ntk_tt records
    them (issue 11).
    """

    features: Callable[[Any, jax.Array], jax.Array] | None = None
    snapshot_steps: Sequence[int] | None = None
    snr_samples: int = 16
    saturation: float = 0.99

    def __post_init__(self):
        if isinstance(self.snr_samples, bool) or not isinstance(self.snr_samples, int) \
                or self.snr_samples < 2:
            raise ValueError(f"snr_samples must be an int >= 2, got {self.snr_samples!r}.")
        if not 0.0 < self.saturation < 1.0:
            raise ValueError(f"saturation must be in (0, 1), got {self.saturation!r}.")
        if self.features is not None and not callable(self.features):
            raise ValueError("features must be a callable features(params, x) -> (N, F).")
        steps = self.snapshot_steps
        if steps is not None and (isinstance(steps, (str, bytes)) or np.ndim(
                np.asarray(steps, dtype=object)) != 1 or not all(
                isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_))
                for t in steps)):
            # 1.5 was recorded as step 1, 'a' failed inside finetune without naming this
            raise ValueError(f"snapshot_steps must be a list of ints (optimiser steps; those "
                             f"outside [0, T] are dropped), got {steps!r}; e.g. (0, 1, 5, 10).")


@dataclasses.dataclass(frozen=True)
class Telemetry:
    """One run's telemetry; fields, shapes and units in the module docstring
    (:mod:`ntk_tt.telemetry._telemetry`). Arrays are numpy float64 (``snapshot_steps`` int64).

    Source: the early-telemetry signals of arXiv 2608.03709 (METHOD.md §9), as ntk_tt records
    them (issue 11).
    """

    learning_rate: float
    momentum: float
    nesterov: bool
    batch_size: int
    steps: int
    num_train: int
    num_classes: int
    loss_name: str
    snr_samples: int
    stopped_at: int
    loss: np.ndarray
    accuracy: np.ndarray
    weight_distance: np.ndarray
    weight_norm: np.ndarray
    head_norm: np.ndarray
    grad_norm: np.ndarray
    grad_snr: np.ndarray
    snapshot_steps: np.ndarray
    max_prob_mean: np.ndarray
    saturated_fraction: np.ndarray
    dead_relu_fraction: np.ndarray
    test_loss: np.ndarray
    test_accuracy: np.ndarray

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: ``schema_version`` plus every field; arrays as lists, NaN →
        None, ±∞ → "inf" / "-inf"."""
        out: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = ([_encode(a) for a in v.tolist()] if isinstance(v, np.ndarray)
                           else v)
        return out

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Telemetry:
        """Inverse of :meth:`to_dict`.

        Raises:
          ValueError: not a dict, no or another ``schema_version``, missing / unknown fields, a
            scalar of the wrong type or range (``steps``, ``batch_size``, ``num_train`` ≥ 1
            and ``num_classes`` ≥ 2 ints, η > 0 and m ∈ [0, 1) numbers, ``loss_name`` known,
            ``nesterov`` with m = 0, ``snr_samples`` outside [min(B, 2), B]), a
            ``weight_distance`` not 0 at step 0,
            or arrays that are not lists of numbers or whose lengths disagree (per-step k + 1,
            per-update k, 0 ≤ k ≤ ``steps``; snapshots of one length, at steps ≤ k), a
            training loss or accuracy not finite, a loss < 0 or an accuracy outside [0, 1],
            ``stopped_at`` 0 or > k, per-step values that change from ``stopped_at`` on or
            gradient values after it, a negative norm, distance, SNR or held-out loss, a
            fraction or held-out accuracy outside [0, 1], a non-finite norm, gradient
            statistic or snapshot before the run blew up (unless not measured: NaN),
            ``snapshot_steps`` not increasing (the rules: ``ntk_tt.telemetry._telemetry_checks``).
        """
        if not isinstance(row, dict):
            raise ValueError(f"a telemetry row must be a JSON object (dict), got "
                             f"{type(row).__name__}.")
        if "schema_version" not in row:  # e.g. an ntk-tt predict --json report
            raise ValueError(f"not a telemetry row (no schema_version; keys {sorted(row)[:5]}):"
                             " give a file that ntk_tt.save_telemetry wrote.")
        if (version := row["schema_version"]) != SCHEMA_VERSION:
            raise ValueError(f"telemetry schema_version {version!r} is not the supported "
                             f"{SCHEMA_VERSION}; re-record the run with this ntk_tt.")
        names = {f.name for f in dataclasses.fields(cls)}
        got = set(row) - {"schema_version"}
        if got != names:
            raise ValueError(f"telemetry row fields differ from the schema: missing "
                             f"{sorted(names - got)}, unknown {sorted(got - names)}.")
        kw = {k: row[k] for k in _SCALARS}
        _check_scalars(kw)
        for k in _PER_STEP + _PER_UPDATE + _SNAPSHOT + ("snapshot_steps",):
            v = row[k]
            if not isinstance(v, list) or any(
                    isinstance(a, bool) or not (a is None or isinstance(a, int | float)
                                                or a in ("inf", "-inf")) for a in v):
                raise ValueError(f"telemetry field {k!r} must be a list of numbers (null for "
                                 "NaN, \"inf\" / \"-inf\"), got "
                                 f"{type(v).__name__} with other entries.")
            kw[k] = np.asarray([_decode(a) for a in v], np.float64)
        steps = kw["snapshot_steps"]
        if not np.all(np.isfinite(steps) & (steps == np.round(steps))):
            raise ValueError("telemetry field 'snapshot_steps' must hold whole step numbers.")
        kw["snapshot_steps"] = steps.astype(np.int64)
        _check_lengths(kw)
        _check_values(kw)
        return cls(**kw)


def check_telemetry(telemetry: Telemetry) -> None:
    """The checks of :meth:`Telemetry.from_dict` (scalars, lengths, values) on a Telemetry
    built another way (the constructor, ``dataclasses.replace``).

    Raises:
      ValueError: naming the field, for what :meth:`Telemetry.from_dict` refuses.
    """
    kw = {f.name: getattr(telemetry, f.name) for f in dataclasses.fields(telemetry)}
    kw = {k: v.item() if isinstance(v, np.generic) else v for k, v in kw.items()}
    for k in _PER_STEP + _PER_UPDATE + _SNAPSHOT + ("snapshot_steps",):
        dtype = np.asarray(kw[k]).dtype  # strings of numbers were read as numbers
        if dtype.kind not in "fiu" or (k == "snapshot_steps" and dtype.kind == "f"
                                       and np.size(kw[k])):
            raise ValueError(f"telemetry field {k!r} must be an array of "
                             + ("whole step numbers" if k == "snapshot_steps" else "numbers")
                             + f", got dtype {dtype}, as a Telemetry row refuses it.")
    _check_scalars(kw)
    _check_lengths(kw)
    _check_values(kw)


def _encode(a: float) -> float | str | None:
    if math.isnan(a):
        return None
    if math.isinf(a):
        return "inf" if a > 0 else "-inf"
    return a


def _decode(a: float | str | None) -> float:
    return math.nan if a is None else float(a)


def save_telemetry(path: str | Path, runs: Telemetry | Sequence[Telemetry], *,
                   overwrite: bool = False) -> None:
    """Write one or several runs to ``path`` as JSON Lines (one :meth:`Telemetry.to_dict`
    row a line, in the order of ``runs``, standard JSON: no NaN literals).

    Source: none (a utility: the JSON Lines form of :class:`Telemetry`).

    Args:
      path: the ``.jsonl`` file to write (str or os.PathLike, ``~`` expanded).
      runs: a :class:`Telemetry` (``ntk_tt.finetune(..., telemetry=True).telemetry``) or a
        sequence (any iterable) of them.
      overwrite: True replaces an existing file; False (default) refuses it (as
        ``save_checkpoint`` and the CLI's ``--overwrite``).

    Returns:
      None (the file is the output; :func:`load_telemetry` reads it back).

    Raises:
      ValueError: ``path`` is not a str or os.PathLike (e.g. a number, or the arguments
        swapped; its type named); ``runs`` is not a Telemetry or a sequence of them (the first
        other item's index and type named) or an empty sequence; a run that
        :func:`load_telemetry` would refuse (:func:`check_telemetry`, e.g. a NaN loss; its
        index named); ``path``'s folder does not
        exist; ``path`` exists and ``overwrite`` is not True. Nothing is written then.
    """
    path = file_path(path, "telemetry", "save_telemetry('runs.jsonl', [run.telemetry]); nothing "
                     "was written")
    many = isinstance(runs, Iterable) and not isinstance(runs, (Telemetry, str, bytes, dict))
    runs = list(runs) if many else [runs]
    for i, r in enumerate(runs):
        if not isinstance(r, Telemetry):
            where = f"item {i} of runs" if many else "runs"
            raise ValueError(f"save_telemetry writes Telemetry records (the .telemetry of "
                             f"ntk_tt.finetune(..., telemetry=True)), one or a list of them; "
                             f"{where} is {a_type(r)}. Nothing was written.")
    if not runs:  # an empty file would only be refused later, by ntk-tt outcome
        raise ValueError("save_telemetry got no runs (an empty sequence); nothing was written.")
    for i, r in enumerate(runs):  # what load_telemetry would refuse (a NaN loss was written)
        try:
            check_telemetry(r)
        except ValueError as err:
            raise ValueError(f"{f'item {i} of runs' if many else 'runs'}: {err} Nothing was "
                             "written.") from None
    require_folder(path, "telemetry")
    if path.exists() and overwrite is not True:
        raise ValueError(f"telemetry path {path} exists; pass overwrite=True to replace it, or "
                         "give a new file name. Nothing was written.")
    with open(path, "w", encoding="utf-8") as fh:
        for r in runs:
            fh.write(json.dumps(r.to_dict(), allow_nan=False) + "\n")


def json_line(path: str | Path, number: int, line: str) -> Any:
    """One JSON Lines row, decoded; a JSON error as a ValueError naming ``path`` and the line
    ``number`` (1-based), as :func:`load_telemetry` and ``ntk-tt outcome`` report it."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}, line {number}: not JSON ({err.msg}, column {err.colno}); a "
                         "telemetry file holds one JSON object a line, as save_telemetry "
                         "writes.") from None


def load_telemetry(path: str | Path) -> list[Telemetry]:
    """Read the runs written by :func:`save_telemetry`, in order (a list; [] for an empty file).

    Source: none (a utility: the reader of :func:`save_telemetry`'s files).

    Args:
      path: the JSON Lines file (str or os.PathLike, ``~`` expanded); blank lines skipped.

    Returns:
      list[Telemetry], one per non-blank line, each checked as :meth:`Telemetry.from_dict`
      does (arrays float64; shapes in the module docstring).

    Raises:
      ValueError: naming ``path`` and the line: a line that is not JSON, or a row of another
        schema version or with other fields (see :meth:`Telemetry.from_dict`); a file that is
        not UTF-8 text; ``path`` not a str or os.PathLike (``~`` is expanded), missing or not
        a file. OSError: unreadable path.
    """
    path = file_path(path, "telemetry", "load_telemetry('runs.jsonl')")
    if not path.is_file():
        raise ValueError(f"telemetry file {str(path)!r} does not exist (or is not a file); "
                         "pass the path of a JSON Lines file that ntk_tt.save_telemetry wrote.")
    out = []
    try:
        with open(path, encoding="utf-8") as fh:
            for i, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                row = json_line(path, i, line)
                try:
                    out.append(Telemetry.from_dict(row))
                except (ValueError, TypeError, KeyError) as err:
                    raise ValueError(f"{path}, line {i}: {err}") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a UTF-8 text JSON Lines file ({err.reason}); a "
                         "telemetry file is written by save_telemetry.") from None
    return out


def truncate(telemetry: Telemetry, k: int) -> Telemetry:
    """The telemetry as known after the first k updates, nothing later.

    Source: the prefix an early-telemetry predictor may read (arXiv 2608.03709; METHOD.md §9).

    Args:
      telemetry: one run's :class:`Telemetry`.
      k: the number of optimiser updates to keep (an int).

    Returns:
      A new :class:`Telemetry`: per-step fields t = 0 … k, (k + 1,); per-update fields
      updates 1 … k, (k,); snapshots those at steps ≤ k; ``stopped_at`` −1 unless the run
      stopped at a step ≤ k. Hyperparameters (``steps`` = the planned T included) are kept.

    Raises:
      ValueError: ``telemetry`` not a :class:`Telemetry` (a run's ``.telemetry``, or
        ``Telemetry.from_dict``); k not an int in [0, number of recorded updates].
    """
    if not isinstance(telemetry, Telemetry):
        raise ValueError(f"truncate takes a Telemetry (a run's .telemetry): {a_type(telemetry)}")
    observed = len(telemetry.loss) - 1
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 0 <= k <= observed:
        raise ValueError(f"k must be an int in [0, {observed}], got {k!r}.")
    keep = telemetry.snapshot_steps <= k
    kw = {f: getattr(telemetry, f)[:k + 1] for f in _PER_STEP}
    kw |= {f: getattr(telemetry, f)[:k] for f in _PER_UPDATE}
    kw |= {f: getattr(telemetry, f)[keep] for f in _SNAPSHOT + ("snapshot_steps",)}
    stopped = telemetry.stopped_at if 0 <= telemetry.stopped_at <= k else -1
    return dataclasses.replace(telemetry, stopped_at=stopped, **kw)


def snapshot_steps(spec: TelemetrySpec, steps: int) -> np.ndarray:
    """The snapshot steps (K,) of a T-step run: ``spec.snapshot_steps`` (default {0, 1, 2, 5,
    10, 20, 50, T}) ∩ [0, T], sorted, unique."""
    wanted = (DEFAULT_SNAPSHOTS + (steps,) if spec.snapshot_steps is None
              else tuple(int(s) for s in spec.snapshot_steps))
    return np.asarray(sorted({s for s in wanted if 0 <= s <= steps}), np.int64)
