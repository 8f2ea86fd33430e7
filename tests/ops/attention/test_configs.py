"""The tile table's rules (configs.py): which tiles a call gets, and what the kernels are told.

The GPU rows are plain functions of the call's shape, so they are checked here on the CPU; the
kernels under each tile run in the GPU suite (every bf16 test at seqlen <= 1,024 and head dim
<= 64 now takes the short-sequence tiles)."""

import pytest
import torch

from genoflash.ops.attention import backward as backward_mod, configs, forward as forward_mod
from genoflash.ops.attention.configs import TileConfig

from tests.utils import random_qkv

SHORT_FWD = TileConfig(64, 64, 4, 3)


def fwd(d=64, dv=None, causal=False, dtype=torch.bfloat16, rope=0, dropout=False, seqlen=0):
    return configs._gpu_forward(d, dv or d, causal, dtype, rope, dropout, seqlen)


def bwd(d=64, dv=None, causal=False, dtype=torch.bfloat16, rope=0, dropout=False, seqlen=0):
    return configs._gpu_backward(d, dv or d, causal, dtype, rope, dropout, seqlen)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [32, 64])
def test_head_dims_up_to_64_take_the_short_sequence_tiles(d, dtype):
    long_fwd, long_bwd = TileConfig(128, 64, 8, 3), bwd(d, dtype=dtype)
    assert fwd(d, dtype=dtype) == long_fwd and long_bwd.dq == TileConfig(128, 64, 8, 3)
    assert long_bwd.dkdv == TileConfig(32, 128, 4, 3)
    fwd_limit, bwd_limit = configs.SHORT_FORWARD_SEQLEN_64, configs.SHORT_BACKWARD_SEQLEN_64
    for n in (1, 17, 512, fwd_limit):
        assert fwd(d, dtype=dtype, seqlen=n) == SHORT_FWD
    assert fwd(d, dtype=dtype, seqlen=fwd_limit + 1) == long_fwd
    # Causal: the short forward and dQ tiles at every length (measured to 16k), the dK/dV tile to the limit.
    for n in (0, 1, 129, fwd_limit + 1, bwd_limit + 1, 65536):
        assert fwd(d, causal=True, dtype=dtype, seqlen=n) == SHORT_FWD
        assert bwd(d, causal=True, dtype=dtype, seqlen=n).dq == TileConfig(64, 64, 4, 3)
    for n in (1, 129, bwd_limit):
        full, causal = bwd(d, dtype=dtype, seqlen=n), bwd(d, causal=True, dtype=dtype, seqlen=n)
        assert full.dq == TileConfig(64, 64, 4, 3)
        assert full.dkdv == TileConfig(32, 128, 4, 3) and causal.dkdv == TileConfig(32, 64, 4, 3)
    assert bwd(d, dtype=dtype, seqlen=bwd_limit + 1) == long_bwd
    assert bwd(d, causal=True, dtype=dtype, seqlen=bwd_limit + 1).dkdv == TileConfig(32, 128, 4, 3)


@pytest.mark.parametrize("case", ["hd128", "dv128", "rope", "dropout", "fp32"])
def test_the_short_tiles_stay_where_they_were_measured(case):
    kw = dict(hd128=dict(d=128), dv128=dict(d=64, dv=128), rope=dict(rope=2), dropout=dict(dropout=True),
              fp32=dict(dtype=torch.float32))[case]
    for causal in (False, True):
        for n in (17, 512):
            assert fwd(causal=causal, seqlen=n, **kw) == fwd(causal=False, **kw) != SHORT_FWD
            assert bwd(causal=causal, seqlen=n, **kw) == bwd(causal=causal, **kw)
            assert bwd(causal=causal, seqlen=n, **kw).dq != TileConfig(64, 64, 4, 3)


def test_the_kernels_pass_the_longer_sequence_length(monkeypatch, device):
    seen = []

    def recorder(real):
        def config(*args, **kw):
            seen.append(args[7] if len(args) > 7 else kw.get("seqlen"))
            return real(*args, **kw)
        return config

    monkeypatch.setattr(forward_mod, "forward_config", recorder(configs.forward_config))
    monkeypatch.setattr(backward_mod, "backward_config", recorder(configs.backward_config))
    import genoflash
    from genoflash.backends import use_backend

    for n_q, n_k in ((17, 129), (129, 17)):
        seen.clear()
        q, k, v, dout = random_qkv(1, n_q, n_k, 2, 32, torch.float16, device)
        with use_backend("triton"):
            torch.autograd.grad(genoflash.flash_attn_func(q, k, v), (q, k, v), dout)
        assert seen == [129, 129]


def test_head_dim_256_forward_takes_32_key_tiles():
    """hd256's forward: 64x32 w4 up to 1,024 tokens (causal from 513 on), 128x32 w8 beyond and for an
    unknown length (configs._gpu_forward; measured 1.3-1.6x faster than the 64x64 tile it replaced);
    other wide pairs keep 64x64."""
    short, long = TileConfig(64, 32, 4, 3), TileConfig(128, 32, 8, 3)
    for n, causal, want in [(1, False, short), (512, False, short), (1024, False, short), (1025, False, long),
                            (0, False, long), (512, True, long), (513, True, short), (1024, True, short),
                            (8192, True, long)]:
        assert fwd(256, causal=causal, seqlen=n) == want, (n, causal)
    assert fwd(256, dropout=True, seqlen=16384) == long
    assert fwd(256, 128) == TileConfig(64, 64, 4, 3)
