"""Sharding under `torchrun`: rank r makes items r, r+W, r+2W, ... of the plan.

Outside torchrun (no WORLD_SIZE) everything is one process and nothing is initialised. The
process group only serves rank 0's word on the run folder's lock and the final barrier: NCCL when CUDA is present (each rank bound to the
GPU of its LOCAL_RANK before the group exists, so the barrier runs there and not on GPU 0),
gloo otherwise. benchmarks/torchrun/torchrun_proof.sh checks both on a 2-GPU machine.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from vcbench.errors import UserError


def setup() -> tuple[int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1
    if not dist.is_initialized():
        gpu = local_gpu()
        if gpu is None:
            dist.init_process_group("gloo")
        else:
            torch.cuda.set_device(gpu)
            dist.init_process_group("nccl", device_id=gpu)
    return dist.get_rank(), dist.get_world_size()


def local_gpu() -> torch.device | None:
    """The GPU of this rank under torchrun (LOCAL_RANK), or None without CUDA or torchrun."""
    if not torch.cuda.is_available() or "LOCAL_RANK" not in os.environ:
        return None
    local, count = int(os.environ["LOCAL_RANK"]), torch.cuda.device_count()
    if local >= count:
        raise UserError(f"torchrun local rank {local} has no GPU of its own ({count} visible): "
                        "use --nproc_per_node <= the number of GPUs")
    return torch.device("cuda", local)


def device(requested: str | None) -> str | None:
    """Each rank takes the GPU of its local rank, unless a device was named."""
    if requested is not None:
        return requested
    gpu = local_gpu()
    return None if gpu is None else str(gpu)


def from_rank0(value):
    """Rank 0's `value` on every rank (a picklable object); the value itself outside torchrun."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
