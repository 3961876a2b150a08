"""A head-aware kernel is checked against the network and data it is used with
(``check_kernel_inputs``): 32 spread rows per prediction (cheap when one kernel serves many),
every row where the kernel is consumed by far costlier work (``adam_head_aware_kernel(hk=)``,
``suggest(head_kernel=)``). The rows it skips are swapped among themselves here (a fresh
user's case: accepted by the 32-row check, its predicted loss wrong from step 0)."""

import jax
import numpy as np
import pytest
from _ntk_models import TanhHeadNet, inputs
from flax import nnx

import ntk_tt
from ntk_tt.dynamics._checks import CHECK_ROWS, check_kernel_inputs

N, C = 60, 3


@pytest.fixture(scope="module")
def problem():
    model = TanhHeadNet(8, C, rngs=nnx.Rngs(0))
    x = inputs("mlp", jax.random.key(1), N)
    y = jax.random.randint(jax.random.key(2), (N,), 0, C)
    spread = np.unique(np.linspace(0, N - 1, CHECK_ROWS).round().astype(int))
    skipped = np.setdiff1d(np.arange(N), spread)
    perm = np.arange(N)
    perm[skipped] = np.roll(skipped, 1)  # every row the spread check skips moves
    split = ntk_tt.split_head(model)
    return model, split, x, y, ntk_tt.head_aware_kernel(split, x[perm])


def test_every_row_catches_rows_the_spread_check_skips(problem):
    _, split, x, _, swapped = problem
    check_kernel_inputs(swapped, split, x)  # 32 spread rows: all equal
    with pytest.raises(ValueError, match="built for other inputs.*features of x differ"):
        check_kernel_inputs(swapped, split, x, rows=None)
    check_kernel_inputs(ntk_tt.head_aware_kernel(split, x), split, x, rows=None)


def test_adam_kernel_and_suggest_compare_every_row(problem, monkeypatch):
    model, split, x, y, swapped = problem
    with pytest.raises(ValueError, match="hk was built for other inputs"):
        ntk_tt.adam_head_aware_kernel(split, x, y, ntk_tt.adamw(1e-2), hk=swapped)

    ak = ntk_tt.adam_head_aware_kernel(split, x, y, ntk_tt.adamw(1e-2))
    with pytest.raises(ValueError, match="of an AdamKernel pass its .hk"):
        ntk_tt.adam_head_aware_kernel(split, x, y, ntk_tt.adamw(1e-2), hk=ak)

    def refuse(*_, **__):
        raise AssertionError("work started before the kernel was checked")

    monkeypatch.setattr("ntk_tt.training._finetune.step_time", refuse)
    apply_fn, params = ntk_tt.from_nnx(model)
    with pytest.raises(ValueError, match="head_kernel was built for other inputs"):
        ntk_tt.suggest(apply_fn, params, x, y, head=split, head_kernel=swapped, target=0.5,
                       target_kind="fraction", steps=10)


def test_kernel_construction_under_jit_or_vmap_is_refused_clearly(problem):
    """The kernels are built from concrete arrays (host buffers): under jit / vmap the call
    says so in one line instead of a TracerArrayConversionError from inside."""
    _, split, x, y, _ = problem
    feature_fn, bparams, w, b = split
    with pytest.raises(ValueError, match=r"head_aware_kernel builds its kernels from concrete "
                       r"arrays and cannot run under jax.jit, vmap or grad \(split is traced\)"):
        jax.jit(lambda p: ntk_tt.head_aware_kernel((feature_fn, p, w, b), x).features)(bparams)
    with pytest.raises(ValueError, match=r"adam_head_aware_kernel .* \(x is traced\)"):
        jax.vmap(lambda xx: ntk_tt.adam_head_aware_kernel(split, xx, y, ntk_tt.adamw(1e-2))
                 .hk.features)(x[None])
    hk = ntk_tt.head_aware_kernel(split, x)
    with pytest.raises(ValueError, match=r"\(hk is traced\)"):
        jax.jit(lambda k: ntk_tt.adam_head_aware_kernel(split, x, y, ntk_tt.adamw(1e-2),
                                                         hk=k).hk.features)(hk)


def test_a_split_that_is_not_a_4_tuple_is_refused_with_hk_given(problem):
    """With hk given no head-aware kernel is built, so adam_head_aware_kernel checks the split
    itself (it unpacked it with a bare Python error)."""
    _, split, x, y, _ = problem
    hk = ntk_tt.head_aware_kernel(split, x)
    with pytest.raises(ValueError, match="split must be ntk_tt.split_head.*got tuple of length 3"):
        ntk_tt.adam_head_aware_kernel(split[:3], x, y, ntk_tt.adamw(1e-2), hk=hk)
