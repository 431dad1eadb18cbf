"""Stop strings over streamed text: what may be shown, and where the answer ends."""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Finds stop strings in streamed text, holding back a tail that may start one.

    `push` returns (text safe to emit, whether a stop string was hit); after a hit the text
    ends just before the stop string and nothing more is accepted.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.hit = False
        self.matched: str | None = None

    def push(self, text: str) -> tuple[str, bool]:
        if self.hit:
            return "", True
        if not self.stops:
            return text, False
        buf = self._held + text
        found = [(i, s) for s in self.stops if (i := buf.find(s)) >= 0]
        if found:
            cut, self.matched = min(found)
            self._held, self.hit = "", True
            return buf[:cut], True
        hold = max((self._overlap(buf, s) for s in self.stops), default=0)
        self._held = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], False

    @staticmethod
    def _overlap(buf: str, stop: str) -> int:
        """Length of the longest suffix of `buf` that is a proper prefix of `stop`."""
        for n in range(min(len(buf), len(stop) - 1), 0, -1):
            if stop.startswith(buf[-n:]):
                return n
        return 0

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.hit else held
