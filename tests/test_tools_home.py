"""Every benchmark has one home: a module of `resin_app/bench/` that `resin bench TOOL` runs,
named in the README; `scripts/` holds shell set-up only."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from resin_app.bench import TOOLS

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "src" / "resin_app" / "bench"
# helpers the tools share (kernel_census / kernel_table: `resin bench runner --kernels`)
SHARED = {"__init__", "runner_bench", "report", "plans", "kernel_census", "kernel_table"}


def test_every_tool_is_a_module_with_a_main_and_named_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    for name, tool in TOOLS.items():
        assert importlib.util.find_spec(tool.module) is not None, name
        source = (ROOT / "src" / (tool.module.replace(".", "/") + ".py")).read_text()
        assert "def main(argv" in source, f"{tool.module}: main(argv) runs it"
        assert f"`{name}`" in readme, f"the README does not name `resin bench {name}`"


def test_every_bench_module_is_a_tool_or_a_shared_helper() -> None:
    modules = {p.stem for p in BENCH.glob("*.py")}
    tools = {t.module.rsplit(".", 1)[1] for t in TOOLS.values()}
    assert modules - tools - SHARED == set()


def test_scripts_hold_shell_setup_only() -> None:
    assert sorted(p.suffix for p in (ROOT / "scripts").iterdir()) == [".sh"] * len(
        list((ROOT / "scripts").iterdir())
    )
