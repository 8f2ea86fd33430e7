"""Experiment: is the forward at 262,144 tokens slower because K and V no longer fit in L2?
(docs/design/attention-forward.md cites its results.)

Before the key-chunk split, the forward ran at
556-558 TF/s at H16 N16k and H8 N64k, but 511 at H8 N256k (cuDNN: 610 and 584). One head's K
and V take 32 MB at 64k, under the H200's 50 MB of L2, and 128 MB at 256k. The guess: at 256k
the programs of a head drift apart along the keys, their K/V tiles stop being shared in L2, and
the forward waits on HBM.

The test, with no kernel change: split the keys into chunks that fit in L2, run the forward once
per chunk (every query against one chunk, `return_lse=True`), and merge the chunks' outputs by
their log-sum-exps (what a split-KV kernel would do). If the split runs at the 64k rate, the guess
holds and the fix is a split-KV forward for long N; if it runs at 511 like the whole, the cause
is elsewhere (then read ncu's L2 hit rate and DRAM throughput at 256k, which this probe also
leaves room for: `--ncu` runs one plain forward at 256k between cudaProfilerStart/Stop).

    python benchmarks/experiments/attention/l2_probe.py --out X.json [--ncu]

The merge over 65,536-key chunks ran at 546 TF/s against 520 at 256k, and ncu read a 63% L2
hit rate there. The probe also times genoflash's own split ("genoflash key chunks of N":
configs.forward_key_chunk, the state carried between launches; 568 TF/s over 65,536-key chunks
at 256k against 501 whole, so it became the default), causal as well, and the default beside
them ("whole" is one launch, key_chunk=0).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os

import torch
import triton
import triton.testing

import genoflash
from genoflash.ops.attention.configs import override_configs


def merged_forward(q, k, v, chunk: int):
    """Attention of q over all of k, v, computed one key chunk at a time and merged by lse."""
    outs, lses = [], []
    for start in range(0, k.shape[1], chunk):
        out, lse = genoflash.flash_attn_func(q, k[:, start:start + chunk], v[:, start:start + chunk],
                                             return_lse=True)
        outs.append(out)
        lses.append(lse)  # (batch, nheads, seqlen_q), natural log
    lse = torch.stack(lses).logsumexp(0)
    weights = [(part - lse).exp().transpose(1, 2).unsqueeze(-1) for part in lses]  # (b, n, h, 1)
    return sum(w * o.float() for w, o in zip(weights, outs)).to(q.dtype)


def chunked_forward(q, k, v, chunk: int, causal: bool = False):
    """genoflash's own split (configs.forward_key_chunk): one launch per key chunk, the softmax
    state carried between them in float32, no merge pass. chunk=0: one launch."""
    with override_configs(key_chunk=chunk):
        return genoflash.flash_attn_func(q, k, v, causal=causal)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ncu", action="store_true", help="one plain forward at 256k between cudaProfilerStart/Stop")
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    meta = dict(device=torch.cuda.get_device_name(), date=datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds"), torch=torch.__version__, triton=triton.__version__,
                commit=os.environ.get("GENOFLASH_COMMIT", "unknown"),
                method="do_bench median; merged = one forward per key chunk (return_lse) + an lse merge in torch")
    for n in (65536, 262144):
        q, k, v = (torch.randn(1, n, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        if args.ncu:
            if n == 262144:
                chunked_forward(q, k, v, 0)
                torch.cuda.synchronize()
                torch.cuda.profiler.start()
                chunked_forward(q, k, v, 0)
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
            continue
        for causal in (False, True):
            flops = 4 * 8 * n * n * 128 / (2 if causal else 1)
            whole = chunked_forward(q, k, v, 0, causal)
            variants = {"whole": lambda: chunked_forward(q, k, v, 0, causal)}
            for chunk in (16384, 32768, 65536):
                if chunk < n:
                    if not causal:  # the merge below knows no causal offsets
                        variants[f"merged, key chunks of {chunk}"] = (lambda c=chunk: merged_forward(q, k, v, c))
                    variants[f"genoflash key chunks of {chunk}"] = (lambda c=chunk: chunked_forward(q, k, v, c, causal))
            variants["default (configs.FORWARD_KEY_CHUNK)"] = lambda: genoflash.flash_attn_func(q, k, v, causal=causal)
            for name, fn in variants.items():
                err = (fn().float() - whole.float()).abs().max().item()
                ms = triton.testing.do_bench(fn, warmup=5, rep=100, return_mode="median")
                row = dict(seqlen=n, nheads=8, headdim=128, causal=causal, variant=name, ms=ms,
                           tflops=flops / ms * 1e-9, max_diff_vs_whole=err)
                print(json.dumps(row), flush=True)
                rows.append(row)
                with open(args.out, "w") as f:
                    json.dump(dict(meta, rows=rows), f, indent=1)
        q = k = v = whole = variants = None  # free before the next length
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
