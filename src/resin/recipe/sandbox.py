"""The sandboxed Jinja environment chat templates run in (HF `apply_chat_template`-compatible).

Templates come from checkpoints, i.e. from strangers: they run in jinja2's
`ImmutableSandboxedEnvironment` (no attribute writes, no mutation of lists/dicts passed in),
and any reach for an unsafe attribute (`__class__`, `__globals__`, `mro`, ...) raises
`SecurityError` at once instead of rendering as an empty Undefined. The helpers match
transformers': `raise_exception`, `strftime_now`, and a `tojson` with `ensure_ascii=False` and
`indent`/`separators`/`sort_keys` options.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any, NoReturn

import jinja2
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateRefusedError(ValueError):
    """The chat template tried to escape the sandbox."""


class _StrictSandbox(ImmutableSandboxedEnvironment):
    def unsafe_undefined(self, obj: Any, attribute: str) -> NoReturn:
        raise SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} is not allowed"
        )


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Namespace(jinja2.utils.Namespace):
    """`namespace()` that refuses underscore names (no way to reach CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _check_name(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise SecurityError(f"namespace attribute {name!r} is not allowed")


@functools.lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """Compile a chat template once (cached by its text)."""
    env = _StrictSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    try:
        return env.from_string(source)
    except TemplateError as exc:
        raise ValueError(f"chat template does not compile: {exc}") from exc


def render_template(source: str, **variables: Any) -> str:
    """Render; a sandbox violation raises `TemplateRefusedError`, a template error (including
    `raise_exception`) a `ValueError` with the template's message."""
    template = compile_template(source)
    try:
        return template.render(**variables)
    except SecurityError as exc:
        raise TemplateRefusedError(f"chat template refused by the sandbox: {exc}") from exc
    except TemplateError as exc:
        raise ValueError(f"chat template error: {exc}") from exc
    except (TypeError, AttributeError, KeyError, IndexError) as exc:
        raise ValueError(f"chat template failed on this conversation: {exc!r}") from exc
