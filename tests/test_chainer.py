"""The Chainer trainer extension, on the CPU with pgmo's host-memory pool.

The model's forward allocates through CuPy's current allocator
(``cupy.cuda.alloc``), the way CuPy arrays do on a GPU, so these tests see
whether the extension really installed the pool and marked the iterations.
"""

import io
import logging
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pgmo import _chainer_compat

_chainer_compat.apply()
chainer = pytest.importorskip("chainer")
cupy = pytest.importorskip("cupy")

from chainer import training  # noqa: E402
from chainer.training import extensions  # noqa: E402

from pgmo.chainer import ProfileGuidedMemory  # noqa: E402
from pgmo.measure.hosts import host_pool  # noqa: E402

from .allocating_model import REQUESTS_PER_UPDATE, AllocatingModel, allocate_pattern  # noqa: E402,E501

pytestmark = pytest.mark.chainer

def make_trainer(stop, ext=None, out="result", updater=None):
    """A tiny trainer on random regression data, with ``ext`` if given."""
    rng = np.random.default_rng(0)
    data = chainer.datasets.TupleDataset(rng.random((8, 3), dtype=np.float32),
                                         rng.random((8, 1), dtype=np.float32))
    model = AllocatingModel()
    optimizer = chainer.optimizers.SGD(0.1)
    optimizer.setup(model)
    if updater is None:
        iterator = chainer.iterators.SerialIterator(data, 2, shuffle=False)
        updater = training.updaters.StandardUpdater(iterator, optimizer)
    trainer = training.Trainer(updater, (stop, "iteration"), out=str(out))
    if ext is not None:
        trainer.extend(ext)
    return trainer


class Observations(training.Extension):
    """Keeps a copy of the trainer's observation after each update."""

    trigger = 1, "iteration"
    priority = training.PRIORITY_READER

    def __init__(self):
        self.seen = []

    def __call__(self, trainer):
        self.seen.append(dict(trainer.observation))


class AllocatingExtension(training.Extension):
    """An extension that allocates device memory of its own after each update."""

    trigger = 1, "iteration"

    def __call__(self, trainer):
        blocks = [cupy.cuda.alloc(s) for s in (700, 30000, 100)]
        del blocks


@pytest.fixture
def allocator_guard():
    """Fail a test that leaves CuPy's allocator changed; restore it anyway."""
    before = cupy.cuda.get_allocator()
    yield before
    after = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(before)
    assert after == before, "CuPy's allocator was not restored"


def test_each_update_is_one_pool_iteration(tmp_path, allocator_guard):
    pool = host_pool()
    trainer = make_trainer(6, ProfileGuidedMemory(pool), tmp_path)
    trainer.extend(AllocatingExtension())
    trainer.run()

    stats = pool.stats()
    assert stats.iterations == trainer.updater.iteration == 6
    # All of the model's requests reached the pool (it was CuPy's allocator),
    # and from the third update on (1 warm-up, 1 profiled) they used the plan.
    assert stats.mode == "optimized"
    assert stats.planned_requests == 4 * REQUESTS_PER_UPDATE
    assert len(pool.plan.trace) == REQUESTS_PER_UPDATE
    # The extension's own requests came between iterations: outside the plan,
    # so they neither diverged an iteration nor forced a re-optimization.
    assert stats.requests == 6 * (REQUESTS_PER_UPDATE + 3)
    assert stats.departures == 0 and stats.reoptimizations == 0
    assert stats.departed_requests == 0


def test_stats_reach_log_and_print_report_in_the_same_iteration(tmp_path, allocator_guard):
    pool = host_pool(page=512)  # a small arena: PrintReport prints it as a plain integer
    observations = Observations()
    printed = io.StringIO()
    trainer = make_trainer(4, ProfileGuidedMemory(pool), tmp_path)
    trainer.extend(observations)
    log_report = extensions.LogReport(trigger=(1, "iteration"))
    trainer.extend(log_report)
    trainer.extend(extensions.PrintReport(["iteration", "pgmo/iterations", "pgmo/arena_bytes"],
                                          out=printed))
    trainer.run()

    assert [o["pgmo/iterations"] for o in observations.seen] == [1, 2, 3, 4]
    # LogReport averages what is reported, so the mode (a string) is left out.
    assert not any("pgmo/mode" in o for o in observations.seen)
    log = log_report.log
    assert [entry["pgmo/iterations"] for entry in log] == [1, 2, 3, 4]
    # The arena appears at the end of the profiled (second) update.
    assert log[0]["pgmo/arena_bytes"] == 0
    assert log[-1]["pgmo/arena_bytes"] == pool.stats().arena_bytes > 0
    # fallback_requests: departed_requests' old name, still reported for one release
    assert {"pgmo/planned_peak", "pgmo/departed_requests", "pgmo/fallback_requests",
            "pgmo/reoptimizations", "pgmo/total_bytes"} <= set(log[-1])
    lines = [line.split() for line in printed.getvalue().replace("\x1b[J", "").splitlines()]
    assert lines[0] == ["iteration", "pgmo/iterations", "pgmo/arena_bytes"]
    assert lines[-1] == ["4", "4", str(pool.stats().arena_bytes)]


def test_chosen_keys_and_prefix(tmp_path, allocator_guard):
    observations = Observations()
    trainer = make_trainer(2, ProfileGuidedMemory(host_pool(), keys=["peak_used_bytes"],
                                                  prefix="mem/"), tmp_path)
    trainer.extend(observations)
    trainer.run()
    reported = {k for k in observations.seen[-1] if k.startswith(("mem/", "pgmo/"))}
    assert reported == {"mem/peak_used_bytes"}


@pytest.mark.parametrize("keys, said", [
    (["arena_byts"], "'arena_byts' is not an integer of pgmo.PoolStats; did you mean "
                     "'arena_bytes'?"),
    (["requests", "mode"], "'mode' is not an integer of pgmo.PoolStats"),  # LogReport averages
])
def test_a_key_that_is_no_integer_stat_is_refused_when_the_extension_is_made(keys, said):
    with pytest.raises(ValueError, match=re.escape(said)):
        ProfileGuidedMemory(host_pool(), keys=keys)


def test_every_key_reported_by_default_can_be_chosen():
    default = set(host_pool().stats().numbers())
    assert ProfileGuidedMemory(host_pool(), keys=sorted(default))._keys == tuple(sorted(default))
    assert ProfileGuidedMemory(host_pool(), keys="requests")._keys == ("requests",)


def test_allocator_and_update_restored_after_run(tmp_path, allocator_guard):
    previous = host_pool()  # whatever allocator the user had before training
    cupy.cuda.set_allocator(previous.malloc)
    pool = host_pool()
    trainer = make_trainer(3, ProfileGuidedMemory(pool), tmp_path)
    updater = trainer.updater
    trainer.run()
    assert cupy.cuda.get_allocator() == previous.malloc
    assert "update" not in vars(updater)
    assert updater.update.__func__ is type(updater).update
    assert previous.stats().requests == 0
    requests = pool.stats().requests
    del allocate_pattern()[:]  # after training: served by the previous allocator again
    assert pool.stats().requests == requests
    assert previous.stats().requests == REQUESTS_PER_UPDATE
    cupy.cuda.set_allocator(allocator_guard)


class FailingUpdater(training.updaters.StandardUpdater):
    def update_core(self):
        if self.iteration == 2:
            raise RuntimeError("boom in update 3")
        super().update_core()


def test_allocator_restored_when_an_update_raises(tmp_path, allocator_guard):
    pool = host_pool()
    rng = np.random.default_rng(1)
    data = chainer.datasets.TupleDataset(rng.random((4, 3), dtype=np.float32),
                                         rng.random((4, 1), dtype=np.float32))
    model = AllocatingModel()
    optimizer = chainer.optimizers.SGD(0.1)
    optimizer.setup(model)
    updater = FailingUpdater(chainer.iterators.SerialIterator(data, 2), optimizer)
    trainer = make_trainer(5, ProfileGuidedMemory(pool), tmp_path, updater=updater)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.run(show_loop_exception_msg=False)
    assert cupy.cuda.get_allocator() == allocator_guard
    assert "update" not in vars(updater)
    assert not pool.engine.in_iteration  # the failed update closed its iteration
    with pool.iteration():  # and the pool is usable again
        pass


class FailingInitializer(training.Extension):
    def initialize(self, trainer):
        raise ValueError("cannot start")

    def __call__(self, trainer):
        pass


def test_nothing_left_behind_when_another_extension_fails_to_start(tmp_path, allocator_guard):
    pool = host_pool()
    trainer = make_trainer(3, ProfileGuidedMemory(pool), tmp_path)
    trainer.extend(FailingInitializer())
    with pytest.raises(ValueError, match="cannot start"):
        trainer.run()
    assert cupy.cuda.get_allocator() == allocator_guard
    assert "update" not in vars(trainer.updater)
    assert pool.stats().iterations == 0


class CountingUpdater(training.Updater):
    """A custom updater, not a StandardUpdater: one optimizer step per update."""

    def __init__(self, optimizer, batch):
        self.optimizer = optimizer
        self.batch = batch
        self.iteration = 0
        self.epoch = 0
        self.epoch_detail = 0.0
        self.is_new_epoch = False

    def get_optimizer(self, name):
        return self.optimizer

    def get_all_optimizers(self):
        return {"main": self.optimizer}

    def connect_trainer(self, trainer):
        pass

    def finalize(self):
        pass

    def update(self):
        self.optimizer.update(self.optimizer.target, *self.batch)
        self.iteration += 1

    def serialize(self, serializer):
        self.iteration = serializer("iteration", self.iteration)


def test_custom_updater(tmp_path, allocator_guard):
    pool = host_pool()
    model = AllocatingModel()
    optimizer = chainer.optimizers.SGD(0.1)
    optimizer.setup(model)
    batch = (np.ones((2, 3), np.float32), np.zeros((2, 1), np.float32))
    updater = CountingUpdater(optimizer, batch)
    observations = Observations()
    trainer = make_trainer(5, ProfileGuidedMemory(pool), tmp_path, updater=updater)
    trainer.extend(observations)
    trainer.run()
    assert pool.stats().iterations == updater.iteration == 5
    assert pool.stats().planned_requests == 3 * REQUESTS_PER_UPDATE
    assert [o["pgmo/iterations"] for o in observations.seen] == [1, 2, 3, 4, 5]
    assert "update" not in vars(updater)


def test_snapshot_resume_keeps_the_plan(tmp_path, allocator_guard):
    first_pool = host_pool()
    first = make_trainer(4, ProfileGuidedMemory(first_pool), tmp_path / "a")
    first.run()
    snapshot = str(tmp_path / "snapshot.npz")
    chainer.serializers.save_npz(snapshot, first)
    planned = first_pool.plan
    assert planned is not None

    resumed_pool = host_pool()
    resumed = make_trainer(8, ProfileGuidedMemory(resumed_pool), tmp_path / "b")
    chainer.serializers.load_npz(snapshot, resumed)
    assert resumed.updater.iteration == 4
    assert resumed_pool.plan.offsets == planned.offsets
    assert resumed_pool.profile == first_pool.profile

    resumed.run()
    stats = resumed_pool.stats()
    # One warm-up update (the pool's default), then three updates from the
    # loaded plan: no profiled update, no new solve.
    assert stats.iterations == 4
    assert stats.mode == "optimized"
    assert stats.profiled_requests == REQUESTS_PER_UPDATE  # the warm-up only
    assert stats.planned_requests == 3 * REQUESTS_PER_UPDATE
    assert stats.reoptimizations == 0
    assert resumed_pool.plan.offsets == planned.offsets


def test_resume_without_warmup_starts_optimized(tmp_path, allocator_guard):
    first_pool = host_pool()
    first = make_trainer(3, ProfileGuidedMemory(first_pool), tmp_path / "a")
    first.run()
    snapshot = str(tmp_path / "snapshot.npz")
    chainer.serializers.save_npz(snapshot, first)

    resumed_pool = host_pool(warmup=0)
    resumed = make_trainer(5, ProfileGuidedMemory(resumed_pool), tmp_path / "b")
    chainer.serializers.load_npz(snapshot, resumed)
    assert resumed_pool.mode == "optimized"
    resumed.run()
    assert resumed_pool.stats().planned_requests == 2 * REQUESTS_PER_UPDATE
    assert resumed_pool.stats().profiled_requests == 0


def test_snapshot_before_any_plan_resumes_profiling(tmp_path, allocator_guard):
    first = make_trainer(1, ProfileGuidedMemory(host_pool()), tmp_path / "a")
    first.run()  # warm-up only: no plan yet
    snapshot = str(tmp_path / "snapshot.npz")
    chainer.serializers.save_npz(snapshot, first)
    resumed_pool = host_pool()
    resumed = make_trainer(4, ProfileGuidedMemory(resumed_pool), tmp_path / "b")
    chainer.serializers.load_npz(snapshot, resumed)
    assert resumed_pool.plan is None and resumed_pool.mode == "warmup"  # then profiling
    resumed.run()
    assert resumed_pool.plan is not None


def test_damaged_snapshot_state_profiles_again(tmp_path, allocator_guard, caplog):
    first = make_trainer(3, ProfileGuidedMemory(host_pool()), tmp_path / "a")
    first.run()
    snapshot = tmp_path / "snapshot.npz"
    chainer.serializers.save_npz(str(snapshot), first)
    with np.load(snapshot) as npz:
        arrays = dict(npz)
    key = "extensions/ProfileGuidedMemory/pool_state"
    state = arrays[key].copy()
    state[len(state) // 2] ^= 0xFF
    arrays[key] = state
    np.savez(snapshot, **arrays)

    resumed_pool = host_pool()
    resumed = make_trainer(6, ProfileGuidedMemory(resumed_pool), tmp_path / "b")
    with caplog.at_level(logging.WARNING, logger="pgmo.chainer"):
        chainer.serializers.load_npz(str(snapshot), resumed)
    assert "unusable" in caplog.text
    assert resumed_pool.plan is None and resumed_pool.mode == "warmup"  # then profiling
    resumed.run()  # and training goes on, profiling afresh
    assert resumed_pool.plan is not None


def test_a_snapshot_taken_without_the_extension_resumes_with_it(tmp_path, allocator_guard):
    # A run that adds pgmo to a training whose snapshots were taken without it.
    first = make_trainer(3, out=tmp_path / "a")
    before, plain_pool = cupy.cuda.get_allocator(), host_pool()
    cupy.cuda.set_allocator(plain_pool.malloc)  # the model allocates through CuPy
    try:
        first.run()
    finally:
        cupy.cuda.set_allocator(before)
    snapshot = str(tmp_path / "snapshot.npz")
    chainer.serializers.save_npz(snapshot, first)

    resumed_pool = host_pool()
    resumed = make_trainer(6, ProfileGuidedMemory(resumed_pool), tmp_path / "b")
    chainer.serializers.load_npz(snapshot, resumed)
    assert resumed.updater.iteration == 3  # the rest of the snapshot was loaded
    assert resumed_pool.plan is None and resumed_pool.mode == "warmup"  # then profiling
    resumed.run()
    assert resumed_pool.plan is not None and resumed_pool.stats().iterations == 3


def test_pool_and_pool_options_are_exclusive():
    with pytest.raises(TypeError, match="either a pool or options"):
        ProfileGuidedMemory(host_pool(), warmup=2)


def check_default_pool(ext, warmup):
    """What a user of ``ProfileGuidedMemory(warmup=...)`` relies on: its own pool is pgmo's,
    a CuPy pool, that serves the first ``warmup`` iterations as warm-up, then profiles."""
    from pgmo.pool import ProfileGuidedMemoryPool

    pool = ext.pool
    assert isinstance(pool, ProfileGuidedMemoryPool) and isinstance(pool, cupy.cuda.MemoryPool)
    modes = []
    for _ in range(warmup + 1):
        modes.append(pool.mode)
        with pool.iteration():
            pass
    assert modes == ["warmup"] * warmup + ["profiling"]


def test_default_pool_gets_the_options(monkeypatch):
    """The extension's default pool, made on host memory: the same checks as on the GPU."""
    import pgmo.pool
    import pgmo.testing

    made = []
    real_pool = pgmo.pool.ProfileGuidedMemoryPool

    def made_on_the_host(**options):  # the real class, on host memory
        made.append(options)
        memory = pgmo.testing.HostMemory()
        return real_pool(memory, fallback=pgmo.testing.HostFallback(memory), device_id=0,
                         context=None, total_memory=2**40, **options)

    monkeypatch.setattr(pgmo.pool, "ProfileGuidedMemoryPool", made_on_the_host)
    ext = ProfileGuidedMemory(warmup=3, method="bestfit")
    assert made == []  # nothing is made before it is needed
    assert ext.pool is ext.pool
    assert made == [{"warmup": 3, "method": "bestfit"}]
    monkeypatch.undo()  # the class again, for the checks
    check_default_pool(ext, warmup=3)


@pytest.mark.gpu
def test_default_pool_is_a_cupy_pool_on_the_gpu():
    """The same checks, with the pool made on the device."""
    check_default_pool(ProfileGuidedMemory(warmup=2), warmup=2)


def _run_python(code):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=env)


def test_compat_imports_chainer_without_numpy_distutils_or_pkg_resources():
    """Python >= 3.12 has no numpy.distutils; setuptools >= 82 has no pkg_resources."""
    result = _run_python("""
        import sys
        sys.modules["numpy.distutils"] = None       # makes 'import numpy.distutils' fail
        sys.modules["pkg_resources"] = None
        import numpy
        assert not hasattr(numpy, "sctypes")
        import pgmo.chainer, chainer
        import chainer.functions as F, chainer.links as L
        x = numpy.ones((1, 2, 4, 4), numpy.float32)
        y = F.softmax_cross_entropy(L.Linear(None, 3)(L.Convolution2D(2, 2, 3)(x)),
                                    numpy.array([1], numpy.int32))
        y.backward()
        assert numpy.sctypes["int"] == [numpy.int8, numpy.int16, numpy.int32, numpy.int64]
        print("ok", chainer.__version__)
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["ok", "7.8.1"]


def test_compat_is_idempotent_and_leaves_present_names_alone():
    result = _run_python("""
        import numpy
        sentinel = {"int": []}
        numpy.sctypes = sentinel                    # as on NumPy 1.x: present already
        from pgmo import _chainer_compat
        _chainer_compat.apply(); _chainer_compat.apply()
        assert numpy.sctypes is sentinel
        import sys
        check = sys.modules["chainer._environment_check"]
        _chainer_compat.apply()
        assert sys.modules["chainer._environment_check"] is check
        print("ok")
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"


def test_chainer_imports_after_a_failed_import_once_pgmo_chainer_is_imported():
    """A notebook: ``import chainer`` fails under NumPy 2, the user adds pgmo.chainer first."""
    result = _run_python("""
        import numpy
        if hasattr(numpy, "sctypes"):               # NumPy 1.x: nothing fails to begin with
            print("ok numpy1"); raise SystemExit
        try:
            import chainer
        except AttributeError:
            pass
        else:
            raise AssertionError("chainer imported under NumPy 2 without pgmo")
        import pgmo.chainer
        import chainer
        import chainer.functions as F, chainer.links as L
        F.sum(L.Linear(3, 2)(numpy.ones((1, 3), numpy.float32))).backward()
        print("ok", chainer.__version__)
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() in (["ok", "7.8.1"], ["ok", "numpy1"])
