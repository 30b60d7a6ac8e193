"""The quick GPU check on the CPU: its stand-ins, each step's logic, its judgement, its dry run, and
the fit of the host model to its results.

The steps run in-process on :mod:`scripts.gpu_stand_ins` (host memory under
pgmo's real device layer, streams with queued work, the faults a GPU would
raise); each check that must fail is shown failing on a pool broken the way
the check is meant to catch (no device sync before an unmap, a free ordered
on another thread's stream, a driver that refuses).  The whole dry run runs
once, as a user starts it, and its ``quick-check.json`` is what the fit reads.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MiB, GiB = 2**20, 2**30

pytest.importorskip("cupy")  # pgmo's pool (the dry run's too) is CuPy's allocator


def script(name: str):
    return importlib.import_module(f"scripts.{name}")


stand_ins = script("gpu_stand_ins")
steps = script("quick_check_steps")
report = script("quick_check_report")
quick = script("gpu_quick_check")
fit = script("fit_host_model")

#: Small options for the steps run in-process.
SMALL = {"iterations": 3, "scale": 0.05, "touch_ms": 0.3, "sizes": [512, 2 * MiB],
         "repeats": 3, "behind_ms": 4.0, "seconds": 20.0}


def run_step(name: str, gpu=None, **options) -> dict:
    return steps.CHECKS[name](gpu or stand_ins.modules(), {**SMALL, **options})


def statuses(data: dict) -> dict[str, tuple[str, str]]:
    return {c.question: (c.verdict, c.status) for c in report.checks(data)}


def failed(data: dict) -> list[str]:
    return [c.question for c in report.checks(data) if c.status == "fail"]


# ------------------------------------------------------------------ the stand-ins
def _parameters(doc: str) -> list[str]:
    """Parameter names from a compiled function's first docstring line, as CuPy and
    cuda-bindings write it: "malloc(size_t size) -> intptr_t"."""
    head = doc.splitlines()[0]
    inner, parts, depth, current = head[head.index("(") + 1:head.rindex(")")], [], 0, ""
    for ch in inner:
        depth += ch in "[(" and 1 or (ch in "])" and -1 or 0)
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.split(":")[0].split()[-1] for p in parts if p.strip()]


RUNTIME_CALLS = ("malloc", "free", "memGetInfo", "getDevice", "setDevice", "deviceSynchronize",
                 "streamSynchronize", "streamQuery", "streamCreateWithFlags", "streamDestroy",
                 "memPoolCreate", "memPoolDestroy", "memPoolSetAttribute", "memPoolGetAttribute",
                 "mallocFromPoolAsync", "freeAsync", "memPoolTrimTo", "MemPoolProps",
                 "runtimeGetVersion", "driverGetVersion", "getDeviceProperties",
                 "deviceGetAttribute")


def test_the_runtime_stand_in_has_cupys_signatures_and_constants():
    runtime = pytest.importorskip("cupy.cuda.runtime")
    fake = stand_ins.modules().runtime
    for name in RUNTIME_CALLS:
        assert list(inspect.signature(getattr(fake, name)).parameters) == \
            _parameters(getattr(runtime, name).__doc__), name
    for name in ("cudaMemPoolAttrReleaseThreshold", "cudaMemPoolAttrReservedMemCurrent",
                 "cudaMemPoolAttrReservedMemHigh", "cudaMemPoolAttrUsedMemCurrent",
                 "cudaMemAllocationTypePinned", "cudaMemHandleTypeNone",
                 "cudaMemLocationTypeDevice", "cudaDevAttrMemoryPoolsSupported",
                 "streamNonBlocking", "streamPerThread"):
        assert getattr(fake, name) == getattr(runtime, name), name


def test_the_driver_stand_in_has_the_bindings_signatures_and_tuples():
    driver = pytest.importorskip("cuda.bindings.driver")
    fake = stand_ins.modules().driver
    names = [n for n in dir(fake) if n.startswith("cu")]
    assert "cuDriverGetVersion" in names and "cuMemSetAccess" in names
    for name in names:
        assert list(inspect.signature(getattr(fake, name)).parameters) == \
            _parameters(getattr(driver, name).__doc__), name
    for enum in ("CUresult", "CUmemAllocationType", "CUmemLocationType", "CUmemAccess_flags",
                 "CUmemAllocationGranularity_flags", "CUdevice_attribute"):
        for key, value in vars(getattr(fake, enum)).items():
            assert int(getattr(getattr(driver, enum), key)) == value, (enum, key)


def test_the_driver_stand_in_maps_host_memory_and_refuses_what_the_driver_refuses():
    gpu = stand_ins.modules()
    d = gpu.driver
    err, granularity = d.cuMemGetAllocationGranularity(d.CUmemAllocationProp(), 0)
    assert err == d.CUresult.CUDA_SUCCESS and granularity == 2 * MiB
    assert d.cuMemCreate(4096, d.CUmemAllocationProp(), 0)[0] == \
        d.CUresult.CUDA_ERROR_INVALID_VALUE  # not a whole granule
    assert d.cuMemCreate(100 * GiB, d.CUmemAllocationProp(), 0)[0] == \
        d.CUresult.CUDA_ERROR_OUT_OF_MEMORY
    _, base = d.cuMemAddressReserve(8 * MiB, 0, 0, 0)
    _, handle = d.cuMemCreate(4 * MiB, d.CUmemAllocationProp(), 0)
    assert d.cuMemMap(base, 4 * MiB, 0, handle, 0) == (0,)
    free, total = gpu.runtime.memGetInfo()
    assert total - free == stand_ins.CONTEXT + 4 * MiB  # the context and the mapping
    assert not gpu.memory.holds(base, 4 * MiB)  # no access granted yet
    assert d.cuMemSetAccess(base, 4 * MiB, [d.CUmemAccessDesc()], 1) == (0,)
    assert gpu.memory.holds(base, 4 * MiB)
    assert d.cuMemUnmap(base, 2 * MiB)[0] == d.CUresult.CUDA_ERROR_INVALID_VALUE  # a part
    assert d.cuMemAddressFree(base, 8 * MiB)[0] != 0  # a mapping is left
    assert d.cuMemUnmap(base, 4 * MiB) == (0,) and d.cuMemAddressFree(base, 8 * MiB) == (0,)
    refusing = stand_ins.modules(fail={"cuMemSetAccess": 801}).driver
    assert refusing.cuMemSetAccess(base, 2 * MiB, [d.CUmemAccessDesc()], 1) == (801,)


def test_releasing_memory_a_queued_kernel_reads_is_a_fault_the_next_sync_raises():
    gpu = stand_ins.modules()
    rt, d = gpu.runtime, gpu.driver
    _, base = d.cuMemAddressReserve(2 * MiB, 0, 0, 0)
    _, handle = d.cuMemCreate(2 * MiB, d.CUmemAllocationProp(), 0)
    d.cuMemMap(base, 2 * MiB, 0, handle, 0)
    d.cuMemSetAccess(base, 2 * MiB, [d.CUmemAccessDesc()], 1)
    other = gpu.new_stream()
    gpu.touch(base, 4096, 50.0, other)
    rt.streamSynchronize(gpu.stream)  # not the stream the kernel is on
    assert rt.streamQuery(other.ptr) == stand_ins.NOT_READY
    d.cuMemUnmap(base, 2 * MiB)
    assert "cuMemUnmap" in gpu.device.violations[0] and gpu.last_error() == 700
    with pytest.raises(stand_ins.CUDARuntimeError, match="IllegalAddress"):
        rt.deviceSynchronize()


def test_a_block_freed_on_another_threads_stream_while_its_own_works_is_a_violation():
    gpu = stand_ins.modules(per_thread=True)
    rt = gpu.runtime
    pool = rt.memPoolCreate(rt.MemPoolProps(1, 0, 1, 0))
    ptr = rt.mallocFromPoolAsync(4096, pool, stand_ins.PER_THREAD)  # this thread's stream
    gpu.spin(50.0)  # queued on it
    import threading

    worker = threading.Thread(target=rt.freeAsync, args=(ptr, stand_ins.PER_THREAD))
    worker.start()
    worker.join()
    assert "freed on the wrong stream or thread" in gpu.device.violations[0]


def test_the_allocation_costs_tell_a_waiting_call_from_one_that_does_not():
    """On the stand-ins cudaFree waits for every stream's queued kernels and nothing else does:
    the measurement must say so, at every size and for both streams."""
    costs = script("allocator_costs")
    gpu = stand_ins.modules()
    result = costs.measure(gpu, sizes=(512, 20 * MiB), repeats=3, behind_ms=4.0)
    assert result["problems"] == [] and result["info"]["granularity"] == 2 * MiB
    rows = result["rows"]
    assert len(rows) == 13 * 2 and "error" not in str(rows)
    # one call over 10 mappings: an unmap, a grant of access
    assert {r["op"] for r in rows} >= {costs.RUN_UNMAP, "cuMemUnmap", costs.RUN_ACCESS}
    for row in rows:
        waits = row["op"] == "cudaFree"
        assert (row["waited"], row["other_waited"]) == (waits, waits), row
    free = [r for r in rows if r["op"] == "cudaFree"]
    assert all(r["behind_us"] >= 4000 > r["idle_us"] for r in free)
    assert gpu.memory.in_use == 0  # every measurement gave its memory back


def test_a_driver_that_unmaps_one_mapping_per_call_is_measured_and_left_clean():
    costs = script("allocator_costs")
    gpu = stand_ins.modules()
    gpu.memory.joins_unmaps = False
    result = costs.measure(gpu, sizes=(512, 20 * MiB), repeats=2, behind_ms=1.0)
    runs = [r for r in result["rows"] if r["op"] == costs.RUN_UNMAP]
    assert runs and all("cuMemUnmap over several mappings" in r["error"] for r in runs
                        if r["size"] > 2 * MiB)
    assert all("error" not in r for r in result["rows"] if r["op"] != costs.RUN_UNMAP)
    assert gpu.memory.in_use == 0  # the refused run was unmapped one mapping at a time


# ------------------------------------------------------------------ the driver's pool
@pytest.mark.parametrize("chunk", [32 * MiB, 2 * MiB])
def test_the_driver_pool_probe_tells_the_pools_step(chunk):
    probe = script("driver_pool_probe")
    result = probe.probe(stand_ins.modules(pool_chunk=chunk))
    assert result["problems"] == []
    fresh = {row["size"]: row["reserved"] for row in result["fresh"]}
    assert fresh == {512: chunk, MiB: chunk, 3 * MiB: -(-3 * MiB // chunk) * chunk,
                     40 * MiB: -(-40 * MiB // chunk) * chunk}
    growth = result["one_live_per_growth"]
    assert set(growth["growths"]) == {chunk} and growth["kept"] == 128 * MiB // chunk
    assert growth["reserved_after_trim"] == growth["kept"] * chunk  # whole chunks kept
    assert growth["reserved_at_end"] == 0
    assert [row["used_grew"] for row in result["cudaMalloc"]] == [2 * MiB, 0, 2 * MiB, 4 * MiB]
    data = {"steps": [{"name": "driver-pool", "status": "done"}],
            "results": {"driver-pool": result}}
    rows = statuses(data)
    assert rows["driver's pool: reserved after one request on a fresh pool"][0] == \
        f"grows in steps of {chunk // MiB} MiB"


def test_a_pool_that_trims_below_its_growth_step_is_told_apart():
    growth = {"block": MiB, "blocks": 128, "growths": [32 * MiB] * 4, "kept": 4,
              "reserved_before": 128 * MiB, "reserved_after_trim": 8 * MiB,
              "used_after_trim": 4 * MiB, "reserved_at_end": 0}
    assert report.trim_verdict(growth) == \
        "trims below its growth step: 2 MiB stays per live block"


# ------------------------------------------------------------------ the device layer
def test_the_device_step_reports_what_pgmo_chose_and_passes_on_a_full_device_layer():
    result = run_step("device")
    assert result["probe"] == {"arena": True, "heap": True, "reasons": {}, "joins_unmaps": True}
    assert result["stats"]["arena_kind"] == "reserved range"
    assert result["stats"]["heap_kind"] == "page heap (recycled pages)"  # the default heap
    assert result["replay"]["corrupted"] == 0 and result["replay"]["requests"] > 0
    assert result["versions"]["cuDriverGetVersion"] == 13000
    data = {"steps": [{"name": "device", "status": "done"}], "results": {"device": result}}
    assert failed(data) == []
    assert statuses(data)["device layer: pgmo's arena (arena_kind)"] == (
        "ok: pgmo's arena uses the reserved range", "ok")
    joined = [c for c in report.checks(data) if "several adjacent" in c.question]
    assert [c.measured for c in joined] == ["accepted"]


@pytest.mark.parametrize("call, code", [("cuMemSetAccess", 801), ("cuMemAddressReserve", 800)])
def test_a_driver_that_refuses_virtual_memory_fails_the_check_with_its_reason(call, code):
    result = run_step("device", stand_ins.modules(fail={call: code}))
    assert result["stats"]["arena_kind"] == "cudaMalloc"
    assert str(code) in result["probe"]["reasons"]["arena"]
    data = {"steps": [{"name": "device", "status": "done"}], "results": {"device": result}}
    verdict, status = statuses(data)["device layer: pgmo's arena (arena_kind)"]
    assert status == "fail" and verdict.startswith("FAIL: pgmo's arena fell back to cudaMalloc: "
                                                   "the driver refused")
    passed, line = report.verdict(data)
    # pgmo's own heap lives in a reserved range as well: both fell back
    assert not passed and line.startswith("quick check: FAIL: 2 check(s) failed: device layer")
    assert statuses(data)["device layer: pgmo's heap (heap_kind)"][1] == "fail"


# ------------------------------------------------------------------ streams and teardown
def _no_device_sync(monkeypatch):
    """pgmo as it was: no wait for the device before an unmap or a trim."""
    from pgmo.device import cuda as cuda_device

    monkeypatch.setattr(cuda_device.CudaRange, "synchronize", lambda self: None)
    monkeypatch.setattr(cuda_device.CudaAsyncPool, "synchronize", lambda self: None)


def test_kernels_on_a_second_stream_across_boundaries_pass_and_are_exercised():
    result = run_step("second-stream", iterations=4)
    assert result["corrupted"] == result["overlaps"] == 0
    assert result["violations"] == [] and result["sync_error"] is None
    assert result["touches"] > 0 and result["stats"]["foreign_requests"] > 0
    data = {"steps": [{"name": "s", "status": "done"}], "results": {"second-stream": result}}
    assert failed(data) == []


def test_the_teardown_check_fails_a_pool_that_unmaps_without_waiting(monkeypatch):
    # The last eight kernels run 150 ms each (wall clock, on the stand-in's stream): long
    # enough to be running still at the boundary and the drop on a loaded machine.
    result = run_step("teardown", last_touch_ms=150.0)
    assert result["pending_at_boundary"] and result["left_bytes"] == 0
    data = {"steps": [{"name": "t", "status": "done"}], "results": {"teardown": result}}
    assert failed(data) == []
    _no_device_sync(monkeypatch)
    gpu = stand_ins.modules()
    result = run_step("teardown", gpu, last_touch_ms=150.0)
    assert result["violations"] and result["last_error"] == 700
    data = {"steps": [{"name": "t", "status": "done"}], "results": {"teardown": result}}
    assert "teardown: the pool dropped while kernels use its memory" in failed(data)
    gpu.device.violations.clear()  # the fault forgotten: what is left can be given back


@pytest.mark.parametrize("heap", [None, "driver"])
def test_frees_from_another_thread_wait_for_the_owner_under_a_per_thread_stream(heap,
                                                                              monkeypatch):
    gpu = stand_ins.modules(per_thread=True)
    result = run_step("per-thread-stream", gpu, touch_ms=5.0, heap=heap)
    assert result["stream"] == 2 and result["violations"] == []
    assert result["dropped_elsewhere"] == 3 and result["busy_at_drops"] >= 1
    assert max(result["pending_after_drops"]) > 0 and result["pending_after_owner"] == 0
    data = {"steps": [{"name": "p", "status": "done"}], "results": {"per-thread-stream": result}}
    assert failed(data) == []
    # A pool that frees on the calling thread's stream: the stand-in sees the hazard.
    from pgmo.device import cuda as cuda_device

    def died(self, ptr, size, stream, thread):  # freed at once, on the calling thread's stream
        try:
            self._free(ptr, size, None)
        except Exception:  # noqa: BLE001 - as the real one: a destructor never raises
            pass

    if heap != "driver":
        return  # (pgmo's own heap has no such free: its blocks' deaths always queue)
    monkeypatch.setattr(cuda_device.CudaAsyncPool, "_died", died)
    gpu = stand_ins.modules(per_thread=True)
    result = run_step("per-thread-stream", gpu, touch_ms=5.0, heap=heap)
    assert any("wrong stream or thread" in v for v in result["violations"])
    data = {"steps": [{"name": "p", "status": "done"}], "results": {"per-thread-stream": result}}
    assert "per-thread default stream: device errors" in failed(data)
    gpu.device.violations.clear()  # the fault forgotten: what is left can be given back


def test_set_limit_fits_at_its_margin_and_fails_cleanly_below_the_limit():
    result = run_step("set-limit")
    fits, small = result["pgmo fits"], result["pgmo too small"]
    assert fits["limit"] == int(1.25 * result["physical_limit"]) and fits["corrupted"] == 0
    assert result["stock fits"]["oom"] is None
    assert small["oom"]["error"].startswith("OutOfMemoryError") and small["serves_after"]
    assert small["corrupted"] == 0
    # (whether pgmo completes under 1.25x, and within its limit, depends on when its background
    # plan arrives: the judgement is tested on set values)
    fits.update(oom=None, stats={**fits["stats"], "peak_total_bytes": fits["limit"]})
    data = {"steps": [{"name": "l", "status": "done"}], "results": {"set-limit": result}}
    assert failed(data) == []
    assert statuses(data)["set_limit, pgmo fits"] == ("completed within its limit", "info")
    small["serves_after"] = "MemoryError: stuck"
    fits["stats"]["peak_total_bytes"] = fits["limit"] + 1
    assert failed(data) == ["set_limit, pgmo fits", "set_limit, pgmo too small"]


# ------------------------------------------------------------------ replays and judgement
def test_a_replay_measures_both_pools_from_outside_and_checks_every_byte():
    runs = {pool: run_step("replay", workload="repeating", pool=pool) for pool in ("stock", "pgmo")}
    for pool, r in runs.items():
        assert r["corrupted"] == 0 and r["requests"] == 431 and r["iterations"] == 3, pool
        assert r["taken"]["NVML"] == r["taken"]["cudaMemGetInfo"] >= r["physical_limit"]
        assert r["outside"]["samples"] >= 3 and len(r["laps_ms"]) == 3
    assert runs["pgmo"]["stats"]["arena_kind"] == "reserved range"
    assert runs["stock"]["stats"] is None
    data = {"steps": [{"name": "r", "status": "done"}],
            "results": {report.replay_key("repeating", p): r for p, r in runs.items()}}
    rows = statuses(data)
    nvml = rows["repeating workload: device memory taken, pgmo / stock (NVML, peak of the "
                "process)"]
    assert nvml[1] == "info" and nvml[0].startswith(("pgmo takes", "about the same"))
    runs["pgmo"]["corrupted"] = 1
    runs["stock"]["nvml_why"] = "nvidia-ml-py is not installed"
    assert failed(data) == ["repeating workload, stock: NVML",
                            "repeating workload, pgmo: replay on the device, pattern-checked"]


def test_a_step_that_did_not_finish_fails_the_check():
    data = {"steps": [{"name": "teardown", "status": "timed out after 45 s"}], "results": {}}
    passed, line = report.verdict(data)
    assert not passed and line == ("quick check: FAIL: 1 check(s) failed: step teardown: the "
                                   "step did not finish: timed out after 45 s")
    assert report.verdict({"steps": [], "results": {}})[0] is False


def test_a_step_over_the_budget_is_not_started_and_what_was_measured_is_written(tmp_path,
                                                                                monkeypatch):
    args = quick.parse_args(["--dry-run", "--out", str(tmp_path), "--budget", "12"])
    check = quick.Check(args, "python -m scripts.gpu_quick_check --dry-run")
    monkeypatch.setattr(quick, "MIN_STEP_S", 0.5)
    assert check.step("sleeps", 1.0, [sys.executable, "-c", "import time; time.sleep(30)"]) is None
    assert check.data["steps"][-1]["status"] == "timed out after 1 s"
    check.started -= 12  # the budget is used up
    check.run(quick.STEPS[-1])
    assert check.data["steps"][-1]["status"] == "not started: time budget used up"
    text = check.write()
    assert "**quick check: FAIL (stand-ins): 2 check(s) failed" in text
    assert json.loads((tmp_path / "quick-check.json").read_text())["steps"][0]["name"] == \
        "sleeps"


@pytest.mark.parametrize("stop, status, line", [
    (KeyboardInterrupt(), 130, "gpu_quick_check: stopped (Ctrl-C); what was measured is in "),
    (quick.Stopped("signal 15"), 143, "gpu_quick_check: stopped (SIGTERM)")])
def test_a_stopped_check_writes_what_it_measured_and_says_so_in_one_line(tmp_path, monkeypatch,
                                                                         capsys, stop, status,
                                                                         line):
    calls = []

    def run(self, step):
        calls.append(step.key)
        if len(calls) == 2:
            raise stop
        self.data["steps"].append({"name": step.name, "status": "done", "limit_s": 1.0,
                                   "seconds": 0.1, "key": step.key})

    monkeypatch.setattr(quick.Check, "run", run)
    assert quick.main(["--dry-run", "--out", str(tmp_path)]) == status
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(line)
    data = json.loads((tmp_path / "quick-check.json").read_text())
    assert [s["status"] for s in data["steps"]] == [
        "done", f"not run: stopped ({str(stop) or 'Ctrl-C'})"]


def test_a_ctrl_c_before_a_steps_child_starts_still_writes_the_report(tmp_path, monkeypatch):
    """The window between listing a step and starting its child (CI hit it)."""
    args = quick.parse_args(["--dry-run", "--out", str(tmp_path)])
    check = quick.Check(args, "python -m scripts.gpu_quick_check --dry-run")

    def interrupted(**env):
        raise KeyboardInterrupt

    monkeypatch.setattr(quick.children, "environment", interrupted)
    with pytest.raises(KeyboardInterrupt):
        check.step("first", 10.0, [sys.executable, "-c", "pass"])
    text = check.write()
    assert "first stopped before it started" in text
    assert json.loads((tmp_path / "quick-check.json").read_text())["steps"][0]["status"] == \
        "stopped before it started"


@pytest.mark.parametrize("argv, message", [(["--budget", "0"], "--budget must be positive"),
                                           (["--device", "-1"], "--dry-run runs on the CPU")])
def test_the_quick_check_answers_a_mistake_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        quick.parse_args(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


# ------------------------------------------------------------------ the dry run, as a user runs it
@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("quick-check")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    done = subprocess.run([sys.executable, "-m", "scripts.gpu_quick_check", "--dry-run",
                           "--out", str(out_dir)], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env=env)
    return out_dir, done


def test_the_dry_run_covers_every_step_and_passes(dry_run):
    out_dir, done = dry_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == "quick check: PASS (stand-ins): every check held"
    assert (out_dir / "quick-check.md").read_text().strip() == "\n".join(lines[:-1]).strip()
    assert "**DRY RUN on the CPU**" in done.stdout
    data = json.loads((out_dir / "quick-check.json").read_text())
    assert data["dry_run"] is True and data["budget_s"] == 450
    assert [s["key"] for s in data["steps"]] == [s.key for s in quick.STEPS]
    assert all(s["status"] == "done" for s in data["steps"])
    assert set(data["results"]) == {s.key for s in quick.STEPS}
    questions = [c.question for c in report.checks(data)]
    for needed in ("device layer: pgmo's arena (arena_kind)",
                   "device layer: pgmo's heap (heap_kind)",
                   "driver's pool: a trim with one live block per growth",
                   "virtual memory: does `cuMemUnmap` wait for queued kernels?",
                   "variable workload: device memory taken, pgmo / stock (NVML, peak of the "
                   "process)", "second stream: what it exercised",
                   "per-thread default stream: frees from another thread",
                   "set_limit, pgmo too small",
                   "teardown: the pool dropped while kernels use its memory"):
        assert needed in questions, needed
    versions = data["environment"]
    assert {"CUDA driver", "CUDA runtime", "cuDriverGetVersion", "cuda-bindings"} <= set(versions)
    # every step's own time, well under its limit on a CPU
    assert all(s["seconds"] < s["limit_s"] for s in data["steps"])


def test_the_dry_runs_report_has_its_tables(dry_run):
    out_dir, done = dry_run
    text = (out_dir / "quick-check.md").read_text()
    for heading in ("## Verdicts", "## 1. The device layer pgmo chose",
                    "## 2. How the driver's stream-ordered pool reserves",
                    "## 3. What taking and giving back device memory costs",
                    "## 4. Replays on the device"):
        assert heading in text, heading
    replays = [line for line in text.splitlines()
               if re.match(r"^\| (h100-alexnet|lstm-random)", line)]
    assert len(replays) == 4
    assert "arena from             reserved range" in text


# ------------------------------------------------------------------ fitting the host model
def test_the_fit_of_the_dry_runs_results_recovers_the_stand_ins_parameters(dry_run, tmp_path):
    out_dir, _ = dry_run
    target = tmp_path / "device_params.py"
    done = subprocess.run([sys.executable, "-m", "scripts.fit_host_model",
                           str(out_dir / "quick-check.json"), "--out", str(target)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"wrote {target}"
    params, source = fit.current(target)
    assert params["page"] == 2 * MiB and params["pool_chunk"] == 32 * MiB
    assert params["pool_trim_step"] == 32 * MiB
    calls = params["call_us"]
    assert set(calls) >= {"cudaMalloc", "cudaFree", "cuMemMap", "cuMemSetAccess", "cuMemUnmap",
                          "cudaMemPoolTrimTo(0)"}
    assert [op for op, c in calls.items() if c["waits"]] == ["cudaFree"]
    assert all(c["fixed"] > 0 for c in calls.values())
    assert source["kind"] == "dry run (stand-ins)" and source["device"] == stand_ins.NAME
    namespace: dict = {}
    exec(target.read_text(), namespace)  # the file is a module: what the model imports
    assert namespace["PARAMS"] == params


def test_a_dry_runs_results_never_overwrite_the_packages_parameters(dry_run):
    out_dir, _ = dry_run
    before = fit.PARAMS_FILE.read_text()
    done = subprocess.run([sys.executable, "-m", "scripts.fit_host_model",
                           str(out_dir / "quick-check.json")], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"fit_host_model.py: error: {out_dir / 'quick-check.json'}: a "
                                   "dry run's numbers are the stand-ins', not a GPU's: give "
                                   "--out another file")
    assert fit.PARAMS_FILE.read_text() == before


def test_the_fit_given_the_quick_checks_folder_asks_for_the_file_in_it(tmp_path):
    done = subprocess.run([sys.executable, "-m", "scripts.fit_host_model", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (f"fit_host_model.py: error: {tmp_path} is a folder: give the "
                                   "quick-check.json in it (the quick check writes it into its "
                                   "--out folder)")


def test_the_fit_keeps_what_a_gpu_run_did_not_measure_and_says_so():
    old = {"page": 2 * MiB, "pool_chunk": 32 * MiB, "pool_trim_step": 32 * MiB, "call_us": {}}
    results = {"driver-pool": {"fresh": [{"size": 512, "reserved": 2 * MiB},
                                         {"size": 40 * MiB, "reserved": 40 * MiB}],
                               "one_live_per_growth": {"kept": 4,
                                                       "reserved_after_trim": 8 * MiB}}}
    new, notes = fit.fit({"results": results}, old)
    assert new == {**old, "pool_chunk": 2 * MiB, "pool_trim_step": 2 * MiB}
    assert "page: not measured (steps costs and driver-pool missing); kept" in notes
    assert fit.changes(old, new) == ["pool_chunk: 33554432 -> 2097152",
                                     "pool_trim_step: 33554432 -> 2097152"]
    # a pool that grows in 32 MiB but trims pages: reported, for the model to change
    results["driver-pool"]["fresh"] = [{"size": 512, "reserved": 32 * MiB}]
    new, notes = fit.fit({"results": results}, old)
    assert new["pool_trim_step"] == 2 * MiB and any("pessimistic" in n for n in notes)


def test_a_call_cost_line_bent_by_a_preempted_call_becomes_its_cheapest_call():
    """A loaded machine preempts one call of the largest size: the line through the times
    would have a negative fixed part (no call costs less than nothing); the fit keeps the
    cheapest call as a fixed cost, says so, and keeps a line that is a cost as it is."""
    GiB = 1 << 30

    def rows(op, times):
        return [{"op": op, "size": size, "idle_us": t, "waited": False}
                for size, t in zip((GiB // 4, GiB // 2, GiB), times)]

    results = {"costs": {"rows": rows("cuMemMap", [100.0, 110.0, 9000.0])
                         + rows("cudaMalloc", [300.0, 500.0, 900.0])}}
    notes: list[str] = []
    calls = fit.fit_calls(results, notes)
    assert calls["cuMemMap"]["fixed"] == 100.0 and calls["cuMemMap"]["per_gib"] == 0.0
    assert calls["cudaMalloc"]["fixed"] == 100.0 and calls["cudaMalloc"]["per_gib"] == 800.0
    assert [n.split(":")[1].strip() for n in notes] == ["cuMemMap"]


def test_the_fit_answers_a_wrong_file_in_one_line(tmp_path):
    (tmp_path / "other.json").write_text('{"command": "x"}')
    (tmp_path / "broken.json").write_text("{")
    for name, message in (("missing.json", "no such file"), ("other.json", 'no "results" field'),
                          ("broken.json", "not JSON (line 1")):
        done = subprocess.run([sys.executable, "-m", "scripts.fit_host_model",
                               str(tmp_path / name), "--check"], capture_output=True,
                              text=True, timeout=120, cwd=ROOT)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
        assert message in done.stderr


def test_the_host_models_page_and_chunk_are_the_fitted_parameters():
    """One source of truth: the host model's page and pool chunk are the fitted ones."""
    from pgmo.device import host_async_pool, host_memory
    from pgmo.device import params as device_params

    assert host_memory.DRIVER_PAGE == device_params.PARAMS["page"]
    assert host_async_pool.DRIVER_POOL_CHUNK == device_params.PARAMS["pool_chunk"]
    assert fit.current() == (device_params.PARAMS, device_params.SOURCE)


def test_the_quick_check_process_stops_on_ctrl_c_with_one_line(tmp_path):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    process = subprocess.Popen([sys.executable, "-m", "scripts.gpu_quick_check", "--dry-run",
                                "--out", str(tmp_path)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
                               start_new_session=True)
    try:
        deadline = 60
        import time

        while not (tmp_path / "quick-check.json").exists() and deadline > 0:
            time.sleep(0.2)
            deadline -= 0.2
        os.killpg(process.pid, signal.SIGINT)  # the terminal's Ctrl-C: the whole group
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("gpu_quick_check: stopped (Ctrl-C)")
    assert "Traceback" not in err
    statuses = [s["status"] for s in json.loads((tmp_path / "quick-check.json").read_text())
                ["steps"]]
    assert statuses[-2:] == ["stopped (Ctrl-C)", "not run: stopped (Ctrl-C)"]
