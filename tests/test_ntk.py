"""Exact empirical NTK, Θ·v, top eigenvalues and the memory guard vs brute-force references."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _ntk_models import brute_ntk, cnn, inputs, setup

import ntk_tt
import ntk_tt.kernels._blocks as blocks_module
import ntk_tt.kernels._ntk as ntk_module
from ntk_tt.kernels._structured import contract, contract_host, structured_jacobian


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


@functools.cache
def _brute(kind, n):
    return brute_ntk(*setup(kind, n))


def _rel(a, b):
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_exact_kernel_matches_jacrev_contraction(x64, kind):
    apply_fn, params, x = setup(kind)
    theta = ntk_tt.empirical_ntk(apply_fn, params, x)
    assert theta.shape == (5 * 3, 5 * 3) and theta.dtype == jnp.float64
    assert _rel(theta, _brute(kind, 5)) < 1e-6


def test_layout_is_sample_major_element_by_element(x64):
    apply_fn, params, x = setup("mlp", n=3)
    theta = np.asarray(ntk_tt.empirical_ntk(apply_fn, params, x))
    c = 3
    grads = {
        (i, a): jax.flatten_util.ravel_pytree(
            jax.grad(lambda p, i=i, a=a: apply_fn(p, x[i : i + 1])[0, a])(params)
        )[0]
        for i in range(3)
        for a in range(c)
    }
    for (i, a), gi in grads.items():
        for (j, b), gj in grads.items():
            np.testing.assert_allclose(theta[i * c + a, j * c + b], gi @ gj, rtol=1e-10)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_traced_kernel_is_sum_of_diagonal_logit_blocks(x64, kind):
    apply_fn, params, x = setup(kind)
    full = np.asarray(ntk_tt.empirical_ntk(apply_fn, params, x))
    traced = np.asarray(ntk_tt.empirical_ntk(apply_fn, params, x, trace_logits=True))
    assert traced.shape == (5, 5)
    expected = sum(full[a::3, a::3] for a in range(3))
    np.testing.assert_allclose(traced, expected, rtol=1e-10)


def test_block_function_compiles_once_per_model_and_block_shape(x64, monkeypatch):
    """An exact then a traced kernel of one model, and the same kernel again, lower the
    Jacobian block function once; another block shape lowers it again."""
    apply_fn, params, x = setup("cnn")
    lowered = []

    class Counting:
        def lower(self, *args):
            lowered.append(args[2].shape)
            return structured_jacobian.lower(*args)

    monkeypatch.setattr(ntk_module, "structured_jacobian", Counting())
    monkeypatch.setattr(ntk_module, "_COMPILED", {})
    full = np.asarray(ntk_tt.empirical_ntk(apply_fn, params, x))
    traced = np.asarray(ntk_tt.empirical_ntk(apply_fn, params, x, trace_logits=True))
    again = np.asarray(ntk_tt.empirical_ntk(apply_fn, params, x))
    assert lowered == [(5, *x.shape[1:])]
    assert _rel(full, _brute("cnn", 5)) < 1e-6 and np.array_equal(again, full)
    np.testing.assert_allclose(traced, sum(full[a::3, a::3] for a in range(3)), rtol=1e-10)
    np.testing.assert_allclose(ntk_tt.empirical_ntk(apply_fn, params, x[:3]),
                               full[:9, :9], rtol=1e-10)
    assert lowered == [(5, *x.shape[1:]), (3, *x.shape[1:])]


@pytest.mark.parametrize("block_size", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("trace_logits", [False, True])
def test_block_size_does_not_change_result(x64, block_size, trace_logits):
    apply_fn, params, x = setup("cnn")
    x2 = inputs("cnn", jax.random.key(7), 4)
    ref = ntk_tt.empirical_ntk(apply_fn, params, x, trace_logits=trace_logits)
    got = ntk_tt.empirical_ntk(
        apply_fn, params, x, trace_logits=trace_logits, block_size=block_size
    )
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14)
    cross_ref = ntk_tt.empirical_ntk(apply_fn, params, x, x2, trace_logits=trace_logits)
    cross = ntk_tt.empirical_ntk(
        apply_fn, params, x, x2, trace_logits=trace_logits, block_size=block_size
    )
    np.testing.assert_allclose(cross, cross_ref, rtol=1e-12, atol=1e-14)


def test_cross_kernel_is_off_diagonal_block_of_joint_kernel(x64):
    apply_fn, params, x = setup("cnn")
    x2 = inputs("cnn", jax.random.key(3), 3)
    cross = ntk_tt.empirical_ntk(apply_fn, params, x, x2)
    assert cross.shape == (15, 9)
    np.testing.assert_allclose(cross, brute_ntk(apply_fn, params, x, x2), rtol=1e-10)
    joint = ntk_tt.empirical_ntk(apply_fn, params, jnp.concatenate([x, x2]), trace_logits=True)
    traced = ntk_tt.empirical_ntk(apply_fn, params, x, x2, trace_logits=True)
    np.testing.assert_allclose(traced, joint[:5, 5:], rtol=1e-10)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_ntk_vector_product_equals_dense_product(x64, kind):
    apply_fn, params, x = setup(kind)
    theta = _brute(kind, 5)
    mv = ntk_tt.ntk_vector_product(apply_fn, params, x)
    v = jax.random.normal(jax.random.key(1), (15, 4))
    np.testing.assert_allclose(mv(v), theta @ v, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(mv(v[:, 0]), theta @ v[:, 0], rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="v must have shape"):
        mv(jnp.ones((14,)))


def test_matrix_free_kernels_built_under_a_transformation_are_one_error():
    """A fresh user: ntk_vector_product and ntk_top_eigenvalues built inside jax.jit or grad
    failed with a TracerArrayConversionError from the model checks (empirical_ntk gave a
    ValueError); now a ValueError that says to build outside, and the product built outside
    runs under jit."""
    apply_fn, params, x = setup("mlp")
    u = jnp.ones(15)
    calls = [
        lambda: jax.jit(lambda v: ntk_tt.ntk_vector_product(apply_fn, params, x)(v))(u),
        lambda: jax.grad(lambda p: ntk_tt.ntk_vector_product(apply_fn, p, x)(u).sum())(params),
        lambda: jax.jit(lambda z: ntk_tt.ntk_top_eigenvalues(apply_fn, params, z, 2,
                                                             key=jax.random.key(0)))(x)]
    for call in calls:
        with pytest.raises(ValueError, match=r"traced \(inside jax.jit, vmap or grad\).*call "
                                             "this outside the transformation"):
            call()
    mv = ntk_tt.ntk_vector_product(apply_fn, params, x)
    np.testing.assert_allclose(jax.jit(mv)(u), mv(u), rtol=1e-6)
    with pytest.raises(ValueError, match="v must be a real array.*got dtype complex128; apply "
                                         "mv to v.real and v.imag apart"):
        mv(np.ones(15, np.complex128))  # its imaginary part was dropped with a warning
    with pytest.raises(ValueError, match="got dtype bool; pass v.astype"):
        mv(np.ones(15) > 0)


def test_top_eigenvalues_match_dense_eigh(x64):
    apply_fn, params, x = setup("cnn")
    eig = np.linalg.eigvalsh(np.asarray(_brute("cnn", 5)))[::-1]
    top = ntk_tt.ntk_top_eigenvalues(apply_fn, params, x, 4, key=jax.random.key(0))
    np.testing.assert_allclose(top, eig[:4], rtol=1e-8)
    with pytest.raises(ValueError, match="k must be"):
        ntk_tt.ntk_top_eigenvalues(apply_fn, params, x, 15, key=jax.random.key(0))
    for bad in (None, 0, "0", np.arange(3)):  # JAX's own TypeErrors before
        with pytest.raises(ValueError, match="key must be"):
            ntk_tt.ntk_top_eigenvalues(apply_fn, params, x, 4, key=bad)
    with pytest.raises(ValueError, match=r"got 2 raw keys .*keys\[0\]"):
        ntk_tt.ntk_top_eigenvalues(apply_fn, params, x, 4,
                                   key=jax.random.split(jax.random.PRNGKey(0), 2))
    with pytest.raises(ValueError, match="k must be"):  # a bool is not a count (scipy's error)
        ntk_tt.ntk_top_eigenvalues(apply_fn, params, x, True, key=jax.random.key(0))


def test_memory_guard_fails_before_any_jacobian(monkeypatch):
    apply_fn, params, x = setup("cnn")

    def no_jacobians(*args, **kwargs):
        raise AssertionError("a Jacobian was computed before the memory guard")

    monkeypatch.setattr(ntk_module, "structured_jacobian", no_jacobians)
    with pytest.raises(ntk_tt.NTKMemoryError) as err:
        ntk_tt.empirical_ntk(apply_fn, params, x, memory_limit=1000)
    assert isinstance(err.value, MemoryError) and isinstance(err.value, ValueError)
    for hint in ("needs about", "with block_size=1 ", "trace_logits=True", "sketched_ntk",
                 "memory_limit"):
        assert hint in str(err.value)
    assert "smaller block_size" not in str(err.value)  # it is 1 already
    with pytest.raises(ntk_tt.NTKMemoryError) as err:
        ntk_tt.empirical_ntk(apply_fn, params, x, block_size=2, memory_limit=1000)
    assert "a smaller block_size" in str(err.value)
    monkeypatch.setenv("NTK_TT_MEMORY_LIMIT", "1000")
    with pytest.raises(MemoryError, match="available"):
        ntk_tt.empirical_ntk(apply_fn, params, x, trace_logits=True)


@pytest.mark.parametrize("limit", [float("nan"), float("inf"), "1e9", True, -1, 0.5, None])
def test_a_memory_limit_that_is_not_a_positive_number_of_bytes_is_named(limit, monkeypatch):
    apply_fn, params, x = setup("mlp")
    if limit is None:  # the environment variable instead
        monkeypatch.setenv("NTK_TT_MEMORY_LIMIT", "inf")
    name = "NTK_TT_MEMORY_LIMIT" if limit is None else "memory_limit"
    with pytest.raises(ValueError, match=rf"{name} must be a .*number of bytes") as err:
        ntk_tt.empirical_ntk(apply_fn, params, x, memory_limit=limit)
    assert not isinstance(err.value, MemoryError)


def test_a_float_memory_limit_is_a_number_of_bytes():
    apply_fn, params, x = setup("mlp")
    np.testing.assert_array_equal(ntk_tt.empirical_ntk(apply_fn, params, x, memory_limit=1e9),
                                  ntk_tt.empirical_ntk(apply_fn, params, x))


def test_params_without_parameters_are_refused():
    x = jnp.ones((4, 5))
    for empty in ({}, [], {"w": jnp.zeros((0, 3))}):
        with pytest.raises(ValueError, match=r"params holds no parameters \(D = 0"):
            ntk_tt.empirical_ntk(lambda p, x: x[:, :3], empty, x)


def test_automatic_block_size_fits_a_tight_memory_limit(x64):
    apply_fn, params, x = setup("cnn")
    # Θ plus two blocks of 3 samples (one being computed) is 1 byte too much
    work, out = _block_bytes(apply_fn, params, x[:3])
    limit = 8 * 15**2 + work + 2 * out - 1
    theta = ntk_tt.empirical_ntk(apply_fn, params, x, memory_limit=limit)
    np.testing.assert_allclose(theta, _brute("cnn", 5), rtol=1e-10)
    with pytest.raises(MemoryError):
        ntk_tt.empirical_ntk(apply_fn, params, x, block_size=3, memory_limit=limit)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_bad_block_size_raises(bad):
    apply_fn, params, x = setup("mlp")
    with pytest.raises(ValueError, match="block_size"):
        ntk_tt.empirical_ntk(apply_fn, params, x, block_size=bad)


@pytest.mark.parametrize("bad", ["yes", "no", 1, 0, None])
def test_trace_logits_must_be_a_bool(bad, monkeypatch):
    """trace_logits="yes" (or "no", read as True) was accepted: one ValueError, before the
    model is even traced; numpy bools are fine."""
    apply_fn, params, x = setup("mlp")

    def no_work(*_, **__):
        raise AssertionError("work started before trace_logits was checked")

    monkeypatch.setattr(blocks_module, "check_model", no_work)  # its input checks
    with pytest.raises(ValueError, match=r"^trace_logits must be True \(logit-summed .* or "
                                         r"False .*, got "):
        ntk_tt.empirical_ntk(apply_fn, params, x, trace_logits=bad)
    with pytest.raises(ValueError, match=r"^trace_logits must be True"):  # the same check
        ntk_tt.sharded_empirical_ntk(apply_fn, params, x, trace_logits=bad)
    monkeypatch.undo()
    got = ntk_tt.empirical_ntk(apply_fn, params, x, trace_logits=np.bool_(True))
    assert got.shape == (x.shape[0], x.shape[0])


def test_a_bare_array_params_is_named_as_such_in_leaf_errors():
    """A fresh user: with params one array (its tree path empty) the messages read "params
    leaf  has dtype int32", a double space where the leaf's path goes. A bare array is now
    "params (a single array)" (num_params: "params"); a leaf of a pytree keeps its path. The
    float array itself passes, and its NTK is the brute-force one of x @ p."""
    x, fn = jnp.ones((4, 3)), lambda p, x: x @ p
    with pytest.raises(ValueError) as err:
        ntk_tt.empirical_ntk(fn, jnp.ones((3, 2), jnp.int32), x)
    assert str(err.value).startswith("params (a single array) has dtype int32: the NTK and ")
    with pytest.raises(ValueError) as err:
        ntk_tt.empirical_ntk(fn, jnp.full((3, 2), jnp.nan), x)
    assert str(err.value) == ("params (a single array) contains NaN or inf; load a valid "
                              "checkpoint or re-initialise.")
    with pytest.raises(ValueError, match=r"^params \(ArrayImpl\) is not a numeric array or a "
                                         r"number; pass the weights alone"):
        ntk_tt.num_params(jnp.ones(3, bool))
    with pytest.raises(ValueError, match=r"^params leaf \['w'\] has dtype int32"):
        ntk_tt.empirical_ntk(lambda p, x: x @ p["w"], {"w": jnp.ones((3, 2), jnp.int32)}, x)
    p = jnp.arange(6.0).reshape(3, 2)
    np.testing.assert_allclose(ntk_tt.empirical_ntk(fn, p, x), brute_ntk(fn, p, x), rtol=1e-6)


def test_bad_inputs_raise_value_error():
    apply_fn, params, x = setup("mlp")
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        ntk_tt.empirical_ntk(apply_fn, params, x[0])
    with pytest.raises(ValueError, match="NaN or inf"):
        ntk_tt.empirical_ntk(apply_fn, params, x.at[1, 2].set(jnp.nan))
    bad_params = dict(params, b1=params["b1"].at[0].set(jnp.inf))
    with pytest.raises(ValueError, match="params leaf"):
        ntk_tt.empirical_ntk(apply_fn, bad_params, x)
    int_params = dict(params, n=jnp.array(2, jnp.int32))  # jacrev's own error before
    with pytest.raises(ValueError, match=r"params leaf \['n'\] has dtype int32"):
        ntk_tt.empirical_ntk(lambda p, x: apply_fn(p, x) * p["n"], int_params, x)
    with pytest.raises(ValueError, match=r"shape \(N, C\)"):
        ntk_tt.empirical_ntk(lambda p, x: apply_fn(p, x)[:, 0], params, x)
    with pytest.raises(ValueError, match="x2 must be a batch"):
        ntk_tt.empirical_ntk(apply_fn, params, x, x[0])


def test_traced_arguments_are_refused_in_one_line_before_any_work(monkeypatch):
    """A fresh user: jax.jit / grad / vmap over empirical_ntk gave a raw
    TracerArrayConversionError; it builds Θ from concrete arrays (memory plan, host buffers),
    so a traced params, x or x2 is refused as head_aware_kernel does, before any work."""
    apply_fn, params, x = setup("mlp")

    def no_work(*args, **kwargs):
        raise AssertionError("kernel work started")

    monkeypatch.setattr(blocks_module, "check_model", no_work)  # its input checks
    monkeypatch.setattr(ntk_module, "_plan", no_work)
    for name, call in (
            ("x", lambda: jax.jit(lambda xx: ntk_tt.empirical_ntk(apply_fn, params, xx))(x)),
            ("x2", lambda: jax.vmap(lambda xx: ntk_tt.empirical_ntk(apply_fn, params, x,
                                                                    xx[None]))(x)),
            ("params", lambda: jax.grad(lambda p: ntk_tt.empirical_ntk(apply_fn, p, x).sum())(
                params))):
        with pytest.raises(ValueError, match=rf"^empirical_ntk builds its kernels from concrete "
                                             rf"arrays and cannot run under jax.jit, vmap or "
                                             rf"grad \({name} is traced\): .*\(predict_from_"
                                             rf"kernel\) over the hyperparameters") as err:
            call()
        assert "\n" not in str(err.value)


def test_structured_dense_leaves_are_detected_and_tied_weights_fall_back(x64):
    apply_fn, params, x = setup("mlp")
    jac = structured_jacobian(apply_fn, params, x)
    names = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)]
    assert sorted(names[i] for i in jac.acts) == ["['w1']", "['w2']"]
    assert [names[i] for i in jac.generic] == ["['b1']"]

    def tied(p, x):  # W used twice: its Jacobian is not h ⊗ δ, so it must fall back
        return jnp.tanh(x @ p["w"]) @ p["w"].T @ p["v"]

    k1, k2 = jax.random.split(jax.random.key(2))
    p = {"w": jax.random.normal(k1, (6, 6)) / 3, "v": jax.random.normal(k2, (6, 3))}
    jac = structured_jacobian(tied, p, x)  # leaf order: v (dense, used once), w (tied)
    assert list(jac.acts) == [0] and list(jac.generic) == [1]
    np.testing.assert_allclose(ntk_tt.empirical_ntk(tied, p, x), brute_ntk(tied, p, x), rtol=1e-10)


_CONVS = {  # lhs, rhs, out layouts, strides, padding, lhs / rhs dilation, kernel shape
    "nhwc_same": ("NHWC", "HWIO", "NHWC", (1, 1), "SAME", (1, 1), (1, 1), (3, 3, 2, 4)),
    "stride2_valid": ("NHWC", "HWIO", "NHWC", (2, 2), "VALID", (1, 1), (1, 1), (3, 2, 2, 4)),
    "nchw_asym_pad_rhs_dil": ("NCHW", "OIHW", "NCHW", (1, 2), ((1, 2), (0, 1)), (1, 1),
                              (2, 1), (4, 2, 3, 2)),
    "ohwi_lhs_dil": ("NHWC", "OHWI", "NHWC", (1, 1), ((1, 1), (2, 0)), (2, 1), (1, 1),
                     (4, 3, 2, 2)),
    "one_by_one": ("NHWC", "HWIO", "NHWC", (1, 1), "SAME", (1, 1), (1, 1), (1, 1, 2, 5)),
}


def _per_sample_jacrev(apply_fn, params, x):
    """Per-leaf per-sample Jacobians (N, C, size) by vmap(jacrev) on the whole network."""
    leaves, treedef = jax.tree.flatten(params)
    jac = jax.vmap(jax.jacrev(lambda ls, xi: apply_fn(treedef.unflatten(ls), xi[None])[0]),
                   in_axes=(None, 0))(leaves, x)
    return [j.reshape(x.shape[0], j.shape[1], -1) for j in jac]


@pytest.mark.parametrize("name", list(_CONVS))
def test_convolution_jacobians_from_patches_equal_jacrev(x64, name):
    lhs, rhs, out, strides, pad, ldil, rdil, wshape = _CONVS[name]
    k1, k2, k3 = jax.random.split(jax.random.key(5), 3)
    x = jax.random.normal(k1, (3, 7, 6, 2) if lhs == "NHWC" else (3, 2, 7, 6))

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, strides, pad, ldil, rdil,
                                            dimension_numbers=(lhs, rhs, out))

    w = jax.random.normal(k2, wshape) / 3
    width = int(np.prod(jax.eval_shape(conv, x, w).shape[1:]))
    params = {"conv": w, "head": jax.random.normal(k3, (width, 3)) / 5}

    def apply_fn(p, x):
        h = jnp.tanh(conv(x, p["conv"]))
        return h.reshape(h.shape[0], -1) @ p["head"]

    jac = structured_jacobian(apply_fn, params, x)  # leaves: conv (0), head (1, dense)
    assert list(jac.generic) == [0] and list(jac.acts) == [1]
    np.testing.assert_allclose(jac.generic[0], _per_sample_jacrev(apply_fn, params, x)[0],
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ntk_tt.empirical_ntk(apply_fn, params, x),
                               brute_ntk(apply_fn, params, x), rtol=1e-10, atol=1e-12)


def test_patches_times_matrix_and_grouped_convolution(x64):
    """A convolution written as patches @ W (weights shared over positions) is formed from
    the patches; a grouped convolution is not structured and keeps vmap(jacrev)."""
    ks = jax.random.split(jax.random.key(6), 4)
    params = {"a_mat": jax.random.normal(ks[0], (18, 4)) / 4,
              "b_grouped": jax.random.normal(ks[1], (3, 3, 2, 4)) / 4,
              "c_head": jax.random.normal(ks[2], (36 * 4, 2)) / 9}
    dn = ("NHWC", "HWIO", "NHWC")

    def apply_fn(p, x):
        patches = jax.lax.conv_general_dilated_patches(x, (3, 3), (1, 1), "SAME",
                                                       dimension_numbers=dn)
        h = jnp.tanh(patches @ p["a_mat"])
        h = jax.lax.conv_general_dilated(h, p["b_grouped"], (1, 1), "SAME",
                                         dimension_numbers=dn, feature_group_count=2)
        return jnp.tanh(h).reshape(h.shape[0], -1) @ p["c_head"]

    x = jax.random.normal(ks[3], (4, 6, 6, 2))
    jac = structured_jacobian(apply_fn, params, x)
    assert list(jac.generic) == [0, 1] and list(jac.acts) == [2]
    ref = _per_sample_jacrev(apply_fn, params, x)
    for i in (0, 1):
        np.testing.assert_allclose(jac.generic[i], ref[i], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ntk_tt.empirical_ntk(apply_fn, params, x, trace_logits=True),
                               jnp.einsum("icjc->ij", brute_ntk(apply_fn, params, x).reshape(
                                   4, 2, 4, 2)), rtol=1e-10)


def test_symmetric_kernel_from_upper_chunks_equals_brute_force(x64):
    """N·C = 1,560 rows (4 chunks; traced: 520 rows, 2 chunks) of the symmetric Gram, by
    ``empirical_ntk`` (on a CPU: the host BLAS, ``contract_host``) and by the XLA
    ``contract`` (the upper-chunk products; used on accelerators and when sharded)."""
    apply_fn, params, x = setup("mlp", n=520)
    theta, ref = ntk_tt.empirical_ntk(apply_fn, params, x), brute_ntk(apply_fn, params, x)
    traced_ref = jnp.einsum("icjc->ij", ref.reshape(520, 3, 520, 3))
    np.testing.assert_allclose(theta, ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ntk_tt.empirical_ntk(apply_fn, params, x, trace_logits=True),
                               traced_ref, rtol=1e-10, atol=1e-12)
    jac = structured_jacobian(apply_fn, params, x)
    for trace, want in ((False, ref), (True, traced_ref)):
        np.testing.assert_allclose(contract(jac, jac, trace, symmetric=True), want,
                                   rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("trace_logits", [False, True])
def test_host_contraction_equals_xla_contraction(x64, kind, trace_logits):
    """``contract_host`` (numpy BLAS, what ``empirical_ntk`` uses on a CPU) against the XLA
    ``contract``, for a diagonal block (symmetric) and a cross block, with generic and
    structured dense leaves."""
    apply_fn, params, x = setup(kind, n=7)
    ja = structured_jacobian(apply_fn, params, x[:4])
    jb = structured_jacobian(apply_fn, params, x[4:])
    assert ja.generic and ja.cotangents if kind == "mlp" else ja.generic
    for a, b, sym in ((ja, ja, True), (ja, jb, False)):
        host = contract_host(a, b, trace_logits, symmetric=sym)
        assert isinstance(host, np.ndarray)
        np.testing.assert_allclose(host, contract(a, b, trace_logits, symmetric=sym),
                                   rtol=1e-12, atol=1e-14)


def _wide_conv():
    """conv3×3(3→16) on 16×16 images, global average pool, dense 16→3: the activations that
    per-sample vmap(jacrev) keeps (16×16×16 per sample and logit) dwarf J (3 × 451 per sample)."""
    k1, k2 = jax.random.split(jax.random.key(3))
    params = {"conv": jax.random.normal(k1, (3, 3, 3, 16)) / 5,
              "head": jax.random.normal(k2, (16, 3)) / 4}

    def apply_fn(p, x):
        h = jax.lax.conv_general_dilated(x, p["conv"], (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jnp.tanh(h).mean(axis=(1, 2)) @ p["head"]

    return apply_fn, params, jax.random.normal(jax.random.key(4), (8, 16, 16, 3))


def _block_bytes(apply_fn, params, xb):
    """(working, output) bytes of one Jacobian block of every logit (the identity
    cotangents ``empirical_ntk`` passes), from XLA's memory analysis."""
    c = jax.eval_shape(apply_fn, params, xb).shape[1]
    cot = jnp.eye(c, dtype=xb.dtype)
    ma = structured_jacobian.lower(apply_fn, params, xb, cot).compile().memory_analysis()
    return ma.temp_size_in_bytes + ma.argument_size_in_bytes, ma.output_size_in_bytes


def _block_sizes(monkeypatch):
    """The block sizes ``empirical_ntk``'s plans choose, one per call."""
    used = []
    real = ntk_module._plan

    def spy(*args):
        plan = real(*args)
        used.append(plan.block_size)
        return plan

    monkeypatch.setattr(ntk_module, "_plan", spy)
    return used


def test_memory_plan_counts_the_activations_of_the_jacobian(monkeypatch):
    apply_fn, params, x = _wide_conv()
    n, c, d = 8, 3, ntk_tt.num_params(params)
    kernel = 4 * (n * c) ** 2
    old_estimate = kernel + 4 * n * c * d  # Θ + Jacobians of one whole block
    work, out = _block_bytes(apply_fn, params, x)
    assert kernel + work + out > 2 * old_estimate  # activations dominate
    limit = (old_estimate + kernel + work + out) // 2  # the old plan took one block of 8
    ref = ntk_tt.empirical_ntk(apply_fn, params, x)
    used = _block_sizes(monkeypatch)
    theta = ntk_tt.empirical_ntk(apply_fn, params, x, memory_limit=limit)
    assert 1 < used[0] < n
    np.testing.assert_allclose(theta, ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(ntk_tt.NTKMemoryError, match="activations"):
        ntk_tt.empirical_ntk(apply_fn, params, x, block_size=n, memory_limit=limit)


def test_memory_plan_warns_when_it_falls_to_one_sample_per_block(monkeypatch):
    apply_fn, params, x = _wide_conv()
    work, out = _block_bytes(apply_fn, params, x[:1])
    limit = 4 * 24**2 + work + 2 * out  # Θ + one block computed while another is held
    ref = ntk_tt.empirical_ntk(apply_fn, params, x)
    used = _block_sizes(monkeypatch)
    with pytest.warns(UserWarning, match=r"one sample at a time .* 36 block pairs"):
        theta = ntk_tt.empirical_ntk(apply_fn, params, x, memory_limit=limit)
    assert used[0] == 1
    np.testing.assert_allclose(theta, ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(ntk_tt.NTKMemoryError):
        ntk_tt.empirical_ntk(apply_fn, params, x, memory_limit=limit - out)


def test_memory_plan_shrinks_past_the_two_block_lower_bound(monkeypatch):
    """One block of all 8 samples passes the uncompiled lower bound but not the compiled
    check, and the first shrunk size fails the lower bound of two blocks held at once:
    the plan must keep shrinking (it used to raise NTKMemoryError here)."""
    apply_fn, params = cnn(jax.random.key(0))
    x = inputs("cnn", jax.random.key(1), 8)
    ref = ntk_tt.empirical_ntk(apply_fn, params, x, trace_logits=True)
    c, d = 3, ntk_tt.num_params(params)
    work, out = _block_bytes(apply_fn, params, x)
    limit = 4 * 8**2 + 4 * c * d * 8 + (work + out) // 4  # single block: lower bound only
    assert 4 * 8**2 + work + out > limit
    used = _block_sizes(monkeypatch)
    theta = ntk_tt.empirical_ntk(apply_fn, params, x, trace_logits=True, memory_limit=limit)
    assert 1 < used[0] < 8
    np.testing.assert_allclose(theta, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("group_bytes", [None, 1, 9, 5])
def test_chunks_and_logit_groups_give_the_brute_force_kernel(x64, monkeypatch, group_bytes):
    """Jacobians two samples per compiled call (host buffers), and the logit-summed kernel
    accumulated over logit groups of one, or of two (the second padded by a zero
    cotangent, whose products are skipped), in one or several sample blocks: every kernel
    equals brute force. ``group_bytes`` 9 / 5: two logits of 9 / 5 samples fit (the cross /
    the symmetric kernel gets groups of two)."""
    apply_fn, params, x = setup("cnn")
    x2 = inputs("cnn", jax.random.key(7), 4)
    c = 3
    monkeypatch.setattr(ntk_module, "CPU_CHUNK", 2)
    samples = group_bytes
    if group_bytes in (9, 5):
        per_logit, per_sample = ntk_module._jacobian_bytes(apply_fn, params, x, c, x.dtype)
        group_bytes = samples * (2 * per_logit + per_sample)
    if group_bytes is not None:
        monkeypatch.setattr(ntk_module, "GROUP_BYTES", group_bytes)
    plans = []
    real = ntk_module._plan
    monkeypatch.setattr(ntk_module, "_plan", lambda *a: plans.append(real(*a)) or plans[-1])
    full = brute_ntk(apply_fn, params, x)
    cross = brute_ntk(apply_fn, params, x, x2)

    def traced(k, n2):
        return jnp.einsum("icjc->ij", k.reshape(-1, c, n2, c))

    for block_size in (None, 3):
        kw = dict(block_size=block_size)
        np.testing.assert_allclose(ntk_tt.empirical_ntk(apply_fn, params, x, **kw), full,
                                   rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(ntk_tt.empirical_ntk(apply_fn, params, x, x2, **kw), cross,
                                   rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(ntk_tt.empirical_ntk(apply_fn, params, x, trace_logits=True,
                                                        **kw), traced(full, 5), rtol=1e-10)
        np.testing.assert_allclose(ntk_tt.empirical_ntk(apply_fn, params, x, x2,
                                                        trace_logits=True, **kw),
                                   traced(cross, 4), rtol=1e-10)
    assert {p.chunk for p in plans} == {2}
    assert all(len(p.groups) == 1 for p in plans[0::4] + plans[1::4])  # exact: every logit
    def groups(ps):
        return {(len(p.groups), p.groups[0].shape) for p in ps}

    sym, cross = groups(plans[2::4]), groups(plans[3::4])  # the traced kernels
    want = {None: ({(1, (3, 3))}, {(1, (3, 3))}), 1: ({(3, (1, 3))}, {(3, (1, 3))}),
            9: ({(1, (3, 3))}, {(2, (2, 3))}), 5: ({(2, (2, 3))}, {(3, (1, 3))})}
    assert (sym, cross) == want[samples]
    padded = plans[3] if samples == 9 else plans[2] if samples == 5 else None
    if padded is not None:
        np.testing.assert_array_equal(padded.groups[1], [[0, 0, 1], [0, 0, 0]])


def test_logit_groups_cover_every_logit_once():
    for c in range(1, 12):
        for group in range(1, c + 1):
            groups = ntk_module.logit_groups(c, group, np.float32)
            assert len({g.shape for g in groups}) == 1 and groups[0].shape[0] <= group
            np.testing.assert_array_equal(sum(g.T @ g for g in groups), np.eye(c))


def test_a_tight_memory_limit_takes_fewer_logits_before_fewer_samples(x64, monkeypatch):
    """Under a limit where the logit-summed kernel's Jacobians of all C logits do not fit
    but those of one logit do, the plan holds one logit at a time in one sample block (one
    forward pass more per logit) instead of splitting the samples into blocks (Jacobians
    recomputed for every block pair); the kernel equals brute force."""
    apply_fn, params = cnn(jax.random.key(0))
    n, c = 64, 3
    x = inputs("cnn", jax.random.key(1), n)
    per_logit, per_sample = ntk_module._jacobian_bytes(apply_fn, params, x, c, x.dtype)
    kernel = 8 * n * n
    # half the memory beside Θ holds one logit's Jacobians of all samples, not two
    limit = kernel + 2 * n * (per_logit + per_sample) + n * per_logit
    args = (apply_fn, params, x, None, c, True, None, limit)
    with monkeypatch.context() as m:  # every logit at once: the samples would be split
        groups = ntk_module.logit_groups
        m.setattr(ntk_module, "logit_groups", lambda c, g, dtype: groups(c, c, dtype))
        assert ntk_module._plan(*args).block_size < n
    plans = []
    real = ntk_module._plan
    monkeypatch.setattr(ntk_module, "_plan", lambda *a: plans.append(real(*a)) or plans[-1])
    theta = ntk_tt.empirical_ntk(apply_fn, params, x, trace_logits=True, memory_limit=limit)
    assert plans[0].block_size == n and [g.shape for g in plans[0].groups] == [(1, c)] * c
    np.testing.assert_allclose(
        theta, jnp.einsum("icjc->ij", brute_ntk(apply_fn, params, x).reshape(n, c, n, c)),
        rtol=1e-10)


def test_x2_samples_of_another_shape_are_refused():
    """A fresh user (session 41): a 16×16 x2 beside 32×32 x gave a kernel without a word (a
    model that pools over space takes any image size). Θ(x, x2) pairs samples of one input
    space: x2's per-sample shape must be x's, in every kernel function."""
    def pooled(p, x):  # global average pooling, then a linear head: any H × W
        return jnp.tanh(x @ p["c"]).mean(axis=(1, 2)) @ p["w"]

    params = {"c": jnp.ones((3, 4)) / 3, "w": jnp.ones((4, 2)) / 4}
    x = jax.random.normal(jax.random.key(0), (4, 8, 8, 3))
    x2 = jax.random.normal(jax.random.key(1), (3, 4, 4, 3))
    assert pooled(params, x2).shape == (3, 2)  # the model itself takes it
    said = r"x2's samples have shape \(4, 4, 3\), x's \(8, 8, 3\): Θ\(x, x2\) pairs samples"
    for fn in (ntk_tt.empirical_ntk, ntk_tt.sharded_empirical_ntk):
        with pytest.raises(ValueError, match=said):
            fn(pooled, params, x, x2)
    assert ntk_tt.empirical_ntk(pooled, params, x, x2[:, :, :, :].repeat(2, 1).repeat(
        2, 2)).shape == (8, 6)
