"""Closed form, ODE and SDE with an optimiser (issue 27): schedules, momentum, weight decay.

References are written here from the equations (METHOD.md §11), independently of the package:
the schedules in NumPy, ∫η by ``scipy.integrate.quad``, the linear ODE by ``scipy.linalg.expm``
and eigendecompositions in NumPy.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.linalg
from _dynamics_helpers import brute_ntk, linear_apply, linear_problem

import ntk_tt
from ntk_tt.dynamics import _optim_predict
from ntk_tt.dynamics._sde import sde_paths
from ntk_tt.prediction import _predict_optimizer

N, C, T = 12, 3, 24
# warmup-cosine (init, peak, warmup, decay_steps, end) and warmup-stable-decay numbers
WC = (0.2, 1.0, 5.0, 20.0, 0.3)
WSD = (1.0, 4.0, 10.0, 8.0, 0.2)


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


@pytest.fixture(scope="module")
def prob():
    with jax.enable_x64(True):
        params, x, y = linear_problem(n=N, d=5, c=C)
        x_test = jax.random.normal(jax.random.key(7), (5, 5), jnp.float64)
        kernel = np.asarray(brute_ntk(linear_apply, params, x))
        lam_max = float(np.linalg.eigvalsh(kernel)[-1])
        return dict(kernel=kernel, kt=np.asarray(brute_ntk(linear_apply, params, x_test, x)),
                    f0=np.asarray(linear_apply(params, x)), y=np.asarray(y),
                    ft0=np.asarray(linear_apply(params, x_test)),
                    a=np.asarray(ntk_tt.weight_tangent(linear_apply, params, x)),
                    at=np.asarray(ntk_tt.weight_tangent(linear_apply, params, x_test)),
                    per_kappa=N / lam_max)


def wc_np(t, scale=1.0):
    init, peak, w, d, end = WC
    if t < w:
        return scale * (init + (peak - init) * t / w)
    frac = min((t - w) / (d - w), 1.0)
    return scale * (end + (peak - end) * 0.5 * (1 + np.cos(np.pi * frac)))


def wsd_np(t, scale=1.0):
    w, start, span, end = WSD[1:]
    ramp = min(t / w, 1.0)
    return scale * (WSD[0] * ramp + (end - WSD[0]) * min(max((t - start) / span, 0.0), 1.0))


def integral(fn, t, kinks):
    """∫_0^t fn(s) ds by adaptive quadrature, split at the schedule's kinks."""
    return scipy.integrate.quad(fn, 0.0, t, points=[k for k in kinks if 0 < k < t],
                                epsabs=1e-13, epsrel=1e-13, limit=200)[0] if t > 0 else 0.0


def mse_loss(f, y):
    r = f - np.eye(C)[y]
    return 0.5 * np.mean(np.sum(r ** 2, axis=-1), axis=-1)


def eig_decay(p, decay_of_lambda):
    """Logits f_t = Y + Σ_k d_k(t) (v_k·r_0) v_k for the (T + 1, K) decays d(λ_k) (eigh)."""
    lam, v = np.linalg.eigh(p["kernel"])
    target = np.eye(C)[p["y"]]
    coeff = v.T @ (p["f0"] - target).reshape(-1)
    d = decay_of_lambda(np.maximum(lam, 0.0))
    return target + ((d * coeff) @ v.T).reshape(-1, N, C)


def sched_opt(scale, m=0.0, **kw):
    init, peak, w, d, end = WC
    return ntk_tt.sgd(ntk_tt.warmup_cosine(scale * peak, w, d, init=scale * init,
                                           end=scale * end), m, **kw)


def test_closed_form_with_warmup_cosine_is_the_product_over_the_schedule(prob):
    """r_t = Σ_k Π_{s<t}(1 − η_s/(1 − m)·λ_k/N) a_k v_k (GD with the step's own η_s), training
    and held-out (f_test,t = f_test,0 − Θ(x_test, x)/N Σ_{s<t} η'_s r_s)."""
    scale, m = 0.6 * prob["per_kappa"], 0.3
    rates = np.array([wc_np(s, scale) for s in range(T)]) / (1 - m)
    out = ntk_tt.predict_from_kernel(
        prob["kernel"], prob["f0"], prob["y"], steps=T, loss="mse", method="closed_form",
        optimizer=sched_opt(scale, m), kernel_test=prob["kt"], f0_test=prob["ft0"],
        y_test=np.zeros(5, int))
    fs = eig_decay(prob, lambda lam: np.concatenate(
        [np.ones((1, lam.size)), np.cumprod(1 - rates[:, None] * lam / N, axis=0)]))
    np.testing.assert_allclose(out.loss, mse_loss(fs, prob["y"]), rtol=1e-9)
    r = fs - np.eye(C)[prob["y"]]
    moves = np.einsum("ab,tb->ta", prob["kt"], r.reshape(T + 1, -1))[:-1] / N
    fts = prob["ft0"].reshape(-1) - np.concatenate(
        [np.zeros((1, moves.shape[1])), np.cumsum(rates[:, None] * moves, axis=0)])
    np.testing.assert_allclose(out.test_loss, mse_loss(fts.reshape(-1, 5, C), np.zeros(5, int)),
                               rtol=1e-9)


def test_ode_with_warmup_cosine_and_momentum_is_exp_of_the_integral(prob):
    """MSE: f(t) − Y = exp(−Θ/N·∫_0^t η(s)/(1 − m) ds)(f_0 − Y), ∫ by quadrature."""
    scale, m = 0.8 * prob["per_kappa"], 0.5
    out = ntk_tt.predict_from_kernel(prob["kernel"], prob["f0"], prob["y"], steps=T,
                                     loss="mse", method="ode", optimizer=sched_opt(scale, m))
    s = np.array([integral(lambda u: wc_np(u, scale), t, WC[2:4]) for t in range(T + 1)])
    fs = eig_decay(prob, lambda lam: np.exp(-np.outer(s / (1 - m), lam / N)))
    # the ODE is solved at rtol = atol = 1e-6
    np.testing.assert_allclose(out.loss, mse_loss(fs, prob["y"]), rtol=2e-5)


def test_cross_entropy_ode_is_the_small_eta_limit_of_the_recursion(prob):
    """Schedule + momentum: the ODE and the exact heavy-ball recursion differ by O(η)."""
    gaps = []
    for kappa in (0.08, 0.04):
        opt = sched_opt(kappa * prob["per_kappa"], 0.3)
        ode, disc = (ntk_tt.predict_from_kernel(prob["kernel"], prob["f0"], prob["y"], steps=T,
                                                method=meth, optimizer=opt).loss
                     for meth in ("ode", "discrete"))
        gaps.append(float(np.max(np.abs(ode - disc)) / float(disc[0])))
    assert gaps[0] < 0.02
    assert 1.7 < gaps[0] / gaps[1] < 2.5


def linear_decay_reference(prob, s_eff, lam):
    """Exact solution of the linear ODE in τ = ∫η': dr/dτ = −(Θ/N + λ) r − λ c (c = a + Y −
    f_0), dq/dτ = −Θ(x_test, x) r/N − λ q (q = a_test + f_test − f_test,0), by the matrix
    exponential of the augmented system [r, q, 1]."""
    k, kt = prob["kernel"], prob["kt"]
    m_, mt = k.shape[0], kt.shape[0]
    target = np.eye(C)[prob["y"]].reshape(-1)
    c = prob["a"].reshape(-1) + target - prob["f0"].reshape(-1)
    gen = np.zeros((m_ + mt + 1, m_ + mt + 1))
    gen[:m_, :m_] = -(k / N + lam * np.eye(m_))
    gen[:m_, -1] = -lam * c
    gen[m_:-1, :m_] = -kt / N
    gen[m_:-1, m_:-1] = -lam * np.eye(mt)
    z0 = np.concatenate([prob["f0"].reshape(-1) - target, prob["at"].reshape(-1), [1.0]])
    zs = np.stack([scipy.linalg.expm(gen * s) @ z0 for s in s_eff])
    fs = (zs[:, :m_] + target).reshape(-1, N, C)
    fts = (zs[:, m_:-1] - prob["at"].reshape(-1) + prob["ft0"].reshape(-1)).reshape(-1, 5, C)
    return fs, fts


@pytest.mark.parametrize("decoupled", [True, False])
def test_ode_weight_decay_is_the_linear_ode_with_effective_decay(prob, decoupled):
    """Decoupled decay: λ' = (1 − m)λ (not amplified by momentum); L2: λ' = λ. Warmup-stable-
    decay (decoupled) and exponential (L2) schedules, training and held-out logits."""
    m, wd, yt = 0.5, 0.3, np.zeros(5, int)
    scale = 0.5 * prob["per_kappa"]
    if decoupled:
        sched, fn, kinks = ntk_tt.warmup_stable_decay(
            scale * WSD[0], *WSD[1:4], end=scale * WSD[4]), lambda u: wsd_np(u, scale), (
            WSD[1], WSD[2], WSD[2] + WSD[3])
    else:
        sched, fn, kinks = ntk_tt.exponential(scale, 0.9), lambda u: scale * 0.9 ** u, ()
    opt = ntk_tt.sgd(sched, m, weight_decay=wd, decoupled=decoupled)
    out = ntk_tt.predict_from_kernel(
        prob["kernel"], prob["f0"], prob["y"], steps=T, loss="mse", method="ode", optimizer=opt,
        a=prob["a"], a_test=prob["at"], kernel_test=prob["kt"], f0_test=prob["ft0"], y_test=yt)
    s_eff = np.array([integral(fn, t, kinks) for t in range(T + 1)]) / (1 - m)
    fs, fts = linear_decay_reference(prob, s_eff, (1 - m) * wd if decoupled else wd)
    np.testing.assert_allclose(out.loss, mse_loss(fs, prob["y"]), rtol=2e-5)
    np.testing.assert_allclose(out.test_loss, mse_loss(fts, yt), rtol=2e-5)


def test_closed_form_with_decay_at_m0_is_the_exact_recursion(prob):
    """m = 0: the closed form with a schedule and decay is exact GD, ``sgd_trajectory``."""
    opt = sched_opt(0.5 * prob["per_kappa"], weight_decay=0.2)
    common = dict(steps=T, loss="mse", optimizer=opt, a=prob["a"], a_test=prob["at"],
                  kernel_test=prob["kt"], f0_test=prob["ft0"], y_test=np.zeros(5, int))
    cf = ntk_tt.predict_from_kernel(prob["kernel"], prob["f0"], prob["y"], method="closed_form",
                                    **common)
    fs, fts = ntk_tt.sgd_trajectory(prob["kernel"], prob["f0"], prob["y"], opt, steps=T,
                                    a=prob["a"], loss="mse", kernel_test=prob["kt"],
                                    f0_test=prob["ft0"], a_test=prob["at"])
    np.testing.assert_allclose(cf.loss, mse_loss(np.asarray(fs), prob["y"]), rtol=1e-9)
    np.testing.assert_allclose(cf.test_loss, mse_loss(np.asarray(fts), np.zeros(5, int)),
                               rtol=1e-9)


def _noise(prob, d=6):
    return np.asarray(jax.random.normal(jax.random.key(3), (N * C, d), jnp.float64)) * 0.05


def test_sde_at_full_batch_has_no_noise_and_is_the_discrete_recursion(prob):
    """B = N: ρ = 0, every path is Euler at dt = 1 with η'(k) = η_k/(1 − m): the product."""
    scale, m = 0.6 * prob["per_kappa"], 0.3
    out = ntk_tt.predict_from_kernel(prob["kernel"], prob["f0"], prob["y"], steps=T,
                                     loss="mse", method="sde", optimizer=sched_opt(scale, m),
                                     key=jax.random.key(0), noise_features=_noise(prob),
                                     num_paths=3)
    rates = np.array([wc_np(s, scale) for s in range(T)]) / (1 - m)
    fs = eig_decay(prob, lambda lam: np.concatenate(
        [np.ones((1, lam.size)), np.cumprod(1 - rates[:, None] * lam / N, axis=0)]))
    np.testing.assert_allclose(out.loss_paths, np.broadcast_to(mse_loss(fs, prob["y"]),
                                                               (3, T + 1)), rtol=1e-9)


def test_sde_noise_variance_scales_as_eta_t_squared_over_b(prob):
    """Step k's noise, the increment minus the drift, divided by the rescaling s(f_k), has
    E‖·‖² = (η_k/(1 − m))²·ρ²/B·tr(G Gᵀ), ρ² = (N − B)/(N − 1): checked over the warmup-cosine
    (η_k from 0.2 to 1 and back to 0.3 of the peak) for B = 3 and 8."""
    scale, m, paths = 0.3 * prob["per_kappa"], 0.3, 400
    g = _noise(prob)
    sched = sched_opt(scale, m).learning_rate
    kernel, target = prob["kernel"], np.eye(C)[prob["y"]]
    etas = np.array([wc_np(k, scale) for k in range(T)]) / (1 - m)
    grad0 = np.linalg.norm((prob["f0"] - target) / N)
    for b in (3, 8):
        fs, _ = sde_paths((jnp.asarray(kernel), False), jnp.asarray(prob["f0"]),
                          jnp.asarray(prob["y"]), jnp.asarray(g), key=jax.random.key(b),
                          num_paths=paths, learning_rate=sched, momentum=jnp.asarray(m),
                          batch_size=b, steps=T, loss="mse")
        fs = np.asarray(fs).reshape(paths, T + 1, -1)
        grads = (fs - target.reshape(-1)) / N
        drift = -etas[None, :, None] * np.einsum("ab,ptb->pta", kernel, grads[:, :-1])
        rescale = np.linalg.norm(grads[:, :-1], axis=-1) / grad0
        noise = (fs[:, 1:] - fs[:, :-1] - drift) / rescale[..., None]
        measured = np.mean(np.sum(noise ** 2, axis=-1), axis=0)
        expected = etas ** 2 * (N - b) / (N - 1) / b * np.sum(g ** 2)
        np.testing.assert_allclose(measured, expected, rtol=0.25)
        ratio = np.mean(measured[:3]) / np.mean(measured[5:8])  # warmup against the peak
        assert abs(ratio / (np.mean(expected[:3]) / np.mean(expected[5:8])) - 1) < 0.12


@pytest.mark.parametrize("method", ["closed_form", "ode", "sde"])
def test_constant_schedule_is_the_shorthand(prob, method):
    """ntk_tt.sgd(η, m) gives the constant-η keywords' curves bit for bit; a callable constant
    (the general schedule path) gives them to rounding."""
    lr, m = 0.4 * prob["per_kappa"], 0.2
    common = dict(steps=T, loss="mse", method=method, kernel_test=prob["kt"],
                  f0_test=prob["ft0"], y_test=np.zeros(5, int))
    if method == "sde":
        common |= dict(key=jax.random.key(1), noise_features=_noise(prob), num_paths=4)
    kw = dict(batch_size=6) if method == "sde" else {}
    ref = ntk_tt.predict_from_kernel(prob["kernel"], prob["f0"], prob["y"], learning_rate=lr,
                                     momentum=m, **kw, **common)
    got = ntk_tt.predict_from_kernel(prob["kernel"], prob["f0"], prob["y"],
                                     optimizer=ntk_tt.sgd(lr, m, **kw), **common)
    for name in ("loss_paths", "test_loss", "training_time", "kappa"):
        np.testing.assert_array_equal(getattr(got, name), getattr(ref, name), err_msg=name)
    gen = ntk_tt.predict_from_kernel(prob["kernel"], prob["f0"], prob["y"],
                                     optimizer=ntk_tt.sgd(lambda t: lr + 0.0 * t, m, **kw),
                                     **common)
    np.testing.assert_allclose(gen.loss_paths, ref.loss_paths, rtol=1e-9)
    np.testing.assert_allclose(gen.test_loss, ref.test_loss, rtol=1e-9)


def test_predict_constant_optimizer_sde_is_the_shorthand():
    """predict(optimizer=sgd(η), method="sde") routes like predict(learning_rate=η): same
    kernel, noise features and Brownian paths."""
    params, x, y = linear_problem(n=N, d=5, c=C)
    common = dict(steps=8, loss="mse", method="sde", key=jax.random.key(4), num_paths=2,
                  sketch_dim=4)
    ref = ntk_tt.predict(linear_apply, params, x, y, learning_rate=0.05, batch_size=4, **common)
    got = ntk_tt.predict(linear_apply, params, x, y, optimizer=ntk_tt.sgd(0.05, batch_size=4),
                         **common)
    assert got.method == "sde"
    np.testing.assert_array_equal(np.asarray(got.loss), np.asarray(ref.loss))


def boom(*_, **__):
    raise AssertionError("work started before the arguments were checked")


@pytest.fixture
def no_solve(monkeypatch):
    for name in ("_continuous", "clamp_psd", "sgd_trajectory"):
        monkeypatch.setattr(_optim_predict, name, boom)
    monkeypatch.setattr(_predict_optimizer, "_kernels", boom)


def test_bad_combinations_are_refused_before_work(prob, no_solve):
    kern = dict(kernel=prob["kernel"], f0=prob["f0"], y=prob["y"], steps=T)
    key, feats = jax.random.key(0), _noise(prob)
    rates = jnp.linspace(0.1, 0.2, T)
    sgd = ntk_tt.sgd(ntk_tt.warmup_cosine(0.1, 3, T))
    for kw, match in (
            (dict(optimizer=ntk_tt.adamw(1e-3), method="ode"),
             "Adam has no frozen-kernel predictor.*method='discrete'.*closed-form/ODE/SDE"),
            (dict(optimizer=sgd, method="closed_form"), "closed_form' exists for loss='mse'"),
            (dict(optimizer=ntk_tt.sgd(0.1, batch_size=4), method="closed_form", loss="mse",
                  key=key), "full-batch GD only"),
            (dict(optimizer=sgd, method="sde", key=key), "needs noise_features"),
            (dict(optimizer=sgd, method="ode", noise_features=feats), "serve method='sde'"),
            (dict(optimizer=ntk_tt.sgd(lambda t: rates[t]), method="ode"),
             "evaluate the learning-rate schedule at real t"),
            (dict(optimizer=ntk_tt.sgd(0.1, weight_decay=0.1), method="ode"), "pass a ")):
        with pytest.raises(ValueError, match=match):
            ntk_tt.predict_from_kernel(**kern | kw)
    params, x, y = linear_problem(n=N, d=5, c=C)
    with pytest.raises(ValueError, match=r"adamw\(B=N\) has no continuous-time predictor.*"
                                         "use method='discrete'"):
        ntk_tt.predict(linear_apply, params, x, y, optimizer=ntk_tt.adamw(1e-3), method="ode",
                       steps=T, head=(boom, params, jnp.zeros((5, C)), jnp.zeros(C)))


def test_closed_form_with_momentum_warns_beyond_its_effective_edge():
    """A fresh user's finding: sgd(0.1, 0.9) at κ ≈ 0.87 — far below heavy ball's edge 3.8 —
    "diverged" with method="closed_form" (its η/(1 − m) GD model is unstable from 2(1 − m) =
    0.2), while the exact recursion converges. The closed form now says so and its outcome
    is "unknown" there (it was "diverges"); below 2(1 − m) it stays silent."""
    import warnings

    kx, ky = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (12, 3))
    kernel = x @ x.T  # a one-logit (C = 1) kernel, Θ = X Xᵀ
    f0, y = jnp.zeros((12, 2)), jax.random.randint(ky, (12,), 0, 2)
    theta = jnp.kron(kernel, jnp.eye(2))
    lam = float(jnp.linalg.eigvalsh(theta)[-1])
    eta = 0.87 * 12 / lam  # κ = 0.87
    common = dict(steps=60, loss="mse")
    exact = ntk_tt.predict_from_kernel(theta, f0, y, optimizer=ntk_tt.sgd(eta, 0.9), **common)
    assert not exact.diverged
    with pytest.warns(ntk_tt.BeyondEdgeWarning, match=r"2\(1 − m\) = 0.2"):
        approx = ntk_tt.predict_from_kernel(theta, f0, y, optimizer=ntk_tt.sgd(eta, 0.9),
                                            method="closed_form", **common)
    assert approx.diverged  # the approximation's divergence, now flagged
    # ... and no call on the real run: "unknown", not "diverges" (the exact recursion and
    # the real network converge there); beyond heavy ball's own edge 2(1 + m) it diverges
    assert ntk_tt.OUTCOMES[int(approx.outcome)] == "unknown" and int(approx.divergence) == 2
    assert ntk_tt.OUTCOMES[int(exact.outcome)] == "converges"
    with warnings.catch_warnings():  # heavy ball diverges too: a right call, no warning
        warnings.simplefilter("error")
        beyond = ntk_tt.predict_from_kernel(theta, f0, y, optimizer=ntk_tt.sgd(
            4.0 * 12 / lam, 0.9), method="closed_form", **common)  # κ = 4 > 2(1 + m) = 3.8
    assert beyond.beyond_edge and ntk_tt.OUTCOMES[int(beyond.outcome)] == "diverges"
    # Nesterov's own edge 2(1 + m)/(1 + 2m) = 1.36 is named (heavy ball's 3.8 was printed)
    with pytest.warns(ntk_tt.BeyondEdgeWarning, match=r"Nesterov is stable up to 2\(1 \+ m\)/"
                                                      r"\(1 \+ 2m\) = 1\.36\)"):
        nest = ntk_tt.predict_from_kernel(theta, f0, y, optimizer=ntk_tt.sgd(
            eta, 0.9, nesterov=True), method="closed_form", **common)
    assert ntk_tt.OUTCOMES[int(nest.outcome)] == "unknown" and not nest.beyond_edge
    with pytest.warns(ntk_tt.BeyondEdgeWarning):  # the shorthand too
        ntk_tt.predict_from_kernel(theta, f0, y, learning_rate=eta, momentum=0.9,
                                   method="closed_form", **common)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ntk_tt.predict_from_kernel(theta, f0, y, optimizer=ntk_tt.sgd(0.1 * 12 / lam, 0.5),
                                   method="closed_form", **common)  # κ = 0.1 < 2(1 − m) = 1
