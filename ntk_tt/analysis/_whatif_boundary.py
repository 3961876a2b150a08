"""``divergence_boundary(..., optimizer=)`` (issue 27): the predicted divergence, T_ε, L_T and
held-out accuracy over a peak-learning-rate × momentum grid for an :class:`ntk_tt.Optimizer`
template.

Grid point (η_peak, m) is the template with its schedule rescaled, η_t ← η_t·η_peak / η_max
(η_max = the template's largest η_t over the T updates: a constant becomes η_peak; a
warmup_cosine's or warmup_stable_decay's peak, init and end, an exponential's init scale
together; a callable schedule's values are read once and scaled the same way), and its
momentum (SGD's m, Adam's β₁) set to m; the rule, Nesterov, b2, eps, weight decay and its
coupling, the batch size and the schedule's shape are the template's. Each point runs the
recursion and summary of :func:`ntk_tt.predict` with ``optimizer=``
(``_whatif_optimizer.run_paths`` / ``summarise_run``: Θ clamped to PSD, the head-aware SGD or
the fast head-aware Adam predictor), all in one ``jit(vmap(vmap))`` (m outer, η_peak inner)
that shares the kernel, the batch orders and the tangents. The schedule enters the program as
one table η_t/η_max (T,), so one compiled program serves every schedule of a given T.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from ntk_tt._schedules import constant
from ntk_tt.analysis._whatif_checks import _prepare_optimizer
from ntk_tt.analysis._whatif_core import _clamped, grid_cell, is_blind
from ntk_tt.analysis._whatif_optimizer import _Rates, run_paths, summarise_run
from ntk_tt.dynamics._optim_linear import check_learning_rates


def optimizer_grid(kernel, y, optimizer, peaks, momenta, *, steps, epsilon, key, y_test, f0,
                   kernel_test, f0_test, a, a_test, loss, num_paths, window):
    """(diverged, T_ε, L_T, held-out accuracy, κ, beyond_edge, outcome), each (G_m, G_η), over
    ``momenta`` × ``peaks`` (checked 1-D grids). Every ValueError before any work: the
    template's schedule (``check_learning_rates``), then the problem as
    ``sensitivities(optimizer=)`` checks it (``_prepare_optimizer``; the schedule passed as a
    constant there, since the grid rescales it whatever its form)."""
    top = check_learning_rates(optimizer, steps)  # None: steps is refused just below
    p = _prepare_optimizer(
        kernel, y, dataclasses.replace(optimizer, learning_rate=constant(1.0)),
        steps=steps, key=key, y_test=y_test, f0=f0, kernel_test=kernel_test, f0_test=f0_test,
        a=a, a_test=a_test, loss=loss, num_paths=num_paths, warmup_smoothing=None)
    unit = np.asarray(optimizer.learning_rates(steps), np.float64) / top
    template = dataclasses.replace(p.optimizer, learning_rate=_Rates(jnp.asarray(unit, p.dtype)))
    return _optimizer_grid_core(
        p.data, p.y, p.y_test, template, jnp.asarray(peaks, p.dtype),
        jnp.asarray(momenta, p.dtype), p.batches, p.tangents, jnp.asarray(epsilon, p.dtype),
        kind=p.kind, traced=p.traced, test_traced=p.test_traced, loss=loss, window=window)


@partial(jax.jit, static_argnames=("kind", "traced", "test_traced", "loss", "window"))
def _optimizer_grid_core(data, y, y_test, template, peaks, momenta, batches, tangents, epsilon,
                         *, kind, traced, test_traced, loss, window):
    """The grid (module docstring); ``template.learning_rate`` the unit table η_t/η_max."""
    psd, lams = _clamped(kind, data[0] if kind == "adam" else data)

    def one(peak, m):
        opt = dataclasses.replace(template, momentum=m,
                                  learning_rate=_Rates(template.learning_rate.rates * peak))
        fs, fts = run_paths(kind, data, psd, y, opt, batches, tangents, traced=traced,
                            test_traced=test_traced, loss=loss)
        pred = summarise_run(kind, data, fs, fts, y, y_test, opt, peak, psd, lams, loss=loss)
        div, t, final, acc, kappa, edge, said = grid_cell(pred, epsilon, window,
                                                          is_blind(kind, loss, pred))
        return div, t, final, acc, kappa, edge & (kind != "adam"), said  # Adam: no edge

    return jax.vmap(lambda m: jax.vmap(lambda peak: one(peak, m))(peaks))(momenta)
