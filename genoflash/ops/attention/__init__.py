"""Exact attention: reference.py (what it computes), chunked.py (the torch backend),
forward.py / backward.py (the Triton kernels), kvcache.py (a decoding cache's layout),
interface.py (the public functions)."""

from .interface import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func, flash_attn_varlen_func,
                        flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache)
from .reference import attention_reference
from .validation import MAX_HEADDIM

__all__ = ["MAX_HEADDIM", "attention_reference", "flash_attn_func", "flash_attn_kvpacked_func",
           "flash_attn_qkvpacked_func", "flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache"]
