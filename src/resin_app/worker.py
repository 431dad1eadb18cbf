"""The ranks of a tensor-parallel job, and `resin worker` (`python -m resin_app.worker`), one
non-leader rank.

`reference_runner` is the reference runner's shard every rank builds, `fast_runner` the fast
runner's (`resin worker --runner cuda`, `resin bench tp --runner cuda`); `checkpoint_replicas`
is what
`resin serve --tensor-parallel N --data-parallel M` runs (the leader starts its workers with
`resin.backend.launch.spawn_local` and `worker_command`). A worker builds its shard exactly as
the leader builds its own (same checkpoint or random-weights config and seed, same page size)
and follows the leader's plans until the leader closes the runner. The world comes from
torchrun's variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`), as
`spawn_local` sets them.

Exit status: 0 after the leader closed the runner; 1 when the leader is gone or a step failed
(a lost peer, a collective timeout, an error in the local runner).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resin.protocols import Runner
from resin_model.family import BuildRequest

if TYPE_CHECKING:
    import torch

    from resin.backend.launch import LocalJob
    from resin.backend.topology import ProcessGroups

log = logging.getLogger("resin.worker")


def worker_command(*args: str) -> list[str]:
    """The command line that starts one `resin worker` with `args` (what to build)."""
    return [sys.executable, "-m", "resin_app.worker", *args]


def reference_runner(
    groups: ProcessGroups,
    *,
    checkpoint: str | Path | None = None,
    config: dict[str, Any] | None = None,
    expert_parallel: bool = False,
    dtype: torch.dtype | None = None,
    seed: int = 0,
    **runner_kwargs: Any,
) -> Runner:
    """This rank's `TorchRunner` over its shard of a checkpoint (or of random weights from a
    Hugging Face style `config` dict, the same on every rank for the same `seed`).

    `expert_parallel`: MoE experts are split across the ranks (attention stays tensor
    parallel); otherwise every expert is split like a dense MLP.
    """
    import torch

    from resin_models_torch.parallel import ParallelStyle, shard_model
    from resin_models_torch.registry import load_model, random_runner
    from resin_models_torch.runner import TorchRunner

    if (checkpoint is None) == (config is None):
        raise ValueError("give exactly one of checkpoint or config")
    if checkpoint is not None:
        model = load_model(checkpoint, groups.device, dtype)
    else:
        assert config is not None
        model = random_runner(config, seed, groups.device, dtype or torch.float32).model
    style = ParallelStyle(experts="expert" if expert_parallel else "tensor")
    return TorchRunner(shard_model(model, groups.model, style), **runner_kwargs)


def fast_runner(
    groups: ProcessGroups,
    *,
    checkpoint: str | Path | None = None,
    config: dict[str, Any] | None = None,
    expert_parallel: bool = False,
    tensor: bool = True,
    dtype: torch.dtype | None = None,
    seed: int = 0,
    quantize: str | None = None,
    options: Any = None,
) -> Runner:
    """This rank's `CudaRunner` over its shard of a fast model (`resin_models_cuda.parallel`):
    a checkpoint, or random weights of a Hugging Face style `config` dict (`quantize`: made
    FP8 / MXFP4 on the device as they are drawn), the same on every rank for the same `seed`.

    `expert_parallel`: whole experts spread over the ranks, else every expert is split;
    `tensor` False keeps attention, dense MLPs and the vocabulary replicated (DeepSeek-V4's
    and GLM-5.3's MoE layers are then cut as they are built). CUDA graphs only
    over NCCL (a Gloo collective cannot be captured); `options` is a `RunnerOptions`."""
    import torch
    import torch.distributed as dist

    from resin_model.hf_config import parse_config
    from resin_model.quant_checkpoint import quantization_config
    from resin_model.quant_config import parse_quant_config
    from resin_models_cuda import CudaRunner, RunnerOptions, build_model
    from resin_models_cuda.layers import RandomWeights, WeightSource
    from resin_models_cuda.layers.quantized import QuantizingWeights
    from resin_models_cuda.parallel import ParallelStyle, moe_cutter, shard_model
    from resin_models_cuda.runner import load_model

    if (checkpoint is None) == (config is None):
        raise ValueError("give exactly one of checkpoint or config")
    opts = options if isinstance(options, RunnerOptions) else RunnerOptions()
    nccl = dist.get_backend(groups.model) == "nccl"
    opts = replace(opts, cuda_graphs=opts.cuda_graphs and nccl)
    device = groups.device
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    style = ParallelStyle(tensor, "expert" if expert_parallel else "tensor")
    # DeepSeek-V4 / GLM-5.3 experts-only: each MoE layer cut as it is built
    build = replace(opts.build_options(), cut_moe=moe_cutter(groups.model, style))
    if checkpoint is not None:
        model = load_model(checkpoint, opts, device, dtype, build)
    else:
        assert config is not None
        parsed = parse_config(config)
        source: WeightSource = RandomWeights(device, dtype, seed, num_layers=parsed.num_layers)
        if quantize is not None:
            source = QuantizingWeights(source, quantize)  # type: ignore[arg-type]
            parsed = replace(parsed, quant=parse_quant_config(quantization_config(quantize)))  # type: ignore[arg-type]
        model = build_model(parsed, source, build)
    return CudaRunner(shard_model(model, groups.model, style), opts)


def checkpoint_replicas(
    folder: str | Path,
    *,
    device: str = "cpu",
    tensor_parallel: int = 1,
    data_parallel: int = 1,
    timeout: timedelta | None = None,
    family: str = "torch",
    request: BuildRequest | None = None,
    dummy: bool = False,
) -> tuple[list[Runner], LocalJob | None]:
    """Runners over a checkpoint for `resin serve --tensor-parallel N --data-parallel M`: one
    runner per replica from runner family `family` (`request` says how; its device is each
    replica's), and the `LocalJob` of the workers when N > 1 (the reference runner only;
    `spawn_local`: this process leads every replica). On CUDA, replica i's rank r runs on
    `cuda:(K + i*N + r)` from `--device cuda:K`; on the CPU every rank runs on the CPU.
    `dummy` (`--load-format dummy`): random weights of the folder's config, one rank."""
    import torch

    from resin.backend.launch import nth_device, spawn_local
    from resin.backend.topology import DEFAULT_TIMEOUT
    from resin_app.runners import build_runner
    from resin_model.hf_config import load_config

    first = torch.device(device)
    request = request or BuildRequest(device)
    if tensor_parallel == 1:
        devices = [
            nth_device(first, i) if first.type == "cuda" else first for i in range(data_parallel)
        ]
        source = load_config(folder) if dummy else Path(folder)
        return [
            build_runner(source, family, replace(request, device=str(d))) for d in devices
        ], None
    if dummy:
        raise ValueError("--load-format dummy runs one rank a replica (no --tensor-parallel)")
    if family != "torch":
        raise ValueError(f"--tensor-parallel runs the reference runner (torch), not {family!r}")
    worker_args = ["--checkpoint", str(folder)]
    worker_args += [] if first.type == "cuda" else ["--device", str(first)]
    job = spawn_local(
        lambda groups: reference_runner(groups, checkpoint=folder),
        worker_command(*worker_args),
        tensor_parallel=tensor_parallel,
        data_parallel=data_parallel,
        device=first,
        timeout=timeout or DEFAULT_TIMEOUT,
    )
    return list(job.runners), job


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="resin worker", description="one non-leader rank of a tensor-parallel job"
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a model folder (the leader's)")
    src.add_argument("--config-json", help="random weights of this config.json (tests, benches)")
    p.add_argument("--seed", type=int, default=0, help="random-weights seed (with --config-json)")
    p.add_argument("--tensor-parallel", type=int, default=None, help="default: the world size")
    p.add_argument(
        "--shared-leader",
        action="store_true",
        help="rank 0 leads every replica (launch.spawn_local's layout, docs/distributed.md)",
    )
    p.add_argument(
        "--runner",
        choices=["torch", "cuda"],
        default="torch",
        help="the reference runner's shards, or the fast runner's (resin_models_cuda)",
    )
    p.add_argument("--expert-parallel", action="store_true")
    p.add_argument(
        "--replicated-attention",
        action="store_true",
        help="--runner cuda: attention, dense MLPs and the vocabulary whole on every rank, "
        "only the experts cut (DeepSeek-V4, GLM-5.3: their one plan)",
    )
    p.add_argument(
        "--quantize",
        choices=["fp8-block", "fp8-channel", "mxfp4"],
        default=None,
        help="--runner cuda with --config-json: random weights made FP8 / MXFP4 as drawn",
    )
    p.add_argument("--max-sequences", type=int, default=256, help="--runner cuda: graph rows")
    p.add_argument("--context-length", type=int, default=8192, help="--runner cuda: longest")
    p.add_argument("--no-cuda-graphs", action="store_true", help="--runner cuda: eager steps")
    p.add_argument("--device", default=None, help="default: cuda:LOCAL_RANK if present, else cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--timeout", type=float, default=120.0, help="collective timeout, seconds")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    import torch

    from resin.backend.launch import start_tensor_parallel
    from resin.backend.topology import Topology

    args = parser().parse_args(argv)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    config = json.loads(Path(args.config_json).read_text()) if args.config_json else None

    common: dict[str, Any] = dict(
        checkpoint=args.checkpoint,
        config=config,
        expert_parallel=args.expert_parallel,
        dtype=dtype,
        seed=args.seed,
    )

    def build(groups: ProcessGroups) -> Runner:
        if args.runner == "cuda":
            from resin_models_cuda import RunnerOptions

            options = RunnerOptions(
                page_size=args.page_size,
                max_batch=args.max_sequences,
                max_context=args.context_length,
                cuda_graphs=not args.no_cuda_graphs,
            )
            return fast_runner(
                groups,
                quantize=args.quantize,
                options=options,
                tensor=not args.replicated_attention,
                **common,
            )
        return reference_runner(groups, page_size=args.page_size, **common)

    try:
        runner = start_tensor_parallel(
            build,
            topology=Topology.from_env(args.tensor_parallel, shared_leader=args.shared_leader),
            device=args.device,
            timeout=timedelta(seconds=args.timeout),
        )
    except Exception as exc:  # the leader is gone or a step failed: say so, exit non-zero
        log.error("resin worker: stopping: %s", exc)
        return 1
    if runner is not None:
        log.error("resin worker: this is rank 0, a leader; run the leader's program there")
        runner.close()
        return 1
    # The leader said CLOSE: leave at once. Interpreter teardown would run Gloo's destructors,
    # which can abort the process (SIGABRT) once the leader's side of the sockets is gone.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.exit(main())
