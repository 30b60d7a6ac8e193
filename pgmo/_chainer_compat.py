"""Let Chainer 7.8.1 (the last release, 2020) import on today's NumPy and Python.

Chainer is frozen, while NumPy 2 removed names it uses and Python 3.12 dropped
``numpy.distutils``.  :func:`apply` fixes exactly the two things that stop
``import chainer`` and the layers pgmo's examples use; it must run before
Chainer is first imported, which ``import pgmo.chainer`` does for the user.

What is patched, and why:

* ``numpy.sctypes`` (removed in NumPy 2.0) is restored with its NumPy 1.x
  content, only when missing.  ``chainer.functions.array.as_strided`` builds a
  table from ``np.sctypes['int']`` at import time, so ``import chainer`` fails
  without it.  Restoring a removed name changes nothing for code that never
  uses it.
* ``chainer._environment_check`` is replaced, before Chainer imports it, by a
  module whose ``check()`` does nothing.  The original imports
  ``numpy.distutils`` (absent on Python >= 3.12, deprecated before) and
  ``pkg_resources`` (removed in setuptools 82), and its three checks are moot
  here: Python 3.5.0 (pgmo needs >= 3.10), a macOS Accelerate warning read
  from ``numpy.distutils`` (which no longer describes how NumPy is built), and
  a pin of CuPy to ``>=7.7,<8`` that would only warn about the CuPy pgmo uses.
* CuPy's NCCL module is imported once, without its nine-line warning that
  the NCCL library could not be loaded.  ``import chainer`` imports it for
  its multi-process updater, which pgmo never uses; where NCCL is used
  (ChainerMN's ``pure_nccl``), ChainerMN stops with its own error when it
  does not load, and ``pgmo.chainermn``'s ``auto`` picks another
  communicator.

* The modules an earlier ``import chainer`` left when it failed (before this
  module ran) are dropped, so that the next ``import chainer`` starts afresh.

Not patched, because nothing pgmo uses needs it: ``numpy.float`` in
``F.resize_images`` (removed in NumPy 1.24).  NumPy behaviour is otherwise
untouched, and :func:`apply` is idempotent.  ChainerMN (shipped in Chainer
7.8.1) needs nothing more under mpi4py 4: its naive communicator, object
and array collectives, ``scatter_dataset``, multi-node optimizer and
evaluator, ``AllreducePersistent`` and ``MultiNodeBatchNormalization`` run on
NumPy 2 as they are (checked on the CPU; its GPU paths need a GPU).
"""

from __future__ import annotations

import logging
import sys
import types
import warnings

import numpy

logger = logging.getLogger(__name__)

_ENV_CHECK = "chainer._environment_check"
#: The no-op module put in its place (kept by :func:`_forget_a_failed_import`).
_STUB: list[types.ModuleType | None] = [None]


def _numpy1_sctypes() -> dict[str, list[type]]:
    """The ``numpy.sctypes`` table of NumPy 1.x: scalar types by kind, by size."""
    return {
        "int": [numpy.int8, numpy.int16, numpy.int32, numpy.int64],
        "uint": [numpy.uint8, numpy.uint16, numpy.uint32, numpy.uint64],
        "float": [numpy.float16, numpy.float32, numpy.float64, numpy.longdouble],
        "complex": [numpy.complex64, numpy.complex128, numpy.clongdouble],
        "others": [bool, object, bytes, str, numpy.void],
    }


def _restore_sctypes() -> bool:
    """Put back ``numpy.sctypes`` if this NumPy removed it; True if it did."""
    if hasattr(numpy, "sctypes"):  # NumPy 1.x, or already restored
        return False
    setattr(numpy, "sctypes", _numpy1_sctypes())  # noqa: B010 (NumPy 2 has no such name)
    return True


def _quiet_environment_check() -> bool:
    """Pre-register a no-op ``chainer._environment_check``; True if it did.

    ``chainer/__init__.py`` runs ``from chainer import _environment_check`` and
    then ``_environment_check.check()``; the import finds this module in
    ``sys.modules`` and never executes the original file.  Once Chainer has
    been imported the original has already run (and so worked), and nothing
    is done.
    """
    if "chainer" in sys.modules or _ENV_CHECK in sys.modules:
        return False
    module = types.ModuleType(_ENV_CHECK, "Replaced by pgmo._chainer_compat: "
                              "the original needs numpy.distutils and pkg_resources.")
    setattr(module, "check", lambda: None)  # noqa: B010 (a module made here)
    sys.modules[_ENV_CHECK] = _STUB[0] = module
    return True


_NCCL = "cupy.cuda.nccl"


def _quiet_nccl_import() -> bool:
    """Import CuPy's NCCL module now, without its warning when NCCL is missing; True if
    it did.  Nothing when Chainer or that module came first, or without CuPy."""
    if "chainer" in sys.modules or _NCCL in sys.modules:
        return False
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"\s*nccl library could not be loaded")
        try:
            import cupy.cuda.nccl  # noqa: F401
        except ImportError:  # no CuPy: Chainer runs on NumPy alone
            return False
    return True


def _forget_a_failed_import() -> bool:
    """Drop the Chainer modules a failed ``import chainer`` left behind; True if any.

    Python removes the package that failed, not the submodules that had loaded
    before it: a second ``import chainer`` in the same interpreter (a notebook
    cell run again after ``import pgmo.chainer`` was added) would find them
    half-initialized and fail on a circular import.  Nothing can hold a working
    Chainer while ``chainer`` itself is missing from ``sys.modules``.
    """
    if "chainer" in sys.modules:
        return False
    stale = [name for name, module in sys.modules.items()
             if name.startswith("chainer.") and module is not _STUB[0]]
    for name in stale:
        del sys.modules[name]
    return bool(stale)


def apply() -> None:
    """Make ``import chainer`` work on NumPy 2 and Python >= 3.12 (idempotent)."""
    if _forget_a_failed_import():
        logger.debug("dropped the modules of an earlier failed 'import chainer'")
    if _restore_sctypes():
        logger.debug("restored numpy.sctypes for Chainer")
    if _quiet_environment_check():
        logger.debug("replaced %s (needs numpy.distutils, pkg_resources)", _ENV_CHECK)
    if _quiet_nccl_import():
        logger.debug("imported %s without its warning that NCCL is missing", _NCCL)
