"""The README's engine example and one-method runner run exactly as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_engine_example_runs_with_the_readme_runner() -> None:
    blocks = _python_blocks()
    engine_block = next(b for b in blocks if "Engine(runner" in b)
    runner_block = next(b for b in blocks if "class Runner" in b)
    namespace: dict[str, object] = {}
    exec(compile(runner_block, "README:runner", "exec"), namespace)
    namespace["runner"] = namespace["Runner"]()  # type: ignore[operator]
    namespace["eos"] = 2
    exec(compile(engine_block, "README:engine", "exec"), namespace)
    # The README runner always answers token 0; eos=2 never comes, so 8 tokens of 0.
    assert namespace["generated_ids"] == [0] * 8


def test_readme_runner_stops_on_eos_zero() -> None:
    blocks = _python_blocks()
    namespace: dict[str, object] = {}
    exec(
        compile(next(b for b in blocks if "class Runner" in b), "README:runner", "exec"), namespace
    )
    namespace["runner"] = namespace["Runner"]()  # type: ignore[operator]
    namespace["eos"] = 0
    exec(
        compile(next(b for b in blocks if "Engine(runner" in b), "README:engine", "exec"), namespace
    )
    assert namespace["generated_ids"] == [0]
