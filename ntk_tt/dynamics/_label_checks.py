"""Checks of class labels: integer indices in [0, C), of two classes or more for training."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt.data._inputs import _concrete, as_array


def check_labels(y, n: int, c: int, *, name: str = "y") -> jax.Array:
    """Integer labels of shape (n,) with values in [0, c) (values checked when concrete); a
    list of ints is accepted. Training labels (``name`` "y") of a model with C >= 2 logits
    must hold two classes or more (:func:`check_two_classes`; C = 1 is a one-output MSE fit);
    held-out ones may hold one. Returns them as a jax array."""
    y = as_array(y, name)
    if np.shape(y) != (n,) or not jnp.issubdtype(jnp.result_type(y), jnp.integer):
        hint = ("pass class indices, not one-hot vectors" if np.ndim(y) == 2 else
                cast_hint(y) if np.shape(y) == (n,) else
                f"give one label per input ({n} inputs)")
        raise ValueError(
            f"{name} must be integer class labels of shape ({n},) matching the logits, got "
            f"shape {np.shape(y)} and dtype {jnp.result_type(y)}; {hint}.")
    yc = _concrete(y)
    if yc is not None and n and (yc.min() < 0 or yc.max() >= c):
        raise ValueError(
            f"{name} has labels outside [0, C) = [0, {c}) (min {yc.min()}, max {yc.max()}); "
            "the number of logits C must exceed every label."
        )
    if yc is not None and name == "y" and c >= 2:
        check_two_classes(yc, name)
    return jnp.asarray(y)


def check_two_classes(y, name: str = "y") -> None:
    """ValueError when the concrete training labels ``y`` (N,) hold one class only: a task
    needs two or more (as ``ntk-tt``'s ``-K >= 2``); with one class the cross-entropy is
    lowered by growing every logit of that class, which is not a classification task."""
    yc = np.asarray(y)
    if yc.size and yc.min() == yc.max():
        raise ValueError(
            f"{name} holds labels of one class only (all {int(yc.flat[0])}, N = {yc.size}): a "
            "task needs at least two classes (ntk-tt -K >= 2); pass labels of two or more "
            "classes, e.g. from ntk_tt.sample_task(data, num_classes=K) with K >= 2.")


def cast_hint(y) -> str:
    """The advice for labels (N,) of a non-integer dtype: cast them, unless some are not whole
    numbers (a fresh user: ``y + 0.5`` was told ``y.astype(int)``, which truncates 0.5 to 0)."""
    yc = _concrete(y)
    if yc is None:  # traced: the values cannot be seen
        return (f"cast the {jnp.result_type(y)} class indices to int (if they are whole "
                "numbers), e.g. y.astype(int)")
    if jnp.issubdtype(np.asarray(yc).dtype, jnp.floating):
        v = np.asarray(yc)
        frac = v[~np.isfinite(v) | (v != np.round(v))]
        if frac.size:
            return (f"{frac.size} of them are not whole numbers (e.g. {frac[0]:g}): class labels "
                    "are the integers 0 ... C − 1, so check how they were made")
    return f"cast the {np.asarray(yc).dtype} class indices to int, e.g. y.astype(int)"
