"""Multi-rank execution on `torch.distributed` (imported lazily: `import resin` loads no torch).

- `topology.py`: torchrun's world -> replicas of `tensor_parallel` ranks; their process groups.
- `distributed.py`: `DistributedRunner` (the leader's Runner) and `run_worker` (every other
  rank), one broadcast per plan, timeouts everywhere, a dead rank -> `RunnerDeadError`.
- `launch.py`: one call every rank makes to get its runner (the leader) or serve as a worker,
  and `spawn_local`, a leader that starts its own workers (`resin worker` processes).

See docs/distributed.md.
"""
