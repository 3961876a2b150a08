"""The optimiser benchmark (issue 27 item 5): schedules, weight decay and AdamW, predicted
against real fine-tunes on the sweep's tasks.

Two families of the optimisers people fine-tune with, each with the warmup-cosine schedule
(linear warmup over ``warmup_fraction``·T steps to the peak, cosine decay to 0 at T):

* ``sgdm_cosine``: SGD with heavy-ball momentum m, decoupled weight decay λ (SGDW); the peak
  η is set from an effective κ̃ = η_peak·λ_max/(N(1 − m)) as the constant-η sweep sets η
  (λ_max of the head-aware Θ_0);
* ``adamw_cosine``: AdamW (β = 0.9, 0.999, ε = 1e-8) at fixed peak learning rates.

Each (task, family, peak, λ, B) is one row: ``ntk_tt.predict(..., optimizer=opt, head=...)``
(the head-aware predictor, isotropic backbone unless ``backbone``; the kernels built once per
task and passed as ``head_kernel``; the Adam kernel once per batch size, or rescaled from
another batch size's where they share its reference profile, ``ntk_tt.adam_kernel_for_batch``;
the isotropic kernel only where it predicts or sets η; an AdamW row's ``lambda_max`` and
``kappa`` are those of its prediction's Θ_0) against
``ntk_tt.finetune(..., optimizer=opt)`` with the same key, so both see the same schedule and
batch order. The tasks are the constant-η sweep's (:func:`ntk_tt.sweep._load.load_task`: the
same classes, images and head for the same (dataset, n, seed)), so the two compare on equal
tasks. Rows are written one at a time (:class:`ntk_tt.sweep.ResultsTable`): an interrupted
run resumes where it stopped. ``reuse`` (:func:`reusable_real`) takes the real curves of an
earlier run's identical rows, so that only the predictions are recomputed (fine-tunes are
deterministic given the task, optimiser and key), and times their training steps again
(``ntk_tt.step_time`` × steps) beside the predictions.
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
import warnings
from typing import NamedTuple

import jax
import numpy as np

import ntk_tt
from ntk_tt._options import DECAY_RANGE, is_decay
from ntk_tt.dynamics._adam_batch import shares_reference
from ntk_tt.dynamics._predict_head_aware import initial_eigenvalues_once
from ntk_tt.dynamics._regime import LinearRegimeWarning
from ntk_tt.sweep._grid import SweepSpec, Task, check_batch_sizes, check_distinct, check_positive
from ntk_tt.sweep._load import _task_key, load_task
from ntk_tt.sweep._table import ResultsTable, read_rows, read_table
from ntk_tt.sweep._targets import target_columns

FAMILIES = ("sgdm_cosine", "adamw_cosine")
BENCH_BACKBONES = ("isotropic", "subspace", "diagonal")  # the predictions' feature kernel


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """One row's optimiser: ``family`` (:data:`FAMILIES`), ``peak`` (κ̃ for sgdm_cosine, the
    peak η for adamw_cosine), ``weight_decay`` λ and ``batch_size`` (None: full batch)."""

    family: str
    peak: float
    weight_decay: float
    batch_size: int | None

    @property
    def id(self) -> str:
        """e.g. ``adamw_cosine-p0.0003-wd0.01-bN``."""
        b = "N" if self.batch_size is None else self.batch_size
        return f"{self.family}-p{self.peak:g}-wd{self.weight_decay:g}-b{b}"


@dataclasses.dataclass(frozen=True)
class OptimSpec:
    """The benchmark grid: tasks (datasets × per_class × seeds, K = ``classes``) × families
    (``families``, a subset of :data:`FAMILIES`, run in that order) × peaks × weight decays ×
    batch sizes (B ≥ N skipped), T = ``steps``. ``backbone``: the head-aware feature kernel
    of the predictions, "isotropic" (the committed tables' default; ``predict``'s default
    is "diagonal" since sessions 34 / 35), "subspace" (k = 16) or "diagonal" (k = 5), both
    families alike (Adam's K_P in the same form on the same basis); SGD-momentum's κ̃ is set
    from the isotropic kernel's λ_max either way, so the real runs are the same.

    Raises:
      ValueError: empty ``datasets``, ``per_class``, ``seeds`` or ``families``, or a family
        not in :data:`FAMILIES`; ``backbone`` not in :data:`BENCH_BACKBONES`; a peak
        (``sgd_kappas``, ``adam_peaks``) not a finite number > 0; a weight decay not finite
        and >= 0; a batch size not None or an integer >= 1; ``per_class`` < 2; ``steps`` <
        1; ``sgd_momentum`` outside [0, 1); ``warmup_fraction`` outside [0, 1]; an ε outside
        (0, 1).
    """

    datasets: tuple[str, ...]
    per_class: tuple[int, ...]
    seeds: tuple[int, ...] = (0,)
    batch_sizes: tuple[int | None, ...] = (None, 50)
    steps: int = 150
    classes: int = 5
    warmup_fraction: float = 0.1
    sgd_kappas: tuple[float, ...] = (1.0, 4.0, 12.0)
    sgd_momentum: float = 0.9
    sgd_decays: tuple[float, ...] = (0.0, 5e-4)
    adam_peaks: tuple[float, ...] = (1e-4, 3e-4, 1e-3)
    adam_decays: tuple[float, ...] = (0.01, 0.1)
    epsilons: tuple[float, ...] = (0.01, 0.1, 0.4)
    num_paths: int = 8
    checkpoint: str | None = None
    families: tuple[str, ...] = FAMILIES
    backbone: str = "isotropic"

    def __post_init__(self):
        for name in ("datasets", "per_class", "seeds", "families"):
            if len(getattr(self, name)) == 0:
                raise ValueError(f"OptimSpec.{name} is empty; give at least one value.")
        if any(f not in FAMILIES for f in self.families):
            raise ValueError(f"OptimSpec.families must be among {FAMILIES}, got "
                             f"{self.families}.")
        if self.backbone not in BENCH_BACKBONES:
            raise ValueError(f"OptimSpec.backbone must be one of {BENCH_BACKBONES}, got "
                             f"{self.backbone!r}.")
        if any(n < 2 for n in self.per_class):
            raise ValueError(f"OptimSpec.per_class must be integers >= 2, got {self.per_class}.")
        if self.steps < 1:
            raise ValueError(f"OptimSpec.steps must be >= 1, got {self.steps}.")
        for name, what in (("sgd_kappas", "κ̃ values"), ("adam_peaks", "peak learning rates")):
            check_positive(f"OptimSpec.{name}", getattr(self, name), what)
        for name in ("sgd_decays", "adam_decays"):
            if any(not np.isfinite(wd) or wd < 0 for wd in getattr(self, name)):
                raise ValueError(f"OptimSpec.{name} must be finite weight decays >= 0, got "
                                 f"{getattr(self, name)}.")
        for name in ("sgd_kappas", "adam_peaks", "sgd_decays", "adam_decays"):
            # a row id names each value with :g (OptimConfig.id)
            check_distinct(f"OptimSpec.{name}", tuple(float(v) for v in getattr(self, name)))
        # a size named twice names its tasks twice (a data set twice: check_datasets, which
        # also knows two names of one file)
        check_distinct("OptimSpec.per_class", self.per_class)
        check_batch_sizes("OptimSpec.batch_sizes", self.batch_sizes)
        if not is_decay(self.sgd_momentum):
            raise ValueError(f"OptimSpec.sgd_momentum must lie in {DECAY_RANGE}, got "
                             f"{self.sgd_momentum}.")
        if not 0.0 <= self.warmup_fraction <= 1.0:
            raise ValueError(f"OptimSpec.warmup_fraction must lie in [0, 1], got "
                             f"{self.warmup_fraction}.")
        if any(not 0.0 < e < 1.0 for e in self.epsilons):
            raise ValueError(f"OptimSpec.epsilons must lie in (0, 1), got {self.epsilons}.")

    def tasks(self) -> list[Task]:
        """Every task of the grid, in order."""
        return [Task(d, n, s, self.classes) for d in self.datasets for n in self.per_class
                for s in self.seeds]

    def configs(self, task: Task) -> list[OptimConfig]:
        """The task's rows (minibatch sizes B ≥ N are skipped: the same as GD or impossible)."""
        sizes = [b for b in self.batch_sizes if b is None or b < task.num_train]
        grids = {"sgdm_cosine": (self.sgd_kappas, self.sgd_decays),
                 "adamw_cosine": (self.adam_peaks, self.adam_decays)}
        return [OptimConfig(f, p, wd, b) for f in self.families for b in sizes
                for p in grids[f][0] for wd in grids[f][1]]

    def optimizer(self, cfg: OptimConfig, lam_max: float, n: int) -> ntk_tt.Optimizer:
        """The :class:`ntk_tt.Optimizer` of ``cfg`` (λ_max of Θ_0, N for the κ̃ → η map)."""
        warmup = round(self.warmup_fraction * self.steps)
        if cfg.family == "sgdm_cosine":
            m = self.sgd_momentum
            peak = cfg.peak * n * (1.0 - m) / lam_max
            return ntk_tt.sgd(ntk_tt.warmup_cosine(peak, warmup, self.steps), m,
                              weight_decay=cfg.weight_decay, batch_size=cfg.batch_size)
        return ntk_tt.adamw(ntk_tt.warmup_cosine(cfg.peak, warmup, self.steps),
                            weight_decay=cfg.weight_decay, batch_size=cfg.batch_size)


def row_id(task: Task, cfg: OptimConfig) -> str:
    """The results-table key of one (task, optimiser) row."""
    return f"{task.id}__{cfg.id}"


def _timed(fn):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - t0


_WARMED: set = set()


def _kernel_times(build, key) -> tuple:
    """(kernel, seconds as this process paid them, seconds without compilation). The first
    build of a ``key`` (kernel kind, feature function, input shape) compiles: it is timed,
    then built again warm (the programs are reused by every later build of the key: the
    constant sweep's rule, compilation apart on both sides); later builds are timed once."""
    if key in _WARMED:
        out, seconds = _timed(build)
        return out, seconds, seconds
    _, cold = _timed(build)
    _WARMED.add(key)
    out, warm = _timed(build)
    return out, cold, warm


def _adam_kernel(data, opt, hk, backbone: str, shape, built) -> tuple:
    """(AdamKernel for ``opt``, seconds, seconds without compilation): an earlier batch
    size's kernel rescaled where they share K_P's reference profile
    (``ntk_tt.adam_kernel_for_batch``), else built (:func:`_kernel_times`)."""
    for ak in built:
        if shares_reference(ak, opt.batch_size):
            out, seconds = _timed(lambda a=ak: ntk_tt.adam_kernel_for_batch(a, opt.batch_size))
            return out, seconds, seconds
    return _kernel_times(lambda: ntk_tt.adam_head_aware_kernel(
        data.split, data.x, data.y, opt, hk=hk, backbone=backbone), ("adam", *shape))


def _retimed(run: RealRun, data, opt, steps: int, key) -> RealRun:
    """A reused, finite run with ``seconds["finetune"]`` = ``ntk_tt.step_time`` × ``steps``
    measured in this process (``finetune``'s own rule: warm steps × steps taken), so that the
    cost ratio compares seconds taken side by side (a GD step at N = 750 timed 1.36 s in
    session 37 where the committed table had recorded 0.35-0.45 s); the earlier table's
    figure is kept as ``seconds["recorded"]``."""
    per_step = ntk_tt.step_time(data.apply_fn, data.params, data.x, data.y, optimizer=opt,
                                key=key)
    return run._replace(seconds={"finetune": per_step * steps,
                                 "recorded": run.seconds["finetune"]})


def _curve_times(curve, eps_list, diverged: bool) -> dict:
    """T_ε of one curve (``ntk_tt.training_time``: steps, NaN where undefined or diverged)."""
    out = {}
    for eps in eps_list:
        t = np.nan if diverged else float(ntk_tt.training_time(np.asarray(curve), eps))
        out[eps] = t if t >= 0 else np.nan
    return out


class RealRun(NamedTuple):
    """A real run read back from an earlier table: loss and error curves (T + 1,), diverged,
    ``seconds`` = {"finetune": training seconds} (the fields of ``ntk_tt.finetune`` a row
    uses)."""

    loss: np.ndarray
    error: np.ndarray
    diverged: bool
    seconds: dict


def reusable_real(out) -> dict[str, dict]:
    """The rows of an earlier optimiser benchmark directory ``out``, by row id: ``out/rows/``
    (one JSON file per row) where it holds any, else ``out/results.parquet``.

    Raises:
      ValueError: ``out`` holds neither, or rows of another kind (a constant-η sweep's, no
        ``family``: it reused nothing, silently); give a directory written by
        optimizer_sweep.py.
    """
    records = read_rows(pathlib.Path(out) / "rows")  # a damaged row file is named
    if not records and (pathlib.Path(out) / "results.parquet").exists():
        records = read_table(out).to_dict("records")
    elif not records:
        raise ValueError(f"{out} holds no rows/*.json and no results.parquet: give a directory "
                         "written by experiments/optimizer_sweep.py --out.")
    if any("family" not in r for r in records):
        raise ValueError(f"{out} holds rows without an optimiser family (a constant-η "
                         "sweep's, whose real runs no row here repeats): give a directory "
                         "written by experiments/optimizer_sweep.py --out.")
    return {r["row_id"]: r for r in records}


def _reused(row: dict | None, opt, spec: OptimSpec) -> RealRun | None:
    """The earlier row's real run if it is the same training (T, peak η to 1e-5, λ), else
    None (that row is fine-tuned again)."""
    if row is None or row.get("steps") != spec.steps \
            or len(row["real_loss"]) != spec.steps + 1:
        return None
    peak = float(np.max(np.asarray(opt.learning_rates(spec.steps))))
    if not np.isclose(row["peak_learning_rate"], peak, rtol=1e-5, atol=0.0) \
            or not np.isclose(row["weight_decay"], float(opt.weight_decay), rtol=1e-5):
        return None
    return RealRun(np.asarray(row["real_loss"], float), np.asarray(row["real_error"], float),
                   bool(row["real_diverged"]), {"finetune": float(row["seconds_finetune"])})


def run_task(task: Task, spec: OptimSpec, table: ResultsTable, *, progress=None,
             reuse: dict | None = None) -> int:
    """Predict and fine-tune every row of ``task`` not yet in ``table``; returns how many rows
    were written. ``progress``: a callable given each finished row id (or None). ``reuse``:
    earlier rows by id (:func:`reusable_real`); a row of the same training supplies the real
    curves instead of a fine-tune (``real_source`` "reused"), and its training steps are timed
    again here (``finetune_timing`` "retimed": :func:`_retimed`; "recorded" for a diverged
    one, whose steps taken are not known; "run" for a row fine-tuned here)."""
    done = table.done_ids()
    left = [c for c in spec.configs(task) if row_id(task, c) not in done]
    if not left:
        return 0
    data = load_task(task, SweepSpec(datasets=(task.dataset,), per_class=(task.per_class,),
                                     seeds=(task.seed,), checkpoint=spec.checkpoint))
    n, key = task.num_train, _task_key(task)
    shape = (id(data.split[0]), data.x.shape)
    kernel_seconds = warm_seconds = 0.0
    lams = {}  # λ_max by family: the isotropic kernel's sets κ̃ (η) of SGD-momentum
    sgd_kernel = None
    if spec.backbone == "isotropic" or any(c.family == "sgdm_cosine" for c in left):
        sgd_kernel, kernel_seconds, warm_seconds = _kernel_times(
            lambda: ntk_tt.head_aware_kernel(data.split, data.x), ("head_aware", *shape))
        lams["sgdm_cosine"] = float(initial_eigenvalues_once(sgd_kernel)[1])
    if spec.backbone != "isotropic":  # timed once: its projected features compile anew
        sgd_kernel, seconds = _timed(lambda: ntk_tt.head_aware_kernel(data.split, data.x,
                                                                     backbone=spec.backbone))
        kernel_seconds, warm_seconds = kernel_seconds + seconds, warm_seconds + seconds
    if any(c.family == "adamw_cosine" for c in left):  # Θ_0 of the prediction's own kernel
        (_, top), seconds = _timed(lambda: initial_eigenvalues_once(sgd_kernel))
        lams["adamw_cosine"] = float(top)  # (predict reads it back: no second factorisation)
        kernel_seconds, warm_seconds = kernel_seconds + seconds, warm_seconds + seconds
    adam_kernels: dict = {}
    for cfg in left:
        lam = lams[cfg.family]
        opt = spec.optimizer(cfg, lam, n)
        kernel = sgd_kernel
        if cfg.family == "adamw_cosine":
            if cfg.batch_size not in adam_kernels:
                built, s, w = _adam_kernel(data, opt, sgd_kernel, spec.backbone, shape,
                                           adam_kernels.values())
                adam_kernels[cfg.batch_size] = built
                kernel_seconds, warm_seconds = kernel_seconds + s, warm_seconds + w
            kernel = adam_kernels[cfg.batch_size]
        with warnings.catch_warnings():  # the row records ρ (weight_travel) instead
            warnings.simplefilter("ignore", LinearRegimeWarning)
            pred = ntk_tt.predict(data.apply_fn, data.params, data.x, data.y, optimizer=opt,
                                  steps=spec.steps, head=data.split, key=key,
                                  num_paths=spec.num_paths if cfg.batch_size else 1,
                                  head_kernel=kernel)
        run = _reused((reuse or {}).get(row_id(task, cfg)), opt, spec)
        source, timing = ("fine-tuned", "run") if run is None else ("reused", "recorded")
        if run is None:
            run = ntk_tt.finetune(data.apply_fn, data.params, data.x, data.y, optimizer=opt,
                                  steps=spec.steps, key=key)
        elif not run.diverged:  # its seconds measured now, beside the predictions
            run, timing = _retimed(run, data, opt, spec.steps, key), "retimed"
        table.write_row(_row(task, spec, cfg, opt, lam, pred, run, kernel_seconds)
                        | {"real_source": source, "task_seconds_kernel_warm": warm_seconds,
                           "finetune_timing": timing,
                           "seconds_finetune_recorded": run.seconds.get("recorded", np.nan)})
        if progress is not None:
            progress(row_id(task, cfg))
    return len(left)


def _row(task, spec, cfg, opt, lam, pred, run, kernel_seconds) -> dict:
    n = task.num_train
    peak = float(np.max(np.asarray(opt.learning_rates(spec.steps))))
    real_t = _curve_times(run.loss, spec.epsilons, run.diverged)
    pred_t = _curve_times(pred.loss, spec.epsilons, pred.diverged)
    row = {
        "row_id": row_id(task, cfg), "task_id": task.id, "dataset": task.dataset,
        "per_class": task.per_class, "seed": task.seed, "num_train": n,
        "num_classes": task.classes, "config_id": cfg.id, "family": cfg.family,
        "optimizer": "gd" if cfg.batch_size is None else "sgd",
        "batch_size": n if cfg.batch_size is None else cfg.batch_size,
        "peak_setting": cfg.peak, "peak_learning_rate": peak,
        "weight_decay": cfg.weight_decay, "momentum": float(opt.momentum),
        "warmup": round(spec.warmup_fraction * spec.steps), "steps": spec.steps,
        "lambda_max": lam, "kappa": peak * lam / n, "pred_method": "discrete",
        "pred_kernel": pred.kernel, "pred_outcome": pred.outcome,
        "real_diverged": bool(run.diverged), "pred_diverged": bool(pred.diverged),
        "real_loss": np.asarray(run.loss, float), "pred_loss": np.asarray(pred.loss, float),
        "real_error": np.asarray(run.error, float), "pred_error": np.asarray(pred.error, float),
        "real_loss_drop": float(1.0 - run.loss[-1] / run.loss[0]) if not run.diverged
        else np.nan,
        "seconds_predict": float(pred.seconds["total"]),
        "seconds_finetune": float(run.seconds["finetune"]),
        "task_seconds_kernel": float(kernel_seconds),
        # Adam's weight-travel bound ρ = Σ η_t / rms(θ_0) (NaN for SGD)
        "weight_travel": float(pred.hyperparameters.get("weight_travel", np.nan)),
    }
    for eps in spec.epsilons:
        row[f"real_T{eps:g}"], row[f"pred_T{eps:g}"] = real_t[eps], pred_t[eps]
    return row | target_columns(run.loss, pred.loss, run.diverged, pred.diverged,
                                run.error, pred.error)
