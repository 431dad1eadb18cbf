"""The headless engine: request lifecycle, scheduling, planning and execution transactions."""

from resin.engine.engine import Engine
from resin.engine.request import Request

__all__ = ["Engine", "Request"]
