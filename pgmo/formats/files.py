"""Opening and writing files safely: gzip by content, atomic replacement.

Every reader opens through :func:`read_head` / :func:`open_text` /
:func:`read_bytes`, so a compressed file is recognised by its magic bytes
rather than its name, a folder or a missing path gets an error that says
what it is, and a compressed file may expand only so far
(:func:`expansion_cap`): a small file that inflates to gigabytes is refused
before it fills the memory.  Every writer goes through
:func:`write_bytes_atomically`: a failed write never leaves half a file
behind.
"""

from __future__ import annotations

import gzip
import io
import os
import tempfile
import zlib
from pathlib import Path

from ..errors import TraceFormatError

__all__ = ["check_readable", "is_gzip", "read_head", "open_text", "read_bytes",
           "write_bytes_atomically", "write_text_atomically", "expansion_cap", "GZIP_ERRORS",
           "EXPANSION_FLOOR", "EXPANSION_RATIO", "NESTED_TOO_DEEPLY"]

GZIP_MAGIC = b"\x1f\x8b"

#: What reading a damaged or truncated gzip stream raises: a bad header (OSError), an
#: early end (EOFError), corrupted deflate data (zlib.error, which is neither).
GZIP_ERRORS = (OSError, EOFError, zlib.error)

#: A compressed file may always expand to this many bytes...
EXPANSION_FLOOR = 16 << 20
#: ...and beyond that to this many times its own size.  Traces, runs and plans
#: compress 2-4x (the bundled ones, the public DSA instances); gzip's most is
#: about 1000x, which only a file made to inflate reaches.
EXPANSION_RATIO = 100


#: Why a JSON file whose nesting exceeds Python's recursion limit is refused.
NESTED_TOO_DEEPLY = "JSON nested too deeply: more levels than Python's recursion limit"


def expansion_cap(compressed_bytes: int) -> int:
    """The most bytes a compressed file of ``compressed_bytes`` may expand to."""
    return max(EXPANSION_FLOOR, EXPANSION_RATIO * compressed_bytes)


def _too_expanded(path: Path, compressed: int, cap: int) -> TraceFormatError:
    return TraceFormatError(
        f"expands to more than {cap:,} B from {compressed:,} B compressed (pgmo expands a "
        f"file to {EXPANSION_RATIO} times its size, or {EXPANSION_FLOOR >> 20} MiB if more): "
        f"refused as a decompression bomb; if it is genuine, decompress it (gunzip -k) and "
        f"read that", path=str(path))


class _CappedGzip(io.RawIOBase):
    """A gzip stream that raises :class:`TraceFormatError` once past its cap."""

    def __init__(self, path: Path):
        self.path = path
        self.compressed = path.stat().st_size
        self.cap = expansion_cap(self.compressed)
        self.expanded = 0
        self._gz = gzip.open(path, "rb")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            n = self._gz.readinto(buffer)
        except zlib.error as exc:  # neither OSError nor EOFError: every reader's catch misses it
            raise TraceFormatError(f"damaged gzip data ({exc})", path=str(self.path)) from None
        self.expanded += n
        if self.expanded > self.cap:
            raise _too_expanded(self.path, self.compressed, self.cap)
        return n

    def close(self) -> None:
        if not self.closed:
            self._gz.close()
        super().close()


def check_readable(path: Path) -> None:
    """Raise :class:`TraceFormatError` saying why ``path`` is not a file to read."""
    if path.is_dir():
        raise TraceFormatError("is a directory, not a trace file", path=str(path))
    if not path.exists():
        raise TraceFormatError("no such file", path=str(path))
    if not path.is_file():
        raise TraceFormatError("is not a regular file", path=str(path))


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == GZIP_MAGIC


def read_head(path: Path, n: int = 4096) -> bytes:
    """The first ``n`` bytes of the (decompressed) content, for format detection."""
    check_readable(path)
    try:
        if is_gzip(path):
            with gzip.open(path, "rb") as fh:
                return fh.read(n)
        with open(path, "rb") as fh:
            return fh.read(n)
    except GZIP_ERRORS as exc:
        raise TraceFormatError(f"cannot be read: {exc}", path=str(path)) from None


def open_text(path: Path):
    """Text in UTF-8; ``utf-8-sig`` skips a byte-order mark (spreadsheet exports)."""
    if is_gzip(path):
        return io.TextIOWrapper(io.BufferedReader(_CappedGzip(path)), encoding="utf-8-sig",
                                newline="")
    return open(path, "r", encoding="utf-8-sig", newline="")


def read_bytes(path: Path) -> bytes:
    """The whole (decompressed) content; a damaged gzip stream is a format error."""
    check_readable(path)
    try:
        if not is_gzip(path):
            return path.read_bytes()
    except OSError as exc:
        raise TraceFormatError(f"cannot be read ({exc.strerror})", path=str(path)) from None
    try:
        with _CappedGzip(path) as stream:
            return stream.readall()
    except GZIP_ERRORS as exc:
        raise TraceFormatError(f"damaged gzip data ({exc})", path=str(path)) from None


def _new_file_mode(path: Path) -> int:
    """Keep an existing file's permissions; a new file gets what open() would give."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_bytes_atomically(path, data: bytes) -> None:
    """Replace ``path`` with ``data`` in one step: never a half-written file.

    A name ending in ``.gz`` is gzip-compressed (mtime=0: reproducible bytes);
    an existing file keeps its permissions.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder, not a file to write")
    if path.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, _new_file_mode(path))  # mkstemp makes 0600 files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomically(path, write) -> None:
    """Render text with ``write(fh)`` in memory, then store it atomically."""
    buf = io.StringIO(newline="")
    write(buf)
    write_bytes_atomically(path, buf.getvalue().encode("utf-8"))
