"""Issue 10 item 1: does ``empirical_ntk(..., memory_limit=...)`` bound the memory it uses?

    python experiments/memory_plan_check.py [LIMIT_BYTES]

Model: conv3×3(3→16) relu conv3×3(16→16) relu, global average pool, dense 16→10, on N = 64
random 64 × 64 × 3 inputs. Prints the block size chosen, the peak RSS rise during the
kernel (polled, experiments/_rss.py) and the limit, or the ``NTKMemoryError`` line.
"""

import argparse

import jax
from _args import at_least  # experiments/_args.py, beside this script
from _rss import PeakRSS

import ntk_tt


def model():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {"c1": jax.random.normal(k1, (3, 3, 3, 16)) / 5,
              "c2": jax.random.normal(k2, (3, 3, 16, 16)) / 12,
              "head": jax.random.normal(k3, (16, 10)) / 4}

    def apply_fn(p, x):
        dn = ("NHWC", "HWIO", "NHWC")
        h = jax.nn.relu(jax.lax.conv_general_dilated(x, p["c1"], (1, 1), "SAME",
                                                     dimension_numbers=dn))
        h = jax.nn.relu(jax.lax.conv_general_dilated(h, p["c2"], (1, 1), "SAME",
                                                     dimension_numbers=dn))
        return h.mean(axis=(1, 2)) @ p["head"]

    return apply_fn, params, jax.random.normal(jax.random.key(1), (64, 64, 64, 3))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("limit", nargs="?", type=float, default=64e6, metavar="LIMIT_BYTES",
                   help="memory_limit in bytes (default 64e6)")
    limit = p.parse_args(argv).limit  # a bare sys.argv read: --help was a float() traceback
    at_least(p, "LIMIT_BYTES", limit, 1)
    apply_fn, params, x = model()
    jax.block_until_ready(apply_fn(params, x[:2]))
    try:
        with PeakRSS() as m:
            theta = jax.block_until_ready(ntk_tt.empirical_ntk(apply_fn, params, x,
                                                               memory_limit=int(limit)))
    except ntk_tt.NTKMemoryError as err:
        print(f"limit {limit / 2**20:.1f} MiB: NTKMemoryError: {err}")
        return
    print(f"limit {limit / 2**20:.1f} MiB: Θ {tuple(theta.shape)}, peak RSS rise "
          f"{m.delta_mib:.0f} MiB")


if __name__ == "__main__":
    main()
