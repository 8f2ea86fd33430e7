"""Scoring DNA with a trained causal DNA LM: per-base log-likelihoods over regions or whole
chromosomes, and reference-vs-alternative log-likelihood ratios of variants.

Per base: the sequence is read in windows of `context` bases that advance by `stride` (chunked
prefill). Each window scores only its last `stride` targets, so every base t is predicted from at
least min(t, context - stride) bases before it, and each base is scored once. The first base of a
chromosome has no context and is not scored.

Variants (equal-length REF and ALT: SNVs and MNVs): one window per site, ending context // 2 bases
past the variant (or at the chromosome's end) and holding up to `context` bases. The ratio is
sum over t >= pos of log P_alt(x'_t | x'_<t) - log P_ref(x_t | x_<t): the bases before the variant
score the same under both alleles, in a causal model. Indels are reported and not scored (their
windows would differ in length).

With a KV cache (a causal LM of attention layers, `DNALM.supports_kv_cache`), the window's bases
before the variant run once per site, into the cache, and the reference and every alternative allele
continue from a copy of it: a site with k alleles costs prefix + (k + 1) x suffix tokens instead of
(k + 1) x window. Other models (Hyena, Mamba) run each allele's whole window; the reference window is
shared by every allele at one site.
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
    if getattr(config, "num_labels", None) is not None:
        raise ValueError(f"scoring needs a DNA language model; this one is a per-base classifier "
                         f"({config.num_labels} classes)")
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


@torch.no_grad()
def continuation_logliks(model: torch.nn.Module, prefixes: list[str], continuations: list[tuple[int, str]],
                         device: torch.device) -> list[np.ndarray]:
    """For each (i, c) of `continuations`, float64 ll with ll[j] = log P(c[j] | prefixes[i] + c[:j])
    (ll[0] is NaN where prefixes[i] is empty). Each prefix runs once, into a KV cache that each of
    its continuations copies; prefixes of one length with continuations of one length run as one
    batch. The model must support a KV cache (`DNALM.supports_kv_cache`)."""
    out: list[np.ndarray | None] = [None] * len(continuations)
    groups: dict[tuple[int, int], list[int]] = {}
    for j, (i, c) in enumerate(continuations):
        groups.setdefault((len(prefixes[i]), len(c)), []).append(j)
    autocast = dict(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    for (p_len, c_len), members in groups.items():
        sites = sorted({continuations[j][0] for j in members})
        row_of_site = {i: r for r, i in enumerate(sites)}
        rows = torch.tensor([row_of_site[continuations[j][0]] for j in members])
        cont = torch.stack([encode(continuations[j][1]) for j in members]).to(device).long()
        first = torch.full((len(members),), math.nan, dtype=torch.float64, device=device)
        with torch.autocast(**autocast):
            if p_len:
                caches = model.new_kv_cache(len(sites), p_len)
                prefix = torch.stack([encode(prefixes[i]) for i in sites]).to(device)
                last = torch.log_softmax(model(prefix, kv_cache=caches)["logits"][:, -1].float(), dim=-1)
                first = last[rows.to(device)].gather(-1, cont[:, :1])[:, 0].double()  # c[0] given the prefix
                caches = [c.select(rows, p_len + c_len) for c in caches]
            else:
                caches = model.new_kv_cache(len(members), c_len)
            logits = model(cont, kv_cache=caches)["logits"]
        logp = torch.log_softmax(logits.float(), dim=-1)[:, :-1]            # predictions for c[1:]
        rest = logp.gather(-1, cont[:, 1:, None])[..., 0].double()
        ll = torch.cat([first[:, None], rest], dim=1).cpu().numpy()
        for row, j in enumerate(members):
            out[j] = ll[row]
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
                   device: torch.device, progress=None, kv_cache: bool | None = None) -> Iterator[VariantScore]:
    """One VariantScore per variant, in input order. kv_cache: run each site's bases before the
    variant once, into a KV cache (default: when the model supports one); False runs every allele's
    whole window."""
    check_causal_lm(model)
    check_context(model, context)
    supported = bool(getattr(model, "supports_kv_cache", False))
    if kv_cache and not supported:
        raise ValueError("kv_cache=True needs a causal LM of attention layers (DNALM.supports_kv_cache)")
    cached = supported if kv_cache is None else kv_cache
    pending: list[tuple[Variant, tuple[str, int, int]]] = []

    def flush_cached():
        # one prefix per (window, variant position); the reference continuation shared by its alleles
        sites = sorted({(chrom, a, variant.pos, e) for variant, (chrom, a, e) in pending})
        index = {site: i for i, site in enumerate(sites)}
        prefixes = [fasta.fetch(chrom, a, pos) for chrom, a, pos, _ in sites]
        refs = [fasta.fetch(chrom, pos, e) for chrom, _, pos, e in sites]
        continuations = list(enumerate(refs))
        for variant, (chrom, a, e) in pending:
            i = index[(chrom, a, variant.pos, e)]
            continuations.append((i, variant.alt + refs[i][len(variant.ref):]))
        lls = continuation_logliks(model, prefixes, continuations, device)
        for (variant, (chrom, a, e)), alt_ll in zip(pending, lls[len(sites):]):
            ref_ll = lls[index[(chrom, a, variant.pos, e)]]
            yield VariantScore(variant, float(np.nansum(alt_ll - ref_ll)), "ok")
        if progress is not None:
            progress(len(pending))
        pending.clear()

    def flush():
        if cached:
            yield from flush_cached()
            return
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
