"""Resin: building blocks for LLM inference.

The core is a headless `Engine` that schedules requests, owns a paged KV cache with prefix
reuse, and hands a frozen `BatchPlan` to a `Runner` you write. Importing `resin` imports
neither torch nor any CUDA library.
"""

from resin.engine import Engine, Request
from resin.engine.grammar import GrammarBackend
from resin.engine.proposers import DraftModelProposer, NgramProposer
from resin.engine.speculative import Proposer, Speculation
from resin.errors import (
    EngineDeadError,
    InvalidRunnerOutputError,
    ResinError,
    RetryableRunnerError,
    RunnerDeadError,
)
from resin.events import ErrorEvent, Event, FinishedEvent, FinishReason, TokensEvent, TopLogprob
from resin.params import Constraint, SamplingParams
from resin.plan import BatchPlan, CacheGroupPlan, ForwardOutput, Phase, SamplingArrays
from resin.protocols import (
    AsyncRunner,
    CacheGroupSpec,
    CacheLayout,
    Compressed,
    History,
    Runner,
    RunnerConfig,
    State,
    Window,
)

__all__ = [
    "AsyncRunner",
    "BatchPlan",
    "CacheGroupPlan",
    "CacheGroupSpec",
    "CacheLayout",
    "Compressed",
    "Constraint",
    "DraftModelProposer",
    "Engine",
    "EngineDeadError",
    "ErrorEvent",
    "Event",
    "FinishReason",
    "FinishedEvent",
    "ForwardOutput",
    "GrammarBackend",
    "History",
    "InvalidRunnerOutputError",
    "NgramProposer",
    "Phase",
    "Proposer",
    "Request",
    "ResinError",
    "RetryableRunnerError",
    "Runner",
    "RunnerConfig",
    "RunnerDeadError",
    "SamplingArrays",
    "SamplingParams",
    "Speculation",
    "State",
    "TokensEvent",
    "TopLogprob",
    "Window",
]
