"""The engine in its own process: what crosses between an engine process and its frontends.

An engine process runs `EngineService` (`service.py`) around one `Engine`: it steps without
waiting on anyone, admits requests under its own policy (at most `admissions_per_step` per
step, `max_active` inside the engine), compiles constraints off its step loop, and sends each
step's outputs to the frontends in one message per frontend. A frontend process drives an
`EngineClient` (`client.py`): an `EngineLike`, so the frontend's actor, the HTTP server,
rendering, tokenization, detokenization, parsing and streaming run over it unchanged.
`wire.py` is the message format (msgspec msgpack; token ids, counts and request ids cross as
raw numpy buffers, one message per step, never one object per token).

pyzmq carries the messages over `ipc://` sockets: one PAIR socket per (engine, frontend)
pair, so either side learns at once when the other process went away (a socket monitor's
disconnect). Nothing here imports the engine, the server or the application.
"""

from resin.ipc.client import EngineClient
from resin.ipc.service import EngineService, ServicePolicy

__all__ = ["EngineClient", "EngineService", "ServicePolicy"]
