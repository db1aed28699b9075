"""Data-parallel training across processes: torchrun, or Slurm tasks through submitit.

One process per device. ``posbench train`` needs no flag for it: the launcher's
environment says how many processes there are::

    torchrun --nproc_per_node=4 --no-python posbench train encoding=alibi          # one node
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d \\
        --rdzv-endpoint=$HEAD:29500 --no-python posbench train encoding=alibi       # two nodes
    posbench -m train hydra/launcher=slurm hydra.launcher.tasks_per_node=4 ...      # Slurm

How the global batch stays what the config says (``train.batch_size`` windows per
optimizer step, whatever the number of processes):

* every rank draws the same global batch from the same generator and keeps its own
  contiguous slice of it (``shard``), so the data are sharded by rank and a run on N
  processes sees exactly the windows a single process sees;
* each rank splits its slice into micro-batches of ``train.micro_batch_size`` windows
  and accumulates gradients over them; DDP averages gradients across ranks, so the
  update is the mean over the global batch, as in one process;
* RNG streams for dropout are offset by rank (``seed + rank``);
* files (checkpoints, metrics, results, wandb) are written by rank 0 only, into the one
  Hydra run dir that every rank computes from the same config.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import PosbenchError


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.size > 1


def _submitit_env() -> None:
    """Inside a submitit job (Slurm, or its local executor) with several tasks, export the
    variables torchrun would set (RANK, WORLD_SIZE, MASTER_ADDR, ...) from submitit's view."""
    if "WORLD_SIZE" in os.environ or not os.environ.get("SUBMITIT_EXECUTOR"):
        return
    from submitit import JobEnvironment
    from submitit.helpers import TorchDistributedEnvironment

    if JobEnvironment().num_tasks > 1:
        # every task sees all the node's GPUs and takes cuda:LOCAL_RANK, as under torchrun
        TorchDistributedEnvironment().export(set_cuda_visible_devices=False)


def world() -> World:
    """This process's place, from the environment a launcher sets (no process group needed)."""
    _submitit_env()
    size = int(os.environ.get("WORLD_SIZE", "1"))
    return World(int(os.environ.get("RANK", "0")), size, int(os.environ.get("LOCAL_RANK", "0")))


def init(device: torch.device) -> tuple[World, torch.device]:
    """Join the process group when launched with several processes; -> (world, this rank's device)."""
    w = world()
    if not w.active:
        return w, device
    if device.type == "cuda":
        device = torch.device("cuda", w.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return w, device


def shutdown() -> None:
    """Leave the process group :func:`init` joined (a no-op when there is none)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def print0(*args, **kwargs) -> None:
    """``print`` on rank 0 only (to stderr unless ``file=`` says otherwise), so the trainer needs
    no rank checks around its messages (nanochat's print0)."""
    if world().is_main:
        print(*args, **{"file": sys.stderr, **kwargs})


def micro_batches(batch_size: int, micro_batch_size: int | None, w: World) -> tuple[int, int]:
    """-> (micro batch size, accumulation steps) for ``batch_size`` windows per step over ``w``."""
    if batch_size % w.size:
        raise PosbenchError(f"train.batch_size={batch_size} is not divisible by the {w.size} processes; "
                            f"valid: a multiple of {w.size}")
    per_rank = batch_size // w.size
    micro = micro_batch_size or per_rank
    if micro > per_rank or per_rank % micro:
        valid = [m for m in range(1, per_rank + 1) if per_rank % m == 0]
        raise PosbenchError(f"train.micro_batch_size={micro} must divide the {per_rank} windows each of the "
                            f"{w.size} process(es) gets from train.batch_size={batch_size}; valid: {valid} or null")
    return micro, per_rank // micro


def shard(x: torch.Tensor, w: World) -> torch.Tensor:
    """This rank's contiguous slice of a global batch (B, ...) -> (B / size, ...)."""
    per_rank = x.shape[0] // w.size
    return x[w.rank * per_rank:(w.rank + 1) * per_rank]


def mean(value: torch.Tensor, w: World) -> torch.Tensor:
    """The mean of a scalar over ranks (every rank gets it)."""
    if not w.active:
        return value
    value = value.detach().clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value / w.size


def gather_objects(obj, w: World) -> list:
    """Every rank's ``obj``, in rank order (a one-item list when not distributed)."""
    if not w.active:
        return [obj]
    out = [None] * w.size
    dist.all_gather_object(out, obj)
    return out


