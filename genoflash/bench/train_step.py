"""`genoflash bench train-step`: one training step of a transformers Llama-style model, genoflash against sdpa.

The model is the one `genoflash bench generate` decodes with, built from a local config (random
weights, bf16): hidden 2048, 16 query heads and 4 KV heads of 128 (GQA 4:1), 8 layers, vocabulary
4096. A step is the forward with the language-model loss, the backward, and an AdamW step, on a
batch of random token ids (the same batch for every implementation at a step).

Every implementation trains its own copy of the same initial weights, with its own optimizer. After
one untimed step each (Triton's compilation and cuDNN's execution plans stay out), ROUNDS rounds go
round the implementations in turn, STEPS timed steps each, so that a slow spell of the host or the
GPU falls on all of them; the step time reported is the median of the timed steps (CUDA events
around each step). The first step's loss is computed from equal weights and data, so it compares
the implementations' attention: it should agree to bf16 rounding (`loss_vs_reference` is each first
loss's difference from the first implementation's, beside that loss's bf16 spacing). The later
losses follow each copy's own rounding and are recorded, not compared.

Results: <out>/<gpu>-<date>-train-step.json and a plot of step time against tokens per step.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
from pathlib import Path

import torch

from .common import RESULTS_DIR, error_text, pyplot, results_stem, run_metadata, save_figure, title_stamp, write_json
from .generate import LLAMA, use_implementation

# "sdpa-no-cudnn": transformers' sdpa with SDPA's cuDNN backend switched off (torch then takes its
# flash backend), a second baseline, as in `bench generate`.
IMPLEMENTATIONS = ("genoflash", "sdpa", "sdpa-no-cudnn")
ROUNDS = 3  # rounds of timed steps, the implementations in turn
STEPS = 4  # timed steps per implementation and round


def build_model(device: torch.device, dtype: torch.dtype = torch.bfloat16, max_tokens: int = 131072, **sizes):
    """`bench generate`'s Llama-style model (LLAMA, or `sizes` instead), with genoflash registered in
    transformers, in training mode."""
    import transformers

    import genoflash.integrations.transformers  # noqa: F401  (registers "genoflash")

    config = transformers.LlamaConfig(**{**LLAMA, **sizes}, max_position_embeddings=max_tokens)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=dtype)
    return model.to(device).train()


def batch_for(step: int, tokens: int, batch: int, vocab: int, device: torch.device) -> torch.Tensor:
    """The token ids of `step` (the same for every implementation)."""
    gen = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, vocab, (batch, tokens), generator=gen).to(device)


def train_step(model, optimizer, ids: torch.Tensor) -> torch.Tensor:
    """One step: the LM loss of ids (labels = inputs, shifted inside the model), its backward, AdamW.
    Returns the loss, detached (still on the device: reading it would wait for the step)."""
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def bf16_spacing(x: float) -> float:
    """The gap between adjacent bf16 values at x (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x else 0.0


def run_point(base, tokens: int, batch: int, implementations, rounds: int = ROUNDS, steps: int = STEPS,
              lr: float = 1e-4) -> dict:
    """Step times and losses of each implementation at `tokens` per sequence, every implementation
    on its own copy of `base` (the same weights) with its own AdamW."""
    device = next(base.parameters()).device
    vocab = base.config.vocab_size
    rec = {"tokens": tokens, "batch": batch, "implementations": {}}
    runs = {}
    for impl in implementations:
        model = copy.deepcopy(base)
        use_implementation(model, impl)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, foreach=True)
        try:  # the untimed first step: the same weights and data for all, so its loss is compared
            first = float(train_step(model, optimizer, batch_for(0, tokens, batch, vocab, device)))
            runs[impl] = (model, optimizer)
            rec["implementations"][impl] = {"first_loss": first, "losses": [first], "step_ms": []}
        except Exception as e:  # e.g. out of memory: record it, go on with the others
            rec["implementations"][impl] = {"error": error_text(e)}
            del model, optimizer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    step = 1
    for _ in range(rounds):
        for impl, (model, optimizer) in list(runs.items()):
            use_implementation(model, impl)
            out = rec["implementations"][impl]
            try:
                for i in range(steps):
                    ids = batch_for(step + i, tokens, batch, vocab, device)
                    if device.type == "cuda":
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        start.record()
                        loss = train_step(model, optimizer, ids)
                        end.record()
                        end.synchronize()
                        out["step_ms"].append(start.elapsed_time(end))
                    else:
                        loss = train_step(model, optimizer, ids)
                    out["losses"].append(float(loss))
            except Exception as e:  # a failed step ends this implementation's run; the others go on
                out["error"] = error_text(e)
                del runs[impl]
        step += steps
    reference = next((r for r in rec["implementations"].values() if "first_loss" in r), None)
    for out in rec["implementations"].values():
        if "step_ms" in out and out["step_ms"]:
            out["median_step_ms"] = statistics.median(out["step_ms"])
            out["tokens_per_s"] = batch * tokens / out["median_step_ms"] * 1e3
        if "first_loss" in out and reference is not None:
            out["loss_vs_reference"] = out["first_loss"] - reference["first_loss"]
            out["bf16_spacing_of_loss"] = bf16_spacing(reference["first_loss"])
    ours, sdpa = rec["implementations"].get("genoflash", {}), rec["implementations"].get("sdpa", {})
    if "median_step_ms" in ours and "median_step_ms" in sdpa:
        rec["genoflash_speedup_vs_sdpa"] = sdpa["median_step_ms"] / ours["median_step_ms"]
    del runs
    return rec


def plot(report: dict, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for impl in report["implementations"]:
        points = [(p["tokens"], p["implementations"][impl]["median_step_ms"]) for p in report["points"]
                  if "median_step_ms" in p["implementations"].get(impl, {})]
        if points:
            ax.plot(*zip(*points), marker="o", label=impl)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"tokens per sequence (batch {report['batch']})")
    ax.set_ylabel("ms per training step (median)")
    ax.legend()
    fig.suptitle(f"training step, Llama-style 8 x (16 x 128, GQA 4:1), bf16, AdamW | "
                 f"{title_stamp(report['metadata'])}", fontsize=9)
    save_figure(fig, path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="genoflash bench train-step", description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="4096,16384,32768", help="tokens per sequence, comma-separated")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--steps", type=int, default=STEPS, help="timed steps per implementation and round")
    parser.add_argument("--implementations", default=",".join(IMPLEMENTATIONS))
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    try:
        tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        parser.error(f"--tokens: comma-separated integers, got {args.tokens!r}")
    for flag, values in (("--tokens", tokens), ("--batch", [args.batch]), ("--rounds", [args.rounds]),
                         ("--steps", [args.steps])):
        if min(values) < 1:
            parser.error(f"{flag} must be >= 1, got {min(values)}")
    implementations = args.implementations.split(",")
    unknown = sorted(set(implementations) - set(IMPLEMENTATIONS) - {"eager"})
    if unknown:
        parser.error(f"--implementations: unknown {', '.join(unknown)} (known: {', '.join(IMPLEMENTATIONS)}, eager)")
    if not torch.cuda.is_available():
        print("genoflash bench train-step needs a CUDA GPU", flush=True)
        return 2
    import transformers

    device = torch.device("cuda")
    base = build_model(device, max_tokens=max(tokens))
    metadata = run_metadata(device, dtype="bf16", transformers=transformers.__version__,
                            model="Llama-style, 8 layers, hidden 2048, 16 heads x 128, 4 KV heads, vocab 4096",
                            method=f"median of {args.rounds} x {args.steps} CUDA-event step times per implementation "
                                   "(forward with LM loss, backward, AdamW), the implementations in turn, after one "
                                   "untimed step each, every implementation on its own copy of the same weights")
    report = {"metadata": metadata, "implementations": implementations, "batch": args.batch, "points": []}
    path = Path(f"{results_stem(args.out, metadata, 'train-step')}.json")
    for n in tokens:
        point = run_point(base, n, args.batch, implementations, args.rounds, args.steps)
        report["points"].append(point)
        write_json(path, report)
        cells = [f"{impl} {r['median_step_ms']:.1f} ms" if "median_step_ms" in r else f"{impl} {r.get('error')}"
                 for impl, r in point["implementations"].items()]
        print(f"{n} tokens: " + ", ".join(cells)
              + (f"; genoflash x{point['genoflash_speedup_vs_sdpa']:.3f} sdpa's speed"
                 if "genoflash_speedup_vs_sdpa" in point else ""), flush=True)
    plot(report, path.with_suffix(".png"))
    print(f"wrote {path}", flush=True)
    return 0
