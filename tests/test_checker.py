"""The replay checker, the oracle of every pool test: it must catch what it is meant to."""

from __future__ import annotations

import contextlib
import ctypes

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pgmo
from pgmo.engine.options import PlainMemory
from pgmo.measure.replay import Checker, replay
from pgmo.testing import HostMemory

from .strategies import MIB, request_sizes


class HostBlocks:
    """A pool that hands out plain host buffers (and keeps them) for the checker to check."""

    host_memory = True
    mode = "plain"

    def __init__(self):
        self.host_device = HostMemory()
        self.buffers = []

    def malloc(self, size: int):
        buffer = self.host_device(max(size, 1))
        self.buffers.append(buffer)
        return PlainMemory(buffer.ptr, size, None, 0)

    @contextlib.contextmanager
    def iteration(self):
        yield self

    def stats(self):
        return None


class ForgetfulPool(HostBlocks):
    """A broken pool: at the end of each iteration it gives back every block's memory,
    live or not."""

    @contextlib.contextmanager
    def iteration(self):
        yield self
        self.buffers.clear()


def poke(memptr, offset: int) -> None:
    """Change one byte of a block behind the checker's back."""
    byte = ctypes.c_uint8.from_address(memptr.ptr + offset)
    byte.value ^= 0xFF


@settings(max_examples=60, deadline=None)
@given(size=request_sizes(max_size=64 * MIB, zero=False), write=st.sampled_from(["all", "ends"]),
       where=st.sampled_from(["first", "last"]))
def test_a_byte_changed_at_either_end_of_any_block_is_caught(size, write, where):
    pool = HostBlocks()
    checker = Checker(host=True, device=pool.host_device, write=write)
    neighbour = checker.alloc(pool, 100)
    handle = checker.alloc(pool, size)
    poke(handle[0], 0 if where == "first" else size - 1)
    assert checker.free(handle) is False
    assert checker.free(neighbour) is True  # only the block that changed
    assert checker.corrupted == 1


@pytest.mark.parametrize("write, caught", [("all", True), ("ends", False), (False, False)])
def test_what_each_write_mode_covers_inside_a_block(write, caught):
    pool = HostBlocks()
    checker = Checker(host=True, device=pool.host_device, write=write)
    handle = checker.alloc(pool, 10_000)
    poke(handle[0], 5_000)
    assert checker.free(handle) is (not caught)


def test_an_unknown_write_mode_is_refused():
    with pytest.raises(ValueError, match="write must be one of"):
        Checker(host=True, write="middle")


def test_replay_catches_a_block_whose_memory_was_given_back_while_it_lived():
    trace = pgmo.Trace.from_rows([(0, 2, 4096), (1, None, 4096)])  # block 1 stays open
    res = replay([trace], ForgetfulPool())
    assert res["corrupted"] == 1  # the open block, checked after the iteration
    assert replay([trace], HostBlocks())["corrupted"] == 0


def test_the_checker_counts_live_bytes_rounded_on_its_own():
    pool = HostBlocks()
    checker = Checker(host=True, write="ends")
    handles = [checker.alloc(pool, size) for size in (0, 1, 512, 513, 3 * MIB + 7)]
    assert checker.live_bytes == 0 + 512 + 512 + 1024 + 3 * MIB + 512
    for handle in handles:
        assert checker.free(handle)
    assert checker.live_bytes == 0 and checker.peak_bytes == 3 * MIB + 2560


class ScribblingPool(HostBlocks):
    """A broken pool that writes a byte past the end it keeps for each block: into the last
    byte of the block it handed out before (no two blocks share an address)."""

    def malloc(self, size: int):
        memptr = super().malloc(size)
        if len(self.buffers) > 1 and self.last_size:
            poke(self.last, self.last_size - 1)
        self.last, self.last_size = memptr, size
        return memptr

    last_size = 0


def test_footprint_replays_catch_a_scribbled_block_by_default():
    """A block's bytes changed behind the pool's addresses are caught by the stamps that
    footprint.measure writes unless told not to."""
    from pgmo.measure import footprint
    from pgmo.runs import run_from_iteration

    run = run_from_iteration(pgmo.Trace.from_rows([(0, 3, 4096), (1, 2, 100_000)]), 2)
    caught = footprint.measure(run, ScribblingPool())
    assert not caught.completed and caught.corrupted > 0
    unseen = footprint.measure(run, ScribblingPool(), write=False)  # addresses alone
    assert unseen.completed and unseen.corrupted == 0
