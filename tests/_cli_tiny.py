"""The tiny task the optimiser CLI tests give ``ntk-tt predict`` in place of ``load_task``."""

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
