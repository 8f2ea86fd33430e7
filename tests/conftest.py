"""Test set-up. On a machine without CUDA the real Triton kernels run under the Triton
interpreter; TRITON_INTERPRET must be set before any kernel is defined, i.e. before
genoflash is imported, which is why it happens here."""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import math  # noqa: E402

import pytest  # noqa: E402

from tests.utils import HAS_CUDA  # noqa: E402


def _interpret_device_calls_without_repatching():
    """Test-speed only, under the Triton interpreter (CPU runs): every call of a @triton.jit helper
    from inside a kernel re-runs the interpreter's _patch_lang (inspect.getmembers over
    triton.language, ~5 scans per call), though the launch in progress (GridExecutor) has already
    patched those very modules and keeps them patched until it ends: on the already-patched
    modules the re-run finds nothing left to patch, and it is never restored. It took about a
    fifth of the interpreted kernels' time (tests/ops/attention/test_key_chunks.py: 160 s -> 127 s
    on 2 cores). Here a helper call skips it when the launch in
    progress patched every language module the helper sees (else it patches as before); the
    kernels run the same interpreted operations. Falls back to triton's own code if its
    interpreter is not laid out as in the triton this was written for (3.6)."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    needed = ("GridExecutor", "InterpretedFunction", "InterpreterError", "_patch_lang")
    if not all(hasattr(interpreter, name) for name in needed):
        return
    import triton.language as tl

    launches = []  # the language modules each launch in progress patched, innermost last
    langs_of = {}

    def langs(fn):
        key = id(fn.__globals__)
        if key not in langs_of:
            langs_of[key] = frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)
        return langs_of[key]

    grid_call = interpreter.GridExecutor.__call__

    def launch(self, *args, **kwargs):
        launches.append(langs(self.fn))
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            launches.pop()

    def device_call(self, *args, **kwargs):
        if not launches or not langs(self.fn) <= launches[-1]:
            interpreter._patch_lang(self.fn)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    interpreter.GridExecutor.__call__ = launch
    interpreter.InterpretedFunction.__call__ = device_call


if os.environ.get("TRITON_INTERPRET") == "1":
    _interpret_device_calls_without_repatching()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run tools/gpu_tests.sh on one)")
    # Minutes-long runs (the demo at its full CPU size, ~2.5 min on 2 cores) stay out of CI;
    # GENOFLASH_SLOW=1 runs them.
    skip_slow = pytest.mark.skip(reason="long-running: set GENOFLASH_SLOW=1")
    run_slow = os.environ.get("GENOFLASH_SLOW") == "1"
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
        if "slow" in item.keywords and not run_slow:
            item.add_marker(skip_slow)


@pytest.fixture
def device():
    return torch.device("cuda" if HAS_CUDA else "cpu")


@pytest.fixture
def poison_allocations(monkeypatch):
    """Every float tensor torch allocates during the test starts as NaN (ints as a sentinel),
    so an output element a kernel forgets to write shows up instead of hiding as 0."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(t):
        if t.is_floating_point():
            t.fill_(math.nan)
        elif t.dtype != torch.bool:
            t.fill_(-12345)
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: poison(empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: poison(empty_like(*a, **kw)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`pytest -n N` (CI's `-n 2`) with work stealing instead of xdist's default "load" chunks: the
    heavy interpreted tests sit together (tests/ops/mamba, tests/ops/attention), and a chunk of
    them sent to one worker near the end left the other idle for minutes (~6 of CI's 35).
    A worker that runs out takes half of the other's pending tests; every test still runs once."""
    if config.getvalue("dist") != "load":
        return None  # an explicit --dist other than the default keeps its own scheduler
    try:
        from xdist.scheduler import WorkStealingScheduling
    except ImportError:  # pytest-xdist < 3.2
        return None
    return WorkStealingScheduling(config, log)
