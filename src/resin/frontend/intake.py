"""Request-side ownership of intake slots and of the generations a request starts.

`Ticket` owns the intake slots a request reserved before any tokenizing; used as a context
manager it releases every slot that was not handed to the engine actor, on every path (an
error while rendering, a bad seed, a cancelled handler). Each slot handed over is released by
the actor when its request enters the engine or is refused.

`Generations` is the generations of one request (n > 1 or a prompt list). `start()` begins reading
every generation at once, then waits until each has its first events (so an engine refusal
is still an error before anything was sent); a generation is never left unread while
another one is awaited, so none overflows its buffer because of its siblings. `updates()`
interleaves them; if any generation is cut off (a slow client, `ClientTooSlow`) the whole
request fails with that error instead of ending with some choices missing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from types import TracebackType

from resin.frontend.errors import (
    ClientTooSlow,
    GenerationFailed,
    RequestRefused,
    constraint_failed,
)
from resin.frontend.generation import Generation, Update, merge
from resin.frontend.intake_slots import Reservation
from resin.params import SamplingParams


class Ticket:
    """Intake slots owned by one request; `with ticket:` releases the unused ones at exit."""

    def __init__(self, reservations: list[Reservation]) -> None:
        self._held = list(reservations)

    def __len__(self) -> int:
        return len(self._held)

    def take(self, count: int) -> list[Reservation]:
        """Hand `count` slots over (to `EngineActor.submit`, which then owns them)."""
        if count > len(self._held):
            raise RuntimeError(f"ticket holds {len(self._held)} slots, {count} asked")
        taken, self._held = self._held[:count], self._held[count:]
        return taken

    def release(self) -> None:
        held, self._held = self._held, []
        for r in held:
            r.release()

    def __enter__(self) -> Ticket:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


_End = None


class Generations:
    """The generations of one request, read concurrently from `start()` on."""

    def __init__(
        self, gens: list[Generation], buffer: int = 64, params: list[SamplingParams] | None = None
    ) -> None:
        self.gens = gens
        self.params = params or []
        """The sampling each generation runs with (defaults applied), for answers that echo
        it (the Responses API)."""
        self._limit = buffer * 64 * max(1, len(gens))  # RequestStream's event cap, per gen
        self._queue: asyncio.Queue[tuple[int, Update | BaseException | None]] = asyncio.Queue()
        self._tasks: list[asyncio.Future[None]] = []

    def __iter__(self) -> Iterator[Generation]:
        return iter(self.gens)

    def __len__(self) -> int:
        return len(self.gens)

    async def start(self) -> None:
        if len(self.gens) == 1:
            try:
                await self.gens[0].start()
            except BaseException:
                self.cancel()
                raise
            return
        loop = asyncio.get_running_loop()
        started = [loop.create_future() for _ in self.gens]
        self._tasks = [
            asyncio.ensure_future(self._pump(i, g, started[i])) for i, g in enumerate(self.gens)
        ]
        try:
            outcomes = await asyncio.gather(*started, return_exceptions=True)
        except BaseException:  # the handler was cancelled (client gone)
            await asyncio.shield(self.close())
            raise
        failure = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if failure is not None:
            await self.close()
            raise failure

    async def _pump(self, i: int, gen: Generation, started: asyncio.Future[None]) -> None:
        try:
            await gen.start()
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc)
            return
        started.set_result(None)
        try:
            async for update in gen.updates():
                self._queue.put_nowait((i, update))
        except ClientTooSlow as exc:
            self._queue.put_nowait((i, exc))
        finally:
            self._queue.put_nowait((i, _End))

    async def updates(self) -> AsyncIterator[tuple[int, Update]]:
        """(choice index, update) as they arrive; raises ClientTooSlow when one generation was
        cut off or the reader fell `buffer * 64` updates per generation behind."""
        if len(self.gens) == 1:
            async for update in self.gens[0].updates():
                yield 0, update
            return
        try:
            open_count = len(self.gens)
            while open_count:
                if self._queue.qsize() > self._limit:
                    raise ClientTooSlow("client fell too far behind the engine")
                i, item = await self._queue.get()
                if item is _End:
                    open_count -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield i, item
        finally:
            await self.close()

    async def collect(self) -> list[Update]:
        """Each generation's updates merged into one (a non-streamed answer); a choice cut off,
        or ended without a finish, is a `GenerationFailed` (a `RequestRefused` when its
        grammar failed, "constraint ..."): never a partial answer taken for a complete one."""
        merged = [Update() for _ in self.gens]
        async for i, update in self.updates():
            merge(merged[i], update)
        for up in merged:
            if up.finish is None or up.finish.failed:
                error = up.finish.error if up.finish else "generation ended without a finish"
                if constraint_failed(error):  # the client's grammar failed
                    raise RequestRefused(error)
                raise GenerationFailed(error or "generation failed; retry")
        return merged

    def cancel(self) -> None:
        for g in self.gens:
            g.cancel()

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self.cancel()
