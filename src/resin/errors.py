"""Errors the engine and runners raise, and what each one means for a step's transaction.

- `RetryableRunnerError` raised by `forward`/`submit` before the runner accepted the plan: the
  engine rolls the step back and runs its requests again later (bounded retries).
- Any other exception from `forward`/`collect`: a post-accept failure; the plan's requests are
  quarantined (finish with reason `error`), the others go on.
- `RunnerDeadError`: the runner cannot go on; the engine stops cleanly.
- `EngineDeadError`: raised by `Engine.submit` once the engine stopped.
- `GrammarBusy`: a grammar backend has too many compiles queued (a server answers 429).
"""

from __future__ import annotations


class ResinError(Exception):
    """Base class of Resin's own errors."""


class RetryableRunnerError(ResinError):
    """The runner refused the plan before accepting it; nothing was written."""


class RunnerDeadError(ResinError):
    """The runner is gone (device lost, process died); no further step can run."""


class EngineDeadError(ResinError):
    """The engine stopped (runner dead or closed) and accepts no new requests."""


class InvalidRunnerOutputError(ResinError):
    """A `ForwardOutput` failed validation (wrong shapes, token id out of range)."""


class GrammarBusy(ResinError):
    """Too many constraint compiles are queued (`GrammarLimits.max_queued_compiles`): retry."""
