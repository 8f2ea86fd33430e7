"""`genoflash bench extrapolation`: a trained causal DNA LM's held-out loss against context length, with
plain RoPE, position interpolation and NTK-aware scaling.

Windows of C bases end at the same positions of the held-out records for every context C, and the
loss is the mean over each window's last --target bases: every C scores the same bases, with more or
less sequence before them. For C beyond the training length T the RoPE tables are
    plain  the trained tables, read past T;
    pi     positions divided by C / T (linear position interpolation);
    ntk    the base multiplied by (C / T)^(d / (d - 2)) (NTK-aware scaling; d the rotary dim),
and at C <= T all three are the trained tables. Bases other than A, C, G, T are not scored.

    genoflash bench extrapolation --model RUN_DIR --fasta genome.fa --records chrXV,chrXVI \\
        --contexts 4096,16384,65536,262144

Results: <out>/<gpu>-<date>-extrapolation[-<tag>].json and a plot of bits per base against context.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from ..data.fasta import FastaFile
from ..data.tokenizer import A_ID, T_ID, encode
from ..layers.attention import RotaryTables
from .common import RESULTS_DIR, pyplot, results_stem, run_metadata, save_figure, title_stamp, write_json

SETTINGS = ("plain", "pi", "ntk")


def set_rope(model: torch.nn.Module, setting: str, factor: float) -> None:
    """Every RoPE table of the model for `setting` at context factor x the training length."""
    for m in model.modules():
        if isinstance(m, RotaryTables):
            m.interpolation = factor if setting == "pi" else 1.0
            m.ntk_alpha = factor if setting == "ntk" else 1.0
            m._cache.clear()


def window_ends(lengths: dict[str, int], longest: int, per_record: int) -> list[tuple[str, int]]:
    """(record, end) of the scored windows: per_record ends spread evenly over [longest, length]
    of each record long enough for the longest context."""
    ends = []
    for name, n in lengths.items():
        if n < longest:
            continue
        k = per_record if n > longest else 1
        ends += [(name, longest + (n - longest) * (i + 1) // k) for i in range(k)]
    return ends


@torch.no_grad()
def bits_per_base(model, tokens: torch.Tensor, ends: list[tuple[str, int]], context: int, target: int,
                  device: torch.device) -> float:
    """Mean cross-entropy, in bits, of the last `target` bases of each window of `context` bases."""
    total, count = 0.0, 0
    for name, end in ends:
        window = tokens[name][end - context:end].to(device)[None]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(window)["logits"]
        pred = logits[0, -target - 1:-1].float()
        want = window[0, -target:]
        scored = (want >= A_ID) & (want <= T_ID)  # A, C, G, T (contiguous ids); N and the rest are not scored
        loss = torch.nn.functional.cross_entropy(pred[scored], want[scored], reduction="sum")
        total += loss.item()
        count += int(scored.sum())
    return total / max(count, 1) / math.log(2)


def plot(report: dict, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for setting in SETTINGS:
        xs = [r["context"] for r in report["rows"] if r["setting"] == setting]
        ax.plot(xs, [r["bits_per_base"] for r in report["rows"] if r["setting"] == setting], marker="o",
                label=setting)
    ax.axvline(report["train_len"], color="gray", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (bases); dashed: training length")
    ax.set_ylabel(f"held-out bits per base (last {report['target']} of each window)")
    ax.set_title(f"{report['tag']} | {title_stamp(report['metadata'])}", fontsize=8)
    ax.legend()
    save_figure(fig, path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="genoflash bench extrapolation", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a `genoflash train` run directory (its newest checkpoint)")
    parser.add_argument("--fasta", required=True)
    parser.add_argument("--records", default=None, help="comma-separated held-out records (default: all)")
    parser.add_argument("--contexts", default="4096,16384,65536,262144")
    parser.add_argument("--target", type=int, default=4096, help="bases scored at the end of each window")
    parser.add_argument("--per-record", type=int, default=8, help="windows per record")
    parser.add_argument("--tag", default=None, help="names the results file and the plot")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    import yaml

    from ..train import load_trained_model

    device = torch.device(args.device)
    contexts = sorted(int(c) for c in args.contexts.split(","))
    if contexts[0] <= args.target:  # the first scored base needs one base before it
        parser.error(f"every context must exceed --target ({args.target}), got {contexts[0]}")
    train_len = int(yaml.safe_load((Path(args.model) / "config.yaml").read_text())["seq_len"])
    model = load_trained_model(args.model).to(device).eval()
    fasta = FastaFile(args.fasta)  # its index goes to the user's cache, never beside a packaged genome
    names = args.records.split(",") if args.records else fasta.contigs
    missing = [n for n in names if n not in fasta]
    if missing:
        parser.error(f"--records: {', '.join(missing)} not in {args.fasta}")
    tokens = {n: encode(fasta.fetch(n, 0, fasta.contig_length(n)), name=n) for n in names}
    ends = window_ends({n: len(t) for n, t in tokens.items()}, contexts[-1], args.per_record)
    if not ends:
        parser.error(f"no record is as long as the longest context ({contexts[-1]})")
    tag = args.tag or Path(args.fasta).stem
    metadata = run_metadata(device, model=str(args.model), fasta=Path(args.fasta).name, records=names,
                            method="mean cross-entropy (bits) of the last `target` bases of each window, bf16 autocast")
    report = {"metadata": metadata, "tag": tag, "train_len": train_len, "target": args.target,
              "windows": len(ends), "scored_bases_per_context": len(ends) * args.target, "rows": []}
    path = Path(f"{results_stem(args.out, metadata, f'extrapolation-{tag}')}.json")
    for context in contexts:
        factor = max(1.0, context / train_len)
        for setting in SETTINGS:
            set_rope(model, setting, factor)
            bits = bits_per_base(model, tokens, ends, context, args.target, device)
            report["rows"].append({"context": context, "setting": setting, "factor": factor, "bits_per_base": bits})
            print(f"{tag} context {context:>7} {setting:5s} {bits:.4f} bits/base", flush=True)
            write_json(path, report)
    set_rope(model, "plain", 1.0)
    plot(report, path.with_suffix(".png"))
    print(f"wrote {path}", flush=True)
    return 0
