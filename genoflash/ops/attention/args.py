"""The non-tensor arguments of an attention call, validated and normalised once.

Kept free of triton so the `torch` and `reference` backends work where triton is absent.
"""

from __future__ import annotations

import dataclasses

import torch

from ...settings import Settings
from .dropout import DropoutArgs


@dataclasses.dataclass(frozen=True)
class AttentionArgs:
    """Everything about a call that is not a tensor of the attention itself, normalised once.

    cu_seqlens_q/k are None for fixed-length batches; window bounds of -1 mean unbounded,
    and causal is folded in as window_right = 0. rotary_cos/sin are None without RoPE."""
    softmax_scale: float
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0
    alibi_slopes: torch.Tensor | None = None
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    rotary_cos: torch.Tensor | None = None  # (seqlen_ro, rotary_dim / 2), contiguous
    rotary_sin: torch.Tensor | None = None
    rotary_interleaved: bool = False
    dropout: DropoutArgs | None = None  # None: no dropout (p = 0 compiles without any dropout code)
    # False: on Hopper the backward may run as one pass that sums dQ in float32 in no fixed order
    # (backward_sm90.py; not bitwise reproducible).
    deterministic: bool = True
    # genoflash.settings() as they were when the call was made: the backward, which autograd may
    # run on another thread, runs with the forward's settings. None stands for the defaults: a
    # Settings instance as the default value would be a constant Dynamo (torch 2.11) cannot wrap
    # while it traces the constructor.
    settings: Settings | None = None

    def __post_init__(self):
        if self.settings is None:
            object.__setattr__(self, "settings", Settings())

    @property
    def rotary_dim(self) -> int:
        return 0 if self.rotary_cos is None else 2 * self.rotary_cos.shape[1]

    @property
    def rotary_table_bytes(self) -> int:
        """Bytes per cos/sin entry (0 without RoPE): the tables stream beside K or Q, so tile
        configs depend on it."""
        return 0 if self.rotary_cos is None else self.rotary_cos.element_size()

    @property
    def rotary_stride(self) -> int:
        return 0 if self.rotary_cos is None else self.rotary_cos.stride(0)

    @property
    def varlen(self) -> bool:
        return self.cu_seqlens_q is not None

    @property
    def causal_only(self) -> bool:
        return self.window_right == 0 and self.window_left < 0
