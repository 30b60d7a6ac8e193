"""The check a GPU program makes first: does CuPy see the CUDA device it is asked to use?

Without it, a GPU program started where there is no GPU (no driver, an old
driver, ``CUDA_VISIBLE_DEVICES=""``) fails in every step with the driver's
traceback, or reports a table of failures and exits 0.  With it, the program
stops before any work with one line: which device, what CuPy said, and how
to run without a GPU (``--device -1``, ``--dry-run``).  Tested by
``tests/test_without_gpu_or_chainer.py``.
"""

from __future__ import annotations

from pgmo import programs

__all__ = ["usable_gpus", "require_gpu"]


def usable_gpus() -> tuple[int, str]:
    """(the CUDA devices CuPy can use, what was tried and why none when 0).

    Raises ``ModuleNotFoundError`` without CuPy.
    """
    import cupy

    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except (RuntimeError, OSError) as exc:  # no driver, an old one, no library: CuPy says
        return 0, f"cudaGetDeviceCount: {' '.join(str(exc).split())}"
    return count, "" if count else "cudaGetDeviceCount: 0 devices"


def require_gpu(device: int = 0, *, instead: str = "") -> None:
    """Raise :class:`pgmo.programs.UsageError` (one line, exit status 2 under
    ``programs.run``) unless CuPy can use CUDA device ``device``.  The message names
    the device, what CuPy said, and ``instead`` (how to run without a GPU)."""
    try:
        count, why = usable_gpus()
    except ModuleNotFoundError as exc:
        missing = programs.missing_package(exc)
        if missing is None:
            raise
        raise programs.UsageError(f"{missing} (it runs on a CUDA GPU)") from exc
    if 0 <= device < count:
        return
    seen = f"{count} GPU(s), numbered 0 to {count - 1}" if count else f"no usable GPU ({why})"
    raise programs.UsageError(f"needs CUDA GPU {device}, and CuPy sees {seen}"
                              + (f"; {instead}" if instead else ""))
