"""Argument checks the experiment scripts share: a bad argument is one ``<script>: error:``
line and exit status 2, before any work (a fresh user's run of closing_note.py into a missing
folder built its kernel, predicted and fine-tuned for 73 s, then lost everything)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from ntk_tt._output_paths import require_folder


def exit_error(prog: str, message: str):
    """Exit 2 with ``<prog>: error: message`` on stderr (one line, no usage block; ``raise
    SystemExit(message)`` exited 1, not argparse's 2 for a usage error)."""
    sys.stderr.write(f"{prog}: error: {message}\n")
    raise SystemExit(2)


def fail(parser: argparse.ArgumentParser, message: str):
    """:func:`exit_error` under ``parser``'s name."""
    exit_error(parser.prog, message)


def output_file(parser: argparse.ArgumentParser, path, flag: str) -> None:
    """``path`` (None or "": not asked for) names a file in an existing folder, not a
    directory."""
    if not path:
        return
    try:
        require_folder(path, flag)
    except ValueError as err:
        fail(parser, str(err))


def at_least(parser: argparse.ArgumentParser, flag: str, values, low: float, *,
             integer: bool = False) -> None:
    """Every one of ``values`` (a number or a list) is finite and ≥ ``low``."""
    many = isinstance(values, (list, tuple))
    for v in values if many else [values]:
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= low):
            kind = ("integers" if many else "an integer") if integer else (
                "finite numbers" if many else "a finite number")
            fail(parser, f"{flag} must be {kind} >= {low:g}, got {v!r}.")


def positive(parser: argparse.ArgumentParser, flag: str, values) -> None:
    """Every one of ``values`` is a finite number > 0 (learning rates, κ values)."""
    many = isinstance(values, (list, tuple))
    for v in values if many else [values]:
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            fail(parser, f"{flag} must be {'finite numbers' if many else 'a finite number'} "
                         f"> 0, got {v!r}.")


def no_rows(frame, what: str) -> None:
    """Exit 2 with one ``<script>: error:`` line when a selection of a committed table is
    empty (a fresh user's --per-class 7 exited 0 without a word, some leaving an empty file):
    ``what`` names the options, e.g. "--per-class [7]"."""
    if len(frame) == 0:
        sys.stderr.write(f"{Path(sys.argv[0]).name}: error: no row of the committed table has "
                         f"{what}: pick values of its grid.\n")
        raise SystemExit(2)


def rows_file(parser: argparse.ArgumentParser, path, report: bool) -> None:
    """A script's JSON-lines ``--out``: with ``--report`` a file that exists (a missing one was
    a traceback: max() of an empty sequence, a KeyError), else a file in an existing folder,
    not a directory (an IsADirectoryError, or a missing folder, after the first row's work)."""
    if not report:
        output_file(parser, path, "--out")
    elif not Path(path).is_file():
        fail(parser, f"--report reads --out {path}, which is not a file: run without --report "
                     "first.")


def out_dir(parser: argparse.ArgumentParser, path) -> None:
    """A script's ``--out`` folder (created if missing): not an existing file (a
    FileExistsError or NotADirectoryError traceback)."""
    if Path(path).exists() and not Path(path).is_dir():
        fail(parser, f"--out {path} is a file; give a folder (created if missing).")


def known_sets(parser: argparse.ArgumentParser, names, flag: str) -> None:
    """Every one of ``names`` is a target set loadable here (``ntk_tt.known_datasets()``)."""
    from ntk_tt import known_datasets

    if unknown := [d for d in names if d not in known_datasets()]:
        fail(parser, f"{flag} {' '.join(unknown)}: not a target set here; known: "
                     f"{', '.join(known_datasets())} (the shared ones need ../shared/data or "
                     "$NTK_TT_DATA_DIR).")


def folder(parser: argparse.ArgumentParser, path, flag: str, what: str) -> None:
    """An input folder that must exist (a traceback from its reader)."""
    if not Path(path).is_dir():
        fail(parser, f"{flag} {path}: no such folder ({what}).")
