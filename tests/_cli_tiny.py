"""Helpers of the CLI tests: the tiny task the optimiser tests give ``ntk-tt predict`` in place
of ``load_task``, and a run of refused options in a fresh interpreter."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

import ntk_tt


class _Net(nnx.Module):
    """A tiny classifier with a linear ``head`` (the job splits it for the head-aware
    predictor)."""

    def __init__(self, rngs):
        self.body = nnx.Linear(6, 12, rngs=rngs)
        self.head = nnx.Linear(12, 3, rngs=rngs)

    def __call__(self, x):
        return self.head(jnp.tanh(self.body(x)))


def tiny_task():
    """``load_task``'s return value for K = 3, n = 8 and 2 held-out images per class."""
    model = _Net(nnx.Rngs(0))
    apply_fn, params = ntk_tt.from_nnx(model)
    x = jax.random.normal(jax.random.key(1), (30, 6))
    y = jnp.argmax(x[:, :3], axis=1)  # learnable labels
    info = {"checkpoint": "tiny", "architecture": "_Net", "num_params": 123,
            "dataset": "tiny", "classes": ["a", "b", "c"], "n_train": 24, "n_test": 6,
            "test_per_class": 2, "image_shape": [6], "model_input_shape": [6],
            "preprocessing": "none"}
    return apply_fn, params, x[:24], y[:24], x[24:], y[24:], info, ntk_tt.split_head(model)


ROOT = str(Path(__file__).resolve().parents[1])  # on PYTHONPATH of the programs run


def cli_before_jax(cases, cwd, *, then: str = "", result: str = "out"):
    """Run ``ntk_tt.cli.main`` on each argument list of ``cases`` in one fresh interpreter
    (in ``cwd``), recording after each its exit status ('no exit' if none) and whether
    ``jax`` was imported; ``then``: more code run after the cases; ``result``: the expression
    printed last (as JSON). Returns (that value, stderr's lines, stderr)."""
    code = ("import json, sys\nfrom ntk_tt.cli import main\nout = []\n"
            f"for args in {cases!r}:\n"
            "    try:\n        main(args)\n        out.append(['no exit', 'jax' in sys.modules])\n"
            "    except SystemExit as e:\n        out.append([e.code, 'jax' in sys.modules])\n"
            f"    sys.stderr.flush()\n{then}print(json.dumps({result}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=os.environ | {"PYTHONPATH": ROOT}, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1]), proc.stderr.splitlines(), proc.stderr
