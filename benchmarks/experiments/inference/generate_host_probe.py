"""Probe: where a greedy generate() step's host time goes, genoflash against sdpa.

Wraps transformers' "genoflash" and "sdpa" attention functions with a host clock (no sync: the
time the Python call takes to return, which is what bounds a host-bound decode loop), runs the
generate benchmark's model, and reports per attention call: mean host us, and per token: wall ms.
Then the bare calls in a loop, outside generate(): each implementation's attention function as
transformers calls it, and decode_attention and SDPA themselves, on one layer's cache; and a
cProfile of genoflash's function on the device's host.

    python benchmarks/experiments/inference/generate_host_probe.py OUT.json
"""

from __future__ import annotations

import copy
import cProfile
import io
import json
import pstats
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, DynamicCache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from genoflash.bench.common import run_metadata
from genoflash.bench.generate import CUDA, _generate, _use, build_model

CLOCKS: dict[str, list[float]] = {}


def wrap(name, fn):
    def timed(*args, **kwargs):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        CLOCKS.setdefault(name, []).append(time.perf_counter() - start)
        return out
    return timed


def bare_loop(fn, calls=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / calls * 1e6
    return {"host_us_per_call": host, "wall_us_per_call": wall}


def main(argv):
    model = build_model()
    for name in ("genoflash", "sdpa"):
        AttentionInterface.register(name, wrap(name, ALL_ATTENTION_FUNCTIONS[name]))
    rows = []
    for batch, prompt in ((1, 100), (1, 4096), (8, 4096)):
        ids = torch.randint(1, model.config.vocab_size, (batch, prompt), device=CUDA)
        mask = torch.ones_like(ids)
        _use(model, "genoflash")
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(ids[:, :-1], attention_mask=mask[:, :-1], past_key_values=cache, use_cache=True,
                  logits_to_keep=1)
        rec = {"batch": batch, "prompt": prompt}
        for impl in ("genoflash", "sdpa", "genoflash", "sdpa"):  # the first round warms up
            _use(model, impl)
            CLOCKS.clear()
            c = copy.deepcopy(cache)
            torch.cuda.synchronize()
            start = time.perf_counter()
            _generate(model, ids, mask, c, 32)
            torch.cuda.synchronize()
            wall = (time.perf_counter() - start) / 32 * 1e3
            calls = CLOCKS.get(impl, [])
            rec[impl] = {"ms_per_token": wall, "attention_calls": len(calls),
                         "attention_host_us_mean": statistics.mean(calls) * 1e6 if calls else None,
                         "attention_host_us_median": statistics.median(calls) * 1e6 if calls else None,
                         "attention_host_ms_per_token": sum(calls) / 32 * 1e3}
            del c
        print(rec, flush=True)
        rows.append(rec)
    from genoflash.integrations.transformers import genoflash_attention_forward
    from genoflash.ops.attention.decode import decode_attention
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module = model.model.layers[0].self_attn
    bare, profiles = {}, {}
    for n in (100, 4096, 65536):
        q = torch.randn(1, 1, 16, 128, device=CUDA, dtype=torch.bfloat16)
        kh = torch.randn(1, 4, n, 128, device=CUDA, dtype=torch.bfloat16)  # transformers' layout
        vh = torch.randn_like(kh)
        k, v = kh.transpose(1, 2), vh.transpose(1, 2)
        qh = q.transpose(1, 2)
        bare[n] = {
            "genoflash, transformers' call": bare_loop(
                lambda: genoflash_attention_forward(module, qh, kh, vh, None, scaling=0.088)),
            "sdpa, transformers' call": bare_loop(
                lambda: sdpa_attention_forward(module, qh, kh, vh, None, scaling=0.088)),
            "genoflash decode_attention": bare_loop(lambda: decode_attention(q, k, v, None, n, softmax_scale=0.088)),
            "sdpa (cuDNN allowed)": bare_loop(lambda: F.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True)),
        }
        print(n, bare[n], flush=True)
        if n == 4096:  # where the device's host spends genoflash's call
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(2000):
                genoflash_attention_forward(module, qh, kh, vh, None, scaling=0.088)
            profile.disable()
            torch.cuda.synchronize()
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(15)
            profiles["genoflash, transformers' call, 4096 keys, 2000 calls"] = text.getvalue()
            print(text.getvalue(), flush=True)
    with open(argv[0], "w") as f:
        json.dump({"metadata": run_metadata(CUDA), "generate": rows, "bare": bare, "profiles": profiles}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
