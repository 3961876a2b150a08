"""Patch extraction (im2col) by strided slices against ``lax.conv_general_dilated_patches``,
and the per-sample Jacobians of networks written as patches @ W against ``vmap(jacrev)``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _ntk_models import brute_ntk

import ntk_tt
from ntk_tt.kernels._patches import patch_rewrites, patches
from ntk_tt.kernels._structured import structured_jacobian

_CASES = {  # input shape, window, strides, padding, rhs dilation, dimension numbers
    "nhwc_same": ((2, 7, 6, 3), (3, 3), (1, 1), "SAME", (1, 1), ("NHWC", "HWIO", "NHWC")),
    "nhwc_valid_stride": ((2, 8, 7, 2), (3, 2), (2, 3), "VALID", (1, 1),
                          ("NHWC", "HWIO", "NHWC")),
    "nchw_pad_dilated": ((2, 3, 7, 6), (2, 3), (1, 2), ((1, 2), (0, 1)), (2, 1),
                         ("NCHW", "OIHW", "NCHW")),
    "one_channel": ((2, 6, 6, 1), (3, 3), (1, 1), "SAME", (1, 1), ("NHWC", "HWIO", "NHWC")),
    "one_d": ((2, 9, 4), (4,), (2,), ((1, 1),), (1,), ("NWC", "WIO", "NWC")),
}


def _explicit(padding, shape, window, strides, dilation, dn):
    """Padding pairs as ``conv_general_dilated`` stores them in a jaxpr."""
    if not isinstance(padding, str):
        return padding
    lhs = jax.lax.conv_dimension_numbers(shape, (1, 1, *window), dn).lhs_spec
    spatial = [shape[a] for a in lhs[2:]]
    dilated = [(w - 1) * d + 1 for w, d in zip(window, dilation, strict=True)]
    return jax.lax.padtype_to_pads(spatial, dilated, strides, padding)


@pytest.mark.parametrize("name", list(_CASES))
def test_patches_by_slicing_equal_lax_patches(name):
    shape, window, strides, padding, dilation, dn = _CASES[name]
    h = jax.random.normal(jax.random.key(0), shape)
    want = jax.lax.conv_general_dilated_patches(h, window, strides, padding,
                                                rhs_dilation=dilation, dimension_numbers=dn)
    dnums = jax.lax.conv_dimension_numbers(shape, (1, 1, *window), dn)
    got = patches(h, window, strides, _explicit(padding, shape, window, strides, dilation, dn),
                  dilation, dnums)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)  # a one-hot kernel only copies: exact


def _patch_model(name):
    """patches @ W → tanh → a learned grouped convolution → a constant non-one-hot
    convolution (a blur) → dense head, on the inputs of ``_CASES[name]``."""
    shape, window, strides, padding, dilation, dn = _CASES[name]
    k = jax.random.split(jax.random.key(1), 4)
    h = jax.random.normal(k[0], shape)
    feats = shape[-1] if dn[0].endswith("C") else shape[1]
    spatial = len(window)
    dn_same = ("NHWC", "HWIO", "NHWC") if spatial == 2 else ("NWC", "WIO", "NWC")

    def to_channels_last(p):
        return p if dn[2].endswith("C") else jnp.moveaxis(p, 1, -1)

    probe = to_channels_last(jax.lax.conv_general_dilated_patches(
        h, window, strides, padding, rhs_dilation=dilation, dimension_numbers=dn))
    grouped_w = jax.random.normal(k[1], (*(2,) * spatial, 2, 4)) / 3
    blur = jnp.full((*(2,) * spatial, 1, 4), 0.25)
    out_shape = jax.eval_shape(
        lambda q: jax.lax.conv_general_dilated(
            q, blur, (1,) * spatial, "SAME", dimension_numbers=dn_same, feature_group_count=4),
        jnp.zeros(probe.shape[:-1] + (4,)))
    params = {"w": jax.random.normal(k[2], (probe.shape[-1], 4)) / (feats * 2),
              "g": grouped_w,
              "head": jax.random.normal(k[3], (int(np.prod(out_shape.shape[1:])), 3)) / 9}

    def apply_fn(p, x):
        q = to_channels_last(jax.lax.conv_general_dilated_patches(
            x, window, strides, padding, rhs_dilation=dilation, dimension_numbers=dn))
        y = jnp.tanh(q @ p["w"])
        y = jax.lax.conv_general_dilated(y, p["g"], (1,) * spatial, "SAME",
                                         dimension_numbers=dn_same, feature_group_count=2)
        y = jax.lax.conv_general_dilated(jnp.tanh(y), blur, (1,) * spatial, "SAME",
                                         dimension_numbers=dn_same, feature_group_count=4)
        return y.reshape(y.shape[0], -1) @ p["head"]

    return apply_fn, params, h


@pytest.mark.parametrize("name", ["nhwc_same", "nchw_pad_dilated", "one_d"])
def test_only_patch_extractions_are_rewritten_and_jacobians_match_jacrev(name):
    """The patch extraction is found (not the learned grouped convolution, not the constant
    blur), and the Jacobians computed through the slices equal ``vmap(jacrev)``."""
    with jax.enable_x64(True):
        apply_fn, params, x = _patch_model(name)
        leaves, treedef = jax.tree.flatten(params)
        closed = jax.make_jaxpr(lambda ls, xi: apply_fn(treedef.unflatten(ls), xi[None])[0])(
            leaves, x[0])
        convs = [k for k, e in enumerate(closed.jaxpr.eqns)
                 if e.primitive.name == "conv_general_dilated"]
        assert len(convs) == 3 and list(patch_rewrites(closed)) == convs[:1]
        jac = structured_jacobian(apply_fn, params, x)  # leaves: g, head (dense), w (shared)
        assert sorted(jac.generic) == [0, 2] and list(jac.acts) == [1]
        ref = jax.vmap(jax.jacrev(lambda ls, xi: apply_fn(treedef.unflatten(ls), xi[None])[0]),
                       in_axes=(None, 0))(leaves, x)
        for i in (0, 2):
            np.testing.assert_allclose(jac.generic[i], ref[i].reshape(jac.generic[i].shape),
                                       rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(ntk_tt.empirical_ntk(apply_fn, params, x),
                                   brute_ntk(apply_fn, params, x), rtol=1e-10, atol=1e-13)
