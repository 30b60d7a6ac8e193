"""What every pgmo program does alike: the ``pgmo`` command, ``scripts/`` and ``examples/``.

A user of any of them may rely on this:

* ``--help`` shows each option's default (:class:`ArgumentParser`);
* a mistyped option, choice or name is answered with the closest one
  ("did you mean ...?"), also after a subcommand;
* a missing input (:func:`existing_path`), an output into a folder that does
  not exist (:func:`output_file`) or an unknown name (:func:`unknown_name`):
  one line naming it, exit status 2;
* Ctrl-C: one line, ``<program>: interrupted``, and exit status 130, from
  :func:`start` on (the program's first import) and while it cleans up; also
  where Python would drop the interruption (raised in a destructor), and
  within :data:`UNWIND_SECONDS` where the program's own code swallows it;
* a long silence: when nothing has been printed for :data:`HEARTBEAT_SECONDS`,
  a line on stderr saying the program is still working, so a log or a pipe
  never sits silent (a progress bar on a terminal prints often enough to
  keep it away);
* a reader that goes away (``| head``): no traceback, exit status 141;
* an optional package it needs that is not installed (CuPy, Chainer, MPI): one line
  saying which and what installs it, exit status 2, also where the program
  imports it before it runs (from :func:`start` on, or :func:`answer_missing_packages`);
* a program that needs a GPU, run where CuPy sees none: one line saying so
  and what was tried, exit status 2, before any work (``scripts/``:
  ``scripts.needs_gpu.require_gpu``, which raises :class:`UsageError`).

A program calls :func:`start` with its ``__name__`` before its heavy imports
and runs its ``main`` through :func:`run`; its command line is read with
:mod:`pgmo.arguments` (re-exported here, so ``programs`` is a program's one import)::

    from pgmo import programs
    programs.start(__name__)
    ...
    if __name__ == "__main__":
        sys.exit(programs.run(main))
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterable, Iterator, TextIO

from .arguments import (ArgumentParser, DefaultsHelpFormatter, UsageError, byte_count,
                        candidates, closest, existing_path, integer, non_negative_float,
                        non_negative_int, output_file, output_folder, picture_file,
                        unknown_name)

__all__ = ["ArgumentParser", "DefaultsHelpFormatter", "UsageError", "start", "run",
           "children_leave_ctrl_c_to_me", "answer_missing_packages", "missing_package",
           "existing_path", "output_file", "output_folder", "candidates",
           "closest", "unknown_name", "integer", "byte_count", "non_negative_int",
           "non_negative_float", "picture_file",
           "HEARTBEAT_SECONDS", "INTERRUPTED", "BROKEN_PIPE"]

#: Exit status after Ctrl-C (128 + SIGINT), as shells report it.
INTERRUPTED = 130
#: Exit status when the reader of the output went away (128 + SIGPIPE).
BROKEN_PIPE = 141
#: Seconds of silence after which a program says it is still working.
HEARTBEAT_SECONDS = 5.0


def program_name() -> str:
    """The program as the user started it: ``train_imagenet.py``, ``bench_footprint.py``."""
    return os.path.basename(sys.argv[0] or "") or "pgmo"


# ----------------------------------------------------------------- Ctrl-C
#: Seconds an interrupted program may take to unwind before it is stopped.
UNWIND_SECONDS = 5.0


class _Interrupt:
    """The state of Ctrl-C handling in this process (one per process)."""

    name = ""
    inside_run = False
    pressed = False
    again = False  # the KeyboardInterrupt was swallowed (in a destructor): raise it again
    said = False
    installed = False
    watchdog: threading.Timer | None = None
    beat: "Heartbeat | None" = None  # what run() watches: a line left open


def _say_interrupted() -> None:
    if _Interrupt.said:
        return
    _Interrupt.said = True
    beat = _Interrupt.beat
    for stream in (sys.stdout, sys.stderr):
        try:
            stream = getattr(stream, "_stream", stream)  # past the watch (it drops stderr)
            if beat is not None and beat.open_line is not None and stream is beat.open_line:
                stream.write("\n")  # a line the interruption cut (inside a print)
            stream.flush()
        except Exception:  # a closed or broken stream: nothing more to say there
            pass
    try:
        os.write(2, f"{_Interrupt.name or program_name()}: interrupted\n".encode())
    except OSError:
        pass


def _ignore(*args: Any) -> None:
    """What a thread raises while an interrupted program unwinds: noise."""


def _unraisable(unraisable: Any) -> None:
    """What a destructor raises while an interrupted program unwinds is noise, but the
    interruption itself, raised inside one (where Python drops it), is raised again."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _Interrupt.inside_run:
        _Interrupt.again = True  # from another thread: raised here, it would be dropped again
        main = threading.main_thread().ident
        assert main is not None
        later = threading.Timer(0.01, signal.pthread_kill, (main, signal.SIGINT))
        later.daemon = True
        later.start()


def _give_up() -> None:
    """The interrupted program did not stop in :data:`UNWIND_SECONDS`: stop it now."""
    if _Interrupt.inside_run:
        _say_interrupted()
        os._exit(INTERRUPTED)


def _on_sigint(signum: int, frame: Any) -> None:
    """Inside :func:`run`, the first Ctrl-C raises ``KeyboardInterrupt`` (cleanup runs, and
    what destructors and threads half-interrupted raise is not printed; if the program
    has not stopped after :data:`UNWIND_SECONDS`, it is stopped); before it (imports) or
    at a second Ctrl-C the program stops at once, saying so."""
    if _Interrupt.inside_run and (not _Interrupt.pressed or _Interrupt.again):
        if not _Interrupt.pressed:
            _Interrupt.pressed = True
            sys.unraisablehook = _unraisable
            threading.excepthook = _ignore
            _Interrupt.watchdog = threading.Timer(UNWIND_SECONDS, _give_up)
            _Interrupt.watchdog.daemon = True
            _Interrupt.watchdog.start()
        _Interrupt.again = False
        raise KeyboardInterrupt
    _say_interrupted()
    os._exit(INTERRUPTED)


def start(module_name: str = "__main__", name: str | None = None) -> None:
    """Answer Ctrl-C, and an optional package missing at an import, with one line from
    here on, when ``module_name`` is ``"__main__"``.

    Call it first thing in a program, with the module's ``__name__``: imported
    (by a test, or a ``spawn`` worker re-importing the main module) it does
    nothing.  ``name``: the program as the messages name it (default: the
    file the user started).
    """
    if module_name != "__main__" or threading.current_thread() is not threading.main_thread():
        return
    _Interrupt.name = name or program_name()
    answer_missing_packages()
    if not _Interrupt.installed and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)
        _Interrupt.installed = True


@contextlib.contextmanager
def children_leave_ctrl_c_to_me() -> Iterator[None]:
    """Child processes started inside ignore Ctrl-C (a worker pool, say): the terminal
    sends it to the whole process group, and this program alone answers it, in one
    line, stopping them itself."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _caused_by_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` came out of a Ctrl-C (raised while one was being handled)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return _Interrupt.pressed


def _quiet_stderr() -> None:
    """Nothing more on stderr: after "interrupted", what threads and destructors say while
    the interpreter shuts down is noise."""
    try:
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
    except (OSError, ValueError):
        pass


# ----------------------------------------------------------------- silence
class _Watched:
    """A text stream that notes when it was last written to (for :class:`Heartbeat`).

    Once Ctrl-C is pressed, what the program writes on stderr while it unwinds is
    dropped: a library's own report of the exception the interruption caused (Chainer's
    trainer prints "Exception in main training loop" and a traceback) is noise beside
    the one "interrupted" line.
    """

    def __init__(self, stream: TextIO, beat: Heartbeat, *, quiet_once_pressed: bool = False):
        self._stream = stream
        self._beat = beat
        self._quiet_once_pressed = quiet_once_pressed

    def write(self, text: str) -> int:
        beat = self._beat
        with beat.lock:
            if self._quiet_once_pressed and _Interrupt.pressed and _Interrupt.inside_run:
                return len(text)
            if not text:
                return self._stream.write(text)
            beat.last = time.monotonic()
            ends = text.endswith("\n")
            # Nothing Python checks for a signal at between the next two statements (a
            # Ctrl-C lands before both or after both): what the line will be once written,
            # then the write (unbuffered, the reader may see it before write returns).
            beat.open_line = None if ends else self._stream
            return self._stream.write(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class Heartbeat:
    """Says "still working" on stderr after each ``seconds`` of silence on stdout and stderr.

    Watches what the program writes through ``sys.stdout`` and ``sys.stderr``
    (wrapped while it runs); writes only at the start of a line.  Output that
    bypasses them (a child process's) is not seen: the line may then come
    although something was printed.
    """

    def __init__(self, name: str, seconds: float | None = HEARTBEAT_SECONDS):
        self.name, self.seconds = name, seconds  # None: watch only, never say anything
        self.lock = threading.RLock()
        self.started = self.last = time.monotonic()
        self.open_line: TextIO | None = None  # the stream whose last line has no end yet
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._streams: tuple[TextIO, TextIO] | None = None

    def __enter__(self) -> Heartbeat:
        self._streams = (sys.stdout, sys.stderr)
        sys.stdout = _Watched(sys.stdout, self)
        sys.stderr = _Watched(sys.stderr, self, quiet_once_pressed=True)
        if self.seconds is not None:
            self._thread = threading.Thread(target=self._beat, name="pgmo-heartbeat",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._streams is not None:
            sys.stdout, sys.stderr = self._streams

    def _beat(self) -> None:
        assert self.seconds is not None
        while not self._stop.wait(min(1.0, self.seconds)):
            with self.lock:
                now = time.monotonic()
                if now - self.last < self.seconds or self.open_line is not None:
                    continue
                assert self._streams is not None
                err = self._streams[1]
                try:
                    err.write(f"{self.name}: still working ({now - self.started:.0f} s)\n")
                    err.flush()
                except (OSError, ValueError):  # stderr closed: nobody to tell
                    return
                self.last = now


# ----------------------------------------------------------------- run
def run(main: Callable[[], int | None], *, name: str | None = None,
        errors: tuple[type[BaseException], ...] = (),
        heartbeat: float | None = HEARTBEAT_SECONDS,
        on_interrupt: Callable[[], None] | None = None) -> int:
    """Run a program's ``main()`` politely; returns its exit status (``sys.exit`` it).

    Ctrl-C: one line, :data:`INTERRUPTED` (also when the interruption made
    cleanup code raise something else, or was swallowed).  A :class:`UsageError`, a pgmo input
    error, a missing or unreadable file, or one of ``errors``: ``<program>:
    error: <message>`` and 2 (``PGMO_DEBUG=1``: the traceback instead).  A
    closed pipe: :data:`BROKEN_PIPE`.  ``heartbeat``: seconds of silence before
    a "still working" line (None: never); only for the process's own stderr.
    ``on_interrupt``: called after the Ctrl-C line (an MPI job aborts its other ranks
    there, which would otherwise wait for this one).
    """
    from .errors import PlanError, PlanFileError, TraceFormatError, UnknownTraceError

    name = name or _Interrupt.name or program_name()
    _Interrupt.name = name
    installed_here = False
    if (not _Interrupt.installed and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
        signal.signal(signal.SIGINT, _on_sigint)  # for this call only (a test calling it)
        installed_here = True
    mistakes = (UsageError, TraceFormatError, PlanError, PlanFileError, UnknownTraceError,
                FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError,
                *errors)
    own_stderr = sys.stderr is sys.__stderr__
    _Interrupt.inside_run, _Interrupt.pressed, _Interrupt.said = True, False, False
    try:
        if own_stderr:  # watched: a line Ctrl-C cuts is ended before "interrupted"
            _Interrupt.beat = Heartbeat(name, heartbeat)
            with _Interrupt.beat:
                code = main()
        else:
            code = main()
        return 0 if code is None else int(code)
    except SystemExit:
        raise
    except BrokenPipeError:  # `... | head`: the reader has gone, not an error
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return BROKEN_PIPE
    except BaseException as exc:
        if _caused_by_interrupt(exc):
            _say_interrupted()
            if own_stderr:
                _quiet_stderr()
            if on_interrupt is not None:
                on_interrupt()
            return INTERRUPTED
        if isinstance(exc, mistakes) and not os.environ.get("PGMO_DEBUG"):
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            print(f"{name}: error: {message}", file=sys.stderr)
            return 2
        missing = missing_package(exc)
        if missing is not None and not os.environ.get("PGMO_DEBUG"):
            print(f"{name}: error: {missing}", file=sys.stderr)
            return 2
        raise
    finally:
        _Interrupt.inside_run = False
        if _Interrupt.watchdog is not None:
            _Interrupt.watchdog.cancel()
        if installed_here:
            signal.signal(signal.SIGINT, signal.default_int_handler)


#: The optional packages a program may need: top-level module -> what installs it.
OPTIONAL = {"cupy": "CuPy (pip install 'pgmo[cuda13]', or cuda12)",
            "cupy_backends": "CuPy (pip install 'pgmo[cuda13]', or cuda12)",
            "chainer": "Chainer (the chainer extra, docs/install.rst)",
            "chainermn": "ChainerMN (the chainer and mpi extras)",
            "mpi4py": "MPI (pip install 'pgmo[mpi]')"}


def missing_package(exc: BaseException) -> str | None:
    """What a program needs that is not installed, when ``exc`` is an optional package's
    absence (a CuPy-only program without CuPy), as one line; else None.  An
    ``ImportError`` raised because of that absence (``pgmo.chainer``'s "needs
    Chainer 7.8.1; install it with ...") is its own message."""
    if not isinstance(exc, ImportError):
        return None
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        needed = OPTIONAL.get(exc.name.split(".")[0])
        return None if needed is None else f"needs {needed}, which is not installed"
    cause = exc.__cause__
    if isinstance(cause, ImportError) and missing_package(cause) is not None:
        return " ".join(str(exc).split())
    return None


def _excepthook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
    """An optional package missing at an import (before :func:`run`): one line, exit 2."""
    missing = missing_package(exc)
    if missing is None or os.environ.get("PGMO_DEBUG"):
        _previous_hook[0](kind, exc, tb)
        return
    with contextlib.suppress(OSError, ValueError):  # what it printed comes first
        sys.stdout.flush()
    with contextlib.suppress(OSError, ValueError):
        print(f"{_Interrupt.name or program_name()}: error: {missing}", file=sys.stderr)
        sys.stderr.flush()
    os._exit(2)  # the status Python would give (1) is no mistake's


def answer_missing_packages() -> None:
    """From here on an optional package missing at an import that nobody catches (the
    program's own, before :func:`run`) is one line, ``<program>: error: needs ...``,
    and exit status 2 (``PGMO_DEBUG=1``: the traceback).  :func:`start` calls it."""
    if sys.excepthook is not _excepthook:
        _previous_hook[0] = sys.excepthook
        sys.excepthook = _excepthook


_previous_hook = [sys.excepthook]  # what answers every other uncaught exception
