"""Kernel launches that degrade in speed, never fail, when a variant does not build.

configs.py holds the measured best tiling per shape and feature set. Some feature
combinations (RoPE tables, the dropout mask's word shuffle, wide heads) take extra shared
memory, and Triton only learns a kernel's shared-memory size when it compiles. Rather than a
hand-written rule for every combination, a launch that fails with OutOfResources is retried
with one stage fewer (fewer K/V tiles in flight; same tiles, same grid, same results).

TMA descriptor loads (TMA=True, descriptors.py) crashed ptxas (triton 3.6, sm_90: SIGSEGV) in
some kernel and tile combinations, e.g. the dK/dV pass with Q by TMA at 32x64 tiles, hd64,
causal. Such a launch is retried with pointer loads (TMA=False: the same tiles and results;
the descriptors are then ignored). Both fallbacks are remembered per kernel specialisation,
so the failed compile is paid once per process.
"""

from __future__ import annotations

import torch
from triton.runtime.errors import OutOfResources, PTXASError

from .configs import TileConfig

_fitted: dict[tuple, tuple[int, bool]] = {}  # key -> (num_stages, TMA) that built
tma_fallbacks: list[str] = []  # kernels whose TMA variant failed to build (for tests and reports)


def launch(kernel, grid: tuple, cfg: TileConfig, *args, **constexprs) -> None:
    key = (kernel.fn.__name__, cfg, tuple(sorted((k, v) for k, v in constexprs.items()
                                                 if not isinstance(v, torch.Tensor))))
    stages, tma = _fitted.get(key, (cfg.num_stages, constexprs.get("TMA", False)))
    while True:
        if "TMA" in constexprs:
            constexprs["TMA"] = tma
        try:
            kernel[grid](*args, num_warps=cfg.num_warps, num_stages=stages, **constexprs)
        except OutOfResources:  # raised before the kernel runs: nothing was written
            if stages <= 1:
                raise
            stages -= 1
            continue
        except PTXASError:  # raised by the compiler, before the kernel runs
            if not tma:
                raise
            tma = False
            tma_fallbacks.append(kernel.fn.__name__)
            continue
        _fitted[key] = (stages, tma)
        return
