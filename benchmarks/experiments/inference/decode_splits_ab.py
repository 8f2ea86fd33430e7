"""Probe: a contiguous or paged cache's split count rounded up (the fill rule before `8b8d954`) or
down (one wave of equal programs), timed in interleaved rounds beside SDPA cuDNN, on
`genoflash bench decode`'s cases. Cited by docs/design/decoding.md ("How many parts"); results in
benchmarks/results/h100-2026-12-07-decode-splits-ab-85fa760.json, transcribed from the log of the
run (an ad-hoc copy of this probe, same cases, rules, rounds and timer, at `85fa760`).

    python benchmarks/experiments/inference/decode_splits_ab.py      # on a CUDA GPU
"""

import statistics

import torch
from torch.nn.attention import SDPBackend

from genoflash.bench.decode import CASES, HEADDIM, _paged, _sdpa, _timed
from genoflash.ops.attention import decode
from genoflash.ops.common.host import cdiv

ROUNDS = 3


def main() -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    slots = decode.DEFAULT_CONFIG.programs_per_sm * sms
    for name, (batch, n, nheads, nheads_k) in CASES.items():
        torch.manual_seed(0)
        q = torch.randn(batch, 1, nheads, HEADDIM, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(batch, n, nheads_k, HEADDIM, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        k_pages, v_pages, table = _paged(k, v)
        qs, ks, vs = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        programs = batch * nheads_k
        counts = {"up": cdiv(slots, programs), "down": max(1, slots // programs)}
        times: dict = {}
        for _ in range(ROUNDS):
            for rule, splits in counts.items():
                for layout, (kc, vc, bt) in {"contiguous": (k, v, None), "paged": (k_pages, v_pages, table)}.items():
                    r = _timed(lambda: decode.decode_attention(q, kc, vc, None, n, softmax_scale=HEADDIM ** -0.5,
                                                               block_table=bt, num_splits=splits, return_lse=False))
                    times.setdefault((layout, rule, splits), []).append(r["ms"])
            times.setdefault(("sdpa-cudnn", "", 0), []).append(
                _timed(lambda: _sdpa(SDPBackend.CUDNN_ATTENTION)(qs, ks, vs))["ms"])
        cudnn = statistics.median(times[("sdpa-cudnn", "", 0)])
        for (layout, rule, splits), ms in sorted(times.items()):
            print(f"{name} {layout} {rule} splits={splits} {statistics.median(ms):.4f} ms "
                  f"speed vs cudnn {cudnn / statistics.median(ms):.4f}", flush=True)
        q = k = v = k_pages = v_pages = qs = ks = vs = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
