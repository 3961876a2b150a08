"""The gradient-boosted models of the outcome predictors, one per target (LightGBM).

Final accuracy is a two-part model (:func:`fit_models`): a regressor on the runs that did not
diverge, mixed with the divergence classifier's probability.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ntk_tt._options import _describe, is_real
from ntk_tt.telemetry._outcome_features import REGRESSION, TARGETS, check_seed

MIN_LEAF = 10  # LightGBM's min_child_samples: a split needs 2 · MIN_LEAF fitting rows

# the classification targets, and what a run of class 1 does (for messages)
_CLASSES = {"diverged": "diverge", "failed": "fail", "above_median": "beat their task's median"}


def _lgbm_params(seed: int) -> dict[str, Any]:
    return dict(n_estimators=150, learning_rate=0.1, num_leaves=7, min_child_samples=MIN_LEAF,
                subsample=0.8, subsample_freq=1, colsample_bytree=0.8, reg_lambda=1.0,
                random_state=seed, n_jobs=1, deterministic=True, verbose=-1)


def check_fit_labels(y: dict[str, np.ndarray], run_ids: np.ndarray, rows: int,
                     folds: int) -> None:
    """What :func:`ntk_tt.fit_outcome` needs of its corpus before fitting anything: at least
    ``folds`` runs (one per cross-validation fold), at least 2 · ``MIN_LEAF`` featurised
    ``rows`` (runs × prefix fractions; fewer and no tree can split), and runs of both classes
    of every classification target (else its model would be a constant, e.g. P(diverged) = 0
    for every run). ``y``: target → labels, ``run_ids``: the run of each label.

    Raises:
      ValueError: the first of these that fails, with the counts and the fix.
    """
    run_ids = np.asarray(run_ids)
    runs = len(np.unique(run_ids))
    if runs < folds:
        raise ValueError(f"fit_outcome got {runs} runs, fewer than folds = {folds}: every "
                         "cross-validation fold needs a run; give more corpus rows or fewer "
                         "folds.")
    if rows < 2 * MIN_LEAF:
        raise ValueError(f"fit_outcome got {rows} rows (runs × prefix fractions), fewer than "
                         f"{2 * MIN_LEAF}: its trees need {MIN_LEAF} rows a leaf and could not "
                         "split at all; give more corpus rows or more prefix fractions (ks).")
    for target, verb in _CLASSES.items():
        ones = len(np.unique(run_ids[np.asarray(y[target]) == 1]))
        if ones in (0, runs):
            raise ValueError(
                f"fit_outcome needs runs of both classes of {target!r}, but {ones} of the "
                f"{runs} runs {verb}: its classifier would give every run P = "
                f"{ones / runs:.0f}; add runs that {'do not ' if ones else ''}{verb}"
                + (" (e.g. larger learning rates)" if target == "diverged" and not ones
                   else "") + ".")


# what a label of each target may be (NaN = unknown, left out, for every target)
_LABELS = {"test_accuracy": "a fraction in [0, 1]", "log_t_eps": "a finite number",
           **{t: "0 or 1" for t in _CLASSES}}


def _check_labels(target: str, label: np.ndarray) -> None:
    known = label[~np.isnan(label)] if label.dtype.kind == "f" else label
    if known.size == 0 and target == "test_accuracy":  # (log_t_eps: NaN predicts "unknown")
        raise ValueError(f"fit_models needs at least one known label of y[{target!r}], got "
                         f"NaN (unknown) in all {label.size} rows: its model and constant would "
                         "be NaN, and so every accuracy prediction.")
    if target == "test_accuracy":
        bad = (known < 0) | (known > 1)
    elif target == "log_t_eps":
        bad = ~np.isfinite(known)
    else:
        bad = (known != 0) & (known != 1)
    if bad.any():
        raise ValueError(f"fit_models needs y[{target!r}] to be {_LABELS[target]} (or NaN = "
                         f"unknown) for every row, got {float(known[bad][0])} (one of "
                         f"{int(bad.sum())} such labels).")


def _fit_one(target: str, x: np.ndarray, y: np.ndarray, seed: int):
    import lightgbm as lgb

    keep = np.isfinite(y)
    if keep.sum() < 2:
        return None  # nothing to learn from: predict the constant
    if target in REGRESSION:
        model = lgb.LGBMRegressor(**_lgbm_params(seed))
    else:
        if len(np.unique(y[keep])) < 2:
            return None  # a constant label: predict its rate
        model = lgb.LGBMClassifier(**_lgbm_params(seed))
    model.fit(x[keep], y[keep])
    return model


def _predict_one(target: str, model, x: np.ndarray, constant: float) -> np.ndarray:
    if model is None:
        return np.full(len(x), constant)
    if target in REGRESSION:
        return model.predict(x)
    return model.predict_proba(x)[:, 1]


def _check_features(x, where: str) -> np.ndarray:
    """``x`` as an array after a ValueError unless it is (R, F) real numbers with R >= 1."""
    try:
        arr = np.asarray(x)
    except ValueError:  # a ragged nested list
        arr = None
    if arr is None or arr.ndim != 2 or arr.dtype.kind not in "biuf" or 0 in arr.shape:
        dtype = "" if arr is None or arr.dtype.kind in "biuf" else f" of dtype {arr.dtype}"
        raise ValueError(f"{where} needs x, the feature matrix (R, F) of real numbers with "
                         f"R >= 1 rows and F >= 1 features (an outcome Dataset's .x), got "
                         f"{_describe(x)}{dtype}.")
    return arr


class _Booster:
    """A LightGBM booster that ``OutcomePredictor.load`` (:mod:`ntk_tt.telemetry._outcome`)
    read, behind the sklearn-style calls :func:`predict_models` makes (``predict`` /
    ``predict_proba``)."""

    def __init__(self, booster, target: str):
        self.booster_ = booster
        self.target = target

    def predict(self, x):
        return self.booster_.predict(x)

    def predict_proba(self, x):
        p = self.booster_.predict(x)
        return np.stack([1 - p, p], axis=1)


def fit_models(x: np.ndarray, y: dict[str, np.ndarray], seed: int = 0
               ) -> tuple[dict[str, Any], dict[str, float]]:
    """One LightGBM model per target on features ``x`` and labels ``y``. A target with fewer
    than 2 known labels (or one class) gets no model and predicts its constant (mean label).

    Final accuracy is a two-part (hurdle) model: the regressor is fitted on the runs that did
    not diverge, and :func:`predict_models` mixes it with the divergence classifier,
    E[acc] = p_div·acc_div + (1 − p_div)·acc_not_div, acc_div the mean final accuracy of the
    diverged training runs (near chance). A diverged run's accuracy is set by the divergence,
    not by its hyperparameters' smooth trend, and the classifier sees that from the first
    steps (measured on the corpus: README).

    Source: arXiv 2608.03709 (gradient-boosted trees on early telemetry; METHOD.md §9); the
    targets and the hurdle model are ntk_tt's own (issue 11).

    Args:
      x: the feature matrix (R, F) (an outcome Dataset's ``.x``).
      y: {target: labels (R,)} for every target of ``TARGETS`` (other keys are ignored); NaN =
        unknown, left out of that target's fit.
      seed: LightGBM's ``random_state``.

    Returns:
      ``(models, constants)``: models, target → fitted ``lightgbm.LGBMRegressor`` /
      ``LGBMClassifier`` or None; constants, target → mean known label (test_accuracy: of the
      runs that did not diverge, if any), and ``"acc_diverged"``: acc_div above (the
      test_accuracy constant when no diverged run has a known accuracy).

    Raises:
      ValueError: ``x`` not an (R, F) array of real numbers with R >= 1 rows; ``y`` not a
        mapping with real labels of shape (R,) for every target of ``TARGETS`` (the first
        missing or malformed one named), or with a label outside its target's range
        (test_accuracy in [0, 1], log_t_eps finite, the classification targets 0 or 1; NaN
        is allowed, but not in every row of test_accuracy); ``seed`` not an integer in
        [0, 2**31). All before any fitting.
    """
    check_seed(seed, "fit_models")
    x = _check_features(x, "fit_models")
    if not isinstance(y, Mapping):
        raise ValueError(f"fit_models needs y, a dict target → labels (R,) for the targets "
                         f"{TARGETS} (an outcome Dataset's .y), got {_describe(y)}.")
    for t in TARGETS:
        label = np.asarray(y[t]) if t in y else None
        if label is None or label.shape != (len(x),) or label.dtype.kind not in "biuf":
            kind = "" if label is None or label.dtype.kind in "biuf" else f" of dtype " \
                f"{label.dtype}"
            raise ValueError(f"fit_models needs y[{t!r}], real labels of shape ({len(x)},) "
                             f"(one per row of x; NaN = unknown), got "
                             f"{'none' if label is None else _describe(label)}{kind}.")
        _check_labels(t, label)
    y = {t: np.asarray(y[t]) for t in TARGETS}
    div = y["diverged"] == 1
    models, consts = {}, {}
    for t in TARGETS:
        yt = y[t]
        consts[t] = float(np.nanmean(yt)) if np.isfinite(yt).any() else math.nan
        keep = ~div if t == "test_accuracy" else np.ones(len(yt), bool)
        models[t] = _fit_one(t, x[keep], yt[keep], seed)
        if t == "test_accuracy" and np.isfinite(yt[~div]).any():
            consts[t] = float(np.nanmean(yt[~div]))
    acc = y["test_accuracy"][div]
    consts["acc_diverged"] = (float(np.nanmean(acc)) if np.isfinite(acc).any()
                              else consts["test_accuracy"])
    return models, consts


def predict_models(models: dict[str, Any], consts: dict[str, float], x: np.ndarray
                   ) -> dict[str, np.ndarray]:
    """Predictions per target from :func:`fit_models`' output.

    Source: arXiv 2608.03709 (METHOD.md §9); the hurdle mixture is ntk_tt's own (issue 11).

    Args:
      models: target → model or None, as :func:`fit_models` returns them (or loaded boosters).
      consts: its constants (target → constant, and ``"acc_diverged"``).
      x: the feature matrix (R, F), its F columns those the models were fitted on.

    Returns:
      {target: (R,) float64} for every target of ``TARGETS``: final accuracy (the hurdle
      mixture, clipped to [0, 1]) and log(T_0.1/T) values, probabilities of class 1 for the
      classification targets.

    Raises:
      ValueError: ``models`` or ``consts`` not the dicts :func:`fit_models` returns (a target,
        or ``consts["acc_diverged"]``, missing; a model without ``predict``, a constant that is
        not a number); ``x`` not an (R, F) array of real numbers
        with R >= 1 rows; from LightGBM, ``x`` with another number of features F than the
        models were fitted on.
    """
    x = _check_features(x, "predict_models")
    need = {"models": (models, TARGETS), "consts": (consts, (*TARGETS, "acc_diverged"))}
    for name, (value, keys) in need.items():
        missing = [k for k in keys if k not in value] if isinstance(value, Mapping) else keys
        if missing:
            raise ValueError(f"predict_models needs {name} as fit_models returns it (models, "
                             f"consts = fit_models(x, y)): {_describe(value)} lacks {missing}.")
    for t in TARGETS:
        if not (models[t] is None or hasattr(models[t], "predict")) or not is_real(consts[t]):
            raise ValueError(f"predict_models needs models and consts as fit_models returns them: "
                             f"models[{t!r}] is {_describe(models[t])} and consts[{t!r}] "
                             f"{_describe(consts[t])}.")
    out = {t: _predict_one(t, models[t], x, consts[t]) for t in TARGETS}
    p = out["diverged"]
    acc = np.clip(out["test_accuracy"], 0.0, 1.0)
    out["test_accuracy"] = np.clip(p * consts["acc_diverged"] + (1 - p) * acc, 0.0, 1.0)
    return out
