"""App. D check: MSE-curve T_ε on N samples predicted from N' < N, against the full kernel.

    python experiments/extrapolate.py --out experiments/results/extrapolate/mnist_test.csv

Shipped checkpoint, fresh seeded 5-class head, K classes × n images of a real target set,
traced kernel. The N-sample kernel is computed once (the reference, Prop. 2 on its exact
spectrum); each class-balanced subset of N' samples (drawn from ``--seed``) gives the App. D
power-law extrapolation (``extrapolate_spectrum``, library defaults) and the Nyström
spectrum (``nystrom_spectrum``). The subset and cross kernels are slices of the full one: the
same values that ``empirical_ntk(..., x_subset)`` would give, at no extra cost here. η is set
by κ = η·μ_max of the full kernel. One row per (N', seed, method, κ, ε).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import numpy as np
import pandas as pd

import ntk_tt

EPSILONS = (0.01, 0.1, 0.4)


def _ints(text):
    return [int(v) for v in text.split(",")]


def check_args(p: argparse.ArgumentParser, a) -> list[float]:
    """Every argument before any work, one ``extrapolate: error:`` line (a fresh user's
    --per-class -1 was blamed on N', and --kappas 0 failed after the kernel was built);
    returns the κ values."""

    def fail(msg):
        p.exit(2, f"extrapolate: error: {msg}\n")

    if not a.dataset.endswith(".npz") and "/" not in a.dataset \
            and a.dataset not in ntk_tt.known_datasets():  # (an .npz path or TFDS name loads)
        fail(f"--dataset {a.dataset}: not a target set here; known: "
             f"{', '.join(ntk_tt.known_datasets())} (the shared ones need ../shared/data or "
             "$NTK_TT_DATA_DIR).")
    for flag, v, low in (("--classes", a.classes, 2), ("--per-class", a.per_class, 2),
                         ("--steps", a.steps, 1)):
        if v < low:
            fail(f"{flag} must be an integer >= {low}, got {v}.")
    try:
        kappas = [float(v) for v in a.kappas.split(",")]
    except ValueError:
        fail(f"--kappas must be comma-separated numbers, got {a.kappas!r}.")
    if not all(np.isfinite(kappas)) or min(kappas) <= 0:
        fail(f"--kappas must be finite numbers > 0 (κ = η·λ_max/N), got {a.kappas}.")
    if min(a.seeds) < 0:
        fail(f"--seeds must be integers >= 0, got {a.seeds}.")
    k, n = a.classes, a.classes * a.per_class
    for n_sub in a.subsets:
        if n_sub % k or not k <= n_sub < n:
            fail(f"N' = {n_sub} (--subsets) must be a multiple of K = {k} (--classes) in "
                 f"[K, N) = [{k}, {n}) (N = --classes × --per-class).")
    return kappas


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="experiments/results/extrapolate/mnist_test.csv")
    p.add_argument("--dataset", default="mnist_test")
    p.add_argument("--classes", type=int, default=5)
    p.add_argument("--per-class", type=int, default=100)
    p.add_argument("--subsets", type=_ints, default=[100, 250], help="N' values, comma-separated")
    p.add_argument("--seeds", type=_ints, default=[0, 1], help="subset draws")
    p.add_argument("--kappas", default="0.25,1.0", help="κ = η·λ_max/N values")
    p.add_argument("--steps", type=int, default=150)
    a = p.parse_args(argv)
    kappas = check_args(p, a)
    k = a.classes
    model, meta = ntk_tt.load_checkpoint()
    model = ntk_tt.replace_head(model, k, key=jax.random.key(1))
    apply_fn, params = ntk_tt.from_nnx(model)
    task = ntk_tt.sample_task(ntk_tt.load_dataset(a.dataset), num_classes=k,
                              per_class=a.per_class, test_per_class=1, key=jax.random.key(0))
    x = ntk_tt.prepare_images(task.x_train, tuple(meta["input_shape"]),
                              mean=np.asarray(meta["mean"]), std=np.asarray(meta["std"]))
    y = np.asarray(task.y_train)
    t0 = time.perf_counter()
    kern = np.asarray(ntk_tt.empirical_ntk(apply_fn, params, x, trace_logits=True))
    t_kernel = time.perf_counter() - t0
    r = np.asarray(apply_fn(params, x)) - np.eye(k)[y]
    full = ntk_tt.kernel_spectrum(kern, r)
    rows = []
    for seed in a.seeds:
        keys = jax.random.split(jax.random.key(100 + seed), k)
        perms = [np.where(y == c)[0][np.asarray(jax.random.permutation(keys[c], a.per_class))]
                 for c in range(k)]
        for n_sub in a.subsets:
            idx = np.sort(np.concatenate([pc[: n_sub // k] for pc in perms]))
            spectra = {
                "power_law": ntk_tt.extrapolate_spectrum(kern[np.ix_(idx, idx)], r[idx], r),
                "nystrom": ntk_tt.nystrom_spectrum(kern[:, idx], kern[np.ix_(idx, idx)], r),
            }
            for kappa in kappas:
                lr = kappa / float(full.eigenvalues[0])
                ref = ntk_tt.predict_curve_from_spectrum(full, learning_rate=lr, steps=a.steps)
                for method, sp in spectra.items():
                    cur = ntk_tt.predict_curve_from_spectrum(sp, learning_rate=lr, steps=a.steps)
                    dist = float(np.max(np.abs(cur - ref)) / (ref[0] - ref[-1]))
                    for eps in EPSILONS:
                        t_ref = ntk_tt.training_time(ref, eps)
                        t_est = ntk_tt.training_time(cur, eps)
                        rows.append(dict(dataset=a.dataset, n=len(y), n_subset=n_sub, seed=seed,
                                         method=method, kappa=kappa, epsilon=eps,
                                         t_full=t_ref, t_subset=t_est,
                                         rel_error=(t_est - t_ref) / t_ref,
                                         curve_distance=dist, kernel_s=round(t_kernel, 1)))
    df = pd.DataFrame(rows)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(a.out, index=False)
    summary = df.groupby(["n_subset", "method", "epsilon"])["rel_error"].apply(
        lambda e: np.max(np.abs(e)))
    print(summary.to_string())
    print(f"kernel N = {len(y)}: {t_kernel:.1f} s; rows: {a.out}")


if __name__ == "__main__":
    main()
