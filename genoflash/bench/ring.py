"""`genoflash bench ring`: context-parallel attention over the GPUs of one host, under torchrun.

    torchrun --nproc-per-node 2 -m genoflash.cli bench ring --out DIR

One process per GPU, NCCL. Parts (`--parts`, all by default), at H=8, D=128, bf16, batch 1:

- `baseline`: the single-GPU kernel (flash_attn_func) forward+backward at `--baseline` tokens,
  non-causal and causal, on every GPU at once with no communication: the per-GPU TF/s the
  scaling efficiencies are measured against.
- `overlap`: at `--overlap` tokens per GPU, ring attention three ways: as is; with the ring's
  sends and receives replaced by no-ops (the same kernels and merges, no communication); and
  the exchanges alone. hidden = (compute + communication - ring) / communication, the share of
  the communication that ran under the compute.
- `weak`: `--weak` tokens per GPU (sequence = world x that), non-causal and causal (zigzag).
- `strong`: a fixed `--strong`-token sequence over all GPUs.
- `train`: one context-parallel training step (forward, backward, gradient all-reduce, AdamW)
  of a causal DNA language model over a `--train-context`-token sequence.

Ring runs are timed once each (they take seconds to minutes), after a compile at a small size,
and checked on `--rows` sampled query rows against an exact float32 reference that streams over
the keys (scale.sampled_rows_attention): outputs, and the gradients of a loss fed by those rows
only (dq on those rows, dk and dv on every rank's whole shard). Time is the slowest rank's;
memory the largest peak. Per-GPU TF/s use the standard count (4 N^2 H D forward, halved when
causal, x3.5 for forward+backward) divided by the number of GPUs; efficiency is that over the
baseline's TF/s. Rank 0 writes <out>/<gpu>-<date>-ring-x<world>.json (after every part) and a
plot.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from .. import flash_attn_func
from ..distributed import enable_context_parallel, ring_flash_attn_func, shard_positions, shard_sequence
from ..distributed import ring as ring_module
from .common import (RESULTS_DIR, attention_flops, free_cached_memory, peak_memory_gib, pyplot, relative_error,
                     reset_peak_memory, results_stem, run_metadata, save_figure, synchronize, tflops, title_stamp,
                     write_json)
from .scale import sampled_rows_attention

PARTS = ("baseline", "overlap", "weak", "strong", "train")
_DEVICE = torch.device("cuda")  # main() switches to the CPU for --cpu (gloo; tests)


def _reset_peak() -> None:
    free_cached_memory(_DEVICE)
    reset_peak_memory(_DEVICE)


def _sync_barrier() -> None:
    synchronize(_DEVICE)
    dist.barrier()


def _slowest(value: float) -> float:
    t = torch.tensor([value], device=_DEVICE, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _largest_peak() -> float | None:
    """The largest rank's peak memory in GiB (None on the CPU)."""
    peak = peak_memory_gib(_DEVICE)
    return None if peak is None else _slowest(peak)


class _SilentRing(ring_module._Ring):
    """The ring with its exchanges removed: every 'received' shard is the one sent, so the
    kernels and merges run on the same shapes and nothing crosses a link."""

    def start(self, tensors):
        return tensors, tensors, []


@contextmanager
def _no_communication():
    saved = ring_module._Ring
    ring_module._Ring = _SilentRing
    try:
        yield
    finally:
        ring_module._Ring = saved


def _full_dtype() -> torch.dtype:
    return torch.bfloat16 if _DEVICE.type == "cuda" else torch.float16


def _full_inputs(seqlen: int, nheads: int, headdim: int, seed: int):
    """The whole sequence's q, k, v, drawn identically on every rank (same seed, same generator)."""
    gen = torch.Generator(device=_DEVICE).manual_seed(seed)
    return [torch.randn(1, seqlen, nheads, headdim, device=_DEVICE, dtype=torch.float32, generator=gen)
            .to(_full_dtype())
            for _ in range(3)]


def _ring_once(q, k, v, dout, causal: bool):
    """(out, (dq, dk, dv), fwd s, bwd s), each time the slowest rank's."""
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    _sync_barrier()
    start = time.perf_counter()
    out = ring_flash_attn_func(q, k, v, causal=causal)
    synchronize(_DEVICE)
    fwd = time.perf_counter() - start
    _sync_barrier()
    start = time.perf_counter()
    grads = torch.autograd.grad(out, (q, k, v), dout)
    synchronize(_DEVICE)
    bwd = time.perf_counter() - start
    return out, grads, _slowest(fwd), _slowest(bwd)


def run_ring(seqlen: int, causal: bool, nheads: int, headdim: int, rows: int, seed: int = 0) -> dict:
    """Ring attention forward+backward over a `seqlen`-token sequence: time, memory, and the
    sampled-row check."""
    rank, world = dist.get_rank(), dist.get_world_size()
    layout = "zigzag" if causal else "contiguous"
    positions = torch.cat([torch.arange(s, e) for s, e in shard_positions(seqlen, world, rank, layout)])
    gen = torch.Generator().manual_seed(seed + 1)  # the same sampled rows and dout rows on every rank
    sampled = torch.randperm(seqlen, generator=gen)[:rows].sort().values
    dout_rows = torch.randn(1, rows, nheads, headdim, generator=gen).to(_DEVICE, _full_dtype())
    # This rank's local indices of the sampled rows it holds.
    local_of = torch.full((seqlen,), -1, dtype=torch.long)
    local_of[positions] = torch.arange(positions.numel())
    mine = local_of[sampled] >= 0
    mine_local = local_of[sampled][mine].to(_DEVICE)

    full = _full_inputs(seqlen, nheads, headdim, seed)
    q, k, v = (shard_sequence(t, world, rank, layout).contiguous() for t in full)
    del full
    dout = torch.zeros_like(q)
    dout[:, mine_local] = dout_rows[:, mine.to(_DEVICE)]
    _reset_peak()
    out, (dq, dk, dv), fwd_s, bwd_s = _ring_once(q, k, v, dout, causal)
    peak = _largest_peak()
    del q, k, v, dout

    # The exact reference for every sampled row (all ranks compute it; each checks what it holds).
    full = _full_inputs(seqlen, nheads, headdim, seed)
    q_rows = full.pop(0)[:, sampled.to(_DEVICE)].float().requires_grad_()
    k32 = full.pop(0).float().requires_grad_()
    v32 = full.pop(0).float().requires_grad_()
    ref = sampled_rows_attention(q_rows, sampled.to(_DEVICE), k32, v32, seqlen, causal, headdim ** -0.5)
    rq, rk, rv = torch.autograd.grad(ref, (q_rows, k32, v32), dout_rows.float())
    local_keys = positions.to(_DEVICE)
    errors = torch.tensor([
        relative_error(out[:, mine_local], ref[:, mine.to(_DEVICE)]) if mine.any() else 0.0,
        relative_error(dq[:, mine_local], rq[:, mine.to(_DEVICE)]) if mine.any() else 0.0,
        relative_error(dk, rk[:, local_keys]), relative_error(dv, rv[:, local_keys])],
        device=_DEVICE, dtype=torch.float64)
    del ref, rq, rk, rv, k32, v32, q_rows, out, dq, dk, dv
    _reset_peak()
    dist.all_reduce(errors, op=dist.ReduceOp.MAX)
    fwd_flops = attention_flops(1, nheads, seqlen, headdim, causal, backward=False)
    total = attention_flops(1, nheads, seqlen, headdim, causal, backward=True)
    return {"seqlen": seqlen, "per_gpu_tokens": seqlen // world, "causal": causal, "layout": layout,
            "fwd_s": fwd_s, "bwd_s": bwd_s, "fwd_bwd_s": fwd_s + bwd_s, "peak_gib_per_gpu": peak,
            "tflops_per_gpu_fwd": tflops(fwd_flops / world, fwd_s * 1e3),
            "tflops_per_gpu_fwd_bwd": tflops(total / world, (fwd_s + bwd_s) * 1e3),
            "rows_checked": rows,
            "max_rel_error_vs_fp32": dict(zip(("out", "dq", "dk", "dv"), errors.tolist()))}


def _median_s(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        _sync_barrier()
        start = time.perf_counter()
        fn()
        synchronize(_DEVICE)
        times.append(_slowest(time.perf_counter() - start))
    return sorted(times)[len(times) // 2]


def run_baseline(seqlen: int, nheads: int, headdim: int, reps: int) -> dict:
    """The single-GPU kernel on every GPU at once, no communication."""
    q, k, v = (t.requires_grad_() for t in _full_inputs(seqlen, nheads, headdim, seed=5))
    dout = torch.randn_like(q)
    record = {"seqlen": seqlen}
    for causal in (False, True):
        def fwd():
            return flash_attn_func(q, k, v, causal=causal)

        def fwd_bwd():
            torch.autograd.grad(flash_attn_func(q, k, v, causal=causal), (q, k, v), dout)

        fwd_bwd()
        f, fb = _median_s(fwd, reps), _median_s(fwd_bwd, reps)
        name = "causal" if causal else "full"
        record[name] = {"fwd_s": f, "fwd_bwd_s": fb,
                        "tflops_fwd": tflops(attention_flops(1, nheads, seqlen, headdim, causal, False), f * 1e3),
                        "tflops_fwd_bwd": tflops(attention_flops(1, nheads, seqlen, headdim, causal, True), fb * 1e3)}
    return record


def run_overlap(per_gpu: int, causal: bool, nheads: int, headdim: int, reps: int) -> dict:
    """How much of the ring's communication hides under its compute, at per_gpu tokens per GPU."""
    world = dist.get_world_size()
    seqlen = per_gpu * world
    layout = "zigzag" if causal else "contiguous"
    q, k, v = (shard_sequence(t, world, dist.get_rank(), layout).contiguous().requires_grad_()
               for t in _full_inputs(seqlen, nheads, headdim, seed=9))
    dout = torch.randn_like(q)

    def fwd():
        return ring_flash_attn_func(q, k, v, causal=causal)

    def fwd_bwd():
        torch.autograd.grad(fwd(), (q, k, v), dout)

    fwd_bwd()
    ring_fwd, ring_fb = _median_s(fwd, reps), _median_s(fwd_bwd, reps)
    with _no_communication():
        fwd_bwd()
        compute_fwd, compute_fb = _median_s(fwd, reps), _median_s(fwd_bwd, reps)
    ring = ring_module._Ring(None)
    dkv = [torch.empty_like(k, dtype=torch.float32), torch.empty_like(v, dtype=torch.float32)]
    kv_s = _median_s(lambda: ring.finish(ring.start([k.detach(), v.detach()])), reps)
    dkv_s = _median_s(lambda: ring.finish(ring.start(dkv)), reps)
    # What the ring sends: forward, W-1 K/V hops; backward, W-1 K/V hops and W dK/dV hops (fp32).
    comm_fwd = (world - 1) * kv_s
    comm_fb = comm_fwd + (world - 1) * kv_s + world * dkv_s
    kv_bytes = 2 * k.numel() * k.element_size()

    def hidden(ring_s, compute_s, comm_s):
        return max(0.0, min(1.0, (compute_s + comm_s - ring_s) / comm_s)) if comm_s > 0 else None

    return {"per_gpu_tokens": per_gpu, "seqlen": seqlen, "causal": causal,
            "ring_fwd_s": ring_fwd, "ring_fwd_bwd_s": ring_fb,
            "compute_only_fwd_s": compute_fwd, "compute_only_fwd_bwd_s": compute_fb,
            "kv_exchange_s": kv_s, "dkv_exchange_s": dkv_s, "kv_exchange_gbps": kv_bytes / kv_s / 1e9,
            "communication_fwd_s": comm_fwd, "communication_fwd_bwd_s": comm_fb,
            "exposed_fwd_bwd_s": max(0.0, ring_fb - compute_fb),
            "hidden_fraction_fwd": hidden(ring_fwd, compute_fwd, comm_fwd),
            "hidden_fraction_fwd_bwd": hidden(ring_fb, compute_fb, comm_fb)}


def run_train_step(context: int, dim: int, depth: int, nheads: int, seed: int = 0) -> dict:
    """One context-parallel training step of a causal DNA LM over a `context`-token sequence
    (random ACGT), as `genoflash train --context-parallel` takes it."""
    from ..data import A_ID
    from ..models import DNALM, DNALMConfig

    torch.manual_seed(seed)  # the same initial weights on every rank
    model = DNALM(DNALMConfig(dim=dim, depth=depth, nheads=nheads, causal=True)).to(_DEVICE)
    cp = enable_context_parallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(seed)
    sequence = torch.randint(A_ID, A_ID + 4, (1, context + 1), generator=gen)

    def step(n: int) -> float:
        tokens = cp.shard(sequence[:, :n].to(_DEVICE))
        labels = cp.shard(sequence[:, 1:n + 1].to(_DEVICE))
        with torch.autocast(_DEVICE.type, dtype=torch.bfloat16, enabled=_DEVICE.type == "cuda"):
            logits = model(tokens)["logits"]
        loss = cp.mean_loss(logits, labels)
        loss.backward()
        cp.sum_gradients(model)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return cp.global_value(loss)

    step(min(context, 8192 * cp.world_size))  # compile at a small size
    _reset_peak()
    _sync_barrier()
    start = time.perf_counter()
    loss = step(context)
    synchronize(_DEVICE)
    seconds = _slowest(time.perf_counter() - start)
    return {"context_tokens": context, "per_gpu_tokens": context // cp.world_size, "dim": dim, "depth": depth,
            "nheads": nheads, "parameters": sum(p.numel() for p in model.parameters()), "loss": loss,
            "step_s": seconds, "tokens_per_s": context / seconds, "peak_gib_per_gpu": _largest_peak()}


def _host_description() -> dict:
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if _DEVICE.type == "cuda" else None
    info = {"world_size": dist.get_world_size(), "backend": dist.get_backend(), "nccl": nccl,
            "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                                   "NVSHMEM_DISABLE_NVLS")}}
    try:
        info["topology"] = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                                          timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        info["topology"] = None
    return info


def plot(report: dict, path: Path) -> None:
    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4.2))
    base = report.get("baseline") or {}
    world = report["host"]["world_size"]
    for ax, part in zip(axes, ("weak", "strong")):
        runs = report.get(part) or []
        for causal, color in ((False, "C0"), (True, "C1")):
            mine = [r for r in runs if r["causal"] == causal]
            if not mine:
                continue
            labels = [f"{r['seqlen'] / 2**20:g}M" for r in mine]
            ax.bar([i + (0.4 if causal else 0) for i in range(len(mine))], [r["tflops_per_gpu_fwd_bwd"] for r in mine],
                   width=0.4, color=color, label=f"{world} GPUs, {'causal' if causal else 'non-causal'}")
            ax.set_xticks([i + 0.2 for i in range(len(mine))], labels)
            name = "causal" if causal else "full"
            if name in base:
                ax.axhline(base[name]["tflops_fwd_bwd"], color=color, ls="--", lw=1,
                           label=f"1 GPU kernel, {base['seqlen'] // 1024}k {'causal' if causal else 'non-causal'}")
        ax.set_title(f"{part} scaling" + (" (1 sequence of the length shown)" if part == "strong" else
                                          " (tokens per GPU fixed)"), fontsize=9)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("fwd+bwd TF/s per GPU")
        if runs:
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"ring attention, H=8 D=128 bf16, on {world}x {title_stamp(report['metadata'])}", fontsize=10)
    save_figure(fig, path)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="genoflash bench ring", description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help="which parts, run in the order given")
    parser.add_argument("--nheads", type=int, default=8)
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--baseline", type=int, default=1 << 18, help="single-GPU kernel tokens")
    parser.add_argument("--overlap", default="65536,262144", help="tokens per GPU")
    parser.add_argument("--weak", default=str(1 << 20), help="tokens per GPU")
    parser.add_argument("--strong", default=str(1 << 22), help="sequence tokens")
    parser.add_argument("--causal", default="both", choices=["both", "causal", "full"],
                        help="weak and strong: which masks")
    parser.add_argument("--strong-causal", default=None, choices=["both", "causal", "full"],
                        help="strong scaling's masks (default: --causal)")
    parser.add_argument("--rows", type=int, default=128, help="sampled query rows checked")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--train-context", type=int, default=1 << 21)
    parser.add_argument("--train-dim", type=int, default=256)
    parser.add_argument("--train-depth", type=int, default=2)
    parser.add_argument("--train-nheads", type=int, default=4)
    parser.add_argument("--tag", default="", help="suffix of the results file name")
    parser.add_argument("--cpu", action="store_true", help="gloo ranks on the CPU at tiny sizes (tests)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if not dist.is_initialized() and ("RANK" not in os.environ or not (args.cpu or torch.cuda.is_available())):
        print("genoflash bench ring runs under torchrun on CUDA GPUs: "
              "torchrun --nproc-per-node N -m genoflash.cli bench ring", flush=True)
        return 2
    parts = [p for p in args.parts.split(",") if p]
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}; choose from {PARTS}")
    global _DEVICE
    owns_group = not dist.is_initialized()
    if args.cpu:
        _DEVICE = torch.device("cpu")
        if owns_group:
            dist.init_process_group("gloo")
    else:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        _DEVICE = torch.device("cuda", local_rank)
        if owns_group:
            dist.init_process_group("nccl", device_id=_DEVICE)
    rank, world = dist.get_rank(), dist.get_world_size()
    report = {"nheads": args.nheads, "headdim": args.headdim, "dtype": "bfloat16", "batch": 1,
              "host": _host_description(),
              "metadata": run_metadata(_DEVICE, world_size=world)}
    stem = results_stem(args.out, report["metadata"], f"ring-x{world}{args.tag}") if rank == 0 else None

    def say(message: str) -> None:
        if rank == 0:
            print(message, flush=True)

    def save() -> None:
        if rank == 0:
            write_json(Path(f"{stem}.json"), report)
            try:
                plot(report, Path(f"{stem}.png"))
            except Exception as e:  # a plot must not lose the numbers
                print(f"plot failed: {e}", flush=True)

    masks = {"both": (False, True), "causal": (True,), "full": (False,)}
    say(f"ring bench: {world} ranks, parts {parts}, nccl {report['host']['nccl']}")
    # Compile every kernel the ring launches (local causal blocks, half-length blocks) at a small size.
    for causal in (False, True):
        run_ring((16 if args.cpu else 8192) * world, causal, args.nheads, args.headdim, rows=8)
    say("compiled")
    try:
        for part in parts:  # in the order given, each saved as it finishes
            if part == "baseline":
                report["baseline"] = run_baseline(args.baseline, args.nheads, args.headdim, args.reps)
                say(f"baseline {json.dumps(report['baseline'])}")
            elif part == "overlap":
                report["overlap"] = []
                for per_gpu in _ints(args.overlap):
                    for causal in (False, True):
                        report["overlap"].append(run_overlap(per_gpu, causal, args.nheads, args.headdim, args.reps))
                        say(f"overlap {json.dumps(report['overlap'][-1])}")
                        save()
            elif part in ("weak", "strong"):
                sizes, which = (args.weak, args.causal) if part == "weak" else (args.strong,
                                                                               args.strong_causal or args.causal)
                report[part] = []
                for n in _ints(sizes):
                    for causal in masks[which]:
                        seqlen = n * world if part == "weak" else n
                        record = run_ring(seqlen, causal, args.nheads, args.headdim, args.rows)
                        base = (report.get("baseline") or {}).get("causal" if causal else "full")
                        if base:
                            record["efficiency_vs_one_gpu_kernel"] = (record["tflops_per_gpu_fwd_bwd"]
                                                                      / base["tflops_fwd_bwd"])
                        report[part].append(record)
                        say(f"{part} {json.dumps(record)}")
                        save()
            elif part == "train" and args.train_context:
                report["train"] = run_train_step(args.train_context, args.train_dim, args.train_depth,
                                                 args.train_nheads)
                say(f"train {json.dumps(report['train'])}")
            save()
        dist.barrier()  # every rank done before any rank tears its group down
    finally:
        save()
        if rank == 0:
            print(f"wrote {stem}.json", flush=True)
        if owns_group:
            dist.destroy_process_group()
    return 0
