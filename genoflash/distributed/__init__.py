"""Context parallelism: one sequence sharded across the ranks of a torch.distributed group.

    ring_flash_attn_func   exact ring attention (ring.py)
    enable_context_parallel / ContextParallel   models whose attention layers ring (context.py)
    shard_sequence / unshard_sequence / shard_positions   the layouts (sharding.py)
"""

from .context import ContextParallel, enable_context_parallel
from .ring import ring_flash_attn_func
from .sharding import LAYOUTS, shard_positions, shard_sequence, unshard_sequence

__all__ = ["ContextParallel", "LAYOUTS", "enable_context_parallel", "ring_flash_attn_func", "shard_positions", "shard_sequence", "unshard_sequence"]
