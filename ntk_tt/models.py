"""Pre-trainable image classifiers in flax NNX, and the fresh task head of fine-tuning.

* :class:`SmallResNet`: a small ResNet-style CNN (about 120 k parameters at the default widths)
  sized so that the exact empirical NTK of a 5 × 150-image task and a 150-step GD fine-tune
  both fit a 2-core CPU. It has **no normalisation layer at all**, so a sample's logits never
  depend on the other samples of its batch (METHOD.md §1).
* :class:`ResNet18`: the CIFAR-style ResNet-18 (He et al. 2016; 3×3 stem, about 11 M
  parameters) for GPU use, with batch norm; :func:`ntk_tt.from_nnx` puts it in evaluation
  mode, so its running statistics are frozen constants in prediction and fine-tuning.

Both expose their classifier as ``model.head`` (an ``nnx.Linear``), which
:func:`replace_head` swaps for a fresh seeded C-output head (paper Sec. 5: the pre-trained
backbone plus a new linear head for the target task).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ntk_tt._keys import check_key

_he = nnx.initializers.variance_scaling(2.0, "fan_in", "truncated_normal")
HEAD_SCALE = 0.3


def _conv3(cin: int, cout: int, *, stride: int = 1, zero_init: bool = False,
           rngs: nnx.Rngs) -> nnx.Conv:
    """3×3 'SAME' convolution with bias, He-normal init (or zeros: the last convolution of
    each residual branch starts at zero, so every block starts as the identity and the net
    trains without normalisation)."""
    return nnx.Conv(cin, cout, (3, 3), strides=(stride, stride), padding="SAME",
                    kernel_init=nnx.initializers.zeros if zero_init else _he, rngs=rngs)


class _Block(nnx.Module):
    """Residual block without normalisation: relu(x + conv(relu(conv(x))))."""

    def __init__(self, width: int, *, rngs: nnx.Rngs):
        self.conv1 = _conv3(width, width, rngs=rngs)
        self.conv2 = _conv3(width, width, zero_init=True, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.nn.relu(x + self.conv2(jax.nn.relu(self.conv1(x))))


class SmallResNet(nnx.Module):
    """Small ResNet-style CNN for 32×32 images, no normalisation layers.

    Layout: 3×3 stem (``widths[0]`` channels) → 2×2 average pool → for each width a residual
    block, with a stride-2 3×3 convolution between stages → global average pool → linear
    ``head``. With ``widths=(16, 32, 64)`` and 10 classes: 121,226 parameters.

    Args:
      num_classes: C, outputs of the linear head.
      widths: channels per stage.
      in_channels: image channels (3 for RGB).
      rngs: ``nnx.Rngs`` for the initialisation.

    Input: float images (N, H, W, in_channels), H and W divisible by 2·2^(len(widths)−1).
    Output: logits (N, C).
    """

    def __init__(self, num_classes: int, *, widths: Sequence[int] = (16, 32, 64),
                 in_channels: int = 3, rngs: nnx.Rngs):
        widths = tuple(int(w) for w in widths)
        self.stem = _conv3(in_channels, widths[0], rngs=rngs)
        self.blocks = nnx.List([_Block(w, rngs=rngs) for w in widths])
        pairs = zip(widths[:-1], widths[1:], strict=True)
        self.downs = nnx.List([_conv3(a, b, stride=2, rngs=rngs) for a, b in pairs])
        self.head = nnx.Linear(widths[-1], num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = jax.nn.relu(self.stem(x))
        x = nnx.avg_pool(x, (2, 2), strides=(2, 2))
        x = self.blocks[0](x)
        for down, block in zip(self.downs, self.blocks[1:], strict=True):
            x = block(jax.nn.relu(down(x)))
        return self.head(jnp.mean(x, axis=(1, 2)))


class _BasicBlock(nnx.Module):
    """ResNet-18 basic block with batch norm and a 1×1 projection shortcut when shapes change."""

    def __init__(self, cin: int, cout: int, stride: int, *, rngs: nnx.Rngs):
        def conv(a, b, k, s):
            return nnx.Conv(a, b, (k, k), strides=(s, s), padding="SAME", use_bias=False,
                            rngs=rngs)

        self.conv1, self.bn1 = conv(cin, cout, 3, stride), nnx.BatchNorm(cout, rngs=rngs)
        self.conv2, self.bn2 = conv(cout, cout, 3, 1), nnx.BatchNorm(cout, rngs=rngs)
        project = stride != 1 or cin != cout
        self.proj = (nnx.Sequential(conv(cin, cout, 1, stride), nnx.BatchNorm(cout, rngs=rngs))
                     if project else None)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = jax.nn.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return jax.nn.relu(h + (x if self.proj is None else self.proj(x)))


class ResNet18(nnx.Module):
    """CIFAR-style ResNet-18 (3×3 stem, stages of 64/128/256/512 channels, 2 blocks each).

    For GPU use (about 11 M parameters). Batch norm is used in training mode only during
    pre-training; :func:`ntk_tt.from_nnx` switches to evaluation mode (frozen statistics).
    Input: (N, H, W, in_channels); output: logits (N, C).
    """

    def __init__(self, num_classes: int, *, in_channels: int = 3, rngs: nnx.Rngs):
        self.stem = nnx.Conv(in_channels, 64, (3, 3), padding="SAME", use_bias=False, rngs=rngs)
        self.bn = nnx.BatchNorm(64, rngs=rngs)
        blocks, cin = [], 64
        for i, cout in enumerate((64, 128, 256, 512)):
            for j in range(2):
                blocks.append(_BasicBlock(cin, cout, 2 if (i > 0 and j == 0) else 1, rngs=rngs))
                cin = cout
        self.blocks = nnx.List(blocks)
        self.head = nnx.Linear(512, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = jax.nn.relu(self.bn(self.stem(x)))
        for block in self.blocks:
            x = block(x)
        return self.head(jnp.mean(x, axis=(1, 2)))


def replace_head(model: nnx.Module, num_classes: int, *, key: jax.Array,
                 scale: float = HEAD_SCALE) -> nnx.Module:
    """A copy of ``model`` whose ``head`` is a fresh, seeded C-output ``nnx.Linear``.

    The backbone (every other parameter and batch-norm statistic) is copied unchanged; the new
    head has the same input width, weights ``scale`` × LeCun-normal drawn from ``key`` and zero
    bias. The default ``scale = 0.3`` keeps the initial predictions close to uniform
    (L_0 ≈ 2.0 for C = 5 on the shipped checkpoint, vs ≈ 4.3 at ``scale = 1``): with the full
    LeCun scale the large initial logits of the un-normalised features make real fine-tuning
    lag the linearised prediction (max loss gap 14–17 % of the loss fall at κ ≤ 1 on 5 × 10
    flowers, 30 GD steps), while at 0.1 the head-only kernel misses the backbone's growing
    contribution (gap 10–32 % at κ = 2–8); at 0.3 the gap was 5–7 % (κ = 1–4).

    Source: Zancato et al. 2020 (arXiv 2008.12478), Sec. 5 (the pre-trained backbone with a
    new linear head for the target task); METHOD.md §8. The scale 0.3 is ntk_tt's, measured.

    Args:
      model: an NNX module with an ``nnx.Linear`` attribute ``head``.
      num_classes: C ≥ 2, the number of target classes.
      key: ``jax.random`` key for the head initialisation.
      scale: > 0, multiplies the LeCun-normal standard deviation (1 = flax's default init).

    Returns:
      A new module; ``model`` itself is not modified.

    Raises:
      ValueError: ``model`` has no linear ``head``, ``num_classes`` not an integer ≥ 2,
        ``scale`` not a finite number > 0, or ``key`` not one ``jax.random.key(seed)`` (or
        a legacy ``jax.random.PRNGKey``, a uint32 (2,) array, jax or numpy), as every key.
    """
    head = getattr(model, "head", None)
    if not isinstance(head, nnx.Linear):
        raise ValueError(
            f"replace_head needs a model with an nnx.Linear attribute `head`, got "
            f"{type(model).__name__}; name the classifier layer `head`."
        )
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) \
            or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}.")
    if not (isinstance(scale, (int, float, np.number)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite number > 0, got {scale!r}; 1 is flax's "
                         "LeCun-normal init.")
    if key is None:
        raise ValueError("key must be a jax.random key for the head's initialisation, e.g. "
                         "key=jax.random.key(0), got None.")
    check_key(key)  # the rule of every other key (a numpy uint32 (2,) was refused only here)
    key = jnp.asarray(key)
    init = nnx.initializers.variance_scaling(float(scale) ** 2, "fan_in", "truncated_normal")
    new = nnx.clone(model)
    new.head = nnx.Linear(head.in_features, int(num_classes), kernel_init=init,
                          rngs=nnx.Rngs(params=key))
    return new
