"""Mamba (Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces")
and a bidirectional wrapper as Caduceus's BiMamba (Schiff et al. 2024), as nn.Modules.

The Mamba-1 block:
    x, z = split(in_proj(u))
    x = silu(causal depthwise conv1d(x))
    dt, B, C = split(x_proj(x));  dt = dt_proj(dt)                       (input-dependent)
    y = selective_scan(x, dt, A = -exp(A_log), B, C, D, z, dt_bias, softplus)
    out = out_proj(y)
The scan is `genoflash.ops.mamba.selective_scan_fn` (Triton, chunked over the sequence).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.mamba import scan_channels_first, selective_scan_fn


class Mamba(nn.Module):
    """(batch, seqlen, d_model) -> (batch, seqlen, d_model); causal: output t sees inputs 0..t.

    Args:
        d_state: state size N per channel; d_conv: causal conv width; expand: inner width
            d_inner = expand * d_model; dt_rank: rank of the dt projection ("auto": ceil(d_model/16)).
        dt_min, dt_max: the initial step sizes are log-uniform in [dt_min, dt_max] (through
            the bias of dt_proj, inverse-softplus'd), as in mamba-ssm.
    """

    def __init__(self, d_model: int, d_state: int = 16, d_conv: int = 4, expand: int = 2, dt_rank="auto",
                 dt_min: float = 0.001, dt_max: float = 0.1, dt_init_floor: float = 1e-4, bias: bool = False,
                 conv_bias: bool = True):
        super().__init__()
        for name, value in (("d_model", d_model), ("d_state", d_state), ("d_conv", d_conv), ("expand", expand)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.d_model, self.d_state, self.d_conv = d_model, d_state, d_conv
        self.d_inner = expand * d_model
        self.dt_rank = math.ceil(d_model / 16) if dt_rank == "auto" else int(dt_rank)
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner, bias=bias)
        self.conv1d = nn.Conv1d(self.d_inner, self.d_inner, d_conv, groups=self.d_inner, padding=d_conv - 1,
                                bias=conv_bias)
        self.x_proj = nn.Linear(self.d_inner, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, self.d_inner, bias=True)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=bias)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1, dtype=torch.float32)).repeat(self.d_inner, 1))
        self.D = nn.Parameter(torch.ones(self.d_inner))
        self.reset_dt(dt_min, dt_max, dt_init_floor)

    @torch.no_grad()
    def reset_dt(self, dt_min: float = 0.001, dt_max: float = 0.1, dt_init_floor: float = 1e-4) -> None:
        """dt_proj: weights U(+-dt_rank^-0.5), bias = softplus^-1(dt) with dt log-uniform in [dt_min, dt_max]."""
        std = self.dt_rank ** -0.5
        nn.init.uniform_(self.dt_proj.weight, -std, std)
        dt = torch.exp(torch.rand(self.d_inner) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=dt_init_floor)
        self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse of softplus

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        if u.dim() != 3 or u.shape[-1] != self.d_model:
            raise ValueError(f"expected input (batch, seqlen, {self.d_model}), got shape {tuple(u.shape)}")
        seqlen = u.shape[1]
        # Padding d_conv - 1 on both sides and keeping the first seqlen outputs: causal.
        channels_first = scan_channels_first.ENABLED
        if channels_first:
            # (batch, dim, seqlen) activations for the scan's state-loop kernels, which need time
            # contiguous (ops/mamba/scan_channels_first.py): in_proj and dt_proj computed
            # transposed, as mamba-ssm does; x, z and dt reach the scan as (batch, seqlen, dim)
            # views of that memory.
            xz = torch.matmul(self.in_proj.weight, u.transpose(1, 2))
            if self.in_proj.bias is not None:
                xz = xz + self.in_proj.bias[:, None]
            x, z = xz[:, :self.d_inner], xz[:, self.d_inner:].transpose(1, 2)
            x = F.silu(self.conv1d(x)[..., :seqlen]).transpose(1, 2)
        else:
            x, z = self.in_proj(u).chunk(2, dim=-1)
            x = F.silu(self.conv1d(x.transpose(1, 2))[..., :seqlen].transpose(1, 2))
        dt, B, C = self.x_proj(x).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        # The bias goes in as delta_bias, inside the softplus.
        if channels_first:
            dt = torch.matmul(self.dt_proj.weight, dt.transpose(1, 2)).transpose(1, 2)
        else:
            dt = F.linear(dt, self.dt_proj.weight)
        A = -torch.exp(self.A_log.float())
        y = selective_scan_fn(x, dt, A, B, C, D=self.D.float(), z=z, delta_bias=self.dt_proj.bias.float(),
                              delta_softplus=True)
        return self.out_proj(y)


class BiMamba(nn.Module):
    """Bidirectional Mamba: one Mamba reads the sequence forwards, another (or the same, with
    shared=True) reads it backwards; their outputs are added. Output t sees every position."""

    def __init__(self, d_model: int, shared: bool = False, **mamba_kwargs):
        super().__init__()
        self.forward_mamba = Mamba(d_model, **mamba_kwargs)
        self.backward_mamba = self.forward_mamba if shared else Mamba(d_model, **mamba_kwargs)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return self.forward_mamba(u) + self.backward_mamba(u.flip(1)).flip(1)
