"""experiments/subspace_preset.py scores a predictor's curves with the sweep's own functions:
put in place of the stored primary's, the stored curves give back the committed figures, and
another curve moves them as its recomputed T_ε says."""

import numpy as np
import pandas as pd
from _scripts import EXPERIMENTS, experiment_script

import ntk_tt
from ntk_tt.sweep._errors import _pooled_stats, t_col
from ntk_tt.sweep._targets import absolute_targets

SWEEP = EXPERIMENTS / "results" / "sweep" / "results.parquet"


def _stored(frame: pd.DataFrame) -> dict:
    return {r.row_id: {"default": {"loss": list(r.pred_loss), "error": list(r.pred_error),
                                   "diverged": bool(r.pred_diverged),
                                   "spiked_at": int(r.pred_spiked_at)}}
            for r in frame.itertuples()}


def test_stored_curves_in_the_primary_slot_give_the_stored_figures(monkeypatch):
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    script = experiment_script("subspace_preset")
    df = pd.read_parquet(SWEEP)
    df = df[(df.kappa_eff < 13) & (df.per_class == 50)].reset_index(drop=True)
    rows = _stored(df)
    same = script.frame_for(df, rows, "default")
    for opt in ("gd", "sgd"):
        sub, ref = same[same.optimizer == opt], df[df.optimizer == opt]
        assert _pooled_stats(sub, "ntk", [0.1, 0.4]) == _pooled_stats(ref, "ntk", [0.1, 0.4])
    got, want = absolute_targets(same), absolute_targets(df)
    assert got["headline"] == want["headline"]
    assert got["headline_error"] == want["headline_error"]
    # "*_own" is the sweep's prediction on GD rows (one batch order), its own curve elsewhere
    first_sgd = df.index[df.optimizer == "sgd"][0]
    rid = df.row_id[first_sgd]
    slower = np.concatenate([[df.pred_loss[first_sgd][0]] * 10, df.pred_loss[first_sgd][:-10]])
    rows[rid]["default_own"] = rows[rid]["default"] | {"loss": list(slower)}
    own = script.frame_for(df, rows, "default_own")
    for e in (0.1, 0.4):
        col = t_col("pred", e)
        moved = own[col] != df[col]
        assert list(df.row_id[moved]) == [rid]
        assert own[col][first_sgd] == ntk_tt.training_time_report(slower, e)[0]
        assert own[col][first_sgd] > df[col][first_sgd]  # the curve 10 steps late is later
