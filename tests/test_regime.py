"""The weight-travel bound ρ = Σ η_t / rms(θ_0) of an Adam prediction and its warning (issue
27; ``ntk_tt.dynamics._regime``).

References: ρ computed by hand; the relative weight change of real Adam fine-tunes
(``ntk_tt.finetune``), which ρ bounds; ``predict``'s warning against the threshold.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import ntk_tt
from ntk_tt.dynamics._regime import LINEAR_TRAVEL, backbone_rms

N, T, C = 16, 12, 3


def test_weight_travel_is_the_summed_schedule_over_the_rms_weight():
    params = {"a": 2.0 * jnp.ones((3, 1)), "b": jnp.zeros(1)}  # rms = √(12 / 4) = √3
    assert ntk_tt.weight_travel([0.1, 0.2, 0.3], params) == pytest.approx(0.6 / np.sqrt(3))
    assert ntk_tt.weight_travel([0.1], {"w": jnp.zeros(2)}) == float("inf")
    with pytest.raises(ValueError, match="backbone's weights"):
        ntk_tt.weight_travel([0.1], {})
    for bad in (0.1, [[0.1]], [0.1, float("nan")], ["a"], [0.1, -0.1], [1e-3 + 1j],
                [[0.1], [0.1, 0.2]]):  # ragged: our message, not numpy's
        with pytest.raises(ValueError, match="1-D array of finite real numbers >= 0"):
            ntk_tt.weight_travel(bad, params)
    # only floating-point leaves are weights: a step counter, a PRNG key, None are skipped
    extra = params | {"step": jnp.asarray(10 ** 6), "rng": jax.random.key(0), "none": None}
    assert ntk_tt.weight_travel([0.6], extra) == ntk_tt.weight_travel([0.6], params)
    for broken in ({"w": jnp.asarray([jnp.nan, 1.0])}, {"w": jnp.asarray([jnp.inf, 1.0])}):
        with pytest.raises(ValueError, match="hold NaN or inf"):
            ntk_tt.weight_travel([0.1], broken)
    assert ntk_tt.weight_travel([], params) == 0.0
    # a fresh user: a bad 1,000-step schedule printed all of it (9,039 characters)
    with pytest.raises(ValueError) as err:
        ntk_tt.weight_travel(np.r_[np.full(500, 1e-3), -1e-3, np.full(499, 1e-3)], params)
    assert str(err.value).endswith("got η_500 = -0.001 (of 1000 steps).")
    assert len(str(err.value)) < 200


class MLP(nnx.Module):
    """A tanh backbone (not linear in its weights) and a linear ``head``."""

    def __init__(self, *, rngs):
        self.body = nnx.Linear(5, 8, rngs=rngs)
        self.head = nnx.Linear(8, C, rngs=rngs)

    def __call__(self, x):
        return self.head(jnp.tanh(self.body(x)))


def _problem():
    kx, ky = jax.random.split(jax.random.key(0))
    x, y = jax.random.normal(kx, (N, 5)), jax.random.randint(ky, (N,), 0, C)
    model = MLP(rngs=nnx.Rngs(0))
    apply_fn, params = ntk_tt.from_nnx(model)
    return model, apply_fn, params, x, y


def _relative_change(before, after) -> float:
    sq = lambda t: sum(float(jnp.sum(v ** 2)) for v in jax.tree.leaves(t))  # noqa: E731
    return np.sqrt(sq(jax.tree.map(jnp.subtract, after, before)) / sq(before))


@pytest.mark.parametrize("peak", [1e-3, 1e-2])
def test_weight_travel_bounds_a_real_adam_runs_relative_weight_change(peak):
    """Adam moves each weight by at most about η_t per step, so ‖θ_T − θ_0‖/‖θ_0‖ ≤ ρ; with
    gradients that keep their sign over a few steps it moves nearly that much (≥ ρ/4 here):
    ρ is the scale of the real weight change, not a loose bound."""
    _, apply_fn, params, x, y = _problem()
    opt = ntk_tt.adam(ntk_tt.warmup_cosine(peak, 3, T))
    run = ntk_tt.finetune(apply_fn, params, x, y, optimizer=opt, steps=T)
    rho = ntk_tt.weight_travel(opt.learning_rates(T), params)
    moved = _relative_change(params, run.params)
    assert rho / 4 <= moved <= rho


def test_adam_predictions_warn_beyond_the_linear_regime_and_record_the_travel():
    model, apply_fn, params, x, y = _problem()
    head = ntk_tt.split_head(model)
    rms = np.sqrt(np.mean(np.concatenate([np.ravel(v) for v in jax.tree.leaves(head[1])]) ** 2))
    # a constant η with T·η = 3 × the threshold (warns) and 0.3 × it (does not)
    for factor, warns in ((3.0, True), (0.3, False)):
        eta = factor * LINEAR_TRAVEL * rms / T
        opt = ntk_tt.adam(eta)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pred = ntk_tt.predict(apply_fn, params, x, y, optimizer=opt, steps=T, head=head)
        said = [w for w in caught if issubclass(w.category, ntk_tt.LinearRegimeWarning)]
        assert len(said) == int(warns), [str(w.message) for w in caught]
        assert pred.hyperparameters["weight_travel"] == pytest.approx(factor * LINEAR_TRAVEL,
                                                                      rel=1e-5)
        if warns:
            assert issubclass(said[0].category, ntk_tt.BeyondEdgeWarning)  # ntk-tt prints it
            assert f"{factor * LINEAR_TRAVEL:.2g}" in str(said[0].message)
            assert said[0].filename == __file__  # points at the predict call
    # SGD's steps scale with its gradient: no travel bound, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", ntk_tt.LinearRegimeWarning)
        pred = ntk_tt.predict(apply_fn, params, x, y, optimizer=ntk_tt.sgd(0.5), steps=T,
                              head=head)
    assert "weight_travel" not in pred.hyperparameters


def test_adam_predictions_abstain_beyond_unit_travel():
    """A fresh user: AdamW at ρ = 23 was predicted to reach loss 0 ("catapult", divergence
    "no") while the real run was destroyed. Beyond UNKNOWN_TRAVEL (ρ = 1; measured by
    experiments/adam_travel_edge.py) the outcome and the divergence verdict are "unknown",
    the reason names ρ and the warning says the prediction abstains; below it the curve's own
    call stands. The curves and T_ε are kept either way."""
    from ntk_tt.dynamics._regime import UNKNOWN_TRAVEL

    model, apply_fn, params, x, y = _problem()
    head = ntk_tt.split_head(model)
    rms = ntk_tt.weight_travel([1.0], head[1]) ** -1  # rms(θ_0)
    for rho in (0.5 * UNKNOWN_TRAVEL, 3.0 * UNKNOWN_TRAVEL):
        with pytest.warns(ntk_tt.LinearRegimeWarning) as said:
            pred = ntk_tt.predict(apply_fn, params, x, y, optimizer=ntk_tt.adam(rho * rms / T),
                                  steps=T, head=head)
        assert pred.hyperparameters["weight_travel"] == pytest.approx(rho, rel=1e-5)
        abstains = rho > UNKNOWN_TRAVEL
        assert ("the prediction abstains" in str(said[0].message)) == abstains
        assert np.all(np.isfinite(pred.loss)) and np.isfinite(pred.training_time["loss"][0.1])
        assert bool(pred.beyond_edge) == abstains  # Adam's edge is ρ, not κ
        if abstains:
            assert (pred.outcome, pred.divergence, pred.spike_step) == ("unknown", "unknown",
                                                                        None)
            assert all(v is None for v in ntk_tt.intervals(pred)["loss"].values())
            assert pred.divergence_reason.startswith(
                f"Adam's weight travel ρ = Σ η_t / rms(θ_0) = {rho:.3g} > 1")
        else:
            assert pred.outcome in ("converges", "catapult") and pred.divergence == "no"


def test_kernel_level_adam_calls_abstain_beyond_unit_travel_as_predict():
    """A fresh user: at ρ = 41, predict said "unknown" while predict_head_aware and
    sensitivities on the AdamKernel of the same run said "catapult" / divergence "no" (their
    warning saying the prediction abstains). Now all three give predict's call, at ρ above and
    below 1, on the very same curve."""
    from ntk_tt.dynamics._divergence import OUTCOMES, VERDICTS
    from ntk_tt.dynamics._regime import UNKNOWN_TRAVEL

    apply_fn, params, x, y, head, ak = _adam_setup()
    for factor in (0.5 * UNKNOWN_TRAVEL / LINEAR_TRAVEL, 3.0 * UNKNOWN_TRAVEL / LINEAR_TRAVEL):
        opt = _adamw(head, factor)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ntk_tt.LinearRegimeWarning)
            pred = ntk_tt.predict(apply_fn, params, x, y, optimizer=opt, steps=T, head=head,
                                  backbone="isotropic")  # ak's kernel
            kp = ntk_tt.predict_head_aware(ak, y, optimizer=opt, steps=T)
            sens = ntk_tt.sensitivities(ak, y, optimizer=opt, steps=T)
        np.testing.assert_allclose(np.asarray(kp.loss), pred.loss, rtol=1e-6)
        abstains = factor * LINEAR_TRAVEL > UNKNOWN_TRAVEL
        assert pred.outcome == ("unknown" if abstains else pred.outcome) != "diverges"
        assert OUTCOMES[int(kp.outcome)] == OUTCOMES[int(sens.outcome)] == pred.outcome
        assert VERDICTS[int(kp.divergence)] == sens.divergence == pred.divergence
        assert bool(kp.beyond_edge) == bool(sens.beyond_edge) == abstains
        assert (int(kp.spike_step) == -1) if abstains else pred.divergence == "no"
        # the same under jit (a second fresh user: there it said "catapult") and swept by vmap
        # over the peak, where ρ is traced: computed in JAX
        jitted = jax.jit(lambda yy, o=opt: ntk_tt.predict_head_aware(ak, yy, optimizer=o,
                                                                      steps=T))(y)
        assert (int(jitted.outcome), bool(jitted.beyond_edge)) == (int(kp.outcome), abstains)
    peaks = jnp.array([_peak(head, f) for f in (0.5 / LINEAR_TRAVEL, 3.0 / LINEAR_TRAVEL)])
    swept = jax.jit(jax.vmap(lambda p: ntk_tt.predict_head_aware(ak, y, optimizer=ntk_tt.adamw(
        ntk_tt.warmup_cosine(p, 3, T), weight_decay=0.0), steps=T)))(peaks)
    assert swept.beyond_edge.tolist() == [False, True] and int(swept.outcome[1]) == 3



def test_adam_calls_come_from_the_curve_not_the_constant_eta_kappa_rule():
    """κ ≥ 68 calls a constant-η SGD run "diverges" whatever its curve (measured on SGD runs);
    κ does not measure Adam's stability, so an Adam prediction at κ = 100 and ρ = 0.02 (inputs
    ×1000: a large kernel, small Adam steps) is its own curve's outcome (the reference:
    ``_divergence.outcome`` of the predicted loss), while SGD at the same η is "diverges".
    Beyond ρ = 1 an Adam prediction abstains unless its own curve blew up (then "diverges",
    as its warning says)."""
    from ntk_tt.dynamics._divergence import OUTCOMES, outcome

    model, apply_fn, params, x, y = _problem()
    head = ntk_tt.split_head(model)
    big = 1000.0 * x
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        probe = ntk_tt.predict(apply_fn, params, big, y, optimizer=ntk_tt.adam(1e-3), steps=T,
                               head=head)
        eta = 100.0 / (float(probe.kappa) / 1e-3)
        adam = ntk_tt.predict(apply_fn, params, big, y, optimizer=ntk_tt.adam(eta), steps=T,
                              head=head)
        sgd = ntk_tt.predict(apply_fn, params, big, y, optimizer=ntk_tt.sgd(eta), steps=T,
                             head=head)  # the same default (diagonal) kernel: Adam's κ
    assert adam.kappa == pytest.approx(100.0, rel=1e-4) and sgd.kappa == pytest.approx(100.0,
                                                                                     rel=1e-4)
    assert adam.hyperparameters["weight_travel"] < 0.1 and not adam.diverged
    own = OUTCOMES[int(outcome(jnp.asarray(adam.loss)).outcome)]
    assert adam.outcome == own != "diverges" and adam.divergence == "no"
    assert adam.divergence_reason is None
    assert not sgd.diverged and sgd.outcome == "diverges" and "≥ 68" in sgd.divergence_reason
    # sensitivities(optimizer=) makes the same calls from the same kernels
    ak = ntk_tt.adam_head_aware_kernel(head, big, y, ntk_tt.adam(eta), backbone="diagonal")
    s_adam = ntk_tt.sensitivities(ak, y, optimizer=ntk_tt.adam(eta), steps=T)
    assert OUTCOMES[int(s_adam.outcome)] == own and s_adam.divergence_reason is None
    hk = ntk_tt.head_aware_kernel(head, big)
    s_sgd = ntk_tt.sensitivities(hk, y, optimizer=ntk_tt.sgd(eta), steps=T)
    assert s_sgd.divergence == "yes" and "≥ 68" in s_sgd.divergence_reason
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        blown = ntk_tt.predict(apply_fn, params, x, y, optimizer=ntk_tt.adam(30.0), steps=T,
                               head=head)
    assert blown.hyperparameters["weight_travel"] > 1 and max(blown.loss) > 10 * blown.loss[0]
    assert (blown.outcome, blown.divergence) == ("diverges", "yes")
    # the default (diagonal) curve spikes to 2,500·L_0 and falls back; the isotropic one's ends
    # above L_0: either is the curve's own call, not an abstention
    assert blown.divergence_reason.startswith(("the predicted loss diverged",
                                               "the predicted loss spiked above 10·L_0"))


def _adam_setup():
    """The tiny MLP's split and the AdamKernel of a full-batch AdamW without decay (the kernel
    depends on ε, B and the loss, not on the schedule: one kernel serves every peak)."""
    model, apply_fn, params, x, y = _problem()
    head = ntk_tt.split_head(model)
    ak = ntk_tt.adam_head_aware_kernel(head, x, y, ntk_tt.adamw(1e-3, weight_decay=0.0))
    return apply_fn, params, x, y, head, ak


def _peak(head, factor) -> float:
    """The warmup-cosine peak whose ρ over T steps is ``factor`` × the threshold."""
    unit = ntk_tt.warmup_cosine(1.0, 3, T).values(T)
    return factor * LINEAR_TRAVEL / ntk_tt.weight_travel(unit, head[1])


def _adamw(head, factor):
    """AdamW (warmup + cosine, no decay) with ρ = ``factor`` × the threshold over T steps."""
    opt = ntk_tt.adamw(ntk_tt.warmup_cosine(_peak(head, factor), 3, T), weight_decay=0.0)
    assert ntk_tt.weight_travel(opt.learning_rates(T), head[1]) == pytest.approx(
        factor * LINEAR_TRAVEL, rel=1e-5)
    return opt


def test_an_adam_kernel_records_the_backbones_rms_weight():
    _, _, x, y, head, ak = _adam_setup()
    leaves = [np.ravel(np.asarray(v, np.float64)) for v in jax.tree.leaves(head[1])]
    assert ak.weight_rms == pytest.approx(np.sqrt(np.mean(np.concatenate(leaves) ** 2)),
                                          rel=1e-12)
    assert ak.weight_rms == backbone_rms(head[1])  # weight_travel's scale
    # built positionally without it, as before the field: None (ρ not checked)
    assert ntk_tt.AdamKernel(ak.hk, ak.precond, N).weight_rms is None
    # a pytree leaf like eps: jit over the kernel traces it (no check), same curve
    opt = _adamw(head, 3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ntk_tt.LinearRegimeWarning)
        jitted = jax.jit(lambda k: ntk_tt.predict_head_aware(k, y, optimizer=opt,
                                                             steps=T).loss)(ak)
    with pytest.warns(ntk_tt.LinearRegimeWarning):
        eager = ntk_tt.predict_head_aware(ak, y, optimizer=opt, steps=T).loss
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(eager), rtol=1e-5)
    # the kernel is built from concrete weights (jit over them is refused), so it always
    # knows their RMS (asserted above)
    with pytest.raises(ValueError, match=r"\(split is traced\)"):
        jax.jit(lambda p: ntk_tt.adam_head_aware_kernel((head[0], p, *head[2:]), x,
                                                         y, opt).weight_rms)(head[1])


@pytest.mark.parametrize("entry", ["predict_head_aware", "sensitivities"])
def test_kernel_level_adam_entry_points_warn_beyond_the_linear_regime(entry):
    _, _, _, y, head, ak = _adam_setup()
    run = ntk_tt.predict_head_aware if entry == "predict_head_aware" else ntk_tt.sensitivities
    with pytest.warns(ntk_tt.LinearRegimeWarning, match=f"{3 * LINEAR_TRAVEL:.2g}") as said:
        run(ak, y, optimizer=_adamw(head, 3.0), steps=T)
    assert len(said) == 1 and said[0].filename == __file__  # the user's call, this line
    with warnings.catch_warnings():
        warnings.simplefilter("error", ntk_tt.LinearRegimeWarning)
        run(ak, y, optimizer=_adamw(head, 0.3), steps=T)
        # no weight_rms (a hand-built kernel): ρ unknown, not checked
        run(ak._replace(weight_rms=None), y, optimizer=_adamw(head, 3.0), steps=T)
        if entry == "predict_head_aware":  # a traced schedule (grad over the peak): skipped
            jax.grad(lambda p: run(ak, y, optimizer=ntk_tt.adamw(
                ntk_tt.warmup_cosine(p, 3, T), weight_decay=0.0), steps=T).loss[-1])(
                _peak(head, 3.0))


def test_predict_with_an_adam_head_kernel_warns_once():
    apply_fn, params, x, y, head, ak = _adam_setup()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pred = ntk_tt.predict(apply_fn, params, x, y, optimizer=_adamw(head, 3.0), steps=T,
                              head=head, head_kernel=ak)
    said = [w for w in caught if issubclass(w.category, ntk_tt.LinearRegimeWarning)]
    assert len(said) == 1, [str(w.message) for w in caught]
    assert said[0].filename == __file__
    assert pred.hyperparameters["weight_travel"] == pytest.approx(3 * LINEAR_TRAVEL, rel=1e-5)
