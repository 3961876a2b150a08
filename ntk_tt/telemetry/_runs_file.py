"""The run files ``ntk-tt outcome`` reads: telemetry rows or corpus rows, as JSON Lines, a
JSON list or one object (``.gz`` too), each row checked with its line number."""

from __future__ import annotations

import gzip
import json
import pathlib

from ntk_tt.telemetry._telemetry import Telemetry


def load_runs(path: str | pathlib.Path) -> list[tuple[int, Telemetry, dict | None]]:
    """Runs to predict from a JSON Lines (``.gz`` too) or JSON file: each line (or the JSON
    list's items, or the single object) either a bare telemetry row
    (:meth:`ntk_tt.Telemetry.to_dict`) or a corpus row ``{"telemetry": {...}, "prediction":
    {...}}``. Returns (row, telemetry, prediction or None) in file order, row the line number
    (a JSON list's item number) that the messages name.

    Raises:
      ValueError: unreadable JSON, or a row that is neither form (with its line number).
    """
    path = pathlib.Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            text = fh.read()
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as err:
        raise ValueError(f"{path}: not a text JSON file ({err}).") from None
    try:
        doc = json.loads(text)
        items = doc if isinstance(doc, list) else [doc]
        numbered = list(enumerate(items, 1))
        bad = [i for i, item in numbered if not isinstance(item, dict)]
        if isinstance(doc, list) and bad:
            raise ValueError(f"{path}: expected a JSON object per line (or a JSON list of "
                             f"objects), got a list whose item {bad[0]} is "
                             f"{type(items[bad[0] - 1]).__name__}.")
    except RecursionError:  # a value nested thousands of levels deep: no run row
        raise ValueError(f"{path}: JSON nested too deeply to be a run row.") from None
    except json.JSONDecodeError:
        numbered = []
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    numbered.append((i, json.loads(line)))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}, line {i}: not JSON ({err.msg}).") from None
                except RecursionError:
                    raise ValueError(f"{path}, line {i}: JSON nested too deeply to be a run "
                                     "row.") from None
    if not numbered:
        raise ValueError(f"{path} holds no runs.")
    out = []
    for i, item in numbered:
        if not isinstance(item, dict):
            raise ValueError(f"{path}, row {i}: expected a JSON object, got {type(item).__name__}.")
        row = item.get("telemetry", item)
        try:
            tele = Telemetry.from_dict(row)
        except (ValueError, TypeError, KeyError) as err:
            raise ValueError(f"{path}, row {i}: {err}") from None
        out.append((i, tele, item.get("prediction")))
    return out
