"""CuPy's stock pool as pgmo uses it: what lies outside every plan, within pgmo's limit.

The stock pool serves requests between ``interrupt()`` and ``resume()`` and
from another thread, device or stream (:mod:`.memory` lists the sources); the
limit it is given is what pgmo's own memory leaves (rule 5), a refused
request makes room once (rule 6), and its idle memory serves a request before
new memory is taken.  Part of :class:`~.memory.DeviceMemory` (a mixin over
:class:`~.accounts.MemoryAccounts`).  Tested in ``tests/test_pool.py`` and
``tests/test_engine_threads.py``.
"""

from __future__ import annotations

from .accounts import MemoryAccounts
from .options import Buffer

__all__ = ["StockUse"]


class StockUse(MemoryAccounts):
    """The stock pool's blocks, within the limit (see the module's docstring)."""

    def reuse(self, rs: int) -> Buffer | None:
        """A block of the stock pool's idle memory, if it holds ``rs`` bytes without growing.

        Idle memory is used before new memory is taken: a chunk the stock pool
        could not give back (split by a block still alive there) serves a
        request of its own instead of sitting beside it.
        """
        stock = self.stock
        if not stock.n_free_blocks() or stock.free_bytes() < rs:
            return None
        limit = stock.get_limit()
        stock.set_limit(size=max(1, stock.total_bytes()))  # no growth: cached memory only
        try:
            return stock.malloc(rs)
        except MemoryError:
            return None
        finally:
            stock.set_limit(size=limit)

    def from_stock(self, size: int, rs: int) -> Buffer:
        """A stock pool block within the limit, after making room if refused."""
        if self.limit:
            self.sync_stock_limit()
        try:
            return self.stock.malloc(size)
        except MemoryError:
            self.make_room()
            if self.limit:
                self.sync_stock_limit()
            try:
                return self.stock.malloc(size)
            except MemoryError:
                raise self.oom_error(rs, self.total_bytes(), self.limit) from None

    def sync_stock_limit(self) -> None:
        """The stock pool may use what the limit leaves after pgmo's own memory."""
        if self.limit == 0:
            self.stock.set_limit(size=0)
        else:
            own = self.total_bytes() - self.stock.total_bytes()
            self.stock.set_limit(size=max(1, self.limit - own))
