"""Probe (cited by docs/design/decoding.md): the Python host time of one transformers decoding call
(`integrations.transformers.genoflash_attention_forward` with one new token), on a machine without
a GPU.

The launcher is stubbed out: triton's driver answers device 0 and stream 0, and the two decoding
kernels are stand-ins whose first launch "compiles" to a no-op, so every later call takes the
path it would take on a GPU (decode.py's steps). What is timed is genoflash's own Python: the
integration's checks, the split choice, the allocations (on the CPU), the step's key, the calls to
the stand-in launchers. Then a cProfile of the same calls.

    python benchmarks/experiments/inference/decode_host_cpu.py [KEYS]
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import torch

from genoflash.ops.attention import decode, launch, plans


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
    launch.driver = decode.driver = plans.driver = _Driver
    launch._INTERPRETED = False
    # The split rule asks the device for its SM count: an H100's, 132, for the CPU's index (-1).
    decode._sm_count = lambda device_index: 132
    decode._decode_split_kernel = _Kernel(decode._decode_split_kernel)
    decode._combine_kernel = _Kernel(decode._combine_kernel)
    from genoflash.integrations import transformers as integration

    integration.select_backend = lambda device: "triton"  # what a CUDA tensor gets
    module = torch.nn.Module()
    module.is_causal = True
    # transformers' layout: (batch, heads, seqlen, dim); the cache as DynamicCache holds it
    query = torch.randn(1, 16, 1, 128, dtype=torch.bfloat16)
    key = torch.randn(1, 4, keys, 128, dtype=torch.bfloat16)
    value = torch.randn_like(key)

    def step():  # what transformers calls per layer per decoding step
        return integration.genoflash_attention_forward(module, query, key, value, None, scaling=0.088)

    for _ in range(100):
        step()
    calls = 20000
    start = time.perf_counter()
    for _ in range(calls):
        step()
    steps = len(getattr(decode, "_steps", ()))  # (absent before decoding steps: the probe runs on older trees too)
    print(f"{keys} keys: {(time.perf_counter() - start) / calls * 1e6:.1f} us per call "
          f"({launch.fast_launches} launches through launch(), {steps} decoding step kinds)")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(5000):
        step()
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main(sys.argv[1:])
