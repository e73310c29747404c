"""Upstream's module layout (``from mscclpp.language.rank import *``): ranks, buffers and
semaphores."""

from .api import BaseBuffer, Buffer, BufferType, Chunk, Rank, ReduceOperationType, Semaphore, SyncType, ThreadBlockGroup

__all__ = ["BaseBuffer", "Buffer", "BufferType", "Chunk", "Rank", "ReduceOperationType", "Semaphore", "SyncType",
           "ThreadBlockGroup"]
