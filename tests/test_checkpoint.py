"""Orbax checkpoints: exact round trip, the shipped checkpoint, clear errors, model heads."""

import shutil

import jax
import numpy as np
import pytest
from flax import nnx

import ntk_tt
from ntk_tt._checkpoint import DEFAULT_CHECKPOINT
from ntk_tt.models import ResNet18, SmallResNet

META = {"architecture": "SmallResNet", "kwargs": {"widths": [4, 8]}, "num_classes": 3,
        "input_shape": [8, 8, 3], "mean": [0.5] * 3, "std": [0.25] * 3}


def leaves(model):
    return jax.tree_util.tree_leaves(nnx.state(model))


def test_round_trip_is_exact(tmp_path):
    model = SmallResNet(3, widths=(4, 8), rngs=nnx.Rngs(7))
    ntk_tt.save_checkpoint(tmp_path / "ck", model, META)
    back, meta = ntk_tt.load_checkpoint(tmp_path / "ck")
    assert meta == META
    for a, b in zip(leaves(model), leaves(back), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    x = jax.random.normal(jax.random.key(0), (2, 8, 8, 3))
    np.testing.assert_array_equal(model(x), back(x))


def test_shipped_checkpoint_loads_and_is_pretrained():
    model, meta = ntk_tt.load_checkpoint()
    assert meta["architecture"] == "SmallResNet" and meta["input_shape"] == [32, 32, 3]
    assert meta["pretrain"]["source_test_accuracy"] > 0.5
    apply_fn, params = ntk_tt.from_nnx(model)
    assert 50_000 <= ntk_tt.num_params(params) <= 150_000
    assert DEFAULT_CHECKPOINT.is_dir()


def test_missing_checkpoint_is_one_clear_line(tmp_path):
    with pytest.raises(ValueError, match="checkpoint not found") as err:
        ntk_tt.load_checkpoint(tmp_path / "nothing")
    assert "\n" not in str(err.value)


def test_corrupt_checkpoint_is_one_clear_line(tmp_path):
    path = tmp_path / "ck"
    shutil.copytree(DEFAULT_CHECKPOINT, path)
    for f in (path / "state").rglob("*"):
        if f.is_file() and f.stat().st_size > 1000:
            f.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="corrupt or not an ntk_tt checkpoint") as err:
        ntk_tt.load_checkpoint(path)
    assert "\n" not in str(err.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="corrupt or not an ntk_tt checkpoint"):
        ntk_tt.load_checkpoint(tmp_path / "empty")


def test_replace_head_is_fresh_seeded_and_keeps_backbone():
    model = SmallResNet(10, widths=(4, 8), rngs=nnx.Rngs(0))
    a = ntk_tt.replace_head(model, 5, key=jax.random.key(1))
    b = ntk_tt.replace_head(model, 5, key=jax.random.key(1))
    c = ntk_tt.replace_head(model, 5, key=jax.random.key(2))
    assert a.head.kernel.shape == (8, 5) and model.head.kernel.shape == (8, 10)
    np.testing.assert_array_equal(a.head.kernel[...], b.head.kernel[...])
    assert not np.array_equal(a.head.kernel[...], c.head.kernel[...])
    np.testing.assert_array_equal(a.stem.kernel[...], model.stem.kernel[...])
    with pytest.raises(ValueError, match="head"):
        ntk_tt.replace_head(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), 3, key=jax.random.key(0))


def test_no_batch_dependence_in_small_resnet_and_frozen_bn_in_resnet18():
    x = jax.random.normal(jax.random.key(0), (4, 32, 32, 3))
    for model in (SmallResNet(5, widths=(4, 8), rngs=nnx.Rngs(0)),
                  ResNet18(5, rngs=nnx.Rngs(0))):
        apply_fn, params = ntk_tt.from_nnx(model)
        full = apply_fn(params, x)
        assert full.shape == (4, 5)
        np.testing.assert_allclose(apply_fn(params, x[:1]), full[:1], rtol=1e-4, atol=1e-5)
    assert ntk_tt.num_params(params) > 11_000_000  # ResNet-18
