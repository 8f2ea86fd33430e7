"""Which matmuls of the Hyena layer cost the host most (a research probe, GPU only).

The host probe (hyena_host_probe.py) put aten::mm first by self CPU time in the 16k layer's
fwd+bwd: 10 calls, 2.6 ms, where a small mm alone costs ~20 us. This records every mm/addmm/bmm
of one profiled step with its shapes and strides and self CPU time, then re-times each distinct
(op, shapes, strides) alone: host us per call without synchronising, 200 calls.

    python benchmarks/hyena_mm_probe.py --out mm.json [--seqlen 16384]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from genoflash.bench.mixers import layer_step
from genoflash.bench.records import run_metadata


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--d-model", type=int, default=256)
    args = parser.parse_args()
    from torch.profiler import ProfilerActivity, profile
    device = torch.device("cuda")
    step = layer_step("hyena", args.d_model, args.seqlen, device, torch.bfloat16).step
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
        torch.cuda.synchronize()
    calls = [e for e in prof.events() if e.name in ("aten::mm", "aten::addmm", "aten::bmm")]
    rows = []
    for e in calls:
        rows.append({"op": e.name, "shapes": [list(s) for s in e.input_shapes if s],
                     "self_cpu_us": e.self_cpu_time_total, "cpu_us": e.cpu_time_total})
        print(f"{e.name:12s} self {e.self_cpu_time_total:8.1f} us  total {e.cpu_time_total:8.1f} us  {rows[-1]['shapes']}",
              flush=True)
    # Each distinct shape alone, operands contiguous and transposed both ways: host us per call.
    alone = []
    seen = set()
    for r in rows:
        if r["op"] != "aten::mm" or len(r["shapes"]) != 2:
            continue
        (m, k), (k2, n) = r["shapes"]
        if (m, k, n) in seen:
            continue
        seen.add((m, k, n))
        for ta in (False, True):
            for tb in (False, True):
                a = torch.randn(k, m, device=device, dtype=torch.bfloat16).mT if ta else \
                    torch.randn(m, k, device=device, dtype=torch.bfloat16)
                b = torch.randn(n, k, device=device, dtype=torch.bfloat16).mT if tb else \
                    torch.randn(k, n, device=device, dtype=torch.bfloat16)
                for _ in range(10):
                    a @ b
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(200):
                    a @ b
                host = (time.perf_counter() - start) / 200 * 1e6
                torch.cuda.synchronize()
                gpu = (time.perf_counter() - start) / 200 * 1e6
                alone.append({"m": m, "k": k, "n": n, "a_transposed": ta, "b_transposed": tb,
                              "host_us": host, "with_sync_us": gpu})
                print(f"mm ({m}x{k}){'T' if ta else ''} @ ({k}x{n}){'T' if tb else ''}: host {host:7.1f} us, "
                      f"until done {gpu:7.1f} us per call", flush=True)
    with open(args.out, "w") as f:
        json.dump({"metadata": run_metadata(method="profiled Hyena fwd+bwd, B1 bf16; each mm shape alone, "
                                            "200 calls", seqlen=args.seqlen),
                   "calls": rows, "alone": alone}, f, indent=1)


if __name__ == "__main__":
    main()
