"""Session set-up for a suite that fits in 10 minutes on CI's 2 cores (issue 25).

* Cheaper XLA compilation. Most of the suite's time is compiling programs that then run on
  tiny inputs. The first ``pytest_configure`` (the controller under pytest-xdist, or the only
  process with ``-n0``) adds ``FAST_COMPILE`` to ``XLA_FLAGS`` in the environment that the
  workers and every subprocess (CLI, sweep, GPU check) inherit; a flag the user set wins:

  - ``--xla_backend_optimization_level=0``: the CPU backend's LLVM code generation without
    optimisation passes. Programs compile about twice as fast and run slower, which halves
    ``tests/test_sketch.py`` (66 → 28 s) and cuts ``test_e2e.py`` + ``test_patches.py``
    80 → 62 s here.
  - ``--xla_cpu_use_fusion_emitters=false``: fused loops emitted by XLA:CPU's LLVM IR
    emitters instead of its newer MLIR fusion emitters, whose pipeline costs more per
    program than the tiny programs here run. Back to back on a loaded machine, CPU seconds
    of one file in one process (``-n0``): test_head_aware 119 → 72,
    test_suggest 89 → 46, test_optimizer_api 78 → 37, test_notebooks 97 → 55, test_cli
    117 → 80, test_corpus 80 → 55, test_gpu_check 73 → 54.
  - ``--xla_cpu_parallel_codegen_split_count=1``: one LLVM module per program, not split for
    parallel code generation (on 2 busy cores the split only adds work): a further ~8 %
    (test_suggest 42.7/40.5 → 38.8/36.6 s, test_head_aware 48.2/51.4 → 44.0/48.5 s).

  The HLO programs, and so what every test computes, are the same (float32 tanh, exp,
  log1p, sin, softmax and logsumexp outputs checked: equal bit for bit). (A persistent
  compilation cache shared by the workers was tried too: it saved little, and jax 0.10.2
  segfaulted writing an entry; ``--xla_llvm_disable_expensive_passes`` and single-threaded
  Eigen gave nothing.)
* One OpenBLAS thread per process (``OPENBLAS_NUM_THREADS=1`` unless you set it), inherited
  by the workers and subprocesses: two workers each spinning one OpenBLAS thread per core
  on 2 cores only contend (the tests' matrices are tiny). Measured one file alone, ``-n0``:
  test_e2e 24 → 13 s, test_corpus 40 → 29–34 s.
* The slowest files first. pytest-xdist's ``--dist loadfile`` hands files to the two
  workers in queue order, so a slow file queued last would run alone at the end.
  ``SLOW_FIRST`` (seconds per file measured with the flags above, ``-n0``, slowest first)
  is collected before the rest, which keep their order, and ``pytest_configure`` turns off
  xdist's own reordering (``--loadscope-reorder``, on by default in pytest-xdist 3.8: files
  with the most tests first, which queued test_sweep.py, the longest file, 18th of 42, and
  test_notebooks.py, test_corpus.py, test_gpu_check.py, test_e2e.py 32nd to 41st).
"""

import os

SLOW_FIRST = ("test_sweep.py", "test_cli.py", "test_notebooks.py", "test_corpus.py",
              "test_gpu_check.py", "test_head_aware.py", "test_optimizers.py", "test_suggest.py",
              "test_e2e.py", "test_optimizer_api.py", "test_ntk.py", "test_finetune.py",
              "test_optimizer_sweep.py", "test_subset.py", "test_checkpoint.py",
              "test_predict.py", "test_sde.py", "test_telemetry.py", "test_divergence.py",
              "test_outcome.py", "test_cli_optimizer.py", "test_whatif.py", "test_dtypes.py",
              "test_patches.py", "test_sketch.py", "test_whatif_optimizer.py",
              "test_sharding.py", "test_suggest_optimizer.py", "test_segments_optimizer.py",
              "test_subset_optimizer.py", "test_cli_method_optimizer.py", "test_cli_advice.py",
              "test_segments_divergence.py", "test_spectrum_optimizer.py")


FAST_COMPILE = {"xla_backend_optimization_level": "0", "xla_cpu_use_fusion_emitters": "false",
                "xla_cpu_parallel_codegen_split_count": "1"}


def pytest_configure(config):
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    flags = os.environ.get("XLA_FLAGS", "").split()
    flags += [f"--{name}={value}" for name, value in FAST_COMPILE.items()
              if not any(f.startswith(f"--{name}=") for f in flags)]
    os.environ["XLA_FLAGS"] = " ".join(flags)
    if hasattr(config.option, "loadscopereorder"):  # keep SLOW_FIRST's order under xdist
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), order[id(item)]))
