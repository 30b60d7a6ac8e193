"""One MPI rank of tests/test_chainermn.py: a Chainer trainer under ChainerMN whose model allocates.

Run as ``mpiexec -n N python tests/mn_trainer.py OUT_DIR ITERATIONS``.  The
model's forward makes a fixed pattern of requests through CuPy's current
allocator (as CuPy arrays do on a GPU), so the rank's host-memory pool, from
:func:`pgmo.chainermn.setup_rank` and installed by the extension, really
serves them: under ChainerMN's multi-node optimizer in each update, and under
the multi-node evaluator between updates.  Each rank writes
``OUT_DIR/trainer<r>.json``.
"""

import json
import os
import sys

import pgmo.chainermn

import chainer  # noqa: E402  (after pgmo.chainermn: the compatibility layer)
import chainermn  # noqa: E402
import cupy  # noqa: E402
import numpy as np  # noqa: E402
from chainer import training  # noqa: E402
from chainer.training import extensions  # noqa: E402

from allocating_model import AllocatingModel  # noqa: E402  (tests/, the script's folder)

def main(out_dir, iterations):
    allocator = cupy.cuda.get_allocator()
    comm = pgmo.chainermn.create_communicator(gpu=False)
    rank = pgmo.chainermn.setup_rank(comm, gpu=False)
    model = AllocatingModel()
    optimizer = chainermn.create_multi_node_optimizer(chainer.optimizers.SGD(0.1), comm)
    optimizer.setup(model)
    data = valid = None
    if comm.rank == 0:
        rng = np.random.default_rng(0)
        data = chainer.datasets.TupleDataset(rng.random((16, 3), dtype=np.float32),
                                             rng.random((16, 1), dtype=np.float32))
        valid = chainer.datasets.TupleDataset(rng.random((8, 3), dtype=np.float32),
                                              rng.random((8, 1), dtype=np.float32))
    data = chainermn.scatter_dataset(data, comm, shuffle=True, seed=0)
    valid = chainermn.scatter_dataset(valid, comm)
    updater = training.updaters.StandardUpdater(
        chainer.iterators.SerialIterator(data, 2), optimizer)
    trainer = training.Trainer(updater, (iterations, "iteration"), out=out_dir)
    rank.extend(trainer)
    evaluator = extensions.Evaluator(
        chainer.iterators.SerialIterator(valid, 2, repeat=False, shuffle=False), model)
    trainer.extend(chainermn.create_multi_node_evaluator(evaluator, comm), trigger=(2, "iteration"))
    trainer.run()
    record = {"rank": comm.rank, "stats": rank.pool.stats().as_dict(),
              "allocator_restored": cupy.cuda.get_allocator() == allocator}
    with open(os.path.join(out_dir, f"trainer{comm.rank}.json"), "w") as fh:
        json.dump(record, fh)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
