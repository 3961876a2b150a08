"""The ``--json`` report file of the main job and ``suggest``: claimed whole and exclusively,
replaced atomically, settled when a job ends early (never another run's file)."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path

# the ``status`` of a --json report: STARTED from the start of the work (the file claimed, no
# result yet), RUNNING once a --verify prediction exists (both in ntk_tt._output_paths, which
# names a report left by a killed run), then COMPLETE, INTERRUPTED or "failed after the
# prediction (...)"
from ntk_tt._output_paths import RUNNING as RUNNING
from ntk_tt._output_paths import STARTED as STARTED

INTERRUPTED = "interrupted during the real fine-tuning"
COMPLETE = "complete"


def settle(path: Path, status: str = INTERRUPTED) -> bool:
    """When a job ends early (Ctrl-C, SIGTERM, an error): remove a --json report at ``path``
    that holds no result yet (:data:`STARTED`), and give one that says the fine-tuning is
    running (:data:`RUNNING`) ``status`` instead, so no report says "running" for a dead
    process; this process's temporary file of ``path`` is removed too (a watcher thread's
    exit skips the writer's own clean-up). Returns whether ``path`` then holds a prediction
    with that ``status``."""
    try:
        _tmp(path).unlink(missing_ok=True)
        report = json.loads(path.read_text())
        if report["status"] == STARTED:
            path.unlink()
        elif report["status"] == RUNNING:
            report["status"] = status
            _write_json(path, report, create=False)
        return report["status"] == status
    except (OSError, ValueError, TypeError, KeyError):  # no report, or not a job's
        return False


def _write_json(path: Path, report: dict, *, create: bool, claim: dict | None = None) -> None:
    """Write the report atomically (:func:`write_atomic`; ``claim["inode"]`` records the
    created file's inode first so that :func:`_claimed` can tell this run's file from
    another's)."""
    write_atomic(path, lambda tmp: tmp.write_text(json.dumps(report, indent=1)),
                 create=create, claim=claim)


def write_atomic(path: Path, write, *, create: bool, claim: dict | None = None) -> None:
    """``write(tmp)`` into a temporary file beside ``path``, then put it in place whole (a
    reader, an interrupt or a full disk never leaves half a file, nor a temporary one);
    ``create``: the file must not exist yet (``FileExistsError``: another run's output), and
    it appears by a hard link of the written file (exclusive and atomic; where the file system
    has no hard links: created empty, then replaced)."""
    tmp = _tmp(path)
    try:
        write(tmp)
        if create:
            if claim is not None:
                claim["inode"] = tmp.stat().st_ino
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise
            except OSError:  # a file system without hard links: empty first, then whole
                if claim is not None:
                    claim.pop("inode", None)
                open(path, "x").close()
                os.replace(tmp, path)
        else:
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _claimed(path: Path, claim: dict) -> bool:
    """Whether ``path`` is the file this run's ``_write_json(create=True, claim=claim)``
    created (also when an interrupt came between the link and the return)."""
    try:
        return "inode" in claim and path.stat().st_ino == claim["inode"]
    except OSError:
        return False


def _output(write, path: Path, *args, **kwargs):
    """Run ``write(path, ...)`` and return its result; an output that appeared meanwhile or
    cannot be written is a one-line ``ValueError`` (checked up front; this catches another
    run writing the same file during the work, and a folder removed or filled)."""
    try:
        return write(path, *args, **kwargs)
    except FileExistsError:
        raise ValueError(f"{path} was created by another run while this one worked; it is not "
                         "replaced: rerun with another path, or with --overwrite "
                         "(overwrite=True).") from None
    except OSError as err:
        raise ValueError(f"could not write {err.filename or path!s}: "
                         f"{err.strerror or type(err).__name__}.") from None


@contextmanager
def claimed_report(json_file: Path | None, claim_it: bool, config: dict):
    """Around a job that writes its --json report ``json_file`` (None: no report): claim the
    path first when ``claim_it`` (written with status :data:`STARTED`, so a second run is
    refused at once), and, when the job ends early, :func:`settle` it (status
    :data:`INTERRUPTED`, or "failed after the prediction (...)") — never another run's file:
    a claim that failed (the path exists) is not this run's. ``predict_task`` and
    ``suggest_task`` (which writes no :data:`RUNNING` report, so its claim is only removed)."""
    claimed, claim = (json_file if json_file and claim_it else None), {}
    try:
        if claimed:  # inside the try: an interrupt right after the claim still settles it
            _output(_write_json, claimed, {"config": config, "status": STARTED}, create=True,
                    claim=claim)
            claim["done"] = True
        yield
    except BaseException as err:
        if json_file and (not claimed or claim.get("done") or _claimed(claimed, claim)):
            settle(json_file, INTERRUPTED if isinstance(err, KeyboardInterrupt) else
                   f"failed after the prediction ({type(err).__name__}: {err})")
        raise
