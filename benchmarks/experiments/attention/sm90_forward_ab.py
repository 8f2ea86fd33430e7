"""Probe (cited by docs/design/attention-forward-sm90.md): the Gluon forward (forward_sm90.py) against the
triton forward, SDPA's cuDNN backend, and flash-attn-4 where it is importable; forward and fwd+bwd TF/s,
medians, all in one process, with each output's relative error against the first provider that ran
the case among cuDNN and the triton forward.

    python benchmarks/experiments/attention/sm90_forward_ab.py OUT.json [--quick | --features | --rows | --varlen]
    python benchmarks/experiments/attention/sm90_forward_ab.py --plot OUT.json   # OUT.png beside it

The plain shapes are the flash-attn-4 comparison's; --features runs the feature paths (head dims
96/192/256, Dv != D, softcap, ALiBi, a causal window at 256k, GQA causal at 128k); --rows runs head
dims up to 64 with the Gluon forward at three compute warpgroups (192 rows, its rule there) and at two
(128 rows, "genoflash-2wg"); --varlen runs packed
batches (65,536 tokens as mixed lengths 1k-32k, full and causal, 16 heads of 128)
through flash_attn_varlen_func, the Gluon forward against the triton one. TF/s count the
useful FLOPs, 2 (D + Dv) per visible (query, key) pair (so the standard formula for plain and
causal attention), x3.5 with the backward. The JSON is rewritten after each case.
"""

from __future__ import annotations

import itertools
import json
import sys

import torch
import torch.nn.functional as F

import genoflash
from genoflash.bench.common import FWD_BWD_OVER_FWD, median_ms, relative_error, run_metadata, tflops
from genoflash.bench.features import mixed_lengths, visible_pairs
from genoflash.ops.attention import forward_sm90
from genoflash.ops.attention.configs import override_configs

DEV = torch.device("cuda")
# (batch, heads, heads_k, seqlen, d, dv, causal, keyword arguments of flash_attn_func)
SHAPES = [
    (1, 8, 8, 65536, 128, 128, False, {}), (1, 8, 8, 262144, 128, 128, False, {}),
    (1, 16, 16, 16384, 128, 128, False, {}), (1, 16, 16, 16384, 128, 128, True, {}),
    (1, 32, 32, 16384, 64, 64, False, {}), (16, 16, 16, 1024, 128, 128, False, {}),
]
QUICK = [SHAPES[i] for i in (0, 2, 3, 4, 5)]  # the flash-attn-4 comparison but 262k
FEATURES = [
    (1, 16, 16, 16384, 96, 96, False, {}), (1, 16, 16, 16384, 96, 96, True, {}),
    (1, 16, 16, 16384, 192, 192, False, {}), (1, 16, 16, 16384, 256, 256, False, {}),
    (8, 8, 8, 4096, 64, 192, False, {}), (1, 16, 16, 16384, 128, 64, False, {}),
    (1, 16, 16, 16384, 128, 128, False, {"softcap": 30.0}),
    (1, 16, 16, 16384, 128, 128, True, {"alibi": True}),
    (1, 16, 16, 262144, 128, 128, True, {"window_size": (4096, 0)}),
    (1, 32, 8, 131072, 128, 128, True, {}),
    (4, 16, 16, 4096, 64, 64, True, {}),
]
# Packed batches: (1, heads, heads, total tokens, d, dv, causal, {"lengths": ...}).
VARLEN = [(1, 16, 16, 65536, 128, 128, causal, {"lengths": lengths})
          for lengths in (mixed_lengths(65536),) for causal in (False, True)]
ROWS = [
    (1, 32, 32, 16384, 64, 64, False, {}), (1, 32, 32, 16384, 64, 64, True, {}),
    (4, 16, 16, 4096, 64, 64, True, {}), (1, 32, 32, 16384, 32, 32, False, {}),
    (1, 32, 8, 65536, 64, 64, True, {}),
]


def providers(causal, kw, two_warpgroups=False, varlen=None):
    def attend(q, k, v):
        if varlen is None:
            return genoflash.flash_attn_func(q, k, v, causal=causal, **kw)
        cu, longest = varlen
        return genoflash.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, longest, longest, causal=causal, **kw)

    def gf(q, k, v):  # the Gluon forward (and the default backward)
        with override_configs(sm90_forward=True):
            return attend(q, k, v)

    def gf_triton(q, k, v):
        with override_configs(sm90_forward=False):
            return attend(q, k, v)

    def cudnn(q, k, v):
        if kw or q.shape[-1] != v.shape[-1] or varlen is not None:
            raise NotImplementedError("not a plain case")
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal,
                                                  enable_gqa=kt.shape[1] != qt.shape[1]).transpose(1, 2)

    def gf_2wg(q, k, v):  # the Gluon forward with 128-row programs (two compute warpgroups) at any head dim
        saved = forward_sm90.tiles
        forward_sm90.tiles = lambda block_d, block_dv: (128, *saved(block_d, block_dv)[1:])
        try:
            return gf(q, k, v)
        finally:
            forward_sm90.tiles = saved

    out = {"genoflash": gf, "genoflash-triton": gf_triton, "cudnn": cudnn}
    if varlen is not None:
        out = {"genoflash": gf, "genoflash-triton": gf_triton}
    if two_warpgroups:
        out["genoflash-2wg"] = gf_2wg
    try:
        from flash_attn.cute import flash_attn_func as fa4

        def run_fa4(q, k, v):
            if "alibi_slopes" in kw:
                raise NotImplementedError("no ALiBi")
            if varlen is not None:
                from flash_attn.cute import flash_attn_varlen_func as fa4_varlen
                cu, longest = varlen
                o = fa4_varlen(q[0], k[0], v[0], cu, cu, longest, longest, causal=causal, **kw)
                return o[0] if isinstance(o, tuple) else o
            o = fa4(q, k, v, causal=causal, **kw)
            return o[0] if isinstance(o, tuple) else o
        out["fa4"] = run_fa4
    except Exception:
        pass
    return out


LABELS = {"genoflash": "genoflash, Gluon forward", "genoflash-2wg": "genoflash, Gluon forward, 128 rows",
          "genoflash-mbar-turns": "genoflash, Gluon forward, turns by shared-memory barriers",
          "genoflash-triton": "genoflash, triton forward",
          "cudnn": "SDPA cuDNN", "fa4": "flash-attn-4"}


def case_label(row) -> str:
    b, h, hk, n, d, dv = row["shape"]
    extra = [key for key in ("softcap", "alibi", "window_size") if key in row]
    return (f"B{b} H{h}{'/' + str(hk) if hk != h else ''} N{n // 1024}k D{d}{'/' + str(dv) if dv != d else ''}"
            f"{' causal' if row['causal'] else ''}{' ' + ' '.join(extra) if extra else ''}")


def plot(path: str) -> None:
    """Forward and fwd+bwd TF/s per case and provider, as grouped bars, into path's .png."""
    from pathlib import Path

    from genoflash.bench.common import pyplot, save_figure, title_stamp

    report = json.loads(Path(path).read_text())
    rows = report["rows"]
    names = [n for n in ("genoflash", "genoflash-2wg", "genoflash-mbar-turns", "genoflash-triton", "cudnn", "fa4")
             if any("fwd_tflops" in r.get(n, {}) for r in rows)]
    plt = pyplot()
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 1.3 * len(rows)), 7), sharex=True)
    width = 0.8 / len(names)
    for ax, key, title in zip(axes, ("fwd_tflops", "fwdbwd_tflops"), ("forward", "forward + backward")):
        for i, name in enumerate(names):
            xs = [j + i * width for j, r in enumerate(rows) if key in r.get(name, {})]
            ys = [r[name][key] for r in rows if key in r.get(name, {})]
            ax.bar(xs, ys, width, label=LABELS.get(name, name))
        ax.set_ylim(0, 1.2 * max(r[n][key] for r in rows for n in names if key in r.get(n, {})))  # legend room
        ax.set_ylabel(f"{title} TF/s")
        ax.legend(ncol=len(names), fontsize=8)
    axes[1].set_xticks([j + 0.4 - width / 2 for j in range(len(rows))])
    axes[1].set_xticklabels([case_label(r) for r in rows], rotation=30, ha="right", fontsize=8)
    fig.suptitle(f"attention, bf16, useful-FLOP TF/s | {title_stamp(report['metadata'])}", fontsize=9)
    save_figure(fig, Path(path).with_suffix(".png"))


def main(argv):
    if argv[0] == "--plot":
        return plot(argv[1])
    path = argv[0]
    modes = {"--quick": QUICK, "--features": FEATURES, "--rows": ROWS,
             "--varlen": VARLEN}
    cases = next((shapes for flag, shapes in modes.items() if flag in argv), SHAPES)
    rows = []
    for (b, h, hk, n, d, dv, causal, kw) in cases:
        kw = dict(kw)
        lengths = kw.pop("lengths", None)
        varlen = None
        if lengths is not None:  # one packed batch of these lengths (b is 1, n their sum)
            cu = torch.tensor([0, *itertools.accumulate(lengths)], device=DEV, dtype=torch.int32)
            varlen = (cu, max(lengths))
        torch.manual_seed(0)
        q = torch.randn(b, n, h, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, n, hk, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, n, hk, dv, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        dout = torch.randn(b, n, h, dv, device=DEV, dtype=torch.bfloat16)
        call_kw = dict(kw)
        if call_kw.pop("alibi", False):
            call_kw["alibi_slopes"] = torch.rand(h, device=DEV, dtype=torch.float32) * 0.1
        window = call_kw.get("window_size", (-1, -1))
        flops = 2 * (d + dv) * h * b * (visible_pairs(n, n, causal, window) if lengths is None else
                                        sum(visible_pairs(m, m, causal, window) for m in lengths))
        rec = {"shape": [b, h, hk, n, d, dv], "causal": causal, **{key: str(val) for key, val in kw.items()}}
        if lengths is not None:
            rec["lengths"] = lengths
        ref = None
        for name, fn in providers(causal, call_kw, "--rows" in argv, varlen).items():
            try:
                with torch.no_grad():
                    out = fn(q, k, v)
                if ref is None and name in ("cudnn", "genoflash-triton"):
                    ref = out
                fwd = median_ms(lambda: fn(q, k, v), DEV)

                def fb():
                    o = fn(q, k, v)
                    torch.autograd.grad(o, (q, k, v), dout.view_as(o))  # (varlen: o is packed)
                fwdbwd = median_ms(fb, DEV)
                rec[name] = {"fwd_ms": fwd, "fwdbwd_ms": fwdbwd, "out": out, "fwd_tflops": tflops(flops, fwd),
                             "fwdbwd_tflops": tflops(FWD_BWD_OVER_FWD * flops, fwdbwd)}
            except Exception as e:
                rec[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            torch.cuda.empty_cache()
        for name, r in rec.items():
            if isinstance(r, dict) and "out" in r:
                o = r.pop("out")
                if ref is not None:
                    r["rel_err_vs_reference"] = relative_error(o, ref)
        rows.append(rec)
        err = "rel_err_vs_reference"
        cells = [f"{name} {r['fwd_tflops']:.0f}/{r['fwdbwd_tflops']:.0f} e{r.get(err, float('nan')):.0e}"
                 if "fwd_tflops" in r else f"{name} ERR {r['error'][:60]}"
                 for name, r in rec.items() if isinstance(r, dict)]
        print(f"B{b} H{h}/{hk} N{n} D{d}/{dv}{' causal' if causal else ''} {kw or ''}: " + " | ".join(cells),
              flush=True)
        with open(path, "w") as f:
            json.dump({"metadata": run_metadata(DEV), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
