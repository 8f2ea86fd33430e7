"""How one process takes part in a training run: alone, or as one rank of a torchrun job.

A job of ``world`` ranks is a device mesh of ``dp x cp``: ``cp`` ranks (``--context-parallel``)
share each sequence, every one holding a shard of it (ring attention), and the ``dp = world / cp``
groups of them read different sequences. Rank ``r`` is data-parallel rank ``r // cp`` and
context-parallel rank ``r % cp`` (the mesh's row-major order).

The model is one replica per data-parallel rank: under DDP (``--data-parallel ddp``) every rank
holds all of it and the gradients are averaged over the world; under FSDP2 (``fsdp``) each block
and the whole model are ``fully_shard``-ed over the world, so parameters, gradients and the
optimizer's state are sharded, gathered per block for its forward and backward. Context-parallel
ranks hold the same replica, so both reduce over every rank.

One invariant makes every layout train the same model as one process: each rank's loss is the sum
of its tokens' losses over the step's *global* count of counted targets, times ``world`` (which the
wrappers' average over the world divides back out). The gradients then sum to the gradient of
the mean loss over the global batch, whatever the split. Every rank takes the same decisions (skip
a step, stop) from values reduced over the world.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

logger = logging.getLogger(__name__)

DATA_PARALLEL = ("ddp", "fsdp")


@dataclass
class Parallel:
    """This process's place in the job; a single-process run is world 1 (every method a no-op)."""

    device: torch.device
    world: int = 1
    rank: int = 0
    cp: int = 1
    mode: str = "ddp"
    mesh: object = None  # torch.distributed DeviceMesh (dp, cp), or None in a single process
    world_mesh: object = None  # the same ranks as one dimension: what FSDP2 shards over
    context: object = None  # genoflash.distributed.ContextParallel when cp > 1
    _wrapped: nn.Module | None = field(default=None, repr=False)

    @property
    def dp(self) -> int:
        return self.world // self.cp

    @property
    def dp_rank(self) -> int:
        return self.rank // self.cp

    @property
    def main(self) -> bool:
        """Rank 0 alone writes logs, plots and the checkpoints' JSON."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def describe(self) -> str:
        if not self.distributed:
            return f"1 process on {self.device}"
        return (f"{self.world} ranks = data parallel {self.dp} ({self.mode}) x context parallel {self.cp}, "
                f"{self.device.type}")

    # ---------------------------------------------------------------- the model

    def wrap(self, model: nn.Module) -> nn.Module:
        """The model this rank trains: context-parallel attention when cp > 1, then DDP or FSDP2
        over the world when there is more than one rank. Every rank built `model` from the same
        seed, so the replicas start equal (DDP also broadcasts rank 0's)."""
        if self.cp > 1:
            from ..distributed import enable_context_parallel
            self.context = enable_context_parallel(model, group=self.mesh["cp"].get_group())
        if not self.distributed:
            self._wrapped = model
        elif self.mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel
            self._wrapped = DistributedDataParallel(model, device_ids=[self.device] if self.device.type == "cuda"
                                                    else None)
        else:
            from torch.distributed.fsdp import fully_shard
            for block in _blocks(model):  # each block's parameters gathered only while it runs
                fully_shard(block, mesh=self.world_mesh)
            fully_shard(model, mesh=self.world_mesh)
            self._wrapped = model
        return self._wrapped

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The model inside DDP's wrapper (FSDP2 shards the model in place: it is the model)."""
        return model.module if self.distributed and self.mode == "ddp" else model

    def gradient_sync(self, model: nn.Module, sync: bool):
        """A context for one micro-batch's backward: gradients are reduced over the ranks only on
        the step's last micro-batch (`sync`); the others accumulate locally."""
        if not self.distributed or sync:
            return contextlib.nullcontext()
        if self.mode == "ddp":
            return model.no_sync()
        return _fsdp_no_sync(model)

    # ---------------------------------------------------------------- data

    def shard(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's part of a full (batch, seqlen, ...) tensor: its sequence shard when cp > 1."""
        return x if self.context is None else self.context.shard(x)

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """x summed over every rank (a copy on x's device; x itself is untouched)."""
        if not self.distributed:
            return x.detach().clone()
        y = x.detach().to(self.device, copy=True)  # NCCL reduces GPU tensors only
        dist.all_reduce(y)
        return y.to(x.device)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's x (equal shapes), concatenated in rank order along dim 0, on x's device."""
        if not self.distributed:
            return x
        y = x.detach().to(self.device).contiguous()
        parts = [torch.empty_like(y) for _ in range(self.world)]
        dist.all_gather(parts, y)
        return torch.cat(parts).to(x.device)

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


def grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clip the gradients to `max_norm` (inf: no clipping) and return their global norm, the same
    on every rank: FSDP2's sharded gradients give a DTensor norm, made whole here."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def setup(device: torch.device, cp: int = 1, mode: str = "ddp") -> Parallel:
    """Join the torchrun job this process belongs to (if any) and build its mesh.

    Under torchrun (WORLD_SIZE > 1, or a process group the caller already initialised) the
    process group is NCCL on GPUs and gloo on CPUs, and LOCAL_RANK picks this rank's GPU. Alone,
    it is world 1, which needs cp == 1."""
    if mode not in DATA_PARALLEL:
        raise ValueError(f"data_parallel must be one of {', '.join(DATA_PARALLEL)}, got {mode!r}")
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else \
        int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        if cp > 1:
            raise ValueError(f"context_parallel (--context-parallel) {cp} shares each sequence over {cp} ranks; run "
                             f"under torchrun: torchrun --nproc-per-node {cp} -m genoflash.cli train ...")
        return Parallel(device)
    if world % cp:
        raise ValueError(f"context_parallel (--context-parallel) {cp} must divide the number of ranks, {world}")
    if device.type == "cuda":  # LOCAL_RANK: this process's GPU on its node
        local = int(os.environ.get("LOCAL_RANK", dist.get_rank() % torch.cuda.device_count()
                                   if dist.is_initialized() else 0))
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", device_id=device
                                if device.type == "cuda" else None)
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(device.type, (world // cp, cp), mesh_dim_names=("dp", "cp"))
    world_mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("world",)) if mode == "fsdp" else None
    return Parallel(device, world=world, rank=dist.get_rank(), cp=cp, mode=mode, mesh=mesh, world_mesh=world_mesh)


def _blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks FSDP2 shards one by one: every member of a ModuleList named `blocks`."""
    found = [block for name, module in model.named_modules() if name.split(".")[-1] == "blocks"
             and isinstance(module, nn.ModuleList) for block in module]
    if not found:
        raise ValueError(f"FSDP needs the model's blocks in a ModuleList named 'blocks'; {type(model).__name__} has "
                         "none")
    return found


@contextlib.contextmanager
def _fsdp_no_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
