"""Upstream's module layout (``from mscclpp.language.loop import *``): loop (pipeline)
contexts."""

from .api import LoopIterationContext

__all__ = ["LoopIterationContext"]
