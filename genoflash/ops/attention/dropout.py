"""Attention dropout from a counter-based Philox stream: generated inside the kernels, never stored.

The keep decision for score (b, h, i, j) (b the batch element, or the sequence index in a
varlen batch; i, j positions inside the sequence) is a pure function of
(seed, offset, b * nheads + h, i, j):
    words = Philox4x32-7(key = seed, counter = (j // 16, i, b * nheads + h, offset))
    byte  = (words[(j % 16) // 4] >> (8 * (j % 4))) & 255
    keep  = byte >= floor(p * 256 + 1/2)
One Philox call (128 random bits) serves sixteen neighbouring keys, eight bits each, as in
flash-attn 2. Bits are what dropout costs: at 24 bits per score (four keys per call) Philox
took 60% of the forward's time on the H200 (docs/design/fused-rope-dropout.md). The price is that p is
rounded to a multiple of 1/256 (`DropoutArgs.effective_p`); kept scores are scaled by
1 / (1 - effective_p), so the expectation of the output stays exactly the undropped one.
Each call runs 7 rounds, as flash-attn 2's does (Random123's authors found 7 rounds of
Philox4x32 pass BigCrush; 10 is their default safety margin): going from 10 to 7 took the
forward from +59% to +55% time over no dropout.
The backward regenerates the same bits, so no mask is kept; `dropout_mask` materialises it
for tests and debugging, bit for bit. This module is the PyTorch side (no triton); the
kernels' twin is `mask._dropout_keep`. The log-sum-exp is that of the undropped softmax.
"""

from __future__ import annotations

import dataclasses

import torch

_M32 = 0xFFFFFFFF
# Philox4x32 constants (Salmon et al., 2011), as triton.language.philox uses them.
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
# Rounds per Philox call, here and in the kernels (mask._dropout_keep passes it to tl.philox).
PHILOX_ROUNDS = 7


def dropout_threshold(p: float) -> int:
    """p rounded to a multiple of 1/256, as the 8-bit threshold the kernels compare with; half
    up, so p = 1/512 is the smallest p that drops anything."""
    return int(p * 256 + 0.5)


@dataclasses.dataclass(frozen=True)
class DropoutArgs:
    p: float
    seed: int | None  # 0 <= seed < 2^63; None only while torch.compile traces (drawn in the graph)
    offset: int | None  # 0 <= offset < 2^31 (a uint32 counter, kept in int32 range for kernel arguments)

    @property
    def threshold(self) -> int:
        """8-bit threshold: a score is dropped when its 8 random bits fall below it."""
        return dropout_threshold(self.p)

    @property
    def effective_p(self) -> float:
        """The probability the kernels drop a score with: p rounded to a multiple of 1/256."""
        return self.threshold / 256

    @property
    def rescale(self) -> float:
        return 256 / (256 - self.threshold)


# Bit 63 of the seed as the kernels receive it (`kernel_seed`). Triton compiles one kernel per
# argument type, and types an int by its size (i32 below 2^31, i64 below 2^63, u64 above): with
# this bit set every seed is a u64, so one compiled kernel serves them all. The kernels clear it.
KERNEL_SEED_TAG = 1 << 63


# Kernel arguments that change with every call. Triton would otherwise specialise on them
# (divisible by 16 or not, equal to 1) and compile new variants of each kernel while a run goes
# on; on the H200 such compiles landed inside timed loops.
DROPOUT_RUNTIME_ARGS = ["dropout_seed", "dropout_offset"]


def kernel_seed(d: DropoutArgs | None) -> int:
    """The seed argument of the kernels (see KERNEL_SEED_TAG); also for no dropout, unused then."""
    return (d.seed if d else 0) | KERNEL_SEED_TAG


def draw_seed_and_offset() -> tuple[int, int]:
    """From torch's default generator, so `torch.manual_seed` reproduces a run."""
    seed, offset = torch.randint(0, 2**62, (2,), dtype=torch.int64).tolist()
    return seed, offset & 0x7FFFFFFF


def _mulhilo(a: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of a * b for uint32 values held in int64 (16-bit limbs, no overflow)."""
    ah, al, bh, bl = a >> 16, a & 0xFFFF, b >> 16, b & 0xFFFF
    t = al * bl
    mid = ah * bl + al * bh + (t >> 16)
    return ah * bh + (mid >> 16), ((mid & 0xFFFF) << 16) | (t & 0xFFFF)


def philox4x32(seed: int, c0, c1, c2, c3, rounds: int = PHILOX_ROUNDS):
    """Philox4x32 in PyTorch, bit-identical to triton.language.philox (same n_rounds) for uint32
    counters."""
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    for _ in range(rounds):
        hi_b, lo_b = _mulhilo(c2, _ROUND_B)
        hi_a, lo_a = _mulhilo(c0, _ROUND_A)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _KEY_A) & _M32, (k1 + _KEY_B) & _M32
    return c0, c1, c2, c3


def keep_mask(d: DropoutArgs, bh: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """The kernels' keep decision for broadcastable int64 tensors of (b*nheads + h), i and j."""
    words = philox4x32(d.seed, cols // 16, rows, bh, torch.full_like(cols, d.offset))
    word = torch.stack(torch.broadcast_tensors(*words), dim=-1)
    word = word.gather(-1, torch.broadcast_to((cols % 16) // 4, word.shape[:-1]).unsqueeze(-1))[..., 0]
    return ((word >> (8 * (cols % 4))) & 0xFF) >= d.threshold


def dropout_mask(batch: int, nheads: int, seqlen_q: int, seqlen_k: int, dropout_p: float, seed: int,
                 offset: int = 0, device=None) -> torch.Tensor:
    """The exact keep mask the kernels use, (batch, nheads, seqlen_q, seqlen_k) bool; True = kept.

    For a varlen batch, sequence b's mask is dropout_mask(b + 1, ...)[b] cut to its lengths."""
    d = DropoutArgs(dropout_p, seed, offset)
    bh = torch.arange(batch * nheads, device=device).view(batch, nheads, 1, 1)
    rows = torch.arange(seqlen_q, device=device).view(1, 1, -1, 1)
    cols = torch.arange(seqlen_k, device=device).view(1, 1, 1, -1)
    return keep_mask(d, bh, rows, cols)
