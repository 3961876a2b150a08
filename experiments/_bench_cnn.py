"""The benchmark CNN in plain JAX (no ntk_tt / flax import), so that the same function and the
same weights run under ntk_tt and, in a separate environment, under neural-tangents 0.6.5.

Architecture (width factor k, C classes): conv3×3(3→16k, SAME) relu avgpool2 →
conv3×3(16k→32k, VALID) relu avgpool2 → flatten (7·7·32k) → dense 64k relu → dense C.
k = 1: D = 105,829 with C = 5. Convolutions are patch extraction + one matmul (faster on CPU,
ENVIRONMENT.md); conv weights are stored as (C_in·9, C_out).
"""

import jax
import numpy as np


def init(key, num_classes, width=1):
    """He-normal weights, zero biases: dict of float32 numpy arrays."""
    c1, c2, hid = 16 * width, 32 * width, 64 * width
    shapes = {
        "conv1": (27, c1),
        "conv2": (9 * c1, c2),
        "dense1": (49 * c2, hid),
        "head": (hid, num_classes),
    }
    params = {}
    for k, (name, (fan_in, fan_out)) in zip(jax.random.split(key, 4), shapes.items(), strict=True):
        w = jax.random.normal(k, (fan_in, fan_out)) * np.sqrt(2.0 / fan_in)
        params[name] = {"w": np.asarray(w, np.float32), "b": np.zeros(fan_out, np.float32)}
    return params


def _conv(x, layer, padding):
    dn = ("NHWC", "HWIO", "NHWC")
    patches = jax.lax.conv_general_dilated_patches(x, (3, 3), (1, 1), padding, dimension_numbers=dn)
    return patches @ layer["w"] + layer["b"]


def _pool(x):
    n, h, w, c = x.shape
    return x.reshape(n, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4))


def features(params, x):
    """Penultimate activations (N, 64k)."""
    h = _pool(jax.nn.relu(_conv(x, params["conv1"], "SAME")))
    h = _pool(jax.nn.relu(_conv(h, params["conv2"], "VALID")))
    h = h.reshape(h.shape[0], -1)
    return jax.nn.relu(h @ params["dense1"]["w"] + params["dense1"]["b"])


def apply(params, x):
    """Logits (N, C) for images x (N, 32, 32, 3) scaled to [0, 1] and standardised."""
    return features(params, x) @ params["head"]["w"] + params["head"]["b"]


def standardise(images):
    """uint8 (N, 32, 32, 3) → float32, per-channel standardised with fixed CIFAR statistics."""
    x = images.astype(np.float32) / 255.0
    return (x - np.array([0.49, 0.48, 0.45], np.float32)) / np.array([0.25, 0.24, 0.26], np.float32)
