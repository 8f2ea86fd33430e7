"""A DNA LM's training step, eager against `torch.compile(fullgraph=True)`: tokens/s and peak memory.

Cited by docs/design/custom-ops.md. What it answers: with the genoflash kernels as custom ops, does
compiling the whole model (inductor fusing the norms, SwiGLU, residuals and the loss around the
kernels) pay, at what compile time, and is the compiled loss the eager one? One process, the
same model and batch for both, bf16 autocast over float32 weights (the usual training set-up),
AdamW steps included. Medians of `--steps` timed steps after `--warmup` untimed ones.

    python benchmarks/experiments/compile/dna_lm_step.py --seq-len 32768 --pattern G --out result.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import time

import torch
import triton

from genoflash.models import DNALM, DNALMConfig


def _step(model, optimizer, tokens):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(tokens, labels=tokens)["loss"]
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def measure(compiled: bool, args) -> dict:
    torch.manual_seed(0)
    config = DNALMConfig(dim=args.dim, depth=args.depth, nheads=args.nheads, layer_pattern=args.pattern,
                         hyena_l_max=args.seq_len, window_size=args.window)
    model = DNALM(config).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    run = torch.compile(model, fullgraph=True) if compiled else model
    tokens = torch.randint(0, 9, (args.batch, args.seq_len), device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    losses = [_step(run, optimizer, tokens).item()]  # the first step compiles
    first = time.perf_counter() - start
    for _ in range(args.warmup):
        losses.append(_step(run, optimizer, tokens).item())
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        losses.append(_step(run, optimizer, tokens).item())  # .item() waits for the step
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    return {"compiled": compiled, "first_step_s": first, "median_step_s": median,
            "tokens_per_s": args.batch * args.seq_len / median, "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
            "losses": losses, "parameters": sum(p.numel() for p in model.parameters())}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=32768)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--nheads", type=int, default=8)
    parser.add_argument("--pattern", default="G")
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--commit", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                           text=True).stdout.strip()
    record = {"what": "DNA LM training step (AdamW, bf16 autocast), eager vs torch.compile(fullgraph=True)",
              "device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(), "commit": commit,
              "torch": torch.__version__, "triton": triton.__version__, "config": vars(args),
              "runs": [measure(False, args), measure(True, args)]}
    eager, compiled = record["runs"]
    record["speedup"] = compiled["tokens_per_s"] / eager["tokens_per_s"]
    # The same model from the same seed and batch: the first losses must agree to bf16 rounding.
    record["first_loss_difference"] = abs(eager["losses"][0] - compiled["losses"][0])
    text = json.dumps(record, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
