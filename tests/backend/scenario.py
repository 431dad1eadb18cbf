"""One rank of a 2-process Gloo job for tests/backend (run by `launcher.launch`, never by pytest).

`python scenario.py NAME OUT_DIR`: every rank builds the same random tiny model, shards it for
the scenario and joins through `start_tensor_parallel`; the leader drives a real Engine and
writes what it saw to OUT_DIR (the test compares it with an unsharded run in its own process).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # `tests.server.doubles`

from cases import CASES, DEVICE, ENGINE_KWARGS, RUNNER_KWARGS, SEED, prompts

from resin import Engine, EngineDeadError, ErrorEvent, FinishedEvent, SamplingParams
from resin.backend.distributed import DistributedRunner
from resin.backend.launch import start_tensor_parallel
from resin.backend.topology import ProcessGroups, shutdown
from resin_models_torch.layers import GatedMLP, SparseMoe
from resin_models_torch.llama import LlamaAttention
from resin_models_torch.parallel import ExpertParallelMoe, shard_model
from resin_models_torch.registry import random_runner
from resin_models_torch.runner import TorchRunner

torch.set_num_threads(1)
RECORDING = ("llama-tp", "qwen2-tied-tp", "moe-tp", "moe-ep", "moe-tp-ep")  # run_to_end cases


def build(name: str, groups: ProcessGroups) -> TorchRunner:
    case = CASES[name]
    model = random_runner(case.config, SEED, device=groups.device).model
    runner = TorchRunner(shard_model(model, groups.model, case.style), **RUNNER_KWARGS)
    # Every rank must take the same code path (the LM head's all-gather sees every row).
    runner.record_logits = name in RECORDING
    return runner


def run_to_end(runner: DistributedRunner, out: Path) -> None:
    """Greedy generation for every prompt; the leader records its (gathered) logits."""
    params = SamplingParams(max_output_tokens=12, temperature=0.0)
    with Engine(runner, **ENGINE_KWARGS) as engine:
        requests = [engine.submit(p, params) for p in prompts()]
        while engine.has_work():
            engine.step()
    assert isinstance(runner.local, TorchRunner)
    steps = {r.step_id: r.logits for r in runner.local.recorded}
    model = runner.local.model
    shards = {  # what this rank really holds, so a test can tell sharded from replicated
        "q_rows": [m.q_proj.out_features for m in model.modules() if isinstance(m, LlamaAttention)],
        "experts": [
            len(m.experts) for m in model.modules() if isinstance(m, SparseMoe | ExpertParallelMoe)
        ],
        "expert_rows": [
            _gate_rows(m) for m in model.modules() if isinstance(m, SparseMoe | ExpertParallelMoe)
        ],
        "embed_rows": int(model.model.embed_tokens.weight.shape[0]),
    }
    result = {"tokens": [r.take_result() for r in requests], "logits": steps, "shards": shards}
    torch.save(result, out / "result.pt")


def _gate_rows(moe: SparseMoe | ExpertParallelMoe) -> int:
    expert = moe.experts[0]
    assert isinstance(expert, GatedMLP)
    return expert.gate_proj.out_features


def run_until_peer_fails(runner: DistributedRunner, out: Path, fault: signal.Signals) -> None:
    """Run a few steps, hit the worker with `fault`, then keep stepping until the engine dies."""
    peer = int(os.environ["PEER_PID"])
    params = SamplingParams(max_output_tokens=40, temperature=0.0)
    events: list[object] = []
    with Engine(runner, **ENGINE_KWARGS) as engine:
        requests = [engine.submit(p, params) for p in prompts()]
        for _ in range(3):
            events += engine.step()
        os.kill(peer, fault)
        start = time.monotonic()
        while engine.has_work():
            events += engine.step()
        seconds = time.monotonic() - start
        try:
            engine.submit([1, 2, 3], params)
            submit_raised = False
        except EngineDeadError:
            submit_raised = True
    finished = {e.request_id: e.reason.value for e in events if isinstance(e, FinishedEvent)}
    errors = [e.message for e in events if isinstance(e, ErrorEvent)]
    report = {
        "requests": [r.id for r in requests],
        "finished": {str(k): v for k, v in finished.items()},
        "errors": errors,
        "seconds_to_death": seconds,
        "submit_raised": submit_raised,
    }
    (out / "result.json").write_text(json.dumps(report))
    if fault is signal.SIGSTOP:
        os.kill(peer, signal.SIGKILL)


def serve_until_peer_dies(runner: DistributedRunner, out: Path) -> None:
    """The real HTTP server over the distributed engine: one answer, then the worker is killed."""
    from resin.server import HttpServer
    from resin.server.launch import free_port, running
    from tests.server.doubles import ByteTokenizer, ChatMLFormat

    tok = ByteTokenizer()
    engine = Engine(runner, **ENGINE_KWARGS)
    server = HttpServer(engine, ChatMLFormat(tok), tokenizer=tok, model="tp2", port=free_port())
    statuses: list[object] = []
    with running(server) as url:
        statuses.append(_chat(url, max_tokens=4))
        os.kill(int(os.environ["PEER_PID"]), signal.SIGKILL)
        statuses.append(_chat(url, max_tokens=8))
        statuses.append(_chat(url, max_tokens=8))
    engine.close()
    (out / "result.json").write_text(json.dumps({"statuses": statuses}))


def _chat(url: str, max_tokens: int) -> list[object]:
    """[HTTP status, body] of one non-streaming chat completion (None, error if refused)."""
    import urllib.error
    import urllib.request

    body = {
        "model": "tp2",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return [response.status, json.loads(response.read())]
    except urllib.error.HTTPError as exc:
        return [exc.code, json.loads(exc.read() or b"{}")]
    except (urllib.error.URLError, ConnectionError) as exc:
        return [None, str(exc)]


def spawned(out: Path, timeout_s: float, replicas: int = 1) -> None:
    """A single process that starts its own workers (`resin worker`) and leads them: one
    worker per replica; with several replicas, their engines run at once on two threads."""
    from resin.backend.launch import spawn_local
    from resin_app.worker import worker_command

    case = CASES["llama-tp"]
    config = out / "config.json"
    config.write_text(json.dumps(case.config))
    worker_args = ["--config-json", str(config), "--seed", str(SEED), "--device", "cpu"]
    worker_args += ["--dtype", "float32", "--page-size", str(RUNNER_KWARGS["page_size"])]

    def build(groups: ProcessGroups) -> TorchRunner:
        model = random_runner(case.config, SEED).model
        return TorchRunner(shard_model(model, groups.model, case.style), **RUNNER_KWARGS)

    job = spawn_local(
        build,
        worker_command(*worker_args),
        tensor_parallel=2,
        data_parallel=replicas,
        timeout=timedelta(seconds=timeout_s),
        device="cpu",
    )
    params = SamplingParams(max_output_tokens=12, temperature=0.0)
    tokens: list[list[list[int]]] = [[] for _ in job.runners]

    def run(i: int) -> None:
        with Engine(job.runners[i], **ENGINE_KWARGS) as engine:
            requests = [engine.submit(p, params) for p in prompts()]
            while engine.has_work():
                engine.step()
        tokens[i] = [r.take_result() for r in requests]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(replicas)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = job.wait()
    report = {"tokens": tokens[0], "replica_tokens": tokens, "worker_codes": codes}
    (out / "result.json").write_text(json.dumps(report))
    shutdown()


def idle_then_run(runner: DistributedRunner, out: Path, idle_s: float) -> None:
    """One request, a quiet spell longer than the collective timeout, then another one."""
    params = SamplingParams(max_output_tokens=6, temperature=0.0)
    first, second = prompts()[:2]
    with Engine(runner, **ENGINE_KWARGS) as engine:
        requests = [engine.submit(first, params)]
        while engine.has_work():
            engine.step()
        time.sleep(idle_s)
        requests.append(engine.submit(second, params))
        while engine.has_work():
            engine.step()
    report = {"tokens": [r.take_result() for r in requests]}
    (out / "result.json").write_text(json.dumps(report))


def crash_after_two_steps(runner: DistributedRunner) -> None:
    params = SamplingParams(max_output_tokens=40, temperature=0.0)
    engine = Engine(runner, **ENGINE_KWARGS)
    for p in prompts():
        engine.submit(p, params)
    engine.step()
    engine.step()
    os._exit(3)  # no close, no goodbye: the workers must notice on their own


def main(name: str, out: Path, timeout_s: float) -> None:
    if name.startswith("spawned"):  # "spawned", "spawned-dp2"
        spawned(out, timeout_s, replicas=int(name.partition("-dp")[2] or 1))
        return
    runner = start_tensor_parallel(
        lambda groups: build(name, groups),
        device=None if DEVICE == "cuda" else "cpu",  # cuda: rank r on cuda:r
        timeout=timedelta(seconds=timeout_s),
        capacity=CASES[name].capacity,
    )
    if runner is None:  # a worker: the leader closed the runner
        # Leave at once, as `resin worker` does: interpreter teardown runs Gloo's destructors,
        # which can abort the process (SIGABRT) once the leader's side of the sockets is gone.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    if name == "killed":
        run_until_peer_fails(runner, out, signal.SIGKILL)
    elif name == "hung":
        run_until_peer_fails(runner, out, signal.SIGSTOP)
    elif name == "idle":
        idle_then_run(runner, out, idle_s=2.5 * timeout_s)
    elif name == "leader-crash":
        crash_after_two_steps(runner)
    elif name == "server":
        serve_until_peer_dies(runner, out)
    else:
        run_to_end(runner, out)
    shutdown()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), float(sys.argv[3]))
