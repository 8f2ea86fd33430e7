"""Training loop for genoflash models: `genoflash train`.

Two tasks:

- ``synthetic``: sequence classification on the long-range motif-grammar task
  (`SyntheticLongRangeDataset`), with a `SequenceClassifier`; held-out accuracy and AUROC.
- ``lm``: causal language modelling on windows of a FASTA file (`GenomeWindowDataset`),
  with a `DNALM`; held-out loss and perplexity.

What makes a long job safe to stop and restart:

- The data stream is a pure function of (seed, step): micro-batch ``j`` of step ``s`` holds
  items ``(s * grad_accum + j) * batch_size ...`` (``batch_size`` of them) of a lazily
  generated dataset, so a resumed run reads exactly the batches the uninterrupted run would
  have.
- ``out_dir/checkpoints/step-<n>/`` holds the weights (safetensors), the optimizer's and the
  RNG states (safetensors and JSON) and the step (which is also the data position): nothing that
  loading could run as code. Each is written beside the others and renamed into place, flushed
  to disk, so a crash mid-write never leaves a broken checkpoint; the newest ``keep_checkpoints``
  stay (checkpoint.py). ``--resume`` continues bit for bit (on CPU; CUDA kernels may differ in the
  last bits) from the newest checkpoint that loads, and drops a log line a kill cut short.
- A step whose loss or gradient norm is not finite changes no weight (the update is skipped and
  logged); ``max_bad_steps`` of them in a row stop the run with an error, the last checkpoint
  (taken from good weights) kept.
- A sample that raises is logged once and replaced by the next index that loads
  (deterministically, so resume still matches); ``--strict`` makes it fatal instead.

Gradient accumulation (``--grad-accum``): one optimizer step runs ``grad_accum``
micro-batches of ``batch_size`` sequences, forward and backward one at a time, so the
effective batch is ``batch_size * grad_accum`` at the memory of one micro-batch. Each
micro-batch's mean loss is weighted by its share of the step's counted targets (1 /
grad_accum when, as on the synthetic task, every micro-batch counts the same), so the
gradient is that of one batch of ``batch_size * grad_accum``; the gradient is clipped once,
after accumulation. Under ``--context-parallel`` the ranks accumulate their shards' gradients
and sum them over the group once per step.

Sequence-length warmup (``--seq-len-warmup``, as in HyenaDNA) trains on the first
``seq_len_start`` tokens of each window and doubles the length in equal stages over the
first ``seq_len_warmup_fraction`` of the steps. It applies to the ``lm`` task only: a
crop of a synthetic sequence would usually cut out one of the two motifs and with it the
label, so the synthetic task always trains at full length.

Config: `TrainConfig` (config.py): defaults, then ``--config file.yaml``, then command-line flags.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pathlib
import random
import sys
import time
from collections.abc import Callable

import numpy as np
import torch
from torch.utils.data import Dataset

from ..data import GenomeWindowDataset, MotifGrammar, SyntheticLongRangeDataset
from ..data.examples import resolve_fasta
from ..extras import require
from ..models.dna_lm import DNALM
from . import checkpoint
from .classifier import SequenceClassifier
from .checkpoint import CheckpointError
from .config import ConfigError, TrainConfig, build_parser, config_from_args

logger = logging.getLogger(__name__)
LOG_NAME, PLOT_NAME = "log.jsonl", "curves.png"
LEGACY_CHECKPOINT = "checkpoint.pt"  # the pickled format of genoflash 0.1.0, no longer loaded

# ---------------------------------------------------------------- schedules and metrics

def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of cfg.lr at `step`: linear warmup, then cosine decay to min_lr."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    floor = cfg.min_lr / cfg.lr
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def seq_len_at(step: int, cfg: TrainConfig) -> int:
    """Training length at `step` (the sequence-length warmup; see the module docstring)."""
    if not cfg.seq_len_warmup or cfg.task != "lm" or cfg.seq_len_start >= cfg.seq_len:
        return cfg.seq_len
    doublings = math.ceil(math.log2(cfg.seq_len / cfg.seq_len_start))
    span = int(cfg.steps * cfg.seq_len_warmup_fraction)
    if step >= span:
        return cfg.seq_len
    return min(cfg.seq_len, cfg.seq_len_start * 2 ** (step * doublings // span))


def auroc(scores, labels) -> float:
    """Area under the ROC curve via the Mann-Whitney rank statistic (ties get average ranks).

    Equals P(score of a random positive > score of a random negative) + 0.5 P(tie);
    NaN when only one class is present.
    """
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels).astype(bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    _, first, counts = np.unique(scores[order], return_index=True, return_counts=True)
    ranks = np.empty(len(scores))
    ranks[order] = np.repeat(first + (counts + 1) / 2, counts)  # 1-based average rank of each tie group
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


# ---------------------------------------------------------------- data

class SafeFetcher:
    """Items of a dataset as (inputs, targets) tensors, surviving records that fail to load.

    A failing index is logged once (with the exception) and replaced by the next index
    that loads, so the stream stays deterministic; with ``strict`` the error propagates.
    """

    def __init__(self, dataset: Dataset, strict: bool = False, max_skips: int = 100):
        self.dataset, self.strict, self.max_skips = dataset, strict, max_skips
        self.failed: set[int] = set()

    def __call__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(self.dataset)
        for offset in range(self.max_skips + 1):
            i = (index + offset) % n
            try:
                return _as_pair(self.dataset[i])
            except Exception as error:
                if self.strict:
                    raise
                if i not in self.failed:
                    self.failed.add(i)
                    logger.warning("sample %d of %s failed to load (%r); replacing it with the next "
                                   "sample (pass --strict to stop instead)", i, type(self.dataset).__name__, error)
        raise RuntimeError(f"{self.max_skips + 1} consecutive samples failed to load from index {index}")

    def batch(self, indices, length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Stacked items; LM items (per-token targets) are cropped to `length`."""
        inputs, targets = zip(*(self(i) for i in indices))
        inputs, targets = torch.stack(inputs), torch.stack(targets)
        if length is not None and targets.dim() == 2:
            inputs, targets = inputs[:, :length], targets[:, :length]
        return inputs, targets


def _as_pair(item) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, label) tuples pass through; GenomeWindowDataset dicts give (input_ids, labels)."""
    if isinstance(item, dict):
        return item["input_ids"], item["labels"]
    return item[0], item[1]


def build_datasets(cfg: TrainConfig) -> tuple[Dataset, Dataset]:
    """(train, held-out) datasets, both lazy: the train stream has steps * batch_size * grad_accum
    items (every micro-batch of every step reads its own)."""
    n_train = cfg.steps * cfg.batch_size * cfg.grad_accum
    if cfg.task == "synthetic":
        grammar = MotifGrammar.random(n_families=cfg.n_families, motif_length=cfg.motif_length, seed=cfg.seed)
        shape = dict(grammar=grammar, margin=cfg.margin, sites=cfg.sites, spacer=cfg.spacer)
        train = SyntheticLongRangeDataset(n_train, cfg.seq_len, cfg.distance, seed=cfg.seed, **shape)
        held_out = SyntheticLongRangeDataset(cfg.eval_samples, cfg.seq_len, cfg.distance,
                                             seed=cfg.seed + 1_000_003, **shape)
        return train, held_out
    fasta = resolve_fasta(cfg.fasta)
    train = GenomeWindowDataset(fasta, cfg.seq_len, n_train, seed=cfg.seed, objective="clm")
    held_out = GenomeWindowDataset(fasta, cfg.seq_len, cfg.eval_samples, seed=cfg.seed + 1_000_003,
                                   objective="clm")
    return train, held_out


# ---------------------------------------------------------------- evaluation

@torch.no_grad()
def evaluate(model: torch.nn.Module, data: SafeFetcher, cfg: TrainConfig, device: torch.device, cp=None) -> dict:
    """Held-out metrics: accuracy and AUROC (synthetic), or loss and perplexity (lm)."""
    model.eval()
    n = len(data.dataset)
    loss_sum, weight, probs, labels = 0.0, 0, [], []
    for start in range(0, n, cfg.batch_size):
        tokens, targets = (t.to(device) for t in data.batch(range(start, min(n, start + cfg.batch_size))))
        if cp is not None:  # every rank holds the batch; each scores its shard, the loss is the global mean
            with _autocast(device):
                logits = model(cp.shard(tokens))["logits"]
            loss = cp.global_value(cp.mean_loss(logits, cp.shard(targets)))
            count = int((targets != -100).sum())
            loss_sum, weight = loss_sum + loss * count, weight + count
            continue
        with _autocast(device):
            out = model(tokens, targets)
        if cfg.task == "synthetic":
            probs.append(out["logits"].float().softmax(-1)[:, 1].cpu())
            labels.append(targets.cpu())
            count = len(targets)
        else:
            count = int((targets != -100).sum())
        loss_sum, weight = loss_sum + out["loss"].item() * count, weight + count
    model.train()
    metrics = {"loss": loss_sum / max(weight, 1)}
    if cfg.task == "synthetic":
        p, y = torch.cat(probs).numpy(), torch.cat(labels).numpy()
        metrics.update(accuracy=float(((p > 0.5) == (y == 1)).mean()), auroc=auroc(p, y))
    else:
        metrics["perplexity"] = math.exp(min(metrics["loss"], 50.0))
    return metrics


# ---------------------------------------------------------------- checkpoints

class TrainingDiverged(RuntimeError):
    """max_bad_steps steps in a row had a non-finite loss or gradient."""


def _trainer_state(cfg: TrainConfig, step: int) -> dict:
    """What a checkpoint records of the run besides the model and optimizer: the step, which is
    also the data position, and how many samples each step read, so that a resume with other
    batch settings can be told apart."""
    return {"data_position": step, "batch_size": cfg.batch_size, "grad_accum": cfg.grad_accum}


def resume(out_dir: pathlib.Path, model, optimizer, scheduler, cfg: TrainConfig) -> int:
    """Restore the newest checkpoint that loads; returns the step to continue from (0: none)."""
    if (out_dir / LEGACY_CHECKPOINT).exists() and not checkpoint.checkpoint_dirs(out_dir):
        raise checkpoint.CheckpointError(
            f"{out_dir / LEGACY_CHECKPOINT} is a pickled checkpoint of genoflash 0.1.0, which this version does not "
            f"load (loading a pickle can run code); start the run afresh")
    document = checkpoint.load_latest(out_dir, model, optimizer, scheduler)
    if document is None:
        return 0
    saved = document["trainer"]
    for key in ("batch_size", "grad_accum"):
        if saved.get(key) != getattr(cfg, key):
            logger.warning("the checkpoint was written with %s=%s, this run has %s; the data stream continues at "
                           "the new position, not where the interrupted run would have read", key, saved.get(key),
                           getattr(cfg, key))
    logger.info("resumed from %s at step %d", out_dir / checkpoint.CHECKPOINTS, document["step"])
    return int(document["step"])


def load_trained_model(out_dir: str | os.PathLike) -> torch.nn.Module:
    """The model a `genoflash train` run trained: built from its config.yaml, with the weights of its
    newest checkpoint that loads, on the CPU in eval mode. Reads only YAML and safetensors."""
    out_dir = pathlib.Path(out_dir)
    yaml = require("yaml", "train", "loading a training run")
    cfg = TrainConfig(**yaml.safe_load((out_dir / "config.yaml").read_text()))
    model = build_model(cfg)
    safetensors = require("safetensors.torch", "train", "loading a training run")
    reasons = []
    for path in checkpoint.checkpoint_dirs(out_dir):
        try:
            safetensors.load_model(model, str(path / checkpoint.WEIGHTS), strict=True)
            return model.eval()
        except Exception as error:  # noqa: BLE001 - a damaged checkpoint: the one before it
            reasons.append(f"{path.name}: {type(error).__name__}: {error}")
    raise checkpoint.CheckpointError(f"no checkpoint in {out_dir / checkpoint.CHECKPOINTS} loads" +
                                     "".join(f"\n  {r}" for r in reasons))


# ---------------------------------------------------------------- the loop

def resolve_device(name: str) -> torch.device:
    return torch.device("cuda" if name == "auto" and torch.cuda.is_available() else
                        "cpu" if name == "auto" else name)


def _autocast(device: torch.device):
    """bf16 autocast on CUDA; a no-op elsewhere (CPU training stays fp32 and bit-reproducible)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def build_model(cfg: TrainConfig) -> torch.nn.Module:
    return SequenceClassifier(cfg.model_config()) if cfg.task == "synthetic" else DNALM(cfg.model_config())


def train(cfg: TrainConfig, train_data: Dataset | None = None, eval_data: Dataset | None = None,
          on_eval: Callable[[int, dict], None] | None = None) -> dict:
    """Train per `cfg`; returns {"final": last held-out metrics, "history": every log record,
    "model": the trained model}. `on_eval(step, metrics)` is called after each evaluation.

    `train_data` / `eval_data` replace the datasets `cfg` describes (tests, custom data);
    they must give (tokens, target) pairs or GenomeWindowDataset-style dicts.
    """
    out_dir = pathlib.Path(cfg.out_dir)
    device = resolve_device(cfg.device)
    if cfg.context_parallel:
        device = _join_context_parallel_group(device)
    main_rank = not cfg.context_parallel or torch.distributed.get_rank() == 0
    if cfg.seq_len_warmup and cfg.task != "lm":
        logger.warning("seq_len_warmup applies to the lm task only (a crop would lose a motif); ignored")
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    random.seed(cfg.seed)
    if train_data is None or eval_data is None:
        default_train, default_eval = build_datasets(cfg)
        train_data = default_train if train_data is None else train_data
        eval_data = default_eval if eval_data is None else eval_data
    train_fetch, eval_fetch = SafeFetcher(train_data, cfg.strict), SafeFetcher(eval_data, cfg.strict)
    model = build_model(cfg).to(device)
    cp = None
    if cfg.context_parallel:  # same seed on every rank: the same initial weights everywhere
        from ..distributed import enable_context_parallel
        cp = enable_context_parallel(model)
        if cfg.seq_len % (2 * cp.world_size):
            raise ValueError(f"context_parallel: seq_len {cfg.seq_len} must be a multiple of 2 x world size = "
                             f"{2 * cp.world_size} (the zigzag layout)")
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg))
    log_path = out_dir / LOG_NAME
    start = resume(out_dir, model, optimizer, scheduler, cfg) if cfg.resume else 0
    # Only now, with the data, the model and any checkpoint loaded (a bad input has failed above),
    # is out_dir written: a run that cannot start leaves no directory behind.
    if main_rank:  # with context parallelism, rank 0 alone writes logs, checkpoints and plots
        _write_config(out_dir, cfg)
    history = _restart_log(log_path, start) if main_rank else []
    last = min(cfg.steps, cfg.stop_at or cfg.steps)

    def record(entry: dict) -> None:
        history.append(entry)
        if main_rank:
            with log_path.open("a") as f:
                f.write(json.dumps(entry) + "\n")

    model.train()
    tokens_seen, tick = 0, time.perf_counter()
    bad_in_a_row = 0
    with _progress(cfg.progress and start < last and main_rank) as bar:
        task = bar.add_task(f"{cfg.task} {cfg.layer_pattern}", total=last, completed=start, info="")
        for step in range(start, last):
            length = seq_len_at(step, cfg)
            micro_batches = [train_fetch.batch(range(first, first + cfg.batch_size), length)
                             for first in micro_batch_starts(step, cfg)]
            # Each micro-batch's mean loss, weighted by its share of the step's counted targets,
            # sums to the mean over the whole effective batch (weights 1 / grad_accum when every
            # micro-batch counts the same, as classification labels always do).
            counts = [_counted(targets) for _, targets in micro_batches]
            total = sum(counts)
            optimizer.zero_grad(set_to_none=True)
            loss = torch.zeros((), device=device)
            for (tokens, targets), count in zip(micro_batches, counts):
                tokens_seen += tokens.numel()
                if count == 0:  # nothing to learn from (every target ignored): no NaN mean, no gradient
                    continue
                weight = count / total
                tokens, targets = tokens.to(device), targets.to(device)
                if cp is None:
                    with _autocast(device):
                        micro_loss = model(tokens, targets)["loss"]
                    (micro_loss * weight).backward()
                    loss += micro_loss.detach().float() * weight
                else:
                    with _autocast(device):
                        local = cp.mean_loss(model(cp.shard(tokens))["logits"], cp.shard(targets))
                    (local * weight).backward()
                    loss += cp.global_value(local) * weight
            if cp is not None:
                cp.sum_gradients(model)  # once per step: every rank now holds the full-sequence gradient
            # The norm is taken whether or not it clips (inf: no clipping), to see a non-finite gradient.
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(),
                                                       cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
            # Every rank holds the same loss and gradient (context parallelism sums them), so every
            # rank takes the same decision here.
            finite = bool(torch.isfinite(loss)) and bool(torch.isfinite(grad_norm))
            skipped = None
            if finite:
                optimizer.step()
                bad_in_a_row = 0
            else:  # no weight and no optimizer moment changes: the step is skipped, the schedule goes on
                optimizer.zero_grad(set_to_none=True)
                bad_in_a_row += 1
                skipped = "non-finite loss" if not torch.isfinite(loss) else "non-finite gradient"
                logger.warning("step %d: %s (loss %s, gradient norm %s); its update is skipped", step + 1, skipped,
                               float(loss), float(grad_norm))
            scheduler.step()
            done = step + 1
            if done % cfg.log_every == 0 or done == last or skipped:  # a skipped step is always logged
                elapsed = time.perf_counter() - tick
                entry = {"step": done, "loss": loss.item() if total else math.nan, "lr": scheduler.get_last_lr()[0],
                         "seq_len": length, "tokens_per_s": tokens_seen / max(elapsed, 1e-9),
                         "skipped_samples": len(train_fetch.failed)}
                if cfg.grad_clip > 0 or skipped:
                    entry["grad_norm"] = float(grad_norm)
                if skipped:
                    entry["skipped"] = skipped
                if device.type == "cuda":
                    entry["gpu_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
                record(entry)
                tokens_seen, tick = 0, time.perf_counter()
                bar.update(task, info=_bar_text(entry))
            if bad_in_a_row >= cfg.max_bad_steps:
                raise TrainingDiverged(
                    f"{bad_in_a_row} steps in a row had a non-finite loss or gradient (the last at step {done}); "
                    f"stopping. The checkpoints in {out_dir / checkpoint.CHECKPOINTS} hold the last good weights; "
                    f"try a lower --lr, a longer --warmup-steps or --grad-clip")
            if done == last or (cfg.eval_every and done % cfg.eval_every == 0):
                metrics = evaluate(model, eval_fetch, cfg, device, cp)
                record({"step": done, "eval": metrics})
                if on_eval is not None:
                    on_eval(done, metrics)
            if main_rank and (done == last or done % cfg.checkpoint_every == 0):
                checkpoint.save(out_dir, done, model, optimizer, scheduler, _trainer_state(cfg, done),
                                cfg.keep_checkpoints)
            bar.update(task, completed=done)

    evals = [h["eval"] for h in history if "eval" in h]
    if main_rank:
        plot_curves(history, out_dir / PLOT_NAME, title=f"{cfg.task} ({cfg.layer_pattern})")
    return {"final": evals[-1] if evals else {}, "history": history, "model": model}


def _write_config(out_dir: pathlib.Path, cfg: TrainConfig) -> None:
    """out_dir/config.yaml, replaced whole (written beside it, then renamed): never half written."""
    yaml = require("yaml", "train", "genoflash train")
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = out_dir / "config.yaml.partial"
    partial.write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
    os.replace(partial, out_dir / "config.yaml")


def micro_batch_starts(step: int, cfg: TrainConfig) -> range:
    """First sample index of each micro-batch of `step`: (step * grad_accum + j) * batch_size."""
    first = step * cfg.grad_accum * cfg.batch_size
    return range(first, first + cfg.grad_accum * cfg.batch_size, cfg.batch_size)


def _counted(targets: torch.Tensor) -> int:
    """Targets the mean loss averages over: every label of a classification batch, the
    non-ignored (-100) ones of an LM batch."""
    return len(targets) if targets.dim() == 1 else int((targets != -100).sum())


def _join_context_parallel_group(device: torch.device) -> torch.device:
    """Join the torchrun job's process group (unless the caller already did) and pick this
    rank's GPU: NCCL on GPUs, gloo on CPUs."""
    import torch.distributed as dist

    if not dist.is_initialized():
        if "RANK" not in os.environ:
            raise RuntimeError("--context-parallel runs under torchrun (or with torch.distributed initialised): "
                               "torchrun --nproc-per-node N -m genoflash.cli train --context-parallel ...")
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", dist.get_rank() % torch.cuda.device_count())))
        torch.cuda.set_device(device)
    return device


def _restart_log(log_path: pathlib.Path, start: int) -> list[dict]:
    """Records up to `start` (a resumed run rewrites what came after its checkpoint). A line that is
    not whole JSON (the last one, cut short by a kill mid-write) is dropped with a warning."""
    kept = []
    if start and log_path.exists():
        for number, line in enumerate(log_path.read_text().splitlines(), 1):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                logger.warning("%s: line %d is not whole JSON (a write cut short); dropped", log_path, number)
                continue
            if entry.get("step", math.inf) <= start:
                kept.append(entry)
    log_path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    return kept


def _bar_text(entry: dict) -> str:
    text = f"loss {entry['loss']:.3f}  {entry['tokens_per_s']:,.0f} tok/s"
    if "gpu_mem_gib" in entry:
        text += f"  {entry['gpu_mem_gib']:.1f} GiB"
    return text


def _progress(enabled: bool):
    """A rich progress bar (loss, tokens/s, GPU memory in its text field); hidden if disabled."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    TextColumn("{task.fields[info]}"), disable=not enabled)


def plot_curves(history: list[dict], path: pathlib.Path, title: str = "") -> None:
    """Training loss and the held-out metric (accuracy or perplexity) against step, as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [h for h in history if "loss" in h and "eval" not in h]
    evals = [h for h in history if "eval" in h]
    metric = "accuracy" if evals and "accuracy" in evals[0]["eval"] else "perplexity"
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot([h["step"] for h in train], [h["loss"] for h in train], label="train")
    left.plot([h["step"] for h in evals], [h["eval"]["loss"] for h in evals], "o-", label="held out")
    left.set(xlabel="step", ylabel="loss", title="loss")
    left.legend()
    right.plot([h["step"] for h in evals], [h["eval"].get(metric, math.nan) for h in evals], "o-")
    right.set(xlabel="step", ylabel=metric, title=f"held-out {metric}")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# What a user can cause with a flag, a config file, a FASTA file or a run directory: reported in
# one line (--debug shows the traceback). Anything else is a bug and keeps its traceback.
INPUT_ERRORS = (ConfigError, CheckpointError, FileNotFoundError, ImportError, ValueError)


def main(argv: list[str] | None = None) -> int:
    """`genoflash train`: parse flags (and --config), train, print the final held-out metrics.

    Exit status: 0 done, 1 the run diverged (TrainingDiverged), 2 a bad input (the message names it)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        cfg = config_from_args(args)
        result = train(cfg)
    except TrainingDiverged as err:
        if args.debug:
            raise
        print(f"{parser.prog}: {err}", file=sys.stderr)
        return 1
    except INPUT_ERRORS as err:
        if args.debug:
            raise
        print(f"{parser.prog}: error: {err} (--debug shows the traceback)", file=sys.stderr)
        return 2
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():  # a --context-parallel job under torchrun
        rank = dist.get_rank()
        dist.destroy_process_group()
        if rank != 0:
            return 0
    print(json.dumps({"out_dir": cfg.out_dir, "final": result["final"]}, indent=2))
    return 0
