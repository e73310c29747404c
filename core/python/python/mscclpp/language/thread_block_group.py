"""Upstream's module layout: thread-block groups."""

from .api import ThreadBlockGroup

__all__ = ["ThreadBlockGroup"]
