"""The sharded fast runner (`resin_models_cuda.parallel`) over two Gloo processes equals one
process: the Engine drives a `DistributedRunner` whose ranks each run a `CudaRunner` over
their shard (on CPU the kernels run in Triton's interpreter, float32), and greedy tokens and
every step's sampled logits match the unsharded fast runner's. A worker killed mid-run makes
the engine report the runner dead. The jobs run `parallel_scenario.py` (cases there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.backend.launcher import launch
from tests.cuda import parallel_scenario as scenario
from tests.models.dsv4_tiny import _CONFIG, randomized

pytestmark = pytest.mark.timeout(240)

SCRIPT = Path(scenario.__file__)
HAS_CUDA = torch.cuda.is_available()

# What rank 0 holds. Unsharded: 4 query heads per layer, 2 KV heads; Qwen3-MoE: 6 experts in
# layer 0 (layer 1 is dense); DeepSeek: layer 0 dense, 8 routed + 2 shared experts in layer 1,
# one latent per token; 301 embedding rows.
SHARDS = {
    "dense-tp": {"q_heads": [2, 2], "experts": [], "embed_rows": 151, "kv_heads": 1},
    "moe-tp-ep": {"q_heads": [2, 2], "experts": [3], "embed_rows": 151, "kv_heads": 1},
    "moe-ep": {"q_heads": [4, 4], "experts": [3], "embed_rows": 301, "kv_heads": 2},
    "moe-tp": {"q_heads": [2, 2], "experts": [6], "embed_rows": 151, "kv_heads": 1},
    "mla-tp-ep": {"q_heads": [2, 2], "experts": [6], "embed_rows": 151, "kv_heads": 1},
    # DeepSeek-V4: every head and vocabulary row, 2 of 4 routed experts + the shared one
    "v4-ep": {"q_heads": [4, 4], "experts": [3, 3], "embed_rows": 300, "kv_heads": 1},
    # GLM-5.3: every KDA / MLA head and vocabulary row, 3 of 6 routed experts + the shared one
    "glm5-ep": {"q_heads": [2, 4], "experts": [4], "embed_rows": 301, "kv_heads": 1},
}
# CPU CI time: one dense job and one MoE job (DeepSeek: MLA split by heads, experts spread,
# shared experts); every style runs where the kernels are compiled.
CASES = ["dense-tp", "mla-tp-ep", "v4-ep", "glm5-ep"]
CASES += ["moe-tp-ep", "moe-ep", "moe-tp"] if HAS_CUDA else []


@pytest.mark.parametrize("name", CASES)
def test_two_ranks_equal_one(name: str, tmp_path: Path) -> None:
    check_two_ranks(name, tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("name", ["dense-tp", "moe-tp-ep", "mla-tp-ep"])
def test_nccl_collectives_replay_inside_cuda_graphs(name: str, tmp_path: Path) -> None:
    """Two GPUs: the model group on NCCL and decode steps replayed from CUDA graphs that
    captured the all-reduces and the logits' all-gather; tokens as one GPU's graphs give."""
    check_two_ranks(name, tmp_path, {"RESIN_PARALLEL_NCCL": "1"})


def check_two_ranks(name: str, tmp_path: Path, env: dict[str, str] | None = None) -> None:
    """The job's leader's tokens and logits against one process's (same graphs setting)."""
    env, checkpoint = dict(env or {}), None
    if scenario.CASES[name].config is None:  # a checkpoint: written once, read by every rank
        checkpoint = str(tmp_path / "v4")
        randomized({**_CONFIG, **scenario.V4_TINY}, 0).save_pretrained(checkpoint)
        env["PARALLEL_CHECKPOINT"] = checkpoint
    job = launch(name, tmp_path, script=SCRIPT, wall=200.0, collective_timeout=60.0, env=env)
    assert job.returncodes == [0, 0], job.output
    sharded = torch.load(tmp_path / "result.pt")
    assert sharded["shards"] == SHARDS[name]  # the leader really holds only its part
    nccl = env.get("RESIN_PARALLEL_NCCL") == "1"
    single = scenario.runner(name, None, nccl, checkpoint)  # graphs as the job's ranks ran
    tokens = scenario.generate(single, name)
    assert sharded["tokens"] == tokens
    assert sorted(sharded["logits"]) == sorted(single.logits)
    sampled = [s for s, logits in single.logits.items() if logits.numel()]
    assert len(sampled) >= scenario.OUTPUT_TOKENS
    worst = max(float((sharded["logits"][s] - single.logits[s]).abs().max()) for s in sampled)
    # On a GPU the Triton kernels' fp32 dots round through TF32, whose error a split sum
    # changes: there the bound is relative to the largest logit.
    largest = max(float(single.logits[s].abs().max()) for s in sampled)
    assert worst < (1e-3 * largest if HAS_CUDA else 1e-4), f"{name}: logits differ by {worst}"


def test_killed_worker_makes_the_engine_report_the_runner_dead(tmp_path: Path) -> None:
    job = launch("killed", tmp_path, script=SCRIPT, wall=200.0, collective_timeout=60.0)
    assert job.returncodes[0] == 0, job.output
    report = json.loads((tmp_path / "result.json").read_text())
    assert sorted(report["finished"]) == sorted(report["requests"])
    assert set(report["finished"].values()) == {"error"}
    assert report["submit_raised"] is True
    assert any("runner died" in str(m) for m in report["errors"]), report
    assert float(report["seconds_to_death"]) < 30.0  # a lost peer is seen at once


@pytest.mark.skipif(
    HAS_CUDA and torch.cuda.device_count() < 2, reason="NCCL needs 2 CUDA GPUs for 2 ranks"
)
def test_resin_bench_tp_runs_the_fast_runner_shards(tmp_path: Path) -> None:
    """`resin bench tp --runner cuda --tensor-parallel 2` without torchrun: the leader starts a
    `resin worker --runner cuda`, and TP=2 and TP=1 rows of the fast runner come out (on CPU
    in Triton's interpreter, whose environment the worker inherits)."""
    import os
    import subprocess
    import sys

    from tests.backend.launcher import SRC

    output = tmp_path / "tp.jsonl"
    argv = ["--tensor-parallel", "2", "--runner", "cuda", "--preset", "tiny"]
    argv += ["--batch", "1", "--context", "8", "--decode-steps", "2", "--timeout", "60"]
    if not HAS_CUDA:
        argv += ["--device", "cpu", "--dtype", "float32"]
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "resin_app.cli", "bench", "tp", *argv, "--output", str(output)],
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [(r["tp"], r["runner"]) for r in rows] == [(2, "cuda"), (1, "cuda")]
    assert all(r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0 for r in rows)
