"""Probe: what fused RoPE costs over plain attention, forward and fwd+bwd, on the H200 (one process).

Variants at H16 N16k and H8 N64k, hd128, bf16:
- `plain`: no RoPE;
- `fp32 tables`, `fp16 tables`: fused RoPE as shipped (the forward takes K's NeoX halves and the
  tables by TMA since d2aed4e; the backward's passes use pointer loads);
- `fp32 tables, dQ by TMA`, `fp16 tables, dQ by TMA`: the same with the backward's dQ pass taking
  K and the tables by TMA too (`BackwardConfig.dq_rope_by_tma`, not yet in the tile table), to
  decide whether the table should turn it on.
(Until 029ff4f it also ran "rows repeat" variants, tables of row stride 0 meant to separate the
table traffic from the rotation. They ran 2-3x slower than real tables, twice: every program
reading one address contends, so they measured the contention. Removed.)

    python benchmarks/rope_probe.py --out rope_probe.json
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.testing

from genoflash.ops.attention.args import AttentionArgs
from genoflash.ops.attention.backward import attention_backward
from genoflash.ops.attention.configs import override_configs
from genoflash.ops.attention.forward import attention_forward
from genoflash.rotary import rotary_tables

SHAPES = [(1, 16, 16384, 128), (1, 8, 65536, 128)]  # (batch, nheads, seqlen, headdim), non-causal


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = []
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                commit=os.environ.get("GENOFLASH_COMMIT", "unknown"),
                method="do_bench median; fwd+bwd = attention_forward + attention_backward; "
                       "'dQ by TMA' = override_configs(dq_rope_by_tma=True)")
    for b, h, n, d in SHAPES:
        torch.manual_seed(0)
        q, k, v, dout = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        flops = 4 * b * h * n * n * d
        variants = {"plain": ({}, False)}
        for dtype, name in ((torch.float32, "fp32"), (torch.float16, "fp16")):
            cos, sin = rotary_tables(n, d, device="cuda", dtype=dtype)
            variants[f"{name} tables"] = (dict(rotary_cos=cos, rotary_sin=sin), False)
            variants[f"{name} tables, dQ by TMA"] = (dict(rotary_cos=cos, rotary_sin=sin), True)
        dq_pointers = None  # the previous variant's dQ: each "dQ by TMA" follows its pointer-load twin
        for name, (tables, dq_by_tma) in variants.items():
            a = AttentionArgs(d ** -0.5, **tables)
            row = dict(batch=b, nheads=h, seqlen=n, headdim=d, variant=name)
            try:
                out, lse = attention_forward(q, k, v, a)
                fwd = triton.testing.do_bench(lambda: attention_forward(q, k, v, a), warmup=25, rep=200,
                                              return_mode="median")
                with override_configs(dq_rope_by_tma=dq_by_tma):
                    dq = attention_backward(dout, q, k, v, out, lse, a)[0]
                    if dq_by_tma:  # the same dQ as the shipped pointer loads give, up to rounding
                        row["max_dq_diff_vs_pointers"] = (dq.float() - dq_pointers.float()).abs().max().item()
                    dq_pointers = dq
                    bwd = triton.testing.do_bench(lambda: attention_backward(dout, q, k, v, out, lse, a), warmup=25,
                                                  rep=200, return_mode="median")
                row.update(fwd_ms=fwd, fwd_tflops=flops / fwd * 1e-9, fwd_bwd_ms=fwd + bwd,
                           fwd_bwd_tflops=3.5 * flops / (fwd + bwd) * 1e-9)
            except Exception as e:  # noqa: BLE001 - a probe reports what failed and goes on
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(json.dumps(row), flush=True)
            rows.append(row)
            with open(args.out, "w") as f:
                json.dump(dict(meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
