"""RoPE as a pass of its own, as a `torch.library` custom op for `torch.compile`:
`genoflash::apply_rotary`, with a fake (meta) implementation and an autograd formula (the inverse
rotation of the gradient).

Eager calls keep interface.py's paths; under `torch.compile` interface.py validates what the
shapes allow and calls this op on every backend, and the op checks what needs the tensors' values
(per-sequence offsets, cu_seqlens) when it runs: the torch backend's packed rotation splits by
those values, which a trace cannot. docs/design/custom-ops.md says why.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..common.checks import check_cu_seqlens
from .reference import rotary_reference
from .validation import check_positions


@torch.library.custom_op("genoflash::apply_rotary", mutates_args=())
def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool,
                 seqlen_offsets: Optional[torch.Tensor], seqlen_offset: int, cu_seqlens: Optional[torch.Tensor],
                 max_seqlen: int, inverse: bool, backend: str) -> torch.Tensor:
    """x rotated (inverse: rotated back) by rotary/forward.py's kernel on the triton backend, by
    reference.py's torch ops on the others. seqlen_offsets, if given, is the int32 per-sequence
    offsets and replaces the int seqlen_offset."""
    batch = x.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    offsets = [seqlen_offset] * batch if seqlen_offsets is None else seqlen_offsets.tolist()
    if not inverse:  # the values the trace could not check; the inverse runs on the forward's
        lengths = ([x.shape[1]] * batch if cu_seqlens is None else
                   check_cu_seqlens("cu_seqlens", cu_seqlens, x.shape[0], max_seqlen, x.device))
        check_positions(lengths, offsets, cos.shape[0])
    if backend != "triton":
        return rotary_reference(x, cos, sin, interleaved, offsets, None if cu_seqlens is None else cu_seqlens.tolist(),
                                inverse).contiguous()
    from .forward import rotary_forward
    if x.stride(-1) != 1:
        x = x.contiguous()
    return rotary_forward(x, cos, sin, interleaved, seqlen_offset if seqlen_offsets is None else seqlen_offsets,
                          cu_seqlens, max_seqlen, inverse=inverse)


@apply_rotary.register_fake
def _(x, *rest):
    return x.new_empty(x.shape)  # rotary_forward writes a new contiguous tensor


def _setup_context(ctx, inputs, output):
    x, *ctx.rest, ctx.inverse, ctx.backend = inputs


def _backward(ctx, dout):
    return (apply_rotary(dout, *ctx.rest, not ctx.inverse, ctx.backend),) + (None,) * (len(ctx.rest) + 2)


apply_rotary.register_autograd(_backward, setup_context=_setup_context)
