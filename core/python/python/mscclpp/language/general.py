"""Upstream's module layout (``from mscclpp.language.general import *``): ``JSON()``."""

from .api import JSON

__all__ = ["JSON"]
