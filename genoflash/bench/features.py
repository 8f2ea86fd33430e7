"""`genoflash bench features`: what the fused masks and biases cost, measured on the GPU.

Each case times forward and forward+backward (median of `triton.testing.do_bench`) and
reports TF/s over the FLOPs that are useful under its mask, so a sliding window or a
varlen batch is not credited for work it skips:
    forward  = 2 * (D + Dv) * (number of visible (query, key) pairs) per head,
    fwd+bwd  = 3.5 x forward  (the convention of the FlashAttention papers).

Cases (bf16, H=8 or 16, D=128 unless noted):
  window   sliding window +-2048, non-causal, N = 16k, 64k, 256k (time must grow linearly in N),
           with FlexAttention (torch.compile'd, its sliding-window block mask built outside the
           timed call) beside it on the same inputs, its output checked against genoflash's
  varlen   65,536 tokens as mixed lengths 1k-32k vs as 4 x 16k
  dv       value head dim != key head dim: (64, 192), (128, 192), (192, 128) at N = 16k
  alibi    ALiBi vs plain at N = 16k, H=16
  softcap  softcap 30 vs plain at N = 16k, H=16
  rope     fused RoPE (all 128 channels) vs plain at N = 16k (H=16) and 64k (H=8), and vs the
           unfused way: a separate rotary kernel (torch.compile'd, one kernel per tensor and
           pass) on q and k, then attention without RoPE
  dropout  dropout 0.1 vs plain at N = 16k, H=16
  gqa      16 query heads over 16 (MHA), 4 (GQA 4:1) and 1 (MQA) key/value heads, N = 16k,
           full and causal: what sharing K/V costs the backward, which sums dK/dV over the group
Results go to <out>/<gpu>-<date>-features.json.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ..ops.attention import flash_attn_func, flash_attn_varlen_func
from .common import (FWD_BWD_OVER_FWD, RESULTS_DIR, relative_error, results_stem, run_metadata, time_and_peak,
                     tflops, write_json)

CUDA = torch.device("cuda")


def visible_pairs(seqlen_q: int, seqlen_k: int, causal: bool, window: tuple[int, int]) -> int:
    """Number of (query, key) pairs the mask leaves visible, computed per row in O(N)."""
    left, right = window[0], 0 if causal else window[1]
    i = torch.arange(seqlen_q, dtype=torch.int64) + (seqlen_k - seqlen_q)
    lo = (i - left).clamp(min=0) if left >= 0 else torch.zeros_like(i)
    hi = (i + right).clamp(max=seqlen_k - 1) if right >= 0 else torch.full_like(i, seqlen_k - 1)
    return int((hi - lo + 1).clamp(min=0).sum())


def measure(call, inputs, pairs_per_head: int, nheads: int, d: int, dv: int) -> dict:
    """Forward and fwd+bwd of call(*inputs) -> out: ms, useful TF/s, peak GiB."""
    dout = torch.randn_like(call(*inputs))
    fwd_flops = 2 * (d + dv) * pairs_per_head * nheads
    rec = {}
    for mode, fn, flops in (("fwd", lambda: call(*inputs), fwd_flops),
                            ("fwd_bwd", lambda: torch.autograd.grad(call(*inputs), inputs, dout),
                             FWD_BWD_OVER_FWD * fwd_flops)):
        timed = time_and_peak(fn, CUDA)
        rec.update({f"{mode}_ms": timed["ms"], f"{mode}_tflops": tflops(flops, timed["ms"]),
                    f"{mode}_peak_gib": timed["peak_gib"]})
    return rec


def _qkv(batch, seqlen, nheads, d, dv, packed=False, nheads_k=None):
    shape = (batch * seqlen,) if packed else (batch, seqlen)
    return [torch.randn(*shape, h, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for h, dim in ((nheads, d), (nheads_k or nheads, d), (nheads_k or nheads, dv))]


def fixed_case(name, batch, seqlen, nheads, d=128, dv=128, nheads_k=None, **kw) -> dict:
    """One flash_attn_func configuration; nheads_k < nheads is GQA (the FLOPs stay those of nheads)."""
    pairs = batch * visible_pairs(seqlen, seqlen, kw.get("causal", False), kw.get("window_size", (-1, -1)))
    rec = measure(lambda q, k, v: flash_attn_func(q, k, v, **kw),
                  _qkv(batch, seqlen, nheads, d, dv, nheads_k=nheads_k), pairs, nheads, d, dv)
    print(f"{name:<28} fwd {rec['fwd_tflops']:6.1f} TF/s {rec['fwd_ms']:9.3f} ms | fwd+bwd "
          f"{rec['fwd_bwd_tflops']:6.1f} TF/s {rec['fwd_bwd_ms']:9.3f} ms", flush=True)
    features = {k: (str(v.dtype) if isinstance(v, torch.Tensor) else list(v) if isinstance(v, tuple) else v)
                for k, v in kw.items()}
    return {"case": name, "batch": batch, "seqlen": seqlen, "nheads": nheads, "nheads_k": nheads_k or nheads,
            "d": d, "dv": dv, "features": features, **rec}


def flex_window_case(name, seqlen, nheads, window: int, d=128) -> dict:
    """FlexAttention with a sliding-window block mask, the peer of the window rows; the record
    holds the error (out of memory at 256k on an H200) where it fails."""
    from .attention import REL_TOL, compiled_flex
    try:
        flex, block_mask = compiled_flex()

        def sliding(b, h, q_idx, kv_idx):
            return (q_idx - kv_idx <= window) & (kv_idx - q_idx <= window)
        mask = block_mask(sliding, None, None, seqlen, seqlen, device="cuda")
        inputs = _qkv(1, seqlen, nheads, d, d)

        def call(q, k, v):
            return flex(*(t.transpose(1, 2) for t in (q, k, v)), block_mask=mask).transpose(1, 2)
        # The same answer as genoflash before it is timed (bench attention's check). With autograd on,
        # as it is timed: under no_grad torch.compile builds a second (inference) graph, and on the
        # H200 machine ptxas ran for minutes on that graph's kernel where the training graph
        # compiles in seconds.
        err = relative_error(call(*inputs).detach(), flash_attn_func(*inputs, window_size=(window, window)).detach())
        if not err < REL_TOL:
            raise AssertionError(f"FlexAttention differs from genoflash: relative error {err:.1e}")
        pairs = visible_pairs(seqlen, seqlen, False, (window, window))
        rec = measure(call, inputs, pairs, nheads, d, d)
    except Exception as e:  # out of memory, or no compiler: the record says why
        print(f"{name:<28} failed: {str(e)[:200]}", flush=True)
        torch.cuda.empty_cache()
        return {"case": name, "seqlen": seqlen, "nheads": nheads, "d": d, "error": str(e)[:300]}
    print(f"{name:<28} fwd {rec['fwd_tflops']:6.1f} TF/s {rec['fwd_ms']:9.3f} ms | fwd+bwd "
          f"{rec['fwd_bwd_tflops']:6.1f} TF/s {rec['fwd_bwd_ms']:9.3f} ms  (rel err {err:.1e})", flush=True)
    return {"case": name, "seqlen": seqlen, "nheads": nheads, "d": d, "rel_err_vs_genoflash": err, **rec}


def varlen_case(name, lengths, nheads=8, d=128) -> dict:
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    q, k, v = _qkv(1, sum(lengths), nheads, d, d, packed=True)
    pairs = sum(n * n for n in lengths)
    rec = measure(lambda a, b, c: flash_attn_varlen_func(a, b, c, cu, cu, max(lengths), max(lengths)), [q, k, v],
                  pairs, nheads, d, d)
    print(f"{name:<28} fwd {rec['fwd_tflops']:6.1f} TF/s | fwd+bwd {rec['fwd_bwd_tflops']:6.1f} TF/s", flush=True)
    return {"case": name, "lengths": lengths, "nheads": nheads, "d": d, **rec}


def mixed_lengths(total: int, seed: int = 0) -> list[int]:
    """Lengths drawn log-uniformly from 1k to 32k that add up to exactly `total`."""
    gen = torch.Generator().manual_seed(seed)
    lengths = []
    while sum(lengths) < total:
        n = int(2 ** (10 + 5 * torch.rand(1, generator=gen).item()))
        lengths.append(min(n, total - sum(lengths)))
    return lengths


def _separate_rotary():
    """The unfused competitor: NeoX rotary as its own compiled kernel (forward and backward),
    writing rotated copies of q and k to HBM before attention reads them."""
    def rotate(x, cos, sin):
        half = cos.shape[-1]
        c, s = cos[None, :x.shape[1], None, :], sin[None, :x.shape[1], None, :]
        x1, x2 = x[..., :half].float(), x[..., half:2 * half].float()
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, x[..., 2 * half:].float()], -1).to(x.dtype)
    return torch.compile(rotate, dynamic=False)


def unfused_rope_case(name, seqlen, nheads, cos, sin) -> dict:
    rotate = _separate_rotary()
    pairs = visible_pairs(seqlen, seqlen, False, (-1, -1))
    call = lambda q, k, v: flash_attn_func(rotate(q, cos, sin), rotate(k, cos, sin), v)  # noqa: E731
    rec = measure(call, _qkv(1, seqlen, nheads, 128, 128), pairs, nheads, 128, 128)
    print(f"{name:<28} fwd {rec['fwd_tflops']:6.1f} TF/s {rec['fwd_ms']:9.3f} ms | fwd+bwd "
          f"{rec['fwd_bwd_tflops']:6.1f} TF/s {rec['fwd_bwd_ms']:9.3f} ms", flush=True)
    return {"case": name, "batch": 1, "seqlen": seqlen, "nheads": nheads, "d": 128, "dv": 128,
            "features": {"separate_rotary_kernel": "torch.compile", "rotary_dim": 128}, **rec}


class _SavedList(list):
    """The results so far, written to `path` (with the run's metadata) after every case, so that a
    run cut short (the device tool's 10-minute calls) keeps the cases it finished."""

    def __init__(self, path: Path | None, metadata: dict):
        super().__init__()
        self.path, self.metadata = path, metadata

    def append(self, record: dict) -> None:
        super().append(record)
        if self.path is not None:
            write_json(self.path, {"metadata": self.metadata, "results": list(self)})


def run(cases: list[str], results: list | None = None) -> list[dict]:
    results = [] if results is None else results
    if "window" in cases:
        for n in (16384, 65536, 262144):
            results.append(fixed_case(f"window+-2048 N={n}", 1, n, 8, window_size=(2048, 2048)))
            results.append(flex_window_case(f"flex window+-2048 N={n}", n, 8, 2048))
    if "varlen" in cases:
        results.append(varlen_case("varlen 4x16k", [16384] * 4))
        results.append(varlen_case("varlen mixed 1k-32k", mixed_lengths(65536)))
    if "dv" in cases:
        for d, dv in ((64, 192), (128, 192), (192, 128), (128, 128)):
            results.append(fixed_case(f"d={d} dv={dv}", 1, 16384, 8, d=d, dv=dv))
    if "alibi" in cases or "softcap" in cases:
        results.append(fixed_case("plain H16 N16k", 1, 16384, 16))
    if "alibi" in cases:
        slopes = torch.tensor([2 ** (-8 * (h + 1) / 16) for h in range(16)], device="cuda")
        results.append(fixed_case("alibi H16 N16k", 1, 16384, 16, alibi_slopes=slopes))
        results.append(fixed_case("alibi causal H16 N16k", 1, 16384, 16, alibi_slopes=slopes, causal=True))
        results.append(fixed_case("plain causal H16 N16k", 1, 16384, 16, causal=True))
    if "softcap" in cases:
        results.append(fixed_case("softcap30 H16 N16k", 1, 16384, 16, softcap=30.0))
    if "rope" in cases:
        from ..ops.rotary import rotary_tables
        for n, h in ((16384, 16), (65536, 8)):
            cos, sin = rotary_tables(n, 128, device="cuda")
            results.append(fixed_case(f"plain H{h} N{n}", 1, n, h))
            results.append(fixed_case(f"rope H{h} N{n}", 1, n, h, rotary_cos=cos, rotary_sin=sin))
            # Tables in 16 bits (flash-attn passes them in q's dtype) stream half the bytes.
            results.append(fixed_case(f"rope fp16-tables H{h} N{n}", 1, n, h, rotary_cos=cos.half(),
                                      rotary_sin=sin.half()))
            try:
                results.append(unfused_rope_case(f"rotary kernel+attn H{h} N{n}", n, h, cos, sin))
            except Exception as e:  # record why the competitor could not run rather than lose the others
                print(f"separate rotary kernel failed: {e}", flush=True)
                results.append({"case": f"rotary kernel+attn H{h} N{n}", "error": str(e)[:300]})
    if "gqa" in cases:
        for causal in (False, True):
            tag = " causal" if causal else ""
            for hk in (16, 4, 1):
                results.append(fixed_case(f"H16 Hk{hk}{tag} N16k", 1, 16384, 16, nheads_k=hk, causal=causal))
    if "dropout" in cases:
        results.append(fixed_case("plain H16 N16k", 1, 16384, 16))
        results.append(fixed_case("dropout0.1 H16 N16k", 1, 16384, 16, dropout_p=0.1))
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="genoflash bench features", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="window,varlen,dv,alibi,softcap,rope,dropout,gqa")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("genoflash bench features needs a CUDA GPU", flush=True)
        return 2
    metadata = run_metadata(CUDA, dtype="bf16", method="do_bench median (warmup 25 ms, rep 200 ms); useful FLOPs only")
    path = Path(f"{results_stem(args.out, metadata, 'features')}.json")
    run([c.strip() for c in args.cases.split(",")], _SavedList(path, metadata))
    print(f"wrote {path}", flush=True)
    return 0
