"""Outcomes of a sweep's rows (issue 26): the real run's own outcome and every predictor's
call on it (``ntk_tt.dynamics._divergence``: "converges", "catapult", "diverges"; a call may
also be "unknown"), the row columns and the summary block.

Columns (per row): ``real_outcome`` / ``real_spike_step`` and, per predictor,
``pred_outcome`` / ``pred_spike_step`` and ``var_<name>_outcome`` / ``var_<name>_spike_step``
(the first step above L_0, −1 for none). A predictor's call uses the row's κ = η·λ_max(Θ)/N
(Θ the exact empirical NTK: the κ̃ of the grid), its stored mean curve and divergence and
spike flags; it abstains ("unknown") beyond the cross-entropy edge 4(1 + m) for the
frozen-kernel predictors, discrete or ODE/SDE (``_divergence.cannot_diverge``). Tables written
before these columns get them from the stored curves (:func:`with_outcomes`).
"""

from __future__ import annotations

import jax
import numpy as np
import pandas as pd

from ntk_tt.dynamics._divergence import (
    DIVERGES,
    KAPPA_MAX,
    OUTCOMES,
    beyond_edge,
    call,
    cannot_diverge,
    outcome,
)
from ntk_tt.sweep._errors import variants

REAL = OUTCOMES[:3]
_own = jax.jit(outcome)  # one compilation per table shape instead of one per operation


@jax.jit
def _called(loss, diverged, spiked_at, kappa, abstains, catapult):
    return call(outcome(loss, diverged, spiked_at), kappa, abstains, catapult)


FEATURE_SUBSPACE = ("diagonal feature kernel", "subspace feature kernel")
"""What a variant's label says when it is a feature-subspace kernel, whose own "diverges"
below κ = 68 is called "catapult" (``_divergence.call``'s ``linearised_catapult``); the
primary's ``pred_kernel`` is then one of ``SUBSPACE_KERNELS``."""
SUBSPACE_KERNELS = ("subspace", "diagonal")


def outcome_columns(prefix: str, loss, diverged, spiked_at, *, kappa=None, momentum=0.0,
                    frozen=False, feature_subspace=False) -> dict:
    """``{prefix}_outcome`` (names of ``OUTCOMES``) and ``{prefix}_spike_step`` (ints, −1 for
    none), lists of R, of R rows' held loss curves (R, T + 1) with their ``diverged`` /
    ``spiked_at`` flags (R,): the real runs' own outcomes (``kappa`` None) or a predictor's
    calls at the rows' κ and momenta (R,). Cross-entropy: a ``frozen`` predictor (not
    head-aware; bool, broadcast), discrete or ODE/SDE, cannot blow up beyond the edge
    (``_divergence.cannot_diverge``), so its call abstains there. A ``feature_subspace``
    predictor's (bool, broadcast) own "diverges" below κ = 68 is "catapult"."""
    args = (np.asarray(loss, np.float32), np.asarray(diverged, bool),
            np.asarray(spiked_at, np.int32))
    if kappa is None:
        said = _own(*args)
    else:
        kappa, momentum = np.asarray(kappa, np.float64), np.asarray(momentum, np.float64)
        beyond = beyond_edge(kappa, momentum, False, "cross_entropy")
        blind = np.asarray(frozen, bool) & cannot_diverge(True, "cross_entropy", False)
        said = _called(*args, kappa.astype(np.float32), np.broadcast_to(beyond & blind,
                                                                         kappa.shape),
                       np.broadcast_to(np.asarray(feature_subspace, bool), kappa.shape))
    return {f"{prefix}_outcome": [OUTCOMES[int(c)] for c in np.asarray(said.outcome)],
            f"{prefix}_spike_step": [int(c) for c in np.asarray(said.spike_step)]}


def _prefix(predictor: str) -> str:
    return "pred" if predictor == "ntk" else f"var_{predictor}"


def _describes(frame: pd.DataFrame, predictor: str) -> pd.Series:
    """What a predictor is, as the table says it: the primary's method and kernel, a
    variant's label."""
    if predictor == "ntk":
        return frame["pred_method"].astype(str) + " " + frame["pred_kernel"].astype(str)
    return frame.get(f"var_{predictor}_label", pd.Series("", index=frame.index)).astype(str)


def with_outcomes(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with the outcome columns of the real runs and of every predictor whose curve
    is stored, derived for the rows that lack them (rows written before issue 26, alone or
    in a table resumed since); a predictor is head-aware when its description
    (``ntk_tt.sweep._predictions``) says so."""
    out = frame.copy()
    for p in ["real", "ntk", *variants(out)]:
        pre = "real" if p == "real" else _prefix(p)
        if not len(out) or f"{pre}_loss" not in out:
            continue
        have = out[f"{pre}_loss"].map(lambda c: c is not None and np.ndim(c) == 1)
        missing = have & (out[f"{pre}_outcome"].isna() if f"{pre}_outcome" in out else True)
        if not missing.any():
            continue
        rows = out[missing]
        said = _describes(rows, p).str.lower()
        extra = {} if p == "real" else dict(
            kappa=rows["kappa"], momentum=rows["momentum"],
            frozen=~said.str.contains("head_aware|head-aware").to_numpy(),
            feature_subspace=(rows["pred_kernel"].isin(SUBSPACE_KERNELS) if p == "ntk" else
                              said.str.contains("|".join(FEATURE_SUBSPACE))).to_numpy())
        cols = outcome_columns(pre, np.stack(rows[f"{pre}_loss"]), rows[f"{pre}_diverged"],
                               rows[f"{pre}_spiked_at"], **extra)
        for name, values in cols.items():
            out[name] = (out[name].astype(object) if name in out
                         else pd.Series(None, index=out.index, dtype=object))
            out.loc[missing, name] = pd.Series(values, index=rows.index, dtype=object)
    return out


def _rates(real: pd.Series, said: pd.Series) -> dict:
    """Recall and precision of the calls "diverges" against the real divergences, with the
    counts (an "unknown" call on a real divergence counts as missed)."""
    r, p = real == OUTCOMES[DIVERGES], said == OUTCOMES[DIVERGES]
    tp, fp, fn = int((r & p).sum()), int((~r & p).sum()), int((r & ~p).sum())
    unknown = said == "unknown"
    return {"n": int(len(real)), "real_diverges": int(r.sum()), "called_diverges": int(p.sum()),
            "tp": tp, "fp": fp, "fn": fn, "unknown": int(unknown.sum()),
            "unknown_real_diverges": int((unknown & r).sum()),
            "recall": tp / (tp + fn) if tp + fn else None,
            "precision": tp / (tp + fp) if tp + fp else None}


def outcome_summary(frame: pd.DataFrame) -> dict:
    """The summary's ``outcome`` block over every row (edge rows included): real outcome
    counts; per predictor ("ntk" = the primary, then the variants) the confusion of its call
    against the real outcome ({call: {real: rows}}: 3 × 3, plus an "unknown" row where it
    abstains) and recall and precision of its "diverges" calls, overall, by κ̃ (rounded to
    2 decimals) and by N."""
    frame = with_outcomes(frame)
    real = frame["real_outcome"]
    predictors = [p for p in ["ntk", *variants(frame)] if f"{_prefix(p)}_outcome" in frame]
    out: dict = {
        "definition": "real/called outcome per ntk_tt.dynamics._divergence: diverges = "
                      "non-finite, L_T > L_0 or a spike above 10·L_0; catapult = rose above "
                      "L_0 and recovered; converges = never above L_0; a call is 'diverges' "
                      f"also where κ ≥ {KAPPA_MAX:g}, 'unknown' where it abstains",
        "kappa_max": KAPPA_MAX,
        "real": {name: int((real == name).sum()) for name in REAL},
        "confusion": {}, "divergence": {}, "divergence_by_kappa": {},
        "divergence_by_num_train": {},
    }
    for p in predictors:
        said = frame[f"{_prefix(p)}_outcome"]
        out["confusion"][p] = {
            s: {r: int(((said == s) & (real == r)).sum()) for r in REAL}
            for s in OUTCOMES if s != "unknown" or (said == "unknown").any()}
        out["divergence"][p] = _rates(real, said)
    for key, values in (("divergence_by_kappa", frame["kappa_eff"].round(2)),
                        ("divergence_by_num_train", frame["num_train"])):
        for level in sorted(values.unique()):
            rows = frame[values == level]
            out[key][f"{level:g}"] = {p: _rates(rows["real_outcome"],
                                                rows[f"{_prefix(p)}_outcome"])
                                      for p in predictors}
    return out
