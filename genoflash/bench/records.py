"""What every results file records beside its numbers: device, date, commit and versions,
and where it goes (benchmarks/results/<gpu>-<date>-<kind>.json)."""

from __future__ import annotations

import datetime
import os
import subprocess
from pathlib import Path

import torch


def git_commit() -> str:
    """GENOFLASH_COMMIT when set (the GPU machine's copy of the tree can hold a stale .git, whose
    HEAD is not the commit that runs), else HEAD of the checkout."""
    if os.environ.get("GENOFLASH_COMMIT"):
        return os.environ["GENOFLASH_COMMIT"]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                                capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = ""
    return commit or "unknown"


def run_metadata(**extra) -> dict:
    import triton
    cuda = torch.cuda.is_available()
    return {"device": torch.cuda.get_device_name() if cuda else "cpu",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git_commit": git_commit(), "torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda, **extra}


def results_stem(out: Path, metadata: dict, kind: str) -> Path:
    """<out>/<device slug>-<date>-<kind>, e.g. benchmarks/results/h200-2026-11-29-memory."""
    slug = metadata["device"].lower().replace("nvidia", "").strip().replace(" ", "-")
    out.mkdir(parents=True, exist_ok=True)
    return out / f"{slug}-{metadata['date'][:10]}-{kind}"
