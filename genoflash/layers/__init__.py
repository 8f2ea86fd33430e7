"""nn.Modules built on genoflash's ops. Depends on ops only; models build on layers."""

from .attention import KVCache, MultiHeadAttention, RotaryTables
from .hyena import HyenaOperator
from .mamba import BiMamba, Mamba
from .rotary import RotaryEmbedding

__all__ = ["BiMamba", "HyenaOperator", "KVCache", "Mamba", "MultiHeadAttention", "RotaryEmbedding", "RotaryTables"]
