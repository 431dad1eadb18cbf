"""The asyncio front of an Engine, usable without HTTP (as vLLM's AsyncLLM or SGLang's
TokenizerManager are): one actor thread drives the engine (`actor.py`), each request reads
its events from a bounded buffer (`stream.py`) as typed updates with stop strings applied
(`generation.py`), and owns its intake slots and generations (`intake.py`). Failures are typed
(`errors.py`); a server maps them to its protocol's answers. Intake slots are `intake_slots.py`;
several engines (data-parallel replicas) sit behind one front in `replicas.py`, each request
routed by `replica_routing.py`. `resin.server` serves it over HTTP; nothing here imports the server.
"""

from resin.frontend.actor import EngineActor
from resin.frontend.errors import (
    ClientTooSlow,
    EngineUnavailable,
    FrontendError,
    GenerationFailed,
    QueueFull,
    RequestRefused,
)
from resin.frontend.generation import Finish, Generation, TokenLogprob, Update
from resin.frontend.intake import Generations, Ticket
from resin.frontend.intake_slots import IntakeSlots, Reservation
from resin.frontend.ports import EngineLike, OutputParser
from resin.frontend.replicas import ReplicaSet

__all__ = [
    "ClientTooSlow",
    "EngineActor",
    "EngineLike",
    "EngineUnavailable",
    "Finish",
    "FrontendError",
    "Generation",
    "GenerationFailed",
    "Generations",
    "IntakeSlots",
    "OutputParser",
    "QueueFull",
    "ReplicaSet",
    "RequestRefused",
    "Reservation",
    "Ticket",
    "TokenLogprob",
    "Update",
]
