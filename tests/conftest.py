"""Session set-up for a suite that fits in 10 minutes on CI's 2 cores (issue 25).

* Cheaper XLA compilation. Most of the suite's time is compiling programs that then run on
  tiny inputs. The first ``pytest_configure`` (the controller under pytest-xdist, or the only
  process with ``-n0``) adds ``--xla_backend_optimization_level=0`` to ``XLA_FLAGS`` in the
  environment that the workers and every subprocess (CLI, sweep, GPU check) inherit: the CPU
  backend's LLVM code generation without optimisation passes. The HLO programs, and so what
  every test computes, are the same; they compile about twice as fast and run slower, which
  halves ``tests/test_sketch.py`` (66 → 28 s) and cuts ``test_e2e.py`` + ``test_patches.py``
  80 → 62 s here. ``--xla_cpu_use_fusion_emitters=false`` (the CPU backend's older loop
  emitter for fusions, same HLO) compiles faster still. A value the user set wins. (A
  persistent compilation cache shared by the workers was tried too: it saved little, and
  jax 0.10.2 segfaulted writing an entry.)
* The slowest files first. pytest-xdist's ``--dist loadfile`` hands files to the two
  workers in collection order, so a slow file collected last (alphabetically: notebooks,
  sweep) would run alone at the end; ``SLOW_FIRST`` (measured with ``--durations=0``,
  slowest first) is scheduled before the rest, which keep their order.
"""

import os

SLOW_FIRST = ("test_notebooks.py", "test_sweep.py", "test_cli.py", "test_ntk.py",
              "test_corpus.py", "test_head_aware.py", "test_patches.py", "test_suggest.py",
              "test_sketch.py", "test_optimizers.py", "test_sde.py", "test_finetune.py",
              "test_gpu_check.py", "test_optimizer_api.py",
              "test_predict.py", "test_e2e.py", "test_checkpoint.py", "test_sharding.py")


FAST_COMPILE = {"xla_backend_optimization_level": "0", "xla_cpu_use_fusion_emitters": "false"}


def pytest_configure(config):
    flags = os.environ.get("XLA_FLAGS", "").split()
    flags += [f"--{name}={value}" for name, value in FAST_COMPILE.items()
              if not any(f.startswith(f"--{name}=") for f in flags)]
    os.environ["XLA_FLAGS"] = " ".join(flags)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), order[id(item)]))
