"""*Synthetic* allocator logs: a trace written as a PyTorch snapshot or an RMM log.

Where no GPU is at hand, this is how pgmo's importers are exercised at scale
(``scripts/bench_import.py``) and how the example output of docs/analyze.rst was made.
A trace (one iteration, e.g. a bundled synthetic one) is repeated for
``iterations`` iterations and served by :class:`CachingAllocatorModel`, a
simplified model of PyTorch's ``CUDACachingAllocator`` that gives every
request an address, so pointers are reused as in a real log and the
segments the model reserves are what the log reports as reserved memory.
Everything written is labelled synthetic.  Not measurements.

Command line::

    python -m pgmo.synth_logs --iterations 60 --pytorch snap.pickle \\
        --rmm requests.csv --rmm-upstream upstream.csv
"""

from __future__ import annotations

import argparse
import bisect
import csv
import io
import pickle
from typing import Any, Sequence

from .trace import Trace, events

__all__ = ["CachingAllocatorModel", "pytorch_snapshot", "rmm_logs", "repeat", "main"]

# PyTorch's constants (c10/cuda/CUDACachingAllocator.cpp, PyTorch 2.x).
MIN_BLOCK = 512  # every size is rounded up to this
SMALL_SIZE = 1 << 20  # the largest "small" request
SMALL_BUFFER = 2 << 20  # segment size of the small pool
LARGE_BUFFER = 20 << 20  # segment size for requests of 1 to 10 MiB
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20  # larger requests get a segment rounded up to this
BASE_ADDRESS = 0x7F0000000000


class CachingAllocatorModel:
    """Best-fit in cached segments that are never released; new segments when nothing fits.

    A simplification of PyTorch's caching allocator: two pools (requests up
    to 1 MiB in 2 MiB segments, larger ones in 20 MiB or rounded segments),
    sizes rounded to 512 B, a free block split when the rest is worth keeping
    and merged with its free neighbours.  No streams, no ``empty_cache``.
    """

    def __init__(self, base: int = BASE_ADDRESS) -> None:
        self._next = base
        self.segments: list[dict[str, Any]] = []  # address, total_size, small
        self._free: dict[bool, list[tuple[int, int]]] = {True: [], False: []}  # (size, addr)
        self._block: dict[int, list] = {}  # addr -> [size, requested (0: free), small]
        self._end: dict[int, int] = {}  # end address -> start, for free blocks only

    @property
    def reserved(self) -> int:
        return sum(s["total_size"] for s in self.segments)

    def malloc(self, requested: int) -> tuple[int, dict[str, Any] | None]:
        """``(address, the new segment or None)`` for a request of ``requested`` bytes."""
        size = max(MIN_BLOCK, -(-requested // MIN_BLOCK) * MIN_BLOCK)
        small = size <= SMALL_SIZE
        pool = self._free[small]
        k = bisect.bisect_left(pool, (size, 0))
        segment = None
        if k < len(pool):
            have, addr = pool.pop(k)
            del self._end[addr + have]
        else:
            have = SMALL_BUFFER if small else LARGE_BUFFER if size < MIN_LARGE_ALLOC \
                else -(-size // ROUND_LARGE) * ROUND_LARGE
            addr = self._next
            self._next += have + ROUND_LARGE  # a gap: blocks never merge across segments
            segment = {"address": addr, "total_size": have, "small": small}
            self.segments.append(segment)
        rest = have - size
        if rest >= MIN_BLOCK if small else rest > SMALL_SIZE:
            self._add_free(addr + size, rest, small)
            have = size
        self._block[addr] = [have, requested, small]
        return addr, segment

    def free(self, addr: int) -> None:
        size, _, small = self._block[addr]
        start, end = addr, addr + size
        before = self._end.get(start)
        if before is not None:  # merge with the free block just below
            self._take_free(before)
            del self._block[start]
            start = before
        after = self._block.get(end)
        if after is not None and after[1] == 0:  # merge with the free block just above
            self._take_free(end)
            del self._block[end]
            end += after[0]
        self._block.pop(start, None)
        self._add_free(start, end - start, small)

    def _add_free(self, addr: int, size: int, small: bool) -> None:
        bisect.insort(self._free[small], (size, addr))
        self._block[addr] = [size, 0, small]
        self._end[addr + size] = addr

    def _take_free(self, addr: int) -> None:
        size, _, small = self._block[addr]
        pool = self._free[small]
        k = bisect.bisect_left(pool, (size, addr))
        del pool[k]
        del self._end[addr + size]

    def state(self) -> list[dict[str, Any]]:
        """Each segment's blocks in address order: ``(address, size, requested or 0)``."""
        out = []
        for seg in self.segments:
            blocks, addr, end = [], seg["address"], seg["address"] + seg["total_size"]
            while addr < end:
                size, requested, _ = self._block[addr]
                blocks.append((addr, size, requested))
                addr += size
            out.append({**seg, "blocks": blocks})
        return out


def repeat(trace: Trace, iterations: int) -> list[tuple[str, int, int]]:
    """``(kind, block number, size)`` events of ``iterations`` back-to-back iterations.

    ``kind`` is ``"alloc"`` or ``"free"``; a block still open at the end of an
    iteration is never freed.
    """
    out = []
    blocks = trace.blocks
    n = len(blocks)
    for it in range(iterations):
        for _, kind, i in events(blocks):
            out.append(("alloc" if kind else "free", it * n + i, blocks[i].size))
    return out


def pytorch_snapshot(trace: Trace, iterations: int = 1, before: Sequence[int] = (),
                     device: int = 0, stream: int = 0, max_entries: int | None = None,
                     frames: int = 0) -> dict[str, Any]:
    """The dict ``torch.cuda.memory._snapshot()`` would return, for a synthetic run.

    ``before``: sizes allocated before recording started and never freed
    (weights): in the final segments, with no trace events.  ``max_entries``:
    keep only the last entries, as ``_record_memory_history(max_entries=...)``
    does (its ring buffer), so early blocks are freed with no alloc.
    ``frames``: give each block a stack of this many frames, drawn from a few
    shared tracebacks as PyTorch shares them (0: no stacks, as with
    ``context=None``).
    """
    stacks = _stacks(frames)
    model = CachingAllocatorModel()
    for size in before:
        model.malloc(size)
    entries: list[dict[str, Any]] = []
    addr_of: dict[int, int] = {}
    clock = 1_700_000_000_000_000  # time_us, 10 us per event

    def entry(action: str, addr: int, size: int, block: int = 0) -> None:
        nonlocal clock
        clock += 10
        entries.append({"action": action, "addr": addr, "size": size, "stream": stream,
                        "time_us": clock, "frames": stacks[block % len(stacks)]})

    for kind, block, size in repeat(trace, iterations):
        if kind == "alloc":
            addr, segment = model.malloc(size)
            if segment is not None:
                entry("segment_alloc", segment["address"], segment["total_size"])
            addr_of[block] = addr
            entry("alloc", addr, size, block)
        else:
            addr = addr_of.pop(block)
            entry("free_requested", addr, size, block)
            model.free(addr)
            entry("free_completed", addr, size, block)
    segments = []
    for seg in model.state():
        blocks = [{"address": a, "size": s, "requested_size": r or s,
                   "state": "active_allocated" if r else "inactive", "frames": []}
                  for a, s, r in seg["blocks"]]
        allocated = sum(b["size"] for b in blocks if b["state"] != "inactive")
        segments.append({"device": device, "address": seg["address"],
                         "total_size": seg["total_size"], "stream": stream,
                         "segment_type": "small" if seg["small"] else "large",
                         "segment_pool_id": (0, 0), "allocated_size": allocated,
                         "active_size": allocated,
                         "requested_size": sum(b["requested_size"] for b in blocks
                                               if b["state"] != "inactive"),
                         "blocks": blocks, "frames": []})
    traces: list[list] = [[] for _ in range(device + 1)]
    traces[device] = entries[-max_entries:] if max_entries else entries
    return {"segments": segments, "device_traces": traces,
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""},
            "pgmo_synthetic": "made by pgmo.synth_logs; not a measurement"}


def _stacks(depth: int, distinct: int = 64) -> list[list[dict[str, Any]]]:
    """Shared tracebacks of ``depth`` frames (one empty one when ``depth`` is 0)."""
    if depth <= 0:
        return [[]]
    pool = [{"filename": f"/site-packages/model/layer{k % 40}.py", "line": 10 + k,
             "name": f"forward_{k}"} for k in range(4 * distinct)]
    return [[pool[(s * 7 + d) % len(pool)] for d in range(depth)] for s in range(distinct)]


def rmm_logs(trace: Trace, iterations: int = 1) -> tuple[str, str]:
    """``(requests, upstream)``: RMM logging-adaptor CSVs above and below a pool.

    The first logs every request (an adaptor over the pool), the second the
    pool's own allocations from the device (an adaptor under it), whose peak
    is the pool's high-water mark.
    """
    model = CachingAllocatorModel()
    header = ["Thread", "Time", "Action", "Pointer", "Size", "Stream"]
    requests, upstream = io.StringIO(), io.StringIO()
    req_w = csv.writer(requests, lineterminator="\n")
    up_w = csv.writer(upstream, lineterminator="\n")
    req_w.writerow(header)
    up_w.writerow(header)
    addr_of: dict[int, int] = {}
    usec = 0

    def now() -> str:
        nonlocal usec
        usec += 7
        s = usec // 10**6
        return f"{s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}.{usec % 10**6:06d}"

    for kind, block, size in repeat(trace, iterations):
        if kind == "alloc":
            addr, segment = model.malloc(size)
            if segment is not None:
                up_w.writerow([140000000000001, now(), "allocate", hex(segment["address"]),
                               segment["total_size"], "0x0"])
            addr_of[block] = addr
            req_w.writerow([140000000000001, now(), "allocate", hex(addr), size, "0x0"])
        else:
            addr = addr_of.pop(block)
            req_w.writerow([140000000000001, now(), "free", hex(addr), size, "0x0"])
            model.free(addr)
    return requests.getvalue(), upstream.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns its exit status (a mistake: one line, status 2)."""
    from . import programs

    return programs.run(lambda: _main(argv), name="python -m pgmo.synth_logs")


def _main(argv: Sequence[str] | None) -> int:
    from . import bundled, programs
    from .formats import write_bytes_atomically
    from .units import MAX_DEVICE_BYTES

    parser = programs.ArgumentParser(prog="python -m pgmo.synth_logs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default="synthetic-resnet50-train-b32",
                        help="bundled trace to repeat (see pgmo demo --list)")
    parser.add_argument("--iterations", type=programs.integer(1), default=10,
                        help="how many times the trace is repeated (default 10)")
    parser.add_argument("--weights", type=programs.integer(0, MAX_DEVICE_BYTES,
                                                           "a number of bytes"),
                        default=0, metavar="BYTES",
                        help="bytes allocated before recording (PyTorch snapshot only)")
    parser.add_argument("--max-entries", type=programs.integer(1), default=None, metavar="N",
                        help="keep the last N trace entries, as PyTorch's ring buffer does")
    parser.add_argument("--frames", type=programs.integer(0), default=0, metavar="N",
                        help="stack frames per event (PyTorch snapshot only)")
    parser.add_argument("--pytorch", type=programs.output_file,
                        help="write a PyTorch snapshot pickle here")
    parser.add_argument("--rmm", type=programs.output_file,
                        help="write the RMM log of the requests here")
    parser.add_argument("--rmm-upstream", type=programs.output_file,
                        help="write the RMM log of the pool's upstream here")
    args = parser.parse_args(argv)
    if not (args.pytorch or args.rmm or args.rmm_upstream):
        parser.error("nothing to write: give --pytorch, --rmm or --rmm-upstream (or several)")
    trace = bundled.load(args.trace)
    if args.pytorch:
        weights = [args.weights] if args.weights else []
        snap = pytorch_snapshot(trace, args.iterations, before=weights,
                                max_entries=args.max_entries, frames=args.frames)
        write_bytes_atomically(args.pytorch, pickle.dumps(snap, protocol=4))
        print(f"wrote {args.pytorch}: {sum(map(len, snap['device_traces'])):,} events")
    if args.rmm or args.rmm_upstream:
        requests, upstream = rmm_logs(trace, args.iterations)
        for path, text in ((args.rmm, requests), (args.rmm_upstream, upstream)):
            if path:
                write_bytes_atomically(path, text.encode())
                print(f"wrote {path}: {text.count(chr(10)) - 1:,} events")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
