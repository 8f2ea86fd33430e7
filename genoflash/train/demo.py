"""`genoflash demo`: does attention need to see far? Full against local attention on the
synthetic long-range task.

Two small classifiers train with the same budget on the motif-grammar task, where the label
depends only on the pair of motifs ``distance`` bases apart: (a) global attention (G) and
(b) local attention whose window is shorter than the distance (L), so no layer can relate
the two motifs. The held-out accuracies are printed side by side; ``out_dir`` gets
``summary.json``, ``accuracy.png`` (held-out accuracy of both against step) and each run's
logs and checkpoint. CPU defaults are small; with CUDA the defaults grow to genomic lengths.

Status (2026-11-29): not yet a demonstration. With the CPU defaults (2 min 19 s on 2 cores)
both models stay at chance (0.54 / 0.54): neither learns the pairwise rule from a uniform
start in that budget. A later probe says range is not the bottleneck: full attention at
seq_len 256 with the motifs only 24 bases apart, 400 steps of 16, lr 3e-3, stays at loss
0.69 with constant predictions, and max pooling instead of the mean did not help either.
The classifier does not learn the pair rule (an XOR of the two motifs' families) at all.
Leads: an attention/CLS pool, a head with a hidden layer, checking first that a model given
the two motif positions learns the rule. It is therefore not yet wired into the CLI.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import pathlib
import time

from .trainer import TrainConfig, resolve_device, train

# Sizes per device: (seq_len, distance, window, steps, batch_size, dim).
CPU_DEFAULTS = dict(seq_len=512, distance=256, window_size=64, steps=150, batch_size=16, dim=64)
GPU_DEFAULTS = dict(seq_len=32768, distance=16384, window_size=1024, steps=600, batch_size=8, dim=128)
QUICK = dict(seq_len=192, distance=24, window_size=8, steps=6, batch_size=4, dim=16, eval_samples=16)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="genoflash demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", default="genoflash-demo")
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda")
    parser.add_argument("--quick", action="store_true", help="a few steps at toy size (smoke test)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    for name in ("seq_len", "distance", "window_size", "steps", "batch_size", "dim"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, help="override the device default")
    return parser


def configs(args: argparse.Namespace) -> dict[str, TrainConfig]:
    """The two runs' configs: identical but for the layer pattern."""
    device = resolve_device(args.device)
    sizes = dict(QUICK if args.quick else GPU_DEFAULTS if device.type == "cuda" else CPU_DEFAULTS)
    sizes.update({k: v for k, v in vars(args).items() if k in sizes and v is not None})
    if sizes["window_size"] >= sizes["distance"]:
        raise ValueError("the local model's window must be shorter than the motif distance")
    base = TrainConfig(task="synthetic", depth=2, nheads=4 if sizes["dim"] >= 32 else 2, seed=args.seed,
                       device=str(device), progress=args.progress,
                       eval_every=max(1, sizes["steps"] // 6), checkpoint_every=sizes["steps"], **sizes)
    out = pathlib.Path(args.out_dir)
    return {"full attention": dataclasses.replace(base, layer_pattern="G", out_dir=str(out / "full")),
            "local attention": dataclasses.replace(base, layer_pattern="L", out_dir=str(out / "local"))}


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
    """Train both models, print their accuracies, write summary.json and accuracy.png."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    runs = configs(args)
    out_dir = pathlib.Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    first = next(iter(runs.values()))
    print(f"long-range task: {first.seq_len} bp, motifs {first.distance} bp apart; local window "
          f"{first.window_size}; {first.steps} steps of {first.batch_size} on {first.device}")
    summary, curves = {}, {}
    for name, cfg in runs.items():
        start = time.perf_counter()
        result = train(cfg)
        curves[name] = [(h["step"], h["eval"]["accuracy"]) for h in result["history"] if "eval" in h]
        summary[name] = {**result["final"], "seconds": time.perf_counter() - start,
                         "layer_pattern": cfg.layer_pattern, "window_size": cfg.window_size}
    summary["config"] = {k: v for k, v in dataclasses.asdict(first).items() if k not in ("out_dir", "layer_pattern")}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_accuracy(curves, out_dir / "accuracy.png", f"motifs {first.distance} bp apart")
    print(f"{'model':<18}{'accuracy':>10}{'AUROC':>8}{'seconds':>9}")
    for name in runs:
        s = summary[name]
        print(f"{name:<18}{s['accuracy']:>10.3f}{s['auroc']:>8.3f}{s['seconds']:>9.1f}")
    print(f"wrote {out_dir / 'summary.json'} and {out_dir / 'accuracy.png'}")
    return 0
