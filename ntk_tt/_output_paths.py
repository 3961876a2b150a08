"""The output paths of the jobs (figure, JSON report), checked before any work, without JAX:
which ones a job may replace, and whether each can be written."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

# the ``status`` of a --json report (ntk_tt.prediction._report_file): STARTED from the start
# of the work (the file claimed, no result yet), RUNNING once a --verify prediction exists
STARTED = "started: loading the task and predicting"
RUNNING = "prediction done; real fine-tuning running"

OUTPUTS = frozenset({"figure", "json"})

# the package's shipped files (checkpoint, vendored target set, interval calibrator, outcome
# predictors): no job writes there, --overwrite or not (a fresh user's --json --overwrite
# replaced the vendored .npz, the calibrator and the checkpoint's meta, breaking every later
# run)
ASSETS = Path(__file__).resolve().parent / "assets"


def replaceable(overwrite) -> frozenset[str]:
    """The outputs ``overwrite`` lets a job replace: every one for True, none for False, or
    those named in a list / set of "figure" and "json" (``ntk-tt predict`` replaces its
    default figure without --overwrite: ``overwrite=("figure",)``).

    Raises:
      ValueError: anything else.
    """
    if isinstance(overwrite, (bool, np.bool_)):
        return OUTPUTS if overwrite else frozenset()
    names = frozenset(overwrite) if isinstance(overwrite, (list, tuple, set, frozenset)) else None
    if names is None or not names <= OUTPUTS:
        raise ValueError(f"overwrite must be True, False or a list of the outputs it may "
                         f"replace, {sorted(OUTPUTS)}, got {overwrite!r}.")
    return names


def require_folder(path, what: str) -> None:
    """Refuse a file ``path`` that is a directory, or whose folder does not exist (as
    :func:`check_outputs` does): the package's save functions write into existing folders and
    create none.

    Raises:
      ValueError: one line naming the path, the missing folder and the fix.
    """
    if Path(path).expanduser().is_dir():
        raise ValueError(f"{what} path {str(path)!r} is a directory; give a file name inside "
                         "it.")
    folder = Path(path).expanduser().absolute().parent
    if not folder.is_dir():
        raise ValueError(f"{what} path {str(path)!r}: folder {str(folder)!r} does not exist; "
                         "create it first or choose another path.")


def check_outputs(figure_path=None, json_path=None, overwrite=False, inputs=()) -> None:
    """Fail fast on output paths, before any work: each must name a file (not a directory) in
    an existing folder where a file can be created, and the figure's extension must be one
    matplotlib writes (png, pdf, svg, ...). An existing file is refused unless ``overwrite``
    names it (:func:`replaceable`; then it must be writable): two runs in one folder never
    replace each other's outputs silently, and none may be one of ``inputs`` ((name, path)
    pairs of the files the job reads, or of folders it reads, such as a checkpoint, whose files
    are then all inputs; a fresh user's ``--json`` replaced its own ``--dataset`` with
    ``--overwrite``), nor inside the package's shipped ``assets`` folder. Empty / None = no
    output.

    Raises:
      ValueError: one line naming the path and the fix.
    """
    from matplotlib.backend_bases import FigureCanvasBase

    replace = replaceable(overwrite)
    given = [(what, path) for what, path in (("figure", figure_path), ("json", json_path))
             if path]
    for what, path in given:  # first: an input is never an output, --overwrite or not
        out = Path(path).expanduser().resolve()
        for name, source in (*inputs, ("package's shipped assets folder", ASSETS)):
            src = Path(source).expanduser().resolve() if source else None
            if src is not None and (out == src or src.is_dir() and out.is_relative_to(src)):
                where = "is" if out == src else "is inside"
                none = " (or none: --figure '')" if what == "figure" else ""  # the default's
                raise ValueError(f"{what} path {str(path)!r} {where} the {name} this command "
                                 f"reads; choose another path{none}.")
    for what, path in given:
        target = Path(path).expanduser()
        if target.is_dir():
            raise ValueError(f"{what} path {str(path)!r} is a directory; give a file name "
                             "inside it.")
        folder = target.resolve().parent
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"{what} path {str(path)!r}: {str(folder)!r} is a file, not a "
                             "folder; choose a path inside a folder.")
        if not folder.is_dir():
            raise ValueError(f"{what} path {str(path)!r}: folder {str(folder)!r} does not "
                             "exist; create it first or choose another path.")
        if target.exists() and what not in replace:
            raise ValueError(f"{what} path {str(path)!r} exists ({_whose(target)}) and "
                             "is not replaced; choose another path, or pass --overwrite "
                             "(overwrite=True) to replace it.")
        if target.exists() and not (target.is_file() and os.access(target, os.W_OK)):
            raise ValueError(f"{what} path {str(path)!r} exists and is not a writable file; "
                             "choose another path.")
        try:  # os.access alone says yes for root on read-only or virtual file systems
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as err:
            raise ValueError(f"{what} path {str(path)!r}: cannot create a file in folder "
                             f"{str(folder)!r} ({err.strerror or type(err).__name__}); "
                             "choose another path.") from None
    if len(given) == 2 and (Path(figure_path).expanduser().resolve()
                            == Path(json_path).expanduser().resolve()):
        raise ValueError(f"the figure and the json report would both be written to "
                         f"{str(figure_path)!r}; give them different paths.")
    if figure_path:
        formats = FigureCanvasBase.get_supported_filetypes()
        ext = Path(figure_path).suffix.lower().lstrip(".")
        if ext not in formats:
            raise ValueError(f"figure path {str(figure_path)!r} must end in a format matplotlib "
                             f"writes: {', '.join('.' + f for f in sorted(formats))}.")


def _whose(target: Path) -> str:
    """What an existing output file is, for the refusal: a --json report of a run that never
    finished (its ``status`` still "started" or "running": that run is still writing it, or it
    was killed, e.g. by kill -9 or out of memory), else "an earlier run's output?"."""
    try:
        status = json.loads(target.read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        status = None
    if status in (STARTED, RUNNING):
        return (f"the report of a run that has not finished, status {status!r}: that run is "
                "still writing it, or it was killed (kill -9, out of memory); if none is "
                "running, remove the file")
    return "an earlier run's output?"


def is_dataset_path(name: str) -> bool:
    """Whether a dataset name is a file path, not a short or TFDS name: it ends in ``.npz``
    or ``.npy`` (any case), holds a path separator, or names an existing file (a fresh user's
    ``GOOD.NPZ``, ``arr.npy`` and extensionless archive were "unknown dataset")."""
    return (name.lower().endswith((".npz", ".npy")) or "/" in name or os.sep in name
            or os.path.isfile(os.path.expanduser(name)))


def job_inputs(o: dict) -> tuple:
    """The (name, path) pairs of what a predict or suggest job reads, for
    :func:`check_outputs`' ``inputs``: the dataset when ``o["dataset"]`` is a file path (a
    short name's vendored file is in the shipped assets, which check_outputs always protects;
    a TFDS name's files are TFDS's) and the checkpoint folder when one is given."""
    name, ck = o["dataset"], o.get("checkpoint")
    return ((("dataset", name),) if isinstance(name, str) and is_dataset_path(name) else ()) \
        + ((("checkpoint folder", ck),) if isinstance(ck, (str, os.PathLike)) and ck else ())
