"""The notebooks run as written (their code cells, in order, in one namespace), in quick mode
(``NTK_TT_NOTEBOOK_QUICK=1``: small sizes), and what they compute is checked against an
independent reference."""

import json
import pathlib

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import optax
import pytest

ROOT = pathlib.Path(__file__).parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _run(path, monkeypatch) -> dict:
    monkeypatch.setenv("NTK_TT_NOTEBOOK_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    matplotlib.use("Agg")
    monkeypatch.chdir(ROOT)
    namespace: dict = {}
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), path.name, "exec"), namespace)
    import matplotlib.pyplot as plt

    plt.close("all")
    return namespace


def _mean_ce(logits, y) -> float:
    return float(optax.softmax_cross_entropy_with_integer_labels(logits, y).mean())


def check_quickstart(ns):
    steps = ns["STEPS"]
    assert ns["QUICK"] and ns["out"].loss.shape == (8, steps + 1)  # the sweep ran
    # every swept curve starts at the real cross-entropy of the pre-trained logits
    l0 = _mean_ce(ns["apply_fn"](ns["params"], ns["x"]), ns["y"])
    np.testing.assert_allclose(np.asarray(ns["out"].loss[:, 0]), l0, rtol=1e-5)
    np.testing.assert_allclose(ns["pred"].loss[0], l0, rtol=1e-5)
    # jax.grad of the final loss against a central difference of the same function
    lr, h = 2e-3, 1e-4
    fd = (float(ns["final_loss"](lr + h)) - float(ns["final_loss"](lr - h))) / (2 * h)
    np.testing.assert_allclose(float(jax.grad(ns["final_loss"])(lr)), fd, rtol=2e-2)


def check_whatif(ns):
    # the MSE GD / heavy-ball boundary is the closed-form edge 2(1 + m)N/λ_max, λ_max of
    # Θ/C ⊗ I_C from an independent float64 eigendecomposition, within one grid step (2 %)
    theta = np.asarray(ns["theta"], np.float64)
    n, c = theta.shape[0], 5
    lam = np.linalg.eigvalsh(theta)[-1] / c
    # (the linear model's own rule, ``diverged``); the predicted boundary, which also stops
    # at a transient spike above 10·L_0, is never above it
    mse = ns["mse"]
    edge = 2 * (1 + mse.momenta) * n / lam
    ratio = mse.learning_rates[1] / mse.learning_rates[0]
    assert mse.diverged.any(axis=1).all() and mse.boundary_inside.all()
    stable = mse.learning_rates[mse.diverged.argmax(axis=1) - 1]
    np.testing.assert_array_equal(stable, ns["stable"])
    assert np.all(stable <= edge * 1.001), (stable, edge)
    assert np.all(stable >= edge / ratio / 1.001), (stable, edge)
    assert np.all(mse.boundary <= stable), (mse.boundary, stable)
    # one heat map per B, of the requested grid, with a boundary inside it for GD
    for b, grid in ns["grids"].items():
        assert grid.training_time.shape == (len(ns["MOMENTA"]), ns["NUM_LR"]), b
    assert ns["grids"][None].boundary_inside.any()
    # the suggestion's predicted steps to target = an independent head-aware prediction's
    sug, real = ns["sug"], ns["real"]
    assert sug.found and real["config"].iloc[0] == "suggestion"
    assert abs(real["predicted_steps"].iloc[0] - sug.steps) <= 1
    assert len(real) >= 2  # real runs at the suggestion and at least one neighbour
    # predicted and real curves start at the same loss: the real initial cross-entropy
    l0 = _mean_ce(ns["apply_fn"](ns["params"], ns["x"]), ns["y"])
    for pred, run in ns["curves"].values():
        assert pred.shape == run.shape == (ns["STEPS"] + 1,)
        np.testing.assert_allclose([pred[0], run[0]], l0, rtol=1e-4)


def check_benchmark(ns):
    stored = json.loads((ROOT / "experiments/results/sweep/summary.json").read_text())
    for opt in ("gd", "sgd"):
        ref = stored["headline"]["all"][opt]["pooled_0.1_0.4"]["ntk"]
        assert ns["headline"].loc[opt, "n"] == ref["n"]
        np.testing.assert_allclose(ns["headline"].loc[opt, "p95"], ref["p95"], rtol=1e-9)
        np.testing.assert_allclose(ns["headline"].loc[opt, "within_20pct"],
                                   ref["within_20pct"], rtol=1e-9)
    ref = stored["breakdown"]["kappa_eff"]["12.0"]["sgd"]["ntk"]
    np.testing.assert_allclose(ns["slices"]["kappa_eff"].loc[12.0, ("p95", "sgd")],
                               round(ref["p95"], 3), atol=1e-12)
    assert set(ns["paths"]) >= {"fig1_scatter.png", "fig6_factors.png"}
    assert all(ns["paths"][f].stat().st_size > 10_000  # figures with something drawn
               for f in ("fig1_scatter.png", "fig6_factors.png"))


def check_own_model(ns):
    pred, run, steps = ns["pred"], ns["run"], ns["STEPS"]
    assert pred.loss.shape == run.loss.shape == (steps + 1,)
    assert pred.kernel.startswith("head_aware")
    # the .npz round trip holds every digit image, in 0..255
    assert len(ns["source"].labels) + len(ns["target"].labels) == 1797
    assert ns["source"].images.max() == 255
    # predicted and real start at the real initial loss; short training barely separates them
    l0 = _mean_ce(ns["apply_fn"](ns["params"], ns["x"]), jnp.asarray(ns["task"].y_train))
    np.testing.assert_allclose([pred.loss[0], run.loss[0]], l0, rtol=1e-4)
    assert run.loss[-1] < 0.7 * run.loss[0] and not run.diverged
    assert ns["report"]["curve_distance"]["loss"]["max_abs"] < 0.5 * (run.loss[0] - run.loss[-1])
    assert ns["pretrain"].loss[-1] < ns["pretrain"].loss[0]


CHECKS = {"quickstart": check_quickstart, "whatif": check_whatif,
          "benchmark": check_benchmark, "own_model": check_own_model}


def test_every_notebook_is_checked():
    assert {p.stem for p in NOTEBOOKS} == set(CHECKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_and_computes(path, monkeypatch):
    CHECKS[path.stem](_run(path, monkeypatch))
