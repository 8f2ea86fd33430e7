"""Context parallelism for models: the attention layers see one shard of each sequence.

    cp = enable_context_parallel(model)             # every MultiHeadAttention now rings
    loss = cp.mean_loss(model(cp.shard(tokens))["logits"], cp.shard(labels))
    loss.backward(); cp.sum_gradients(model)        # then clip and step as usual

Everything in a DNA LM block but attention is per position, so the shards need no other
exchange. Each rank computes its tokens' loss over the *global* token count and the
parameter gradients are summed over the group: the update equals the single-device one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .ring import ring_flash_attn_func
from .sharding import shard_sequence


@dataclass
class ContextParallel:
    group: object = None  # a torch.distributed ProcessGroup; None is the world
    layout: str = "zigzag"

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.group)

    def shard(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's part of a full (batch, seqlen, ...) tensor."""
        return shard_sequence(x, self.world_size, self.rank, self.layout, dim)

    def attention(self, q, k, v, layer) -> torch.Tensor:
        """Ring attention for a MultiHeadAttention layer over its shard."""
        cos = sin = None
        if layer.rotary is not None:
            cos, sin = layer.rotary_tables_for(q.shape[1] * self.world_size, q)
        return ring_flash_attn_func(q, k, v, group=self.group, causal=layer.causal, softcap=layer.softcap,
                                    layout=self.layout, rotary_cos=cos, rotary_sin=sin,
                                    rotary_interleaved=layer.rotary_interleaved)

    def mean_loss(self, logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
        """Cross-entropy of this shard's tokens divided by the number of counted tokens on all
        ranks: summed over the group (as the gradients are), it is the global mean."""
        total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                                ignore_index=ignore_index, reduction="sum")
        count = (labels != ignore_index).sum().to(torch.float32)
        dist.all_reduce(count, group=self.group)
        return total / count.clamp_min(1.0)

    def global_value(self, local: torch.Tensor) -> float:
        """The sum over the group of a per-rank scalar (e.g. mean_loss's value)."""
        value = local.detach().clone().float()
        dist.all_reduce(value, group=self.group)
        return float(value)

    def sum_gradients(self, model: torch.nn.Module) -> None:
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, group=self.group)


def enable_context_parallel(model: torch.nn.Module, group=None, layout: str = "zigzag") -> ContextParallel:
    """Make every genoflash MultiHeadAttention in `model` attend across the group's shards.
    (Layers opt in by having a `context_parallel` attribute, so this module needs no import of
    the layers package, which sits above it.)"""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("context parallelism needs an initialised torch.distributed process group "
                           "(run under torchrun, or call torch.distributed.init_process_group)")
    cp = ContextParallel(group, layout)
    layers = [m for m in model.modules() if hasattr(m, "context_parallel")]
    if not layers:
        raise ValueError("the model has no genoflash MultiHeadAttention layer to make context-parallel")
    for layer in layers:
        if tuple(layer.window_size) != (-1, -1):
            raise ValueError(f"ring attention has no sliding window yet; a layer has window_size {layer.window_size} "
                             "(use global layers only, layer_pattern 'G')")
        if layer.dropout:
            raise ValueError("ring attention has no dropout yet; build the model with attention dropout 0")
        layer.context_parallel = cp
    return cp
