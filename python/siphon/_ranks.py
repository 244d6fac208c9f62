"""Which reader of a training job this process is: the rank and world size given, or
``torch.distributed``'s when neither is (0 of 1 without torch or outside a process group)."""

from __future__ import annotations

from typing import Optional, Tuple

from .errors import DatasetError


def check_reader(batch_size: int, rank: int, world_size: int, worker: int, num_workers: int) -> None:
    """Refuses, by name, a batch size or a reader (`rank` of `world_size` × `worker` of
    `num_workers`) that cannot be."""
    if batch_size <= 0:
        raise DatasetError(f"batch_size must be positive, got {batch_size}")
    if world_size <= 0:
        raise DatasetError(f"world_size must be positive, got {world_size}")
    if not 0 <= rank < world_size:
        raise DatasetError(f"rank {rank} is out of range for world_size {world_size} (0 <= rank < world_size)")
    if num_workers <= 0 or not 0 <= worker < num_workers:
        raise DatasetError(f"worker {worker} is out of range for num_workers {num_workers}")


def ranks(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """`rank` and `world_size` as given, or torch.distributed's when both are ``None``."""
    if (rank is None) != (world_size is None):
        raise DatasetError("give both rank and world_size, or neither (then torch.distributed's)")
    if rank is not None and world_size is not None:
        return rank, world_size
    try:
        import torch.distributed as dist
    except ImportError:
        return 0, 1
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
