"""The asyncio front of an Engine, usable without HTTP (as vLLM's AsyncLLM or SGLang's
TokenizerManager are): one actor thread drives the engine (`actor.py`), each request reads
its events from a bounded buffer (`stream.py`) as typed updates with stop strings applied
(`generation.py`), and owns its intake slots and generations (`intake.py`). Failures are typed
(`errors.py`); a server maps them to its protocol's answers. `resin.server` serves it over
HTTP; nothing here imports the server.
"""

from resin.frontend.actor import EngineActor, Reservation
from resin.frontend.errors import (
    ClientTooSlow,
    EngineUnavailable,
    FrontendError,
    GenerationFailed,
    QueueFull,
    RequestRefused,
)
from resin.frontend.generation import Finish, Generation, TokenLogprob, Update
from resin.frontend.intake import Batch, Ticket
from resin.frontend.ports import EngineLike, OutputParser

__all__ = [
    "Batch",
    "ClientTooSlow",
    "EngineActor",
    "EngineLike",
    "EngineUnavailable",
    "Finish",
    "FrontendError",
    "Generation",
    "GenerationFailed",
    "OutputParser",
    "QueueFull",
    "RequestRefused",
    "Reservation",
    "Ticket",
    "TokenLogprob",
    "Update",
]
