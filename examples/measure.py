"""Measuring helpers shared by the examples: pools, device memory, timing, tables.

On the CPU (``--device -1``) Chainer and the examples compute with NumPy, which
never calls CuPy's allocator: the pool is still installed and iterations are
still marked (so the same code runs unchanged on a GPU), but there are no GPU
bytes to report, and the pool, which receives no request, has no mode or
counts to show: the lines and tables say ``n/a (CPU)``.
"""

import os
import sys
import time

from pgmo import programs

NA = "n/a (CPU)"

DEVICE_HELP = ("GPU id, or -1 for the CPU (default: GPU 0 when CuPy sees a GPU, "
               "else the CPU, with a note)")


def add_device_option(parser, choices=None, help=DEVICE_HELP):
    """``--device``/``-d``; its default (None) is resolved by :func:`pick_device`."""
    parser.add_argument("--device", "-d", default=None, choices=choices, metavar="N",
                        type=programs.integer(-1, what="a device number (-1: the CPU)"),
                        help=help)


def visible_gpus():
    """(GPUs CuPy sees, why none when 0); stops with one line when CuPy is missing."""
    try:
        import cupy
    except ImportError as exc:
        sys.exit(f"{_program()}: needs CuPy, also on the CPU (pgmo's pool is CuPy's): "
                 f"{exc}; see examples/README.rst for the install command")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, an old driver, no device: CuPy says which
        return 0, str(exc).split(":")[0] or type(exc).__name__
    return count, "" if count else "no CUDA device"


def pick_device(args, quiet=False):
    """Resolve ``args.device``: the GPU when CuPy sees one, else the CPU with a one-line note.

    A GPU asked for by number that CuPy cannot see stops the example with one
    line naming ``--device -1``, rather than a traceback from the driver.
    ``quiet``: neither the note nor that line (MPI ranks other than 0).
    """
    count, why = visible_gpus()  # CuPy is needed on the CPU too
    if args.device is not None and args.device < 0:
        return args.device
    if args.device is None:
        args.device = 0 if count else -1
        if not count and not quiet:
            print(f"No GPU seen by CuPy ({why}): running on the CPU, as --device -1 does.",
                  flush=True)
    elif args.device >= count:
        sys.exit(1 if quiet else
                 f"{_program()}: --device {args.device}: CuPy sees "
                 f"{f'{count} GPU(s)' if count else f'no GPU ({why})'}; "
                 f"run on the CPU with --device -1")
    return args.device


def _program():
    return os.path.basename(sys.argv[0]) or "example"


def mode_text(pool, device_id):
    """pgmo's mode for an iteration's line: ``stock`` without pgmo, ``n/a (CPU)`` on the
    CPU (NumPy never asks the pool for memory, so it would say ``profiling`` forever)."""
    if pool is None:
        return "stock"
    return NA if device_id < 0 else pool.mode


class _WithoutEscapes:
    """A text stream that drops the terminal's "erase below" code Chainer's PrintReport
    writes before each line: a file or a pipe gets the lines alone."""

    ERASE = "\033[J"

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        return self._stream.write(text.replace(self.ERASE, ""))

    def __getattr__(self, name):
        return getattr(self._stream, name)


def report_stream():
    """Where PrintReport should write: stdout, without escape codes unless a terminal."""
    return sys.stdout if sys.stdout.isatty() else _WithoutEscapes(sys.stdout)


def make_pool(device_id, **options):
    """A pgmo pool: on the GPU the real one, on the CPU one backed by host memory."""
    if device_id < 0:
        from pgmo.testing import host_pool

        return host_pool(**options)
    from pgmo import ProfileGuidedMemoryPool

    return ProfileGuidedMemoryPool(**options)


CPU_NOTE = f"On the CPU Chainer allocates with NumPy, not CuPy: memory columns read {NA}."


def use_device(device_id, cpu_note=CPU_NOTE):
    """Chainer's device for ``--device`` (-1: the CPU, with NumPy), made current.

    On the CPU it prints ``cpu_note``: why the memory columns will be empty.
    """
    import chainer

    device = chainer.get_device("@numpy" if device_id < 0 else f"@cupy:{device_id}")
    device.use()
    if device_id < 0:
        print(cpu_note)
    return device


def add_pgmo_options(parser, warmup=1):
    """The pool's options every example takes: warm-up, solver method, time limit."""
    from pgmo import METHODS, SolverOptions, programs

    parser.add_argument("--warmup", type=programs.non_negative_int, default=warmup,
                        help="pgmo warm-up iterations")
    parser.add_argument("--method", default=SolverOptions().method, choices=METHODS,
                        help="pgmo solver")
    parser.add_argument("--time-limit", type=programs.non_negative_float,
                        default=SolverOptions().time_limit,
                        metavar="S", help="pgmo solver seconds")


def pgmo_options(args):
    """The pool's keyword options from what :func:`add_pgmo_options` declared."""
    return {"warmup": args.warmup, "method": args.method, "time_limit": args.time_limit}


def require_positive(parser, args, names):
    """Reject options below 1, naming the option as the user typed it."""
    for name in names:
        value = getattr(args, name)
        if value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")


def synchronize(device_id):
    """Wait for queued GPU work so that wall-clock times mean something."""
    if device_id >= 0:
        import cupy

        cupy.cuda.Device(device_id).synchronize()


def pool_bytes(device_id, pool=None):
    """Bytes held by CuPy's default pool plus those held by ``pool`` (GPU only).

    Parameters allocated before a pgmo pool is installed stay in CuPy's default
    pool, so the sum is what the process holds either way.
    """
    if device_id < 0:
        return None
    import cupy

    held = cupy.get_default_memory_pool().total_bytes()
    if pool is not None:
        held += pool.stats().total_bytes
    return held


def device_bytes_in_use(device_id):
    """Device memory in use by everyone (driver's view: total minus free)."""
    if device_id < 0:
        return None
    import cupy

    with cupy.cuda.Device(device_id):
        free, total = cupy.cuda.runtime.memGetInfo()
    return total - free


def release_cached(device_id):
    """Give CuPy's cached blocks back, between runs measured in one process."""
    if device_id >= 0:
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()


class Peak:
    """The largest of the values seen; ``None`` values (CPU) are ignored."""

    def __init__(self):
        self.value = None

    def add(self, value):
        if value is not None and (self.value is None or value > self.value):
            self.value = value
        return value


class Stopwatch:
    """Times between successive ``lap()`` calls, after synchronizing the device."""

    def __init__(self, device_id):
        self.device_id = device_id
        self.laps = []
        self._last = None

    def start(self):
        synchronize(self.device_id)
        self._last = time.perf_counter()

    def lap(self):
        synchronize(self.device_id)
        now = time.perf_counter()
        self.laps.append(now - self._last)
        self._last = now
        return self.laps[-1]

    def restart(self):
        """Start the next lap now (time spent since the last lap is left out)."""
        self._last = time.perf_counter()

    def steady_ms(self):
        """Median lap in ms, leaving out the first (warm-up, profiling) lap when possible."""
        laps = sorted(self.laps[1:] or self.laps)
        return 1e3 * laps[len(laps) // 2] if laps else float("nan")


def mib(value):
    """Bytes as MiB text, or ``n/a (CPU)`` for None."""
    return NA if value is None else f"{value / 2**20:.1f} MiB"


def print_table(title, columns, rows):
    """Print rows (sequences of values) under their column names, aligned."""
    cells = [[str(c) for c in columns]] + [[str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    line = "  ".join("-" * w for w in widths)
    print(f"\n{title}")
    print(line)
    for k, row in enumerate(cells):
        print("  ".join(v.rjust(w) if k and i else v.ljust(w)
                        for i, (v, w) in enumerate(zip(row, widths))))
        if k == 0:
            print(line)
    print(line)


class Recorder:
    """Per-iteration time, and the peaks of pool bytes and device memory over every iteration.

    The same for every pool: every iteration counts, from the first (pgmo's
    warm-up and profiled iterations, and the one where it takes its arena
    while what it held before is still there, as much as the stock pool's
    iterations).  Read at iteration ends; ``scripts/bench_memory.py`` adds
    an :class:`outside_view.OutsideView` that also samples inside them.
    The pools' bytes are their own count; the device's are seen from outside.
    """

    def __init__(self, device_id, pool=None):
        self.device_id = device_id
        self.pool = pool
        self.watch = Stopwatch(device_id)
        self.peak_pool = Peak()
        self.peak_device = Peak()

    def start(self):
        self.watch.start()

    def record(self):
        """Close one iteration: returns (seconds, pool bytes, device bytes)."""
        seconds = self.watch.lap()
        held = self.peak_pool.add(pool_bytes(self.device_id, self.pool))
        used = self.peak_device.add(device_bytes_in_use(self.device_id))
        self.watch.restart()  # the sampling is not the iteration's time
        return seconds, held, used

    @property
    def iterations(self):
        return len(self.watch.laps)

    def peak_text(self, peak):
        """A peak for the summary: MiB, or ``n/a (CPU)``."""
        return NA if self.device_id < 0 or peak.value is None else mib(peak.value)
