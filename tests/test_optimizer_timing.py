"""``predict(optimizer=...)``: seconds that add up, no recompilation of a repeated call, and
the summary of a diverged prediction (signed zeros, the reason for "yes").

References: JAX's own compilation events (``jax.monitoring``, counted and summed by a listener
of the test), the wall clock around the call, the frozen-kernel predictor's own curve
(``predict_from_kernel`` on the same kernel) and the divergence rule applied to the curve by
hand.
"""

import time

import jax
import numpy as np
import pytest
from _ntk_models import TanhHeadNet, inputs, mlp
from flax import nnx

import ntk_tt
from ntk_tt.prediction._result import STAGES

N, C, T = 24, 3, 40
# resolve the lazy export here: the first attribute access imports the prediction modules
# (0.1-0.2 s under pytest's import hook), which is not part of a call's run time
PREDICT = ntk_tt.predict
COMPILE = "/jax/core/compile/backend_compile_duration"
EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
          "/jax/core/compile/jaxpr_to_mlir_module_duration", COMPILE)


@pytest.fixture(scope="module")
def data60():
    """The user's 60 samples (the diverged cases below were reported on them)."""
    return inputs("mlp", jax.random.key(1), 60), jax.random.randint(jax.random.key(2), (60,),
                                                                      0, C)


@pytest.fixture(scope="module")
def data():
    x = inputs("mlp", jax.random.key(1), N + 8)
    y = jax.random.randint(jax.random.key(2), (N + 8,), 0, C)
    return x[:N], y[:N], x[N:], y[N:]


class Compiles:
    """Listener: the number of XLA compilations and the seconds of every compile event."""

    def __enter__(self):
        self.count, self.seconds = 0, 0.0
        jax.monitoring.register_event_duration_secs_listener(self._listen)
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.start
        jax.monitoring.unregister_event_duration_listener(self._listen)

    def _listen(self, event, duration, **_):
        if event in EVENTS:
            self.seconds += duration
            self.count += event == COMPILE


def _timed_twice(call):
    """Two identical calls; checks each one's seconds against the listener and the wall
    clock, and that the second compiled nothing. Returns the second Prediction."""
    preds = []
    for _ in range(2):
        with Compiles() as seen:
            pred = call()
        s = pred.seconds
        assert set(s) >= set(STAGES) | {"compile", "total"}
        # every compilation of the call, inside a stage or not, is in "compile"
        assert s["compile"] == pytest.approx(seen.seconds, rel=1e-9, abs=1e-9)
        # total = the stages' sum = the call's wall time without compilation
        assert s["total"] == pytest.approx(sum(s[k] for k in STAGES), rel=1e-12, abs=1e-12)
        assert seen.wall - seen.seconds - 0.05 <= s["total"] <= seen.wall - seen.seconds + 1e-6
        preds.append((pred, seen.count))
    (first, n_first), (second, n_second) = preds
    assert n_first > 0 and n_second == 0  # a compiled recursion per shape, not per call
    np.testing.assert_array_equal(first.loss, second.loss)
    return second


def test_frozen_kernel_sgd_schedule_decay_twice(data):
    """The user's case: SGD, warmup-cosine, momentum, weight decay (J·θ0), held-out set."""
    x, y, xt, yt = data
    apply_fn, params = mlp(jax.random.key(0), width=16, c=C)
    opt = ntk_tt.sgd(ntk_tt.warmup_cosine(0.1, 10, T), 0.9, weight_decay=1e-3)
    pred = _timed_twice(lambda: ntk_tt.predict(apply_fn, params, x, y, optimizer=opt, steps=T,
                                               key=jax.random.key(3), x_test=xt, y_test=yt))
    assert pred.kernel == "exact" and pred.loss[-1] < pred.loss[0]


def test_head_aware_minibatch_sgd_and_adam_twice(data):
    """Head-aware SGD (the kernel built in the call) and Adam (its kernel passed in: the
    recursion and the checks are what is timed)."""
    x, y, xt, yt = data
    model = TanhHeadNet(8, C, rngs=nnx.Rngs(0))
    apply_fn, params = ntk_tt.from_nnx(model)
    head = ntk_tt.split_head(model)
    sgd = ntk_tt.sgd(ntk_tt.warmup_cosine(0.05, 5, T), 0.9, weight_decay=1e-3, batch_size=8)
    adam = ntk_tt.adamw(ntk_tt.warmup_cosine(1e-2, 5, T), weight_decay=1e-3)
    adam_kernel = ntk_tt.adam_head_aware_kernel(head, x, y, adam, xt)
    for opt, kernel in ((sgd, None), (adam, adam_kernel)):
        pred = _timed_twice(lambda opt=opt, kernel=kernel: ntk_tt.predict(
            apply_fn, params, x, y, optimizer=opt, steps=T, key=jax.random.key(4), head=head,
            num_paths=4, x_test=xt, y_test=yt, head_kernel=kernel))
        assert pred.kernel.startswith("head_aware") and pred.loss[-1] < pred.loss[0]


def test_shorthand_seconds_add_up_too(data):
    x, y, _, _ = data
    apply_fn, params = mlp(jax.random.key(0), width=16, c=C)
    _timed_twice(lambda: ntk_tt.predict(apply_fn, params, x, y, learning_rate=0.5, steps=T))


def test_frozen_kernel_far_beyond_the_edge_has_no_negative_zeros(data60):
    """At peak η 1e3 the frozen cross-entropy recursion drives the logit margins so far that
    the loss rounds to 0, which must read +0.0 in predict's and in the kernel predictor's own
    curve (it was −0.0, the negated log-softmax of 0); the verdict is "yes" with the
    reason."""
    x, y = data60
    apply_fn, params = mlp(jax.random.key(0), width=16, c=C)
    opt = ntk_tt.sgd(ntk_tt.warmup_cosine(1e3, 10, 100), 0.9)
    pred = ntk_tt.predict(apply_fn, params, x, y, optimizer=opt, steps=100)
    ref = ntk_tt.predict_from_kernel(ntk_tt.empirical_ntk(apply_fn, params, x),
                                     apply_fn(params, x), y, optimizer=opt, steps=100)
    np.testing.assert_allclose(pred.loss, ref.loss, rtol=1e-5, atol=1e-6)
    # the margins do grow so far that the loss rounds to 0 (at which step depends on the
    # kernel's last bits, e.g. the BLAS thread count)
    assert (ref.loss == 0.0).any() and not np.signbit(ref.loss).any()  # −0.0 before the fix
    assert (pred.loss == 0.0).any() and np.all(pred.loss >= 0)
    assert not np.signbit(pred.loss).any() and not np.signbit(pred.error).any()
    assert pred.divergence == "yes" and "≥ 68" in pred.divergence_reason


def test_diverged_adam_names_the_step(data60):
    """Head-aware Adam at lr 1e4 blows up; divergence "yes" says at which step, the step of
    the divergence rule (the final rise above L_0 begins after the last step ≤ L_0)."""
    x, y = data60
    model = TanhHeadNet(8, C, rngs=nnx.Rngs(0))
    apply_fn, params = ntk_tt.from_nnx(model)
    pred = ntk_tt.predict(apply_fn, params, x, y, optimizer=ntk_tt.adamw(1e4), steps=50,
                          head=ntk_tt.split_head(model))
    assert pred.diverged and pred.divergence == "yes"
    loss = pred.loss  # one path (full batch), finite here
    assert np.isfinite(loss).all() and not np.signbit(loss).any()
    step = 1 + int(np.flatnonzero(loss <= loss[0]).max())
    assert pred.diverged_at == step
    assert pred.divergence_reason.startswith(
        f"the predicted loss diverged (non-finite, or ending above L_0): its final rise began "
        f"at step {step}")


def test_adam_kernel_compiles_once_per_network(data):
    """A second Adam kernel of the same network (another batch size, ε and weight decay, so
    other second moments and preconditioner) compiles nothing, and its values are those of a
    kernel built with every compiled program dropped (no stale preconditioner in the reused
    program)."""
    from ntk_tt.kernels import _ntk

    x, y, xt, _ = data
    model = TanhHeadNet(8, C, rngs=nnx.Rngs(0))
    head = ntk_tt.split_head(model)
    first = ntk_tt.adam_head_aware_kernel(head, x, y, ntk_tt.adamw(1e-2), xt)
    other = ntk_tt.adamw(1e-3, eps=1e-6, weight_decay=0.1, batch_size=8)
    with Compiles() as seen:
        reused = ntk_tt.adam_head_aware_kernel(head, x, y, other, xt)
    assert seen.count == 0  # was 8 programs per call (closures around each call's arrays)
    assert not np.allclose(reused.precond.backbone, first.precond.backbone, rtol=1e-2)
    _ntk._COMPILED.clear()
    jax.clear_caches()
    fresh = ntk_tt.adam_head_aware_kernel(head, x, y, other, xt)
    for a, b in zip(jax.tree.leaves(reused), jax.tree.leaves(fresh), strict=True):
        np.testing.assert_array_equal(a, b)


def test_subspace_kernel_compiles_once_per_network(data):
    """A second subspace kernel of the same network on other inputs of the same size (another
    basis Z) compiles nothing (it compiled its Jacobian program per call around a closure over
    Z), and equals a kernel built with every compiled program dropped (no stale Z)."""
    from ntk_tt.kernels import _ntk

    x, _, xt, _ = data
    head = ntk_tt.split_head(TanhHeadNet(8, C, rngs=nnx.Rngs(0)))
    first = ntk_tt.head_aware_kernel(head, x, xt, backbone="subspace", subspace_dim=3)
    other, other_test = x[::-1] * 0.5, xt[::-1] * 2.0
    with Compiles() as seen:
        reused = ntk_tt.head_aware_kernel(head, other, other_test, backbone="subspace",
                                          subspace_dim=3)
    assert seen.count == 0
    assert not np.allclose(reused.basis, first.basis, atol=1e-3)
    _ntk._COMPILED.clear()
    jax.clear_caches()
    fresh = ntk_tt.head_aware_kernel(head, other, other_test, backbone="subspace",
                                     subspace_dim=3)
    for a, b in zip(jax.tree.leaves(reused), jax.tree.leaves(fresh), strict=True):
        np.testing.assert_array_equal(a, b)
