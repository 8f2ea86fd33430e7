"""Probe (cited by docs/design/decoding.md): how a decoding step's GPU time splits between the
split-KV kernel and the combine kernel (torch profiler, GQA 32:8 at 131,072 keys), and the host
time of one decode_attention call where the GPU work is short (512 and 4,096 keys). On a GPU:
`python3 benchmarks/experiments/profile_decode.py`."""
import torch
from torch.profiler import profile, ProfilerActivity
from genoflash.ops.attention import decode
q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 131072, 8, 128, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
for _ in range(3): decode.decode_attention(q, k, v, None, 131072, softmax_scale=128 ** -0.5)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as p:
    for _ in range(20): decode.decode_attention(q, k, v, None, 131072, softmax_scale=128 ** -0.5)
    torch.cuda.synchronize()
print(p.key_averages().table(sort_by="cuda_time_total", row_limit=6))
import time
for n in (512, 4096):
    kk = k[:, :n]; vv = v[:, :n]
    for _ in range(5): decode.decode_attention(q, kk, vv, None, n, softmax_scale=128 ** -0.5)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(200): decode.decode_attention(q, kk, vv, None, n, softmax_scale=128 ** -0.5)
    torch.cuda.synchronize(); print(f"host+gpu per call at {n} keys: {(time.perf_counter() - t) / 200 * 1e6:.1f} us")
