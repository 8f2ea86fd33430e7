"""Tile sizes and launch settings per (head dims, causal, dtype, RoPE table width, device).

Kept apart from the kernels and the interface, so tuning touches one table. The GPU entries
were chosen by measurement on the H200 (tools/tune_attention.py); docs/design/tile-configs.md
holds the measurement behind each entry. The interpreter entries keep CPU tests quick while
still crossing several tile boundaries.

`override_configs` is the developers' hook: tests and tools force other tilings and dispatch
choices with it, and launch plans (plans.py) stand aside while it is active.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import torch

from ...backends import triton_interpreted
from ..common.host import cdiv, sm_count


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """Warps and pipeline stages of a launch whose blocks are constexprs of its own (light passes)."""
    num_warps: int = 4
    num_stages: int = 3
    # Programmatic dependent launch (sm_90+): the kernel may start while the one before it on the
    # stream finishes, and must wait (gdc_wait) before it reads what that one wrote.
    pdl: bool = False


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
    _: dataclasses.KW_ONLY  # the switches below are named at every use
    # Where TMA descriptors apply (descriptors.py), whether the dK/dV pass also streams Q
    # through one (the dQ pass always streams K and V so). dO stays on pointer loads: by TMA
    # as well, the 255-register dK/dV kernel spilled or crashed ptxas (triton 3.6, sm_90).
    dkdv_q_by_tma: bool = False
    # With RoPE (NeoX halves, fixed lengths), whether the dQ pass takes K's halves, pass-through
    # channels and the tables by TMA, as the forward does: measured faster up to hd128; other
    # head dims are untimed and keep pointer loads (docs/design/tile-configs.md).
    dq_rope_by_tma: bool = False
    # Causal and windowed backward: the dK/dV pass runs one loop over every visible query tile
    # and, by default, masks only the edge tiles behind a branch. Where that branch costs the
    # kernel its tensor-core pipelining (ptxas note C7515 near the 255-register limit: hd256 at
    # its 32x64 tile), the pass masks every tile instead: the same scores (a whole tile's mask
    # keeps every score), a few compares per score more, and no branch
    # (docs/design/attention-backward.md).
    dkdv_mask_every_tile: bool = False


# Light passes (the Gluon backward's prologue and dQ conversion) launch with triton's defaults
# (4 warps, 3 stages; they have no loop to pipeline); their row block is a constexpr of their own.
LIGHT_PASS = LaunchConfig(num_warps=4, num_stages=3)

# Uneven on purpose (BLOCK_M != BLOCK_N), like the GPU tilings, so CPU tests cross the same kinds
# of tile boundaries.
_INTERPRETER_FWD = TileConfig(64, 32)
_INTERPRETER_BWD = BackwardConfig(TileConfig(32, 64), TileConfig(64, 32))

# Set by override_configs (tests, tools) to run the same kernels under other tilings and choices.
_override: dict[str, object] = {}


def overridden() -> bool:
    """Whether override_configs is active (launch plans stand aside then)."""
    return bool(_override)

# Head dims <= 64, 16-bit, without RoPE or dropout, at short sequences (and causal at any length):
# 64-row query tiles with 4 warps, several CTAs per SM, where the long-N tiles (one CTA per SM)
# leave a program few key tiles or much of its work on the causal diagonal. `seqlen` is the longer
# of the query and key lengths (the max lengths for varlen); 0 (unknown) takes the long-N tiles
# where the choice depends on it.
SHORT_FORWARD_SEQLEN_64 = 1024
SHORT_BACKWARD_SEQLEN_64 = 2048


def _short_ok(rotary_table_bytes: int, dropout: bool) -> bool:
    """Where the short-sequence tiles above were measured (16-bit dtypes are checked by the caller)."""
    return not rotary_table_bytes and not dropout


def _gpu_forward(head_dim: int, head_dim_v: int, causal: bool, dtype: torch.dtype,
                 rotary_table_bytes: int, dropout: bool, seqlen: int = 0) -> TileConfig:
    """The forward's tiles on a CUDA GPU; each branch's measurement is in docs/design/tile-configs.md."""
    widest = max(head_dim, head_dim_v)
    if dtype == torch.float32:
        # fp32 (exact "ieee" dots) is for tests and CPU-sized work; small tiles keep the
        # register footprint, and so the compile time, reasonable at large head dims.
        return TileConfig(64, 32) if widest <= 64 else TileConfig(32, 32)
    if widest <= 64:
        if _short_ok(rotary_table_bytes, dropout) and (causal or 0 < seqlen <= SHORT_FORWARD_SEQLEN_64):
            return TileConfig(64, 64, num_warps=4, num_stages=3)
        return TileConfig(128, 64, num_warps=8, num_stages=3)
    if rotary_table_bytes and widest <= 128:
        # RoPE streams a cos and a sin tile beside each K tile: 128x128 with 3 stages does not fit
        # in shared memory; 16-bit tables fit 128x128 at 2 stages, fp32 tables take 128x64.
        return TileConfig(128, 128, 8, 2) if rotary_table_bytes <= 2 else TileConfig(128, 64, 8, 3)
    if widest <= 128:  # dropout included: its 8-bit draws leave room for 3 stages
        return TileConfig(128, 128, num_warps=8, num_stages=3)
    if rotary_table_bytes:
        return TileConfig(64, 32, 4, 3)
    if head_dim + head_dim_v <= 256 and value_blocks(head_dim_v)[1]:  # (64, 192), V as 128 + 64
        return TileConfig(128, 128, num_warps=8, num_stages=3)
    if head_dim + head_dim_v <= 320:  # (128, 192), (192, 128)
        return TileConfig(128, 64, num_warps=8, num_stages=3)
    if head_dim + head_dim_v <= 384 and channel_blocks(head_dim)[1] and value_blocks(head_dim_v)[1]:
        return TileConfig(128, 64, num_warps=8, num_stages=3)  # (192, 192), Q/K and V as 128 + 64
    if head_dim == head_dim_v == 256:
        # 32-key tiles: K and V of 3 stages take 96 KB of shared memory where 64 keys took 192 KB.
        if 0 < seqlen <= 1024 and not (causal and seqlen <= 512):
            return TileConfig(64, 32, num_warps=4, num_stages=3)
        return TileConfig(128, 32, num_warps=8, num_stages=3)
    return TileConfig(64, 64, num_warps=4, num_stages=3)


def _gpu_backward(head_dim: int, head_dim_v: int, causal: bool, dtype: torch.dtype,
                  rotary_table_bytes: int, dropout: bool, seqlen: int = 0) -> BackwardConfig:
    """The two-pass backward's tiles on a CUDA GPU (dK/dV chosen first, then dQ with the best
    dK/dV); each branch's measurement is in docs/design/tile-configs.md. Tiles that spill at sm_90
    are avoided (tools/offline_compile.py)."""
    widest = max(head_dim, head_dim_v)
    if dtype == torch.float32:
        if widest <= 64:
            return BackwardConfig(TileConfig(32, 64), TileConfig(64, 32))
        return BackwardConfig(TileConfig(16, 32), TileConfig(32, 16))
    if widest <= 64:
        short = _short_ok(rotary_table_bytes, dropout) and 0 < seqlen <= SHORT_BACKWARD_SEQLEN_64
        dkdv = TileConfig(32, 64, 4, 3) if short and causal else TileConfig(32, 128, 4, 3)
        dq_short = _short_ok(rotary_table_bytes, dropout) and (causal or short)
        return BackwardConfig(dkdv, TileConfig(64, 64, 4, 3) if dq_short else TileConfig(128, 64, 8, 3),
                              dkdv_q_by_tma=True)
    if widest <= 128 and not rotary_table_bytes:
        # hd96 (Q/K and V as 64 + 32 channels) takes 64x64 dQ tiles
        dq = TileConfig(64, 64, 4, 3) if channel_blocks(head_dim)[1] else TileConfig(128, 64, 8, 3)
        return BackwardConfig(TileConfig(64, 128, 8, 2 if causal else 3), dq)
    if widest <= 128:  # with RoPE
        return BackwardConfig(TileConfig(64, 128, 8, 2 if causal else 3), TileConfig(128, 64, 8, 3),
                              dq_rope_by_tma=True)
    if rotary_table_bytes:
        return BackwardConfig(TileConfig(32, 64, 4, 2), TileConfig(64, 32, 4, 2))
    split_v = value_blocks(head_dim_v)[1] > 0
    if head_dim + head_dim_v <= 256 and split_v:  # (64, 192), V as 128 + 64
        return BackwardConfig(TileConfig(64, 128, 8, 3), TileConfig(128, 64, 8, 3), dkdv_q_by_tma=True)
    if head_dim + head_dim_v <= 320 and split_v:  # (128, 192)
        return BackwardConfig(TileConfig(32, 128, 8, 3), TileConfig(128, 64, 8, 3))
    if head_dim + head_dim_v <= 256:  # V padded (split_channels forced off)
        return BackwardConfig(TileConfig(32, 64, 4, 3), TileConfig(128, 64, 8, 3), dkdv_q_by_tma=True)
    if head_dim + head_dim_v <= 320:
        # 16 query rows per dK/dV step leave the 192-wide accumulators room; with Q/K split
        # (128 + 64) the dQ pass takes 128x64, which spills with dropout.
        split_qk = channel_blocks(head_dim)[1] > 0
        dq = TileConfig(128, 64, 8, 3) if split_qk and not dropout else TileConfig(64, 64, 4, 3)
        return BackwardConfig(TileConfig(16, 128, 8, 3), dq)
    if head_dim + head_dim_v <= 384 and split_v and channel_blocks(head_dim)[1]:
        # (192, 192), Q/K and V as 128 + 64; with dropout a 64x64 dQ tile spills, so it keeps 64x32
        return BackwardConfig(TileConfig(16, 128, 8, 3), TileConfig(64, 32 if dropout else 64, 4, 3))
    # hd256: dK/dV 32x64 with 8 warps (4 warps spilled 1.5 KB of its two 64 x 256 accumulators);
    # dQ 128x32 w8, 64x32 w4 with dropout (128x32 spills there). The dK/dV pass masks every tile
    # when causal or windowed: with the edge branch ptxas serialised its wgmma.
    return BackwardConfig(TileConfig(32, 64, 8, 3), TileConfig(64, 32, 4, 3) if dropout else TileConfig(128, 32, 8, 3),
                          dkdv_mask_every_tile=True)


# Keys per forward launch for long fixed-length full attention: one head's K and V outgrow L2
# past 65,536 keys (bf16, hd128) and the programs of a head drift apart along them, so
# attention_forward launches once per chunk of this many keys, carrying the softmax state
# between launches in float32 (docs/design/attention-forward.md). Causal and windowed attention
# keep one launch (a query tile reads only the keys of its band).
FORWARD_KEY_CHUNK = 65536
# The carried state takes (batch, nheads, seqlen_q, head_dim_v + 2) float32, 2x a bf16 output.
# A forward at genome scale may not have that to spare; then it runs in one launch (the result is
# bit-for-bit the same either way). The share of free memory the state may take:
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
# waits for the work queued on the device, a sync per call (442 us inside a short backward on the
# H200, against 10 us idle; docs/design/launch-path.md). A buffer this small a share of the
# device's memory is taken without asking: the two-pass alternative needs nearly as much at that
# size, and larger buffers come with work that takes 0.1 s or more, beside which the query costs
# nothing (docs/design/memory.md).
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


def small_buffer(nbytes: int, device: torch.device) -> bool:
    """Whether a buffer is taken without asking the driver (fits_in_free_memory's first rule)."""
    return nbytes <= SMALL_BUFFER_FRACTION * _device_total_memory(device)


def forward_key_chunk(seqlen_k: int, block_n: int, device: torch.device, masked: bool = False,
                      state_bytes: int = 0) -> int | None:
    """Keys per forward launch, a multiple of block_n, or None for one launch.

    The default (FORWARD_KEY_CHUNK) applies to full attention on a CUDA GPU only (masked: causal
    or a sliding window, where it was slower or cannot help: a query tile then reads only the keys
    of its window), and only if the state takes at most KEY_CHUNK_STATE_MAX_FREE_FRACTION of the
    device's free memory (PyTorch's cached blocks included). An explicit override_configs
    (key_chunk=...) always applies: tests force the chunked path with it, and key_chunk=0 forces
    one launch."""
    if "key_chunk" in _override:
        chunk = _override["key_chunk"]
    else:
        if device.type != "cuda" or triton_interpreted() or seqlen_k <= FORWARD_KEY_CHUNK or masked:
            return None
        if not fits_in_free_memory(state_bytes, KEY_CHUNK_STATE_MAX_FREE_FRACTION, device):
            return None
        chunk = FORWARD_KEY_CHUNK
    if not chunk:  # an override of 0: one launch
        return None
    return max(block_n, (int(chunk) // block_n) * block_n)


# GQA/MQA: a dK/dV program sums over its group's query heads, so there are only
# batch * nheads_k * key tiles of them. Below this many waves of the device's SMs the heads of a
# group are split over several programs (each sums a share of them into its own float32 dK/dV
# slice; a deterministic sum over the slices follows): MQA causal at H16 N16k hd128 ran at 302
# TF/s fwd+bwd against 432 for MHA before the split (docs/design/attention-backward.md).
DKDV_GROUP_SPLIT_MIN_WAVES = 2
DKDV_GROUP_SPLIT_TARGET_WAVES = 4
# ... and only where the pass is long enough for its balance to matter: the split adds a float32
# sum and a cast per gradient (four launches, ~16 us of host time each on the H200 machine),
# more than a dK/dV pass of a few tens of microseconds could gain. 2^35 FLOPs of dK/dV work is
# ~70 us at 500 TF/s (MQA H16 N16k hd128: 2^42).
DKDV_GROUP_SPLIT_MIN_FLOPS = 2**35


def dkdv_group_split(kv_group: int, programs: int, flops: float, device: torch.device) -> int:
    """Query heads per dK/dV program (kv_group: no split; fewer: the group's heads are split over
    ceil(kv_group / this) programs per key tile), for `programs` unsplit programs doing `flops` of
    dK/dV work in all. override_configs(dkdv_heads_per_split=...) forces it (tests cover the split
    under the interpreter)."""
    if "dkdv_heads_per_split" in _override:
        return max(1, min(kv_group, int(_override["dkdv_heads_per_split"])))  # type: ignore[arg-type]
    if kv_group == 1 or device.type != "cuda" or triton_interpreted() or flops < DKDV_GROUP_SPLIT_MIN_FLOPS:
        return kv_group
    sms = sm_count(device)
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
    if "dq_rope_by_tma" in _override:
        cfg = dataclasses.replace(cfg, dq_rope_by_tma=_override["dq_rope_by_tma"])
    return cfg  # type: ignore[return-value]


def sm90_min_seqlen(default: int) -> int:
    """The Gluon backward's shortest length (backward_sm90.MIN_SEQLEN), or override_configs'
    sm90_min_seqlen (tests take that kernel at their odd small lengths with 0)."""
    return int(_override.get("sm90_min_seqlen", default))  # type: ignore[arg-type]


def sm90_forward_allowed(head_dim: int, head_dim_v: int, varlen: bool = False) -> bool:
    """Whether the Gluon forward (forward_sm90.py) may run at these head dims: as override_configs'
    sm90_forward says, else where it beat the triton forward (sm90_forward_preferred) for
    fixed-length batches; never where override_configs forces what only the triton forward has
    (its tiling, its key chunks, its channel groups), which tests of those paths do. Packed
    sequences (varlen) take it only where sm90_forward=True says: it computes them (the GPU tests
    check it), but its speed on them against the triton forward has not been measured yet."""
    if any(name in _override for name in ("forward", "key_chunk", "split_channels")):
        return False
    forced = _override.get("sm90_forward")
    if forced is not None:
        return bool(forced)
    return not varlen and sm90_forward_preferred(head_dim, head_dim_v)


def sm90_forward_preferred(head_dim: int, head_dim_v: int) -> bool:
    """The Gluon forward's measured ground (docs/design/attention-forward-sm90.md, "Measurements";
    H100, all providers in one process): the wider head dim in (64, 128], where it ran at
    1.04-1.17x the triton forward (96, padded to 128, included); (32, 64], padded to 64, where its
    three compute warpgroups ran at 1.01-1.22x ("Three warpgroups at head dim 64"); or exactly 256
    (1.17x). At 32 and below it trails (0.95x with two warpgroups); over 128 but under 256 the
    padding to 256 halves its key tile, and it trailed the triton forward's channel groups (0.92x
    at 192, 0.97x at (64, 192))."""
    wide = max(head_dim, head_dim_v)
    return 32 < wide <= 128 or wide == 256


@contextlib.contextmanager
def override_configs(forward: TileConfig | None = None, backward: BackwardConfig | None = None,
                     dq_rope_by_tma: bool | None = None, key_chunk: int | None = None,
                     dkdv_heads_per_split: int | None = None, split_channels: bool | None = None,
                     sm90_min_seqlen: int | None = None, sm90_forward: bool | None = None):
    """Force tile configs (tests use this to cover uneven tilings such as BLOCK_M != BLOCK_N), or
    only whether the RoPE dQ pass takes K by TMA, the forward's keys per launch, the query heads
    per GQA dK/dV program, whether channels split into two groups where they can
    (channel_blocks), the shortest length at which the Gluon backward runs, or whether the Gluon
    forward may run (False: the triton forward, for A/B timings and tests)."""
    saved = dict(_override)
    given = dict(forward=forward, backward=backward, dq_rope_by_tma=dq_rope_by_tma, key_chunk=key_chunk,
                 dkdv_heads_per_split=dkdv_heads_per_split, split_channels=split_channels,
                 sm90_min_seqlen=sm90_min_seqlen, sm90_forward=sm90_forward)
    _override.update({name: value for name, value in given.items() if value is not None})
    try:
        yield
    finally:
        _override.clear()
        _override.update(saved)
