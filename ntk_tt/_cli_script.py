"""What the scripts of ``experiments/`` share: their parser (:class:`ScriptParser`) and the way
they run their work under ``ntk-tt``'s interrupt guard (:func:`run_guarded`)."""

from __future__ import annotations

import signal
from collections.abc import Callable

from ntk_tt._cli_parser import Parser
from ntk_tt.cli import _caused_by_interrupt, _guard_interrupts


class ScriptParser(Parser):
    """The parser of an ``experiments/`` script: a negative number in any form is a value
    (:class:`ntk_tt._cli_parser.Parser`), no abbreviated flags (``--smok`` was read as
    ``--smoke``; ``ntk-tt`` refuses them too), and argparse's own errors (an unknown flag, a
    bad choice, a value it cannot read) are one ``SCRIPT: error:`` line, status 2, without
    the usage block."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:
        self.exit(2, f"{self.prog}: error: {message}\n")


def run_guarded(work: Callable[[], object], state: dict, stop: Callable[[dict], None], *,
                starting: dict, is_program: bool):
    """``work()``, with Ctrl-C and SIGTERM ending the process through ``stop(state)`` (one
    line saying what is kept, status 128 + the signal: :func:`ntk_tt.cli.exit_once`).

    ``starting``: what :func:`ntk_tt.cli.guard_starting` took over (restored first, as
    :func:`ntk_tt.cli._guard_interrupts` takes over default handlers only); ``is_program``:
    the script runs as the program (a test calling ``main(argv)`` keeps its handlers). Other
    exceptions of ``work`` propagate (a ValueError for the script's error line), except one
    caused by an interrupt (XLA may wrap it), which stops as Ctrl-C does.
    """
    if is_program:
        for sig, default in starting.items():
            signal.signal(sig, default)
        _guard_interrupts(state, stop=stop, started=lambda st: True)
    try:
        return work()
    except KeyboardInterrupt:
        stop(state)
    except Exception as err:
        if not _caused_by_interrupt(err):
            raise
        stop(state)
