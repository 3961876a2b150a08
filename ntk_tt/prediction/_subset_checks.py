"""Checks of the subset predictions' arguments that need no kernel: the key, full-batch GD on
the MSE loss, and the subset size (shared by :func:`ntk_tt.predict_from_subset` and
``ntk_tt.predict(subset=...)``)."""

from __future__ import annotations

import numpy as np

from ntk_tt._options import _is_int
from ntk_tt.data._inputs import check_key, check_real


def check_subset_key(key, *, who="predict_from_subset") -> None:
    """ValueError unless ``key`` is a jax random key (the subset is drawn at random);
    ``who``: the call the message names."""
    if key is None:
        raise ValueError(f"{who} draws the subset at random: pass key=jax.random.key(seed).")
    check_key(key)


def check_gd_mse(loss, batch_size, momentum, n, *, who="predict_from_subset") -> None:
    """ValueError unless the training is full-batch GD on the MSE loss (the only case with a
    spectrum formula). ``who``: the call the messages name ("predict_from_subset", or
    "predict(subset=...)" on ``ntk_tt.predict``'s subset path); the advice names no other
    call's arguments (the full kernel is ``ntk_tt.predict`` without ``subset``, momentum an
    ``optimizer=`` instead of ``learning_rate=`` and ``momentum=``, both calls take them)."""
    if loss != "mse":
        raise ValueError(
            f"{who} predicts the mean MSE loss ½‖f − onehot(y)‖² (Prop. 2 from the kernel's "
            f"spectrum, App. D) and nothing else; got loss={loss!r}: use loss='mse', or "
            "ntk_tt.predict without subset (the full kernel) for cross-entropy.")
    if batch_size is not None and not (_is_int(batch_size) and batch_size == n):
        raise ValueError(
            f"{who} predicts full-batch gradient descent only (B = N = {n}); got "
            f"batch_size={batch_size!r}: pass batch_size=None, or ntk_tt.predict without "
            "subset (the full kernel) for SGD.")
    check_real(momentum, "momentum")
    if float(momentum) != 0.0:
        raise ValueError(
            f"{who}'s momentum= keyword is plain gradient descent only (momentum 0; the "
            f"closed form has no velocity); got momentum={momentum!r}: for heavy-ball or "
            f"Nesterov momentum pass optimizer=ntk_tt.sgd(learning_rate, momentum=m) to {who} "
            "instead of learning_rate= and momentum=.")


def check_subset_size(subset_size, y: np.ndarray, *, name="subset_size",
                      full="use ntk_tt.predict or kernel_spectrum") -> int:
    """ValueError unless ``subset_size`` is an int N' in [K, N), a multiple of the K classes
    present in ``y``, with N'/K samples available in every class; returns K. ``name``: the
    argument the messages name ("subset" for ``ntk_tt.predict(subset=...)``); ``full``: the
    advice for N' = N (the full kernel)."""
    n = int(np.shape(y)[0])
    classes, counts = np.unique(np.asarray(y), return_counts=True)
    k = len(classes)
    if not _is_int(subset_size):
        raise ValueError(f"{name} must be an integer N' (samples in the subset), got "
                         f"{subset_size!r}.")
    if not (k <= subset_size < n and subset_size % k == 0):
        raise ValueError(
            f"{name} N' = {subset_size} must be a multiple of the K = {k} classes in y with "
            f"K <= N' < N = {n} (a class-balanced strict subset; N' = N is the full kernel: "
            f"{full}); e.g. {max(k, (n // 4) // k * k)}.")
    per = subset_size // k
    if counts.min() < per:
        c = classes[np.argmin(counts)]
        raise ValueError(
            f"{name} N' = {subset_size} needs {per} samples of each of the K = {k} classes, "
            f"but class {c} has only {counts.min()}; choose N' <= {k * counts.min()}.")
    return k
