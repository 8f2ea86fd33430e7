"""Probe (cited by docs/design/mixer-comparison.md): how strong Mamba's state path is at
initialisation, and whether strengthening it lets the demo's BiMamba bridge a gap it does not.

    python benchmarks/experiments/mixers/mamba_state_path.py ratio
    python benchmarks/experiments/mixers/mamba_state_path.py demo [genoflash demo arguments]
    python benchmarks/experiments/mixers/mamba_state_path.py recall [LAG]

`ratio`: one Mamba block (d_model 128, d_state 16) on RMS-normed random input (batch 4, 200
positions), its output split into the state path's part (C . h) and the skip's (D . x), as
Frobenius norms, with mamba-ssm's initialisation (nn.Linear's default) and with the DNA LM's
(N(0, 0.02) for every Linear but dt_proj). Written from the paper's recurrence, step by step.

`demo`: `genoflash demo` with every Mamba block's in_proj and x_proj at nn.Linear's default
initialisation and x_proj's B and C rows times 3 (a state path ~10x stronger at step 0).

`recall`: one Mamba block (d_model 64, its own initialisation) between an embedding and a head,
trained with Adam at 3e-3 to name, at the last position, the token LAG (default 16) positions
back, among 4 (chance: accuracy 0.25, loss 1.386); 400 steps of 64 sequences of LAG + 4 tokens.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F


def state_and_skip(m, u: torch.Tensor) -> tuple[float, float]:
    with torch.no_grad():
        seqlen = u.shape[1]
        x, _ = (u @ m.in_proj.weight.T).chunk(2, -1)
        x = F.silu(F.conv1d(x.transpose(1, 2), m.conv1d.weight, m.conv1d.bias, padding=m.d_conv - 1,
                            groups=m.d_inner)[..., :seqlen]).transpose(1, 2)
        dt, B, C = (x @ m.x_proj.weight.T).split([m.dt_rank, m.d_state, m.d_state], -1)
        dt = F.softplus(dt @ m.dt_proj.weight.T + m.dt_proj.bias)
        A = -torch.exp(m.A_log)
        h = torch.zeros(u.shape[0], m.d_inner, m.d_state)
        state = []
        for t in range(seqlen):
            h = torch.exp(dt[:, t, :, None] * A) * h + dt[:, t, :, None] * B[:, t, None, :] * x[:, t, :, None]
            state.append((h * C[:, t, None, :]).sum(-1))
        return torch.stack(state, 1).norm().item(), (m.D * x).norm().item()


def ratio() -> None:
    from genoflash.layers.mamba import Mamba
    from genoflash.models.dna_lm import _init_weights

    torch.manual_seed(0)
    u = torch.randn(4, 200, 128)
    u = u / u.pow(2).mean(-1, keepdim=True).sqrt()  # RMS-normed, as a pre-norm block gives it
    m = Mamba(128)
    print("mamba-ssm's init: |C.h| %.3g, |D.x| %.3g" % state_and_skip(m, u))
    for name, module in m.named_modules():
        if not name.endswith("dt_proj"):
            _init_weights(module)
    print("the DNA LM's init: |C.h| %.3g, |D.x| %.3g" % state_and_skip(m, u))


def demo(argv: list[str]) -> int:
    from genoflash.layers.mamba import Mamba
    from genoflash.train import demo as demo_cli, trainer

    build = trainer.build_model

    def build_with_stronger_state(cfg):
        model = build(cfg)
        for m in model.modules():
            if isinstance(m, Mamba):
                m.in_proj.reset_parameters()
                m.x_proj.reset_parameters()
                with torch.no_grad():
                    m.x_proj.weight[m.dt_rank:] *= 3.0
        return model

    trainer.build_model = build_with_stronger_state
    return demo_cli.main(argv)


def recall(lag: int) -> None:
    from torch import nn

    from genoflash.layers.mamba import Mamba

    torch.manual_seed(0)
    dim, vocab, seqlen = 64, 4, lag + 4
    embed, norm, mixer, head = nn.Embedding(vocab, dim), nn.LayerNorm(dim), Mamba(dim), nn.Linear(dim, vocab)
    params = [p for m in (embed, norm, mixer, head) for p in m.parameters()]
    opt = torch.optim.Adam(params, 3e-3)
    for step in range(400):
        x = torch.randint(0, vocab, (64, seqlen))
        h = embed(x)
        logits = head(h + mixer(norm(h)))[:, -1]
        loss = F.cross_entropy(logits, x[:, -1 - lag])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 99:
            acc = (logits.argmax(-1) == x[:, -1 - lag]).float().mean().item()
            print(f"step {step + 1}: loss {loss.item():.3f}, accuracy {acc:.3f}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["ratio"]:
        ratio()
    elif sys.argv[1:2] == ["demo"]:
        sys.exit(demo(sys.argv[2:]))
    elif sys.argv[1:2] == ["recall"]:
        recall(int(sys.argv[2]) if len(sys.argv) > 2 else 16)
    else:
        sys.exit(__doc__)
