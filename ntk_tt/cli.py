"""``ntk-tt``: predict fine-tuning training time from the empirical NTK, without training.

    ntk-tt                      # the embedded default end to end (= ntk-tt predict --verify)
    ntk-tt predict [options]    # predicted T_ε and wall-clock time; --verify also fine-tunes
    ntk-tt suggest [options]    # the (η, m, B) predicted to reach a target loss soonest
    ntk-tt outcome RUNS.jsonl   # how runs will end, from their first steps' telemetry

Bad input ends with one ``ntk-tt: error: ...`` line (exit status 2), never a traceback;
option values that need no data are checked before JAX is imported (``ntk_tt._options``).
This module is the entry point and its signal handling; the parser is ``ntk_tt._cli_parser``,
the commands ``ntk_tt._cli_commands``, the report's text ``ntk_tt._cli_report``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

# Only the standard library here: the console script imports this module before it calls
# ``main``, and ``main`` installs the signal handling before it imports the parser and the
# commands (numpy, then JAX once the arguments are checked), so a Ctrl-C at any moment is
# one line. The commands import JAX and the jobs only after the arguments are parsed and
# checked (``ntk-tt -h`` is instant, and so is a bad option value).

_EXITING = threading.Lock()
GRACE_S = 3.0  # after Ctrl-C, the main thread's own exit path gets this long
_STOPPED = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated (SIGTERM)"}


def guard_starting(script: str, is_program: bool) -> dict:
    """Ctrl-C or SIGTERM while a script of ``experiments/`` starts (the imports of JAX and the
    package and its argument checks, the first seconds) ends it with one line, ``SCRIPT:
    interrupted while starting; nothing was written`` (or ``terminated (SIGTERM)``), status
    128 + the signal, at once: Python's default was a traceback from the import machinery,
    a silent death (SIGTERM), or a KeyboardInterrupt swallowed by an XLA callback and the
    whole run done anyway. Call it before the script's heavy imports, with ``is_program`` =
    ``__name__ == "__main__"`` (a test importing the script keeps its handlers).

    Returns:
      {signal: Python's default handler} for the signals taken over (none when not the
      program; a signal ignored at start, e.g. SIGINT of a background job, stays ignored):
      the script restores them before :func:`_guard_interrupts`, which takes over default
      handlers only.
    """
    def starting(signum, frame) -> None:
        os.write(2, f"{script}: {_STOPPED[signum]} while starting; nothing was written\n"
                 .encode())
        os._exit(128 + signum)

    taken = {sig: default for sig, default in ((signal.SIGINT, signal.default_int_handler),
                                               (signal.SIGTERM, signal.SIG_DFL))
             if is_program and signal.getsignal(sig) is default}
    for sig in taken:
        signal.signal(sig, starting)
    return taken


def _interrupted(run: dict) -> None:
    """Ctrl-C or SIGTERM: one line, exit status 128 + the signal number (130, 143), at once.

    A --json report the job left saying the fine-tuning is running is marked interrupted,
    one that holds no result yet is removed (:func:`ntk_tt.prediction._report_file.settle`); the
    line names a report that keeps the prediction. A prediction no report keeps (no --json,
    or none written yet) is printed to stdout first, from ``run["prediction"]``: the text
    ``predict`` formatted as soon as the prediction existed, so that nothing is computed
    here. ``os._exit`` skips the interpreter's teardown, where JAX / orbax threads
    interrupted mid-work can crash (segmentation fault) or print tracebacks. Called by the
    main thread (``KeyboardInterrupt``, or the signal handler before the work starts) or by
    the watcher of :func:`_guard_interrupts`, whichever comes first; the other one waits for
    the exit.
    """
    signum = run.get("signal", signal.SIGINT)

    def line() -> str:
        # imported if a report was written
        report_file = sys.modules.get("ntk_tt.prediction._report_file")
        kept = run.get("json_path") if report_file and run.get("json_path") else None
        note = (f" (the prediction is kept in {kept})"
                if kept and report_file.settle(Path(kept).expanduser()) else "")
        if run.get("progress") and sys.stderr.isatty():  # the progress bar's line
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
        if run.get("prediction") and not note:  # the prediction, kept in no report
            sys.stdout.write(f"{run['prediction']}\n")
        return f"ntk-tt: {_STOPPED[signum]}{note}"

    exit_once(signum, line)


def exit_once(signum: int, line) -> None:
    """End the process at once, status 128 + ``signum``, after ``line()`` (a callable, so what
    it settles or prints happens once) on stderr, stdout flushed first. The main thread and
    the watcher of :func:`_guard_interrupts` may both call it; the second waits
    (:data:`_EXITING`). ``os._exit`` skips the interpreter's teardown, where JAX / orbax
    threads interrupted mid-work can crash (segmentation fault) or print tracebacks. Used by
    ``ntk-tt`` and the scripts of ``experiments/``."""
    if not _EXITING.acquire(blocking=False):
        threading.Event().wait()  # the other caller is exiting the process
    try:
        text = line()
        sys.stdout.flush()
        sys.stderr.write(f"{text}\n")
        sys.stderr.flush()
    finally:
        try:
            os._exit(128 + signum)
        finally:  # reached only where a test patches os._exit
            _EXITING.release()


def _guard_interrupts(run: dict, stop=None, started=None) -> None:
    """Make Ctrl-C and SIGTERM end the program with one line, whatever it is doing.

    ``stop(run)`` ends the process (default :func:`_interrupted`; it must hold
    :data:`_EXITING` while it exits) and ``started(run)`` says whether the work has started
    (default ``run["working"]``): ``experiments/sweep.py`` passes its own.

    ``run`` says what an interruption needs: ``working`` (set once the imports are done and
    the job starts), ``json_path``, ``progress``, ``prediction`` (``predict``'s text of the
    prediction, once it exists); the handler adds ``signal``. Before the work (arguments,
    checks, the imports of numpy, matplotlib and JAX) the handler exits at once: nothing is
    written yet, and a ``KeyboardInterrupt`` inside an import surfaces as an ``ImportError``
    or a traceback. During the work it raises ``KeyboardInterrupt``, so the job records the
    interruption in its JSON report. Python runs the handler only
    between bytecodes of the main thread: not during a long XLA compilation, and a
    ``KeyboardInterrupt`` raised inside a garbage-collection or ``__del__`` callback is
    printed ("Exception ignored in ...") and dropped, so the run went on. The C-level
    handler also writes the signal number to a wake-up pipe at once; a watcher thread reads
    it, gives the main thread's own path :data:`GRACE_S` seconds, then exits itself. Dropped
    ``KeyboardInterrupt`` reports are silenced (the watcher ends the run). A signal ignored
    when the program starts (e.g. SIGINT of a job started in the background) stays ignored.
    """
    handled = [sig for sig, default in ((signal.SIGINT, signal.default_int_handler),
                                        (signal.SIGTERM, signal.SIG_DFL))
               if signal.getsignal(sig) is default]
    if not handled:
        return
    stop = stop or _interrupted
    started = started or (lambda r: r.get("working"))

    def handler(signum, frame):
        if _EXITING.locked():  # a second Ctrl-C while exiting: the exit goes on
            return
        run.setdefault("signal", signum)
        if not started(run):
            stop(run)
        raise KeyboardInterrupt

    for sig in handled:
        signal.signal(sig, handler)
    read, write = os.pipe()
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write)
    previous = sys.unraisablehook

    def hook(unraisable):
        if not issubclass(unraisable.exc_type, KeyboardInterrupt):
            previous(unraisable)

    sys.unraisablehook = hook

    def watch():
        while (signum := os.read(read, 1)[0]) not in handled:
            pass
        run.setdefault("signal", signum)
        time.sleep(GRACE_S)
        stop(run)

    threading.Thread(target=watch, name="ntk-tt-interrupt", daemon=True).start()


def _caused_by_interrupt(err: BaseException) -> bool:
    """Whether a KeyboardInterrupt is in the cause/context chain of ``err``."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


def main(argv: list[str] | None = None) -> int:
    """Console entry point; with no arguments runs ``predict --verify`` on the defaults.

    Exit status: 0 done, 2 bad input (one ``ntk-tt: error: ...`` line on stderr), 130
    interrupted (Ctrl-C: one ``ntk-tt: interrupted`` line; a --json report that holds the
    prediction is kept and the line says so; a ``predict`` interrupted after its prediction
    (during the --verify fine-tuning or the timing of real steps) with no such report
    prints the prediction's table to stdout before that line), 143 terminated (SIGTERM, as
    Ctrl-C). As the program (``argv`` None), the signals are handled from the start of
    ``main``, before any import beyond the standard library, and end the run within
    :data:`GRACE_S` seconds even during a compilation (:func:`_guard_interrupts`).
    """
    run: dict = {}
    if argv is None:  # the ntk-tt process itself (not a call from Python)
        _guard_interrupts(run)
    try:
        return _main(sys.argv[1:] if argv is None else argv, run)
    except KeyboardInterrupt:
        _interrupted(run)
    except ImportError as err:  # Ctrl-C while numpy/jax import: numpy re-raises it this way
        if not _caused_by_interrupt(err):
            raise
        _interrupted(run)


def _main(argv: list[str], run: dict) -> int:
    from ntk_tt import _cli_parser  # numpy: after the signal handling is in place

    if argv[:1] == ["--"]:  # POSIX: "--" ends options, and there are none before the command
        argv = argv[1:]
    args, parser = _cli_parser.parse(argv or ["predict", "--verify"])
    from ntk_tt._cli_commands import _outcome, _predict, _suggest

    if args.command == "outcome":
        return _outcome(args, parser)
    if args.command == "suggest":
        return _suggest(args, parser, run)
    if args.command != "predict":
        parser.error("choose a command: predict, suggest or outcome")
    return _predict(args, parser, run)


if __name__ == "__main__":
    sys.exit(main())
