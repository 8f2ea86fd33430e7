"""One HyenaOperator's forward+backward on CUDA: median time and peak memory against N.

HyenaOperator(d_model=256, l_max=N, order=2) at batch 1 under bf16 autocast (fp32 parameters;
`--bf16-params` casts the layer to bf16 instead, as `genoflash bench mixers` does). Time is the
median of `triton.testing.do_bench`; peak is torch.cuda.max_memory_allocated over one call after
a reset, inputs and parameters included. One JSON line per N.

To compare with another version, run it again importing genoflash from that tree:

    python benchmarks/hyena_layout_probe.py                     # this checkout
    python benchmarks/hyena_layout_probe.py --root /path/to/old # e.g. `git worktree add /path/to/old <rev>`

`--profile N` also prints the CUDA kernels of one call at N, largest first.
"""

import argparse
import json
import sys
from pathlib import Path

parser = argparse.ArgumentParser(description="HyenaOperator fwd+bwd: time and peak memory against N")
parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                    help="directory holding the genoflash package to import (default: this checkout)")
parser.add_argument("--seqlens", type=int, nargs="+", default=[16384, 65536, 262144, 1048576])
parser.add_argument("--bf16-params", action="store_true", help="cast the layer to bf16 instead of autocast")
parser.add_argument("--profile", type=int, default=None, metavar="N", help="also list one call's kernels at N")
args = parser.parse_args()
sys.path.insert(0, str(args.root.resolve()))

import torch  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import genoflash  # noqa: E402
from genoflash.layers import HyenaOperator  # noqa: E402


def make_step(seqlen: int):
    torch.manual_seed(0)
    layer = HyenaOperator(d_model=256, l_max=seqlen, order=2).cuda()
    dtype = torch.bfloat16 if args.bf16_params else torch.float32
    layer = layer.to(dtype)
    u = torch.randn(1, seqlen, 256, device="cuda", dtype=dtype, requires_grad=True)
    dy = torch.randn(1, seqlen, 256, device="cuda", dtype=torch.bfloat16)
    inputs = [u, *layer.parameters()]

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=not args.bf16_params):
            y = layer(u)
        torch.autograd.grad(y, inputs, dy)
    return step


for seqlen in args.seqlens:
    step = make_step(seqlen)
    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**30
    ms = do_bench(step, warmup=25, rep=200, return_mode="median")
    print(json.dumps({"seqlen": seqlen, "ms": round(ms, 3), "peak_gib": round(peak, 3),
                      "genoflash": str(Path(genoflash.__file__).parent), "bf16_params": args.bf16_params}),
          flush=True)
    del step
    torch.cuda.empty_cache()

if args.profile:
    from torch.profiler import ProfilerActivity, profile
    step = make_step(args.profile)
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)
    print(f"kernels of one call at N = {args.profile}: {sum(e.self_device_time_total for e in rows) / 1e3:.1f} ms")
    for e in rows[:30]:
        print(f"{e.self_device_time_total / 1e3:9.3f} ms {e.count:5d}x  {e.key[:150]}")
