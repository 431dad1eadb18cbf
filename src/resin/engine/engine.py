"""Engine (contract stub; the core-engine issue implements it).

```python
with Engine(runner, context_length=32768, prefix_cache=True) as engine:
    request = engine.submit([1, 6, 24131], sampling_params=SamplingParams(max_output_tokens=8))
    while engine.has_work():
        for event in engine.step():
            print(event)
    generated_ids = request.take_result()
```
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

from resin.engine.request import Request
from resin.events import Event
from resin.params import SamplingParams
from resin.protocols import Runner


class Engine:
    def __init__(
        self,
        runner: Runner,
        *,
        context_length: int = 32768,
        prefix_cache: bool = False,
        max_batch_tokens: int = 8192,
        max_sequences: int = 256,
        prefill_chunk_tokens: int = 2048,
        enable_metrics: bool = True,
    ) -> None:
        raise NotImplementedError

    def submit(
        self, prompt_token_ids: Sequence[int], sampling_params: SamplingParams | None = None
    ) -> Request:
        raise NotImplementedError

    def has_work(self) -> bool:
        raise NotImplementedError

    def step(self) -> list[Event]:
        raise NotImplementedError

    def abort(self, request: Request | int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Engine:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
