"""The import layers of `src/`, read from the source with `ast` (nothing is imported).

From the top down: `resin.cli` -> `resin.server` (HTTP) -> `resin.frontend` (the asyncio front
of an Engine) -> `resin.recipe` (+ tokenizer, detokenizer, media) and `resin.engine` ->
`resin.cache` -> contracts (`resin.plan`, `params`, `protocols`, `events`, `errors`,
`metrics`). Rules:
- no import cycle between modules (lazy and `TYPE_CHECKING` imports count too);
- nothing imports a higher layer; `resin.engine` imports neither the server nor recipes;
  the server and the frontend import neither `resin.engine` nor `resin.cache` (they drive
  any `EngineLike`; the engine's types are contracts);
  `resin.cache` never imports the engine; `resin.metrics` imports the engine only under
  `if TYPE_CHECKING`;
- runner packages (`resin_models_torch`, `resin_models_cuda`) import from `resin` only the
  contract modules, and each other only through the shared model-description module.
A known violation goes in `ALLOWED` with a one-line reason; anything new fails.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

CONTRACTS = ("resin.plan", "resin.params", "resin.protocols", "resin.events", "resin.errors")
RUNNER_PACKAGES = ("resin_models_torch", "resin_models_cuda")
SHARED_MODEL_DESCRIPTION = (
    "resin_models_torch.config",
    "resin_models_torch.hf_config",  # config.json -> ModelConfig (with hf_reader)
    "resin_models_torch.hf_reader",
    "resin_models_torch.architectures",
    "resin_models_torch.constraints",  # plain-torch mask + bias, applied by both runner families
    "resin_models_torch.penalties",  # token counts for penalties (+ the reference rule), both
    "resin_models_torch.verify",  # speculative acceptance rule (draft_layout + accept), both
    "resin_models_torch.routing",  # DeepSeek's expert routing rule, both
    "resin_models_torch.checkpoint_names",  # checkpoint tensor names -> model names, both
    "resin_models_torch.media_cache",  # image features by content hash, both
    "resin_models_torch.gemma3_encoder",  # Gemma 3's SigLIP tower + projector (eager), both
)
"""The one module both runner families may share (the typed model description)."""

LAYERS: tuple[tuple[str, int], ...] = (
    ("resin.cli", 6),
    ("resin.server", 5),
    ("resin.frontend", 4),
    ("resin.engine", 3),
    ("resin.recipe", 3),
    ("resin.tokenizer", 2),
    ("resin.generation_config", 2),
    ("resin.detokenizer", 2),
    ("resin.media", 2),
    ("resin.cache", 2),
    ("resin.metrics", 1),
    *((c, 0) for c in CONTRACTS),
)
"""Module prefix -> layer; a module may import its own layer or lower ones. The package
`resin` itself (its `__init__`, the public API) sits on top with the CLI."""

ALLOWED: dict[tuple[str, str], str] = {
    # (importer, imported): reason. Empty today; the server helper clears server entries.
}


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    type_checking: bool
    line: int


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in SRC.rglob("*.py")}


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


def _edges(module: str, path: Path, modules: dict[str, Path]) -> list[Edge]:
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    edges: list[Edge] = []

    def visit(node: ast.AST, type_checking: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_checking)
            return
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    pkg = pkg.rpartition(".")[0]
                base = f"{pkg}.{base}" if base else pkg
            # `from pkg import sub` imports the module `pkg.sub` when there is one.
            targets = [f"{base}.{a.name}" for a in node.names]
        for target in targets:
            resolved = _resolve(target, modules)
            if resolved is not None and resolved != module:
                edges.append(Edge(module, resolved, type_checking, getattr(node, "lineno", 0)))
        for sub in ast.iter_child_nodes(node):
            visit(sub, type_checking)

    visit(tree, False)
    return edges


def _all_edges() -> list[Edge]:
    modules = _modules()
    return [e for m, p in sorted(modules.items()) for e in _edges(m, p, modules)]


def _layer(module: str) -> int | None:
    if module == "resin":
        return 6
    for prefix, layer in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return None


def _under(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _violation(e: Edge) -> str | None:
    a, b = e.importer, e.imported
    if _under(a, "resin.engine") and _under(b, "resin.server", "resin.recipe"):
        return "the engine imports the server or a recipe"
    if _under(a, "resin.server", "resin.frontend") and _under(b, "resin.engine", "resin.cache"):
        return "the server or the frontend reaches into the engine (it drives any EngineLike)"
    if _under(a, "resin.cache") and _under(b, "resin.engine"):
        return "the cache imports the engine"
    if _under(a, "resin.metrics") and _under(b, "resin.engine") and not e.type_checking:
        return "metrics import the engine outside TYPE_CHECKING"
    if _under(a, *RUNNER_PACKAGES):
        own = a.split(".")[0]
        if _under(b, "resin") and not _under(b, *CONTRACTS):
            return "a runner package imports more of resin than the contracts"
        other = [p for p in RUNNER_PACKAGES if p != own]
        if _under(b, *other) and b not in SHARED_MODEL_DESCRIPTION:
            return "runner packages import each other beyond the shared model description"
        return None
    la, lb = _layer(a), _layer(b)
    if la is not None and lb is not None and lb > la and not e.type_checking:
        return f"upward import (layer {la} -> {lb})"
    return None


def _cycles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.importer, set()).add(e.imported)
        graph.setdefault(e.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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


def test_no_import_cycles() -> None:
    edges = [e for e in _all_edges() if not _is_package_init_edge(e)]
    edges = [e for e in edges if (e.importer, e.imported) not in ALLOWED]
    assert _cycles(edges) == []


def test_no_upward_or_forbidden_imports() -> None:
    bad = [
        f"{e.importer} -> {e.imported} (line {e.line}): {why}"
        for e in _all_edges()
        if (why := _violation(e)) is not None and (e.importer, e.imported) not in ALLOWED
    ]
    assert bad == []


def test_allow_list_has_no_stale_entries() -> None:
    edges = {(e.importer, e.imported) for e in _all_edges()}
    assert [k for k in ALLOWED if k not in edges] == []


def test_the_checker_sees_violations() -> None:
    """The rules fire on made-up edges (so an empty result above means something)."""
    assert _violation(Edge("resin.cache.manager", "resin.engine.request", True, 1))
    assert _violation(Edge("resin.engine.engine", "resin.server.app", False, 1))
    assert _violation(Edge("resin.metrics.prometheus", "resin.engine.engine", False, 1))
    assert not _violation(Edge("resin.metrics.prometheus", "resin.engine.engine", True, 1))
    assert _violation(Edge("resin_models_cuda.runner", "resin.engine.engine", False, 1))
    assert _violation(Edge("resin_models_cuda.runner", "resin_models_torch.layers", False, 1))
    assert not _violation(Edge("resin_models_cuda.runner", "resin_models_torch.config", False, 1))
    assert _violation(Edge("resin.cache.pool", "resin.server.app", False, 1))
    assert _violation(Edge("resin.frontend.actor", "resin.server.errors", False, 1))
    assert not _violation(Edge("resin.server.service", "resin.frontend.intake", False, 1))
    assert _violation(Edge("resin.frontend.actor", "resin.engine.engine", False, 1))
    assert _cycles([Edge("a", "b", False, 1), Edge("b", "a", True, 1)]) == [["a", "b"]]


def test_the_server_stays_thin_and_no_file_grows_past_350_lines() -> None:
    """Issue 12's house rules: `server/` holds at most 3,200 lines, no file in `src/` over 350."""
    server = sum(len(p.read_text().splitlines()) for p in (SRC / "resin" / "server").glob("*.py"))
    assert server <= 3200, f"src/resin/server/ has {server} lines"
    long = {
        str(p.relative_to(SRC)): n
        for p in SRC.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 350
    }
    assert not long, f"files over 350 lines: {long}"
