"""A thread that frees the blocks handed to it, later: frees from another thread, in tests."""

from __future__ import annotations

import queue
import threading


class LateFreer:
    """Checks and frees (drops) each handle put to it, on its own thread.

    ``checker.free`` runs under ``lock`` (the tests' shared bookkeeping);
    a corrupted block is noted in ``errors``.  ``wait()`` returns once every
    handle put so far is freed; ``stop()`` frees what is left and ends.
    """

    def __init__(self, checker, lock: threading.Lock, errors: list):
        self.checker, self.lock, self.errors = checker, lock, errors
        self.handoff: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def put(self, handle) -> None:
        self.handoff.put(handle)

    def wait(self) -> None:
        self.handoff.join()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join()

    def _run(self) -> None:
        while not (self._stop.is_set() and self.handoff.empty()):
            try:
                handle = self.handoff.get(timeout=0.01)
            except queue.Empty:
                continue
            with self.lock:
                if not self.checker.free(handle):
                    self.errors.append("corrupted")
            del handle
            self.handoff.task_done()
