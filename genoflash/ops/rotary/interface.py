"""`apply_rotary_emb`: RoPE as a pass of its own, with flash-attn's name and arguments
(flash_attn.layers.rotary.apply_rotary_emb). Validate -> the chosen backend: `triton` runs
forward.py's kernel inside an autograd Function that keeps only the tables; `torch` and
`reference` run reference.py's PyTorch rotation (differentiable as it is)."""

from __future__ import annotations

import torch

from ...backends import select_backend
from ..common.checks import as_int, check_cu_seqlens, check_triton_device
from . import custom_ops
from .reference import rotary_reference
from .validation import check_offsets, check_positions



class RotaryFunction(torch.autograd.Function):
    """out = x rotated pair by pair to its positions. Saves the tables (and the offsets and
    cu_seqlens), never x: the backward rotates the output's gradient back by the same angles."""

    @staticmethod
    def forward(ctx, x, cos, sin, interleaved, seqlen_offsets, cu_seqlens, max_seqlen, inplace):
        from .forward import rotary_forward
        offsets = seqlen_offsets if isinstance(seqlen_offsets, torch.Tensor) else None
        ctx.save_for_backward(cos, sin, offsets, cu_seqlens)
        ctx.interleaved, ctx.int_offset, ctx.max_seqlen = interleaved, seqlen_offsets, max_seqlen
        if inplace:
            ctx.mark_dirty(x)  # autograd's version counter then refuses any earlier use of x's old values
        return rotary_forward(x, cos, sin, interleaved, seqlen_offsets, cu_seqlens, max_seqlen,
                              out=x if inplace else None)

    @staticmethod
    def backward(ctx, dout):
        from .forward import rotary_forward
        cos, sin, offsets, cu_seqlens = ctx.saved_tensors
        seqlen_offsets = offsets if offsets is not None else ctx.int_offset
        dout = dout if dout.stride(-1) == 1 else dout.contiguous()
        dx = rotary_forward(dout, cos, sin, ctx.interleaved, seqlen_offsets, cu_seqlens, ctx.max_seqlen, inverse=True)
        return dx, None, None, None, None, None, None, None


def apply_rotary_emb(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False,
                     inplace: bool = False, seqlen_offsets: int | torch.Tensor = 0,
                     cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None) -> torch.Tensor:
    """Rotary position embedding, as a new tensor, or written into x (inplace=True: x is returned).

    Args:
        x: (batch, seqlen, nheads, headdim), or packed (total, nheads, headdim) with cu_seqlens.
        cos, sin: (positions, rotary_dim / 2) tables, e.g. `genoflash.rotary_tables`; the first
            rotary_dim channels of each head rotate, the rest pass through.
        interleaved: GPT-J pairs (2m, 2m + 1) instead of NeoX halves (m, m + rotary_dim / 2).
        inplace: write the rotation into x and return x (no new tensor on the triton backend when
            x's channels are contiguous; the others rotate into a temporary and copy it back). As
            with any in-place operation, a leaf that requires grad is refused by autograd.
        seqlen_offsets: token t of a sequence sits at position t + seqlen_offsets; an int, or one
            per sequence as an integer (batch,) tensor.
        cu_seqlens, max_seqlen: a packed batch's int32 prefix sums and its longest sequence;
            positions restart at 0 (plus the offset) in each sequence.

    Differentiable with respect to x; the tables get no gradient. The rotation is computed in
    float32 and rounded once to x's dtype (float64 x: the PyTorch backends, in float64).
    """
    varlen = cu_seqlens is not None
    rank, layout = (3, "(total, nheads, headdim)") if varlen else (4, "(batch, seqlen, nheads, headdim)")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError("x must be a floating-point torch.Tensor")
    if x.dim() != rank:
        raise ValueError(f"x must have rank {rank} {layout}, got shape {tuple(x.shape)}")
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() != 2:
            raise TypeError(f"{name} must be a 2-D floating-point tensor (positions, rotary_dim / 2)")
        if t.device != x.device:
            raise ValueError(f"{name} must be on {x.device}, got {t.device}")
    if cos.shape != sin.shape:
        raise ValueError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} differ in shape")
    if not 0 < 2 * cos.shape[1] <= x.shape[-1]:
        raise ValueError(f"rotary_dim (2 x {cos.shape[1]}) must be in [2, headdim = {x.shape[-1]}]")
    if not isinstance(interleaved, bool):
        raise TypeError(f"interleaved must be a bool, got {type(interleaved).__name__}")
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace must be a bool, got {type(inplace).__name__}")
    if varlen:
        max_seqlen = as_int("max_seqlen", max_seqlen)
        lengths = check_cu_seqlens("cu_seqlens", cu_seqlens, x.shape[0], max_seqlen, x.device)
        batch = cu_seqlens.shape[0] - 1
    else:
        if max_seqlen is not None:
            raise ValueError("max_seqlen goes with cu_seqlens (a packed batch)")
        lengths, batch, max_seqlen = [x.shape[1]] * x.shape[0], x.shape[0], x.shape[1]
    offsets, offset_values = check_offsets(seqlen_offsets, batch, x.device)
    if lengths is not None and offset_values is not None:  # else (compiling) the op checks them
        check_positions(lengths, offset_values, cos.shape[0])
    if x.numel() == 0:
        return x if inplace else x.clone()
    out = _rotate(x, cos, sin, interleaved, offsets, offset_values, cu_seqlens, max_seqlen, inplace)
    # Only the triton kernel writes where x lies (eager, channels contiguous); the other paths
    # rotate into a new tensor, copied back.
    return x.copy_(out) if inplace and out is not x else out


def _rotate(x, cos, sin, interleaved, offsets, offset_values, cu_seqlens, max_seqlen, inplace):
    backend = select_backend(x.device)
    if torch.compiler.is_compiling():  # one graph node (docs/design/custom-ops.md)
        if backend == "triton":
            check_triton_device(x)
        per_sequence = isinstance(offsets, torch.Tensor)
        return custom_ops.apply_rotary(x, cos.contiguous(), sin.contiguous(), interleaved,
                                       offsets if per_sequence else None, 0 if per_sequence else offsets,
                                       cu_seqlens, max_seqlen, False, backend)
    if backend != "triton":
        if offset_values is None:  # not read (settings(check_indices=False)): torch ops need them on the host
            offset_values = offsets.tolist()
        return rotary_reference(x, cos, sin, interleaved, offset_values,
                                None if cu_seqlens is None else cu_seqlens.tolist())
    check_triton_device(x)
    if x.stride(-1) != 1:
        return RotaryFunction.apply(x.contiguous(), cos.contiguous(), sin.contiguous(), interleaved, offsets,
                                    cu_seqlens, max_seqlen, False)
    return RotaryFunction.apply(x, cos.contiguous(), sin.contiguous(), interleaved, offsets, cu_seqlens, max_seqlen,
                                inplace)
