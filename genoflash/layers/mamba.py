"""Mamba (Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces")
and a bidirectional wrapper as Caduceus's BiMamba (Schiff et al. 2024), as nn.Modules.

The Mamba-1 block:
    x, z = split(in_proj(u))
    x = silu(causal depthwise conv1d(x))
    dt, B, C = split(x_proj(x));  dt = dt_proj(dt)                       (input-dependent)
    y = selective_scan(x, dt, A = -exp(A_log), B, C, D, z, dt_bias, softplus)
    out = out_proj(y)
The scan is `genoflash.ops.mamba.selective_scan_fn` (Triton); the conv and SiLU are one Triton
pass (`genoflash.ops.common.short_conv`, shared with the Hyena operator), as is the causal-conv1d
package's for mamba-ssm.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.common.projection import (autocast_operands, project_from_channels_first, project_to_channels_first,
                                    project_within_channels_first)
from ..ops.common.short_conv import depthwise_conv1d
from ..ops.mamba import selective_scan_fn


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
        # The decay rates and the skip are kept out of weight decay, as mamba-ssm does
        # (genoflash.train.optim.no_decay_names reads the mark).
        self.A_log._no_weight_decay = True
        self.D._no_weight_decay = True
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
        A = -torch.exp(self.A_log.float())
        scan_args = dict(D=self.D.float(), delta_bias=self.dt_proj.bias.float(), delta_softplus=True)
        # (batch, channels, seqlen) activations from in_proj to out_proj, as mamba-ssm keeps them:
        # the scan's state-loop backward needs time contiguous (ops/mamba/backward_channels_first.py),
        # and so does the causal conv. The projections read and write across the layout boundary
        # in the matmuls themselves (ops/common/projection.py: no transpose kernel), and every
        # gradient comes back in its tensor's own layout. At a million tokens the same layer on
        # torch.matmul of transposed views and nn.Conv1d spent 43 of its 151 ms in strided copies
        # (docs/design/mamba-scan.md).
        xz = project_to_channels_first(*autocast_operands(u, self.in_proj.weight))
        if self.in_proj.bias is not None:
            xz = xz + self.in_proj.bias.to(xz.dtype)[:, None]
        # split, not two slices: its backward is one cat of dx and dz, where each slice's would
        # zero-fill a buffer the size of xz and copy its part in.
        x, z = xz.split(self.d_inner, dim=1)
        # Causal depthwise conv and SiLU in one pass (left = d_conv - 1 positions of padding).
        x = depthwise_conv1d(x, self.conv1d.weight.flatten(1), self.conv1d.bias, self.d_conv - 1, activation="silu")
        x_dbl = project_within_channels_first(*autocast_operands(self.x_proj.weight, x))
        dt, B, C = x_dbl.split([self.dt_rank, self.d_state, self.d_state], dim=1)
        dt = project_within_channels_first(*autocast_operands(self.dt_proj.weight, dt))  # its bias: delta_bias
        # (batch, seqlen, dim) views of channels-first memory: what selective_scan_fn's state-loop
        # kernels take (its output is channels-first too).
        y = selective_scan_fn(x.transpose(1, 2), dt.transpose(1, 2), A, B.transpose(1, 2), C.transpose(1, 2),
                              z=z.transpose(1, 2), **scan_args)
        return project_from_channels_first(*autocast_operands(y.transpose(1, 2), self.out_proj.weight,
                                                              self.out_proj.bias))

    def forward_reference(self, u: torch.Tensor) -> torch.Tensor:
        """The same block written with the plain modules on (batch, seqlen, dim) activations
        (nn.Linear, nn.Conv1d, F.silu), as mamba-ssm's reference path reads: what `forward`
        computes, for tests and readers."""
        A = -torch.exp(self.A_log.float())
        scan_args = dict(D=self.D.float(), delta_bias=self.dt_proj.bias.float(), delta_softplus=True)
        seqlen = u.shape[1]
        x, z = self.in_proj(u).chunk(2, dim=-1)
        # Padding d_conv - 1 on both sides and keeping the first seqlen outputs: causal.
        x = F.silu(self.conv1d(x.transpose(1, 2))[..., :seqlen].transpose(1, 2))
        dt, B, C = self.x_proj(x).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        dt = F.linear(dt, self.dt_proj.weight)  # the bias goes in as delta_bias, inside the softplus
        y = selective_scan_fn(x, dt, A, B, C, z=z, **scan_args)
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
