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
* a reader that goes away (``| head``): no traceback, exit status 141.

A program calls :func:`start` with its ``__name__`` before its heavy imports
and runs its ``main`` through :func:`run`::

    from pgmo import programs
    programs.start(__name__)
    ...
    if __name__ == "__main__":
        sys.exit(programs.run(main))
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NoReturn, Sequence, TextIO

__all__ = ["ArgumentParser", "DefaultsHelpFormatter", "UsageError", "start", "run",
           "children_leave_ctrl_c_to_me",
           "existing_path", "output_file", "output_folder", "candidates", "closest",
           "unknown_name",
           "HEARTBEAT_SECONDS", "INTERRUPTED", "BROKEN_PIPE"]

#: Exit status after Ctrl-C (128 + SIGINT), as shells report it.
INTERRUPTED = 130
#: Exit status when the reader of the output went away (128 + SIGPIPE).
BROKEN_PIPE = 141
#: Seconds of silence after which a program says it is still working.
HEARTBEAT_SECONDS = 5.0


class UsageError(ValueError):
    """A mistake of the user's (a name, a path, a value): one line, exit status 2."""


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


def _say_interrupted() -> None:
    if _Interrupt.said:
        return
    _Interrupt.said = True
    for stream in (sys.stdout, sys.stderr):
        try:
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
    """Answer Ctrl-C with one line from here on, when ``module_name`` is ``"__main__"``.

    Call it first thing in a program, with the module's ``__name__``: imported
    (by a test, or a ``spawn`` worker re-importing the main module) it does
    nothing.  ``name``: the program as the messages name it (default: the
    file the user started).
    """
    if module_name != "__main__" or threading.current_thread() is not threading.main_thread():
        return
    _Interrupt.name = name or program_name()
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
    """A text stream that notes when it was last written to (for :class:`Heartbeat`)."""

    def __init__(self, stream: TextIO, beat: Heartbeat):
        self._stream = stream
        self._beat = beat

    def write(self, text: str) -> int:
        with self._beat.lock:
            written = self._stream.write(text)
            if text:
                self._beat.wrote(text)
        return written

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

    def __init__(self, name: str, seconds: float = HEARTBEAT_SECONDS):
        self.name, self.seconds = name, seconds
        self.lock = threading.RLock()
        self.started = self.last = time.monotonic()
        self.at_line_start = True
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._streams: tuple[TextIO, TextIO] | None = None

    def wrote(self, text: str) -> None:
        self.last = time.monotonic()
        self.at_line_start = text.endswith("\n")

    def __enter__(self) -> Heartbeat:
        self._streams = (sys.stdout, sys.stderr)
        sys.stdout = _Watched(sys.stdout, self)
        sys.stderr = _Watched(sys.stderr, self)
        self._thread = threading.Thread(target=self._beat, name="pgmo-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._streams is not None:
            sys.stdout, sys.stderr = self._streams

    def _beat(self) -> None:
        while not self._stop.wait(min(1.0, self.seconds)):
            with self.lock:
                now = time.monotonic()
                if now - self.last < self.seconds or not self.at_line_start:
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
        heartbeat: float | None = HEARTBEAT_SECONDS) -> int:
    """Run a program's ``main()`` politely; returns its exit status (``sys.exit`` it).

    Ctrl-C: one line, :data:`INTERRUPTED` (also when the interruption made
    cleanup code raise something else, or was swallowed).  A :class:`UsageError`, a pgmo input
    error, a missing or unreadable file, or one of ``errors``: ``<program>:
    error: <message>`` and 2 (``PGMO_DEBUG=1``: the traceback instead).  A
    closed pipe: :data:`BROKEN_PIPE`.  ``heartbeat``: seconds of silence before
    a "still working" line (None: never); only for the process's own stderr.
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
        if heartbeat is not None and own_stderr:
            with Heartbeat(name, heartbeat):
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
            return INTERRUPTED
        if isinstance(exc, mistakes) and not os.environ.get("PGMO_DEBUG"):
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            print(f"{name}: error: {message}", file=sys.stderr)
            return 2
        raise
    finally:
        _Interrupt.inside_run = False
        if _Interrupt.watchdog is not None:
            _Interrupt.watchdog.cancel()
        if installed_here:
            signal.signal(signal.SIGINT, signal.default_int_handler)


# ----------------------------------------------------------------- names
def candidates(word: str, names: Iterable[str], most: int = 3) -> list[str]:
    """The names the user most likely meant by ``word``: those containing it (at most
    ``most``, nearest first), else the nearest by spelling, else none."""
    names = list(names)
    containing = [n for n in names if word and word.lower() in n.lower()]
    if containing:
        return sorted(containing, key=lambda n: -difflib.SequenceMatcher(None, word, n).ratio()
                      )[:most] if len(containing) <= most else []
    return difflib.get_close_matches(word, names, n=1, cutoff=0.5)


def closest(word: str, names: Iterable[str]) -> str | None:
    """The one name the user most likely meant by ``word`` (see :func:`candidates`)."""
    found = candidates(word, names)
    return found[0] if found else None


def _did_you_mean(found: Sequence[str]) -> str:
    return "; did you mean " + " or ".join(repr(n) for n in found) + "?" if found else ""


def unknown_name(what: str, word: str, names: Sequence[str], listed_by: str = "") -> UsageError:
    """The error for a name that is not one of ``names``: the closest ones, and where
    all are listed (``listed_by``), else all of them."""
    found = candidates(word, names)
    text = f"no {what} {word!r}{_did_you_mean(found)}"
    if listed_by:
        text += f" ({listed_by} lists all {len(names)})"
    elif not found:
        text += f"; choose from {', '.join(names)}"
    return UsageError(text)


# ----------------------------------------------------------------- argparse
def _shown(default: Any) -> str | None:
    """A default as ``--help`` shows it; None where there is none worth showing (None,
    a flag's False, nothing)."""
    if (default is None or default is argparse.SUPPRESS or isinstance(default, bool)
            or (isinstance(default, (list, tuple)) and not default)):
        return None
    if isinstance(default, (list, tuple)):
        return " ".join(str(d) for d in default)
    return str(default)


class DefaultsHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help that ends with ``(default: X)`` wherever an option has a default that its
    help does not already state; descriptions keep their line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        shown = _shown(action.default)
        if not action.option_strings or shown is None or "default" in text.lower():
            return action.help
        return f"{text} (default: {shown.replace('%', '%%')})"


class ArgumentParser(argparse.ArgumentParser):
    """argparse with defaults in ``--help`` and the closest option or choice suggested.

    A subcommand's parser (``add_subparsers().add_parser``) answers a mistake
    after the subcommand itself: ``pgmo solve t.csv --time-limt 2`` names
    ``--time-limit``, with ``pgmo solve``'s usage.
    """

    _PARSER = "_pgmo_subparser"

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def format_help(self) -> str:
        for action in self._actions:  # argparse shows nothing for an option without help
            shown = _shown(action.default)
            if action.help is None and action.option_strings and shown is not None:
                action.help = f"default: {shown.replace('%', '%%')}"
        return super().format_help()

    def add_subparsers(self, **kwargs: Any) -> Any:
        action = super().add_subparsers(**kwargs)
        add_parser = action.add_parser
        key = self._PARSER

        def add(name: str, **options: Any) -> ArgumentParser:
            parser = add_parser(name, **options)
            parser.set_defaults(**{key: parser})
            return parser

        action.add_parser = add  # type: ignore[method-assign]
        return action

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        sub = getattr(parsed, self._PARSER, None)
        if sub is not None and sub is not self:  # the outer parse, after a subcommand's
            delattr(parsed, self._PARSER)
            if extras:
                sub.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        hint = self._hint(message)
        super().error(message + hint)

    def _hint(self, message: str) -> str:
        """"did you mean ...?" for the first unknown option of an "unrecognized" message."""
        prefix = "unrecognized arguments: "
        if not message.startswith(prefix):
            return ""
        options = [o for action in self._actions for o in action.option_strings]
        for word in message[len(prefix):].split():
            if word.startswith("-"):
                guess = difflib.get_close_matches(word.split("=")[0], options, n=1, cutoff=0.6)
                if guess:
                    return f"; did you mean {guess[0]}?"
        return ""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = action.choices
        if choices is None or value in choices:
            return
        names = [str(c) for c in choices]
        listed = ", ".join(repr(c) for c in names)
        raise argparse.ArgumentError(action, f"invalid choice: {value!r}"
                                     f"{_did_you_mean(candidates(str(value), names))} "
                                     f"(choose from {listed})")


# ----------------------------------------------------------------- paths
def existing_path(kind: str = "file or folder") -> Callable[[str], Path]:
    """An argparse ``type``: a path that exists (``kind``: "file", "folder" or either)."""
    def check(text: str) -> Path:
        path = Path(text)
        if not path.exists():
            raise argparse.ArgumentTypeError(f"no such {kind}: {text}")
        if kind == "file" and path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
        if kind == "folder" and not path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} is not a folder")
        return path

    return check


def output_file(text: str) -> Path:
    """An argparse ``type``: a file to write, in a folder that exists (never made silently)."""
    path = Path(text)
    folder = path.parent
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file name")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: no folder {folder} "
                                         "(make it first)")
    return path


def output_folder(text: str) -> Path:
    """An argparse ``type``: a folder to write into; it may be new, its parent must exist."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    if not path.exists() and not path.resolve().parent.is_dir():
        raise argparse.ArgumentTypeError(f"cannot make {text}: no folder "
                                         f"{path.resolve().parent} (make it first)")
    return path
