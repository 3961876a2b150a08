"""Run as a script with 8 forced CPU devices: sharded_empirical_ntk vs empirical_ntk.

Prints one JSON line {case: max |Θ_sharded − Θ| / max |Θ|} plus the device and shard counts.
``XLA_FLAGS`` must be set before JAX is imported, hence a separate process (test_sharding).
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from _ntk_models import inputs, setup  # noqa: E402

import ntk_tt  # noqa: E402

kind = sys.argv[1]
apply_fn, params, x = setup(kind, 13)  # 13 samples: padded to 16 over 8 devices
x2 = inputs(kind, jax.random.key(5), 6)
out = {"devices": jax.device_count()}
for trace in (False, True):
    for name, second in (("sym", None), ("cross", x2)):
        got = ntk_tt.sharded_empirical_ntk(apply_fn, params, x, second, trace_logits=trace)
        ref = np.asarray(ntk_tt.empirical_ntk(apply_fn, params, x, second, trace_logits=trace))
        err = float(np.max(np.abs(np.asarray(got) - ref)) / np.max(np.abs(ref)))
        out[f"{name}_trace{int(trace)}"] = [err, list(got.shape) == list(ref.shape)]
x16 = inputs(kind, jax.random.key(7), 16)
got = ntk_tt.sharded_empirical_ntk(apply_fn, params, x16)
ref = np.asarray(ntk_tt.empirical_ntk(apply_fn, params, x16))
out["even_rows"] = [float(np.max(np.abs(np.asarray(got) - ref)) / np.max(np.abs(ref))), True]
out["even_shards"] = len(got.sharding.device_set)
print(json.dumps(out))
