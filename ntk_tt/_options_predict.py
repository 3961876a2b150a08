"""The checks of :func:`ntk_tt.predict_task` / ``ntk-tt predict`` that need no JAX (see
``ntk_tt._options``): every option value, the method / kernel / predictor / subset
combinations and the output paths, before any data or weights are read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ntk_tt._defaults import DEFAULTS
from ntk_tt._options import (
    BACKBONES,
    DECAY_RANGE,
    FLOAT32_MAX,
    FLOAT32_TINY,
    KERNELS,
    MAX_PATHS,
    MAX_STEPS,
    PREDICTORS,
    SUBSET_METHODS,
    _check_source,
    _is_int,
    _real_or_none,
    check_head_scale,
    check_loss,
    is_decay,
    resolve_method,
)
from ntk_tt._options_optimizer import check_optimizer_options
from ntk_tt._options_targets import check_job_targets
from ntk_tt._output_paths import check_outputs, job_inputs

SUBSPACE_DIM = 16  # the "subspace" feature kernel's k (README "Error budget", issue 26)
DIAGONAL_DIM = 5  # the "diagonal" one's (README "Which predictor")


def default_backbone(segments=1) -> str:
    """The head-aware feature kernel that ``backbone=None`` (``predict``, ``ntk-tt predict``)
    builds: "diagonal" (k = ``DIAGONAL_DIM``) with one segment, for the SGD family (since
    session 34: T_ε p95 13.8 / 21.5 % on the full preset against the isotropic kernel's
    22.7 / 23.0 %, at its kernel cost) and for Adam / AdamW, whose K_P then takes the same
    diagonal form (since session 35: AdamW T_ε p95 21.2 / 18.9 % at N = 250 against
    35.7 / 32.1 %); "isotropic" for ``segments`` > 1 (the diagonal basis is not
    re-linearised)."""
    return "isotropic" if segments != 1 else "diagonal"
# how ntk_tt.intervals' note for a prediction it gives no interval begins (the CLI prints that
# note as a "note:" line, its range warnings as "warning:" lines)
NO_INTERVAL = "no T_ε interval"


def check_options(o: dict[str, Any]) -> None:
    """Fail fast on the options of :func:`ntk_tt.predict_task`, before loading anything (and
    without JAX): K, n, seed, the dataset path, split and data_dir
    (:func:`ntk_tt._options._check_source`), the hyperparameters and the optimiser
    (:func:`ntk_tt._options_optimizer.check_optimizer_options`), the method / kernel /
    predictor / subset combinations, the checkpoint folder. K against the dataset's classes,
    n against its images and the images against the model need the data:
    :func:`ntk_tt.prediction._job.load_task` checks them.

    Each message names the option as in Python and, in parentheses, its ``ntk-tt predict``
    flag. N = K·n is known before loading, so the batch size is checked against it here.

    Raises:
      ValueError: one line naming the option, the value and the fix.
    """
    k, n = o["num_classes"], o["per_class"]
    if not _is_int(k) or k < 2:
        raise ValueError(f"num_classes (K) must be >= 2 (-K: an integer number of classes; a "
                         f"task needs at least two), got {k!r}.")
    if not _is_int(n) or n < 1:
        raise ValueError(f"per_class (n) must be >= 1 training image per class (-n: an "
                         f"integer), got {n!r}.")
    _check_source(o)
    steps = o["steps"]
    if not _is_int(steps) or steps < 1 or steps > MAX_STEPS:
        raise ValueError(f"steps (-T) must be an integer >= 1 and <= {MAX_STEPS:,} (optimiser "
                         f"updates), got {steps!r}.")
    lr = _real_or_none(o["learning_rate"])
    if lr is None or not FLOAT32_TINY <= lr <= FLOAT32_MAX:
        raise ValueError(f"learning_rate (--lr) must be a finite number > 0 (in [{FLOAT32_TINY:.8g}"
                         f", {FLOAT32_MAX:.8g}], float32's normal range), got "
                         f"{o['learning_rate']!r}.")
    m = _real_or_none(o["momentum"])
    if m is None or not is_decay(m):
        raise ValueError(f"momentum (-m) must be in {DECAY_RANGE}, got {o['momentum']!r}; use 0 "
                         "for plain (S)GD.")
    check_optimizer_options(o)
    if o["nesterov"] and m == 0.0:
        raise ValueError("Nesterov needs momentum > 0: nesterov (--nesterov) with momentum "
                         "(-m) 0 is plain (S)GD; pass e.g. -m 0.9 or drop --nesterov.")
    k, n, b = o["num_classes"], o["per_class"], o["batch_size"]
    if b is not None:
        if not _is_int(b) or b < 1:
            raise ValueError(f"batch_size (-B) must be an integer >= 1, got {b!r}; omit it "
                             "(None) for full-batch gradient descent.")
        if _is_int(k) and _is_int(n) and k >= 2 and n >= 1 and b > k * n:
            raise ValueError(f"batch_size (-B) = {b} is more than the N = K·n = {k}·{n} = "
                             f"{k * n} training images; choose B <= {k * n}, or omit it for "
                             "full-batch gradient descent.")
    check_head_scale(_real_or_none(o["head_scale"]), o["head_scale"])
    tpc = o["test_per_class"]
    if not _is_int(tpc) or tpc < 0:
        raise ValueError(f"test_per_class (--test-per-class) must be an integer >= 0 held-out "
                         f"images per class (0 for none), got {tpc!r}.")
    check_loss(o["loss"])
    method = resolve_method(o["method"])
    full_batch = b is None or (_is_int(k) and _is_int(n) and b == k * n)
    _check_subset_options(o, full_batch)
    if method == "closed_form" and (o["loss"] != "mse" or not full_batch):
        raise ValueError(f"method 'closed_form' (--method closed_form) exists for loss 'mse' "
                         f"(--loss mse) with full-batch GD only, got loss {o['loss']!r} and "
                         f"batch_size (-B) {b!r}; use --loss mse without -B, or method 'ode' "
                         "(cross-entropy) or 'discrete' (SGD).")
    if o["kernel"] not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {o['kernel']!r}.")
    _check_predictor_options(o, method)
    d = o["sketch_dim"]
    if d is not None:
        if not _is_int(d) or d < 1:
            raise ValueError(f"sketch_dim (--sketch-dim) must be an integer >= 1 (D'), got "
                             f"{d!r}.")
        if o["kernel"] != "sketch" and method != "sde":
            raise ValueError(f"sketch_dim (--sketch-dim) only applies to kernel 'sketch' "
                             f"(--kernel sketch) or method 'sde' (--method sde); got kernel "
                             f"{o['kernel']!r}, method {o['method']!r}: drop it or choose one "
                             "of those.")
    if o["checkpoint"] is not None:
        ck = Path(o["checkpoint"]).expanduser()
        if ck.exists() and not ck.is_dir():
            raise ValueError(f"checkpoint {str(ck)!r} is a file; pass the directory written "
                             "by ntk_tt.save_checkpoint (or omit it for the shipped one).")
        if not ck.exists():
            raise ValueError(f"checkpoint not found: {ck.absolute()} (pass the directory "
                             "written by ntk_tt.save_checkpoint, or omit it for the shipped "
                             "one).")


def check_predict_job(options: dict[str, Any], figure_path=None, json_path=None,
                      overwrite=False) -> dict[str, Any]:
    """Every check of :func:`ntk_tt.predict_task` that reads no data: unknown options,
    ``num_paths``, :func:`check_options`, the absolute targets
    (:func:`ntk_tt._options_targets.check_job_targets`),
    :func:`ntk_tt._output_paths.check_outputs`. Returns
    the options with their defaults (``DEFAULTS | options``).

    Raises:
      ValueError: one line naming the option, the value and the fix.
    """
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown options {sorted(unknown)}; known: {sorted(DEFAULTS)}.")
    o = DEFAULTS | options
    if not (_is_int(o["num_paths"]) and 1 <= o["num_paths"] <= MAX_PATHS):
        raise ValueError(f"num_paths (--num-paths) must be an integer in [1, {MAX_PATHS}] (SGD "
                         f"noise paths; 4096 resolve the 5–95 % band to ~1 %), got "
                         f"{o['num_paths']!r}.")
    check_options(o)
    if "num_paths" in options and o["batch_size"] in (None, o["num_classes"] * o["per_class"]):
        raise ValueError("num_paths (--num-paths) averages SGD batch orders (or SDE paths) and "
                         "full-batch GD has one (no -B, or -B N): "
                         + ("drop --num-paths (--subset predicts GD only)." if o["subset"] else
                            "give -B < N, or drop --num-paths."))
    if "num_paths" in options and o["method"] in ("ode", "closed_form"):
        raise ValueError(f"num_paths (--num-paths) averages SGD batch orders or SDE paths; "
                         f"method {o['method']!r} (--method {o['method']}) is deterministic, "
                         "the mean flow of -B's SGD (one path, the same curves for any "
                         "--num-paths): drop --num-paths, or use --method sde or auto for "
                         "SGD's noise.")
    check_job_targets(o)
    check_outputs(figure_path, json_path, overwrite, inputs=job_inputs(o))
    return o


def _check_subset_options(o: dict[str, Any], full_batch: bool) -> None:
    """``subset`` (--subset N') and ``subset_method``: the subset predictor exists for the
    MSE loss of full-batch training only (the predicted spectrum, App. D), with ``method``
    auto, discrete or closed_form as ``ntk_tt.predict(subset=)`` (the optimiser's part, and
    closed_form's constant η and m = 0: ``ntk_tt._options_optimizer``)."""
    sub, how = o["subset"], o["subset_method"]
    if how not in SUBSET_METHODS:
        raise ValueError(f"subset_method (--subset-method) must be one of {SUBSET_METHODS}, "
                         f"got {how!r}.")
    if sub is None:
        if how != "power_law":
            raise ValueError(f"subset_method (--subset-method) {how!r} applies with subset "
                             "(--subset N') only; add --subset N' or drop --subset-method.")
        return
    k, n = o["num_classes"], o["per_class"]
    if not _is_int(sub) or sub < 1:
        raise ValueError(f"subset (--subset) must be an integer N' >= 1 (samples whose kernel "
                         f"is built), got {sub!r}.")
    if _is_int(k) and _is_int(n) and k >= 2 and n >= 1 and not (
            k <= sub < k * n and sub % k == 0):
        raise ValueError(f"subset (--subset) N' = {sub} must be a multiple of K = {k} classes "
                         f"with K <= N' < N = K·n = {k}·{n} = {k * n} (N'/K images per "
                         f"class); e.g. --subset {max(k, (k * n // 4) // k * k)}.")
    if o["loss"] != "mse":
        raise ValueError(f"subset (--subset) predicts the MSE loss only (Prop. 2 on the "
                         f"predicted spectrum, App. D): pass --loss mse, got loss "
                         f"{o['loss']!r}.")
    if not full_batch:
        raise ValueError(f"subset (--subset) predicts full-batch GD only: drop -B (got "
                         f"batch_size {o['batch_size']!r}).")
    if o["method"] not in ("auto", "discrete", "closed_form"):
        gd = o["schedule"] == "constant" and not _real_or_none(o["momentum"])
        allowed = "auto, discrete or closed_form" if gd else "auto or discrete"
        raise ValueError(f"subset (--subset) runs each eigenmode's exact recursion on the "
                         f"predicted spectrum (constant-η GD: the closed form): --method must "
                         f"be {allowed} here, got {o['method']!r}; drop --method.")
    if o["kernel"] == "sketch":
        raise ValueError("subset (--subset) builds the exact logit-summed kernel of the "
                         "subset: drop --kernel sketch (exact and traced are the same here).")
    if o["predictor"] == "head_aware":
        raise ValueError("subset (--subset) is the frozen-kernel linear predictor: drop "
                         "--predictor head_aware (or use --predictor linear).")


def resolve_predictor(o: dict[str, Any]) -> str:
    """The predictor the job runs: ``predictor`` unless "auto", which is the head-aware model
    (the best measured, README) except with options only the frozen-kernel linear predictor
    has (``method`` other than auto/discrete, ``kernel`` "sketch" or "traced", ``subset``)."""
    if o["predictor"] != "auto":
        return o["predictor"]
    if o.get("subset") is not None:
        return "linear"
    # (a fresh user's --kernel traced ran the head-aware predictor, which has no traced form)
    linear_only = resolve_method(o["method"]) != "discrete" or o["kernel"] != "exact"
    return "linear" if linear_only else "head_aware"


def _check_predictor_options(o: dict[str, Any], method: str) -> None:
    if o["predictor"] not in PREDICTORS:
        raise ValueError(f"predictor (--predictor) must be one of {PREDICTORS}, got "
                         f"{o['predictor']!r}.")
    if o["backbone"] is not None and o["backbone"] not in BACKBONES:  # None: the default
        raise ValueError(f"backbone (--backbone) must be one of {BACKBONES}, got "
                         f"{o['backbone']!r}.")
    seg, steps = o["segments"], o["steps"]
    if not _is_int(seg) or seg < 1 or (_is_int(steps) and seg > steps):
        raise ValueError(f"segments (--segments) must be an integer in [1, steps], got "
                         f"{seg!r}.")
    if o["predictor"] == "head_aware" and (method != "discrete" or o["kernel"] != "exact"):
        got = " and ".join(g for g, bad in ((f"method {o['method']!r}", method != "discrete"),
                                            (f"kernel {o['kernel']!r}", o["kernel"] != "exact"))
                           if bad)  # only what is wrong (naming 'exact' beside it misled)
        raise ValueError(f"the head-aware predictor (--predictor head_aware) uses the exact "
                         f"discrete recursion and the exact logit-summed kernel, got {got}; "
                         "use --predictor linear for other methods, a traced kernel or a "
                         "sketch.")
    if resolve_predictor(o) == "linear" and (seg != 1 or o["backbone"] is not None
                                             or o["subspace_dim"] is not None):
        given = [f for f, on in ((f"--segments {seg}", seg != 1),
                                 (f"--backbone {o['backbone']}", o["backbone"] is not None),
                                 (f"--subspace-dim {o['subspace_dim']}",
                                  o["subspace_dim"] is not None))
                 if on]
        why = ("--predictor linear" if o["predictor"] == "linear" else "--subset"
               if o.get("subset") is not None else f"--method {o['method']}"
               if method != "discrete" else f"--kernel {o['kernel']}")
        verb = "applies" if len(given) == 1 else "apply"
        raise ValueError(f"{' and '.join(given)} {verb} to the head-aware predictor only, and "
                         f"{why} selects the linear predictor (only it has that option): drop "
                         f"{' and '.join(given)}, or drop {why}.")
    check_default_subspace_dim(o["subspace_dim"], o["backbone"], seg)
    check_subspace_dim(o["subspace_dim"], o["backbone"] or default_backbone(seg))
    if o["backbone"] in ("subspace", "diagonal") and seg != 1:
        raise ValueError(f"backbone (--backbone) {o['backbone']} is not re-linearised (its "
                         "feature basis would change at every segment): drop --segments, or "
                         "use --backbone isotropic, kronecker or exact.")


DEFAULT_ISOTROPIC_K = (
    "subspace_dim (--subspace-dim) sets the k of the diagonal and subspace feature kernels, "
    "which are not re-linearised; with segments > 1 (--segments) the default feature kernel "
    "is the isotropic one: drop subspace_dim, or drop segments.")


def check_default_subspace_dim(subspace_dim, backbone, segments) -> None:
    """ValueError for ``subspace_dim`` given with the default backbone where that default is
    the isotropic kernel (``segments`` > 1): :data:`DEFAULT_ISOTROPIC_K`."""
    if subspace_dim is not None and backbone is None \
            and default_backbone(segments) == "isotropic":
        raise ValueError(DEFAULT_ISOTROPIC_K)


def check_no_subspace_dim(subspace_dim) -> None:
    """ValueError for a ``subspace_dim`` given to the linear predictor (it has no feature
    kernel: the default backbone's k would be silently unused)."""
    if subspace_dim is not None:
        raise ValueError("subspace_dim sets the k of the head-aware predictor's subspace / "
                         "diagonal feature kernel; the linear predictor (predictor='linear', "
                         "or no head=) has none: drop subspace_dim, or pass "
                         "head=ntk_tt.split_head(model).")


def check_subspace_dim(subspace_dim, backbone: str = "subspace",
                       head_kernel=None) -> int | None:
    """``subspace_dim`` as an int k (None: ``SUBSPACE_DIM`` for the subspace backbone,
    ``DIAGONAL_DIM`` for the diagonal one, None for another), for ``backbone`` (the ``predict``
    / ``ntk-tt predict --subspace-dim`` / ``head_aware_kernel`` check: k sets the
    ``"subspace"`` and ``"diagonal"`` kernels only, and a given ``head_kernel`` has its own).

    Raises:
      ValueError: k not an int >= 1; k given with another backbone or with a head_kernel.
    """
    if subspace_dim is None:
        return {"subspace": SUBSPACE_DIM, "diagonal": DIAGONAL_DIM}.get(backbone)
    if not _is_int(subspace_dim) or subspace_dim < 1:
        raise ValueError(f"subspace_dim (--subspace-dim) must be an int >= 1 (feature "
                         f"directions), got {subspace_dim!r}.")
    if head_kernel is not None:  # first: choosing the subspace backbone would not help
        raise ValueError("subspace_dim sets the k of a subspace kernel built by predict; the "
                         "head_kernel given was built with its own k (head_aware_kernel(..., "
                         "subspace_dim=k)): drop subspace_dim.")
    if backbone not in ("subspace", "diagonal"):
        raise ValueError(f"subspace_dim (--subspace-dim) sets the k of the subspace and "
                         f"diagonal backbones (backbone='subspace' or 'diagonal', --backbone) "
                         f"only, got backbone {backbone!r}: drop it, or choose one of those.")
    return int(subspace_dim)
