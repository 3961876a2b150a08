"""Wall-clock timing with JAX's compilation time measured apart.

Prediction and fine-tuning are compared on the same footing (fine-tuning issue): compile time
is excluded from a stage's time and reported on its own. JAX reports every trace, lowering and
XLA compilation through ``jax.monitoring`` duration events; :class:`Stopwatch` sums them while
it runs.
"""

from __future__ import annotations

import time

import jax

_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


class Stopwatch:
    """Context manager: ``seconds`` (wall time minus compilation) and ``compile_seconds``.

    Example:
      >>> with Stopwatch() as sw:
      ...     jax.block_until_ready(f(x))
      >>> sw.seconds, sw.compile_seconds

    Only work done inside the block is counted; block on asynchronous results
    (``jax.block_until_ready``) before it ends.
    """

    def __enter__(self) -> Stopwatch:
        self.compile_seconds = 0.0
        jax.monitoring.register_event_duration_secs_listener(self._listen)
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self._start
        jax.monitoring.unregister_event_duration_listener(self._listen)
        self.seconds = max(wall - self.compile_seconds, 0.0)

    def _listen(self, event: str, duration: float, **_) -> None:
        if event in _COMPILE_EVENTS:
            self.compile_seconds += duration


def timed_stage(seconds: dict, stage: str, fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` to completion (``jax.block_until_ready``) as one named stage
    of a pipeline: its wall seconds without XLA compilation go to ``seconds[stage]`` and the
    compilation seconds are added to ``seconds["compile"]``. Returns ``fn``'s output."""
    with Stopwatch() as sw:
        out = jax.block_until_ready(fn(*args, **kwargs))
    seconds[stage] = sw.seconds
    seconds["compile"] = seconds.get("compile", 0.0) + sw.compile_seconds
    return out
