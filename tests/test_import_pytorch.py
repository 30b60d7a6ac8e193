"""PyTorch memory snapshots: pickles written here with plain ``pickle`` in PyTorch's schema.

The schema is that of ``torch.cuda.memory._snapshot()`` (PyTorch 2.13):
``{"segments": [...], "device_traces": [[trace entries of device 0], ...]}``.
torch is never imported.
"""

from __future__ import annotations

import bisect
import gzip
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings

import pgmo
from pgmo.formats import TraceFormatError, detect, load
from pgmo.synth_logs import pytorch_snapshot

from .strategies import event_traces

DATA = Path(__file__).resolve().parent / "data"


def alloc(addr, size, stream=0):
    return {"action": "alloc", "addr": addr, "size": size, "stream": stream,
            "time_us": 1, "frames": [{"filename": "train.py", "line": 3, "name": "step"}]}


def free(addr, size, stream=0):
    """The two events PyTorch records for one free (no cross-stream use)."""
    return [{"action": "free_requested", "addr": addr, "size": size, "stream": stream,
             "time_us": 2, "frames": []},
            {"action": "free_completed", "addr": addr, "size": size, "stream": stream,
             "time_us": 2, "frames": []}]


def segment(address, total, blocks=(), device=0, stream=0):
    """A segment whose ``blocks`` are ``(size, requested_size, state)``, filling it in order."""
    blocks = list(blocks)
    used = sum(b[0] for b in blocks)
    if used < total:
        blocks.append((total - used, total - used, "inactive"))
    return {"device": device, "address": address, "total_size": total, "stream": stream,
            "segment_type": "large", "segment_pool_id": (0, 0),
            "allocated_size": sum(b[0] for b in blocks if b[2] != "inactive"),
            "active_size": sum(b[0] for b in blocks if b[2] != "inactive"),
            "requested_size": sum(b[1] for b in blocks if b[2] != "inactive"),
            "blocks": [{"size": s, "requested_size": r, "state": st, "frames": []}
                       for s, r, st in blocks]}


def write(tmp_path, data, name="snap.pickle", protocol=pickle.DEFAULT_PROTOCOL) -> Path:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(data, protocol=protocol))
    return path


def flat(*events):
    out = []
    for e in events:
        out.extend(e if isinstance(e, list) else [e])
    return out


def rows(trace):
    return [(b.lower, b.upper, b.size) for b in trace.blocks]


def report(trace):
    return trace.metadata["import"]


# -- the basics ------------------------------------------------------------------
def test_allocs_and_frees_become_blocks_on_the_event_clock(tmp_path):
    events = flat(alloc(0x1000, 1000), alloc(0x2000, 3000), free(0x1000, 1000),
                  alloc(0x1000, 700), free(0x2000, 3000), free(0x1000, 700))
    path = write(tmp_path, {"segments": [], "device_traces": [events]})
    trace = pgmo.read_trace(path)
    # one tick per alloc and per free (free_requested + free_completed is one free)
    assert rows(trace) == [(0, 2, 1000), (1, 4, 3000), (3, 5, 700)]
    assert trace.lower_bound() == 4000
    assert trace.metadata["source_format"] == "pytorch-snapshot"
    assert report(trace)["block_ends_at"] == "free_completed"
    assert trace.source == str(path)


def test_sizes_are_kept_as_requested_not_rounded(tmp_path):
    path = write(tmp_path, {"device_traces": [flat(alloc(0x1000, 1), free(0x1000, 1))]})
    assert rows(pgmo.read_trace(path)) == [(0, 1, 1)]


def test_pointer_reuse_makes_a_new_block_each_time(tmp_path):
    events = flat(*(ev for _ in range(3) for ev in (alloc(0xA0, 512), free(0xA0, 512))))
    trace = pgmo.read_trace(write(tmp_path, {"device_traces": [events]}))
    assert rows(trace) == [(0, 1, 512), (2, 3, 512), (4, 5, 512)]
    assert trace.lower_bound() == 512


def test_a_block_ends_when_its_free_completes(tmp_path):
    """record_stream: the memory is in use until free_completed, later than free_requested."""
    events = [alloc(0x1000, 100),
              {"action": "free_requested", "addr": 0x1000, "size": 100, "stream": 0},
              alloc(0x2000, 200),
              {"action": "free_completed", "addr": 0x1000, "size": 100, "stream": 0}]
    trace = pgmo.read_trace(write(tmp_path, {"device_traces": [events]}))
    assert rows(trace) == [(0, 2, 100), (1, None, 200)]
    assert trace.lower_bound() == 300


def test_without_free_completed_events_blocks_end_at_free_requested(tmp_path):
    """A snapshot recorded with skip_actions=["free_completed"]."""
    events = [alloc(0x1000, 100),
              {"action": "free_requested", "addr": 0x1000, "size": 100, "stream": 0},
              alloc(0x1000, 200)]
    trace = pgmo.read_trace(write(tmp_path, {"device_traces": [events]}))
    assert rows(trace) == [(0, 1, 100), (2, None, 200)]
    assert report(trace)["block_ends_at"] == "free_requested"


# -- blocks from before the recording, blocks still live -------------------------
def test_frees_before_allocs_are_blocks_allocated_before_recording(tmp_path):
    """A ring buffer (max_entries) or a late _record_memory_history starts mid-run."""
    events = flat(free(0x5000, 4096), alloc(0x1000, 100), free(0x1000, 100))
    trace = pgmo.read_trace(write(tmp_path, {"device_traces": [events]}))
    # live from the first tick until its free, then the recorded block
    assert rows(trace) == [(0, 1, 4096), (2, 3, 100)]
    assert report(trace)["before_freed"] == {"count": 1, "bytes": 4096}
    assert trace.lower_bound() == 4096


def test_blocks_live_at_the_end_and_from_before_are_kept_open(tmp_path):
    """Weights allocated before recording show only in the segments; nothing is dropped."""
    events = flat(alloc(0x1000 + 2048, 100), alloc(0x1000 + 2560, 200), free(0x1000 + 2560, 200))
    segs = [segment(0x1000, 1 << 20, [(2048, 2000, "active_allocated"),
                                      (512, 100, "active_allocated")])]
    trace = pgmo.read_trace(write(tmp_path, {"segments": segs, "device_traces": [events]}))
    assert rows(trace) == [(0, None, 2000), (1, None, 100), (2, 3, 200)]
    r = report(trace)
    assert r["before_live"] == {"count": 1, "bytes": 2000}
    assert r["live_at_end"] == {"count": 1, "bytes": 100}
    assert trace.open_ids == (0, 1)
    assert trace.lower_bound() == 2300


def test_a_segment_only_snapshot_gives_the_live_blocks(tmp_path):
    """torch.cuda.memory_snapshot() (a list) or a snapshot taken without history."""
    segs = [segment(0x1000, 2 << 20, [(1024, 1000, "active_allocated"),
                                      (4096, 4096, "inactive"),
                                      (512, 512, "active_allocated")]),
            segment(0x900000, 20 << 20, [(8192, 8000, "active_allocated")])]
    for data in (segs, {"segments": segs, "device_traces": []},
                 {"segments": segs, "device_traces": [[]]}):
        trace = pgmo.read_trace(write(tmp_path, data))
        assert sorted(b.size for b in trace.blocks) == [512, 1000, 8000]
        assert all(b.upper is None for b in trace.blocks)
        assert trace.metadata["reserved_peak"] == (2 << 20) + (20 << 20)
        assert report(trace)["events"] == 0


def test_an_empty_snapshot_reads_as_an_empty_trace(tmp_path):
    trace = pgmo.read_trace(write(tmp_path, {"segments": [], "device_traces": []}))
    assert len(trace) == 0


# -- what the allocator reserved ---------------------------------------------------
def test_reserved_peak_replays_the_segment_history(tmp_path):
    mib = 1 << 20
    events = [{"action": "segment_alloc", "addr": 0x100000, "size": 20 * mib, "stream": 0},
              alloc(0x100000, 5 * mib),
              {"action": "segment_alloc", "addr": 0x9000000, "size": 40 * mib, "stream": 0},
              alloc(0x9000000, 30 * mib), free(0x9000000, 30 * mib),
              {"action": "segment_free", "addr": 0x9000000, "size": 40 * mib, "stream": 0}]
    # a segment of 2 MiB existed before recording and is still there
    segs = [segment(0x40000, 2 * mib), segment(0x100000, 20 * mib,
                                               [(5 * mib, 5 * mib, "active_allocated")])]
    trace = pgmo.read_trace(write(tmp_path, {"segments": segs, "device_traces": [flat(*events)]}))
    assert trace.metadata["reserved_at_end"] == 22 * mib
    assert trace.metadata["reserved_peak"] == 62 * mib


def test_expandable_segments_map_and_unmap_count_as_reserved(tmp_path):
    mib = 1 << 20
    events = [{"action": "segment_map", "addr": 0x100000, "size": 4 * mib, "stream": 0},
              {"action": "segment_unmap", "addr": 0x100000, "size": 2 * mib, "stream": 0}]
    segs = [segment(0x100000, 2 * mib)]
    trace = pgmo.read_trace(write(tmp_path, {"segments": segs, "device_traces": [events]}))
    assert trace.metadata["reserved_peak"] == 4 * mib


def test_a_segment_history_that_does_not_add_up_is_reported_not_used(tmp_path):
    """A segment allocated while recording cannot be missing from the final segments."""
    events = [{"action": "segment_alloc", "addr": 0x100000, "size": 1 << 30, "stream": 0}]
    trace = pgmo.read_trace(write(tmp_path, {"segments": [], "device_traces": [events]}))
    assert "reserved_peak" not in trace.metadata
    assert "does not match" in trace.metadata["reserved_note"]


# -- devices and streams -----------------------------------------------------------
def two_devices(tmp_path):
    dev0 = flat(alloc(0x10, 100), free(0x10, 100))
    dev1 = flat(alloc(0x10, 7, stream=5), alloc(0x20, 9, stream=6), free(0x10, 7, stream=5))
    segs = [segment(0x0, 1 << 21, device=0), segment(0x0, 1 << 22, device=1, stream=5)]
    return write(tmp_path, {"segments": segs, "device_traces": [dev0, dev1]})


def test_the_device_with_the_most_events_is_read_by_default(tmp_path):
    trace = pgmo.read_trace(two_devices(tmp_path))
    assert report(trace)["device"] == 1
    assert sorted(b.size for b in trace.blocks) == [7, 9]
    assert report(trace)["streams"] == [5, 6]
    assert trace.metadata["reserved_peak"] == 1 << 22


def test_device_and_stream_options_pick_one(tmp_path):
    path = two_devices(tmp_path)
    assert [b.size for b in pgmo.read_trace(path, device=0).blocks] == [100]
    assert [b.size for b in pgmo.read_trace(path, stream=6).blocks] == [9]
    assert [b.size for b in pgmo.read_trace(path, stream=5).blocks] == [7]


def test_an_unknown_device_or_stream_names_those_that_exist(tmp_path):
    path = two_devices(tmp_path)
    with pytest.raises(TraceFormatError, match=r"no device 3 .*devices with events or "
                                               r"segments: 0, 1") as e:
        pgmo.read_trace(path, device=3)
    assert e.value.field == "device"
    with pytest.raises(TraceFormatError, match=r"no stream 9 \(streams: 5, 6\)"):
        pgmo.read_trace(path, stream=9)


# -- bad input: clear errors naming the event and field ------------------------------
@pytest.mark.parametrize("event, field, reason", [
    (alloc(0x10, -4), "size", "size must be >= 0, got -4"),
    ({"action": "alloc", "size": 4}, "addr", "missing 'addr'"),
    ({"action": "alloc", "addr": "0x10", "size": 4}, "addr", "expected an integer"),
    ({"action": "alloc", "addr": 16, "size": 4.5}, "size", "expected an integer, got 4.5"),
    ({"action": 7, "addr": 16, "size": 4}, "action", "expected an action name"),
])
def test_bad_trace_entries_are_named(tmp_path, event, field, reason):
    path = write(tmp_path, {"device_traces": [[alloc(0x99, 1), event]]})
    with pytest.raises(TraceFormatError, match=reason) as e:
        pgmo.read_trace(path)
    assert e.value.field == field and e.value.path == str(path)
    assert str(e.value).startswith(f"{path}, field '{field}': device_traces[0][1]:")


def test_zero_size_requests_take_no_memory_and_are_counted(tmp_path):
    events = flat(alloc(0x10, 0), free(0x10, 0), alloc(0x20, 8), free(0x20, 8))
    trace = pgmo.read_trace(write(tmp_path, {"device_traces": [events]}))
    assert rows(trace) == [(0, 1, 8)]
    assert report(trace)["zero_size_requests"] == 1


def test_an_alloc_at_an_address_still_allocated_is_an_error(tmp_path):
    path = write(tmp_path, {"device_traces": [[alloc(0x10, 8), alloc(0x10, 8)]]})
    with pytest.raises(TraceFormatError, match=r"device_traces\[0\]\[1\]: alloc at address "
                                               r"0x10, which is still allocated"):
        pgmo.read_trace(path)


def test_unknown_actions_are_skipped_and_counted_as_pytorchs_viewer_does(tmp_path):
    events = flat(alloc(0x10, 8), {"action": "resize", "addr": 0, "size": 0},
                  {"action": "resize"}, {"action": "snapshot", "addr": 0, "size": 0},
                  {"action": "annotate", "stream": 0, "frames": [], "time_us": 5},
                  free(0x10, 8))
    trace = pgmo.read_trace(write(tmp_path, {"device_traces": [events]}))
    assert rows(trace) == [(0, 1, 8)]
    # annotate (torch.cuda.memory._annotate_memory's markers) and snapshot are known
    assert report(trace)["skipped_actions"] == {"resize": 2}


def test_out_of_memory_events_are_counted(tmp_path):
    events = [alloc(0x10, 8), {"action": "oom", "device_free": 1024, "size": 1 << 40,
                               "stream": 0}]
    trace = pgmo.read_trace(write(tmp_path, {"device_traces": [events]}))
    assert report(trace)["failed_requests"] == {"count": 1, "bytes": 1 << 40}


@pytest.mark.parametrize("data, reason", [
    ({"device_traces": "nope"}, "'device_traces' must be a list"),
    ({"segments": {}, "device_traces": []}, "'segments' must be a list"),
    ({"device_traces": [[alloc(0, 1)], "x"]}, r"device_traces\[1\]: must be a list"),
    ({"weights": [1, 2]}, "a dict without 'segments' or 'device_traces'"),
    (42, "the pickle holds a int"),
    ({"segments": [3]}, r"segments\[0\]: expected a dict"),
])
def test_pickles_that_are_not_snapshots_are_named(tmp_path, data, reason):
    with pytest.raises(TraceFormatError, match=reason):
        pgmo.read_trace(write(tmp_path, data))


def test_a_truncated_snapshot_says_so(tmp_path):
    whole = pickle.dumps({"device_traces": [flat(alloc(0x10, 8), free(0x10, 8))] * 50})
    for cut in (len(whole) // 2, len(whole) - 1, 3):
        path = tmp_path / f"cut{cut}.pickle"
        path.write_bytes(whole[:cut])
        with pytest.raises(TraceFormatError, match="truncated") as e:
            pgmo.read_trace(path)
        assert e.value.path == str(path)


class _RunsCode:
    """A pickle payload that would create a file if it were ever executed."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_would_run_code_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    evil = {"segments": [], "device_traces": [[alloc(0x10, 8)]], "x": _RunsCode(marker)}
    path = write(tmp_path, evil, name="evil.pickle")
    with pytest.raises(TraceFormatError, match=r"refused to load .*import (posix|os)\.system"
                                               r".*can run code") as e:
        pgmo.read_trace(path)
    assert e.value.path == str(path)
    assert not marker.exists()
    # also through the command line: one line, exit status 2, nothing run
    proc = subprocess.run([sys.executable, "-m", "pgmo", "analyze", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "refused to load" in proc.stderr
    assert "Traceback" not in proc.stderr and not marker.exists()


@pytest.mark.parametrize("payload", [
    pickle.dumps(Path("x")),  # any class is an import
    b"\x80\x04cbuiltins\neval\n(S'1'\ntR.",  # GLOBAL + REDUCE by hand
    b"\x80\x02Pfoo\n.",  # a persistent id
])
def test_imports_and_external_objects_are_refused(tmp_path, payload):
    path = tmp_path / "p.pickle"
    path.write_bytes(payload)
    with pytest.raises(TraceFormatError, match="refused to load"):
        pgmo.read_trace(path)


# -- files: detection by content, compression --------------------------------------
def test_a_snapshot_is_recognised_by_content_whatever_its_name(tmp_path):
    data = {"device_traces": [flat(alloc(0x10, 8), free(0x10, 8))]}
    for protocol in (2, 3, 4, 5):
        path = write(tmp_path, data, name=f"odd-name-{protocol}.csv", protocol=protocol)
        assert detect(path).name == "pytorch-snapshot"
        assert len(pgmo.read_trace(path)) == 1


def test_a_gzipped_snapshot_is_read(tmp_path):
    path = tmp_path / "snap.pickle.gz"
    data = {"device_traces": [flat(alloc(1, 8), free(1, 8))]}
    path.write_bytes(gzip.compress(pickle.dumps(data)))
    assert rows(pgmo.read_trace(path)) == [(0, 1, 8)]


def test_format_option_overrides_detection(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("id,lower,upper,size\n0,0,1,4\n")
    with pytest.raises(TraceFormatError, match="PyTorch memory snapshot"):
        load(path, format="pytorch-snapshot")


def test_reading_a_snapshot_loads_neither_torch_nor_cupy(tmp_path):
    path = write(tmp_path, {"device_traces": [flat(alloc(0x10, 8), free(0x10, 8))]})
    code = (f"import sys, pgmo\nt = pgmo.read_trace({str(path)!r})\n"
            f"pgmo.analyze(t, time_limit=1)\n"
            "print(sorted(m for m in ('torch', 'cupy', 'chainer') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.strip() == "[]"


# -- a generated run, read back ------------------------------------------------------
@settings(max_examples=40)
@given(event_traces())
def test_a_trace_written_as_a_snapshot_reads_back_unchanged(trace):
    data = pickle.loads(pickle.dumps(pytorch_snapshot(trace)))
    back = pgmo.formats.pytorch.snapshot_to_trace(data)
    assert rows(back) == rows(trace)


def test_a_generated_multi_iteration_snapshot_reads_back_with_its_reservation(tmp_path):
    trace = pgmo.bundled.load("synthetic-alexnet-train-b32")
    path = write(tmp_path, pytorch_snapshot(trace, iterations=3, before=[10 << 20]))
    back = pgmo.read_trace(path)
    assert len(back) == 3 * len(trace) + 1
    assert report(back)["before_live"] == {"count": 1, "bytes": 10 << 20}
    assert back.metadata["reserved_peak"] >= back.lower_bound() > 0


# -- a real snapshot, when one was recorded on a GPU --------------------------------
REAL = sorted(DATA.glob("*.pickle")) + sorted(DATA.glob("*.pickle.gz"))


@pytest.mark.skipif(not REAL, reason="no real snapshot in tests/data (recorded on a GPU with "
                                     "torch.cuda.memory._dump_snapshot)")
@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_a_real_snapshot_reads_and_its_totals_add_up(path):
    """Cross-checks against a plain count of the pickle's events, and against
    ``<name>.expected.json`` (requests, lower_bound, reserved_peak) when it exists."""
    from pgmo.formats.files import read_bytes
    from pgmo.formats.safe_pickle import loads_plain_data

    trace = pgmo.read_trace(path)
    r = report(trace)
    raw = loads_plain_data(read_bytes(path))
    events = raw["device_traces"][r["device"]] if isinstance(raw, dict) and \
        raw.get("device_traces") else []
    allocs = [e for e in events if e.get("action") == "alloc" and e.get("size", 0) > 0]
    before = r["before_freed"]["count"] + r["before_live"]["count"]
    assert len(trace) == len(allocs) + before
    assert trace.total_bytes == sum(e["size"] for e in allocs) + \
        r["before_freed"]["bytes"] + r["before_live"]["bytes"]
    if "reserved_peak" in trace.metadata:
        assert trace.metadata["reserved_peak"] >= trace.lower_bound()
    expected = path.with_name(path.name.split(".pickle")[0] + ".expected.json")
    if expected.exists():
        want = json.loads(expected.read_text())
        got = {"requests": len(trace), "lower_bound": trace.lower_bound(),
               "reserved_peak": trace.metadata.get("reserved_peak")}
        assert {k: got[k] for k in want} == want


@pytest.mark.parametrize("protocol", [0, 1])
def test_an_old_protocol_pickle_is_refused_and_never_runs(tmp_path, protocol):
    """Snapshots are pickled with protocol >= 2; older pickles (evil ones too) are not loaded."""
    marker = tmp_path / "ran"
    evil = pickle.dumps(_RunsCode(marker), protocol=protocol)
    for name, data in [("evil.pickle", evil),
                       ("plain.pickle", pickle.dumps({"segments": []}, protocol=protocol))]:
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(TraceFormatError, match="a pickle of protocol 0 or 1, which pgmo "
                                                   "does not load"):
            pgmo.read_trace(path)
    assert not marker.exists()


@pytest.mark.parametrize("content, kind", [(b"Thread,Time,Action\n", "not a pickle"),
                                           (b"", "an empty file")])
def test_forcing_the_snapshot_format_on_other_content_says_what_it_is(tmp_path, content,
                                                                        kind):
    path = tmp_path / "snap.pickle"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=f"not a PyTorch memory snapshot: {kind}"):
        load(path, "pytorch-snapshot")


def test_a_stream_is_chosen_by_its_number_as_text_too(tmp_path):
    events = flat(alloc(0x10, 7, stream=0x7F00), alloc(0x20, 9, stream=0), free(0x10, 7,
                                                                                  stream=0x7F00))
    path = write(tmp_path, {"device_traces": [events]})
    for chosen in (0x7F00, "0x7f00", str(0x7F00)):
        assert [b.size for b in pgmo.read_trace(path, stream=chosen).blocks] == [7]



# -- the H100 snapshot against PyTorch's own counters ------------------------------------
H100_SNAPSHOT = DATA / "pytorch-snapshot-small-cnn-h100.pickle"
#: What PyTorch itself reported for the run that snapshot recorded (tests/data/README.rst).
PYTORCH_MAX_RESERVED, PYTORCH_MAX_ALLOCATED = 578_813_952, 221_594_624
SMALL_REQUEST = 1 << 20  # PyTorch's kSmallSize: larger requests go to the large pool


def pytorch_allocated_peak(snapshot: dict, device: int = 0, rounded: bool = False) -> int:
    """The most bytes PyTorch counts as allocated at once, rebuilt from a snapshot's addresses.

    PyTorch's ``allocated_bytes`` adds each *block's* size.  A request is
    rounded up to 512 B and cut from the start of a free block, which is split
    only when the rest is at least 512 B (small pool) or more than 1 MiB
    (large pool); else the whole free block is handed out.  Free neighbours
    merge, so a free block runs to the next allocated block or its segment's
    end.  ``rounded``: every block at its rounded request size instead, as
    pgmo's pool hands memory out.
    """
    def round512(n):
        return max(512, -(-n // 512) * 512)

    segments = {s["address"]: (s["total_size"], s["segment_type"])
                for s in snapshot["segments"] if s["device"] == device}
    starts = sorted(segments)
    events = snapshot["device_traces"][device]
    recorded = {e["addr"] for e in events if e["action"] == "alloc"}
    live = {}  # address -> (block size, rounded request)
    for s in snapshot["segments"]:  # blocks allocated before recording: live throughout
        addr = s["address"]
        for b in s["blocks"]:
            if b["state"].startswith("active") and addr not in recorded:
                live[addr] = (b["size"], round512(b["requested_size"]))
            addr += b["size"]
    at = 1 if rounded else 0
    now = peak = sum(v[at] for v in live.values())
    for e in events:
        if e["action"] == "alloc":
            start = starts[bisect.bisect_right(starts, e["addr"]) - 1]
            size, kind = segments[start]
            end = min([a for a in live if e["addr"] < a < start + size], default=start + size)
            free, need = end - e["addr"], round512(e["size"])
            split = free - need >= 512 if kind == "small" else free - need > SMALL_REQUEST
            live[e["addr"]] = (need if split else free, need)
            now += live[e["addr"]][at]
            peak = max(peak, now)
        elif e["action"] == "free_requested":  # PyTorch counts a block freed when asked
            now -= live.pop(e["addr"])[at]
    return peak


def test_the_h100_snapshot_against_pytorchs_own_counters():
    """pgmo reads the real snapshot as PyTorch counted it; its lower bound sits 104,960 B
    below max_memory_allocated, which counts the large pool's unsplit block remainders."""
    from pgmo.formats.safe_pickle import loads_plain_data

    result = pgmo.analyze(H100_SNAPSHOT, method="bestfit")
    assert result.requests == 166  # 160 alloc events and 6 blocks allocated before recording
    assert result.reserved == PYTORCH_MAX_RESERVED
    snapshot = loads_plain_data(H100_SNAPSHOT.read_bytes())
    assert pytorch_allocated_peak(snapshot) == PYTORCH_MAX_ALLOCATED  # the model is PyTorch's
    assert result.lower_bound == pytorch_allocated_peak(snapshot, rounded=True)
    assert PYTORCH_MAX_ALLOCATED - result.lower_bound == 104_960
    assert result.plans["bestfit"]["peak"] == result.lower_bound  # pgmo's plan needs no more
