"""Read a GPU session's output folder into plain data, for ``scripts.results_table``.

The folder is what ``scripts/gpu_session.sh`` leaves in ``$OUT`` (``session.log``,
``pytest-gpu.log``, ``bench_malloc.txt``, ``sanitizer.log``, ``demo.log``,
``results.md`` and ``bench_memory.log`` from step ``bench``, ``traces.tar.gz``),
as it was copied (``bench_memory-results.md`` for ``results.md``, ``traces/``
unpacked), plus what an outside probe added (``nvml-process-peaks.md``) and a
``README.md``; and the quick check's raw results (``quick-check/quick-check.json``,
beside the files or in ``traces.tar.gz``, from ``scripts.gpu_quick_check``).
Nothing is computed here that the files do not say: each
reader returns the tables and lines as written (:mod:`scripts.markdown` reads
the tables, keyed by their own headers), and a file that is missing reads as
absent (None or empty), never as zero.
"""

from __future__ import annotations

import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from .markdown import bullets

#: What each file may be called in a session's folder, first match wins.
NAMES = {
    "session": ("session.log", "gpu_session.log"),
    "results": ("results.md", "bench_memory-results.md"),
    "pytest": ("pytest-gpu.log",),
    "malloc": ("bench_malloc.txt",),
    "sanitizer": ("sanitizer.log",),
    "nvml_probe": ("nvml-process-peaks.md",),
    "readme": ("README.md",),
}


def find(folder: Path, what: str) -> Path | None:
    for name in NAMES[what]:
        if (folder / name).is_file():
            return folder / name
    return None


def read_text(folder: Path, what: str) -> str:
    path = find(folder, what)
    return path.read_text() if path else ""


# ------------------------------------------------------------------ the files
@dataclass
class Session:
    """What one GPU session's folder says."""

    folder: Path
    session_log: str = ""
    results: str = ""
    pytest_log: str = ""
    malloc: str = ""
    sanitizer_log: str = ""
    nvml_probe: str = ""
    readme: str = ""
    traces: dict[str, dict] = field(default_factory=dict)  # file name -> metadata
    quick_check: dict | None = None  # scripts.gpu_quick_check's quick-check.json

    @classmethod
    def read(cls, folder: str | Path) -> "Session":
        folder = Path(folder)
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: no such folder (a GPU session's output)")
        session = cls(folder, read_text(folder, "session"), read_text(folder, "results"),
                      read_text(folder, "pytest"), read_text(folder, "malloc"),
                      read_text(folder, "sanitizer"), read_text(folder, "nvml_probe"),
                      read_text(folder, "readme"))
        session.traces = _trace_metadata(folder)
        session.quick_check = _quick_check(folder)
        if not (session.session_log or session.results or session.quick_check):
            raise FileNotFoundError(f"{folder}: neither session.log nor results.md nor "
                                    f"{QUICK_CHECK}: not the output of scripts/gpu_session.sh")
        return session

    # -- session.log ---------------------------------------------------------------
    def setup(self) -> dict[str, str]:
        """Device, driver, versions, compiled hot path, pgmo's commit, as the setup logged them."""
        log, out = self.session_log, {}
        m = re.search(r"(?m)^(NVIDIA [^,\n]+), (\d+) MiB, ([\d.]+)$", log)
        if m:
            out.update(device=m[1], device_mib=m[2], driver=m[3])
        m = re.search(r"(?m)^python (\S+) numpy (\S+) cupy (\S+)$", log)
        if m:
            out.update(python=m[1], numpy=m[2], cupy=m[3])
        m = re.search(r"(?m)^pgmo (\S+) from .* chainer (\S+)$", log)
        if m:
            out.update(pgmo=m[1], chainer=m[2])
        m = re.search(r"(?m)^pgmo hot path: (.+)$", log)
        if m:
            out["hot_path"] = m[1].strip()
        m = re.search(r"(?m)^pgmo commit: (\S+)", log) or \
            re.search(r"at commit ([0-9a-f]{7,40})", self.readme)
        if m:
            out["commit"] = m[1]
        m = re.search(r"CUDA runtime (\d+)", self.results)
        if m:
            out["cuda_runtime"] = m[1]
        date = bullets(self.results).get("date") or _first_trace_date(self.traces)
        if date:
            out["date"] = date[:10]
        return out

    def steps(self) -> dict[str, dict]:
        """Each step's command, exit status and seconds (``BEGIN``/``END`` lines)."""
        out: dict[str, dict] = {}
        for m in re.finditer(r"BEGIN ([\w-]+) \(timeout (\d+)s\): (.*)", self.session_log):
            out[m[1]] = {"command": m[3].strip(), "timeout": int(m[2])}
        for m in re.finditer(r"END ([\w-]+): exit (\d+) after (\d+)s", self.session_log):
            out.setdefault(m[1], {}).update(exit=int(m[2]), seconds=int(m[3]))
        return out

    def summary_line(self, name: str) -> str | None:
        """A step's summary line in session.log (``pytest: ...``, ``mn: ...``)."""
        m = re.search(rf"\] {name}: (.*)$", self.session_log, re.M)
        return m[1].strip() if m else None

    def chainermn(self) -> tuple[list[dict[str, str]], list[str]]:
        """Step mn: every rank's row of its pool table, and its summary lines."""
        log = self.session_log
        start = log.find("Every rank's pgmo pool")
        if start < 0:
            return [], []
        lines = log[start:].splitlines()[1:]
        rule = [k for k, line in enumerate(lines) if line.startswith("----")]
        if len(rule) < 3:
            return [], []
        spans = [m.span() for m in re.finditer(r"-+", lines[rule[0]])]  # fixed-width columns

        def split(line: str) -> list[str]:
            return [line[a:b if k + 1 < len(spans) else None].strip()
                    for k, (a, b) in enumerate(spans)]

        header = split(lines[rule[0] + 1])
        rows = [dict(zip(header, split(line))) for line in lines[rule[1] + 1:rule[2]]]
        summary = [line.strip() for line in lines[rule[2] + 1:]
                   if line.startswith(("parameters identical", "pools optimized"))]
        return rows, summary

    def failed_workloads(self) -> list[str]:
        """Workloads whose recording failed in step traces, with the error's last line."""
        return re.findall(r"RuntimeError: ([\w.-]+): (.*)$|OutOfMemoryError: (.*)$",
                          self.session_log, re.M)

    # -- the other files ---------------------------------------------------------------
    def pytest_failures(self) -> list[str]:
        return re.findall(r"(?m)^FAILED (\S+)", self.pytest_log)

    def sanitizer_summaries(self) -> list[str]:
        return re.findall(r"ERROR SUMMARY: (\d+ errors?)", self.sanitizer_log)


def _trace_metadata(folder: Path) -> dict[str, dict]:
    """The recorded traces' metadata: from ``traces/`` or inside ``traces.tar.gz``."""
    import pgmo

    out = {}
    if (folder / "traces").is_dir():
        for path in sorted((folder / "traces").glob("*.json.gz")):
            out[path.name] = pgmo.read_trace(path).metadata
    elif (folder / "traces.tar.gz").is_file():
        import tempfile

        with tarfile.open(folder / "traces.tar.gz") as tar, \
                tempfile.TemporaryDirectory() as tmp:
            for member in tar.getmembers():
                if member.isfile() and member.name.endswith(".json.gz") and \
                        not member.name.endswith(".run.json.gz"):
                    data = tar.extractfile(member).read()
                    path = Path(tmp) / Path(member.name).name
                    path.write_bytes(data)
                    out[path.name] = pgmo.read_trace(path).metadata
    return out


QUICK_CHECK = "quick-check.json"


def _quick_check(folder: Path) -> dict | None:
    """The quick check's raw results: in the folder, in ``quick-check/``, or in the archive."""
    import json

    for path in (folder / QUICK_CHECK, folder / "quick-check" / QUICK_CHECK):
        if path.is_file():
            return json.loads(path.read_text())
    if (folder / "traces.tar.gz").is_file():
        with tarfile.open(folder / "traces.tar.gz") as tar:
            for member in tar.getmembers():
                if member.isfile() and Path(member.name).name == QUICK_CHECK:
                    return json.loads(tar.extractfile(member).read())
    return None


def _first_trace_date(traces: dict[str, dict]) -> str | None:
    dates = sorted(m["date"] for m in traces.values() if m.get("date"))
    return dates[0] if dates else None


__all__ = ["Session", "find"]
