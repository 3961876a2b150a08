"""The telemetry corpus (issue 11, METHOD.md §9): real fine-tunes with telemetry, each with the
head-aware NTK prediction of the same run stored beside it.

A *task* is the sweep's (:class:`ntk_tt.sweep.Task`: K classes × n images of a target set,
its seed fixing classes, images and the fresh head) plus ``test_per_class`` held-out images
per class. A *run* is one optimiser configuration on a task: batch size B (None = GD),
momentum m, effective κ̃ = η·λ_max(Θ_0)/(N·(1 − m)) (λ_max of the head-aware model's initial
empirical NTK Θ_0, mean-loss convention) and a run seed fixing the SGD batch order (GD runs
have run seed 0 only). Every run is recorded by ``ntk_tt.finetune(..., telemetry=spec)`` and
predicted by ``ntk_tt.predict_head_aware`` with the same batch order (its path 0), before the
real run and from nothing but the pre-trained weights and the data.

Each finished run is one crash-safe JSON file ``runs/<run id>.json`` (written atomically), so
an interrupted generation (even ``kill -9``) resumes with the same command, skipping the runs
present and never writing one twice. :func:`ntk_tt.sweep._corpus_files.read_corpus` reads them
back.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import pathlib
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._options import DECAY_RANGE, _is_int, is_decay

CORPUS_VERSION = 1
EPSILONS = (0.01, 0.1, 0.4)


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
    """The corpus grid; every field is an option of ``experiments/telemetry_corpus.py``.

    ``batch_sizes[i]``, ``sgd_seeds[i]`` and ``task_seeds[i]`` belong to ``per_class[i]``: the
    batch sizes run at that task size (None = GD), the number of SGD batch orders (run seeds
    0, 1, …) each SGD configuration is run with, and how many of ``seeds`` (the first ones)
    that size's tasks use (None: all). ``snapshot_steps``: the telemetry snapshots
    (∩ [0, steps]), T = ``steps`` always among them (a shorter ``--steps`` than a preset's
    last snapshot left the run without its final snapshot).
    """

    datasets: tuple[str, ...]
    per_class: tuple[int, ...] = (10, 50)
    seeds: tuple[int, ...] = (0, 1, 2)
    batch_sizes: tuple[tuple[int | None, ...], ...] = ((None, 10), (25, 50))
    sgd_seeds: tuple[int, ...] = (3, 1)
    task_seeds: tuple[int, ...] | None = (3, 2)
    momenta: tuple[float, ...] = (0.0, 0.9)
    kappas: tuple[float, ...] = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0)
    steps: int = 40
    classes: int = 5
    test_per_class: int = 50
    snr_samples: int = 8
    snapshot_steps: tuple[int, ...] = (0, 1, 2, 4, 8, 20, 40)
    num_paths: int = 8
    checkpoint: str | None = None

    def __post_init__(self):
        sizes = (len(self.per_class), len(self.batch_sizes), len(self.sgd_seeds),
                 len(self.per_class if self.task_seeds is None else self.task_seeds))
        if len(set(sizes)) != 1:
            raise ValueError("per_class, batch_sizes, sgd_seeds and task_seeds must have equal "
                             f"lengths (one entry per task size), got {sizes}.")
        for name in ("datasets", "per_class", "seeds", "momenta", "kappas"):
            if not getattr(self, name):
                raise ValueError(f"CorpusSpec.{name} is empty; give at least one value.")
            if len(set(getattr(self, name))) != len(getattr(self, name)):
                raise ValueError(f"CorpusSpec.{name} names a value twice, got "
                                 f"{getattr(self, name)}; give each once (they name the runs).")
        if any(not _is_int(s) or not 0 <= s < 2**32 for s in self.seeds):
            raise ValueError(f"CorpusSpec.seeds must be integers in [0, 2**32) (jax.random."
                             f"key(2**32) is key(0): the same tasks again), got {self.seeds}.")
        if self.steps < 1:
            raise ValueError(f"CorpusSpec.steps must be >= 1, got {self.steps}.")
        if not all(is_decay(m) for m in self.momenta):
            raise ValueError(f"momenta must lie in {DECAY_RANGE}, got {self.momenta}.")
        if any(not (k > 0 and math.isfinite(k)) for k in self.kappas):
            raise ValueError(f"kappas must be finite and > 0, got {self.kappas}.")
        for n, bs in zip(self.per_class, self.batch_sizes, strict=True):
            for b in bs:
                if b is not None and not 1 <= b < n * self.classes:
                    raise ValueError(f"batch size {b} at {n} per class must be in [1, N) with "
                                     f"N = {n * self.classes}; use None for GD.")

    def tasks(self):
        """The sweep tasks, smallest first."""
        from ntk_tt.sweep._grid import Task

        counts = self.task_seeds or (len(self.seeds),) * len(self.per_class)
        return [Task(d, n, s, self.classes)
                for n, count in zip(self.per_class, counts, strict=True)
                for d, s in itertools.product(self.datasets, self.seeds[:count])]

    def runs(self, task) -> list[RunConfig]:
        """The task's runs, grouped by (batch size, run seed) in that order."""
        i = self.per_class.index(task.per_class)
        out = []
        for b in self.batch_sizes[i]:
            for r in range(1 if b is None else self.sgd_seeds[i]):
                out += [RunConfig(b, m, k, r)
                        for m, k in itertools.product(self.momenta, self.kappas)]
        return out


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One run's optimiser setting on a task: B (None = GD), m, effective κ̃, run seed."""

    batch_size: int | None
    momentum: float
    kappa: float
    run_seed: int

    @property
    def id(self) -> str:
        b = "N" if self.batch_size is None else str(self.batch_size)
        return f"b{b}-m{self.momentum:g}-k{self.kappa:g}-r{self.run_seed}"

    def learning_rate(self, lambda_max: float, num_train: int) -> float:
        """η = κ̃·N·(1 − m)/λ_max."""
        return self.kappa * num_train * (1.0 - self.momentum) / lambda_max


def run_id(task, cfg: RunConfig) -> str:
    """``<task id>__<run config id>``: the run's file name in ``runs/``."""
    return f"{task.id}__{cfg.id}"


def failed(test_accuracy: float | None, diverged: bool, num_classes: int) -> bool:
    """The corpus's failure label: diverged (``ntk_tt.dynamics._divergence``), or a final held-out
    accuracy below chance + 0.05 (1/C + 0.05: the run learnt nothing that transfers)."""
    acc = math.nan if test_accuracy is None else test_accuracy
    return bool(diverged) or not acc >= 1.0 / num_classes + 0.05


def _run_key(task, run_seed: int) -> jax.Array:
    """The SGD batch order of run seed r: shared by the real run and its prediction."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(task.seed), 7919), run_seed)


_FEATURES: dict = {}


def load_corpus_task(task, spec: CorpusSpec):
    """(apply_fn, params, x, y, x_test, y_test, split, telemetry features) of a task: the
    sweep's :func:`ntk_tt.sweep._load.load_task` data and fresh head, plus ``test_per_class``
    held-out images per class drawn with the training ones."""
    from flax import nnx

    from ntk_tt.data._data import prepare_images, sample_task
    from ntk_tt.kernels._head_aware import split_head
    from ntk_tt.models import replace_head
    from ntk_tt.sweep._load import _checkpoint, _dataset, _shared_apply

    model, meta = _checkpoint(spec.checkpoint)
    key = jax.random.key(task.seed)
    sampled = sample_task(_dataset(task.dataset), num_classes=task.classes,
                          per_class=task.per_class, test_per_class=spec.test_per_class,
                          key=jax.random.fold_in(key, 0))
    prep = dict(mean=np.asarray(meta["mean"]), std=np.asarray(meta["std"]))
    shape = tuple(meta["input_shape"])
    x = prepare_images(sampled.x_train, shape, **prep)
    xt = prepare_images(sampled.x_test, shape, **prep)
    module = replace_head(model, task.classes, key=jax.random.fold_in(key, 1))
    apply_fn, params = _shared_apply(module)
    graph = nnx.graphdef(module)
    feature_fn, bparams, w0, b0 = split_head(module)
    feature_fn = _FEATURES.setdefault(("split", graph), feature_fn)

    def features(p, xx):
        return feature_fn(nnx.State({k: v for k, v in p.items() if k != "head"}), xx)

    features = _FEATURES.setdefault(("telemetry", graph), features)
    return (apply_fn, params, jnp.asarray(x), jnp.asarray(sampled.y_train, jnp.int32),
            jnp.asarray(xt), jnp.asarray(sampled.y_test, jnp.int32),
            (feature_fn, bparams, w0, b0), features)


def _predict(hk, y, yt, key, lrs, moms, *, steps, batch_size, num_paths):
    """Head-aware predictions of G configurations (one compiled vmap): dict of numpy arrays."""
    import ntk_tt
    from ntk_tt.sweep._compile import _compiled

    def one(hk, y, yt, key, lr, m):
        p = ntk_tt.predict_head_aware(hk, y, learning_rate=lr, momentum=m, steps=steps,
                                      batch_size=batch_size, key=key, num_paths=num_paths,
                                      y_test=yt)
        return dict(loss=p.loss, error=p.error, test_loss=p.test_loss,
                    test_error=p.test_error, diverged=p.diverged, spiked_at=p.spiked_at,
                    kappa=p.kappa, beyond_edge=p.beyond_edge, training_time=p.training_time)

    fn = jax.vmap(one, in_axes=(None, None, None, None, 0, 0))
    args = (hk, y, yt, key, lrs, moms)
    exe, _ = _compiled(("corpus-predict", steps, batch_size, num_paths), fn, *args)
    t0 = time.perf_counter()
    out = jax.device_get(jax.block_until_ready(exe(*args)))
    return {k: np.asarray(v) for k, v in out.items()}, time.perf_counter() - t0


def run_corpus_task(task, spec: CorpusSpec, out: pathlib.Path, done: set[str], *,
                    progress: Callable[[str], None] = print) -> int:
    """Predict and fine-tune every run of ``task`` not in ``done``; one file per run.

    Returns the number of runs written.
    """
    import ntk_tt
    from ntk_tt.dynamics._fspace import top_eigenvalue
    from ntk_tt.dynamics._training_time import training_time_report
    from ntk_tt.kernels._head_aware import head_aware_kernel, initial_kernel
    from ntk_tt.sweep._table import _atomic_write, _jsonable

    left = [c for c in spec.runs(task) if run_id(task, c) not in done]
    if not left:
        return 0
    t0 = time.perf_counter()
    apply_fn, params, x, y, xt, yt, split, features = load_corpus_task(task, spec)
    n = x.shape[0]
    hk = head_aware_kernel(split, x, xt, backbone="isotropic")
    lam = float(top_eigenvalue(initial_kernel(hk)))
    seconds_kernel = time.perf_counter() - t0
    tspec = ntk_tt.TelemetrySpec(features=features, snr_samples=spec.snr_samples,
                                 snapshot_steps=(*spec.snapshot_steps, spec.steps))
    groups: dict = {}
    for c in left:
        groups.setdefault((c.batch_size, c.run_seed), []).append(c)
    written = 0
    for (b, r), cfgs in groups.items():
        key = _run_key(task, r)
        lrs = jnp.asarray([c.learning_rate(lam, n) for c in cfgs], jnp.float32)
        moms = jnp.asarray([c.momentum for c in cfgs], jnp.float32)
        pred, sec_pred = _predict(hk, y, yt, key, lrs, moms, steps=spec.steps, batch_size=b,
                                  num_paths=1 if b is None else spec.num_paths)
        for i, c in enumerate(cfgs):
            lr = float(lrs[i])
            run = ntk_tt.finetune(apply_fn, params, x, y, learning_rate=lr, steps=spec.steps,
                                  batch_size=b, momentum=c.momentum, key=key, x_test=xt,
                                  y_test=yt, telemetry=tspec)
            row = {
                "corpus_version": CORPUS_VERSION, "run_id": run_id(task, c),
                "task_id": task.id, "dataset": task.dataset, "per_class": task.per_class,
                "task_seed": task.seed, "num_train": n, "num_classes": task.classes,
                "num_test": int(xt.shape[0]), "config_id": c.id,
                "batch_size": n if b is None else b, "optimizer": "gd" if b is None else "sgd",
                "momentum": c.momentum, "kappa_eff": c.kappa, "run_seed": r,
                "learning_rate": lr, "lambda_max": lam, "steps": spec.steps,
                "telemetry": run.telemetry.to_dict(),
                "prediction": {k: v[i] for k, v in pred.items()} | {
                    "method": "head_aware:isotropic", "seconds_kernel": seconds_kernel,
                    "seconds_solve": sec_pred / len(cfgs),
                    "num_paths": 1 if b is None else spec.num_paths},
                "outcome": {
                    "test_accuracy": run.test_accuracy, "diverged": run.diverged,
                    "spiked_at": run.spiked_at, "final_loss": float(run.loss[-1]),
                    "failed": failed(run.test_accuracy, run.diverged, task.classes),
                    "training_time": {f"{e:g}": training_time_report(run.loss, e)[0]
                                      for e in EPSILONS}},
                "seconds": {k: float(v) for k, v in run.seconds.items()},
            }
            _atomic_write(out / f"{row['run_id']}.json",
                          json.dumps(_jsonable(row), allow_nan=False).encode())
            written += 1
        progress(f"{task.id}: B={b or 'N'} r{r}: {len(cfgs)} runs "
                 f"({time.perf_counter() - t0:.0f} s)")
    return written


def run_corpus(spec: CorpusSpec, out, *, progress: Callable[[str], None] = print) -> dict:
    """Generate (or resume) the corpus into ``out/runs``; ``out/spec.json`` records the grid,
    ``out/invocations.json`` each invocation's seconds, runs written and whether it finished
    (rewritten after every group of runs, so an interrupted one is kept, unfinished).

    Raises:
      ValueError: ``out`` holds a corpus of a different grid or a damaged run file
        (:func:`check_corpus_resume`), before any work.
    """
    from ntk_tt.sweep._corpus_files import _grid, check_corpus_resume

    out = pathlib.Path(out)
    check_corpus_resume(spec, out)
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(_grid(spec), indent=1))
    t0 = time.perf_counter()
    done = {p.stem for p in runs.glob("*.json")}
    present = sum(run_id(t, c) in done for t in spec.tasks() for c in spec.runs(t))
    log = out / "invocations.json"
    calls = json.loads(log.read_text()) if log.exists() else []
    mine = len(calls)

    def record(finished: bool) -> None:  # rewritten as it goes: a stopped invocation counts
        new = sum(p.stem not in done for p in runs.glob("*.json"))
        calls[mine:] = [{"seconds": time.perf_counter() - t0, "runs_written": new,
                         "finished": finished}]
        log.write_text(json.dumps(calls, indent=1))

    def noted(message: str) -> None:
        progress(message)
        record(False)

    record(False)
    try:
        written = sum(run_corpus_task(t, spec, runs, done, progress=noted)
                      for t in spec.tasks())
    except BaseException:  # Ctrl-C / SIGTERM (a KeyboardInterrupt here) or an error
        record(False)
        raise
    record(True)
    return {"written": written, "already_present": present}
