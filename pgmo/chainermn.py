"""Data-parallel training with ChainerMN: one pgmo pool per MPI process.

Each process (rank) trains on its own GPU and allocates its own requests, so
each gets its own pool, which profiles, plans and saves the plan of that rank
alone; nothing is shared between ranks.  Usage, in every rank::

    import pgmo.chainermn                        # before chainer: the compatibility layer
    import chainermn

    comm = pgmo.chainermn.create_communicator()  # "auto": what these GPUs and this MPI can do
    rank = pgmo.chainermn.setup_rank(comm, plan_dir="result")
    model.to_device(rank.device)
    optimizer = chainermn.create_multi_node_optimizer(optimizer, comm)
    ...                                          # scatter_dataset, updater, trainer
    rank.extend(trainer)                         # the ProfileGuidedMemory extension
    trainer.run()
    table = rank.gather_stats()                  # on rank 0: every rank's pool statistics

MPI comes from pip (``pip install 'pgmo[mpi]'``: mpi4py and MPICH's wheel);
start with ``mpiexec -n N python train.py``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy

from . import _chainer_compat
from .chainer import ProfileGuidedMemory

_chainer_compat.apply()

try:
    import chainer
    import chainermn
    from chainermn.communicators.naive_communicator import NaiveCommunicator
    from mpi4py import MPI
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "pgmo.chainermn needs Chainer 7.8.1 (which ships ChainerMN), mpi4py and an MPI "
        "library; install them with pip install 'pgmo[chainer,mpi]' (see docs/install.rst)") from error

__all__ = ["COMMUNICATORS", "GPU_ONLY", "HostStagedCommunicator", "Rank", "RankStats",
           "create_communicator", "choose_communicator", "setup_rank", "plan_file_name",
           "MN_WARMUP"]

logger = logging.getLogger(__name__)

#: Names :func:`create_communicator` accepts: ``auto``, pgmo's ``host_staged``
#: and ChainerMN's own.
COMMUNICATORS = ("auto", "host_staged", "pure_nccl", "flat", "naive", "non_cuda_aware")
#: ChainerMN's communicators that only move GPU arrays.
GPU_ONLY = ("pure_nccl", "flat", "non_cuda_aware")

#: Warm-up iterations of a rank's pool: ChainerMN's multi-node optimizer only
#: broadcasts rank 0's parameters at its first update, so the optimizer makes
#: its state (momentum...) at the second; the third is the first like the rest.
MN_WARMUP = 2


class HostStagedCommunicator(NaiveCommunicator):
    """ChainerMN's naive communicator, with GPU arrays copied through host memory.

    Ranks that share a GPU cannot use NCCL (it refuses two ranks on one
    device), and ChainerMN's MPI communicators hand GPU pointers to MPI, which
    only a CUDA-aware MPI accepts; the MPI wheels on PyPI are not.  This one
    copies each parameter (at the broadcast) and each gradient (at the
    averaging) to host memory, lets the naive communicator do its MPI call on
    the copy, and copies the result back in place.  Parameters and gradients
    are contiguous, so the copies allocate no device memory and add no pool
    requests.  NumPy arrays (the CPU) are used as they are.
    """

    def bcast_data(self, model) -> None:
        for _, param in sorted(model.namedparams()):
            if param.data is not None:
                host = _to_host(param.data)
                self._bcast_host(host)
                _copy_back(param.data, host)

    def _bcast_host(self, host) -> None:
        """Rank 0's values into ``host`` (float16 goes over MPI as float32, as in ChainerMN)."""
        if host.dtype == numpy.float16:
            wide = host.astype(numpy.float32)
            self.mpi_comm.Bcast(wide)
            host[...] = wide
        else:
            self.mpi_comm.Bcast(host)

    def _multi_node_mean(self, sendbuf, recvbuf) -> None:
        host_recv = _to_host(recvbuf)
        host_send = None if sendbuf is None else _to_host(sendbuf)
        super()._multi_node_mean(host_send, host_recv)
        _copy_back(recvbuf, host_recv)


def _to_host(array):
    """A C-contiguous host copy of ``array`` (a contiguous NumPy array itself)."""
    return numpy.ascontiguousarray(chainer.backends.cuda.to_cpu(array))


def _copy_back(array, host) -> None:
    """Write ``host`` into ``array`` in place, unless they are the same array."""
    if host is array:
        return
    if isinstance(array, chainer.backends.cuda.ndarray):
        array.set(host)  # host to device, into the same memory: no allocation
    else:
        array[...] = host


def choose_communicator(mpi_comm=None, *, gpu: bool = True) -> str:
    """The communicator ``auto`` stands for, the same on every rank.

    On the CPU ChainerMN's ``naive``.  On GPUs ``pure_nccl`` (ChainerMN's
    default) when NCCL can be loaded and every rank of every node has a GPU of
    its own; otherwise ``host_staged`` (ranks share a GPU, or no NCCL).
    """
    mpi_comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
    if not gpu:
        return "naive"
    import cupy
    from chainermn import nccl

    node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        ranks_here = node.Get_size()
    finally:
        node.Free()
    own_gpu = ranks_here <= cupy.cuda.runtime.getDeviceCount()
    nccl_everywhere = mpi_comm.allreduce(bool(nccl._available and own_gpu), op=MPI.LAND)
    return "pure_nccl" if nccl_everywhere else "host_staged"


def create_communicator(name: str = "auto", *, gpu: bool = True, mpi_comm=None):
    """A ChainerMN communicator by name (:data:`COMMUNICATORS`); collective: call it on every rank.

    ``gpu``: whether the ranks train on GPUs (ChainerMN's :data:`GPU_ONLY`
    communicators are refused otherwise).  ``auto`` picks with
    :func:`choose_communicator`; ``host_staged`` is
    :class:`HostStagedCommunicator`; other names go to
    ``chainermn.create_communicator``.
    """
    if name not in COMMUNICATORS:
        raise ValueError(f"unknown communicator {name!r}; choose from {', '.join(COMMUNICATORS)}")
    if not gpu and name in GPU_ONLY:
        raise ValueError(f"the {name} communicator needs GPUs; on the CPU use naive or auto")
    mpi_comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
    if name == "auto":
        name = choose_communicator(mpi_comm, gpu=gpu)
    if name == "host_staged":
        comm = HostStagedCommunicator(mpi_comm=mpi_comm)
    else:
        comm = chainermn.create_communicator(name, mpi_comm=mpi_comm)
    if comm.rank == 0:
        logger.info("ChainerMN communicator: %s (%s), %d ranks", name, type(comm).__name__,
                    comm.size)
    return comm


def plan_file_name(rank: int) -> str:
    """Where a rank keeps its plan, inside the plan folder: one file per rank."""
    return f"pgmo-plan.rank{rank}.json"


@dataclass(frozen=True)
class RankStats:
    """One rank's pool statistics, as :meth:`Rank.gather_stats` collects them."""

    rank: int
    host: str
    device_id: int  # -1: the CPU
    plan_path: str | None
    stats: Any  # a pgmo.PoolStats


@dataclass
class Rank:
    """What :func:`setup_rank` made for this process."""

    comm: Any  # the ChainerMN communicator
    device: Any  # a chainer.backend.Device: this rank's GPU, or the CPU
    device_id: int  # the GPU's id, -1 for the CPU
    pool: Any  # this rank's pgmo.ProfileGuidedMemoryPool
    plan_path: str | None  # where the pool loads and saves its plan
    host: str

    def extend(self, trainer, **options: Any) -> ProfileGuidedMemory:
        """Add the ProfileGuidedMemory extension with this rank's pool to ``trainer``."""
        extension = ProfileGuidedMemory(self.pool, **options)
        trainer.extend(extension)
        return extension

    def gather_stats(self) -> list[RankStats] | None:
        """Every rank's pool statistics, by rank, on rank 0 (None elsewhere); collective."""
        mine = RankStats(self.comm.rank, self.host, self.device_id, self.plan_path,
                         self.pool.stats())
        return self.comm.gather_obj(mine)


def setup_rank(comm, *, gpu: bool = True, plan_dir: str | os.PathLike | None = None,
               **pool_options: Any) -> Rank:
    """Make this rank's device current and give it its own pgmo pool.

    With ``gpu`` the rank uses the GPU of its intra-node rank
    (``comm.intra_rank``, modulo the GPUs visible, so ranks share GPUs when
    there are more ranks than GPUs); otherwise the CPU, where Chainer computes
    with NumPy and the pool, on host memory (:func:`pgmo.measure.hosts.host_pool`),
    serves only what is given to it directly.  ``plan_dir``: each rank loads
    and saves its plan there, in its own file (:func:`plan_file_name`);
    None keeps plans in memory.  ``pool_options`` go to the pool
    (``warmup`` defaults to :data:`MN_WARMUP`).
    """
    pool_options.setdefault("warmup", MN_WARMUP)
    plan_path = None
    if plan_dir is not None:
        os.makedirs(plan_dir, exist_ok=True)
        plan_path = os.path.join(os.fspath(plan_dir), plan_file_name(comm.rank))
    if gpu:
        import cupy

        from .pool import ProfileGuidedMemoryPool

        gpus = cupy.cuda.runtime.getDeviceCount()
        if gpus < 1:
            raise RuntimeError("no GPU is visible to this process; train on the CPU "
                               "(gpu=False) or check CUDA_VISIBLE_DEVICES")
        device_id = comm.intra_rank % gpus
        device = chainer.get_device(f"@cupy:{device_id}")
        device.use()
        pool = ProfileGuidedMemoryPool(plan_path=plan_path, **pool_options)
    else:
        from .measure.hosts import host_pool

        device_id = -1
        device = chainer.get_device("@numpy")
        pool = host_pool(plan_path=plan_path, **pool_options)
    host = MPI.Get_processor_name()
    logger.info("rank %d of %d on %s: %s, plan %s", comm.rank, comm.size, host,
                f"GPU {device_id}" if gpu else "CPU", plan_path or "in memory")
    return Rank(comm, device, device_id, pool, plan_path, host)
