"""The pieces every stage of the selective scan shares: the linear-recurrence operator, the
element-wise work around it (the step size dt = softplus(delta + delta_bias), the gate), tile
loads, and the host's tile sizes and launch flags.

The recurrence (reference.py states it in full) is h[t] = a[t] h[t-1] + b[t] with a = exp(dt A)
and b = dt B u, per (batch, channel, state); y[t] = sum_n C[t, n] h[t]. Composing two steps
h -> a1 h + b1 then h -> a2 h + b2 gives h -> (a1 a2) h + (a2 b1 + b2): an associative operator,
so chunks of steps scan in parallel (`_linear_recurrence`, `tl.associative_scan`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.host import next_power_of_2


@triton.jit
def _linear_recurrence(a1, b1, a2, b2):
    """Compose h -> a1 h + b1 (earlier) with h -> a2 h + b2 (later)."""
    return a1 * a2, a2 * b1 + b2


@triton.jit
def _tile_2d(ptr, stride_t, stride_x, offs_t, offs_x, n_t, n_x):
    """(CHUNK, X) tile of a (time, x) slice as float32; out-of-range reads are 0."""
    mask = (offs_t[:, None] < n_t) & (offs_x[None, :] < n_x)
    return tl.load(ptr + offs_t[:, None] * stride_t + offs_x[None, :] * stride_x, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _softplus(x):
    """log(1 + exp(x)) = max(x, 0) + log1p(e), e = exp(-|x|) in (0, 1], without overflow (as
    PyTorch's softplus, which returns x itself above 20, where this rounds to x as well).
    log1p(e) = 2 atanh(s), s = e / (2 + e) <= 1/3, by its odd series to s^13 (truncation below
    2e-8 relative), with one exp and one division: within ~1e-7 relative near x = 0, ~2e-6 at
    |x| = 30 (exp2 of a rounded large argument; tests/ops/mamba/test_mamba.py checks it). log(1 + e) itself loses
    relative accuracy where e is small (e ~ 1e-3 at Mamba's smallest initial steps), in
    fp32 and in PTX's approximate lg2 alike. Each (time, channel) value is computed by every
    thread that holds one of its states (the (CHUNK, BLOCK_D) tile is a slice of the 3-D one),
    so it is kept to two MUFU operations; libdevice's precise log took the local pass from 768
    to 1,800 instructions per thread (sm_90, bf16 inputs)."""
    e = tl.math.exp2(-tl.abs(x) * 1.4426950408889634)
    s = e / (2.0 + e)
    s2 = s * s
    series = 1.0 + s2 * (1.0 / 3 + s2 * (1.0 / 5 + s2 * (1.0 / 7 + s2 * (1.0 / 9 + s2 * (1.0 / 11 + s2 / 13)))))
    return tl.maximum(x, 0.0) + 2.0 * s * series


@triton.jit
def _sigmoid(x):
    """1 / (1 + exp(-x)), with exp2 (one MUFU) and the approximate division."""
    return 1.0 / (1.0 + tl.math.exp2(-x * 1.4426950408889634))


@triton.jit
def _step_size(DELTA, DELTA_BIAS, off_b, t0, d0, dim, stride_db, stride_dl, stride_dd, offs_t, offs_d, n_t,
               HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr):
    """dt = softplus(delta + delta_bias) (each part where asked) over one (CHUNK, BLOCK_D) tile,
    float32, and x = delta + delta_bias (softplus's derivative is sigmoid(x)). Steps at or past
    n_t get dt = 0, so a = exp(dt A) = 1 and b = 0 there: they leave the state unchanged (a
    bias would otherwise make softplus(0 + bias) > 0 past the sequence end)."""
    delta = _tile_2d(DELTA + off_b.to(tl.int64) * stride_db + t0.to(tl.int64) * stride_dl + d0 * stride_dd,
                     stride_dl, stride_dd, offs_t, offs_d, n_t, dim - d0)
    x = delta
    if HAS_BIAS:
        x += tl.load(DELTA_BIAS + d0 + offs_d, mask=offs_d < dim - d0, other=0.0).to(tl.float32)[None, :]
    dt = x
    if SOFTPLUS:
        dt = _softplus(x)
    return tl.where((offs_t < n_t)[:, None], dt, 0.0), x


@triton.jit
def _channel_vector(X, d0, dim, offs_d, HAS: tl.constexpr, BLOCK_D: tl.constexpr):
    """A (BLOCK_D,) slice of a per-channel float vector (D), float32; zeros when not given."""
    v = tl.zeros([BLOCK_D], dtype=tl.float32)
    if HAS:
        v = tl.load(X + d0 + offs_d, mask=offs_d < dim - d0, other=0.0).to(tl.float32)
    return v


@triton.jit
def _write_partial(ptr, value, mask, ATOMIC: tl.constexpr):
    """A partial sum: added into one shared float32 buffer (ATOMIC: no partials, but the order of
    the additions varies from run to run), or stored in this program's own slot."""
    if ATOMIC:
        tl.atomic_add(ptr, value, mask=mask, sem="relaxed")
    else:
        tl.store(ptr, value, mask=mask)


@triton.jit
def _decay(dt, a_log2, FAST_EXP: tl.constexpr):
    """The decays exp(dt A) = 2^(dt A log2(e)), from a_log2 = A log2(e) scaled once per state
    (the multiply by log2(e) would otherwise run per element). On the GPU as ex2.approx.ftz:
    without ftz, ex2.approx guards subnormal results with a compare and two multiplies around
    the MUFU (sm_90 SASS), four instructions where one does. Flushing a decay below 2^-126 to 0
    changes nothing a float32 state can hold."""
    x = dt * a_log2
    if FAST_EXP:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    return tl.math.exp2(x)


# ---------------------------------------------------------------- host

def chunk_blocks(dim: int, dstate: int, interpreted: bool) -> dict:
    """The chunk length (CHUNK steps: the chunk states' granularity, shared by the forward and
    both backwards) and the rows layout's (CHUNK, BLOCK_D, BLOCK_N) tile."""
    # A (CHUNK, BLOCK_D, BLOCK_N) float32 tile per live tensor: CHUNK * BLOCK_D * BLOCK_N = 8192
    # keeps each at 32 registers per thread over 8 warps.
    block_n = max(2, next_power_of_2(dstate))
    block_d = 8 if interpreted else max(1, min(16, 256 // block_n))
    chunk = 16 if interpreted else max(8, 8192 // (block_d * block_n))
    # 8 warps: 256 threads share each 8192-element tile (4 warps made the gradient pass spill).
    return dict(CHUNK=chunk, BLOCK_D=block_d, BLOCK_N=block_n, num_warps=8)


def grads_blocks(dim: int, dstate: int, interpreted: bool, deterministic: bool) -> dict:
    """The gradient pass's tile. Deterministic: the forward's (each channel block writes its own
    dB/dC partials, so fewer, wider blocks keep those small), at 255 registers, one 8-warp
    program per SM. Not deterministic: a quarter of the channels, 108 registers, two programs
    per SM (tools/offline_compile.py mamba), dB/dC added atomically with no partials."""
    cfg = chunk_blocks(dim, dstate, interpreted)
    if not deterministic and not interpreted:
        cfg["BLOCK_D"] = max(1, cfg["BLOCK_D"] // 4)
    return cfg


def strides3(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def kernel_flags(D, z, delta_bias, softplus: bool) -> dict:
    return dict(HAS_BIAS=delta_bias is not None, SOFTPLUS=bool(softplus), HAS_D=D is not None, HAS_Z=z is not None)


def check_same_layout(u: torch.Tensor, **others: torch.Tensor | None) -> None:
    """The kernels index z, dout and the (token, channel) gradients with u's strides."""
    for name, t in others.items():
        if t is not None and (t.shape != u.shape or t.stride() != u.stride()):
            raise ValueError(f"{name} must have u's shape and strides {tuple(u.shape)} {u.stride()}, "
                             f"got {tuple(t.shape)} {t.stride()}")


# Whether the backwards scan the adjoint as a flipped forward scan (backward.py's _chunk_adjoint;
# backward_channels_first.py reads its inputs in reversed step order instead), which the GPU
# always does: Triton lowers reverse=True with lane shuffles. The interpreter runs tl.flip slowly
# (the scan tests took ~3x as long), so CPU runs take reverse=True, except where a test sets this
# to True to run the GPU's form on the CPU (tests/ops/mamba/test_mamba.py does, for both layouts).
FLIP_REVERSE_SCAN_IN_INTERPRETER = False


def flip_reverse_scan(interpreted: bool) -> bool:
    return FLIP_REVERSE_SCAN_IN_INTERPRETER if interpreted else True
