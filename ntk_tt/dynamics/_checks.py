"""Argument checks of the kernel predictors: hyperparameters, labels, initial logits and the
kernels themselves, raised as ValueErrors before any compiled work (values only when concrete,
not traced). Shared by ``predict_from_kernel``, the head-aware predictor, what-if and ``predict``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._options import DECAY_RANGE, is_decay
from ntk_tt._schedule_checks import RATE_RANGE, is_rate
from ntk_tt.data._batches import check_sizes
from ntk_tt.data._inputs import _check_finite, _concrete, as_array, check_real
from ntk_tt.dynamics._fspace import as_operator
from ntk_tt.dynamics._label_checks import check_labels as check_labels  # one home
from ntk_tt.dynamics._label_checks import check_two_classes as check_two_classes
from ntk_tt.dynamics._losses import LOSSES, check_loss


def check_num_paths(num_paths) -> None:
    """ValueError unless ``num_paths`` (seeds / Brownian paths) is an int >= 1."""
    if isinstance(num_paths, bool) or not isinstance(num_paths, (int, np.integer)) \
            or num_paths < 1:
        raise ValueError(
            f"num_paths must be an int >= 1 (SGD seeds or Brownian paths), got {num_paths!r}."
        )


def check_hyper(learning_rate, momentum, steps, batch_size, n, nesterov=False) -> None:
    """ValueErrors for η or m not a real scalar (a string included), η ≤ 0, m ∉ [0, 1) (or 1.0
    in float32: ``DECAY_RANGE``),
    Nesterov with m = 0 (as ``ntk_tt.sgd``), steps not an int in [1, MAX_STEPS], B not an int
    in [1, N], either traced (:func:`ntk_tt.data._batches.check_sizes`; values checked when
    concrete)."""
    for name, value in (("learning_rate", learning_rate), ("momentum", momentum)):
        check_real(value, name)
        if np.ndim(value) != 0:
            raise ValueError(
                f"{name} must be a scalar, got shape {np.shape(value)}; to sweep it, "
                "jax.vmap the prediction over it (one kernel, one compilation)."
            )
    lr, m = _concrete(learning_rate), _concrete(momentum)
    if lr is not None and not is_rate(lr):
        raise ValueError(f"learning_rate must be finite and {RATE_RANGE}, got {learning_rate!r}.")
    if m is not None and not is_decay(m):
        raise ValueError(f"momentum must be in {DECAY_RANGE}, got {momentum!r}; use 0.0 for "
                         "plain (S)GD.")
    check_nesterov(nesterov, m)
    check_sizes(steps, batch_size, n)


GRAM_TOL = 1e-3
"""Relative tolerance of :func:`check_gram` (of max |Θ|): far above float32 rounding of a
blockwise Θ = J Jᵀ (~1e-6), far below the asymmetry of a cross kernel."""


def check_gram(kernel, name: str = "kernel",
               cross: str = "a cross kernel Θ(x_test, x) goes in kernel_test (with f0_test and "
                            "y_test)") -> None:
    """ValueError when a concrete square ``kernel`` cannot be an empirical NTK Θ = J Jᵀ:
    asymmetric by more than ``GRAM_TOL`` of its largest entry (e.g. a cross kernel
    Θ(x, x2) of two input sets of one size), or with a diagonal entry below −``GRAM_TOL``
    of it (Θ_ii = ‖∂f(x_i)/∂w‖² ≥ 0; e.g. −Θ), or zero everywhere (no weight moves an output:
    a fresh user's Θ = 0 read "converges"); integer kernels too. Traced kernels, and other
    shapes (left to ``as_operator``), are not checked. Rows are compared in blocks."""
    kc = _concrete(kernel)
    if kc is None or kc.ndim != 2 or kc.shape[0] != kc.shape[1] or kc.size == 0 \
            or not jnp.issubdtype(kc.dtype, jnp.number) or jnp.iscomplexobj(kc):
        return
    kc = kc.astype(jnp.float32) if jnp.issubdtype(kc.dtype, jnp.integer) else kc  # no wrap
    scale = max(float(kc.max()), -float(kc.min()))  # max |Θ| without an N·C × N·C temporary
    if scale == 0.0:
        raise ValueError(
            f"{name} is zero everywhere: no weight moves any output at these inputs, so nothing "
            "would train (the curve is flat). Pass the empirical NTK of the model's trainable "
            "weights, e.g. ntk_tt.empirical_ntk(apply_fn, params, x).")
    side, rows = kc.shape[0], max(1, 2**22 // kc.shape[0])
    asym = max(float(np.max(np.abs(kc[r : r + rows] - kc[:, r : r + rows].T)))
               for r in range(0, side, rows))
    if asym > GRAM_TOL * scale:
        raise ValueError(
            f"{name} is not symmetric: max |Θ − Θᵀ| = {asym:.3g} against max |Θ| = "
            f"{scale:.3g}. The dynamics need the training kernel Θ(x, x) = J Jᵀ; {cross}, "
            "and empirical_ntk(apply_fn, params, x) without x2 gives Θ(x, x).")
    low = float(np.min(np.diagonal(kc)))
    if low < -GRAM_TOL * scale:
        raise ValueError(
            f"{name} has a negative diagonal entry ({low:.3g}; max |Θ| = {scale:.3g}), but "
            "Θ_ii = ‖∂f(x_i)/∂w‖² ≥ 0 for an empirical NTK: pass Θ = J Jᵀ itself (not −Θ "
            "or a difference of kernels).")


def _check_method_inputs(method, loss, full_batch, key, noise_features, nc):
    if method == "closed_form" and (loss != "mse" or not full_batch):
        raise ValueError(
            "method='closed_form' exists for loss='mse' with full-batch GD only; use "
            "method='ode' (cross-entropy) or method='discrete' / 'sde' (SGD)."
        )
    if method == "sde":
        if noise_features is None or np.ndim(noise_features) != 2 or (
                np.shape(noise_features)[0] != nc):
            raise ValueError(
                f"method='sde' needs noise_features of shape ({nc}, D') (see "
                "ntk_tt.noise_features); got "
                f"{None if noise_features is None else np.shape(noise_features)}."
            )
        # a fresh user's NaN features ran to NaN curves read as "invalid under jit / vmap"
        _check_finite(noise_features, "noise_features")
    if key is None and (method == "sde" or (method == "discrete" and not full_batch)):
        raise ValueError(
            f"method={method!r} with batch_size < N is random: pass key=jax.random.key(seed)."
        )


def check_finite_logits(f0, name: str = "f0") -> None:
    """ValueError when concrete initial logits ``f0`` hold NaN or inf (the message gives how
    many); traced ones are not checked."""
    fc = _concrete(f0)
    if fc is None or not jnp.issubdtype(fc.dtype, jnp.floating):
        return
    bad = int(np.size(fc) - np.count_nonzero(np.isfinite(fc)))
    if bad:
        x = "x_test" if name == "f0_test" else "x"
        raise ValueError(
            f"{name} has {bad} non-finite entries (NaN or inf) of {np.size(fc)}; the initial "
            f"logits must be finite: recompute {name} = apply_fn(params, {x}) and check the "
            "weights and inputs (a NaN there makes every predicted curve NaN)."
        )


def solve_dtype(*arrays):
    """The floating dtype a prediction runs in (README, "Dtypes"): the promotion of the
    floating dtypes among ``arrays`` (None, integer and bool ones ignored; the default float
    dtype if none is floating), at least float32. bfloat16 and float16 are promoted to
    float32: their 8- and 11-bit mantissas are too coarse for Θ's eigenvalues and a T-step
    recursion. float64 needs ``jax_enable_x64`` (JAX's arrays are float32 without it).
    Complex arrays are refused earlier, by ``as_array``."""
    floats = [jnp.result_type(a) for a in arrays
              if a is not None and jnp.issubdtype(jnp.result_type(a), jnp.floating)]
    dtype = jnp.result_type(*floats) if floats else jnp.result_type(float)
    return jnp.promote_types(dtype, jnp.float32)


def float_logits(f0, kernel):
    """``f0`` (already an array) as a jax array of :func:`solve_dtype` ``(kernel, f0)``, the
    dtype the prediction runs in: integer or bool initial logits (e.g.
    ``np.zeros((N, C), int)``) take the kernel's float dtype, bfloat16 / float16 ones become
    float32, float32 logits with a float64 kernel (x64) float64, so the recursion's carry,
    the kernel and the hyperparameters share one dtype."""
    return jnp.asarray(f0, solve_dtype(kernel, f0))


def solve_dtype_fields(hk):
    """A head-aware kernel ``hk`` (``ntk_tt.HeadAwareKernel``) with every array cast to the
    :func:`solve_dtype` of all of them, and that dtype. Raises ValueError naming the field
    (``hk.<field>``) when one is complex or not an array."""
    fields = [None if a is None else as_array(a, f"hk.{name}")
              for name, a in zip(hk._fields, hk, strict=True)]
    dtype = solve_dtype(*fields)
    return type(hk)(*(None if a is None else jnp.asarray(a, dtype) for a in fields)), dtype


def flag(value, name: str = "nesterov") -> bool:
    """``bool(value)`` of True, False (a 0-d boolean array too) or None (False); ValueError for
    anything else (the string "no" is truthy) and for a traced flag (it picks a compiled
    update rule)."""
    if isinstance(value, jax.core.Tracer):
        raise ValueError(f"{name} picks the update rule and cannot be traced (jit / vmap / "
                         f"grad): sweep learning_rate and momentum, and call once per {name}.")
    if value is not None and not isinstance(value, (bool, np.bool_)) and not (
            isinstance(value, (np.ndarray, jax.Array)) and np.ndim(value) == 0
            and np.asarray(value).dtype == bool):  # a concrete jnp.array(True) is a bool
        raise ValueError(f"{name} must be True or False (or None: False), got {value!r}.")
    return bool(value)


def check_nesterov(nesterov, momentum) -> None:
    """ValueError for Nesterov with a concrete momentum of 0 (plain GD: a mistake, refused as
    ``ntk_tt.sgd`` and the CLI refuse it); a traced momentum (a sweep) is not checked."""
    if nesterov and momentum is not None and np.ndim(momentum) == 0 and float(momentum) == 0:
        raise ValueError("Nesterov needs momentum > 0: nesterov=True with momentum 0 is plain "
                         "gradient descent; pass momentum > 0 or nesterov=False.")


def check_problem(f0, y, loss, learning_rate, momentum, steps, batch_size, nesterov=False):
    """Shared checks of a plain-kernel problem: ``f0`` the (N, C) initial logits (finite when
    concrete), the loss for C outputs, the hyperparameters, the labels. Returns
    ``(n, c, batch_size, y)`` with ``batch_size`` None read as N (GD) and ``y`` as checked
    labels. Raises ValueError."""
    if np.ndim(f0) != 2:
        raise ValueError(f"f0 must be the initial logits (N, C), got shape {np.shape(f0)}.")
    check_finite_logits(f0)
    n, c = np.shape(f0)
    check_loss(loss, c)
    batch_size = n if batch_size is None else batch_size
    check_hyper(learning_rate, momentum, steps, batch_size, n, nesterov)
    return n, c, batch_size, check_labels(y, n, c)


def check_f0_shape(kernel, f0, y) -> None:
    """ValueError when ``f0`` does not have the (N, C) shape that ``kernel`` and the labels
    ``y`` imply (shapes only, and the labels' values when concrete): N = len(y), C =
    kernel side / N for a full (N·C, N·C) kernel; for a logit-summed (N, N) kernel, C must
    exceed every label. ``f0`` of shape (C, N) (N ≠ C) is said to be transposed. A kernel that
    fits neither is left to the kernel's own check."""
    if np.ndim(f0) != 2 or np.ndim(kernel) != 2 or np.ndim(y) != 1:
        return
    n, c = np.shape(f0)
    side = np.shape(kernel)[0]
    if np.shape(kernel) != (side, side):
        return
    ny = np.shape(y)[0]
    if c == ny != n and ny and side in (n * c, ny):
        raise ValueError(
            f"f0 looks transposed: it has shape {(n, c)} = (C, N), while the {ny} labels y "
            f"and the kernel {(side, side)} imply N = {ny} samples of C = {n} logits; pass "
            f"f0 of shape (N, C) = {(ny, n)} (f0.T)."
        )
    if side not in (n * c, n) and ny and side % ny == 0:
        expected = f"({ny}, {side // ny})" if side != ny else f"({ny}, C)"
        raise ValueError(
            f"f0 has shape {(n, c)}, but the kernel {(side, side)} and the {ny} labels y "
            f"imply initial logits of shape {expected} (N = {ny} samples, "
            + (f"C = {side} / {ny} = {side // ny} logits each" if side != ny else
               "a logit-summed (N, N) kernel")
            + "); pass f0 = apply_fn(params, x) of the model and inputs the kernel was built "
            f"on (or the kernel of this f0's model: shape {(n * c, n * c)} or {(n, n)})."
        )
    yc = _concrete(y) if side == n and c > 1 and ny == n > 0 else None
    if yc is not None and yc.dtype.kind in "iu" and yc.max() >= c:
        raise ValueError(
            f"f0 has shape {(n, c)}: C = {c} logits per sample, but the labels y go up to "
            f"{yc.max()}: expected f0 of shape ({n}, C) with C >= {yc.max() + 1}; pass f0 = "
            "apply_fn(params, x) of a model with one logit per class (or check the labels)."
        )


def check_test_kernel(kernel_test, f0_test, y_test, n, c, dtype):
    """Held-out inputs of a plain-kernel prediction: Θ(x_test, x) (N_test·C, N·C) or traced
    (N_test, N), f0_test (N_test, C) logits, y_test (N_test,) labels. Returns
    ``(test operator, traced?, f0_test, y_test)``, all None without the three. Raises
    ValueError when f0_test / y_test are missing or mis-shaped, given without kernel_test
    (they were silently unused), or Θ_test or (concrete) f0_test is not finite."""
    if kernel_test is None:
        given = [k for k, v in (("f0_test", f0_test), ("y_test", y_test)) if v is not None]
        if given:
            raise ValueError(f"{' and '.join(given)} without kernel_test: the held-out curves "
                             "need kernel_test Θ(x_test, x), f0_test and y_test together; pass "
                             "all three, or none.")
        return None, None, None, None
    kernel_test = as_array(kernel_test, "kernel_test")
    f0_test = None if f0_test is None else as_array(f0_test, "f0_test")
    if f0_test is None or y_test is None or np.ndim(f0_test) != 2 or np.shape(f0_test)[1] != c:
        shape = None if f0_test is None else np.shape(f0_test)
        raise ValueError(f"kernel_test needs f0_test (N_test, {c}) and y_test (N_test,), got "
                         f"f0_test of shape {shape}.")
    _check_finite(kernel_test, "kernel_test")
    check_finite_logits(f0_test, "f0_test")
    nt = np.shape(f0_test)[0]
    y_test = check_labels(y_test, nt, c, name="y_test")
    test_mat, test_traced = as_operator(jnp.asarray(kernel_test, dtype), n, c,
                                        name="kernel_test", rows=nt)
    return test_mat, test_traced, jnp.asarray(f0_test, dtype), y_test


def check_head_kernel(head_kernel, head_aware: bool, n: int, x_test, head=None,
                      x=None) -> None:
    """ValueError unless ``head_kernel`` is None, or a head-aware kernel (or Adam kernel) of
    N training rows with held-out features exactly when ``x_test`` is given, for a
    head-aware prediction of one segment (``head_aware``); otherwise a kernel is refused as
    unused. With ``head`` and ``x`` also unless it is the kernel of this head on these
    inputs (:func:`check_kernel_inputs`)."""
    if head_kernel is None:
        return
    from ntk_tt.dynamics._adam_head_aware import AdamKernel
    from ntk_tt.kernels._head_aware import HeadAwareKernel

    if not head_aware:
        raise ValueError("head_kernel is used only by the head-aware predictor with one "
                         "segment (head=..., segments=1), which reads the kernels at w0; "
                         "segments > 1 rebuilds them along the path and the linear predictor "
                         "has none: drop head_kernel=.")
    hk = head_kernel.hk if isinstance(head_kernel, AdamKernel) else head_kernel
    why = (f"got a {type(head_kernel).__name__}" if not isinstance(hk, HeadAwareKernel) else
           f"it has {hk.features.shape[0]} training rows, x has {n}"
           if hk.features.shape[0] != n else
           "it has held-out features but no x_test was given" if x_test is None
           and hk.features_test is not None else
           "x_test was given but it has no held-out features" if x_test is not None
           and hk.features_test is None else None)
    if why is not None:
        raise ValueError("head_kernel must be the ntk_tt.head_aware_kernel(head, x, x_test) "
                         "of these inputs (N rows, held-out features iff x_test), for the "
                         f"head-aware predictor (head=..., segments=1); or None to build it: "
                         f"{why}.")
    if head is not None and x is not None:
        check_kernel_inputs(hk, head, x, x_test)


CHECK_ROWS = 32
"""Rows of x (and x_test), spread evenly, whose features :func:`check_kernel_inputs`
recomputes: one small forward pass, against a kernel's O(N²) cost."""


def check_kernel_inputs(hk, head, x, x_test=None, name: str = "head_kernel",
                        rows: int | None = CHECK_ROWS) -> None:
    """ValueError unless ``hk`` (a :class:`ntk_tt.HeadAwareKernel`) was built from this
    ``head`` = (feature_fn, backbone_params, W, b) on these inputs: its head W_0, b_0 equal
    ``head``'s, and the features h_0 of ``rows`` rows of ``x`` (and of ``x_test``) spread over
    the set (None: every row) match ``feature_fn(backbone_params, rows)`` to 1e-3 of their
    largest entry. A kernel of other inputs of the same shape (another data set, a reshuffled
    x) gave silently wrong curves, from step 0 on."""
    feature_fn, params, w, b = head
    fix = (f"{name} was built for other inputs or another head: rebuild it with "
           "ntk_tt.head_aware_kernel(head, x, x_test) for these, or pass None to build it")
    if np.shape(w) != np.shape(hk.head_kernel) or np.shape(b) != np.shape(hk.head_bias) or \
            not (np.allclose(w, hk.head_kernel) and np.allclose(b, hk.head_bias)):
        raise ValueError(f"{fix} (its head weights differ from head's).")
    for inputs, feats, what in ((x, hk.features, "x"), (x_test, hk.features_test, "x_test")):
        if inputs is None or feats is None:
            continue
        pick = np.unique(np.linspace(0, len(inputs) - 1, min(rows or len(inputs), len(inputs))
                                     ).round().astype(int))
        got = np.asarray(feature_fn(params, jnp.asarray(inputs)[pick]), np.float64)
        want = np.asarray(feats, np.float64)[pick]
        if got.shape != want.shape or not np.all(
                np.abs(got - want) <= 1e-3 * max(1.0, float(np.max(np.abs(want))))):
            raise ValueError(f"{fix} (its features of {what} differ from the backbone's).")


def check_warmup(learning_rate, steps: int) -> None:
    """ValueError when a schedule's warmup ends at or after the run's end: η_t first reaches
    its peak at step ⌈w⌉ (``warmup_cosine`` rising from init < peak, ``warmup_stable_decay``),
    and T = ``steps`` updates use η_0 … η_{T−1}, so ⌈w⌉ ≥ T means the run never trains at
    the peak it names (``ntk-tt predict`` refuses ``--warmup W >= T`` alike). Schedules
    without a warmup (constant, exponential) and user callables (no notion of one) pass, as
    do traced leaves."""
    from ntk_tt._schedules import WarmupCosine, WarmupStableDecay

    if not isinstance(learning_rate, (WarmupCosine, WarmupStableDecay)):
        return
    warmup, peak = _concrete(learning_rate.warmup), _concrete(learning_rate.peak)
    init = _concrete(getattr(learning_rate, "init", 0.0))
    if warmup is None or peak is None or init is None or not init < peak:
        return
    reached = int(np.ceil(float(warmup)))
    if reached >= steps:
        raise ValueError(
            f"the schedule's warmup is {float(warmup):g} steps: η_t reaches its peak "
            f"{float(peak):g} at step {reached}, but a run of steps = {steps} updates ends "
            f"before it (η_0 … η_{steps - 1}); shorten the warmup to <= {steps - 1} steps (η "
            f"peaks at step ⌈warmup⌉) or raise steps to > {reached}.")


def check_adam_kernel(ak, optimizer, batch_size: int, name: str, loss: str | None = None,
                      y=None) -> None:
    """ValueError unless the :class:`ntk_tt.AdamKernel` ``ak`` was built for this optimiser's
    batch size and ε, for ``loss`` and for the labels ``y`` (v̄ holds the loss's gradients at
    y and depends on B, P on ε; traced values, a loss or y of None are not checked)."""
    fix = "rebuild it with ntk_tt.adam_head_aware_kernel(..., optimizer) for this optimizer."
    if not isinstance(ak.batch_size, jax.core.Tracer) and ak.batch_size != batch_size:
        raise ValueError(f"{name} was built for batch size {ak.batch_size} (v̄ depends on B), "
                         f"the optimizer's is {batch_size}: {fix[:-1]}, or "
                         f"ntk_tt.adam_kernel_for_batch({name}, {batch_size}) where it shares "
                         "the reference profile.")
    built = None if ak.loss is None or isinstance(ak.loss, jax.core.Tracer) else LOSSES[ak.loss]
    if loss is not None and built is not None and built != loss:
        raise ValueError(f"{name} was built for loss={built!r} (v̄ holds that loss's "
                         f"gradients), the prediction's is {loss!r}: rebuild it with "
                         f"ntk_tt.adam_head_aware_kernel(..., loss={loss!r}).")
    eps = _concrete(optimizer.eps)
    eps = None if eps is None or np.ndim(eps) else float(eps)
    built = None if ak.eps is None or isinstance(ak.eps, jax.core.Tracer) else float(ak.eps)
    if eps is not None and built is not None and not np.isclose(eps, built, rtol=1e-6, atol=0):
        raise ValueError(f"{name} was built for Adam's ε = {built:g} (P = 1/(√v̄ + ε)), the "
                         f"optimizer's is {eps:g}: {fix}")
    labels = None if ak.labels is None else _concrete(ak.labels)
    given = None if y is None else _concrete(y)
    if labels is not None and given is not None and not np.array_equal(labels, given):
        raise ValueError(f"{name} was built for other labels y (v̄ holds the loss gradients at "
                         "its labels): rebuild it with ntk_tt.adam_head_aware_kernel(split, x, "
                         "y, optimizer) for these labels.")
