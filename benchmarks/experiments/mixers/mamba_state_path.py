"""Probe (cited by docs/design/mixer-comparison.md): how strong Mamba's state path is at
initialisation, and whether strengthening it lets the demo's BiMamba bridge a gap it does not.

    python benchmarks/experiments/mixers/mamba_state_path.py ratio
    python benchmarks/experiments/mixers/mamba_state_path.py demo [genoflash demo arguments]
    python benchmarks/experiments/mixers/mamba_state_path.py demo-published [genoflash demo arguments]
    python benchmarks/experiments/mixers/mamba_state_path.py recall [LAG] [--steps S] [--published] [--json PATH]
    python benchmarks/experiments/mixers/mamba_state_path.py lag [--bc]

`ratio`: one Mamba block (d_model 128, d_state 16) on RMS-normed random input (batch 4, 200
positions), its output split into the state path's part (C . h) and the skip's (D . x), as
Frobenius norms, with mamba-ssm's initialisation (nn.Linear's default) and with N(0, 0.02) for
every Linear but dt_proj (the DNA LM's until 2026-12-06, when it took mamba-ssm's). Written from
the paper's recurrence, step by step.

`demo`: `genoflash demo` with every Mamba block's in_proj and x_proj at nn.Linear's default
initialisation and x_proj's B and C rows times 3 (a state path ~10x stronger at step 0).

`demo-published`: `genoflash demo` with every Mamba block at the published Mamba-1 initialisation
(mamba-ssm's Mamba with MambaLMHeadModel's _init_weights): in_proj and x_proj at nn.Linear's
default, out_proj at nn.Linear's default divided by sqrt(2 x depth) (two residual branches per
block here: mixer and feed-forward); dt_proj, A_log, D and the conv as Mamba builds them.
`--bc-scale S` (first, before the demo's arguments) then multiplies x_proj's B and C rows by S:
the state path's share of the output (and its dependence on inputs past the conv) S^2 x the
published one's at step 0.

`recall`: one Mamba block (d_model 64, its own initialisation, which is mamba-ssm's) between an
embedding and a head, trained with Adam at 3e-3 to name, at the last position, the token LAG
(default 16) positions back, among 4 (chance: accuracy 0.25, loss 1.386); S (default 400)
steps of 64 sequences of LAG + 4 tokens. Every 100 steps it prints the training batch's loss
and accuracy and the accuracy on 1,024 held-out sequences. `--published` runs the same weights
through `published_mamba` instead (the block written from the paper's equations, step by step:
no genoflash op), as a check that the curve is the equations' and not the implementation's.

`lag`: how strongly the first mixer of the distance-80 demo's classifier (dim 128, 176 positions)
depends, at initialisation, on its input k positions back: ||d y_t / d u_{t-k}||_F for random
unit-variance probe directions, averaged over t in [88, 96) (2 probes each), for BiMamba with the
N(0, 0.02) initialisation (the DNA LM's until 2026-12-06) and the published one, and Hyena; `--bc`
instead for the published one with x_proj's B and C rows x3, x10 and x30. Prints one JSON object.
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


def published_mamba(m, u: torch.Tensor) -> torch.Tensor:
    """Mamba-1's block (Gu & Dao 2023, Algorithm 2 and section 3.6) on m's parameters, written
    from the equations with plain tensor ops, one step at a time: in_proj to x and z; causal
    depthwise conv1d (d_conv taps, the first d_conv - 1 positions seeing zeros) and SiLU;
    x_proj to (dt, B, C); dt = softplus(dt_proj(dt)); h_t = exp(dt A) h_{t-1} + dt B x_t with
    A = -exp(A_log); y_t = C_t . h_t + D x_t; out_proj(y * silu(z))."""
    batch, seqlen, _ = u.shape
    xz = F.linear(u, m.in_proj.weight, m.in_proj.bias)
    x, z = xz[..., :m.d_inner], xz[..., m.d_inner:]
    w = m.conv1d.weight[:, 0, :]  # (d_inner, d_conv); tap j reads position t - (d_conv - 1) + j
    conv = []
    for t in range(seqlen):
        acc = m.conv1d.bias.expand(batch, -1) if m.conv1d.bias is not None else x.new_zeros(batch, m.d_inner)
        for j in range(m.d_conv):
            if t - (m.d_conv - 1) + j >= 0:
                acc = acc + w[:, j] * x[:, t - (m.d_conv - 1) + j]
        conv.append(acc)
    x = F.silu(torch.stack(conv, 1))
    x_dbl = F.linear(x, m.x_proj.weight)
    dt, B, C = x_dbl[..., :m.dt_rank], x_dbl[..., m.dt_rank:m.dt_rank + m.d_state], x_dbl[..., m.dt_rank + m.d_state:]
    dt = F.softplus(F.linear(dt, m.dt_proj.weight, m.dt_proj.bias))
    A = -torch.exp(m.A_log)
    h = x.new_zeros(batch, m.d_inner, m.d_state)
    ys = []
    for t in range(seqlen):
        h = torch.exp(dt[:, t, :, None] * A) * h + dt[:, t, :, None] * B[:, t, None, :] * x[:, t, :, None]
        ys.append((h * C[:, t, None, :]).sum(-1) + m.D * x[:, t])
    return F.linear(torch.stack(ys, 1) * F.silu(z), m.out_proj.weight, m.out_proj.bias)


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
    print("N(0, 0.02) init: |C.h| %.3g, |D.x| %.3g" % state_and_skip(m, u))


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


def demo_published(argv: list[str]) -> int:


    from genoflash.train import demo as demo_cli, trainer

    build = trainer.build_model

    bc_scale = 1.0
    if argv[:1] == ["--bc-scale"]:
        bc_scale, argv = float(argv[1]), argv[2:]

    def build_published(cfg):
        model = build(cfg)
        _published_init(model, cfg.depth, bc_scale)
        return model

    trainer.build_model = build_published
    return demo_cli.main(argv)


def _published_init(model, depth: int, bc_scale: float = 1.0) -> None:
    """Every Mamba block of model at the published Mamba-1 initialisation (demo-published's),
    x_proj's B and C rows times bc_scale."""
    import math

    from torch import nn

    from genoflash.layers.mamba import Mamba

    for m in model.modules():
        if isinstance(m, Mamba):
            m.in_proj.reset_parameters()
            m.x_proj.reset_parameters()
            nn.init.kaiming_uniform_(m.out_proj.weight, a=math.sqrt(5))
            with torch.no_grad():
                m.out_proj.weight /= math.sqrt(2 * depth)
                m.x_proj.weight[m.dt_rank:] *= bc_scale


def lag_dependence(bc: bool) -> dict:
    from genoflash.train import trainer
    from genoflash.train.config import TrainConfig

    torch.set_num_threads(1)
    seqlen, dim, lags = 176, 128, [0, 1, 2, 3, 4, 8, 16, 24, 32, 48, 64, 80]
    cases = ([(f"BiMamba, published init, B,C x{s:g}", "M", s) for s in (3, 10, 30)] if bc else
             [("BiMamba, N(0, 0.02) init", "M", 0.0), ("BiMamba, published init", "M", 1.0), ("Hyena", "H", None)])
    torch.manual_seed(1)
    u0 = torch.randn(1, seqlen, dim)
    u0 = u0 / u0.pow(2).mean(-1, keepdim=True).sqrt()
    result = {}
    for name, letter, bc_scale in cases:
        cfg = TrainConfig(task="synthetic", depth=2, nheads=4, dim=dim, seq_len=seqlen, distance=80, sites=4,
                          spacer=0, margin=16, layer_pattern=letter)
        torch.manual_seed(0)
        model = trainer.build_model(cfg)
        if bc_scale == 0.0:  # the N(0, 0.02) case: every Mamba Linear but dt_proj redrawn
            from genoflash.layers.mamba import Mamba
            from genoflash.models.dna_lm import _init_weights
            for m in (m for m in model.modules() if isinstance(m, Mamba)):
                for name, sub in m.named_modules():
                    if not name.endswith("dt_proj"):
                        _init_weights(sub)
        elif bc_scale is not None:
            _published_init(model, cfg.depth, bc_scale)
        mixer = model.trunk.blocks[0].mixer
        sq, n = torch.zeros(len(lags)), 0
        for t in range(88, 96):
            for probe in range(2):
                u = u0.clone().requires_grad_()
                r = torch.randn(dim, generator=torch.Generator().manual_seed(100 * t + probe))
                g, = torch.autograd.grad((mixer(u)[0, t] * r).sum(), u)
                sq += torch.stack([g[0, t - k].pow(2).sum() for k in lags])
                n += 1
        result[name] = {str(k): round(v, 6) for k, v in zip(lags, (sq / n).sqrt().tolist())}
    return result


def recall(lag: int, steps: int = 400, published: bool = False) -> list[dict]:
    from torch import nn

    from genoflash.layers.mamba import Mamba

    torch.manual_seed(0)
    dim, vocab, seqlen = 64, 4, lag + 4
    embed, norm, mixer, head = nn.Embedding(vocab, dim), nn.LayerNorm(dim), Mamba(dim), nn.Linear(dim, vocab)
    mix = (lambda v: published_mamba(mixer, v)) if published else mixer
    params = [p for m in (embed, norm, mixer, head) for p in m.parameters()]
    opt = torch.optim.Adam(params, 3e-3)
    held_out = torch.randint(0, vocab, (1024, seqlen), generator=torch.Generator().manual_seed(1))
    curve = []
    for step in range(steps):
        x = torch.randint(0, vocab, (64, seqlen))
        h = embed(x)
        logits = head(h + mix(norm(h)))[:, -1]
        loss = F.cross_entropy(logits, x[:, -1 - lag])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 99:
            acc = (logits.argmax(-1) == x[:, -1 - lag]).float().mean().item()
            with torch.no_grad():
                h = embed(held_out)
                held = (head(h + mix(norm(h)))[:, -1].argmax(-1) == held_out[:, -1 - lag]).float().mean().item()
            curve.append(dict(step=step + 1, loss=round(loss.item(), 4), accuracy=round(acc, 4),
                              held_out_accuracy=round(held, 4)))
            print(f"step {step + 1}: loss {loss.item():.3f}, accuracy {acc:.3f}, held-out accuracy {held:.3f}",
                  flush=True)
    return curve


if __name__ == "__main__":
    if sys.argv[1:2] == ["ratio"]:
        ratio()
    elif sys.argv[1:2] == ["demo"]:
        sys.exit(demo(sys.argv[2:]))
    elif sys.argv[1:2] == ["demo-published"]:
        sys.exit(demo_published(sys.argv[2:]))
    elif sys.argv[1:2] == ["recall"]:
        import argparse
        import json

        parser = argparse.ArgumentParser(prog="mamba_state_path.py recall")
        parser.add_argument("lag", type=int, nargs="?", default=16)
        parser.add_argument("--steps", type=int, default=400)
        parser.add_argument("--published", action="store_true")
        parser.add_argument("--json", help="write the curve here")
        args = parser.parse_args(sys.argv[2:])
        result = recall(args.lag, args.steps, args.published)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(vars(args), curve=result), f, indent=1)
    elif sys.argv[1:2] == ["lag"]:
        import json

        print(json.dumps(lag_dependence("--bc" in sys.argv[2:]), indent=1))
    else:
        sys.exit(__doc__)
