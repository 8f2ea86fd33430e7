"""Models built on genoflash's layers: a DNA language model and an Enformer-style encoder.

| module | what |
|---|---|
| ``blocks`` | ``RMSNorm``, ``SwiGLU``, ``PreNormBlock`` (pre-norm mixer and SwiGLU, each residual) |
| ``dna_lm`` | ``DNALM``: causal or masked LM over bases; local/global layer pattern; ``MIXERS`` |
| ``enformer`` | ``Enformer``: conv tower to 128-bp bins, attention over bins, heads; ``encode_long`` |
| ``outputs`` | ``LMOutput``, ``SequenceClassifierOutput``: dicts that also read as tuples, the loss first (Hugging Face's way) |
| ``rc`` | ``ReverseComplementWrapper``: average over both strands |
| ``io`` | ``save_pretrained`` / ``load_pretrained``: config.json + model.safetensors |
"""

from .blocks import PreNormBlock, RMSNorm, SwiGLU
from .dna_lm import DNALM, MIXERS, DNALMConfig
from .enformer import AttentionPool, ConvBlock, ConvTower, Enformer, EnformerConfig
from .io import load_pretrained, save_pretrained
from .outputs import LMOutput, ModelOutput, SequenceClassifierOutput
from .rc import ReverseComplementWrapper

__all__ = [
    "RMSNorm", "SwiGLU", "PreNormBlock",
    "DNALM", "DNALMConfig", "MIXERS", "LMOutput", "ModelOutput", "SequenceClassifierOutput",
    "Enformer", "EnformerConfig", "ConvTower", "ConvBlock", "AttentionPool",
    "ReverseComplementWrapper",
    "save_pretrained", "load_pretrained",
]
