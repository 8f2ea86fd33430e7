"""The `genoflash` command line.

    genoflash demo               full vs local attention (or Hyena, Mamba) on a long-range DNA task: who sees far?
    genoflash example            attention over a DNA-length sequence: genoflash vs standard attention
    genoflash train              train a DNA model (synthetic long-range task or LM on a FASTA), flags or --config YAML
    genoflash score              per-base log-likelihoods or variant log-likelihood ratios from a trained DNA LM
    genoflash bench attention    genoflash vs the peer kernels, TF/s and peak memory (GPU)
    genoflash bench decode       one decoding step against a long KV cache, beside SDPA and the HBM floor (GPU)
    genoflash bench generate     transformers generate(): per-token time with genoflash against sdpa (GPU)
    genoflash bench train-step   transformers Llama training step: step time with genoflash against sdpa (GPU)
    genoflash bench extrapolation  a trained DNA LM's held-out loss against context, with plain RoPE, PI and NTK
    genoflash bench genome       attention, local+global, Hyena, Mamba as DNA LMs on a genome: bits/base vs context
    genoflash bench features     what windows, varlen, ALiBi, softcap, Dv != D, RoPE and dropout cost (GPU)
    genoflash bench memory       peak memory against N for genoflash, standard attention and SDPA (GPU)
    genoflash bench mixers       attention vs Hyena vs Mamba, one layer's time and memory against N (GPU)
    genoflash bench quality      attention vs Hyena vs Mamba, held-out accuracy against distance (from demo runs)
    genoflash bench ring         context-parallel ring attention over the GPUs of one host (torchrun, GPUs)
    genoflash scale attention    million-token attention, checked on sampled rows (GPU)
    genoflash scale chromosome   an Enformer-style encoder over a whole chromosome in one pass (GPU)
    genoflash scale chloroplast  one training step of a DNA LM on a whole real genome (GPU)
"""

from __future__ import annotations

import argparse
import sys


def _example(argv):
    from .bench.dna_attention import main
    return main(argv)


def _bench(argv):
    parser = argparse.ArgumentParser(prog="genoflash bench")
    parser.add_argument("what", choices=["attention", "decode", "extrapolation", "features", "generate", "genome",
                                         "memory", "mixers", "quality", "ring", "train-step"])
    args, rest = parser.parse_known_args(argv)
    if args.what == "attention":
        from .bench.attention import main
    elif args.what == "decode":
        from .bench.decode import main
    elif args.what == "extrapolation":
        from .bench.extrapolation import main
    elif args.what == "features":
        from .bench.features import main
    elif args.what == "generate":
        from .bench.generate import main
    elif args.what == "genome":
        from .bench.genome import main
    elif args.what == "mixers":
        from .bench.mixers import main
    elif args.what == "quality":
        from .bench.quality import main
    elif args.what == "ring":
        from .bench.ring import main
    elif args.what == "train-step":
        from .bench.train_step import main
    else:
        from .bench.memory import main
    return main(rest)


def _scale(argv):
    from .bench.scale import main
    return main(argv)


def _demo(argv):
    from .train.demo import main
    return main(argv)


def _train(argv):
    from .train.trainer import main
    return main(argv)


def _score(argv):
    from .inference.cli import main
    return main(argv)


COMMANDS = {"demo": _demo, "example": _example, "bench": _bench, "scale": _scale, "train": _train, "score": _score}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__)
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    return int(COMMANDS[argv[0]](argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
