"""Opening and writing files safely: gzip by content, atomic replacement.

Every reader opens through :func:`read_head` / :func:`open_text`, so a
compressed file is recognised by its magic bytes rather than its name, and a
folder or a missing path gets an error that says what it is.  Every writer
goes through :func:`write_bytes_atomically`: a failed write never leaves half
a file behind.
"""

from __future__ import annotations

import gzip
import io
import os
import tempfile
from pathlib import Path

from ..errors import TraceFormatError

__all__ = ["check_readable", "is_gzip", "read_head", "open_text", "read_bytes",
           "write_bytes_atomically", "write_text_atomically"]

GZIP_MAGIC = b"\x1f\x8b"


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
    except (OSError, EOFError) as exc:
        raise TraceFormatError(f"cannot be read: {exc}", path=str(path)) from None


def open_text(path: Path):
    """Text in UTF-8; ``utf-8-sig`` skips a byte-order mark (spreadsheet exports)."""
    if is_gzip(path):
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return open(path, "r", encoding="utf-8-sig", newline="")


def read_bytes(path: Path) -> bytes:
    """The whole (decompressed) content; a damaged gzip stream is a format error."""
    check_readable(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceFormatError(f"cannot be read ({exc.strerror})", path=str(path)) from None
    if data[:2] == GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise TraceFormatError(f"damaged gzip data ({exc})", path=str(path)) from None
    return data


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
