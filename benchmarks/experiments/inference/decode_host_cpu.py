"""Probe (cited by docs/design/decoding.md): the Python host time of one transformers decoding call
(`integrations.transformers._decode_step`), on a machine without a GPU.

The launcher is stubbed out: triton's driver answers device 0 and stream 0, and the two decoding
kernels are stand-ins whose first launch "compiles" to a no-op, so every later launch takes
launch.py's direct path as it would on a GPU. What is timed is genoflash's own Python: the split
choice, the allocations (on the CPU), the fast launch's key, the direct call. Then a cProfile of
the same calls.

    python benchmarks/experiments/inference/decode_host_cpu.py [KEYS]
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import torch

from genoflash.ops.attention import decode, launch


class _Active:
    @staticmethod
    def get_current_device():
        return 0

    @staticmethod
    def get_current_stream(device):
        return 0


class _Driver:
    active = _Active


class _Compiled:
    function = None
    packed_metadata = None

    @staticmethod
    def run(*args):
        return None

    def __getitem__(self, grid):
        return lambda *args: None


class _Kernel:
    """A JITFunction's face (what launch.py reads) over a kernel that never runs."""

    def __init__(self, real):
        self.fn, self.params, self.arg_names = real.fn, real.params, real.arg_names

    def __getitem__(self, grid):
        return lambda *args, **kwargs: _Compiled()


def main(argv):
    keys = int(argv[0]) if argv else 4096
    launch.driver = _Driver
    launch._INTERPRETED = False
    # The GPU's split rule asks the device for its SM count; 132 SMs' answer for this shape.
    decode.choose_splits = lambda work, n, device: max(1, min(32, n // 128))
    decode._decode_split_kernel = _Kernel(decode._decode_split_kernel)
    decode._combine_kernel = _Kernel(decode._combine_kernel)
    from genoflash.integrations.transformers import _decode_step

    q = torch.randn(1, 16, 1, 128, dtype=torch.bfloat16).transpose(1, 2)  # transformers' layout, viewed
    k = torch.randn(1, 4, keys, 128, dtype=torch.bfloat16).transpose(1, 2)
    v = torch.randn_like(k)

    def step():
        return _decode_step(q, k, v, None, 0.088, (-1, -1), 0.0)

    for _ in range(100):
        step()
    calls = 20000
    start = time.perf_counter()
    for _ in range(calls):
        step()
    print(f"{keys} keys: {(time.perf_counter() - start) / calls * 1e6:.1f} us per call "
          f"({launch.fast_launches} direct launches)")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(5000):
        step()
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main(sys.argv[1:])
