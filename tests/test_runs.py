"""Whole runs: iteration marks, run files, runs built from one iteration, the physical limit."""

from __future__ import annotations

import pytest

import pgmo
from pgmo.errors import TraceFormatError
from pgmo.runs import Run, RunRecorder, read_run, run_from_iteration, write_run


def tiny_run() -> Run:
    rec = RunRecorder()
    w = rec.alloc(100)  # outside any iteration: the weights
    for _ in range(2):
        rec.begin()
        a = rec.alloc(10)
        b = rec.alloc(20)
        rec.free(a)
        rec.free(b)
        rec.end()
    rec.free(w)
    return rec.run(model="tiny")


def test_the_recorder_marks_iterations_on_the_event_clock():
    run = tiny_run()
    assert run.iterations == ((1, 5), (5, 9))
    assert [k for k, _ in run.events()] == ["alloc", "begin", "alloc", "alloc", "free", "free",
                                            "end", "begin", "alloc", "alloc", "free", "free",
                                            "end", "free"]
    assert run.iteration_of() == [-1, 0, 0, 1, 1]
    assert run.lower_bound() == 130 and run.long_lived_bytes() == 100
    assert [b.id for b in run.long_lived()] == [0]


def test_misuse_of_the_recorder_is_refused():
    rec = RunRecorder()
    with pytest.raises(RuntimeError, match="without begin"):
        rec.end()
    rec.begin()
    with pytest.raises(RuntimeError, match="inside an iteration"):
        rec.begin()
    rec.alloc(8)
    assert rec.run().iterations == ((0, 1),)  # an open iteration ends where the run does


def test_a_run_file_reads_back_and_a_plain_trace_is_no_run(tmp_path):
    run = tiny_run()
    write_run(run, tmp_path / "tiny.run.json.gz")
    again = read_run(tmp_path / "tiny.run.json.gz")
    assert again.iterations == run.iterations and again.trace.blocks == run.trace.blocks
    assert again.metadata["model"] == "tiny"
    pgmo.write_trace(run.trace.without_open(), tmp_path / "plain.csv")
    with pytest.raises(TraceFormatError, match="plain.csv: no 'iterations'"):
        read_run(tmp_path / "plain.csv")


@pytest.mark.parametrize("iterations, message", [
    ([[5, 2]], "iteration 0: \\[5, 2\\) is not a tick range"),
    ([[0, 4], [2, 6]], "iteration 1 begins at tick 2, before the end of the one before it"),
    ("soon", "'iterations' must be a list of \\[begin, end\\] tick pairs"),
])
def test_bad_iteration_marks_are_named(tmp_path, iterations, message):
    trace = pgmo.Trace.from_tuples([(0, 2, 8)], metadata={"iterations": iterations})
    pgmo.write_trace(trace, tmp_path / "bad.json")
    with pytest.raises(TraceFormatError, match=message):
        read_run(tmp_path / "bad.json")


def test_a_run_from_one_iteration_keeps_weights_state_and_carries_gradients():
    # an iteration: activation 1000, a gradient 64 that outlives it, activation 500
    trace = pgmo.Trace.from_tuples([(0, 3, 1000), (1, None, 64), (2, 4, 500)])
    run = run_from_iteration(trace, 3, setup=[64], state=[64])
    assert run.iterations == ((0, 7), (7, 13), (13, 19))
    rows = [(b.lower, b.upper, b.size) for b in run.trace.blocks]
    assert rows[0] == (0, None, 64)  # the weights, made as the first iteration starts
    assert rows[4] == (6, None, 64)  # the optimizer state, made by the first update
    grads = [rows[2], rows[6], rows[9]]
    # each gradient is freed in the next iteration, just before the next one is made
    assert grads == [(2, 8, 64), (9, 14, 64), (15, None, 64)]
    assert run.long_lived_bytes() == 64 * 3  # weights, state, one gradient across a boundary
    assert run.lower_bound() == 64 + 64 + 64 + 1000 + 500


def test_a_recorded_iteration_says_when_the_last_gradients_die():
    """TraceRecorder's blocks from before the recording are the carried frees."""
    trace = pgmo.Trace.from_tuples([(0, 5, 512), (1, 3, 4096), (2, None, 512), (4, 6, 8)],
                                   metadata={"import": {"before_freed": {"count": 1}}})
    run = run_from_iteration(trace, 2)
    assert len(run) == 6  # the block from before is not repeated: it is the carried one
    carried = run.trace.blocks[1]
    small = run.trace.blocks[5]
    assert (carried.size, small.size) == (512, 8)
    # freed at the recorded tick: after the 8-byte block is made, before it dies
    assert small.lower < carried.upper < small.upper


def test_scaling_grows_activations_not_long_lived_blocks():
    trace = pgmo.Trace.from_tuples([(0, 2, 1000), (1, None, 100)])
    run = run_from_iteration(trace, 3, setup=[300])
    double = run.scaled(2.0)
    assert [b.size for b in double.trace.blocks] == [300, 2000, 100, 2000, 100, 2000, 100]
    assert double.metadata["activation_scale"] == 2.0
    # weights, an activation and one gradient at once, each rounded up to 512 B
    assert double.lower_bound_rounded() == 512 + 2048 + 512


def test_the_generated_variable_run_varies_in_its_number_of_requests():
    run = pgmo.synth.seq2seq_run(iterations=5, batch=2, hidden=16, vocab=40, layers=2)
    where = run.iteration_of()
    per_iteration = [where.count(k) for k in range(5)]
    assert len(set(per_iteration[1:])) > 1 and run.metadata["synthetic"] is True


def test_bounds_give_each_iterations_own_peak_and_the_long_lived_bytes():
    run = tiny_run()  # weights 100 outside; per iteration 10 and 20 live together
    assert run.iteration_lower_bounds(unit=1) == [30, 30]
    assert run.iteration_lower_bounds() == [1024, 1024]  # each size rounded up to 512 B
    assert run.long_lived_bytes_rounded(unit=1) == run.long_lived_bytes() == 100
    bounds = run.bounds()
    assert (bounds.physical, bounds.iterations, bounds.largest, bounds.long_lived) == (
        1536, (1024, 1024), 1024, 512)


def test_an_iterations_own_bound_leaves_its_survivors_apart_unless_asked():
    # activations 1000 and 500 overlap; weights (64) and a gradient (64) outlive the first
    # iteration, the optimizer state (64) is made at its end
    trace = pgmo.Trace.from_tuples([(0, 3, 1000), (1, None, 64), (2, 4, 500)])
    run = run_from_iteration(trace, 2, setup=[64], state=[64])
    assert run.iteration_lower_bounds(unit=1) == [1500, 1500]
    assert run.iteration_lower_bounds(unit=1, survivors=True) == [64 + 64 + 1500, 64 + 1500]
    assert run.long_lived_bytes_rounded(unit=1) == run.long_lived_bytes() == 3 * 64
    assert run.bounds(unit=1).physical == run.lower_bound()
