"""BED intervals: reading, and resizing about the centre.

Columns (tab-separated; 0-based half-open coordinates, as in the BED spec):

    chrom  start  end  [name  [score  [strand  [split]]]]

- ``name`` and ``score`` may be ``.`` (missing); ``score`` is read as a float.
- ``strand`` is ``+``, ``-`` or ``.`` (``.`` when the column is absent).
- ``split`` is genoflash's convention for train/validation/test sets: a *seventh and
  last* column holding ``train``, ``valid`` or ``test`` (BED6+1). Lines with more than
  seven columns (BED9, BED12, narrowPeak, ...) have no split; their extra columns are
  ignored.

Blank lines and lines starting with ``#``, ``track`` or ``browser`` are skipped. A line
that breaks these rules raises ValueError naming the file and line number. Files ending
in ``.gz`` are read through gzip.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
from dataclasses import dataclass
from pathlib import Path

SPLITS = ("train", "valid", "test")
STRANDS = ("+", "-", ".")


@dataclass(frozen=True)
class Interval:
    """One BED record; ``source`` and ``line`` say where it came from (for messages)."""

    chrom: str
    start: int
    end: int
    name: str | None = None
    score: float | None = None
    strand: str = "."
    split: str | None = None
    source: str | None = None
    line: int | None = None

    def __len__(self) -> int:
        return self.end - self.start

    @property
    def where(self) -> str:
        """``file:line`` of the record, or its coordinates if it did not come from a file."""
        if self.source is None:
            return f"interval {self.chrom}:{self.start}-{self.end}"
        return f"{self.source}:{self.line}"


def read_bed(path: str | os.PathLike) -> list[Interval]:
    """All intervals of a BED file, in file order (see the module docstring for columns)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as lines:
        return [_parse_line(line, str(path), number) for number, line in enumerate(lines, 1)
                if line.strip() and not line.startswith(("#", "track", "browser"))]


def _parse_line(line: str, source: str, number: int) -> Interval:
    fields = line.rstrip("\r\n").split("\t") if "\t" in line else line.split()

    def bad(reason: str) -> ValueError:
        return ValueError(f"{source}:{number}: {reason} in BED line {line.rstrip()!r}")

    if len(fields) < 3:
        raise bad(f"expected at least 3 columns (chrom, start, end), got {len(fields)}")
    chrom, start, end = fields[:3]
    try:
        start, end = int(start), int(end)
    except ValueError:
        raise bad("start and end must be integers") from None
    if start < 0 or end < start:
        raise bad(f"need 0 <= start <= end, got start {start} and end {end}")
    name = fields[3] if len(fields) > 3 and fields[3] != "." else None
    score = None
    if len(fields) > 4 and fields[4] != ".":
        try:
            score = float(fields[4])
        except ValueError:
            raise bad(f"score {fields[4]!r} is not a number") from None
    strand = fields[5] if len(fields) > 5 else "."
    if strand not in STRANDS:
        raise bad(f"strand must be one of {', '.join(STRANDS)}, got {strand!r}")
    split = fields[6] if len(fields) == 7 else None
    if split is not None and split not in SPLITS:
        raise bad(f"split (7th and last column) must be one of {', '.join(SPLITS)}, got {split!r}")
    return Interval(chrom, start, end, name, score, strand, split, source, number)


def resize(interval: Interval, length: int) -> Interval:
    """``interval`` resized to ``length`` about its centre, as Basenji/Enformer do.

    The centre is ``(start + end) // 2`` and the new start ``centre - length // 2``, so
    an interval may grow past a contig's ends (negative start): fetch it with padding.
    """
    if length <= 0:
        raise ValueError(f"length must be positive, got {length}")
    start = (interval.start + interval.end) // 2 - length // 2
    return dataclasses.replace(interval, start=start, end=start + length)
