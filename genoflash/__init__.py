"""genoflash: exact FlashAttention in Triton for long-sequence genomic models."""

from .backends import BACKENDS, use_backend
from .ops.attention import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                            flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                            flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache)
from .ops.attention.dropout import dropout_mask
from .ops.rotary import apply_rotary_emb, rotary_tables
from .padding import pad_input, unpad_input
from .settings import Settings, settings

__version__ = "0.1.0"

__all__ = ["BACKENDS", "Settings", "apply_rotary_emb", "dropout_mask", "flash_attn_func", "flash_attn_kvpacked_func",
           "flash_attn_qkvpacked_func", "flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache", "pad_input", "rotary_tables", "settings",
           "unpad_input", "use_backend", "__version__"]
