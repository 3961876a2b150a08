"""Dtype mixes (issue 25): x64 on/off × float32 / float64 / bfloat16 kernels and logits ×
eager / jit(vmap) over η and m, for predict_from_kernel, predict_head_aware and predict.

The rule under test (README, "Dtypes"): a prediction runs in the kernel's floating dtype
promoted with the logits', at least float32 (bfloat16 promoted; float64 only with x64); η and
m are cast to it. References are independent float64 numpy recursions on the same (for
bfloat16: rounded) values, or, for ``predict``, the same prediction at float64.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import ntk_tt
from ntk_tt.dynamics._predict_head_aware import predict_head_aware
from ntk_tt.kernels._head_aware import HeadAwareKernel

N, C, F, STEPS = 8, 3, 4, 10
LRS, MS = (0.4, 0.8), (0.0, 0.5)  # the jit(vmap) sweep; eager uses the first pair with m = 0.5
DTYPES = ("float32", "float64", "bfloat16")
# eager: every (kernel, logits) pair (one compilation per solve dtype); jit(vmap) compiles per
# pair, so the all-float32 one only, the case under x64 (float64 η and m there)
GRID = [(k, f, "eager") for k in DTYPES for f in DTYPES] + [("float32", "float32", "jit_vmap")]


@pytest.fixture(params=[False, True], ids=["x32", "x64"])
def x64(request):
    with jax.enable_x64(request.param):
        yield request.param


def _expected_dtype(x64_on, *dtypes):
    """The documented rule: float64 iff x64 and some input is float64, else float32."""
    return np.dtype("float64" if x64_on and "float64" in dtypes else "float32")


def _rounded(a, dtype):
    """``a`` as numpy ``dtype`` (bfloat16 via ml_dtypes) and its values back in float64."""
    arr = np.asarray(a).astype(jnp.dtype(dtype))
    return arr, arr.astype(np.float64)


def _softmax(f):
    e = np.exp(f - f.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _ce(f, y):
    return float(np.mean(-np.log(_softmax(f)[np.arange(len(y)), y])))


def _ref_kernel_curve(k, f0, y, lr, m):
    """Heavy ball on the linearised model in float64 numpy: h ← m h + Θ ∇L(f), f ← f − η h."""
    f, h, out = f0.copy(), np.zeros_like(f0), [_ce(f0, y)]
    onehot = np.eye(C)[y]
    for _ in range(STEPS):
        g = (_softmax(f) - onehot) / N
        h = m * h + (k @ g.reshape(-1)).reshape(N, C)
        f = f - lr * h
        out.append(_ce(f, y))
    return np.array(out)


def _ref_head_curve(h0, w, b, kb, y, lr, m):
    """The head-aware model in float64 numpy: head (W, b) exact, features h0 + φ with
    φ moved by k_b g Wᵀ (isotropic S = I), all three by heavy ball."""
    phi, uw, ub, vphi = np.zeros_like(h0), np.zeros_like(w), np.zeros_like(b), np.zeros_like(h0)
    onehot, out = np.eye(C)[y], [_ce(h0 @ w + b, y)]
    for _ in range(STEPS):
        hb = h0 + phi
        g = (_softmax(hb @ w + b) - onehot) / N
        gw, gb, dphi = hb.T @ g, g.sum(0), kb @ g @ w.T
        uw, ub, vphi = m * uw + gw, m * ub + gb, m * vphi + dphi
        w, b, phi = w - lr * uw, b - lr * ub, phi - lr * vphi
        out.append(_ce((h0 + phi) @ w + b, y))
    return np.array(out)


def _kernel_problem():
    """A full-rank Θ = J Jᵀ (N·C = 24, D = 60: λ_min ≈ 8 ≫ bfloat16 rounding of Θ, so no
    clamping in any dtype), scaled to λ_max/N ≈ 1, logits and labels."""
    rng = np.random.default_rng(0)
    j = rng.normal(size=(N * C, 60))
    k = j @ j.T
    k *= N / np.linalg.eigvalsh(k)[-1]
    return k, rng.normal(size=(N, C)), np.arange(N) % C


def _head_problem():
    rng = np.random.default_rng(1)
    v = rng.normal(size=(N, 6))
    return (rng.normal(size=(N, F)), rng.normal(size=(F, C)) / 2, rng.normal(size=C) / 10,
            v @ v.T / 6, np.arange(N) % C)


def _pfk(kernel, f0, y, lr, m):
    return ntk_tt.predict_from_kernel(kernel, f0, y, learning_rate=lr, momentum=m, steps=STEPS)


_PFK_SWEEP = jax.jit(jax.vmap(_pfk, in_axes=(None, None, None, 0, 0)))


def _pha(hk, y, lr, m):
    return predict_head_aware(hk, y, learning_rate=lr, momentum=m, steps=STEPS)


_PHA_SWEEP = jax.jit(jax.vmap(_pha, in_axes=(None, None, 0, 0)))


def _sweep_args(x64_on):
    """η and m for the jit(vmap) mode: float64 arrays under x64 (they must not change the
    solve's dtype), float32 otherwise."""
    dt = np.float64 if x64_on else np.float32
    return np.asarray(LRS, dt), np.asarray(MS, dt)


def _tol(dtype):
    return 1e-10 if dtype == np.float64 else 1e-4


@pytest.mark.parametrize(("kernel_dtype", "logits_dtype", "mode"), GRID)
def test_predict_from_kernel_dtype_grid(x64, kernel_dtype, logits_dtype, mode):
    k, f0, y = _kernel_problem()
    kernel, k_ref = _rounded(k, kernel_dtype)
    logits, f_ref = _rounded(f0, logits_dtype)
    want = _expected_dtype(x64, kernel_dtype, logits_dtype)
    if mode == "eager":
        outs, hyper = [_pfk(kernel, logits, y, LRS[0], 0.5)], [(LRS[0], 0.5)]
    else:
        out = _PFK_SWEEP(kernel, logits, y, *_sweep_args(x64))
        outs = [jax.tree.map(lambda a, i=i: a[i], out) for i in range(len(LRS))]
        hyper = list(zip(LRS, MS, strict=True))
    lam_max = np.linalg.eigvalsh(k_ref)[-1]
    for out, (lr, m) in zip(outs, hyper, strict=True):
        assert out.loss.dtype == want and out.kappa.dtype == want
        assert out.min_eigenvalue.dtype == want and out.training_time.dtype == want
        np.testing.assert_allclose(out.loss, _ref_kernel_curve(k_ref, f_ref, y, lr, m),
                                   rtol=_tol(want))
        np.testing.assert_allclose(out.kappa, lr * lam_max / N, rtol=1e-5)  # power iteration
        assert not bool(out.clamped) and not bool(out.diverged)


@pytest.mark.parametrize(("backbone_dtype", "head_dtype", "mode"), GRID)
def test_predict_head_aware_dtype_grid(x64, head_dtype, backbone_dtype, mode):
    """Features, head W and b in ``head_dtype`` (they make the logits), k_b and S in
    ``backbone_dtype``."""
    h0, w, b, kb, y = _head_problem()
    (h0, h0_ref), (w, w_ref), (b, b_ref) = (_rounded(a, head_dtype) for a in (h0, w, b))
    kb, kb_ref = _rounded(kb, backbone_dtype)
    hk = HeadAwareKernel(h0, w, b, kb, np.eye(F).astype(jnp.dtype(backbone_dtype)))
    want = _expected_dtype(x64, head_dtype, backbone_dtype)
    if mode == "eager":
        outs, hyper = [_pha(hk, y, LRS[0], 0.5)], [(LRS[0], 0.5)]
    else:
        out = _PHA_SWEEP(hk, y, *_sweep_args(x64))
        outs = [jax.tree.map(lambda a, i=i: a[i], out) for i in range(len(LRS))]
        hyper = list(zip(LRS, MS, strict=True))
    for out, (lr, m) in zip(outs, hyper, strict=True):
        assert out.loss.dtype == want and out.kappa.dtype == want
        assert out.min_eigenvalue.dtype == want
        np.testing.assert_allclose(
            out.loss, _ref_head_curve(h0_ref, w_ref, b_ref, kb_ref, y, lr, m), rtol=_tol(want))


class _Net(nnx.Module):
    def __init__(self, dtype, *, rngs):
        self.body = nnx.Linear(5, F, param_dtype=dtype, rngs=rngs)
        self.head = nnx.Linear(F, C, param_dtype=dtype, rngs=rngs)

    def __call__(self, x):
        return self.head(jnp.tanh(self.body(x)))


def _predict(apply_fn, params, head, x, y):
    return ntk_tt.predict(apply_fn, params, x, y, learning_rate=0.5, momentum=0.5,
                          steps=STEPS, head=head)


def _to_float64(tree):
    return jax.tree.map(lambda a: jnp.asarray(a, jnp.float64) if hasattr(a, "dtype") else a,
                        tree)


def _bfloat16_and_float64_predictions(head_aware):
    model = _Net(jnp.bfloat16, rngs=nnx.Rngs(0))
    apply_fn, params = ntk_tt.from_nnx(model)
    head = ntk_tt.split_head(model) if head_aware else None
    x = np.random.default_rng(2).normal(size=(N, 5)).astype(jnp.bfloat16)
    y = np.arange(N) % C
    got = _predict(apply_fn, params, head, x, y)
    with jax.enable_x64(True):
        return got, _predict(apply_fn, *_to_float64((params, head, x)), y)


@pytest.mark.parametrize(("x64_on", "head_aware"), [(False, False), (True, True)],
                         ids=["x32-linear", "x64-head_aware"])
def test_predict_bfloat16_params_run_in_float32(x64_on, head_aware):
    """bfloat16 params and inputs: Θ, f0 and the curves in float32, equal to the float64
    prediction on the same (bfloat16-rounded) values."""
    with jax.enable_x64(x64_on):
        got, ref = _bfloat16_and_float64_predictions(head_aware)
    assert got.loss.dtype == np.float32 and ref.loss.dtype == np.float64
    np.testing.assert_allclose(got.loss, ref.loss, rtol=1e-4)
    np.testing.assert_allclose(got.kappa, ref.kappa, rtol=1e-4)


def test_float32_sde_under_x64_equals_x32():
    """Under x64, a float32 kernel and logits give the SDE prediction of x64 off: the Brownian
    increments are drawn in float32 (in the default float64 they failed the solve)."""
    k, f0, y = _kernel_problem()
    k, f0 = k.astype(np.float32), f0.astype(np.float32)
    noise = (np.random.default_rng(3).normal(size=(N * C, 4)) / 10).astype(np.float32)
    kw = dict(method="sde", key=jax.random.key(0), noise_features=noise, batch_size=4,
              num_paths=2, learning_rate=0.4, steps=STEPS)
    with jax.enable_x64(False):
        ref = ntk_tt.predict_from_kernel(k, f0, y, **kw)
    with jax.enable_x64(True):
        got = ntk_tt.predict_from_kernel(k, f0, y, **kw)
    assert got.loss.dtype == np.float32
    np.testing.assert_allclose(got.loss_paths, ref.loss_paths, rtol=1e-5)


def test_divergence_boundary_float32_under_x64():
    """divergence_boundary (clamp_psd, as predict_from_kernel) with a float32 kernel and
    logits under x64: the final losses equal the numpy float64 recursion."""
    k, f0, y = _kernel_problem()
    k32, f32 = k.astype(np.float32), f0.astype(np.float32)
    with jax.enable_x64(True):
        grid = ntk_tt.divergence_boundary(k32, y, f0=f32, momenta=[0.0, 0.5],
                                          learning_rates=[0.4, 0.8], steps=STEPS)
    for i, m in enumerate((0.0, 0.5)):
        for j, lr in enumerate((0.4, 0.8)):
            want = _ref_kernel_curve(k32.astype(np.float64), f32.astype(np.float64), y, lr, m)
            np.testing.assert_allclose(grid.final_loss[i, j], want[-1], rtol=1e-4)


def test_complex_inputs_refused_before_work(monkeypatch):
    """Complex x, kernel, f0 or HeadAwareKernel field: one ValueError naming it."""
    import ntk_tt.kernels._ntk as ntk_mod

    def no_kernel(*args, **kwargs):
        raise AssertionError("the kernel was built")

    monkeypatch.setattr(ntk_mod, "empirical_ntk", no_kernel)
    model = _Net(jnp.float32, rngs=nnx.Rngs(0))
    apply_fn, params = ntk_tt.from_nnx(model)
    x = np.ones((N, 5), np.complex64)
    y = np.arange(N) % C
    with pytest.raises(ValueError, match=r"^x is complex \(complex64\)"):
        ntk_tt.predict(apply_fn, params, x, y, learning_rate=0.1, steps=STEPS)
    k, f0, _ = _kernel_problem()
    with pytest.raises(ValueError, match=r"^kernel is complex \(complex128\)"):
        ntk_tt.predict_from_kernel(k.astype(complex), f0, y, learning_rate=0.1, steps=STEPS)
    with pytest.raises(ValueError, match=r"^f0 is complex \(complex128\)"):
        ntk_tt.predict_from_kernel(k, f0.astype(complex), y, learning_rate=0.1, steps=STEPS)
    h0, w, b, kb, _ = _head_problem()
    hk = HeadAwareKernel(h0.astype(np.complex64), w, b, kb, np.eye(F))
    with pytest.raises(ValueError, match=r"^hk\.features is complex \(complex64\)"):
        predict_head_aware(hk, y, learning_rate=0.1, steps=STEPS)
