"""The attention kernels compile for the H200 (sm_90) without serialised tensor-core instructions.

ptxas may make every wgmma of a kernel wait for the one before (its note C7515), which costs
the kernel its tensor-core pipelining: 8-22% of the causal and windowed backward until the
dK/dV pass's masked loops became one (docs/design/attention-backward.md). The note depends
on register allocation near the 255-register limit, so it comes and goes with small changes to
a kernel; this compiles the feature combinations where it was seen, for sm_90 on this machine
(no GPU: tools/offline_compile.py, in a subprocess since it swaps Triton's driver), and
fails if any kernel is marked WGMMA-SERIALIZED. A kernel that fails to compile fails it too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _ptxas_available() -> bool:
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        return os.path.exists(get_ptxas(90).path)
    except Exception:
        return False


pytestmark = pytest.mark.skipif(not _ptxas_available(), reason="triton's bundled ptxas is not available")


def _offline_compile(case: str) -> subprocess.CompletedProcess:
    """tools/offline_compile.py CASE in a subprocess (it swaps Triton's driver); it must succeed."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "offline_compile.py"), *case.split()],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


# Each was WGMMA-SERIALIZED before the backward's loop change (8d50ea4, 37c8ae2), except the
# controls (full attention, dropout), which must stay clean.
@pytest.mark.parametrize("case", [
    "plain 128 --causal",
    "window 128",
    "window 64",
    "plain 128 --varlen",
    "dropout 128 --causal",
    "plain 128",
    "dropout 128",
    "plain 64 192",  # V split in two channel groups (configs.channel_blocks), at the tile table's tiles
    "plain 128 192",
    "plain 192 128",  # Q/K split in two channel groups
    "plain 96 --causal",  # both
    "plain 192 192 --causal",  # both, at the (192, 192) row's tiles (serialised at hd256's 32x64 dK/dV)
    "plain 256 --causal",  # hd256: its dK/dV pass masks every tile (BackwardConfig.dkdv_mask_every_tile);
    "window 256",  # with the edge branch both were serialised
])
def test_kernels_compile_for_sm90_without_serialised_wgmma(case):
    out = _offline_compile(case)
    kernels = [line for line in out.stdout.splitlines() if "_kernel " in line]
    assert any("_attn_bwd_dkdv_kernel" in line for line in kernels), out.stdout
    assert any("_attn_bwd_dq_kernel" in line for line in kernels), out.stdout
    serialised = [line for line in kernels if "WGMMA-SERIALIZED" in line]
    assert not serialised, "\n".join(serialised)


@pytest.mark.parametrize("case", ["plain 128 --sm90-backward", "plain 128 --sm90-backward --causal --gqa",
                                  "plain 128 --sm90-backward --causal --dtype float16",
                                  "plain 256 --sm90-backward --causal --gqa"])
def test_gluon_backward_compiles_for_sm90_without_spills(case):
    """The Gluon one-pass backward (backward_sm90.py) builds for sm_90: its compute warps run at 240
    registers (setmaxnreg) beside two 24-register copy warps, where a spill would cost every step.
    At head dim 256 (the wide kernel) each warpgroup holds a 64 x 256 float32 accumulator. No wgmma
    is serialised, nor has ptxas injected a wait for one (tools/offline_compile.py's WGMMA- marks)."""
    out = _offline_compile(case)
    lines = [line for line in out.stdout.splitlines() if "_attn_bwd_sm90_kernel " in line]
    assert len(lines) == 1, out.stdout
    assert "spill-stores 0" in lines[0] and "WGMMA-" not in lines[0], lines[0]
    assert not any("_attn_bwd_dkdv_kernel" in line for line in out.stdout.splitlines()), out.stdout


@pytest.mark.parametrize("case", ["plain 128 --sm90-forward", "plain 96 --sm90-forward --causal --gqa",
                                  "plain 256 --sm90-forward --causal --dtype float16",
                                  "window 64 192 --sm90-forward --softcap 5 --alibi",
                                  "plain 64 --sm90-forward --causal", "plain 48 --sm90-forward --gqa",
                                  "plain 128 --sm90-forward --varlen --causal --gqa"])
def test_gluon_forward_compiles_for_sm90_without_spills(case):
    """The Gluon forward (forward_sm90.py) builds for sm_90 at padded head dims (96 -> 128, 192 -> 256),
    Dv != D, every score modification and packed (varlen) sequences, its compute warps at 240
    registers (two warpgroups) or 160 (three, where the head dims pad to 64) without a spill, and
    with no wgmma serialised or waited for by ptxas's own injection."""
    out = _offline_compile(case)
    lines = [line for line in out.stdout.splitlines() if "_attn_fwd_sm90_kernel " in line]
    assert len(lines) == 1, out.stdout
    assert "spill-stores 0" in lines[0] and "WGMMA-" not in lines[0], lines[0]
    assert not any("_attn_fwd_kernel" in line for line in out.stdout.splitlines()), out.stdout


_DECODE_PDL_SCRIPT = """
import sys
sys.path.insert(0, "tools")
import offline_compile as oc
from triton.runtime import driver
from triton.runtime.jit import JITFunction
driver.set_active(oc._Sm90Driver())
JITFunction.run = oc._compile_only
import torch
from genoflash.ops.attention import decode
decode._has_pdl = lambda device_index: True  # CPU tensors stand in for an sm_90 device's
q = torch.randn(1, 1, 32, 128, dtype=torch.bfloat16)
k = torch.randn(1, 4096, 8, 128, dtype=torch.bfloat16)
for pdl in (True, False):
    with decode.use_config(pdl=pdl):
        decode.decode_attention(q, k, k, None, 4096, softmax_scale=0.1, num_splits=4)
for name, _, _, kernel in oc.COMPILED:
    ptx = kernel.asm["ptx"]
    print(name, kernel.metadata.launch_pdl, "griddepcontrol.launch_dependents" in ptx, "griddepcontrol.wait" in ptx)
"""


def test_decoding_combine_compiles_as_a_programmatic_dependent_on_sm90():
    """With DecodeConfig.pdl (sm_90+) the split kernel signals its dependent early and the combine
    kernel is launched with programmatic dependent launch and waits (griddepcontrol) before it reads
    a part; with pdl off neither instruction is there and the combine is launched plainly."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", _DECODE_PDL_SCRIPT], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line.split() for line in out.stdout.splitlines() if line.startswith("_")]
    assert lines == [["_decode_split_kernel", "False", "True", "False"],
                     ["_combine_kernel", "True", "False", "True"],
                     ["_decode_split_kernel", "False", "False", "False"],
                     ["_combine_kernel", "False", "False", "False"]], out.stdout
