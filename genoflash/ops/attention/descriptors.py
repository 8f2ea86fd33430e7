"""TMA tensor descriptors for the attention kernels' tile loads and stores (Hopper and later).

A descriptor describes a whole (batch, seqlen, heads, dim) tensor to the GPU's copy engine;
a kernel then asks for a (1, rows, 1, dim-block) box at a coordinate and gets it into shared
memory in one bulk copy, with no per-thread address arithmetic and no masks. Boxes that run
past the sequence end or past the head dim are filled with zeros on load and clipped on
store: exactly what the pointer loads' masks do, so both paths compute the same thing.
Measured on the H200: a minimal forward at hd128 went from 491 TF/s with pointer loads to 532
with 4-D descriptors (docs/design/attention-forward.md).

Used where they apply: fixed-length batches (a varlen tile that runs past its sequence would
read its neighbour, not zeros) and tensors whose base and strides meet the copy engine's
16-byte alignment. With RoPE only K (NeoX halves, one box each) and its tables take them
(`rope_tma_applies`, `key_descriptors`): in the forward, and in the backward's dQ pass where the
tile table asks for it; the rotated Q tiles keep pointer loads. Everything else takes the
pointer loads, and so does every call made with the `tma` setting off (genoflash.settings).
Under the Triton interpreter descriptors work too, so CPU tests run this path.
"""

from __future__ import annotations

import dataclasses

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from ...backends import triton_interpreted
from .args import AttentionArgs


def aligned(t: torch.Tensor) -> bool:
    # The copy engine needs a 16-byte aligned base, 16-byte aligned strides (all but the
    # last) and a contiguous last dim.
    size, strides = t.element_size(), t.stride()
    if strides[-1] != 1 or t.data_ptr() % 16:
        return False
    for s in strides[:-1]:
        if s <= 0 or (s * size) % 16:
            return False
    return True


_capabilities: dict[int | None, tuple[int, int]] = {}  # CUDA device index -> compute capability


def device_capability(device: torch.device) -> tuple[int, int]:
    """torch.cuda.get_device_capability, looked up once per device: torch's lookup costs a few
    microseconds of host time, paid on every attention call at short sequences."""
    cap = _capabilities.get(device.index)
    if cap is None:
        cap = _capabilities[device.index] = torch.cuda.get_device_capability(device)
    return cap


def _has_tma(device: torch.device) -> bool:
    """Hopper or later."""
    return device_capability(device)[0] >= 9


def tma_applies(a: AttentionArgs, *tensors: torch.Tensor, rotary: bool = False) -> bool:
    """Whether these (batch, seqlen, heads, dim) tensors can go through descriptors: the tma
    setting on, a fixed-length batch, Hopper or later (or the interpreter), every tensor aligned.
    Without rotary=True a call with RoPE never takes them (its Q and K tiles are rotated)."""
    if not a.settings.tma or a.varlen or (a.rotary_dim and not rotary):
        return False
    device = tensors[0].device
    if not triton_interpreted():
        if device.type != "cuda" or not _has_tma(device):
            return False
    for t in tensors:
        if t.dim() != 4 or not aligned(t):
            return False
    return True


def rope_tma_applies(a: AttentionArgs, *tensors: torch.Tensor) -> bool:
    """Whether K's NeoX halves and the RoPE tables can go through descriptors (channel_groups.py,
    `_load_qk_tma`): fixed-length batches, NeoX halves (interleaved pairs are not two contiguous
    boxes), and tables whose rows meet the copy engine's alignment."""
    cos, sin = a.rotary_cos, a.rotary_sin
    if cos is None or a.rotary_interleaved:
        return False
    # The second half's box starts at channel R/2 and the pass-through's at R: box starts along
    # the contiguous dim must be 16-byte aligned too.
    half_bytes = cos.shape[1] * tensors[0].element_size()
    return (half_bytes % 16 == 0 and tma_applies(a, *tensors, rotary=True)
            and all(t.dim() == 2 and aligned(t) for t in (cos, sin)))


def _descriptor(t: torch.Tensor, block_shape: list[int]) -> TensorDescriptor:
    """triton's TensorDescriptor of the whole of t, built without its __post_init__ checks (a few
    microseconds per descriptor, six to eight per fwd+bwd). What those checks assert holds by
    construction here: every tensor given a descriptor passed `aligned` (through tma_applies or
    rope_tma_applies) or is a fresh contiguous allocation of the kernels' own (out, the dQ
    accumulator); its sizes are >= 1 (the interface rejects empty inputs); the boxes are the tile
    table's powers of two. tests/test_launch.py checks the result equals the checked constructor's.
    A triton whose TensorDescriptor has other fields (pyproject allows >= 3.2) gets the checked one."""
    if not _UNCHECKED_DESCRIPTORS:
        return TensorDescriptor(t, list(t.shape), list(t.stride()), block_shape)
    return unchecked(TensorDescriptor, base=t, shape=list(t.shape), strides=list(t.stride()), block_shape=block_shape,
                     padding="zero")


def has_exactly_fields(cls, names: set[str]) -> bool:
    """Whether cls is a plain dataclass (no __slots__) with exactly these fields, so that
    `unchecked` builds what its constructor would, minus the checks."""
    return (dataclasses.is_dataclass(cls) and not hasattr(cls, "__slots__")
            and {f.name for f in dataclasses.fields(cls)} == names)


def unchecked(cls, **fields):
    """An instance of the dataclass cls with these fields, without running __init__ or
    __post_init__ (their checks cost microseconds per descriptor on the hot path)."""
    d = cls.__new__(cls)
    d.__dict__.update(fields)
    return d


# The fields _descriptor fills (triton 3.6); with any other set it takes the checked constructor.
_UNCHECKED_DESCRIPTORS = has_exactly_fields(TensorDescriptor, {"base", "shape", "strides", "block_shape", "padding"})


def table_descriptor(t: torch.Tensor, block_rows: int, block_r: int):
    """Descriptor of a (seqlen, rotary_dim / 2) cos or sin table for (block_rows, block_r) boxes;
    columns past rotary_dim / 2 and rows past the table read as 0."""
    return _descriptor(t, [block_rows, block_r])


def key_descriptors(k: torch.Tensor, block_n: int, blocks: dict, rope: bool, rotary_dim: int,
                    cos: torch.Tensor | None, sin: torch.Tensor | None) -> list:
    """[K, K's pass-through channels, cos, sin, K's tail group] descriptors for (block_n)-row key
    tiles. Without RoPE, one box of BLOCK_P channels, three Nones and the tail; with RoPE
    (`rope_tma_applies`), K's box is one NeoX half (BLOCK_R channels), the pass-through box exists
    when rotary_dim < head dim, and the tables come in (block_n, BLOCK_R) boxes, for
    `channel_groups._load_qk_tma`. The tail (a box of BLOCK_T channels) exists where the pass-through
    channels are two groups (channel_groups.py's t), else None."""
    tail = tile_descriptor(k, block_n, blocks["BLOCK_T"]) if blocks["BLOCK_T"] else None
    if not rope:
        return [tile_descriptor(k, block_n, blocks["BLOCK_P"]), None, None, None, tail]
    passthrough = tile_descriptor(k, block_n, blocks["BLOCK_P"]) if rotary_dim < k.shape[-1] else None
    return [tile_descriptor(k, block_n, blocks["BLOCK_R"]), passthrough,
            *(table_descriptor(t, block_n, blocks["BLOCK_R"]) for t in (cos, sin)), tail]


def tile_descriptor(t: torch.Tensor, block_rows: int, block_d: int):
    """Descriptor of a (batch, seqlen, heads, dim) tensor for (1, block_rows, 1, block_d) boxes."""
    return _descriptor(t, [1, block_rows, 1, block_d])
