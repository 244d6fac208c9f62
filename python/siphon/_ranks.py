"""Which reader of a training job this process is: the rank and world size given, or
``torch.distributed``'s when neither is (0 of 1 without torch or outside a process group)."""

from __future__ import annotations

from typing import Optional, Tuple

from .errors import DatasetError


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
