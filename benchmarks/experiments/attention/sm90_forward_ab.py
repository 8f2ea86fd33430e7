"""Probe (cited by docs/design/attention-forward-sm90.md): the Gluon forward (forward_sm90.py, forced with
override_configs) against the triton forward, SDPA's cuDNN and flash backends, and flash-attn-4 where it is
importable; forward and fwd+bwd TF/s (the standard formula), medians, all in one process, with each
output's relative error against cuDNN's.

    python benchmarks/experiments/attention/sm90_forward_ab.py OUT.json [--quick]
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

import genoflash
from genoflash.bench.common import attention_flops, median_ms, relative_error, run_metadata, tflops
from genoflash.ops.attention.configs import override_configs

DEV = torch.device("cuda")
SHAPES = [  # (batch, heads, heads_k, seqlen, d, causal)
    (1, 8, 8, 65536, 128, False), (1, 8, 8, 262144, 128, False), (1, 16, 16, 16384, 128, False),
    (1, 16, 16, 16384, 128, True), (1, 32, 32, 16384, 64, False), (16, 16, 16, 1024, 128, False),
    (1, 32, 8, 131072, 128, True), (4, 16, 16, 4096, 64, True),
]


def providers(causal):
    def gf(q, k, v):  # the Gluon forward (and the default backward)
        with override_configs(sm90_forward=True):
            return genoflash.flash_attn_func(q, k, v, causal=causal)

    def gf_triton(q, k, v):
        with override_configs(sm90_forward=False):
            return genoflash.flash_attn_func(q, k, v, causal=causal)

    def sdpa(backend):
        def run(q, k, v):
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
            with torch.nn.attention.sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal,
                                                      enable_gqa=kt.shape[1] != qt.shape[1]).transpose(1, 2)
        return run

    out = {"genoflash": gf, "genoflash-triton": gf_triton,
           "cudnn": sdpa(torch.nn.attention.SDPBackend.CUDNN_ATTENTION),
           "sdpa-flash": sdpa(torch.nn.attention.SDPBackend.FLASH_ATTENTION)}
    try:
        from flash_attn.cute import flash_attn_func as fa4

        def run_fa4(q, k, v):
            o = fa4(q, k, v, causal=causal)
            return o[0] if isinstance(o, tuple) else o
        out["fa4"] = run_fa4
    except Exception:
        pass
    return out


def main(argv):
    path = argv[0]
    quick = "--quick" in argv
    rows = []
    for (b, h, hk, n, d, causal) in [SHAPES[i] for i in (0, 3, 4, 5, 7)] if quick else SHAPES:
        torch.manual_seed(0)
        q = torch.randn(b, n, h, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(b, n, hk, d, device=DEV, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
        dout = torch.randn_like(q)
        rec = {"shape": [b, h, hk, n, d], "causal": causal}
        ref = None
        for name, fn in providers(causal).items():
            if name == "sdpa-flash" and hk != h:
                continue
            try:
                with torch.no_grad():
                    out = fn(q, k, v)
                if ref is None and name == "cudnn":
                    ref = out
                fwd = median_ms(lambda: fn(q, k, v), DEV)
                def fb():
                    o = fn(q, k, v)
                    torch.autograd.grad(o, (q, k, v), dout)
                fwdbwd = median_ms(fb, DEV)
                rec[name] = {"fwd_ms": fwd, "fwdbwd_ms": fwdbwd, "out": out,
                             "fwd_tflops": tflops(attention_flops(b, h, n, d, causal, False), fwd),
                             "fwdbwd_tflops": tflops(attention_flops(b, h, n, d, causal, True), fwdbwd)}
            except Exception as e:
                rec[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            torch.cuda.empty_cache()
        for name, r in rec.items():
            if isinstance(r, dict) and "out" in r:
                o = r.pop("out")
                if ref is not None:
                    r["rel_err_vs_cudnn"] = relative_error(o, ref)
        rows.append(rec)
        cells = [f"{name} {r['fwd_tflops']:.0f}/{r.get('fwdbwd_tflops', float('nan')):.0f}"
                 f" e{r.get('rel_err_vs_cudnn', float('nan')):.0e}" if "fwd_tflops" in r else f"{name} ERR {r['error'][:80]}"
                 for name, r in rec.items() if isinstance(r, dict)]
        print(f"B{b} H{h}/{hk} N{n} D{d}{' causal' if causal else ''}: " + " | ".join(cells), flush=True)
    with open(path, "w") as f:
        json.dump({"metadata": run_metadata(DEV), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
