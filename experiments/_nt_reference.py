"""neural-tangents reference timings, run by bench_ntk.py inside a separate environment
(neural-tangents 0.6.5, jax 0.4.25, numpy<2, flax 0.8.1: see ENVIRONMENT.md).

Usage: <nt-python> _nt_reference.py INPUT.npz IMPL TRACE CALLS [MODULE]
  INPUT.npz: params (flattened as "layer/name") and x, written by bench_ntk.py;
  IMPL: 1 jacobian contraction, 2 NTK-vector products, 3 structured derivatives;
  TRACE: 1 for the logit-traced (N, N) kernel, 0 for the full one (trace_axes=());
  CALLS: the first call and CALLS − 1 steady ones (median ``steady_s``, minimum ``best_s``);
    1 for the first call only;
  MODULE: the plain-JAX model, ``_bench_cnn`` (default) or ``_bench_resnet``.
Prints one JSON line: first-call (and steady) seconds, peak memory over the calls (as in
bench_ntk.py); writes the kernel next to the input for the error check.
"""

import importlib
import json
import sys
import time

import jax
import neural_tangents as nt
import numpy as np
from _rss import PeakRSS


def main(path, impl, trace, calls, module="_bench_cnn"):
    net = importlib.import_module(module)
    data = np.load(path)
    params = {}
    for key in data.files:
        if "/" in key:
            layer, name = key.split("/")
            params.setdefault(layer, {})[name] = jax.numpy.asarray(data[key])
    x = jax.numpy.asarray(data["x"])
    fn = nt.empirical_ntk_fn(
        net.apply,
        trace_axes=(-1,) if trace else (),
        vmap_axes=0,
        implementation=nt.NtkImplementation(impl),
    )
    fn = jax.jit(fn)
    times = []
    with PeakRSS() as mem:
        for _ in range(calls):
            t0 = time.perf_counter()
            k = np.asarray(fn(x, None, params))
            times.append(time.perf_counter() - t0)
    if not trace:  # (N, N, C, C) → (N·C, N·C) sample-major
        n, _, c, _ = k.shape
        k = k.transpose(0, 2, 1, 3).reshape(n * c, n * c)
    np.save(path.replace(".npz", f"_nt{impl}{trace}.npy"), k)
    res = {"first_s": times[0], "peak_mib": mem.delta_mib, "nt_jax": jax.__version__}
    if calls > 1:
        res["steady_s"] = float(np.median(times[1:]))
        res["best_s"] = min(times[1:])
    print(json.dumps(res))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:])
