"""sharded_empirical_ntk equals the single-device empirical_ntk (8 forced CPU devices)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from _ntk_models import setup
from jax.sharding import Mesh

import ntk_tt

HERE = Path(__file__).parent


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_eight_devices_equal_single_device(kind):
    """XLA_FLAGS must precede the JAX import, so the comparison runs in a fresh process:
    N = 13 rows (padded to 16), with and without x2, full and traced kernels, float32."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(HERE / "_sharding_check.py"), kind],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out.pop("devices") == 8
    assert out.pop("even_shards") == 8  # N divisible by 8: rows stay split over the devices
    assert len(out) == 5
    for case, (err, same_shape) in out.items():
        assert same_shape and err < 1e-5, (case, err)


def test_one_device_and_bad_mesh():
    apply_fn, params, x = setup("mlp", 5)
    got = ntk_tt.sharded_empirical_ntk(apply_fn, params, x, trace_logits=True)
    ref = ntk_tt.empirical_ntk(apply_fn, params, x, trace_logits=True)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    mesh2d = Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1), ("a", "b"))
    with pytest.raises(ValueError, match="1-D"):
        ntk_tt.sharded_empirical_ntk(apply_fn, params, x, mesh=mesh2d)
    with pytest.raises(ValueError, match="x2"):
        ntk_tt.sharded_empirical_ntk(apply_fn, params, x, np.ones((3, 5)))


def test_traced_arguments_are_refused_in_one_line_before_any_work(monkeypatch):
    """A fresh user: jax.jit over sharded_empirical_ntk gave a raw TracerArrayConversionError;
    it pads and places concrete arrays, so a traced params, x or x2 is refused in one line."""
    import ntk_tt.kernels._sharding as sharding

    apply_fn, params, x = setup("mlp", 5)

    def no_work(*args, **kwargs):
        raise AssertionError("kernel work started")

    monkeypatch.setattr(sharding, "pair_shapes", no_work)
    for name, call in (
            ("x", lambda: jax.jit(lambda xx: ntk_tt.sharded_empirical_ntk(apply_fn, params,
                                                                          xx))(x)),
            ("x2", lambda: jax.jit(lambda xx: ntk_tt.sharded_empirical_ntk(apply_fn, params, x,
                                                                           xx))(x)),
            ("params", lambda: jax.grad(lambda p: ntk_tt.sharded_empirical_ntk(
                apply_fn, p, x).sum())(params))):
        with pytest.raises(ValueError, match=rf"^sharded_empirical_ntk builds its kernels from "
                                             rf"concrete arrays .*\({name} is traced\): .*"
                                             rf"\(predict_from_kernel\)") as err:
            call()
        assert "\n" not in str(err.value)
