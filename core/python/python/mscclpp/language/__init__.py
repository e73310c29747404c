"""``mscclpp.language``: write a collective algorithm in Python and get an execution plan in
upstream MSCCL++'s JSON format (the one ``mscclpp.ExecutionPlan`` / the executor reads).

A program (docs/dsl-tutorial.md walks through one)::

    from mscclpp.language import *

    with CollectiveProgram("my_allreduce", AllReduce(2, 1, True), 2) as prog:
        ...  # Rank(r) buffers sliced into chunks, MemoryChannel(dst, src).put/signal/wait...
    open("my_allreduce.json", "w").write(prog.json())

Mistakes (unknown ranks, chunks out of bounds, a channel to itself, a chunk of the wrong rank,
an unmatched signal/wait at the end) raise :class:`DslError` whose message starts with the
``file:line`` of the offending statement. Standard library only: importing it needs no
native extension.
"""

from .api import (
    JSON,
    BaseBuffer,
    Buffer,
    BufferType,
    Chunk,
    LoopIterationContext,
    MemoryChannel,
    PortChannel,
    Rank,
    ReduceOperationType,
    Semaphore,
    SwitchChannel,
    SyncType,
    ThreadBlockGroup,
)
from .collectives import AllGather, AllReduce, AllToAll, Collective, ReduceScatter
from .program import CollectiveProgram, DslError, get_program, render

__all__ = [
    "AllGather",
    "AllReduce",
    "AllToAll",
    "BaseBuffer",
    "Buffer",
    "BufferType",
    "Chunk",
    "Collective",
    "CollectiveProgram",
    "DslError",
    "JSON",
    "LoopIterationContext",
    "MemoryChannel",
    "PortChannel",
    "Rank",
    "ReduceOperationType",
    "ReduceScatter",
    "Semaphore",
    "SwitchChannel",
    "SyncType",
    "ThreadBlockGroup",
    "get_program",
    "render",
]
