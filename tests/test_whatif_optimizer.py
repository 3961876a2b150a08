"""What-if for an ntk_tt.Optimizer (issue 27): sensitivities(..., optimizer=) against central
differences of the same prediction (recomputed through the public trajectory functions, with
the perturbed optimiser), its values against ntk_tt.predict(optimizer=) and the trajectories,
the constant-schedule case against the constant-η sensitivities, and the refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _dynamics_helpers import brute_ntk, linear_apply, linear_problem

import ntk_tt
from ntk_tt.analysis import _whatif_optimizer
from ntk_tt.kernels._head_aware import HeadAwareKernel

N, NT, T, EPS, TAU = 16, 6, 30, 0.1, 0.02  # TAU: sensitivities' default temperature
QUANTITIES = ("training_time", "final_loss", "test_accuracy")


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _soft_accuracy(logits, y, tau=0.1):
    """Independent re-statement of the smoothed accuracy: mean σ(margin / τ)."""
    logits, y = np.asarray(logits), np.asarray(y)
    true = logits[np.arange(len(y)), y]
    other = np.where(np.eye(logits.shape[1], dtype=bool)[y], -np.inf, logits).max(axis=1)
    return float(np.mean(1.0 / (1.0 + np.exp(-(true - other) / tau))))


_smooth_t = jax.jit(ntk_tt.smooth_training_time)


def _quantities(paths, y, yt):
    """(smooth T_ε, L_T, soft held-out accuracy) of [(fs, fts)] per SGD path, the mean
    training-loss curve and the mean held-out (arg-max) accuracy."""
    curve = np.mean([jax.vmap(lambda f: ntk_tt.mean_loss(f, y, "cross_entropy"))(fs)
                     for fs, _ in paths], axis=0)
    soft = np.mean([_soft_accuracy(fts[-1], yt) for _, fts in paths])
    hard = np.mean([np.mean(np.argmax(fts[-1], axis=1) == np.asarray(yt)) for _, fts in paths])
    return (np.array([float(_smooth_t(curve, EPS, temperature=TAU)), curve[-1], soft]), curve,
            hard)


def _check_against_central(s, reference, point, names=None, rel=1e-6, rtol=1e-5):
    """The gradients and elasticities of ``s`` for ``names`` (default: all of ``point``)
    against central differences of ``reference(**point)`` (the three quantities), each
    hyperparameter moved by ``rel`` of its value."""
    values = [float(s.training_time), float(s.final_loss), float(s.soft_test_accuracy)]
    for name in names or point:
        value = point[name]
        h = rel * value
        up, down = (reference(**(point | {name: value + d})) for d in (h, -h))
        fd = (up - down) / (2 * h)
        for i, q in enumerate(QUANTITIES):
            got = float(s.gradients[q][name])
            np.testing.assert_allclose(got, fd[i], rtol=rtol, err_msg=f"{q} / {name}")
            assert abs(got) > 1e-6, (q, name)  # the hyperparameter does move the quantity
            np.testing.assert_allclose(float(s.elasticities[q][name]), value * got / values[i],
                                       rtol=1e-12)
        np.testing.assert_allclose(float(s.hyperparameters[name]), value)


def _plain():
    params, x, y = linear_problem(n=N + NT)
    x, xt, y, yt = x[:N], x[N:], y[:N], y[N:]
    held = dict(kernel_test=brute_ntk(linear_apply, params, xt, x),
                f0_test=linear_apply(params, xt), y_test=yt)
    return (params, x, y, xt, yt, brute_ntk(linear_apply, params, x), linear_apply(params, x),
            held)


class _Table(ntk_tt.Schedule):
    """η_t read from a table (T,)."""

    rates: jax.Array

    def __call__(self, step):
        return self.rates[step]


def test_plain_kernel_sgdw_warmup_cosine_matches_central_differences(x64):
    """Frozen kernel, GD, heavy ball, decoupled decay, integer warmup 5 (its derivative along
    the ramp relaxed by 0.25 step, the default): the derivatives against central differences
    of sgd_trajectory's prediction (every schedule passed as its table of η_t: one
    compilation), the values equal to it, κ by numpy's eigvalsh."""
    params, x, y, xt, yt, kernel, f0, held = _plain()
    a, a_t = (ntk_tt.weight_tangent(linear_apply, params, z) for z in (x, xt))
    point = dict(peak_learning_rate=0.5, warmup=5.0, weight_decay=0.05, momentum=0.5)

    def make(schedule, **p):
        p = point | p
        return ntk_tt.sgd(schedule, p["momentum"], weight_decay=p["weight_decay"])

    def rates(smoothing=0.0, **p):
        p = point | p
        sched = ntk_tt.warmup_cosine(p["peak_learning_rate"], p["warmup"], T,
                                     smoothing=smoothing)
        return np.asarray(sched.values(T))

    def reference(table=None, **p):
        table = rates(**p) if table is None else table
        fs, fts = ntk_tt.sgd_trajectory(kernel, f0, y, make(_Table(jnp.asarray(table)), **p),
                                        steps=T, a=a, a_test=a_t, f0_test=held["f0_test"],
                                        kernel_test=held["kernel_test"])
        return _quantities([(fs, fts)], y, yt)

    s = ntk_tt.sensitivities(kernel, y, optimizer=make(ntk_tt.warmup_cosine(0.5, 5, T)),
                             steps=T, f0=f0, a=a, a_test=a_t, **held)
    assert not bool(s.diverged) and s.warmup_smoothing == 0.25
    assert list(s.gradients["final_loss"]) == list(point)
    _check_against_central(s, lambda **p: reference(**p)[0], point,
                           ["peak_learning_rate", "weight_decay", "momentum"])
    # warmup: the exact η_t moved along ∂η̃_t/∂w of the ramp relaxed by 0.25 step (by
    # central differences of warmup_cosine(smoothing=0.25))
    direction = (rates(0.25, warmup=5.0 + 1e-6) - rates(0.25, warmup=5.0 - 1e-6)) / 2e-6

    def along(warmup, **_):
        return reference(rates() + (warmup - 5.0) * direction)[0]

    _check_against_central(s, along, point, ["warmup"])
    # and close to the slope of the exact prediction over w ± 1 step (measured 12 % and 9 %
    # off for L_T and the accuracy; a 1-step relaxation, 2.6× and 2.3×); the smooth T_ε is
    # too nonlinear in w for a secant (0.34 over ± 1 step, 0.05 over ± 0.25, derivative 0.04)
    secant = (reference(warmup=6.0)[0] - reference(warmup=4.0)[0]) / 2
    np.testing.assert_allclose([float(s.gradients[q]["warmup"]) for q in QUANTITIES[1:]],
                               secant[1:], rtol=0.2)
    # values: those of the exact schedule
    values, curve, accuracy = reference()
    hard = ntk_tt.training_time(curve, EPS)
    assert float(s.training_time_hard) == hard and abs(float(s.training_time) - hard) <= 1.0
    np.testing.assert_allclose([float(s.training_time), float(s.final_loss),
                                float(s.soft_test_accuracy)], values, rtol=1e-9)
    # error_rate's mean of booleans is float32 even under x64: compare to float32 rounding
    np.testing.assert_allclose(float(s.test_accuracy), accuracy, atol=1e-7)
    np.testing.assert_allclose(float(s.kappa), 0.5 * np.linalg.eigvalsh(kernel)[-1] / N,
                               rtol=1e-10)


def _head_problem(seed=0, d=5, f=4, c=3):
    """A linear backbone h = x V + c under a linear head (isotropic feature kernel
    x_i·x_j + 1, exact), its tangent J_h θ0 and a second PSD kernel (the Adam K_P)."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(N + NT, d)))
    y = jnp.asarray(rng.integers(0, c, N + NT))
    params = {"v": jnp.asarray(rng.normal(size=(d, f)) / np.sqrt(d)),
              "c": jnp.zeros(f, jnp.float64)}
    w, b = jnp.asarray(0.3 * rng.normal(size=(f, c))), jnp.zeros(c, jnp.float64)
    xs, xts = x[:N], x[N:]
    hk = HeadAwareKernel(xs @ params["v"] + params["c"], w, b, xs @ xs.T + 1.0,
                         jnp.eye(f, dtype=jnp.float64), xts @ params["v"] + params["c"],
                         xts @ xs.T + 1.0)
    a_h = ntk_tt.weight_tangent(lambda p, z: z @ p["v"] + p["c"], params, x)
    scale = jnp.asarray(rng.uniform(0.5, 2.0, size=d))  # K_P = x diag(s) xᵀ + 1
    precond = hk._replace(backbone=(xs * scale) @ xs.T + 1.0,
                          backbone_test=(xts * scale) @ xs.T + 1.0)
    return hk, precond, y[:N], y[N:], a_h[:N], a_h[N:]


def test_head_aware_sgd_two_paths_l2_nesterov_smoothed_warmup(x64):
    """HeadAwareKernel, SGD B = 4 over two batch orders (path 0 = batch_indices(key), path 1
    = batch_indices(split(key, 2)[1])), Nesterov, L2 decay, a warmup-cosine schedule with
    its own smoothing 1.5 (the warmup derivative is of it): central differences of
    head_aware_sgd_trajectory averaged over the same two orders."""
    hk, _, y, yt, a_h, a_ht = _head_problem()
    key = jax.random.key(3)
    orders = [ntk_tt.batch_indices(k, N, 4, T) for k in (key, jax.random.split(key, 2)[1])]

    def make(peak=0.3, warmup=4.0, weight_decay=0.05, momentum=0.6):
        # init > 0: the relaxed ramp is slightly negative at t = 0 (1 − s·softplus(1/s))
        sched = ntk_tt.warmup_cosine(peak, warmup, T, init=0.02, end=0.02, smoothing=1.5)
        return ntk_tt.sgd(sched, momentum, nesterov=True, weight_decay=weight_decay,
                          decoupled=False, batch_size=4)

    def reference(**point):
        paths = [ntk_tt.head_aware_sgd_trajectory(hk, y, make(**point), steps=T, a_h=a_h,
                                                  a_h_test=a_ht, batches=o) for o in orders]
        return _quantities(paths, y, yt)

    s = ntk_tt.sensitivities(hk, y, optimizer=make(), steps=T, key=key, num_paths=2,
                             y_test=yt, a=a_h, a_test=a_ht)
    assert not bool(s.diverged) and s.warmup_smoothing == 1.5
    point = dict(peak_learning_rate=0.3, warmup=4.0, weight_decay=0.05, momentum=0.6)
    assert list(s.gradients["test_accuracy"]) == list(point)

    def ref(peak_learning_rate, **rest):
        return reference(peak=peak_learning_rate, **rest)[0]

    _check_against_central(s, ref, point)
    values, curve, accuracy = reference()
    np.testing.assert_allclose([float(s.training_time), float(s.final_loss),
                                float(s.soft_test_accuracy)], values, rtol=1e-9)
    assert float(s.training_time_hard) == ntk_tt.training_time(curve, EPS)
    np.testing.assert_allclose(float(s.test_accuracy), accuracy, atol=1e-7)


def test_adamw_on_an_adam_kernel_exact_warmup(x64):
    """AdamKernel, AdamW, GD, a WSD schedule, warmup 4.5 with warmup_smoothing=0 (the exact
    ramp, smooth at a non-integer warmup): d/d(peak, warmup, λ, β₁) against central
    differences of head_aware_adam_trajectory, values equal to it."""
    hk, precond, y, yt, a_h, a_ht = _head_problem(seed=1)
    ak = ntk_tt.AdamKernel(hk, precond, N)

    def make(peak=0.03, warmup=4.5, weight_decay=0.1, b1=0.8):
        return ntk_tt.adamw(ntk_tt.warmup_stable_decay(peak, warmup, 12, 15, end=0.005), b1,
                            0.99, weight_decay=weight_decay)

    def reference(**point):
        return _quantities([ntk_tt.head_aware_adam_trajectory(
            ak, y, make(**point), steps=T, a_h=a_h, a_h_test=a_ht)], y, yt)

    s = ntk_tt.sensitivities(ak, y, optimizer=make(), steps=T, y_test=yt, a=a_h, a_test=a_ht,
                             warmup_smoothing=0.0)
    assert not bool(s.diverged) and s.warmup_smoothing == 0.0

    def ref(peak_learning_rate, **rest):
        return reference(peak=peak_learning_rate, **rest)[0]

    _check_against_central(
        s, ref, dict(peak_learning_rate=0.03, warmup=4.5, weight_decay=0.1, b1=0.8))
    values, curve, accuracy = reference()
    np.testing.assert_allclose([float(s.training_time), float(s.final_loss),
                                float(s.soft_test_accuracy)], values, rtol=1e-9)
    np.testing.assert_allclose(float(s.test_accuracy), accuracy, atol=1e-7)
    assert curve[0] - curve[-1] > 0.1 * curve[0]  # it trained


def test_adamw_with_a_drifting_profile_is_predict_s(x64):
    """An AdamKernel with the drifting second-moment profile (its DriftTable, from g_0² and
    σ² per parameter): the values are head_aware_adam_trajectory's on that kernel (what
    ``predict`` runs), not the frozen profile's (drift=None), which differ."""
    from ntk_tt.dynamics._adam_drift import drift_table

    hk, precond, y, yt, a_h, a_ht = _head_problem(seed=2)
    rng = np.random.default_rng(3)
    g0sq = {"v": jnp.asarray(rng.uniform(0.0, 1.0, size=(5, 4)))}
    sigma2 = {"v": jnp.asarray(rng.uniform(0.5, 2.0, size=(5, 4)))}
    table, _ = drift_table(g0sq, sigma2, 1e-8, N, N, jnp.float64)
    opt = ntk_tt.adamw(ntk_tt.warmup_cosine(0.05, 2, 12), weight_decay=0.1)
    drifting, frozen = (ntk_tt.AdamKernel(hk, precond, N, drift) for drift in (table, None))
    values = {}
    for name, ak in (("drift", drifting), ("frozen", frozen)):
        s = ntk_tt.sensitivities(ak, y, optimizer=opt, steps=T, y_test=yt, a=a_h, a_test=a_ht)
        ref, _, accuracy = _quantities([ntk_tt.head_aware_adam_trajectory(
            ak, y, opt, steps=T, a_h=a_h, a_h_test=a_ht)], y, yt)
        np.testing.assert_allclose([float(s.training_time), float(s.final_loss),
                                    float(s.soft_test_accuracy)], ref, rtol=1e-9)
        values[name] = float(s.final_loss)
    assert abs(values["drift"] - values["frozen"]) > 1e-5 * values["frozen"]  # 3e-4 here


def _tiny_head():
    rng = np.random.default_rng(0)
    return HeadAwareKernel(rng.normal(size=(N, 4)), rng.normal(size=(4, 3)), np.zeros(3),
                           np.eye(N), np.eye(4))


BAD = [
    (dict(learning_rate=0.1), "optimizer= describes the whole update rule.*drop learning_rate"),
    (dict(momentum=0.9, nesterov=False), "drop momentum, nesterov"),
    (dict(batch_size=4), "drop batch_size"),
    (dict(optimizer=None, learning_rate=0.1, a=np.zeros((N, 3))), "a belong.*optimizer="),
    (dict(optimizer=ntk_tt.sgd(lambda t: 0.1)), "callable schedule"),
    (dict(optimizer=ntk_tt.sgd(0.1, weight_decay=0.1)), "weight decay acts on J·θ0: pass a"),
    (dict(a=np.zeros((N, 2))), "a must have shape \\(16, 3\\)"),
    (dict(a_test=np.zeros((NT, 3))), "a_test .* needs a on the training"),
    # a NaN tangent gave NaN T_ε silently (a NaN f0 was refused)
    (dict(optimizer=ntk_tt.sgd(0.1, weight_decay=1e-3), a=np.full((N, 3), np.nan)),
     "a contains NaN or inf; recompute it with ntk_tt.weight_tangent"),
    (dict(a=np.zeros((N, 3)), a_test=np.full((NT, 3), np.inf), y_test=np.zeros(NT, int),
          kernel_test=np.zeros((NT * 3, N * 3)), f0_test=np.zeros((NT, 3))),
     "a_test contains NaN or inf"),
    (dict(a=np.zeros((N, 3)), y_test=np.zeros(NT, int), kernel_test=np.zeros((NT * 3, N * 3)),
          f0_test=np.zeros((NT, 3))), "a_test goes with held-out data"),
    (dict(optimizer=ntk_tt.adamw(0.1)), "pass kernel=ntk_tt.adam_head_aware_kernel"),
    (dict(warmup_smoothing=1.0), "applies to a schedule with a warmup"),
    (dict(optimizer=ntk_tt.sgd(ntk_tt.warmup_cosine(0.1, 3, 9, smoothing=1.0)),
          warmup_smoothing=0.5), "own smoothing=1.0.*drop warmup_smoothing"),
    (dict(optimizer=ntk_tt.sgd(ntk_tt.warmup_cosine(0.1, 3, 9)), warmup_smoothing=-1.0),
     "warmup_smoothing must be in \\[0"),
    (dict(kernel="adam", optimizer=ntk_tt.sgd(0.1)), "AdamKernel is for an Adam optimizer"),
    (dict(kernel="adam", optimizer=ntk_tt.adamw(0.1, batch_size=4), key=jax.random.key(0)),
     "built for batch size 16"),
    (dict(kernel="adam", optimizer=ntk_tt.adam(0.1, weight_decay=0.1)), "use ntk_tt.adamw"),
]


@pytest.mark.parametrize("bad,match", BAD)
def test_refuses_bad_input_before_any_work(monkeypatch, bad, match):
    def no_work(*a, **k):
        raise AssertionError("work started before validation")

    monkeypatch.setattr(_whatif_optimizer, "_optimizer_core", no_work)
    kw = dict(kernel=np.eye(N * 3), f0=np.zeros((N, 3)), optimizer=ntk_tt.sgd(0.1),
              steps=9) | bad
    if isinstance(kw["kernel"], str):
        hk = _tiny_head()
        kw = kw | dict(kernel=ntk_tt.AdamKernel(hk, hk, N), f0=None)
    with pytest.raises(ValueError, match=match):
        ntk_tt.sensitivities(kw.pop("kernel"), np.arange(N) % 3, **kw)


class _Recorded(Exception):
    pass


@pytest.mark.parametrize("optimizer,extra,names,warm", [
    (ntk_tt.sgd(0.4, 0.6, nesterov=True), {}, ("peak_learning_rate", "momentum"), None),
    (ntk_tt.sgd(ntk_tt.exponential(0.3, 0.9)), {}, ("peak_learning_rate", "momentum"), None),
    (ntk_tt.sgd(ntk_tt.warmup_cosine(0.4, 3, 9), weight_decay=0.1), {"a": np.zeros((N, 3))},
     ("peak_learning_rate", "warmup", "weight_decay", "momentum"), 0.25),
    (ntk_tt.sgd(ntk_tt.warmup_cosine(0.4, 3, 9, init=0.05, smoothing=1.0)), {},
     ("peak_learning_rate", "warmup", "momentum"), 1.0),
    (ntk_tt.sgd(ntk_tt.warmup_cosine(0.4, 3, 9)), {"warmup_smoothing": 0.0},
     ("peak_learning_rate", "warmup", "momentum"), 0.0),
    (ntk_tt.adamw(ntk_tt.warmup_cosine(0.4, 3, 9), weight_decay=0.0), {"kernel": "adam"},
     ("peak_learning_rate", "warmup", "b1"), 0.25),
])
def test_the_differentiated_hyperparameters_follow_the_optimizer(monkeypatch, optimizer, extra,
                                                                 names, warm):
    """Which derivatives come back (the keys of gradients and elasticities): the schedule's
    peak, its warmup if it has one (relaxed by its own smoothing, warmup_smoothing or 0.25),
    λ only with the tangent a, m or β₁."""
    seen = {}

    def record(*args, **kwargs):
        seen.update(kwargs)
        raise _Recorded

    monkeypatch.setattr(_whatif_optimizer, "_optimizer_core", record)
    kw = dict(kernel=np.eye(N * 3), f0=np.zeros((N, 3))) | extra
    if isinstance(kw["kernel"], str):
        hk = _tiny_head()
        kw = kw | dict(kernel=ntk_tt.AdamKernel(hk, hk, N), f0=None)
    with pytest.raises(_Recorded):
        ntk_tt.sensitivities(kw.pop("kernel"), np.arange(N) % 3, optimizer=optimizer, steps=9,
                             **kw)
    assert seen["names"] == names and seen["warm"] == warm


def test_the_divergence_call_and_no_accuracy_without_held_out_data(x64):
    """A fresh user's probe: warmup-cosine to η = 1e3 on a plain Θ gave T_ε NaN, every T_ε
    derivative NaN, diverged False and no reason, while predict said divergence yes
    (κ ≥ 68); without held-out data gradients["test_accuracy"] was all NaN. Here peak 30
    (κ = 76: its curve does not diverge, measured): the call, T_ε code and κ are
    predict_from_kernel(optimizer=)'s (κ by numpy's eigvalsh), the reasons say why, and
    there is no accuracy entry."""
    params, x, y, xt, yt, kernel, f0, held = _plain()
    opt = ntk_tt.sgd(ntk_tt.warmup_cosine(30.0, 2, 50))
    s = ntk_tt.sensitivities(kernel, y, f0=f0, optimizer=opt, steps=50)
    pred = ntk_tt.predict_from_kernel(kernel, f0, y, optimizer=opt, steps=50)
    kappa = 30.0 * np.linalg.eigvalsh(np.asarray(kernel))[-1] / N
    np.testing.assert_allclose(float(s.kappa), kappa, rtol=1e-9)
    assert kappa >= 68 and not bool(s.diverged) and not bool(pred.diverged)
    assert int(s.outcome) == int(pred.outcome) == 2 and s.divergence == "yes"  # "diverges"
    assert s.divergence_reason.startswith(f"κ = η·λ_max/N = {kappa:.3g} ≥ 68, where the real "
                                          "runs measured diverged")
    assert int(s.training_time_code) == int(pred.training_time_code[0, 1]) == 7
    assert s.training_time_reason.startswith("predicted to diverge")  # called, not just blind
    assert all(np.isnan(float(v)) for v in s.gradients["training_time"].values())
    assert list(s.gradients) == list(s.elasticities) == ["training_time", "final_loss"]
    assert s.test_accuracy is None and s.soft_test_accuracy is None
    # with held-out data the accuracy gradients are there (and finite below the edge)
    s = ntk_tt.sensitivities(kernel, y, f0=f0, optimizer=ntk_tt.sgd(0.5), steps=T, **held)
    assert s.divergence == "no" and s.divergence_reason is None and s.training_time_reason \
        is None
    assert np.isfinite(float(s.gradients["test_accuracy"]["peak_learning_rate"]))


@pytest.mark.parametrize("backbone", ["diagonal", "subspace"])
def test_feature_basis_kernels_decay_and_call_as_predict(x64, backbone):
    """A fresh user's finds: on a subspace / diagonal kernel, sensitivities and
    divergence_boundary with weight decay ran the decay's J_h θ_0 unprojected (final loss 1e-4
    to 3e-3 off predict's, whose features and decay move in span(Z) only), and a diagonal
    curve that diverges below κ = 68 was "diverges" there where predict calls it "catapult".
    Now: the values of head_aware_sgd / adam_trajectory (what predict runs) and predict's
    calls, AdamW and SGD-momentum alike."""
    from test_optimizers import _head_problem

    from ntk_tt.dynamics._divergence import OUTCOMES, VERDICTS

    _, split, x, y, _, a_h, _ = _head_problem()
    hk = ntk_tt.head_aware_kernel(split, x, backbone=backbone, subspace_dim=3)
    adamw = ntk_tt.adamw(1e-3, weight_decay=0.01)
    ak = ntk_tt.adam_head_aware_kernel(split, x, y, adamw, backbone=backbone, hk=hk)
    sgdw = ntk_tt.sgd(0.01, 0.9, weight_decay=0.01)
    for kernel, opt, run in ((ak, adamw, ntk_tt.head_aware_adam_trajectory),
                             (hk, sgdw, ntk_tt.head_aware_sgd_trajectory)):
        want = ntk_tt.mean_loss(run(kernel, y, opt, steps=T, a_h=a_h)[0][-1], y,
                                "cross_entropy")
        s = ntk_tt.sensitivities(kernel, y, optimizer=opt, steps=T, a=a_h)
        grid = ntk_tt.divergence_boundary(kernel, y, optimizer=opt, steps=T, a=a_h,
                                          momenta=[float(opt.momentum)],
                                          learning_rates=[float(opt.learning_rates(1)[0])])
        np.testing.assert_allclose([float(s.final_loss), float(grid.final_loss[0, 0])],
                                   float(want), rtol=1e-10)
    for eta in (2.0, 4.0, 16.0):  # κ ≈ 10, 20 (its own curve diverges: "catapult"), 79
        opt = ntk_tt.sgd(eta, 0.9)
        p = ntk_tt.predict_head_aware(hk, y, optimizer=opt, steps=T)
        s = ntk_tt.sensitivities(hk, y, optimizer=opt, steps=T)
        assert int(s.outcome) == int(p.outcome) and s.divergence == VERDICTS[int(p.divergence)]
        plain = ntk_tt.sensitivities(hk, y, learning_rate=eta, momentum=0.9, steps=T)
        assert int(plain.outcome) == int(p.outcome)  # the constant-η form too
        if eta == 4.0 and backbone == "diagonal":
            assert bool(p.diverged) and OUTCOMES[int(p.outcome)] == "catapult"


def test_an_adam_abstention_names_the_weight_travel(x64):
    """Beyond ρ = 1 an Adam sensitivities call abstains as predict's does; its reason named
    "κ = ... 0" (a fresh user's find) and now names the weight travel, as predict's."""
    from test_optimizers import _head_problem

    _, split, x, y, _, _, _ = _head_problem()
    opt = ntk_tt.adamw(ntk_tt.warmup_cosine(1e-3, 3, T), weight_decay=0.0)
    ak = ntk_tt.adam_head_aware_kernel(split, x, y, opt)
    far = ntk_tt.adamw(ntk_tt.warmup_cosine(2.0 * float(ak.weight_rms), 3, T),
                       weight_decay=0.0)  # ρ > 1, its own curve not blown up (5×: it is)
    with pytest.warns(ntk_tt.LinearRegimeWarning):
        s = ntk_tt.sensitivities(ak, y, optimizer=far, steps=T)
    assert s.divergence == "unknown"
    assert s.divergence_reason.startswith("Adam's weight travel ρ = Σ η_t / rms(θ_0) > 1")
