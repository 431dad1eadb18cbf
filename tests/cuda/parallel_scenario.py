"""One rank of a 2-process Gloo job of the sharded fast runner (run by
`tests/backend/launcher.launch`, never by pytest), and the cases `test_parallel.py` shares.

`python parallel_scenario.py NAME OUT_DIR TIMEOUT`: every rank builds the same random tiny
fast model, `resin_models_cuda.parallel.shard_model` cuts its shard, and the ranks join through
`start_tensor_parallel`; the leader drives a real Engine and writes what it saw to OUT_DIR.
Without CUDA the kernels run in Triton's interpreter (`tests/cuda/conftest.py` sets it up).
"""

# ruff: noqa: E402  (run as a script, the interpreter is set up before torch and the kernels)
from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    import tests.cuda.conftest  # noqa: F401  (the interpreter, before any kernel is defined)

import torch
import torch.distributed as dist

from resin import Engine, EngineDeadError, ErrorEvent, FinishedEvent, SamplingParams
from resin.plan import BatchPlan, ForwardOutput
from resin.protocols import CacheLayout, RunnerConfig
from resin_model.hf_config import parse_config
from resin_model.presets import preset_hf
from resin_models_cuda import CudaRunner, RunnerOptions, build_model
from resin_models_cuda.layers import RandomWeights
from resin_models_cuda.layers.parallel import ParallelMoE
from resin_models_cuda.parallel import ParallelStyle, moe_cutter, shard_model
from resin_models_cuda.runner import load_model

SEED = 5
# With CUDA both ranks run on cuda:0 over Gloo (NCCL refuses two ranks on one device): the
# one-GPU proof of the sharded math. Without it, the CPU and Triton's interpreter.
# `RESIN_PARALLEL_NCCL=1` (2 GPUs): rank r on cuda:r over NCCL, decode steps in CUDA graphs
# that hold the collectives (the unsharded side captures graphs too).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NCCL = os.environ.get("RESIN_PARALLEL_NCCL") == "1"
OPTIONS = RunnerOptions(
    page_size=4, max_batch=8, max_context=64, num_pages=64, cuda_graphs=NCCL, keep_logits=True
)
ENGINE_KWARGS: dict[str, Any] = {
    "context_length": 64,
    "prefix_cache": True,
    "prefill_chunk_tokens": 8,
    "max_batch_tokens": 16,
    "overlap": False,
}
OUTPUT_TOKENS = 4

_COMMON: dict[str, Any] = {
    "vocab_size": 301,  # odd: the last vocabulary shard is one row short
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 2,
    "max_position_embeddings": 256,
}
LLAMA: dict[str, Any] = {**_COMMON, "model_type": "llama"}
QWEN3_MOE: dict[str, Any] = {
    **_COMMON,
    "model_type": "qwen3_moe",
    "tie_word_embeddings": True,  # embedding and LM head: one vocabulary shard
    "moe_intermediate_size": 32,
    "num_experts": 6,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "mlp_only_layers": [1],
}
# DeepSeek-V2-Lite's structure: MLA without q LoRA, a dense first layer, then 8 routed experts
# and 2 shared ones (folded into the stack; rank 0 holds them under expert parallelism).
DEEPSEEK: dict[str, Any] = {
    **preset_hf("tiny-deepseek"),
    "vocab_size": 301,
    "tie_word_embeddings": True,  # embedding and LM head: one vocabulary shard
}


# DeepSeek-V4 (`V4_TINY`, a checkpoint of `tests/models/dsv4_tiny.py`'s: a sliding layer
# hash-routed by a random token table, then a CSA layer; 4 routed experts, top-2, one shared):
# attention, mHC and the vocabulary replicated, the experts spread. The expert GEMV up to 8
# pairs, so rank 0 (3 pairs a token) and rank 1 (2) run both MoE paths.
V4_TINY: dict[str, Any] = {"num_hidden_layers": 2, "compress_ratios": [0, 4]}
V4_OPTIONS = replace(OPTIONS, page_size=16, max_draft_tokens=0, moe_gemv_max_pairs=8)

# GLM-5.3 (KDA, then indexed MLA; layer 0 dense, layer 1 6 routed experts, top-2, one shared):
# the mixers, mHC and the vocabulary replicated, the experts spread.
GLM5: dict[str, Any] = {
    **preset_hf("tiny-glm5_next"), "vocab_size": 301, "num_hidden_layers": 2,
    "layer_types": ["linear_attention", "indexed_attention"],
    "mlp_layer_types": ["dense", "sparse"],
}  # fmt: skip
GLM5_OPTIONS = replace(OPTIONS, page_size=16)


@dataclass(frozen=True)
class Case:
    config: dict[str, Any] | None  # None: a checkpoint folder (`runner`)
    style: ParallelStyle
    options: RunnerOptions = OPTIONS
    vocab: int = 301
    cut_while_loading: bool = False  # MoE layers cut as built (`moe_cutter`), not afterwards


CASES: dict[str, Case] = {
    "dense-tp": Case(LLAMA, ParallelStyle()),
    "moe-tp-ep": Case(QWEN3_MOE, ParallelStyle(experts="expert")),
    "moe-ep": Case(QWEN3_MOE, ParallelStyle(tensor=False, experts="expert")),
    "moe-tp": Case(QWEN3_MOE, ParallelStyle()),
    "mla-tp-ep": Case(DEEPSEEK, ParallelStyle(experts="expert")),
    "v4-ep": Case(None, ParallelStyle(tensor=False, experts="expert"), V4_OPTIONS, 300, True),
    "glm5-ep": Case(GLM5, ParallelStyle(tensor=False, experts="expert"), GLM5_OPTIONS),
    "killed": Case(LLAMA, ParallelStyle()),
}


class Recording:
    """A runner that keeps each step's sampled logits (`keep_logits`) by step id."""

    def __init__(self, inner: CudaRunner) -> None:
        self.inner = inner
        self.logits: dict[int, torch.Tensor] = {}

    @property
    def runner_config(self) -> RunnerConfig:
        return self.inner.runner_config

    def bind(self, layout: CacheLayout) -> None:
        self.inner.bind(layout)

    def forward(self, plan: BatchPlan) -> ForwardOutput:
        out = self.inner.forward(plan)
        assert self.inner.last_logits is not None
        self.logits[plan.step_id] = self.inner.last_logits.cpu()
        return out

    def close(self) -> None:
        self.inner.close()


def runner(
    name: str,
    group: torch.distributed.ProcessGroup | None,
    graphs: bool | None = None,
    checkpoint: str | None = None,
) -> Recording:
    """The case's fast runner on every rank's same random weights (peaky: std 0.2, so greedy
    choices are not near-ties) or checkpoint (default: the folder `PARALLEL_CHECKPOINT`
    names), sharded over `group` (None: the whole model); `graphs`: decode CUDA graphs
    (default: over NCCL)."""
    case = CASES[name]
    options = replace(case.options, cuda_graphs=NCCL if graphs is None else graphs)
    device = f"cuda:{dist.get_rank(group)}" if NCCL and group is not None else DEVICE
    build = options.build_options()
    if group is not None and case.cut_while_loading:
        build = replace(build, cut_moe=moe_cutter(group, case.style))
    if case.config is None:
        folder = checkpoint or os.environ["PARALLEL_CHECKPOINT"]
        model = load_model(folder, options, device, torch.float32, build)
    else:
        source = RandomWeights(device, torch.float32, seed=SEED, std=0.2)
        model = build_model(parse_config(case.config), source, build)
    if build.cut_moe is not None:  # already this rank's experts, before `shard_model`
        assert all(isinstance(layer.moe.moe, ParallelMoE) for layer in model.layers)
    if group is not None:
        model = shard_model(model, group, case.style)
    return Recording(CudaRunner(model, options))


def prompts(name: str) -> list[list[int]]:
    vocab, gen = CASES[name].vocab, torch.Generator().manual_seed(11)
    shared = torch.randint(0, vocab, (9,), generator=gen).tolist()
    return [
        [*shared, *torch.randint(0, vocab, (3,), generator=gen).tolist()],
        [*shared, vocab - 1, vocab - 2],  # the top ids live in the last vocabulary shard
        torch.randint(0, vocab, (3,), generator=gen).tolist(),
    ]


def generate(local: Any, name: str) -> list[list[int]]:
    params = SamplingParams(max_output_tokens=OUTPUT_TOKENS, temperature=0.0)
    with Engine(local, **ENGINE_KWARGS) as engine:
        requests = [engine.submit(p, params) for p in prompts(name)]
        while engine.has_work():
            engine.step()
    return [list(r.take_result()) for r in requests]


def shards(model: Any) -> dict[str, Any]:
    """What this rank holds: per layer query heads and expert stack sizes, embedding rows and
    the KV heads its arena holds per token."""
    from resin_models_cuda.layers import MoE
    from resin_models_cuda.layers.mla import MlaAttention
    from resin_models_cuda.models.deepseek_v4 import DeepseekV4
    from resin_models_cuda.models.glm5_next import Glm5Next

    def heads(attn: Any) -> int:
        return attn.heads if isinstance(attn, MlaAttention) else attn.q_size // 16

    if isinstance(model, DeepseekV4):  # its attention as `attention`, its MoE in `moe.moe`
        q_heads = [layer.attention.heads for layer in model.layers]
        stacks = [layer.moe.moe.w.down.shape[0] for layer in model.layers]
    elif isinstance(model, Glm5Next):  # KDA and indexed MLA as `mixer`, whole on every rank
        q_heads = [layer.mixer.heads for layer in model.layers]
        stacks = [layer.mlp.w.down.shape[0] for layer in model.layers
                  if isinstance(layer.mlp, MoE)]  # fmt: skip
    else:
        q_heads = [heads(layer.attn) for layer in model.layers]
        stacks = [layer.mlp.w.down.shape[0] for layer in model.layers
                  if isinstance(layer.mlp, MoE)]  # fmt: skip
    return {
        "q_heads": q_heads,
        "experts": stacks,
        "embed_rows": int(model.embed.shape[0]),
        "kv_heads": model.cache_token_shape()[1],
    }


def run_until_peer_dies(local: Any, out: Path) -> None:
    """A few steps, SIGKILL the worker, then step until the engine dies."""
    params = SamplingParams(max_output_tokens=40, temperature=0.0)
    events: list[object] = []
    with Engine(local, **ENGINE_KWARGS) as engine:
        requests = [engine.submit(p, params) for p in prompts("killed")]
        for _ in range(2):
            events += engine.step()
        os.kill(int(os.environ["PEER_PID"]), signal.SIGKILL)
        start = time.monotonic()
        while engine.has_work():
            events += engine.step()
        seconds = time.monotonic() - start
        try:
            engine.submit([1, 2, 3], params)
            submit_raised = False
        except EngineDeadError:
            submit_raised = True
    report = {
        "requests": [str(r.id) for r in requests],
        "finished": {
            str(e.request_id): e.reason.value for e in events if isinstance(e, FinishedEvent)
        },
        "errors": [e.message for e in events if isinstance(e, ErrorEvent)],
        "seconds_to_death": seconds,
        "submit_raised": submit_raised,
    }
    (out / "result.json").write_text(json.dumps(report))


def main(name: str, out: Path, timeout_s: float) -> None:
    from resin.backend.launch import start_tensor_parallel
    from resin.backend.topology import shutdown

    torch.set_num_threads(1)
    leader = start_tensor_parallel(
        lambda groups: runner(name, groups.model),  # type: ignore[arg-type, return-value]
        device=None if NCCL else "cuda:0" if DEVICE == "cuda" else "cpu",  # None: cuda:RANK
        timeout=timedelta(seconds=timeout_s),
        backend="nccl" if NCCL else "gloo",
    )
    if leader is None:  # a worker whose leader closed the runner: leave at once (as
        sys.stdout.flush()  # `resin worker` does; Gloo's destructors may abort at teardown)
        sys.stderr.flush()
        os._exit(0)
    if name == "killed":
        run_until_peer_dies(leader, out)
    else:
        tokens = generate(leader, name)
        local = leader.local
        assert isinstance(local, Recording)
        held = shards(local.inner.model)
        torch.save({"tokens": tokens, "logits": local.logits, "shards": held}, out / "result.pt")
    shutdown()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), float(sys.argv[3]))
