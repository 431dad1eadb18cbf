"""The sandboxed Jinja environment chat templates run in (HF `apply_chat_template`-compatible).

Templates come from checkpoints, i.e. from strangers: they run in jinja2's
`ImmutableSandboxedEnvironment` (no attribute writes, no mutation of lists/dicts passed in),
and any reach for an unsafe attribute (`__class__`, `__globals__`, `mro`, ...) raises
`SecurityError` at once instead of rendering as an empty Undefined. The helpers match
transformers': `raise_exception`, `strftime_now`, and a `tojson` with `ensure_ascii=False` and
`indent`/`separators`/`sort_keys` options.

A render is bounded (`TemplateLimits`, set per recipe; `resin serve --template-*`):
- size: no string, list or number the template builds may exceed `max_chars` items (an int
  `max_chars` bits), checked before the operation where its size is known in advance
  (`*`, `**`, `%`, `str.format`, `replace`, `join`, `center`, `indent`, `range`, ...) and
  after every other one (`~`, `+`, filters, calls), so one step allocates at most a few
  times `max_chars`; the rendered text is at most `max_chars` too;
- depth: calls nest at most `max_depth` deep (macros, recursive loops);
- time: the render stops with an error once it has run `timeout_s`, checked on every loop
  iteration, call, attribute access, operator and output chunk (a thread cannot be killed,
  so the template's own steps check; `resin.server` renders off the event loop).
Exceeding a limit raises `TemplateLimitError` (a `ValueError`: the client's 400), naming it.
"""

from __future__ import annotations

import contextvars
import functools
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any, NoReturn, cast

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from resin.recipe.template_limits import TemplateLimitError, TemplateLimits


class _Budget:
    """One render's running account against its limits."""

    def __init__(self, limits: TemplateLimits) -> None:
        self.limits = limits
        self.deadline = time.monotonic() + limits.timeout_s
        self.depth = 0

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimitError(
                f"the chat template ran past its time limit of {self.limits.timeout_s:g} s "
                "(--template-timeout)"
            )

    def size(self, n: int, what: str = "a value", unit: str = "items") -> None:
        if n > self.limits.max_chars:
            raise TemplateLimitError(
                f"the chat template built {what} of {n} {unit}, above its limit of "
                f"{self.limits.max_chars} (--template-max-chars)"
            )


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar(
    "resin_template_budget", default=None
)


_UNTIMED = threading.local()


def _budget() -> _Budget:
    budget = _BUDGET.get()
    if budget is None:
        # A compiled template rendered outside `render_template`: the default size and depth
        # limits, no clock (its start is unknown), one account per thread.
        budget = getattr(_UNTIMED, "budget", None)
        if budget is None:
            budget = _UNTIMED.budget = _Budget(TemplateLimits(timeout_s=float("inf")))
    return budget


def _measure(value: Any) -> Any:
    """`value`, after checking its size against the budget (and the clock)."""
    budget = _budget()
    budget.tick()
    if isinstance(value, (str, bytes, list, tuple, dict, set)):
        budget.size(len(value))
    elif isinstance(value, int) and not isinstance(value, bool):
        budget.size(value.bit_length(), "a number", "bits")
    return value


def bounded_iter(iterable: Iterable[Any]) -> Iterator[Any]:
    """Every `{% for %}` loop iterates through this: the clock is checked each step."""
    budget = _budget()
    for item in iterable:
        budget.tick()
        yield item


def measured(value: Any) -> Any:
    """Every `~` concatenation and filter result passes through this (`_measure`)."""
    return _measure(value)


class _Bounded(NodeTransformer):
    """Rewrites a parsed template: loops iterate through `bounded_iter`, concatenations and
    filter results through `measured` (both imported by name: a template cannot shadow them)."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = _call("bounded_iter", node.iter)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return _call("measured", node)

    def visit_Filter(self, node: nodes.Filter) -> nodes.Node:
        self.generic_visit(node)
        return _call("measured", node)

    def visit_FilterBlock(self, node: nodes.FilterBlock) -> nodes.Node:
        node.body = [self.visit(n) for n in node.body]  # its `filter` must stay a Filter
        return node

    def visit_AssignBlock(self, node: nodes.AssignBlock) -> nodes.Node:
        node.body = [self.visit(n) for n in node.body]  # likewise its `filter`
        return node


def _call(name: str, arg: nodes.Node) -> nodes.Call:
    target = nodes.ImportedName(f"{__name__}.{name}", lineno=arg.lineno)
    return nodes.Call(target, [cast(nodes.Expr, arg)], [], None, None, lineno=arg.lineno)


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\d+|\*)?(?:\.(\d+|\*))?")
_BRACE_NUMBER = re.compile(r"\d{5,}")
MAX_FIELD_WIDTH = 9999
"""The widest `%` / `format` field a template may ask for."""


def _check_percent(fmt: str) -> None:
    for m in _PERCENT_SPEC.finditer(fmt):
        for part in m.groups():
            if part == "*" or (part is not None and int(part) > MAX_FIELD_WIDTH):
                raise TemplateLimitError(f"a format width above {MAX_FIELD_WIDTH}: {m.group()!r}")


def _estimated_size(method: str, text: str, args: tuple[Any, ...]) -> int | None:
    """The length `text.<method>(*args)` will have, or a bound on it (None: not a sizing
    method, or arguments it will refuse itself)."""
    if method == "replace" and len(args) >= 2 and isinstance(args[0], str):
        grow = len(str(args[1])) - len(args[0])
        return len(text) + max(0, grow) * (text.count(args[0]) if args[0] else len(text) + 1)
    if method in ("center", "ljust", "rjust", "zfill") and args and isinstance(args[0], int):
        return max(len(text), args[0])
    if method == "expandtabs":
        width = args[0] if args and isinstance(args[0], int) else 8
        return len(text) + text.count("\t") * max(0, width)
    if method == "join" and args:
        items = args[0] if isinstance(args[0], (list, tuple)) else None
        if items is None:
            return None
        return sum(len(i) if isinstance(i, str) else 0 for i in items) + len(text) * len(items)
    return None


class TemplateRefusedError(ValueError):
    """The chat template tried to escape the sandbox."""


class _StrictSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def unsafe_undefined(self, obj: Any, attribute: str) -> NoReturn:
        raise SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} is not allowed"
        )

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        bounded = _Bounded().visit(tree)
        assert isinstance(bounded, nodes.Template)
        return bounded

    def call_binop(self, context: Any, op: str, left: Any, right: Any) -> Any:
        budget = _budget()
        budget.tick()
        if op == "*":
            seq, times = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, (str, list, tuple)) and isinstance(times, int):
                budget.size(len(seq) * max(0, times))
        elif op == "**" and isinstance(left, int) and isinstance(right, int):
            if abs(left) > 1 and right > 0:
                budget.size(left.bit_length() * right, "a number", "bits")
        elif op == "%" and isinstance(left, str):
            _check_percent(left)
        return _measure(self.binop_table[op](left, right))

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        # positional-only: a template's keyword arguments (`f(self=1)`) cannot collide
        budget = _budget()
        budget.tick()
        owner = getattr(obj, "__self__", None)
        if isinstance(owner, str):
            estimate = _estimated_size(getattr(obj, "__name__", ""), owner, args)
            if estimate is not None:
                budget.size(estimate)
        if budget.depth >= budget.limits.max_depth:
            raise TemplateLimitError(
                f"the chat template nested calls deeper than its limit of "
                f"{budget.limits.max_depth} (--template-max-depth)"
            )
        budget.depth += 1
        try:
            return _measure(super().call(context, obj, *args, **kwargs))
        finally:
            budget.depth -= 1

    def getattr(self, obj: Any, attribute: str) -> Any:
        _budget().tick()
        return super().getattr(obj, attribute)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is not None and _BRACE_NUMBER.search(value.__self__):
            raise TemplateLimitError(f"a format width above {MAX_FIELD_WIDTH}")
        return wrapped


def _range(*args: int) -> range:
    """`range` whose length counts against the size limit."""
    values = range(*args)
    _budget().size(len(values), "a range")
    return values


def _bounded_filter(name: str, size: Callable[..., int]) -> Callable[..., Any]:
    """A built-in filter whose output size `size(value, *args)` is checked before it runs."""
    original = jinja2.filters.FILTERS[name]
    passes = getattr(original, "jinja_pass_arg", None)  # the context it is handed first

    def run(*call: Any, **kwargs: Any) -> Any:
        value, *args = call[1:] if passes is not None else call
        try:
            estimate = size(value, *args, **kwargs)
        except (TypeError, ValueError):
            estimate = 0  # arguments the filter itself refuses
        _budget().size(estimate)
        return original(*call, **kwargs)

    if passes is not None:
        run.jinja_pass_arg = passes  # type: ignore[attr-defined]
    return run


def _indent_size(value: Any, width: Any = 4, *_: Any, **kwargs: Any) -> int:
    width = kwargs.get("width", width)
    n = len(str(value))
    per = width if isinstance(width, int) else len(str(width))
    return n + (str(value).count("\n") + 1) * per


def _replace_size(value: Any, old: Any, new: Any, *_: Any, **__: Any) -> int:
    return _estimated_size("replace", str(value), (str(old), str(new))) or 0


def _join_size(value: Any, d: Any = "", *_: Any, **__: Any) -> int:
    items = list(value) if isinstance(value, (list, tuple)) else []
    return sum(len(str(i)) for i in items) + len(str(d)) * len(items)


def _center_size(value: Any, width: Any = 80, *_: Any, **__: Any) -> int:
    return max(len(str(value)), int(width))


def _format_size(value: Any, *_: Any, **__: Any) -> int:
    _check_percent(str(value))
    return 0


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
    env.filters["indent"] = _bounded_filter("indent", _indent_size)
    env.filters["replace"] = _bounded_filter("replace", _replace_size)
    env.filters["join"] = _bounded_filter("join", _join_size)
    env.filters["center"] = _bounded_filter("center", _center_size)
    env.filters["format"] = _bounded_filter("format", _format_size)
    env.globals["range"] = _range
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    try:
        return env.from_string(source)
    except TemplateError as exc:
        raise ValueError(f"chat template does not compile: {exc}") from exc
    except RecursionError:
        raise ValueError("chat template does not compile: nested too deeply") from None


def render_template(source: str, limits: TemplateLimits | None = None, **variables: Any) -> str:
    """Render within `limits` (default `TemplateLimits()`); a sandbox violation raises
    `TemplateRefusedError`, a limit `TemplateLimitError`, a template error (including
    `raise_exception`) a `ValueError` with the template's message."""
    template = compile_template(source)
    limits = limits or TemplateLimits()
    budget = _Budget(limits)
    token = _BUDGET.set(budget)
    try:
        parts: list[str] = []
        total = 0
        for chunk in template.generate(**variables):
            total += len(chunk)
            budget.size(total, "a prompt")
            budget.tick()
            parts.append(chunk)
        return "".join(parts)
    except SecurityError as exc:
        raise TemplateRefusedError(f"chat template refused by the sandbox: {exc}") from exc
    except TemplateError as exc:
        raise ValueError(f"chat template error: {exc}") from exc
    except RecursionError:
        raise TemplateLimitError(
            f"the chat template recursed too deeply (limit {limits.max_depth} calls)"
        ) from None
    except MemoryError:
        raise TemplateLimitError("the chat template ran out of memory") from None
    except (TypeError, AttributeError, KeyError, IndexError, OverflowError) as exc:
        raise ValueError(f"chat template failed on this conversation: {exc!r}") from exc
    finally:
        _BUDGET.reset(token)
