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

import contextlib
import os
from typing import Any, Iterator

from . import _mscclpp  # noqa: F401 (the native module, for mscclpp._mscclpp users)
from ._mscclpp import BufferRef, Communicator, ExecutionPlan, Executor, MscclppError, RawGpuBuffer
from ._mscclpp import PointToPoint, TcpBootstrap, UniqueId, __version__, backend, device_count
from ._mscclpp import BaseMemoryChannel, BasePortChannel, Connection, Future, Host2DeviceSemaphore
from ._mscclpp import Host2HostSemaphore, MemoryChannel, MemoryDevice2DeviceSemaphore, PortChannel
from ._mscclpp import ProxyService, RegisteredMemory, Semaphore

#: The package's version (the same as ``__version__``).
version: str = __version__

__all__ = ["BufferRef", "CommGroup", "Collectives", "Communicator", "ExecutionPlan", "Executor", "MscclppError"]
__all__ += ["BaseMemoryChannel", "BasePortChannel", "Connection", "Future", "Host2DeviceSemaphore"]
__all__ += ["Host2HostSemaphore", "MemoryChannel", "MemoryDevice2DeviceSemaphore", "PortChannel"]
__all__ += ["ProxyService", "RegisteredMemory", "Semaphore"]
__all__ += ["GpuBuffer", "P2pBatch", "PointToPoint", "RawGpuBuffer", "TcpBootstrap", "UniqueId", "__version__", "backend", "device_count", "get_include", "version"]


def get_include() -> str:
    """The folder of the device headers (``mscclpp/*.hpp``, kernels/cuda/include of the
    repository) shipped in the package: pass it as ``-I`` when compiling kernels that use the
    device handles."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")


def GpuBuffer(shape: int | tuple[int, ...], dtype: Any = "float32", device: int | None = None) -> Any:
    """An array in memory this library allocates (a :class:`RawGpuBuffer`, zeroed, kept alive
    by the array through DLPack), like upstream's ``mscclpp.utils.GpuBuffer``: a CuPy array
    on GPU builds (``cupy`` must be installed; ``torch.from_dlpack`` views it as a tensor), a
    NumPy array on the host backend. Peers can map it: zero-copy algorithms, execution plans
    and :meth:`Communicator.register_memory` take it."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    count = 1
    for n in shape:
        count *= n
    if backend() == "host":
        import numpy as xp
    else:
        import cupy as xp  # type: ignore[no-redef]
    dt = xp.dtype(dtype)
    raw = RawGpuBuffer(max(count * dt.itemsize, 1), device)
    flat = xp.from_dlpack(raw)
    return flat[: count * dt.itemsize].view(dt).reshape(shape)


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


class P2pBatch:
    """A batch of sends and receives that runs as one (one kernel launch on GPUs, like an NCCL
    group): ``send``/``recv`` queue, :meth:`run` (or leaving the ``with`` block without an
    exception) runs them together, so matched sends and receives complete in any order.

    The buffers stay referenced until the batch ran. Made by :meth:`CommGroup.batch` (or
    ``P2pBatch(point_to_point, stream=None)``); ``with group.group(): ...`` batches the
    group's own ``send``/``recv`` calls the same way.
    """

    def __init__(self, p2p: PointToPoint, stream: int | None = None) -> None:
        self.p2p = p2p
        self.stream = stream
        self.ops: list[tuple[str, int, Any]] = []

    def send(self, buf: Any, peer: int) -> None:
        """Queues sending the whole of ``buf`` to ``peer`` (whose matching receive is the same size)."""
        self.ops.append(("send", peer, buf))

    def recv(self, buf: Any, peer: int) -> None:
        """Queues receiving ``peer``'s matching send into ``buf`` (the same size)."""
        self.ops.append(("recv", peer, buf))

    def run(self) -> None:
        """Runs the queued operations as one batch and empties the queue (nothing to do when empty)."""
        ops, self.ops = self.ops, []
        if ops:
            self.p2p.run(ops, stream=self.stream)

    def __len__(self) -> int:
        return len(self.ops)

    def __enter__(self) -> P2pBatch:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.run()
        else:
            self.ops = []


class CommGroup(Collectives):
    """One rank of a group: its :class:`TcpBootstrap`, :class:`Communicator` and the
    :class:`Collectives` it is (like upstream MSCCL++'s ``mscclpp.CommGroup``).

    ``address`` is a :class:`UniqueId` (or its bytes) that rank 0 created and passed to the
    others, or ``"ip:port"`` / ``"ifname:ip:port"`` where rank 0 listens. Creating it is
    collective: every rank of the group constructs one. ``device`` picks the GPU on GPU
    builds (default: ``(rank % nranks_per_node) % device_count``); ``timeout`` is the
    bootstrap's, in seconds; ``p2p=False`` skips setting up :meth:`send`/:meth:`recv` (their
    links take a few MiB per peer), ``p2p_timeout`` bounds a stalled batch (seconds, default
    120); the other keywords go to :class:`Collectives` (``ll_half_bytes``,
    ``plain_bytes``, ``host_timeout``, ``host_blocks``, ``plan_dir``, ``plans``).
    """

    bootstrap: TcpBootstrap
    communicator: Communicator
    _executor: Executor | None
    _p2p: PointToPoint | None
    _batch: P2pBatch | None

    def __new__(
        cls,
        rank: int,
        nranks: int,
        address: UniqueId | bytes | str,
        *,
        device: int | None = None,
        timeout: float = 60.0,
        p2p: bool = True,
        p2p_timeout: float | None = None,
        **config: Any,
    ) -> CommGroup:
        bootstrap = TcpBootstrap(rank, nranks)
        bootstrap.initialize(address, timeout)
        communicator = Communicator(bootstrap)
        self = super().__new__(cls, communicator, device=device, **config)
        self.bootstrap, self.communicator, self._executor = bootstrap, communicator, None
        self._batch, self._p2p = None, None
        if p2p:
            dev = self.device if self.device >= 0 else None
            self._p2p = PointToPoint(communicator, device=dev, timeout=p2p_timeout)
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

    @property
    def p2p(self) -> PointToPoint:
        """The group's :class:`PointToPoint` (an error when made with ``p2p=False``)."""
        if self._p2p is None:
            raise MscclppError("this CommGroup was made with p2p=False: no send/recv")
        return self._p2p

    def batch(self, stream: int | None = None) -> P2pBatch:
        """A new :class:`P2pBatch` of this group's point-to-point (``stream``: GPU builds, default
        the first buffer's current stream)."""
        return P2pBatch(self.p2p, stream)

    @contextlib.contextmanager
    def group(self, stream: int | None = None) -> Iterator[P2pBatch]:
        """``with g.group(): g.send(a, 1); g.recv(b, 1)``: the :meth:`send`/:meth:`recv` calls
        inside run as one batch when the outermost ``with`` ends (like ncclGroupStart/End;
        nesting is allowed; an exception drops the queued operations). Yields the batch."""
        outermost = self._batch is None
        if outermost:
            self._batch = P2pBatch(self.p2p, stream)
        batch = self._batch
        assert batch is not None
        try:
            yield batch
        except BaseException:
            if outermost:
                self._batch = None
                batch.ops = []
            raise
        if outermost:
            self._batch = None
            batch.run()

    def send(self, buf: Any, peer: int, *, stream: int | None = None) -> None:
        """Sends the whole of ``buf`` to ``peer``, whose matching :meth:`recv` is the same size
        (inside :meth:`group`: queued; else a batch of its own, which needs the peer's
        matching call). GPU builds: asynchronous on ``stream`` (default: the buffer's current
        stream); host backend: done on return."""
        if self._batch is not None:
            self._batch.send(buf, peer)
        else:
            self.p2p.run([("send", peer, buf)], stream=stream)

    def recv(self, buf: Any, peer: int, *, stream: int | None = None) -> None:
        """Receives ``peer``'s matching send into ``buf`` (the same size); as :meth:`send`."""
        if self._batch is not None:
            self._batch.recv(buf, peer)
        else:
            self.p2p.run([("recv", peer, buf)], stream=stream)

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
