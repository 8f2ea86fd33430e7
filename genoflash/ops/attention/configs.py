"""Tile sizes and launch settings per (head dims, causal, dtype, RoPE table width, device).

Kept apart from the kernels and the interface, so tuning touches one table. The GPU
entries were chosen by measurement on the H200 (see benchmarks/NOTES.md); the
interpreter entries keep CPU tests quick while still crossing several tile boundaries.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import torch

from ...backends import triton_interpreted
from ..host import cdiv


@dataclasses.dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2


@dataclasses.dataclass(frozen=True)
class BackwardConfig:
    dkdv: TileConfig  # block_m: query rows streamed; block_n: key rows owned by a program
    dq: TileConfig  # block_m: query rows owned by a program; block_n: key rows streamed
    preprocess_block: int = 128
    # Where TMA descriptors apply (descriptors.py), whether the dK/dV pass also streams Q
    # through one (the dQ pass always streams K and V so). dO stays on pointer loads: by TMA
    # as well, the 255-register dK/dV kernel spilled or crashed ptxas (triton 3.6, sm_90).
    dkdv_q_by_tma: bool = False
    # deterministic=False allows the one-pass backward: the dK/dV pass also accumulates dQ
    # (atomics or TMA reductions), with its extra (BLOCK_M, D) float32 tile. one_pass says
    # whether to take it when allowed; on the H200 it was never faster than the two passes (402
    # against 447 TF/s fwd+bwd at H16 N16k hd128, level when causal; 2026-11-30,
    # results/h200-2026-11-30-tma-probe-fused-tiles-4f2c6a4.json), so no entry turns it on yet.
    one_pass: bool = False
    fused_dkdv: TileConfig | None = None  # the one-pass dK/dV tiles; None means the dkdv tiles
    # With RoPE (NeoX halves, fixed lengths), whether the dQ pass takes K's halves, pass-through
    # channels and the tables by TMA, as the forward does. The sm_90 compile at hd128 has a
    # longer key loop than with pointer loads (587 against 527 instructions, fp32 tables), yet
    # it measured faster there (benchmarks/rope_probe.py at 4a904cb, H200, fwd+bwd ms, pointers
    # -> TMA: H16 N16k fp32 tables 28.70 -> 27.78, fp16 25.81 -> 25.71; H8 N64k fp32 223.7 ->
    # 219.5, fp16 209.3 -> 205.5; results/h200-2026-11-30-rope-probe-4a904cb.json), so the
    # RoPE entry up to hd128 takes it. Other head dims are untimed and keep pointer loads.
    dq_rope_by_tma: bool = False
    # Causal and windowed backward: the dK/dV pass runs one loop over every visible query tile
    # and, by default, masks only the edge tiles behind a branch. Where that branch costs the
    # kernel its tensor-core pipelining (ptxas note C7515 near the 255-register limit; hd256 at
    # its 32x64 tile, benchmarks/offline_compile.py "plain 256 --causal" and "window 256"), the
    # pass masks every tile instead: the same scores (a whole tile's mask keeps every score),
    # a few compares per score more, and no branch.
    dkdv_mask_every_tile: bool = False


# Light passes (the backward's delta and dQ-conversion passes beside the one-pass kernels) launch
# with triton's defaults (4 warps, 3 stages; they have no loop to pipeline). Their row block comes
# as a constexpr of their own, so the block sizes here are unused.
LIGHT_PASS_TILES = TileConfig(block_m=0, block_n=0, num_warps=4, num_stages=3)

# Uneven on purpose (BLOCK_M != BLOCK_N), like the GPU tilings, so CPU tests cross the same kinds
# of tile boundaries.
_INTERPRETER_FWD = TileConfig(64, 32)
_INTERPRETER_BWD = BackwardConfig(TileConfig(32, 64), TileConfig(64, 32), 64)

# Set by tests (override_configs) to run the same kernels under other tilings.
_override: dict[str, object] = {}

# Head dims <= 64, 16-bit, without RoPE or dropout: 64-row query tiles with 4 warps (49 KB shared,
# 123-141 registers at sm_90, several CTAs per SM) where the long-N tiles (one CTA per SM) leave a
# program few key tiles or, with a causal mask, much of its work on the diagonal. Measured on the H200
# at 16k tokens per batch, H32 (tune_attention.py --set short-fwd,short-bwd64 and short-limits,
# results/tune-short-h200-2026-12-01-a6a465d.json and tune-short-limits-h200-2026-12-01-036fccc.json),
# ms, long-N tile -> this one:
# - forward 64x64 w4 s3 against 128x64 w8 s3: causal N512 0.262 -> 0.159, 1k 0.359 -> 0.227, 2k 0.549
#   -> 0.376, 4k 0.952 -> 0.724, 8k 1.740 -> 1.405, 16k 3.226 -> 2.731; non-causal N512 0.232 -> 0.182,
#   1k 0.337 -> 0.308, then level within the runs' spread (2k 0.615 -> 0.582 and 0.618 -> 0.648; 4k
#   1.258 -> 1.274; 16k 5.38 -> 5.67, tune-h200-2026-11-29.json);
# - whole backward, dQ 64x64 w4 s3 against 128x64 w8 s3: causal N512 0.552 -> 0.450, 1k 0.799 ->
#   0.663, 2k 1.302 -> 1.196, 4k 2.348 -> 2.168, 8k 4.386 -> 4.193, 16k 8.363 -> 8.112; non-causal
#   N512 0.746 -> 0.618, 1k 1.200 -> 1.058, 2k 2.149 -> 1.967, 4k 4.108 -> 4.171;
# - causal dK/dV 32x64 w4 s3 against 32x128 w4 s3: N512 0.594 -> 0.550, 1k 0.846 -> 0.793, 2k 1.340 ->
#   1.293, then level (4k 2.371 -> 2.348, 16k 8.341 -> 8.446). Non-causal keeps 32x128 (0.744 / 0.749).
# `seqlen` is the longer of the query and key lengths (the max lengths for varlen); 0 (unknown) takes
# the long-N tiles where the choice depends on it.
SHORT_FORWARD_SEQLEN_64 = 1024
SHORT_BACKWARD_SEQLEN_64 = 2048


def _short_ok(rotary_table_bytes: int, dropout: bool) -> bool:
    """Where the short-sequence tiles above were measured (16-bit dtypes are checked by the caller)."""
    return not rotary_table_bytes and not dropout


def _gpu_forward(head_dim: int, head_dim_v: int, causal: bool, dtype: torch.dtype,
                 rotary_table_bytes: int, dropout: bool, seqlen: int = 0) -> TileConfig:
    widest = max(head_dim, head_dim_v)
    if dtype == torch.float32:
        # fp32 (exact "ieee" dots) is for tests and CPU-sized work; small tiles keep the
        # register footprint, and so the compile time, reasonable at large head dims.
        return TileConfig(64, 32) if widest <= 64 else TileConfig(32, 32)
    # bf16/fp16, measured on the H200 (benchmarks/results/tune-*h200-2026-11-29.json):
    # hd64 128x64 w8 s3 409 TF/s; hd128 128x128 w8 s3 455 (non-causal) / 445 (causal);
    # (64, 192), (128, 192), (192, 128): 128x64 w8 s3 (128x128 does not fit in shared memory with
    # V padded to 256 channels; with V split, 128 + 64, (64, 192) takes 128x128: below);
    # hd256 64x64 w4 s3 296 (2026-11-29; 32-key tiles since 2026-12-03: below).
    if widest <= 64:
        if _short_ok(rotary_table_bytes, dropout) and (causal or 0 < seqlen <= SHORT_FORWARD_SEQLEN_64):
            return TileConfig(64, 64, num_warps=4, num_stages=3)  # above
        return TileConfig(128, 64, num_warps=8, num_stages=3)
    if rotary_table_bytes and widest <= 128:
        # RoPE streams a cos and a sin tile (BLOCK_N x D/2) beside each K tile; 128x128 with
        # 3 stages no longer fits in shared memory (benchmarks/offline_compile.py). Measured
        # (results/tune-rope-h200-2026-11-29.json), H16 N16k: fp32 tables 128x64 s3 9.07 ms
        # (128x128 s2 does not fit); 16-bit tables 128x128 s2 7.66 ms, 128x64 s3 7.80 ms.
        return TileConfig(128, 128, 8, 2) if rotary_table_bytes <= 2 else TileConfig(128, 64, 8, 3)
    # Dropout: with 24-bit draws the keep mask's word shuffle (tl.join + reshape) took shared
    # memory and 128x128 needed 2 stages; 8-bit draws shuffle byte flags and 3 stages fit (213 KB).
    # Measured at 3d87021 (results/h200-2026-11-30-tune-dropout-3d87021.json), H16 N16k hd128:
    # 128x128 s3 7.45 ms, s2 7.65, 128x64 s3 7.65.
    if widest <= 128:
        return TileConfig(128, 128, num_warps=8, num_stages=3)
    if rotary_table_bytes:
        return TileConfig(64, 32, 4, 3)
    if head_dim + head_dim_v <= 256 and value_blocks(head_dim_v)[1]:
        # (64, 192) with V as 128 + 64 channels (results/tune-dv-split-h200-2026-11-30-9a6410d.json, H8
        # N16k): 128x128 w8 s3 2.125 ms, 128x64 s3 2.162, 128x128 s2 2.434. (128, 192) keeps 128x64 s3
        # (2.617 against 2.85 for 128x128 s2 / s3).
        return TileConfig(128, 128, num_warps=8, num_stages=3)
    if head_dim + head_dim_v <= 320:
        return TileConfig(128, 64, num_warps=8, num_stages=3)
    if head_dim + head_dim_v <= 384 and channel_blocks(head_dim)[1] and value_blocks(head_dim_v)[1]:
        # (192, 192) with Q/K and V each as 128 + 64 channels (results/tune-qk-split-h200-2026-11-30-8a2b967.log,
        # B2 H8 N8192): 128x64 w8 s3 1.454 ms against 1.847 for hd256's 64x64 w4 s3 (compiles at sm_90
        # without spills, also causal, windowed and with dropout).
        return TileConfig(128, 64, num_warps=8, num_stages=3)
    if head_dim == head_dim_v == 256:
        # 32-key tiles: K and V of 3 stages take 96 KB of shared memory where 64 keys took 192 KB
        # (one CTA per SM). Measured over the papers' sweep lengths (tune_attention.py --set hd256-fwd,
        # results/tune-hd256-fwd-h200-2026-12-03-1a9ba85.json, H8, 16k tokens per batch), ms, 64x64 w4 s3
        # -> 64x32 w4 s3 / 128x32 w8 s3: N512 0.263 -> 0.164 / 0.177, causal 0.187 -> 0.161 / 0.139;
        # N1024 0.444 -> 0.284 / 0.293, causal 0.280 -> 0.175 / 0.199; N8192 3.037 -> 2.081 / 1.998,
        # causal 1.513 -> 1.105 / 1.086. Both compile at sm_90 without spills with dropout, window,
        # softcap and ALiBi (varlen: 64x32 spills 4 bytes).
        if 0 < seqlen <= 1024 and not (causal and seqlen <= 512):
            return TileConfig(64, 32, num_warps=4, num_stages=3)
        return TileConfig(128, 32, num_warps=8, num_stages=3)
    return TileConfig(64, 64, num_warps=4, num_stages=3)


def _gpu_backward(head_dim: int, head_dim_v: int, causal: bool, dtype: torch.dtype,
                  rotary_table_bytes: int, dropout: bool, seqlen: int = 0) -> BackwardConfig:
    widest = max(head_dim, head_dim_v)
    if dtype == torch.float32:
        if widest <= 64:
            return BackwardConfig(TileConfig(32, 64), TileConfig(64, 32))
        return BackwardConfig(TileConfig(16, 32), TileConfig(32, 16))
    # Measured on the H200 as the forward: dK/dV chosen first, then dQ with the best dK/dV.
    # Q by TMA in dK/dV, measured (results/h200-2026-11-29-tma-probe-d32239f.json): hd64 fwd+bwd
    # 342 -> 373 TF/s, (64, 192) 356 -> 370; hd128 438 vs 439 (no gain), (128, 192) 335 -> 310.
    # fused_dkdv: the one-pass backward's tiles, chosen by the sm_90 compile report (no spills;
    # benchmarks/offline_compile.py --fused; the dkdv tiles spill there). Timed 2026-11-30 and
    # slower than the two passes at every shape, so one_pass stays off (BackwardConfig).
    if widest <= 64:
        short = _short_ok(rotary_table_bytes, dropout) and 0 < seqlen <= SHORT_BACKWARD_SEQLEN_64
        dkdv = TileConfig(32, 64, 4, 3) if short and causal else TileConfig(32, 128, 4, 3)
        dq_short = _short_ok(rotary_table_bytes, dropout) and (causal or short)  # above
        return BackwardConfig(dkdv, TileConfig(64, 64, 4, 3) if dq_short else TileConfig(128, 64, 8, 3),
                              dkdv_q_by_tma=True, fused_dkdv=TileConfig(64, 128, 8, 3))
    if widest <= 128 and not rotary_table_bytes:
        # hd96 with Q/K and V as 64 + 32 channels (results/tune-qk-split-2-h200-2026-11-30-b7e9319.json,
        # H16 N16k, whole backward): dQ 64x64 w4 s3 11.58 ms against 12.47 for 128x64 w8 s3.
        dq = TileConfig(64, 64, 4, 3) if channel_blocks(head_dim)[1] else TileConfig(128, 64, 8, 3)
        return BackwardConfig(TileConfig(64, 128, 8, 2 if causal else 3), dq, fused_dkdv=TileConfig(32, 128, 8, 3))
    if widest <= 128:  # with RoPE
        return BackwardConfig(TileConfig(64, 128, 8, 2 if causal else 3), TileConfig(128, 64, 8, 3),
                              dq_rope_by_tma=True)
    if rotary_table_bytes:
        return BackwardConfig(TileConfig(32, 64, 4, 2), TileConfig(64, 32, 4, 2))
    split_v = value_blocks(head_dim_v)[1] > 0
    # V split into two channel groups (value_blocks: 192 = 128 + 64), whole backward at B1 H8 N16k
    # (results/tune-dv-split-h200-2026-11-30-9a6410d.json; dK/dV chosen first, then dQ):
    # (64, 192): dK/dV 64x128 w8 s3 6.66 ms (32x64 w4 s3 6.80, 32x128 w8 s3 6.86), dQ 128x64 w8 s3 6.65;
    # (128, 192): dK/dV 32x128 w8 s3 8.93 ms (32x64 w4 9.23, 16x128 9.97), dQ 128x64 w8 s3 8.23 (64x64 w4
    # 8.91). Both compile at sm_90 without spills (64x128 spills 236 bytes at (128, 192)).
    if head_dim + head_dim_v <= 256 and split_v:
        return BackwardConfig(TileConfig(64, 128, 8, 3), TileConfig(128, 64, 8, 3), dkdv_q_by_tma=True,
                              fused_dkdv=TileConfig(32, 128, 8, 2))
    if head_dim + head_dim_v <= 320 and split_v:
        return BackwardConfig(TileConfig(32, 128, 8, 3), TileConfig(128, 64, 8, 3))
    if head_dim + head_dim_v <= 256:  # (64, 192) padded: whole backward 9.3 ms at B1 H8 N16k
        return BackwardConfig(TileConfig(32, 64, 4, 3), TileConfig(128, 64, 8, 3), dkdv_q_by_tma=True,
                              fused_dkdv=TileConfig(32, 128, 8, 2))
    if head_dim + head_dim_v <= 320:
        # (128, 192), (192, 128), whole backward at B1 H8 N16k (results/tune-dv192-h200-2026-11-30-f14cdec.json,
        # tune-dv192-dv64-h200-2026-11-30-e48bc66.json): dK/dV 16x128 w8 s3 11.17 / 11.34 ms against
        # 32x128 w8 s2 11.39 / 11.48 (which spills 52 bytes at sm_90; 16 query rows per step leave
        # the 192-wide accumulator room), then dQ 64x64 w4 s3 10.74 / 10.92 against 128x32 w8 s3.
        # With Q/K split (128 + 64, configs.channel_blocks), dQ 128x64 w8 s3 9.56 ms against 10.07
        # (results/tune-qk-split-2-h200-2026-11-30-b7e9319.json); with dropout it spills at sm_90.
        split_qk = channel_blocks(head_dim)[1] > 0
        dq = TileConfig(128, 64, 8, 3) if split_qk and not dropout else TileConfig(64, 64, 4, 3)
        return BackwardConfig(TileConfig(16, 128, 8, 3), dq)
    if head_dim + head_dim_v <= 384 and split_v and channel_blocks(head_dim)[1]:
        # (192, 192) with Q/K and V as 128 + 64 channels (same file, B2 H8 N8192, whole backward):
        # dK/dV 16x128 w8 s3 6.98 ms against 10.27 for hd256's 32x64 w8 s3, then dQ 64x64 w4 s3 5.96
        # against 6.98 for 64x32 w4 s3. At sm_90 neither spills, and the causal dK/dV pass no longer
        # serialises its wgmma as 32x64 did; with dropout 64x64 dQ spills 124 bytes, so it keeps 64x32.
        return BackwardConfig(TileConfig(16, 128, 8, 3), TileConfig(64, 32 if dropout else 64, 4, 3))
    # hd256 (results/tune-hd256-h200-2026-11-30-772ec5e.json, whole backward at B2 H8 N8192): dK/dV
    # 32x64 with 8 warps 12.54 ms against 24.92 with 4, which held 2 x 64 x 256 float32 accumulators
    # over 128 threads and spilled 1.5 KB (sm_90; 8 warps: no spills); s2 14.50. dQ then 64x32 w4 s3
    # 12.46 against 64x64 w8 s2 15.58 and 64x32 w8 s3 16.66.
    # A wider search (tune_attention.py --set hd256-2, results/tune-hd256-2-h200-2026-11-30-0aab1d6.json):
    # dK/dV 32x64 w8 s3 stays (s4 level; 16x64 +37%; 16- and 128-key tiles spill at sm_90); dQ
    # 128x32 w8 s3 12.03 ms against 12.44 (causal 6.91 / 7.03, N1024 B16 1.71 / 1.78). With dropout
    # it spills 80 bytes at sm_90 (64x32 w4: 64), so dropout keeps 64x32. The dK/dV pass masks
    # every tile when causal or windowed: with the edge branch ptxas serialised its wgmma.
    return BackwardConfig(TileConfig(32, 64, 8, 3), TileConfig(64, 32, 4, 3) if dropout else TileConfig(128, 32, 8, 3),
                          dkdv_mask_every_tile=True)


# Keys per forward launch for long fixed-length sequences (None: all keys in one launch). One
# head's K and V take 128 MB at 256k keys (bf16, hd128), more than the H200's 50 MB of L2, and
# there ncu read a 63% L2 hit rate (96-98% at 16k): the programs of a head drift apart along the
# keys and stop sharing K/V tiles in L2. attention_forward then launches once per key chunk,
# carrying the softmax state between launches in float32. Measured on the H200 at B1 H8 hd128
# bf16 (benchmarks/l2_probe.py; results/h200-2026-11-30-l2-probe-a3eaca5.json and
# ...-l2-probe-153baf4-tail.jsonl), without a mask: at 256k one launch ran at 501-518 TF/s,
# chunks of 16,384 at 557-562, of 32,768 564-570, of 65,536 568-571; at 64k chunks of 16,384
# cost 1% (563 vs 570), so chunks apply only where seqlen_k exceeds 65,536. Causal at 256k the
# split loses (one launch 573, chunks of 65,536 560): a causal query tile reads only the keys up
# to its diagonal, and the heavy-first tile order already keeps the programs in step.
FORWARD_KEY_CHUNK: int | None = 65536
# The carried state takes (batch, nheads, seqlen_q, head_dim_v + 2) float32, 2x a bf16 output.
# A forward at genome scale may not have that to spare; then it runs in one launch (the result is
# bit-for-bit the same either way, tests/test_forward_key_chunks.py). The share of free memory the
# state may take:
KEY_CHUNK_STATE_MAX_FREE_FRACTION = 0.5


def free_memory_bytes(device: torch.device) -> int:
    """What a new allocation on this CUDA device can still get: the driver's free memory plus
    the blocks PyTorch's allocator holds cached but unused. Asks the driver, which waits for the
    device's queued work: call it through `fits_in_free_memory`."""
    free, total = torch.cuda.mem_get_info(device)
    _total_memory.setdefault(device.index, total)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


# The memory rules (the forward's key chunks, the one-pass backward's float32 dQ accumulator) ask
# whether an extra buffer fits in a share of the free memory. The driver's answer (cudaMemGetInfo)
# waits for the work queued on the device: inside a backward at B8 H16 N2048 hd128 it took 442 us
# of host time against 10 us on an idle GPU (H200, results/h200-2026-12-01-host-layers-933a612.json),
# a sync per call that kept the one-pass backward from short sequences. A buffer this small a
# share of the device's memory is taken without asking: the two-pass alternative needs nearly as
# much at that size (dq itself is half the accumulator), and a device that close to full is near
# its limit either way. Larger buffers come with work that takes 0.1 s or more (an accumulator of
# 1/128 of an H200 is B*H*N = 2.7M rows at hd128), beside which the query costs nothing.
SMALL_BUFFER_FRACTION = 1 / 128
_total_memory: dict[int | None, int] = {}  # CUDA device index -> total bytes, read once


def _device_total_memory(device: torch.device) -> int:
    total = _total_memory.get(device.index)
    if total is None:
        total = _total_memory[device.index] = torch.cuda.mem_get_info(device)[1]
    return total


def fits_in_free_memory(nbytes: int, fraction: float, device: torch.device) -> bool:
    """Whether a buffer of nbytes takes at most `fraction` of what a new allocation on this CUDA
    device can still get (free_memory_bytes). Without asking the driver where nbytes is at most
    SMALL_BUFFER_FRACTION (and `fraction`) of the device's total memory."""
    if nbytes <= min(SMALL_BUFFER_FRACTION, fraction) * _device_total_memory(device):
        return True
    return nbytes <= fraction * free_memory_bytes(device)


def forward_key_chunk(seqlen_k: int, block_n: int, device: torch.device, masked: bool = False,
                      state_bytes: int = 0) -> int | None:
    """Keys per forward launch, a multiple of block_n, or None for one launch.

    The default (FORWARD_KEY_CHUNK) applies to full attention only (masked: causal or a sliding
    window, where it was slower or cannot help: a query tile then reads only the keys of its
    window), and only if the state takes at most KEY_CHUNK_STATE_MAX_FREE_FRACTION of the
    device's free memory (PyTorch's cached blocks included). An explicit override_configs
    (key_chunk=...) always applies: tests force the chunked path with it, and key_chunk=0 forces
    one launch."""
    if "key_chunk" in _override:
        chunk = _override["key_chunk"]
    else:
        chunk = FORWARD_KEY_CHUNK if device.type == "cuda" and not triton_interpreted() else None
        if chunk is None or seqlen_k <= chunk or masked:
            return None
        if not fits_in_free_memory(state_bytes, KEY_CHUNK_STATE_MAX_FREE_FRACTION, device):
            return None
    if not chunk:  # None, or an override of 0: one launch
        return None
    return max(block_n, (int(chunk) // block_n) * block_n)


# GQA/MQA: a dK/dV program sums over its group's query heads, so there are only
# batch * nheads_k * key tiles of them. Below this many waves of the device's SMs the heads of a
# group are split over several programs (each sums a share of them into its own float32 dK/dV
# slice; a deterministic sum over the slices follows). Measured on the H200 (results/h200-2026-11-30-
# features-gqa-8b0d857.json, H16 N16k hd128 bf16): MQA causal fwd+bwd 302 TF/s against 432 for MHA,
# 128 programs for 132 SMs with the causal work of the first key tile 128x that of the last; full
# attention MQA (equal programs, one wave) lost nothing.
DKDV_GROUP_SPLIT_MIN_WAVES = 2
DKDV_GROUP_SPLIT_TARGET_WAVES = 4
# ... and only where the pass is long enough for its balance to matter: the split adds a float32
# sum and a cast per gradient (four launches, ~16 us of host time each on the H200 machine),
# more than a dK/dV pass of a few tens of microseconds could gain. 2^35 FLOPs of dK/dV work is
# ~70 us at 500 TF/s (MQA H16 N16k hd128: 2^42).
DKDV_GROUP_SPLIT_MIN_FLOPS = 2**35


def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def dkdv_group_split(kv_group: int, programs: int, flops: float, device: torch.device) -> int:
    """Query heads per dK/dV program (kv_group: no split; fewer: the group's heads are split over
    ceil(kv_group / this) programs per key tile), for `programs` unsplit programs doing `flops` of
    dK/dV work in all. override_configs(dkdv_heads_per_split=...) forces it (tests cover the split
    under the interpreter)."""
    if "dkdv_heads_per_split" in _override:
        return max(1, min(kv_group, int(_override["dkdv_heads_per_split"])))  # type: ignore[arg-type]
    if kv_group == 1 or device.type != "cuda" or triton_interpreted() or flops < DKDV_GROUP_SPLIT_MIN_FLOPS:
        return kv_group
    sms = _sm_count(device)
    if programs >= DKDV_GROUP_SPLIT_MIN_WAVES * sms:
        return kv_group
    splits = min(kv_group, cdiv(DKDV_GROUP_SPLIT_TARGET_WAVES * sms, programs))
    return cdiv(kv_group, splits)


def channel_blocks(width: int, split_by_default: bool = True) -> tuple[int, int]:
    """(main, tail): the widths of the two channel groups a tile of `width` channels is held as.

    A tile's width must be a power of two, so 192 channels held as one group are a 256-wide tile
    whose last 64 channels are masked zeros: a quarter of every matmul over those channels is
    padding, and the padded accumulators take registers. Held as a 128-wide main group and a
    64-wide tail (two dots instead of one), none of it is. The split is taken where it saves at
    least a quarter of the padded width and the tail is at least 32 wide (narrower wgmma tiles
    are not worth a second dot); otherwise the tail is 0 and the kernels compile to the
    one-group form. Tests force it either way with override_configs(split_channels=...).
    Used for V, O, dO and dV (value_blocks) and for Q and K's pass-through channels (qk_blocks,
    which passes split_by_default=False with RoPE: there the split waits for a GPU timing).
    """
    padded = max(16, 1 << (width - 1).bit_length())
    main = max(16, 1 << (width.bit_length() - 1))
    rest = width - main
    tail = max(16, 1 << (rest - 1).bit_length()) if rest > 0 else 0
    split = _override.get("split_channels")
    if split is None:
        split = split_by_default and rest > 0 and tail >= 32 and 4 * (main + tail) <= 3 * padded
    if not split or rest <= 0:
        return padded, 0
    return main, tail


def value_blocks(head_dim_v: int) -> tuple[int, int]:
    """(BLOCK_DV, BLOCK_DVT): V, O, dO and dV as channel_blocks holds them (192 = 128 + 64; 25% of
    the P V, dO V^T and P^T dO work was padding at Enformer's (64, 192) and AlphaGenome's (128, 192))."""
    return channel_blocks(head_dim_v)


# The rows are pure functions of their arguments (with no override set): looked up once per shape,
# since the lookup runs on every attention call (host time that bounds short sequences).
_gpu_forward_cached = functools.lru_cache(maxsize=1024)(_gpu_forward)
_gpu_backward_cached = functools.lru_cache(maxsize=1024)(_gpu_backward)


def forward_config(head_dim: int, head_dim_v: int, causal: bool, dtype: torch.dtype,
                   device: torch.device, rotary_table_bytes: int = 0, dropout: bool = False,
                   seqlen: int = 0) -> TileConfig:
    if "forward" in _override:
        return _override["forward"]  # type: ignore[return-value]
    if device.type != "cuda" or triton_interpreted():
        return _INTERPRETER_FWD
    rule = _gpu_forward_cached if not _override else _gpu_forward  # overrides (split_channels) reach the rule
    return rule(head_dim, head_dim_v, causal, dtype, rotary_table_bytes, dropout, seqlen)


def backward_config(head_dim: int, head_dim_v: int, causal: bool, dtype: torch.dtype,
                    device: torch.device, rotary_table_bytes: int = 0, dropout: bool = False,
                    seqlen: int = 0) -> BackwardConfig:
    if "backward" in _override:
        cfg = _override["backward"]
    elif device.type != "cuda" or triton_interpreted():
        cfg = _INTERPRETER_BWD
    else:
        rule = _gpu_backward_cached if not _override else _gpu_backward
        cfg = rule(head_dim, head_dim_v, causal, dtype, rotary_table_bytes, dropout, seqlen)
    for flag in ("one_pass", "dq_rope_by_tma"):
        if flag in _override:
            cfg = dataclasses.replace(cfg, **{flag: _override[flag]})
    return cfg  # type: ignore[return-value]


@contextlib.contextmanager
def override_configs(forward: TileConfig | None = None, backward: BackwardConfig | None = None,
                     one_pass: bool | None = None, dq_rope_by_tma: bool | None = None, key_chunk: int | None = None,
                     dkdv_heads_per_split: int | None = None, split_channels: bool | None = None):
    """Force tile configs (tests use this to cover uneven tilings such as BLOCK_M != BLOCK_N),
    or only whether deterministic=False takes the one-pass backward, whether the RoPE dQ pass
    takes K by TMA, the forward's keys per launch, the query heads per GQA dK/dV program, or
    whether channels split into two groups where they can (channel_blocks) (tests and probes
    of them)."""
    saved = dict(_override)
    if forward is not None:
        _override["forward"] = forward
    if backward is not None:
        _override["backward"] = backward
    if one_pass is not None:
        _override["one_pass"] = one_pass
    if dq_rope_by_tma is not None:
        _override["dq_rope_by_tma"] = dq_rope_by_tma
    if key_chunk is not None:
        _override["key_chunk"] = key_chunk
    if dkdv_heads_per_split is not None:
        _override["dkdv_heads_per_split"] = dkdv_heads_per_split
    if split_channels is not None:
        _override["split_channels"] = split_channels
    try:
        yield
    finally:
        _override.clear()
        _override.update(saved)
