"""A DNA language model: single-nucleotide tokens, pre-norm blocks of a sequence mixer + SwiGLU.

Causal (next-base prediction, as HyenaDNA and Evo) or bidirectional (masked LM, as
DNABERT and Caduceus). The mixer of each layer is picked by a letter of `layer_pattern`:
genoflash attention with RoPE (a Triton pass before the kernels), global (G) or sliding-window local
(L, O(N x window)), or the Hyena operator (H, FFT long convolutions, O(N log N)), or Mamba's selective scan (M,
O(N); BiMamba for a masked LM). Hybrids such as StripedHyena's (mostly Hyena, some
attention: "HHHG") or Jamba-like "MMMG" are patterns too (`MIXERS`: letter -> factory).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..data import IGNORE_INDEX, VOCAB_SIZE
from ..layers import BiMamba, HyenaOperator, KVCache, Mamba, MultiHeadAttention
from ..padding import pad_input, unpad_input
from .blocks import PreNormBlock, RMSNorm, swiglu_hidden
from .outputs import LMOutput

LAYER_LETTERS = {"L": "sliding-window local attention", "G": "global (full) attention",
                 "H": "Hyena long convolution", "M": "Mamba selective scan (bidirectional: BiMamba)"}
MIXER_NAMES = {"attention": None, "hyena": "H", "mamba": "M"}  # mixer= shorthand -> every layer's letter


@dataclass
class DNALMConfig:
    """Shape and behaviour of a DNALM; saved as config.json by `save_pretrained`.

    Attributes:
        vocab_size: token ids the embedding and LM head cover (the tokenizer's 9).
        dim, depth, nheads: width, number of blocks, query heads (head_dim = dim // nheads).
        nheads_k: K/V heads (fewer than nheads gives GQA/MQA); None means nheads.
        ffn_mult: SwiGLU hidden width is ffn_mult * dim, rounded up to a multiple of 64; 0 leaves
            the feed-forward out (mixer-only blocks, as Mamba's and Caduceus's LMs stack).
        causal: True for a causal LM (position i sees 0..i), False for a masked LM.
        rotary_base, rotary_interpolation: RoPE base and linear position interpolation.
        rotary_fused: rotate Q and K inside the attention kernels instead of in a pass of
            their own before them (`MultiHeadAttention`; the pass is faster on the H200).
        attn_dropout: dropout on the attention probabilities (training only), fused.
        window_size: how far (in tokens) a local layer's query sees, on each side it may look.
        layer_pattern: one letter per layer, repeated to `depth`: L (local attention), G
            (global attention), H (Hyena); "LLLG" with depth 8 gives LLLGLLLG. Its length must
            divide depth.
        mixer: "attention" (the letters decide), or "hyena" / "mamba" as shorthand for every
            layer being H / M (then layer_pattern must be left at its default).
        hyena_l_max: the longest sequence a Hyena layer's implicit filters are defined for
            (positions are normalised by it; cost does not depend on it).
        hyena_order: (long convolution, gate) steps per Hyena layer.
        hyena_normalize_filters: divide each implicit filter by its window's sum, so outputs
            stay bounded at any l_max (off, as in HyenaDNA: see `HyenaFilter`).
        mamba_d_state: state size per channel of a Mamba layer (M; BiMamba when not causal).
        gradient_checkpointing: recompute each block in the backward instead of storing
            its activations (training only).
        tie_embeddings: the LM head shares the embedding matrix.
        num_labels: None for a language model; a number of classes makes the head a per-base
            classifier instead (token classification: logits (batch, seqlen, num_labels), labels
            one class id per base), untied from the embedding.
    """

    vocab_size: int = VOCAB_SIZE
    dim: int = 256
    depth: int = 8
    nheads: int = 8
    nheads_k: int | None = None
    ffn_mult: float = 8 / 3
    causal: bool = True
    rotary_base: float = 10000.0
    rotary_interpolation: float = 1.0
    rotary_fused: bool = False
    attn_dropout: float = 0.0
    window_size: int = 512
    layer_pattern: str = "G"
    mixer: str = "attention"
    hyena_l_max: int = 1 << 20
    hyena_order: int = 2
    hyena_normalize_filters: bool = False
    mamba_d_state: int = 16
    gradient_checkpointing: bool = False
    tie_embeddings: bool = True
    num_labels: int | None = None

    def __post_init__(self):
        if self.num_labels is not None and (isinstance(self.num_labels, bool) or not isinstance(self.num_labels, int)
                                            or self.num_labels < 2):
            raise ValueError(f"num_labels must be None (a language model) or an int >= 2, got {self.num_labels!r}")
        if self.mixer not in MIXER_NAMES:
            raise ValueError(f"unknown mixer {self.mixer!r}; choose one of {', '.join(MIXER_NAMES)}")
        if MIXER_NAMES[self.mixer] is not None:
            if self.layer_pattern not in ("G", MIXER_NAMES[self.mixer]):
                raise ValueError(f"mixer={self.mixer!r} makes every layer {MIXER_NAMES[self.mixer]}; for a hybrid, "
                                 f"leave mixer='attention' and use layer_pattern letters (got {self.layer_pattern!r})")
            self.layer_pattern = MIXER_NAMES[self.mixer]
        if not (math.isfinite(self.ffn_mult) and self.ffn_mult >= 0):
            raise ValueError(f"ffn_mult must be a number >= 0 (0: no feed-forward), got {self.ffn_mult!r}")
        if self.dim % self.nheads:
            raise ValueError(f"dim ({self.dim}) must be divisible by nheads ({self.nheads})")
        unknown = set(self.layer_pattern) - set(LAYER_LETTERS)
        if not self.layer_pattern or unknown:
            raise ValueError(f"layer_pattern {self.layer_pattern!r}: use the letters "
                             + ", ".join(f"{k} ({v})" for k, v in LAYER_LETTERS.items()))
        if self.depth % len(self.layer_pattern):
            raise ValueError(f"layer_pattern {self.layer_pattern!r} (length {len(self.layer_pattern)}) "
                             f"must repeat a whole number of times in depth {self.depth}")
        if "L" in self.layer_pattern and self.window_size < 0:
            raise ValueError(f"window_size must be >= 0 for local layers, got {self.window_size}")

    @property
    def layer_letters(self) -> str:
        """The pattern repeated to one letter per layer."""
        return self.layer_pattern * (self.depth // len(self.layer_pattern))


def attention_mixer(config: DNALMConfig, letter: str) -> nn.Module:
    """genoflash MultiHeadAttention with RoPE; windowed for an L layer."""
    window = config.window_size
    # Causal masking already hides keys to the right, so a causal window is (window, 0).
    window_size = (window, 0 if config.causal else window) if letter == "L" else (-1, -1)
    return MultiHeadAttention(config.dim, config.nheads, config.nheads_k, causal=config.causal,
                              window_size=window_size, rotary_base=config.rotary_base,
                              rotary_interpolation=config.rotary_interpolation, rotary_fused=config.rotary_fused,
                              dropout=config.attn_dropout)


class HyenaMixer(nn.Module):
    """The Hyena operator with the mixer call signature (x, cu_seqlens, max_seqlen)."""

    def __init__(self, config: DNALMConfig):
        super().__init__()
        self.hyena = HyenaOperator(config.dim, config.hyena_l_max, order=config.hyena_order, causal=config.causal,
                                   normalize_filters=config.hyena_normalize_filters)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None,
                max_seqlen: int | None = None) -> torch.Tensor:
        if cu_seqlens is not None:
            raise ValueError("Hyena layers take (batch, seqlen, dim) batches; packed (varlen) input would "
                             "convolve across sequence boundaries")
        return self.hyena(x)


def hyena_mixer(config: DNALMConfig, letter: str) -> nn.Module:
    return HyenaMixer(config)


class MambaMixer(nn.Module):
    """Mamba (causal LM) or BiMamba (masked LM) with the mixer call signature."""

    def __init__(self, config: DNALMConfig):
        super().__init__()
        kw = dict(d_state=config.mamba_d_state)
        self.mamba = Mamba(config.dim, **kw) if config.causal else BiMamba(config.dim, **kw)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None,
                max_seqlen: int | None = None) -> torch.Tensor:
        if cu_seqlens is not None:
            raise ValueError("Mamba layers take (batch, seqlen, dim) batches; packed (varlen) input would "
                             "carry the state across sequence boundaries")
        return self.mamba(x)


def mamba_mixer(config: DNALMConfig, letter: str) -> nn.Module:
    return MambaMixer(config)


# layer letter -> factory(config, letter) -> module mapping (..., dim) to (..., dim) and taking
# (x, cu_seqlens, max_seqlen).
MIXERS: dict[str, Callable[[DNALMConfig, str], nn.Module]] = {"G": attention_mixer, "L": attention_mixer,
                                                               "H": hyena_mixer, "M": mamba_mixer}


def build_mixer(config: DNALMConfig, letter: str) -> nn.Module:
    """The mixer of one layer (letters are validated by DNALMConfig)."""
    return MIXERS[letter](config, letter)


class DNALM(nn.Module):
    """tokens (batch, seqlen) -> LMOutput(loss, logits (batch, seqlen, vocab_size)), or with
    `config.num_labels` a per-base classifier: logits (batch, seqlen, num_labels).

    The token ids come as `tokens` or, with Hugging Face's name, `input_ids` (one of the two).
    `labels` are per-position targets, already aligned: for a causal LM labels[i] is the
    base after tokens[i] (the shift happens in the data, as `GenomeWindowDataset` does);
    for a masked LM it is the original base at masked positions. -100 is ignored.

    The output is a dict that also indexes as a tuple (`outputs.ModelOutput`): `out["logits"]`,
    `out.logits`; with labels, `out["loss"]` and `out[0]` are the loss (the mean cross-entropy
    over the counted positions); without, there is no "loss" key (`out.loss` is None) and
    `out[0]` is the logits. So transformers' `Trainer`, which calls
    `model(input_ids=..., labels=..., attention_mask=...)`, trains it as it is.

    Packed batches: tokens (total,) with int32 `cu_seqlens` (batch + 1,) prefix sums;
    sequences never attend to each other, and RoPE positions restart per sequence.

    Inference in chunks (a causal LM of attention layers): `new_kv_cache(batch, capacity)` gives
    one `KVCache` per layer; `model(tokens, kv_cache=caches)` then reads tokens (batch, n) as the
    continuation of the cached sequences (RoPE positions go on from the cached count) and appends
    their keys. Prefill a shared prefix once, `KVCache.select` its rows for each continuation, and
    the logits equal a full forward's over prefix + continuation, to rounding.

    Padded batches: `attention_mask` (batch, seqlen), true (or 1) at real tokens. Padding is
    never seen by a real token, and never counted in the loss; its logits are 0. A model of
    attention layers packs the real tokens (padding costs no compute, RoPE positions start at
    each sequence's first real token, left or right padding alike). Hyena and Mamba layers run
    over the padded batch, which is exact only in a causal model with padding at the end of
    each sequence; any other mask is refused.
    """

    def __init__(self, config: DNALMConfig):
        super().__init__()
        self.config = config
        ffn_hidden = swiglu_hidden(config.dim, config.ffn_mult)
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.blocks = nn.ModuleList(PreNormBlock(config.dim, build_mixer(config, letter), ffn_hidden)
                                    for letter in config.layer_letters)
        self.norm = RMSNorm(config.dim)
        self.lm_head = nn.Linear(config.dim, config.num_labels or config.vocab_size, bias=False)
        # Mamba blocks keep mamba-ssm's initialisation: N(0, 0.02) on in_proj and x_proj would
        # start the state path ~80x weaker than the published block's (design note
        # mixer-comparison.md).
        own_init = {id(m) for block in self.modules() if isinstance(block, Mamba) for m in block.modules()}
        for name, module in self.named_modules():
            # The Hyena filter MLP keeps its own initialisation too (its Sine features need O(1)
            # weights; N(0, 0.02) would flatten every filter).
            if ".filter." not in name and id(module) not in own_init:
                _init_weights(module)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, Mamba):
                    # The published LM's prenorm-residual rescale: 1/sqrt(the branches added to
                    # the residual stream), two per block (mixer, feed-forward) or one.
                    module.out_proj.weight /= math.sqrt(config.depth * (2 if ffn_hidden else 1))
        if config.tie_embeddings and config.num_labels is None:  # a classifier's head has its own rows
            self.lm_head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None, *,
                input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                kv_cache: list[KVCache] | None = None) -> LMOutput:
        if (tokens is None) == (input_ids is None):
            raise TypeError("DNALM takes the token ids as tokens or as input_ids, one of the two; got "
                            + ("both" if tokens is not None else "neither"))
        tokens = tokens if tokens is not None else input_ids
        if labels is not None and labels.shape != tokens.shape:
            raise ValueError(f"labels must have the tokens' shape {tuple(tokens.shape)}, got {tuple(labels.shape)}")
        if attention_mask is not None:
            if cu_seqlens is not None:
                raise ValueError("attention_mask (a padded batch) and cu_seqlens (a packed one) exclude each other")
            if tokens.dim() != 2 or attention_mask.shape != tokens.shape:
                raise ValueError(f"attention_mask must be (batch, seqlen), the shape of 2-D tokens; got tokens "
                                 f"{tuple(tokens.shape)} and attention_mask {tuple(attention_mask.shape)}")
            mask = attention_mask.bool()
            if not bool(mask.all()):  # an all-true mask is the plain batch
                return self._forward_padded(tokens, labels, mask)
        if kv_cache is not None:
            if cu_seqlens is not None or attention_mask is not None or tokens.dim() != 2:
                raise ValueError("kv_cache takes tokens (batch, n) of one length: no cu_seqlens, no attention_mask")
            self._check_kv_cache(kv_cache)
            x = self.embed(tokens)
            for block, cache in zip(self.blocks, kv_cache):
                x = block(x, kv_cache=cache)
            logits = self.lm_head(self.norm(x))
        else:
            logits = self._logits(tokens, cu_seqlens, max_seqlen)
        return LMOutput(loss=_loss(logits, labels), logits=logits)

    @property
    def supports_kv_cache(self) -> bool:
        """A causal model of attention layers only (Hyena and Mamba layers keep no KV cache)."""
        return self.config.causal and set(self.config.layer_letters) <= {"L", "G"}

    def new_kv_cache(self, batch: int, capacity: int) -> list[KVCache]:
        """One empty KVCache per layer for `batch` sequences of up to `capacity` tokens (the
        buffers come at the first call, in the dtype and on the device of its keys)."""
        if not self.supports_kv_cache:
            raise ValueError(f"a KV cache needs a causal LM of attention layers (G, L); this one is "
                             f"{'causal' if self.config.causal else 'a masked LM'} with layers "
                             f"{self.config.layer_letters!r}")
        return [KVCache(batch, capacity) for _ in self.blocks]

    def _check_kv_cache(self, kv_cache) -> None:
        if not self.supports_kv_cache:
            self.new_kv_cache(1, 1)  # raises, saying why
        if not isinstance(kv_cache, (list, tuple)) or len(kv_cache) != len(self.blocks) \
                or not all(isinstance(c, KVCache) for c in kv_cache):
            raise TypeError(f"kv_cache must be a list of {len(self.blocks)} KVCache, one per layer "
                            f"(DNALM.new_kv_cache)")

    def _forward_padded(self, tokens: torch.Tensor, labels: torch.Tensor | None, mask: torch.Tensor) -> LMOutput:
        """A padded batch (mask: true at real tokens, not all true); see the class docstring."""
        batch, seqlen = tokens.shape
        if not mask.any(dim=1).all():
            raise ValueError("attention_mask: every sequence needs at least one real token (a row is all padding)")
        if set(self.config.layer_letters) <= {"L", "G"}:
            # Attention only: the real tokens packed, so no real token sees padding and RoPE
            # positions restart at each sequence's first real token.
            packed, indices, cu_seqlens, max_seqlen, _ = unpad_input(tokens, mask)
            logits = self._logits(packed, cu_seqlens, max_seqlen)
            loss = None if labels is None else _loss(logits, labels.flatten().index_select(0, indices))
            return LMOutput(loss=loss, logits=pad_input(logits, indices, batch, seqlen))
        right_padded = torch.equal(mask, torch.arange(seqlen, device=mask.device) < mask.sum(1, keepdim=True))
        if not (self.config.causal and right_padded):
            raise ValueError("attention_mask: Hyena and Mamba layers read a padded batch only in a causal model with "
                             "the padding at the end of each sequence (there, position i sees 0..i, all real); pass "
                             "sequences of one length, or right-padded ones to a causal model")
        logits = self._logits(tokens, None, None).masked_fill(~mask[..., None], 0.0)
        loss = None if labels is None else _loss(logits, labels.masked_fill(~mask, IGNORE_INDEX))
        return LMOutput(loss=loss, logits=logits)

    def _logits(self, tokens: torch.Tensor, cu_seqlens: torch.Tensor | None, max_seqlen: int | None) -> torch.Tensor:
        if cu_seqlens is not None and max_seqlen is None:
            max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
        x = self.embed(tokens)
        for block in self.blocks:
            if self.config.gradient_checkpointing and self.training:
                # Non-reentrant checkpointing restores the RNG state, so fused dropout
                # draws the same seed when the block is recomputed.
                x = checkpoint(block, x, cu_seqlens, max_seqlen, use_reentrant=False)
            else:
                x = block(x, cu_seqlens, max_seqlen)
        return self.lm_head(self.norm(x))


def _loss(logits: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor | None:
    """Mean cross-entropy over the positions whose label is not IGNORE_INDEX, in float32."""
    if labels is None:
        return None
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=IGNORE_INDEX)


def _init_weights(module: nn.Module) -> None:
    """GPT-2's N(0, 0.02): torch's default N(0, 1) embedding would make tied logits ~sqrt(dim)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
