"""The warnings of a prediction whose method cannot show the real run's instability: the
continuous-time ODE/SDE beyond the stability edge, and the closed form with momentum beyond
its effective-learning-rate model's own edge 2(1 − m) (METHOD.md §2, §3; Sec. 3.1)."""

from __future__ import annotations

import warnings

import numpy as np

from ntk_tt.data._inputs import _concrete
from ntk_tt.dynamics._divergence import ABSTAINS, stability_edge


def edge_words(m: float, nesterov: bool) -> str:
    """Where exact momentum on MSE is stable, in words: heavy ball up to 2(1 + m), Nesterov up
    to 2(1 + m)/(1 + 2m) (``_divergence.stability_edge``)."""
    edge = stability_edge(m, nesterov, "mse")
    return (f"Nesterov is stable up to 2(1 + m)/(1 + 2m) = {edge:.3g}" if nesterov else
            f"heavy ball is stable up to 2(1 + m) = {edge:.3g}")


def warn_method_edges(out, method: str, momentum, nesterov: bool = False) -> None:
    """The warnings of a prediction ``out`` whose ``method`` cannot show the real run's
    instability (ODE/SDE beyond the edge; closed form with m beyond its η/(1 − m) model's)."""
    if method in ("ode", "sde"):
        _warn_beyond_edge(out.beyond_edge, out.kappa, method)
    if method == "closed_form":
        _warn_effective_edge(out.kappa, out.outcome, momentum, bool(nesterov))


class BeyondEdgeWarning(UserWarning):
    """A continuous-time (ODE/SDE) prediction at κ beyond the stability edge, or a closed form
    with momentum beyond its effective-learning-rate model's own edge: its curve and T_ε are
    not trustworthy. ``ntk-tt predict`` prints its own warning line instead.

    Source: ntk_tt's own (the linear model's stability edge, METHOD.md §2, §3)."""


def _warn_effective_edge(kappa, outcome, momentum, nesterov: bool) -> None:
    """UserWarning when ``method="closed_form"`` with m > 0 (concrete values) called
    "unknown": at 2(1 − m) ≤ κ, not beyond the exact recursion's edge, its GD model with
    η/(1 − m) (Sec. 3.1) is unstable (q = κ/(1 − m) ≥ 2) while momentum is stable, so its
    curve is the approximation's (the zone is ``_divergence.effective_rate_abstains``'s, read
    from ``outcome``). Beyond the edge the call "diverges" is right: no warning."""
    m, kappas, codes = _concrete(momentum), _concrete(kappa), _concrete(outcome)
    if m is None or kappas is None or codes is None or np.ndim(m) or not float(m) > 0:
        return
    m = float(m)
    within = np.asarray(kappas)[np.asarray(codes) == ABSTAINS]
    if within.size:
        warnings.warn(
            f"method='closed_form' with momentum m = {m:g} uses the effective learning rate "
            f"η/(1 − m), a GD model that is unstable from κ = 2(1 − m) = {2 * (1 - m):.3g}; "
            f"here κ = η·λ_max/N = {float(within.max()):.4g} ({edge_words(m, nesterov)}), so "
            "its curve and any divergence it predicts are "
            "the approximation's and its outcome is \"unknown\": use method='discrete' (exact "
            "heavy ball).",
            BeyondEdgeWarning, stacklevel=4)


def _warn_beyond_edge(beyond_edge, kappa, method) -> None:
    """UserWarning when a continuous-time prediction (concrete values) is beyond the
    stability edge: the ODE/SDE has no step size, so it converges at any κ while the real
    discrete run diverges or oscillates there, and nothing in its curve says so."""
    flags, kappas = _concrete(beyond_edge), _concrete(kappa)
    if flags is None or kappas is None or not np.any(flags):
        return
    warnings.warn(
        f"κ = η·λ_max/N = {float(np.max(kappas[flags])):.4g} is beyond the linearised model's "
        f"stability edge, where the real (discrete) run diverges or oscillates; method="
        f"{method!r} integrates the continuous-time limit, which converges at any κ, so its "
        "curve and T_ε are not trustworthy here (the result's beyond_edge is True). Lower the "
        "learning rate, or use method='discrete', which reports the divergence.",
        BeyondEdgeWarning, stacklevel=4)
