"""Small models and brute-force references shared by the dynamics tests."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from ntk_tt.dynamics._losses import mean_loss


def linear_apply(params, x):
    """f(x; w, b) = x w + b: linear in the parameters, so its linearisation is exact."""
    return x @ params["w"] + params["b"]


def linear_problem(n=16, d=6, c=3, seed=0, dtype=None):
    """(params, x, y) for the linear model, with small random initial weights; ``dtype``
    None: float64 under x64, else float32 (what a float64 request is truncated to, without
    JAX's warning)."""
    if dtype is None:
        dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    kx, kw, ky = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(kx, (n, d), dtype)
    params = {"w": 0.3 * jax.random.normal(kw, (d, c), dtype), "b": jnp.zeros(c, dtype)}
    y = jax.random.randint(ky, (n,), 0, c)
    return params, x, y


@partial(jax.jit, static_argnums=0)
def jacobian(apply_fn, params, x):
    """Brute-force J = ∂f(x)/∂w, (N·C, D), sample-major rows, via jax.jacrev."""
    jac = jax.jacrev(lambda p: apply_fn(p, x).reshape(-1))(params)
    return jnp.concatenate([leaf.reshape(leaf.shape[0], -1)
                            for leaf in jax.tree.leaves(jac)], axis=1)


@partial(jax.jit, static_argnums=0)
def brute_ntk(apply_fn, params, x, x2=None):
    """Θ(x, x2) = J(x) J(x2)ᵀ from brute-force Jacobians."""
    j = jacobian(apply_fn, params, x)
    j2 = j if x2 is None else jacobian(apply_fn, params, x2)
    return j @ j2.T


def train_optax(apply_fn, params, x, y, batches, x_eval, learning_rate, momentum, *, nesterov,
                loss):
    """Real optax.sgd training over a batch-index sequence (η, m traceable).

    Returns the logits on ``x_eval`` after 0..steps updates, (steps + 1, N_eval, C).
    """
    tx = optax.sgd(learning_rate, momentum=momentum, nesterov=nesterov)
    return train_tx(apply_fn, params, x, y, tx, batches, x_eval, loss)


def train_tx(apply_fn, params, x, y, tx, batches, x_eval, loss):
    """Real training with the optax transformation ``tx`` over a batch-index sequence
    ``batches`` (T, B); the logits on ``x_eval`` after 0..T updates, (T + 1, N_eval, C)."""

    def step(carry, idx):
        p, state = carry
        grads = jax.grad(lambda q: mean_loss(apply_fn(q, x[idx]), y[idx], loss))(p)
        updates, state = tx.update(grads, state, p)
        p = optax.apply_updates(p, updates)
        return (p, state), apply_fn(p, x_eval)

    _, fs = jax.lax.scan(step, (params, tx.init(params)), batches)
    return jnp.concatenate([apply_fn(params, x_eval)[None], fs])


class LinearHeadNet(nnx.Module):
    """Backbone Linear(d, f) (linear in its weights) and a linear ``head``, in float64: the
    head-aware model of it is the network itself."""

    def __init__(self, d, f, c, *, rngs):
        self.body = nnx.Linear(d, f, param_dtype=jnp.float64, rngs=rngs)
        self.head = nnx.Linear(f, c, param_dtype=jnp.float64, rngs=rngs)

    def __call__(self, x):
        return self.head(self.body(x))
