"""Probe (cited by docs/design/backward-sm90.md): flash-attn-4's sm_90 backward kernel, compiled for
sm_90a on a machine without a GPU, as SASS, with the opcode counts of its main loop (one query tile
of one key block per iteration) beside genoflash's Gluon backward compiled the same way.

flash-attn-4 is a peer, never a dependency: this runs in a virtual environment of its own, with
flash-attn-4's wheels for the local Python (its CuTe DSL compiles without a GPU under torch's
FakeTensorMode, FLASH_ATTENTION_ARCH=sm_90 and CUTE_DSL_ARCH=sm_90a), and triton 3.6 for nvdisasm:

    python -m venv /tmp/fa4venv && cd /tmp && /tmp/fa4venv/bin/pip install torch==2.13.0 triton==3.6.0 \
        "numpy<2.3" einops protobuf "cuda-python>=13,<14" apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5
    /tmp/fa4venv/bin/pip install --no-deps flash-attn-4==4.0.0b36 quack-kernels==0.6.5 nvidia-cutlass-dsl==4.8.1 \
        nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1
    /tmp/fa4venv/bin/python benchmarks/experiments/attention/fa4_sass.py OUT.json [--forward]
                                                                         [--genoflash-sass D:CAUSAL:DIR ...]

`--genoflash-sass 128:1:DIR` (repeatable; head dim, causal 0/1, directory) reads genoflash's kernel
for that case from a `tools/offline_compile.py plain 128 --causal --sm90-backward --sass DIR` run,
so that both loops land in one report (--forward: the forward kernels, genoflash's from a
`--sm90-forward --sass DIR` run; its main loop holds the masked and the unmasked tile's code, of which
one runs per tile, so its count is the sum of both). The JSON has
each case's configuration, flash-attn-4's loop summary (instructions per thread and iteration, and
the opcode counts) and, where given, genoflash's.
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter

os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90")
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")
# The CuTe DSL reads these once, at import: every case's cubin lands in one folder, read newest-first.
DUMP_DIR = tempfile.mkdtemp(prefix="fa4-sass-")
os.environ["CUTE_DSL_KEEP"] = "cubin"
os.environ["CUTE_DSL_DUMP_DIR"] = DUMP_DIR

CASES = [(128, False), (128, True), (64, False)]  # (head dim, causal): the genomic shapes' head dims


def _offline_compile():
    """tools/offline_compile.py as a module (tools/ is not a package): its SASS loop reader."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tools", "offline_compile.py")
    spec = importlib.util.spec_from_file_location("offline_compile", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main_loop(sass: str) -> dict:
    """The innermost loop holding HGMMA: its length and opcode counts, and its synchronisation in
    order (barriers, shared-memory barrier waits and arrives, wgmma issues and waits)."""
    tool = _offline_compile()
    _, _, body = tool.mma_loop_bodies(sass)[0]
    sync = [re.sub(r"\s+", " ", i) for i in body
            if re.search(r"BAR\.|SYNCS\.(ARRIVE|PHASECHK)|WARPGROUP\.DEPBAR|HGMMA.*(gsb0|!UPT)", i)]
    return {"instructions": len(body), "opcodes": dict(Counter(tool.opcode(i) for i in body).most_common()),
            "sync_in_order": sync}


def fa4_sass(head_dim: int, causal: bool, forward: bool) -> tuple[str, dict]:
    """flash-attn-4's sm_90 backward (or forward) kernel for (1, 16384, 16, head_dim) bf16 inputs, as
    SASS, with its tile configuration (the backward's is its own table's, `_tile_size_bwd_sm90`)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from flash_attn.cute import interface

    started = time.time()
    cfg = {} if forward else interface._tile_size_bwd_sm90(head_dim, head_dim, causal, False)
    with FakeTensorMode():
        b, n, h = 1, 16384, 16
        q, k, v, out, dout = (torch.empty(b, n, h, head_dim, dtype=torch.bfloat16, device="cuda") for _ in range(5))
        lse = torch.empty(b, h, n, dtype=torch.float32, device="cuda")
        if forward:
            interface._flash_attn_fwd(q, k, v, causal=causal)
        else:
            interface._flash_attn_bwd(q, k, v, out, dout, lse, causal=causal, m_block_size=cfg.m_block_size,
                                      n_block_size=cfg.n_block_size, num_stages_Q=cfg.num_stages_Q,
                                      num_stages_dO=cfg.num_stages_dO, SdP_swapAB=cfg.SdP_swapAB,
                                      dKV_swapAB=cfg.dKV_swapAB, dQ_swapAB=cfg.dQ_swapAB,
                                      AtomLayoutMSdP=cfg.AtomLayoutMSdP, AtomLayoutNdKV=cfg.AtomLayoutNdKV,
                                      AtomLayoutMdQ=cfg.AtomLayoutMdQ)
    # (the file name is the kernel's signature, the same for every case: the one written by this compile)
    kind = "fwd_sm90" if forward else "bwd_sm90"
    cubin = [f for f in glob.glob(os.path.join(DUMP_DIR, f"*{kind}*.cubin")) if os.path.getmtime(f) >= started]
    assert len(cubin) == 1, f"expected one sm_90 {kind} cubin written in {DUMP_DIR}, found {cubin}"
    from triton.backends.nvidia.compiler import get_ptxas
    nvdisasm = os.path.join(os.path.dirname(get_ptxas(90).path), "nvdisasm")
    sass = subprocess.run([nvdisasm, "-c", cubin[0]], capture_output=True, text=True, check=True).stdout
    return sass, {k: getattr(cfg, k) for k in ("m_block_size", "n_block_size", "num_stages_Q", "num_stages_dO",
                                                 "SdP_swapAB", "dKV_swapAB", "dQ_swapAB", "AtomLayoutMSdP",
                                                 "AtomLayoutNdKV", "AtomLayoutMdQ") if cfg}


def main(argv):
    import importlib.metadata

    path = argv[0]
    ours = {}
    for i, a in enumerate(argv):
        if a == "--genoflash-sass":
            d, c, directory = argv[i + 1].split(":", 2)
            ours[(int(d), c == "1")] = directory
    report = {"metadata": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                           "target": "sm_90a, compiled offline (no GPU)",
                           "genoflash_commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                                              capture_output=True, text=True).stdout.strip(),
                           "versions": {p: importlib.metadata.version(p) for p in
                                        ("flash-attn-4", "nvidia-cutlass-dsl", "torch", "triton")}},
              "cases": []}
    forward = "--forward" in argv
    report["metadata"]["kernels"] = "forward" if forward else "backward"
    for head_dim, causal in CASES:
        sass, cfg = fa4_sass(head_dim, causal, forward)
        case = {"head_dim": head_dim, "causal": causal, "flash_attn_4": {"config": cfg, **main_loop(sass)}}
        if (head_dim, causal) in ours:
            name = "_attn_fwd_sm90_kernel.sass" if forward else "_attn_bwd_sm90_kernel.sass"
            with open(os.path.join(ours[(head_dim, causal)], name)) as f:
                case["genoflash"] = main_loop(f.read())
        report["cases"].append(case)
        print(f"hd{head_dim}{' causal' if causal else ''}: flash-attn-4 {cfg.get('m_block_size', '')} "
              f"{case['flash_attn_4']['instructions']} instructions an iteration"
              + (f", genoflash {case['genoflash']['instructions']}" if "genoflash" in case else ""), flush=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
