"""What one chat-template render may use (`TemplateLimits`) and the error past them; the
sandbox (`resin.recipe.sandbox`) enforces them. Here without jinja2, so recipes and the
application name limits without importing it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TemplateLimits:
    """What one chat-template render may use (module docstring)."""

    max_chars: int = 8_000_000
    """Longest string / list (and the rendered prompt), in items; ints up to this many bits."""
    max_depth: int = 64
    """Deepest nesting of calls (macros calling macros, recursive loops)."""
    timeout_s: float = 2.0
    """Wall time of one render."""

    def __post_init__(self) -> None:
        if self.max_chars < 1 or self.max_depth < 1 or not self.timeout_s > 0:
            raise ValueError("template limits must be positive")


class TemplateLimitError(ValueError):
    """A render went past one of its `TemplateLimits` (the message names which)."""
