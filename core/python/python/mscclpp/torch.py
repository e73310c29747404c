"""PyTorch integration: a communicator made from a ``torch.distributed`` process group that
runs mscclpp's collectives (the default algorithms, or one named per call) on torch tensors,
on the current CUDA stream (like upstream MSCCL++'s
examples/torch-integration/customized_comm_with_default_algo.py).

    import torch.distributed as dist, mscclpp.torch
    dist.init_process_group("gloo")            # any backend: only the UniqueId travels on it
    comm = mscclpp.torch.TorchComm()           # collective over the default group
    comm.all_reduce(tensor)                    # in place, sum, torch's current stream

torch is imported when this module is, not by ``import mscclpp``. On GPU builds the tensors
are CUDA tensors of ``torch.cuda.current_device()`` (set it per rank first); on the host
backend, CPU tensors.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

import mscclpp

__all__ = ["TorchComm", "empty", "op_name"]

_OPS = {"SUM": "sum", "PRODUCT": "prod", "PROD": "prod", "MIN": "min", "MAX": "max", "AVG": "avg"}


def op_name(op: Any) -> str:
    """mscclpp's name of a reduction: a ``torch.distributed.ReduceOp`` (SUM, PRODUCT, MIN,
    MAX, AVG) or already a name (``"sum"``, ...)."""
    if isinstance(op, str):
        return op
    name = getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]
    try:
        return _OPS[str(name).upper()]
    except KeyError:
        raise mscclpp.MscclppError(f"reduce op {op!r}: expected one of SUM, PRODUCT, MIN, MAX, AVG") from None


def empty(*shape: int, dtype: torch.dtype = torch.float32, device: int | None = None) -> torch.Tensor:
    """An uninitialized tensor in memory this library allocated (a :class:`mscclpp.RawGpuBuffer`,
    which the tensor keeps alive): peers can map it, so the zero-copy algorithms and the
    execution plans take it. A CUDA tensor on GPU ``device`` (default: the current one) on
    GPU builds, a CPU tensor on the host backend."""
    count = 1
    for n in shape:
        count *= n
    itemsize = torch.empty((), dtype=dtype).element_size()
    if device is None and mscclpp.backend() != "host":
        device = torch.cuda.current_device()
    buf = mscclpp.RawGpuBuffer(max(count * itemsize, 1), device)
    if buf.device >= 0:
        raw = torch.as_tensor(buf, device=torch.device("cuda", buf.device))
    else:
        raw = torch.frombuffer(buf, dtype=torch.uint8)
    return raw[: count * itemsize].view(dtype).view(shape)


class TorchComm:
    """mscclpp's collectives over the ranks of a ``torch.distributed`` group.

    Creating it is collective over ``group`` (default: the world): rank 0 of the group makes
    a :class:`mscclpp.UniqueId` and broadcasts it with ``dist.broadcast_object_list``, then
    every rank builds a :class:`mscclpp.CommGroup` (``device``: default
    ``torch.cuda.current_device()`` on GPU builds; other keywords go to it). The methods
    take the arguments of their ``torch.distributed`` namesakes; each accepts ``algorithm=``
    (one of ``comm.group.collectives.algorithm_names(...)``) and ``stream=`` (default
    torch's current stream of the tensor's device). Every rank must call them in the same
    order.
    """

    def __init__(self, group: Any = None, *, device: int | None = None, timeout: float = 60.0, **config: Any) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise mscclpp.MscclppError(
                "torch.distributed is not initialized: call dist.init_process_group first"
            )
        self.torch_group = group
        rank = dist.get_rank(group)
        nranks = dist.get_world_size(group)
        if device is None and mscclpp.backend() != "host":
            device = torch.cuda.current_device()
        box: list[Any] = [bytes(mscclpp.UniqueId.create()) if rank == 0 else None]
        src = dist.get_global_rank(group, 0) if group is not None else 0
        dist.broadcast_object_list(box, src=src, group=group)
        uid = mscclpp.UniqueId.from_bytes(box[0])
        self.group = mscclpp.CommGroup(rank, nranks, uid, device=device, timeout=timeout, **config)

    @property
    def rank(self) -> int:
        """This rank in the group."""
        return self.group.rank

    @property
    def world_size(self) -> int:
        """The group's size."""
        return self.group.nranks

    def all_reduce(self, tensor: torch.Tensor, op: Any = "sum", *, out: torch.Tensor | None = None, **kw: Any) -> None:
        """``dist.all_reduce``: in place (or into ``out``)."""
        self.group.all_reduce(tensor, out, op=op_name(op), **kw)

    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor, **kw: Any) -> None:
        """``dist.all_gather_into_tensor``: every rank's ``input`` into ``output`` (world x input);
        in place when ``input`` is this rank's block of ``output`` (the same storage)."""
        n, r = self.world_size, self.rank
        if input.numel() * n == output.numel() and input.data_ptr() == output.data_ptr() + r * input.numel() * input.element_size():
            self.group.all_gather(output, **kw)
        else:
            self.group.all_gather(input, output, **kw)

    def reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor, op: Any = "sum", **kw: Any) -> None:
        """``dist.reduce_scatter_tensor``: block ``rank`` of the reduction of ``input`` into ``output``."""
        n, r = self.world_size, self.rank
        if output.numel() * n == input.numel() and output.data_ptr() == input.data_ptr() + r * output.numel() * output.element_size():
            self.group.reduce_scatter(input, op=op_name(op), **kw)
        else:
            self.group.reduce_scatter(input, output, op=op_name(op), **kw)

    def broadcast(self, tensor: torch.Tensor, src: int = 0, **kw: Any) -> None:
        """``dist.broadcast``: ``src``'s tensor (its rank in the group) into every rank's, in place."""
        self.group.broadcast(tensor, root=src, **kw)

    def send(self, tensor: torch.Tensor, dst: int, **kw: Any) -> None:
        """``dist.send``: the whole of ``tensor`` to rank ``dst`` of the group (whose ``recv`` is
        the same size); asynchronous on the current stream on GPUs. Inside :meth:`group`:
        queued until the group ends."""
        self.group.send(tensor, dst, **kw)

    def recv(self, tensor: torch.Tensor, src: int, **kw: Any) -> None:
        """``dist.recv``: rank ``src``'s matching send into ``tensor``."""
        self.group.recv(tensor, src, **kw)

    def batch(self, stream: int | None = None) -> Any:
        """``with comm.batch(): comm.send(a, 1); comm.recv(b, 1)``: the sends and receives
        inside run as one batch when the block ends (one kernel launch on GPUs; like an NCCL
        group or ``dist.batch_isend_irecv``)."""
        return self.group.group(stream)

    def batch_isend_irecv(self, ops: list[tuple[str, torch.Tensor, int]]) -> None:
        """``("send" | "recv", tensor, peer)`` operations run as one batch."""
        with self.group.group():
            for kind, tensor, peer in ops:
                if kind == "send":
                    self.group.send(tensor, peer)
                elif kind == "recv":
                    self.group.recv(tensor, peer)
                else:
                    raise mscclpp.MscclppError(f"batch_isend_irecv: {kind!r}: expected \"send\" or \"recv\"")

    def barrier(self) -> None:
        """A barrier of the host threads (not of the GPU streams)."""
        self.group.barrier()
