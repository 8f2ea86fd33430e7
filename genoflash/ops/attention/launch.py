"""Kernel launches that degrade in speed, never fail, when a variant does not build.

configs.py holds the measured best tiling per shape and feature set. Some feature
combinations (RoPE tables, the dropout mask's word shuffle, wide heads) take extra shared
memory, and Triton only learns a kernel's shared-memory size when it compiles. Rather than a
hand-written rule for every combination, a launch that fails with OutOfResources is retried
with one stage fewer (fewer K/V tiles in flight; same tiles, same grid, same results).

TMA descriptor loads (TMA=True, descriptors.py) crashed ptxas (triton 3.6, sm_90: SIGSEGV) in
some kernel and tile combinations, e.g. the dK/dV pass with Q by TMA at 32x64 tiles, hd64,
causal. Such a launch is retried with pointer loads (TMA=False, and DQ_TMA=False: the same
tiles and results; the descriptors are then ignored). Both fallbacks are remembered per kernel specialisation,
so the failed compile is paid once per process.
"""

from __future__ import annotations

from triton.runtime.errors import OutOfResources, PTXASError

from .configs import TileConfig

_fitted: dict[tuple, tuple[int, bool]] = {}  # key -> (num_stages, TMA) that built
tma_fallbacks: list[str] = []  # kernels whose TMA variant failed to build (for tests and reports)
# Constexpr switches of TMA paths: TMA (descriptor loads and stores), DQ_TMA (the fused
# backward's dQ reductions by TMA). A ptxas failure turns them all off.
_TMA_FLAGS = ("TMA", "DQ_TMA")


def launch(kernel, grid: tuple, cfg: TileConfig, *args, **constexprs) -> None:
    # Every keyword here is a constexpr switch (bools, ints, strings), so the items hash as they
    # are. A call site passes them in one order, so they need no sorting: a key built in another
    # order would only be a cache miss, never a wrong hit. (This runs on every launch, and the
    # host time of short sequences is mostly launch overhead: benchmarks/attention_host_probe.py.)
    key = (kernel.fn.__name__, cfg, tuple(constexprs.items()))
    asked = {flag: constexprs[flag] for flag in _TMA_FLAGS if flag in constexprs}
    stages, tma = _fitted.get(key, (cfg.num_stages, any(asked.values())))
    while True:
        for flag, value in asked.items():  # after a fallback, every TMA path is off
            constexprs[flag] = value and tma
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
