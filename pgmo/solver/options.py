"""Solver options, declared once: the API, the command line and the pool all use them.

:class:`SolverOptions` is the single place where a default (method, time
limit, seed...) is written.  :func:`add_arguments` derives the command-line
flags from its fields, so a new option appears everywhere at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["SolverOptions", "METHODS", "BACKENDS", "add_arguments", "from_arguments",
           "solver_options"]

#: Packing methods, fastest first.
METHODS = ("bestfit", "best", "exact")
#: Exact solver backends (``auto``: CP-SAT when OR-Tools imports, else HiGHS).
BACKENDS = ("auto", "cpsat", "highs")


def _option(default: Any, help: str, choices: tuple[str, ...] | None = None,
            cli: bool = True) -> Any:
    return field(default=default, metadata={"help": help, "choices": choices, "cli": cli})


@dataclass(frozen=True)
class SolverOptions:
    """How to solve a packing; every field has a command-line flag of the same name."""

    method: str = _option(
        "best", "packing method: 'bestfit' is the paper's heuristic (milliseconds), 'best' "
        "searches for a lower peak within the time limit, 'exact' proves optimality on "
        "small traces (needs pgmo[exact])", METHODS)
    time_limit: float | None = _option(
        10.0, "seconds that 'best' and 'exact' may take ('none': no limit; 'best' then "
        "needs a budget)")
    budget: int | None = _option(
        None, "search steps that 'best' may take: a limit that gives the same plan on every "
        "machine ('none': only the time limit)")
    seed: int = _option(0, "seed of the randomised search: the same seed and budget give "
                           "the same plan")
    backend: str = _option("auto", "solver behind 'exact': CP-SAT (OR-Tools), HiGHS, or "
                                   "'auto' (the first installed)", BACKENDS)
    progress: bool = _option(False, "show a progress bar on long solves", cli=False)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose one of "
                             f"{', '.join(METHODS)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown exact backend {self.backend!r}; choose one of "
                             f"{', '.join(BACKENDS)}")
        if self.time_limit is not None and not (self.time_limit >= 0
                                                and math.isfinite(self.time_limit)):
            raise ValueError(f"time_limit must be a number of seconds >= 0 (or None for "
                             f"no limit), got {self.time_limit!r}")
        if self.budget is not None and (isinstance(self.budget, bool) or self.budget < 1):
            raise ValueError(f"budget must be a positive number of search steps (or None), "
                             f"got {self.budget!r}")
        if self.method == "best" and self.time_limit is None and self.budget is None:
            raise ValueError("method 'best' needs a time limit or a budget to stop")

    def replace(self, **changes: Any) -> "SolverOptions":
        return dataclasses.replace(self, **changes)


def solver_options(options: SolverOptions | None = None, **changes: Any) -> SolverOptions:
    """``options`` (default: the defaults) with ``changes``; unknown names are refused."""
    names = {f.name for f in dataclasses.fields(SolverOptions)}
    unknown = sorted(set(changes) - names)
    if unknown:
        raise TypeError(f"unknown solver option {unknown[0]!r}; the options are "
                        f"{', '.join(sorted(names))}")
    base = options if options is not None else SolverOptions()
    return dataclasses.replace(base, **changes) if changes else base


# --------------------------------------------------------------- command line
def _value_type(hint: Any) -> tuple[type, bool]:
    """(scalar type, whether None is allowed) from a field's type hint."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return hint, False


def _parser_for(kind: type, optional: bool, flag: str, name: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        if optional and text.strip().lower() in ("none", "no", "off"):
            return None
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{flag} expects {'an integer' if kind is int else 'a number'}"
                f"{' or none' if optional else ''}, got {text!r}") from None
        try:  # the option's own check, worded as the command line spells it
            SolverOptions(method="bestfit", **{name: value})
        except ValueError as exc:
            why = str(exc).removeprefix(f"{name} ").replace("None", "none")
            if not optional:  # the field takes none, this flag does not
                why = re.sub(r" \(or none[^)]*\)", "", why)
            raise argparse.ArgumentTypeError(f"{why.split(', got')[0]}, got {text!r}") from None
        return value
    parse.__name__ = kind.__name__
    return parse


def argument_type(name: str, optional: bool | None = None) -> Callable[[str], Any]:
    """The ``type=`` of option ``name``'s flag: parses it and checks it as the API does.

    ``optional=False`` refuses ``none`` where the field would take it.
    """
    kind, may_be_none = _value_type(typing.get_type_hints(SolverOptions)[name])
    allow = may_be_none if optional is None else optional and may_be_none
    return _parser_for(kind, allow, "--" + name.replace("_", "-"), name)


def add_arguments(parser: argparse.ArgumentParser, **defaults: Any) -> None:
    """Add one ``--flag`` per option field; ``defaults`` override the dataclass defaults."""
    hints = typing.get_type_hints(SolverOptions)
    for f in dataclasses.fields(SolverOptions):
        if not f.metadata.get("cli"):
            continue
        flag = "--" + f.name.replace("_", "-")
        default = defaults.get(f.name, f.default)
        kind, optional = _value_type(hints[f.name])
        shown = "none" if default is None else default
        kw: dict[str, Any] = {"dest": f.name, "default": default,
                              "help": f"{f.metadata['help']} (default: {shown})"}
        if f.metadata.get("choices"):
            kw["choices"] = f.metadata["choices"]
        else:
            kw["type"] = _parser_for(kind, optional, flag, f.name)
            kw["metavar"] = "N" if kind is int else "S"
        parser.add_argument(flag, **kw)


def from_arguments(args: argparse.Namespace, **extra: Any) -> SolverOptions:
    """The options named on the command line (``extra``: fields set by the program)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(SolverOptions)
              if f.metadata.get("cli") and hasattr(args, f.name)}
    return SolverOptions(**values, **extra)
