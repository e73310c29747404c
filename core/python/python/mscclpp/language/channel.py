"""Upstream's module layout (``from mscclpp.language.channel import *``): the channels and the
types their calls take."""

from .api import BufferType, MemoryChannel, PortChannel, ReduceOperationType, SwitchChannel, SyncType, ThreadBlockGroup

__all__ = ["BufferType", "MemoryChannel", "PortChannel", "ReduceOperationType", "SwitchChannel", "SyncType",
           "ThreadBlockGroup"]
