"""Variants from a VCF (plain or gzip/bgzip-compressed) or a BED whose name column is REF>ALT.

A damaged record never ends a read: it is skipped and reported with its file, line and reason, and
the caller decides what to do with the list.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path

_BASES = set("ACGTN")


@dataclass(frozen=True)
class Variant:
    chrom: str
    pos: int          # 0-based position of the first reference base
    ref: str          # upper-case reference allele
    alt: str          # upper-case alternative allele (one of a multi-allelic record's)
    id: str = "."

    @property
    def end(self) -> int:
        return self.pos + len(self.ref)


@dataclass(frozen=True)
class Skipped:
    where: str        # file:line
    reason: str


def _open_text(path: Path):
    with open(path, "rb") as fh:
        magic = fh.read(2)
    return gzip.open(path, "rt") if magic == b"\x1f\x8b" else open(path)


def _allele(text: str) -> str | None:
    allele = text.upper()
    return allele if allele and set(allele) <= _BASES else None


def read_variants(path: str | os.PathLike) -> tuple[list[Variant], list[Skipped]]:
    """(variants, skipped records). A VCF gives CHROM, 1-based POS, ID, REF and ALT (each ALT of a
    multi-allelic record a variant of its own; symbolic or missing ALTs are skipped). A BED (.bed,
    .bed.gz) gives chrom, 0-based start, end and a name REF>ALT whose REF spans start..end."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"variants file {path} does not exist")
    bed = path.name.lower().removesuffix(".gz").endswith(".bed")
    variants, skipped = [], []
    with _open_text(path) as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip() or line.startswith(("#", "track", "browser")):
                continue
            where = f"{path.name}:{number}"
            fields = line.rstrip("\n").split("\t")
            if len(fields) < (4 if bed else 5):
                skipped.append(Skipped(where, f"not a {'BED' if bed else 'VCF'} record: {len(fields)} tab-separated "
                                              f"fields, need {4 if bed else 5}"))
                continue
            try:
                if bed:
                    chrom, start, end, name = fields[0], int(fields[1]), int(fields[2]), fields[3]
                    ref_text, sep, alt_text = name.partition(">")
                    if not sep:
                        raise ValueError(f"the name column must be REF>ALT, got {name!r}")
                    if start < 0 or end - start != len(ref_text):
                        raise ValueError(f"REF {ref_text!r} must span start..end ({start}..{end})")
                    pos, ident, alts = start, ".", [alt_text]
                else:
                    chrom, pos_text, ident, ref_text, alt_field = fields[:5]
                    pos = int(pos_text) - 1
                    if pos < 0:
                        raise ValueError(f"POS must be >= 1, got {pos_text}")
                    alts = alt_field.split(",")
            except ValueError as error:
                reason = str(error)
                if "invalid literal" in reason:  # int() of a position column
                    reason = f"a position is not an integer: {reason.split(': ', 1)[-1]}"
                skipped.append(Skipped(where, reason))
                continue
            ref = _allele(ref_text)
            if ref is None:
                skipped.append(Skipped(where, f"REF {ref_text!r} is not a sequence of A, C, G, T or N"))
                continue
            for alt_text in alts:
                alt = _allele(alt_text)
                if alt is None:
                    skipped.append(Skipped(where, f"ALT {alt_text!r} is not a sequence of bases (symbolic or missing)"))
                else:
                    variants.append(Variant(chrom, pos, ref, alt, ident))
    return variants, skipped
