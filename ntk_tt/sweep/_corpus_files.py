"""The files of a telemetry corpus (:mod:`ntk_tt.sweep._corpus`): its recorded grid
(``spec.json``), checked before a resume (:func:`check_corpus_resume`), and its runs, read back
one JSON object per run file or packed line (:func:`iter_corpus`, :func:`read_corpus`), each run
file checked to be the run its name says (:func:`_check_run`)."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Iterator

from ntk_tt.sweep._corpus import CorpusSpec


def _grid(spec: CorpusSpec) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(spec)))


def check_corpus_resume(spec: CorpusSpec, out) -> None:
    """ValueError, before any work, when ``out`` holds a corpus of another grid (its
    ``spec.json``; the fields that differ are named) or a run file that is not its run
    (damaged from outside, :func:`_check_run`: a resume counted it as done, and ``--pack``
    failed on it later or packed it)."""
    out = pathlib.Path(out)
    spec_path, want = out / "spec.json", _grid(spec)
    if spec_path.exists():
        try:
            old = json.loads(spec_path.read_text())
        except (ValueError, OSError) as err:
            old = err
        if not isinstance(old, dict):
            why = f"not readable JSON: {old}" if isinstance(old, Exception) else \
                f"a JSON {type(old).__name__}, not an object"
            raise ValueError(f"{spec_path} is damaged ({why}), so the grid of the corpus in "
                             f"{out} is unknown; restore it, or choose a new --out.")
        if old != want:
            differ = sorted(k for k in want if old.get(k) != want[k])
            raise ValueError(f"{out} holds a corpus of a different grid ({spec_path}; it "
                             f"differs in {', '.join(differ)}); resume it with the same "
                             "options or choose a new --out.")
    for _ in iter_runs(out):  # every run file read and checked
        pass


def iter_runs(out) -> Iterator[dict]:
    """The rows of ``out/runs`` as :func:`iter_corpus` reads them, each checked to be its run
    (:func:`_check_run`; a ValueError names the first that is not): before a resume, and as
    ``--pack`` writes them (its file is kept only when every run passed)."""
    files = sorted(pathlib.Path(out, "runs").glob("*.json"))
    for path, row in zip(files, iter_corpus(out), strict=True):
        yield _check_run(row, path)


def iter_corpus(out) -> Iterator[dict]:
    """The run rows of a corpus directory (``out/runs/*.json``, or a ``.jsonl`` / ``.jsonl.gz``
    file of rows), in file-name order; a line or file that is not a JSON object is a
    ValueError naming it (see :func:`read_corpus`)."""
    path = pathlib.Path(out)
    if path.is_file():
        import gzip

        opener = gzip.open if path.suffix == ".gz" else open
        try:
            with opener(path, "rt", encoding="utf-8") as fh:
                for i, line in enumerate(fh, 1):
                    if line.strip():
                        yield _row(line, f"{path}, line {i}")
        except (UnicodeDecodeError, OSError, EOFError) as err:  # gzip.BadGzipFile: an OSError
            raise ValueError(f"{path}: not a corpus file (JSON Lines, .gz too): {err}.") from None
        return
    for p in sorted((path / "runs").glob("*.json")):
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError) as err:  # a folder named x.json: IsADirectoryError
            raise ValueError(f"{p}: not a corpus row file (a JSON object): {err}.") from None
        yield _row(text, str(p))


def _check_run(row: dict, path: pathlib.Path) -> dict:
    """A run file's row, else a ValueError naming the file: a JSON object that is not the run
    its name says ({} or another run_id, a cut or impossible telemetry, a malformed prediction)
    was counted as finished on resume and packed without a word."""
    from ntk_tt.telemetry._prediction_checks import check_prediction
    from ntk_tt.telemetry._telemetry import Telemetry

    fix = "delete it and run the same command again: that run is redone"
    if row.get("run_id") != path.stem:
        raise ValueError(f"{path}: not the run its name says (run_id {row.get('run_id')!r}); "
                         f"{fix}.")
    try:
        tele = Telemetry.from_dict(row.get("telemetry"))
        check_prediction(row.get("prediction"), tele.steps)
    except ValueError as err:
        raise ValueError(f"{path}: {str(err).rstrip('.')}; {fix}.") from None
    return row


def _row(text: str, where: str) -> dict:
    try:
        row = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not JSON ({err.msg}); a corpus row is one JSON object.") \
            from None
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a corpus row is a JSON object, got {type(row).__name__}.")
    return row


def read_corpus(path) -> list[dict]:
    """Every run row of a telemetry corpus, in order: the rows :func:`ntk_tt.fit_outcome` fits
    on (``experiments/telemetry_corpus.py`` writes them; the packed corpus of README
    "Telemetry and outcome prediction" is ``experiments/results/telemetry/corpus.jsonl.gz``).

    Source: none (a utility: ntk_tt's corpus format, issue 11).

    Args:
      path: a corpus directory (its ``runs/*.json``, in file-name order) or a ``.jsonl`` /
        ``.jsonl.gz`` file of rows (one JSON object per line).

    Returns:
      A list of dicts, one per run: ``telemetry`` (:meth:`ntk_tt.Telemetry.to_dict`),
      ``prediction`` (the NTK prediction's curves) or None, ``outcome``, and the run's
      configuration (``run_id``, ``task_id``, ``dataset``, ``optimizer``, ``batch_size``,
      ``per_class``, ``momentum``, ``kappa_eff``, ``steps``).

    Raises:
      ValueError: ``path`` not a non-empty str / PathLike, does not exist, is a directory
        without a ``runs/`` folder of rows, or holds no rows; a line or file that is not one
        JSON object, or not UTF-8 text (named with its line).
    """
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ValueError(f"read_corpus needs the path of a corpus directory or .jsonl(.gz) "
                         f"file, got {path!r}.")
    try:
        where = pathlib.Path(path).expanduser()
    except RuntimeError as err:  # "~nosuchuser/...": no such home directory
        raise ValueError(f"corpus {str(path)!r}: {err}") from None
    if not where.exists():
        raise ValueError(f"corpus {str(path)!r} does not exist; give a corpus directory or a "
                         ".jsonl(.gz) file of rows.")
    if where.is_dir() and not (where / "runs").is_dir():
        raise ValueError(f"corpus {str(path)!r} is a directory without runs/: give the folder "
                         "experiments/telemetry_corpus.py wrote, or a .jsonl(.gz) file.")
    rows = list(iter_corpus(where))
    if not rows:
        raise ValueError(f"corpus {str(path)!r} holds no rows.")
    return rows
