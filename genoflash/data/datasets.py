"""Torch datasets that stream windows from a FASTA file.

Each dataset holds a ``FastaFile`` (a pyfaidx handle plus the contig lengths), never the
genome: bases are read from disk per item, and each DataLoader worker opens its own
handle. Every item is a pure function of ``(seed, epoch, index)``: the same item comes
back whatever the worker count or order; call ``set_epoch`` to draw fresh randomness
(windows, masks, shifts, strands) each epoch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from .augment import random_reverse_complement, random_shift, reverse_complement_tokens
from .bed import SPLITS, Interval, read_bed, resize
from .fasta import FastaFile
from .onehot import N_VALUES, one_hot
from .tokenizer import MASK_ID, N_ID, encode

IGNORE_INDEX = -100  # label value that torch.nn.functional.cross_entropy ignores
logger = logging.getLogger(__name__)


def _as_fasta(fasta: str | os.PathLike | FastaFile, index_dir: str | os.PathLike | None) -> FastaFile:
    return fasta if isinstance(fasta, FastaFile) else FastaFile(fasta, index_dir=index_dir)


def item_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """A torch.Generator for one item, from numpy's SeedSequence child ``(epoch, index)``.

    Hashing gives well-separated streams for neighbouring indices, which
    ``manual_seed(seed + index)`` would not (and a spawn key, unlike an entropy list
    such as ``[seed, 0, 0]``, never collides with a shorter list padded by zeros).
    """
    state = np.random.SeedSequence(seed, spawn_key=(epoch, index)).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


class GenomeWindowDataset(Dataset):
    """Fixed-length windows drawn uniformly from a genome, for language-model pretraining.

    Item ``i`` is a window at a start drawn uniformly over every valid window position in
    the genome (contigs shorter than a window are never used). Windows with more than
    ``max_n_fraction`` N are redrawn, up to ``max_tries`` times.

    Returns a dict with ``input_ids`` (int64, (window_length,)), ``chrom``, ``start``,
    ``reverse_complement`` and, depending on ``objective``:

    - ``"mlm"``: masked LM. Each A/C/G/T position is masked with probability
      ``mask_prob`` (N is never a target): ``input_ids`` has [MASK] there and ``labels``
      the original base; ``labels`` is -100 everywhere else. (All masked positions get
      [MASK]; BERT's 80/10/10 replacement is not applied.)
    - ``"clm"``: causal LM. A window of ``window_length + 1`` bases is read;
      ``input_ids`` is all but the last base and ``labels`` all but the first (the next
      base at each position), with -100 where the next base is N.
    - ``None``: ``input_ids`` only.
    """

    def __init__(self, fasta: str | os.PathLike | FastaFile, window_length: int, num_windows: int, *,
                 seed: int = 0, objective: str | None = "mlm", mask_prob: float = 0.15,
                 rc_prob: float = 0.0, max_n_fraction: float = 0.5, max_tries: int = 100,
                 contigs: Sequence[str] | None = None, index_dir: str | os.PathLike | None = None):
        if objective not in ("mlm", "clm", None):
            raise ValueError(f"objective must be 'mlm', 'clm' or None, got {objective!r}")
        if window_length <= 0 or num_windows < 0 or max_tries <= 0:
            raise ValueError("window_length and max_tries must be positive and num_windows >= 0")
        self.fasta = _as_fasta(fasta, index_dir)
        self.window_length, self.num_windows, self.seed, self.epoch = window_length, num_windows, seed, 0
        self.objective, self.mask_prob, self.rc_prob = objective, mask_prob, rc_prob
        self.max_n_fraction, self.max_tries = max_n_fraction, max_tries
        self._read_length = window_length + (objective == "clm")
        names = list(contigs) if contigs is not None else self.fasta.contigs
        starts_per_contig = [self.fasta.contig_length(c) - self._read_length + 1 for c in names]
        self._contigs = [c for c, n in zip(names, starts_per_contig) if n > 0]
        if not self._contigs:
            raise ValueError(f"no contig in {self.fasta.path} is at least "
                             f"{self._read_length} bases long")
        # Window k (over all contigs) is contig j's window k - offsets[j].
        self._offsets = np.cumsum([0] + [n for n in starts_per_contig if n > 0])

    def __len__(self) -> int:
        return self.num_windows

    def set_epoch(self, epoch: int) -> None:
        """Use epoch-specific windows, masks and strands from now on."""
        self.epoch = epoch

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < self.num_windows:
            raise IndexError(f"index {index} out of range for {self.num_windows} windows")
        generator = item_generator(self.seed, self.epoch, index)
        chrom, start, tokens = self._draw_window(index, generator)
        flipped = False
        if self.rc_prob > 0:
            tokens, flipped = random_reverse_complement(tokens, generator, self.rc_prob)
        item = {"chrom": chrom, "start": start, "reverse_complement": flipped}
        if self.objective == "mlm":
            targets = (tokens != N_ID) & (torch.rand(tokens.shape, generator=generator) < self.mask_prob)
            item["input_ids"] = tokens.masked_fill(targets, MASK_ID)
            item["labels"] = tokens.masked_fill(~targets, IGNORE_INDEX)
        elif self.objective == "clm":
            item["input_ids"] = tokens[:-1]
            item["labels"] = tokens[1:].masked_fill(tokens[1:] == N_ID, IGNORE_INDEX)
        else:
            item["input_ids"] = tokens
        return item

    def _draw_window(self, index: int, generator: torch.Generator) -> tuple[str, int, torch.Tensor]:
        """A window with at most ``max_n_fraction`` N, drawn with ``generator``."""
        for _ in range(self.max_tries):
            k = int(torch.randint(int(self._offsets[-1]), (), generator=generator))
            j = int(np.searchsorted(self._offsets, k, side="right")) - 1
            chrom, start = self._contigs[j], k - int(self._offsets[j])
            end = start + self._read_length
            tokens = encode(self.fasta.fetch(chrom, start, end), name=f"{chrom}:{start}-{end}")
            if (tokens == N_ID).float().mean() <= self.max_n_fraction:
                return chrom, start, tokens
        raise RuntimeError(
            f"window {index}: no window of {self._read_length} bases in {self.fasta.path} with at "
            f"most {self.max_n_fraction:.0%} N found in {self.max_tries} tries; the genome is mostly "
            f"N at this length: raise max_n_fraction or max_tries, or pick contigs")


class ChromosomeDataset(Dataset):
    """Whole chromosomes as sequences, for training and evaluating at chromosome-length context.

    Item i is a whole chromosome of `contigs` (default every one): drawn uniformly at random per
    (seed, epoch, index), or with ``each=True`` the i-th in order (cycling), so that an evaluation
    reads every chromosome once. The items are dicts as `GenomeWindowDataset` gives them (``chrom``,
    ``start`` 0, ``input_ids``, and for ``objective="clm"`` the next-base ``labels``, -100 where that
    base is N); their lengths differ, so a batch holds one. Chromosomes longer than `max_length`
    are refused when the dataset is made."""

    def __init__(self, fasta: str | os.PathLike | FastaFile, num_items: int, *, seed: int = 0,
                 contigs: Sequence[str] | None = None, objective: str | None = "clm", each: bool = False,
                 max_length: int | None = None, index_dir: str | os.PathLike | None = None):
        if objective not in ("clm", None):
            raise ValueError(f"objective must be 'clm' or None, got {objective!r}")
        if num_items < 0:
            raise ValueError(f"num_items must be >= 0, got {num_items}")
        self.fasta = _as_fasta(fasta, index_dir)
        self.contigs = list(contigs) if contigs is not None else self.fasta.contigs
        if not self.contigs:
            raise ValueError("contigs must name at least one chromosome")
        longest = max(self.contigs, key=self.fasta.contig_length)
        if max_length is not None and self.fasta.contig_length(longest) > max_length:
            raise ValueError(f"{longest} has {self.fasta.contig_length(longest):,} bases, more than max_length "
                             f"{max_length:,}")
        self.num_items, self.seed, self.objective, self.each, self.epoch = num_items, seed, objective, each, 0

    def __len__(self) -> int:
        return self.num_items

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < self.num_items:
            raise IndexError(f"index {index} out of range for {self.num_items} items")
        if self.each:
            chrom = self.contigs[index % len(self.contigs)]
        else:
            generator = item_generator(self.seed, self.epoch, index)
            chrom = self.contigs[int(torch.randint(len(self.contigs), (), generator=generator))]
        tokens = encode(self.fasta.fetch(chrom, 0, self.fasta.contig_length(chrom)), name=chrom)
        item = {"chrom": chrom, "start": 0, "reverse_complement": False}
        if self.objective == "clm":
            item["input_ids"] = tokens[:-1]
            item["labels"] = tokens[1:].masked_fill(tokens[1:] == N_ID, IGNORE_INDEX)
        else:
            item["input_ids"] = tokens
        return item


class IntervalDataset(Dataset):
    """Labelled BED intervals, resized about their centres, for classification/regression.

    Args:
        fasta: FASTA path or FastaFile.
        intervals: a BED path (read with ``read_bed``'s defaults) or a sequence of
            ``Interval``: ``read_bed(path, bed_columns=..., split_column=...)`` for a file
            with extra columns or a split column, ``split_by_chrom(...)`` for held-out
            chromosomes.
        length: every interval is resized to this many bases about its centre; parts
            past a contig end are padded with N.
        labels: one label (a number or a vector) per interval, in the order of
            ``intervals`` (of the BED file's records); integer labels come back as int64
            (class ids), others as float32. ``None`` uses the BED score column.
        output: ``"one_hot"`` ((length, 4) float32, ``n_value`` for N) or ``"tokens"``
            ((length,) int64).
        split: keep only records whose ``split`` (``train``, ``valid`` or ``test``) is this;
            each record must have one (see ``intervals``).
        stranded: reverse-complement records on the ``-`` strand.
        max_shift: random shift of up to this many bases (see ``augment.random_shift``).
        rc_prob: probability of a random reverse complement (augmentation).
        on_error: what to do with a record that does not fit the genome (unknown
            contig, or coordinates outside the contig): ``"raise"`` a ValueError
            naming the BED line, or ``"skip"`` it with one logged warning. Records are
            checked once, here, so a long job never meets one mid-epoch.

    Items are ``(x, label)``.
    """

    def __init__(self, fasta: str | os.PathLike | FastaFile,
                 intervals: str | os.PathLike | Sequence[Interval], *, length: int,
                 labels: Sequence | np.ndarray | torch.Tensor | None = None,
                 output: str = "one_hot", n_value: float = 0.25, split: str | None = None,
                 stranded: bool = False, max_shift: int = 0, rc_prob: float = 0.0, seed: int = 0,
                 on_error: str = "raise", index_dir: str | os.PathLike | None = None):
        if output not in ("one_hot", "tokens"):
            raise ValueError(f"output must be 'one_hot' or 'tokens', got {output!r}")
        if n_value not in N_VALUES:
            raise ValueError(f"n_value must be one of {N_VALUES}, got {n_value!r}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if split is not None and split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)} or None, got {split!r}")
        self.fasta = _as_fasta(fasta, index_dir)
        records = read_bed(intervals) if isinstance(intervals, (str, os.PathLike)) else list(intervals)
        all_labels = self._labels(records, labels)
        keep = [i for i, record in enumerate(records)
                if (split is None or self._in_split(record, split)) and self._fits(record, on_error)]
        self.records = [records[i] for i in keep]
        self.labels = all_labels[keep]
        self.length, self.output, self.n_value = length, output, n_value
        self.stranded, self.max_shift, self.rc_prob = stranded, max_shift, rc_prob
        self.seed, self.epoch = seed, 0

    @staticmethod
    def _labels(records: list[Interval], labels) -> torch.Tensor:
        if labels is None:
            missing = next((r for r in records if r.score is None), None)
            if missing is not None:
                raise ValueError(f"{missing.where}: no score column to use as the label; pass labels=")
            return torch.tensor([r.score for r in records], dtype=torch.float32)
        labels = torch.as_tensor(np.asarray(labels))
        if len(labels) != len(records):
            raise ValueError(f"got {len(labels)} labels for {len(records)} intervals")
        return labels.long() if not labels.is_floating_point() else labels.float()

    @staticmethod
    def _in_split(record: Interval, split: str) -> bool:
        if record.split is None:
            raise ValueError(f"{record.where}: split={split!r} asked for but the record has no split: read "
                             f"the BED with read_bed(path, split_column=...) or assign splits by chromosome "
                             f"with split_by_chrom(records, {{'valid': [...], 'test': [...]}})")
        return record.split == split

    def _fits(self, record: Interval, on_error: str) -> bool:
        """Whether the record lies on a known contig, within it; raise or warn if not."""
        length = self.fasta.contig_lengths.get(record.chrom)
        if length is not None and 0 <= record.start <= record.end <= length:
            return True
        problem = (f"contig {record.chrom!r} is not in {self.fasta.path}" if length is None else
                   f"not within 0..{length}, the length of {record.chrom!r}")
        message = f"{record.where}: bad record {record.chrom}:{record.start}-{record.end}: {problem}"
        if on_error == "raise":
            raise ValueError(message + "; pass on_error='skip' to skip such records")
        logger.warning("%s; skipped", message)
        return False

    def __len__(self) -> int:
        return len(self.records)

    def set_epoch(self, epoch: int) -> None:
        """Use epoch-specific shifts and strands from now on."""
        self.epoch = epoch

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self.records):
            raise IndexError(f"index {index} out of range for {len(self.records)} intervals")
        record = resize(self.records[index], self.length)
        generator = item_generator(self.seed, self.epoch, index)
        start, end = record.start, record.end
        if self.max_shift:
            start, end = random_shift(start, end, self.max_shift,
                                      self.fasta.contig_lengths[record.chrom], generator)
        sequence = self.fasta.fetch(record.chrom, start, end, pad=True)
        tokens = encode(sequence, name=f"{record.where} ({record.chrom}:{start}-{end})")
        if self.stranded and record.strand == "-":
            tokens = reverse_complement_tokens(tokens)
        if self.rc_prob > 0:
            tokens, _ = random_reverse_complement(tokens, generator, self.rc_prob)
        x = one_hot(tokens, n_value=self.n_value) if self.output == "one_hot" else tokens
        return x, self.labels[index]
