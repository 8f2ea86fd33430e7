"""Checkpoints a training run can trust: no code runs on load, a crash never leaves a broken one,
and a damaged one is passed over for the one before it.

A checkpoint is a directory, ``out_dir/checkpoints/step-<step>/``, holding

- ``model.safetensors``: the weights;
- ``optimizer.safetensors``: every tensor of the optimizer's and the trainer's state (AdamW's
  moments, the RNG states), under flat names;
- ``state.json``: everything else (the step, the optimizer's param groups, the scheduler, the
  random generators' non-tensor state), and the names of the tensors in the file beside it.

Nothing is unpickled: safetensors and JSON are data formats, so loading a planted file cannot run
code (`torch.load` of a pickle can). A checkpoint is written into a directory of its own first,
each file flushed to disk (fsync), and renamed into place, so a kill mid-write leaves the previous
checkpoints as they were and, at worst, a ``.partial`` directory that the next save removes. The
newest `keep` checkpoints stay; `load_latest` takes the newest one that loads and says why it
passed over any other.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import random
import re
import shutil

import numpy as np
import torch

from ..extras import require

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
WEIGHTS, TENSORS, STATE = "model.safetensors", "optimizer.safetensors", "state.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")
FORMAT = 1  # state.json's "format": a checkpoint this code does not know how to read is passed over


class CheckpointError(RuntimeError):
    """No checkpoint of a run could be loaded (each one's reason is in the message)."""


def checkpoint_dirs(out_dir: pathlib.Path) -> list[pathlib.Path]:
    """The run's checkpoints, newest first."""
    root = out_dir / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def save(out_dir: pathlib.Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler,
         trainer_state: dict, keep: int = 2) -> pathlib.Path:
    """Write the step's checkpoint (atomically: see the module docstring) and keep the newest `keep`.
    `trainer_state` is JSON-able (the data position, the batch settings)."""
    safetensors = require("safetensors.torch", "train", "writing checkpoints")
    root = out_dir / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".step-*.partial*"):  # left by a kill mid-save
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step-{step:08d}"
    partial = root / f".step-{step:08d}.partial-{os.getpid()}"
    partial.mkdir()
    tensors, state = _split_state(optimizer.state_dict(), "optimizer")
    rng_tensors, rng_state = _rng_state()
    tensors.update(rng_tensors)
    document = {"format": FORMAT, "step": step, "trainer": trainer_state, "optimizer": state,
                "scheduler": _json_safe(scheduler.state_dict()), "rng": rng_state}
    safetensors.save_model(_unwrap(model), str(partial / WEIGHTS))
    safetensors.save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(partial / TENSORS))
    (partial / STATE).write_text(json.dumps(document))
    for name in (WEIGHTS, TENSORS, STATE):
        _fsync(partial / name)
    _fsync(partial)
    if final.exists():  # the same step written again (a resumed run that stopped at a step it had saved)
        shutil.rmtree(final)
    os.rename(partial, final)
    _fsync(root)
    for old in checkpoint_dirs(out_dir)[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load(path: pathlib.Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler) -> dict:
    """Restore a checkpoint written by `save` into model, optimizer and scheduler, and the random
    generators; returns its state.json (the step, the trainer state). Raises on any damage."""
    safetensors = require("safetensors.torch", "train", "reading checkpoints")
    document = json.loads((path / STATE).read_text())
    if document.get("format") != FORMAT:
        raise ValueError(f"unknown checkpoint format {document.get('format')!r}")
    tensors = safetensors.load_file(str(path / TENSORS))
    # Read and checked as far as it can be before anything is applied. Damage found later leaves a
    # part applied, which is harmless: load_latest then loads every part from an older checkpoint,
    # or the run stops.
    optimizer_state = _join_state(document["optimizer"], tensors, "optimizer")
    missing, unexpected = safetensors.load_model(_unwrap(model), str(path / WEIGHTS), strict=True)
    if missing or unexpected:  # (strict raises first; kept for safetensors versions that return them)
        raise ValueError(f"weights do not match the model: missing {missing}, unexpected {unexpected}")
    optimizer.load_state_dict(optimizer_state)
    scheduler.load_state_dict(document["scheduler"])
    _set_rng_state(document["rng"], tensors)
    return document


def load_latest(out_dir: pathlib.Path, model, optimizer, scheduler) -> dict | None:
    """Restore the newest checkpoint that loads (None if the run has none); a damaged one is
    reported and passed over. Raises CheckpointError if there are checkpoints and none loads."""
    reasons = []
    for path in checkpoint_dirs(out_dir):
        try:
            document = load(path, model, optimizer, scheduler)
        except Exception as error:  # noqa: BLE001 - any damage: try the one before
            reasons.append(f"{path.name}: {type(error).__name__}: {error}")
            logger.warning("checkpoint %s does not load (%s: %s); trying the one before it", path,
                           type(error).__name__, error)
            continue
        if reasons:
            logger.warning("resuming from %s, the newest checkpoint that loads", path)
        return document
    if reasons:
        raise CheckpointError(f"no checkpoint in {out_dir / CHECKPOINTS} loads:\n  " + "\n  ".join(reasons))
    return None


# ---------------------------------------------------------------- state as tensors plus JSON

def _split_state(value, prefix: str, tensors: dict | None = None):
    """(tensors by flat name, a JSON-able copy of value with each tensor replaced by {"tensor": name})."""
    tensors = {} if tensors is None else tensors
    if isinstance(value, torch.Tensor):
        tensors[prefix] = value
        return tensors, {"tensor": prefix}
    if isinstance(value, dict):
        out = {"dict": [[k, _split_state(v, f"{prefix}/{k}", tensors)[1]] for k, v in value.items()]}
        return tensors, out
    if isinstance(value, (list, tuple)):
        kind = "list" if isinstance(value, list) else "tuple"
        return tensors, {kind: [_split_state(v, f"{prefix}/{i}", tensors)[1] for i, v in enumerate(value)]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return tensors, {"value": value}
    raise TypeError(f"{prefix}: cannot store a {type(value).__name__} in a checkpoint")


def _join_state(value: dict, tensors: dict, prefix: str):
    """_split_state's inverse."""
    (kind, body), = value.items()
    if kind == "tensor":
        if body not in tensors:
            raise ValueError(f"{prefix}: tensor {body!r} is missing from {TENSORS}")
        return tensors[body]
    if kind == "dict":
        return {k: _join_state(v, tensors, prefix) for k, v in body}
    if kind in ("list", "tuple"):
        items = [_join_state(v, tensors, prefix) for v in body]
        return items if kind == "list" else tuple(items)
    if kind == "value":
        return body
    raise ValueError(f"{prefix}: unknown entry {kind!r}")


def _json_safe(value):
    """A scheduler's state_dict as JSON keeps (numbers, lists, None: what LambdaLR's holds)."""
    return json.loads(json.dumps(value))


def _rng_state() -> tuple[dict, dict]:
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    tensors = {"rng/torch": torch.get_rng_state(), "rng/numpy_keys": torch.from_numpy(np_keys.astype(np.int64))}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng/cuda/{i}"] = state
    version, internal, gauss = random.getstate()
    return tensors, {"numpy": [np_kind, np_pos, np_has_gauss, np_gauss], "python": [version, list(internal), gauss],
                     "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0}


def _set_rng_state(state: dict, tensors: dict) -> None:
    torch.set_rng_state(tensors["rng/torch"])
    np_kind, np_pos, np_has_gauss, np_gauss = state["numpy"]
    np.random.set_state((np_kind, tensors["rng/numpy_keys"].numpy().astype(np.uint32), np_pos, np_has_gauss,
                         np_gauss))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    cuda = [tensors[f"rng/cuda/{i}"] for i in range(state["cuda_devices"])]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)  # DistributedDataParallel keeps the model as .module


def _fsync(path: pathlib.Path) -> None:
    """Flush a file's (or a directory's entries') writes to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
