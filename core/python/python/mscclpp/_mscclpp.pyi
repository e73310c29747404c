"""Type stubs of the native module ``mscclpp._mscclpp`` (core/python/src, PyO3)."""

from __future__ import annotations

import builtins
import os
from typing import Any, Literal, Self, final

from typing_extensions import disjoint_base

__version__: str
__all__ = [
    "BaseMemoryChannel",
    "BasePortChannel",
    "BufferRef",
    "Collectives",
    "Communicator",
    "Connection",
    "ExecutionPlan",
    "Executor",
    "Future",
    "Host2DeviceSemaphore",
    "Host2HostSemaphore",
    "MemoryChannel",
    "MemoryDevice2DeviceSemaphore",
    "MscclppError",
    "PointToPoint",
    "PortChannel",
    "ProxyService",
    "RawGpuBuffer",
    "RegisteredMemory",
    "Semaphore",
    "TcpBootstrap",
    "UniqueId",
    "__version__",
    "backend",
    "device_count",
]

# A buffer (typed Any): a NumPy array (or any object with the buffer protocol: host memory), a
# torch tensor, an object with ``__cuda_array_interface__`` (CuPy), a RawGpuBuffer or a
# BufferRef.

class MscclppError(RuntimeError):
    """An error of the mscclpp library: the message says what came and what was expected."""

    code: str
    """Its kind: InvalidUsage, Timeout, RemoteError, SystemError, InternalError, Aborted,
    ExecutorError."""

def backend() -> str:
    """``"host"``, ``"cuda"`` or ``"rocm"``: the backend this module was built for."""

def device_count() -> int:
    """GPUs this process sees (0 on the host backend or without a driver)."""

@final
class UniqueId:
    """128 opaque bytes naming one bootstrap group (root address and nonce)."""

    @classmethod
    def create(cls) -> UniqueId:
        """A new group id; this process keeps its listening port for rank 0."""
    @classmethod
    def from_bytes(cls, data: bytes) -> UniqueId:
        """The id of ``bytes(uid)``; raises MscclppError for malformed bytes."""
    def to_bytes(self) -> bytes:
        """Its 128 bytes."""
    def __bytes__(self) -> bytes: ...
    @property
    def root_address(self) -> str:
        """The root's ``"ip:port"``."""
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class TcpBootstrap:
    """The TCP bootstrap of one rank: construct, then ``initialize`` on every rank."""

    def __new__(cls, rank: int, nranks: int) -> Self: ...
    @classmethod
    def create(cls, rank: int, nranks: int) -> TcpBootstrap:
        """``TcpBootstrap(rank, nranks)`` (upstream's spelling)."""
    @staticmethod
    def create_unique_id() -> UniqueId:
        """A new :class:`UniqueId`."""
    def set_job_key(self, key: str) -> None:
        """The job key of ``"ip:port"`` mode (every rank the same), before ``initialize``."""
    def initialize(self, address: UniqueId | bytes | str, timeout: float = 60.0) -> None:
        """Joins the group at a UniqueId (or its bytes) or ``"[ifname:]ip:port"``."""
    @property
    def rank(self) -> int: ...
    @property
    def nranks(self) -> int: ...
    @property
    def nranks_per_node(self) -> int: ...
    def barrier(self) -> None:
        """Waits until every rank called it."""
    def all_gather(self, data: bytes) -> list[bytes]:
        """Every rank's ``data`` in rank order."""
    def send(self, data: bytes, peer: int, tag: int = 0) -> None:
        """Sends ``data`` to ``peer`` under ``tag``."""
    def recv(self, peer: int, tag: int = 0) -> bytes:
        """The next message from ``peer`` under ``tag``."""

@final
class Communicator:
    """A communicator over an initialized :class:`TcpBootstrap`."""

    def __new__(cls, bootstrap: TcpBootstrap) -> Self: ...
    @property
    def bootstrap(self) -> TcpBootstrap: ...
    @property
    def rank(self) -> int: ...
    @property
    def nranks(self) -> int: ...
    def register_memory(self, buffer: Any, transports: str | list[str] | None = None) -> RegisteredMemory:
        """Registers library-allocated memory for ``transports`` (default ``"cudaipc"``)."""
    def send_memory(self, memory: RegisteredMemory, remote_rank: int, tag: int = 0) -> None:
        """Sends a registration to ``remote_rank``."""
    def recv_memory(self, remote_rank: int, tag: int = 0) -> Future:
        """The next registration ``remote_rank`` sends."""
    def connect(
        self, remote_rank: int, tag: int = 0, *, transport: str = "cudaipc", device: int | None = None
    ) -> Future:
        """A connection to ``remote_rank`` (both ranks call it)."""
    def build_semaphore(self, connection: Connection, remote_rank: int, tag: int = 0) -> Future:
        """A semaphore over ``connection`` (both ranks call it)."""

@final
class BufferRef:
    """A description of memory this package does not own (see mscclpp._buffers.describe)."""

    ptr: int
    nbytes: int
    dtype: str | None
    device: int
    readonly: bool
    contiguous: bool
    stream: int | None
    owner: Any
    kind: str
    def __new__(
        cls,
        ptr: int,
        nbytes: int,
        dtype: str | None = None,
        device: int = -1,
        *,
        readonly: bool = False,
        contiguous: bool = True,
        stream: int | None = None,
        owner: Any = None,
        kind: str = "buffer",
    ) -> Self: ...

@disjoint_base
class Collectives:
    """The collectives of one communicator (the native base of mscclpp.Collectives)."""

    def __new__(
        cls,
        comm: Communicator,
        *,
        device: int | None = None,
        ll_half_bytes: int | None = None,
        plain_bytes: int | None = None,
        host_timeout: float | None = None,
        host_blocks: int | None = None,
        plan_dir: str | os.PathLike[str] | None = None,
        plans: bool = True,
    ) -> Self: ...
    @property
    def rank(self) -> int: ...
    @property
    def nranks(self) -> int: ...
    @property
    def device(self) -> int:
        """The GPU the collectives run on, -1 on the host backend."""
    def algorithm_names(self, collective: str) -> list[str]:
        """Algorithm names of ``"allreduce"``, ``"allgather"``, ``"reducescatter"``, ``"broadcast"``."""
    def algorithm_for(self, collective: str, nbytes: int) -> str:
        """The algorithm the default (or forced) choice takes for ``nbytes``."""
    def recent_calls(self) -> list[dict[str, Any]]:
        """The last calls (at most 64), oldest first: ``seq``, ``collective``, ``count``,
        ``dtype``, ``op``, ``root``, ``algorithm``, ``state``."""
    def force_algorithm(self, collective: str, name: str | None) -> None:
        """Forces ``name`` for later calls (None un-forces)."""
    def register_buffer(self, buffer: Any) -> None:
        """Registers ``buffer`` for the zero-copy algorithms (as ``ncclCommRegister``): calls
        whose buffers all lie inside registered ones prefer them. Local; every rank alike."""
    def deregister_buffer(self, buffer: Any) -> None:
        """Takes back ``register_buffer(buffer)`` (every rank alike, before freeing it)."""
    def collective(
        self,
        collective: str,
        send: Any,
        recv: Any = None,
        *,
        op: str = "sum",
        root: int = 0,
        dtype: str | None = None,
        algorithm: str | None = None,
        stream: int | None = None,
    ) -> None:
        """Runs ``"allreduce"``, ``"allgather"``, ``"reducescatter"`` or ``"broadcast"``
        (in place when ``recv`` is None)."""

@final
class RawGpuBuffer:
    """Communication memory allocated by this library (zeroed)."""

    def __new__(cls, nbytes: int, device: int | None = None) -> Self: ...
    @property
    def ptr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def device(self) -> int: ...
    def data(self) -> int:
        """Its address."""
    def bytes(self) -> int:
        """Its size in bytes."""
    def write(self, data: builtins.bytes, offset: int = 0) -> None:
        """Copies ``data`` in at byte ``offset``."""
    def read(self, offset: int = 0, nbytes: int | None = None) -> builtins.bytes:
        """Copies bytes out."""
    def __len__(self) -> int: ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]: ...
    def __dlpack_device__(self) -> tuple[int, int]:
        """``(device_type, device_id)`` of DLPack."""
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """A DLPack capsule of its bytes (1-D uint8, zero-copy)."""
    def to_dlpack(self) -> Any:
        """A legacy DLPack capsule of its bytes."""

@final
class PointToPoint:
    """The point-to-point links of one rank: batches of sends and receives."""

    def __new__(
        cls, comm: Communicator, *, device: int | None = None, timeout: float | None = None
    ) -> Self: ...
    @property
    def device(self) -> int: ...
    def reaches(self, peer: int) -> bool:
        """Whether batches may name ``peer``."""
    def check(self) -> None:
        """Raises the error a GPU batch recorded."""
    def run(self, ops: list[tuple[str, int, Any]], *, stream: int | None = None) -> None:
        """Runs one batch of ``(kind, peer, buffer)`` operations."""

@final
class ExecutionPlan:
    """A JSON execution plan loaded for one rank."""

    def __new__(cls, path: str | os.PathLike[str], rank: int) -> Self: ...
    @property
    def name(self) -> str: ...
    @property
    def collective(self) -> str: ...
    @property
    def world_size(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def is_in_place(self) -> bool: ...
    @property
    def protocol(self) -> str: ...
    @property
    def min_message_size(self) -> int: ...
    @property
    def max_message_size(self) -> int: ...

@final
class Executor:
    """Runs execution plans on a communicator."""

    def __new__(
        cls,
        comm: Communicator,
        *,
        timeout: float | None = None,
        host_threads_per_block: int | None = None,
        port_channels: Literal["auto", "proxy"] | None = None,
    ) -> Self: ...
    def execute(
        self,
        plan: ExecutionPlan,
        send: Any,
        recv: Any,
        *,
        dtype: str | None = None,
        stream: int | None = None,
        packet_type: str = "LL16",
    ) -> None:
        """Runs ``plan`` on library-allocated buffers (collective)."""
    def reset(self) -> None:
        """Drops the cached contexts (collective)."""
    def set_trace(self, on: bool) -> None:
        """Starts or stops counting each op's time per thread block."""
    @property
    def tracing(self) -> bool: ...
    def take_trace(self) -> list[dict[str, Any]]:
        """The counts since the last call, one dict per (plan, buffers, size); zeroes them."""

@final
class Future:
    """What the peer sends arrives on ``get()``."""

    def get(self) -> Any:
        """The Connection, RegisteredMemory or Semaphore."""
    def ready(self) -> bool:
        """Whether ``get`` returned already."""

@final
class Connection:
    """A connection to one peer."""

    @property
    def transport(self) -> str: ...
    @property
    def remote_rank(self) -> int | None: ...
    def write(
        self, dst: RegisteredMemory, dst_offset: int, src: RegisteredMemory, src_offset: int, size: int
    ) -> None:
        """Copies ``size`` bytes to the peer's memory."""
    def flush(self, timeout: float = 60.0) -> None:
        """Waits until every earlier write is done."""

@final
class RegisteredMemory:
    """Memory registered for transports (this rank's or a peer's)."""

    @property
    def data(self) -> int: ...
    @property
    def original_data_ptr(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def transports(self) -> list[str]: ...
    def serialize(self) -> builtins.bytes:
        """Its wire form."""
    @classmethod
    def deserialize(cls, data: builtins.bytes) -> RegisteredMemory:
        """A registration received as bytes."""

@final
class Semaphore:
    """A pair of tokens over a connection."""

    @property
    def connection(self) -> Connection: ...

@final
class MemoryDevice2DeviceSemaphore:
    """A GPU signals a GPU through peer-mapped memory."""

    def __new__(cls, semaphore: Semaphore) -> Self: ...
    def device_handle(self) -> builtins.bytes:
        """MemoryDevice2DeviceSemaphoreDeviceHandle (24 bytes)."""

@final
class Host2DeviceSemaphore:
    """The host signals, a GPU waits."""

    def __new__(cls, semaphore: Semaphore) -> Self: ...
    def signal(self) -> None:
        """Increments the peer's token."""
    def device_handle(self) -> builtins.bytes:
        """Host2DeviceSemaphoreDeviceHandle (16 bytes)."""

@final
class Host2HostSemaphore:
    """The host signals and the host waits."""

    def __new__(cls, semaphore: Semaphore) -> Self: ...
    def signal(self) -> None:
        """Increments the peer's token."""
    def poll(self) -> bool:
        """Whether the peer signalled."""
    def wait(self, timeout: float = 60.0) -> None:
        """Waits for the peer's next signal."""

@final
class BaseMemoryChannel:
    """A memory channel with only a semaphore."""

    def __new__(cls, semaphore: Semaphore) -> Self: ...
    def device_handle(self) -> builtins.bytes:
        """BaseMemoryChannelDeviceHandle (24 bytes)."""

@final
class MemoryChannel:
    """Device threads put into a peer's memory directly."""

    def __new__(cls, semaphore: Semaphore, dst: RegisteredMemory, src: Any, packet_buffer: Any = None) -> Self: ...
    def device_handle(self) -> builtins.bytes:
        """MemoryChannelDeviceHandle (48 bytes)."""
    def put(self, dst_offset: int, src_offset: int, nbytes: int) -> None:
        """Host backend: the device's put on this thread."""
    def signal(self) -> None:
        """Host backend: signals the peer."""
    def wait(self, timeout: float = 60.0) -> None:
        """Host backend: waits for the peer's signal."""

@final
class ProxyService:
    """The proxy of port channels."""

    def __new__(cls) -> Self: ...
    def add_semaphore(self, semaphore: Semaphore) -> int:
        """Adds a semaphore; its id."""
    def add_memory(self, memory: RegisteredMemory) -> int:
        """Adds a memory; its id."""
    def base_port_channel(self, semaphore_id: int) -> BasePortChannel:
        """A channel with only a semaphore."""
    def port_channel(self, semaphore_id: int, dst: int, src: int) -> PortChannel:
        """A channel from memory ``src`` to memory ``dst``."""
    def start_proxy(self) -> None:
        """Starts the proxy thread."""
    def stop_proxy(self) -> None:
        """Stops the proxy thread."""
    @property
    def handled(self) -> int: ...

@final
class BasePortChannel:
    """A port channel with only its semaphore and FIFO."""

    def device_handle(self) -> builtins.bytes:
        """BasePortChannelDeviceHandle (64 bytes)."""
    @property
    def semaphore_id(self) -> int: ...

@final
class PortChannel:
    """Put/signal/flush requests the proxy performs."""

    def device_handle(self) -> builtins.bytes:
        """PortChannelDeviceHandle (72 bytes)."""
    @property
    def dst(self) -> int: ...
    @property
    def src(self) -> int: ...
    @property
    def semaphore_id(self) -> int: ...
    def put_with_signal(self, dst_offset: int, src_offset: int, nbytes: int, timeout: float = 60.0) -> None:
        """Host backend: queues a put then a signal."""
    def flush(self, timeout: float = 60.0) -> None:
        """Host backend: waits for the proxy."""
    def wait(self, timeout: float = 60.0) -> None:
        """Host backend: waits for the peer's signal."""
