"""What a sweep takes from an earlier one instead of computing it again: the real fine-tunes
(``--reuse-real``) and the variants' predictions (``--reuse-predictions``).

Both are deterministic given the task, the configuration (η to 1e-5, steps) and the checkpoint
(the same data, head, batch orders and keys), so a rerun that changes only the primary
predictor, or adds a variant, need not redo the rest: at N = 750 one task's exact-kernel
variants (the ODE/SDE paths, the sketch, the Kronecker S) took 27 min of the full preset's
hours on 2 cores. A variant's prediction is reused only when every configuration of the
task's batch size has it, at the same η and steps and under the same label (the label names
the variant's definition, ``_predictions.variant_labels``); otherwise it is computed again.
"""

from __future__ import annotations

import numpy as np

from ntk_tt.sweep._errors import variants
from ntk_tt.sweep._grid import row_id
from ntk_tt.sweep._table import read_table


def reusable_runs(out) -> dict:
    """Real runs of an earlier sweep directory ``out``, by row id: (loss curve, diverged,
    compile seconds, learning rate, steps, error curve or None: tables before absolute
    targets stored none). Real fine-tunes are deterministic given the task,
    configuration and checkpoint (same data, head, batch order, η), so a rerun that changes
    only the predictors need not train again. Their cost is measured again on this machine
    (``_run._real_runs``): the earlier run's seconds may come from another machine or load."""
    frame = read_table(out)
    cols = ["real_loss", "real_diverged", "seconds_compile_finetune", "learning_rate",
            "steps"]
    errors = frame["real_error"] if "real_error" in frame else [None] * len(frame)
    return {r.row_id: (*(getattr(r, k) for k in cols), e)
            for r, e in zip(frame.itertuples(), errors, strict=True)}


def reusable_predictions(out) -> dict:
    """The variants' predictions of an earlier sweep directory ``out``, by row id: {variant
    name: (loss curve (T + 1,), diverged, spiked_at, seconds per row, label, learning rate,
    steps)} for each variant the row records (a NaN label or curve: not recorded)."""
    frame = read_table(out)
    found: dict = {}
    for name in variants(frame):
        cols = [f"var_{name}_{k}" for k in ("loss", "diverged", "spiked_at", "seconds",
                                            "label")]
        if not set(cols) <= set(frame.columns):
            continue
        for r in frame[["row_id", *cols, "learning_rate", "steps"]].itertuples(index=False):
            loss, label = r[1], r[5]
            if isinstance(label, str) and np.ndim(loss) == 1:
                found.setdefault(r[0], {})[name] = tuple(r[1:])
    return found


def reused_predictions(found: dict | None, task, cfgs, lrs, steps: int,
                       labels: dict[str, str]) -> dict:
    """The variants whose predictions every configuration of ``cfgs`` (one batch size of
    ``task``, η ``lrs``) has in ``found`` (:func:`reusable_predictions`) with the same η (to
    1e-5), steps and label (``labels``: name → the variant's label now): {name: (loss curves
    (G, T + 1), diverged (G,), spiked_at (G,), seconds of the group, 0.0 compile seconds,
    None)}, the tuple a computed group has (``_predictions._predict_group``; the error
    curves of a reused prediction are not stored)."""
    rows = [(found or {}).get(row_id(task, c), {}) for c in cfgs]
    out = {}
    for name, label in labels.items():
        got = [r.get(name) for r in rows]
        if not all(g is not None and g[4] == label and int(g[6]) == steps
                   and len(g[0]) == steps + 1 and abs(g[5] - float(lr)) <= 1e-5 * abs(lr)
                   for g, lr in zip(got, np.asarray(lrs, float), strict=True)):
            continue
        out[name] = (np.stack([np.asarray(g[0], np.float32) for g in got]),
                     np.array([bool(g[1]) for g in got]),
                     np.array([int(g[2]) for g in got]),
                     float(sum(g[3] for g in got)), 0.0, None)
    return out
