"""The forward over chunks of keys, one launch per chunk with the online softmax's state carried
between launches in float32 (configs.forward_key_chunk; on the GPU by default above 65,536
keys). Processed in the same tile order as one launch, it must give the same output and LSE bit
for bit, with every feature, and so the same gradients. The launches are counted, so a silent
single launch would fail."""

from __future__ import annotations

import pytest
import torch

import genoflash
from genoflash.ops.attention import forward
from genoflash.ops.attention.configs import override_configs
from genoflash.ops.rotary import rotary_tables

from tests.utils import HAS_CUDA

DTYPE = torch.bfloat16 if HAS_CUDA else torch.float16

pytestmark = pytest.mark.usefixtures("poison_allocations")

CASES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "window": dict(window_size=(40, 7)),
    "causal-window-alibi-softcap": dict(causal=True, window_size=(50, 0), softcap=20.0, alibi=True),
    "dropout": dict(dropout_p=0.2),
    "rope": dict(rope=True),
}


# Under the interpreter (64-key chunks of two 32-key tiles) 150 keys still make three launches
# (first, carried-through, last) with a partial last chunk, over query tiles the last of which is
# partial, and two query heads share a key head; the GPU keeps its longer runs and four query heads.
SHAPES = [
    (129, 300, 4, 2, 40, 24),   # GQA, Dv != D, odd lengths, seqlen_q < seqlen_k
    (300, 260, 2, 1, 32, 32),   # seqlen_q > seqlen_k: early queries see no key under causal
    (1, 129, 2, 2, 24, 24),     # one query
] if HAS_CUDA else [
    (65, 150, 2, 1, 40, 24),    # GQA, Dv != D, odd lengths, seqlen_q < seqlen_k (two query tiles of 64)
    (100, 70, 2, 1, 32, 32),    # seqlen_q > seqlen_k: early queries see no key under causal (two launches)
    (1, 129, 2, 2, 24, 24),     # one query
]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("seqlen_q,seqlen_k,nheads,nheads_k,d,dv", SHAPES)
def test_key_chunks_equal_one_launch(case, seqlen_q, seqlen_k, nheads, nheads_k, d, dv, device, monkeypatch):
    opts = dict(CASES[case])
    if opts.get("rope") and seqlen_q > seqlen_k:
        pytest.skip("RoPE needs seqlen_q <= seqlen_k (bottom-right positions)")
    torch.manual_seed(21)
    q = torch.randn(2, seqlen_q, nheads, d, device=device, dtype=DTYPE, requires_grad=True)
    k = torch.randn(2, seqlen_k, nheads_k, d, device=device, dtype=DTYPE, requires_grad=True)
    v = torch.randn(2, seqlen_k, nheads_k, dv, device=device, dtype=DTYPE, requires_grad=True)
    kwargs = dict(causal=opts.get("causal", False), window_size=opts.get("window_size", (-1, -1)),
                  softcap=opts.get("softcap", 0.0), dropout_p=opts.get("dropout_p", 0.0), return_lse=True)
    if opts.get("alibi"):
        kwargs["alibi_slopes"] = torch.rand(nheads, device=device)
    if opts.get("dropout_p"):
        kwargs["dropout_seed"] = 5
    if opts.get("rope"):
        cos, sin = rotary_tables(max(seqlen_q, seqlen_k), d, device=device)
        kwargs.update(rotary_cos=cos, rotary_sin=sin)
    dout = torch.randn(2, seqlen_q, nheads, dv, device=device, dtype=DTYPE)
    launches = []
    real_launch = forward.launch

    def spy(kernel, grid, cfg, *args, **constexprs):
        launches.append((constexprs["CARRY_IN"], constexprs["CARRY_OUT"], constexprs["BLOCK_N"]))
        return real_launch(kernel, grid, cfg, *args, **constexprs)

    monkeypatch.setattr(forward, "launch", spy)
    runs = []
    for chunk in (0, 64):  # 0: one launch; 64 keys: two of the interpreter's 32-key tiles per launch (one GPU tile)
        launches.clear()
        with genoflash.use_backend("triton"), override_configs(key_chunk=chunk):
            # deterministic: bit-for-bit gradients from both runs (dQ summed in no fixed order would not be)
            out, lse = genoflash.flash_attn_func(q, k, v, deterministic=True, **kwargs)
            grads = torch.autograd.grad(out, [q, k, v], dout)
        runs.append([out, lse, *grads])
        if chunk == 0:
            assert [flags[:2] for flags in launches] == [(False, False)]
    block_n = launches[0][2]
    n_launches = -(-seqlen_k // max(block_n, 64 // block_n * block_n))
    assert n_launches >= (3 if seqlen_k > 129 else 2)  # a carried-through middle launch where the keys allow
    assert [flags[:2] for flags in launches] == [(False, True)] + [(True, True)] * (n_launches - 2) + [(True, False)]
    for name, a, b in zip(["out", "lse", "dq", "dk", "dv"], *runs):
        assert not torch.isnan(a).any(), name
        assert torch.equal(a, b), f"{name}: max diff {(a.float() - b.float()).abs().max().item():.3e}"


def test_default_chunking_stands_aside_where_it_cannot_help_or_fit(monkeypatch):
    """The default split (FORWARD_KEY_CHUNK) applies to long keys on the GPU only, not under a
    causal or window mask (slower causal on the H200; a window bounds the keys read), and not
    when its float32 state would take more than the allowed share of free memory. The device's
    memory is faked so that this runs on the CPU too."""
    from genoflash.ops.attention import configs
    cuda = torch.device("cuda")
    gib = 2**30
    monkeypatch.setattr(configs, "triton_interpreted", lambda: False)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * gib, 141 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 3 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 1 * gib)
    monkeypatch.setattr(configs, "_total_memory", {})  # the faked device's total, read afresh
    chunk = configs.FORWARD_KEY_CHUNK
    assert chunk and chunk % 128 == 0
    n = 4 * chunk
    assert configs.forward_key_chunk(n, 128, cuda, state_bytes=gib) == chunk
    assert configs.forward_key_chunk(chunk, 128, cuda, state_bytes=gib) is None  # fits in one chunk
    assert configs.forward_key_chunk(n, 128, torch.device("cpu"), state_bytes=gib) is None
    assert configs.forward_key_chunk(n, 128, cuda, masked=True, state_bytes=gib) is None
    # 10 GiB free plus 2 GiB cached: a state of 6 GiB fits (half), one of 6 GiB + 1 byte does not.
    assert configs.forward_key_chunk(n, 128, cuda, state_bytes=6 * gib) == chunk
    assert configs.forward_key_chunk(n, 128, cuda, state_bytes=6 * gib + 1) is None
    # An explicit override applies regardless; 0 forces one launch.
    with override_configs(key_chunk=1000):
        assert configs.forward_key_chunk(n, 128, cuda, masked=True, state_bytes=100 * gib) == 896
    with override_configs(key_chunk=0):
        assert configs.forward_key_chunk(n, 128, cuda, state_bytes=gib) is None


def test_small_buffers_fit_without_asking_the_driver(monkeypatch):
    """The driver's free-memory query waits for the device's queued work (a sync per call: 442 us
    inside a short backward on the H200), so fits_in_free_memory answers without it for buffers
    of at most SMALL_BUFFER_FRACTION of the device's memory, and asks for larger ones. A fraction
    of 0 never fits (tests use it to force the memory-lean path). Faked device, so on the CPU too."""
    from genoflash.ops.attention import configs
    cuda = torch.device("cuda")
    gib = 2**30
    asked = []

    def mem_get_info(device=None):
        asked.append(device)
        return 10 * gib, 128 * gib
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 3 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 1 * gib)
    monkeypatch.setattr(configs, "_total_memory", {})
    small = int(configs.SMALL_BUFFER_FRACTION * 128 * gib)
    assert configs.fits_in_free_memory(small, 0.5, cuda) and len(asked) == 1  # the total, read once
    for _ in range(3):
        assert configs.fits_in_free_memory(small, 0.5, cuda)
    assert len(asked) == 1
    # Past the small share: asked each time; 10 GiB free + 2 GiB cached, half of it is 6 GiB.
    assert configs.fits_in_free_memory(6 * gib, 0.5, cuda) and len(asked) == 2
    assert not configs.fits_in_free_memory(6 * gib + 1, 0.5, cuda) and len(asked) == 3
    assert not configs.fits_in_free_memory(1, 0.0, cuda)
    # The one-pass backward's rule goes through it: a small accumulator is taken without a query.
    from genoflash.ops.attention import backward_sm90
    q = torch.empty(8, 2048, 16, 128, device="meta")
    assert backward_sm90.accumulator_bytes(q) <= small
    n = len(asked)
    assert configs.fits_in_free_memory(backward_sm90.accumulator_bytes(q), backward_sm90.ACCUM_MAX_FREE_FRACTION,
                                       cuda) and len(asked) == n
