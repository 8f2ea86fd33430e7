"""Checkpoints a training run can trust: no code runs on load, a crash never leaves a broken one,
a damaged one is passed over for the one before it, and a sharded model saves and loads in shards.

A checkpoint is a directory, ``out_dir/checkpoints/step-<step>/``, holding

- ``tensors/``: every tensor of the model and the optimizer (AdamW's moments), written with
  `torch.distributed.checkpoint` (DCP) as safetensors files, one per rank that holds a part: an
  FSDP2-sharded model is written by every rank in parallel, each tensor's offset in the file's
  header, and read back into any other layout (another world size, or one process);
- ``rng-rank<r>.safetensors``: rank r's random generators;
- ``state.json``: everything else (the step, the optimizer's param groups, the scheduler, the
  random generators' non-tensor state), and the names of the tensors in ``tensors/``.

Nothing is unpickled: safetensors and JSON are data formats, so loading a planted file cannot run
code (`torch.load` of a pickle can). A checkpoint is written into a directory of its own first,
each file flushed to disk (fsync), and renamed into place by rank 0 once every rank has written
its part, so a kill mid-write leaves the previous checkpoints as they were and, at worst, a
``.partial`` directory that the next save removes. The newest `keep` checkpoints stay;
`load_latest` takes the newest one that loads on every rank and says why it passed over any other.

In a torchrun job every rank calls `save` and `load_latest` (they are collective); alone, they
need no process group.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pathlib
import random
import re
import shutil
import warnings

import numpy as np
import torch
import torch.distributed as dist

from ..extras import require

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
TENSORS, STATE = "tensors", "state.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")
FORMAT = 2  # state.json's "format": a checkpoint this code does not know how to read is passed over


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
    `model` may be plain, DDP- or FSDP2-wrapped; `trainer_state` is JSON-able (the data position,
    the batch settings). Collective in a torchrun job."""
    safetensors = require("safetensors.torch", "train", "writing checkpoints")
    dcp = _dcp()
    rank = _rank()
    root = out_dir / CHECKPOINTS
    final = root / f"step-{step:08d}"
    partial = root / f".step-{step:08d}.partial"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".step-*.partial*"):  # left by a kill mid-save
            shutil.rmtree(stale, ignore_errors=True)
        partial.mkdir()
    _barrier()  # the directory exists before any rank writes into it
    tensors, optimizer_json = _tensors_and_json(model, optimizer)
    # Each rank writes the parts it holds (replicated tensors once); the writer fsyncs its files.
    with _single_process_is_meant():
        dcp.save(tensors, storage_writer=dcp.HuggingFaceStorageWriter(str(partial / TENSORS), save_distributed=True),
                 no_dist=not _distributed())
    rng_tensors, rng_json = _rng_state()
    rng_file = partial / _rng_name(rank)
    safetensors.save_file(rng_tensors, str(rng_file))
    _fsync(rng_file)
    if rank == 0:
        document = {"format": FORMAT, "step": step, "world": _world(), "trainer": trainer_state,
                    "optimizer": optimizer_json, "scheduler": _json_safe(scheduler.state_dict()), "rng": rng_json}
        (partial / STATE).write_text(json.dumps(document))
        _fsync(partial / STATE)
    _barrier()  # every rank's part is on disk
    if rank == 0:
        _fsync(partial / TENSORS)
        _fsync(partial)
        if final.exists():  # the same step written again (a resumed run that stopped at a step it had saved)
            shutil.rmtree(final)
        os.rename(partial, final)
        _fsync(root)
        for old in checkpoint_dirs(out_dir)[keep:]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()  # no rank goes on (and could save again) before the checkpoint is in place
    return final


def load(path: pathlib.Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler) -> dict:
    """Restore a checkpoint written by `save` into model, optimizer and scheduler, and the random
    generators; returns its state.json (the step, the trainer state). Raises on any damage.
    Collective in a torchrun job."""
    safetensors = require("safetensors.torch", "train", "reading checkpoints")
    dcp = _dcp()
    document = json.loads((path / STATE).read_text())
    if document.get("format") != FORMAT:
        raise ValueError(f"unknown checkpoint format {document.get('format')!r}")
    tensors, _ = _tensors_and_json(model, optimizer)  # the optimizer's state made, to be filled in
    _check_names(path, tensors)
    # Read and checked as far as it can be before anything is applied. Damage found later leaves a
    # part applied, which is harmless: load_latest then loads every part from an older checkpoint,
    # or the run stops.
    with _single_process_is_meant():
        dcp.load(tensors, storage_reader=dcp.HuggingFaceStorageReader(str(path / TENSORS)), no_dist=not _distributed())
    rng_file = path / _rng_name(_rank())
    rng_tensors = safetensors.load_file(str(rng_file if rng_file.exists() else path / _rng_name(0)))
    from torch.distributed.checkpoint.state_dict import set_state_dict
    model_state = {name[len("model/"):]: t for name, t in tensors.items() if name.startswith("model/")}
    model_state.update({name: model_state[first] for name, first in tied_names(model).items()})
    set_state_dict(model, optimizer, model_state_dict=model_state,
                   optim_state_dict=_join_state(document["optimizer"], tensors, "optimizer"))
    scheduler.load_state_dict(document["scheduler"])
    _set_rng_state(document["rng"], rng_tensors)
    return document


def load_weights(path: pathlib.Path, model: torch.nn.Module) -> torch.nn.Module:
    """The weights of the checkpoint at `path` into a plain (unwrapped) `model`, in this process
    alone, whatever layout wrote them."""
    dcp = _dcp()
    tied = tied_names(model)
    tensors = {f"model/{name}": t for name, t in model.state_dict().items() if name not in tied}
    _check_names(path, tensors, optimizer=False)
    with _single_process_is_meant():
        dcp.load(tensors, storage_reader=dcp.HuggingFaceStorageReader(str(path / TENSORS)), no_dist=True)
    return model


def load_latest(out_dir: pathlib.Path, model, optimizer, scheduler) -> dict | None:
    """Restore the newest checkpoint that loads (None if the run has none); a damaged one is
    reported and passed over. Raises CheckpointError if there are checkpoints and none loads.
    In a torchrun job the ranks agree: a checkpoint counts as loaded only if it loaded on all."""
    reasons = []
    for path in checkpoint_dirs(out_dir):
        error = None
        try:
            document = load(path, model, optimizer, scheduler)
        except Exception as caught:  # noqa: BLE001 - any damage: try the one before
            error = caught
        failed = torch.tensor([error is not None], dtype=torch.int32)
        if _distributed():
            dist.all_reduce(failed, op=dist.ReduceOp.MAX)
        if failed.item():
            reason = f"{type(error).__name__}: {error}" if error is not None else "it failed to load on another rank"
            reasons.append(f"{path.name}: {reason}")
            logger.warning("checkpoint %s does not load (%s); trying the one before it", path, reason)
            continue
        if reasons:
            logger.warning("resuming from %s, the newest checkpoint that loads", path)
        return document
    if reasons:
        raise CheckpointError(f"no checkpoint in {out_dir / CHECKPOINTS} loads:\n  " + "\n  ".join(reasons))
    return None


def _tensors_and_json(model, optimizer) -> tuple[dict, dict]:
    """The model's and optimizer's tensors under flat names ("model/<fqn>", "optimizer/state/<fqn>/
    exp_avg", ...: DTensors stay sharded), and the optimizer's other state as JSON."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_state, optimizer_state = get_state_dict(model, optimizer)
    tied = tied_names(model)
    tensors = {f"model/{name}": t for name, t in model_state.items() if name not in tied}
    optimizer_tensors, optimizer_json = _split_state(optimizer_state, "optimizer")
    tensors.update(optimizer_tensors)
    return tensors, optimizer_json


def tied_names(model: torch.nn.Module) -> dict[str, str]:
    """{name: the first name of the same parameter} for every parameter known by a second name (a
    tied embedding and LM head): stored once, as safetensors requires. Found by identity in the
    module tree, so every rank finds the same names whatever its shards hold."""
    inner = getattr(model, "module", model)  # DistributedDataParallel keeps the model as .module
    first: dict[int, str] = {}
    tied = {}
    for name, p in inner.named_parameters(remove_duplicate=False):
        if id(p) in first:
            tied[name] = first[id(p)]
        else:
            first[id(p)] = name
    return tied


def _check_names(path: pathlib.Path, tensors: dict, optimizer: bool = True) -> None:
    """The checkpoint holds a tensor of the same shape for every one of ours, and (with the
    optimizer) nothing else: a checkpoint of another model is an error, not a partial load."""
    dcp = _dcp()
    saved = {name: tuple(meta.size) for name, meta in
             dcp.HuggingFaceStorageReader(str(path / TENSORS)).read_metadata().state_dict_metadata.items()}
    if not optimizer:
        saved = {name: size for name, size in saved.items() if name.startswith("model/")}
    missing, unexpected = sorted(set(tensors) - set(saved)), sorted(set(saved) - set(tensors))
    if missing or unexpected:
        raise ValueError(f"the checkpoint does not match the model: missing {missing[:5]}, unexpected "
                         f"{unexpected[:5]}")
    for name, t in tensors.items():
        if tuple(t.shape) != saved[name]:
            raise ValueError(f"{name}: the checkpoint holds shape {saved[name]}, the model {tuple(t.shape)}")


def _dcp():
    import torch.distributed.checkpoint as dcp
    return dcp


@contextlib.contextmanager
def _single_process_is_meant():
    """DCP warns on every call without a process group; alone, that is what we mean."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _world() -> int:
    return dist.get_world_size() if _distributed() else 1


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def _rng_name(rank: int) -> str:
    return f"rng-rank{rank:05d}.safetensors"


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


def _fsync(path: pathlib.Path) -> None:
    """Flush a file's (or a directory's entries') writes to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
