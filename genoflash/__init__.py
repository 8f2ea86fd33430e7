"""genoflash: exact FlashAttention in Triton for long-sequence genomic models."""

from .backends import BACKENDS, use_backend
from .ops.attention import flash_attn_func, flash_attn_varlen_func
from .ops.attention.dropout import dropout_mask
from .ops.rotary import apply_rotary_emb
from .padding import pad_input, unpad_input
from .rotary import apply_rotary, rotary_tables

__version__ = "0.1.0"

__all__ = ["BACKENDS", "apply_rotary", "apply_rotary_emb", "dropout_mask", "flash_attn_func", "flash_attn_varlen_func",
           "pad_input", "rotary_tables", "unpad_input", "use_backend", "__version__"]
