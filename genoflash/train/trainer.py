"""Training loop for genoflash models: `genoflash train`.

Three tasks:

- ``synthetic``: sequence classification on the long-range motif-grammar task
  (`SyntheticLongRangeDataset`), with a `SequenceClassifier`; held-out accuracy and AUROC.
- ``lm``: causal language modelling on windows of a FASTA file (`GenomeWindowDataset`),
  with a `DNALM`; held-out loss and perplexity.
- ``annotation``: a class per base from a BED of features (`AnnotationTrack`: none, the
  ``label_types`` in priority order, other), on windows of a FASTA (`AnnotationWindowDataset`),
  with a bidirectional `DNALM` whose head classifies each base; held-out accuracy, per-class F1
  and AUPRC, and macro F1 (`BaseTally`).

The FASTA tasks hold out whole chromosomes: ``val_chroms`` for the evaluations, ``test_chroms``
scored once at the end (a "test" record in the log); training reads every other chromosome.

What makes a long job safe to stop and restart:

- The data stream is a pure function of (seed, step): micro-batch ``j`` of step ``s`` holds
  items ``(s * grad_accum + j) * batch_size ...`` (``batch_size`` of them) of a lazily
  generated dataset, so a resumed run reads exactly the batches the uninterrupted run would
  have.
- ``out_dir/checkpoints/step-<n>/`` holds the model's and optimizer's tensors (safetensors written
  by every rank with torch.distributed.checkpoint), the RNG states and the step (which is also the
  data position) as JSON: nothing that loading could run as code. It is written beside the others
  and renamed into place, flushed to disk, so a crash mid-write never leaves a broken checkpoint;
  the newest ``keep_checkpoints`` stay (checkpoint.py). ``--resume`` continues bit for bit (on CPU;
  CUDA kernels may differ in the last bits) from the newest checkpoint that loads, on any number of
  ranks, and drops a log line a kill cut short.
- A step whose loss or gradient norm is not finite changes no weight (the update is skipped and
  logged); ``max_bad_steps`` of them in a row stop the run with an error, the last checkpoint
  (taken from good weights) kept.
- A sample that raises is logged once and replaced by the next index that loads
  (deterministically, so resume still matches); ``--strict`` makes it fatal instead.

Gradient accumulation (``--grad-accum``): one optimizer step runs ``grad_accum``
micro-batches of ``batch_size`` sequences, forward and backward one at a time, so the
effective batch is ``batch_size * grad_accum`` at the memory of one micro-batch. Each
micro-batch's loss is its targets' summed loss over the step's count of counted targets, so
the gradient is that of one batch of ``batch_size * grad_accum``; the gradient is clipped once,
after accumulation.

Under torchrun the ranks form a data-parallel x context-parallel mesh (parallel.py): data-parallel
rank r reads micro-batches ``((step * grad_accum + j) * dp + r) * batch_size ...``, so together
they read what one process with ``batch_size * dp`` would, and the gradients are reduced once per
step, after the last micro-batch.

Sequence-length warmup (``--seq-len-warmup``, as in HyenaDNA) trains on the first
``seq_len_start`` tokens of each window and doubles the length in equal stages over the
first ``seq_len_warmup_fraction`` of the steps. It applies to the FASTA tasks only: a
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
import torch.nn.functional as F
from torch.utils.data import Dataset

from ..data import (IGNORE_INDEX, AnnotationTrack, ChromosomeDataset, FastaFile, GenomeWindowDataset, Labelled,
                    MotifGrammar, SyntheticLongRangeDataset)
from ..data.examples import resolve_fasta
from ..extras import require
from ..models.dna_lm import DNALM
from . import checkpoint
from .classifier import SequenceClassifier
from .checkpoint import CheckpointError
from . import parallel
from .config import ConfigError, TrainConfig, build_parser, config_from_args, flag
from .optim import no_decay_names, param_groups

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
    if not cfg.seq_len_warmup or cfg.task == "synthetic" or cfg.seq_len_start >= cfg.seq_len:
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


def build_datasets(cfg: TrainConfig, dp: int = 1) -> tuple[Dataset, Dataset, Dataset | None]:
    """(train, held-out, test or None) datasets, all lazy: the train stream has steps * batch_size *
    grad_accum * dp items (every micro-batch of every step of every data-parallel rank reads its own).

    FASTA tasks read their windows by chromosome: training from every chromosome but val_chroms and
    test_chroms, the evaluations from val_chroms (or, without them, other windows of the training
    chromosomes), the test from test_chroms."""
    n_train = cfg.steps * cfg.batch_size * cfg.grad_accum * dp
    if cfg.task == "synthetic":
        grammar = MotifGrammar.random(n_families=cfg.n_families, motif_length=cfg.motif_length, seed=cfg.seed)
        shape = dict(grammar=grammar, margin=cfg.margin, sites=cfg.sites, spacer=cfg.spacer)
        train = SyntheticLongRangeDataset(n_train, cfg.seq_len, cfg.distance, seed=cfg.seed, **shape)
        held_out = SyntheticLongRangeDataset(cfg.eval_samples, cfg.seq_len, cfg.distance,
                                             seed=cfg.seed + 1_000_003, **shape)
        return train, held_out, None
    fasta = FastaFile(resolve_fasta(cfg.fasta))
    train_chroms, val, test = split_chroms(cfg, fasta.contigs)
    objective = "clm" if cfg.task == "lm" else None
    track = None
    if cfg.task == "annotation":
        track = AnnotationTrack.from_bed(cfg.bed, cfg.types(), cfg.bed_type_column)
        if not set(track.chroms) & set(fasta.contigs):
            raise ConfigError(f"bed ({flag('bed')}): no feature lies on a chromosome of the FASTA "
                              f"({', '.join(fasta.contigs[:5])}{', ...' if len(fasta.contigs) > 5 else ''})")

    def sequences(n, seed, contigs, held_out=False):
        if cfg.whole_chroms:  # an evaluation reads each of its chromosomes once
            n = len(contigs) if held_out else n
            try:
                data = ChromosomeDataset(fasta, n, seed=seed, contigs=contigs, objective=objective, each=held_out,
                                         max_length=cfg.seq_len + (objective == "clm"))
            except ValueError as err:
                raise ConfigError(f"seq_len ({flag('seq_len')}) is the longest chromosome whole_chroms reads: "
                                  f"{err}") from None
        else:
            data = GenomeWindowDataset(fasta, cfg.seq_len, n, seed=seed, objective=objective, contigs=contigs)
        return Labelled(data, track) if track is not None else data

    train = sequences(n_train, cfg.seed, train_chroms)
    held_out = sequences(cfg.eval_samples, cfg.seed + 1_000_003, val or train_chroms, held_out=True)
    tested = sequences(cfg.eval_samples, cfg.seed + 2_000_003, test, held_out=True) if test else None
    return train, held_out, tested


def split_chroms(cfg: TrainConfig, contigs: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(training, validation, test) chromosomes of the FASTA, each named one checked against it."""
    val, test = cfg.chroms("val_chroms"), cfg.chroms("test_chroms")
    for key, names in (("val_chroms", val), ("test_chroms", test)):
        unknown = [c for c in names if c not in contigs]
        if unknown:
            raise ConfigError(f"{key} ({flag(key)}): {', '.join(unknown)} not in the FASTA, whose chromosomes are "
                              f"{', '.join(contigs[:8])}{', ...' if len(contigs) > 8 else ''}")
    train = [c for c in contigs if c not in val and c not in test]
    if not train:
        raise ConfigError("val_chroms and test_chroms (--val-chroms, --test-chroms) hold out every chromosome: "
                          "none is left to train on")
    return train, val, test


# ---------------------------------------------------------------- evaluation

@torch.no_grad()
def evaluate(model: torch.nn.Module, data: SafeFetcher, cfg: TrainConfig, par: parallel.Parallel | None = None) -> dict:
    """Held-out metrics: accuracy and AUROC (synthetic), or loss and perplexity (lm).

    In a torchrun job each data-parallel rank scores its own slice of the held-out set (its
    context-parallel ranks a shard of each sequence) and the sums are reduced over the ranks.
    Every rank runs the same number of batches, as the collectives inside the model need: a slice
    that runs past the set's end is padded with rows whose targets are all ignored."""
    par = par or parallel.Parallel(next(model.parameters()).device)
    model.eval()
    n = len(data.dataset)
    per = -(-n // par.dp)  # held-out rows per data-parallel rank
    mine = range(par.dp_rank * per, (par.dp_rank + 1) * per)
    sums = torch.zeros(2, dtype=torch.float64)  # (summed loss, counted targets) of this rank's shards
    probs, labels = [], []
    tally = BaseTally(len(cfg.types()) + 2) if cfg.task == "annotation" else None
    for start in range(0, per, cfg.batch_size):
        rows = mine[start:start + cfg.batch_size]
        tokens, targets = data.batch([i if i < n else 0 for i in rows])
        targets[torch.tensor([i >= n for i in rows])] = IGNORE_INDEX  # padding: counts nothing
        tokens, targets = par.shard(tokens).to(par.device), par.shard(targets).to(par.device)
        with _autocast(par.device):
            logits = model(tokens)["logits"]
        sums += torch.stack([_loss_sum(logits, targets).double().cpu(), torch.tensor(_counted(targets), dtype=torch.float64)])
        if cfg.task == "synthetic":
            probs.append(logits.float().softmax(-1)[:, 1].cpu())
            labels.append(targets.cpu())
        elif tally is not None:
            tally.add(logits, targets)
    model.train()
    loss, count = par.sum(sums).tolist()
    metrics = {"loss": loss / max(count, 1)}
    if cfg.task == "synthetic":
        p, y = par.gather(torch.cat(probs)).numpy(), par.gather(torch.cat(labels)).numpy()
        p, y = p[y != IGNORE_INDEX], y[y != IGNORE_INDEX]
        metrics.update(accuracy=float(((p > 0.5) == (y == 1)).mean()), auroc=auroc(p, y))
    elif tally is not None:
        metrics.update(tally.metrics(["none", *cfg.types(), "other"], par))
    else:
        metrics["perplexity"] = math.exp(min(metrics["loss"], 50.0))
    return metrics


class BaseTally:
    """Per-base classification counts of an evaluation, summed over batches and ranks: the
    confusion matrix (true class x predicted class, the argmax) and, per class, histograms of its
    predicted probability over the bases of that class and over the others (BINS bins), from which
    the average precision (area under the precision-recall curve) follows to within a bin."""

    BINS = 1000

    def __init__(self, num_classes: int):
        self.c = num_classes
        self.confusion = torch.zeros(num_classes, num_classes, dtype=torch.float64)
        self.hist = torch.zeros(2, num_classes, self.BINS, dtype=torch.float64)  # (negatives, positives)

    def add(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        keep = targets != IGNORE_INDEX
        y = targets[keep].long()
        p = logits[keep].float().softmax(-1)                                   # (bases, classes)
        c, bins = self.c, self.BINS
        self.confusion += torch.bincount(y * c + p.argmax(-1), minlength=c * c).view(c, c).double().cpu()
        flat = torch.arange(c, device=p.device) * bins + (p * bins).long().clamp(max=bins - 1)  # class, bin
        positive = torch.nn.functional.one_hot(y, c).bool()
        for j, which in enumerate((~positive, positive)):
            self.hist[j] += torch.bincount(flat[which], minlength=c * bins).view(c, bins).double().cpu()

    def metrics(self, names: list[str], par: parallel.Parallel) -> dict:
        confusion = par.sum(self.confusion).numpy()
        hist = par.sum(self.hist).numpy()
        total = confusion.sum()
        true, predicted, hit = confusion.sum(1), confusion.sum(0), np.diag(confusion)
        with np.errstate(invalid="ignore", divide="ignore"):
            f1 = 2 * hit / (true + predicted)                      # NaN for a class neither present nor predicted
            # Precision at each threshold, from the highest bin down; AP = sum of precision x recall steps.
            tp = np.cumsum(hist[1][:, ::-1], axis=1)
            fp = np.cumsum(hist[0][:, ::-1], axis=1)
            precision = tp / np.maximum(tp + fp, 1)
            recall_step = hist[1][:, ::-1] / true[:, None]
            ap = (precision * recall_step).sum(1)
        ap[true == 0] = np.nan
        present = true > 0
        return {"accuracy": float(hit.sum() / max(total, 1)),
                "macro_f1": float(np.nanmean(np.where(present, f1, np.nan))) if present.any() else math.nan,
                "f1": {n: float(v) for n, v in zip(names, f1)},
                "auprc": {n: float(v) for n, v in zip(names, ap)},
                "bases": {n: int(v) for n, v in zip(names, true)}}


# ---------------------------------------------------------------- checkpoints

class TrainingDiverged(RuntimeError):
    """max_bad_steps steps in a row had a non-finite loss or gradient."""


def _trainer_state(cfg: TrainConfig, step: int, par: parallel.Parallel) -> dict:
    """What a checkpoint records of the run besides the model and optimizer: the step, which is
    also the data position, and how many samples each step read, so that a resume with other
    batch settings can be told apart."""
    return {"data_position": step, "batch_size": cfg.batch_size, "grad_accum": cfg.grad_accum,
            "data_parallel": par.dp, "context_parallel": par.cp, "ranks": par.world}


def resume(out_dir: pathlib.Path, model, optimizer, scheduler, cfg: TrainConfig, par: parallel.Parallel) -> int:
    """Restore the newest checkpoint that loads; returns the step to continue from (0: none)."""
    if (out_dir / LEGACY_CHECKPOINT).exists() and not checkpoint.checkpoint_dirs(out_dir):
        raise checkpoint.CheckpointError(
            f"{out_dir / LEGACY_CHECKPOINT} is a pickled checkpoint of genoflash 0.1.0, which this version does not "
            f"load (loading a pickle can run code); start the run afresh")
    document = checkpoint.load_latest(out_dir, model, optimizer, scheduler)
    if document is None:
        return 0
    saved = document["trainer"]
    for key, now in (("batch_size", cfg.batch_size), ("grad_accum", cfg.grad_accum), ("data_parallel", par.dp)):
        if saved.get(key, 1) != now and par.main:
            logger.warning("the checkpoint was written with %s=%s, this run has %s; the data stream continues at "
                           "the new position, not where the interrupted run would have read", key, saved.get(key, 1),
                           now)
    logger.info("resumed from %s at step %d", out_dir / checkpoint.CHECKPOINTS, document["step"])
    return int(document["step"])


def load_trained_model(out_dir: str | os.PathLike) -> torch.nn.Module:
    """The model a `genoflash train` run trained: built from its config.yaml, with the weights of its
    newest checkpoint that loads, on the CPU in eval mode. Reads only YAML and safetensors."""
    out_dir = pathlib.Path(out_dir)
    yaml = require("yaml", "train", "loading a training run")
    cfg = TrainConfig(**yaml.safe_load((out_dir / "config.yaml").read_text()))
    model = build_model(cfg)
    reasons = []
    for path in checkpoint.checkpoint_dirs(out_dir):
        try:
            return checkpoint.load_weights(path, model).eval()
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

    Alone it trains in this process; as one rank of a torchrun job (or with a process group
    already initialised) it trains its part of the job's dp x cp mesh (parallel.py), every rank
    calling train with the same cfg.

    `train_data` / `eval_data` replace the datasets `cfg` describes (tests, custom data);
    they must give (tokens, target) pairs or GenomeWindowDataset-style dicts.
    """
    out_dir = pathlib.Path(cfg.out_dir)
    par = parallel.setup(resolve_device(cfg.device), cfg.context_parallel, cfg.data_parallel)
    device = par.device
    if cfg.seq_len_warmup and cfg.task == "synthetic":
        logger.warning("seq_len_warmup applies to the lm and annotation tasks only (a crop would lose a motif); "
                       "ignored")
    # The same seed on every rank: the replicas start equal, and every rank draws the same random
    # numbers (a checkpoint keeps each rank's generators all the same).
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    random.seed(cfg.seed)
    test_data = None
    if train_data is None or eval_data is None:
        default_train, default_eval, test_data = build_datasets(cfg, par.dp)
        train_data = default_train if train_data is None else train_data
        eval_data = default_eval if eval_data is None else eval_data
    train_fetch, eval_fetch = SafeFetcher(train_data, cfg.strict), SafeFetcher(eval_data, cfg.strict)
    model = build_model(cfg).to(device)
    no_decay = no_decay_names(model)
    model = par.wrap(model)
    optimizer = torch.optim.AdamW(param_groups(par.unwrap(model), cfg.weight_decay, no_decay), lr=cfg.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg))
    log_path = out_dir / LOG_NAME
    start = resume(out_dir, model, optimizer, scheduler, cfg, par) if cfg.resume else 0
    # Only now, with the data, the model and any checkpoint loaded (a bad input has failed above),
    # is out_dir written: a run that cannot start leaves no directory behind.
    if par.main:  # rank 0 alone writes the config, the log and the plot
        _write_config(out_dir, cfg)
    history = _restart_log(log_path, start) if par.main else []
    last = min(cfg.steps, cfg.stop_at or cfg.steps)

    def record(entry: dict) -> None:
        history.append(entry)
        if par.main:
            with log_path.open("a") as f:
                f.write(json.dumps(entry) + "\n")

    sequences = cfg.batch_size * cfg.grad_accum * par.dp  # per optimizer step, over the whole job
    record({"step": start, "run": {"layout": par.describe(), "ranks": par.world, "data_parallel": par.dp,
                                   "context_parallel": par.cp, "sequences_per_step": sequences,
                                   "tokens_per_step": sequences * cfg.seq_len, "lr": cfg.lr,
                                   "parameters": sum(p.numel() for p in par.unwrap(model).parameters())}})
    if par.main:
        logger.info("%s; %d sequences per step (batch_size %d x grad_accum %d x data parallel %d), peak lr %g",
                    par.describe(), sequences, cfg.batch_size, cfg.grad_accum, par.dp, cfg.lr)
    model.train()
    tokens_seen, tick = 0, time.perf_counter()
    bad_in_a_row = 0
    with _progress(cfg.progress and start < last and par.main) as bar:
        task = bar.add_task(f"{cfg.task} {cfg.layer_pattern}", total=last, completed=start, info="")
        for step in range(start, last):
            length = seq_len_at(step, cfg)
            micro_batches = [train_fetch.batch(range(first, first + cfg.batch_size), length)
                             for first in micro_batch_starts(step, cfg, par.dp, par.dp_rank)]
            tokens_seen += sum(tokens.numel() for tokens, _ in micro_batches) * par.dp
            shards = [(par.shard(tokens), par.shard(targets)) for tokens, targets in micro_batches]
            # Each rank's loss is its targets' summed loss over the step's global count of counted
            # targets (times world, which DDP's and FSDP's average divides out): the gradients sum to
            # the mean loss's over the global batch however it is split (parallel.py).
            counts = par.sum(torch.tensor([_counted(targets) for _, targets in shards], dtype=torch.float64))
            total = float(counts.sum())
            live = [j for j, count in enumerate(counts.tolist()) if count > 0]  # the same on every rank
            optimizer.zero_grad(set_to_none=True)
            loss_sum = torch.zeros((), dtype=torch.float64, device=device)
            for j in live:  # a micro-batch with nothing to learn from (every target ignored) is left out
                tokens, targets = (t.to(device) for t in shards[j])
                with par.gradient_sync(model, sync=j == live[-1]):  # reduced once, after the last
                    with _autocast(device):
                        logits = model(tokens)["logits"]
                    local = _loss_sum(logits, targets)
                    (local * (par.world / total)).backward()
                loss_sum += local.detach().double()
            loss = par.sum(loss_sum) / total if total else torch.tensor(math.nan, dtype=torch.float64)
            # The norm is taken whether or not it clips (inf: no clipping), to see a non-finite gradient;
            # it is the global norm, the same on every rank, as the loss is: every rank decides alike.
            grad_norm = parallel.grad_norm(model, cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
            finite = bool(torch.isfinite(loss)) and bool(torch.isfinite(grad_norm))
            skipped = None
            if finite or not total:
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
                elapsed = max(time.perf_counter() - tick, 1e-9)
                entry = {"step": done, "loss": float(loss), "lr": scheduler.get_last_lr()[0], "seq_len": length,
                         "tokens_per_s": tokens_seen / elapsed, "skipped_samples": len(train_fetch.failed)}
                if par.distributed:
                    entry["tokens_per_s_per_rank"] = tokens_seen / elapsed / par.world
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
                metrics = evaluate(model, eval_fetch, cfg, par)
                record({"step": done, "eval": metrics})
                if on_eval is not None:
                    on_eval(done, metrics)
            if done == last and test_data is not None:  # the held-out test chromosomes, once
                record({"step": done, "test": evaluate(model, SafeFetcher(test_data, cfg.strict), cfg, par)})
            if done == last or done % cfg.checkpoint_every == 0:  # every rank writes its part
                checkpoint.save(out_dir, done, model, optimizer, scheduler, _trainer_state(cfg, done, par),
                                cfg.keep_checkpoints)
            bar.update(task, completed=done)

    evals = [h["eval"] for h in history if "eval" in h]
    tests = [h["test"] for h in history if "test" in h]
    if par.main:
        plot_curves(history, out_dir / PLOT_NAME, title=f"{cfg.task} ({cfg.layer_pattern})")
    result = {"final": evals[-1] if evals else {}, "history": history, "model": par.unwrap(model)}
    if tests:
        result["test"] = tests[-1]
    return result


def _write_config(out_dir: pathlib.Path, cfg: TrainConfig) -> None:
    """out_dir/config.yaml, replaced whole (written beside it, then renamed): never half written."""
    yaml = require("yaml", "train", "genoflash train")
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = out_dir / "config.yaml.partial"
    partial.write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
    os.replace(partial, out_dir / "config.yaml")


def micro_batch_starts(step: int, cfg: TrainConfig, dp: int = 1, dp_rank: int = 0) -> range:
    """First sample index of each micro-batch data-parallel rank `dp_rank` reads at `step`:
    ((step * grad_accum + j) * dp + dp_rank) * batch_size. The dp ranks' micro-batches j together
    are the samples one process with batch_size * dp would read."""
    stride = cfg.batch_size * dp
    first = step * cfg.grad_accum * stride + dp_rank * cfg.batch_size
    return range(first, first + cfg.grad_accum * stride, stride)


def _counted(targets: torch.Tensor) -> int:
    """Targets a mean loss averages over: those not ignored (IGNORE_INDEX)."""
    return int((targets != IGNORE_INDEX).sum())


def _loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy of the counted targets, in float32: a classifier's (batch, classes)
    logits, or an LM's (batch, seqlen, vocab) against targets already aligned per position."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="sum")


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
    rank = int(os.environ.get("RANK", "0"))  # under torchrun; every rank but 0 keeps to warnings
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"%(levelname)s {f'[rank {rank}] ' if 'RANK' in os.environ else ''}%(message)s")
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
        if rank == 0:  # every rank meets the same bad input: one message
            print(f"{parser.prog}: error: {err} (--debug shows the traceback)", file=sys.stderr)
        return 2
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    if rank == 0:
        print(json.dumps({"out_dir": cfg.out_dir, "final": result["final"],
                          **({"test": result["test"]} if "test" in result else {})}, indent=2))
    return 0
