"""The data kept in ``tests/data`` is what its provenance says: unchanged copies, licensed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data"
BENCH = DATA / "dsa-benchmarks"
EVIDENCE = DATA / "gpu-evidence"


def sums(path: Path) -> dict[str, str]:
    """``SHA256SUMS`` as ``{relative path: digest}``."""
    pairs = (line.split(maxsplit=1) for line in path.read_text().splitlines() if line.strip())
    return {name.removeprefix("./"): digest for digest, name in pairs}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_dsa_instances_are_the_listed_bytes_and_nothing_else():
    listed = sums(BENCH / "SHA256SUMS")
    present = {str(p.relative_to(BENCH)) for p in BENCH.rglob("*") if p.is_file()}
    assert present - set(listed) == {"SHA256SUMS", "PROVENANCE.md"}
    assert set(listed) <= present
    for name, expected in listed.items():
        assert digest(BENCH / name) == expected, name


@pytest.mark.parametrize("folder, license_says", [
    ("minimalloc", "Apache License"), ("idealloc", "MIT License"),
    ("omnimalloc-small", "Apache License")])
def test_each_instance_folder_carries_its_license_and_provenance(folder, license_says):
    assert license_says in (BENCH / folder / "LICENSE").read_text()
    provenance = (BENCH / "PROVENANCE.md").read_text()
    assert f"`{folder}/`" in provenance and "commit" in provenance


def test_the_gpu_evidence_is_the_sessions_bytes():
    listed = sums(EVIDENCE / "2026-11-25-h100.SHA256SUMS")
    session = EVIDENCE / "2026-11-25-h100"
    kept = {str(p.relative_to(session)) for p in session.rglob("*") if p.is_file()}
    elsewhere = {"pytorch-snapshot-small-cnn-h100.pickle": DATA}  # the import tests' copy
    assert kept | set(elsewhere) == set(listed)
    for name, expected in listed.items():
        assert digest(elsewhere.get(name, session) / name) == expected, name
    assert "never regenerate" in (EVIDENCE / "README.rst").read_text()


def test_the_later_gpu_session_is_its_bytes():
    listed = sums(EVIDENCE / "2026-11-27-h100.SHA256SUMS")
    session = EVIDENCE / "2026-11-27-h100"
    assert {str(p.relative_to(session)) for p in session.rglob("*") if p.is_file()} \
        == set(listed)
    for name, expected in listed.items():
        assert digest(session / name) == expected, name
