"""Sharding under `torchrun`: rank r makes items r, r+W, r+2W, ... of the plan.

Outside torchrun (no WORLD_SIZE) everything is one process and nothing is initialised. The
process group only serves the final barrier, so gloo on CPU and NCCL on CUDA both work.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def setup() -> tuple[int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), dist.get_world_size()


def device(requested: str | None) -> str | None:
    """Each rank takes the GPU of its local rank, unless a device was named."""
    if requested is not None or not torch.cuda.is_available() or "LOCAL_RANK" not in os.environ:
        return requested
    return f"cuda:{int(os.environ['LOCAL_RANK'])}"


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
