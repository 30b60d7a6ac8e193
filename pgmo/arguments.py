"""What a pgmo program's command line accepts, and how a mistake in it is answered.

``--help`` shows each option's default; a mistyped option, choice or name
gets the closest one ("did you mean ...?"), also after a subcommand; a
missing input, an output into a folder that does not exist, a negative
count or time (:func:`non_negative_int`, :func:`non_negative_float`) or an
unknown name is one line naming it (:class:`UsageError`, exit status 2 under
:func:`pgmo.programs.run`).  Programs import these through
:mod:`pgmo.programs`, which re-exports them.
"""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path
from typing import Any, Callable, Iterable, NoReturn, Sequence

from .units import MAX_DEVICE_BYTES

__all__ = ["ArgumentParser", "DefaultsHelpFormatter", "UsageError", "existing_path",
           "output_file", "output_folder", "candidates", "closest", "unknown_name",
           "integer", "byte_count", "non_negative_int", "non_negative_float",
           "picture_file", "PICTURE_SUFFIXES"]


class UsageError(ValueError):
    """A mistake of the user's (a name, a path, a value): one line, exit status 2."""


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
        """One line, ``<prog>: error: <message>``, and exit status 2: argparse's usage block
        above it is left out (``--help`` shows it), so that a mistake is answered in one
        line, as every failure of a program is."""
        self.exit(2, f"{self.prog}: error: {message}{self._hint(message)}\n")

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


# ----------------------------------------------------------------- numbers
def integer(low: int, high: int | None = None,
            what: str = "an integer") -> Callable[[str], int]:
    """An argparse ``type``: an integer from ``low`` to ``high`` (None: no top); the
    error says ``what`` is expected and the range."""
    span = f"from {low:,} to {high:,}" if high is not None else f">= {low:,}"

    def check(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expects {what} {span}, got {text!r}")
        return value

    check.__name__ = "int"
    return check


def byte_count(text: str) -> int:
    """An argparse ``type``: a positive number of bytes that a device can hold (at most
    :data:`pgmo.units.MAX_DEVICE_BYTES`, the bound every trace's sizes obey)."""
    return integer(1, MAX_DEVICE_BYTES, "a number of bytes (256 TiB at most)")(text)


#: An argparse ``type``: an integer 0 or more (a count of warm-up iterations).
non_negative_int = integer(0)


def non_negative_float(text: str) -> float:
    """An argparse ``type``: a finite number 0 or more (seconds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


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


#: The picture formats pgmo's plots are written in (matplotlib's Agg backend), by suffix.
PICTURE_SUFFIXES = (".png", ".pdf", ".svg", ".svgz", ".eps", ".ps", ".jpg", ".jpeg", ".tif",
                    ".tiff", ".webp", ".raw", ".rgba")


def picture_file(text: str) -> Path:
    """An argparse ``type``: a picture to write (:func:`output_file`), in a format the plots
    can be written in: checked before any work (no suffix: ``.png`` is added)."""
    path = output_file(text)
    if path.suffix and path.suffix.lower() not in PICTURE_SUFFIXES:
        raise argparse.ArgumentTypeError(
            f"cannot draw {text}: a picture ends in one of {', '.join(PICTURE_SUFFIXES)}")
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
