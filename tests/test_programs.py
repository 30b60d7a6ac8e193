"""What every pgmo program does alike (:mod:`pgmo.programs`), in-process.

The programs themselves are held to it by ``tests/test_politeness.py``.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pgmo import programs


# ------------------------------------------------------------------ names
def test_the_closest_name_is_the_one_containing_the_word_else_the_nearest_spelling():
    names = ["synthetic-resnet50-infer-b1", "synthetic-resnet50-train-b32",
             "h100-alexnet-infer-b1"]
    assert programs.candidates("resnet50", names) == ["synthetic-resnet50-infer-b1",
                                                      "synthetic-resnet50-train-b32"]
    assert programs.closest("alexnet", names) == "h100-alexnet-infer-b1"
    assert programs.closest("resnt50-train", names) == "synthetic-resnet50-train-b32"
    assert programs.closest("bert", names) is None


def test_an_unknown_name_says_the_closest_and_where_all_are_listed():
    names = ["sync/best", "sync/bestfit", "bestfit"]
    error = programs.unknown_name("mode", "sync/bst", names, "--help")
    assert str(error) == "no mode 'sync/bst'; did you mean 'sync/best'? (--help lists all 3)"
    error = programs.unknown_name("mode", "zzz", names)
    assert str(error) == "no mode 'zzz'; choose from sync/best, sync/bestfit, bestfit"
    assert isinstance(error, ValueError)


# ------------------------------------------------------------------ argparse
def _parser() -> programs.ArgumentParser:
    parser = programs.ArgumentParser(prog="prog", description="First line.\n\n  kept as is")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--time-limit", type=float, default=2.0, help="seconds")
    parser.add_argument("--method", default="best", choices=("bestfit", "best", "exact"),
                        help="solver (default: the pool's)")
    parser.add_argument("--modes", nargs="+", default=["a, b", "c"], help="modes")
    parser.add_argument("--out", default=None, help="a file")
    parser.add_argument("--verbose", action="store_true", help="say more")
    group = parser.add_argument_group("more")
    group.add_argument("--repeat", type=int, default=3)
    return parser


def test_help_shows_every_default_once_and_keeps_the_description(capsys):
    text = " ".join(_parser().format_help().split())
    assert "--iterations ITERATIONS default: 20" in text  # an option without help
    assert "--time-limit TIME_LIMIT seconds (default: 2.0)" in text
    assert "solver (default: the pool's)" in text and "(default: best)" not in text
    assert "--modes MODES [MODES ...] modes (default: a, b c)" in text
    assert "--repeat REPEAT default: 3" in text  # in a group too
    assert "a file (default" not in text and "say more (default" not in text
    assert "First line.\n\n  kept as is" in _parser().format_help()


def test_a_mistyped_option_or_choice_is_answered_with_the_closest(capsys):
    with pytest.raises(SystemExit) as stop:
        _parser().parse_args(["--time-limt", "2"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == \
        "prog: error: unrecognized arguments: --time-limt 2; did you mean --time-limit?"
    with pytest.raises(SystemExit):
        _parser().parse_args(["--method", "besst"])
    assert capsys.readouterr().err.splitlines()[-1] == (
        "prog: error: argument --method: invalid choice: 'besst'; did you mean 'best'? "
        "(choose from 'bestfit', 'best', 'exact')")


def test_a_mistake_after_a_subcommand_is_that_subcommands(capsys):
    parser = programs.ArgumentParser(prog="tool")
    sub = parser.add_subparsers(dest="command", required=True)
    solve = sub.add_parser("solve")
    solve.add_argument("--time-limit", type=float, default=1.0)
    assert parser.parse_args(["solve", "--time-limit", "3"]).time_limit == 3.0
    assert not hasattr(parser.parse_args(["solve"]), programs.ArgumentParser._PARSER)
    with pytest.raises(SystemExit):
        parser.parse_args(["solve", "--time-limt", "2"])
    err = capsys.readouterr().err
    assert err.splitlines() == ["tool solve: error: unrecognized arguments: --time-limt 2; "
                                "did you mean --time-limit?"]  # one line: no usage block


def test_paths_are_checked_before_anything_runs(tmp_path):
    (tmp_path / "f.txt").write_text("x")
    assert programs.existing_path("file")(str(tmp_path / "f.txt")) == tmp_path / "f.txt"
    with pytest.raises(argparse.ArgumentTypeError, match="no such folder: /nonexistent"):
        programs.existing_path("folder")("/nonexistent")
    with pytest.raises(argparse.ArgumentTypeError, match="is not a folder"):
        programs.existing_path("folder")(str(tmp_path / "f.txt"))
    assert programs.output_file(str(tmp_path / "new.png")) == tmp_path / "new.png"
    with pytest.raises(argparse.ArgumentTypeError,
                       match="cannot write /nonexistent/dir/p.png: no folder /nonexistent/dir "
                             r"\(make it first\)"):
        programs.output_file("/nonexistent/dir/p.png")
    with pytest.raises(argparse.ArgumentTypeError, match="is a folder; give a file name"):
        programs.output_file(str(tmp_path))
    assert programs.output_folder(str(tmp_path / "new")) == tmp_path / "new"  # made later
    with pytest.raises(argparse.ArgumentTypeError, match="no folder /nonexistent"):
        programs.output_folder("/nonexistent/new")
    assert not (tmp_path / "new").exists()


# ------------------------------------------------------------------ run
def test_a_mistake_is_one_line_and_exit_status_2(capsys, monkeypatch):
    monkeypatch.delenv("PGMO_DEBUG", raising=False)

    def main():
        raise programs.UsageError("no workload 'x'")

    assert programs.run(main, name="prog") == 2
    assert capsys.readouterr().err == "prog: error: no workload 'x'\n"
    assert programs.run(lambda: open("/nonexistent/file"), name="prog") == 2
    assert "No such file or directory: '/nonexistent/file'" in capsys.readouterr().err

    def bug():
        raise ZeroDivisionError("a bug is not a mistake")

    with pytest.raises(ZeroDivisionError):  # a bug keeps its traceback
        programs.run(bug, name="prog")


def test_an_optional_package_not_installed_is_one_line_naming_it(capsys, monkeypatch):
    """A CuPy-only program where CuPy is not installed: which package, what installs it."""
    monkeypatch.delenv("PGMO_DEBUG", raising=False)

    def needs(module):
        def main():
            raise ModuleNotFoundError(f"No module named '{module}'", name=module)
        return main

    assert programs.run(needs("cupy.cuda.memory"), name="prog") == 2
    assert capsys.readouterr().err == ("prog: error: needs CuPy (pip install 'pgmo[cuda13]', "
                                       "or cuda12), which is not installed\n")
    assert programs.run(needs("chainer"), name="prog") == 2
    assert "needs Chainer" in capsys.readouterr().err
    with pytest.raises(ModuleNotFoundError):  # pgmo's own module missing is a bug
        programs.run(needs("pgmo.nowhere"), name="prog")


def test_an_import_error_pgmo_raises_for_a_missing_package_is_its_own_line(capsys, monkeypatch):
    """``pgmo.chainer``'s "needs Chainer 7.8.1; install it with ..." where Chainer is missing:
    that line, exit status 2; an ImportError of something else stays a traceback (a bug)."""
    monkeypatch.delenv("PGMO_DEBUG", raising=False)

    def main():
        try:
            raise ModuleNotFoundError("No module named 'chainer'", name="chainer")
        except ImportError as error:
            raise ImportError("pgmo.chainer needs Chainer 7.8.1; install it with\n"
                              "  pip install 'pgmo[chainer]'") from error

    assert programs.run(main, name="prog") == 2
    assert capsys.readouterr().err == ("prog: error: pgmo.chainer needs Chainer 7.8.1; "
                                       "install it with pip install 'pgmo[chainer]'\n")

    def broken():
        try:
            raise ModuleNotFoundError("No module named 'pgmo.nowhere'", name="pgmo.nowhere")
        except ImportError as error:
            raise ImportError("cannot start") from error

    with pytest.raises(ImportError, match="cannot start"):
        programs.run(broken, name="prog")


# ------------------------------------------------------------------ numbers
def test_a_negative_count_or_time_is_refused_by_the_parser(capsys):
    parser = programs.ArgumentParser(prog="prog")
    parser.add_argument("--warmup", type=programs.non_negative_int, default=1)
    parser.add_argument("--time-limit", type=programs.non_negative_float, default=2.0)
    args = parser.parse_args(["--warmup", "0", "--time-limit", "0"])
    assert (args.warmup, args.time_limit) == (0, 0.0)
    for argv, said in ((["--warmup", "-1"], "argument --warmup: expects an integer >= 0, got '-1'"),
                       (["--warmup", "1.5"], "argument --warmup: expects an integer >= 0, got '1.5'"),
                       (["--time-limit", "-1"], "argument --time-limit: must be a number >= 0, "
                                                "got -1"),
                       (["--time-limit", "inf"], "argument --time-limit: must be a number >= 0, "
                                                 "got inf"),
                       (["--time-limit", "nan"], "argument --time-limit: must be a number >= 0, "
                                                 "got nan")):
        with pytest.raises(SystemExit) as stop:
            parser.parse_args(argv)
        assert stop.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1] == f"prog: error: {said}"


def test_ctrl_c_is_one_line_and_exit_status_130_also_when_cleanup_raises(capfd):
    def interrupted():
        raise KeyboardInterrupt

    def cleanup_fails():
        try:
            raise KeyboardInterrupt
        finally:
            [].pop()  # what an interrupted engine's cleanup once raised

    for main in (interrupted, cleanup_fails):
        assert programs.run(main, name="prog") == programs.INTERRUPTED
        out, err = capfd.readouterr()
        assert err == "prog: interrupted\n" and out == ""


def test_on_interrupt_runs_after_the_ctrl_c_line_and_only_then(capfd):
    """What an MPI job aborts its other ranks with: after this rank's one line."""
    said = []

    def interrupted():
        raise KeyboardInterrupt

    def abort():
        said.append(capfd.readouterr().err)

    assert programs.run(interrupted, name="prog", on_interrupt=abort) == programs.INTERRUPTED
    assert said == ["prog: interrupted\n"]
    assert programs.run(lambda: None, name="prog", on_interrupt=abort) == 0
    assert len(said) == 1


def test_a_closed_pipe_is_no_error(monkeypatch):
    def main():
        raise BrokenPipeError

    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO()))
    monkeypatch.setattr(sys.stdout, "fileno", lambda: 1 << 20)  # dup2 fails: still no error
    assert programs.run(main, name="prog") == programs.BROKEN_PIPE


def test_a_silent_program_says_it_is_still_working(capsys):
    with programs.Heartbeat("prog", seconds=0.2):
        time.sleep(0.7)  # silent
    silent = capsys.readouterr().err.splitlines()
    assert silent and all(line.startswith("prog: still working (") for line in silent)
    with programs.Heartbeat("prog", seconds=0.5):
        for _ in range(10):  # a line every 0.1 s: never silent for long
            print("working", flush=True)
            time.sleep(0.1)
    out, err = capsys.readouterr()
    assert out.count("working") == 10 and err == ""
    with programs.Heartbeat("prog", seconds=0.2):
        print("half a line", end="", flush=True)  # never cut a line in two
        time.sleep(0.7)
        print()
    assert "still working" not in capsys.readouterr().err


# ------------------------------------------------------------------ Ctrl-C, for real
SWALLOWING = """
import sys, time
from pgmo import programs
programs.start(__name__)
programs.UNWIND_SECONDS = {unwind}

class Slow:
    def __del__(self):
        print("ready", flush=True)
        time.sleep(30)  # a Ctrl-C here is raised in a destructor: Python drops it

def in_a_destructor():
    Slow()
    time.sleep(30)

def by_the_program():
    try:
        print("ready", flush=True)
        time.sleep(30)
    except KeyboardInterrupt:  # code that swallows it, and goes on
        time.sleep(30)

sys.exit(programs.run({main}))
"""


@pytest.mark.parametrize("main, unwind", [
    ("in_a_destructor", 60),  # raised again at once, where it stops the program
    ("by_the_program", 0.5),  # stopped after UNWIND_SECONDS
])
def test_a_swallowed_ctrl_c_still_stops_the_program_in_one_line(main, unwind, tmp_path):
    program = tmp_path / "swallow.py"
    program.write_text(SWALLOWING.format(main=main, unwind=unwind))
    child = subprocess.Popen([sys.executable, str(program)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True,
                             cwd=Path(__file__).resolve().parents[1])
    assert child.stdout.readline() == "ready\n"
    started = time.monotonic()
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=60)
    assert time.monotonic() - started < 5.0, main  # not the 30 s it would sleep on
    assert child.returncode == programs.INTERRUPTED
    assert out == "swallow.py: interrupted\n", out


CUT_LINE = """
import sys
from pgmo import programs
programs.start(__name__)

def main():
    print("iter 1", end="", flush=True)  # a Ctrl-C between a line's text and its end
    raise KeyboardInterrupt

sys.exit(programs.run(main))
"""


def test_a_line_ctrl_c_cut_is_ended_before_interrupted(tmp_path):
    """Ctrl-C inside a ``print`` (its text written, its newline not yet): the message is on
    a line of its own, not glued to the program's last line."""
    program = tmp_path / "cut.py"
    program.write_text(CUT_LINE)
    done = subprocess.run([sys.executable, str(program)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == programs.INTERRUPTED
    assert done.stdout == "iter 1\ncut.py: interrupted\n", done.stdout


REPORTING_LIBRARY = """
import sys, traceback
from pgmo import programs
programs.start(__name__)

def main():
    print("ready", flush=True)
    try:
        try:
            while True:
                pass
        finally:
            raise OSError(9, "Bad file descriptor")  # clean-up the Ctrl-C broke
    except Exception as e:  # what Chainer's trainer does with the loop's exception
        print("Exception in main training loop: {}".format(e), file=sys.stderr)
        print("Traceback (most recent call last):", file=sys.stderr)
        traceback.print_tb(sys.exc_info()[2])
        raise

sys.exit(programs.run(main))
"""


def test_a_librarys_report_of_what_ctrl_c_broke_is_not_printed(tmp_path):
    """Ctrl-C makes clean-up code raise something else, which a library reports on stderr
    with a traceback before re-raising: the user still sees one line."""
    program = tmp_path / "report.py"
    program.write_text(REPORTING_LIBRARY)
    child = subprocess.Popen([sys.executable, str(program)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True,
                             cwd=Path(__file__).resolve().parents[1])
    assert child.stdout.readline() == "ready\n"
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == programs.INTERRUPTED
    assert out == "report.py: interrupted\n", out
