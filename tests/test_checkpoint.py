"""Orbax checkpoints: exact round trip, the shipped checkpoint, clear errors, model heads."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

import ntk_tt
from ntk_tt.data._checkpoint import DEFAULT_CHECKPOINT, read_meta
from ntk_tt.models import ResNet18, SmallResNet
from ntk_tt.prediction._job import load_task

META = {"architecture": "SmallResNet", "kwargs": {"widths": [4, 8]}, "num_classes": 3,
        "input_shape": [8, 8, 3], "mean": [0.5] * 3, "std": [0.25] * 3}


def leaves(model):
    return jax.tree_util.tree_leaves(nnx.state(model))


def without_digest(meta):
    """A loaded meta less the ``weights_sha256`` that save_checkpoint adds."""
    return {k: v for k, v in meta.items() if k != "weights_sha256"}


def test_round_trip_is_exact(tmp_path):
    model = SmallResNet(3, widths=(4, 8), rngs=nnx.Rngs(7))
    ntk_tt.save_checkpoint(tmp_path / "ck", model, META)
    back, meta = ntk_tt.load_checkpoint(tmp_path / "ck")
    assert without_digest(meta) == META
    assert len(meta["weights_sha256"]) == 64
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
    (tmp_path / "d.npz").write_bytes(b"")  # a fresh user: a file was "not found"
    with pytest.raises(ValueError, match=r"^checkpoint is a file: .*d\.npz \(pass the "
                                         r"directory written by ntk_tt.save_checkpoint"):
        ntk_tt.load_checkpoint(tmp_path / "d.npz")


def test_load_checkpoint_refuses_a_path_that_is_not_a_path():
    """A fresh user: load_checkpoint(5) gave pathlib's bare TypeError; load_checkpoint(model)
    gave a two-line message (the module's repr cut at 40 characters)."""
    model = SmallResNet(3, widths=(4, 8), rngs=nnx.Rngs(7))
    for bad, kind in ((5, "an int"), (b"ck", "a bytes"), (model, "a SmallResNet"),
                      ([tuple(range(30))], "a list"),
                      ("", r"a str \(empty\)")):  # "" was read as the current folder
        with pytest.raises(ValueError, match=r"^path must be the checkpoint folder's path \(str "
                                             r"or os\.PathLike\), or None for the shipped "
                                             rf"checkpoint; got {kind}: pass e\.g\. "
                                             r"load_checkpoint\('my_ckpt'\)\.$") as err:
            ntk_tt.load_checkpoint(bad)
        assert "\n" not in str(err.value)


def test_save_checkpoint_refuses_a_path_that_is_not_a_path_first(tmp_path):
    """The arguments swapped, save_checkpoint(model, path, meta), blamed meta's architecture
    ("the model is a str"); the path's type is now checked first, named by type only."""
    model = SmallResNet(3, widths=(4, 8), rngs=nnx.Rngs(7))
    for args, kind in (((model, str(tmp_path / "ck"), META), "a SmallResNet"),
                       ((None, model, META), "None"), (([1, 2], model, META), "a list")):
        with pytest.raises(ValueError, match=r"^path must be the checkpoint folder's path \(str "
                                             rf"or os\.PathLike\), got {kind}: call "
                                             r"save_checkpoint\(path, model, meta\)\.$") as err:
            ntk_tt.save_checkpoint(*args)
        assert "\n" not in str(err.value)
    assert not (tmp_path / "ck").exists()


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


def tiny_checkpoint(path, **meta):
    model = SmallResNet(3, widths=(4, 8), rngs=nnx.Rngs(7))
    ntk_tt.save_checkpoint(path, model, META)
    if meta:
        file = path / "meta" / "metadata"
        file.write_text(json.dumps(json.loads(file.read_text()) | meta))
    return path


def truncate_largest_array_file(path):
    big = max((f for f in (path / "state").rglob("*") if f.is_file()),
              key=lambda f: f.stat().st_size)
    big.write_bytes(big.read_bytes()[: big.stat().st_size // 2])


@pytest.mark.parametrize("meta,match", [
    ({"kwargs": {"widths": [4, 16]}},
     "does not match the stored weights: blocks/1/conv1/bias should have shape (16,) but has "
     "(8,) (7 arrays differ); re-save it with ntk_tt.save_checkpoint, or omit it for the "
     "shipped one."),
    ({"kwargs": {"widths": [4, 8, 16]}}, "does not match the stored weights (6 arrays in one "
                                         "and not the other, e.g. blocks/2/conv1/bias)"),
    ({"architecture": "VGG99"}, "meta names architecture 'VGG99', which ntk_tt does not know; "
                                "known architectures: ResNet18, SmallResNet."),
    ({"kwargs": {"depth": 3}}, "meta's architecture SmallResNet cannot be built from kwargs "
                               "{'depth': 3} (TypeError: "),
])
def test_meta_not_matching_the_weights_is_one_complete_line(meta, match, tmp_path):
    path = tiny_checkpoint(tmp_path / "ck", **meta)
    with pytest.raises(ValueError) as err:
        ntk_tt.load_checkpoint(path)
    text = str(err.value)
    assert match in text and "\n" not in text and text.endswith("."), text


def test_truncated_weights_are_one_line_and_nothing_after(tmp_path):
    path = tiny_checkpoint(tmp_path / "ck")
    truncate_largest_array_file(path)
    with pytest.raises(ValueError) as err:
        ntk_tt.load_checkpoint(path)
    # which half of orbax's files the cut reaches varies: the weights, or their index
    said = str(err.value).removeprefix(f"checkpoint at {path} is corrupt")
    assert said.startswith((": its weights cannot be read, the array files are truncated or "
                            "damaged (", " or not an ntk_tt checkpoint: its state lists no "
                            "arrays (damaged or missing array metadata);")), said
    assert "\n" not in said and said.endswith("omit it for the shipped one.")
    # the CLI, in a fresh process: one line, then nothing (orbax's late asyncio errors)
    code = ("import time\nfrom ntk_tt.cli import main\ntry:\n    main(['predict', "
            f"'--checkpoint', {str(path)!r}, '-K', '2', '-n', '2', '--figure', ''])\n"
            "finally:\n    time.sleep(2)")
    root = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=os.environ | {"PYTHONPATH": root}, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"ntk-tt: error: checkpoint at {path} is corrupt"), \
        done.stderr
    assert done.stderr.count("\n") == 1 and "\r" not in done.stderr, done.stderr


def test_bit_damaged_weights_are_refused(tmp_path):
    """A fresh user flipped one bit in the middle of the largest array file: orbax read the
    changed weights back without a word (max change 1e-8 here). The SHA-256 of the arrays
    saved in meta (hashlib over each array's bytes, below: not the package's function) now
    refuses them in one line; the undamaged copy and an older checkpoint without a digest load."""
    import hashlib

    path = tiny_checkpoint(tmp_path / "ck")
    model, meta = ntk_tt.load_checkpoint(path)
    h = hashlib.sha256()
    for leaf in leaves(model):  # state leaves in the pure dict's order
        a = np.asarray(leaf)
        h.update(f"{a.dtype.str}{a.shape};".encode() + a.tobytes())
    assert meta["weights_sha256"] == h.hexdigest()
    _, shipped = ntk_tt.load_checkpoint()  # the shipped one carries its digest and loads
    assert len(shipped["weights_sha256"]) == 64
    old = shutil.copytree(path, tmp_path / "old")  # saved before the digest: not checked
    file = old / "meta" / "metadata"
    file.write_text(json.dumps({k: v for k, v in json.loads(file.read_text()).items()
                                if k != "weights_sha256"}))
    said = []
    digest_line = (
        f"checkpoint at {path} is corrupt: its weights differ from those saved (their SHA-256 "
        "is not meta's weights_sha256), the array files are damaged; re-save it with "
        "ntk_tt.save_checkpoint, or omit it for the shipped one.")
    # orbax splits the arrays over data files in state/ocdbt.process_0/d/ (how varies from
    # save to save): one bit flipped at 12 places of each
    for file in sorted((path / "state" / "ocdbt.process_0" / "d").glob("*")):
        clean = file.read_bytes()
        for at in np.linspace(0, len(clean) - 1, 12).astype(int):
            data = bytearray(clean)
            data[at] ^= 0x10
            file.write_bytes(bytes(data))
            try:  # never other weights without a word: refused in one line, or the same ones
                back, _ = ntk_tt.load_checkpoint(path)
            except ValueError as err:
                assert str(err).startswith(f"checkpoint at {path} is corrupt") and "\n" not in \
                    str(err)
                said.append(str(err))
                continue
            for a, b in zip(leaves(model), leaves(back), strict=True):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        file.write_bytes(clean)
    assert digest_line in said  # the digest caught a flip that orbax read without a word
    ntk_tt.load_checkpoint(old)
    bad = tiny_checkpoint(tmp_path / "bad", weights_sha256="abc")
    with pytest.raises(ValueError, match=r"meta has weights_sha256 'abc'; expected the 64 hex "
                                         r"digits save_checkpoint writes; re-save it"):
        ntk_tt.load_checkpoint(bad)


def test_loading_compiles_nothing(tmp_path):
    # weights from numpy into an abstract model: saving compiles no initialiser either,
    # so a load that built the model for real would be the first to compile them
    abstract = nnx.eval_shape(lambda: SmallResNet(7, widths=(5, 11), in_channels=2,
                                                  rngs=nnx.Rngs(3)))
    graphdef, state = nnx.split(abstract)
    rng = np.random.default_rng(0)
    state = jax.tree.map(lambda s: rng.standard_normal(s.shape).astype(s.dtype), state)
    model = nnx.merge(graphdef, state)
    meta = META | {"kwargs": {"widths": [5, 11]}, "num_classes": 7, "input_shape": [8, 8, 2],
                   "mean": [0.5] * 2, "std": [0.25] * 2}
    ntk_tt.save_checkpoint(tmp_path / "ck", model, meta)
    # lowering to MLIR happens whether or not a persistent compilation cache
    # (JAX_COMPILATION_CACHE_DIR) then has the executable, so a cache hit cannot hide it
    compiled = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, *_, **__: compiled.append(event)
        if event in ("/jax/core/compile/backend_compile_duration",
                     "/jax/core/compile/jaxpr_to_mlir_module_duration") else None)
    back, _ = ntk_tt.load_checkpoint(tmp_path / "ck")
    assert compiled == []
    np.testing.assert_array_equal(back.stem.kernel[...], model.stem.kernel[...])


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
    # a numpy uint32 (2,) key, accepted by every other function, was refused here alone
    legacy = ntk_tt.replace_head(model, 5, key=np.asarray(jax.random.PRNGKey(1)))
    np.testing.assert_array_equal(
        legacy.head.kernel[...], ntk_tt.replace_head(model, 5, key=jax.random.PRNGKey(1)).head
        .kernel[...])
    for bad, match in ((None, "got None"), (nnx.Rngs(0), r"an nnx.Rngs draws one"),
                       (jax.random.split(jax.random.key(0)), "got an array of 2 keys"),
                       (3, "must be a jax random key")):
        with pytest.raises(ValueError, match=match):
            ntk_tt.replace_head(model, 5, key=bad)


def test_no_batch_dependence_in_small_resnet_and_frozen_bn_in_resnet18():
    x = jax.random.normal(jax.random.key(0), (4, 32, 32, 3))
    for model in (SmallResNet(5, widths=(4, 8), rngs=nnx.Rngs(0)),
                  ResNet18(5, rngs=nnx.Rngs(0))):
        apply_fn, params = ntk_tt.from_nnx(model)
        full = apply_fn(params, x)
        assert full.shape == (4, 5)
        np.testing.assert_allclose(apply_fn(params, x[:1]), full[:1], rtol=1e-4, atol=1e-5)
    assert ntk_tt.num_params(params) > 11_000_000  # ResNet-18


class _MyCNN(nnx.Module):
    def __init__(self, rngs):
        self.head = nnx.Linear(4, 3, rngs=rngs)

    def __call__(self, x):
        return self.head(x)


@pytest.mark.parametrize("model_kind, meta, expected", [
    ("own", META | {"architecture": "MyCNN"},
     "meta names architecture 'MyCNN' (the model is a _MyCNN), which ntk_tt cannot rebuild: "
     "load_checkpoint builds the model from this name, and the known architectures are "
     "ResNet18, SmallResNet (ntk_tt.models). Save one of those, or use your own flax model "
     "without a checkpoint: ntk_tt.from_nnx(model) and the Python API (keep its weights with "
     "orbax yourself, e.g. nnx.state(model))."),
    ("own", META | {"architecture": "SmallResNet"},
     "meta names architecture 'SmallResNet' but the model is a _MyCNN: load_checkpoint would "
     "rebuild a SmallResNet, not this model. Set meta['architecture'] to the model's class "
     "(one of ResNet18, SmallResNet), or see ntk_tt.from_nnx for other models."),
    ("small", {k: v for k, v in META.items() if k not in ("mean", "std")},
     "meta lacks the keys ['mean', 'std']; it needs architecture (one of ResNet18, "
     "SmallResNet), num_classes, input_shape [H, W, C], mean and std (C,), and optionally "
     "kwargs."),
])
def test_save_checkpoint_names_the_architecture_problem(model_kind, meta, expected, tmp_path):
    """Issue 25: an unknown architecture said "missing []"; now the message names it, the
    model's class, the known ones and the way out, and nothing is written."""
    model = (_MyCNN(nnx.Rngs(0)) if model_kind == "own"
             else SmallResNet(3, widths=(4, 8), rngs=nnx.Rngs(7)))
    with pytest.raises(ValueError) as err:
        ntk_tt.save_checkpoint(tmp_path / "ck", model, meta)
    assert str(err.value) == expected
    assert not (tmp_path / "ck").exists()


def test_save_checkpoint_refuses_a_meta_that_does_not_rebuild_the_model(tmp_path):
    """A fresh user's probe: README's sequence load_checkpoint → replace_head(model, 3) →
    save_checkpoint(path, model, meta) wrote a checkpoint that load_checkpoint then refused
    (meta still said 10 classes). Now save refuses it before writing and names the fix; the
    fixed meta round-trips exactly; a meta with other widths or a bad kwarg is refused too."""
    model = SmallResNet(3, widths=(4, 8), rngs=nnx.Rngs(7))
    five = ntk_tt.replace_head(model, 5, key=jax.random.key(1))
    for bad_model, meta, said in [
            (five, META, r"head/bias of shape \(3,\), the model \(5,\).*num_classes'\] = 5"),
            (model, META | {"kwargs": {"widths": [4, 16]}}, "set meta's kwargs"),
            (model, META | {"kwargs": {"depth": 3}}, "cannot be built from .*depth")]:
        with pytest.raises(ValueError, match=said):
            ntk_tt.save_checkpoint(tmp_path / "ck", bad_model, meta)
        assert not (tmp_path / "ck").exists()
    # the shipped meta's 10 CIFAR class_names were kept beside num_classes 5 (session 41)
    with pytest.raises(ValueError, match=r"class_names has 3 names but num_classes is 5 .*"
                                         r"replace_head\): set meta\['class_names'\]"):
        ntk_tt.save_checkpoint(tmp_path / "ck", five, META | {"num_classes": 5,
                                                              "class_names": ["a", "b", "c"]})
    assert not (tmp_path / "ck").exists()
    ntk_tt.save_checkpoint(tmp_path / "ck", five, META | {"num_classes": 5,
                                                          "class_names": list("abcde")})
    back, meta = ntk_tt.load_checkpoint(tmp_path / "ck")
    assert meta["num_classes"] == 5 and meta["class_names"] == list("abcde")
    for a, b in zip(leaves(five), leaves(back), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_save_checkpoint_checks_meta_as_load_does_and_takes_numpy(tmp_path):
    """A fresh user's probe: a mean of the wrong length and num_classes '5' were saved and then
    refused or misread by load_checkpoint, and a NumPy mean (README's own idiom) raised an
    orbax traceback and left a temporary folder. Now save refuses what load would, before
    writing anything, and stores NumPy / JAX values as JSON numbers."""
    model = SmallResNet(3, widths=(4, 8), rngs=nnx.Rngs(7))
    for meta, said in [(META | {"mean": [0.5, 0.5]}, "mean .*expected 3 finite numbers"),
                       # a fresh user: a NaN mean was saved, loaded, and blamed on the images
                       (META | {"mean": [float("nan")] * 3}, "mean .*expected 3 finite"),
                       (META | {"num_classes": "3"}, "num_classes '3'; expected a positive"),
                       # a fresh user: a wrong channel count in input_shape blamed the mean
                       (META | {"input_shape": [32, 32, 1]},
                        r"mean .*expected 1 finite numbers \(one per input channel, input_shape "
                        r"\[32, 32, 1\]; they disagree: input_shape or mean is wrong\)"),
                       (META | {"note": object()}, "JSON values .*type object"),
                       # a fresh user: saved, then `ntk-tt predict --checkpoint` refused it
                       (META | {"mean": [120.0] * 3}, r"mean \[120.0, .*looks like 0\.\.255"),
                       (META | {"std": [0.0, 0.2, 0.2]}, "std must be finite and > 0")]:
        with pytest.raises(ValueError, match=said + ".*fix meta before saving"):
            ntk_tt.save_checkpoint(tmp_path / "ck", model, meta)
        assert not list(tmp_path.iterdir())
    meta = META | {"mean": np.full(3, 0.5, np.float32), "num_classes": np.int64(3),
                   "std": jax.numpy.full(3, 0.25)}
    ntk_tt.save_checkpoint(tmp_path / "ck", model, meta)
    back, stored = ntk_tt.load_checkpoint(tmp_path / "ck")
    assert without_digest(stored) == META and type(stored["num_classes"]) is int
    for a, b in zip(leaves(model), leaves(back), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_checkpoint_saved_on_other_devices_loads_on_this_one(tmp_path):
    """The stored sharding names the saving machine's devices; a GPU loading a checkpoint
    written on a CPU failed with orbax's 'Topology mismatch' (seen on an H200). Here the
    checkpoint is written by a process with two CPU devices, its arrays on the second one
    (absent in this one-device process), and must load with the same weights."""
    code = (
        "import sys, jax, ntk_tt\n"
        "from flax import nnx\n"
        "from ntk_tt.models import SmallResNet\n"
        "m = SmallResNet(3, widths=(4, 8), rngs=nnx.Rngs(7))\n"
        "graphdef, state = nnx.split(m)\n"
        "state = jax.device_put(state, jax.devices()[1])\n"
        "m = nnx.merge(graphdef, state)\n"
        "assert all(a.devices() == {jax.devices()[1]} for a in jax.tree.leaves(nnx.state(m)))\n"
        f"ntk_tt.save_checkpoint(sys.argv[1], m, {META!r})\n"
        "import numpy as np\n"
        "np.savez(sys.argv[2], *map(np.asarray, jax.tree.leaves(nnx.state(m))))\n")
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", code, tmp_path / "ck", tmp_path / "w.npz"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(jax.devices()) == 1
    back, _ = ntk_tt.load_checkpoint(tmp_path / "ck")
    saved = np.load(tmp_path / "w.npz")
    saved = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    for a, b in zip(saved, leaves(back), strict=True):
        np.testing.assert_array_equal(a, np.asarray(b))
        assert b.devices() == {jax.devices()[0]}


def test_save_checkpoint_never_deletes_other_files_and_replaces_only_when_asked(tmp_path):
    """A fresh user's probe: save_checkpoint into an existing folder deleted everything in it
    (orbax's force=True), the user's notes and working directory included. Now a folder
    holding other files is refused, an earlier checkpoint is replaced only with
    overwrite=True, and an empty folder or a new path is written."""
    model = SmallResNet(3, widths=(4, 8), rngs=nnx.Rngs(7))
    notes = tmp_path / "mine"
    notes.mkdir()
    (notes / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="holding other files \\(notes.txt\\).*delete them"):
        ntk_tt.save_checkpoint(notes, model, META)
    assert (notes / "notes.txt").read_text() == "keep me"
    with pytest.raises(ValueError, match="is a file"):
        ntk_tt.save_checkpoint(notes / "notes.txt", model, META)
    empty = tmp_path / "empty"
    empty.mkdir()
    ntk_tt.save_checkpoint(empty, model, META)
    other = SmallResNet(3, widths=(4, 8), rngs=nnx.Rngs(8))
    with pytest.raises(ValueError, match="already holds a checkpoint: pass overwrite=True"):
        ntk_tt.save_checkpoint(empty, other, META)
    back, _ = ntk_tt.load_checkpoint(empty)
    for a, b in zip(leaves(model), leaves(back), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    ntk_tt.save_checkpoint(empty, other, META, overwrite=True)
    back, _ = ntk_tt.load_checkpoint(empty)
    for a, b in zip(leaves(other), leaves(back), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_save_checkpoint_path_edge_cases(tmp_path, monkeypatch):
    """A second probe: folders named meta/ and state/ holding a user's file passed for a
    checkpoint (deleted with overwrite=True); "." deleted the working directory; a link to an
    empty folder gave orbax's raw rmtree error; None, overwrite="no" and "~" were not
    checked or expanded. Each is now refused or handled."""
    model = SmallResNet(3, widths=(4, 8), rngs=nnx.Rngs(7))
    fake = tmp_path / "fake"
    (fake / "meta").mkdir(parents=True)
    (fake / "state").mkdir()
    (fake / "state" / "data.csv").write_text("1")
    with pytest.raises(ValueError, match="not a checkpoint that save_checkpoint wrote"):
        ntk_tt.save_checkpoint(fake, model, META, overwrite=True)
    assert (fake / "state" / "data.csv").read_text() == "1"
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    for where in (".", tmp_path):
        with pytest.raises(ValueError, match="is the current folder or holds it"):
            ntk_tt.save_checkpoint(where, model, META)
    assert here.is_dir()
    (tmp_path / "target").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "target")
    ntk_tt.save_checkpoint(tmp_path / "link", model, META)
    assert without_digest(ntk_tt.load_checkpoint(tmp_path / "target")[1]) == META
    for bad, said in [(dict(path=None), "path must be the checkpoint folder's path"),
                      (dict(path=tmp_path / "target", overwrite="no"), "overwrite must be")]:
        with pytest.raises(ValueError, match=said):
            ntk_tt.save_checkpoint(model=model, meta=META, **bad)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ntk_tt.save_checkpoint("~/home_ck", model, META) == (tmp_path / "home_ck").resolve()


@pytest.mark.parametrize("kwargs, said", [
    # a third fresh user: key=3 was accepted, None / "abc" gave a raw flax error, 5.7 classes
    # built a 5-output head and scale=inf NaN weights
    (dict(key=3), "key must be a jax.random key"),
    (dict(key=None), "key must be a jax.random key"),
    (dict(key="abc"), "key must be a jax.random key"),
    (dict(num_classes=5.7), "num_classes must be an integer >= 2, got 5.7"),
    (dict(num_classes=1), "num_classes must be an integer >= 2"),
    (dict(scale=float("inf")), "scale must be a finite number > 0, got inf"),
    (dict(scale=0.0), "scale must be a finite number > 0"),
])
def test_replace_head_refuses_bad_arguments(kwargs, said):
    model = SmallResNet(3, widths=(4, 8), rngs=nnx.Rngs(7))
    args = dict(num_classes=4, key=jax.random.key(0)) | kwargs
    with pytest.raises(ValueError, match=said):
        ntk_tt.replace_head(model, args.pop("num_classes"), **args)


RESAVE = ("save the checkpoint again with the right input_shape (ntk_tt.save_checkpoint(path, "
          "model, dict(meta, input_shape=[H, W, C]), overwrite=True)).")


@pytest.mark.parametrize("shape, said", [
    # a CIFAR-like model saved with a grey dataset's shape, then with the channels wrong alone
    ([28, 28, 1], "meta's input_shape [28, 28, 1] is wrong: the stored weights take 3-channel "
                  "inputs, not 1 (stem/kernel has shape (3, 3, 3, 4), not (3, 3, 1, 4)); "
                  "input_shape must be [H, W, 3] (H × W the images' size the model was "
                  "trained on) with mean and std of 3 values each; " + RESAVE),
    ([32, 32, 1], "meta's input_shape [32, 32, 1] is wrong: the stored weights take 3-channel "
                  "inputs, not 1 "),
    # a fresh user: a 1×1 input_shape loaded and gave NaN logits (the 2×2 pool empties it)
    ([1, 1, 3], "meta's input_shape [1, 1, 3] does not fit its SmallResNet: given one input "
                "of that shape, its layers shrink it to an empty array of shape (1, 0, 0, 4), "
                "so every logit would be NaN; inputs of at least 2×2 px work; " + RESAVE),
], ids=["grey_28x28", "channels_only", "too_small_1x1"])
def test_a_wrong_input_shape_in_meta_is_refused_before_any_work(shape, said, tmp_path,
                                                                 monkeypatch):
    """A fresh user: a checkpoint whose meta records the wrong input_shape loaded (NaN logits
    later) or was refused with a message naming the stem's shapes, and ``ntk-tt predict``
    blamed the dataset's images. Now reading meta refuses it, from the stored arrays' shapes
    and a traced (never computed) forward pass, naming input_shape, what the weights take
    and the fix; no weight is read, nothing compiled, and the CLI's task loader refuses it
    before the dataset."""
    path = tiny_checkpoint(tmp_path / "ck", input_shape=shape, mean=[0.5] * shape[2],
                           std=[0.25] * shape[2])

    def refuse(*_, **__):
        raise AssertionError("weights or data read before meta's input_shape was checked")

    monkeypatch.setattr(ntk_tt.data._checkpoint.ocp.args, "StandardRestore", refuse)
    monkeypatch.setattr("ntk_tt.prediction._job.load_dataset", refuse)
    compiled = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, *_, **__: compiled.append(event)
        if event == "/jax/core/compile/backend_compile_duration" else None)
    for call in (read_meta, ntk_tt.load_checkpoint, lambda p: load_task(checkpoint=p)):
        with pytest.raises(ValueError) as err:
            call(path)
        assert str(err.value).startswith(f"checkpoint at {path}: {said}"), str(err.value)
        assert "\n" not in str(err.value)
    assert compiled == []


@pytest.mark.parametrize("shape, said", [
    ([28, 28, 1], r"^meta's input_shape \[28, 28, 1\] is wrong: the model takes 3-channel "
                  r"inputs, not 1 .*fix meta before saving \(or build the model with "
                  r"in_channels=1\)\.$"),
    ([1, 1, 3], r"^meta's input_shape \[1, 1, 3\] does not fit its SmallResNet: .* every "
                r"logit would be NaN; inputs of at least 2×2 px work; fix meta before "
                r"saving\.$"),
], ids=["grey_28x28", "too_small_1x1"])
def test_save_checkpoint_refuses_a_wrong_input_shape(shape, said, tmp_path):
    model = SmallResNet(3, widths=(4, 8), rngs=nnx.Rngs(7))
    meta = META | {"input_shape": shape, "mean": [0.5] * shape[2], "std": [0.25] * shape[2]}
    with pytest.raises(ValueError, match=said):
        ntk_tt.save_checkpoint(tmp_path / "ck", model, meta)
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("shape", [[32, 32, 3], [28, 28, 3], [2, 2, 3]])
def test_a_right_input_shape_still_loads_with_the_same_logits(shape, tmp_path):
    """The input_shape check refuses no valid checkpoint: any size the model maps to finite
    logits (2×2 is the smallest for a SmallResNet) loads, its logits those of the model it
    was saved from."""
    model = SmallResNet(3, widths=(4, 8), rngs=nnx.Rngs(7))
    ntk_tt.save_checkpoint(tmp_path / "ck", model, META | {"input_shape": shape})
    back, meta = ntk_tt.load_checkpoint(tmp_path / "ck")
    assert meta["input_shape"] == shape
    x = jax.random.normal(jax.random.key(0), (2, *shape))
    logits = back(x)
    assert np.all(np.isfinite(logits))
    np.testing.assert_array_equal(logits, model(x))


def test_save_checkpoint_refuses_a_missing_parent_folder_as_the_other_save_functions(
        tmp_path):
    """A fresh user: save_checkpoint created missing parent folders (orbax does) while
    save_telemetry, IntervalCalibrator.save and OutcomePredictor.save refuse a path whose
    folder does not exist. save_checkpoint now refuses it too, before writing anything, and
    saves once the folder is made."""
    model = SmallResNet(3, widths=(4, 8), rngs=nnx.Rngs(7))
    path = tmp_path / "runs" / "ck"
    with pytest.raises(ValueError) as err:
        ntk_tt.save_checkpoint(path, model, META)
    assert str(err.value) == (f"checkpoint path {path}: folder {tmp_path / 'runs'} does not "
                              "exist; create it first or choose another path.")
    assert not (tmp_path / "runs").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="folder .*file is a file, not a folder; create it"):
        ntk_tt.save_checkpoint(tmp_path / "file" / "ck", model, META)
    with pytest.raises(ValueError, match="does not exist; create it first"):
        ntk_tt.default_calibrator().save(tmp_path / "runs" / "c.json")
    (tmp_path / "runs").mkdir()
    assert ntk_tt.save_checkpoint(path, model, META) == path
    assert without_digest(ntk_tt.load_checkpoint(path)[1]) == META


def test_a_bfloat16_model_saved_loads_back_as_its_float32_weights(tmp_path):
    """A third probe: save_checkpoint of a bfloat16 model succeeded, then load_checkpoint
    called its own file corrupt (the digest covered the bfloat16 arrays, the weights are read
    back into the rebuilt float32 model). The digest is of the arrays as they load: it loads,
    each weight exactly its bfloat16 value."""
    import jax.numpy as jnp

    model = SmallResNet(3, widths=(4, 8), rngs=nnx.Rngs(7))
    nnx.update(model, jax.tree.map(lambda a: a.astype(jnp.bfloat16), nnx.state(model)))
    ntk_tt.save_checkpoint(tmp_path / "ck", model, META)
    back, _ = ntk_tt.load_checkpoint(tmp_path / "ck")
    for a, b in zip(leaves(model), leaves(back), strict=True):
        assert b.dtype == np.float32
        np.testing.assert_array_equal(np.asarray(a).astype(np.float32), np.asarray(b))
