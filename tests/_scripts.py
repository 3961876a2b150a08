"""The experiment scripts as modules (their ``main(argv)`` and ``parse`` in this process), and
the one error line of a command they refuse."""

import importlib.util
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def experiment_script(name: str):
    """``experiments/<name>.py`` loaded as a module (not run), its folder on ``sys.path`` as
    when run (the scripts import their neighbours, e.g. ``_args``)."""
    if str(EXPERIMENTS) not in sys.path:
        sys.path.append(str(EXPERIMENTS))
    spec = importlib.util.spec_from_file_location(f"{name}_script", EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def refused(module, argv, capsys) -> str:
    """The one ``<script>: error:`` line of a command ``module.main`` refuses (exit status 2:
    one line, no traceback or usage block)."""
    with pytest.raises(SystemExit) as ended:
        module.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert ended.value.code == 2 and len(err) == 1, err
    assert ": error: " in err[0]
    return err[0]
