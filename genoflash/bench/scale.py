"""`genoflash scale ...`: genome-scale runs on one GPU.

    attention    million-token attention, checked on sampled rows (below)
    chromosome   an Enformer-style encoder over a chromosome-length sequence in one pass
    chloroplast  one training step of a single-nucleotide DNA LM on a whole real genome

`attention`: million-token attention on one GPU, checked on sampled rows.

A full reference does not fit at these lengths, so correctness is checked on `--rows`
randomly sampled query rows: their outputs, and the gradients of a loss that only those rows
feed (dq on those rows, dk and dv everywhere), against an exact float32 computation that
streams over the keys in chunks (`sampled_rows_attention`). Reports time and peak memory.

    genoflash scale attention --seqlen 1048576 --backward     # fwd+bwd at 1M, H=8, D=128
    genoflash scale attention --seqlen 4194304                # forward at 4M
    genoflash scale chromosome --length 248956422             # human chr1 length, ~1.95M bins
    genoflash scale chloroplast                               # 154,478-bp genome, one training step
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from .. import flash_attn_func
from .common import (RESULTS_DIR, measure_once, peak_memory_gib, relative_error, reset_peak_memory, results_stem,
                     run_metadata, timed_call, write_json)


def sampled_rows_attention(q_rows: torch.Tensor, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           seqlen_q: int, causal: bool, softmax_scale: float, chunk: int = 65536) -> torch.Tensor:
    """Exact attention for a few query rows (batch, R, nheads, dim) in q_rows' dtype precision
    (fp32 or fp64), streaming over keys in chunks so no (R, seqlen_k) matrix is larger than a chunk.
    Differentiable, so sampled-loss gradients come from autograd."""
    acc = q_rows.dtype
    shift = k.shape[1] - seqlen_q

    def chunk_scores(k0: int) -> torch.Tensor:
        s = torch.einsum("brhd,bkhd->bhrk", q_rows, k[:, k0:k0 + chunk].to(acc)) * softmax_scale
        if causal:
            j = torch.arange(k0, k0 + s.shape[-1], device=k.device)
            s = s.masked_fill(j[None, :] > rows[:, None] + shift, float("-inf"))
        return s

    starts = range(0, k.shape[1], chunk)
    # Pass 1: the row max (a constant for the gradient, so no graph is kept for it).
    with torch.no_grad():
        row_max = torch.stack([chunk_scores(k0).amax(-1) for k0 in starts]).amax(0)
    row_max = row_max.masked_fill(torch.isinf(row_max), 0.0)[..., None]
    # Pass 2: normaliser and un-normalised output, one key chunk at a time.
    total, out = 0.0, 0.0
    for k0 in starts:
        p = torch.exp(chunk_scores(k0) - row_max)
        total = total + p.sum(-1)
        out = out + torch.einsum("bhrk,bkhd->brhd", p, v[:, k0:k0 + chunk].to(acc))
    return out / total.clamp_min(1e-30).transpose(1, 2)[..., None]


def check_sampled(q, k, v, causal: bool, n_rows: int, backward: bool, seed: int = 0) -> dict:
    """Run genoflash once (timed, peak memory) and compare sampled rows with the fp32 reference."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rows = torch.randperm(q.shape[1], generator=gen)[:n_rows].sort().values.to(q.device)
    scale = q.shape[-1] ** -0.5
    dout_rows = torch.randn(q.shape[0], n_rows, *q.shape[2:], generator=gen).to(q.device, q.dtype)
    if backward:
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    reset_peak_memory(q.device)
    out, fwd_s = timed_call(lambda: flash_attn_func(q, k, v, causal=causal), q.device)
    rec = {"fwd_s": fwd_s}
    if backward:
        dout = torch.zeros_like(out)
        dout[:, rows] = dout_rows
        (dq, dk, dv), rec["bwd_s"] = timed_call(lambda: torch.autograd.grad(out, (q, k, v), dout), q.device)
    rec["peak_gib"] = peak_memory_gib(q.device)  # over the forward and the backward

    q32, k32, v32 = (t.detach().float().requires_grad_(backward) for t in (q, k, v))
    ref = sampled_rows_attention(q32[:, rows], rows, k32, v32, q.shape[1], causal, scale)
    errors = {"out": relative_error(out[:, rows], ref)}
    if backward:
        rq, rk, rv = torch.autograd.grad(ref, (q32, k32, v32), dout_rows.float())
        errors.update(dq=relative_error(dq[:, rows], rq[:, rows]), dk=relative_error(dk, rk),
                      dv=relative_error(dv, rv))
    rec["rel_errors_vs_fp32"] = errors
    return rec


def _write(record: dict, device: torch.device, out: Path, name: str) -> None:
    record["metadata"] = run_metadata(device)
    print(json.dumps({k: v for k, v in record.items() if k != "metadata"}), flush=True)
    path = Path(f"{results_stem(out, record['metadata'], 'scale-' + name)}.json")
    write_json(path, record)
    print(f"wrote {path}", flush=True)


def run_chromosome(length: int, dim: int, depth: int, nheads: int, chunk_bins: int, device: torch.device,
                   seed: int = 0) -> dict:
    """Enformer-style encoder (conv tower to 128-bp bins + full non-causal attention with RoPE) over a
    generated chromosome-length sequence in one forward pass. The sequence stays on the host as
    1 byte per base; the tower one-hots it chunk by chunk on the device."""
    from ..data import A_ID
    from ..models import Enformer, EnformerConfig

    bins = length // 128
    gen = torch.Generator().manual_seed(seed)
    # A, C, G, T token ids (consecutive in genoflash.data's vocabulary), one byte per base.
    tokens = torch.randint(A_ID, A_ID + 4, (1, bins * 128), generator=gen, dtype=torch.uint8)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = Enformer(EnformerConfig(dim=dim, depth=depth, nheads=nheads, heads={"tracks": 8})).to(device, dtype).eval()

    def fetch(start: int, end: int) -> torch.Tensor:
        return tokens[:, start:end].to(device)

    with torch.no_grad():
        out, seconds, peak = measure_once(lambda: model.encode_long(fetch, bins * 128, chunk_bins=chunk_bins), device)
    tracks = out["tracks"]
    return {"length_bp": length, "bins": bins, "dim": dim, "depth": depth, "nheads": nheads, "dtype": str(dtype),
            "seconds": seconds, "peak_gib": peak, "output_shape": list(tracks.shape),
            "output_finite": bool(torch.isfinite(tracks).all())}


def run_chloroplast(fasta: str, dim: int, depth: int, nheads: int, device: torch.device, max_length=None) -> dict:
    """Forward, backward and one AdamW step of a single-nucleotide causal DNA LM over a whole genome
    (by default the 154,478-bp Arabidopsis chloroplast shipped with genoflash) as one context."""
    from ..data import FastaFile, encode
    from ..data.examples import resolve_fasta
    from ..models import DNALM, DNALMConfig

    genome = FastaFile(resolve_fasta(fasta))
    chrom = next(iter(genome.contig_lengths))
    seq = genome.fetch(chrom, 0, genome.contig_lengths[chrom])[:max_length]
    tokens = encode(seq, name=chrom)[None].to(device)
    model = DNALM(DNALMConfig(dim=dim, depth=depth, nheads=nheads, causal=True)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast(
        "cpu", enabled=False)

    def step():
        with autocast:
            loss = model(tokens[:, :-1], labels=tokens[:, 1:])["loss"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    loss, seconds, peak = measure_once(step, device)
    return {"genome": chrom, "context_bp": tokens.shape[1] - 1, "dim": dim, "depth": depth, "nheads": nheads,
            "loss": loss, "seconds_fwd_bwd_step": seconds, "peak_gib": peak,
            "parameters": sum(p.numel() for p in model.parameters())}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="genoflash scale", description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["attention", "chromosome", "chloroplast"])
    parser.add_argument("--seqlen", type=int, default=1 << 20, help="attention: tokens")
    parser.add_argument("--nheads", type=int, default=8)
    parser.add_argument("--headdim", type=int, default=128, help="attention: head dim")
    parser.add_argument("--causal", action="store_true", help="attention: causal")
    parser.add_argument("--backward", action="store_true", help="attention: also run and check the backward")
    parser.add_argument("--rows", type=int, default=256, help="attention: sampled rows checked")
    parser.add_argument("--length", type=int, default=248_956_422, help="chromosome: bases (human chr1 default)")
    parser.add_argument("--dim", type=int, default=None, help="chromosome/chloroplast: model width")
    parser.add_argument("--depth", type=int, default=2, help="chromosome/chloroplast: transformer layers")
    parser.add_argument("--chunk-bins", type=int, default=16384, help="chromosome: conv tower chunk")
    parser.add_argument("--fasta", default="arabidopsis-chloroplast",
                        help="chloroplast: a FASTA file or the name of a genome shipped with genoflash")
    parser.add_argument("--cpu", action="store_true", help="run a CPU-sized version (for tests)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.cpu else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("genoflash scale needs a CUDA GPU (or --cpu for a small run)", flush=True)
        return 2
    if args.what == "chromosome":
        record = run_chromosome(args.length, args.dim or 768, args.depth, args.nheads, args.chunk_bins, device)
        _write(record, device, args.out, f"chromosome-{args.length}")
        return 0
    if args.what == "chloroplast":
        record = run_chloroplast(args.fasta, args.dim or 256, args.depth, args.nheads, device,
                                 max_length=2048 if args.cpu else None)
        _write(record, device, args.out, "chloroplast-dnalm")
        return 0
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, args.seqlen, args.nheads, args.headdim, device=device, dtype=torch.bfloat16)
               for _ in range(3))
    record = {"seqlen": args.seqlen, "nheads": args.nheads, "headdim": args.headdim, "causal": args.causal,
              "backward": args.backward, "rows_checked": args.rows,
              **check_sampled(q, k, v, args.causal, args.rows, args.backward)}
    _write(record, device, args.out, f"attention-N{args.seqlen}{'-causal' if args.causal else ''}"
                             f"{'-fwdbwd' if args.backward else '-fwd'}")
    return 0
