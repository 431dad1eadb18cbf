"""Who may touch what, read from the source with `ast` (nothing is imported).

1. The scheduler owns the cache: outside `resin.cache` itself, only `resin.engine.scheduler`
   names `CacheManager` (imports it, annotates with it, builds one) or reaches a member of it.
   A member is reached as `<receiver>.<member>` where the receiver's last name is `cache` or
   ends in `_cache` (`self.cache`, `self._cache`, `cache`), or as `<...scheduler>.cache`
   (borrowing the scheduler's cache to call it elsewhere). Members are read from the
   `CacheManager` class: its public methods and properties and the attributes it sets.
2. No module calls another's privates: any `x._name` (load, store or delete; `_name` starting
   with one underscore, dunders excepted) where `x` is not `self`, `cls` or `super()`, and any
   `getattr`/`setattr`/`hasattr`/`delattr(x, "_name")`, counts, unless `ALLOWED_PRIVATE` lists
   it with the reason it is a true necessity.
3. Cache-group kinds are told apart in one place: no `isinstance` / `issubclass` / class
   pattern (`case State():`) naming a kind (the spec classes of `resin.protocols` and the
   kind classes of `resin.cache.groups`) outside `KIND_MODULES`; everywhere else asks the
   kind itself (its methods and class attributes).
4. One engine loop: the loop that drives an engine for served requests (admission, the
   grammar-compile wait, stepping, shutdown) is `resin.frontend.engine_loop.EngineLoop`, and
   both of its drivers build it (`EngineActor`, a thread of the server process, and
   `EngineService`, an engine process). Under `resin.frontend`, `resin.ipc` and
   `resin.server` no other module names `Admission`, calls `.admit(`, `.step(` or
   `.prepare(`, or defines an admission method (`_admit`, `admit`).
The first three cover every module under `src/`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MANAGER = SRC / "resin" / "cache" / "manager.py"
CACHE_OWNER = "resin.engine.scheduler"
CACHE_RECEIVER = re.compile(r"(^|_)cache$")

ALLOWED_PRIVATE: dict[tuple[str, str], str] = {
    # (receiver as written, attribute): why it is no private reach.
    ("os", "_exit"): "the worker's hard exit after a fatal collective (no cleanup may run)",
    ("sys", "_getframe"): "the standard library's documented frame access",
    ("torch", "_scaled_mm"): "PyTorch's cuBLASLt FP8 GEMM (no public name yet)",
    # Benchmarks that time one internal seam of the engine or runner (resin_app/bench/): they
    # read what they time, and a benchmark breaking with the internals is the point.
    ("engine", "_scheduler"): "bench engine / grammar: the step's queues, read between steps",
    ("engine", "_constraints"): "bench grammar: times ConstraintSet.attach / advance",
    ("runner", "_sampler"): "bench grammar: times the sampler's pick",
    ("self.runner", "_graphs"): "bench overlap: replays one captured decode graph alone",
    ("self.runner", "_pick_graph"): "bench overlap: the graph a batch size replays",
}
KIND_MODULES = frozenset({"resin.protocols", "resin.cache.groups"})
"""Where group kinds are defined: the only modules that may test an object's kind."""
GROUPS = SRC / "resin" / "cache" / "groups.py"
PROTOCOLS = SRC / "resin" / "protocols.py"
NAMEDTUPLE_API = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults"})
"""`NamedTuple`'s public API is spelled with one underscore; allowed on any receiver."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, ast.Module]:
    return {_module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(SRC.rglob("*.py"))}


def _last_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


# -- 1. the cache's one caller ----------------------------------------------------------------
def cache_members(manager: ast.Module) -> frozenset[str]:
    """Public methods, properties and attributes of `CacheManager`."""
    cls = next(n for n in manager.body if isinstance(n, ast.ClassDef) and n.name == "CacheManager")
    names = {
        n.name
        for n in cls.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and not n.name.startswith("_")
    }
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and not node.attr.startswith("_")
        ):
            names.add(node.attr)
    return frozenset(names)


def cache_reaches(tree: ast.Module, members: frozenset[str]) -> list[str]:
    """Every place the module names `CacheManager` or reaches into a cache (rule 1)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == "CacheManager" for a in node.names):
            found.append(f"line {node.lineno}: imports CacheManager")
        elif isinstance(node, ast.Name) and node.id == "CacheManager":
            found.append(f"line {node.lineno}: names CacheManager")
        elif isinstance(node, ast.Attribute):
            receiver = _last_name(node.value) or ""
            if node.attr in members and CACHE_RECEIVER.search(receiver):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
            elif node.attr == "cache" and "scheduler" in receiver:
                found.append(f"line {node.lineno}: borrows {ast.unparse(node)}")
    return found


def test_only_the_scheduler_calls_the_cache_manager() -> None:
    members = cache_members(ast.parse(MANAGER.read_text()))
    assert {"reserve", "commit", "rollback", "release", "admit", "match"} <= members
    bad = {
        name: found
        for name, tree in _modules().items()
        if name != CACHE_OWNER and not (name == "resin.cache" or name.startswith("resin.cache."))
        for found in [cache_reaches(tree, members)]
        if found
    }
    assert not bad, f"only {CACHE_OWNER} may drive the CacheManager: {bad}"


def test_the_cache_rule_sees_each_form() -> None:
    members = frozenset({"reserve", "pool", "match"})

    def reaches(code: str) -> list[str]:
        return cache_reaches(ast.parse(code), members)

    assert reaches("from resin.cache.manager import CacheManager")
    assert reaches("def f(c: 'x') -> None:\n    CacheManager(layout, 1, 2)")
    assert reaches("self._cache.reserve(slots)")
    assert reaches("n = cache.pool.num_free")
    assert reaches("engine._scheduler.cache")
    assert reaches("self.scheduler.cache.match(keys)")
    assert not reaches("self._cache.get(key)")  # a member name it does not have
    assert not reaches("re.match(pattern, text)")  # not a cache receiver
    assert not reaches("self.scheduler.reserve(cohort)")  # through the owner


# -- 2. nobody's privates but one's own -------------------------------------------------------
def private_reaches(tree: ast.Module) -> list[str]:
    """Every `x._name` with `x` not `self`/`cls`/`super()`, and string forms (rule 2)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            if _own(node.value) or node.attr in NAMEDTUPLE_API:
                continue
            receiver = ast.unparse(node.value)
            if (receiver, node.attr) not in ALLOWED_PRIVATE:
                found.append(f"line {node.lineno}: {receiver}.{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _is_private(node.args[1].value)
            and not _own(node.args[0])
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own(receiver: ast.expr) -> bool:
    if isinstance(receiver, ast.Name):
        return receiver.id in ("self", "cls")
    return (
        isinstance(receiver, ast.Call)
        and isinstance(receiver.func, ast.Name)
        and receiver.func.id == "super"
    )


def test_no_module_reaches_another_modules_privates() -> None:
    bad = {name: found for name, tree in _modules().items() if (found := private_reaches(tree))}
    assert not bad, f"underscored names are their class's own: {bad}"


def test_the_private_rule_sees_each_form() -> None:
    def reaches(code: str) -> list[str]:
        return private_reaches(ast.parse(code))

    assert reaches("self._txn._commit(plan)")
    assert reaches("self.engine._scheduler.waiting")
    assert reaches("x._y = 1")
    assert reaches("getattr(engine, '_spec')")
    assert not reaches("self._commit(plan)")
    assert not reaches("cls._registry[name] = f")
    assert not reaches("super()._outputs(plan, hidden)")
    assert not reaches("point._replace(x=1); Tiles._fields")
    assert not reaches("os._exit(1)")
    assert not reaches("obj.__class__.__name__")
    assert not reaches("getattr(obj, '__dict__')")


# -- 3. kinds are told apart by the kinds ------------------------------------------------------
def kind_names() -> frozenset[str]:
    """The spec classes (`CacheGroupSpec`'s members) and every class of the kinds' module."""
    protocols = ast.parse(PROTOCOLS.read_text())
    spec = next(
        n
        for n in protocols.body
        if isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "CacheGroupSpec" for t in n.targets)
    )
    names = {n.id for n in ast.walk(spec.value) if isinstance(n, ast.Name)}
    groups = ast.parse(GROUPS.read_text())
    names |= {n.name for n in groups.body if isinstance(n, ast.ClassDef)}
    return frozenset(names)


def _names_in(node: ast.expr) -> set[str]:
    return {n for sub in ast.walk(node) if (n := _last_name(sub)) is not None}  # type: ignore[arg-type]


def kind_tests(tree: ast.Module, kinds: frozenset[str]) -> list[str]:
    """Every isinstance / issubclass / class pattern / `type(x) is` naming a kind (rule 3)."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass")
            and len(node.args) == 2
            and _names_in(node.args[1]) & kinds
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.MatchClass) and _names_in(node.cls) & kinds:
            found.append(f"line {node.lineno}: case {ast.unparse(node)}")
        elif (
            isinstance(node, ast.Compare)
            and any(isinstance(op, ast.Is | ast.IsNot | ast.Eq | ast.NotEq) for op in node.ops)
            and any(
                isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "type"
                for c in (node.left, *node.comparators)
            )
            and _names_in(node) & kinds
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_only_the_kinds_tell_kinds_apart() -> None:
    kinds = kind_names()
    assert {"History", "Window", "State", "Compressed", "StateKind"} <= kinds
    bad = {
        name: found
        for name, tree in _modules().items()
        if name not in KIND_MODULES
        for found in [kind_tests(tree, kinds)]
        if found
    }
    assert not bad, f"ask the kind, not its class (resin.cache.groups): {bad}"


def test_the_kind_rule_sees_each_form() -> None:
    kinds = frozenset({"State", "Window"})

    def tests(code: str) -> list[str]:
        return kind_tests(ast.parse(code), kinds)

    assert tests("isinstance(g, State)")
    assert tests("isinstance(g, protocols.Window | int)")
    assert tests("issubclass(cls, (int, State))")
    assert tests("match g:\n    case State():\n        pass")
    assert tests("type(g) is Window")
    assert not tests("isinstance(g, KvSpec)")
    assert not tests("g.state_region and not g.rewinds(2)")


# -- 4. one engine loop -----------------------------------------------------------------------
LOOP_MODULE = "resin.frontend.engine_loop"
LOOP_PACKAGES = ("resin.frontend", "resin.ipc", "resin.server")
LOOP_DRIVERS = ("resin.frontend.actor", "resin.ipc.service")
LOOP_CALLS = frozenset({"admit", "step", "prepare"})


def loop_reaches(tree: ast.Module) -> list[str]:
    """What in `tree` drives an engine itself instead of through `EngineLoop`."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name | ast.alias) and "Admission" in (
            getattr(node, "id", None),
            getattr(node, "name", None),
        ):
            found.append(f"line {getattr(node, 'lineno', 0)}: names Admission")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in LOOP_CALLS
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node.func)}(...)")
        elif isinstance(node, ast.FunctionDef) and node.name in ("admit", "_admit"):
            found.append(f"line {node.lineno}: def {node.name}")
    return found


def test_one_engine_loop_drives_the_engine() -> None:
    modules = _modules()
    bad = {
        name: found
        for name, tree in modules.items()
        if name.startswith(LOOP_PACKAGES) and name not in (LOOP_MODULE, "resin.frontend.admission")
        for found in [loop_reaches(tree)]
        if found
    }
    assert not bad, f"drive the engine through resin.frontend.engine_loop.EngineLoop: {bad}"
    for driver in LOOP_DRIVERS:
        names = {n.id for n in ast.walk(modules[driver]) if isinstance(n, ast.Name)}
        assert "EngineLoop" in names, f"{driver} runs its own loop instead of EngineLoop"
    assert loop_reaches(modules[LOOP_MODULE]), "the loop rule no longer sees the loop's own calls"


def test_the_loop_rule_sees_each_form() -> None:
    def reaches(code: str) -> list[str]:
        return loop_reaches(ast.parse(code))

    assert reaches("from resin.frontend.admission import Admission")
    assert reaches("x = Admission()")
    assert reaches("self._admission.admit(engine, 0, (1, 1), f)")
    assert reaches("events = self.engine.step()")
    assert reaches("future = backend.prepare(constraint)")
    assert reaches("class A:\n    def _admit(self):\n        pass")
    assert not reaches("loop.submit(item)")


# -- 5. the scheduler alone writes a request's progress ---------------------------------------
PROGRESS_OWNER = "resin.engine.scheduler"
REQUEST = SRC / "resin" / "engine" / "request.py"
SLOTS = SRC / "resin" / "engine" / "slots.py"
SCHEDULER = SRC / "resin" / "engine" / "scheduler.py"
PROGRESS = frozenset(
    {
        "output_token_ids",
        "status",
        "slot",
        "arrival",
        "cached_tokens",
        "retries",
        "drafts",
        "finish_reason",
        "error",
    }
)
"""A request's progress (`Request`'s docstring): its tokens, queue state, slot, attempts, the
runner's drafts for it, its outcome."""
QUEUES = frozenset({"waiting", "prefilling", "running", "live", "free_slots", "held"})
"""The scheduler's queues and tables (`Scheduler`)."""
MUTATORS = frozenset(
    {"append", "appendleft", "extend", "insert", "pop", "popleft", "remove", "clear", "sort"}
)
STORE_RECEIVER = re.compile(r"store$")
SCHEDULER_RECEIVER = re.compile(r"(^|_)scheduler$")


def request_fields(request: ast.Module) -> frozenset[str]:
    """The attributes `Request.__init__` sets (what a progress name must be one of)."""
    cls = next(n for n in request.body if isinstance(n, ast.ClassDef) and n.name == "Request")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    return frozenset(
        node.attr
        for node in ast.walk(init)
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
    )


def store_writers(slots: ast.Module) -> frozenset[str]:
    """`SlotStore`'s public methods that write its arrays (any store through `self.`)."""
    cls = next(n for n in slots.body if isinstance(n, ast.ClassDef) and n.name == "SlotStore")
    writers = set()
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef) or fn.name.startswith("_"):
            continue
        calls_private = any(
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and _own(n.func.value)
            and n.func.attr.startswith("_")
            for n in ast.walk(fn)
        )
        if calls_private or _writes_self(fn):
            writers.add(fn.name)
    return frozenset(writers)


def _writes_self(fn: ast.AST) -> bool:
    for node in ast.walk(fn):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for t in targets:
            while isinstance(t, ast.Subscript | ast.Attribute):
                if isinstance(t, ast.Attribute) and _own(t.value):
                    return True
                t = t.value
    return False


def progress_writes(tree: ast.Module, writers: frozenset[str]) -> list[str]:
    """Every place a module writes a request's progress, the slot store or the scheduler's
    queues (rule 5): an assignment to `<x>.<progress>` (x not `self`), a mutating call on
    `<x>.output_token_ids` or a scheduler's queue, `attrgetter("output_token_ids")`, a call of
    a `SlotStore` writer on a store, a store into a store's arrays or a scheduler's queues."""
    found = []

    def store_target(t: ast.expr) -> None:
        base = t
        while isinstance(base, ast.Subscript):
            base = base.value
        if not isinstance(base, ast.Attribute):
            return
        receiver = _last_name(base.value) or ""
        progress = base is t and base.attr in PROGRESS and not _own(base.value)
        array = base is not t and STORE_RECEIVER.search(receiver)
        queue = base.attr in QUEUES and SCHEDULER_RECEIVER.search(receiver)
        if progress or array or queue:
            found.append(f"line {t.lineno}: {ast.unparse(t)} =")

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                store_target(t)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            store_target(node.target)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner, name = node.func.value, node.func.attr
            if isinstance(owner, ast.Attribute):
                receiver = _last_name(owner.value) or ""
                queue = owner.attr in QUEUES and SCHEDULER_RECEIVER.search(receiver)
                if name in MUTATORS and (owner.attr == "output_token_ids" or queue):
                    found.append(f"line {node.lineno}: {ast.unparse(node.func)}(...)")
            if name in writers and STORE_RECEIVER.search(_last_name(owner) or ""):
                found.append(f"line {node.lineno}: {ast.unparse(node.func)}(...)")
        if (
            isinstance(node, ast.Call)
            and _last_name(node.func) == "attrgetter"
            and any(
                isinstance(a, ast.Constant) and a.value == "output_token_ids" for a in node.args
            )
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_only_the_scheduler_writes_request_progress() -> None:
    assert request_fields(ast.parse(REQUEST.read_text())) >= PROGRESS
    writers = store_writers(ast.parse(SLOTS.read_text()))
    assert {"admit", "release", "launched", "landed", "computed", "append"} <= writers
    allowed = {PROGRESS_OWNER, "resin.engine.request", "resin.engine.slots"}
    bad = {
        name: found
        for name, tree in _modules().items()
        if name.startswith("resin.") and name not in allowed  # the library holds requests
        for found in [progress_writes(tree, writers)]
        if found
    }
    assert not bad, f"only {PROGRESS_OWNER} writes a request's progress: {bad}"
    # ... and it does write them (the rule is not vacuous)
    assert progress_writes(ast.parse(SCHEDULER.read_text()), writers)


def test_the_progress_rule_sees_each_form() -> None:
    writers = frozenset({"append", "landed"})

    def writes(code: str) -> list[str]:
        return progress_writes(ast.parse(code), writers)

    assert writes("r.retries += 1")
    assert writes("request.status = Status.DECODE")
    assert writes("r.output_token_ids.append(t)")
    assert writes("deque(map(list.append, map(attrgetter('output_token_ids'), rs), ts))")
    assert writes("self._slot_store.landed(slots)")
    assert writes("scheduler.slot_store.append(slots, ids)")
    assert writes("store.num_output[slots] += 1")
    assert writes("self._scheduler.running.remove(r)")
    assert writes("queues.held = ()") == []  # a Protocol's name: only `scheduler` receivers
    assert writes("self._scheduler.held = frozenset()")
    assert not writes("self.status = 'ok'")  # a class's own attribute
    assert not writes("n = store.num_output[slots]")  # reading
    assert not writes("tokens.append(t)")
    assert not writes("self._scheduler.commit(requests, pages, plan, out)")
