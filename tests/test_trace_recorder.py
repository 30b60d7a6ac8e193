"""``pgmo.TraceRecorder``: a CuPy memory hook that records a live program into a trace.

Driven two ways, both without a GPU: through pgmo's pool on host memory
(which calls CuPy's memory hooks as CuPy's pool does), and by calling the
hook points directly with the keywords CuPy passes.
"""

from __future__ import annotations

import pytest

cupy = pytest.importorskip("cupy")

import pgmo  # noqa: E402
from pgmo.measure.hosts import host_pool  # noqa: E402
from pgmo.trace_recorder import TraceRecorder  # noqa: E402


def rows(trace):
    return [(b.lower, b.upper, b.size) for b in trace.blocks]


def report(trace):
    return trace.metadata["import"]


def malloc(rec, ptr, size, pmem=None, device=0):
    rec.malloc_preprocess(device_id=device, size=size, mem_size=-(-size // 512) * 512)
    rec.malloc_postprocess(device_id=device, size=size, mem_size=-(-size // 512) * 512,
                           mem_ptr=ptr, pmem_id=pmem if pmem is not None else ptr + 1)


def free(rec, ptr, size, pmem=None, device=0):
    kw = dict(device_id=device, mem_size=-(-size // 512) * 512, mem_ptr=ptr,
              pmem_id=pmem if pmem is not None else ptr + 1)
    rec.free_preprocess(**kw)
    rec.free_postprocess(**kw)


def test_records_a_pools_requests_around_one_iteration():
    pool = host_pool()
    with TraceRecorder() as rec:
        a = pool.malloc(1000)
        b = pool.malloc(2000)
        del a
        c = pool.malloc(1000)  # may reuse a's address: a new block all the same
        empty = pool.malloc(0)
        del b
    trace = rec.trace()
    assert rows(trace) == [(0, 2, 1000), (1, 4, 2000), (3, None, 1000)]
    assert report(trace)["zero_size_requests"] == 1
    assert report(trace)["live_at_end"] == {"count": 1, "bytes": 1000}
    assert trace.metadata["recorded_by"] == "pgmo.TraceRecorder"
    del c, empty


def test_the_hook_is_registered_only_inside_the_with_block():
    pool = host_pool()
    rec = TraceRecorder()
    with rec:
        assert cupy.cuda.memory_hook.get_memory_hooks()[rec.name] is rec
        keep = pool.malloc(512)
    after = pool.malloc(512)
    assert rec.name not in cupy.cuda.memory_hook.get_memory_hooks()
    assert len(rec.trace()) == 1
    with rec:  # a new recording
        pass
    assert len(rec.trace()) == 0
    del keep, after


def test_pointer_reuse_and_frees_of_earlier_memory():
    rec = TraceRecorder()
    free(rec, 0x9000, 4096)  # allocated before recording
    for _ in range(2):
        malloc(rec, 0x1000, 100)
        free(rec, 0x1000, 100)
    trace = rec.trace()
    assert rows(trace) == [(0, 1, 4096), (2, 3, 100), (4, 5, 100)]
    assert report(trace)["before_freed"] == {"count": 1, "bytes": 4096}


def test_a_free_that_was_not_heard_ends_where_the_address_is_reused():
    rec = TraceRecorder()
    malloc(rec, 0x1000, 100, pmem=1)
    malloc(rec, 0x1000, 300, pmem=2)  # the first one's free happened in another thread
    free(rec, 0x1000, 300, pmem=2)
    trace = rec.trace()
    assert rows(trace) == [(0, 1, 100), (2, 3, 300)]
    assert report(trace)["frees_not_heard"] == 1


def test_a_free_of_other_pooled_memory_at_a_live_address_does_not_end_the_block():
    rec = TraceRecorder()
    malloc(rec, 0x1000, 100, pmem=1)
    free(rec, 0x1000, 100, pmem=7)
    assert rows(rec.trace()) == [(0, None, 100)]


def test_failed_requests_are_counted_and_devices_kept_apart():
    rec = TraceRecorder()
    malloc(rec, 0, 1 << 40, pmem=0)  # CuPy reports pointer 0 when malloc fails
    malloc(rec, 0x1000, 8, device=1)
    malloc(rec, 0x2000, 16, device=1)
    free(rec, 0x2000, 16, device=1)
    malloc(rec, 0x1000, 32, device=0)
    assert [b.size for b in rec.trace().blocks] == [8, 16]  # device 1: the most events
    zero = rec.trace(device=0)
    assert [b.size for b in zero.blocks] == [32]
    assert report(zero)["failed_requests"] == {"count": 1, "bytes": 1 << 40}


class FakePool:
    """What TraceRecorder asks of a pool: the bytes it holds."""

    held = 1 << 20

    def total_bytes(self):
        return self.held


def test_with_its_pool_the_trace_records_what_the_pool_reserved():
    pool = FakePool()
    with TraceRecorder(pool=pool) as rec:
        rec.alloc_postprocess(device_id=0, mem_size=4096, mem_ptr=0x5000)
        pool.held += 4096
        rec.alloc_postprocess(device_id=0, mem_size=8192, mem_ptr=0)  # failed
        malloc(rec, 0x5000, 4000)
    trace = rec.trace()
    assert trace.metadata["reserved_peak"] == (1 << 20) + 4096
    assert "reserved_note" not in trace.metadata  # nothing was given back
    assert pgmo.analyze(trace, method="bestfit").reserved == (1 << 20) + 4096


def test_memory_given_back_while_recording_makes_the_reservation_an_upper_bound():
    pool = FakePool()
    with TraceRecorder(pool=pool) as rec:
        rec.alloc_postprocess(device_id=0, mem_size=4096, mem_ptr=0x5000)
        malloc(rec, 0x5000, 4000)
        pool.held = 4096  # free_all_blocks() on an out-of-memory retry: not heard by hooks
    trace = rec.trace()
    assert trace.metadata["reserved_peak"] == (1 << 20) + 4096
    notes = pgmo.analyze(trace, method="bestfit").notes
    assert any("gave memory back while recording" in n and "upper bound" in n for n in notes)


def test_a_saved_recording_is_analysed_from_its_file(tmp_path, capsys):
    from pgmo.cli import main

    pool = host_pool()
    with pgmo.TraceRecorder() as rec:
        blocks = [pool.malloc(1 << 16) for _ in range(4)]
        del blocks[1:3]
        blocks.append(pool.malloc(1 << 17))
    path = tmp_path / "step.json"
    saved = rec.save(path)
    assert rows(pgmo.read_trace(path)) == rows(saved)
    assert main(["analyze", str(path), "--method", "bestfit"]) == 0
    assert "lower bound" in capsys.readouterr().out


# ------------------------------------------------------------------ whole runs
def test_a_whole_run_is_every_request_heard_with_its_iterations():
    """Installed before the weights, with begin()/end() around each iteration: a run file of
    pgmo.runs, as bench_memory records one on a GPU (here pgmo's pool on host memory)."""
    rec = TraceRecorder()
    with rec:  # installed first: the weights are heard too
        pool = host_pool(warmup=1)
        with pool:
            weights = cupy.cuda.alloc(4096)
            for _ in range(3):
                rec.begin()
                with pool.iteration():
                    a = cupy.cuda.alloc(1000)
                    b = cupy.cuda.alloc(3000)
                    del a
                    grads = cupy.cuda.alloc(2000)  # kept until the next iteration
                    del b
                rec.end()
            del grads, weights
    run = rec.run(model="toy", pool="pgmo", recorded_by="installed at process start")
    # a tick per alloc and per free: the weights at 0; then 5 events in the first iteration,
    # 6 in the next (the new gradients' alloc, then the old ones' free)
    assert run.iterations == ((1, 6), (6, 12), (12, 18))
    assert [b.size for b in run.trace.blocks] == [4096] + [1000, 3000, 2000] * 3
    assert run.metadata["heard"] == {"device": 0, "events": 26, "frees_not_heard": 0,
                                     "frees_of_memory_from_before": 0, "live_at_end": 0}
    assert run.long_lived_bytes() == 4096 + 2000  # weights, and gradients across a boundary
    assert (run.metadata["model"], run.metadata["pool"]) == ("toy", "pgmo")
    assert run.metadata["recorded_by"] == "installed at process start"
    # the same recording as one trace: the marks are not requests
    assert [b.size for b in rec.trace().blocks] == [b.size for b in run.trace.blocks]


def test_a_run_pairs_frees_as_the_trace_does_and_leaves_out_memory_from_before():
    rec = TraceRecorder()
    free(rec, 0x9000, 4096)  # allocated before the recorder: not part of the run
    malloc(rec, 0x1000, 100)
    rec.begin()
    malloc(rec, 0x1000, 200)  # the first block's free was not heard (another thread)
    malloc(rec, 0x2000, 0)  # a zero-size request: no memory handed out
    malloc(rec, 0x3000, 300, device=1)  # another device's
    free(rec, 0x1000, 200, pmem=0x7777)  # other pooled memory at a live address: not its free
    rec.end()
    run = rec.run()
    assert [(b.lower, b.upper, b.size) for b in run.trace.blocks] == [(0, 1, 100),
                                                                     (2, None, 200)]
    assert run.iterations == ((1, 3),)
    assert run.metadata["heard"] == {"device": 0, "events": 6, "frees_not_heard": 1,
                                     "frees_of_memory_from_before": 1, "live_at_end": 1}
    assert run.metadata["recorded_by"] == "pgmo.TraceRecorder"
    assert [b.size for b in rec.run(1, device="the second GPU").trace.blocks] == [300]
