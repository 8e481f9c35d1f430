"""Data-parallel training over torch.distributed (torchrun), for PPO and the Trainer.

Every rank owns its envs and collects; the update averages gradients across ranks with one
all-reduce of the flattened gradients per minibatch, so every rank holds the same model after
each update. Running statistics and reported stats are reduced across ranks. Outside a
process group every operation here is a no-op, so single-process code pays nothing.

Launch with ``torchrun --nproc_per_node=N -m rl8 train CONFIG.yaml``; see
``docs/distributed.md``.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["DistContext", "init_distributed", "derive_seed"]

# Seeds of different ranks must not collide with seed + k of a neighbouring run.
_RANK_SEED_STRIDE = 1_000_003


def derive_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank`` in a run seeded with ``seed`` (rank 0 keeps ``seed``)."""
    return (seed + rank * _RANK_SEED_STRIDE) % (2**31)


def init_distributed(*, backend: str | None = None, timeout_s: float = 300.0) -> bool:
    """Join the process group that torchrun describes in the environment, if any.

    Reads ``WORLD_SIZE``/``RANK``/``LOCAL_RANK`` (set by torchrun). Does nothing and returns
    ``False`` when ``WORLD_SIZE`` is unset or 1, or when a group is already initialised.

    Args:
        backend: ``"gloo"`` or ``"nccl"``; ``None``: nccl when CUDA is available, else gloo.
        timeout_s: Seconds a collective may wait for a peer before raising (a dead rank then
            ends the others with an error instead of a hang).

    Returns:
        Whether a process group is active after the call.
    """
    if dist.is_initialized():
        return True
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    return True


class DistContext:
    """The process group PPO runs in (a no-op outside torch.distributed).

    Attributes:
        enabled: Whether a process group with more than one rank is active.
        rank: This process's rank (0 when not distributed).
        world_size: Number of ranks (1 when not distributed).
    """

    def __init__(self) -> None:
        self.enabled = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        self.rank = dist.get_rank() if self.enabled else 0
        self.world_size = dist.get_world_size() if self.enabled else 1

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0 (the rank that tracks and checkpoints)."""
        return self.rank == 0

    def all_reduce_(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """All-reduce ``tensor`` in place with ``op`` in ``{"sum", "min", "max"}``."""
        if self.enabled:
            ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
            dist.all_reduce(tensor, op=ops[op])
        return tensor

    def average_gradients(self, params: list[nn.Parameter]) -> None:
        """Average the gradients of ``params`` across ranks with ONE all-reduce."""
        if not self.enabled:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat.div_(self.world_size)
        offset = 0
        for p, g in zip(params, grads):
            n = g.numel()
            if p.grad is None:
                p.grad = flat[offset : offset + n].view_as(p).clone()
            else:
                p.grad.copy_(flat[offset : offset + n].view_as(p))
            offset += n

    def broadcast_module(self, module: nn.Module, src: int = 0) -> None:
        """Make every rank's parameters and buffers equal to rank ``src``'s."""
        if not self.enabled:
            return
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src)

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank (a collective: every rank must call it)."""
        if not self.enabled:
            return flag
        t = torch.tensor([1.0 if flag else 0.0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def gather_objects(self, obj):
        """Every rank's ``obj`` as a list indexed by rank (on every rank)."""
        if not self.enabled:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out
