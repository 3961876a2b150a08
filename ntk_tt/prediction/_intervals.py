"""Calibrated prediction intervals for T_ε: Mondrian split conformal on the benchmark table.

Score of a (row, ε) of the benchmark table: the log-ratio residual r = log(T_ε / T̂_ε) of the
default predictor (columns ``real_T<ε>``, ``pred_T<ε>``, in steps). Rows where either side
diverged (``real_diverged``, ``pred_diverged``) or either T_ε is undefined are skipped: an
interval is only given for a defined prediction, and only says where a defined real T_ε falls.

Residuals are grouped by what is known before training (a Mondrian taxonomy): the effective
κ̃ = η·λ_max/(N·(1 − m)) in bins (≤ 2, (2, 8], > 8), and optionally ε and the optimiser (gd /
sgd) (``by``; default κ̃ alone, see below). The interval at level 1 − α for a new prediction T̂
is [T̂·exp(q_lo), T̂·exp(q_hi)], q_hi the ⌈(n + 1)(1 − α/2)⌉-th smallest and q_lo the
⌈(n + 1)(1 − α/2)⌉-th largest of the group's n residuals. If the new case is exchangeable with
the group's calibration cases, each tail is missed with probability ≤ α/2, so the interval
covers with probability ≥ 1 − α (split conformal: Vovk, Gammerman & Shafer 2005, "Algorithmic
Learning in a Random World"; Lei, G'Sell, Rinaldo, Tibshirani & Wasserman 2018,
"Distribution-free predictive inference for regression", JASA; per-group "Mondrian"
conformal: Vovk et al. 2005 ch. 4, Vovk, Lindsay, Nouretdinov & Gammerman 2003). A group with
fewer than ``min_count`` residuals, or too few for finite quantiles at the level asked, falls
back to a coarser group, dropping the fields of ``by`` from the last (e.g. (κ̃, ε, optimiser)
→ (κ̃, ε) → κ̃ → all residuals pooled); :meth:`IntervalCalibrator.group` says which was used.

Exchangeability across target sets is an assumption, not a guarantee: the coverage measured
leaving one target set out (``experiments/intervals.py``) is the honest figure. On the
committed benchmark table, groups finer than κ̃ under-cover a held-out set (their residuals
come from three other sets whose offsets differ from its own: 80 % at 90 % for (κ̃, ε,
optimiser)), hence the default ``by=("kappa",)``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import os
import pathlib
import warnings

import numpy as np

from ntk_tt._options import a_type, file_path
from ntk_tt._options_predict import NO_INTERVAL
from ntk_tt._output_paths import require_folder
from ntk_tt.prediction._intervals_checks import (  # noqa: F401 (_check_edges re-exported)
    KAPPA_EDGES,
    _check_edges,
    _check_level,
    check_interval_args,
    scalar,
)
from ntk_tt.prediction._intervals_range import (  # noqa: F401 (re-exported)
    CalibrationRangeWarning,
    _abstain_message,
    _level_message,
    check_ranges,
    prediction_messages,
    range_messages,
)
from ntk_tt.prediction._result import LINEARISED_CATAPULT, Prediction

FORMAT = "ntk_tt.intervals/1"
MIN_COUNT = 20
_FIELDS = ("kappa", "eps", "optimizer")
_ASSETS = {rule: pathlib.Path(__file__).resolve().parents[1] / "assets" / f"intervals{tail}.json"
           for rule, tail in (("sgd", ""), ("diagonal", ""), ("adam", "_adamw"),
                              ("adam_isotropic", "_adamw_isotropic"), ("subspace", "_subspace"),
                              ("isotropic", "_isotropic"))}


def conformal_quantile(scores, q: float) -> float:
    """The split-conformal upper quantile: the ⌈(n + 1)·q⌉-th smallest of n scores.

    Equivalently the empirical quantile at level ⌈(n + 1)·q⌉/n (Lei et al. 2018, Lemma 2).
    Returns +inf when ⌈(n + 1)·q⌉ > n (too few scores for a finite bound, e.g. n < 19 at
    q = 0.95) and −inf when it is < 1. ``scores``: 1-D array-like; ``q`` in (0, 1).
    """
    s = np.sort(np.asarray(scores, float).ravel())
    # the tolerance keeps (n + 1)·q that is an integer in exact arithmetic from rounding up
    k = math.ceil((len(s) + 1) * q - 1e-9)
    if k > len(s):
        return math.inf
    return -math.inf if k < 1 else float(s[k - 1])


def kappa_bin(kappa_eff: float, edges=KAPPA_EDGES) -> str:
    """Label of κ̃'s bin: ``"<=2"``, ``"(2, 8]"``, ``">8"`` for the default edges."""
    i = int(np.searchsorted(np.asarray(edges, float), float(kappa_eff), side="left"))
    if i == 0:
        return f"<={edges[0]:g}"
    return f">{edges[-1]:g}" if i == len(edges) else f"({edges[i - 1]:g}, {edges[i]:g}]"


@dataclasses.dataclass(frozen=True)
class IntervalCalibrator:
    """Residuals of the default T_ε predictor grouped by (κ̃ bin, ε, optimiser); see module doc.

    level: the default 1 − α of :meth:`interval`. by: the grouping fields, a tuple of "kappa",
    "eps", "optimizer", finest group first, coarser ones dropping fields from the end.
    min_count: fewest residuals a group needs before it is used instead of a coarser one.
    kappa_edges: κ̃ bin edges (right-closed bins).
    groups: {(κ̃ bin label, ε as ``f"{ε:g}"``, "gd" | "sgd"): sorted residuals (tuple of
    float, natural-log units)}. source: where it was fitted (rows, target sets, predictor;
    "num_train", "steps": [min, max] N and T; "schedule", "weight_decay", "nesterov": the
    update rule, ``_intervals_range.rule_source``; each absent from older fits).

    Source: split conformal prediction (Vovk, Gammerman & Shafer 2005; Lei et al. 2018),
    Mondrian per group, on ntk_tt's benchmark residuals (README "Calibrated intervals for T_ε").
    """

    level: float
    by: tuple
    min_count: int
    kappa_edges: tuple
    groups: dict
    source: dict

    def _pick(self, kappa_eff, eps, optimizer, level):
        k, e = scalar(kappa_eff, "kappa_eff"), scalar(eps, "eps")
        if not (math.isfinite(k) and k >= 0) or not 0 < e < 1 or optimizer not in ("gd", "sgd"):
            raise ValueError(f"kappa_eff must be a finite number >= 0, eps in (0, 1) and "
                             f"optimizer 'gd' (B = N) or 'sgd' (B < N); got {kappa_eff!r}, "
                             f"{eps!r}, {optimizer!r}.")
        key = {"kappa": kappa_bin(k, self.kappa_edges), "eps": f"{e:g}", "optimizer": optimizer}
        alpha = 1.0 - _check_level(self.level if level is None else level)
        for fields in (self.by[:i] for i in range(len(self.by), -1, -1)):
            res = np.array([v for g, r in self.groups.items()
                            if all(g[_FIELDS.index(f)] == key[f] for f in fields) for v in r])
            lo = -conformal_quantile(-res, 1 - alpha / 2)
            hi = conformal_quantile(res, 1 - alpha / 2)
            # the last level (no field: all residuals pooled) is used whatever its size
            if (len(res) >= self.min_count and math.isfinite(hi)) or not fields:
                return {f: key[f] for f in fields}, len(res), lo, hi

    def group(self, kappa_eff: float, eps: float, optimizer: str, level: float | None = None):
        """``(fields, n)``: the group whose residuals set this case's interval, and its size.

        ``fields`` maps the fields matched to this case's values, e.g. ``{"kappa": "(2, 8]"}``;
        fewer fields than ``by`` means a fallback, ``{}`` all residuals pooled.
        """
        return self._pick(kappa_eff, eps, optimizer, level)[:2]

    def interval(self, t_pred: float, kappa_eff: float, eps: float, optimizer: str,
                 level: float | None = None, steps: float | None = None) -> tuple[float, float]:
        """``(lo, hi)`` in steps: the conformal interval for the real T_ε around ``t_pred``.

        Args:
          t_pred: predicted T_ε (steps, finite, > 0; a NaN, undefined T̂_ε has no interval).
            kappa_eff: κ̃ = η·λ_max/(N·(1 − m)). eps: ε. optimizer: "gd" (B = N) or "sgd"
            (B < N). level: 1 − α, None = ``self.level``. steps: the horizon T the prediction
            was made over, each bound capped at it (T_ε ≤ T by definition, so ``t_pred`` ≤
            T); None: no cap.

        Returns:
          ``(t_pred·exp(q_lo), t_pred·exp(q_hi))``, each capped at ``steps``; ±inf bounds (0
          and inf, or ``steps``) when even the pooled residuals are too few for the level.

        Raises:
          ValueError: ``t_pred``, ``kappa_eff``, ``eps`` or ``steps`` not a real number (a
            string, a bool, an array); ``t_pred`` NaN, infinite or ≤ 0; ``steps`` not None or
            finite and > 0; ``t_pred`` > ``steps`` (beyond the horizon: a T̂_ε over T steps
            is ≤ T); level not in (0, 1), ``kappa_eff`` not finite and ≥ 0, ``eps`` outside
            (0, 1), ``optimizer`` not "gd" or "sgd".
        """
        t, cap = check_interval_args(t_pred, steps)
        _, _, lo, hi = self._pick(kappa_eff, eps, optimizer, level)
        return min(t * math.exp(lo), cap), min(t * math.exp(hi), cap)

    def range_warnings(self, num_train=None, steps=None, num_classes=None) -> list[str]:
        """:func:`ntk_tt.prediction._intervals_range.range_messages` of this calibrator: one
        message per N = ``num_train``, T = ``steps`` or C = ``num_classes`` outside
        ``source``'s recorded range."""
        return range_messages(self.source, num_train, steps, num_classes)

    def to_json(self) -> dict:
        """JSON-ready dict (``FORMAT``); residuals as they are, float64 (``json`` writes a
        float's shortest repr that reads back to the same float: :meth:`save` then
        :meth:`load` gives an equal calibrator)."""
        return {"format": FORMAT, "level": self.level, "by": list(self.by), "min_count":
                self.min_count, "kappa_edges": list(self.kappa_edges), "source": self.source,
                "groups": [{"kappa_eff": k, "eps": e, "optimizer": o,
                            "residuals": [float(v) for v in r]}
                           for (k, e, o), r in sorted(self.groups.items())]}

    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> None:
        """Write :meth:`to_json` to ``path`` (a small JSON file, one line per group), exactly:
        :meth:`load` gives back an equal calibrator (the same residuals, the same intervals).

        Args:
          path: the ``.json`` file to write (str or os.PathLike, ``~`` expanded).
          overwrite: True replaces an existing file; False (default) refuses it (as
            :func:`ntk_tt.save_telemetry` and :func:`ntk_tt.save_checkpoint`).

        Raises:
          ValueError: ``path`` not a str or os.PathLike, its folder missing, or ``path``
            exists and ``overwrite`` is not True. Nothing is written then.
        """
        path = file_path(path, "calibrator", "calibrator.save('intervals.json')")
        data = self.to_json()
        groups = ",\n  ".join(json.dumps(g) for g in data.pop("groups"))
        head = json.dumps(data, indent=1)[:-2]
        require_folder(path, "calibrator")
        if path.exists() and overwrite is not True:
            raise ValueError(f"calibrator path {path} exists; pass overwrite=True to replace "
                             "it, or give a new file name. Nothing was written.")
        path.write_text(f'{head},\n "groups": [\n  {groups}\n ]\n}}\n')

    @classmethod
    def load(cls, path: str | os.PathLike) -> IntervalCalibrator:
        """Read a file written by :meth:`save` (an older one, without some ``source`` field,
        loads too and flags nothing for it).

        Raises:
          ValueError: ``path`` not a str or os.PathLike (``~`` expanded), not a file, or not an
            ``ntk_tt.intervals/1`` calibrator (not JSON, another format, fields missing);
            ``source`` not an object, or a recorded field malformed (``check_ranges``).
        """
        path = file_path(path, "calibrator", "IntervalCalibrator.load('intervals.json')")
        if not path.is_file():
            raise ValueError(f"{path} is not a file: give the path of a calibrator that "
                             "IntervalCalibrator.save wrote.")
        wrong = ValueError(f"{path} is not an interval calibrator (a JSON file of format "
                           f"{FORMAT!r}, as IntervalCalibrator.save writes).")
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise wrong from None
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(
                source := data.get("source"), dict):
            raise wrong
        check_ranges(path, source)
        try:
            groups = {(g["kappa_eff"], g["eps"], g["optimizer"]): tuple(g["residuals"])
                      for g in data["groups"]}
            return cls(level=data["level"], by=tuple(data["by"]), min_count=data["min_count"],
                       kappa_edges=tuple(data["kappa_edges"]), groups=groups, source=source)
        except (KeyError, TypeError):
            raise wrong from None


def default_calibrator(rule: str = "sgd") -> IntervalCalibrator:
    """A shipped calibrator (90 %).

    Source: ntk_tt's own fits (README "Calibrated intervals for T_ε").

    Args:
      rule: which predictor's (README "Calibrated intervals for T_ε"). "sgd" or "diagonal"
        (default): the default one's (diagonal kernel, k = 5; ``assets/intervals.json``),
        fitted on ``experiments/results/sweep/results.parquet``; "isotropic":
        ``backbone="isotropic"``'s (``assets/intervals_isotropic.json``, that table's earlier
        run); "adam" / "adam_isotropic": the fast AdamW predictor's default (diagonal, k = 5)
        / isotropic one's (``assets/intervals_adamw.json`` / ``intervals_adamw_isotropic.json``,
        AdamW rows of ``experiments/results/optimizers*``); "subspace": ``backbone="subspace"``'s
        with k = 16 (``assets/intervals_subspace.json``, ``experiments/subspace_intervals.py``).

    Returns:
      An :class:`IntervalCalibrator`, the caller's own copy (edits change no later call's).

    Raises:
      ValueError: ``rule`` not one of those.
    """
    if not isinstance(rule, str) or rule not in _ASSETS:
        raise ValueError(f"rule must be one of {sorted(_ASSETS)} (the predictor: 'sgd' the "
                         "default one, 'adam' the Adam/AdamW one, 'subspace' the subspace "
                         f"backbone's, '*isotropic' the isotropic ones'), got {rule!r}.")
    return copy.deepcopy(_shipped(rule))  # the caller's own: edits reach no later call


@functools.lru_cache(maxsize=len(_ASSETS))
def _shipped(rule: str) -> IntervalCalibrator:
    return IntervalCalibrator.load(_ASSETS[rule])


def calibrated_for(prediction, calibrator: IntervalCalibrator) -> bool:
    """Whether ``calibrator``'s residuals are of the predictor that made ``prediction``.

    The sweep's predictions are cross-entropy ones by the discrete recursion; the predictor is
    the ``pred_method``/``pred_kernel`` pair(s) in ``calibrator.source`` (e.g. "head_aware" /
    "isotropic": ``Prediction.kernel`` "head_aware:isotropic"). A calibrator whose source does
    not name its predictor (a table without those columns) matches any discrete cross-entropy one.
    One that records ``source["subspace_dim"]`` (the subspace kernel's k) matches a prediction
    with that ``hyperparameters["subspace_dim"]`` only.

    Source: none (a utility of :func:`intervals`).

    Args:
      prediction: a :class:`ntk_tt.Prediction` (``method``, ``kernel``, and
        ``hyperparameters["loss"]`` are read). calibrator: e.g. :func:`default_calibrator`.

    Returns:
      True when :func:`intervals` gives intervals for ``prediction``.

    Raises:
      ValueError: ``prediction`` not a Prediction or ``calibrator`` not an IntervalCalibrator.
    """
    if not isinstance(prediction, Prediction) or not isinstance(calibrator, IntervalCalibrator):
        raise ValueError(f"calibrated_for takes a Prediction (ntk_tt.predict) and an "
                         f"IntervalCalibrator (ntk_tt.default_calibrator()), got "
                         f"{type(prediction).__name__} and {type(calibrator).__name__}.")
    hp = prediction.hyperparameters
    if prediction.method != "discrete" or hp.get("loss", "cross_entropy") != "cross_entropy":
        return False
    methods, kernels = (calibrator.source.get(k) for k in ("pred_method", "pred_kernel"))
    if not methods or not kernels:
        return True
    dim = calibrator.source.get("subspace_dim")  # the subspace kernel's k, if it records one
    return prediction.kernel in {f"{m}:{k}" for m in methods for k in kernels} and (
        dim is None or hp.get("subspace_dim") == dim)


def intervals(prediction, calibrator: IntervalCalibrator | None = None,
              level: float | None = None) -> dict:
    """Conformal intervals around a :class:`ntk_tt.Prediction`'s T_ε.

    κ̃ = ``prediction.kappa``/(1 − m) and the optimiser (gd when B = N, else sgd) come from
    ``prediction.hyperparameters``.

    Source: split conformal prediction (Vovk, Gammerman & Shafer 2005; Lei et al. 2018) on
    ntk_tt's benchmark residuals (module docstring; README "Calibrated intervals for T_ε").

    Args:
      prediction: from :func:`ntk_tt.predict`. calibrator: None = the shipped one of the
        prediction's predictor, :func:`default_calibrator` ``("adam_isotropic")`` for
        "head_aware_adam:isotropic", ``("adam")`` for another fast AdamW prediction,
        ``("subspace")`` / ``("isotropic")`` for "head_aware:subspace" / ":isotropic",
        ``("sgd")`` otherwise (the default diagonal one's).
      level: 1 − α, None = the calibrator's level (0.9 for the shipped ones).

    Returns:
      ``{"loss": {ε: (lo, hi) or None}, "error": {ε: None}, "warnings": [str]}`` in steps, for the
      ε of ``prediction.training_time``, each bound capped at the horizon T (``hyperparameters``
      "steps"; T_ε ≤ T by definition, so no coverage is lost); None where T̂_ε is undefined (or
      the prediction diverged); the benchmark table measures loss-curve T_ε only, so error-curve
      T_ε have no calibrated interval (None). All None when the prediction abstains (outcome
      "unknown": beyond the edge it can see, e.g. Adam's weight travel ρ > 1) or was not made by the
      predictor the residuals are of (:func:`calibrated_for`): the shipped calibrators' are the
      default head-aware predictor's (``kernel`` "head_aware:diagonal"), the isotropic
      feature kernel's ("head_aware:isotropic"), the fast AdamW predictor's
      ("head_aware_adam:diagonal" with k 5, "head_aware_adam:isotropic") and the subspace
      one's ("head_aware:subspace" with ``hyperparameters["subspace_dim"]`` 16), discrete
      recursion, cross-entropy; not the
      frozen-kernel, subset, ODE/SDE or MSE predictions'. "warnings": if an interval is given,
      one message per N, T or C (``hyperparameters`` "num_train", "steps", "num_classes")
      outside the calibration table's range (:meth:`IntervalCalibrator.range_warnings`), per
      κ̃ outside a recorded κ̃ range (the subspace calibrator's: κ̃ ≤ 12), and per
      update-rule field ("schedule", "weight_decay", "nesterov", peak "learning_rate"; the
      constant-η table's: constant η, λ = 0, heavy-ball; the AdamW table's: warmup + cosine,
      λ = 0.01–0.1, peak η = 1e-4–1e-3) outside the table's
      (``_intervals_range.prediction_messages``), and one when ``level`` is above what the
      table's residuals resolve (level > 1 − 2/(n + 1) for n residuals, all pooled: the bounds
      are then 0 and T); [] for a calibrator recording none; when every interval is None
      because the prediction abstains, calls divergence or is not of the calibrator's
      predictor, one message saying which.

    Warns:
      CalibrationRangeWarning: (a :class:`ntk_tt.BeyondEdgeWarning`) each of "warnings".

    Raises:
      ValueError: ``prediction`` not a :class:`ntk_tt.Prediction`; ``calibrator`` not an
        :class:`IntervalCalibrator` or None; level not in (0, 1).
    """
    if not isinstance(prediction, Prediction):
        raise ValueError(f"intervals(prediction) takes a Prediction from ntk_tt.predict, got "
                         f"{type(prediction).__name__}.")
    if calibrator is not None and not isinstance(calibrator, IntervalCalibrator):
        raise ValueError(f"calibrator must be an IntervalCalibrator (IntervalCalibrator.load("
                         f"path)) or None (the shipped one), got {a_type(calibrator)}.")
    level = None if level is None else _check_level(level)
    tt = prediction.training_time
    kernel = str(prediction.kernel)
    rule = {"head_aware:subspace": "subspace", "head_aware:isotropic": "isotropic",
            "head_aware_adam:isotropic": "adam_isotropic"}.get(
        kernel, "adam" if kernel.startswith("head_aware_adam:") else "sgd")
    cal = default_calibrator(rule) if calibrator is None else calibrator
    if not calibrated_for(prediction, cal) or prediction.outcome in ("unknown", "diverges"):
        said = [_abstain_message(prediction, cal)]
        warnings.warn(said[0], CalibrationRangeWarning, stacklevel=2)
        return {"loss": dict.fromkeys(tt["loss"]), "error": dict.fromkeys(tt["error"]),
                "warnings": said}
    hp = prediction.hyperparameters
    kappa_eff = float(prediction.kappa) / (1.0 - float(hp["momentum"]))
    opt = "gd" if int(hp["batch_size"]) >= int(hp["num_train"]) else "sgd"
    loss, unresolved = {}, None
    for eps, t in tt["loss"].items():
        if math.isnan(t):  # undefined T̂_ε (never reached): no interval
            loss[eps] = None
            continue
        lo, hi = loss[eps] = cal.interval(t, kappa_eff, eps, opt, level, steps=hp.get("steps"))
        if lo == 0.0:  # T̂·exp(−inf): too few residuals even pooled (both bounds infinite)
            unresolved = cal.group(kappa_eff, eps, opt, level)[1]
    said = (prediction_messages(cal.source, hp | {"kappa_eff": kappa_eff})
            if any(loss.values()) else [])
    if prediction.outcome == "catapult" and prediction.diverged:  # a fresh user: no word why
        said = [f"{NO_INTERVAL}: {LINEARISED_CATAPULT}"]
    if unresolved is not None:
        said.append(_level_message(cal.level if level is None else level, unresolved))
    for message in said:
        warnings.warn(message, CalibrationRangeWarning, stacklevel=2)
    return {"loss": loss, "error": dict.fromkeys(tt["error"]), "warnings": said}
