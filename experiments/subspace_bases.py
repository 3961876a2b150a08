"""Which feature directions the subspace kernel needs, and which of its blocks (issue 26).

    python experiments/subspace_bases.py --out OUT.jsonl [--per-class 10 50]
    python experiments/subspace_bases.py --out OUT.jsonl --report

``backbone="subspace"`` keeps the backbone feature kernel K_h exact on the k = 16 leading
principal directions Z of the centred training features and brings the full preset's T_ε p95
from 22.7 / 23.0 % to 9.9 / 15.6 % (GD / SGD), but its Gram costs k²/C ≈ 51 times the default's
logit-summed Θ. This asks whether a cheaper kernel keeps the gain. Per task, K_h is computed
once on Q, an orthonormal basis of span(Z, W_0) (21 directions: Z and the fresh head's C
columns), and every kernel below is read off it exactly (for a basis U = Q·R in span(Q),
K_U(i, j) = Rᵀ K_Q(i, j) R):

* ``p4``, ``p8``, ``p16``: the leading 4, 8, 16 principal directions (``p16`` is the shipped
  ``backbone="subspace"``; the Gram costs k²/C times Θ's: 3.2, 12.8, 51);
* ``head5``: the span of W_0's columns alone (the directions the loss gradient takes at step 0;
  C²/C = 5 times); ``head5p3``, ``head5p11``: W_0's span plus the leading 3 or 11 principal
  directions (k = 8, 16);
* ``diag16``: ``p16`` with every cross-direction block dropped, K(ia, jb) = 0 for a ≠ b (Schur
  product with 1 ⊗ I_k, so still positive semi-definite); its Gram costs k/C = 3.2 times Θ's,
  as ``p4``.

Each is predicted on every main-grid row (κ̃ ≤ 12) of the committed full preset of the given
sizes (``experiments/results/sweep``; GD, and minibatch rows as the mean over the sweep's batch
orders, path 0 the real run's, exactly as ``feature_subspace.py``). Rows resume per task (one
JSON line per row). ``--report``: T_ε p95 / mean (signed median) pooled over ε ∈ {0.1, 0.4}
per kernel, optimiser, κ̃ and N, with the default's stored predictions beside them. Nothing is
fitted; every kernel is reported.
"""

from __future__ import annotations

import argparse
import json
import time

import error_budget as eb
import jax
import jax.numpy as jnp
import pandas as pd
from _args import no_rows, rows_file  # experiments/_args.py, beside this script
from feature_shrinkage import pending_tasks, print_groups
from feature_subspace import write_rows

from ntk_tt.kernels._head_aware import HeadAwareKernel, _Projected, feature_basis
from ntk_tt.kernels._ntk import empirical_ntk

NAMES = ("p4", "p8", "p16", "head5", "head5p3", "head5p11", "diag16")


def _orth(a):
    return jnp.linalg.qr(a)[0]


def kernels(split, x) -> tuple[dict, float]:
    """Every kernel of ``NAMES`` read off one K_Q, and K_Q's seconds."""
    feature_fn, bparams, w0, b0 = split
    h0 = feature_fn(bparams, x)
    n, z = h0.shape[0], feature_basis(h0, 16)
    q = _orth(jnp.concatenate([z, w0], axis=1))
    t0 = time.perf_counter()
    kq = empirical_ntk(jax.tree_util.Partial(_Projected(feature_fn), q), bparams, x)
    kq.block_until_ready()
    seconds = time.perf_counter() - t0
    big = kq.reshape(n, q.shape[1], n, q.shape[1])

    def on(u, diagonal=False):
        r = q.T @ u
        k = jnp.einsum("iajb,ac,bd->icjd", big, r, r)
        if diagonal:
            k = k * jnp.eye(u.shape[1])[None, :, None, :]
        return HeadAwareKernel(h0, w0, b0, k.reshape(n * u.shape[1], -1), None, None, None, u)

    head = _orth(w0)
    out = {"p4": on(z[:, :4]), "p8": on(z[:, :8]), "p16": on(z), "head5": on(head),
           "head5p3": on(_orth(jnp.concatenate([w0, z[:, :3]], 1))),
           "head5p11": on(_orth(jnp.concatenate([w0, z[:, :11]], 1))),
           "diag16": on(z, diagonal=True)}
    return out, seconds


def collect(path: str, per_class) -> None:
    df = pd.read_parquet(eb.SWEEP)
    df = df[(df.kappa_eff < 13) & df.per_class.isin(per_class)]
    no_rows(df, f"--per-class {list(per_class)}")
    with open(path, "a") as out:
        for group, task, data in pending_tasks(path, df):
            kern, seconds = kernels(data.split, data.x)
            write_rows(out, group, task, data, kern, kernel_seconds=seconds)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--per-class", type=int, nargs="+", default=[10, 50])
    p.add_argument("--report", action="store_true")
    a = p.parse_args(argv)
    rows_file(p, a.out, a.report)  # before any work
    if a.report:
        rows = [json.loads(line) for line in open(a.out)]
        print(f"{len(rows)} rows; |T̂_ε − T_ε|/T_ε pooled over ε ∈ {{0.1, 0.4}}")
        print_groups(rows, ["default", *NAMES])
    else:
        collect(a.out, a.per_class)


if __name__ == "__main__":
    main()
