"""`flash_attn_func` and `flash_attn_varlen_func`: validate -> choose a backend -> autograd.Function.

Argument names, layouts and semantics follow flash-attn, so code written for flash-attn
switches with one import.
"""

from __future__ import annotations

import math

import torch

from ...backends import select_backend, triton_interpreted
from ...rotary import apply_rotary, apply_rotary_packed
from . import chunked, reference
from .args import AttentionArgs
from .dropout import DropoutArgs, draw_seed_and_offset, dropout_threshold

MAX_HEADDIM = 256
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Tile-local offsets in the kernels are int32: up to 256 rows times the sequence stride.
_MAX_SEQ_STRIDE = (2**31 - 1) // 256


# ---------------------------------------------------------------- validation

def _check_tensor(name: str, t, rank: int, layout: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating-point tensor (float16, bfloat16 or float32), got {t.dtype}")
    if t.dim() != rank:
        raise ValueError(f"{name} must have rank {rank} {layout}, got shape {tuple(t.shape)}")


def _check_headdim(name: str, d: int) -> None:
    if d > MAX_HEADDIM or d % 8 != 0 or d < 8:
        raise ValueError(f"{name} headdim must be a multiple of 8 between 8 and {MAX_HEADDIM}, got {d}")


def _check_qkv(q, k, v, varlen: bool) -> None:
    rank, layout = (3, "(total, nheads, headdim)") if varlen else (4, "(batch, seqlen, nheads, headdim)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, rank, layout)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device, got q {q.device}, k {k.device}, v {v.device}")
    if not varlen and not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(f"batch mismatch: q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[-3] != v.shape[-3]:
        raise ValueError(f"k and v must have the same seqlen, got k {k.shape[-3]}, v {v.shape[-3]}")
    nheads, nheads_k = q.shape[-2], k.shape[-2]
    if v.shape[-2] != nheads_k:
        raise ValueError(f"nheads mismatch: k has {nheads_k}, v has {v.shape[-2]}")
    if nheads_k < 1 or nheads % nheads_k != 0:
        raise ValueError(f"nheads mismatch: q's nheads ({nheads}) must be divisible by k/v's nheads ({nheads_k})")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"headdim mismatch: q {q.shape[-1]}, k {k.shape[-1]}")
    _check_headdim("q/k", q.shape[-1])
    _check_headdim("v", v.shape[-1])
    if any(s < 1 for s in q.shape[:-2] + k.shape[:-2]):
        raise ValueError(f"batch, seqlen_q and seqlen_k must be >= 1, got q {tuple(q.shape)}, k {tuple(k.shape)}")


def _check_scale(softmax_scale, headdim: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(headdim)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"softmax_scale must be a float, got {type(softmax_scale).__name__}")
    if not (math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale must be finite and > 0, got {softmax_scale}")
    return float(softmax_scale)


def _check_window(window_size, causal: bool) -> tuple[int, int]:
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(f"window_size must be a pair (left, right), got {window_size!r}") from None
    for side, w in (("left", left), ("right", right)):
        if isinstance(w, bool) or not isinstance(w, int):
            raise TypeError(f"window_size {side} must be an int, got {type(w).__name__}")
        if w < -1:
            raise ValueError(f"window_size {side} must be >= -1 (-1 means unbounded), got {w}")
    # flash-attn: causal is a window whose right edge is the diagonal.
    return left, (0 if causal else right)


def _check_softcap(softcap) -> float:
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"softcap must be a float, got {type(softcap).__name__}")
    if not (math.isfinite(softcap) and softcap >= 0):
        raise ValueError(f"softcap must be finite and >= 0 (0 disables it), got {softcap}")
    return float(softcap)


def _check_alibi(alibi_slopes, batch: int, nheads: int, device) -> torch.Tensor | None:
    if alibi_slopes is None:
        return None
    if not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.dtype != torch.float32:
        raise TypeError("alibi_slopes must be a float32 tensor")
    if tuple(alibi_slopes.shape) not in ((nheads,), (batch, nheads)):
        raise ValueError(f"alibi_slopes must have shape ({nheads},) or ({batch}, {nheads}), "
                         f"got {tuple(alibi_slopes.shape)}")
    if alibi_slopes.device != device:
        raise ValueError(f"alibi_slopes must be on {device}, got {alibi_slopes.device}")
    return alibi_slopes.contiguous()


def _check_cu_seqlens(name: str, cu: torch.Tensor, total: int, max_seqlen, device) -> list[int]:
    if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 2:
        raise TypeError(f"{name} must be a 1-D int32 tensor of batch + 1 prefix sums")
    if cu.device != device:
        raise ValueError(f"{name} must be on {device}, got {cu.device}")
    values = cu.tolist()  # one small device-to-host copy; a wrong cu_seqlens must never read out of bounds
    lengths = [b - a for a, b in zip(values, values[1:])]
    if values[0] != 0 or min(lengths) < 0:
        raise ValueError(f"{name} must start at 0 and never decrease, got {values[:8]}...")
    if values[-1] != total:
        raise ValueError(f"{name} ends at {values[-1]} but the packed tensor holds {total} tokens")
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int):
        raise TypeError(f"max_seqlen for {name} must be an int, got {type(max_seqlen).__name__}")
    if max_seqlen < max(lengths):
        raise ValueError(f"max_seqlen ({max_seqlen}) is smaller than the longest sequence in {name} "
                         f"({max(lengths)})")
    return lengths


def _check_rotary(cos, sin, interleaved, headdim: int, lengths_q: list[int], lengths_k: list[int], device):
    """Returns contiguous (cos, sin) or (None, None). Query i sits at position i + seqlen_k - seqlen_q,
    so every position lies in [0, seqlen_k)."""
    if cos is None and sin is None:
        return None, None
    if cos is None or sin is None:
        raise ValueError("rotary_cos and rotary_sin must be given together")
    for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() != 2:
            raise TypeError(f"{name} must be a 2-D floating-point tensor (seqlen, rotary_dim / 2)")
        if t.device != device:
            raise ValueError(f"{name} must be on {device}, got {t.device}")
    if cos.shape != sin.shape:
        raise ValueError(f"rotary_cos {tuple(cos.shape)} and rotary_sin {tuple(sin.shape)} differ in shape")
    if not isinstance(interleaved, bool):
        raise TypeError(f"rotary_interleaved must be a bool, got {type(interleaved).__name__}")
    rotary_dim = 2 * cos.shape[1]
    if not 0 < rotary_dim <= headdim:
        raise ValueError(f"rotary_dim (2 x {cos.shape[1]} = {rotary_dim}) must be in [2, headdim = {headdim}]")
    if cos.shape[0] < max(lengths_k):
        raise ValueError(f"rotary tables cover {cos.shape[0]} positions but seqlen_k is {max(lengths_k)}")
    if any(nq > nk for nq, nk in zip(lengths_q, lengths_k)):
        raise ValueError("rotary embeddings need seqlen_q <= seqlen_k: query i sits at position "
                         "i + seqlen_k - seqlen_q, which would be negative")
    return cos.contiguous(), sin.contiguous()


def _check_dropout(dropout_p, seed, offset) -> DropoutArgs | None:
    """None for p = 0 (the kernels then compile without any dropout code)."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if dropout_p == 0.0:
        return None
    # The kernels draw 8 random bits per score (dropout.py), so p is rounded to a multiple of
    # 1/256; a p that rounds to 0 or to 1 would silently mean no dropout or dropping everything.
    threshold = dropout_threshold(dropout_p)
    if not 0 < threshold < 256:
        raise ValueError(f"dropout_p must be 0 or in [1/512, 1 - 1/512): the kernels draw 8 random bits per "
                         f"score and round p to a multiple of 1/256, which would turn {dropout_p} into "
                         f"{threshold}/256")
    if seed is None:
        seed, offset = draw_seed_and_offset()
    for name, value, limit in (("dropout_seed", seed, 2**63), ("dropout_offset", offset, 2**31)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
            raise ValueError(f"{name} must be an int in [0, {limit}), got {value!r}")
    return DropoutArgs(float(dropout_p), seed, offset)


def _check_triton_device(q: torch.Tensor) -> None:
    if q.dtype not in _TRITON_DTYPES:
        raise TypeError(f"the triton backend supports float16, bfloat16 and float32, got {q.dtype}")
    if q.device.type != "cuda" and not triton_interpreted():
        raise ValueError(f"the triton backend needs CUDA tensors (got {q.device}); on the CPU use the "
                         "'torch' backend, or set TRITON_INTERPRET=1 before importing genoflash")


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    # The kernels take any batch/seq/head strides; only the channel stride must be 1.
    if t.stride(-1) != 1 or t.stride(-3) > _MAX_SEQ_STRIDE:
        t = t.contiguous()
    return t


# ---------------------------------------------------------------- backends

def _torch_kwargs(a: AttentionArgs) -> dict:
    """AttentionArgs -> the keyword arguments of the torch and reference backends."""
    return dict(causal=False, window_size=(a.window_left, a.window_right), softcap=a.softcap,
                alibi_slopes=a.alibi_slopes, dropout=a.dropout)


def _rotate_qk(q, k, a: AttentionArgs, inverse: bool = False):
    """RoPE for the torch and reference backends (the kernels rotate on chip instead). With
    inverse=True, maps gradients w.r.t. rotated q and k back to q and k. Differentiable."""
    if not a.rotary_dim:
        return q, k
    rotate = lambda x, offset: apply_rotary(x, a.rotary_cos, a.rotary_sin, a.rotary_interleaved,  # noqa: E731
                                            offset, inverse)
    if not a.varlen:
        return rotate(q, k.shape[1] - q.shape[1]), rotate(k, 0)
    cu_q, cu_k = a.cu_seqlens_q.tolist(), a.cu_seqlens_k.tolist()
    # Query i of sequence b sits at i + seqlen_k - seqlen_q of that sequence.
    offsets_q = [(k1 - k0) - (q1 - q0) for q0, q1, k0, k1 in zip(cu_q, cu_q[1:], cu_k, cu_k[1:])]
    table = (a.rotary_cos, a.rotary_sin)
    return (apply_rotary_packed(q, *table, cu_q, offsets_q, a.rotary_interleaved, inverse),
            apply_rotary_packed(k, *table, cu_k, [0] * len(offsets_q), a.rotary_interleaved, inverse))


def _forward(q, k, v, a: AttentionArgs, backend: str):
    if backend == "triton":
        from .forward import attention_forward  # triton is only needed for this backend
        return attention_forward(q, k, v, a)
    q, k = _rotate_qk(q, k, a)
    if a.varlen:
        return chunked.attention_chunked_varlen_forward(q, k, v, a.cu_seqlens_q, a.cu_seqlens_k,
                                                        a.softmax_scale, **_torch_kwargs(a))
    return chunked.attention_chunked_forward(q, k, v, a.softmax_scale, **_torch_kwargs(a))


def _backward(dout, q, k, v, out, lse, a: AttentionArgs, backend: str):
    if backend == "triton":
        from .backward import attention_backward
        return attention_backward(dout, q, k, v, out, lse, a)
    q, k = _rotate_qk(q, k, a)
    if a.varlen:
        dq, dk, dv = chunked.attention_chunked_varlen_backward(dout, q, k, v, out, lse, a.cu_seqlens_q,
                                                               a.cu_seqlens_k, a.softmax_scale, **_torch_kwargs(a))
    else:
        dq, dk, dv = chunked.attention_chunked_backward(dout, q, k, v, out, lse, a.softmax_scale, **_torch_kwargs(a))
    dq, dk = _rotate_qk(dq, dk, a, inverse=True)
    return dq, dk, dv


class FlashAttnFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, args: AttentionArgs, backend: str):
        q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
        out, lse = _forward(q, k, v, args, backend)
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
        dq, dk, dv = _backward(_last_dim_contiguous(dout), q, k, v, out, lse, ctx.args, ctx.backend)
        return dq, dk, dv, None, None


def _run(q, k, v, args: AttentionArgs, return_lse: bool, return_attn_probs: bool):
    out, lse = _attend(q, k, v, args)
    if return_attn_probs:  # flash-attn's testing output (out, lse, S_dmask); the probabilities are not kept
        return out, lse, None
    return (out, lse) if return_lse else out


def _attend(q, k, v, args: AttentionArgs):
    backend = select_backend(q.device)
    if backend == "reference":
        q, k = _rotate_qk(q, k, args)
        kw = _torch_kwargs(args)
        if args.varlen:
            out, lse = reference.attention_reference_varlen(q, k, v, args.cu_seqlens_q, args.cu_seqlens_k,
                                                            args.softmax_scale, **kw)
        else:
            out, lse = reference.attention_reference(q, k, v, args.softmax_scale, **kw)
        return out, lse.detach()
    if backend == "triton":
        _check_triton_device(q)
    return FlashAttnFunc.apply(q, k, v, args, backend)


def _attention_args(q, lengths_q: list[int], lengths_k: list[int], dropout_p, softmax_scale, causal, window_size,
                    softcap, alibi_slopes, rotary_cos, rotary_sin, rotary_interleaved, dropout_seed, dropout_offset,
                    deterministic=True, **varlen) -> AttentionArgs:
    """Validate the non-tensor arguments shared by both public functions, once, into AttentionArgs.
    lengths_q/k are the per-sequence lengths (one entry for a fixed-length batch)."""
    left, right = _check_window(window_size, causal)
    cos, sin = _check_rotary(rotary_cos, rotary_sin, rotary_interleaved, q.shape[-1], lengths_q, lengths_k, q.device)
    batch = len(lengths_q) if varlen else q.shape[0]
    return AttentionArgs(
        softmax_scale=_check_scale(softmax_scale, q.shape[-1]), window_left=left, window_right=right,
        softcap=_check_softcap(softcap), alibi_slopes=_check_alibi(alibi_slopes, batch, q.shape[-2], q.device),
        rotary_cos=cos, rotary_sin=sin, rotary_interleaved=rotary_interleaved,
        dropout=_check_dropout(dropout_p, dropout_seed, dropout_offset), deterministic=bool(deterministic), **varlen)


def flash_attn_block_backward(dout, q, k, v, out, lse, softmax_scale=None, causal=False, softcap=0.0):
    """Gradients (dq, dk, dv) of one block of a larger attention, given that attention's final
    output `out` and log-sum-exp `lse` (batch, nheads, seqlen_q).

    Ring attention splits the keys over devices; with the *global* out and lse, each block's
    P = exp(s - lse) and dS = P * (dP - rowsum(dout * out)) are exactly the global ones restricted
    to the block, so the block gradients add up to the full gradients. Not differentiable."""
    _check_qkv(q, k, v, varlen=False)
    if lse.shape != (q.shape[0], q.shape[2], q.shape[1]) or lse.dtype != torch.float32:
        raise ValueError(f"lse must be float32 (batch, nheads, seqlen_q) = {(q.shape[0], q.shape[2], q.shape[1])}, "
                         f"got {lse.dtype} {tuple(lse.shape)}")
    if dout.shape != out.shape or out.shape != (*q.shape[:-1], v.shape[-1]):
        raise ValueError(f"dout {tuple(dout.shape)} and out {tuple(out.shape)} must be (batch, seqlen_q, nheads, "
                         f"headdim_v) = {(*q.shape[:-1], v.shape[-1])}")
    args = _attention_args(q, [q.shape[1]], [k.shape[1]], 0.0, softmax_scale, causal, (-1, -1), softcap, None, None,
                           None, False, None, 0)
    backend = select_backend(q.device)
    if backend == "triton":
        _check_triton_device(q)
    dout, q, k, v, out = (_last_dim_contiguous(t) for t in (dout, q, k, v, out))
    with torch.no_grad():
        return _backward(dout, q, k, v, out, lse.contiguous(), args, backend)


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
            1,024, hd64 causal 2,048, hd256 causal 512) queries or keys on, with room for a float32 dQ accumulator,
            then runs as one pass in Gluon (ops/attention/backward_sm90.py); everything else, and True everywhere, runs the two
            triton passes, which write every gradient element from one program, without atomics,
            so that two backward passes are bitwise equal. (The triton one-pass form, with dQ
            summed in its dK/dV pass, is taken only where the tile table says so: nowhere on the
            H200, where it was slower.) The torch and reference backends are deterministic either way.
        return_attn_probs: flash-attn's testing output: returns (out, lse, None); the attention
            probabilities themselves are never materialised.
        return_lse: also return the log-sum-exp, float32 (batch, nheads, seqlen_q), natural log.
        dropout_seed, dropout_offset: the Philox key and counter offset; by default both are drawn
            from torch's default generator, so `torch.manual_seed` reproduces a run.

    Returns:
        out (batch, seqlen_q, nheads, headdim_v) in q's dtype, or (out, lse) when return_lse.
    """
    _check_qkv(q, k, v, varlen=False)
    args = _attention_args(q, [q.shape[1]], [k.shape[1]], dropout_p, softmax_scale, causal, window_size, softcap,
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
    """
    _check_qkv(q, k, v, varlen=True)
    lengths_q = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q, q.device)
    lengths_k = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k, q.device)
    if len(lengths_q) != len(lengths_k):
        raise ValueError(f"cu_seqlens_q describes {len(lengths_q)} sequences but cu_seqlens_k {len(lengths_k)}")
    args = _attention_args(q, lengths_q, lengths_k, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, rotary_cos, rotary_sin, rotary_interleaved, dropout_seed, dropout_offset,
                           deterministic, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                           max_seqlen_k=max_seqlen_k)
    return _run(q, k, v, args, return_lse, return_attn_probs)
