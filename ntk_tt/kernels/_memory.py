"""Memory guard for the empirical NTK: estimate the bytes a kernel needs, fail before the work.

The available memory is read from ``/proc/meminfo`` (``MemAvailable``), falling back to
``os.sysconf``; the environment variable ``NTK_TT_MEMORY_LIMIT`` (bytes) or a ``memory_limit``
argument overrides it (tests use a tiny limit).
"""

from __future__ import annotations

import os

import numpy as np

MEMORY_ENV = "NTK_TT_MEMORY_LIMIT"


class NTKMemoryError(MemoryError, ValueError):
    """The requested kernel does not fit in memory; the message says how much and what to use.

    Subclasses both ``MemoryError`` and ``ValueError``, so either ``except`` clause catches it.
    Raised before any Jacobian is computed.

    Source: none (ntk_tt's own guard; the kernel's costs are those of METHOD.md §5).
    """


def _bytes(value) -> int:
    """``value`` as a whole number of bytes ≥ 1; ValueError (or OverflowError for ±inf)
    otherwise (NaN included)."""
    out = int(value)
    if out < 1:
        raise ValueError(value)
    return out


def available_memory(memory_limit: int | None = None) -> int:
    """Bytes available for a kernel computation.

    Source: none (a utility).

    Args:
      memory_limit: explicit limit in bytes; wins over everything else.

    Returns:
      ``memory_limit`` if given, else ``$NTK_TT_MEMORY_LIMIT`` if set, else ``MemAvailable``
      from ``/proc/meminfo``, else free physical pages × page size from ``os.sysconf``.

    Raises:
      ValueError: ``memory_limit`` or ``$NTK_TT_MEMORY_LIMIT`` not a positive integer.
    """
    if memory_limit is None and os.environ.get(MEMORY_ENV):
        try:
            memory_limit = _bytes(float(os.environ[MEMORY_ENV]))
        except (ValueError, OverflowError):
            raise ValueError(
                f"${MEMORY_ENV} must be a positive, finite number of bytes, got "
                f"{os.environ[MEMORY_ENV]!r}; unset it or write e.g. {MEMORY_ENV}=8e9."
            ) from None
    if memory_limit is not None:
        if isinstance(memory_limit, (bool, np.bool_)) or not isinstance(
                memory_limit, (int, float, np.integer, np.floating)):
            raise ValueError(f"memory_limit must be a number of bytes (e.g. 8e9 or 2**33), got "
                             f"{memory_limit!r} of type {type(memory_limit).__name__}.")
        try:
            return _bytes(memory_limit)
        except (ValueError, OverflowError):
            raise ValueError(f"memory_limit must be a positive, finite number of bytes (e.g. "
                             f"8e9), got {memory_limit!r}.") from None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def kernel_memory_bytes(
    n: int, n2: int, c: int, d: int, *, itemsize: int, trace_logits: bool, jac_rows: int
) -> int:
    """Bytes held at the peak of a blocked kernel computation: Jacobian blocks plus Θ.

    Args:
      n, n2: number of row and column inputs.
      c: number of logits C.
      d: number of parameters D.
      itemsize: bytes per number (4 for float32).
      trace_logits: the (n, n2) logit-summed kernel instead of the (n·C, n2·C) one.
      jac_rows: number of inputs whose per-sample Jacobians (C × D each) are alive at once.

    Returns:
      ``itemsize · (jac_rows·C·D + size of Θ)``. Activations saved for the backward pass are
      not counted.
    """
    kernel = n * n2 * (1 if trace_logits else c * c)
    return int(itemsize * (jac_rows * c * d + kernel))


def format_bytes(b: float) -> str:
    """Human-readable size: ``"1.50 GiB"``, ``"12.3 MiB"`` or ``"512 B"``."""
    if b >= 2**30:
        return f"{b / 2**30:.2f} GiB"
    return f"{b / 2**20:.1f} MiB" if b >= 2**20 else f"{int(b)} B"


def check_feature_kernel_fits(rows: int, test_rows: int, itemsize: int) -> None:
    """NTKMemoryError before any work when ``head_aware_kernel(backbone="exact")``'s two feature
    kernels, K_h (N·F, N·F) and its held-out cross kernel (N_test·F, N·F) (``rows`` = N·F,
    ``test_rows`` = N_test·F), need more than half of :func:`available_memory`: the predictor
    then works on them, and each ``empirical_ntk`` call checks only its own kernel (the main
    job's N = 750, F = 64: 11.4 GiB of kernels on a 23 GiB machine peaked at 20.2 GiB and ran
    15 minutes without output before it was stopped)."""
    need = itemsize * rows * (rows + test_rows)
    have = available_memory()
    if 2 * need > have:
        raise NTKMemoryError(
            f"backbone='exact' needs the ({rows}, {rows}) feature kernel K_h and its held-out "
            f"cross kernel ({test_rows}, {rows}): {format_bytes(need)}, and the prediction works"
            f" on them, against {format_bytes(have)} available (they may use half). Use "
            "backbone='subspace' (K_h exact on the features' k leading directions, its "
            "measured substitute) or the default 'diagonal', or fewer samples.")
