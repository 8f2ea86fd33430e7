"""`flash_attn_func` and `flash_attn_varlen_func`: validate -> choose a backend -> autograd.Function;
the packed forms (`flash_attn_qkvpacked_func`, `flash_attn_kvpacked_func` and their varlen forms)
split their packed tensor into views and call them.

Argument names, layouts and semantics follow flash-attn, so code written for flash-attn
switches with one import.
"""

from __future__ import annotations

import dataclasses

import torch

from ...backends import select_backend
from ...settings import current as current_settings
from . import custom_ops, reference
from .args import AttentionArgs
from .dropout import DropoutArgs, draw_seed_and_offset
from .passes import backward_pass, forward_pass, rotate_qk, torch_kwargs
from ..common.checks import as_int, check_float_tensor
from ..rotary.interface import apply_rotary_emb
from .validation import (attention_args, check_alibi, check_cu_seqlens, check_headdim, check_qkv, check_scale,
                         check_softcap, check_triton_device, check_window, last_dim_contiguous)


class FlashAttnFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, args: AttentionArgs, backend: str):
        q, k, v = (last_dim_contiguous(t) for t in (q, k, v))
        out, lse = forward_pass(q, k, v, args, backend)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args, ctx.backend = args, backend
        ctx.mark_non_differentiable(lse)
        # lse has no gradient, and out's may be absent (a loss that does not use it): without
        # this, autograd would allocate and zero-fill a tensor for each, one launch more per
        # backward (and a whole backward pass of zeros for an unused out).
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:  # out reached no loss: no gradient flows to q, k or v
            return None, None, None, None, None
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = backward_pass(last_dim_contiguous(dout), q, k, v, out, lse, ctx.args, ctx.backend)
        return dq, dk, dv, None, None


def _run(q, k, v, args: AttentionArgs, return_lse: bool, return_attn_probs: bool):
    out, lse = _attend(q, k, v, args)
    if return_attn_probs:  # flash-attn's testing output (out, lse, S_dmask)
        return out, lse, _dropout_encoded_probs(q, k, args)
    return (out, lse) if return_lse else out


def _dropout_encoded_probs(q, k, args: AttentionArgs) -> torch.Tensor:
    """flash-attn's S_dmask, for tests: the softmax probabilities (batch, nheads, seqlen_q, seqlen_k),
    or (batch, nheads, max_seqlen_q, max_seqlen_k) zero-padded for varlen, in q's dtype, negated where
    dropout dropped them (the sign is the keep mask, as flash-attn encodes it). Standard attention
    in torch ops: O(N^2) memory, slow, no gradient."""
    if args.dropout is not None and args.dropout.seed is None:
        raise ValueError("return_attn_probs with dropout is not available under torch.compile: the dropout "
                         "seed is drawn inside the graph")
    with torch.no_grad():
        q, k = rotate_qk(q, k, args)
        kw = dict(softmax_scale=args.softmax_scale, window_size=(args.window_left, args.window_right),
                  softcap=args.softcap, dropout=args.dropout)

        def encoded(q, k, slopes, batch_offset=0):
            probs, _, keep = reference.attention_probs(q, k, alibi_slopes=slopes, batch_offset=batch_offset, **kw)
            return (probs if keep is None else torch.where(keep, probs, -probs)).to(q.dtype)

        if not args.varlen:
            return encoded(q, k, args.alibi_slopes)
        cu_q, cu_k = args.cu_seqlens_q.tolist(), args.cu_seqlens_k.tolist()
        probs = q.new_zeros(len(cu_q) - 1, q.shape[1], args.max_seqlen_q, args.max_seqlen_k)
        for b in range(len(cu_q) - 1):
            slopes = args.alibi_slopes
            if slopes is not None and slopes.dim() == 2:
                slopes = slopes[b]
            part = encoded(q[None, cu_q[b]:cu_q[b + 1]], k[None, cu_k[b]:cu_k[b + 1]], slopes, b)
            probs[b, :, :part.shape[2], :part.shape[3]] = part[0]
        return probs


def _attend(q, k, v, args: AttentionArgs):
    backend = select_backend(q.device)
    if backend == "reference":  # standard attention in torch ops: traced as they are under torch.compile
        if args.dropout is not None and args.dropout.seed is None:  # see custom_ops.flash_attn
            args = dataclasses.replace(args, dropout=DropoutArgs(args.dropout.p, *draw_seed_and_offset()))
        q, k = rotate_qk(q, k, args)
        kw = torch_kwargs(args)
        if args.varlen:
            out, lse = reference.attention_reference_varlen(q, k, v, args.cu_seqlens_q, args.cu_seqlens_k,
                                                            args.softmax_scale, **kw)
        else:
            out, lse = reference.attention_reference(q, k, v, args.softmax_scale, **kw)
        return out, lse.detach()
    if backend == "triton":
        check_triton_device(q)
    if torch.compiler.is_compiling():  # one graph node per pass, not a trace of the launch code
        return custom_ops.flash_attn(q, k, v, args, backend)
    return FlashAttnFunc.apply(q, k, v, args, backend)


def flash_attn_block_backward(dout, q, k, v, out, lse, softmax_scale=None, causal=False, softcap=0.0):
    """Gradients (dq, dk, dv) of one block of a larger attention, given that attention's final
    output `out` and log-sum-exp `lse` (batch, nheads, seqlen_q).

    Ring attention splits the keys over devices; with the *global* out and lse, each block's
    P = exp(s - lse) and dS = P * (dP - rowsum(dout * out)) are exactly the global ones restricted
    to the block, so the block gradients add up to the full gradients. Not differentiable."""
    check_qkv(q, k, v, varlen=False)
    if lse.shape != (q.shape[0], q.shape[2], q.shape[1]) or lse.dtype != torch.float32:
        raise ValueError(f"lse must be float32 (batch, nheads, seqlen_q) = {(q.shape[0], q.shape[2], q.shape[1])}, "
                         f"got {lse.dtype} {tuple(lse.shape)}")
    if dout.shape != out.shape or out.shape != (*q.shape[:-1], v.shape[-1]):
        raise ValueError(f"dout {tuple(dout.shape)} and out {tuple(out.shape)} must be (batch, seqlen_q, nheads, "
                         f"headdim_v) = {(*q.shape[:-1], v.shape[-1])}")
    args = attention_args(q, [q.shape[1]], [k.shape[1]], 0.0, softmax_scale, causal, (-1, -1), softcap, None, None,
                           None, False, None, 0)
    backend = select_backend(q.device)
    if backend == "triton":
        check_triton_device(q)
    dout, q, k, v, out = (last_dim_contiguous(t) for t in (dout, q, k, v, out))
    with torch.no_grad():
        return backward_pass(dout, q, k, v, out, lse.contiguous(), args, backend)


# ---------------------------------------------------------------- public functions

def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    rotary_interleaved: bool = False,
    dropout_seed: int | None = None,
    dropout_offset: int = 0,
):
    """Exact attention with O(N) memory.

    The positional order is flash-attn's (q, k, v, dropout_p, softmax_scale, causal, window_size,
    softcap, alibi_slopes, deterministic, return_attn_probs); genoflash's own arguments are
    keyword-only.

    Args:
        q: (batch, seqlen_q, nheads, headdim).
        k: (batch, seqlen_k, nheads_k, headdim); nheads_k divides nheads (GQA/MQA).
        v: (batch, seqlen_k, nheads_k, headdim_v); headdim_v may differ from headdim.
        dropout_p: 0, or in [1/512, 1 - 1/512). Attention probabilities are dropped with a Philox
            stream made inside the kernels (dropout.py) and regenerated in the backward; no mask is
            stored. As in flash-attn 2, each score gets 8 random bits, so p is rounded to a multiple
            of 1/256 (0.1 drops 26/256) and kept scores are scaled by 1 / (1 - that rounded p).
        softmax_scale: defaults to 1 / sqrt(headdim).
        causal: bottom-right aligned (flash-attn >= 2.1): query i sees keys
            j <= i + seqlen_k - seqlen_q. A query that sees no key gets output 0, lse -inf.
        window_size: (left, right): query i sees keys j with
            i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right; -1 is unbounded.
        softcap: if > 0, scores become softcap * tanh(scores / softcap) before the softmax.
        alibi_slopes: float32 (nheads,) or (batch, nheads); adds -slope * |i + seqlen_k - seqlen_q - j|.
        rotary_cos, rotary_sin: RoPE tables (seqlen >= seqlen_k, rotary_dim / 2), e.g. from
            `genoflash.rotary_tables`; q and k are rotated inside the kernels (key j at position j,
            query i at i + seqlen_k - seqlen_q), the first rotary_dim channels of each head.
        rotary_interleaved: GPT-J pairs (2m, 2m+1) instead of NeoX halves (m, m + rotary_dim/2).
        deterministic: False (the default, as in flash-attn) allows a backward whose dQ is a float32
            sum in no fixed order, so two backward passes may differ in the last bits. On an H200
            (sm_90) the backward of 16-bit attention with head dim 64, 128 or 256, fixed lengths,
            full or causal, without dropout, RoPE, ALiBi or softcap, from 512 (hd64: 1,024; causal
            1,024, hd64 causal 2,048, hd256 causal 512) queries or keys on, with room for a float32
            dQ accumulator, then runs as one pass in Gluon (ops/attention/backward_sm90.py);
            everything else, and True everywhere, runs the two triton passes, which write every
            gradient element from one program, without atomics, so that two backward passes are
            bitwise equal. (The triton one-pass form, with dQ
            summed in its dK/dV pass, is taken only where the tile table says so: nowhere on the
            H200, where it was slower.) The torch and reference backends are deterministic either way.
        return_attn_probs: flash-attn's testing output: returns (out, lse, S_dmask), S_dmask the
            softmax probabilities (batch, nheads, seqlen_q, seqlen_k), negated where dropout dropped
            them, computed apart from the kernels in torch ops (slow, O(N^2) memory: for tests).
        return_lse: also return the log-sum-exp, float32 (batch, nheads, seqlen_q), natural log.
        dropout_seed, dropout_offset: the Philox key and counter offset; by default both are drawn
            from torch's default generator, so `torch.manual_seed` reproduces a run.

    Returns:
        out (batch, seqlen_q, nheads, headdim_v) in q's dtype, or (out, lse) when return_lse.
    """
    check_qkv(q, k, v, varlen=False)
    args = attention_args(q, [q.shape[1]], [k.shape[1]], dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, rotary_cos, rotary_sin, rotary_interleaved, dropout_seed, dropout_offset,
                           deterministic)
    return _run(q, k, v, args, return_lse, return_attn_probs)


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: torch.Tensor | None = None,
    *,
    return_lse: bool = False,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    rotary_interleaved: bool = False,
    dropout_seed: int | None = None,
    dropout_offset: int = 0,
):
    """Attention over a packed batch of variable-length sequences (flash-attn's varlen layout).

    q: (total_q, nheads, headdim); k: (total_k, nheads_k, headdim); v: (total_k, nheads_k, headdim_v).
    cu_seqlens_q/k: int32 (batch + 1,) prefix sums: sequence b holds rows [cu[b], cu[b+1]).
    max_seqlen_q/k: at least the longest sequence. Masks, positions (causal alignment, ALiBi)
    and the softmax are per sequence: no sequence attends across its neighbour, and padding
    costs no compute. RoPE positions restart at 0 in every sequence. Other arguments as in
    `flash_attn_func`; lse is (nheads, total_q).

    block_table: int32 (batch, max_num_blocks_per_seq): k and v are then paged caches (num_blocks,
    page_block_size, nheads_k, headdim), sequence b's key t in page block_table[b, t // page_block_size]
    at row t % page_block_size, and cu_seqlens_k counts each sequence's keys. They are gathered into
    the packed layout (a copy of the keys used) and attended to; gradients flow back into the pages.
    """
    if block_table is not None:
        from .kvcache import paged_keys
        if torch.compiler.is_compiling():
            raise ValueError("block_table is not available under torch.compile: the pages are read by value")
        if not isinstance(cu_seqlens_k, torch.Tensor) or cu_seqlens_k.dim() != 1 or cu_seqlens_k.numel() < 2:
            raise TypeError("cu_seqlens_k must be a 1-D int32 tensor of batch + 1 prefix sums")
        lengths = check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, int(cu_seqlens_k[-1]),
                                   as_int("max_seqlen_k", max_seqlen_k), q.device)
        k, v = paged_keys(k, v, block_table, lengths)
    check_qkv(q, k, v, varlen=True)
    max_seqlen_q, max_seqlen_k = as_int("max_seqlen_q", max_seqlen_q), as_int("max_seqlen_k", max_seqlen_k)
    lengths_q = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q, q.device)
    lengths_k = check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k, q.device)
    if cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
        raise ValueError(f"cu_seqlens_q describes {cu_seqlens_q.shape[0] - 1} sequences but cu_seqlens_k "
                         f"{cu_seqlens_k.shape[0] - 1}")
    args = attention_args(q, lengths_q, lengths_k, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, rotary_cos, rotary_sin, rotary_interleaved, dropout_seed, dropout_offset,
                           deterministic, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                           max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    return _run(q, k, v, args, return_lse, return_attn_probs)


# ---------------------------------------------------------------- packed forms (flash-attn's)

def _unpack(name: str, packed, axis: int, parts: int, rank: int, layout: str) -> tuple[torch.Tensor, ...]:
    """Views of packed's `parts` slices along `axis`: no copy, and autograd assembles the packed
    gradient from the slices' gradients."""
    if not isinstance(packed, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(packed).__name__}")
    if packed.dim() != rank or packed.shape[axis] != parts:
        raise ValueError(f"{name} must have shape {layout}, got {tuple(packed.shape)}")
    return packed.unbind(axis)


def flash_attn_qkvpacked_func(
    qkv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
    dropout_seed: int | None = None,
    dropout_offset: int = 0,
):
    """`flash_attn_func` on qkv (batch, seqlen, 3, nheads, headdim): q, k and v share a head count
    and a head dim. The gradient is one (batch, seqlen, 3, nheads, headdim) tensor, as flash-attn's."""
    q, k, v = _unpack("qkv", qkv, 2, 3, 5, "(batch, seqlen, 3, nheads, headdim)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, return_lse=return_lse, dropout_seed=dropout_seed,
                           dropout_offset=dropout_offset)


def flash_attn_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
    dropout_seed: int | None = None,
    dropout_offset: int = 0,
):
    """`flash_attn_func` with kv (batch, seqlen_k, 2, nheads_k, headdim) packed; nheads_k divides
    q's nheads (GQA/MQA)."""
    k, v = _unpack("kv", kv, 2, 2, 5, "(batch, seqlen_k, 2, nheads_k, headdim)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, return_lse=return_lse, dropout_seed=dropout_seed,
                           dropout_offset=dropout_offset)


def flash_attn_varlen_qkvpacked_func(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
    dropout_seed: int | None = None,
    dropout_offset: int = 0,
):
    """`flash_attn_varlen_func` on a packed batch qkv (total, 3, nheads, headdim), one cu_seqlens
    for queries and keys."""
    q, k, v = _unpack("qkv", qkv, 1, 3, 4, "(total, 3, nheads, headdim)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
                                  causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                                  return_lse=return_lse, dropout_seed=dropout_seed, dropout_offset=dropout_offset)


def flash_attn_varlen_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
    dropout_seed: int | None = None,
    dropout_offset: int = 0,
):
    """`flash_attn_varlen_func` with kv (total_k, 2, nheads_k, headdim) packed."""
    k, v = _unpack("kv", kv, 1, 2, 4, "(total_k, 2, nheads_k, headdim)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, return_lse=return_lse, dropout_seed=dropout_seed,
                                  dropout_offset=dropout_offset)


# ---------------------------------------------------------------- decoding with a KV cache

def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: int | torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: torch.Tensor | None = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
):
    """Attention of q against a KV cache, appending new keys and values to it first (flash-attn's
    `flash_attn_with_kvcache`, its arguments and semantics). For inference: not differentiable.

    Args:
        q: (batch, seqlen_q, nheads, headdim).
        k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k, headdim[_v]), or paged with block_table:
            (num_blocks, page_block_size, nheads_k, headdim[_v]). nheads_k divides nheads (GQA/MQA).
        k, v: optional new tokens (batch, seqlen_new, nheads_k, headdim[_v]), written into the cache in
            place at slots cache_seqlens[b] .. + seqlen_new (rotated first when rotary tables are
            given), and attended to.
        rotary_cos, rotary_sin: (seqlen_ro, rotary_dim / 2) tables; the new k is rotated at its slots,
            and q at cache_seqlens + i when causal or windowed, else every query at cache_seqlens.
        cache_seqlens: the filled slots of each sequence before this call: an int or an int32
            (batch,) tensor; None means every slot of the cache is filled.
        cache_batch_idx: int32 (batch,): the cache row of each sequence (default 0 .. batch - 1).
        cache_leftpad: int32 (batch,): each sequence's keys start at this slot (left padding).
        block_table: int32 (batch, max_num_blocks_per_seq): a paged cache's pages of each sequence.
        softmax_scale, causal, window_size, softcap, alibi_slopes: as in `flash_attn_func`, with the
            keys of sequence b counted from cache_leftpad[b] to its last new token (causal is
            bottom-right aligned to them).
        rotary_interleaved: GPT-J pairs (flash-attn's default here) instead of NeoX halves.
        num_splits: how many parts each sequence's keys are split into (split-KV decoding); 0
            chooses from the shape. Used where the call decodes (seqlen_q x nheads / nheads_k <= 128
            query rows per KV head, on the triton backend); longer prefills run the training kernels.
        return_softmax_lse: also return the log-sum-exp, float32 (batch, nheads, seqlen_q).

    Returns:
        out (batch, seqlen_q, nheads, headdim_v), or (out, lse).
    """
    from . import kvcache

    check_float_tensor("q", q, 4, "(batch, seqlen_q, nheads, headdim)")
    check_headdim("q", q.shape[-1])
    windowed = check_window(window_size, False) != (-1, -1)
    batch, seqlen_q = q.shape[:2]
    decoding = select_backend(q.device) == "triton" and _decodes(seqlen_q, q.shape[2], k_cache.shape[2])
    # The decoding kernel takes the indices on the device: unless settings(check_indices=True) asks
    # for their values to be checked, nothing waits on the host. Every other path needs them there.
    layout = kvcache.check_cache(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                 read_values=current_settings().check_indices or not decoding)
    if isinstance(num_splits, bool) or as_int("num_splits", num_splits) < 0:
        raise ValueError(f"num_splits must be an int >= 0 (0 chooses), got {num_splits!r}")
    positions = layout.seqlens_t
    if rotary_cos is not None or rotary_sin is not None:
        if rotary_cos is None or rotary_sin is None:
            raise ValueError("rotary_cos and rotary_sin must be given together")
        if not isinstance(rotary_cos, torch.Tensor) or rotary_cos.dim() != 2:
            raise TypeError("rotary_cos must be a 2-D tensor (seqlen_ro, rotary_dim / 2)")
        # Every position this call rotates lies inside the tables (apply_rotary_emb checks it too).
        q_positions = seqlen_q if causal or windowed else 1
        reach = None if layout.seqlens is None else max(n + max(layout.seqlen_new, q_positions) for n in layout.seqlens)
        if reach is not None and rotary_cos.shape[0] < reach:
            raise ValueError(f"the rotary tables cover {rotary_cos.shape[0]} positions but this call reaches "
                             f"{reach - 1}")
    with torch.no_grad():
        if rotary_cos is not None:
            if q_positions == seqlen_q:
                q = apply_rotary_emb(q, rotary_cos, rotary_sin, rotary_interleaved, seqlen_offsets=positions)
            else:  # every query sits at cache_seqlens: rotate them as one token of seqlen_q x nheads heads
                q = apply_rotary_emb(q.reshape(batch, 1, -1, q.shape[-1]), rotary_cos, rotary_sin, rotary_interleaved,
                                     seqlen_offsets=positions).view(q.shape)
            if k is not None:
                k = apply_rotary_emb(k, rotary_cos, rotary_sin, rotary_interleaved, seqlen_offsets=positions)
        if k is not None:
            kvcache.append(k_cache, v_cache, k, v, layout)
        if decoding:
            check_triton_device(q)  # split-KV decoding, the cache read in place (decode.py)
            out, lse = _decode(q, k_cache, v_cache, layout, softmax_scale, causal, window_size, softcap, alibi_slopes,
                               num_splits)
            return (out, lse) if return_softmax_lse else out
        kw = dict(softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                  alibi_slopes=alibi_slopes, return_lse=True)
        if kvcache.whole_rows(layout, batch):  # the cache as it lies: no copy
            out, lse = flash_attn_func(q, k_cache[:batch], v_cache[:batch], **kw)
        else:
            keys, values, counts = kvcache.gather(k_cache, v_cache, layout)
            if not keys.shape[0]:  # no sequence has a key: every query sees none (output 0, lse -inf)
                out = q.new_zeros(*q.shape[:3], v_cache.shape[-1])
                lse = torch.full((batch, q.shape[2], seqlen_q), -torch.inf, device=q.device)
                return (out, lse) if return_softmax_lse else out
            cu_k = torch.tensor([0] + counts, device=q.device).cumsum(0).to(torch.int32)
            cu_q = torch.arange(0, (batch + 1) * seqlen_q, seqlen_q, device=q.device, dtype=torch.int32)
            out, lse = flash_attn_varlen_func(q.reshape(-1, *q.shape[2:]), keys, values, cu_q, cu_k, seqlen_q,
                                              max(counts), **kw)
            out = out.view(batch, seqlen_q, *out.shape[1:])
            lse = lse.view(lse.shape[0], batch, seqlen_q).transpose(0, 1)
    return (out, lse) if return_softmax_lse else out


def _decodes(seqlen_q: int, nheads: int, nheads_k: int) -> bool:
    """Whether a call is short enough for the split-KV decoding kernel (the triton backend only)."""
    from . import decode  # imports triton

    return decode.rows_per_kv_head(seqlen_q, nheads, nheads_k) <= decode.MAX_ROWS


def _decode(q, k_cache, v_cache, layout, softmax_scale, causal, window_size, softcap, alibi_slopes, num_splits):
    """flash_attn_with_kvcache's decoding path: the layout's index tensors, on the device, to the
    split-KV kernel."""
    from . import decode

    left, right = check_window(window_size, causal)
    ends = layout.seqlens_t + layout.seqlen_new if layout.seqlen_new else layout.seqlens_t
    return decode.decode_attention(
        last_dim_contiguous(q), k_cache, v_cache, ends, layout.max_keys(),
        softmax_scale=check_scale(softmax_scale, q.shape[-1]), window_left=left, window_right=right,
        softcap=check_softcap(softcap), alibi_slopes=check_alibi(alibi_slopes, q.shape[0], q.shape[2], q.device),
        leftpad=layout.leftpad_t, cache_rows=layout.rows_t, block_table=layout.pages,
        num_splits=as_int("num_splits", num_splits))
