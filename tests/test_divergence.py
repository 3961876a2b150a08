"""Divergence vs a spike: one rule for real runs and predictions (issue 10, item 4); the
prediction's tri-state verdict on the real run (issue 25, item 3); the three-way outcome and
the call on the real run (issue 26, item 3).

References: a plain optax loop written here (real runs), the closed form of GD on a diagonal
kernel (predictions), curves read by hand (the rule itself), real ``ntk_tt.finetune`` runs of
a flax MLP with λ_max of its brute-force NTK (the verdict).
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _dynamics_helpers import brute_ntk
from flax import nnx

import ntk_tt
from ntk_tt._cli_report import format_report
from ntk_tt.dynamics._divergence import (
    CATAPULT,
    CONVERGES,
    DIVERGES,
    KAPPA_MAX,
    OUTCOMES,
    VERDICTS,
    Outcome,
    call,
    divergence,
    outcome,
    paths_outcome,
    verdict,
)
from ntk_tt.dynamics._losses import mean_loss
from ntk_tt.prediction._compare import predicted_summary

WIDTH, N, D, C = 1024, 32, 16, 2


def relu_net(params, x):
    """Two-layer ReLU network in NTK parameterisation."""
    return jax.nn.relu(x @ params["w1"]) @ params["w2"] / np.sqrt(WIDTH)


def catapult_problem(dtype):
    k1, k2, k3, k4 = jax.random.split(jax.random.key(0), 4)
    params = {"w1": jax.random.normal(k1, (D, WIDTH), dtype) / np.sqrt(D),
              "w2": jax.random.normal(k2, (WIDTH, C), dtype)}
    x = jax.random.normal(k3, (N, D), dtype)
    y = jax.random.randint(k4, (N,), 0, C)
    return params, x, y


@pytest.fixture(scope="module")
def catapult_lr():
    """η = 4·N/λ_max (κ = 4), λ_max of the empirical NTK J Jᵀ (N·C, N·C) by brute force."""
    with jax.enable_x64(True):
        params, x, _ = catapult_problem(jnp.float64)
        jac = jax.jit(jax.jacrev(lambda q: relu_net(q, x).reshape(-1)))(params)
        jac = jnp.concatenate([a.reshape(a.shape[0], -1) for a in jax.tree.leaves(jac)], 1)
        return 4.0 * N / float(jnp.linalg.eigvalsh(jac @ jac.T)[-1])


def optax_curve(params, x, y, lr, steps):
    """Independent reference: full-batch optax.sgd, full-set MSE after every step."""
    opt = optax.sgd(lr)
    state = opt.init(params)
    curve = [float(mean_loss(relu_net(params, x), y, "mse"))]
    grad = jax.jit(jax.grad(lambda p: mean_loss(relu_net(p, x), y, "mse")))
    for _ in range(steps):
        upd, state = opt.update(grad(params), state, params)
        params = optax.apply_updates(params, upd)
        curve.append(float(mean_loss(relu_net(params, x), y, "mse")))
    return np.asarray(curve)


def test_catapult_spikes_recovers_and_is_not_diverged(catapult_lr):
    """κ = η·λ_max/N = 4 (twice the linear model's edge): the real net spikes above 10·L_0 and
    converges below L_0; finetune trains through the spike exactly like plain optax."""
    steps, lr = 20, catapult_lr
    with jax.enable_x64(True):
        params, x, y = catapult_problem(jnp.float64)
        ref = optax_curve(params, x, y, lr, steps)
        run = ntk_tt.finetune(relu_net, params, x, y, learning_rate=lr, steps=steps, loss="mse")
        pred = ntk_tt.predict(relu_net, params, x, y, learning_rate=lr, steps=steps, loss="mse")
    spike = int(np.argmax(ref > 10 * ref[0]))
    assert spike >= 1 and ref[-1] < 1e-2 * ref[0]  # the reference really spikes and recovers
    np.testing.assert_allclose(run.loss, ref, rtol=1e-8)
    assert not run.diverged and run.diverged_at is None and run.spiked_at == spike
    report = ntk_tt.compare(pred, run)
    # the linear model beyond its edge does blow up: a correct predicted flag, not "both"
    assert report["diverged"] == {"predicted": True, "real": False}
    assert report["real"]["spiked_at"] == spike and report["predicted"]["beyond_edge"]
    # T_ε as for any run, not "diverged" (the loss curve's is undefined for another reason:
    # the spike inflates training_time's noise floor; the error curve's is defined)
    t_real = ntk_tt.training_time(run.error, 0.1)
    assert report["real"]["training_time"]["error"][0.1] == t_real > spike
    reasons = report["real"]["training_time_reasons"]
    assert not any("diverged" in r for c in reasons.values() for r in c.values())


def test_truly_divergent_run_is_diverged_with_finite_held_curves(catapult_lr):
    """κ = 400: the loss overflows; the run stops at the first non-finite step of the optax
    reference and holds its last finite value."""
    params, x, y = catapult_problem(jnp.float32)
    lr = 100 * catapult_lr
    steps = 20
    with np.errstate(over="ignore", invalid="ignore"):
        ref = optax_curve(params, x, y, lr, steps)
    stop = int(np.argmax(~np.isfinite(ref)))
    assert 1 <= stop <= steps and np.all(ref[1:stop] > ref[0])
    run = ntk_tt.finetune(relu_net, params, x, y, learning_rate=lr, steps=steps, loss="mse")
    assert run.diverged and run.diverged_at == 1 and run.spiked_at == 1
    np.testing.assert_allclose(run.loss[:stop], ref[:stop], rtol=1e-4)
    assert np.all(run.loss[stop:] == run.loss[stop - 1])
    assert run.seconds["finetune"] == pytest.approx(run.seconds_per_step * stop)


@pytest.mark.parametrize("curve,diverged,diverged_at,spiked_at", [
    ([1.0, 0.8, 15.0, 3.0, 0.5, 0.1], False, -1, 2),      # catapult: spike, recovery
    ([1.0, 0.5, 0.7, 1.2, 1.5], True, 3, -1),             # slow rise, never 10·L_0
    ([1.0, 2.0, 0.9, np.inf, np.nan], True, 3, 3),        # non-finite after a dip
    ([1.0, 20.0, np.nan, 0.5, 0.5], True, 1, 1),          # what follows NaN is ignored
    ([1.0, 1.0, 1.0], False, -1, -1),                      # did not move: not diverged
])
def test_shared_rule_on_hand_read_curves(curve, diverged, diverged_at, spiked_at):
    out = divergence(jnp.asarray(curve))
    assert (bool(out.diverged), int(out.diverged_at), int(out.spiked_at)) == (
        diverged, diverged_at, spiked_at)


def diagonal_case(a2, steps):
    """GD on Θ = diag(k) (logit-summed, N = C = 2, f0 = 0): mode i shrinks by a_i =
    1 − η·k_i/(C·N) per step; sample 0 has a_0 = 0, sample 1 has a_2. Closed-form loss."""
    k = jnp.diag(jnp.asarray([4.0, 4.0 * (1.0 - a2)]))
    y = jnp.asarray([0, 1])
    pred = ntk_tt.predict_from_kernel(k, jnp.zeros((2, 2)), y, learning_rate=1.0, steps=steps,
                                      loss="mse", method="discrete")
    t = np.arange(steps + 1, dtype=float)
    closed = 0.25 * (np.where(t == 0, 1.0, 0.0) + np.float64(a2) ** (2 * t))
    return pred, closed


def test_prediction_that_rises_slowly_above_l0_is_diverged():
    """|a| = 1.1: the loss dips, then rises above L_0 at step 4 but stays below 10·L_0 by
    T = 10 (the old rule missed it)."""
    pred, closed = diagonal_case(-1.1, 10)
    np.testing.assert_allclose(pred.loss, closed, rtol=1e-5)
    rise = int(np.max(np.nonzero(closed <= closed[0])[0])) + 1
    assert closed[-1] < 10 * closed[0] and rise == 4
    assert bool(pred.diverged) and int(pred.diverged_at) == rise
    assert int(pred.spiked_at) == -1 and np.all(pred.training_time_code == 4)


def test_prediction_that_overflows_is_diverged_and_held():
    """|a| = 1000 (float32): the loss overflows at the first step the closed form exceeds the
    float32 range; the curve holds its last finite value from there."""
    pred, closed = diagonal_case(-1000.0, 10)
    stop = int(np.argmax(4 * closed > np.finfo(np.float32).max))  # r² = 4·L overflows
    assert 2 <= stop <= 10
    np.testing.assert_allclose(pred.loss[:stop], closed[:stop], rtol=1e-5)
    assert np.all(pred.loss[stop:] == pred.loss[stop - 1])
    assert bool(pred.diverged) and int(pred.diverged_at) == 1 and int(pred.spiked_at) == 1


@pytest.mark.parametrize("diverged,beyond_edge,expected", [
    (False, False, "no"), (True, False, "yes"), (True, True, "yes"), (False, True, "unknown"),
])
def test_verdict_rule_read_by_hand(diverged, beyond_edge, expected):
    assert VERDICTS[int(verdict(jnp.asarray(diverged), jnp.asarray(beyond_edge)))] == expected


class _CEMLP(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(6, 32, rngs=rngs)
        self.head = nnx.Linear(32, 3, rngs=rngs)

    def __call__(self, x):
        return self.head(jax.nn.relu(self.l1(x)))


@pytest.fixture(scope="module")
def ce_mlp():
    """A flax MLP with a cross-entropy task, and η for κ = η·λ_max/N from an independent
    float64 eigendecomposition of its brute-force NTK (N·C, N·C)."""
    model = _CEMLP(nnx.Rngs(0))
    apply_fn, params = ntk_tt.from_nnx(model)
    x = jax.random.normal(jax.random.key(1), (30, 6))
    y = jnp.arange(30) % 3
    lam = float(np.linalg.eigvalsh(np.asarray(brute_ntk(apply_fn, params, x), np.float64))[-1])
    return model, apply_fn, params, x, y, lambda kappa: kappa * 30 / lam


def _report(pred, run):
    """The keys ``format_report`` reads, around the real prediction and run, as the report's
    JSON holds them."""
    body = ntk_tt.compare(pred, run)
    body["predicted"] = predicted_summary(pred, run.seconds_per_step) | {
        k: body["predicted"][k] for k in ("wall_clock", "test_accuracy")}
    return json.loads(json.dumps(body | {
        "config": {"test_per_class": 0},
        "task": {"dataset": "toy", "classes": ["a", "b", "c"], "n_train": 30, "n_test": 0,
                 "test_per_class": 0, "architecture": "MLP", "num_params": 323,
                 "image_shape": [6], "model_input_shape": [6], "preprocessing": "none"},
        "seconds": {"predict": 0.1, "predict_stages": {"compile": 0.0}, "finetune": 0.1,
                    "compile_finetune": 0.0, "ratio": 1.0},
        "diverged": {"predicted": pred.diverged, "real": run.diverged}}))


def test_frozen_cross_entropy_far_beyond_the_edge_says_unknown_not_no(ce_mlp):
    """The frozen-kernel cross-entropy recursion cannot blow up (its gradient is bounded):
    at κ = 10⁴, 2,500 times the edge 4, the real fine-tune diverges while the prediction's
    curve does not. Its call is "diverges" all the same (κ ≥ KAPPA_MAX, issue 26), said with
    the reason; at κ = 20 (beyond the edge, below KAPPA_MAX) its verdict is "unknown" (not
    "no"); both have no T_ε and the reason, in the API, the report's JSON half and the CLI's
    lines; at κ = 0.5 both the real run and the verdict say "no" and T_ε is defined."""
    _, apply_fn, params, x, y, lr_at = ce_mlp
    far = ntk_tt.finetune(apply_fn, params, x, y, learning_rate=lr_at(1e4), steps=40)
    assert far.diverged and not far.loss[-1] <= far.loss[0]  # the real run blew up
    pred = ntk_tt.predict(apply_fn, params, x, y, learning_rate=lr_at(1e4), steps=40)
    assert pred.kernel == "exact" and pred.kappa == pytest.approx(1e4, rel=1e-3)
    assert not pred.diverged and pred.loss[-1] <= pred.loss[0]  # what the old "no" rested on
    assert pred.beyond_edge and pred.divergence == "yes" and pred.outcome == "diverges"
    assert "κ = η·λ_max/N = 1e+04 ≥ 68, where the real runs" in pred.divergence_reason
    mid = ntk_tt.predict(apply_fn, params, x, y, learning_rate=lr_at(20.0), steps=40)
    assert mid.beyond_edge and mid.divergence == "unknown" and mid.outcome == "unknown"
    assert "beyond the linearised model's stability edge" in mid.divergence_reason
    for p, why in ((pred, "predicted to diverge (the call on the real run is \"diverges\""),
                   (mid, "beyond the stability edge: the linearised model cannot tell")):
        for curve in ("loss", "error"):  # called divergent (a fresh user: T_ε was given) or blind
            assert all(np.isnan(t) for t in p.training_time[curve].values())
            assert all(r.startswith(why) for r in p.training_time_reasons[curve].values())
    to = ntk_tt.predict(apply_fn, params, x, y, learning_rate=lr_at(1e4), steps=40,
                        targets={"loss": 0.5 * float(pred.loss[0])})
    assert np.isnan(to.steps_to_target["loss"][0.5 * float(pred.loss[0])])
    report = _report(pred, far)
    assert report["predicted"]["interval_90"]["loss"] == dict.fromkeys(("0.01", "0.1", "0.4"))
    assert report["predicted"]["divergence"] == "yes"
    assert report["predicted"]["diverged"] is False
    text = format_report(report)
    assert "diverged: predicted True (the predicted loss spiked above 10·L_0 at step 1" in text
    assert "; κ = η·λ_max/N = 1e+04 ≥ 68, where the real " in text
    assert text.endswith("though the predicted curve did not end above L_0), real True")
    assert "predicted: diverges" in text and "beyond the stability" not in text
    mid_run = ntk_tt.finetune(apply_fn, params, x, y, learning_rate=lr_at(20.0), steps=40)
    report = _report(mid, mid_run)
    assert report["predicted"]["divergence"] == "unknown"
    assert ("diverged: predicted unknown (beyond the stability edge: the linearised model "
            "cannot tell), real False") in format_report(report)

    near = ntk_tt.finetune(apply_fn, params, x, y, learning_rate=lr_at(0.5), steps=40)
    small = ntk_tt.predict(apply_fn, params, x, y, learning_rate=lr_at(0.5), steps=40)
    assert not near.diverged and near.loss[-1] < near.loss[0]
    assert not small.beyond_edge and small.divergence == "no" and small.divergence_reason is None
    assert all(np.isfinite(t) for c in ("loss", "error") for t in small.training_time[c].values())
    assert "diverged: predicted False, real False" in format_report(_report(small, near))
    called = ntk_tt.compare(small._replace(outcome="diverges"), near)  # no run to compare
    assert called["curve_distance"] is None and called["predicted"]["test_accuracy"] is None


def test_head_aware_beyond_the_edge_calls_its_own_outcome(ce_mlp):
    """The head-aware recursion can blow up (its head grows): far beyond the edge it predicts
    the real divergence ("yes"); just beyond it, not diverged, its call is its own outcome
    (issue 26: "no", as the real run at κ = 8 converges) and it keeps its T_ε (calibrated
    there, README "Calibrated intervals")."""
    model, apply_fn, params, x, y, lr_at = ce_mlp
    head = ntk_tt.split_head(model)
    far = ntk_tt.predict(apply_fn, params, x, y, learning_rate=lr_at(1e4), steps=40, head=head)
    real = ntk_tt.finetune(apply_fn, params, x, y, learning_rate=lr_at(1e4), steps=40)
    assert real.diverged and far.diverged and far.divergence == "yes"
    near = ntk_tt.predict(apply_fn, params, x, y, learning_rate=lr_at(8.0), steps=40, head=head)
    run = ntk_tt.finetune(apply_fn, params, x, y, learning_rate=lr_at(8.0), steps=40)
    assert not run.diverged and np.all(run.loss[1:] <= run.loss[0])  # it converges
    assert near.beyond_edge and not near.diverged and near.divergence == "no"
    assert near.outcome == "converges" and near.divergence_reason is None
    assert np.isfinite(near.training_time["loss"][0.1])


# --- issue 26: the three-way outcome and the call on the real run ---------------------------


@pytest.mark.parametrize("curve,name,step", [
    ([2.0, 1.5, 1.0, 0.5], "converges", -1),                 # never above L_0
    ([2.0, 1.9, 3.0, 7.0, 1.0, 0.2], "catapult", 2),         # up to 3.5·L_0, back below
    ([2.0, 1.0, 1.5, 2.5, 3.0], "diverges", 3),              # slow rise, ends above L_0
    ([2.0, 30.0, 1e9, 1.6, 1.6], "diverges", 1),             # above 10·L_0, "back" to ln K
    ([2.0, 1.0, 0.5, np.nan, 0.1], "diverges", 3),           # non-finite without a rise
    ([2.0, 2.0, 2.0], "converges", -1),                      # did not move
])
def test_outcome_of_hand_made_curves(curve, name, step):
    out = outcome(jnp.asarray(curve))
    assert (OUTCOMES[int(out.outcome)], int(out.spike_step)) == (name, step)


def test_outcome_of_held_curves_and_batches():
    """A held curve (last finite value repeated from the non-finite step 3 on, with the
    flags of the curve as computed) gets the outcome and spike step of the curve as computed;
    a batch of curves is read row by row."""
    computed = jnp.asarray([2.0, 1.0, 0.5, jnp.nan, jnp.nan])
    held = jnp.asarray([2.0, 1.0, 0.5, 0.5, 0.5])
    div = divergence(computed)
    out = outcome(held, div.diverged, div.spiked_at)
    assert (int(out.outcome), int(out.spike_step)) == (DIVERGES, 3)
    batch = outcome(jnp.asarray([[2.0, 1.0, 0.5], [2.0, 3.0, 1.0], [2.0, 25.0, 1.0]]))
    assert [OUTCOMES[c] for c in np.asarray(batch.outcome)] == ["converges", "catapult",
                                                                "diverges"]
    assert list(np.asarray(batch.spike_step)) == [-1, 1, 1]


def test_paths_outcome_and_call_read_by_hand():
    """Several paths: "diverges" if one does, at its first step above L_0; else the mean
    curve's outcome. The call: "diverges" at κ ≥ KAPPA_MAX whatever the curve, "unknown"
    where the predictor abstains, else its own outcome."""
    calm = jnp.asarray([[2.0, 1.0, 0.5, 0.4], [2.0, 1.5, 2.5, 1.0]])
    mean = jnp.mean(calm, 0)  # [2, 1.25, 1.5, 0.7]: never above L_0
    assert OUTCOMES[int(paths_outcome(calm, mean).outcome)] == "converges"
    wild = calm.at[1].set(jnp.asarray([2.0, 1.0, 1.5, jnp.inf]))
    out = paths_outcome(wild, mean)
    assert (OUTCOMES[int(out.outcome)], int(out.spike_step)) == ("diverges", 3)
    own = Outcome(jnp.asarray([CONVERGES, CATAPULT, CATAPULT, DIVERGES]),
                  jnp.asarray([-1, 2, 2, 1]))
    kappa = jnp.asarray([1.0, 20.0, KAPPA_MAX, 1.0])
    said = call(own, kappa, jnp.asarray([True, True, False, True]))
    assert [OUTCOMES[c] for c in np.asarray(said.outcome)] == ["unknown", "unknown",
                                                               "diverges", "diverges"]
    assert list(np.asarray(said.spike_step)) == [-1, 2, 2, 1]
    # a feature-subspace kernel: its own "diverges" below KAPPA_MAX is a catapult, at or
    # above it the κ rule calls "diverges"; its other calls are unchanged
    own = Outcome(jnp.asarray([DIVERGES, DIVERGES, DIVERGES, CATAPULT, CONVERGES]),
                  jnp.asarray([3, 3, 3, 2, -1]))
    kappa = jnp.asarray([40.0, KAPPA_MAX * 0.999, KAPPA_MAX, 40.0, KAPPA_MAX])
    said = call(own, kappa, jnp.zeros(5, bool), linearised_catapult=True)
    assert [OUTCOMES[c] for c in np.asarray(said.outcome)] == [
        "catapult", "catapult", "diverges", "catapult", "diverges"]
    assert list(np.asarray(said.spike_step)) == [3, 3, 3, 2, -1]
    plain = call(own, kappa, jnp.zeros(5, bool))
    assert [OUTCOMES[c] for c in np.asarray(plain.outcome)][:3] == ["diverges"] * 3


def test_outcomes_of_real_runs_and_the_calls_of_their_predictions(ce_mlp):
    """Real ``ntk_tt.finetune`` runs of the MLP, each read by hand: κ = 0.5 never rises above
    L_0 (converges), κ = 20 rises at step 1 and recovers below 10·L_0 (a catapult), κ = 10⁴
    blows up (diverges). The head-aware prediction calls each of them right, the catapult at
    the real step; the frozen-kernel one calls "converges" within the edge, abstains at 20
    (beyond the edge 4, below KAPPA_MAX) and calls "diverges" at 10⁴ although its own curve
    did not diverge."""
    model, apply_fn, params, x, y, lr_at = ce_mlp
    head = ntk_tt.split_head(model)
    for kappa, real_name, frozen_name in ((0.5, "converges", "converges"),
                                          (20.0, "catapult", "unknown"),
                                          (1e4, "diverges", "diverges")):
        lr = lr_at(kappa)
        run = ntk_tt.finetune(apply_fn, params, x, y, learning_rate=lr, steps=40)
        loss = np.asarray(run.loss)
        rise = np.flatnonzero(loss[1:] > loss[0]) + 1
        by_hand = ("diverges" if run.diverged or np.max(loss) > 10 * loss[0] else
                   "catapult" if rise.size else "converges")
        assert by_hand == real_name
        real = outcome(loss, run.diverged, -1 if run.spiked_at is None else run.spiked_at)
        assert OUTCOMES[int(real.outcome)] == real_name
        if real_name == "catapult":
            assert int(real.spike_step) == rise[0] == 1
        ha = ntk_tt.predict(apply_fn, params, x, y, learning_rate=lr, steps=40, head=head)
        frozen = ntk_tt.predict(apply_fn, params, x, y, learning_rate=lr, steps=40)
        assert (ha.outcome, frozen.outcome) == (real_name, frozen_name)
        if real_name == "catapult":
            assert ha.spike_step == int(real.spike_step)
        report = ntk_tt.compare(ha, run)
        assert report["real"]["outcome"] == report["predicted"]["outcome"] == real_name
    assert not frozen.diverged and frozen.divergence == "yes"


def test_invalid_traced_hyperparameters_are_nan_not_diverged(ce_mlp):
    """Under jit(vmap) η and m are traced, so the eager refusal cannot run: a fresh user's
    sweep over η ∈ {…, −1, NaN} read "diverged" for both. Those entries are now NaN with
    code INVALID and outcome "unknown"; the valid ones equal their eager calls (frozen kernel
    and head-aware), and the eager calls still refuse the invalid values."""
    from ntk_tt.dynamics._training_time import INVALID, REASONS

    model, apply_fn, params, x, y, _ = ce_mlp
    kernel, f0 = ntk_tt.empirical_ntk(apply_fn, params, x), apply_fn(params, x)
    hk = ntk_tt.head_aware_kernel(ntk_tt.split_head(model), x)
    lrs = jnp.array([0.5, 1e3, -1.0, jnp.nan, jnp.inf, 0.0])
    ms = jnp.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.5])
    bad = np.array([False, False, True, True, True, True])
    runs = {"frozen": lambda lr, m: ntk_tt.predict_from_kernel(
                kernel, f0, y, learning_rate=lr, momentum=m, steps=30),
            "head-aware": lambda lr, m: ntk_tt.predict_head_aware(
                hk, y, learning_rate=lr, momentum=m, steps=30)}
    for name, run in runs.items():
        swept = jax.jit(jax.vmap(run))(lrs, ms)
        assert not np.asarray(swept.diverged)[bad].any(), name
        assert np.isnan(np.asarray(swept.loss)[bad]).all(), name
        assert (np.asarray(swept.training_time_code)[bad] == INVALID).all(), name
        assert (np.asarray(swept.outcome)[bad] == 3).all(), name  # "unknown"
        for i in np.flatnonzero(~bad):  # η = 1e3 is chaotic: its curve's last bits differ
            eager = run(float(lrs[i]), float(ms[i]))
            if i == 0:
                np.testing.assert_allclose(swept.loss[i], eager.loss, rtol=1e-5, atol=1e-6)
            assert bool(swept.diverged[i]) == bool(eager.diverged)
            assert int(swept.outcome[i]) == int(eager.outcome)
        with pytest.raises(ValueError, match="learning_rate must be finite and > 0"):
            run(-1.0, 0.0)
    assert "jit / vmap" in REASONS[INVALID]
    # README: "ntk_tt.REASONS names every code"; a fresh user's REASONS[0] was a KeyError
    codes = np.asarray(swept.training_time_code)
    assert set(REASONS) == set(range(8)) and all(int(c) in REASONS for c in codes.ravel())
    assert REASONS[0].startswith("defined")
    ms_bad = jnp.array([0.0, 1.0])  # m = 1 is outside [0, 1) too
    swept = jax.jit(jax.vmap(runs["frozen"]))(jnp.array([0.5, 0.5]), ms_bad)
    assert np.isnan(np.asarray(swept.loss)[1]).all() and np.isfinite(swept.loss[0]).all()
    # a second probe: nesterov=True at a traced m = 0 gave plain GD with code 0, where the
    # eager call refuses it; now INVALID too (frozen, head-aware, and an sgd optimizer), and
    # m = 0.5 beside it equals its eager call
    nesterov = {"frozen": lambda m: ntk_tt.predict_from_kernel(
                    kernel, f0, y, learning_rate=0.5, momentum=m, nesterov=True, steps=30),
                "head-aware": lambda m: ntk_tt.predict_head_aware(
                    hk, y, learning_rate=0.5, momentum=m, nesterov=True, steps=30),
                "optimizer": lambda m: ntk_tt.predict_from_kernel(
                    kernel, f0, y, steps=30, optimizer=ntk_tt.sgd(0.5, m, nesterov=True))}
    for name, run in nesterov.items():
        swept = jax.vmap(run)(jnp.array([0.0, 0.5]))
        assert (np.asarray(swept.training_time_code[0]) == INVALID).all(), name
        assert np.isnan(np.asarray(swept.loss[0])).all() and int(swept.outcome[0]) == 3, name
        np.testing.assert_allclose(swept.loss[1], run(0.5).loss, rtol=1e-5, atol=1e-6)
        with pytest.raises(ValueError, match="Nesterov needs momentum > 0"):
            run(0.0)


def test_invalid_traced_data_is_nan_and_unknown_and_its_gradient_nan(ce_mlp):
    """A fresh user's jit(vmap) over label sets read "diverges" for a set holding the label C,
    and a NaN f0 or kernel read "diverges", a negated kernel "converges": eager calls refuse
    all four. Traced, they are now NaN with code INVALID and outcome "unknown" (frozen kernel
    and head-aware), the good entries beside them equal their eager calls, and jax.grad at an
    invalid η is NaN, not the 0 of a flat spot, while a valid one matches central differences."""
    from ntk_tt.dynamics._training_time import INVALID

    model, apply_fn, params, x, y, _ = ce_mlp
    kernel, f0 = ntk_tt.empirical_ntk(apply_fn, params, x), apply_fn(params, x)
    c = f0.shape[1]
    frozen = jax.jit(lambda k, f, yy: ntk_tt.predict_from_kernel(k, f, yy, learning_rate=0.5,
                                                                   steps=20))
    cases = {"label C": (kernel, f0, y.at[0].set(c)), "label -1": (kernel, f0, y.at[1].set(-1)),
             "NaN f0": (kernel, f0.at[0, 0].set(jnp.nan), y),
             "inf f0": (kernel, f0.at[2, 1].set(jnp.inf), y),
             "NaN kernel": (kernel.at[0, 0].set(jnp.nan), f0, y),
             "negated kernel": (-kernel, f0, y)}
    for name, args in cases.items():
        p = frozen(*args)
        assert np.isnan(np.asarray(p.loss)).all() and np.isnan(float(p.kappa)), name
        assert (np.asarray(p.training_time_code) == INVALID).all(), name
        assert int(p.outcome) == 3 and not bool(p.diverged), name  # "unknown"
        with pytest.raises(ValueError):
            ntk_tt.predict_from_kernel(*args, learning_rate=0.5, steps=20)
    good = frozen(kernel, f0, y)
    assert (np.asarray(good.training_time_code) != INVALID).all()
    np.testing.assert_allclose(good.loss, ntk_tt.predict_from_kernel(
        kernel, f0, y, learning_rate=0.5, steps=20).loss, rtol=1e-5, atol=1e-6)
    hk = ntk_tt.head_aware_kernel(ntk_tt.split_head(model), x)
    labels = jnp.stack([y, y.at[0].set(c)])
    swept = jax.jit(jax.vmap(lambda yy: ntk_tt.predict_head_aware(
        hk, yy, learning_rate=0.5, steps=20)))(labels)
    assert list(np.asarray(swept.outcome)) == [int(ntk_tt.predict_head_aware(
        hk, y, learning_rate=0.5, steps=20).outcome), 3]
    assert np.isfinite(swept.loss[0]).all() and np.isnan(swept.loss[1]).all()

    def last(lr):
        return ntk_tt.predict_from_kernel(kernel, f0, y, learning_rate=lr, steps=20).loss[-1]

    assert np.isnan(float(jax.grad(last)(-0.1)))
    h = 1e-3
    np.testing.assert_allclose(float(jax.grad(last)(0.5)),
                               (float(last(0.5 + h)) - float(last(0.5 - h))) / (2 * h), rtol=2e-2)


def test_a_kappa_set_to_the_edge_is_at_it_whatever_the_last_bit():
    """The benchmark's κ̃ = 4, m = 0 rows sit on cross-entropy's edge 4: η·λ_max/N rounds a
    hair above or below it, and the frozen predictors' call flipped between its own outcome
    and "unknown" from one rerun of the same row to the next. Within the relative rounding
    EDGE_RTOL a κ is at the edge; 0.1 % beyond it is beyond (heavy ball's edge 4(1 + m) = 7.6
    at m = 0.9, Nesterov's 4(1 + m)/(1 + 2m), MSE's half of cross-entropy's)."""
    from ntk_tt.dynamics._divergence import EDGE_RTOL, beyond_edge, stability_edge
    from ntk_tt.sweep._outcomes import outcome_columns

    assert stability_edge(0.9, False, "cross_entropy") == pytest.approx(7.6)
    assert stability_edge(0.9, True, "cross_entropy") == pytest.approx(7.6 / 2.8)
    assert stability_edge(0.0, False, "mse") == 2.0
    edge = np.array([4.0, 4.0, 4.0, 7.6])
    kappa = edge * np.array([1 - 1e-7, 1 + 1e-7, 1.001, 1 + EDGE_RTOL / 2])
    m = np.array([0.0, 0.0, 0.0, 0.9])
    assert beyond_edge(kappa, m, False, "cross_entropy").tolist() == [False, False, True, False]
    falling = np.tile(np.linspace(1.6, 0.4, 11), (4, 1))  # a frozen predictor's curves
    said = outcome_columns("var_linear", falling, np.zeros(4, bool), np.full(4, -1),
                           kappa=kappa, momentum=m, frozen=True)["var_linear_outcome"]
    assert said == ["converges", "converges", "unknown", "converges"]
