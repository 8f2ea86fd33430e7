"""BED intervals: reading (BED3 to BED12, as the UCSC and hts-specs BEDv1 specifications define
them, with extra columns after), train/valid/test splits, and resizing about the centre.

The standard columns, tab-separated (or space-separated where a line has no tab), 0-based
half-open coordinates; a file has the first 3 to 12 of them, in this order (column numbers
count from 1, as the specification's and ``cut``'s do):

    1 chrom  2 chromStart  3 chromEnd  4 name  5 score  6 strand  7 thickStart  8 thickEnd
    9 itemRgb  10 blockCount  11 blockSizes  12 blockStarts

- ``chromStart <= chromEnd``, both integers >= 0.
- ``name`` and ``score`` may be ``.`` (missing); ``score`` is a number (the specification's
  integers 0-1000, and the other numbers tools write there).
- ``strand`` is ``+``, ``-`` or ``.`` (``.`` when the column is absent).
- ``thickStart <= thickEnd`` and, unless the two are equal (no thick part), both lie within
  ``chromStart .. chromEnd``.
- ``itemRgb`` is ``R,G,B`` (each 0-255) or ``0`` (none).
- ``blockCount`` >= 1 blocks, with ``blockSizes`` (each >= 1) and ``blockStarts`` (relative to
  chromStart) as comma-separated lists of that many integers (a trailing comma is allowed): the
  first block starts at chromStart, blocks ascend without overlapping, the last ends at
  chromEnd. The three come together: a line of 10 or 11 standard columns is an error.

Columns past the standard ones (BEDn+m, such as narrowPeak's BED6+4) are kept as text in
``Interval.extra``. Which columns are standard is the line's column count (up to 12) unless
``bed_columns`` says otherwise: a narrowPeak file is read with ``bed_columns=6``, since its 7th
column is a signal value, not a thickStart.

Train/valid/test splits come from one of two places:

- a column past the standard ones holding ``train``, ``valid`` or ``test``:
  ``read_bed(path, split_column=7)`` (then columns 1-6 are the standard ones), or by the name a
  ``#`` header line gives it, ``read_bed(path, split_column="split")``;
- the chromosomes: ``split_by_chrom(records, {"valid": ["chr8"], "test": ["chr9"]})`` puts
  every other chromosome in ``train``.

Blank lines and lines starting with ``#``, ``track`` or ``browser`` are skipped. A line that
breaks these rules raises ValueError naming the file, the line number and the column. Files
ending in ``.gz`` are read through gzip.
"""

from __future__ import annotations

import dataclasses
import gzip
import logging
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

SPLITS = ("train", "valid", "test")
STRANDS = ("+", "-", ".")
COLUMNS = ("chrom", "chromStart", "chromEnd", "name", "score", "strand", "thickStart", "thickEnd",
           "itemRgb", "blockCount", "blockSizes", "blockStarts")
# Integers as BED writes them: ASCII digits, perhaps a minus (int() would also take "1_000" and " 5").
_INTEGER = re.compile(r"-?[0-9]+")
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Interval:
    """One BED record; ``source`` and ``line`` say where it came from (for messages).

    Columns a line does not have are None (``strand``: ``"."``). ``block_sizes`` and
    ``block_starts`` (relative to ``start``) are tuples; ``blocks`` gives the blocks in genome
    coordinates. ``extra`` holds the columns past the standard ones, as text.
    """

    chrom: str
    start: int
    end: int
    name: str | None = None
    score: float | None = None
    strand: str = "."
    thick_start: int | None = None
    thick_end: int | None = None
    item_rgb: tuple[int, int, int] | None = None
    block_sizes: tuple[int, ...] | None = None
    block_starts: tuple[int, ...] | None = None
    extra: tuple[str, ...] = ()
    split: str | None = None
    source: str | None = None
    line: int | None = None

    def __len__(self) -> int:
        return self.end - self.start

    @property
    def blocks(self) -> tuple[tuple[int, int], ...]:
        """The blocks (exons, say) as 0-based half-open (start, end) pairs; the whole interval
        as one block where the record has none."""
        if self.block_sizes is None or self.block_starts is None:
            return ((self.start, self.end),)
        return tuple((self.start + s, self.start + s + n) for s, n in zip(self.block_starts, self.block_sizes))

    @property
    def where(self) -> str:
        """``file:line`` of the record, or its coordinates if it did not come from a file."""
        if self.source is None:
            return f"interval {self.chrom}:{self.start}-{self.end}"
        return f"{self.source}:{self.line}"


def read_bed(path: str | os.PathLike, *, bed_columns: int | None = None,
             split_column: int | str | None = None) -> list[Interval]:
    """All intervals of a BED file, in file order (see the module docstring for the columns).

    Args:
        bed_columns: how many leading columns are standard BED (3 to 12, not 10 or 11), the n of
            BEDn+m. By default every column up to the 12th is, or up to the split column.
        split_column: the column holding each record's split (``train``, ``valid`` or
            ``test``): its number counting from 1, or its name in the last ``#`` line before the
            first record (``#chrom start end name score strand split``). It must lie past the
            standard columns.
    """
    path = Path(path)
    if bed_columns is not None and (not isinstance(bed_columns, int) or isinstance(bed_columns, bool)
                                    or not 3 <= bed_columns <= 12 or bed_columns in (10, 11)):
        raise ValueError(f"bed_columns must be an integer from 3 to 12 other than 10 and 11 (blockCount, "
                         f"blockSizes and blockStarts come together), got {bed_columns!r}")
    if split_column is not None and not isinstance(split_column, str) and (
            not isinstance(split_column, int) or isinstance(split_column, bool) or split_column < 4):
        raise ValueError(f"split_column must be a column number from 4 (counting from 1; columns 1-3 are "
                         f"chrom, chromStart, chromEnd) or a column name, got {split_column!r}")
    opener = gzip.open if path.suffix == ".gz" else open
    records: list[Interval] = []
    header: list[str] | None = None
    column: int | None = None  # the split column's 0-based index, once known
    with opener(path, "rt") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip() or line.startswith(("track", "browser")):
                continue
            if line.startswith("#"):
                if not records:  # a header names columns only before the first record
                    header = _fields(line[1:])
                continue
            if column is None and split_column is not None:
                column = _split_index(split_column, header, path, bed_columns)
            records.append(_parse_line(line, str(path), number, bed_columns, column))
    return records


def _fields(line: str) -> list[str]:
    line = line.rstrip("\r\n")
    return line.split("\t") if "\t" in line else line.split()


def _split_index(split_column: int | str, header: list[str] | None, path: Path, bed_columns: int | None) -> int:
    """The split column's 0-based index, from its number or its name in the header."""
    if isinstance(split_column, str):
        names = [name.strip() for name in header] if header else []
        if split_column not in names:
            seen = f"the header line names {', '.join(map(repr, names))}" if names else "it has no '#' header line"
            raise ValueError(f"{path}: split_column={split_column!r} names no column: {seen}")
        index = names.index(split_column)
        if index < 3:
            raise ValueError(f"{path}: split_column={split_column!r} is column {index + 1}, one of chrom, "
                             f"chromStart and chromEnd")
    else:
        index = split_column - 1
    if bed_columns is not None and index < bed_columns:
        raise ValueError(f"split_column={split_column!r} (column {index + 1}) must lie past the {bed_columns} "
                         f"standard columns that bed_columns={bed_columns} declares")
    return index


def _parse_line(line: str, source: str, number: int, bed_columns: int | None = None,
                split_index: int | None = None) -> Interval:
    fields = _fields(line)

    def bad(column: int | None, reason: str) -> ValueError:
        where = "" if column is None else f"column {column + 1} ({COLUMNS[column]}) "
        return ValueError(f"{source}:{number}: {where}{reason} in BED line {line.rstrip()!r}")

    def integer(column: int, minimum: int = 0) -> int:
        text = fields[column]
        if not _INTEGER.fullmatch(text):
            hint = ""
            if column == 6 and text in SPLITS:
                hint = "; if this column is a train/valid/test split, read the file with split_column=7"
            elif column >= 6:
                hint = (f"; if columns from {column + 1} on are not standard BED (narrowPeak is BED6+4), "
                        f"pass bed_columns={column}")
            raise bad(column, f"{text!r} is not an integer{hint}")
        value = int(text)
        if value < minimum:
            raise bad(column, f"must be >= {minimum}, got {value}")
        return value

    if len(fields) < 3:
        raise ValueError(f"{source}:{number}: expected at least 3 columns (chrom, chromStart, chromEnd), "
                         f"got {len(fields)} in BED line {line.rstrip()!r}")
    if bed_columns is not None and len(fields) < bed_columns:
        raise bad(None, f"bed_columns={bed_columns} standard columns expected, got {len(fields)}")
    standard = bed_columns if bed_columns is not None else min(len(fields), 12)
    if split_index is not None:
        if split_index >= len(fields):
            raise bad(None, f"no split column {split_index + 1} (the line has {len(fields)} columns)")
        standard = min(standard, split_index)
    if standard in (10, 11):
        raise bad(None, f"{standard} columns read as standard BED, but blockCount, blockSizes and blockStarts "
                        f"come together (BED12); a BEDn+m file, such as narrowPeak (BED6+4), is read with "
                        f"bed_columns=n")

    chrom = fields[0]
    if not chrom:
        raise bad(0, "is empty")
    start, end = integer(1), integer(2)
    if end < start:
        raise bad(2, f"must be >= chromStart, got chromStart {start} and chromEnd {end}")
    name = fields[3] if standard > 3 and fields[3] != "." else None
    score = None
    if standard > 4 and fields[4] != ".":
        if not _is_number(fields[4]):
            raise bad(4, f"{fields[4]!r} is not a finite number")
        score = float(fields[4])
    strand = fields[5] if standard > 5 else "."
    if strand not in STRANDS:
        raise bad(5, f"strand must be one of {', '.join(STRANDS)}, got {strand!r}")
    thick_start = integer(6) if standard > 6 else None
    thick_end = integer(7) if standard > 7 else None
    if thick_end is not None:
        if thick_end < thick_start:
            raise bad(7, f"must be >= thickStart, got thickStart {thick_start} and thickEnd {thick_end}")
        # An empty thick part (thickStart == thickEnd) may sit anywhere: tools mark "none" so.
        if thick_start < thick_end and not start <= thick_start <= thick_end <= end:
            raise bad(6, f"thickStart {thick_start} .. thickEnd {thick_end} must lie within chromStart {start} "
                         f".. chromEnd {end}")
    elif thick_start is not None and not start <= thick_start <= end:
        raise bad(6, f"must lie within chromStart {start} .. chromEnd {end}, got {thick_start}")
    item_rgb = _item_rgb(fields[8], lambda reason: bad(8, reason)) if standard > 8 else None
    block_sizes = block_starts = None
    if standard == 12:
        count = integer(9, minimum=1)
        block_sizes = _integer_list(fields[10], count, 1, lambda reason: bad(10, reason))
        block_starts = _integer_list(fields[11], count, 0, lambda reason: bad(11, reason))
        if block_starts[0] != 0:
            raise bad(11, f"the first block must start at chromStart (blockStarts[0] = 0), got {block_starts[0]}")
        for i in range(count - 1):
            if block_starts[i] + block_sizes[i] > block_starts[i + 1]:
                raise bad(11, f"blocks must ascend without overlapping: block {i + 1} ends at "
                              f"{block_starts[i] + block_sizes[i]}, block {i + 2} starts at {block_starts[i + 1]}")
        if start + block_starts[-1] + block_sizes[-1] != end:
            raise bad(11, f"the last block must end at chromEnd {end}, it ends at "
                          f"{start + block_starts[-1] + block_sizes[-1]}")
    split = None
    if split_index is not None:
        split = fields[split_index]
        if split not in SPLITS:
            raise ValueError(f"{source}:{number}: column {split_index + 1} (the split column) must be one of "
                             f"{', '.join(SPLITS)}, got {split!r} in BED line {line.rstrip()!r}")
    return Interval(chrom, start, end, name, score, strand, thick_start, thick_end, item_rgb, block_sizes,
                    block_starts, tuple(fields[standard:]), split, source, number)


def _is_number(text: str) -> bool:
    """Whether ``text`` is a finite number (a score becomes a label: no NaN, no infinity)."""
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _item_rgb(text: str, bad) -> tuple[int, int, int] | None:
    if text in ("0", "."):
        return None
    parts = text.split(",")
    if len(parts) != 3 or not all(p.isdigit() and int(p) <= 255 for p in parts):
        raise bad(f"itemRgb must be R,G,B with each 0-255, or 0, got {text!r}")
    return int(parts[0]), int(parts[1]), int(parts[2])


def _integer_list(text: str, count: int, minimum: int, bad) -> tuple[int, ...]:
    """A comma-separated list of ``count`` integers >= minimum; UCSC writes a trailing comma."""
    parts = text[:-1].split(",") if text.endswith(",") else text.split(",")
    if not all(_INTEGER.fullmatch(p) for p in parts):
        raise bad(f"{text!r} is not a comma-separated list of integers")
    values = tuple(int(p) for p in parts)
    if len(values) != count:
        raise bad(f"blockCount is {count} but the list has {len(values)} values ({text!r})")
    if min(values) < minimum:
        raise bad(f"values must be >= {minimum}, got {text!r}")
    return values


def split_by_chrom(intervals: Iterable[Interval], chroms: Mapping[str, Sequence[str]]) -> list[Interval]:
    """``intervals`` with ``split`` set by chromosome: ``chroms`` maps ``"valid"`` and/or ``"test"``
    to chromosome names (``{"valid": ["chr8"], "test": ["chr9"]}``, as Basenji and Enformer hold
    out whole chromosomes); every other chromosome is ``train``. A split read from the file is
    replaced. A chromosome named in ``chroms`` that no interval lies on gets a logged warning (a
    ``chr8`` / ``8`` mismatch would otherwise leave the split empty)."""
    if not isinstance(chroms, Mapping):
        raise TypeError(f"chroms must map a split name to chromosome names, got {type(chroms).__name__}")
    split_of: dict[str, str] = {}
    for split, names in chroms.items():
        if split not in SPLITS:
            raise ValueError(f"chroms: unknown split {split!r}; use {', '.join(SPLITS)}")
        if isinstance(names, str):
            raise TypeError(f"chroms[{split!r}] must be a list of chromosome names, got the string {names!r}")
        for name in names:
            if split_of.setdefault(name, split) != split:
                raise ValueError(f"chroms: chromosome {name!r} is in both {split_of[name]!r} and {split!r}")
    records = [dataclasses.replace(r, split=split_of.get(r.chrom, "train")) for r in intervals]
    present = {r.chrom for r in records}
    for name in split_of.keys() - present:
        logger.warning("split_by_chrom: no interval lies on %r (in the %r split)", name, split_of[name])
    return records


def resize(interval: Interval, length: int) -> Interval:
    """``interval`` resized to ``length`` about its centre, as Basenji/Enformer do.

    The centre is ``(start + end) // 2`` and the new start ``centre - length // 2``, so
    an interval may grow past a contig's ends (negative start): fetch it with padding.
    The window keeps the record's name, score, strand, colour, extra columns, split and origin;
    its thick part and blocks described the original feature and are dropped.
    """
    if length <= 0:
        raise ValueError(f"length must be positive, got {length}")
    start = (interval.start + interval.end) // 2 - length // 2
    return dataclasses.replace(interval, start=start, end=start + length, thick_start=None, thick_end=None,
                               block_sizes=None, block_starts=None)
