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
