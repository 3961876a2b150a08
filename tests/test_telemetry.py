"""Telemetry of real fine-tuning: schema, values against brute-force references, no effect on
the run, JSON round trip, truncation to the first k updates."""

import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.flatten_util import ravel_pytree

import ntk_tt
from ntk_tt.telemetry._telemetry import SCHEMA_VERSION, Telemetry, TelemetrySpec, truncate

N, D, F, C, T = 24, 5, 8, 3, 12
F64 = jnp.float64

FIELDS = [  # (name, shape) for T = 12 updates and the default snapshots {0, 1, 2, 5, 10, 12}
    ("learning_rate", ()), ("momentum", ()), ("nesterov", ()), ("batch_size", ()),
    ("steps", ()), ("num_train", ()), ("num_classes", ()), ("loss_name", ()),
    ("snr_samples", ()), ("stopped_at", ()),
    ("loss", (T + 1,)), ("accuracy", (T + 1,)), ("weight_distance", (T + 1,)),
    ("weight_norm", (T + 1,)), ("head_norm", (T + 1,)),
    ("grad_norm", (T,)), ("grad_snr", (T,)),
    ("snapshot_steps", (6,)), ("max_prob_mean", (6,)), ("saturated_fraction", (6,)),
    ("dead_relu_fraction", (6,)), ("test_loss", (6,)), ("test_accuracy", (6,)),
]


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


class Net(nnx.Module):
    """ReLU backbone Linear(D, F) and a linear ``head``."""

    def __init__(self, *, rngs):
        self.body = nnx.Linear(D, F, param_dtype=F64, rngs=rngs)
        self.head = nnx.Linear(F, C, param_dtype=F64, rngs=rngs)

    def __call__(self, x):
        return self.head(jax.nn.relu(self.body(x)))


@functools.cache
def _problem():
    """The model's telemetry features, (apply_fn, params) and data (float64: call it with x64
    on). Built once, so every run shares one ``apply_fn`` and ``features`` and reuses the
    compiled programs of earlier runs of the same shapes and settings."""
    kx, ky = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (N + 6, D), F64)
    y = jax.random.randint(ky, (N + 6,), 0, C)
    model = Net(rngs=nnx.Rngs(1))
    apply_fn, params = ntk_tt.from_nnx(model)
    return ntk_tt.model_features(model), apply_fn, params, x[:N], y[:N], x[N:], y[N:]


def _run(telemetry, *, lr=0.5, momentum=0.0, batch_size=8, steps=T, test=True):
    features, apply_fn, params, x, y, xt, yt = _problem()
    spec = (TelemetrySpec(features=features, **telemetry)
            if isinstance(telemetry, dict) else telemetry)
    run = ntk_tt.finetune(apply_fn, params, x, y, learning_rate=lr, momentum=momentum,
                          steps=steps, batch_size=batch_size, key=jax.random.key(2),
                          x_test=xt if test else None, y_test=yt if test else None,
                          telemetry=spec)
    return run, (apply_fn, params, x, y, xt, yt)


@pytest.fixture(scope="module")
def default_run():
    """One recorded run (default spec with features, held-out split), shared."""
    with jax.enable_x64(True):
        return _run({})[0]


def _ce(logits, y):
    """Independent mean cross-entropy in numpy."""
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return -np.mean(logp[np.arange(len(y)), y])


def test_schema_pinned(default_run):
    tele = default_run.telemetry
    assert SCHEMA_VERSION == 1
    assert [f.name for f in dataclasses.fields(Telemetry)] == [name for name, _ in FIELDS]
    for name, shape in FIELDS:
        assert np.shape(getattr(tele, name)) == shape, name
    np.testing.assert_array_equal(tele.snapshot_steps, [0, 1, 2, 5, 10, 12])
    assert (tele.learning_rate, tele.momentum, tele.nesterov, tele.batch_size, tele.steps,
            tele.num_train, tele.num_classes, tele.loss_name, tele.snr_samples,
            tele.stopped_at) == (0.5, 0.0, False, 8, T, N, C, "cross_entropy", 8, -1)
    row = tele.to_dict()
    assert list(row) == ["schema_version"] + [name for name, _ in FIELDS]
    long = ntk_tt.telemetry._telemetry.snapshot_steps(TelemetrySpec(), 60)
    np.testing.assert_array_equal(long, [0, 1, 2, 5, 10, 20, 50, 60])
    spec = TelemetrySpec(snapshot_steps=[7, 3, 3, 99, -1])
    mine = ntk_tt.telemetry._telemetry.snapshot_steps(spec, 60)
    np.testing.assert_array_equal(mine, [3, 7])
    for bad in ([1.5], ["a"], 5, [True]):  # a probe: 1.5 was recorded as step 1, 'a' failed
        with pytest.raises(ValueError, match="snapshot_steps must be a list of ints"):
            TelemetrySpec(snapshot_steps=bad)  # inside finetune, naming nothing


@pytest.mark.parametrize("batch_size,snr_samples,momentum", [(8, 4, 0.0), (3, 16, 0.9)])
def test_values_match_brute_force(x64, batch_size, snr_samples, momentum):
    lr = 0.5
    run, (apply_fn, params, x, y, xt, yt) = _run(
        {"snr_samples": snr_samples, "saturation": 0.5}, lr=lr, momentum=momentum,
        batch_size=batch_size)
    tele = run.telemetry
    s = min(batch_size, snr_samples)
    assert tele.snr_samples == s

    @jax.jit  # compiled once per batch shape (op by op it dominated the test's time)
    @jax.grad
    def grad_ce(p, i):
        logits = apply_fn(p, x[i])
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(i)), y[i]])

    batches = np.asarray(ntk_tt.batch_indices(jax.random.key(2), N, batch_size, T))
    opt = optax.sgd(lr, momentum)
    state, p = opt.init(params), params
    w0 = ravel_pytree(params)[0]
    ref = {k: [] for k in ("grad_norm", "grad_snr", "weight_distance", "weight_norm",
                           "head_norm", "snap")}
    for t in range(T + 1):
        w = ravel_pytree(p)[0]
        ref["weight_distance"].append(np.linalg.norm(w - w0))
        ref["weight_norm"].append(np.linalg.norm(w))
        ref["head_norm"].append(np.linalg.norm(np.asarray(p["head"]["kernel"][...])))
        if t in (0, 1, 2, 5, 10, 12):
            probs = np.asarray(jax.nn.softmax(apply_fn(p, x)))
            h = np.maximum(np.asarray(x @ p["body"]["kernel"][...] + p["body"]["bias"][...]),
                           0.0)
            ft = np.asarray(apply_fn(p, xt))
            ref["snap"].append([probs.max(1).mean(), np.mean(probs.max(1) > 0.5),
                                np.mean(h == 0), _ce(ft, np.asarray(yt)),
                                np.mean(ft.argmax(1) == np.asarray(yt))])
        if t == T:
            break
        idx = batches[t]
        g = grad_ce(p, idx)
        ref["grad_norm"].append(np.linalg.norm(ravel_pytree(g)[0]))
        per = np.stack([ravel_pytree(grad_ce(p, idx[j:j + 1]))[0] for j in range(s)])
        mean = per.mean(0)
        ref["grad_snr"].append(mean @ mean / np.mean(np.sum((per - mean) ** 2, 1)))
        if batch_size <= snr_samples:  # the SNR's mean gradient is the minibatch gradient
            np.testing.assert_allclose(mean, ravel_pytree(g)[0], rtol=1e-10, atol=1e-14)
        upd, state = opt.update(g, state, p)
        p = optax.apply_updates(p, upd)

    for k in ("grad_norm", "grad_snr", "weight_distance", "weight_norm", "head_norm"):
        np.testing.assert_allclose(getattr(tele, k), ref[k], rtol=1e-9, atol=1e-12, err_msg=k)
    snap = np.asarray(ref["snap"])
    for i, k in enumerate(("max_prob_mean", "saturated_fraction", "dead_relu_fraction",
                           "test_loss", "test_accuracy")):
        np.testing.assert_allclose(getattr(tele, k), snap[:, i], rtol=1e-9, err_msg=k)
    assert 0 < snap[:, 1].max() and 0 < snap[:, 2].min()  # the references are not trivial
    np.testing.assert_array_equal(tele.loss, run.loss)
    np.testing.assert_array_equal(tele.accuracy, 1.0 - run.error)
    assert tele.test_accuracy[-1] == pytest.approx(run.test_accuracy)


def test_recording_does_not_change_the_run(x64, default_run):
    off, on = _run(False)[0], default_run
    assert off.telemetry is None and on.telemetry is not None
    np.testing.assert_array_equal(on.loss, off.loss)
    np.testing.assert_array_equal(on.error, off.error)
    assert on.test_accuracy == off.test_accuracy
    for a, b in zip(jax.tree_util.tree_leaves(on.params), jax.tree_util.tree_leaves(off.params),
                    strict=True):
        np.testing.assert_array_equal(a, b)


def test_no_head_no_features_no_test_and_a_stop():
    """dict parameters (no head), B = 1 (no SNR), no held-out split; η so large that the
    loss overflows float32 at update 1: later updates are NaN, the rest held."""
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {"w1": jax.random.normal(k1, (D, F)), "w2": jax.random.normal(k2, (F, C))}

    def mlp(p, x):
        return jnp.tanh(x @ p["w1"]) @ p["w2"]

    x = jax.random.normal(k3, (N, D))
    y = jnp.arange(N) % C
    ok = ntk_tt.finetune(mlp, params, x, y, learning_rate=0.1, steps=4, batch_size=1,
                         key=jax.random.key(1), telemetry=True).telemetry
    assert np.isnan(ok.head_norm).all() and np.isnan(ok.dead_relu_fraction).all()
    assert np.isnan(ok.test_loss).all() and np.isnan(ok.test_accuracy).all()
    assert np.isnan(ok.grad_snr).all() and np.isfinite(ok.grad_norm).all()
    assert ok.snr_samples == 1
    bad = ntk_tt.finetune(mlp, params, x, y, learning_rate=1e30, steps=T, loss="mse",
                          telemetry=True)
    tele = bad.telemetry
    assert tele.stopped_at == 1 and bad.diverged
    assert np.isfinite(tele.grad_norm[0]) and np.isnan(tele.grad_norm[1:]).all()
    np.testing.assert_array_equal(tele.weight_distance, 0.0)  # held at w0
    np.testing.assert_array_equal(tele.max_prob_mean, tele.max_prob_mean[0])
    assert truncate(tele, 0).stopped_at == -1 and truncate(tele, 1).stopped_at == 1


def _equal(a: Telemetry, b: Telemetry):
    for f in dataclasses.fields(Telemetry):
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if isinstance(va, np.ndarray):
            assert va.dtype == vb.dtype, f.name
            np.testing.assert_array_equal(va, vb, err_msg=f.name)
        else:
            assert va == vb and type(va) is type(vb), f.name


def test_json_round_trip(default_run, tmp_path):
    tele = default_run.telemetry
    nan = np.full_like(tele.test_loss, np.nan)  # no held-out split; a loss spike at step 1:
    odd = dataclasses.replace(  # gradient norms may overflow (-inf: test_telemetry_checks.py)
        tele, loss=np.r_[tele.loss[0], 10 * tele.loss[0], tele.loss[2:]], test_loss=nan,
        grad_norm=np.r_[tele.grad_norm[0], np.inf, np.nan, tele.grad_norm[3:]], test_accuracy=nan)
    for t in (tele, odd):
        text = json.dumps(t.to_dict(), allow_nan=False)  # standard JSON: no NaN literals
        _equal(Telemetry.from_dict(json.loads(text)), t)
    assert odd.to_dict()["grad_norm"][1:3] == ["inf", None]
    path = tmp_path / "runs.jsonl"
    ntk_tt.save_telemetry(path, [tele, odd])
    back = ntk_tt.load_telemetry(path)
    assert len(back) == 2 and len(path.read_text().splitlines()) == 2
    _equal(back[0], tele)
    _equal(back[1], odd)
    with pytest.raises(ValueError, match=r"runs.jsonl exists; pass overwrite=True to "
                                         r"replace it.*Nothing was written"):
        ntk_tt.save_telemetry(path, tele)  # used to replace the two runs silently
    assert len(ntk_tt.load_telemetry(path)) == 2
    ntk_tt.save_telemetry(path, tele, overwrite=True)
    _equal(ntk_tt.load_telemetry(path)[0], tele)
    with pytest.raises(ValueError, match=r"telemetry path .*: folder .*nowhere' does not "
                                         r"exist; create it first"):
        ntk_tt.save_telemetry(tmp_path / "nowhere" / "runs.jsonl", tele)
    row = tele.to_dict()
    with pytest.raises(ValueError, match="schema_version"):
        Telemetry.from_dict(row | {"schema_version": 0})
    with pytest.raises(ValueError, match="missing"):
        Telemetry.from_dict({k: v for k, v in row.items() if k != "grad_snr"})


def test_truncate_keeps_nothing_past_k(default_run):
    tele, k = default_run.telemetry, 5
    cut = truncate(tele, k)
    assert cut.loss.shape == cut.weight_norm.shape == (k + 1,)
    assert cut.grad_norm.shape == cut.grad_snr.shape == (k,)
    np.testing.assert_array_equal(cut.snapshot_steps, [0, 1, 2, 5])
    assert cut.test_loss.shape == (4,) and cut.steps == T
    np.testing.assert_array_equal(cut.loss, tele.loss[:k + 1])
    np.testing.assert_array_equal(cut.grad_norm, tele.grad_norm[:k])
    # Everything after update k replaced by garbage: the truncation does not change.
    late = tele.snapshot_steps > k
    garbage = {f: np.where(np.arange(T + 1) > k, 1e9, getattr(tele, f))
               for f in ("loss", "accuracy", "weight_distance", "weight_norm", "head_norm")}
    garbage |= {f: np.where(np.arange(1, T + 1) > k, -7.0, getattr(tele, f))
                for f in ("grad_norm", "grad_snr")}
    garbage |= {f: np.where(late, 3.0, getattr(tele, f))
                for f in ("max_prob_mean", "saturated_fraction", "dead_relu_fraction",
                          "test_loss", "test_accuracy")}
    _equal(truncate(dataclasses.replace(tele, stopped_at=9, **garbage), k), cut)
    _equal(truncate(tele, T), tele)
    for bad in (-1, T + 1, 2.0, True):
        with pytest.raises(ValueError, match="k must be"):
            truncate(tele, bad)
    # a third fresh user: a FineTuneRun or a dict gave an AttributeError
    for wrong in (tele.to_dict(), None):
        with pytest.raises(ValueError, match="truncate takes a Telemetry"):
            truncate(wrong, 2)


def test_validation(x64):
    _, apply_fn, params, x, y, _, _ = _problem()
    with pytest.raises(ValueError, match="telemetry must be"):
        ntk_tt.finetune(apply_fn, params, x, y, learning_rate=0.1, steps=2, telemetry="yes")
    with pytest.raises(ValueError, match="snr_samples"):
        TelemetrySpec(snr_samples=1)
    with pytest.raises(ValueError, match="saturation"):
        TelemetrySpec(saturation=1.0)
    with pytest.raises(ValueError, match=r"\(N, F\)"):
        ntk_tt.finetune(apply_fn, params, x, y, learning_rate=0.1, steps=2,
                        telemetry=TelemetrySpec(features=lambda p, x: x[0]))


def test_telemetry_files_and_records_are_checked_with_file_and_line(default_run, tmp_path):
    """A file that is not JSON Lines gave a bare JSONDecodeError (no file, no line), a list of
    other records an AttributeError after the file was already truncated; now ValueErrors
    naming the file and line, or the record, and nothing written."""
    path = tmp_path / "garbage.jsonl"
    good = json.dumps(default_run.telemetry.to_dict())
    path.write_text(good + "\n\n{not json\n")
    with pytest.raises(ValueError, match=r"garbage.jsonl, line 3: not JSON \(Expecting"):
        ntk_tt.load_telemetry(path)
    path.write_text(good + "\n" + json.dumps({"schema_version": 0}) + "\n")
    with pytest.raises(ValueError, match=r"garbage.jsonl, line 2: telemetry schema_version 0"):
        ntk_tt.load_telemetry(path)
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ValueError, match=r"garbage.jsonl: not a UTF-8 text JSON Lines file"):
        ntk_tt.load_telemetry(path)
    path.write_text("")
    assert ntk_tt.load_telemetry(path) == []
    out = tmp_path / "runs.jsonl"
    for runs, where in (([1, 2], r"item 0 of runs is an int\."),
                        ([default_run.telemetry, "x"], r"item 1 of runs is a str\."),
                        (default_run.telemetry.to_dict(), r"; runs is a dict\."),
                        (None, r"; runs is None\.")):
        with pytest.raises(ValueError, match=r"save_telemetry writes Telemetry records .*"
                                             + where + r".*Nothing was written"):
            ntk_tt.save_telemetry(out, runs)
        assert not out.exists()
    for empty in ([], ()):  # wrote an empty file, which ntk-tt outcome then refused
        with pytest.raises(ValueError, match=r"save_telemetry got no runs \(an empty sequence\); "
                                             "nothing was written"):
            ntk_tt.save_telemetry(out, empty)
        assert not out.exists()
    ntk_tt.save_telemetry(out, (t for t in [default_run.telemetry]))  # any iterable
    assert len(ntk_tt.load_telemetry(out)) == 1
    with pytest.raises(ValueError, match=r"telemetry path .* is a directory; give a file name"):
        ntk_tt.save_telemetry(tmp_path, [default_run.telemetry])  # was a raw IsADirectoryError



def test_load_telemetry_names_a_missing_file(tmp_path):
    """A fresh user: load_telemetry("/tmp/nope.jsonl") was a bare FileNotFoundError (a
    folder an IsADirectoryError), where ``ntk-tt outcome`` said the runs file does not exist;
    now a ValueError naming the path and what to pass. Pure path checks: no run needed."""
    for path in (tmp_path / "nope.jsonl", str(tmp_path / "nope.jsonl"), tmp_path):
        with pytest.raises(ValueError) as err:
            ntk_tt.load_telemetry(path)
        assert str(err.value) == (
            f"telemetry file {str(path)!r} does not exist (or is not a file); pass the path "
            "of a JSON Lines file that ntk_tt.save_telemetry wrote.")

def test_save_telemetry_refuses_a_path_that_is_not_a_path(tmp_path, default_run):
    """A fresh user: save_telemetry(3, runs) gave pathlib's bare TypeError; the arguments
    swapped gave one too."""
    tele = default_run.telemetry
    said = (r"^the telemetry path must be a str or os\.PathLike, got {} \(an int would be taken "
            r"for an open file descriptor\); call e\.g\. save_telemetry\('runs\.jsonl', "
            r"\[run\.telemetry\]\); nothing was written\.$")
    for path, kind in ((3, "an int"), (tele, "a Telemetry"), (None, "None")):
        with pytest.raises(ValueError, match=said.format(kind)):
            ntk_tt.save_telemetry(path, [tele])
    # swapped: the list's repr was cut at 40 characters, "got list ([Telemetry(learning_..."
    with pytest.raises(ValueError, match=said.format("a list")) as err:
        ntk_tt.save_telemetry([tele], str(tmp_path / "runs.jsonl"))
    assert "\n" not in str(err.value) and "Telemetry(" not in str(err.value)
    assert not (tmp_path / "runs.jsonl").exists()


def test_save_and_load_functions_take_paths_only_and_expand_the_home_folder(
        tmp_path, default_run, monkeypatch):
    """A fresh user: load_telemetry(f.fileno()) read an open file by its descriptor and closed
    it (load_telemetry(True) closed stdout); "~/t.jsonl" was a bare FileNotFoundError in four
    save functions while save_checkpoint expanded it."""
    with open(tmp_path / "open.txt", "w") as fh:
        fd = fh.fileno()
        calls = (ntk_tt.load_telemetry, ntk_tt.OutcomePredictor.load,
                 ntk_tt.IntervalCalibrator.load, ntk_tt.default_calibrator().save,
                 ntk_tt.default_outcome_predictor().save)
        for call in calls:
            for bad in (fd, True):
                with pytest.raises(ValueError, match=r"path must be a str or os\.PathLike, got "
                                                     r"(an int|a bool) \(an int would be taken"):
                    call(bad)
        os.fstat(fd)  # still open
        fh.write("x")
    monkeypatch.setenv("HOME", str(tmp_path))
    ntk_tt.save_telemetry("~/t.jsonl", [default_run.telemetry])
    assert ntk_tt.load_telemetry(tmp_path / "t.jsonl")[0].to_dict() == \
        default_run.telemetry.to_dict()
    assert len(ntk_tt.load_telemetry("~/t.jsonl")) == 1
    ntk_tt.default_calibrator().save("~/c.json")
    assert ntk_tt.IntervalCalibrator.load("~/c.json") == ntk_tt.default_calibrator()
    ntk_tt.default_outcome_predictor().save("~/p.json.gz")
    assert (tmp_path / "p.json.gz").is_file()
    assert ntk_tt.OutcomePredictor.load("~/p.json.gz").columns == \
        ntk_tt.default_outcome_predictor().columns


def test_model_features_without_a_head_names_the_telemetry_feature():
    """The message named 'the head-aware predictor' (split_head's) when telemetry asked."""

    class NoHead(nnx.Module):
        def __init__(self):
            self.out = nnx.Linear(D, C, rngs=nnx.Rngs(0))

        def __call__(self, x):
            return self.out(x)

    for model in (NoHead(), object()):
        with pytest.raises(ValueError, match=r"^model_features needs an NNX model .*"
                                             r"dead_relu_fraction.*TelemetrySpec\(features="):
            ntk_tt.model_features(model)
