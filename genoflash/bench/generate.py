"""`genoflash bench generate`: per-token time of greedy `generate()` in transformers, genoflash against sdpa.

The model is a Llama-style decoder built from a local config (random weights, bf16): hidden 2048,
16 query heads and 4 KV heads of 128 (GQA 4:1), 8 layers, vocabulary 4096. For each batch and prompt
length, the prompt but its last token is prefilled once (with genoflash); each implementation then
runs `generate()` from its own copy of that cache, so every step it times is a decoding step
(the first one reads the prompt's last token). Per-token time = wall time of T new tokens / T.
Each implementation first runs one untimed generate of the same T tokens, so that every key length
the timed runs meet has been seen (Triton's compilation and cuDNN's per-length execution plans stay
out); then REPEATS timed runs go round the implementations in turn, so that a slow spell of the
host falls on all of them, and the median is reported. Tokens are compared with eager's. Beside
transformers' "sdpa", "sdpa-no-cudnn" is the same with SDPA's cuDNN backend off.

Results: <out>/<gpu>-<date>-generate.json and a plot of per-token time against prompt length.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch

from .common import RESULTS_DIR, error_text, pyplot, results_stem, run_metadata, save_figure, title_stamp, write_json

CUDA = torch.device("cuda")
# "sdpa-no-cudnn": transformers' sdpa with SDPA's cuDNN backend switched off (torch then takes its
# flash backend), as a second baseline: cuDNN builds an execution plan per new key length.
IMPLEMENTATIONS = ("genoflash", "sdpa", "sdpa-no-cudnn", "eager")
REPEATS = 5  # timed generate() calls per point and implementation; the median is reported
# The Llama-style model of this benchmark and of `bench train-step` (GQA 4:1, head dim 128).
LLAMA = dict(vocab_size=4096, hidden_size=2048, intermediate_size=5632, num_hidden_layers=8, num_attention_heads=16,
             num_key_value_heads=4, head_dim=128)


def build_model(layers: int = 8):
    import transformers

    import genoflash.integrations.transformers  # noqa: F401  (registers "genoflash")

    config = transformers.LlamaConfig(**{**LLAMA, "num_hidden_layers": layers}, max_position_embeddings=131072)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="genoflash",
                                                       dtype=torch.bfloat16)
    return model.to(CUDA).eval()


def use_implementation(model, implementation: str) -> None:
    """Switch the model's attention; "sdpa-no-cudnn" is sdpa with SDPA's cuDNN backend off."""
    model.set_attn_implementation("sdpa" if implementation == "sdpa-no-cudnn" else implementation)
    if torch.cuda.is_available():
        torch.backends.cuda.enable_cudnn_sdp(implementation != "sdpa-no-cudnn")


def _generate(model, ids, mask, cache, new_tokens: int):
    return model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)


def run_point(model, batch: int, prompt: int, new_tokens: int, implementations) -> dict:
    from transformers import DynamicCache

    torch.manual_seed(prompt + batch)
    ids = torch.randint(1, model.config.vocab_size, (batch, prompt), device=CUDA)
    mask = torch.ones_like(ids)
    use_implementation(model, "genoflash")
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids[:, :-1], attention_mask=mask[:, :-1], past_key_values=cache, use_cache=True, logits_to_keep=1)
    rec = {"batch": batch, "prompt": prompt, "new_tokens": new_tokens, "implementations": {}}
    tokens, times = {}, {}
    for impl in implementations:  # warm-up: every key length of the timed runs, once
        use_implementation(model, impl)
        try:
            _generate(model, ids, mask, copy.deepcopy(cache), new_tokens)
            times[impl] = []
        except Exception as e:  # e.g. eager out of memory: record it, go on
            rec["implementations"][impl] = {"error": error_text(e)}
        torch.cuda.empty_cache()
    for _ in range(REPEATS):
        for impl in list(times):
            use_implementation(model, impl)
            run_cache = copy.deepcopy(cache)
            try:
                torch.cuda.synchronize()
                start = time.perf_counter()
                out = _generate(model, ids, mask, run_cache, new_tokens)
                torch.cuda.synchronize()
            except Exception as e:  # out of memory beside the copy, say: this implementation stops here
                rec["implementations"][impl] = {"error": error_text(e)}
                del times[impl]
                continue
            finally:
                del run_cache
                torch.cuda.empty_cache()
            times[impl].append((time.perf_counter() - start) / new_tokens * 1e3)
            tokens[impl] = out[:, prompt:]
    for impl, runs in times.items():
        rec["implementations"][impl] = {"ms_per_token": statistics.median(runs), "ms_per_token_runs": runs}
    if "eager" in tokens:
        for impl, t in tokens.items():
            same = (t == tokens["eager"]).all(dim=0)
            rec["implementations"][impl]["tokens_equal_eager"] = bool(same.all())
            rec["implementations"][impl]["steps_equal_eager"] = int(same.cumprod(0).sum())
    use_implementation(model, "genoflash")
    g = rec["implementations"].get("genoflash", {}).get("ms_per_token")
    for base in ("sdpa", "sdpa-no-cudnn"):
        b = rec["implementations"].get(base, {}).get("ms_per_token")
        if g and b:
            rec[f"genoflash_over_{base}"] = g / b
    print(f"batch {batch} prompt {prompt}: " + "  ".join(
        f"{i} {r['ms_per_token']:.2f} ms/token" if "ms_per_token" in r else f"{i} {r['error']}"
        for i, r in rec["implementations"].items()), flush=True)
    del cache
    torch.cuda.empty_cache()
    return rec


def plot(report: dict, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(report["batches"]), figsize=(5 * len(report["batches"]), 4), squeeze=False)
    for ax, batch in zip(axes[0], report["batches"]):
        points = [p for p in report["points"] if p["batch"] == batch]
        for impl in IMPLEMENTATIONS:
            xs = [p["prompt"] for p in points if "ms_per_token" in p["implementations"].get(impl, {})]
            ys = [p["implementations"][impl]["ms_per_token"] for p in points
                  if "ms_per_token" in p["implementations"].get(impl, {})]
            if xs:
                ax.plot(xs, ys, marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel("ms per new token")
        ax.set_title(f"batch {batch}")
        ax.legend()
    fig.suptitle(f"greedy generate(), Llama-style 8 x (16 x 128, GQA 4:1), bf16 | {title_stamp(report['metadata'])}",
                 fontsize=9)
    save_figure(fig, path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="genoflash bench generate", description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default="100,1024,4096,16384,65536")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--implementations", default=",".join(IMPLEMENTATIONS))
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("genoflash bench generate needs a CUDA GPU", flush=True)
        return 2
    import transformers

    model = build_model()
    metadata = run_metadata(CUDA, dtype="bf16", transformers=transformers.__version__,
                            model="Llama-style, 8 layers, hidden 2048, 16 heads x 128, 4 KV heads, vocab 4096",
                            method=f"median of {REPEATS} wall times of generate(new_tokens), the implementations "
                                   "in turn, after an untimed generate of the same length each, every run from a "
                                   "copy of one prefilled cache")
    batches = [int(b) for b in args.batches.split(",")]
    report = {"metadata": metadata, "batches": batches, "points": []}
    path = Path(f"{results_stem(args.out, metadata, 'generate')}.json")
    for batch in batches:
        for prompt in (int(p) for p in args.prompts.split(",")):
            report["points"].append(run_point(model, batch, prompt, args.new_tokens, args.implementations.split(",")))
            write_json(path, report)
    plot(report, path.with_suffix(".png"))
    print(f"wrote {path}", flush=True)
    return 0
