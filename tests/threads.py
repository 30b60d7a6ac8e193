"""Helper threads whose failures fail the test: an exception is re-raised by ``join()``.

Pytest only warns about an exception in a thread (setup.cfg makes that
warning an error, but blames whichever test is running when it fires); a
:class:`CheckedThread` hands it to the test that joins it, at the join.
"""

from __future__ import annotations

import threading

__all__ = ["CheckedThread"]


class CheckedThread(threading.Thread):
    """A ``threading.Thread`` whose exception (an assertion, say) is raised again by ``join``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            super().run()
        except BaseException as exc:
            self.failure = exc
            raise  # also reported by threading.excepthook, should no one join

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self.is_alive():
            raise AssertionError(f"thread {self.name} still runs after {timeout} s")
        if self.failure is not None:
            raise AssertionError(f"thread {self.name} failed") from self.failure
