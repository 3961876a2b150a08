"""The shipped SmallResNet (``ntk_tt.models.SmallResNet``, widths 16-32-64) in plain JAX (no
ntk_tt / flax import), so that the same function and the same weights run under ntk_tt and, in
a separate environment, under neural-tangents 0.6.5.

Parameters: a two-level dict ``{layer: {"kernel": (3, 3, in, out) HWIO, "bias": (out,)}}``
with layers ``stem``, ``b0c1``, ``b0c2``, ``d0``, ``b1c1``, ``b1c2``, ``d1``, ``b2c1``,
``b2c2`` and ``head`` (kernel (64, C)). :func:`from_nnx_params` converts the ``nnx.State`` of
:func:`ntk_tt.from_nnx`; ``bench_ntk.py`` checks that both give the same logits.
"""

import jax
import jax.numpy as jnp


def _conv(x, layer, stride=1):
    y = jax.lax.conv_general_dilated(x, layer["kernel"], (stride, stride), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y + layer["bias"]


def _block(x, p, i):
    return jax.nn.relu(x + _conv(jax.nn.relu(_conv(x, p[f"b{i}c1"])), p[f"b{i}c2"]))


def apply(params, x):
    """Logits (N, C) for images x (N, 32, 32, 3), normalised as the checkpoint's meta says."""
    h = jax.nn.relu(_conv(x, params["stem"]))
    n, hh, ww, c = h.shape
    h = h.reshape(n, hh // 2, 2, ww // 2, 2, c).mean(axis=(2, 4))
    h = _block(h, params, 0)
    for i in (1, 2):
        h = _block(jax.nn.relu(_conv(h, params[f"d{i - 1}"], stride=2)), params, i)
    return jnp.mean(h, axis=(1, 2)) @ params["head"]["kernel"] + params["head"]["bias"]


def from_nnx_params(state):
    """The two-level dict above from the ``nnx.State`` of a SmallResNet (numpy arrays)."""
    import numpy as np

    def layer(m):
        return {"kernel": np.asarray(m["kernel"].value), "bias": np.asarray(m["bias"].value)}

    out = {"stem": layer(state["stem"]), "head": layer(state["head"])}
    for i in range(3):
        out[f"b{i}c1"] = layer(state["blocks"][i]["conv1"])
        out[f"b{i}c2"] = layer(state["blocks"][i]["conv2"])
    for i in range(2):
        out[f"d{i}"] = layer(state["downs"][i])
    return out
