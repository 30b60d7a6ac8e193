#!/usr/bin/env python
"""pgmo in one line: ``cupy.cuda.set_allocator(pool.malloc)`` around a plain CuPy loop.

The loop trains a two-layer perceptron written directly in CuPy.  It runs once
with CuPy's own pool and once with pgmo, and prints the memory each holds::

    python examples/one_liner.py              # GPU 0 when CuPy sees one, else the CPU
    python examples/one_liner.py --device -1 --iterations 2 --batchsize 8   # CPU smoke run

All it takes besides the allocator line is marking the hot loop's iterations
with ``with pool.iteration():``.  With ``--device -1`` the loop runs on NumPy,
which never calls CuPy's allocator: the pool is installed and the iterations
are marked all the same, but there are no GPU bytes to show.
"""

import logging
import os
import sys

from pgmo import programs

programs.start(__name__)  # Ctrl-C from here on: one line, exit status 130

import numpy  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from measure import (  # noqa: E402
    NA, Recorder, add_device_option, make_pool, mib, mode_text, pick_device, print_table,
    release_cached,
)


def init_weights(xp, args):
    rng = numpy.random.default_rng(args.seed)
    w1 = rng.standard_normal((args.inputs, args.hidden), dtype=numpy.float32) * 0.05
    w2 = rng.standard_normal((args.hidden, args.classes), dtype=numpy.float32) * 0.05
    return [xp.asarray(w1), xp.asarray(w2)]


def train_step(xp, weights, x, t, lr=0.1):
    """Forward, backward and SGD update of a ReLU perceptron; returns the loss."""
    w1, w2 = weights
    h = xp.maximum(x @ w1, 0)
    y = h @ w2
    y -= y.max(axis=1, keepdims=True)
    p = xp.exp(y)
    p /= p.sum(axis=1, keepdims=True)
    loss = -xp.log(p[xp.arange(len(t)), t] + 1e-9).mean()
    p[xp.arange(len(t)), t] -= 1  # d loss / d y, times the batch size
    p /= len(t)
    grad_w2 = h.T @ p
    grad_h = (p @ w2.T) * (h > 0)
    grad_w1 = x.T @ grad_h
    w1 -= lr * grad_w1
    w2 -= lr * grad_w2
    return float(loss)


def run(args, pool_name):
    """Train ``args.iterations`` steps; return the summary row."""
    if args.device >= 0:
        import cupy as xp

        xp.cuda.Device(args.device).use()
    else:
        xp = numpy
    import cupy

    pool = None
    if pool_name == "pgmo":
        pool = make_pool(args.device, warmup=args.warmup)
        previous = cupy.cuda.get_allocator()
        cupy.cuda.set_allocator(pool.malloc)  # <- the one line
    try:
        rng = numpy.random.default_rng(args.seed + 1)
        weights = init_weights(xp, args)
        recorder = Recorder(args.device, pool)
        recorder.start()
        for i in range(1, args.iterations + 1):
            x = rng.standard_normal((args.batchsize, args.inputs), dtype=numpy.float32)
            t = x[:, :args.classes].argmax(axis=1)  # a rule the perceptron can learn
            with pool.iteration() if pool is not None else _nothing():
                loss = train_step(xp, weights, xp.asarray(x), xp.asarray(t))
            seconds, held, used = recorder.record()
            mode = mode_text(pool, args.device)
            if args.verbose or i in (1, args.iterations):
                print(f"  iter {i:4d}  loss {loss:7.4f}  {mode:10s}  pools {mib(held):>14s}  "
                      f"{1e3 * seconds:8.2f} ms", flush=True)
    finally:
        if pool is not None:
            cupy.cuda.set_allocator(previous)
    stats = pool.stats() if pool is not None and args.device >= 0 else None
    row = (pool_name, recorder.iterations, recorder.peak_text(recorder.peak_pool),
           mib(stats.arena_bytes) if stats else ("-" if pool is None else NA),
           mib(stats.lower_bound) if stats else ("-" if pool is None else NA),
           f"{recorder.watch.steady_ms():.2f}")
    del weights
    release_cached(args.device)
    return row


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def parse_args(argv=None):
    parser = programs.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_device_option(parser)
    parser.add_argument("--iterations", "-i", type=int, default=20)
    parser.add_argument("--batchsize", "-b", type=int, default=512)
    parser.add_argument("--inputs", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--classes", type=int, default=1000, help="at most --inputs")
    parser.add_argument("--warmup", type=programs.non_negative_int, default=1,
                        help="pgmo warm-up iterations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", "-v", action="store_true", help="print every iteration")
    args = parser.parse_args(argv)
    for name in ("iterations", "batchsize", "inputs", "hidden", "classes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.classes > args.inputs:
        parser.error(f"--classes {args.classes} exceeds --inputs {args.inputs}")
    return args


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    args = parse_args(argv)
    pick_device(args)
    if args.device < 0:
        print(f"On the CPU the loop runs on NumPy, not CuPy: memory columns read {NA}.")
    rows = []
    for pool_name in ("stock", "pgmo"):
        print(f"\npool {pool_name}", flush=True)
        rows.append(run(args, pool_name))
    print_table("Summary (pool bytes: the most held at an iteration's end, every iteration "
                "counted; ms/iter: median after the first)",
                ("pool", "iters", "pool bytes", "pgmo arena", "lower bound", "ms/iter"), rows)


if __name__ == "__main__":
    sys.exit(programs.run(main))
