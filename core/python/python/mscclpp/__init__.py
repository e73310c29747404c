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

from ._mscclpp import (
    BufferRef,
    Collectives,
    Communicator,
    ExecutionPlan,
    Executor,
    MscclppError,
    RawGpuBuffer,
    TcpBootstrap,
    UniqueId,
    __version__,
    backend,
    device_count,
)

#: The package's version (the same as ``__version__``).
version: str = __version__

__all__ = [
    "BufferRef",
    "CommGroup",
    "Collectives",
    "Communicator",
    "ExecutionPlan",
    "Executor",
    "MscclppError",
    "RawGpuBuffer",
    "TcpBootstrap",
    "UniqueId",
    "__version__",
    "backend",
    "device_count",
    "get_include",
    "version",
]


def get_include() -> str:
    """The folder of the device headers (``mscclpp/*.hpp``, kernels/cuda/include of the
    repository) shipped in the package: pass it as ``-I`` when compiling kernels that use the
    device handles."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


class CommGroup:
    """One rank of a group: owns its :class:`TcpBootstrap`, :class:`Communicator` and
    :class:`Collectives` (like upstream MSCCL++'s ``mscclpp.CommGroup``).

    ``address`` is a :class:`UniqueId` (or its bytes) that rank 0 created and passed to the
    others, or ``"ip:port"`` / ``"ifname:ip:port"`` where rank 0 listens. Creating it is
    collective: every rank of the group constructs one. ``device`` picks the GPU on GPU
    builds (default: ``(rank % nranks_per_node) % device_count``); ``timeout`` is the
    bootstrap's, in seconds; the other keywords go to :class:`Collectives` (``ll_half_bytes``,
    ``plain_bytes``, ``host_timeout``, ``host_blocks``, ``plan_dir``, ``plans``).
    """

    def __init__(
        self,
        rank: int,
        nranks: int,
        address: UniqueId | bytes | str,
        *,
        device: int | None = None,
        timeout: float = 60.0,
        **collectives_config: Any,
    ) -> None:
        self.bootstrap = TcpBootstrap(rank, nranks)
        self.bootstrap.initialize(address, timeout)
        self.communicator = Communicator(self.bootstrap)
        self.collectives = Collectives(self.communicator, device=device, **collectives_config)
        self._executor: Executor | None = None

    @property
    def rank(self) -> int:
        """This rank."""
        return self.bootstrap.rank

    @property
    def my_rank(self) -> int:
        """This rank (upstream's name)."""
        return self.bootstrap.rank

    @property
    def nranks(self) -> int:
        """The number of ranks."""
        return self.bootstrap.nranks

    @property
    def nranks_per_node(self) -> int:
        """Ranks on this host."""
        return self.bootstrap.nranks_per_node

    @property
    def device(self) -> int:
        """The GPU the collectives run on, -1 on the host backend."""
        return self.collectives.device

    def barrier(self) -> None:
        """Waits until every rank called it."""
        self.bootstrap.barrier()

    def all_reduce(self, send: Any, recv: Any = None, **kw: Any) -> None:
        """:meth:`Collectives.all_reduce` (in place when ``recv`` is None)."""
        self.collectives.all_reduce(send, recv, **kw)

    def all_gather(self, send: Any, recv: Any = None, **kw: Any) -> None:
        """:meth:`Collectives.all_gather` (in place when ``recv`` is None)."""
        self.collectives.all_gather(send, recv, **kw)

    def reduce_scatter(self, send: Any, recv: Any = None, **kw: Any) -> None:
        """:meth:`Collectives.reduce_scatter` (in place when ``recv`` is None)."""
        self.collectives.reduce_scatter(send, recv, **kw)

    def broadcast(self, send: Any, recv: Any = None, **kw: Any) -> None:
        """:meth:`Collectives.broadcast` (in place when ``recv`` is None; ``root=`` keyword)."""
        self.collectives.broadcast(send, recv, **kw)

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
