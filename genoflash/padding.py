"""Move a padded batch in and out of the packed varlen layout (like flash-attn's bert_padding).

A batch of windows of different lengths is usually stored padded, (batch, seqlen, ...),
with a key-padding mask. `unpad_input` packs the real tokens into (total, ...) and returns
the `cu_seqlens` that `flash_attn_varlen_func` takes; `pad_input` puts results back. Both
are differentiable.
"""

from __future__ import annotations

import torch


def unpad_input(hidden_states: torch.Tensor, attention_mask: torch.Tensor, unused_mask: torch.Tensor | None = None):
    """Pack the tokens where attention_mask (or unused_mask) is true, as flash-attn's bert_padding does.

    Args:
        hidden_states: (batch, seqlen, ...).
        attention_mask: (batch, seqlen), bool or 0/1; true for real tokens.
        unused_mask: optional (batch, seqlen), true for tokens that are packed too but are not
            real (allocated but unused, e.g. a static cache's free slots); disjoint from
            attention_mask.

    Returns:
        (packed (total, ...), indices (total,) into the flattened batch, cu_seqlens int32
        (batch + 1,) over the packed tokens, max_seqlen (int) of them, seqlens int32 (batch,) of
        the real tokens alone).
    """
    shape = tuple(hidden_states.shape[:2])
    if attention_mask.dim() != 2 or tuple(attention_mask.shape) != shape:
        raise ValueError(f"attention_mask must be (batch, seqlen) = {shape}, got {tuple(attention_mask.shape)}")
    used = attention_mask.bool()
    packed_mask = used
    if unused_mask is not None:
        if unused_mask.dim() != 2 or tuple(unused_mask.shape) != shape:
            raise ValueError(f"unused_mask must be (batch, seqlen) = {shape}, got {tuple(unused_mask.shape)}")
        unused = unused_mask.bool()
        if bool((used & unused).any()):
            raise ValueError("unused_mask must be false wherever attention_mask is true: a token is used or unused")
        packed_mask = used | unused
    seqlens = packed_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(packed_mask.flatten(), as_tuple=False).flatten()
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    packed = hidden_states.flatten(0, 1).index_select(0, indices)
    used_seqlens = seqlens if unused_mask is None else used.sum(dim=-1, dtype=torch.int32)
    return packed, indices, cu_seqlens, int(seqlens.max().item()), used_seqlens


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Inverse of `unpad_input`: (total, ...) -> (batch, seqlen, ...), zeros at padding."""
    out = torch.zeros((batch * seqlen, *hidden_states.shape[1:]), device=hidden_states.device,
                      dtype=hidden_states.dtype)
    out = out.index_put((indices,), hidden_states)
    return out.view(batch, seqlen, *hidden_states.shape[1:])
