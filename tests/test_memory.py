"""pgmo.engine.memory: what the pool obtains and releases, and what it says about it.

Mostly exercised through whole runs elsewhere (test_footprint, test_variable_workloads,
test_cuda_device); here, the rules that a run does not show by its bytes alone.
"""

from __future__ import annotations

import logging

import pytest

import pgmo
from pgmo.testing import Checker, host_device_of, host_engine

MiB = 1 << 20
SIZES = [8 * MiB, 6 * MiB, 4 * MiB, 8 * MiB]


def run(engine, checker, iterations: int, scale: int = 1) -> None:
    for _ in range(iterations):
        with engine.iteration():
            live = [checker.alloc(engine, s * scale) for s in SIZES]
            while live:
                assert checker.free(live.pop())


@pytest.mark.parametrize("vmm", [True, False], ids=["reserved range", "cudaMalloc"])
def test_an_arena_the_device_refuses_is_logged_once_not_at_every_boundary(vmm, caplog):
    """A plan whose arena the device cannot hold (a saved one, made for a larger batch) is
    tried again at every boundary while the pool goes on with the plan it has; the warning
    comes once, when the trouble starts (a 150-iteration run once logged it twice per
    boundary), and the trouble is in ``stats().device_reasons`` while it lasts."""
    engine = host_engine(capacity=64 * MiB, vmm=vmm)
    checker = Checker(host=True, device=host_device_of(engine), write="ends")
    run(engine, checker, 3)  # warm-up, profiling, the plan: an arena of 26 MiB
    larger = pgmo.Trace.from_tuples([(k, k, k + 5, 4 * s) for k, s in enumerate(SIZES)])
    caplog.set_level(logging.WARNING, logger="pgmo.pool")
    engine.adopt(larger, pgmo.Plan(larger, pgmo.solve(larger, method="bestfit").offsets))
    run(engine, checker, 40)  # the old plan serves; the larger one is refused at each boundary
    refused = [r.getMessage() for r in caplog.records if "cannot" in r.getMessage()]
    assert len(refused) == 1, refused
    assert "arena refused" in engine.stats().device_reasons
    assert engine.stats().planned_requests > 0
    assert checker.corrupted == 0 and checker.overlaps == 0


def test_arena_kind_says_what_holds_the_arena_now():
    engine = host_engine()
    assert engine.stats().arena_kind == "none"  # nothing mapped yet
    checker = Checker(host=True, device=host_device_of(engine), write="ends")
    run(engine, checker, 3)
    assert engine.stats().arena_kind == "reserved range"
    engine.free_all_blocks()  # between iterations: the idle arena goes back
    assert engine.stats().arena_bytes == 0
