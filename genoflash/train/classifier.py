"""A sequence classifier on the DNA LM trunk: bidirectional blocks, mean pool, linear head.

It reuses `DNALM`'s embedding, blocks and final norm (built with ``causal=False``), so the
L/G layer pattern and the window apply unchanged. Padded batches are packed to the varlen
layout first, so real tokens never attend to padding and padding costs no compute.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from ..data import PAD_ID
from ..models import SequenceClassifierOutput
from ..models.dna_lm import DNALM, DNALMConfig
from ..padding import pad_input, unpad_input


STEM_KERNEL = 15  # the default convolution stem: about one 16-base motif wide


class SequenceClassifier(nn.Module):
    """tokens (batch, seqlen) -> SequenceClassifierOutput(loss, logits (batch, num_classes)): a dict
    that reads as a tuple, the loss first when labels are given, as transformers' Trainer expects.

    Args:
        config: the trunk's shape; its ``causal`` flag is overridden to False (a classifier
            reads the whole sequence in both directions).
        num_classes: outputs of the linear head.
        stem_kernel: width of the residual convolution stem (odd; 0 for none).
    """

    def __init__(self, config: DNALMConfig, num_classes: int = 2, stem_kernel: int = STEM_KERNEL):
        super().__init__()
        self.config = dataclasses.replace(config, causal=False)
        self.trunk = DNALM(self.config)
        del self.trunk.lm_head  # the trunk's LM head is unused here (tied: no extra weights)
        # N(0, 1) embeddings, not the LM's N(0, 0.02): untied from any head, they need not be
        # small, and the local stem's features of a motif are then O(1) from the first step.
        # On the long-range task (where the label is an interaction of two far positions) the
        # small init left probes at chance where this one learned (at length 64, 600 steps).
        nn.init.normal_(self.trunk.embed.weight)
        # Single-nucleotide tokens carry no k-mer context; a short convolution gives each
        # position its neighbourhood, so attention can match motifs instead of spending its
        # first layers spelling them. It is local (stem_kernel bases), so long-range
        # relations still have to come from attention. 0 disables it.
        self.stem = (nn.Conv1d(self.config.dim, self.config.dim, stem_kernel, padding=stem_kernel // 2)
                     if stem_kernel else None)
        self.head = nn.Linear(self.config.dim, num_classes)

    def hidden_states(self, tokens: torch.Tensor,
                      attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Normed trunk outputs (batch, seqlen, dim) and the mask of the tokens read (batch,
        seqlen): not PAD, and true in attention_mask if one is given."""
        mask = tokens != PAD_ID
        if attention_mask is not None:
            if attention_mask.shape != tokens.shape:
                raise ValueError(f"attention_mask must be (batch, seqlen), the tokens' shape {tuple(tokens.shape)}; "
                                 f"got {tuple(attention_mask.shape)}")
            mask = mask & attention_mask.bool()
        trunk = self.trunk
        x = trunk.embed(tokens) * mask.unsqueeze(-1)
        if self.stem is not None:
            x = x + F.gelu(self.stem(x.transpose(1, 2))).transpose(1, 2) * mask.unsqueeze(-1)
        if bool(mask.all()):
            for block in trunk.blocks:
                x = block(x, None, None)
            return trunk.norm(x), mask
        packed, indices, cu_seqlens, max_seqlen, _ = unpad_input(x, mask)
        for block in trunk.blocks:
            packed = block(packed, cu_seqlens, max_seqlen)
        return pad_input(trunk.norm(packed), indices, *tokens.shape), mask

    def forward(self, tokens: torch.Tensor | None = None, labels: torch.Tensor | None = None, *,
                input_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> SequenceClassifierOutput:
        """The token ids as tokens or input_ids (Hugging Face's name); attention_mask (batch,
        seqlen), if given, leaves out the positions where it is 0, as PAD tokens are."""
        if (tokens is None) == (input_ids is None):
            raise TypeError("SequenceClassifier takes the token ids as tokens or as input_ids, one of the two; "
                            "got " + ("both" if tokens is not None else "neither"))
        tokens = tokens if tokens is not None else input_ids
        x, mask = self.hidden_states(tokens, attention_mask)
        weights = mask.unsqueeze(-1).to(x.dtype)
        pooled = (x * weights).sum(1) / weights.sum(1).clamp_min(1.0)  # an all-padding row pools to 0
        logits = self.head(pooled).float()
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return SequenceClassifierOutput(loss=loss, logits=logits)
