"""How a sequence is split over the ranks of a context-parallel group, and back.

`contiguous`: rank r holds tokens [r*N/W, (r+1)*N/W).
`zigzag`: the sequence is cut into 2W equal chunks and rank r holds chunks r and 2W-1-r.
Under a causal mask every rank then does the same amount of work (an early chunk, which sees
little, paired with a late one, which sees much); with contiguous shards the last rank would
do W times the first one's work.
"""

from __future__ import annotations

import torch

LAYOUTS = ("contiguous", "zigzag")


def _check(seqlen: int, world_size: int, rank: int, layout: str) -> int:
    """The number of equal chunks the sequence is cut into."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a group of {world_size}")
    chunks = world_size * (2 if layout == "zigzag" else 1)
    if seqlen % chunks:
        raise ValueError(f"a sequence of {seqlen} tokens does not split into {chunks} equal chunks "
                         f"({layout} layout over {world_size} ranks); pad it to a multiple of {chunks}")
    return chunks


def shard_positions(seqlen: int, world_size: int, rank: int, layout: str = "zigzag") -> list[tuple[int, int]]:
    """The global [start, end) token ranges rank `rank` holds, in the order it holds them."""
    chunk = seqlen // _check(seqlen, world_size, rank, layout)
    if layout == "contiguous":
        return [(rank * chunk, (rank + 1) * chunk)]
    late = 2 * world_size - 1 - rank
    return [(rank * chunk, (rank + 1) * chunk), (late * chunk, (late + 1) * chunk)]


def shard_sequence(x: torch.Tensor, world_size: int, rank: int, layout: str = "zigzag", dim: int = 1) -> torch.Tensor:
    """This rank's part of a full sequence x (the sequence along `dim`)."""
    ranges = shard_positions(x.shape[dim], world_size, rank, layout)
    return torch.cat([x.narrow(dim, start, end - start) for start, end in ranges], dim=dim)


def unshard_sequence(shards: list[torch.Tensor], layout: str = "zigzag", dim: int = 1) -> torch.Tensor:
    """The full sequence from every rank's shard, in rank order (the inverse of shard_sequence)."""
    world_size = len(shards)
    local = shards[0].shape[dim]
    seqlen = local * world_size
    pieces: dict[int, torch.Tensor] = {}
    for rank, shard in enumerate(shards):
        if shard.shape[dim] != local:
            raise ValueError(f"shard {rank} holds {shard.shape[dim]} tokens, shard 0 holds {local}")
        offset = 0
        for start, end in shard_positions(seqlen, world_size, rank, layout):
            pieces[start] = shard.narrow(dim, offset, end - start)
            offset += end - start
    return torch.cat([pieces[start] for start in sorted(pieces)], dim=dim)
