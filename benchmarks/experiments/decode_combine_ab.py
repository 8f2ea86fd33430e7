"""Probe (cited by docs/design/decoding.md): a decoding step with the parts merged inside the split
kernel (an atomic count, COMBINE_IN_KERNEL) against the second combine kernel, on bench decode's
cases, for a cache in flash-attn's layout (batch, N, heads, dim) and one in SDPA's (batch, heads, N,
dim) read in place through a transposed view; SDPA cuDNN on its own layout beside them. Each case
runs its providers in rounds (A B C D, A B C D, ...) and reports each one's median over the rounds.
On a GPU: `python3 benchmarks/experiments/decode_combine_ab.py OUT.json`."""
import json
import statistics
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from genoflash import settings
from genoflash.bench.common import median_ms, run_metadata
from genoflash.bench.decode import CASES, HEADDIM
from genoflash.ops.attention import decode, flash_attn_with_kvcache

cuda = torch.device("cuda")


def run_case(name: str, batch: int, n: int, nheads: int, nheads_k: int) -> dict:
    torch.manual_seed(0)
    q = torch.randn(batch, 1, nheads, HEADDIM, device=cuda, dtype=torch.bfloat16)
    k = torch.randn(batch, n, nheads_k, HEADDIM, device=cuda, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kh, vh = (t.transpose(1, 2).contiguous() for t in (k, v))  # SDPA's layout
    qh = q.transpose(1, 2).contiguous()
    lengths = torch.full((batch,), n, dtype=torch.int32, device=cuda)

    def ours(kk, vv, in_kernel):
        def call():
            decode.COMBINE_IN_KERNEL = in_kernel
            return flash_attn_with_kvcache(q, kk, vv, cache_seqlens=lengths)
        return call

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, enable_gqa=nheads != nheads_k)

    providers = {"in-kernel": ours(k, v, True), "two-kernels": ours(k, v, False),
                 "in-kernel-heads-first": ours(kh.transpose(1, 2), vh.transpose(1, 2), True),
                 "two-kernels-heads-first": ours(kh.transpose(1, 2), vh.transpose(1, 2), False),
                 "sdpa-cudnn": cudnn}
    times = {p: [] for p in providers}
    with settings(check_indices=False):
        ref = cudnn().transpose(1, 2).float()
        for p, fn in providers.items():
            err = (fn().float() - ref).abs().max().item()
            assert err < 2e-2, (name, p, err)
        for _ in range(5):
            for p, fn in providers.items():
                times[p].append(median_ms(fn, cuda, rep_ms=100))
    decode.COMBINE_IN_KERNEL = True
    row = {"case": name, **{p: statistics.median(t) for p, t in times.items()}}
    print(name, "  ".join(f"{p} {row[p]:.4f}" for p in providers), flush=True)
    return row


rows = []
for name, shape in CASES.items():
    rows.append(run_case(name, *shape))
    torch.cuda.empty_cache()
json.dump({"metadata": run_metadata(), "rows": rows}, open(sys.argv[1], "w"), indent=1)
