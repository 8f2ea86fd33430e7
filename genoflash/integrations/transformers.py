"""genoflash as a Hugging Face transformers attention implementation.

    import genoflash.integrations.transformers          # registers "genoflash"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="genoflash")

Any transformers model that dispatches through `AttentionInterface` (Llama, Qwen, Mistral,
Gemma, ModernBERT, ...) then runs its attention on genoflash: causal or not, GQA, sliding
windows, softcap and dropout in the kernels. Padding masks arrive as transformers gives them
to FlashAttention-2, a 2-D (batch, kv_len) boolean mask or None (`flash_attention_mask`); a
padded batch is packed to the varlen layout, so padding costs no compute. Packed batches
(padding-free training, where transformers passes cu_seq_lens_q/k) run varlen as well.

transformers treats every implementation whose name contains "flash" as a FlashAttention
flavour and preloads its functions by name (`modeling_flash_attention_utils._lazy_imports`),
which knows flash-attn 2/3/4 and Hub kernels only. `register()` wraps that loader so the name
"genoflash" resolves to genoflash's own flash-attn-compatible functions; every other name
goes through unchanged.
"""

from __future__ import annotations

import math
import weakref

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

from ..backends import select_backend
from ..ops.attention import flash_attn_func, flash_attn_varlen_func
from ..ops.attention.validation import check_scale, check_softcap, last_dim_contiguous
from ..padding import pad_input, unpad_input

NAME = "genoflash"


def genoflash_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                                value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                                scaling: float | None = None, is_causal: bool | None = None,
                                sliding_window: int | None = None, softcap: float | None = None,
                                **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention call: query (batch, nheads, q_len, headdim), key/value
    (batch, nheads_kv, kv_len, headdim) -> ((batch, q_len, nheads, headdim), None)."""
    if kwargs.get("output_attentions"):
        raise ValueError("genoflash never forms the attention matrix: output_attentions is not available; "
                         "use attn_implementation='eager' to inspect attention weights")
    if query.shape[2] == 1 and not dropout and kwargs.get("cu_seq_lens_q") is None \
            and select_backend(query.device) == "triton":
        return _decode_step(module, query, key, value, attention_mask, scaling, sliding_window, softcap), None
    q, k, v = _common_dtype(module, *(t.transpose(1, 2) for t in (query, key, value)))  # (batch, seqlen, heads, dim)
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    # transformers counts a window in tokens including the current one; flash-attn's bounds are
    # inclusive offsets, so a window of w tokens is w - 1 to each side.
    window = (-1, -1) if sliding_window is None else (sliding_window - 1, sliding_window - 1)
    kw = dict(dropout_p=dropout, softmax_scale=scaling, causal=causal, window_size=window, softcap=softcap or 0.0)
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is None and attention_mask is None:
        cu_q = cu_k = _packed_boundaries(kwargs.get("position_ids"), q.shape[0], q.shape[1], k.shape[1])
    if cu_q is not None and cu_k is not None:  # a packed batch: (1, total, heads, dim) and prefix sums
        max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
        max_q = int(max_q) if max_q is not None else int((cu_q[1:] - cu_q[:-1]).max())
        max_k = int(max_k) if max_k is not None else int((cu_k[1:] - cu_k[:-1]).max())
        out = flash_attn_varlen_func(q[0], k[0], v[0], cu_q.to(torch.int32), cu_k.to(torch.int32), max_q, max_k,
                                     **kw)
        return out[None], None
    _check_mask(attention_mask)
    if attention_mask is not None and k.shape[1] > attention_mask.shape[1]:
        # A static cache: K/V hold every slot it allocated, the mask covers the filled ones, which
        # come first (transformers' FlashAttention path slices the same way).
        k, v = k[:, :attention_mask.shape[1]], v[:, :attention_mask.shape[1]]
    if attention_mask is None:
        return flash_attn_func(q, k, v, **kw), None
    batch, q_len = q.shape[:2]
    kv_mask = attention_mask[:, -k.shape[1]:]
    q_mask = kv_mask[:, -q_len:]  # queries are the last q_len positions (decoding with a cache)
    q_packed, q_index, cu_q, max_q, _ = unpad_input(q, q_mask)
    k_packed, _, cu_k, max_k, _ = unpad_input(k, kv_mask)
    v_packed, _, _, _, _ = unpad_input(v, kv_mask)
    out = flash_attn_varlen_func(q_packed, k_packed, v_packed, cu_q, cu_k, max_q, max_k, **kw)
    # Fully padded query rows come back as zeros.
    return pad_input(out, q_index, batch, q_len), None


_decode = None


def _decode_module():
    """ops.attention.decode, imported on first use: it needs triton, which the torch backend does not."""
    global _decode
    if _decode is None:
        from ..ops.attention import decode
        _decode = decode
    return _decode


def _check_mask(attention_mask) -> None:
    if attention_mask is not None and (attention_mask.dim() != 2 or attention_mask.dtype != torch.bool):
        raise ValueError(f"genoflash expects transformers' 2-D boolean padding mask (batch, kv_len), got "
                         f"{attention_mask.dtype} {tuple(attention_mask.shape)}")


def _decode_step(module, query, key, value, attention_mask, scaling, sliding_window, softcap) -> torch.Tensor:
    """One new token per sequence against the cache, read where transformers keeps it, in its
    (batch, heads, kv_len, dim) layout: the split-KV decoding kernel, with the padding mask read
    by the kernel, key by key, so the step neither copies the cache nor waits on the host. Padded
    slots are skipped and windows count positions, as eager attention does. Returns
    (batch, 1, heads, dim). The host sets a generation's pace, so this path does only what a
    decoding step needs (docs/design/decoding.md)."""
    decode = _decode_module()
    query, key, value = _common_dtype(module, query, key, value)
    _check_mask(attention_mask)
    if attention_mask is not None and key.shape[2] > attention_mask.shape[1]:  # a static cache (as above)
        key, value = key[:, :, :attention_mask.shape[1]], value[:, :, :attention_mask.shape[1]]
    if query.stride(-1) != 1 or key.stride(-1) != 1 or value.stride(-1) != 1:  # the kernel's one layout demand
        query, key, value = (last_dim_contiguous(t) for t in (query, key, value))
    keys = key.shape[2]
    mask = None if attention_mask is None else attention_mask[:, -keys:]
    # (transformers passes the layer's float scaling and softcap: checked without a call where they are)
    scale = scaling if type(scaling) is float and 0.0 < scaling < math.inf else check_scale(scaling, query.shape[-1])
    cap = softcap if type(softcap) is float and 0.0 <= softcap < math.inf else check_softcap(softcap or 0.0)
    # transformers counts a window in tokens including the current one; flash-attn's bounds are
    # inclusive offsets. One query at the last position: nothing lies right of it.
    left = -1 if sliding_window is None else sliding_window - 1
    right = 0 if left >= 0 else -1
    if torch.compiler.is_compiling():  # a static cache's step, compiled by transformers: one graph node
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))
        return decode.decode_attention_op(q, k, v, None, keys, scale, left, right, cap, None, None, None, None, mask,
                                          0)[0]
    return decode.decode_attention(query, key, value, None, keys, softmax_scale=scale, window_left=left,
                                   window_right=right, softcap=cap, key_mask=mask, return_lse=False,
                                   heads_first=True)[0]


def _common_dtype(module: torch.nn.Module, q, k, v):
    """q, k and v in one 16-bit dtype where transformers' FlashAttention path casts them: under
    autocast (with float32 weights, RoPE leaves q and k in float32 beside a bfloat16 v) the autocast
    dtype; otherwise, where they differ, the dtype of the layer's weights. Same-dtype inputs outside
    autocast pass unchanged (float32 runs as float32)."""
    device_type = q.device.type
    autocast = torch.is_autocast_enabled(device_type)
    if q.dtype == k.dtype == v.dtype and not (autocast and q.dtype == torch.float32):
        return q, k, v
    if autocast:
        target = torch.get_autocast_dtype(device_type)
    else:
        target = next((p.dtype for p in module.parameters() if p.is_floating_point()), q.dtype)
    return q.to(target), k.to(target), v.to(target)


# The last position_ids read, (a weak reference to the tensor, its in-place version, the answer):
# telling a packed batch from one sequence reads position_ids on the host, a device sync, and
# every layer of a forward gets the same tensor, so it is read once per forward, not per layer.
_boundaries_read: tuple = (None, -1, None)


def _packed_boundaries(position_ids, batch: int, q_len: int, kv_len: int):
    """cu_seqlens of a padding-free packed batch, told by position_ids restarting at 0 (as
    transformers' FlashAttention path reads them), or None for an ordinary batch."""
    global _boundaries_read
    if position_ids is None or batch != 1 or q_len != kv_len or position_ids.shape[-1] != q_len:
        return None
    if position_ids.is_inference():  # (no version counter: read each time)
        return _read_boundaries(position_ids, q_len)
    ref, version, cu = _boundaries_read
    if ref is not None and ref() is position_ids and version == position_ids._version:
        return cu
    cu = _read_boundaries(position_ids, q_len)
    _boundaries_read = (weakref.ref(position_ids), position_ids._version, cu)
    return cu


def _read_boundaries(position_ids, q_len: int):
    pos = position_ids.reshape(-1)
    if torch.equal(pos, torch.arange(q_len, device=pos.device) + pos.min()):
        return None  # one sequence
    starts = (pos == 0).nonzero().flatten()
    if starts.numel() == 0 or starts[0] != 0:
        return None
    return torch.cat([starts, starts.new_tensor([q_len])]).to(torch.int32)


def _patch_flash_loader() -> None:
    from transformers import modeling_flash_attention_utils as fa_utils

    loader = getattr(fa_utils, "_lazy_imports", None)
    if loader is None or getattr(loader, "_genoflash", False):
        return

    def lazy_imports(implementation, *args, **kwargs):
        if implementation == NAME:
            return flash_attn_func, flash_attn_varlen_func, None, fa_utils._pad_input, fa_utils._unpad_input
        return loader(implementation, *args, **kwargs)

    lazy_imports._genoflash = True
    fa_utils._lazy_imports = lazy_imports


def register() -> None:
    """Register "genoflash" with transformers (idempotent)."""
    AttentionInterface.register(NAME, genoflash_attention_forward)
    AttentionMaskInterface.register(NAME, flash_attention_mask)
    _patch_flash_loader()


register()
