"""`genoflash demo`: does attention need to see far? Full against local attention on the
synthetic long-range task.

Two small classifiers train with the same budget on the motif-grammar task
(`SyntheticLongRangeDataset`): an enhancer element and, ``distance`` bases downstream, a
promoter element, each a cluster of binding sites of one motif family; the label says whether
the two families are compatible, and neither element alone says anything about it. Model (a)
has global attention (G); model (b) local attention (L) whose reach, over all its layers and
the convolution stem, is shorter than the gap between the elements, so no position of it can
relate the two. The held-out accuracies are printed side by side; ``out_dir`` gets
``summary.json``, ``accuracy.png`` (held-out accuracy of both against step) and each run's
logs and checkpoint. CPU defaults are small; with CUDA the defaults grow to 32 kb.

Why clusters of sites and not single motifs: see the synthetic module's docstring. A model
from a random start, at 16 sequences per step, found the two-element rule only when the
elements were about 30% of the sequence. At 224 bp that is 4 sites. At 32 kb (the GPU
default) elements of 19% learned with 128 sequences per step (16 x 8 gradient accumulation).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import pathlib
import time

from ..data.synthetic import element_length
from .classifier import STEM_KERNEL
from .config import TrainConfig
from .trainer import resolve_device, train

# Sizes per device. Elements are `sites` x 16-base motifs; local reach (see `local_reach`) must
# stay below the gap between the elements, distance - sites * (16 + spacer).
# grad_accum: micro-batches of batch_size per optimizer step (the effective batch is the product).
CPU_DEFAULTS = dict(seq_len=224, distance=112, sites=4, spacer=0, margin=16, window_size=8, steps=300,
                    batch_size=16, grad_accum=1, dim=128)
# At 32 kb, 64 sites (1,280-bp elements) with 600 steps of 8 stayed at chance on an H200.
# Elements at ~19% of the sequence (384 sites, 6,144 bp) and 16 x 8 sequences per step learned:
# full attention reached held-out accuracy 1.0 by step 60 of 100 on the H200
# (tools/gpu_demo_ladder.sh), at ~1.3M tokens/s and 8.6 GiB (docs/performance.md).
GPU_DEFAULTS = dict(seq_len=32768, distance=16384, sites=384, spacer=0, margin=512, window_size=1024, steps=100,
                    batch_size=16, grad_accum=8, dim=128)
QUICK = dict(seq_len=192, distance=96, sites=2, spacer=0, margin=16, window_size=4, steps=6, batch_size=4,
             grad_accum=1, dim=16, eval_samples=16)


# The models the demo can compare, by the layer letter every layer of the trunk gets
# (genoflash.models.dna_lm): name and output folder. The classifier's trunk is bidirectional,
# so M is BiMamba and H a bidirectional Hyena.
MODELS = {"G": ("full attention", "full"), "L": ("local attention", "local"), "H": ("Hyena", "hyena"),
          "M": ("Mamba (BiMamba)", "mamba")}


def local_reach(depth: int, window_size: int, stem_kernel: int = STEM_KERNEL) -> int:
    """How far (in bases) the local model's output at one position can see on each side:
    the stem's half-width, plus one window per local layer."""
    return stem_kernel // 2 + depth * window_size


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="genoflash demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", default="genoflash-demo")
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda")
    parser.add_argument("--quick", action="store_true", help="a few steps at toy size (smoke test)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    for name in ("seq_len", "distance", "sites", "spacer", "margin", "window_size", "steps", "batch_size", "dim"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, help="override the device default")
    parser.add_argument("--grad-accum", type=int, help="micro-batches of --batch-size per optimizer step "
                        "(effective batch = batch size x grad accum); overrides the device default")
    parser.add_argument("--lr", type=float, default=3e-3, help="learning rate, constant after warm-up "
                        "(default 3e-3)")
    parser.add_argument("--mixers", default="G,L", help="models to train, comma-separated layer letters: "
                        "G full attention, L local attention, H Hyena, M Mamba (default: G,L)")
    return parser


def parse_mixers(text: str) -> list[str]:
    letters = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in letters if m not in MODELS]
    if unknown or not letters or len(set(letters)) != len(letters):
        names = ", ".join(f"{letter} {name}" for letter, (name, _) in MODELS.items())
        raise ValueError(f"--mixers takes distinct letters among {names}; got {text!r}")
    return letters


def configs(args: argparse.Namespace) -> dict[str, TrainConfig]:
    """The runs' configs, one per --mixers letter: identical but for the layer pattern."""
    mixers = parse_mixers(args.mixers)
    device = resolve_device(args.device)
    sizes = dict(QUICK if args.quick else GPU_DEFAULTS if device.type == "cuda" else CPU_DEFAULTS)
    sizes.update({k: v for k, v in vars(args).items() if k in sizes and v is not None})
    # A constant learning rate after warm-up (min_lr = lr): the rule is found after a plateau
    # whose length varies with the seed (150-250 steps at CPU size), and a decaying rate
    # stretched the slowest seeds' plateau past the budget.
    base = TrainConfig(task="synthetic", depth=2, nheads=4 if sizes["dim"] >= 32 else 2, seed=args.seed,
                       lr=args.lr, min_lr=args.lr,
                       device=str(device), progress=args.progress, log_every=max(1, sizes["steps"] // 50),
                       eval_every=max(1, sizes["steps"] // 5), checkpoint_every=sizes["steps"], **sizes)
    # Both elements must be separable by more than the local model can span: a position whose
    # view reached into both could compute the label, and the comparison would be meaningless.
    gap = base.distance - element_length(base.sites, base.motif_length, base.spacer)
    reach = local_reach(base.depth, base.window_size)
    if "L" in mixers and 2 * reach >= gap:
        raise ValueError(f"the local model could see both elements: its reach of {reach} bases each side "
                         f"(stem {STEM_KERNEL // 2} + {base.depth} layers x window {base.window_size}) spans "
                         f"2 x {reach} >= the {gap}-base gap between them; use a smaller --window-size or a "
                         "larger --distance")
    out = pathlib.Path(args.out_dir)
    return {MODELS[m][0]: dataclasses.replace(base, layer_pattern=m, out_dir=str(out / MODELS[m][1]))
            for m in mixers}


def plot_accuracy(curves: dict[str, list[tuple[int, float]]], path: pathlib.Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, points in curves.items():
        ax.plot(*zip(*points), "o-", label=name)
    ax.axhline(0.5, color="grey", linestyle=":", label="chance")
    ax.set(xlabel="step", ylabel="held-out accuracy", title=title, ylim=(0.3, 1.02))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Train the models, print their accuracies, write summary.json and accuracy.png."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    runs = configs(args)
    out_dir = pathlib.Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    first = next(iter(runs.values()))
    element = element_length(first.sites, first.motif_length, first.spacer)
    local = (f"local model's window {first.window_size} (reach {local_reach(first.depth, first.window_size)} bp "
             "each side); ") if "local attention" in runs else ""
    print(f"long-range task: {first.seq_len} bp; enhancer and promoter elements ({first.sites} sites, "
          f"{element} bp each) {first.distance} bp apart; {local}"
          f"{first.steps} steps of {first.batch_size}"
          f"{f' x {first.grad_accum} micro-batches' if first.grad_accum > 1 else ''} on {first.device}")
    summary, curves = {}, {}
    for name, cfg in runs.items():
        start = time.perf_counter()
        result = train(cfg)
        curves[name] = [(h["step"], h["eval"]["accuracy"]) for h in result["history"] if "eval" in h]
        summary[name] = {**result["final"], "seconds": time.perf_counter() - start,
                         "layer_pattern": cfg.layer_pattern, "window_size": cfg.window_size}
    summary["config"] = {k: v for k, v in dataclasses.asdict(first).items() if k not in ("out_dir", "layer_pattern")}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_accuracy(curves, out_dir / "accuracy.png", f"elements {first.distance} bp apart")
    print(f"{'model':<18}{'accuracy':>10}{'AUROC':>8}{'seconds':>9}")
    for name in runs:
        s = summary[name]
        print(f"{name:<18}{s['accuracy']:>10.3f}{s['auroc']:>8.3f}{s['seconds']:>9.1f}")
    print(f"wrote {out_dir / 'summary.json'} and {out_dir / 'accuracy.png'}")
    return 0
