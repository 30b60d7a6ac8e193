#!/usr/bin/env python
"""Data-parallel training with ChainerMN, one pgmo pool per MPI process.

Start one process per GPU with MPI (``pip install 'pgmo[mpi]'`` puts mpiexec
in the environment's ``bin/``)::

    mpiexec -n 2 python examples/train_mn.py --arch resnet50 --batchsize 32
    mpiexec -n 2 python examples/train_mn.py --device -1 --arch mlp --insize 8 \\
        --batchsize 4 --iterations 4 --classes 4          # CPU smoke run

Each rank trains on the GPU of its intra-node rank (ranks share GPUs when
there are more ranks than GPUs) with its own pgmo pool, made by
``pgmo.chainer``'s extension under ChainerMN's multi-node optimizer: the pool
profiles and plans that rank's requests and, with ``--out``, saves its plan
in its own file there.  ``--batchsize`` is per rank.  Rank 0's weights are
broadcast at the first update (each rank starts from other random weights),
gradients are averaged at every update, and the multi-node evaluator averages
the validation loss over the ranks.  At the end rank 0 prints every rank's
pool statistics and a digest of its parameters, which must be identical.
"""

import hashlib
import logging
import os
import sys
import tempfile

from pgmo import programs

programs.start(__name__)  # Ctrl-C from here on: one line, exit status 130
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pgmo.chainermn  # noqa: E402  (applies the Chainer compatibility layer first)

import chainer  # noqa: E402
import chainer.functions as F  # noqa: E402
import chainer.links as L  # noqa: E402
import chainermn  # noqa: E402
import numpy as np  # noqa: E402
from chainer import training  # noqa: E402
from chainer.training import extensions  # noqa: E402
from mpi4py import MPI  # noqa: E402

from measure import (  # noqa: E402
    NA, add_device_option, add_pgmo_options, mib, pick_device, pgmo_options, print_table,
    report_stream, require_positive,
)
from models import ARCHS  # noqa: E402
from models.base import ImageNetModel  # noqa: E402
from train_imagenet import SyntheticImageNet  # noqa: E402


class MLP(ImageNetModel):
    """A two-layer perceptron on the flattened images: the CPU smoke run's model."""

    insize = 8
    min_insize = 1

    def __init__(self, n_classes=10, insize=8, units=32):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(3 * insize * insize, units)
            self.l2 = L.Linear(units, n_classes)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


def make_model(args):
    if args.arch == "mlp":
        return MLP(args.classes, args.insize)
    return ARCHS[args.arch](n_classes=args.classes)


def digest(model):
    """The first 16 hex digits of a SHA-256 over every parameter (name and bytes)."""
    h = hashlib.sha256()
    for name, param in sorted(model.namedparams()):
        if param.array is not None:
            h.update(name.encode())
            h.update(np.ascontiguousarray(chainer.backends.cuda.to_cpu(param.array)).tobytes())
    return h.hexdigest()[:16]


def scattered(comm, size, args, seed):
    """``size`` synthetic examples made on rank 0, a different share on each rank."""
    data = SyntheticImageNet(size, args.insize, args.classes, seed) if comm.rank == 0 else None
    return chainermn.scatter_dataset(data, comm, shuffle=True, seed=seed)


def train(args, comm, out):
    rank = pgmo.chainermn.setup_rank(comm, gpu=args.device >= 0, plan_dir=args.out,
                                     **pgmo_options(args))
    np.random.seed(args.seed + comm.rank)  # other initial weights on each rank
    model = make_model(args)
    model.to_device(rank.device)
    start = digest(model)
    optimizer = chainermn.create_multi_node_optimizer(
        chainer.optimizers.MomentumSGD(lr=0.01, momentum=0.9), comm)
    optimizer.setup(model)

    per_rank = args.batchsize * comm.size
    train_data = scattered(comm, 4 * per_rank, args, args.seed)
    valid_data = scattered(comm, 2 * per_rank, args, args.seed + 1)
    iterator = chainer.iterators.SerialIterator(train_data, args.batchsize, shuffle=False)
    valid_iterator = chainer.iterators.SerialIterator(valid_data, args.batchsize,
                                                      repeat=False, shuffle=False)
    updater = training.updaters.StandardUpdater(iterator, optimizer, device=rank.device)
    trainer = training.Trainer(updater, (args.iterations, "iteration"), out=out)
    rank.extend(trainer)
    evaluator = extensions.Evaluator(valid_iterator, model, device=rank.device)
    trainer.extend(chainermn.create_multi_node_evaluator(evaluator, comm),
                   trigger=(args.eval_interval or args.iterations, "iteration"))
    if comm.rank == 0:
        # On the CPU the pools receive no request: no counts to show
        counts = ["pgmo/planned_requests", "pgmo/departed_requests", "pgmo/pinned_requests"] \
            if args.device >= 0 else []
        trainer.extend(extensions.LogReport(trigger=(1, "iteration")))
        trainer.extend(extensions.PrintReport(
            ["iteration", "main/loss", "validation/main/loss", *counts, "elapsed_time"],
            out=report_stream()))
    trainer.run()
    return rank, start, digest(model)


COLUMNS = ("rank", "host", "device", "iters", "pgmo mode", "requests", "planned", "fallback",
           "pinned", "planned peak", "held, peak", "params at start", "params at end")


def report(rows, digests, comm_name):
    """Print every rank's pool and parameters (rank 0); True when the parameters agree."""
    table = []
    for row, (start, end) in zip(rows, digests):
        s = row.stats
        pool = [s.mode, s.requests, s.planned_requests, s.departed_requests,
                s.pinned_requests, mib(s.planned_peak), mib(s.peak_total_bytes)] \
            if row.device_id >= 0 else [NA] * 7
        table.append([row.rank, row.host, "CPU" if row.device_id < 0 else f"GPU {row.device_id}",
                      s.iterations, *pool, start, end])
    print_table(f"Every rank's pgmo pool ({comm_name}; pinned: requests whose blocks outlive "
                "their iteration, served by the stock pool as planned)", COLUMNS, table)
    same = len({end for _, end in digests}) == 1
    print(f"parameters identical on all {len(digests)} ranks: {'yes' if same else 'NO'}")
    if rows[0].device_id >= 0:
        optimized = sum(row.stats.mode == "optimized" for row in rows)
        print(f"pools optimized: {optimized} of {len(rows)}; fallback requests: "
              f"{sum(row.stats.departed_requests for row in rows)} "
              f"(pinned requests: {sum(row.stats.pinned_requests for row in rows)})")
    else:
        print(f"On the CPU Chainer computes with NumPy, not CuPy: the pools' columns read {NA}.")
    return same


def parse_args(argv=None):
    parser = programs.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", choices=["mlp", *sorted(ARCHS)], default="resnet50")
    parser.add_argument("--batchsize", "-b", type=int, default=32, help="per rank")
    parser.add_argument("--iterations", "-i", type=int, default=20)
    add_device_option(parser, choices=(-1, 0),
                      help="0: each rank on the GPU of its intra-node rank (pick GPUs with "
                           "CUDA_VISIBLE_DEVICES); -1: the CPU (default: 0 when CuPy sees a "
                           "GPU, else -1, with a note)")
    parser.add_argument("--communicator", "-c", choices=pgmo.chainermn.COMMUNICATORS,
                        default="auto", help="auto: naive on the CPU; pure_nccl when every "
                        "rank has its own GPU and NCCL loads; else host_staged")
    parser.add_argument("--out", "-o", default=None, type=programs.output_folder,
                        metavar="DIR", help="folder for each rank's plan file and the log, "
                                            "made if new (default: plans kept in memory)")
    parser.add_argument("--insize", type=int, default=None,
                        help="image size (default: the model's published size)")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--eval-interval", type=int, default=0,
                        help="iterations between evaluations (default: at the end)")
    add_pgmo_options(parser, warmup=pgmo.chainermn.MN_WARMUP)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    require_positive(parser, args, ("batchsize", "iterations", "classes"))
    model = MLP if args.arch == "mlp" else ARCHS[args.arch]
    args.insize = args.insize or model.insize
    if args.insize < model.min_insize:
        parser.error(f"--insize {args.insize} is too small for {args.arch} "
                     f"(at least {model.min_insize})")
    return args


def main(argv=None):
    logging.basicConfig(level=logging.INFO,
                        format=f"[rank {MPI.COMM_WORLD.rank}] %(name)s: %(message)s")
    args = parse_args(argv)
    pick_device(args, quiet=MPI.COMM_WORLD.rank != 0)  # one note, from rank 0
    chainermn.global_except_hook.add_hook()  # one rank failing stops them all, none hangs
    comm = pgmo.chainermn.create_communicator(args.communicator, gpu=args.device >= 0)
    with tempfile.TemporaryDirectory() as scratch:
        rank, start, end = train(args, comm, args.out or scratch)
    rows, digests = rank.gather_stats(), comm.gather_obj((start, end))
    if comm.rank == 0 and not report(rows, digests, type(comm).__name__):
        sys.exit(1)


def abort_the_job() -> None:
    """After this rank's Ctrl-C line: end every rank.  Ctrl-C reaches the ranks at different
    points, and a rank that stopped would wait in MPI's finalize for ranks still in a
    collective, which wait for it (the job hung)."""
    if MPI.COMM_WORLD.size > 1:
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(programs.INTERRUPTED)


if __name__ == "__main__":  # rank 0 reports every iteration; the others stay quiet
    sys.exit(programs.run(main, heartbeat=None if MPI.COMM_WORLD.rank else
                          programs.HEARTBEAT_SECONDS, on_interrupt=abort_the_job))
