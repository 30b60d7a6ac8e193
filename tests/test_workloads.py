"""The family of variable workloads: whole runs made from a seed, well formed, as varied as
they claim, and replayed by the pool with every block checked."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgmo import workloads
from pgmo.runs import Run, read_run
from pgmo.measure.hosts import host_engine
from pgmo.measure.replay import replay_run

GENERATED = ["lstm-random", "lstm-bucketed", "lstm-growing", "lstm-outliers", "serving",
             "cnn-resolutions"]

#: Small versions of each member: a few thousand requests, sizes / 100.
SMALL = {
    "lstm-random": dict(iterations=5, scale=0.01, max_len=12, layers=2),
    "lstm-bucketed": dict(iterations=8, scale=0.01, buckets=(4, 6, 8, 10, 12), layers=2),
    "lstm-growing": dict(iterations=6, scale=0.01, start=2, stop=12, layers=2),
    "lstm-outliers": dict(iterations=10, scale=0.01, short=(2, 4), rate=0.2, layers=2),
    "serving": dict(iterations=10, scale=0.01, burst=(1, 3), blocks=(1, 1, 1, 1)),
    "cnn-resolutions": dict(iterations=8, scale=0.01, blocks=(1, 1, 1, 1),
                            resolutions=(64, 96, 128, 160)),
}

seeds = st.integers(0, 2 ** 32 - 1)


def own_requests(run: Run) -> dict[int, list[tuple]]:
    """Per iteration, its allocations as (alloc tick, free tick or None, size), ticks
    counted from its beginning (None too for a block freed after it ends)."""
    where = run.iteration_of()
    out: dict[int, list[tuple]] = {k: [] for k in range(len(run.iterations))}
    for i, b in enumerate(run.trace.blocks):
        k = where[i]
        if k >= 0:
            begin, end = run.iterations[k]
            upper = b.upper - begin if b.upper is not None and b.upper <= end else None
            out[k].append((b.lower - begin, upper, b.size))
    return out


def survivors(run: Run, k: int) -> list[int]:
    """The sizes of the blocks iteration ``k`` makes that outlive it."""
    return sorted(size for _, upper, size in own_requests(run)[k] if upper is None)


def test_the_family_is_named_in_order_and_a_stranger_is_refused():
    assert workloads.names() == GENERATED + ["seq2seq-recorded"] == list(workloads.FAMILY)
    with pytest.raises(ValueError, match="no workload 'lstm'; the family is lstm-random, "):
        workloads.make("lstm")


@pytest.mark.parametrize("name", GENERATED)
@pytest.mark.parametrize("bad, message", [(dict(iterations=0), "iterations must be"),
                                          (dict(scale=0), "scale must be")])
def test_bad_sizes_are_named(name, bad, message):
    with pytest.raises(ValueError, match=message):
        workloads.make(name, **{**SMALL[name], **bad})


@pytest.mark.parametrize("name", GENERATED)
@settings(max_examples=6)
@given(seed=seeds)
def test_a_member_is_a_well_formed_run_made_from_its_seed(name, seed):
    run = workloads.make(name, seed, **SMALL[name])
    again = workloads.make(name, seed, **SMALL[name])
    assert run.trace.blocks == again.trace.blocks and run.iterations == again.iterations
    assert run.metadata == again.metadata
    meta = run.metadata
    assert (meta["workload"], meta["seed"], meta["synthetic"]) == (name, seed, True)
    assert meta["parameters"]["iterations"] == SMALL[name]["iterations"] == len(run.iterations)
    assert meta["how"] and len(meta["shapes"]) == len(run.iterations)
    # the event clock: one alloc or free per tick, block i the i-th request
    ticks = [b.lower for b in run.trace.blocks] + [b.upper for b in run.trace.blocks
                                                  if b.upper is not None]
    assert sorted(ticks) == list(range(len(ticks)))
    assert [b.id for b in run.trace.blocks] == list(range(len(run)))
    assert all(b.size > 0 and (b.upper is None or b.upper > b.lower) for b in run.trace.blocks)
    # iterations ordered, not overlapping, not empty, every request of a training run in one
    marks = [t for it in run.iterations for t in it]
    assert marks == sorted(marks) and all(b < e for b, e in run.iterations)
    where = run.iteration_of()
    outside = [i for i, k in enumerate(where) if k < 0]
    if name == "serving":  # the model is loaded before the first request
        assert outside == list(range(len(outside))) and outside
    else:
        assert outside == []


@pytest.mark.parametrize("name", GENERATED)
@settings(max_examples=6)
@given(seed=seeds)
def test_an_iterations_requests_are_its_shape_and_only_weights_state_and_gradients_live_on(
        name, seed):
    run = workloads.make(name, seed, **SMALL[name])
    shapes = [tuple(s) if isinstance(s, list) else s for s in run.metadata["shapes"]]
    own = own_requests(run)
    # after the first (which makes the weights), one shape is one sequence of requests
    by_shape: dict = {}
    for k in range(1, len(shapes)):
        by_shape.setdefault(shapes[k], set()).add(tuple(own[k]))
    assert all(len(seen) == 1 for seen in by_shape.values())
    assert len({next(iter(seen)) for seen in by_shape.values()}) == len(by_shape)
    # long-lived blocks: the weights, never freed; later iterations leave only gradients,
    # the same every time, each the size of a weight, freed by the next iteration
    opened = [b.size for b in run.trace.blocks if b.upper is None]
    assert opened and run.bounds().long_lived > 0
    later = [survivors(run, k) for k in range(1, len(shapes))]
    if name == "serving":
        assert survivors(run, 0) == [] and not any(later)
    else:
        assert len({tuple(s) for s in later}) == 1 and later[0]
        assert not Counter(later[0]) - Counter(opened)
    where = run.iteration_of()
    for i, b in enumerate(run.trace.blocks):
        k = where[i]
        if 0 < k < len(shapes) - 1:
            assert b.upper is not None and b.upper <= run.iterations[k + 1][1], (k, b)


@pytest.mark.parametrize("name", GENERATED)
@given(seed=seeds)
@settings(max_examples=3)
def test_different_seeds_give_different_runs(name, seed):
    shapes = [workloads.make(name, s, **SMALL[name]).metadata["shapes"]
              for s in (seed, seed + 1, seed + 2)]
    assert shapes[0] != shapes[1] or shapes[1] != shapes[2]


@pytest.mark.parametrize("name", GENERATED)
@pytest.mark.parametrize("replan", ["sync", "bestfit"])
@settings(max_examples=3)
@given(seed=seeds)
def test_a_member_replays_through_the_pool_every_block_checked(name, replan, seed):
    run = workloads.make(name, seed, **SMALL[name])
    engine = host_engine(replan=replan)
    try:
        result = replay_run(run, engine)
    finally:
        engine.close()
    assert (result["corrupted"], result["overlaps"]) == (0, 0)
    assert result["requests"] == len(run) and result["iterations"] == len(run.iterations)


def test_the_default_runs_vary_as_their_names_say_and_stay_small():
    runs = {name: workloads.make(name) for name in GENERATED}
    for name, run in runs.items():
        assert len(run) <= 50_000, name  # replayed in seconds
        assert len({str(s) for s in run.metadata["shapes"]}) > 1, name
    def recurring(name):
        counts = Counter(str(s) for s in runs[name].metadata["shapes"])
        return max(counts.values())
    for name in ("lstm-bucketed", "serving", "cnn-resolutions"):
        assert recurring(name) >= 5, name  # a shape comes back
    growing = [max(s) for s in runs["lstm-growing"].metadata["shapes"]]
    assert max(growing[:5]) <= 12 and max(growing[-5:]) >= 30
    outliers = runs["lstm-outliers"].metadata
    assert outliers["outliers"]
    longest = [max(s) for s in outliers["shapes"]]
    chosen = outliers["outliers"]
    assert all(longest[k] >= 15 for k in chosen)
    assert all(n <= 15 for k, n in enumerate(longest) if k not in chosen)
    bounds = [b for b in runs["lstm-random"].bounds().iterations]
    assert max(bounds) > 3 * min(bounds)  # the largest iteration is several times the smallest


def test_the_recorded_run_ignores_the_seed_and_keeps_its_first_iterations():
    full = workloads.make("seq2seq-recorded")
    assert full.metadata["recorded_by"].startswith("scripts/record_runs.py")
    assert full.metadata["workload"] == "seq2seq-recorded" and len(full.iterations) == 30
    short = workloads.make("seq2seq-recorded", seed=7, iterations=2, scale=0.001)
    assert short.iterations == full.iterations[:2] and short.metadata["seed"] == 7
    cut = full.iterations[1][1]
    kept = [b for b in full.trace.blocks if b.lower < cut]
    assert len(short) == len(kept) < len(full)
    assert all(s.upper == (b.upper if b.upper is not None and b.upper <= cut else None)
               for s, b in zip(short.trace.blocks, kept))
    assert short.trace.blocks == workloads.make("seq2seq-recorded", seed=8, iterations=2,
                                                scale=0.001).trace.blocks
    engine = host_engine(replan="sync")
    try:
        result = replay_run(short, engine)
    finally:
        engine.close()
    assert (result["corrupted"], result["overlaps"], result["iterations"]) == (0, 0, 2)
    with pytest.raises(ValueError, match="has 30 iterations; asked for 31"):
        workloads.make("seq2seq-recorded", iterations=31)


def test_a_member_written_to_a_run_file_reads_back(tmp_path):
    path = tmp_path / "serving.run.json.gz"
    run = workloads.write("serving", path, seed=3, **SMALL["serving"])
    again = read_run(path)
    assert again.trace.blocks == run.trace.blocks and again.iterations == run.iterations
    assert again.metadata["workload"] == "serving" and again.metadata["seed"] == 3
