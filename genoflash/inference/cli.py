"""`genoflash score`: per-base log-likelihoods or variant log-likelihood ratios from a trained DNA LM.

    genoflash score --model runs/lm --fasta genome.fa --out scores.bedgraph            # every base
    genoflash score --model runs/lm --fasta genome.fa --regions peaks.bed --out s.tsv   # some regions
    genoflash score --model runs/lm --fasta genome.fa --variants calls.vcf.gz --out llr.tsv

The output is written to OUT.partial and renamed to OUT when complete: an error or an interrupt
removes OUT.partial, and even a SIGKILL leaves no half-written OUT (run it again). Bad variant
records are skipped, counted and reported.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from pathlib import Path

import torch

from ..data import FastaFile, example_fasta, read_bed
from ..data.examples import EXAMPLES
from ..data.vcf import read_variants
from .score import check_causal_lm, check_context, score_bases, score_variants

log = logging.getLogger("genoflash.score")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="genoflash score", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", required=True,
                        help="a `genoflash train` run directory, or a save_pretrained directory")
    parser.add_argument("--fasta", required=True, help=f"a FASTA path, or a bundled genome ({', '.join(EXAMPLES)})")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--regions", help="a BED of regions to score base by base (default: every chromosome)")
    what.add_argument("--variants", help="a VCF (plain or gzip), or a BED whose name column is REF>ALT")
    parser.add_argument("--context", type=int, default=2048, help="bases the model reads at once")
    parser.add_argument("--stride", type=int, default=None,
                        help="per base: targets per window, so each base has >= context - stride bases before it "
                             "(default: context // 2)")
    parser.add_argument("--batch-size", type=int, default=8, help="windows per forward pass")
    parser.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda, cuda:1, ...")
    parser.add_argument("--out", required=True, help="the output file: .tsv, or .bedgraph / .bg")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return parser


def load_model(path: str | os.PathLike, device: torch.device) -> torch.nn.Module:
    path = Path(path)
    if (path / "config.yaml").is_file():  # a training run: its newest checkpoint that loads
        from ..train import load_trained_model
        return load_trained_model(path).to(device).eval()
    if (path / "config.json").is_file():
        from ..models import load_pretrained
        return load_pretrained(path, device=device)
    raise FileNotFoundError(f"--model {path}: neither a training run (config.yaml) nor a saved model (config.json)")


def _progress(total: int, quiet: bool):
    """(advance callable, context manager) of a rich progress bar, or no-ops when quiet."""
    if quiet:
        import contextlib
        return (lambda n: None), contextlib.nullcontext()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    bar = Progress(TextColumn("scoring"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                   transient=True)
    task = bar.add_task("score", total=total)
    return (lambda n: bar.advance(task, n)), bar


def run(args: argparse.Namespace) -> dict:
    out = Path(args.out)
    bedgraph = out.suffix.lower() in (".bedgraph", ".bg")
    if not bedgraph and out.suffix.lower() != ".tsv":
        raise ValueError(f"--out {out}: the format is told by the suffix, .tsv or .bedgraph (.bg)")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    stride = args.stride if args.stride is not None else max(1, args.context // 2)
    fasta_path = example_fasta(args.fasta) if args.fasta in EXAMPLES else Path(args.fasta)
    if not Path(fasta_path).is_file():
        raise FileNotFoundError(f"--fasta {args.fasta}: no such file or bundled genome")
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    fasta = FastaFile(fasta_path)
    model = load_model(args.model, device)
    check_causal_lm(model)  # every setting is checked before a file is opened
    check_context(model, args.context, None if args.variants else stride)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    try:
        summary = _write(args, model, fasta, fasta_path, device, stride, partial, bedgraph)
    except BaseException:  # an error or an interrupt: no half-written file stays (a SIGKILL leaves OUT.partial)
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, out)  # whole or absent
    return {"out": str(out), **summary}


def _write(args, model, fasta, fasta_path, device, stride: int, partial: Path, bedgraph: bool) -> dict:
    summary: dict = {}
    if args.variants:
        variants, skipped = read_variants(args.variants)
        for s in skipped[:10]:
            log.warning("skipped %s: %s", s.where, s.reason)
        if len(skipped) > 10:
            log.warning("... and %d more records skipped", len(skipped) - 10)
        advance, bar = _progress(len(variants), args.quiet)
        counts: dict[str, int] = {}
        with bar, open(partial, "w") as fh:
            fh.write("" if bedgraph else "chrom\tpos\tid\tref\talt\tllr\tstatus\n")
            for s in score_variants(model, fasta, variants, args.context, args.batch_size, device, advance):
                v = s.variant
                key = "ok" if s.status == "ok" else s.status.split(":")[0]
                counts[key] = counts.get(key, 0) + 1
                if bedgraph:
                    if s.status == "ok":
                        fh.write(f"{v.chrom}\t{v.pos}\t{v.end}\t{s.llr:.6g}\n")
                else:
                    llr = "NA" if math.isnan(s.llr) else f"{s.llr:.6g}"
                    fh.write(f"{v.chrom}\t{v.pos + 1}\t{v.id}\t{v.ref}\t{v.alt}\t{llr}\t{s.status}\n")
        summary.update(variants=len(variants), skipped_records=len(skipped), status=counts)
    else:
        if args.regions:
            regions = [(r.chrom, r.start, r.end) for r in read_bed(args.regions, bed_columns=3)]
        else:
            regions = [(c, 0, fasta.contig_length(c)) for c in fasta.contigs]
        for chrom, start, end in regions:
            if chrom not in fasta:
                raise ValueError(f"--regions: chromosome {chrom!r} is not in {fasta_path}")
            if end > fasta.contig_length(chrom):
                raise ValueError(f"--regions: {chrom}:{start}-{end} runs past the chromosome's end "
                                 f"({fasta.contig_length(chrom)})")
        windows = sum(-(-max(0, end - max(start, 1)) // stride) for _, start, end in regions)
        advance, bar = _progress(windows, args.quiet)
        bases, total = 0, 0.0
        with bar, open(partial, "w") as fh:
            fh.write("" if bedgraph else "chrom\tstart\tend\tbase\tloglik\n")
            for chrom, pos, base, ll in score_bases(model, fasta, regions, args.context, stride, args.batch_size,
                                                    device, advance):
                fh.write(f"{chrom}\t{pos}\t{pos + 1}\t{ll:.6g}\n" if bedgraph else
                         f"{chrom}\t{pos}\t{pos + 1}\t{base}\t{ll:.6g}\n")
                bases, total = bases + 1, total + ll
        summary.update(bases=bases, mean_loglik=total / bases if bases else math.nan,
                       perplexity=math.exp(-total / bases) if bases else math.nan)
    return summary


def main(argv: list[str] | None = None) -> int:
    """Exit status 0 done, 2 a bad input (one line naming it; --debug shows the traceback)."""
    import json
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        summary = run(args)
    except (FileNotFoundError, ValueError, ImportError, KeyError) as err:
        if args.debug:
            raise
        print(f"{parser.prog}: error: {err} (--debug shows the traceback)", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2))
    return 0
