"""A thread that frees the blocks handed to it, later: frees from another thread, in tests."""

from __future__ import annotations

import queue
import threading

from .threads import CheckedThread


class LateFreer:
    """Checks and frees (drops) each handle put to it, on its own thread.

    ``checker.free`` runs under ``lock`` (the tests' shared bookkeeping), and
    the block is dropped under it too, so that whoever holds ``lock`` sees
    the checker's count of live bytes and the pool's agree (provided the
    caller also puts under ``lock``: until ``put`` returns, the caller holds
    a reference, and the block would be freed when it lets go, not here).  A corrupted
    block is noted in ``errors``.  ``wait()`` returns once every handle put
    so far is freed; ``stop()`` frees what is left and ends.  Both raise
    what went wrong on the thread (the first exception), so that a failure
    there fails the test.
    """

    def __init__(self, checker, lock: threading.Lock, errors: list):
        self.checker, self.lock, self.errors = checker, lock, errors
        self.handoff: queue.Queue = queue.Queue()
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self.thread = CheckedThread(target=self._run, daemon=True, name="late-freer")
        self.thread.start()

    def put(self, handle) -> None:
        self.handoff.put(handle)

    def wait(self) -> None:
        self.handoff.join()
        self._raise()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(60)
        self._raise()

    def _raise(self) -> None:
        if self.failure is not None:
            raise AssertionError("the freeing thread failed") from self.failure

    def _run(self) -> None:
        while not (self._stop.is_set() and self.handoff.empty()):
            try:
                handle = self.handoff.get(timeout=0.01)
            except queue.Empty:
                continue
            try:
                with self.lock:
                    if not self.checker.free(handle):
                        self.errors.append("corrupted")
                    del handle  # the block's last reference: freed now, under the lock
            except BaseException as exc:  # keep draining, so that wait() returns
                if self.failure is None:
                    self.failure = exc
            finally:
                self.handoff.task_done()
