"""A failure on a helper thread fails the test: joined threads re-raise, and the suite's
configuration turns an unhandled thread exception (or one in a destructor) into an error."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .threads import CheckedThread

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_join_raises_what_failed_on_the_thread():
    def check():
        assert 1 + 1 == 3, "wrong on the thread"

    thread = CheckedThread(target=check)
    thread.start()
    with pytest.raises(AssertionError, match="failed") as info:
        thread.join(10)
    assert "wrong on the thread" in str(info.value.__cause__)


def test_join_says_when_the_thread_is_still_running():
    import threading

    release = threading.Event()
    thread = CheckedThread(target=release.wait)
    thread.start()
    with pytest.raises(AssertionError, match="still runs"):
        thread.join(0.01)
    release.set()
    thread.join(10)


def test_an_exception_in_a_thread_nobody_joins_or_in_a_destructor_fails_the_suite(tmp_path):
    test = tmp_path / "test_swallowed.py"
    test.write_text(textwrap.dedent("""
        import gc
        import threading

        def test_with_a_failing_helper():
            thread = threading.Thread(target=lambda: 1 / 0)
            thread.start()
            thread.join()

        class Block:
            def __del__(self):  # as a block's free would fail
                raise KeyError("freed twice")

        def test_with_a_failing_destructor():
            Block()
            gc.collect()
    """))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-c", str(ROOT / "setup.cfg"), "--rootdir", str(tmp_path), str(test)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "2 failed" in out.stdout, out.stdout
    assert "PytestUnhandledThreadExceptionWarning" in out.stdout
    assert "PytestUnraisableExceptionWarning" in out.stdout
