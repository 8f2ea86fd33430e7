"""Ring attention: exact attention over a sequence sharded across a torch.distributed group.

Each rank holds one shard of q, k and v (sharding.py). Over W steps the K/V shards travel
around the ring (rank r sends to r+1 and receives from r-1 with batch_isend_irecv, started
before the step's compute so the transfer hides under it); at step s rank r attends its
queries to the K/V shard of rank r-s with the fused kernel, which returns the block's output
and log-sum-exp. The blocks are merged exactly, in fp32, through their LSEs:
    lse = logaddexp(lse, lse_b),   out = out * exp(lse_old - lse) + out_b * exp(lse_b - lse).

Backward: with the final out and lse, each block's gradients are exact pieces of the full
ones (ops/attention/interface.flash_attn_block_backward). dQ accumulates where it is; the
dK/dV of a K/V shard travel the ring with it and, after a last hop, arrive at its owner.

Causal masks follow global positions. Under the zigzag layout a block is either the local
causal block, "all our queries x the sender's early chunk", or "our late chunk x all the
sender's keys": every rank does the same work at every step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..ops.attention.interface import flash_attn_block_backward, flash_attn_func
from ..ops.attention.validation import check_qkv
from ..ops.rotary import apply_rotary_emb
from .sharding import LAYOUTS, shard_positions


class _Ring:
    """The ranks either side of this one in a group, and asynchronous exchanges with them."""

    def __init__(self, group):
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)
        self.next = dist.get_global_rank(self.group, (self.rank + 1) % self.world)
        self.prev = dist.get_global_rank(self.group, (self.rank - 1) % self.world)

    def start(self, tensors: list[torch.Tensor]):
        """Send tensors to the next rank and receive the previous rank's, without waiting.
        Every rank posts its exchanges in the same order, so they pair up in order."""
        sent = [t.contiguous() for t in tensors]
        received = [torch.empty_like(t) for t in sent]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in sent]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group) for t in received]
        return sent, received, dist.batch_isend_irecv(ops)

    @staticmethod
    def finish(pending) -> list[torch.Tensor]:
        _, received, works = pending
        for work in works:
            work.wait()
        return received


def _block_plan(src: int, rank: int, causal: bool, layout: str, half: int):
    """(query slice, key slice, causal) of the step that sees rank src's K/V, or None if the
    mask hides it entirely."""
    every = slice(None)
    if not causal:
        return every, every, False
    if src == rank:
        # The local shard keeps global order (zigzag: early chunk, then late chunk), so a causal
        # mask over local indices is the global one.
        return every, every, True
    if layout == "contiguous":
        return (every, every, False) if src < rank else None
    if src < rank:
        # The sender's early chunk precedes both of ours; its late chunk follows both.
        return every, slice(0, half), False
    # Our late chunk follows both of the sender's chunks; our early chunk precedes both.
    return slice(half, None), every, False


def _merge(out: torch.Tensor, lse: torch.Tensor, rows: slice, out_b: torch.Tensor, lse_b: torch.Tensor) -> None:
    """Fold one block's (out_b, lse_b) into the running fp32 (out, lse) over query rows `rows`."""
    old = lse[:, :, rows]
    new = torch.logaddexp(old, lse_b)
    seen = torch.isfinite(new)  # a row with no visible key yet keeps weight 0 on both sides
    w_old = torch.where(seen, torch.exp(old - new), 0.0).transpose(1, 2)[..., None]
    w_new = torch.where(seen, torch.exp(lse_b - new), 0.0).transpose(1, 2)[..., None]
    out[:, rows] = out[:, rows] * w_old + out_b.float() * w_new
    lse[:, :, rows] = new


class RingFlashAttnFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, softmax_scale, softcap, layout):
        ring = _Ring(group)
        batch, seqlen, nheads, _ = q.shape
        half = seqlen // 2
        out = torch.zeros(batch, seqlen, nheads, v.shape[-1], device=q.device, dtype=torch.float32)
        lse = torch.full((batch, nheads, seqlen), float("-inf"), device=q.device, dtype=torch.float32)
        k_cur, v_cur = k, v
        for step in range(ring.world):
            pending = ring.start([k_cur, v_cur]) if step < ring.world - 1 else None
            plan = _block_plan((ring.rank - step) % ring.world, ring.rank, causal, layout, half)
            if plan is not None:
                rows, keys, block_causal = plan
                out_b, lse_b = flash_attn_func(q[:, rows], k_cur[:, keys], v_cur[:, keys], softmax_scale=softmax_scale,
                                               causal=block_causal, softcap=softcap, return_lse=True)
                _merge(out, lse, rows, out_b, lse_b)
            if pending is not None:
                k_cur, v_cur = ring.finish(pending)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.causal, ctx.softmax_scale, ctx.softcap, ctx.layout = ring, causal, softmax_scale, softcap, layout
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        ring = ctx.ring
        half = q.shape[1] // 2
        dq = torch.zeros_like(q, dtype=torch.float32)
        dk_acc = torch.zeros_like(k, dtype=torch.float32)  # this step's K/V shard's gradient so far
        dv_acc = torch.zeros_like(v, dtype=torch.float32)
        k_cur, v_cur = k, v
        dkv_pending = None
        for step in range(ring.world):
            last = step == ring.world - 1
            kv_pending = ring.start([k_cur, v_cur]) if not last else None
            plan = _block_plan((ring.rank - step) % ring.world, ring.rank, ctx.causal, ctx.layout, half)
            grads = None
            if plan is not None:
                rows, keys, block_causal = plan
                grads = flash_attn_block_backward(dout[:, rows], q[:, rows], k_cur[:, keys], v_cur[:, keys],
                                                  out[:, rows], lse[:, :, rows], ctx.softmax_scale, block_causal,
                                                  ctx.softcap)
            if dkv_pending is not None:  # the previous rank's contributions to this K/V shard
                dk_acc, dv_acc = ring.finish(dkv_pending)
            if grads is not None:
                dq[:, rows] += grads[0]
                dk_acc[:, keys] += grads[1]
                dv_acc[:, keys] += grads[2]
            if ring.world > 1:
                # On to the rank that holds this K/V shard next; after the last step, to its owner.
                dkv_pending = ring.start([dk_acc, dv_acc])
            if kv_pending is not None:
                k_cur, v_cur = ring.finish(kv_pending)
        if dkv_pending is not None:
            dk_acc, dv_acc = ring.finish(dkv_pending)
        return dq.to(q.dtype), dk_acc.to(k.dtype), dv_acc.to(v.dtype), None, None, None, None, None


def _rotate_shard(x: torch.Tensor, cos, sin, interleaved: bool, ranges) -> torch.Tensor:
    """RoPE on a shard, each of its chunks at its global positions."""
    parts, offset = [], 0
    for start, end in ranges:
        parts.append(apply_rotary_emb(x[:, offset:offset + end - start], cos, sin, interleaved, seqlen_offsets=start))
        offset += end - start
    return torch.cat(parts, dim=1)


def _check_same_on_every_rank(q, k, v, ring: _Ring) -> None:
    dtypes = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    mine = torch.tensor([*q.shape, *k.shape, v.shape[-1], dtypes.index(q.dtype)], device=q.device, dtype=torch.int64)
    everyone = [torch.empty_like(mine) for _ in range(ring.world)]
    dist.all_gather(everyone, mine, group=ring.group)
    for rank, theirs in enumerate(everyone):
        if not torch.equal(theirs, mine):
            raise ValueError(f"context-parallel shards differ across ranks: rank {ring.rank} has q "
                             f"{tuple(q.shape)} k {tuple(k.shape)} dv {v.shape[-1]} {q.dtype}, rank {rank} has "
                             f"q {tuple(theirs[:4].tolist())} k {tuple(theirs[4:8].tolist())} dv {int(theirs[8])} "
                             f"{dtypes[int(theirs[9])]}")


def ring_flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group=None, causal: bool = False,
                         softmax_scale: float | None = None, softcap: float = 0.0, layout: str | None = None,
                         rotary_cos: torch.Tensor | None = None, rotary_sin: torch.Tensor | None = None,
                         rotary_interleaved: bool = False, return_lse: bool = False):
    """Exact attention over a sequence sharded across the ranks of `group` (default: the world).

    Args:
        q, k, v: this rank's shard, (batch, seqlen / world, nheads, headdim), as
            `genoflash.distributed.shard_sequence` cuts it; k/v may have fewer heads (GQA).
        layout: how the sequence is sharded, "zigzag" (default when causal: balanced work) or
            "contiguous" (default otherwise).
        rotary_cos, rotary_sin: RoPE tables covering the *whole* sequence; each token is rotated
            at its global position.
    Returns out (this rank's shard of the output), and (out, lse) with return_lse.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("ring_flash_attn_func needs an initialised torch.distributed process group "
                           "(torch.distributed.init_process_group, e.g. under torchrun)")
    check_qkv(q, k, v, varlen=False)
    layout = layout or ("zigzag" if causal else "contiguous")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"ring attention shards one sequence: q and k need the same local seqlen, got "
                         f"{q.shape[1]} and {k.shape[1]}")
    if layout == "zigzag" and q.shape[1] % 2:
        raise ValueError(f"the zigzag layout holds two equal chunks per rank: the local seqlen must be even, "
                         f"got {q.shape[1]}")
    ring = _Ring(group)
    _check_same_on_every_rank(q, k, v, ring)
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos and rotary_sin must be given together")
    if rotary_cos is not None:
        seqlen = q.shape[1] * ring.world
        if rotary_cos.shape[0] < seqlen:
            raise ValueError(f"rotary tables cover {rotary_cos.shape[0]} positions but the sequence has {seqlen}")
        ranges = shard_positions(seqlen, ring.world, ring.rank, layout)
        q = _rotate_shard(q, rotary_cos, rotary_sin, rotary_interleaved, ranges)
        k = _rotate_shard(k, rotary_cos, rotary_sin, rotary_interleaved, ranges)
    out, lse = RingFlashAttnFunc.apply(q, k, v, group, causal, softmax_scale, softcap, layout)
    return (out, lse) if return_lse else out
