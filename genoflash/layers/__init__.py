"""nn.Modules built on genoflash's ops. Depends on ops only; models build on layers."""

from .attention import MultiHeadAttention, RotaryTables
from .hyena import HyenaOperator
from .mamba import BiMamba, Mamba
from .rotary import RotaryEmbedding

__all__ = ["BiMamba", "HyenaOperator", "Mamba", "MultiHeadAttention", "RotaryEmbedding", "RotaryTables"]
