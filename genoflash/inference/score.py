"""Scoring DNA with a trained causal DNA LM: per-base log-likelihoods over regions or whole
chromosomes, and reference-vs-alternative log-likelihood ratios of variants.

Per base: the sequence is read in windows of `context` bases that advance by `stride` (chunked
prefill). Each window scores only its last `stride` targets, so every base t is predicted from at
least min(t, context - stride) bases before it, and each base is scored once. The first base of a
chromosome has no context and is not scored.

Variants (equal-length REF and ALT: SNVs and MNVs): one window per site, ending context // 2 bases
past the variant (or at the chromosome's end) and holding up to `context` bases. The ratio is
sum over t >= pos of log P_alt(x'_t | x'_<t) - log P_ref(x_t | x_<t): the bases before the variant
score the same under both alleles, in a causal model. The reference window is shared by every
allele at one site. Indels are reported and not scored (their windows would differ in length).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np
import torch

from ..data.fasta import FastaFile
from ..data.tokenizer import encode
from ..data.vcf import Variant


@dataclass(frozen=True)
class VariantScore:
    variant: Variant
    llr: float          # nats; NaN when not scored
    status: str         # "ok", or why it was not scored


def check_causal_lm(model: torch.nn.Module) -> None:
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "causal") or not hasattr(config, "vocab_size"):
        raise ValueError(f"scoring needs a genoflash DNALM, got {type(model).__name__}")
    if not config.causal:
        raise ValueError("scoring needs a causal DNA LM (per-base likelihoods); this model is a masked LM")


def check_context(model: torch.nn.Module, context: int, stride: int | None = None) -> None:
    if isinstance(context, bool) or not isinstance(context, int) or context < 2:
        raise ValueError(f"context must be an int >= 2, got {context!r}")
    if stride is not None and (isinstance(stride, bool) or not isinstance(stride, int) or not 1 <= stride < context):
        raise ValueError(f"stride must be an int in [1, context = {context}), got {stride!r}")
    l_max = getattr(model.config, "hyena_l_max", None)
    if "H" in getattr(model.config, "layer_pattern", "") and l_max is not None and context > l_max:
        raise ValueError(f"context ({context}) exceeds the model's Hyena filters ({l_max} positions)")


@torch.no_grad()
def window_logliks(model: torch.nn.Module, windows: list[str], device: torch.device) -> list[np.ndarray]:
    """For each window w, float64 ll with ll[i] = log P(w[i] | w[:i]) for i >= 1 and ll[0] = NaN.
    Windows of one length run as one batch."""
    out: list[np.ndarray | None] = [None] * len(windows)
    by_length: dict[int, list[int]] = {}
    for i, w in enumerate(windows):
        by_length.setdefault(len(w), []).append(i)
    for length, members in by_length.items():
        tokens = torch.stack([encode(windows[i]) for i in members]).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(tokens)["logits"]
        logp = torch.log_softmax(logits.float(), dim=-1)[:, :-1]          # predictions for tokens 1..
        ll = logp.gather(-1, tokens[:, 1:, None].long())[..., 0].double().cpu().numpy()
        for row, i in enumerate(members):
            out[i] = np.concatenate([[math.nan], ll[row]])
    return out


def base_windows(length: int, start: int, end: int, context: int, stride: int) -> Iterator[tuple[int, int, int]]:
    """(window start, first target, end) of the windows covering targets [max(start, 1), end) of a
    sequence of `length`: targets [t0, t1) are read in the window [max(0, t1 - context), t1)."""
    if not 0 <= start <= end <= length:
        raise ValueError(f"region {start}..{end} must lie in 0..{length}")
    t0 = max(start, 1)
    while t0 < end:
        t1 = min(t0 + stride, end)
        yield max(0, t1 - context), t0, t1
        t0 = t1


def score_bases(model, fasta: FastaFile, regions: Iterable[tuple[str, int, int]], context: int, stride: int,
                batch_size: int, device: torch.device, progress=None) -> Iterator[tuple[str, int, str, float]]:
    """(chrom, pos, base, log-likelihood in nats) for every scorable base of the regions, in order."""
    check_causal_lm(model)
    check_context(model, context, stride)
    for chrom, start, end in regions:
        plan = list(base_windows(fasta.contig_length(chrom), start, end, context, stride))
        for first in range(0, len(plan), batch_size):
            batch = plan[first:first + batch_size]
            sequences = [fasta.fetch(chrom, a, t1) for a, _, t1 in batch]
            for (a, t0, t1), seq, ll in zip(batch, sequences, window_logliks(model, sequences, device)):
                for t in range(t0, t1):
                    yield chrom, t, seq[t - a], float(ll[t - a])
            if progress is not None:
                progress(len(batch))


def variant_window(variant: Variant, length: int, context: int) -> tuple[int, int]:
    end = min(length, variant.end + context // 2)
    return max(0, end - context), end


def score_variants(model, fasta: FastaFile, variants: list[Variant], context: int, batch_size: int,
                   device: torch.device, progress=None) -> Iterator[VariantScore]:
    """One VariantScore per variant, in input order."""
    check_causal_lm(model)
    check_context(model, context)
    pending: list[tuple[Variant, tuple[str, int, int]]] = []

    def flush():
        sites = sorted({site for _, site in pending})
        references = {site: fasta.fetch(*site) for site in sites}
        alleles = []
        for variant, (chrom, a, e) in pending:
            ref_window = references[(chrom, a, e)]
            i = variant.pos - a
            alleles.append(ref_window[:i] + variant.alt + ref_window[i + len(variant.ref):])
        lls = window_logliks(model, [references[s] for s in sites] + alleles, device)
        ref_ll = dict(zip(sites, lls))
        for (variant, site), alt_ll in zip(pending, lls[len(sites):]):
            first = variant.pos - site[1]
            diff = alt_ll[first:] - ref_ll[site][first:]
            yield VariantScore(variant, float(np.nansum(diff)), "ok")
        if progress is not None:
            progress(len(pending))
        pending.clear()

    for variant in variants:
        if variant.chrom not in fasta:
            status = f"chromosome {variant.chrom!r} is not in the FASTA"
        elif len(variant.ref) != len(variant.alt):
            status = "indel: not scored"
        elif variant.end > fasta.contig_length(variant.chrom):
            status = f"past the end of {variant.chrom}"
        else:
            genome = fasta.fetch(variant.chrom, variant.pos, variant.end)
            status = "ok" if genome == variant.ref else f"REF mismatch: the genome has {genome}"
        if status != "ok":
            yield from flush() if pending else ()
            yield VariantScore(variant, math.nan, status)
            if progress is not None:
                progress(1)
            continue
        a, e = variant_window(variant, fasta.contig_length(variant.chrom), context)
        pending.append((variant, (variant.chrom, a, e)))
        if len(pending) >= batch_size:
            yield from flush()
    if pending:
        yield from flush()
