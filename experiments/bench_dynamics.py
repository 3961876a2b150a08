"""Wall time of each dynamics method for N = 750, C = 5, T = 150, as one table from one run.

A random PSD kernel with a power-law spectrum (Θ = A Aᵀ, A of shape (N·C, 512) with column
scales k^(−0.6), like a sketched NTK) stands in for a real one; the dynamics cost does not
depend on where Θ came from. "first call" includes JIT compilation, "steady" is a second call.

    python experiments/bench_dynamics.py [--out results.csv]
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import jax
import jax.numpy as jnp
import pandas as pd
from _args import output_file  # experiments/_args.py, beside this script

import ntk_tt
from ntk_tt.dynamics._fspace import top_eigenvalue

N, C, T, B, PATHS, SKETCH = 750, 5, 150, 50, 32, 256


def problem(key):
    ka, kf, ky, kg = jax.random.split(key, 4)
    scales = jnp.arange(1, 513, dtype=jnp.float32) ** -0.6
    a = jax.random.normal(ka, (N * C, 512)) * scales
    kernel = a @ a.T
    f0 = 0.1 * jax.random.normal(kf, (N, C))
    y = jax.random.randint(ky, (N,), 0, C)
    feats = 0.05 * jax.random.normal(kg, (N * C, SKETCH))
    lr = 0.5 * N / float(top_eigenvalue(kernel))  # κ = 0.5
    return kernel, f0, y, feats, lr


def cases(kernel, f0, y, feats, lr, key):
    run = partial(ntk_tt.predict_from_kernel, kernel, f0, y, learning_rate=lr, steps=T)
    return {
        "closed form (MSE, GD)": lambda: run(loss="mse", method="closed_form"),
        "ODE (CE, GD, diffrax Tsit5)": lambda: run(method="ode"),
        f"SDE (CE, B={B}, {PATHS} paths, D'={SKETCH})": lambda: run(
            method="sde", batch_size=B, key=key, noise_features=feats, num_paths=PATHS),
        "discrete GD (CE)": lambda: run(method="discrete"),
        f"discrete SGD (CE, B={B}, {PATHS} seeds)": lambda: run(
            method="discrete", batch_size=B, key=key, num_paths=PATHS),
    }


def timed(fn):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="optional CSV path for the table")
    args = parser.parse_args()
    output_file(parser, args.out, "--out")  # written after every method's timing
    key = jax.random.key(0)
    kernel, f0, y, feats, lr = problem(key)
    rows = []
    for name, fn in cases(kernel, f0, y, feats, lr, jax.random.fold_in(key, 1)).items():
        first = timed(fn)
        rows.append({"method": name, "first call s": first, "steady s": timed(fn)})
    table = pd.DataFrame(rows)
    print(f"N = {N}, C = {C}, T = {T}, float32, {jax.devices()[0].platform}")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    if args.out:
        table.to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
