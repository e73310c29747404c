"""MSCCL++ in Rust for Python: bootstrap, communicator, collectives and the executor.

Quick start (one process per rank; every rank makes the same calls in the same order)::

    import numpy as np, mscclpp
    group = mscclpp.CommGroup(rank, nranks, "127.0.0.1:50000")
    x = np.full(1024, rank, dtype=np.float32)
    group.all_reduce(x)            # in place: x == sum of every rank's x
    group.barrier()

The build's backend (:func:`backend`) decides which buffers the collectives take: NumPy
arrays (any object with the buffer protocol) on the host backend; torch tensors, CuPy arrays
and :class:`RawGpuBuffer` on GPU builds. ``mscclpp.torch`` integrates with
``torch.distributed``.
"""

from __future__ import annotations

import os
from typing import Any

from . import _mscclpp  # noqa: F401 (the native module, for mscclpp._mscclpp users)
from ._mscclpp import BufferRef, Communicator, ExecutionPlan, Executor, MscclppError, RawGpuBuffer
from ._mscclpp import TcpBootstrap, UniqueId, __version__, backend, device_count

#: The package's version (the same as ``__version__``).
version: str = __version__

__all__ = ["BufferRef", "CommGroup", "Collectives", "Communicator", "ExecutionPlan", "Executor", "MscclppError"]
__all__ += ["RawGpuBuffer", "TcpBootstrap", "UniqueId", "__version__", "backend", "device_count", "get_include", "version"]


def get_include() -> str:
    """The folder of the device headers (``mscclpp/*.hpp``, kernels/cuda/include of the
    repository) shipped in the package: pass it as ``-I`` when compiling kernels that use the
    device handles."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


class Collectives(_mscclpp.Collectives):
    """The collectives of one communicator: ``Collectives(comm, *, device=None, ...)`` (every
    rank creates it, then makes the same calls in the same order).

    Buffers: NumPy arrays (anything with the buffer protocol) on the host backend; torch
    tensors, CuPy arrays, :class:`RawGpuBuffer` and :class:`BufferRef` on GPU builds, where
    the calls are asynchronous on ``stream`` (default: the tensor's current torch/CuPy
    stream, else 0). Every call takes ``dtype=`` (overrides the buffers' element type),
    ``algorithm=`` (one of :meth:`algorithm_names`, for this call) and ``stream=``;
    :meth:`collective` says the size rules.
    """

    def all_reduce(self, send: Any, recv: Any = None, *, op: str = "sum", **kw: Any) -> None:
        """Every element becomes the reduction (sum, prod, min, max, avg) over the ranks;
        in place when ``recv`` is None."""
        self.collective("allreduce", send, recv, op=op, **kw)

    def all_gather(self, send: Any, recv: Any = None, **kw: Any) -> None:
        """Every rank's ``send`` into ``recv`` (rank r's block at r x send's size); in place when
        ``recv`` is None: ``send`` is then the whole buffer, this rank's block in its place."""
        self.collective("allgather", send, recv, **kw)

    def reduce_scatter(self, send: Any, recv: Any = None, *, op: str = "sum", **kw: Any) -> None:
        """Rank r's ``recv`` gets block r of the reduction over the ranks of ``send`` (nranks
        blocks); in place when ``recv`` is None: into this rank's block of ``send``."""
        self.collective("reducescatter", send, recv, op=op, **kw)

    def broadcast(self, send: Any, recv: Any = None, *, root: int = 0, **kw: Any) -> None:
        """``root``'s ``send`` into every rank's ``recv`` (in place when None: ``send`` is
        overwritten on the other ranks)."""
        self.collective("broadcast", send, recv, root=root, **kw)


class CommGroup(Collectives):
    """One rank of a group: its :class:`TcpBootstrap`, :class:`Communicator` and the
    :class:`Collectives` it is (like upstream MSCCL++'s ``mscclpp.CommGroup``).

    ``address`` is a :class:`UniqueId` (or its bytes) that rank 0 created and passed to the
    others, or ``"ip:port"`` / ``"ifname:ip:port"`` where rank 0 listens. Creating it is
    collective: every rank of the group constructs one. ``device`` picks the GPU on GPU
    builds (default: ``(rank % nranks_per_node) % device_count``); ``timeout`` is the
    bootstrap's, in seconds; the other keywords go to :class:`Collectives` (``ll_half_bytes``,
    ``plain_bytes``, ``host_timeout``, ``host_blocks``, ``plan_dir``, ``plans``).
    """

    bootstrap: TcpBootstrap
    communicator: Communicator
    _executor: Executor | None

    def __new__(
        cls,
        rank: int,
        nranks: int,
        address: UniqueId | bytes | str,
        *,
        device: int | None = None,
        timeout: float = 60.0,
        **config: Any,
    ) -> CommGroup:
        bootstrap = TcpBootstrap(rank, nranks)
        bootstrap.initialize(address, timeout)
        communicator = Communicator(bootstrap)
        self = super().__new__(cls, communicator, device=device, **config)
        self.bootstrap, self.communicator, self._executor = bootstrap, communicator, None
        return self

    def __init__(self, *args: Any, **kw: Any) -> None:
        """Everything is done by ``__new__`` (the native base takes its arguments there)."""

    @property
    def my_rank(self) -> int:
        """This rank (upstream's name)."""
        return self.rank

    @property
    def nranks_per_node(self) -> int:
        """Ranks on this host."""
        return self.bootstrap.nranks_per_node

    @property
    def collectives(self) -> Collectives:
        """The group itself (it is its :class:`Collectives`)."""
        return self

    def barrier(self) -> None:
        """Waits until every rank called it."""
        self.bootstrap.barrier()

    @property
    def executor(self) -> Executor:
        """The group's :class:`Executor` (made on first use)."""
        if self._executor is None:
            self._executor = Executor(self.communicator)
        return self._executor

    def load_plan(self, path: str | os.PathLike[str]) -> ExecutionPlan:
        """The execution plan at ``path`` for this rank."""
        return ExecutionPlan(os.fspath(path), self.rank)

    def execute(self, plan: ExecutionPlan | str | os.PathLike[str], send: Any, recv: Any, **kw: Any) -> None:
        """Runs ``plan`` (an :class:`ExecutionPlan` or a path) with :meth:`Executor.execute`."""
        if not isinstance(plan, ExecutionPlan):
            plan = self.load_plan(plan)
        self.executor.execute(plan, send, recv, **kw)

    def __repr__(self) -> str:
        return f"CommGroup(rank={self.rank}, nranks={self.nranks}, backend={backend()!r})"
