"""genoflash's host time per attention call, two source trees side by side, on a machine without a GPU.

Each tree runs in its own process (this script re-runs itself with the tree first on sys.path),
with launches compile-only and then stubbed as in attention_host_cpu_probe.py, and reports the
minimum over repeats of 100 calls: on a shared 2-core machine the minimum is what separates two
trees, the mean mostly measures the neighbours. Make the baseline tree with
`git worktree add /tmp/base REV`.

    python benchmarks/attention_host_cpu_ab.py /tmp/base . [--rounds 2 --causal --headdim 64]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import timeit


def run_tree(tree: str, args) -> None:
    tree = os.path.abspath(tree)
    sys.path[:0] = [tree, os.path.join(tree, "benchmarks")]
    import offline_compile as oc  # sets the offline-compile environment first

    import torch
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    driver.set_active(oc._Sm90Driver())
    JITFunction.run = oc._compile_only
    CompiledKernel.__getitem__ = lambda self, grid: (lambda *a, **kw: None)  # nothing launches
    import genoflash
    from genoflash.backends import use_backend
    from genoflash.ops.attention import backward, forward
    from genoflash.ops.attention.args import AttentionArgs

    assert genoflash.__file__.startswith(tree), genoflash.__file__
    oc.stand_in_for_sm90()
    os.environ["GENOFLASH_FAST_LAUNCH"] = "1"
    b, h, n, d = args.batch, args.nheads, args.seqlen, args.headdim
    q, k, v = (torch.randn(b, n, h, d, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(b, n, h, d, dtype=torch.bfloat16)
    qd, kd, vd = (t.detach() for t in (q, k, v))
    a = AttentionArgs(d ** -0.5, -1, 0 if args.causal else -1)
    with use_backend("triton"):
        out, lse = forward.attention_forward(qd, kd, vd, a)
        calls = {
            "fwd+bwd (autograd)": lambda: torch.autograd.grad(
                genoflash.flash_attn_func(q, k, v, causal=args.causal), (q, k, v), dout),
            "attention_forward": lambda: forward.attention_forward(qd, kd, vd, a),
            "attention_backward": lambda: backward.attention_backward(dout, qd, kd, vd, out, lse, a),
        }
        for fn in calls.values():  # compile, then fill the fast path's cache
            fn()
            fn()
        class Floor(torch.autograd.Function):
            """autograd's own cost for a Function of the same shape (3 inputs, out and lse, 5 saved
            tensors), with genoflash's work replaced by the allocations alone."""

            @staticmethod
            def forward(ctx, q_, k_, v_):
                o, m = torch.empty_like(q_), torch.empty_like(lse)
                ctx.save_for_backward(q_, k_, v_, o, m)
                ctx.mark_non_differentiable(m)
                return o, m

            @staticmethod
            def backward(ctx, do, _dm):
                q_, k_, v_, _, _ = ctx.saved_tensors
                return torch.empty_like(q_), torch.empty_like(k_), torch.empty_like(v_)

        calls["autograd floor"] = lambda: torch.autograd.grad(Floor.apply(q, k, v)[0], (q, k, v), dout)
        for name, fn in calls.items():
            best = min(timeit.repeat(fn, number=100, repeat=args.repeats)) / 100 * 1e6
            print(f"{os.path.basename(tree) or tree:12s} {name:20s} {best:7.1f} us (min of {args.repeats} x 100)",
                  flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the trees, so drift shows")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--nheads", type=int, default=32)
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--headdim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        run_tree(args.trees[0], args)
        return
    passthrough = [a for a in sys.argv[1:] if a not in args.trees]
    for _ in range(args.rounds):
        for tree in args.trees:
            subprocess.run([sys.executable, __file__, tree, "--_child", *passthrough], check=True)


if __name__ == "__main__":
    main()
