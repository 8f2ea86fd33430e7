"""Kernel launches that step down the pipeline depth when a tiling does not fit on chip.

configs.py holds the measured best tiling per shape and feature set. Some feature
combinations (RoPE tables, the dropout mask's word shuffle, wide heads) take extra shared
memory, and Triton only learns a kernel's shared-memory size when it compiles. Rather than a
hand-written rule for every combination, a launch that fails with OutOfResources is retried
with one stage fewer (fewer K/V tiles in flight; same tiles, same grid, same results), and
the depth that fitted is remembered for that kernel specialisation.
"""

from __future__ import annotations

import torch
from triton.runtime.errors import OutOfResources

from .configs import TileConfig

_fitted_stages: dict[tuple, int] = {}


def launch(kernel, grid: tuple, cfg: TileConfig, *args, **constexprs) -> None:
    key = (kernel.fn.__name__, cfg, tuple(sorted((k, v) for k, v in constexprs.items()
                                                 if not isinstance(v, torch.Tensor))))
    stages = _fitted_stages.get(key, cfg.num_stages)
    while True:
        try:
            kernel[grid](*args, num_warps=cfg.num_warps, num_stages=stages, **constexprs)
        except OutOfResources:  # raised before the kernel runs: nothing was written
            if stages <= 1:
                raise
            stages -= 1
            continue
        _fitted_stages[key] = stages
        return
