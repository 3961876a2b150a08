"""Benchmark: exact vs sketched empirical NTK (ntk_tt) vs neural-tangents, on real images.

Models (``--nets``): ``cnn``, the plain-JAX CNN of ``_bench_cnn.py`` (conv16-conv32-dense64-
head, D = 105,829 at C = 5), pre-trained here for a few hundred Adam steps on
``cifar10_train_source10k`` (10 classes), then given a fresh seeded 5-class head (paper Sec.
5); ``resnet``, the shipped SmallResNet checkpoint (``ntk_tt.models.SmallResNet``: a stem,
six residual and two strided 3×3 convolutions, D = 120,901 at C = 5) written in plain JAX in
``_bench_resnet.py`` with the same weights and a fresh seeded 5-class head. Task: CIFAR-10
test images of classes 0-4 from ``cifar10_test_300pc`` (N/5 per class). Each measurement
runs in its own subprocess: wall time of the first call (with compilation) and of
``--repeats`` more, steady calls (``steady_s`` their median, ``best_s`` their minimum: this
machine is shared and noisy); peak memory = the subprocess's maximum resident size minus its
resident size after imports and data loading, polled every 2 ms (``_rss.py``; XLA allocations
are host memory on CPU, so RSS sees them; tracemalloc would not), over all calls.

Run:  python experiments/bench_ntk.py [--quick | --sizes 150,750] [--nets cnn,resnet]
      [--nt-impls 3] [--sketch-dims ''] [--widths 1,2,4] [--csv out.csv]
      [--nt-python /work/nt-venv/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _args import at_least, output_file, positive  # experiments/_args.py, beside this script

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data"
NETS = {"cnn": "_bench_cnn", "resnet": "_bench_resnet"}


def _load_params(path):
    import jax.numpy as jnp

    data = np.load(path)
    params = {}
    for key in data.files:
        if "/" in key:
            layer, name = key.split("/")
            params.setdefault(layer, {})[name] = jnp.asarray(data[key])
    return params, jnp.asarray(data["x"])


def worker(spec: dict) -> None:
    """One measurement (run in a subprocess): prints a JSON line."""
    import importlib

    import jax
    from _rss import PeakRSS

    import ntk_tt

    net = importlib.import_module(NETS[spec.get("net", "cnn")])
    params, x = _load_params(spec["input"])
    if spec["method"] == "exact":

        def run():
            return ntk_tt.empirical_ntk(net.apply, params, x, trace_logits=spec["trace"])
    else:

        def run():
            return ntk_tt.sketched_ntk(
                net.apply,
                params,
                x,
                sketch_dim=spec["sketch_dim"],
                key=jax.random.key(spec.get("seed", 0)),
            ).features

    times = []
    with PeakRSS() as mem:
        for _ in range(1 + spec.get("repeats", 1)):
            t0 = time.perf_counter()
            out = np.asarray(jax.block_until_ready(run()))
            times.append(time.perf_counter() - t0)
    np.save(spec["out"], out)
    print(json.dumps({"first_s": times[0], "steady_s": float(np.median(times[1:])),
                      "best_s": min(times[1:]), "peak_mib": mem.delta_mib}))


def _measure(cmd: list[str], timeout: float) -> dict:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=HERE)
    except subprocess.TimeoutExpired:
        return {"note": f"timeout after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"note": "failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1][:80]}
    return json.loads(lines[-1])


def pretrain(steps: int, width: int, seed: int = 0):
    """Adam on the 10-class source set, then a fresh 5-class head: dict of numpy arrays."""
    import _bench_cnn
    import jax
    import optax

    src = np.load(DATA / "cifar10_train_source10k.npz")
    x, y = _bench_cnn.standardise(src["images"]), src["labels"]
    params = jax.tree.map(jax.numpy.asarray, _bench_cnn.init(jax.random.key(seed), 10, width))
    opt = optax.adam(1e-3)
    state = opt.init(params)

    @jax.jit
    def step(params, state, xb, yb):
        def loss(p):
            logits = _bench_cnn.apply(p, xb)
            return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

        value, grads = jax.value_and_grad(loss)(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    rng = np.random.default_rng(seed)
    value = np.nan
    for _ in range(steps):
        idx = rng.choice(len(y), 128, replace=False)
        params, state, value = step(params, state, x[idx], y[idx])
    fresh = _bench_cnn.init(jax.random.key(seed + 1), 5, width)["head"]
    params = {k: {n: np.asarray(v) for n, v in layer.items()} for k, layer in params.items()}
    params["head"] = fresh
    return params, float(value)


def resnet_params(seed: int = 0):
    """The shipped SmallResNet checkpoint with a fresh seeded 5-class head, as the two-level
    dict of ``_bench_resnet.py`` (numpy), after checking both give the same logits."""
    import _bench_resnet
    import jax

    import ntk_tt
    from ntk_tt.data._checkpoint import load_checkpoint

    model, _ = load_checkpoint(None)
    model = ntk_tt.replace_head(model, 5, key=jax.random.key(seed + 1))
    apply_fn, state = ntk_tt.from_nnx(model)
    params = _bench_resnet.from_nnx_params(state)
    x = task_inputs(10, "resnet")
    gap = np.abs(np.asarray(apply_fn(state, x)) - np.asarray(_bench_resnet.apply(params, x)))
    assert gap.max() < 1e-5, f"_bench_resnet differs from SmallResNet by {gap.max():.2g}"
    return params


def task_inputs(n: int, net: str = "cnn") -> np.ndarray:
    """n CIFAR-10 test images, n/5 from each of classes 0-4, standardised (``cnn``: fixed
    CIFAR statistics; ``resnet``: those stored with the checkpoint)."""
    tgt = np.load(DATA / "cifar10_test_300pc.npz")
    idx = np.concatenate([np.flatnonzero(tgt["labels"] == c)[: n // 5] for c in range(5)])
    if net == "cnn":
        import _bench_cnn

        return _bench_cnn.standardise(tgt["images"][idx])
    from ntk_tt.data._checkpoint import read_meta

    meta = read_meta(None)[1]
    return ((tgt["images"][idx].astype(np.float32) / 255 - np.asarray(meta["mean"], np.float32))
            / np.asarray(meta["std"], np.float32))


def _write_input(tmp: Path, name: str, params, x) -> str:
    path = tmp / f"{name}.npz"
    flat = {f"{k}/{n}": v for k, layer in params.items() for n, v in layer.items()}
    np.savez(path, x=x, **flat)
    return str(path)


def _top_eig_error(theta, approx, k=10):
    lam = np.linalg.eigvalsh(theta)[::-1][:k]
    lam_hat = np.linalg.eigvalsh(approx)[::-1][:k]
    return float(np.max(np.abs(lam_hat - lam) / lam))


def _row(rows, **kw):
    rows.append(kw)
    cells = [f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in kw.items()]
    print("  " + ", ".join(cells), flush=True)


def _ours(tmp, inp, rows, n, d, sketch_dims, timeout, model="pre-trained", net="cnn",
          repeats=1):
    me = [sys.executable, str(HERE / "bench_ntk.py"), "--worker"]
    exact_path = str(tmp / f"{net}_exact{n}.npy")
    for trace in (False, True):
        out = exact_path if not trace else str(tmp / f"{net}_traced{n}.npy")
        spec = {"method": "exact", "input": inp, "trace": trace, "out": out, "net": net,
                "repeats": repeats}
        res = _measure([*me, json.dumps(spec)], timeout)
        label = "ntk_tt exact" + (" traced" if trace else "")
        _row(rows, net=net, model=model, method=label, N=n, D=d, **res)
    theta = np.load(exact_path).astype(np.float64)
    r = np.trace(theta) ** 2 / np.sum(theta**2)
    for sd in sketch_dims:
        out = str(tmp / f"{net}_sketch{n}_{sd}.npy")
        spec = {"method": "sketch", "input": inp, "sketch_dim": sd, "out": out, "net": net,
                "repeats": repeats}
        res = _measure([*me, json.dumps(spec)], timeout)
        if "steady_s" in res:
            feats = np.load(out).astype(np.float64)
            approx = feats @ feats.T
            res["rel_frob_err"] = float(np.linalg.norm(approx - theta) / np.linalg.norm(theta))
            res["theory_err"] = float(np.sqrt((1 + r) / sd))
            res["top10_eig_err"] = _top_eig_error(theta, approx)
            res["NCDp_mib"] = n * 5 * sd * 4 / 2**20
            res["DDp_mib"] = d * sd * 4 / 2**20
        _row(rows, net=net, model=model, method=f"ntk_tt sketch D'={sd}", N=n, D=d, **res)
    return theta


def _neural_tangents(tmp, inp, rows, n, d, theta, nt_python, impls, timeout, net="cnn",
                     repeats=1):
    names = {1: "jacobian contraction", 2: "NTK-vector products", 3: "structured derivatives"}
    if not nt_python or not Path(nt_python).exists():
        _row(
            rows,
            net=net,
            model="pre-trained",
            method="neural-tangents",
            N=n,
            D=d,
            note=f"not run: no neural-tangents python at {nt_python!r} (--nt-python)",
        )
        return
    for impl in impls:
        for trace in (0, 1):
            cmd = [nt_python, str(HERE / "_nt_reference.py"), inp, str(impl), str(trace),
                   str(1 + repeats), NETS[net]]
            res = _measure(cmd, timeout)
            if "steady_s" in res and not trace:
                k = np.load(inp.replace(".npz", f"_nt{impl}{trace}.npy"))
                res["diff_vs_ntk_tt"] = float(np.linalg.norm(k - theta) / np.linalg.norm(theta))
            label = f"neural-tangents {names[impl]}" + (" traced" if trace else "")
            _row(rows, net=net, model="pre-trained", method=label, N=n, D=d, **res)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N in {60, 150}, D' in {256, 1024}")
    ap.add_argument("--sizes", default="",
                    help="comma list of task sizes N (multiples of 5), e.g. 750; default "
                         "60,150,750 (60,150 with --quick)")
    ap.add_argument("--nt-python", default=os.environ.get("NT_PYTHON", "/work/nt-venv/bin/python"))
    ap.add_argument("--pretrain-steps", type=int, default=300)
    ap.add_argument(
        "--widths", default="", help="width factors of the D sweep at N=150, e.g. 1,2,4 (slow)"
    )
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per measurement")
    ap.add_argument("--repeats", type=int, default=3,
                    help="steady calls after the first (median and minimum reported)")
    ap.add_argument("--csv", default=None, help="also write the table to this CSV file")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--nt-impls", default="",
                    help="comma list of neural-tangents implementations to time (1 jacobian "
                         "contraction, 2 NTK-vector products, 3 structured derivatives); "
                         "default 1,3 (and 2 for the CNN at N = 60)")
    ap.add_argument("--sketch-dims", default=None,
                    help="comma list of sketch dimensions D' for the CNN ('' for none); "
                         "default 256,1024,4096 (256,1024 with --quick)")
    ap.add_argument("--nets", default="cnn,resnet",
                    help="comma list of cnn (benchmark CNN) and resnet (shipped SmallResNet)")
    args = ap.parse_args(argv)
    if args.worker:
        return worker(json.loads(args.worker))
    nets = args.nets.split(",")
    if not nets or any(k not in NETS for k in nets):
        ap.error(f"--nets takes a comma list of {', '.join(NETS)}, got {args.nets!r}")
    try:
        sizes = [int(v) for v in args.sizes.split(",")] if args.sizes else []
    except ValueError:
        sizes = [0]
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    output_file(ap, args.csv, "--csv")  # it writes after every measurement
    at_least(ap, "--pretrain-steps", args.pretrain_steps, 0, integer=True)
    positive(ap, "--timeout", args.timeout)
    if any(v < 5 or v % 5 for v in sizes):
        ap.error(f"--sizes takes a comma list of multiples of 5, got {args.sizes!r}")
    import pandas as pd

    sizes = sizes or ([60, 150] if args.quick else [60, 150, 750])
    sketch_dims = [256, 1024] if args.quick else [256, 1024, 4096]
    if args.sketch_dims is not None:
        try:
            sketch_dims = [int(v) for v in args.sketch_dims.split(",") if v]
        except ValueError:
            sketch_dims = [0]
        if any(v < 1 for v in sketch_dims):
            ap.error(f"--sketch-dims takes a comma list of integers >= 1 (or ''), got "
                     f"{args.sketch_dims!r}")
    try:
        nt_impls = tuple(int(v) for v in args.nt_impls.split(",") if v)
    except ValueError:
        nt_impls = (0,)
    if any(v not in (1, 2, 3) for v in nt_impls):
        ap.error(f"--nt-impls takes a comma list of 1, 2, 3, got {args.nt_impls!r}")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for net in nets:
            if net == "cnn":
                params, loss = pretrain(args.pretrain_steps, 1)
                print(f"cnn: pre-trained {args.pretrain_steps} Adam steps on the source set, "
                      f"loss {loss:.3f}", flush=True)
            else:
                params = resnet_params()
            d = sum(v.size for layer in params.values() for v in layer.values())
            print(f"{net}: D = {d}", flush=True)
            for n in sizes:
                inp = _write_input(tmp, f"{net}_in{n}", params, task_inputs(n, net))
                # sketches: the CNN only (the target is the exact and traced kernels)
                dims = sketch_dims if n > 60 and net == "cnn" else []
                theta = _ours(tmp, inp, rows, n, d, dims, args.timeout, net=net,
                              repeats=args.repeats)
                # NTK-vector products: 94 s and 15 GB already at N = 150 on the CNN, so only
                # there at N = 60
                impls = nt_impls or ((1, 2, 3) if n == 60 and net == "cnn" else (1, 3))
                _neural_tangents(tmp, inp, rows, n, d, theta, args.nt_python, impls,
                                 args.timeout, net=net, repeats=args.repeats)
        if args.widths and not args.quick:
            import _bench_cnn
            import jax

            for w in [int(s) for s in args.widths.split(",")]:
                p = _bench_cnn.init(jax.random.key(0), 5, w)  # random init for the D sweep
                dw = sum(v.size for layer in p.values() for v in layer.values())
                inp = _write_input(tmp, f"wide{w}", p, task_inputs(150))
                _ours(tmp, inp, rows, 150, dw, [256, 1024], args.timeout, f"random init, w={w}",
                      repeats=args.repeats)
    table = pd.DataFrame(rows)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 30)
    print(table.to_string(index=False, float_format="%.3g"))
    if args.csv:
        table.to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
