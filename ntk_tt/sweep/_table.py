"""Crash-safe results table: one row per (task, configuration, seed), written as it finishes.

Each finished row is one small JSON file ``rows/<row id>.json``, written to a temporary name,
fsync-ed and renamed atomically, so a sweep killed at any instant (SIGKILL included) leaves only
whole rows; a resumed sweep skips the ids already present and can never duplicate one.
:meth:`ResultsTable.consolidate` gathers the rows into ``results.parquet``, the single table
that the figures and the summary read. A directory that holds only ``results.parquet`` (a
committed table, whose ``rows/`` were not kept) resumes too: its rows count as done and
stay in the table when new rows are consolidated beside them.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import secrets
import tempfile

import numpy as np
import pandas as pd

TABLE_NAME = "results.parquet"


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, np.ndarray | list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _new_temp(directory: pathlib.Path, suffix: str) -> tuple[int, pathlib.Path]:
    """A new hidden ``.tmp-*`` file in ``directory``, open for writing: (fd, path). It is
    created with mode 0o666 less the process umask, as a plain ``open(..., "w")`` creates
    files (``tempfile.mkstemp`` makes them 0o600, unreadable to the group and others)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = directory / f".tmp-{secrets.token_hex(8)}{suffix}"
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary file name in {directory}.")


def check_out(out: str | os.PathLike) -> None:
    """Refuse a results directory that cannot be one: ``out`` or its nearest existing
    ancestor is not a directory (a file, say).

    Raises:
      ValueError: naming the path; give a directory (created if missing). An empty path
        (``--out ''``, which pathlib reads as the current folder) is refused too, and so is
        a folder that takes no new entry (read-only; probed with a temporary folder, removed).
    """
    if not str(out).strip():
        raise ValueError(f"--out is empty ({str(out)!r}); give the sweep's directory, e.g. "
                         "--out runs/sweep (created if missing; '.' for the current folder).")
    path = pathlib.Path(out)
    for parent in (path, *path.parents):
        if parent.exists() or parent.is_symlink():  # a dangling link: not a directory
            if not parent.is_dir():
                what = "is" if parent == path else f"is inside {parent}, which is"
                raise ValueError(f"{str(out)!r} {what} not a directory; give --out a "
                                 "directory path (created if missing).")
            try:  # a folder that takes no new entry (read-only, /sys, /proc): a traceback later
                with tempfile.TemporaryDirectory(dir=parent):
                    pass
            except OSError as err:
                where = "" if parent == path else f" (in {parent})"
                raise ValueError(f"cannot create files in --out {str(out)!r}"
                                 f"{where}: {err.strerror or err}; give a folder you can "
                                 "write.") from None
            return


def _atomic_write(path: pathlib.Path, data: bytes) -> None:
    fd, tmp = _new_temp(path.parent, path.suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class ResultsTable:
    """The results of one sweep directory ``out``: ``out/rows/*.json`` and ``out/results.parquet``.

    Args:
      out: the sweep's output directory (created if missing).

    Raises:
      ValueError: ``out`` is not a directory (:func:`check_out`).
    """

    def __init__(self, out: str | os.PathLike):
        check_out(out)
        self.out = pathlib.Path(out)
        self.rows_dir = self.out / "rows"
        self.rows_dir.mkdir(parents=True, exist_ok=True)

    def _path(self, rid: str) -> pathlib.Path:
        if "/" in rid or rid.startswith("."):
            raise ValueError(f"row id {rid!r} must not contain '/' or start with '.'.")
        return self.rows_dir / f"{rid}.json"

    def _consolidated(self) -> pd.DataFrame | None:
        """``results.parquet`` (None if absent; one written with no rows has no columns)."""
        path = self.out / TABLE_NAME
        if not path.exists():
            return None
        try:
            frame = pd.read_parquet(path)
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
            raise ValueError(f"{path} is not a readable results table ({err}); restore it or "
                             "remove it (rows/ is consolidated again).") from None
        return frame if "row_id" in frame.columns else None

    def row_ids(self) -> set[str]:
        """Ids of the rows written to ``rows/`` (temporary files of a killed write are
        ignored); not those only in ``results.parquet``, which is not read."""
        return {p.stem for p in self.rows_dir.glob("*.json") if not p.name.startswith(".")}

    def done_ids(self) -> set[str]:
        """Ids of the rows already written to ``rows/`` (:meth:`row_ids`) or in
        ``results.parquet``."""
        ids = self.row_ids()
        table = self._consolidated()
        return ids if table is None else ids | set(table["row_id"])

    def write_row(self, row: dict) -> None:
        """Write one finished row atomically; ``row["row_id"]`` is its key.

        Raises:
          ValueError: if the row has no ``row_id`` or that id is already in ``rows/`` (an id
            only in ``results.parquet`` is accepted: the ``rows/`` copy wins at
            :meth:`consolidate`; callers skip :meth:`done_ids`).
        """
        rid = row.get("row_id")
        if not rid:
            raise ValueError("a results row needs a non-empty 'row_id'.")
        path = self._path(rid)
        if path.exists():
            raise ValueError(f"row {rid!r} is already in {self.rows_dir}; a resume must skip it.")
        _atomic_write(path, json.dumps(_jsonable(row)).encode())

    def load_rows(self) -> pd.DataFrame:
        """All written rows as a DataFrame (one row each), sorted by ``row_id``.

        Raises:
          ValueError: a damaged row file, named (:func:`read_rows`).
        """
        frame = pd.DataFrame.from_records(read_rows(self.rows_dir))
        return frame.sort_values("row_id").reset_index(drop=True) if len(frame) else frame

    def consolidate(self) -> pathlib.Path:
        """Gather the rows into ``results.parquet`` (atomic) and return its path. Rows already
        there and absent from ``rows/`` are kept (a row in both: the ``rows/`` one)."""
        frame, old = self.load_rows(), self._consolidated()
        if old is not None and len(old):
            kept = old if not len(frame) else old[~old["row_id"].isin(frame["row_id"])]
            frame = pd.concat([kept, frame], ignore_index=True) if len(frame) else kept
            frame = frame.sort_values("row_id").reset_index(drop=True)
        path = self.out / TABLE_NAME
        tmp = self.out / f".tmp-{TABLE_NAME}"
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, path)
        return path


def read_rows(rows_dir: pathlib.Path) -> list[dict]:
    """The row files of ``rows_dir`` (a sweep's ``rows/``; none when it is missing), each one
    JSON object, in file-name order.

    Raises:
      ValueError: a row file that is not a JSON object with a ``row_id`` (rows are written
        atomically, so only outside damage does that), naming it: delete it and the resume
        redoes that row (unless ``results.parquet`` holds it already).
    """
    records = []
    for p in sorted(p for p in rows_dir.glob("*.json") if not p.name.startswith(".")):
        try:
            record = json.loads(p.read_text())
            if not (isinstance(record, dict) and record.get("row_id")):
                raise ValueError("not a row: a JSON object with a row_id")
            if record["row_id"] != p.stem:  # written as rows/<row_id>.json (write_row)
                raise ValueError(f"row_id {record['row_id']!r} is not its file's name")
        except ValueError as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise ValueError(f"row file {p} is damaged ({err}); delete it and run the same "
                             "command again: that row is redone (unless results.parquet "
                             "holds it already)") from None
        records.append(record)
    return records


def read_table(out: str | os.PathLike) -> pd.DataFrame:
    """The consolidated results table of a sweep directory (``results.parquet``).

    Raises:
      ValueError: if the directory holds no ``results.parquet``; run the sweep (or
        ``--report``, which consolidates ``rows/``) first.
    """
    path = pathlib.Path(out) / TABLE_NAME
    if not path.exists():
        raise ValueError(f"no results table at {path}; run `experiments/sweep.py --out {out}`.")
    return pd.read_parquet(path)
