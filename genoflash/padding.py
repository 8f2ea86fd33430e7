"""Move a padded batch in and out of the packed varlen layout (like flash-attn's bert_padding).

A batch of windows of different lengths is usually stored padded, (batch, seqlen, ...),
with a key-padding mask. `unpad_input` packs the real tokens into (total, ...) and returns
the `cu_seqlens` that `flash_attn_varlen_func` takes; `pad_input` puts results back. Both
are differentiable.
"""

from __future__ import annotations

import torch


def unpad_input(hidden_states: torch.Tensor, attention_mask: torch.Tensor):
    """Pack the tokens where attention_mask is true.

    Args:
        hidden_states: (batch, seqlen, ...).
        attention_mask: (batch, seqlen), bool or 0/1; true for real tokens.

    Returns:
        (packed (total, ...), indices (total,) into the flattened batch, cu_seqlens int32
        (batch + 1,), max_seqlen (int), seqlens int32 (batch,)).
    """
    if attention_mask.dim() != 2 or tuple(attention_mask.shape) != tuple(hidden_states.shape[:2]):
        raise ValueError(f"attention_mask must be (batch, seqlen) = {tuple(hidden_states.shape[:2])}, "
                         f"got {tuple(attention_mask.shape)}")
    mask = attention_mask.bool()
    seqlens = mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    packed = hidden_states.flatten(0, 1).index_select(0, indices)
    return packed, indices, cu_seqlens, int(seqlens.max().item()), seqlens


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Inverse of `unpad_input`: (total, ...) -> (batch, seqlen, ...), zeros at padding."""
    out = torch.zeros((batch * seqlen, *hidden_states.shape[1:]), device=hidden_states.device,
                      dtype=hidden_states.dtype)
    out = out.index_put((indices,), hidden_states)
    return out.view(batch, seqlen, *hidden_states.shape[1:])
