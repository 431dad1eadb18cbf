"""The import layers of `src/`, read from the source with `ast` (nothing is imported).

Every module of every package under `src/` is read, and every way it can reach another module
is an edge: imports at the top, lazy imports inside functions, `if TYPE_CHECKING` imports, and
string imports (`importlib.import_module("x")`, `__import__("x")`, and any string that is a
module path, `"pkg.mod"` or `"pkg.mod:Name"`, as entry points and registries write them).

Packages, from the bottom: `resin` (the core) < `resin_model` (the model description both
runner families share) < `resin_models_torch`, `resin_models_cuda` (runner families, never
each other) < `resin_app` (the application). Rules:
- no cycle between modules, none between packages (a package = a folder; a module directly in
  a top-level package is its own unit), none between the top-level packages;
- nothing imports a higher package; `resin_model` and the runner families import from `resin`
  only the contract modules;
- inside `resin`, from the top down: `resin` (its `__init__`, the public API) -> `server` ->
  `frontend` -> `recipe` (+ tokenizer, detokenizer, media, generation_config) and `engine` ->
  `cache`, `backend` -> `metrics` -> contracts (`plan`, `params`, `protocols`, `events`,
  `errors`); every module has a layer and imports its own layer or lower ones. `resin.engine`
  imports neither the server nor recipes; the server and the frontend import neither
  `resin.engine` nor `resin.cache` (they drive any `EngineLike`); `resin.cache` and
  `resin.metrics` never import the engine (not even for types: the engine feeds them);
- the HTTP-client tools of the application (`check`, `terminal`, `bench.serve`) import nothing
  from `resin.server`: they talk to any server as a client would.
A known violation goes in `ALLOWED` with a one-line reason; anything new fails.
"""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

PACKAGE_RANK = {
    "resin": 0,
    "resin_model": 1,
    "resin_models_torch": 2,
    "resin_models_cuda": 2,
    "resin_app": 3,
}
"""Every top-level package under `src/` and its place in the DAG (equal ranks: siblings that
never import each other)."""

RUNNER_PACKAGES = ("resin_models_torch", "resin_models_cuda", "resin_app")
"""Packages that may import runner code (the families themselves, and the application)."""

CONTRACTS = ("resin.plan", "resin.params", "resin.protocols", "resin.events", "resin.errors")

LAYERS: tuple[tuple[str, int], ...] = (
    ("resin.server", 5),
    ("resin.frontend", 4),
    ("resin.ipc", 4),
    ("resin.engine", 3),
    ("resin.recipe", 3),
    ("resin.tokenizer", 2),
    ("resin.generation_config", 2),
    ("resin.detokenizer", 2),
    ("resin.media", 2),
    ("resin.cache", 2),
    ("resin.backend", 2),
    ("resin.metrics", 1),
    *((c, 0) for c in CONTRACTS),
)
"""Module prefix inside `resin` -> layer; a module may import its own layer or lower ones. The
package `resin` itself (its `__init__`, the public API) sits on top."""

HTTP_CLIENT_TOOLS = ("resin_app.check", "resin_app.check_client", "resin_app.check_eval")
HTTP_CLIENT_TOOLS += ("resin_app.terminal", "resin_app.bench.serve")

ALLOWED: dict[tuple[str, str], str] = {
    # (importer, imported): reason. Empty today.
}

_MODULE_PATH = re.compile(r"[A-Za-z_]\w*(\.\w+)*(:[\w.]+)?")
_IMPORT_CALLS = {"import_module", "__import__", "find_spec"}


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    type_checking: bool
    line: int
    kind: str = "import"  # "import" | "string"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest known module `name` starts with (`a.b.C` -> `a.b`)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _string_target(value: str, in_import_call: bool, modules: dict[str, Path]) -> str | None:
    """The module a string names: any argument of an import call, else a dotted module path,
    with or without a `:attribute` (a bare word, or `resin:name` as Prometheus names metrics,
    is no import)."""
    if not _MODULE_PATH.fullmatch(value):
        return None
    module = value.partition(":")[0]
    if not (in_import_call or "." in module):
        return None
    return module if module in modules else None


def _import_targets(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        pkg = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            pkg = pkg.rpartition(".")[0]
        base = f"{pkg}.{base}" if base else pkg
    # `from pkg import sub` imports the module `pkg.sub` when there is one.
    return [f"{base}.{a.name}" for a in node.names]


def _call_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _edges(module: str, path: Path, modules: dict[str, Path]) -> list[Edge]:
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    edges: list[Edge] = []

    def add(target: str | None, type_checking: bool, node: ast.AST, kind: str) -> None:
        resolved = None if target is None else _resolve(target, modules)
        if resolved is not None and resolved != module:
            line = getattr(node, "lineno", 0)
            edges.append(Edge(module, resolved, type_checking, line, kind))

    def visit(node: ast.AST, type_checking: bool, in_call: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True, False)
            for child in node.orelse:
                visit(child, type_checking, False)
            return
        for target in _import_targets(node, module, is_package):
            add(target, type_checking, node, "import")
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            add(_string_target(node.value, in_call, modules), type_checking, node, "string")
        calls = isinstance(node, ast.Call) and _call_name(node) in _IMPORT_CALLS
        for sub in ast.iter_child_nodes(node):
            visit(sub, type_checking, calls and sub in getattr(node, "args", ()))

    visit(tree, False, False)
    return edges


def _all_edges() -> list[Edge]:
    modules = _modules()
    return [e for m, p in sorted(modules.items()) for e in _edges(m, p, modules)]


def _under(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _top(module: str) -> str:
    return module.split(".")[0]


def _layer(module: str) -> int | None:
    if module == "resin":
        return 6
    for prefix, layer in LAYERS:
        if _under(module, prefix):
            return layer
    return None


def _package_violation(a: str, b: str) -> str | None:
    pa, pb = _top(a), _top(b)
    if pa == pb:
        return None
    if PACKAGE_RANK[pb] > PACKAGE_RANK[pa]:
        return f"upward import between packages ({pa} -> {pb})"
    if PACKAGE_RANK[pb] == PACKAGE_RANK[pa]:
        return "runner families import each other"
    if pa != "resin_app" and pb == "resin" and not _under(b, *CONTRACTS):
        return f"{pa} imports more of resin than the contracts"
    return None


def _core_violation(e: Edge) -> str | None:
    a, b = e.importer, e.imported
    if _under(a, "resin.engine") and _under(b, "resin.server", "resin.recipe"):
        return "the engine imports the server or a recipe"
    if _under(a, "resin.server", "resin.frontend") and _under(b, "resin.engine", "resin.cache"):
        return "the server or the frontend reaches into the engine (it drives any EngineLike)"
    if _under(a, "resin.cache") and _under(b, "resin.engine"):
        return "the cache imports the engine"
    if _under(a, "resin.metrics") and _under(b, "resin.engine"):
        return "metrics import the engine (the engine feeds them)"
    la, lb = _layer(a), _layer(b)
    if la is not None and lb is not None and lb > la and not e.type_checking:
        return f"upward import (layer {la} -> {lb})"
    return None


def _violation(e: Edge) -> str | None:
    a, b = e.importer, e.imported
    if (why := _package_violation(a, b)) is not None:
        return why
    if _under(a, *HTTP_CLIENT_TOOLS) and _under(b, "resin.server"):
        return "an HTTP-client tool imports the server"
    if _top(a) == "resin":
        return _core_violation(e)
    return None


def _cycles(edges: list[Edge] | list[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        a, b = (e.importer, e.imported) if isinstance(e, Edge) else e
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def _is_package_init_edge(e: Edge) -> bool:
    # A package's `__init__` re-exporting its own submodules is not a cycle between modules.
    return e.imported.startswith(e.importer + ".")


def _unit(module: str, modules: dict[str, Path]) -> str:
    """The package (folder) a module lives in; a module directly in a top-level package, and
    a top-level package itself, are units of their own."""
    parent = module.rpartition(".")[0]
    if modules[module].name == "__init__.py" or "." not in parent:
        return module
    return parent


def _checked_edges() -> list[Edge]:
    edges = [e for e in _all_edges() if not _is_package_init_edge(e)]
    return [e for e in edges if (e.importer, e.imported) not in ALLOWED]


def test_every_module_under_src_belongs_to_a_known_package_and_layer() -> None:
    modules = _modules()
    assert sorted({_top(m) for m in modules}) == sorted(PACKAGE_RANK)
    unlayered = [m for m in modules if _top(m) == "resin" and _layer(m) is None]
    assert unlayered == [], "every resin module needs a layer in LAYERS"


def test_no_import_cycles_between_modules() -> None:
    assert _cycles(_checked_edges()) == []


def test_no_import_cycles_between_packages() -> None:
    modules = _modules()
    units = {(_unit(e.importer, modules), _unit(e.imported, modules)) for e in _checked_edges()}
    assert _cycles([(a, b) for a, b in units if a != b]) == []
    tops = {(_top(e.importer), _top(e.imported)) for e in _all_edges()}
    assert _cycles([(a, b) for a, b in tops if a != b]) == []


def test_no_upward_or_forbidden_imports() -> None:
    bad = [
        f"{e.importer} -> {e.imported} ({e.kind}, line {e.line}): {why}"
        for e in _all_edges()
        if (why := _violation(e)) is not None and (e.importer, e.imported) not in ALLOWED
    ]
    assert bad == []


def test_allow_list_has_no_stale_entries() -> None:
    edges = {(e.importer, e.imported) for e in _all_edges()}
    assert [k for k in ALLOWED if k not in edges] == []


_OUTSIDE_THE_CORE = re.compile(r"(resin_model|resin_models_\w+|resin_app)(\.\w+)*(:[\w.]+)?")


def _names_outside_the_core(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value]
        found += [(getattr(node, "lineno", 0), n) for n in names if _OUTSIDE_THE_CORE.fullmatch(n)]
    return found


def test_the_core_names_no_runner_package_and_no_application_anywhere() -> None:
    """Every `resin` module's whole AST (lazy imports and import strings included), read
    without the module table: a runner package that is not under `src/` counts too."""
    bad = {
        str(path.relative_to(SRC)): hits
        for path in sorted((SRC / "resin").rglob("*.py"))
        if (hits := _names_outside_the_core(ast.parse(path.read_text())))
    }
    assert bad == {}


def test_entry_points_name_runner_families_in_runner_packages() -> None:
    """The `resin.runners` entry points (pyproject.toml) are string imports too: each names a
    module of a runner family, loaded by the application only."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    points = project["entry-points"]["resin.runners"]
    modules = _modules()
    for name, target in points.items():
        module = target.partition(":")[0]
        assert module in modules, (name, target)
        assert _top(module) in ("resin_models_torch", "resin_models_cuda"), (name, target)
    assert project["scripts"]["resin"].partition(":")[0] in modules


def test_the_checker_sees_violations() -> None:
    """The rules fire on made-up edges (so an empty result above means something)."""
    assert _violation(Edge("resin.cache.manager", "resin.engine.request", True, 1))
    assert _violation(Edge("resin.engine.engine", "resin.server.app", False, 1))
    assert _violation(Edge("resin.metrics.prometheus", "resin.engine.engine", False, 1))
    assert _violation(Edge("resin.metrics.prometheus", "resin.engine.engine", True, 1))
    assert _violation(Edge("resin_models_cuda.runner", "resin.engine.engine", False, 1))
    assert _violation(Edge("resin_models_cuda.runner", "resin_models_torch.layers", False, 1))
    assert _violation(Edge("resin_models_torch.runner", "resin_models_cuda.runner", True, 1))
    assert not _violation(Edge("resin_models_cuda.runner", "resin_model.config", False, 1))
    assert _violation(Edge("resin_model.config", "resin_models_torch.layers", False, 1))
    assert _violation(Edge("resin_model.family", "resin.engine", False, 1))
    assert _violation(Edge("resin.loading", "resin_models_torch.registry", False, 1, "string"))
    assert _violation(Edge("resin.backend.launch", "resin_app.worker", True, 1))
    assert _violation(Edge("resin_models_torch.family", "resin_app.runners", False, 1))
    assert not _violation(Edge("resin_app.loading", "resin.engine", False, 1))
    assert _violation(Edge("resin_app.check", "resin.server.app", False, 1))
    assert _violation(Edge("resin.cache.pool", "resin.server.app", False, 1))
    assert _violation(Edge("resin.frontend.actor", "resin.server.errors", False, 1))
    assert not _violation(Edge("resin.server.service", "resin.frontend.intake", False, 1))
    assert _violation(Edge("resin.frontend.actor", "resin.engine.engine", False, 1))
    assert _cycles([Edge("a", "b", False, 1), Edge("b", "a", True, 1)]) == [["a", "b"]]


def test_the_reader_sees_lazy_type_checking_and_string_imports(tmp_path: Path) -> None:
    source = """
import importlib
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from resin.engine import Engine
def f():
    from resin_models_torch import registry
    importlib.import_module("resin_app")
    return __import__("resin_model.config")
TABLE = {"x": "resin_models_cuda.models.llama:Llama", "y": "resin_app.worker"}
DOC = "see resin_app.cli for the command line"  # prose, not a module path
"""
    path = tmp_path / "probe.py"
    path.write_text(source)
    modules = {**_modules(), "resin.probe": path}
    edges = {(e.imported, e.type_checking, e.kind) for e in _edges("resin.probe", path, modules)}
    assert edges == {
        ("resin.engine", True, "import"),
        ("resin_models_torch.registry", False, "import"),
        ("resin_app", False, "string"),
        ("resin_model.config", False, "string"),
        ("resin_models_cuda.models.llama", False, "string"),
        ("resin_app.worker", False, "string"),
    }
    assert len(_names_outside_the_core(ast.parse(source))) == 5
