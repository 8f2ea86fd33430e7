"""Per-base labels from a BED of annotated features, for sequence-labelling tasks (which bases are
coding, intronic, a tRNA, ...), and windows of a genome with their labels.

Each base gets one class: the first of `types` whose feature covers it, else "other" when a
feature of an unlisted type covers it, else "none". So the class ids are

    0 none, 1 .. len(types) the types in priority order, len(types) + 1 other

and the order of `types` settles overlaps: with types ("CDS", "gene", "tRNA") a coding base is CDS,
a base of a gene outside its CDS (an intron, a UTR) is gene, and an LTR base is other. A
feature's type is a column of the BED: the name (column 4, the default), or a column past the six
standard ones, such as the GenBank feature type that `sacCer_S288C.annotations.bed` keeps in column
7. A BED12 record labels its blocks (exons) only.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from .bed import Interval, read_bed
from .datasets import IGNORE_INDEX, GenomeWindowDataset
from .fasta import FastaFile
from .tokenizer import N_ID

NONE, OTHER = "none", "other"


class AnnotationTrack:
    """Per-base class ids of a genome's annotated features (see the module docstring).

    Args:
        intervals: the features (`read_bed`'s Intervals).
        types: feature types that get a class of their own, highest priority first.
        type_column: where a feature's type is: 4 (the name) or a column number from 7 (counting
            from 1), read from the record's extra columns.
    """

    def __init__(self, intervals: Iterable[Interval], types: Sequence[str], type_column: int = 4):
        types = list(types)
        if not types or any(not isinstance(t, str) or not t for t in types) or len(set(types)) != len(types):
            raise ValueError(f"types must be distinct non-empty names, got {types!r}")
        if NONE in types or OTHER in types:
            raise ValueError(f"types must not use the reserved class names {NONE!r} and {OTHER!r}")
        check_type_column(type_column)
        self.types, self.type_column = types, type_column
        self.classes = [NONE, *types, OTHER]
        priority = {t: i + 1 for i, t in enumerate(types)}
        spans: dict[str, list[tuple[int, int, int]]] = {}
        self.counts = {c: 0 for c in self.classes[1:]}  # features per class
        for record in intervals:
            kind = record_type(record, type_column)
            label = priority.get(kind, len(types) + 1)
            self.counts[self.classes[label]] += 1
            for start, end in record.blocks:
                if end > start:
                    spans.setdefault(record.chrom, []).append((start, end, label))
        # Per chromosome: spans sorted by start, with the running maximum of their ends, so that
        # the spans overlapping [s, e) are found by two binary searches (`labels`).
        self._index = {}
        for chrom, rows in spans.items():
            array = np.array(sorted(rows), dtype=np.int64)
            self._index[chrom] = (array[:, 0], array[:, 1], array[:, 2], np.maximum.accumulate(array[:, 1]))

    @classmethod
    def from_bed(cls, path: str | os.PathLike, types: Sequence[str], type_column: int = 4) -> "AnnotationTrack":
        """The track of a BED file; a type column past the sixth is read as an extra column
        (the file is read as BED6+n)."""
        check_type_column(type_column)
        return cls(read_bed(path, bed_columns=6 if type_column >= 7 else None), types, type_column)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def chroms(self) -> list[str]:
        return list(self._index)

    def labels(self, chrom: str, start: int, end: int) -> np.ndarray:
        """int64 class ids of the bases [start, end) of chrom (all "none" where it has no feature)."""
        if not 0 <= start <= end:
            raise ValueError(f"region {chrom}:{start}-{end} must have 0 <= start <= end")
        out = np.zeros(end - start, dtype=np.int64)
        index = self._index.get(chrom)
        if index is None or end == start:
            return out
        starts, ends, labels, max_end = index
        first = int(np.searchsorted(max_end, start, side="right"))  # spans before it all end by start
        last = int(np.searchsorted(starts, end, side="left"))        # spans from it on start at end or later
        if first >= last:
            return out
        hit = np.arange(first, last)[ends[first:last] > start]
        # Paint the lowest priority first (the highest id; other last of all): the first type wins.
        for i in hit[np.argsort(-labels[hit], kind="stable")]:
            out[max(starts[i], start) - start:min(ends[i], end) - start] = labels[i]
        return out


def check_type_column(type_column: int) -> None:
    if isinstance(type_column, bool) or not isinstance(type_column, int) or not (type_column == 4 or type_column >= 7):
        raise ValueError(f"type_column must be 4 (the name) or a column number from 7 (past the six standard "
                         f"ones), got {type_column!r}")


def record_type(record: Interval, type_column: int) -> str:
    """A feature's type: its name (column 4) or an extra column's text."""
    if type_column == 4:
        if record.name is None:
            raise ValueError(f"{record.where}: the feature has no name (column 4) to read its type from")
        return record.name
    i = type_column - 7
    if i >= len(record.extra):
        raise ValueError(f"{record.where}: the feature has no column {type_column} to read its type from")
    return record.extra[i]


class Labelled(Dataset):
    """The items of a sequence dataset (dicts with ``input_ids``, ``chrom`` and ``start``, as
    `GenomeWindowDataset(objective=None)` and `ChromosomeDataset(objective=None)` give them) with
    ``labels``: the track's class id of every base, IGNORE_INDEX where the base is N."""

    def __init__(self, sequences: Dataset, track: AnnotationTrack):
        self.sequences, self.track = sequences, track

    def __len__(self) -> int:
        return len(self.sequences)

    def set_epoch(self, epoch: int) -> None:
        self.sequences.set_epoch(epoch)

    def __getitem__(self, index: int) -> dict:
        item = self.sequences[index]
        tokens = item["input_ids"]
        labels = torch.from_numpy(self.track.labels(item["chrom"], item["start"], item["start"] + len(tokens)))
        return {"input_ids": tokens, "labels": labels.masked_fill(tokens == N_ID, IGNORE_INDEX),
                "chrom": item["chrom"], "start": item["start"]}


class AnnotationWindowDataset(Labelled):
    """Windows of a genome with a class id per base: item i is a dict with ``input_ids`` (int64,
    (window_length,)), ``labels`` (int64 class ids of the same bases; IGNORE_INDEX where the base is N),
    ``chrom`` and ``start``. The windows are drawn as `GenomeWindowDataset` draws them (uniformly,
    reproducibly per (seed, epoch, index), from `contigs`, redrawn where mostly N)."""

    def __init__(self, fasta: str | os.PathLike | FastaFile, track: AnnotationTrack, window_length: int,
                 num_windows: int, *, seed: int = 0, contigs: Sequence[str] | None = None,
                 max_n_fraction: float = 0.5, index_dir: str | os.PathLike | None = None):
        super().__init__(GenomeWindowDataset(fasta, window_length, num_windows, seed=seed, objective=None,
                                             contigs=contigs, max_n_fraction=max_n_fraction, index_dir=index_dir),
                         track)
        self.windows = self.sequences
