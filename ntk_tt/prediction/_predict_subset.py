"""``predict(..., subset=N')``: the loss curve from a subset's kernel (App. D, METHOD.md §7) as a
:class:`ntk_tt.Prediction`, with the constant-η keywords or an SGD-family ``optimizer``
(issue 27: :func:`ntk_tt.predict_from_subset` runs each eigenmode's exact recursion with the
schedule's η_t, momentum and Nesterov; weight decay, B < N and Adam are refused there)."""

from __future__ import annotations

import warnings

import numpy as np

from ntk_tt.dynamics._divergence import call, outcome
from ntk_tt.dynamics._predict_kernel import EPSILONS
from ntk_tt.prediction._result import Prediction, outcome_fields, withhold_called_divergent
from ntk_tt.prediction._spectrum_sgd import check_spectrum_optimizer, constant_rate
from ntk_tt.training._optimizer_run import optimizer_hyperparameters

ERROR_NOT_PREDICTED = ("not predicted: the subset predictor (subset=N') gives the mean MSE "
                       "loss curve only, from the kernel's spectrum")
WHO = "predict(subset=...)"


def _check_rule(optimizer, n, steps, learning_rate, batch_size, momentum, nesterov, loss,
                method) -> str:
    """The update rule's checks; returns the method the curve is: "closed_form" for
    constant-η GD (the keywords, or ``ntk_tt.sgd(η)``: (1 − η μ_k)^(2t)), "discrete" for the
    rest of the SGD family (each mode's exact recursion)."""
    from ntk_tt.prediction._subset_checks import check_gd_mse

    check_gd_mse(loss, batch_size, momentum, n, who=WHO)
    if optimizer is None:
        if nesterov:
            raise ValueError(f"{WHO}'s keywords are plain GD (momentum 0, where nesterov=True "
                             "changes nothing): for Nesterov momentum pass optimizer="
                             "ntk_tt.sgd(learning_rate, momentum=m, nesterov=True), or drop "
                             "nesterov.")
        allowed, done = ("auto", "closed_form"), "closed_form"
    else:
        check_spectrum_optimizer(optimizer, n, steps, where=WHO)
        done = "closed_form" if constant_rate(optimizer) is not None else "discrete"
        allowed = ("auto", "discrete") + (("closed_form",) if done == "closed_form" else ())
    if method not in allowed:
        how = ("the closed form of Prop. 2" if done == "closed_form" else
               "each eigenmode's exact recursion with the schedule's η_t and momentum")
        raise ValueError(f"{WHO} uses {how} on the predicted spectrum: method must be "
                         f"{' or '.join(map(repr, allowed))}, got {method!r}.")
    return done


def predict_subset(apply_fn, params, x, y, subset, subset_method, *, learning_rate, steps,
                   batch_size, momentum, nesterov, loss, method, kernel, sketch_dim, key,
                   x_test, y_test, predictor, segments, optimizer=None, head=None) -> Prediction:
    """``predict(..., subset=N')``: validate the options that make sense with a subset (all
    before any kernel work), run :func:`ntk_tt.predict_from_subset` and return its loss curve
    (T + 1,) as a :class:`Prediction` (error curves NaN, :data:`ERROR_NOT_PREDICTED`).

    ``optimizer``: an SGD-family :class:`ntk_tt.Optimizer` at full batch without weight decay
    (then learning_rate, batch_size None, momentum 0, nesterov False); its ``hyperparameters``
    are :func:`ntk_tt.training._optimizer_run.optimizer_hyperparameters` plus "steps",
    "num_train", "loss", "subset_size", "subset_method", as the other optimiser paths.

    Every message names ``predict(subset=...)`` and ``predict``'s own arguments (``subset``,
    ``subset_method``, ``key``), never ``predict_from_subset``'s (``subset_size``, ``k0``):
    the key and N' are checked here, before :func:`ntk_tt.predict_from_subset` checks them
    again.

    Raises:
      ValueError: loss not "mse", B < N, momentum or Nesterov through the keywords, an Adam
        optimizer, weight decay, a bad schedule, an unknown subset_method, a method other than
        "auto" / "closed_form" (keywords, constant-η GD) or "auto" / "discrete" (the SGD
        family), a sketched kernel, the head-aware predictor, segments > 1, a held-out set,
        no key ("predict(subset=...) draws the subset at random: pass
        key=jax.random.key(seed).") or a bad one, ``subset`` not an int N' in [K, N), a
        multiple of the K classes with N'/K samples in each ("subset N' = ... must be a
        multiple ..."; "subset must be an integer N' ..."). After the kernel work,
        subset_method "power_law" only: "predict(subset=...): the power-law extrapolation of
        the N' = ... subset's spectrum failed with its default k0 and fit range ..." (the
        fit's message; another subset_method or subset, or
        :func:`ntk_tt.predict_from_subset`'s k0= / fit_range=).

    Warns:
      UserWarning: fewer than 4 samples per class in the subset (``subset`` < 4·K), from
        :func:`ntk_tt.predict_from_subset` before any kernel work ("the subset of N' = ...
        samples holds ... of each of the K = ... classes: ..."; it names no argument).
    """
    from ntk_tt.prediction._subset import SUBSET_METHODS, PowerLawFitError, predict_from_subset
    from ntk_tt.prediction._subset_checks import check_subset_key, check_subset_size

    n = int(np.shape(x)[0])
    done = _check_rule(optimizer, n, steps, learning_rate, batch_size, momentum, nesterov, loss,
                       method)
    if subset_method not in SUBSET_METHODS:
        raise ValueError(f"subset_method must be one of {SUBSET_METHODS}, got "
                         f"{subset_method!r}.")
    if kernel not in ("exact", "traced") or sketch_dim is not None:
        raise ValueError(f"{WHO} builds the exact logit-summed kernel of the subset: kernel "
                         f"must be 'exact' or 'traced' (the same here) and sketch_dim None, got "
                         f"kernel={kernel!r}, sketch_dim={sketch_dim!r}.")
    if predictor == "head_aware" or (predictor == "auto" and head is not None) \
            or segments != 1:
        raise ValueError(f"{WHO} is the frozen-kernel linear predictor: use predictor='linear' "
                         "(or 'auto' without head=) and segments=1, or drop subset for the "
                         "head-aware prediction.")
    if x_test is not None or y_test is not None:
        raise ValueError(f"{WHO} predicts the training loss only (no held-out curves from a "
                         "spectrum): drop x_test and y_test.")
    check_subset_key(key, who=WHO)  # predict's names, before predict_from_subset's checks
    check_subset_size(subset, y, name="subset", full="drop subset")
    try:
        with warnings.catch_warnings():  # predict has warned of uint8 inputs already
            warnings.filterwarnings("ignore", "x is uint8", UserWarning)
            sp = predict_from_subset(apply_fn, params, x, y, subset_size=subset,
                                     learning_rate=learning_rate, steps=steps,
                                     method=subset_method, key=key, optimizer=optimizer)
    except PowerLawFitError as err:
        raise ValueError(
            f"{WHO}: the power-law extrapolation of the N' = {subset} subset's spectrum failed "
            f"with its default k0 and fit range ({err}); use subset_method='nystrom' or "
            "another subset, or choose k0= / fit_range= with ntk_tt.predict_from_subset."
        ) from err
    s = sp.seconds
    seconds = {"kernel": s["kernel"], "noise": 0.0, "logits": s["logits"],
               "solve": s["spectrum"] + s["curve"], "spectrum": s["spectrum"],
               "curve": s["curve"]}
    nan = np.full(int(steps) + 1, np.nan)
    run = {"steps": int(steps), "num_train": n, "loss": "mse", "subset_size": int(subset),
           "subset_method": subset_method}
    hyper = ({"learning_rate": float(learning_rate), "momentum": 0.0, "nesterov": False,
              "batch_size": n} if optimizer is None
             else optimizer_hyperparameters(optimizer, steps, n)) | run
    return withhold_called_divergent(Prediction(
        loss=sp.loss, error=nan, loss_band=None, error_band=None, test_loss=None,
        test_error=None,
        training_time={"loss": dict(sp.training_time), "error": dict.fromkeys(EPSILONS,
                                                                               np.nan)},
        training_time_reasons={"loss": dict(sp.training_time_reasons),
                               "error": dict.fromkeys(EPSILONS, ERROR_NOT_PREDICTED)},
        diverged=sp.diverged, diverged_at=sp.diverged_at, spiked_at=sp.spiked_at,
        kappa=sp.kappa, beyond_edge=sp.beyond_edge, clamped=False,
        min_eigenvalue=float(sp.spectrum.eigenvalues[-1]) * n, method=done,
        kernel=f"traced:subset{sp.subset_size}:{subset_method}", hyperparameters=hyper,
        seconds=seconds, **outcome_fields(call(outcome(sp.loss), sp.kappa, False))))
