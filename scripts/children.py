"""Start a program of this package as a child process, and read the result it prints.

The benchmarks run each configuration, and ``record_traces --isolate`` each
workload, in a fresh process, so that nothing one leaves on the device
reaches the next.  A child is started as ``python -m scripts.<program>``
with the repository root first on ``PYTHONPATH``, so that it finds this
package from any working folder (``bench_memory`` records DenseNet-BC from
inside its output folder).  A child that returns a result prints it as one
line of JSON after :data:`RESULT_TAG` (:func:`print_result`); the parent
finds it in the child's output (:func:`result_of`), whatever else was printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

from pgmo import programs

#: The repository root: the folder holding ``scripts/`` and ``pgmo/``.
ROOT = Path(__file__).resolve().parent.parent
#: Starts the line that carries a child's result.
RESULT_TAG = "BENCH-RESULT "


def command(program: str, *args) -> list[str]:
    """The command line that runs ``scripts.<program>`` with ``args`` in this Python."""
    return [sys.executable, "-m", f"scripts.{program}", *map(str, args)]


def environment(**variables: str) -> dict[str, str]:
    """This process's environment with the repository root on ``PYTHONPATH`` (first, unless
    it is there already), and ``variables`` set."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(ROOT) not in paths:
        paths.insert(0, str(ROOT))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths), **variables)


def print_result(result: dict) -> None:
    """Print a child's result where :func:`result_of` finds it."""
    print(RESULT_TAG + json.dumps(result), flush=True)


def result_of(stdout: str) -> dict | None:
    """The result a child printed (:func:`print_result`), or None if it printed none."""
    for line in stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    return None


@contextlib.contextmanager
def busy_core(busy: bool = True) -> Iterator[subprocess.Popen | None]:
    """While inside, another process (given) keeps one core busy (``busy``; else none, and
    None): a machine whose other work wants the CPU too, as a data loader's processes do."""
    if not busy:
        yield None
        return
    with programs.children_leave_ctrl_c_to_me():  # a Ctrl-C is the bench's to answer
        proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()
