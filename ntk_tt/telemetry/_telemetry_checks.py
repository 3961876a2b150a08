"""The checks of a telemetry row (:meth:`ntk_tt.Telemetry.from_dict`,
:func:`ntk_tt.telemetry._telemetry.check_telemetry`): scalars of the right type and range,
arrays of agreeing lengths, and values a recorded run can hold. Schema: the module docstring
of ``ntk_tt.telemetry._telemetry``.

Which values a run can hold (all of them checked where recorded):

* the training loss and accuracy are finite (a run holds its last finite values from
  ``stopped_at`` on), the loss ≥ 0, the accuracy in [0, 1];
* ``stopped_at`` is −1 or an update 1 … k (step 0 is the initial parameters), and from it on
  the per-step fields equal their values at step ``stopped_at`` − 1 and the per-update
  (gradient) fields are NaN: the run made no more updates;
* norms, distances, the gradient SNR and the held-out loss are ≥ 0, the accuracies and
  fractions in [0, 1];
* a norm, distance, gradient statistic or snapshot is non-finite only once the run has blown
  up: its training loss rose above its step-0 value at or before that point (a float32 norm
  or the softmax then overflows, as in the diverged runs of the corpus), or the run stopped
  and the value is at or after the parameters of the update that went non-finite
  (w_{stopped_at − 1}: a per-step value at step ``stopped_at`` − 1, the gradient of update
  ``stopped_at``, and everything later). NaN is also what a value that was not measured
  holds: ``grad_snr`` anywhere (fewer than 2 samples, or no spread), and at every entry
  ``head_norm`` (no head), ``dead_relu_fraction`` (no ``TelemetrySpec.features``),
  ``test_loss`` and ``test_accuracy`` (no held-out split).
"""

from __future__ import annotations

import math

import numpy as np

from ntk_tt._options import DECAY_RANGE, FLOAT32_MAX, FLOAT32_TINY, is_decay

_SCALARS = ("learning_rate", "momentum", "nesterov", "batch_size", "steps", "num_train",
            "num_classes", "loss_name", "snr_samples", "stopped_at")
_PER_STEP = ("loss", "accuracy", "weight_distance", "weight_norm", "head_norm")
_PER_UPDATE = ("grad_norm", "grad_snr")
_SNAPSHOT = ("max_prob_mean", "saturated_fraction", "dead_relu_fraction", "test_loss",
             "test_accuracy")

# field: (upper bound, NaN allowed: "never" before a blow-up, "all" (not measured: every
# entry NaN) or "any" (documented NaN: fewer than 2 samples or no spread)); lower bound 0
_DIAGNOSTICS = {
    "weight_distance": (math.inf, "never"), "weight_norm": (math.inf, "never"),
    "head_norm": (math.inf, "all"), "grad_norm": (math.inf, "never"),
    "grad_snr": (math.inf, "any"), "max_prob_mean": (1.0, "never"),
    "saturated_fraction": (1.0, "never"), "dead_relu_fraction": (1.0, "all"),
    "test_loss": (math.inf, "all"), "test_accuracy": (1.0, "all"),
}
_ABSENT = {"head_norm": "a run without a head (NaN at every step)",
           "dead_relu_fraction": "a run without TelemetrySpec.features (NaN at every snapshot)",
           "test_loss": "a run without a held-out split (NaN at every snapshot)",
           "test_accuracy": "a run without a held-out split (NaN at every snapshot)"}


def _check_values(kw: dict) -> None:
    """ValueErrors for values a recorded run cannot hold (module docstring), in this order:
    the training loss and accuracy, ``stopped_at`` and what it implies, the other fields'
    ranges and non-finite entries, ``snapshot_steps`` not increasing."""
    # a run records float32 losses: beyond float32's largest the features (float32) overflow
    # to inf and the run read as diverged (a probe's falling 1e300 curve)
    for f, lo, hi in (("loss", 0.0, FLOAT32_MAX), ("accuracy", 0.0, 1.0)):
        v = np.asarray(kw[f], np.float64)
        bad = (v < lo) | (v > hi) | ~np.isfinite(v)
        if bad.any():
            i = int(np.argmax(bad))
            held = "" if np.isfinite(v[i]) else (" (a diverged run holds its last finite "
                                                 "value from stopped_at on)")
            rng = f"[{lo:g}, {hi:g}]" if math.isfinite(hi) else f"[{lo:g}, inf)"
            raise ValueError(f"telemetry field {f!r} must be finite and lie in {rng}, got "
                             f"{v[i]:g} at step {i}{held}.")
    if kw["weight_distance"][0] != 0:
        raise ValueError(f"telemetry field 'weight_distance' starts at "
                         f"{kw['weight_distance'][0]:g}, but at step 0 ||w_0 - w_0|| = 0; "
                         "give the distances from the initial parameters.")
    k = len(kw["loss"]) - 1
    stop = kw["stopped_at"]
    if stop > k:
        raise ValueError(f"telemetry field 'stopped_at' is {stop}, past the {k} "
                         "recorded updates; it is the first non-finite step, or -1.")
    _check_stop(kw, stop)
    _check_diagnostics(kw, stop)
    if np.any(np.diff(kw["snapshot_steps"]) <= 0):
        raise ValueError(f"telemetry field 'snapshot_steps' must increase, got "
                         f"{np.asarray(kw['snapshot_steps']).tolist()}.")


def _check_stop(kw: dict, stop: int) -> None:
    """A run that stopped at update ``stop`` holds its per-step values of step ``stop`` − 1
    from it on and has NaN gradient fields from update ``stop`` + 1 on."""
    fix = "set stopped_at to the first update whose loss or parameters were non-finite, or -1"
    if stop == 0:
        raise ValueError("telemetry field 'stopped_at' is 0, but step 0 holds the initial "
                         f"parameters and their finite loss; {fix}.")
    if stop < 0:
        return
    for f in _PER_STEP:
        v = np.asarray(kw[f], np.float64)
        same = (v[stop:] == v[stop - 1]) | (np.isnan(v[stop:]) & np.isnan(v[stop - 1]))
        if not same.all():
            j = stop + int(np.argmin(same))
            raise ValueError(f"telemetry field {f!r} changes after stopped_at = {stop} "
                             f"({v[j]:g} at step {j}, {v[stop - 1]:g} at step {stop - 1}), but a "
                             f"run holds its last finite values from stopped_at on; {fix}.")
    for f in _PER_UPDATE:
        v = np.asarray(kw[f], np.float64)
        if not np.isnan(v[stop:]).all():
            i = stop + int(np.argmin(np.isnan(v[stop:])))
            raise ValueError(f"telemetry field {f!r} is {v[i]:g} at update {i + 1}, after "
                             f"stopped_at = {stop}, but a stopped run makes no more updates "
                             f"(NaN from update stopped_at + 1 on); {fix}.")


def _check_diagnostics(kw: dict, stop: int) -> None:
    """Norms, gradient statistics and snapshots within their ranges, and non-finite only
    where the module docstring allows (after a blow-up, from ``stop`` on, or not measured)."""
    loss = np.asarray(kw["loss"], np.float64)
    # blown[t]: the loss rose above L_0 by step t, or w_t is at or past the parameters of the
    # update that went non-finite (w_{stopped_at - 1}, held from then on)
    blown = np.maximum.accumulate(loss) > loss[0]
    if stop >= 1:
        blown[stop - 1:] = True
    steps = np.asarray(kw["snapshot_steps"], np.int64)
    for f, (hi, nan) in _DIAGNOSTICS.items():
        v = np.asarray(kw[f], np.float64)
        if f in _PER_UPDATE:  # update i + 1 is evaluated at w_i
            at, ok, where = np.arange(1, len(v) + 1), blown[:-1], "update"
        elif f in _SNAPSHOT:
            at, ok, where = steps, blown[steps], "snapshot step"
        else:
            at, ok, where = np.arange(len(v)), blown, "step"
        out = (v < 0) | (v > hi)
        if out.any():
            i = int(np.argmax(out))
            raise ValueError(f"telemetry field {f!r} must lie in [0, {hi:g}], got {v[i]:g} at "
                             f"{where} {at[i]}.")
        free = np.isnan(v) & (nan == "any" or (nan == "all" and np.isnan(v).all()))
        bad = ~np.isfinite(v) & ~ok & ~free
        if bad.any():
            i = int(np.argmax(bad))
            absent = f" or to {_ABSENT[f]}" if f in _ABSENT else ""
            raise ValueError(
                f"telemetry field {f!r} is {v[i]:g} at {where} {at[i]}, but the run had not "
                "blown up by then: a non-finite value belongs to a run whose training loss "
                "rose above its step-0 value, or from step stopped_at - 1 on (the parameters "
                f"of the update that went non-finite){absent}; give the measured value.")


def _check_scalars(kw: dict) -> None:
    """ValueErrors for hyperparameters of the wrong type or range (:meth:`Telemetry.from_dict`)."""
    for k in ("steps", "batch_size", "num_train", "num_classes", "snr_samples"):
        v, least = kw[k], 2 if k == "num_classes" else 1
        if isinstance(v, bool) or not isinstance(v, int) or v < least:
            why = " (a classifier has at least two classes)" if least == 2 else ""
            raise ValueError(f"telemetry field {k!r} must be an int >= {least}{why}, got "
                             f"{v!r}.")
    if isinstance(kw["stopped_at"], bool) or not isinstance(kw["stopped_at"], int) \
            or kw["stopped_at"] < -1:
        raise ValueError(f"telemetry field 'stopped_at' must be an int >= -1, got "
                         f"{kw['stopped_at']!r}.")
    # the run's float32 values (a probe's learning rate 1e300 was read as a real run's)
    for k, ok, rng in (("learning_rate", lambda v: FLOAT32_TINY <= v <= FLOAT32_MAX,
                        f"> 0, in [{FLOAT32_TINY:.8g}, {FLOAT32_MAX:.8g}] (float32's normal "
                        "range)"), ("momentum", is_decay, f"in {DECAY_RANGE}")):
        v = kw[k]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                or not ok(v):
            raise ValueError(f"telemetry field {k!r} must be a finite number {rng}, got {v!r}.")
    if not isinstance(kw["nesterov"], bool):
        raise ValueError(f"telemetry field 'nesterov' must be true or false, got "
                         f"{kw['nesterov']!r}.")
    if kw["loss_name"] not in ("cross_entropy", "mse"):
        raise ValueError(f"telemetry field 'loss_name' must be 'cross_entropy' or 'mse', got "
                         f"{kw['loss_name']!r}.")
    if kw["batch_size"] > kw["num_train"]:
        raise ValueError(f"telemetry batch_size {kw['batch_size']} exceeds num_train "
                         f"{kw['num_train']}.")
    if kw["nesterov"] and kw["momentum"] == 0:
        raise ValueError("telemetry field 'nesterov' is true with momentum 0, which no run "
                         "records (Nesterov needs m > 0); give the run's momentum or set "
                         "nesterov to false.")
    b, s = kw["batch_size"], kw["snr_samples"]
    if not min(b, 2) <= s <= b:
        raise ValueError(f"telemetry field 'snr_samples' is {s}, but a run of batch_size {b} "
                         f"records min(B, TelemetrySpec.snr_samples) per-sample gradients, "
                         f"{min(b, 2)} to {b}; give the number the run used.")


def _check_lengths(kw: dict) -> None:
    """ValueErrors for arrays whose lengths disagree (:meth:`Telemetry.from_dict`)."""
    k = len(kw["loss"]) - 1
    if not 0 <= k <= kw["steps"]:
        raise ValueError(f"telemetry 'loss' must have 1 to steps + 1 = {kw['steps'] + 1} "
                         f"entries (after 0 … k updates), got {k + 1}.")
    for f in _PER_STEP:
        if len(kw[f]) != k + 1:
            raise ValueError(f"telemetry field {f!r} has {len(kw[f])} entries, 'loss' "
                             f"{k + 1}: per-step fields must have equal lengths.")
    for f in _PER_UPDATE:
        if len(kw[f]) != k:
            raise ValueError(f"telemetry field {f!r} has {len(kw[f])} entries; a run of {k} "
                             "recorded updates has one per update.")
    n = len(kw["snapshot_steps"])
    for f in _SNAPSHOT:
        if len(kw[f]) != n:
            raise ValueError(f"telemetry field {f!r} has {len(kw[f])} entries, "
                             f"'snapshot_steps' {n}: snapshot fields must have equal lengths.")
    if n and (kw["snapshot_steps"].min() < 0 or kw["snapshot_steps"].max() > k):
        raise ValueError(f"telemetry snapshot_steps must lie in [0, {k}] (the recorded "
                         f"updates), got {kw['snapshot_steps'].tolist()}.")
