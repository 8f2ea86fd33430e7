"""Post-hoc reverse-complement conjoining: average a model over both strands of its input.

DNA is read from either strand, so a prediction for a sequence should agree with the
prediction for its reverse complement once positions are flipped back. Averaging the two
(as Enformer and Basenji do at test time) makes any model exactly strand-invariant:
wrapped(x) equals wrapped(rc(x)) with per-position outputs reversed.
"""

from __future__ import annotations

import torch
from torch import nn

from ..data.augment import reverse_complement_one_hot, reverse_complement_tokens
from ..data.tokenizer import VOCAB_SIZE
from .outputs import ModelOutput

# Token id -> its complement's id (the reverse complement of all ids, un-reversed); as an
# index along a vocabulary axis it swaps A/T and C/G and keeps N and the specials.
_COMPLEMENT_IDS = reverse_complement_tokens(torch.arange(VOCAB_SIZE)).flip(-1)


class ReverseComplementWrapper(nn.Module):
    """x -> mean of model(x) and model(rc(x)) mapped back to x's strand.

    x is a float one-hot (B, L, 4) (both axes flip) or integer tokens (B, L) (A<->T,
    C<->G, reversed). The model returns a dict of tensors (None values pass through):
    - outputs with 3 or more dims are per position, (B, positions, ...), and the
      reverse-strand copy is flipped along positions before averaging;
    - outputs with fewer dims (per sequence, e.g. class logits) are averaged as they are;
    - outputs named in `vocab_outputs` have a last axis over token ids (an LM's logits):
      "A on the reverse strand" is "T on this one", so that axis is complemented too.

    A causal LM is refused: its reverse-strand pass predicts the previous base, not the
    next, so the average would mix two different tasks.
    """

    def __init__(self, model: nn.Module, vocab_outputs: tuple[str, ...] = ("logits",)):
        super().__init__()
        if getattr(getattr(model, "config", None), "causal", False):
            raise ValueError("a causal LM cannot be conjoined over strands: on the reverse strand it "
                             "predicts the previous base; use a bidirectional (masked LM) model")
        self.model, self.vocab_outputs = model, vocab_outputs

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor | None]:
        rc = reverse_complement_one_hot(x) if x.is_floating_point() else reverse_complement_tokens(x)
        forward_strand, reverse_strand = self.model(x), self.model(rc)
        averaged = {name: None if out is None else (out + self._to_forward_strand(name, reverse_strand[name])) / 2
                    for name, out in forward_strand.items()}
        # The model's own output type (a DNALM's LMOutput) where it has one.
        return type(forward_strand)(averaged) if isinstance(forward_strand, ModelOutput) else averaged

    def _to_forward_strand(self, name: str, out: torch.Tensor) -> torch.Tensor:
        if out.dim() >= 3:
            out = out.flip(1)
        if name in self.vocab_outputs:
            if out.shape[-1] != VOCAB_SIZE:
                raise ValueError(f"output {name!r} has last axis {out.shape[-1]}, not the vocabulary "
                                 f"({VOCAB_SIZE}); pass vocab_outputs= naming the token-logit outputs")
            out = out.index_select(-1, _COMPLEMENT_IDS.to(out.device))
        return out
