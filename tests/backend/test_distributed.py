"""Two-process Gloo tests of tensor / expert parallelism and the coordinator (CPU, fp32).

Each job runs `scenario.py` on ranks 0 and 1 (see `launcher.py`): both build the same random
tiny model and shard it; rank 0 drives a real Engine through a `DistributedRunner`. This
process runs the same Engine over the unsharded model and compares: greedy tokens equal, the
logits of every computed position within 1e-5.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from cases import CASES, ENGINE_KWARGS, RUNNER_KWARGS, SEED, prompts
from launcher import launch, run_single

from resin import Engine, SamplingParams
from resin_models_torch.registry import random_runner

pytestmark = pytest.mark.timeout(120)


def _unsharded(name: str, device: str = "cpu") -> tuple[list[list[int]], dict[int, torch.Tensor]]:
    runner = random_runner(CASES[name].config, SEED, device=device, **RUNNER_KWARGS)
    runner.record_logits = True
    params = SamplingParams(max_output_tokens=12, temperature=0.0)
    # Step by step like the sharded leader (a DistributedRunner does not overlap), so the
    # step ids of the recorded logits line up.
    with Engine(runner, overlap=False, **ENGINE_KWARGS) as engine:
        requests = [engine.submit(p, params) for p in prompts()]
        while engine.has_work():
            engine.step()
    steps = {r.step_id: r.logits for r in runner.recorded if r.logits is not None}
    return [r.take_result() for r in requests], steps


# What rank 0 holds: query-projection rows per layer (4 heads x 16 = 64 unsharded), experts per
# MoE layer (6 unsharded; layer 1 is dense) and gate rows of each (32 unsharded), embedding
# rows (301 unsharded; shards of 151).
_DENSE: dict[str, list[int]] = {"experts": [], "expert_rows": []}
SHARDS = {
    "llama-tp": {"q_rows": [32, 32], **_DENSE, "embed_rows": 151},
    "qwen2-tied-tp": {"q_rows": [32, 32], **_DENSE, "embed_rows": 151},
    "moe-tp": {"q_rows": [32, 32], "experts": [6], "expert_rows": [16], "embed_rows": 151},
    "moe-ep": {"q_rows": [64, 64], "experts": [3], "expert_rows": [32], "embed_rows": 301},
    "moe-tp-ep": {"q_rows": [32, 32], "experts": [3], "expert_rows": [32], "embed_rows": 151},
}
EQUIVALENCE_CASES = ["llama-tp", "qwen2-tied-tp", "moe-tp", "moe-ep", "moe-tp-ep"]


@pytest.mark.parametrize("name", EQUIVALENCE_CASES)
def test_sharded_engine_equals_unsharded(name: str, tmp_path: Path) -> None:
    check_equivalence(name, tmp_path, "cpu")


def check_equivalence(name: str, tmp_path: Path, device: str) -> None:
    job = launch(name, tmp_path, env={"RESIN_TEST_DEVICE": device})
    assert job.returncodes == [0, 0], job.output
    sharded = torch.load(tmp_path / "result.pt")
    tokens, logits = _unsharded(name, device)
    assert sharded["shards"] == SHARDS[name]  # the leader really holds only its part
    assert sharded["tokens"] == tokens
    assert sorted(sharded["logits"]) == sorted(logits)
    worst = max(float((sharded["logits"][s] - logits[s].cpu()).abs().max()) for s in logits)
    assert worst < 1e-5, f"{name}: logits differ by {worst}"


def _dead_report(name: str, tmp_path: Path, collective_timeout: float) -> dict[str, Any]:
    job = launch(name, tmp_path, collective_timeout=collective_timeout)
    assert job.returncodes[0] == 0, job.output
    report: dict[str, Any] = json.loads((tmp_path / "result.json").read_text())
    finished = report["finished"]
    assert sorted(finished) == sorted(str(i) for i in report["requests"])
    assert set(finished.values()) == {"error"}
    assert report["submit_raised"] is True
    assert any("runner died" in str(m) for m in report["errors"]), report
    return report


def test_killed_worker_kills_the_engine_not_the_process(tmp_path: Path) -> None:
    report = _dead_report("killed", tmp_path, collective_timeout=30.0)
    assert float(report["seconds_to_death"]) < 10.0  # a lost peer is seen at once, not at timeout


def test_hung_worker_hits_the_collective_timeout(tmp_path: Path) -> None:
    report = _dead_report("hung", tmp_path, collective_timeout=3.0)
    assert 2.0 < float(report["seconds_to_death"]) < 20.0


def test_server_answers_503_once_a_worker_died(tmp_path: Path) -> None:
    job = launch("server", tmp_path)
    assert job.returncodes[0] == 0, job.output
    statuses = json.loads((tmp_path / "result.json").read_text())["statuses"]
    first, second, third = statuses
    assert first[0] == 200, statuses  # the tensor-parallel engine serves
    assert 1 <= first[1]["usage"]["completion_tokens"] <= 4
    assert second[0] == 503, statuses  # the request in flight when the worker died
    assert third[0] in (503, None), statuses  # refused, or the listener already stopped


def test_a_leader_spawns_its_own_resin_worker(tmp_path: Path) -> None:
    job = run_single("spawned", tmp_path)
    assert job.returncodes == [0], job.output
    report = json.loads((tmp_path / "result.json").read_text())
    assert report["worker_codes"] == [0]  # the worker left cleanly when the leader closed
    assert report["tokens"] == _unsharded("llama-tp")[0]


def test_one_leader_spawns_and_leads_two_tensor_parallel_replicas(tmp_path: Path) -> None:
    """`spawn_local(data_parallel=2)`: one process leads two TP=2 groups (three processes in
    all) and drives both engines at once; each gives the unsharded greedy tokens."""
    job = run_single("spawned-dp2", tmp_path)
    assert job.returncodes == [0], job.output
    report = json.loads((tmp_path / "result.json").read_text())
    assert report["worker_codes"] == [0, 0]
    want = _unsharded("llama-tp")[0]
    assert report["replica_tokens"] == [want, want]


def test_heartbeats_keep_idle_workers_alive(tmp_path: Path) -> None:
    # The engine idles for 2.5x the collective timeout between two requests.
    job = launch("idle", tmp_path, collective_timeout=2.0)
    assert job.returncodes == [0, 0], job.output
    tokens = json.loads((tmp_path / "result.json").read_text())["tokens"]
    assert [len(t) for t in tokens] == [6, 6]


def test_workers_exit_when_the_leader_crashes(tmp_path: Path) -> None:
    start = time.monotonic()
    job = launch("leader-crash", tmp_path, collective_timeout=5.0, wall=60.0)
    assert job.returncodes == [3, 1], job.output  # the worker stops with an error, not a hang
    assert time.monotonic() - start < 45.0


def test_resin_bench_tensor_parallel_starts_its_own_workers(tmp_path: Path) -> None:
    """`resin bench tp --tensor-parallel 2` without torchrun: TP=2 and TP=1 rows in one run."""
    import os
    import subprocess
    import sys

    from launcher import SRC

    output = tmp_path / "tp.jsonl"
    argv = ["--tensor-parallel", "2", "--preset", "tiny", "--device", "cpu", "--dtype", "float32"]
    argv += ["--batch", "1", "2", "--context", "16", "--decode-steps", "3", "--timeout", "30"]
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "resin_app.cli", "bench", "tp", *argv, "--output", str(output)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [(r["tp"], r["batch"]) for r in rows] == [(2, 1), (2, 2), (1, 1), (1, 2)]
    assert all(r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0 for r in rows)
    assert "decode TP=2 / TP=1" in done.stdout
