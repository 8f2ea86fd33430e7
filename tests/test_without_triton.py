"""genoflash without triton (its wheels are for Linux only): every package imports, and the torch
backend runs a model and attention; asking for the triton backend fails with an error that says
what to install.

triton is installed here, so the checks run in a subprocess whose import system refuses it: a
meta-path finder, first in line, raises ImportError for `triton` and its submodules, as Python
does where triton is missing. The first check proves the finder blocks; the last, that a kernel
module still fails to import there, so a check that passes is not a blocker that lets triton by.
TRITON_INTERPRET=1 is set in the subprocess, so code that takes the interpreter's word for
triton being there would fail too.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent(r"""
    import json, math, pathlib, sys, traceback

    class BlockTriton:
        def find_spec(self, name, path=None, target=None):
            if name == "triton" or name.startswith("triton."):
                raise ImportError(f"No module named {name!r} (blocked)")
            return None

    sys.meta_path.insert(0, BlockTriton())
    sys.path.insert(0, ROOT)
    results = {}

    def check(name):
        def run(fn):
            try:
                fn()
                results[name] = "ok"
            except BaseException:
                results[name] = traceback.format_exc()
        return run

    @check("blocker_blocks")
    def _():
        try:
            import triton  # noqa: F401
        except ImportError:
            return
        raise AssertionError("import triton succeeded under the blocker")

    @check("imports")
    def _():
        import importlib, importlib.util
        names = ["genoflash", "genoflash.layers", "genoflash.models", "genoflash.data", "genoflash.train",
                 "genoflash.cli", "genoflash.distributed"]
        if importlib.util.find_spec("transformers") is not None:
            names.append("genoflash.integrations.transformers")
        for name in names:
            importlib.import_module(name)
        import genoflash
        assert pathlib.Path(genoflash.__file__).is_relative_to(ROOT), genoflash.__file__

    @check("model")
    def _():
        import torch
        from genoflash.models import DNALM, DNALMConfig
        torch.manual_seed(0)
        model = DNALM(DNALMConfig(dim=32, depth=3, nheads=2, layer_pattern="GHM"))
        kinds = {type(m).__name__ for m in model.modules()}
        assert {"MultiHeadAttention", "HyenaMixer", "MambaMixer"} <= kinds, kinds
        tokens = torch.randint(4, 8, (2, 40))
        loss = model(tokens, labels=tokens)["loss"]
        loss.backward()
        assert math.isfinite(loss.item()), loss
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        assert sum(g.abs().sum().item() for g in grads) > 0

    @check("attention")
    def _():
        import torch
        import genoflash
        from genoflash.backends import select_backend
        assert select_backend(torch.device("cuda")) == "torch"  # no backend set: by device, triton absent
        torch.manual_seed(0)
        q, k, v = (torch.randn(2, 33, 2, 16, requires_grad=True) for _ in range(3))
        out = genoflash.flash_attn_func(q, k, v, causal=True)
        out.sum().backward()
        with genoflash.use_backend("reference"):
            ref = genoflash.flash_attn_func(q.detach(), k.detach(), v.detach(), causal=True)
        torch.testing.assert_close(out.detach(), ref, rtol=1e-5, atol=1e-5)
        assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))

    @check("triton_backend_error")
    def _():
        import torch
        import genoflash
        q = torch.randn(1, 8, 1, 16)
        with genoflash.use_backend("triton"):  # entering the block is fine: the call raises
            try:
                genoflash.flash_attn_func(q, q, q)
            except ImportError as e:
                message = str(e)
            else:
                raise AssertionError("the triton backend ran without triton")
        assert "'triton' backend needs triton" in message and "pip install triton" in message, message
        assert "backend='torch'" in message, message

    @check("kernels_still_blocked")
    def _():
        assert "triton" not in sys.modules, "something imported triton"
        try:
            import genoflash.ops.hyena.staging_kernels  # noqa: F401
        except ImportError:
            return
        raise AssertionError("a kernel module imported under the blocker")

    print("RESULTS " + json.dumps(results))
""")

CHECKS = ["blocker_blocks", "imports", "model", "attention", "triton_backend_error", "kernels_still_blocked"]


@pytest.fixture(scope="module")
def results():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", f"ROOT = {str(ROOT)!r}\n" + SCRIPT], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS ")]
    assert proc.returncode == 0 and lines, proc.stdout + proc.stderr
    return json.loads(lines[-1][len("RESULTS "):])


@pytest.mark.parametrize("name", CHECKS)
def test_without_triton(results, name):
    assert results.get(name) == "ok", results.get(name, f"check {name} did not run")
