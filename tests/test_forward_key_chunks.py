"""The forward over chunks of keys, one launch per chunk with the online softmax's state carried
between launches in float32 (configs.forward_key_chunk; off by default until timed on the
H200). Processed in the same tile order as one launch, it must give the same output and LSE bit
for bit, with every feature, and so the same gradients. The launches are counted, so a silent
single launch would fail."""

from __future__ import annotations

import pytest
import torch

import genoflash
from genoflash.ops.attention import forward
from genoflash.ops.attention.configs import override_configs
from genoflash.rotary import rotary_tables

from .conftest import HAS_CUDA

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


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("seqlen_q,seqlen_k,nheads,nheads_k,d,dv", [
    (129, 300, 4, 2, 40, 24),   # GQA, Dv != D, odd lengths, seqlen_q < seqlen_k
    (300, 260, 2, 1, 32, 32),   # seqlen_q > seqlen_k: early queries see no key under causal
    (1, 129, 2, 2, 24, 24),     # one query
])
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
    for chunk in (None, 64):  # 64 keys: two of the interpreter's 32-key tiles per launch (one GPU tile)
        launches.clear()
        with genoflash.use_backend("triton"), override_configs(key_chunk=chunk):
            out, lse = genoflash.flash_attn_func(q, k, v, **kwargs)
            grads = torch.autograd.grad(out, [q, k, v], dout)
        runs.append([out, lse, *grads])
        if chunk is None:
            assert [flags[:2] for flags in launches] == [(False, False)]
    block_n = launches[0][2]
    n_launches = -(-seqlen_k // max(block_n, 64 // block_n * block_n))
    assert n_launches >= 2
    assert [flags[:2] for flags in launches] == [(False, True)] + [(True, True)] * (n_launches - 2) + [(True, False)]
    for name, a, b in zip(["out", "lse", "dq", "dk", "dv"], *runs):
        assert not torch.isnan(a).any(), name
        assert torch.equal(a, b), f"{name}: max diff {(a.float() - b.float()).abs().max().item():.3e}"
