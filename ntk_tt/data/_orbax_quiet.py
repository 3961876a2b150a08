"""Silencing orbax's noise around a checkpoint read (split from :mod:`ntk_tt.data._checkpoint`):
its absl warnings, and the asyncio tracebacks a failed read prints late, so that the caller's
one-line error is all that is printed.
"""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager


def _orbax_noise(unraisable) -> bool:
    """A failed orbax read's late report: its background futures failing against the closed
    event loop, or one of its coroutines collected with the read error still inside."""
    err = unraisable.exc_value
    if isinstance(err, RuntimeError) and str(err) == "Event loop is closed":
        return True
    code = getattr(unraisable.object, "cr_code", None)
    return code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename


def _ignore_orbax_noise(previous):
    """An unraisable-exception hook that drops :func:`_orbax_noise` and passes on the rest."""
    def hook(unraisable):
        if not _orbax_noise(unraisable):
            previous(unraisable)

    hook.ntk_tt_quiet = True
    return hook


@contextmanager
def _quiet():
    """Silence orbax's absl warnings and the asyncio tracebacks of a failed read: a damaged
    checkpoint leaves orbax's futures (against its closed event loop, seconds later) and
    coroutines holding the read error to print tracebacks through ``sys.unraisablehook``;
    those (only those, :func:`_orbax_noise`) are dropped from the first read on, and asyncio's
    logger stays silenced after a failure, so nothing follows the caller's one-line error."""
    if not getattr(sys.unraisablehook, "ntk_tt_quiet", False):
        sys.unraisablehook = _ignore_orbax_noise(sys.unraisablehook)
    loggers = [logging.getLogger(name) for name in ("absl", "asyncio")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    except BaseException:
        loggers.pop()  # asyncio's logger stays silent: the failed read's tasks end later
        raise
    finally:
        for lg, level in zip(loggers, levels, strict=False):
            lg.setLevel(level)
