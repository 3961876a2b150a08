"""The user's line for a warning, however deep in the package it is raised (a base module)."""

from __future__ import annotations

import os
import sys

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
DRIVERS = frozenset({os.path.join(PACKAGE_DIR, "prediction", "_job.py")})
"""Modules of the package that call its public functions as a user's script does: the main job
of ``ntk-tt predict``, whose report keeps the warnings raised at its lines
(``ntk_tt.prediction._job.reported``)."""


def user_stacklevel() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` made by the function that calls this one which
    names the first frame outside the ``ntk_tt`` package, or in one of its :data:`DRIVERS`: the
    user's call, whichever public function (``predict``, ``predict(subset=)``,
    ``predict(optimizer=)``, ``predict_from_subset``) it came through. A hand-counted
    stacklevel named a module of the package when the same warning was reached by a longer
    path (``predict(subset=)``'s small-subset warning named ``_predict_subset.py``)."""
    frame, level = sys._getframe(1), 1  # the caller, where warnings.warn counts 1
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(PACKAGE_DIR) or path in DRIVERS:
            break
        frame, level = frame.f_back, level + 1
    return level
