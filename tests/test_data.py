"""Data loader, task sampler and preprocessing on the vendored real images."""

import pathlib
import re
import warnings

import jax
import numpy as np
import pytest

import ntk_tt
from ntk_tt.data._data import Dataset


@pytest.fixture(scope="module")
def flowers():
    return ntk_tt.load_dataset("flowers5")


def test_vendored_set_is_real_and_balanced(flowers):
    assert flowers.images.dtype == np.uint8 and flowers.images.shape == (1000, 32, 32, 3)
    assert flowers.class_names == ("daisy", "dandelion", "rose", "sunflower", "tulip")
    np.testing.assert_array_equal(np.bincount(flowers.labels), [200] * 5)
    assert flowers.images.std() > 30  # photos, not a constant placeholder
    assert "flowers5" in ntk_tt.known_datasets()


def test_task_sampler_is_seeded_disjoint_and_relabelled(flowers):
    a = ntk_tt.sample_task(flowers, num_classes=3, per_class=20, test_per_class=7,
                           key=jax.random.key(0))
    b = ntk_tt.sample_task(flowers, num_classes=3, per_class=20, test_per_class=7,
                           key=jax.random.key(0))
    c = ntk_tt.sample_task(flowers, num_classes=3, per_class=20, test_per_class=7,
                           key=jax.random.key(1))
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert not np.array_equal(a.x_train, c.x_train)
    assert a.x_train.shape == (60, 32, 32, 3) and a.x_test.shape == (21, 32, 32, 3)
    np.testing.assert_array_equal(np.bincount(a.y_train), [20] * 3)
    np.testing.assert_array_equal(np.bincount(a.y_test), [7] * 3)
    flat = {im.tobytes(): i for i, im in enumerate(flowers.images)}
    train_ids = [flat[im.tobytes()] for im in a.x_train]
    test_ids = [flat[im.tobytes()] for im in a.x_test]
    assert not set(train_ids) & set(test_ids)
    for ids, labels in ((train_ids, a.y_train), (test_ids, a.y_test)):
        original = [a.class_names.index(flowers.class_names[flowers.labels[i]]) for i in ids]
        np.testing.assert_array_equal(original, labels)


def test_held_out_is_capped_by_what_is_left(flowers):
    with pytest.warns(UserWarning, match=r"10 held-out images per class, fewer than the "
                      r"test_per_class = 50 asked for: a chosen class has 200 images"):
        t = ntk_tt.sample_task(flowers, num_classes=2, per_class=190, test_per_class=50,
                               key=jax.random.key(0))
    assert len(t.y_test) == 2 * 10
    with warnings.catch_warnings():  # exactly what is left: no warning
        warnings.simplefilter("error")
        t = ntk_tt.sample_task(flowers, num_classes=2, per_class=190, test_per_class=10,
                               key=jax.random.key(0))
    assert len(t.y_test) == 2 * 10


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_classes=6), "num_classes"), (dict(num_classes=1), r"num_classes \(K\) must be >= 2"),
    (dict(per_class=201), "per_class"), (dict(per_class=0), r"per_class \(n\) must be >= 1"),
])
def test_sampler_rejects_k_and_n_too_large(flowers, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ntk_tt.sample_task(flowers, key=jax.random.key(0), **kwargs)


def test_sampler_rejects_single_class_dataset():
    one = Dataset(np.zeros((10, 4, 4, 1), np.uint8), np.zeros(10, np.int64), ("only",))
    with pytest.raises(ValueError, match="only 1 class.*at least 2"):
        ntk_tt.sample_task(one, num_classes=2, per_class=2, key=jax.random.key(0))


def test_bad_npz_paths_say_what_is_wrong(tmp_path):
    np.savez(tmp_path / "keys.npz", x=np.zeros((2, 4, 4, 3), np.uint8), labels=np.arange(2))
    (tmp_path / "text.npz").write_text("not an archive")
    with pytest.raises(ValueError, match=r"lacks the keys \['images', 'class_names'\].*uint8"):
        ntk_tt.load_dataset(str(tmp_path / "keys.npz"))
    with pytest.raises(ValueError, match="not a numpy .npz archive"):
        ntk_tt.load_dataset(str(tmp_path / "text.npz"))
    for missing in (str(tmp_path / "missing.npz"), "missing.npz", "some/dir"):
        with pytest.raises(ValueError, match="file not found"):
            ntk_tt.load_dataset(missing)


def test_an_npz_path_in_any_case_or_without_extension_is_a_path(flowers, tmp_path,
                                                                   monkeypatch):
    """A fresh user's GOOD.NPZ, an archive saved without extension and arr.npy were "unknown
    dataset" (only a lower-case .npz ending or a / made a name a path); a folder was "file
    not found"."""
    monkeypatch.chdir(tmp_path)
    np.savez(tmp_path / "good.npz", images=flowers.images, labels=flowers.labels,
             class_names=np.asarray(flowers.class_names))
    (tmp_path / "good.npz").rename(tmp_path / "GOOD.NPZ")
    (tmp_path / "gooddata").write_bytes((tmp_path / "GOOD.NPZ").read_bytes())
    np.save(tmp_path / "arr.npy", np.zeros(3))
    for name in ("GOOD.NPZ", "gooddata"):
        got = ntk_tt.load_dataset(name)
        np.testing.assert_array_equal(got.images, flowers.images)
        assert tuple(got.class_names) == tuple(flowers.class_names)
    with pytest.raises(ValueError, match="arr.npy holds a single array, not a numpy .npz"):
        ntk_tt.load_dataset("arr.npy")
    with pytest.raises(ValueError, match="dataset file is a folder, not a file"):
        ntk_tt.load_dataset(str(tmp_path))


def test_unknown_dataset_lists_known_ones():
    with pytest.raises(ValueError, match="unknown dataset 'nope'.*flowers5"):
        ntk_tt.load_dataset("nope")


def test_tfds_name_not_prepared_fails_fast(tmp_path):
    with pytest.raises(ValueError, match="TFDS dataset 'cifar10' is not prepared.*download"):
        ntk_tt.load_dataset("cifar10", data_dir=tmp_path)


def test_damaged_tfds_folder_is_one_error_naming_it(tmp_path):
    """A prepared TFDS folder with an emptied or cut dataset_info.json gave TFDS's own
    "Invalid version ''" or a protobuf ParseError, naming neither the data set nor the folder
    (a known gap): now one ValueError that names both and how to fix it."""
    version = tmp_path / "cifar10" / "1.0.0"
    version.mkdir(parents=True)
    for text, cause in (("", "ParseError"), ("{}", "Invalid version ''"),
                        ('{"name": "cifar10", "version": "1.0.0"}', "Cannot restore")):
        (version / "dataset_info.json").write_text(text)
        with pytest.raises(ValueError, match=rf"TFDS dataset 'cifar10' prepared in "
                                             rf"{re.escape(str(version))} cannot be read "
                                             rf"\(.*{cause}.*prepare it again there"):
            ntk_tt.load_dataset("cifar10", data_dir=tmp_path)


def test_prepare_grey_28px_to_rgb_32px():
    grey = np.zeros((4, 28, 28, 1), np.uint8)
    grey[:, 7:21, 7:21] = 255
    mean, std = np.array([0.1, 0.2, 0.3]), np.array([0.5, 0.5, 0.5])
    x = np.asarray(ntk_tt.prepare_images(grey, (32, 32, 3), mean=mean, std=std))
    assert x.shape == (4, 32, 32, 3) and x.dtype == np.float32
    # all three channels carry the same grey image, each normalised by its own statistics
    np.testing.assert_allclose(x[..., 0] * 0.5 + 0.1, x[..., 2] * 0.5 + 0.3, atol=1e-6)
    # the bright square stays centred and bright after resizing (28 → 32 px)
    assert x[0, 16, 16, 0] == pytest.approx((1 - 0.1) / 0.5, abs=1e-5)
    assert x[0, 1, 1, 0] == pytest.approx((0 - 0.1) / 0.5, abs=1e-5)


def test_prepare_same_size_is_exact_normalisation():
    imgs = np.random.default_rng(0).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    x = ntk_tt.prepare_images(imgs, (32, 32, 3), mean=np.full(3, 0.5), std=np.full(3, 0.25))
    np.testing.assert_allclose(np.asarray(x), (imgs / 255 - 0.5) / 0.25, atol=1e-5)


@pytest.mark.parametrize("shape,kwargs,match", [
    ((2, 32, 32, 4), {}, "only grey"), ((2, 28, 28, 3), dict(resize=False), "resiz"),
    # a second fresh user: channels-first images got no hint, and a mean / std of the wrong
    # length a raw broadcasting error
    ((2, 3, 32, 32), {}, r"look channels-first \(N, C, H, W\): transpose them"),
    ((2, 32, 32, 3), dict(mean=np.zeros(2)), r"mean must hold one value per channel.*\(2,\)"),
    ((2, 32, 32, 3), dict(std=np.ones((3, 1))), r"std must hold one value per channel"),
    # a third fresh user: these gave inf / NaN / near-constant inputs silently, or a raw error
    ((2, 32, 32, 3), dict(std=[0.0, 1.0, 1.0]), r"std must be finite and > 0"),
    ((2, 32, 32, 3), dict(std=[np.nan, 1.0, 1.0]), r"std must be finite and > 0"),
    ((2, 32, 32, 3), dict(std=[-0.2, 0.2, 0.2]), r"std must be finite and > 0"),
    ((2, 32, 32, 3), dict(mean=[125.3, 123.0, 113.9], std=[63.0, 62.1, 66.7]),
     r"mean .* looks like 0\.\.255 units.*mean / 255"),
    ((2, 32, 32, 3), dict(pixels=-100.0), r"finite pixel values in \[0, 255\]"),
    ((2, 32, 32, 3), dict(pixels=np.nan), r"finite pixel values in \[0, 255\]"),
    ((2, 32, 32, 3), dict(input_shape=(32, 32)), r"input_shape must be the model's \(H, W, C\)"),
    # a fourth: a zero or fractional size gave an empty (N, 0, 32, 3) array
    ((2, 32, 32, 3), dict(input_shape=(0, 32, 3)), r"three integers >= 1, got \(0, 32, 3\)"),
    ((2, 32, 32, 3), dict(input_shape=(32.5, 32, 3)), r"three integers >= 1"),
])
def test_prepare_rejects_mismatching_images(shape, kwargs, match):
    kwargs = dict(kwargs)
    dtype = float if "pixels" in kwargs else np.uint8
    imgs = np.full(shape, kwargs.pop("pixels", 0), dtype)
    if "input_shape" in kwargs:
        with pytest.raises(ValueError, match=match):
            ntk_tt.prepare_images(imgs, kwargs["input_shape"], mean=np.zeros(3), std=np.ones(3))
        return
    with pytest.raises(ValueError, match=match):
        ntk_tt.prepare_images(imgs, (32, 32, 3), **(dict(mean=np.zeros(3), std=np.ones(3))
                                                    | kwargs))



def test_prepare_refuses_colour_images_for_a_grey_model_in_words_that_read_right():
    """A fresh user: RGB images for a (32, 32, 1) model were told "only grey (1-channel)
    images are converted, to 1 channels", though a grey model converts nothing. The message
    now says the model takes grey images and how to make them; its suggestion then works (the
    channel mean, as independent reference); an RGB model's message is unchanged."""
    rgb = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3)).astype(np.uint8)
    stats = dict(mean=np.full(1, 0.5), std=np.full(1, 0.25))
    with pytest.raises(ValueError) as err:
        ntk_tt.prepare_images(rgb, (32, 32, 1), **stats)
    assert str(err.value) == (
        "images have shape (32, 32, 3) but the model expects (H, W, C) = (32, 32, 1); the "
        "model takes grey (1-channel) images, and 3-channel ones are not converted to grey: "
        "convert them first (e.g. np.round(images.mean(axis=-1)).astype(np.uint8)) or use a "
        "checkpoint made for these images.")
    grey = np.round(rgb.mean(axis=-1)).astype(np.uint8)
    x = ntk_tt.prepare_images(grey, (32, 32, 1), **stats)
    np.testing.assert_allclose(np.asarray(x), (grey[..., None] / 255 - 0.5) / 0.25, atol=1e-5)
    with pytest.raises(ValueError) as err:
        ntk_tt.prepare_images(np.zeros((2, 32, 32, 4), np.uint8), (32, 32, 3),
                              mean=np.zeros(3), std=np.ones(3))
    assert str(err.value).endswith("only grey (1-channel) images are converted, to 3 channels: "
                                   "use 3-channel data or a checkpoint made for these images.")


def test_prepare_refuses_one_image_without_a_batch_axis():
    """A fresh user: one (32, 32, 3) image for a (32, 32, 3) model came back as
    (32, 32, 32, 3), read silently as 32 grey 32×3 images; now refused with the fix. The
    same image with its batch axis, and a batch of grey (N, H, W) images, still pass."""
    img, stats = np.ones((32, 32, 3), np.uint8), dict(mean=np.zeros(3), std=np.ones(3))
    with pytest.raises(ValueError) as err:
        ntk_tt.prepare_images(img, (32, 32, 3), **stats)
    assert str(err.value) == (
        "images have shape (32, 32, 3) = input_shape: this looks like one image without a "
        "batch axis (it would be read as 32 grey 32×3 images); prepare_images takes a batch "
        "(N, H, W, C): pass images[None], of shape (1, 32, 32, 3).")
    assert ntk_tt.prepare_images(img[None], (32, 32, 3), **stats).shape == (1, 32, 32, 3)
    grey = np.ones((32, 32, 32), np.uint8)  # 32 grey 32×32 images: (N, H, W)
    assert ntk_tt.prepare_images(grey, (32, 32, 3), **stats).shape == (32, 32, 32, 3)

def test_npz_loader_adds_channel_axis_to_grey(tmp_path, monkeypatch):
    path = tmp_path / "mnist_test.npz"
    np.savez(path, images=np.zeros((6, 28, 28), np.uint8), labels=np.arange(6) % 2,
             class_names=np.array(["zero", "one"]))
    monkeypatch.setenv("NTK_TT_DATA_DIR", str(tmp_path))
    d = ntk_tt.load_dataset("mnist_test")
    assert isinstance(d, Dataset) and d.images.shape == (6, 28, 28, 1)
    assert d.class_names == ("zero", "one")
    by_path = ntk_tt.load_dataset(str(path))
    np.testing.assert_array_equal(by_path.images, d.images)


def _npz(tmp_path, images=None, labels=None, class_names=None, name="d.npz"):
    """A small .npz dataset (2 classes, 6 grey 4×4 uint8 images) with one array replaced."""
    path = tmp_path / name
    np.savez(path,
             images=np.zeros((6, 4, 4), np.uint8) + 100 if images is None else images,
             labels=np.arange(6) % 2 if labels is None else labels,
             class_names=np.array(["a", "b"]) if class_names is None else class_names)
    return str(path)


def test_npz_corrupt_zip_is_a_value_error(tmp_path):
    path = tmp_path / "c.npz"
    path.write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(ValueError, match=r"c\.npz is not a numpy \.npz archive \(BadZipFile\)"):
        ntk_tt.load_dataset(str(path))


def test_npz_images_and_labels_must_match_in_length(tmp_path):
    for n in (30, 50):
        with pytest.raises(ValueError, match=rf"images \(40\) and labels \({n}\) of .*differ in "
                                             "length"):
            ntk_tt.load_dataset(_npz(tmp_path, images=np.zeros((40, 4, 4, 3), np.uint8),
                                     labels=np.arange(n) % 2))


def test_npz_float_images_in_0_1_are_rejected(tmp_path):
    imgs = np.random.default_rng(0).random((6, 4, 4, 3)).astype(np.float32)
    imgs[0, 0, 0, 0] = 1.0
    with pytest.raises(ValueError, match=r"images of .* are float with max 1\.0.*store uint8 in "
                                         r"\[0, 255\].*or float in \[0, 255\]"):
        ntk_tt.load_dataset(_npz(tmp_path, images=imgs))


@pytest.mark.parametrize("images,match", [
    (np.full((6, 4, 4), 300.0), r"values in \[300\.0, 300\.0\], outside \[0, 255\]"),
    (np.full((6, 4, 4), -1, np.int16), r"outside \[0, 255\]"),
    (np.full((6, 4, 4), np.nan), "NaN or infinite"),
    (np.full((6, 4, 4), "x"), r"dtype <U1; store uint8"),
    (np.zeros((6, 16), np.uint8), r"shape \(6, 16\); expected \(N, H, W, C\)"),
])
def test_npz_images_outside_0_255_or_malformed_are_rejected(tmp_path, images, match):
    with pytest.raises(ValueError, match="images of .*" + match):
        ntk_tt.load_dataset(_npz(tmp_path, images=images))


def test_npz_float_labels_must_be_whole_numbers(tmp_path):
    with pytest.raises(ValueError, match=r"labels of .* are float with non-integer values "
                                         r"\(e\.g\. 0\.5\)"):
        ntk_tt.load_dataset(_npz(tmp_path, labels=np.array([0.5, 1.5, 0, 1, 0, 1])))
    d = ntk_tt.load_dataset(_npz(tmp_path, labels=np.array([0.0, 1.0] * 3)))
    assert d.labels.dtype == np.int64
    np.testing.assert_array_equal(d.labels, [0, 1] * 3)


@pytest.mark.parametrize("labels,values", [
    (np.array([0, 1, 3, 0, 1, 0]), "from 0 to 3"), (np.array([0, 1, -1, 0, 1, 0]), "from -1 to 1"),
])
def test_npz_labels_must_index_class_names(tmp_path, labels, values):
    with pytest.raises(ValueError, match=r"labels of .* must be integers in \[0, K\) with K = "
                                         rf"len\(class_names\) = 2; got values {values}"):
        ntk_tt.load_dataset(_npz(tmp_path, labels=labels))


def test_npz_string_labels_are_rejected(tmp_path):
    with pytest.raises(ValueError, match=r"labels of .* have dtype <U1; store integer indices "
                                         "into class_names"):
        ntk_tt.load_dataset(_npz(tmp_path, labels=np.array(["a", "b"] * 3)))


def test_npz_one_hot_labels_are_rejected(tmp_path):
    with pytest.raises(ValueError, match=r"labels of .* have shape \(6, 2\).*one-hot\? store "
                                         r"labels\.argmax\(1\)"):
        ntk_tt.load_dataset(_npz(tmp_path, labels=np.eye(2, dtype=np.int64)[np.arange(6) % 2]))


def test_npz_object_class_names_are_rejected(tmp_path):
    names = np.array(["a", "b"], dtype=object)
    with pytest.raises(ValueError, match=r"class_names of .* is an object \(pickled\) array.*"
                                         r"np\.array\(names, dtype=str\)"):
        ntk_tt.load_dataset(_npz(tmp_path, class_names=names))
    with pytest.raises(ValueError, match=r"class_names of .* has shape \(\).*1-D string array"):
        ntk_tt.load_dataset(_npz(tmp_path, class_names=np.array("ab")))


def test_npz_integer_class_names_are_refused_with_the_fix(tmp_path):
    """A fresh user: integer class_names loaded silently as the names '0', '1', ... although
    the documented format is K strings."""
    with pytest.raises(ValueError, match=r"class_names of .* are integers \(int64, e\.g\. 0\); "
                                         r"store the K class names as strings.*"
                                         r"np\.array\(\[str\(c\) for c in class_names\]\)"):
        ntk_tt.load_dataset(_npz(tmp_path, class_names=np.array([0, 1], np.int64)))


@pytest.mark.parametrize("channels", [1, 3])
def test_npz_channels_first_images_are_refused_with_the_transpose(tmp_path, channels):
    """A fresh user: (N, C, H, W) images loaded silently as C-pixel-high images."""
    images = np.zeros((6, channels, 4, 5), np.uint8) + 100
    with pytest.raises(ValueError, match=rf"images of .* have shape \(6, {channels}, 4, 5\), "
                                         r"which looks channels-first \(N, C, H, W\) with "
                                         rf"C = {channels}; .*expects channels-last "
                                         r"\(N, H, W, C\): store images\.transpose\(0, 2, 3, "
                                         rf"1\) \(shape \(6, 4, 5, {channels}\)\)"):
        ntk_tt.load_dataset(_npz(tmp_path, images=images))
    fixed = ntk_tt.load_dataset(_npz(tmp_path, images=images.transpose(0, 2, 3, 1)))
    assert fixed.images.shape == (6, 4, 5, channels)


def test_npz_four_channel_channels_first_images_are_refused(tmp_path):
    """A fresh user: (N, 4, 32, 32) RGBA images loaded as H = 4, W = 32, C = 32."""
    images = np.zeros((6, 4, 8, 8), np.uint8) + 100
    with pytest.raises(ValueError, match=r"images of .* have shape \(6, 4, 8, 8\), which looks "
                                         r"channels-first \(N, C, H, W\) with C = 4, H = W = 8 "
                                         r"\(square\); .*store images\.transpose\(0, 2, 3, 1\) "
                                         r"\(shape \(6, 8, 8, 4\)\)"):
        ntk_tt.load_dataset(_npz(tmp_path, images=images))
    with pytest.raises(ValueError, match=r"with C = 4; load_dataset expects channels-last"):
        ntk_tt.load_dataset(_npz(tmp_path, images=np.zeros((6, 4, 8, 5), np.uint8)))
    # channels-last with C in {1, 3, 4} loads, even with 1, 3 or 4 rows (H)
    for shape in ((6, 4, 8, 4), (6, 3, 8, 3), (6, 1, 8, 1), (6, 4, 4, 3)):
        assert ntk_tt.load_dataset(_npz(tmp_path, images=np.zeros(shape, np.uint8))
                                   ).images.shape == shape


def test_load_dataset_takes_a_path_object_and_refuses_other_types(tmp_path):
    """A fresh user: load_dataset(pathlib.Path('good.npz')) and load_dataset(3) gave
    AttributeError: 'PosixPath' / 'int' object has no attribute 'endswith'."""
    path = pathlib.Path(_npz(tmp_path))
    d = ntk_tt.load_dataset(path)
    assert d.images.shape == (6, 4, 4, 1) and d.class_names == ("a", "b")
    (tmp_path / "noext").write_bytes(path.read_bytes())  # a Path is a file, whatever its name
    assert ntk_tt.load_dataset(tmp_path / "noext").class_names == ("a", "b")
    with pytest.raises(ValueError, match=r"dataset file not found: 'flowers5'"):
        ntk_tt.load_dataset(pathlib.Path("flowers5"))
    for bad, kind in ((3, "an int"), (None, "None"), (b"d.npz", "a bytes"),
                      (["d.npz"], "a list")):
        with pytest.raises(ValueError, match=r"^name must be a dataset name \(str, e\.g\. "
                                             r"'flowers5'\) or the path of an \.npz file \(str "
                                             r"or os\.PathLike, e\.g\. pathlib\.Path\('data\.npz'"
                                             rf"\)\), got {kind}\.$"):
            ntk_tt.load_dataset(bad)


@pytest.mark.parametrize("names,match", [
    (np.array([b"\xe9t\xe9", b"dog"]), r"class_names of .*d\.npz are bytes, and class_names\[0\] "
                                       r"is not UTF-8; store the class names as UTF-8 strings"),
    (np.array(["a", "a"]), r"class_names of .*d\.npz repeat 'a' \(class_names\[0\] and "
                           r"class_names\[1\]\); give each class a distinct name"),
    (np.array(["", " "]), r"class_names of .*d\.npz has an empty or blank name, "
                          r"class_names\[0\] = ''; give every class a non-empty name"),
    (np.array(["a", " \t"]), r"blank name, class_names\[1\] = ' \\t'"),
])
def test_npz_class_names_must_be_utf8_distinct_and_not_blank(tmp_path, names, match):
    """A fresh user: non-UTF-8 bytes names gave a raw UnicodeDecodeError (the CLI printed the
    codec message without the file); duplicate and blank names loaded silently."""
    with pytest.raises(ValueError, match=match) as err:
        ntk_tt.load_dataset(_npz(tmp_path, class_names=names))
    assert type(err.value) is ValueError and "\n" not in str(err.value)


def test_npz_valid_uint8_and_float_0_255_images_still_load(tmp_path):
    grey = np.arange(6 * 16, dtype=np.uint8).reshape(6, 4, 4)
    d = ntk_tt.load_dataset(_npz(tmp_path, images=grey, class_names=np.array([b"a", b"b"])))
    assert d.images.dtype == np.uint8 and d.images.shape == (6, 4, 4, 1)
    np.testing.assert_array_equal(d.images[..., 0], grey)
    assert d.class_names == ("a", "b")
    f = ntk_tt.load_dataset(_npz(tmp_path, images=grey.astype(np.float32) * 2.5, name="f.npz"))
    assert f.images.dtype == np.float32 and f.images.max() == pytest.approx(95 * 2.5)
    x = ntk_tt.prepare_images(f.images, (4, 4, 3), mean=np.zeros(3), std=np.ones(3))
    np.testing.assert_allclose(np.asarray(x)[..., 1], f.images[..., 0] / 255, rtol=1e-6)
    task = ntk_tt.sample_task(f, num_classes=2, per_class=2, key=jax.random.key(0))
    assert task.x_train.shape == (4, 4, 4, 1)


def test_prepare_rejects_float_images_in_0_1():
    with pytest.raises(ValueError, match=r"images are float with max 0\.5.*0\.\.255 is expected"):
        ntk_tt.prepare_images(np.full((2, 4, 4, 3), 0.5), (4, 4, 3), mean=np.zeros(3),
                              std=np.ones(3))


def test_sampler_rejects_labels_outside_class_names():
    bad = Dataset(np.zeros((6, 4, 4, 1), np.uint8), np.array([0, 1, 2, 0, 1, 2]), ("a", "b"))
    with pytest.raises(ValueError, match=r"labels must be integers in \[0, K\) with K = "
                                         r"len\(class_names\) = 2; got values from 0 to 2"):
        ntk_tt.sample_task(bad, num_classes=2, per_class=1, key=jax.random.key(0))
    short = Dataset(np.zeros((5, 4, 4, 1), np.uint8), np.arange(6) % 2, ("a", "b"))
    with pytest.raises(ValueError, match=r"images \(5\) and labels \(6\) differ in length"):
        ntk_tt.sample_task(short, num_classes=2, per_class=1, key=jax.random.key(0))


def test_readme_lists_every_short_dataset_name():
    """README's --dataset option names exactly the code's short names, in its order
    (sorted vendored, then shared: ntk_tt.known_datasets when every file is present)."""
    import re
    from pathlib import Path

    from ntk_tt.data._data import SHARED, VENDORED

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    listed = readme.split("`--dataset NAME|file.npz` (short names:", 1)[1]
    listed = listed.split("holds them;", 1)[0]
    names = [n for n in re.findall(r"`([^`]+)`", listed) if not n.startswith(("..", "$"))]
    assert names == sorted(VENDORED) + list(SHARED)


@pytest.mark.parametrize("kwargs, said", [
    # a third fresh user: raw slice / JAX TypeErrors, and -1 or 2.5 held-out images silently
    (dict(per_class=5.5), r"per_class must be an integer >= 1, got 5.5"),
    (dict(num_classes=2.0), r"num_classes must be an integer >= 2, got 2.0"),
    (dict(test_per_class=-1), r"test_per_class must be an integer >= 0, got -1"),
    (dict(test_per_class=2.5), r"test_per_class must be an integer >= 0"),
    (dict(key=0), r"key must be a jax random key"),
    (dict(key=None), r"key must be a jax random key"),
    (dict(data={"images": 1}), r"data must be an ntk_tt.Dataset"),
])
def test_sample_task_refuses_bad_arguments(kwargs, said):
    args = dict(data=ntk_tt.load_dataset("flowers5"), num_classes=3, per_class=5,
                test_per_class=2, key=jax.random.key(0)) | kwargs
    with pytest.raises(ValueError, match=said):
        ntk_tt.sample_task(args.pop("data"), **args)
