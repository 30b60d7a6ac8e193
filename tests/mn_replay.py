"""One MPI rank of tests/test_chainermn.py: replay a bundled trace through this rank's pool.

Run as ``mpiexec -n N python tests/mn_replay.py OUT_DIR ITERATIONS``.  Each rank
takes its pool from :func:`pgmo.chainermn.setup_rank` (what
``examples/train_mn.py --device -1`` does, here with the pool's own
background re-planning), replays its own bundled trace (:data:`TRACES`, by
rank) for ITERATIONS iterations, checking every byte, and writes
``OUT_DIR/rank<r>.json``; rank 0 adds what :meth:`~pgmo.chainermn.Rank.gather_stats`
collected from every rank.
"""

import dataclasses
import json
import os
import sys
import time

import pgmo.chainermn
from pgmo import bundled
from pgmo.measure.replay import replay

TRACES = ("synthetic-resnet50-infer-b1", "synthetic-seq2seq-train-b64")


def wait_for(path, seconds=60.0):
    """The background planner's thread writes the plan file: give it time."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return os.path.exists(path)


def main(out_dir, iterations):
    comm = pgmo.chainermn.create_communicator("auto", gpu=False)
    rank = pgmo.chainermn.setup_rank(comm, gpu=False, plan_dir=out_dir,
                                     replan="background", method="best", time_limit=5.0)
    name = TRACES[comm.rank % len(TRACES)]
    trace = bundled.load(name)
    # warm-up and profiled iterations, then the plan the worker makes from the profile
    first = replay([trace] * 3, rank.pool)
    assert rank.pool.engine.planner.wait_idle(60)
    result = replay([trace] * (iterations - 3), rank.pool)
    result["modes"] = first["modes"] + result["modes"]
    result["corrupted"] += first["corrupted"]
    result["overlaps"] += first["overlaps"]
    saved = wait_for(rank.plan_path)
    gathered = rank.gather_stats()
    record = {
        "rank": comm.rank, "size": comm.size, "communicator": type(comm).__name__,
        "trace": name, "plan_path": rank.plan_path, "plan_saved": saved,
        "device_id": rank.device_id, "device": str(rank.device),
        "modes": result["modes"], "corrupted": result["corrupted"],
        "overlaps": result["overlaps"], "stats": result["stats"].as_dict(),
        "gathered": None if gathered is None else [
            {**dataclasses.asdict(row), "stats": row.stats.as_dict()} for row in gathered],
    }
    with open(os.path.join(out_dir, f"rank{comm.rank}.json"), "w") as fh:
        json.dump(record, fh)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
