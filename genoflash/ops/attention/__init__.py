"""Exact attention: reference.py (what it computes), chunked.py (the torch backend),
forward.py / backward.py (the Triton kernels), interface.py (the public functions)."""

from .interface import flash_attn_func, flash_attn_varlen_func
from .reference import attention_reference
from .validation import MAX_HEADDIM

__all__ = ["MAX_HEADDIM", "flash_attn_func", "flash_attn_varlen_func", "attention_reference"]
