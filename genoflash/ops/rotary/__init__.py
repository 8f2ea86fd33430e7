"""Rotary position embedding: reference.py (the tables and the readable PyTorch rotation),
forward.py (the Triton pass; the backward is the same kernel rotating the other way),
interface.py (`apply_rotary_emb`, flash-attn's name and arguments).

The attention kernels can also rotate Q and K on chip (flash_attn_func's rotary_cos /
rotary_sin). This pass writes rotated copies instead, and on the H200 it is the faster of the
two (docs/design/fused-rope-dropout.md), at the price of one Q- and one K-sized tensor."""

from .interface import apply_rotary_emb
from .reference import rotary_reference, rotary_tables, rotate, rotate_packed

__all__ = ["apply_rotary_emb", "rotary_reference", "rotary_tables", "rotate", "rotate_packed"]
