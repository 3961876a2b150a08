"""Tiny test networks (MLP and CNN with several parameter leaves) and a brute-force Θ.

Shared by test_linearize, test_ntk, test_sketch, test_optimizer_api and
test_optimizer_timing. Build them inside ``jax.enable_x64(True)``
for float64.
"""

from __future__ import annotations

import functools
from functools import partial

import jax
import jax.numpy as jnp
from flax import nnx
from jax.flatten_util import ravel_pytree

import ntk_tt


class TanhHeadNet(nnx.Module):
    """A flax MLP, tanh hidden layer ``l1`` (its backbone: Linear(6, width)) and a linear
    ``head`` (Linear(width, classes)), for ``ntk_tt.split_head``."""

    def __init__(self, width=16, classes=3, *, rngs):
        self.l1 = nnx.Linear(6, width, rngs=rngs)
        self.head = nnx.Linear(width, classes, rngs=rngs)

    def __call__(self, x):
        return self.head(jnp.tanh(self.l1(x)))


def mlp(key, d_in=6, width=8, c=3):
    """(apply_fn, params) of a 2-layer tanh MLP: dict params, 3 leaves."""
    k1, k2 = jax.random.split(key)
    params = {
        "w1": jax.random.normal(k1, (d_in, width)) / jnp.sqrt(d_in),
        "b1": jnp.full((width,), 0.1),
        "w2": jax.random.normal(k2, (width, c)) / jnp.sqrt(width),
    }

    def apply_fn(p, x):
        return jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"]

    return apply_fn, params


def cnn(key, c=3):
    """(apply_fn, params) of conv(2→4)-relu-conv(4→4, stride 2)-tanh-dense on (N, 6, 6, 2)."""
    ks = jax.random.split(key, 3)
    params = {
        "conv1": {"w": jax.random.normal(ks[0], (3, 3, 2, 4)) / 4, "b": jnp.full((4,), 0.05)},
        "conv2": {"w": jax.random.normal(ks[1], (3, 3, 4, 4)) / 6, "b": jnp.full((4,), -0.05)},
        "dense": [jax.random.normal(ks[2], (36, c)) / 6, jnp.zeros((c,))],
    }

    def conv(x, w, b, stride):
        dn = ("NHWC", "HWIO", "NHWC")
        out = jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=dn)
        return out + b

    def apply_fn(p, x):
        h = jax.nn.relu(conv(x, p["conv1"]["w"], p["conv1"]["b"], 1))
        h = jnp.tanh(conv(h, p["conv2"]["w"], p["conv2"]["b"], 2))
        return h.reshape(h.shape[0], -1) @ p["dense"][0] + p["dense"][1]

    return apply_fn, params


def inputs(kind, key, n):
    """n inputs for ``mlp`` (N, 6) or ``cnn`` (N, 6, 6, 2)."""
    shape = (n, 6) if kind == "mlp" else (n, 6, 6, 2)
    return jax.random.normal(key, shape)


@partial(jax.jit, static_argnums=0)
def brute_jacobian(apply_fn, params, x):
    """(N·C, D) Jacobian of the flattened logits by one ``jax.jacrev`` on raveled params."""
    flat, unravel = ravel_pytree(params)
    return jax.jacrev(lambda w: apply_fn(unravel(w), x).reshape(-1))(flat)


def brute_ntk(apply_fn, params, x, x2=None):
    """J(x) J(x2)ᵀ from :func:`brute_jacobian`."""
    j1 = brute_jacobian(apply_fn, params, x)
    j2 = j1 if x2 is None else brute_jacobian(apply_fn, params, x2)
    return j1 @ j2.T


@functools.cache
def _cached_model(kind, x64_enabled):
    del x64_enabled  # cache key only: params are created in the active precision
    return {"mlp": mlp, "cnn": cnn}[kind](jax.random.key(0))


def setup(kind, n=5):
    """(apply_fn, params, x) with n inputs; one model object per kind and precision, shared by
    the test files so that compiled functions (keyed on apply_fn) are reused."""
    apply_fn, params = _cached_model(kind, jax.config.jax_enable_x64)
    return apply_fn, params, inputs(kind, jax.random.key(1), n)


def labelled_mlp(n, n_test, c):
    """The tiny tanh MLP on n + n_test inputs with learnable labels (argmax of c input
    coordinates), as (apply_fn, params, x, y, x_test, y_test); and its split into (feature_fn
    = the tanh layer, backbone weights, head w2, zero bias) for the head-aware predictors."""
    apply_fn, params, x = setup("mlp", n=n + n_test)
    y = jnp.argmax(x[:, :c], axis=1)
    split = (lambda p, z: jnp.tanh(z @ p["w1"] + p["b1"]),
             {"w1": params["w1"], "b1": params["b1"]}, params["w2"], jnp.zeros(c))
    return (apply_fn, params, x[:n], y[:n], x[n:], y[n:]), split


def mlp_problem(n, n_test, c):
    """:func:`labelled_mlp` as a frozen-kernel problem: Θ (brute-force Jacobians), f0, y, the
    held-out arguments (kernel_test, f0_test, y_test) and the tangents J·θ0 (a, a_test)."""
    (apply_fn, params, x, y, xt, yt), _ = labelled_mlp(n, n_test, c)
    held = dict(kernel_test=brute_ntk(apply_fn, params, xt, x), f0_test=apply_fn(params, xt),
                y_test=yt)
    tangents = dict(a=ntk_tt.weight_tangent(apply_fn, params, x),
                    a_test=ntk_tt.weight_tangent(apply_fn, params, xt))
    return brute_ntk(apply_fn, params, x), apply_fn(params, x), y, held, tangents


def mlp_split_problem(n, n_test, c):
    """:func:`labelled_mlp` as a head-aware problem: (split, x, y, x_test, y_test, the feature
    tangents J_h θ_0 (a_h, a_h_test))."""
    (_, _, x, y, xt, yt), split = labelled_mlp(n, n_test, c)
    tangents = dict(a_h=ntk_tt.weight_tangent(split[0], split[1], x),
                    a_h_test=ntk_tt.weight_tangent(split[0], split[1], xt))
    return split, x, y, xt, yt, tangents
