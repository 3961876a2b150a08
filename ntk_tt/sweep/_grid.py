"""The benchmark grid: tasks × optimiser configurations (paper Sec. 5, App. B; METHOD.md §8).

A *task* is one draw of K classes × n images per class from a target set (its seed also fixes
the new head's initialisation and the SGD batch order). A *configuration* is an optimiser
setting applied to every task: batch size B (``None`` = gradient descent), momentum m and a
learning rate given either as an effective κ or as a fixed η.

Learning rates by κ. A fixed η is a different regime on each task, so the main axis is the
*effective* κ̃ = η·λ_max(Θ) / (N·(1 − m)), with λ_max the top eigenvalue of the empirical NTK Θ
of the task (mean-loss convention, so GD on the linear MSE model is stable for κ < 2). The
learning rate actually used is η = κ̃·N·(1 − m)/λ_max: configurations with the same κ̃ and
different m form the paper's equal-effective-learning-rate pairs (Sec. 3.1, Fig. 2).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import numbers
import re
from collections import Counter
from pathlib import Path

from ntk_tt._options import DECAY_RANGE, FLOAT32_MAX, FLOAT32_TINY, is_decay
from ntk_tt._output_paths import is_dataset_path


def dataset_tag(name: str) -> str:
    """The dataset's part of task and row ids (file names in the sweep folder).

    A short name (``flowers5``) is used as is. A file path (ends in ``.npz`` or holds a path
    separator, as in :func:`ntk_tt.load_dataset`) gives its file stem reduced to
    ``[A-Za-z0-9_.-]`` without leading dots, plus 8 hex digits of the SHA-1 of the resolved
    path, so two files of the same name in different folders get different ids.
    """
    if not is_dataset_path(name):
        return name
    path = Path(name).resolve()
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem).lstrip(".") or "dataset"
    return f"{stem}-{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_positive(name: str, values, what: str = "κ̃ values, or η for etas") -> None:
    """Refuse learning rates (κ̃ or η, ``what`` they are) that are not finite numbers > 0
    within float32's normal range (``FLOAT32_TINY`` .. ``FLOAT32_MAX``: 1e-50 is 0 in float32,
    1e39 inf).

    Raises:
      ValueError: naming ``name`` and the values.
    """
    if any(isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v)
           or not FLOAT32_TINY <= v <= FLOAT32_MAX for v in values):
        raise ValueError(f"{name} must be finite numbers > 0 ({what}) in "
                         f"[{FLOAT32_TINY:.8g}, {FLOAT32_MAX:.8g}] (float32's normal range), "
                         f"got {tuple(values)}; give positive values.")


def check_batch_sizes(name: str, values) -> None:
    """Refuse batch sizes that are neither None (full batch, GD) nor integers >= 1.

    Raises:
      ValueError: naming ``name`` and the values.
    """
    if any(b is not None and (not _is_int(b) or b < 1) for b in values):
        raise ValueError(f"{name} must be integers >= 1 or None (N: full batch), got "
                         f"{tuple(values)}.")


def _label(value) -> str:
    """A grid value as a row id spells it: N for None (full batch), floats with :g."""
    if value is None:
        return "N"
    return str(value) if _is_int(value) else f"{value:g}"


def check_distinct(name: str, values) -> None:
    """Refuse grid values that give the same row name (a row id spells a float with :g, to 6
    significant digits, and a batch size None as N): the second would be the first's row again.

    Raises:
      ValueError: naming ``name``, the values and the two that collide.
    """
    seen: dict = {}
    for value in values:
        label = _label(value)
        if label in seen:
            digits = " to 6 significant digits" if isinstance(value, float) else ""
            first, second = (_label(v) if v is None else repr(v) for v in (seen[label], value))
            clash = (f"{first} is given twice" if first == second else
                     f"{first} and {second} both give {label!r}")
            raise ValueError(f"{name} must be distinct{digits} (they name the rows), got "
                             f"{tuple(values)}: {clash}; give each value once.")
        seen[label] = value


@dataclasses.dataclass(frozen=True)
class Task:
    """One fine-tuning problem: ``classes`` random classes × ``per_class`` training images."""

    dataset: str
    per_class: int
    seed: int
    classes: int = 5

    @property
    def num_train(self) -> int:
        """N, the number of training samples."""
        return self.classes * self.per_class

    @property
    def id(self) -> str:
        """``<dataset tag>-k<K>-n<n>-s<seed>``; see :func:`dataset_tag`."""
        return f"{dataset_tag(self.dataset)}-k{self.classes}-n{self.per_class}-s{self.seed}"


@dataclasses.dataclass(frozen=True)
class Config:
    """One optimiser setting; ``lr_kind`` is ``"kappa"`` (effective κ̃) or ``"eta"`` (fixed η)."""

    batch_size: int | None
    momentum: float
    lr_kind: str
    lr_value: float

    @property
    def optimizer(self) -> str:
        return "gd" if self.batch_size is None else "sgd"

    @property
    def id(self) -> str:
        b = "N" if self.batch_size is None else str(self.batch_size)
        return f"b{b}-m{self.momentum:g}-{self.lr_kind}{self.lr_value:g}"

    def learning_rate(self, lambda_max: float, num_train: int) -> float:
        """η for a task whose empirical NTK has top eigenvalue ``lambda_max`` (mean loss)."""
        if self.lr_kind == "eta":
            return float(self.lr_value)
        return float(self.lr_value) * num_train * (1.0 - self.momentum) / float(lambda_max)


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """The whole grid; every field is a command-line choice in ``experiments/sweep.py``.

    ``sketch_dims`` lists sketch dimensions D' whose sketched-kernel predictions are recorded
    next to the exact-kernel ones (sketch vs exact agreement in the summary). ``noise_dim`` > 0
    also records the continuous-time predictions (ODE for GD, SDE for SGD with noise features
    of that sketch dimension). ``num_paths``: minibatch orders (discrete SGD) or Brownian paths
    (SDE) averaged by a stochastic prediction.

    Edge rows (the divergence benchmark, README "Benchmark sweep"): every (B, m, κ̃) in
    ``edge_batch_sizes`` (None: ``batch_sizes``) × ``edge_momenta`` × ``edge_kappas`` that the
    main grid lacks, on the tasks of N ≤ ``edge_max_train`` (None: every task).

    Raises:
      ValueError: an empty required tuple or no learning rate at all; a sketch dimension < 1;
        a κ̃ or η (``kappas``,
        ``etas``, ``edge_kappas``) not a finite number > 0; a batch size not None or an
        integer >= 1; ``per_class`` not integers >= 1; ``seeds`` not integers in [0, 2³²);
        ``steps`` < 1; a momentum outside
        [0, 1); an ε outside (0, 1); two values of a grid field that give the same row name
        (:func:`check_distinct`: ``per_class``, ``seeds``, batch sizes, momenta, κ̃, η,
        ``sketch_dims``). A batch size that no task runs is refused by the sweep, not here
        (:func:`check_batch_below_n`).
    """

    datasets: tuple[str, ...]
    per_class: tuple[int, ...]
    seeds: tuple[int, ...]
    batch_sizes: tuple[int | None, ...] = (None, 50, 100)
    momenta: tuple[float, ...] = (0.0, 0.9)
    kappas: tuple[float, ...] = (1.0, 4.0, 12.0)
    etas: tuple[float, ...] = ()
    steps: int = 150
    classes: int = 5
    epsilons: tuple[float, ...] = (0.01, 0.1, 0.4)
    sketch_dims: tuple[int, ...] = ()
    noise_dim: int = 0
    num_paths: int = 16
    checkpoint: str | None = None
    edge_kappas: tuple[float, ...] = ()
    edge_max_train: int | None = None
    edge_momenta: tuple[float, ...] = (0.0,)
    edge_batch_sizes: tuple[int | None, ...] | None = None

    def __post_init__(self):
        for name in ("datasets", "per_class", "seeds", "batch_sizes", "momenta", "epsilons"):
            if len(getattr(self, name)) == 0:
                raise ValueError(f"{_field(name)} is empty; give at least one value.")
        if not self.kappas and not self.etas:
            raise ValueError("SweepSpec needs learning rates: give kappas (--kappas) and/or "
                             "etas (--etas).")
        if self.steps < 1:
            raise ValueError(f"{_field('steps')} must be >= 1, got {self.steps}.")
        for name in ("kappas", "etas", "edge_kappas"):
            check_positive(_field(name), getattr(self, name))
        check_batch_sizes(_field("batch_sizes"), self.batch_sizes)
        check_batch_sizes(_field("edge_batch_sizes"), self.edge_batch_sizes or ())
        if any(not _is_int(d) or d < 1 for d in self.sketch_dims):
            raise ValueError(f"{_field('sketch_dims')} must be integers >= 1 (sketch "
                             f"dimensions D'), got {self.sketch_dims}.")
        if not _is_int(self.noise_dim) or self.noise_dim < 0:
            raise ValueError(f"SweepSpec.noise_dim must be an integer >= 0 (the SGD noise "
                             f"sketch's D'; 0: none), got {self.noise_dim!r}.")
        if any(not _is_int(n) or n < 1 for n in self.per_class):
            raise ValueError(f"{_field('per_class')} must be integers >= 1 (images per class), "
                             f"got {self.per_class}.")
        if any(not _is_int(s) or not 0 <= s < 2**32 for s in self.seeds):
            raise ValueError(f"{_field('seeds')} must be integers in [0, 2**32) (they "
                             f"pick the images and the batch order; jax.random.key(2**32) is "
                             f"key(0)), got {self.seeds}.")
        for name in ("momenta", "edge_momenta"):
            if not all(is_decay(m) for m in getattr(self, name)):
                raise ValueError(f"{_field(name)} must lie in {DECAY_RANGE}, got "
                                 f"{getattr(self, name)}.")
        if self.edge_kappas and not self.edge_momenta:
            raise ValueError(f"{_field('edge_momenta')} is empty; give at least one value "
                             "(0.0).")
        if self.edge_batch_sizes is not None and not self.edge_batch_sizes:
            raise ValueError(f"{_field('edge_batch_sizes')} is empty; give None (= batch_sizes) "
                             "or at least one value.")
        if any(not 0.0 < e < 1.0 for e in self.epsilons):
            raise ValueError(f"SweepSpec.epsilons must lie in (0, 1), got {self.epsilons}.")
        for name in _NAMED_ROWS:
            check_distinct(_field(name), getattr(self, name) or ())

    def tasks(self) -> list[Task]:
        """Tasks in run order: dataset size first (in ``per_class`` order), then target set."""
        return [
            Task(d, n, s, self.classes)
            for n, d, s in itertools.product(self.per_class, self.datasets, self.seeds)
        ]

    def configs(self) -> list[Config]:
        lrs = [("kappa", k) for k in self.kappas] + [("eta", e) for e in self.etas]
        grid = [
            Config(b, m, kind, value)
            for b, m, (kind, value) in itertools.product(self.batch_sizes, self.momenta, lrs)
        ]
        return grid + self.edge_configs()

    def edge_configs(self) -> list[Config]:
        """The divergence benchmark's configurations not already in the main grid."""
        lrs = [("kappa", k) for k in self.kappas] + [("eta", e) for e in self.etas]
        # by row name: an edge κ̃ equal to a main one to 6 significant digits is that row
        grid = {Config(b, m, kind, value).id for b, m, (kind, value)
                in itertools.product(self.batch_sizes, self.momenta, lrs)}
        sizes = self.batch_sizes if self.edge_batch_sizes is None else self.edge_batch_sizes
        configs = (Config(b, m, "kappa", k)
                   for b, m, k in itertools.product(sizes, self.edge_momenta, self.edge_kappas))
        return [c for c in configs if c.id not in grid]


# the fields whose values name rows (Task.id, Config.id) or variants (sketch{D'})
def _field(name: str) -> str:
    """``SweepSpec.<name>`` and, where ``experiments/sweep.py`` has one, its flag."""
    flag = (f" (--{name.replace('_', '-')})" if name in (*_NAMED_ROWS, "datasets", "steps",
                                                         "checkpoint") else "")
    return f"SweepSpec.{name}{flag}"


_NAMED_ROWS = ("per_class", "seeds", "batch_sizes", "momenta", "kappas", "etas", "edge_kappas",
               "edge_momenta", "edge_batch_sizes", "sketch_dims")


def check_batch_below_n(spec: SweepSpec) -> None:
    """Refuse a minibatch size B that no task runs: B ≥ N = ``classes`` × the largest
    ``per_class`` (:func:`plan` skips B ≥ N, B = N being GD again and B > N impossible, so it
    would give no row). A grid whose B is below N on some tasks only keeps its skipped rows.

    Raises:
      ValueError: naming the flag, B and N.
    """
    n = spec.classes * max(spec.per_class)
    sizes = [("batch_sizes", spec.batch_sizes)]
    if spec.edge_kappas:
        sizes.append(("edge_batch_sizes", spec.edge_batch_sizes or ()))
    for name, values in sizes:
        big = [b for b in values if b is not None and b >= n]
        if big:
            raise ValueError(
                f"{_field(name)} B = {big[0]} is not below "
                f"N = {n} (classes × per_class = {spec.classes} × {max(spec.per_class)}, the "
                f"largest task), so no task would run it (B >= N is skipped: B = N is GD, "
                f"B > N impossible); give B < {n}, or N for gradient descent.")


def row_id(task: Task, config: Config) -> str:
    """The results-table key of one (task, configuration, seed) row."""
    return f"{task.id}__{config.id}"


def plan(spec: SweepSpec) -> tuple[list[tuple[Task, list[Config]]], Counter]:
    """The runnable (task, configurations) pairs and the count of skipped rows by reason.

    SGD with B ≥ N is skipped: B > N is impossible, and B = N draws the whole set every step,
    which is gradient descent again (it would duplicate the GD row under an SGD label).
    """
    skipped: Counter = Counter()
    out = []
    edge = set(spec.edge_configs())
    for task in spec.tasks():
        keep = []
        for config in spec.configs():
            b = config.batch_size
            if config in edge and spec.edge_max_train is not None \
                    and task.num_train > spec.edge_max_train:
                skipped["edge κ̃ on a task above edge_max_train"] += 1
            elif b is not None and b > task.num_train:
                skipped["batch_size > N"] += 1
            elif b is not None and b == task.num_train:
                skipped["batch_size == N (same as GD)"] += 1
            else:
                keep.append(config)
        out.append((task, keep))
    return out, skipped


def spec_to_dict(spec: SweepSpec) -> dict:
    """A JSON-ready dict of the grid (stored as ``spec.json`` beside the results)."""
    return dataclasses.asdict(spec)


def spec_from_dict(data: dict) -> SweepSpec:
    """Inverse of :func:`spec_to_dict`."""
    return SweepSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})
