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
from ntk_tt.dynamics._regime import LINEAR_TRAVEL

N, T, C = 16, 12, 3


def test_weight_travel_is_the_summed_schedule_over_the_rms_weight():
    params = {"a": 2.0 * jnp.ones((3, 1)), "b": jnp.zeros(1)}  # rms = √(12 / 4) = √3
    assert ntk_tt.weight_travel([0.1, 0.2, 0.3], params) == pytest.approx(0.6 / np.sqrt(3))
    assert ntk_tt.weight_travel([0.1], {"w": jnp.zeros(2)}) == float("inf")
    with pytest.raises(ValueError, match="backbone's weights"):
        ntk_tt.weight_travel([0.1], {})
    for bad in (0.1, [[0.1]], [0.1, float("nan")], ["a"], [0.1, -0.1], [1e-3 + 1j]):
        with pytest.raises(ValueError, match="1-D array of finite real numbers >= 0"):
            ntk_tt.weight_travel(bad, params)
    # only floating-point leaves are weights: a step counter, a PRNG key, None are skipped
    extra = params | {"step": jnp.asarray(10 ** 6), "rng": jax.random.key(0), "none": None}
    assert ntk_tt.weight_travel([0.6], extra) == ntk_tt.weight_travel([0.6], params)
    for broken in ({"w": jnp.asarray([jnp.nan, 1.0])}, {"w": jnp.asarray([jnp.inf, 1.0])}):
        with pytest.raises(ValueError, match="hold NaN or inf"):
            ntk_tt.weight_travel([0.1], broken)
    assert ntk_tt.weight_travel([], params) == 0.0


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
