"""Large N on a GPU (issue 26 item 5): the head-aware predictor with the isotropic feature kernel
(``ntk_tt.predict``'s default until session 34; the diagonal default's per-logit blocks are
contracted on the host, not yet checked at this scale) against real fine-tunes, one JSON.

    bash experiments/gpu_check.sh                       # on a GPU machine (sets up, then this)
    python experiments/gpu_check.py --out X.json        # the work alone: N = 10,000 notMNIST
    python experiments/gpu_check.py --tiny --data flowers5 --classes 5 --out /tmp/t.json  # CPU

Task: the shipped checkpoint with a fresh seeded K-output head and K classes × n images of
notMNIST (default all 10 × 1,000: N = 10,000, no held-out split), resized to the model's
32×32 RGB input (``ntk_tt.prediction._job.load_task``: the task of ``ntk-tt predict
--dataset notmnist -K 10 -n 1000 --test-per-class 0 --seed s``). Cross-entropy, T = ``--steps``.

Stages, each timed with JAX compilation apart (``Stopwatch``) and recorded in the JSON as it
ends, so the file always holds what was done; a failing stage is recorded (its error and
traceback tail) and the stages that need it are skipped:

* ``load``: checkpoint, data, task, images.
* ``kernel``: the head-aware isotropic predictor's kernel
  ``ntk_tt.head_aware_kernel(split_head(model), x)``: the logit-summed N × N empirical NTK,
  the backbone features and k_b; ``kernel_repeat``: the same again for a steady time when it
  costs under a tenth of the budget left. Peak device memory (``memory_stats``
  ``peak_bytes_in_use``, cumulative, so the kernel's is read after it: it runs first) and the
  host's peak RSS during the stage (``experiments/_rss.py``) per stage.
* ``lambda``: λ_max of the head-aware Θ_0 (``initial_eigenvalues``, as the telemetry corpus);
  η = κ̃·N·(1 − m)/λ_max with κ̃ = ``--kappa`` (the sweep's effective learning rate; m = 0),
  or ``--lr``.
* GD row: ``gd_step_time`` (``ntk_tt.step_time``, which compiles the training step the
  fine-tune reuses), ``gd_predict`` (``ntk_tt.predict_head_aware`` on that kernel: what
  ``ntk_tt.predict(..., head=split)`` computes, without building the kernel twice),
  ``gd_finetune`` (``ntk_tt.finetune``), compared by ``ntk_tt.compare``.
* ``gd_sweep``: ``--sweep`` K GD learning rates (η × geomspace(0.25, 2, K)) in one
  ``jit(vmap(predict_head_aware))`` on the kernel; ``sweep.ratio`` = K × the GD fine-tune's
  seconds / (kernel + λ_max + the sweep's solves), compilation excluded on both sides.
* SGD row (B = ``--sgd-batch``, same η and key for the batch order): ``sgd_predict``
  (``--num-paths`` orders), ``sgd_finetune``.

Budget guard (``--budget`` seconds from the start): GD's T is cut to what fits (recorded in
``steps_used``) when the measured step time says the fine-tune would not; the SGD row is
skipped when its estimate (from the GD step time) does not fit. The prediction's cost per row
is kernel + λ_max + that row's solve; ``seconds.ratio`` = fine-tune training steps / it.
Exit status: 0 complete (a row skipped for the budget included), 1 a stage failed, 2 bad
input (one ``gpu_check.py: error:`` line: options and a missing data file before any work and
with no JSON written, a dataset or task that ``load_task`` refuses after the JSON records it),
143 SIGTERM (recorded in the JSON, the process ended at once).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import signal
import sys
import time
import traceback
from pathlib import Path

from ntk_tt._options_source import SHARED_FILES, VENDORED_FILES

HERE = Path(__file__).resolve().parent
NOTMNIST = "notmnist_sample_test.npz"
FULL = dict(per_class=1000, steps=150, sgd_batch=100, num_paths=32, budget=450.0, repeat=True,
            sweep=32)
TINY_N = 20  # --tiny: about 20 images (K × n), seconds on a CPU
TINY = dict(steps=20, sgd_batch=10, num_paths=4, budget=300.0, repeat=False, sweep=4)
SWEEP_SPAN = (0.25, 2.0)  # the sweep's η: the row's η times geomspace over this span
EPS_HEADLINE = (0.1, 0.4)
TINY_XLA_FLAGS = "--xla_backend_optimization_level=0"
EVAL_FACTOR = 1.5  # a recorded fine-tune step (training step + full-set evaluation) vs a bare one


def _fail(msg: str) -> None:
    sys.stderr.write(f"gpu_check.py: error: {msg}\n")
    raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the JSON to write (refused if it exists)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    p.add_argument("--data", default=None,
                   help=f"dataset: short name (e.g. flowers5) or .npz path; default notMNIST: "
                        f"experiments/data/{NOTMNIST}, then $NTK_TT_DATA_DIR, then ../shared/data")
    p.add_argument("--tiny", action="store_true",
                   help=f"about {TINY_N} images, T = {TINY['steps']}, B = {TINY['sgd_batch']}, "
                        f"XLA_FLAGS={TINY_XLA_FLAGS} unless set: a CPU smoke run (the test "
                        "suite's)")
    p.add_argument("-K", "--classes", type=int, default=10)
    p.add_argument("-n", "--per-class", type=int, default=None,
                   help=f"images per class (default {FULL['per_class']}; --tiny {TINY_N}/K)")
    p.add_argument("-T", "--steps", type=int, default=None, help=f"default {FULL['steps']}")
    p.add_argument("--kappa", type=float, default=4.0,
                   help="effective learning rate κ̃ = η·λ_max/(N(1 − m)) of both rows")
    p.add_argument("--lr", type=float, default=None, help="a fixed η instead of --kappa")
    p.add_argument("--sgd-batch", type=int, default=None,
                   help=f"SGD row's B (default {FULL['sgd_batch']}); 0: no SGD row")
    p.add_argument("--num-paths", type=int, default=None,
                   help=f"SGD batch orders predicted (default {FULL['num_paths']})")
    p.add_argument("--sweep", type=int, default=None,
                   help=f"GD learning rates predicted in one jit(vmap) on the kernel, for a "
                        f"sweep's cost (default {FULL['sweep']}, --tiny {TINY['sweep']}); 0: none")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", type=float, default=None,
                   help=f"seconds for the whole run (default {FULL['budget']:.0f})")
    p.add_argument("--repeat", action=argparse.BooleanOptionalAction, default=None,
                   help="time the kernel a second time (default: yes, no with --tiny)")
    return p


def resolve_data(arg: str | None) -> str:
    """The dataset to load: ``arg`` as given, else the first notMNIST file found."""
    if arg:
        if arg.endswith(".npz") and not Path(arg).is_file():
            _fail(f"--data {arg}: no such file.")
        names = {**VENDORED_FILES, **SHARED_FILES}  # JAX-free: a short name, known before work
        if not arg.endswith(".npz") and "/" not in arg and arg not in names:
            _fail(f"--data {arg}: unknown dataset; the short names are {', '.join(names)}, or "
                  "pass an .npz file.")
        return arg
    env = os.environ.get("NTK_TT_DATA_DIR")
    places = [HERE / "data", *([Path(env)] if env else []), HERE.parents[1] / "shared" / "data"]
    for place in places:
        if (place / NOTMNIST).is_file():
            return str(place / NOTMNIST)
    _fail(f"{NOTMNIST} not found in {', '.join(map(str, places))}; run `bash "
          "experiments/gpu_check.sh --prepare` where ../shared/data exists (it copies the file "
          "into experiments/data/), or pass --data PATH.")


def parse(argv=None) -> argparse.Namespace:
    """Options with the full / tiny defaults filled in; bad values end in one error line."""
    a = _parser().parse_args(argv)
    preset = dict(FULL, per_class=max(1, TINY_N // max(a.classes, 1))) | TINY \
        if a.tiny else FULL
    for name, value in preset.items():
        if getattr(a, name) is None:
            setattr(a, name, value)
    n = a.classes * a.per_class
    checks = [(a.classes >= 2, f"--classes must be >= 2, got {a.classes}"),
              (a.per_class >= 1, f"--per-class must be >= 1, got {a.per_class}"),
              (a.steps >= 1, f"--steps must be >= 1, got {a.steps}"),
              (math.isfinite(a.kappa) and a.kappa > 0,  # inf ran 12 s to 4 failed stages
               f"--kappa must be a finite number > 0, got {a.kappa}"),
              (a.lr is None or (math.isfinite(a.lr) and a.lr > 0),
               f"--lr must be a finite number > 0, got {a.lr}"),
              (0 <= a.sgd_batch < n, f"--sgd-batch must be in [1, N = {n}) or 0 (no SGD row), "
                                     f"got {a.sgd_batch}"),
              (a.num_paths >= 1, f"--num-paths must be >= 1, got {a.num_paths}"),
              (a.sweep >= 0, f"--sweep must be >= 0, got {a.sweep}"),
              (math.isfinite(a.budget) and a.budget > 0,
               f"--budget must be a finite number > 0 of seconds, got {a.budget}")]
    for ok, msg in checks:
        if not ok:
            _fail(msg + ".")
    out = Path(a.out)
    if out.exists() and not a.overwrite:
        _fail(f"--out {out} exists; pass --overwrite to replace it, or another path.")
    if not out.parent.is_dir():
        _fail(f"--out {out}: folder {out.parent} does not exist.")
    a.data = resolve_data(a.data)
    return a


class Recorder:
    """The JSON record, rewritten atomically after every stage; runs and times the stages."""

    def __init__(self, path: Path, deadline: float, record: dict):
        self.path, self.deadline, self.rec = path, deadline, record
        self.current = None

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def write(self) -> None:
        from ntk_tt.prediction._job import _plain

        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(_plain(self.rec), indent=1))
        os.replace(tmp, self.path)

    def ok(self, name: str) -> bool:
        return self.rec["stages"].get(name, {}).get("status") == "ok"

    def skip(self, name: str, why: str) -> None:
        self.rec["stages"][name] = {"status": f"skipped: {why}"}
        print(f"{name}: skipped: {why}", flush=True)
        self.write()

    def stage(self, name: str, fn, needs=()):
        """Run ``fn()`` as stage ``name`` (skipped when a stage in ``needs`` is not ok);
        its output, or None when it failed or was skipped."""
        import jax
        from _rss import PeakRSS

        from ntk_tt.training._timing import Stopwatch

        missing = [s for s in needs if not self.ok(s)]
        if missing:
            self.skip(name, f"needs {', '.join(missing)}")
            return None
        self.current = name
        self.rec["status"] = f"running: {name}"
        self.write()
        st = self.rec["stages"][name] = {"status": "running"}
        t0, out = time.perf_counter(), None
        with PeakRSS() as m:
            try:
                with Stopwatch() as sw:
                    out = jax.block_until_ready(fn())
                st.update(status="ok", seconds=sw.seconds, compile_seconds=sw.compile_seconds)
            except Exception as err:
                text = str(err).strip().splitlines()
                st.update(status=f"failed: {type(err).__name__}: {text[0] if text else ''}",
                          traceback=traceback.format_exc().splitlines()[-8:])
            except BaseException:  # SIGTERM, Ctrl-C: main records it and ends the process
                st.update(status="interrupted", wall_seconds=time.perf_counter() - t0)
                raise
        st.update(wall_seconds=time.perf_counter() - t0, host_peak_rss_mib=m.peak_mib,
                  host_rss_delta_mib=m.delta_mib, device_memory=device_memory())
        self.current = None
        print(f"{name}: {st['status']} ({st['wall_seconds']:.1f} s wall)", flush=True)
        self.write()
        return out


def device_memory() -> dict | None:
    """Device 0's allocator statistics in bytes (None where JAX gives none, e.g. CPU)."""
    import jax

    try:
        stats = jax.local_devices()[0].memory_stats()
    except Exception:  # a backend without allocator statistics
        stats = None
    if not stats:
        return None
    return {k: int(stats[k]) for k in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit",
                                       "largest_alloc_size") if k in stats}


def environment() -> dict:
    """Device, versions and the settings that shape memory and speed."""
    import jax

    from ntk_tt.kernels._memory import MEMORY_ENV

    dev = jax.local_devices()[0]
    env = {"platform": dev.platform, "device_kind": dev.device_kind,
           "device_count": jax.local_device_count(), "python": platform.python_version(),
           "machine": platform.machine(), "cpu_count": os.cpu_count(),
           "jax_default_matmul_precision": getattr(jax.config, "jax_default_matmul_precision",
                                                   None),
           "env": {k: os.environ.get(k) for k in (
               "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_FLAGS",
               MEMORY_ENV, "JAX_ENABLE_X64")}}
    stats = device_memory()
    if stats and stats.get("bytes_limit") and not os.environ.get(MEMORY_ENV):
        # the kernel planner reads host memory by default: plan within the device's instead
        limit = int(0.9 * (stats["bytes_limit"] - stats.get("bytes_in_use", 0)))
        os.environ[MEMORY_ENV] = str(limit)
        env["ntk_memory_limit_set"] = limit
    return env


def packages() -> dict:
    """{distribution: version} of the third-party packages this run imported."""
    from importlib.metadata import packages_distributions, version

    dists = packages_distributions()
    top = {m.split(".")[0] for m in list(sys.modules)} - set(sys.stdlib_module_names)
    out = {}
    for mod in sorted(top):
        for dist in dists.get(mod, []):
            out[dist] = version(dist)
    return dict(sorted(out.items()))


def headline(report: dict) -> dict:
    """T_ε predicted / real / relative error of the loss and error curves at ε ∈ {0.1, 0.4},
    the loss-curve distance and the cost ratio, from ``ntk_tt.compare``'s report."""
    out = {}
    for curve in ("loss", "error"):
        out[curve] = {str(e): {"predicted": report["predicted"]["training_time"][curve][e],
                               "real": report["real"]["training_time"][curve][e],
                               "rel_error": report["relative_error"][curve][e]}
                      for e in EPS_HEADLINE}
    dist = report["curve_distance"]
    out["loss_curve_max_rel_to_fall"] = None if dist is None else dist["loss"]["max_rel_to_fall"]
    out["seconds_predict"] = report["seconds"]["predict"]
    out["seconds_finetune"] = report["seconds"]["finetune"]
    out["cost_ratio_finetune_over_predict"] = report["seconds"]["ratio"]
    return out


def _g(v) -> str:
    return "n/a" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def summary(rec: dict) -> str:
    """A few lines for the log: device, kernel cost, each row's T_ε and cost ratio."""
    env, k = rec.get("environment", {}), rec.get("kernel", {})
    mem = (k.get("device_memory_after") or {}).get("peak_bytes_in_use")
    lines = [f"device {env.get('device_kind')} ({env.get('platform')}), N = {k.get('n')}; "
             f"kernel {_g(k.get('seconds'))} s (again {_g(k.get('seconds_repeat'))} s; "
             f"compile {_g(k.get('compile_seconds'))} s), device peak "
             f"{_g(None if mem is None else mem / 2**30)} GiB, host peak RSS "
             f"{_g(k.get('host_peak_rss_mib'))} MiB; η = {_g(rec.get('learning_rate'))}, "
             f"κ̃ = {_g(rec.get('kappa_eff'))}"]
    for name, row in rec.get("rows", {}).items():
        h = row.get("headline")
        if h is None:
            lines.append(f"{name}: incomplete (see stages)")
            continue
        t = "; ".join(f"{c} T_{e} {_g(v['predicted'])}/{_g(v['real'])}"
                      for c in ("loss", "error") for e, v in h[c].items())
        lines.append(f"{name} (B = {row['batch_size']}, T = {row['steps']}): predicted/real "
                     f"{t}; loss curve max |Δ|/fall {_g(h['loss_curve_max_rel_to_fall'])}; "
                     f"fine-tune/predict {_g(h['cost_ratio_finetune_over_predict'])}")
    sw = rec.get("sweep")
    if sw:
        lines.append(f"sweep of {sw['configs']} GD learning rates: kernel + λ_max "
                     f"{_g(sw['kernel_and_lambda_seconds'])} s + solves {_g(sw['solve_seconds'])}"
                     f" s against {sw['configs']} × {_g(sw['finetune_seconds_each'])} s of "
                     f"fine-tuning: {_g(sw['ratio'])}× cheaper")
    return "\n".join(lines)


def _row(r: Recorder, name: str, hk, y, apply_fn, params, x, key, *, lr, steps, batch,
         num_paths, pre_seconds: float) -> None:
    """Predict one configuration on the shared kernel, fine-tune it for real, compare."""
    import ntk_tt
    from ntk_tt.dynamics._predict_head_aware import predict_head_aware
    from ntk_tt.prediction._result import _to_prediction

    n = int(x.shape[0])
    out = r.stage(f"{name}_predict", lambda: predict_head_aware(
        hk, y, learning_rate=lr, steps=steps, batch_size=batch, key=key,
        num_paths=num_paths))
    run = r.stage(f"{name}_finetune", lambda: ntk_tt.finetune(
        apply_fn, params, x, y, learning_rate=lr, steps=steps, batch_size=batch, key=key))
    row = r.rec["rows"][name] = {"batch_size": n if batch is None else batch, "steps": steps,
                                 "learning_rate": lr}
    if out is not None:
        st = r.rec["stages"][f"{name}_predict"]
        seconds = {"kernel": pre_seconds, "noise": 0.0, "solve": st["seconds"],
                   "compile": st["compile_seconds"], "total": pre_seconds + st["seconds"]}
        hyper = {"learning_rate": lr, "momentum": 0.0, "nesterov": False,
                 "batch_size": n if batch is None else batch, "steps": steps, "num_train": n,
                 "loss": "cross_entropy"}
        pred = _to_prediction(out, "discrete", "head_aware:isotropic", hyper, seconds)
        row["predicted_curves"] = {"loss": pred.loss, "error": pred.error,
                                   "loss_band": pred.loss_band}
        row["predicted_training_time"] = pred.training_time
        row["kappa"] = pred.kappa
    if run is not None:
        row["real_curves"] = {"loss": run.loss, "error": run.error}
        row["real_seconds"] = run.seconds | {"per_step": run.seconds_per_step}
    if out is not None and run is not None:
        report = ntk_tt.compare(pred, run)
        row["compare"] = {k: v for k, v in report.items() if k != "linearisation_gap"}
        row["headline"] = headline(report)
    r.write()


def _sweep(r: Recorder, hk, y, *, lr, steps, k, pre_seconds: float) -> None:
    """A sweep's cost: ``k`` GD learning rates (the row's η × geomspace(SWEEP_SPAN)) predicted
    in one ``jit(vmap)`` on the shared kernel, against ``k`` fine-tunes at the GD row's
    measured cost (compilation excluded on both sides, as the CPU sweep's ``wall_time``)."""
    import jax
    import jax.numpy as jnp

    from ntk_tt.dynamics._predict_head_aware import predict_head_aware

    lrs = lr * jnp.geomspace(*SWEEP_SPAN, k)  # (k,); T_ε (k, 2, 3): loss/error × ε
    fn = jax.jit(jax.vmap(lambda e: predict_head_aware(hk, y, learning_rate=e,
                                                       steps=steps).training_time))
    out = r.stage("gd_sweep", lambda: fn(lrs), needs=("gd_predict",))
    if out is None:
        return
    st, tune = r.rec["stages"]["gd_sweep"], r.rec["stages"].get("gd_finetune", {})
    real = r.rec["rows"]["gd"].get("real_seconds", {}).get("finetune")
    r.rec["sweep"] = {
        "configs": k, "learning_rates": [float(e) for e in lrs], "steps": steps,
        "solve_seconds": st["seconds"],
        "compile_seconds": st["compile_seconds"], "kernel_and_lambda_seconds": pre_seconds,
        "predict_seconds": pre_seconds + st["seconds"],
        "finetune_seconds_each": real, "finetune_stage_ok": tune.get("status") == "ok",
        "ratio": None if real is None else k * real / (pre_seconds + st["seconds"]),
        "training_time": [[[float(v) for v in c] for c in cfg] for cfg in out]}
    r.write()


def work(a: argparse.Namespace, r: Recorder) -> None:
    import jax

    from ntk_tt.dynamics._predict_head_aware import initial_eigenvalues
    from ntk_tt.kernels._head_aware import head_aware_kernel
    from ntk_tt.prediction._job import load_task

    rec = r.rec
    rec["environment"] = r.stage("environment", environment) or {}
    task = r.stage("load", lambda: load_task(
        dataset=a.data, num_classes=a.classes, per_class=a.per_class, test_per_class=0,
        seed=a.seed))
    if task is None:
        return
    apply_fn, params, x, y, _, _, info, split = task
    n = int(x.shape[0])
    rec["task"] = info
    rec["kernel"] = {"n": n, "traced_kernel_bytes": n * n * 4}
    hk = r.stage("kernel", lambda: head_aware_kernel(split, x, backbone="isotropic"))
    wall = rec["stages"]["kernel"].get("wall_seconds", 0.0)
    if hk is not None and a.repeat and wall < 0.1 * r.left():
        r.stage("kernel_repeat", lambda: head_aware_kernel(split, x, backbone="isotropic"))
    elif hk is not None and a.repeat:
        r.skip("kernel_repeat", f"the first call took {wall:.0f} s, over a tenth of the "
                                f"{r.left():.0f} s left")
    lams = r.stage("lambda", lambda: initial_eigenvalues(hk), needs=("kernel",))
    if lams is None:
        return
    lam_min, lam_max = (float(v) for v in lams)
    lr = a.kappa * n / lam_max if a.lr is None else a.lr
    key = jax.random.fold_in(jax.random.key(a.seed), 2)
    pre = rec["stages"]["kernel"]["seconds"] + rec["stages"]["lambda"]["seconds"]
    rec["kernel"] |= {"seconds": rec["stages"]["kernel"]["seconds"],
                      "seconds_repeat": rec["stages"].get("kernel_repeat", {}).get("seconds"),
                      "compile_seconds": rec["stages"]["kernel"]["compile_seconds"],
                      "device_memory_after": rec["stages"]["kernel"]["device_memory"],
                      "host_peak_rss_mib": rec["stages"]["kernel"]["host_peak_rss_mib"],
                      "lambda_max": lam_max, "lambda_min": lam_min,
                      "lambda_seconds": rec["stages"]["lambda"]["seconds"]}
    rec |= {"learning_rate": lr, "kappa_eff": lr * lam_max / n, "rows": {}}

    import ntk_tt

    sps = r.stage("gd_step_time", lambda: ntk_tt.step_time(apply_fn, params, x, y,
                                                           learning_rate=lr, key=key))
    steps = a.steps
    if sps is not None:  # budget: what a recorded fine-tune of T steps costs, with a margin
        fit = int((r.left() - 30.0) / (EVAL_FACTOR * sps))
        if fit < steps:
            steps = max(1, fit)
            rec["steps_cut"] = (f"T = {a.steps} cut to {steps}: a step takes {sps:.3g} s and "
                                f"{r.left():.0f} s of the budget were left")
    rec["steps_used"] = steps
    _row(r, "gd", hk, y, apply_fn, params, x, key, lr=lr, steps=steps, batch=None,
         num_paths=1, pre_seconds=pre)
    if a.sweep:
        _sweep(r, hk, y, lr=lr, steps=steps, k=a.sweep, pre_seconds=pre)
    if not a.sgd_batch:
        return
    # an SGD step = a B-sample training step + the full-set evaluation (~1/3 of a GD step),
    # plus compiling both; estimated from the GD row
    gd = rec["stages"].get("gd_finetune", {})
    per_step = (sps or 0.0) * (a.sgd_batch / n + 1 / 3) * EVAL_FACTOR
    est = steps * per_step + 2 * gd.get("compile_seconds", 0.0) \
        + 2 * rec["stages"].get("gd_predict", {}).get("wall_seconds", 0.0)
    if est > r.left():
        r.skip("sgd_predict", f"the SGD row would take about {est:.0f} s, {r.left():.0f} s "
                              "of the budget left")
        r.skip("sgd_finetune", "budget (see sgd_predict)")
        return
    _row(r, "sgd", hk, y, apply_fn, params, x, key, lr=lr, steps=steps, batch=a.sgd_batch,
         num_paths=a.num_paths, pre_seconds=pre)


def main(argv=None) -> int:
    t_start = time.perf_counter()
    a = parse(argv)
    if a.tiny:  # compiling is most of a tiny run: XLA's backend optimisation off (-30 % CPU)
        os.environ.setdefault("XLA_FLAGS", TINY_XLA_FLAGS)
    sys.path.insert(0, str(HERE))  # experiments/_rss.py
    n = a.classes * a.per_class
    rec = {"schema": "gpu_check/1", "status": "starting", "issue": "26 item 5",
           "config": {"data": a.data, "classes": a.classes, "per_class": a.per_class, "n": n,
                      "steps": a.steps, "kappa_eff": a.kappa if a.lr is None else None,
                      "lr": a.lr, "momentum": 0.0,
                      "sgd_batch": a.sgd_batch or None, "num_paths": a.num_paths,
                      "seed": a.seed, "budget_seconds": a.budget, "tiny": a.tiny,
                      "predictor": "head_aware:isotropic (the default until session 34)",
                      "loss": "cross_entropy"},
           "stages": {}}
    r = Recorder(Path(a.out), t_start + a.budget, rec)

    def on_term(signum, frame):
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, on_term)
    code = 0
    try:
        work(a, r)
        failed = [s for s, v in rec["stages"].items() if v["status"].startswith("failed")]
        rec["status"] = "complete" if not failed else f"finished; failed stages: {failed}"
        code = 1 if failed else 0
    except Exception as err:  # outside any stage (a comparison, the record): keep the JSON
        rec["status"] = f"failed outside a stage: {type(err).__name__}: {err}"
        rec["traceback"] = traceback.format_exc().splitlines()[-8:]
        code = 1
    except (SystemExit, KeyboardInterrupt) as err:
        code = err.code if isinstance(err, SystemExit) else 130
        rec["status"] = f"terminated (signal) during {r.current or 'set-up'}"
    finally:
        rec["seconds_total_wall"] = time.perf_counter() - t_start
        rec["process_peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        rec["device_memory_final"] = device_memory()
        try:
            rec["environment"] = rec.get("environment", {}) | {"packages": packages()}
        except Exception as err:  # a broken distribution's metadata: say so, keep the JSON
            rec["environment"] = rec.get("environment", {}) | {"packages": repr(err)}
        r.write()
        print(summary(rec), flush=True)
        print(f"gpu_check.py: {rec['status']}; {a.out} ({rec['seconds_total_wall']:.0f} s)",
              flush=True)
    if rec["status"].startswith("terminated"):
        os._exit(code)  # at once: XLA may still be compiling on other threads
    load = rec["stages"].get("load", {})
    if load.get("status", "").startswith("failed: ValueError"):
        sys.stderr.write(f"gpu_check.py: error: {load['status'][len('failed: ValueError: '):]}\n")
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
