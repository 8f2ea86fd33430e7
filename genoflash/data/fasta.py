"""Random access to FASTA files through pyfaidx, in 0-based half-open coordinates.

``FastaFile(path).fetch(chrom, start, end)`` returns bases ``start .. end-1`` of
``chrom``, as Python slicing and BED do. The file is never loaded into memory: pyfaidx
seeks with a ``.fai`` index, which is built on first use.

Where the index goes: next to the FASTA (``genome.fa.fai``, as samtools does) when that
index exists and is current or the directory may be written; otherwise (a read-only
shared data directory, say) in ``$XDG_CACHE_HOME/genoflash/fai/`` (default
``~/.cache/genoflash/fai/``), under a name keyed on the FASTA's absolute path. The FASTA
itself is never copied. A directory whose permission bits forbid writing counts as
read-only even for root, so a data directory marked read-only stays untouched. The example
genomes shipped with the package (examples.py) are indexed in the cache too: the installed
package is not a place to write.

Compressed FASTA: bgzip (BGZF, ``bgzip genome.fa`` from htslib) keeps random access, and is
read with Biopython installed (``pip install 'genoflash[bgzip]'``); pyfaidx then also writes a
``.gzi`` block index, placed as the ``.fai`` is. A file is recognised by its first bytes, not its
name: plain gzip, bzip2, xz, zstd and zip cannot be read at random and raise a ValueError that
says to recompress with bgzip.

A ``FastaFile`` may be pickled into DataLoader workers or inherited through ``fork``: each
process reopens its own pyfaidx handle on first use, so workers never share a file offset.
"""

from __future__ import annotations

import hashlib
import inspect
import os
from pathlib import Path

import numpy as np

from ..extras import require
from .examples import EXAMPLES_DIR


class UnknownContigError(KeyError, ValueError):
    """A contig name that the FASTA does not have (both a KeyError and a ValueError)."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0])


def _pyfaidx():
    return require("pyfaidx", "genomics", "reading FASTA files")


# pyfaidx chooses between plain and BGZF reading by the file name's ending.
BGZIP_SUFFIXES = (".gz", ".bgz")
# The first bytes of compressed formats that allow no random access into the text.
_SEQUENTIAL_FORMATS = {b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd",
                       b"PK\x03\x04": "zip"}


def compression(path: str | os.PathLike) -> str | None:
    """How a file is compressed, read from its first bytes: ``"bgzip"``, ``"gzip"``, ``"bzip2"``,
    ``"xz"``, ``"zstd"``, ``"zip"``, or ``None`` (not compressed)."""
    with open(path, "rb") as file:
        head = file.read(18)
    if head.startswith(b"\x1f\x8b"):
        # BGZF (the SAM/BAM specification, 4.1): a gzip member whose FLG has FEXTRA (bit 2) and
        # whose extra field opens with the subfield SI1 SI2 = 'B' 'C' (bytes 12-13).
        return "bgzip" if len(head) == 18 and head[3] & 4 and head[12:14] == b"BC" else "gzip"
    return next((name for magic, name in _SEQUENTIAL_FORMATS.items() if head.startswith(magic)), None)


def _check_readable(path: Path) -> str | None:
    """The file's compression if pyfaidx can read it at random, else a ValueError saying what to do;
    for bgzip, an ImportError naming the extra when Biopython (or a recent pyfaidx) is missing."""
    kind = compression(path)
    named_compressed = path.name.lower().endswith(BGZIP_SUFFIXES)
    if kind == "gzip":
        if path.name.lower().endswith(".gz"):  # bgzip replaces the file with a .gz of the same name
            how = f"gzip -dc {path.name} > {path.name[:-3]} && bgzip -f {path.name[:-3]}"
        else:  # a new name: a shell redirect to the file being read would empty it first
            how = f"gzip -dc {path.name} | bgzip -c > {path.name}.gz"
        raise ValueError(f"{path} is compressed with plain gzip, which allows no random access; "
                         f"recompress it with bgzip (htslib): {how}")
    if kind is not None and kind != "bgzip":
        raise ValueError(f"{path} is compressed with {kind}, which allows no random access; decompress it "
                         f"and use the plain file, or compress that with bgzip (htslib)")
    if kind is None and named_compressed:
        raise ValueError(f"{path} is not compressed, but its name ends in {path.suffix}, which makes pyfaidx "
                         f"read it as bgzip: rename it")
    if kind == "bgzip":
        if not named_compressed:
            raise ValueError(f"{path} is bgzip-compressed, but pyfaidx reads a file as bgzip only when its "
                             f"name ends in {' or '.join(BGZIP_SUFFIXES)}: rename it")
        require("Bio.bgzf", "bgzip", "reading a bgzip-compressed FASTA", package="biopython")
        if "gzi_indexname" not in inspect.signature(_pyfaidx().Fasta.__init__).parameters:
            # Older pyfaidx writes the .gzi beside the FASTA whatever it is told, and its .fai
            # holds virtual offsets that samtools' does not.
            raise ImportError("reading a bgzip-compressed FASTA needs pyfaidx >= 0.9.0.1, which genoflash "
                              "installs with its 'bgzip' extra: pip install 'genoflash[bgzip]'")
    return kind


def default_index_dir() -> Path:
    """Where indexes of FASTA files in read-only directories go."""
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "genoflash" / "fai"


def _can_write(directory: Path) -> bool:
    """True if ``directory`` may be written: allowed for this user *and* by its mode bits."""
    return os.access(directory, os.W_OK) and bool(directory.stat().st_mode & 0o222)


def _current(index: Path, fasta: Path) -> bool:
    """Whether an index exists and is no older than its FASTA."""
    return index.exists() and index.stat().st_mtime >= fasta.stat().st_mtime


def _gzi_path(index: Path) -> Path:
    """The .gzi block index of a bgzip FASTA, beside its .fai (``genome.fa.gz.gzi``, as samtools)."""
    return index.with_suffix(".gzi")


def _index_path(fasta: Path, index_dir: Path | None, bgzip: bool = False) -> Path:
    """The .fai path for ``fasta``: beside it when possible, else in ``index_dir`` / the cache.
    A bgzip FASTA's .gzi goes with its .fai, so both are beside it or neither is."""
    beside = fasta.with_name(fasta.name + ".fai")
    if index_dir is None and fasta.resolve().parent == EXAMPLES_DIR:
        index_dir = default_index_dir()
    if index_dir is None:
        current = _current(beside, fasta) and (not bgzip or _current(_gzi_path(beside), fasta))
        if current or _can_write(fasta.parent):
            return beside
        index_dir = default_index_dir()
    index_dir = Path(index_dir)
    index_dir.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(str(fasta.resolve()).encode()).hexdigest()[:16]
    return index_dir / f"{fasta.name}.{key}.fai"


class FastaFile:
    """An indexed FASTA file: contig lengths and ``fetch(chrom, start, end)``.

    Args:
        path: the FASTA file: plain text, or bgzip-compressed (named ``.gz`` or ``.bgz``;
            needs the ``bgzip`` extra).
        index_dir: put the ``.fai`` index (and a bgzip file's ``.gzi``) here instead of
            choosing as described above.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ImportError: a bgzip FASTA without Biopython; the message names the extra.
        ValueError: the file is not a FASTA pyfaidx can index (text before the first
            ``>`` header, inconsistent line lengths, blank lines inside a record,
            duplicate names, binary data, compression other than bgzip); the message
            names the file.
    """

    def __init__(self, path: str | os.PathLike, *, index_dir: str | os.PathLike | None = None):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"FASTA file not found: {self.path}")
        _pyfaidx()  # fail here, with what to install, if pyfaidx is missing
        self.compression = _check_readable(self.path)
        bgzip = self.compression == "bgzip"
        self.index_path = _index_path(self.path, None if index_dir is None else Path(index_dir), bgzip)
        # A bgzip file's block index, built and placed with the .fai; None for a plain file.
        self.gzi_path = _gzi_path(self.index_path) if bgzip else None
        self._handle = None  # pyfaidx.Fasta, opened per process on first use
        self._pid = -1
        self.contig_lengths: dict[str, int] = {
            name: len(record) for name, record in self._fasta.records.items()}

    @property
    def _fasta(self):
        """This process's pyfaidx handle, opened on first use (and again after a fork)."""
        if self._handle is None or self._pid != os.getpid():
            pyfaidx = _pyfaidx()
            try:
                if not self._indexes_current():
                    self._build_index(pyfaidx)
                self._handle = pyfaidx.Fasta(str(self.path), indexname=str(self.index_path), as_raw=True,
                                             sequence_always_upper=False, **self._gzi_argument(self.gzi_path))
            except (pyfaidx.FastaIndexingError, pyfaidx.IndexNotFoundError, pyfaidx.UnsupportedCompressionFormat,
                    ValueError) as err:
                # ValueError covers duplicate names and UnicodeDecodeError on binary data;
                # UnsupportedCompressionFormat a name pyfaidx takes for compression (.bz2, .zip).
                raise ValueError(f"malformed FASTA file {self.path}: {err}") from err
            self._pid = os.getpid()
        return self._handle

    def _indexes_current(self) -> bool:
        """Whether the .fai (and a bgzip file's .gzi) exist and are no older than the FASTA."""
        return _current(self.index_path, self.path) and (self.gzi_path is None or _current(self.gzi_path, self.path))

    @staticmethod
    def _gzi_argument(gzi_path: Path | None) -> dict:
        # Named only for bgzip files: pyfaidx reads no .gzi for plain ones.
        return {} if gzi_path is None else {"gzi_indexname": str(gzi_path)}

    def _build_index(self, pyfaidx) -> None:
        """Write the .fai (and .gzi) under names of this process's own, then rename them into place,
        the .gzi first: processes that index one file at once (DataLoader workers, test workers,
        ranks sharing a cache) each see whole indexes or none, never a half-written one, and a
        current .fai always has its .gzi beside it."""
        tag = f"{os.getpid()}.{os.urandom(4).hex()}.partial"
        partial = self.index_path.with_name(f"{self.index_path.name}.{tag}")
        partial_gzi = None if self.gzi_path is None else self.gzi_path.with_name(f"{self.gzi_path.name}.{tag}")
        try:
            pyfaidx.Fasta(str(self.path), indexname=str(partial), as_raw=True, **self._gzi_argument(partial_gzi)).close()
            if partial_gzi is not None:
                os.replace(partial_gzi, self.gzi_path)
            os.replace(partial, self.index_path)
        finally:
            partial.unlink(missing_ok=True)
            if partial_gzi is not None:
                partial_gzi.unlink(missing_ok=True)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_handle": None, "_pid": -1}

    @property
    def contigs(self) -> list[str]:
        """Contig names in file order."""
        return list(self.contig_lengths)

    def __contains__(self, chrom: str) -> bool:
        return chrom in self.contig_lengths

    def __repr__(self) -> str:
        return f"FastaFile({str(self.path)!r}, {len(self.contig_lengths)} contigs)"

    def contig_length(self, chrom: str) -> int:
        """Length of ``chrom``; an UnknownContigError that lists known names if absent."""
        try:
            return self.contig_lengths[chrom]
        except KeyError:
            raise UnknownContigError(self._unknown_contig_message(chrom)) from None

    def _unknown_contig_message(self, chrom: str) -> str:
        names = self.contigs
        shown = ", ".join(repr(n) for n in names[:5]) + (", ..." if len(names) > 5 else "")
        message = f"contig {chrom!r} is not in {self.path} ({len(names)} contigs: {shown})"
        for alias in (chrom[3:], "chr" + chrom) if chrom.startswith("chr") else ("chr" + chrom,):
            if alias in self.contig_lengths:
                return message + f"; did you mean {alias!r}?"
        return message

    def fetch(self, chrom: str, start: int, end: int, *, pad: bool = False, upper: bool = True,
              return_softmask: bool = False) -> str | tuple[str, np.ndarray]:
        """Bases ``start .. end-1`` of ``chrom`` (0-based, half-open), as a string.

        Args:
            pad: fill the parts of the interval outside the contig with N. Without it,
                such an interval raises ValueError (naming chrom, start, end and length).
            upper: upper-case the bases (the default); ``False`` keeps the file's case.
            return_softmask: also return a boolean array, True where the file has a
                lower-case (soft-masked, typically repeat) base; False for padding.
        """
        length = self.contig_length(chrom)
        if start > end:
            raise ValueError(f"interval {chrom}:{start}-{end} has start > end")
        if (start < 0 or end > length) and not pad:
            raise ValueError(
                f"interval {chrom}:{start}-{end} (0-based, half-open) lies outside contig "
                f"{chrom!r} of length {length} in {self.path}; pass pad=True to fill with N")
        left = min(max(0, -start), end - start)             # N before the contig starts
        right = min(max(0, end - length), end - start - left)  # N after it ends
        inside_start, inside_end = start + left, end - right
        raw = self._fasta[chrom][inside_start:inside_end] if inside_end > inside_start else ""
        sequence = "N" * left + (raw.upper() if upper else raw) + "N" * right
        if not return_softmask:
            return sequence
        mask = np.zeros(end - start, dtype=bool)
        codes = np.frombuffer(raw.encode("ascii", errors="replace"), dtype=np.uint8)
        mask[left:left + codes.size] = (codes >= ord("a")) & (codes <= ord("z"))
        return sequence, mask

    def close(self) -> None:
        """Close this process's file handle (reopened automatically if used again)."""
        if self._handle is not None and self._pid == os.getpid():
            self._handle.close()
        self._handle = None

    def __enter__(self) -> FastaFile:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
