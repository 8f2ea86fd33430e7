"""Compile genoflash's Triton kernels for the H200 (sm_90) on a machine without a GPU.

Reports, per kernel launched by the given call: shared memory, registers and spills (from
ptxas -v). This catches "out of resource: shared memory" and register spills before a
device call is spent on them. The kernels are compiled, never run: outputs are garbage.

    python tools/offline_compile.py CASE [D [DV]] [--fwd BM,BN,WARPS,STAGES] [--dkdv ...] [--dq ...]

CASE is plain, rope (fp32 tables), rope-bf16, window, dropout, rope-dropout, mamba (the
selective scan's forward and backward; --channels-first: on channels-first inputs (the Mamba block's
layout); --sequential-forward: the forward's kernels alone, with dstate = D); --fwd/--dkdv/--dq force
tiles; --sass DIR writes each kernel's SASS (and its PTX beside
it); --sm90-forward compiles the Gluon forward (forward_sm90.py); --no-tma keeps pointer loads where TMA descriptors would apply; --sm90-backward compiles the
Gluon one-pass backward (backward_sm90.py; its compute warps run at 240 registers, so ptxas's
count is the launch's, and a spill is what to look for); --dq-rope-tma: RoPE's dQ pass with K and
the tables by TMA; --key-chunk N: the forward over chunks of N keys; --causal, --softcap X,
--alibi, --varlen and --gqa add those features (--heads-per-split N: GQA's dK/dV pass with the
group split over programs). A kernel whose wgmma ptxas serialized (notes C7514/C7515: no
tensor-core pipelining) is marked WGMMA-SERIALIZED, one where it injected a wait for a wgmma in
flight (C7517) WGMMA-WAIT-INJECTED.

A change meant to keep the machine code as it is (Python moved, a helper renamed) is checked by
writing --sass before and after and comparing the files: tools/sass_identity.py runs a set of cases
for two trees.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402


class _Sm90Driver:
    """Just enough of a CUDA driver for Triton to compile (not launch) for sm_90."""

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_device_interface(self):
        return torch.cuda


COMPILED: list = []


def _compile_only(self, *args, grid, warmup, **kwargs):
    kernel = _original_run(self, *args, grid=grid, warmup=True, **kwargs)
    COMPILED.append((self.fn.__name__, kwargs.get("num_warps"), kwargs.get("num_stages"), kernel))
    return kernel


_original_run = JITFunction.run


def ptxas_report(kernel) -> str:
    from triton.backends.nvidia.compiler import get_ptxas
    ptxas = get_ptxas(90).path
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(kernel.asm["ptx"])
    out = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", f.name, "-o", os.devnull],
                         capture_output=True, text=True)
    regs = re.search(r"Used (\d+) registers", out.stderr)
    spill = re.search(r"(\d+) bytes spill stores", out.stderr)
    report = f"regs {regs.group(1) if regs else '?'} spill-stores {spill.group(1) if spill else '?'}"
    # ptxas notes C7514 / C7515: it made every wgmma of the kernel wait for the one before (no
    # tensor-core pipelining), e.g. when a non-wgmma instruction reads (C7514) or writes (C7515) an
    # accumulator inside a pipeline stage. C7517: it injected a wait for the wgmma in flight before
    # an instruction that uses registers it believes a wgmma defined (the overlap there is lost).
    if "C7514" in out.stderr or "C7515" in out.stderr:
        report += " WGMMA-SERIALIZED"
    if "C7517" in out.stderr:
        report += " WGMMA-WAIT-INJECTED"
    return report


def opcode(instruction: str) -> str:
    """'@!P0 IMAD.WIDE.U32 R2, ...' -> 'IMAD' (predicate and modifiers dropped)."""
    return re.sub(r"^@!?U?P\w+\s+", "", instruction).split()[0].split(".")[0]


def mma_loop_bodies(sass: str) -> list[tuple[int, int, list[str]]]:
    """(start, end, instructions) of each loop (a backward branch) holding tensor-core
    instructions (HGMMA), innermost first, then in program order: the key loops whose per-tile
    work this tool compares (benchmarks/experiments/attention/fa4_sass.py reads flash-attn-4's too)."""
    labels, instrs = {}, []
    for line in sass.splitlines():
        label = re.match(r"^\s*(\.L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(instrs)
        ins = re.match(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if ins:
            instrs.append(ins.group(1))
    loops = []
    for end, ins in enumerate(instrs):
        target = re.search(r"BRA\s+(?:`\()?(\.L_x_\d+)", ins)
        if target and labels.get(target.group(1), end + 1) < end:
            body = instrs[labels[target.group(1)]:end + 1]
            if any(opcode(i) == "HGMMA" for i in body):
                loops.append((labels[target.group(1)], end, body))

    def holds_another(loop):
        return any(other is not loop and loop[0] <= other[0] and other[1] <= loop[1] for other in loops)
    return sorted(loops, key=lambda loop: (holds_another(loop), loop[0]))


def mma_loops(sass: str) -> list[tuple[int, int, dict]]:
    """mma_loop_bodies' loops with the count of each opcode in place of the instructions."""
    from collections import Counter
    return [(start, end, Counter(opcode(i) for i in body)) for start, end, body in mma_loop_bodies(sass)]


def dump_sass(kernel, path: str) -> dict:
    """Write the kernel's SASS (nvdisasm of the cubin Triton built) to `path`; returns the count of
    each opcode (for comparing two kernels' instruction mix) and prints the innermost key loops."""
    from collections import Counter

    from triton.backends.nvidia.compiler import get_ptxas
    nvdisasm = os.path.join(os.path.dirname(get_ptxas(90).path), "nvdisasm")
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    with open(os.path.splitext(path)[0] + ".ptx", "w") as out:  # what LLVM emitted, before ptxas
        out.write(kernel.asm["ptx"])
    sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout
    with open(path, "w") as out:
        out.write(sass)
    # The innermost loops come first, in program order: the key loops (in the forward, the whole
    # tiles' loop, then the masked tiles'). A loop at BLOCK_N 64 counts half the keys of one at 128.
    for start, end, ops in mma_loops(sass)[:3]:
        print(f"    loop [{start}..{end}]: {end + 1 - start} instructions:",
              " ".join(f"{op} {n}" for op, n in ops.most_common(14)))
    ops = re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass, flags=re.M)
    return Counter(op.split(".")[0] for op in ops)


def _tiles(text):
    from genoflash.ops.attention.configs import TileConfig
    return TileConfig(*(int(x) for x in text.split(",")))


def stand_in_for_sm90(no_tma: bool = False) -> torch.device:
    """Let CPU tensors stand in for CUDA ones in genoflash's attention: skip the device check,
    choose the GPU's tile configs, and count tensors as TMA-eligible as on Hopper (unless
    no_tma). Call after the driver is set (and JITFunction.run replaced). Returns the device whose
    configs apply."""
    from genoflash.ops.attention import backward as bwd_mod, configs, descriptors, forward as fwd_mod, interface

    interface.check_triton_device = lambda q: None
    gpu = torch.device("cuda")
    fwd_cfg, bwd_cfg = configs.forward_config, configs.backward_config
    configs.forward_config = lambda d, dv, causal, dt, device, *rest: fwd_cfg(d, dv, causal, dt, gpu, *rest)
    configs.backward_config = lambda d, dv, causal, dt, device, *rest: bwd_cfg(d, dv, causal, dt, gpu, *rest)
    for mod in (fwd_mod, bwd_mod):
        for name in ("forward_config", "backward_config"):
            if hasattr(mod, name):
                setattr(mod, name, getattr(configs, name))

    def tma_on_sm90(a, *tensors, rotary=False):
        return (a.settings.tma and not no_tma and not a.varlen and (not a.rotary_dim or rotary)
                and all(t.dim() == 4 and descriptors.aligned(t) for t in tensors))
    # descriptors.tma_applies too: rope_tma_applies (the forward's RoPE path) asks it.
    fwd_mod.tma_applies = bwd_mod.tma_applies = descriptors.tma_applies = tma_on_sm90
    return gpu


def main(argv):
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("case", nargs="?", default="plain")
    parser.add_argument("d", nargs="?", type=int, default=128)
    parser.add_argument("dv", nargs="?", type=int)
    parser.add_argument("--fwd")
    parser.add_argument("--dkdv")
    parser.add_argument("--dq")
    parser.add_argument("--rotary-dim", type=int)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--no-tma", action="store_true", help="pointer loads where TMA descriptors would apply")
    parser.add_argument("--dq-rope-tma", action="store_true",
                        help="RoPE: the dQ pass takes K's halves and the tables by TMA (BackwardConfig.dq_rope_by_tma)")
    parser.add_argument("--sm90-backward", action="store_true",
                        help="deterministic=False through the Gluon one-pass backward (backward_sm90.py)")
    parser.add_argument("--sm90-forward", action="store_true",
                        help="the Gluon forward (forward_sm90.py) where it supports the call")
    parser.add_argument("--sass", help="directory: write each kernel's SASS there and print its opcode counts")
    parser.add_argument("--key-chunk", type=int,
                        help="the forward over chunks of this many keys (configs.forward_key_chunk): its launches")
    parser.add_argument("--causal", action="store_true", help="causal (with window: both)")
    parser.add_argument("--softcap", type=float, default=0.0)
    parser.add_argument("--alibi", action="store_true", help="ALiBi slopes, one per head")
    parser.add_argument("--varlen", action="store_true", help="flash_attn_varlen_func, two sequences (300 + 724)")
    parser.add_argument("--gqa", action="store_true", help="two query heads per K/V head")
    parser.add_argument("--heads-per-split", type=int,
                        help="GQA: query heads per dK/dV program (configs.dkdv_group_split), e.g. 1 with --gqa")
    parser.add_argument("--sequential-forward", action="store_true",
                        help="mamba: forward.py's kernels alone (pass 1 and the output pass), dstate = D (the "
                             "positional argument)")
    parser.add_argument("--channels-first", action="store_true",
                        help="mamba: channels-first inputs (the backward's state-loop kernels, "
                             "backward_channels_first.py)")
    args = parser.parse_args(argv)
    driver.set_active(_Sm90Driver())
    JITFunction.run = _compile_only
    import genoflash
    from genoflash.ops.attention import configs
    from genoflash.ops.rotary import rotary_tables

    gpu = stand_in_for_sm90(no_tma=args.no_tma)
    bwd_cfg = configs.backward_config

    case, d = args.case, args.d
    dv = args.dv or d
    rotary_dim = args.rotary_dim or d
    dtype = getattr(torch, args.dtype)
    n, h = 1024, 2
    hk = 1 if args.gqa else h  # GQA: two query heads share one K/V head
    q = torch.randn(1, n, h, d, dtype=dtype, requires_grad=True)
    k = torch.randn(1, n, hk, d, dtype=dtype, requires_grad=True)
    v = torch.randn(1, n, hk, dv, dtype=dtype, requires_grad=True)
    kw = {}
    if case == "rope":
        cos, sin = rotary_tables(n, rotary_dim, dtype=torch.float32)
        kw = dict(rotary_cos=cos, rotary_sin=sin)
    elif case == "rope-bf16":
        cos, sin = rotary_tables(n, rotary_dim, dtype=dtype)
        kw = dict(rotary_cos=cos, rotary_sin=sin)
    elif case == "window":
        kw = dict(window_size=(256, 256))
    elif case == "dropout":
        kw = dict(dropout_p=0.1)
    elif case == "rope-dropout":
        cos, sin = rotary_tables(n, rotary_dim, dtype=torch.float32)
        kw = dict(rotary_cos=cos, rotary_sin=sin, dropout_p=0.1)
    if case == "mamba":  # the selective scan's kernels at Mamba's usual sizes (d_inner 512, dstate 16)
        from genoflash.ops.mamba import backward, backward_channels_first, forward
        # As the Mamba layer calls them: 16-bit u, delta, z, B, C, with D, delta_bias and the softplus.
        # 1,024 steps: with channels-first inputs a length that is a multiple of 8 is what lets
        # Triton vectorise the loads along time (and keep 8 steps in each thread).
        u, delta, z = (torch.randn(1, 1024, 512, dtype=torch.bfloat16) for _ in range(3))
        kernels = backward
        if args.channels_first:  # (batch, dim, seqlen) memory: the backward's state-loop kernels
            kernels = backward_channels_first
            u, delta, z = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (u, delta, z))
        dstate = args.d if args.sequential_forward else 16
        A = -torch.rand(512, dstate)
        B, C = (torch.randn(1, 1024, dstate, dtype=torch.bfloat16) for _ in range(2))
        extras = dict(D=torch.ones(512), z=z, delta_bias=torch.rand(512), softplus=True)
        y, h0, decay = forward.scan_forward(u, delta, A, B, C, **extras)
        if not args.sequential_forward:
            kernels.scan_backward(torch.randn_like(y), u, delta, A, B, C, h0, decay, **extras)
            kernels.scan_backward(torch.randn_like(y), u, delta, A, B, C, h0, decay, deterministic=False, **extras)
        seen_kernels: dict[str, int] = {}
        for name, warps, stages, kernel in COMPILED:
            print(f"mamba {name:<32} warps {warps} shared {kernel.metadata.shared:>7} {ptxas_report(kernel)}")
            if args.sass:  # no tensor-core loops here: the whole kernel's opcode counts
                seen_kernels[name] = seen_kernels.get(name, 0) + 1
                os.makedirs(args.sass, exist_ok=True)
                ops = dump_sass(kernel, os.path.join(args.sass, f"{name}-{seen_kernels[name]}.sass"))
                print("    " + " ".join(f"{op} {n}" for op, n in ops.most_common(16)))
        return
    if args.causal:
        kw["causal"] = True
    if args.softcap:
        kw["softcap"] = args.softcap
    if args.alibi:
        kw["alibi_slopes"] = torch.rand(h)
    fwd = _tiles(args.fwd) if args.fwd else None
    bwd = None
    if args.sm90_backward:  # the GPU's dispatch, with the device check left out
        from genoflash.ops.attention import backward_sm90
        kw["deterministic"] = False
        backward_sm90.applies = lambda q, k, v, dout, out, a: not a.deterministic and backward_sm90.supports(
            q, k, v, dout, out, a)
    if args.sm90_forward:  # the GPU's dispatch, with the device check left out
        from genoflash.ops.attention import forward_sm90
        forward_sm90.applies = lambda q, k, v, a: forward_sm90.supports(q, k, v, a)
    if args.dkdv or args.dq:
        gpu_default = bwd_cfg(d, dv, False, dtype, gpu, 4 if case in ("rope", "rope-dropout") else 2 if "rope" in case else 0,
                              "dropout" in case)
        bwd = configs.BackwardConfig(_tiles(args.dkdv) if args.dkdv else gpu_default.dkdv,
                                     _tiles(args.dq) if args.dq else gpu_default.dq,
                                     dkdv_q_by_tma=gpu_default.dkdv_q_by_tma)
    # Launches here only compile: a cached compiled kernel (launch.py's fast path) cannot be called.
    with genoflash.settings(backend="triton", fast_launch=False), configs.override_configs(
            fwd, bwd, dq_rope_by_tma=True if args.dq_rope_tma else None,
            key_chunk=args.key_chunk, dkdv_heads_per_split=args.heads_per_split):
        if args.varlen:
            cu = torch.tensor([0, 300, n], dtype=torch.int32)
            out = genoflash.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 724, 724, **kw)
        else:
            out = genoflash.flash_attn_func(q, k, v, **kw)
        out.backward(torch.randn_like(out))
    seen: dict[str, int] = {}
    for name, warps, stages, kernel in COMPILED:
        if name in ("_bwd_sm90_prologue_kernel", "_bwd_sm90_dq_kernel"):
            continue
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:  # another launch of the same kernel (the key chunks' launches)
            name = f"{name}-{seen[name]}"
        print(f"{case} {args.dtype} d={d} dv={dv} r={rotary_dim if 'rope' in case else 0} {name:<22} warps {warps} "
              f"stages {stages} shared {kernel.metadata.shared:>7} {ptxas_report(kernel)}")
        if args.sass:
            os.makedirs(args.sass, exist_ok=True)
            ops = dump_sass(kernel, os.path.join(args.sass, f"{name}.sass"))
            print("   ", " ".join(f"{op} {n}" for op, n in ops.most_common(40)))


if __name__ == "__main__":
    main(sys.argv[1:])
