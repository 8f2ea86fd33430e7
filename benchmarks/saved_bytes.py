"""Count what a layer keeps for its backward, per token, on any machine (CPU included).

Runs one forward of a genoflash layer under `torch.autograd.graph.saved_tensors_hooks` and sums
the bytes of every storage the autograd graph keeps, other than the input and the parameters.
That is the part of the training peak that grows with N. The Triton kernels run under the
interpreter on a CPU, so this works without a GPU. The GPU peak adds the backward's transients
on top.

    python benchmarks/saved_bytes.py mamba --d-model 256 --seqlen 256 --out X.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess

if not __import__("torch").cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import genoflash  # noqa: E402


def saved_bytes(layer: torch.nn.Module, x: torch.Tensor) -> int:
    own = {p.untyped_storage().data_ptr() for p in layer.parameters()} | {x.untyped_storage().data_ptr()}
    kept: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in own:
            kept[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    return sum(kept.values())


def main() -> None:
    from genoflash.layers import HyenaOperator, Mamba
    ap = argparse.ArgumentParser()
    ap.add_argument("layer", choices=["mamba", "hyena"])
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--seqlen", type=int, default=256)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, args.dtype)
    layer = (Mamba(args.d_model) if args.layer == "mamba" else HyenaOperator(args.d_model, args.seqlen))
    layer = layer.to(device, dtype)
    x = torch.randn(1, args.seqlen, args.d_model, device=device, dtype=dtype, requires_grad=True)
    with genoflash.use_backend("triton"):
        total = saved_bytes(layer, x)
    commit = os.environ.get("GENOFLASH_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    row = dict(layer=args.layer, d_model=args.d_model, seqlen=args.seqlen, dtype=args.dtype, device=device,
               commit=commit, date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               torch=torch.__version__, saved_bytes=total, bytes_per_token=total / args.seqlen)
    print(json.dumps(row))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
