"""`resin worker` (`python -m resin.backend.worker`): one non-leader rank of a job.

It builds its shard of the model exactly as the leader builds its own (same checkpoint or
random-weights config and seed, same page size) and follows the leader's plans until the
leader closes the runner. The world comes from torchrun's variables (`RANK`, `WORLD_SIZE`,
`LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`), as `launch.spawn_local` sets them.

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
from datetime import timedelta
from pathlib import Path

log = logging.getLogger("resin.worker")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="resin worker", description=__doc__.splitlines()[0])
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
    p.add_argument("--expert-parallel", action="store_true")
    p.add_argument("--device", default=None, help="default: cuda:LOCAL_RANK if present, else cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--timeout", type=float, default=120.0, help="collective timeout, seconds")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    import torch

    from resin.backend.launch import reference_runner, start_tensor_parallel
    from resin.backend.topology import Topology

    args = parser().parse_args(argv)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    config = json.loads(Path(args.config_json).read_text()) if args.config_json else None
    try:
        runner = start_tensor_parallel(
            lambda groups: reference_runner(
                groups,
                checkpoint=args.checkpoint,
                config=config,
                expert_parallel=args.expert_parallel,
                dtype=dtype,
                seed=args.seed,
                page_size=args.page_size,
            ),
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
