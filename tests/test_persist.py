"""Saved profiles and plans: a round trip skips profiling; a bad file is refused clearly."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("cupy")  # the pool's save and load (the plan file itself: test_formats)

import pgmo  # noqa: E402
from pgmo.errors import PlanFileError
from pgmo.formats.planfile import _checksum
from pgmo.pool import PlanFileError as PoolPlanFileError
from pgmo.measure.hosts import host_pool
from pgmo.measure.replay import replay

HOT = pgmo.Trace.from_tuples([(0, 0, 2, 1000), (1, 1, 4, 2000), (2, 3, 6, 3000),
                              (3, 5, 7, 500), (4, 2, 9, 700)])


def trained_pool(**kw):
    pool = host_pool(warmup=1, **kw)
    replay([HOT] * 2, pool)
    assert pool.plan is not None
    return pool


def test_plan_error_is_a_value_error_and_exported_by_the_pool_module():
    assert issubclass(PlanFileError, ValueError)
    assert PoolPlanFileError is PlanFileError


@pytest.mark.parametrize("name", ["plan.json", "plan.json.gz"])
def test_round_trip_skips_profiling(tmp_path, name):
    src = trained_pool()
    path = tmp_path / name
    src.save(path)
    dst = host_pool(warmup=1)
    plan = dst.load(path)
    assert plan.offsets == src.plan.offsets and plan.peak == src.plan.peak
    assert [b.size for b in dst.profile] == [b.size for b in src.profile]
    res = replay([HOT] * 3, dst)  # warm-up, then the plan at once: no profiling iteration
    assert res["modes"] == ["warmup", "optimized", "optimized"]
    assert res["corrupted"] == 0
    assert res["stats"].planned_requests == 2 * len(HOT)
    assert res["stats"].reoptimizations == 0


def test_state_bytes_round_trip():
    src = trained_pool()
    data = src.state_bytes()
    dst = host_pool(warmup=0)
    dst.load_state_bytes(data)
    assert dst.mode == "optimized" and dst.plan.offsets == src.plan.offsets


def test_save_before_any_plan_is_a_clear_error(tmp_path):
    with pytest.raises(RuntimeError, match="no plan to save yet"):
        host_pool().save(tmp_path / "x.json")


def damaged_variants(data: bytes):
    doc = json.loads(data)
    yield "truncated", data[: len(data) // 2], "damaged or truncated"
    flipped = bytearray(data)
    pos = data.index(b'"offsets":[') + len('"offsets":[')
    flipped[pos] = ord("9") if flipped[pos] != ord("9") else ord("8")
    yield "flipped byte", bytes(flipped), "checksum mismatch"
    bad = dict(doc, sha256="0" * 64)
    yield "wrong checksum", json.dumps(bad).encode(), "checksum mismatch"
    yield "wrong version", json.dumps(dict(doc, version=99)).encode(), "version 99"
    yield "not ours", json.dumps({"hello": 1}).encode(), "not a pgmo plan file"
    # A consistent checksum over a plan that overlaps live blocks: still refused.
    payload = json.loads(json.dumps(doc["payload"]))
    payload["offsets"] = [0] * len(payload["offsets"])
    yield ("overlapping offsets", json.dumps(dict(doc, payload=payload,
                                                  sha256=_checksum(payload))).encode(),
           "overlaps")
    # Offsets and peaks no device can have, behind a recomputed checksum: refused, where
    # the pool would otherwise ask for an arena of 10**30 bytes at every iteration.
    payload = json.loads(json.dumps(doc["payload"]))
    payload["offsets"][-1] = 10 ** 30
    yield ("offset beyond any device", json.dumps(dict(doc, payload=payload,
                                                       sha256=_checksum(payload))).encode(),
           r"offset 1,000,000,000,000,000,000,000,000,000,000 B \(request \d\): more than any "
           "device holds")
    payload = json.loads(json.dumps(doc["payload"]))
    payload["peak"] = 1 << 60
    yield ("stated peak beyond any device", json.dumps(dict(doc, payload=payload,
                                                            sha256=_checksum(payload))).encode(),
           "field 'peak' .* more than any device holds")
    # Unaligned offsets behind a recomputed checksum: every block's address would be
    # unaligned (a device pointer CuPy's kernels assume aligned to 512 bytes).
    payload = json.loads(json.dumps(doc["payload"]))
    payload["offsets"] = [o + 1 for o in payload["offsets"]]
    yield ("unaligned offsets", json.dumps(dict(doc, payload=payload,
                                                sha256=_checksum(payload))).encode(),
           "field 'offsets' must hold multiples of 512")
    yield ("deeply nested", b"[" * 1100 + b"]" * 1100, "nested too deeply")
    nested = b'{"format":"pgmo-pool-plan","version":1,"payload":{"extra":%s}}' % (
        b"[" * 1100 + b"]" * 1100)
    yield "deeply nested payload", nested, "nested too deeply"
    payload = json.loads(json.dumps(doc["payload"]))
    payload["sizes"][0] += 512
    yield ("profile and plan disagree", json.dumps(dict(doc, payload=payload,
                                                        sha256=_checksum(payload))).encode(),
           "does not fit its profile")


@pytest.mark.parametrize("case", [c[0] for c in damaged_variants(trained_pool().state_bytes())])
def test_damaged_or_mismatched_files_are_refused_and_the_pool_profiles(tmp_path, case):
    good = trained_pool().state_bytes()
    data, why = next((d, w) for c, d, w in damaged_variants(good) if c == case)
    path = tmp_path / "plan.json"
    path.write_bytes(data)
    pool = trained_pool()  # has a plan: loading a bad file must drop it, not keep a wrong one
    with pytest.raises(PlanFileError, match=why) as err:
        pool.load(path)
    assert str(path) in str(err.value)
    assert pool.plan is None and pool.mode == "profiling"
    res = replay([HOT] * 3, pool)  # profiles again, then optimizes
    assert res["corrupted"] == 0 and res["modes"][-1] == "optimized"
    with pytest.raises(PlanFileError):
        host_pool().load_state_bytes(data)


def test_a_plan_larger_than_the_device_is_refused_and_the_pool_profiles(tmp_path):
    path = tmp_path / "plan.json"
    trained_pool().save(path)  # a peak of 6,144 B
    pool = host_pool(capacity=4096, warmup=0)
    with pytest.raises(PlanFileError, match=r"plan.json: the plan needs 6,144 B, more than "
                                            r"this device's 4,096 B"):
        pool.load(path)
    assert pool.plan is None and pool.mode == "profiling"


def test_a_compressed_plan_may_not_expand_without_limit(tmp_path, monkeypatch):
    from pgmo.formats import files

    monkeypatch.setattr(files, "EXPANSION_FLOOR", 1 << 20)
    good = trained_pool().state_bytes()
    doc = json.loads(good)
    doc["payload"]["extra"] = {"pad": "x" * (2 << 20)}  # 2 MiB that gzip makes 2 KiB
    bomb = tmp_path / "plan.json.gz"
    bomb.write_bytes(gzip.compress(json.dumps(doc).encode()))
    pool = trained_pool()
    with pytest.raises(PlanFileError, match=r"plan.json.gz: expands to more than 1,048,576 B "
                                            r"from [\d,]+ B compressed.*decompression bomb"):
        pool.load(bomb)
    assert pool.plan is None and pool.mode == "profiling"
    res = replay([HOT] * 2, pool)
    assert res["corrupted"] == 0 and res["modes"][-1] == "optimized"
    fine = tmp_path / "fine.json.gz"
    fine.write_bytes(gzip.compress(good))  # below the cap: read as always
    assert host_pool().load(fine).offsets == pool.plan.offsets


def test_damaged_gzip_and_missing_file(tmp_path):
    path = tmp_path / "plan.json.gz"
    path.write_bytes(gzip.compress(b"{}")[:10])
    with pytest.raises(PlanFileError, match="damaged gzip"):
        host_pool().load(path)
    with pytest.raises(PlanFileError, match="no such file"):
        host_pool().load(tmp_path / "missing.json")
    with pytest.raises(PlanFileError, match=r"is a directory, not a plan file$"):
        host_pool().load(tmp_path)


def test_a_plan_path_no_plan_could_be_written_to_is_refused_at_once(tmp_path):
    """A folder, or a path under a file, used to be accepted, and each plan's save then logged
    "File exists" or "Is a directory"; the pool now refuses it, naming the problem."""
    (tmp_path / "notes").write_text("x")
    with pytest.raises(ValueError, match=r"is a folder: give a file name in it"):
        host_pool(plan_path=tmp_path)
    with pytest.raises(ValueError, match=r"lies under '.*notes', which is a file, not a folder"):
        host_pool(plan_path=tmp_path / "notes" / "deeper" / "plan.json")
    pool = host_pool(plan_path=tmp_path / "new" / "plan.json")  # folders made when it saves
    pool.close()


def test_every_bit_flip_of_a_compressed_plan_is_a_plan_file_error(tmp_path, caplog):
    """Corrupted deflate data raises zlib.error, which is neither OSError nor EOFError: every
    flipped bit of a .json.gz plan must still be a PlanFileError from ``load`` and a logged,
    ignored file under ``plan_path``."""
    path = tmp_path / "plan.json.gz"
    trained_pool().save(path)
    good = path.read_bytes()
    kinds = set()
    for pos in range(len(good)):
        damaged = bytearray(good)
        damaged[pos] ^= 0x10
        path.write_bytes(bytes(damaged))
        try:
            host_pool().load(path)
        except PlanFileError as e:
            kinds.add(str(e).split(": ", 1)[1][:12])
        # loaded: the flip was in a field gzip does not check (its header's mtime, say)
    assert any(k.startswith("damaged gzip") for k in kinds)  # the deflate data was hit
    path.write_bytes(bytes(b ^ 0x10 if 20 <= k < 40 else b for k, b in enumerate(good)))
    caplog.clear()
    pool = host_pool(warmup=0, plan_path=path)
    assert pool.plan is None and pool.mode == "profiling"
    assert len([r for r in caplog.records if "ignoring saved plan" in r.getMessage()]) == 1


def test_plan_path_saves_and_reloads(tmp_path, caplog):
    path = tmp_path / "auto.json"
    first = trained_pool(plan_path=path)
    assert path.exists()
    second = host_pool(warmup=0, plan_path=path)
    assert second.mode == "optimized" and second.plan.offsets == first.plan.offsets
    path.write_bytes(b"garbage")
    third = host_pool(warmup=0, plan_path=path)  # logged, ignored, profiles
    assert third.plan is None and third.mode == "profiling"
    assert "ignoring saved plan" in caplog.text
    path.write_bytes(b"[" * 1100 + b"]" * 1100)  # as docs/usage.rst says: logged and ignored
    fourth = host_pool(warmup=0, plan_path=path)
    assert fourth.plan is None and "nested too deeply" in caplog.text
    assert replay([HOT] * 2, fourth)["modes"] == ["profiling", "optimized"]


def test_load_in_a_new_process(tmp_path):
    path = tmp_path / "plan.json"
    trained_pool().save(path)
    code = textwrap.dedent(f"""
        import pgmo
        from pgmo.measure.hosts import host_pool
        from pgmo.measure.replay import replay
        hot = pgmo.Trace.from_tuples({[(b.id, b.lower, b.upper, b.size) for b in HOT]!r})
        pool = host_pool(warmup=0)
        pool.load({str(path)!r})
        res = replay([hot] * 2, pool)
        print(res["modes"], res["corrupted"], res["stats"].planned_requests)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"['optimized', 'optimized'] 0 {2 * len(HOT)}"
