"""Programmatic dependent launch (`kernels/pdl.py`): the rule that keeps it correct (every
runner kernel waits for its predecessor before it touches memory, every launch passes the
switch), what the compiler makes of it for sm_90, that it stays off where it cannot run, and on
a GPU that a model decodes the same logits with it as without, through CUDA graphs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from resin.plan import Phase
from resin_models_cuda.kernels import pdl
from tests.cuda.sm90 import compile_sm90

KERNELS = Path(pdl.__file__).parent


def _launched_kernels() -> list[tuple[Path, ast.FunctionDef]]:
    """Each `@triton.jit` function of kernels/ that some launcher there launches (`k[grid](..)`)."""
    trees = {p: ast.parse(p.read_text()) for p in sorted(KERNELS.glob("*.py"))}
    launched = {
        node.func.value.id
        for tree in trees.values()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Subscript)
        and isinstance(node.func.value, ast.Name)
    }
    return [
        (path, fn)
        for path, tree in trees.items()
        for fn in tree.body
        if isinstance(fn, ast.FunctionDef) and fn.name in launched
    ]


def test_every_runner_kernel_waits_before_it_touches_memory() -> None:
    kernels = _launched_kernels()
    assert len(kernels) >= 35  # the walk found the kernels (41 when this was written)
    for path, fn in kernels:
        where = f"{path.name}:{fn.name}"
        assert "PDL" in [a.arg for a in fn.args.args], f"{where} takes no PDL constexpr"
        first = fn.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            first = fn.body[1]  # past the docstring
        assert (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Call)
            and ast.unparse(first.value) == "pdl_enter(PDL)"
        ), f"{where}: the first statement must be pdl_enter(PDL)"


def test_every_launch_passes_the_switch() -> None:
    names = {fn.name for _, fn in _launched_kernels()}
    launches = 0
    for path in sorted(KERNELS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Subscript)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in names
            ):
                launches += 1
                spread = [ast.unparse(k.value) for k in node.keywords if k.arg is None]
                assert "pdl_args()" in spread, f"{path.name}:{node.lineno} launches without it"
    assert launches >= len(names)


def _ptx(pdl_on: bool) -> tuple[str, bool]:
    """The rmsnorm kernel (residual add) compiled for sm_90 with PDL on or off."""
    signature = {"x_ptr": "*bf16", "res_ptr": "*bf16", "w_ptr": "*bf16", "wx_ptr": "*bf16",
                 "out_ptr": "*bf16", "stride_x": "i32", "stride_r": "i32", "stride_o": "i32",
                 "eps": "fp32"}  # fmt: skip
    constexprs = {"H": 4096, "BLOCK": 4096, "HAS_RESIDUAL": True, "NORM_INPUT": False,
                  "UNIT_OFFSET": False, "PDL": pdl_on}  # fmt: skip
    return compile_sm90("resin_models_cuda.kernels.rmsnorm", "_rmsnorm_kernel", signature,
                        constexprs, launch_pdl=pdl_on)  # fmt: skip


def test_compiled_for_sm90_the_wait_comes_before_the_first_load() -> None:
    ptx, launch_pdl = _ptx(True)
    memory = re.search(r"\b(ld|st)\.global", ptx)
    wait = ptx.find("griddepcontrol.wait")
    assert launch_pdl and memory and 0 <= wait < memory.start()
    assert wait < ptx.find("griddepcontrol.launch_dependents")
    ptx, launch_pdl = _ptx(False)
    assert not launch_pdl and "griddepcontrol" not in ptx


def test_pdl_stays_off_where_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from resin_model.presets import preset
    from resin_models_cuda.options import RunnerOptions
    from resin_models_cuda.runner import random_runner

    monkeypatch.setenv("RESIN_PDL", "1")
    assert RunnerOptions().pdl and not RunnerOptions(pdl=False).pdl
    monkeypatch.delenv("RESIN_PDL")
    assert not RunnerOptions().pdl
    runner = random_runner(preset("tiny"), RunnerOptions(pdl=True), "cpu", torch.float32)
    assert not runner.pdl and pdl.pdl_args() == {"PDL": False, "launch_pdl": False}
    assert not pdl.set_pdl(True, torch.device("cpu"))


def _decode_logits(name: str, on: bool, device: str = "cuda") -> torch.Tensor:
    """Logits [steps, B, V] of a prefill then 6 decode steps (graph replays) of a random model
    built with PDL on or off; the same seed, so the same weights and prompts."""
    from resin.protocols import CacheLayout
    from resin_app.bench.plans import PagedPlanner
    from resin_model.presets import preset
    from resin_models_cuda.options import RunnerOptions
    from resin_models_cuda.runner import random_runner

    options = RunnerOptions(max_batch=8, max_context=256, keep_logits=True, pdl=on)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    runner = random_runner(preset(name), options, device, dtype, seed=3)
    assert runner.pdl == on
    rc = runner.runner_config
    pages = 64 * len(rc.cache_groups)
    states = sum(g.state_region for g in rc.cache_groups) * 8
    runner.bind(CacheLayout(pages, 16, rc.page_bytes, rc.cache_groups, states,
                            rc.state_page_bytes))  # fmt: skip
    planner = PagedPlanner(pages, 16, specs=rc.cache_groups, max_rows=8)
    gen = torch.Generator().manual_seed(1)
    # 40 prompt tokens, then 6 more fed one a step (teacher-forced: the same in both runs)
    seqs = [planner.new_sequence(torch.randint(0, 200, (46,), generator=gen).tolist())
            for _ in range(5)]  # fmt: skip
    rows = [(s, 40) for s in seqs]
    runner.forward(planner.plan(rows, Phase.PREFILL))
    planner.commit(rows)
    out = []
    for _ in range(6):
        rows = [(s, 1) for s in seqs]
        runner.forward(planner.plan(rows, Phase.DECODE))
        planner.commit(rows)
        assert runner.last_logits is not None
        out.append(runner.last_logits.float().cpu())
    runner.close()
    return torch.stack(out)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name",
    [
        "tiny",
        "tiny-qwen3_moe",
        "tiny-gpt_oss",
        "tiny-qwen3_5_moe",
        "tiny-deepseek",
        "tiny-deepseek_v4",
    ],
)
def test_pdl_decodes_the_same_logits_gpu(name: str) -> None:
    if not torch.cuda.is_available() or not pdl.pdl_supported(torch.device("cuda")):
        pytest.skip("needs a CUDA device of sm_90 or later")
    try:
        on = _decode_logits(name, True)
    finally:
        pdl.set_pdl(False, torch.device("cuda"))
    off = _decode_logits(name, False)
    # The same kernels in the same order: bit for bit, PDL only moves when they start.
    assert torch.equal(on, off)
