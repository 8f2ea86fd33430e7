"""genoflash.data against real DNA (the example genomes shipped in genoflash/data/examples/) and
independent computations.

Expected values come from a tiny FASTA reader written here, from explicit tables and
literal coordinates, never from the function under test. The examples directory belongs to the
installed package: every test indexes into a temporary directory or the cache, and a guard
checks that the directory is unchanged afterwards.
"""

import bz2
import dataclasses
import gzip
import logging
import os
import pickle
import re
import stat
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from genoflash.data import (
    A_ID, C_ID, CLS_ID, EXAMPLES, G_ID, IGNORE_INDEX, MASK_ID, N_ID, PAD_ID, SEP_ID, T_ID, VOCAB, VOCAB_SIZE,
    FastaFile, example_fasta, GenomeWindowDataset, Interval, IntervalDataset, MarkovBackground, MotifGrammar,
    SyntheticLongRangeDataset, decode, encode, one_hot, random_reverse_complement, random_shift,
    read_bed, resize, reverse_complement, reverse_complement_one_hot, reverse_complement_str,
    reverse_complement_tokens, split_by_chrom, write_fasta_bed)

CHLOROPLAST = example_fasta("arabidopsis-chloroplast")
PLASMID = example_fasta("yersinia-plasmid")
HG38 = example_fasta("hg38-fragments")
DATA = CHLOROPLAST.parent
CP = "NC_000932.1"
COMPLEMENT = {"A": "T", "C": "G", "G": "C", "T": "A", "N": "N", "R": "Y", "Y": "R", "S": "S",
              "W": "W", "K": "M", "M": "K", "B": "V", "V": "B", "D": "H", "H": "D"}


def read_fasta_text(path: Path) -> dict[str, str]:
    """Independent reader: record name (first word of the header) -> sequence, case kept."""
    records: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if line.startswith(">"):
            name = line[1:].split()[0]
            records[name] = []
        elif line.strip():
            records[name].append(line.strip())
    return {name: "".join(parts) for name, parts in records.items()}


def slow_reverse_complement(sequence: str) -> str:
    return "".join(COMPLEMENT[c.upper()] if c.isupper() else COMPLEMENT[c.upper()].lower()
                   for c in reversed(sequence))


def slow_one_hot(sequence: str, n_value: float) -> np.ndarray:
    return np.array([[1.0 if c == b else 0.0 for b in "ACGT"] if c in "ACGT" else [n_value] * 4
                     for c in sequence.upper()])


@pytest.fixture(scope="module", autouse=True)
def example_data_untouched():
    assert DATA.is_dir(), f"the example genomes are missing: expected them at {DATA}"
    before = sorted(p.name for p in DATA.iterdir())
    yield
    assert sorted(p.name for p in DATA.iterdir()) == before, "a test wrote into the package's example data"


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fai")


@pytest.fixture(scope="module")
def raw():
    return {path.name: read_fasta_text(path) for path in (CHLOROPLAST, PLASMID, HG38)}


@pytest.fixture(scope="module")
def chloroplast(index_dir):
    return FastaFile(CHLOROPLAST, index_dir=index_dir)


@pytest.fixture(scope="module")
def chloroplast_text(raw):
    return raw[CHLOROPLAST.name][CP]


# --- FASTA -------------------------------------------------------------------------------

@pytest.mark.parametrize("path", [CHLOROPLAST, PLASMID, HG38], ids=lambda p: p.name)
def test_fetch_matches_the_raw_file(path, raw, index_dir):
    fasta, expected = FastaFile(path, index_dir=index_dir), raw[path.name]
    assert fasta.contig_lengths == {name: len(seq) for name, seq in expected.items()}
    rng = np.random.default_rng(0)
    for chrom, seq in expected.items():
        n = len(seq)
        intervals = [(0, n), (0, 1), (n - 1, n), (5, 5), (69, 71), (49, 51), (n - 71, n - 69)]
        intervals += [tuple(sorted(rng.integers(0, n + 1, 2))) for _ in range(100)]
        for start, end in intervals:
            assert fasta.fetch(chrom, start, end) == seq[start:end].upper()
            assert fasta.fetch(chrom, start, end, upper=False) == seq[start:end]


def test_softmask_is_true_exactly_on_lower_case(raw, index_dir):
    fasta = FastaFile(HG38, index_dir=index_dir)
    for chrom, seq in raw[HG38.name].items():
        sequence, mask = fasta.fetch(chrom, 0, len(seq), return_softmask=True)
        expected = np.array([c.islower() for c in seq])
        assert 0 < expected.sum() < len(seq)  # the file is soft-masked in part
        np.testing.assert_array_equal(mask, expected)
        assert sequence == seq.upper()
    chrom, seq = "chr4:41257605-41263290", raw[HG38.name]["chr4:41257605-41263290"]
    lower = next(i for i, c in enumerate(seq) if c.islower())
    _, mask = fasta.fetch(chrom, lower - 3, lower + 3, return_softmask=True)
    np.testing.assert_array_equal(mask, [c.islower() for c in seq[lower - 3:lower + 3]])
    sequence, mask = fasta.fetch(chrom, len(seq) - 2, len(seq) + 3, pad=True, return_softmask=True)
    assert sequence == seq[-2:].upper() + "NNN"
    np.testing.assert_array_equal(mask, [c.islower() for c in seq[-2:]] + [False] * 3)


def test_windows_at_contig_edges_are_padded_with_n(chloroplast, chloroplast_text):
    seq, n = chloroplast_text, len(chloroplast_text)
    assert chloroplast.fetch(CP, -5, 10, pad=True) == "N" * 5 + seq[:10]
    assert chloroplast.fetch(CP, n - 3, n + 4, pad=True) == seq[-3:] + "N" * 4
    assert chloroplast.fetch(CP, -7, -2, pad=True) == "N" * 5
    assert chloroplast.fetch(CP, n + 2, n + 6, pad=True) == "N" * 4
    assert chloroplast.fetch(CP, -1, n + 1, pad=True) == "N" + seq + "N"
    for start, end in [(-5, 10), (-1, 0), (n - 3, n + 4), (n - 1, n + 1), (n, n + 1), (-1, n + 1)]:
        message = f"{CP}:{start}-{end}.*length {n}"
        with pytest.raises(ValueError, match=message):
            chloroplast.fetch(CP, start, end)
    with pytest.raises(ValueError, match="start > end"):
        chloroplast.fetch(CP, 10, 5)


def test_unknown_contig_is_named_with_known_ones(index_dir, tmp_path):
    fasta = FastaFile(HG38, index_dir=index_dir)
    with pytest.raises(KeyError, match=r"'chr99'.*chr13:75549820-75605809"):
        fasta.fetch("chr99", 0, 10)
    with pytest.raises(ValueError, match="did you mean 'chrX'"):  # also a ValueError
        FastaFile(_write(tmp_path / "chrx.fa", ">chrX\nACGT\n")).fetch("X", 0, 1)


def test_missing_fasta_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "nope.fa"))):
        FastaFile(tmp_path / "nope.fa")


def _write(path: Path, text: "str | bytes") -> Path:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


@pytest.mark.parametrize("content", [
    "ACGT\n>chr1\nACGT\n",                      # sequence before the first header
    ">chr1\nACGTACGT\nACG\nACGTACGT\n",         # inconsistent line lengths
    ">chr1\nACGT\n\nACGT\n",                    # blank line inside a record
    ">chr1\nACGT\n>chr1\nAC\n",                 # duplicate names
    "",                                         # no record at all
    bytes(range(256)) * 2,                      # binary junk
], ids=["text-before-header", "line-lengths", "blank-line", "duplicate", "empty", "binary"])
def test_malformed_fasta_is_a_value_error_naming_the_file(tmp_path, content):
    path = _write(tmp_path / "bad.fa", content)
    with pytest.raises(ValueError, match=re.escape(str(path))):
        FastaFile(path)


def test_index_of_an_example_genome_goes_to_the_cache(monkeypatch, tmp_path, raw):
    """The package's own directory is not written, whether or not the installation allows it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    fasta = FastaFile(PLASMID)
    assert fasta.index_path.parent == tmp_path / "genoflash" / "fai" and fasta.index_path.exists()
    assert not (DATA / (PLASMID.name + ".fai")).exists()
    (chrom, seq), = raw[PLASMID.name].items()
    assert fasta.fetch(chrom, 100, 200) == seq[100:200]


def test_example_genomes_by_name(tmp_path):
    """Every bundled genome is where its name says, with the records its README describes; a file
    path is taken as it is, and an unknown name is an error that lists the known ones."""
    from genoflash.data.examples import resolve_fasta

    records = {name: read_fasta_text(example_fasta(name)) for name in EXAMPLES}
    assert {n: len(s) for n, s in records["arabidopsis-chloroplast"].items()} == {"NC_000932.1": 154478}
    assert [len(s) for s in records["yersinia-plasmid"].values()] == [9609]
    assert [len(s) for s in records["hg38-fragments"].values()] == [55989, 5685]
    assert resolve_fasta("yersinia-plasmid") == PLASMID
    own = _write(tmp_path / "yersinia-plasmid", ">x\nACGT\n")  # a file of that name wins
    assert resolve_fasta(own) == own
    with pytest.raises(ValueError, match="unknown example genome 'mouse'.*arabidopsis-chloroplast"):
        example_fasta("mouse")
    with pytest.raises(FileNotFoundError, match="nor is it a bundled example"):
        resolve_fasta(tmp_path / "missing.fa")


def _fetch_in_a_fresh_process(path: str, index_dir: str) -> str:
    fasta = FastaFile(path, index_dir=index_dir)
    return fasta.fetch(fasta.contigs[0], 4000, 4100)


def test_processes_indexing_one_file_at_once_each_read_a_whole_index(tmp_path):
    """Indexes are written under a private name and renamed into place, so processes that index the
    same FASTA together (DataLoader or test workers, ranks sharing a cache) never read a partial one."""
    import multiprocessing

    index_dir = tmp_path / "fai"
    index_dir.mkdir()
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        got = pool.starmap(_fetch_in_a_fresh_process, [(str(PLASMID), str(index_dir))] * 8)
    (chrom, seq), = read_fasta_text(PLASMID).items()
    assert got == [seq[4000:4100]] * 8
    assert [p.name for p in index_dir.iterdir()] == [FastaFile(PLASMID, index_dir=index_dir).index_path.name]


def test_an_index_build_cut_short_leaves_no_index_behind(monkeypatch, tmp_path):
    """A process killed while pyfaidx writes the index (stood in for by a build that writes half an
    index and raises) leaves nothing at the index's path: the next open builds a whole one, rather
    than taking the half one for current."""
    import pyfaidx

    index_dir = tmp_path / "fai"
    real = pyfaidx.Fasta

    def cut_short(path, indexname, **kwargs):
        Path(indexname).write_text("gi|45478711|ref|NC_005816.1|\t9609\t")  # half a line
        raise KeyboardInterrupt

    monkeypatch.setattr(pyfaidx, "Fasta", cut_short)
    with pytest.raises(KeyboardInterrupt):
        FastaFile(PLASMID, index_dir=index_dir)
    assert list(index_dir.iterdir()) == []
    monkeypatch.setattr(pyfaidx, "Fasta", real)
    fasta = FastaFile(PLASMID, index_dir=index_dir)
    (chrom, seq), = read_fasta_text(PLASMID).items()
    assert fasta.fetch(chrom, 9000, 9609) == seq[9000:]


def test_index_goes_beside_the_fasta_unless_the_directory_is_read_only(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    writable = tmp_path / "writable"
    writable.mkdir()
    assert FastaFile(_write(writable / "a.fa", ">a\nACGT\n")).index_path == writable / "a.fa.fai"
    locked = tmp_path / "locked"
    locked.mkdir()
    _write(locked / "a.fa", ">a\nACGTAC\nGT\n")
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)  # read-only even for root: mode bits count
    try:
        fasta = FastaFile(locked / "a.fa")
        assert fasta.index_path.parent == tmp_path / "cache" / "genoflash" / "fai"
        assert fasta.fetch("a", 4, 8) == "ACGT" and sorted(os.listdir(locked)) == ["a.fa"]
        # the same name in another directory gets its own cache entry
        assert FastaFile(writable / "a.fa", index_dir=fasta.index_path.parent).index_path != fasta.index_path
    finally:
        locked.chmod(stat.S_IRWXU)


# --- compressed FASTA --------------------------------------------------------------------

BGZF_EOF = bytes.fromhex("1f8b08040000000000ff0600424302001b0003000000000000000000")  # SAM spec 4.1.2


def bgzf_bytes(data: bytes) -> bytes:
    """``data`` as BGZF, written from the specification (SAM/BAM 4.1), not by Biopython: gzip members
    of at most 64 KiB of input, each with the 'BC' extra subfield giving its size, then the EOF block."""
    blocks = []
    for at in range(0, len(data), 0xFF00):
        chunk = data[at:at + 0xFF00]
        deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
        body = deflate.compress(chunk) + deflate.flush()
        header = b"\x1f\x8b\x08\x04" + bytes(4) + b"\x00\xff" + struct.pack("<H", 6) + b"BC" + struct.pack("<H", 2)
        size = len(header) + 2 + len(body) + 8
        blocks.append(header + struct.pack("<H", size - 1) + body + struct.pack("<II", zlib.crc32(chunk), len(chunk)))
    return b"".join(blocks) + BGZF_EOF


def test_bgzf_writer_here_agrees_with_gzip_and_biopython():
    text = CHLOROPLAST.read_bytes()
    packed = bgzf_bytes(text)
    assert gzip.decompress(packed) == text  # BGZF is multi-member gzip
    bgzf = pytest.importorskip("Bio.bgzf")
    import io
    blocks = list(bgzf.BgzfBlocks(io.BytesIO(packed)))  # each block's size field is right
    assert len(blocks) == 4 and sum(b[3] for b in blocks) == len(text) and blocks[-1][3] == 0
    assert bgzf.BgzfReader(fileobj=io.BytesIO(packed)).read(len(text) + 1) == text.decode()


@pytest.mark.parametrize("path", [CHLOROPLAST, HG38], ids=lambda p: p.name)
def test_bgzip_fasta_reads_as_the_plain_file(path, raw, tmp_path):
    """A bgzip FASTA written by Biopython gives the plain file's bases, case and soft-mask, across block
    boundaries (the chloroplast spans three 64 KiB blocks); its .gzi goes with its .fai."""
    bgzf = pytest.importorskip("Bio.bgzf")
    packed = tmp_path / (path.name + ".gz")
    with bgzf.BgzfWriter(str(packed), "wb") as out:
        out.write(path.read_bytes())
    fasta, expected = FastaFile(packed), raw[path.name]
    assert fasta.compression == "bgzip"
    assert (fasta.index_path, fasta.gzi_path) == (tmp_path / (packed.name + ".fai"), tmp_path / (packed.name + ".gzi"))
    assert fasta.contig_lengths == {name: len(seq) for name, seq in expected.items()}
    rng = np.random.default_rng(1)
    for chrom, seq in expected.items():
        n = len(seq)
        intervals = [(0, n), (0, 1), (n - 1, n), (65_000, 66_500)] + [
            tuple(sorted(rng.integers(0, n + 1, 2))) for _ in range(50)]
        for start, end in intervals:
            if end <= n:
                assert fasta.fetch(chrom, start, end, upper=False) == seq[start:end]
        sequence, mask = fasta.fetch(chrom, n - 3, n + 2, pad=True, return_softmask=True)
        assert sequence == seq[-3:].upper() + "NN"
        np.testing.assert_array_equal(mask, [c.islower() for c in seq[-3:]] + [False] * 2)
    (chrom, seq), *_ = expected.items()
    assert pickle.loads(pickle.dumps(fasta)).fetch(chrom, 10, 20, upper=False) == seq[10:20]  # a worker's copy


def test_bgzip_fasta_in_a_read_only_directory_is_indexed_in_the_cache(monkeypatch, tmp_path):
    pytest.importorskip("Bio.bgzf")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    locked = tmp_path / "locked"
    locked.mkdir()
    _write(locked / "a.fa.bgz", bgzf_bytes(b">a desc\nACGTAC\nGTNNac\n>b\nTTTT\n"))
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        fasta = FastaFile(locked / "a.fa.bgz")
        assert fasta.index_path.parent == fasta.gzi_path.parent == tmp_path / "cache" / "genoflash" / "fai"
        assert fasta.fetch("a", 4, 12, upper=False) == "ACGTNNac" and fasta.fetch("b", 0, 4) == "TTTT"
        assert sorted(os.listdir(locked)) == ["a.fa.bgz"]
        assert sorted(p.suffix for p in fasta.index_path.parent.iterdir()) == [".fai", ".gzi"]  # no partial left
    finally:
        locked.chmod(stat.S_IRWXU)


@pytest.mark.parametrize("missing", ["biopython", "new-pyfaidx"])
def test_bgzip_fasta_without_the_extra_names_it(monkeypatch, tmp_path, missing):
    import pyfaidx

    path = _write(tmp_path / "x.fa.gz", bgzf_bytes(b">x\nACGT\n"))
    if missing == "biopython":
        monkeypatch.setitem(sys.modules, "Bio", None)  # import Bio raises ImportError
        monkeypatch.setitem(sys.modules, "Bio.bgzf", None)
    else:
        pytest.importorskip("Bio.bgzf")

        class Pyfaidx08:  # pyfaidx before 0.9.0.1 takes no gzi_indexname
            def __init__(self, filename, indexname=None, as_raw=False, sequence_always_upper=False):
                raise AssertionError("not to be opened")

        monkeypatch.setattr(pyfaidx, "Fasta", Pyfaidx08)
    with pytest.raises(ImportError, match=re.escape("pip install 'genoflash[bgzip]'")) as error:
        FastaFile(path)
    assert ("needs biopython" if missing == "biopython" else "pyfaidx >= 0.9.0.1") in str(error.value)
    assert list(tmp_path.iterdir()) == [path]  # no index started


def test_compression_other_than_bgzip_says_what_to_do(tmp_path):
    text = b">x\nACGT\n"
    cases = {
        "plain.fa.gz": (gzip.compress(text), r"plain gzip.*bgzip.*gzip -dc plain\.fa\.gz > plain\.fa && bgzip -f plain\.fa"),
        "plain.fasta": (gzip.compress(text), r"plain gzip.*gzip -dc plain\.fasta \| bgzip -c > plain\.fasta\.gz"),
        "x.fa.bz2": (bz2.compress(text), "bzip2, which allows no random access"),
        "x.fa": (bz2.compress(text), "bzip2, which allows no random access"),
        "named.fa.gz": (text, r"not compressed, but its name ends in \.gz.*rename it"),
        "bgzip.fa": (bgzf_bytes(text), r"bgzip-compressed, but .* ends in \.gz or \.bgz: rename it"),
    }
    for name, (content, message) in cases.items():
        path = _write(tmp_path / name, content)
        with pytest.raises(ValueError, match=re.escape(str(path)) + ".*" + message):
            FastaFile(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(cases)  # nothing indexed


# --- tokens and one-hot ------------------------------------------------------------------

def test_token_ids_are_as_documented():
    ids = [PAD_ID, MASK_ID, CLS_ID, SEP_ID, A_ID, C_ID, G_ID, T_ID, N_ID]
    assert ids == list(range(9))
    assert VOCAB_SIZE == 9 and VOCAB[A_ID:] == ("A", "C", "G", "T", "N")
    assert encode("ACGTNacgtn").tolist() == [4, 5, 6, 7, 8, 4, 5, 6, 7, 8]
    assert encode("").dtype == torch.long and encode("").numel() == 0


def test_iupac_codes_become_n():
    codes = "RYSWKMBDHV"
    assert encode(codes + codes.lower()).tolist() == [N_ID] * 20
    assert decode(encode("ArYt")) == "ANNT"


@pytest.mark.parametrize("bad, position", [("ACGTX", 4), ("-ACGT", 0), ("AC GT", 2), ("ACμGT", 2)])
def test_illegal_character_names_record_and_position(bad, position):
    message = f"{re.escape(repr(bad[position]))} at position {position} in record 'chr7'"
    with pytest.raises(ValueError, match=message):
        encode(bad, name="chr7")


def test_encode_decode_round_trip_on_a_genome(chloroplast_text):
    tokens = encode(chloroplast_text)
    expected = [{"A": A_ID, "C": C_ID, "G": G_ID, "T": T_ID}[c] for c in chloroplast_text[:5000]]
    assert tokens[:5000].tolist() == expected
    assert decode(tokens) == chloroplast_text
    assert decode(torch.tensor([CLS_ID, A_ID, MASK_ID, PAD_ID])) == "[CLS]A[MASK][PAD]"


def test_one_hot_is_in_acgt_order(chloroplast_text):
    np.testing.assert_array_equal(one_hot("ACGTN"), [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0],
                                                     [0, 0, 0, 1], [0.25] * 4])
    np.testing.assert_array_equal(one_hot("NaR", n_value=0.0), [[0] * 4, [1, 0, 0, 0], [0] * 4])
    window = chloroplast_text[10_000:12_000] + "NRYN"
    np.testing.assert_array_equal(one_hot(window), slow_one_hot(window, 0.25))
    batch = torch.stack([encode("ACGT"), encode("TTNA")])
    assert one_hot(batch).shape == (2, 4, 4)
    np.testing.assert_array_equal(one_hot(batch)[1], slow_one_hot("TTNA", 0.25))
    np.testing.assert_array_equal(one_hot(torch.tensor([PAD_ID, A_ID])), [[0] * 4, [1, 0, 0, 0]])
    with pytest.raises(ValueError, match=r"\[MASK\]"):
        one_hot(torch.tensor([A_ID, MASK_ID]))
    with pytest.raises(ValueError, match="n_value"):
        one_hot("ACGT", n_value=0.5)


# --- augmentation ------------------------------------------------------------------------

def test_reverse_complement_of_strings(chloroplast_text):
    window = chloroplast_text[50_000:53_000]
    assert reverse_complement_str(window) == slow_reverse_complement(window)
    mixed = "acgtNRYSWKMBDHVryswkmbdhv" + window[:100]
    assert reverse_complement(mixed) == slow_reverse_complement(mixed)
    assert reverse_complement_str(reverse_complement_str(mixed)) == mixed
    with pytest.raises(ValueError, match="'X' at position 2"):
        reverse_complement_str("ACXGT")


def test_reverse_complement_of_tokens_and_one_hot_agree_with_strings(chloroplast_text):
    window = chloroplast_text[90_000:92_000] + "NNACN"
    tokens = encode(window)
    expected = encode(slow_reverse_complement(window))
    assert torch.equal(reverse_complement_tokens(tokens), expected)
    assert torch.equal(reverse_complement(reverse_complement(tokens)), tokens)
    with_specials = torch.tensor([CLS_ID, A_ID, C_ID, N_ID, MASK_ID, SEP_ID, PAD_ID])
    assert reverse_complement(with_specials).tolist() == [PAD_ID, SEP_ID, MASK_ID, N_ID, G_ID, T_ID, CLS_ID]
    for n_value in (0.25, 0.0):
        x = one_hot(window, n_value=n_value)
        assert torch.equal(reverse_complement_one_hot(x), torch.from_numpy(
            slow_one_hot(slow_reverse_complement(window), n_value)).float())
        assert torch.equal(reverse_complement(reverse_complement(x)), x)
    batch = one_hot(torch.stack([encode("AACG"), encode("TNGC")]))
    assert torch.equal(reverse_complement(batch)[0], one_hot("CGTT"))


def test_random_reverse_complement_is_seeded():
    tokens = encode("AACCGGTTN")
    flips = [random_reverse_complement(tokens, torch.Generator().manual_seed(s))[1] for s in range(200)]
    again = [random_reverse_complement(tokens, torch.Generator().manual_seed(s))[1] for s in range(200)]
    assert flips == again and 60 < sum(flips) < 140
    out, flipped = random_reverse_complement(tokens, torch.Generator().manual_seed(0), p=1.0)
    assert flipped and decode(out) == "NAACCGGTT"


def test_random_shift_stays_within_bounds_and_adds_no_n():
    generator = torch.Generator().manual_seed(0)
    length, max_shift = 1_000, 7
    for start, end in [(0, 100), (3, 103), (450, 550), (895, 997), (900, 1000), (-5, 50), (-10, 1010)]:
        shifts = set()
        for _ in range(300):
            new_start, new_end = random_shift(start, end, max_shift, length, generator)
            shift = new_start - start
            assert new_end - new_start == end - start and abs(shift) <= max_shift
            assert max(0, -new_start) <= max(0, -start) and max(0, new_end - length) <= max(0, end - length)
            shifts.add(shift)
        expected_low = max(-max_shift, min(0, -start))
        expected_high = min(max_shift, max(0, length - end))
        assert shifts == set(range(expected_low, expected_high + 1))


# --- BED ---------------------------------------------------------------------------------

BED_TEXT = """track name=peaks
browser position chr1:1-100
# a comment

NC_000932.1\t100\t200
NC_000932.1\t300\t400\tpeak2\t7.5\t-
NC_000932.1\t500\t600\tpeak3\t.
NC_000932.1\t700\t800\tpeak4\t1\t.\t710\t790\t0,0,0
NC_000932.1 900 950 spaced 3 +
"""


def test_read_bed_columns_and_skipped_lines(tmp_path):
    path = _write(tmp_path / "x.bed", BED_TEXT)
    records = read_bed(path)
    assert [(r.chrom, r.start, r.end, r.name, r.score, r.strand, r.thick_start, r.thick_end, r.item_rgb, r.split,
             r.line) for r in records] == [
        (CP, 100, 200, None, None, ".", None, None, None, None, 5),
        (CP, 300, 400, "peak2", 7.5, "-", None, None, None, None, 6),
        (CP, 500, 600, "peak3", None, ".", None, None, None, None, 7),
        (CP, 700, 800, "peak4", 1.0, ".", 710, 790, (0, 0, 0), None, 8),
        (CP, 900, 950, "spaced", 3.0, "+", None, None, None, None, 9),
    ]
    assert all(r.extra == () and r.block_sizes is None and r.blocks == ((r.start, r.end),) for r in records)
    with gzip.open(tmp_path / "x.bed.gz", "wt") as f:
        f.write(BED_TEXT)
    assert read_bed(tmp_path / "x.bed.gz") == [dataclasses.replace(r, source=str(tmp_path / "x.bed.gz"))
                                               for r in records]


def test_bed7_column_7_is_thick_start(tmp_path):
    """A spec-valid BED7 is read as such: its 7th column is thickStart, not a split."""
    path = _write(tmp_path / "x.bed", "chr1\t100\t200\tx\t0\t+\t150\nchr1\t100\t200\ty\t0\t-\t100\n")
    assert [(r.thick_start, r.thick_end, r.split, r.extra) for r in read_bed(path)] == [
        (150, None, None, ()), (100, None, None, ())]


def test_bed12_blocks_and_extra_columns(tmp_path):
    """A UCSC gene (trailing commas in the lists, as the browser writes them), a one-block BED12, an empty
    thick part placed at 0 (as some tools write for non-coding genes) and two columns past the 12th."""
    path = _write(tmp_path / "genes.bed",
                  "chr1\t1000\t5000\tgeneA\t960\t+\t1200\t4800\t255,0,0\t3\t400,600,1000,\t0,1500,3000,\n"
                  "chr2\t10\t20\tone\t0\t-\t10\t10\t0\t1\t10\t0\tENSG01\t7.25\n"
                  "chr2\t50\t80\tnc\t0\t+\t0\t0\t0\t2\t10,10\t0,20\n")
    gene, one, noncoding = read_bed(path)
    assert (gene.name, gene.score, gene.strand, gene.thick_start, gene.thick_end, gene.item_rgb) == (
        "geneA", 960.0, "+", 1200, 4800, (255, 0, 0))
    assert (gene.block_sizes, gene.block_starts) == ((400, 600, 1000), (0, 1500, 3000))
    assert gene.blocks == ((1000, 1400), (2500, 3100), (4000, 5000))
    assert one.blocks == ((10, 20),) and one.item_rgb is None and one.extra == ("ENSG01", "7.25")
    assert (noncoding.thick_start, noncoding.thick_end, noncoding.blocks) == (0, 0, ((50, 60), (70, 80)))
    window = resize(gene, 1000)  # a window, no longer the gene: its structure is dropped, the rest kept
    assert (window.start, window.end, window.blocks, window.thick_start, window.name, window.item_rgb) == (
        2500, 3500, ((2500, 3500),), None, "geneA", (255, 0, 0))


def test_narrowpeak_is_bed6_plus_4(tmp_path):
    line = "chr1\t9356\t9806\tpeak1\t182\t.\t5.09\t20.9\t18.2\t273\n"
    path = _write(tmp_path / "x.narrowPeak", line)
    with pytest.raises(ValueError, match=r":1: 10 columns read as standard BED.*narrowPeak.*bed_columns=n"):
        read_bed(path)
    peak, = read_bed(path, bed_columns=6)
    assert (peak.start, peak.end, peak.score, peak.thick_start, peak.extra) == (
        9356, 9806, 182.0, None, ("5.09", "20.9", "18.2", "273"))
    bed9 = _write(tmp_path / "x9.bed", "chr1\t0\t10\tx\t0\t+\t0\t10\t5.5\n")  # BED8+1
    with pytest.raises(ValueError, match=r"column 9 \(itemRgb\) itemRgb must be R,G,B"):
        read_bed(bed9)
    assert read_bed(bed9, bed_columns=8)[0].extra == ("5.5",)
    with pytest.raises(ValueError, match="bed_columns must be an integer from 3 to 12 other than 10 and 11"):
        read_bed(path, bed_columns=10)


BLOCKS = "chr1\t100\t200\tg\t0\t+\t100\t200\t0"


@pytest.mark.parametrize("line, column, reason", [
    ("chr1\t100", None, "expected at least 3 columns"),
    ("chr1\tten\t200", "2 (chromStart)", "'ten' is not an integer"),
    ("chr1\t1_0\t200", "2 (chromStart)", "'1_0' is not an integer"),
    ("chr1\t200\t100", "3 (chromEnd)", "must be >= chromStart, got chromStart 200 and chromEnd 100"),
    ("chr1\t-1\t100", "2 (chromStart)", "must be >= 0, got -1"),
    ("\t1\t100", "1 (chrom)", "is empty"),
    ("chr1\t1\t100\tx\thigh", "5 (score)", "'high' is not a finite number"),
    ("chr1\t1\t100\tx\tnan", "5 (score)", "'nan' is not a finite number"),
    ("chr1\t1\t100\tx\t0\t*", "6 (strand)", "strand must be one of"),
    ("chr1\t1\t100\tx\t0\t+\ttrain", "7 (thickStart)", "'train' is not an integer; .*split_column=7"),
    ("chr1\t1\t100\tx\t0\t+\t200", "7 (thickStart)", "must lie within chromStart 1 .. chromEnd 100"),
    ("chr1\t1\t100\tx\t0\t+\t50\t20", "8 (thickEnd)", "must be >= thickStart"),
    ("chr1\t1\t100\tx\t0\t+\t50\t120", "7 (thickStart)", "thickStart 50 .. thickEnd 120 must lie within"),
    ("chr1\t1\t100\tx\t0\t+\t1\t100\t255,0", "9 (itemRgb)", "R,G,B"),
    ("chr1\t1\t100\tx\t0\t+\t1\t100\t256,0,0", "9 (itemRgb)", "R,G,B"),
    ("chr1\t1\t100\tx\t0\t+\t1\t100\t0\t1", None, "10 columns read as standard BED"),
    (BLOCKS + "\t0\t\t", "10 (blockCount)", "must be >= 1, got 0"),
    (BLOCKS + "\t2\t10,20,30\t0,50", "11 (blockSizes)", "blockCount is 2 but the list has 3"),
    (BLOCKS + "\t2\t10,x\t0,50", "11 (blockSizes)", "not a comma-separated list of integers"),
    (BLOCKS + "\t2\t0,50\t0,50", "11 (blockSizes)", "values must be >= 1"),
    (BLOCKS + "\t2\t10,50\t5,50", "12 (blockStarts)", "first block must start at chromStart"),
    (BLOCKS + "\t2\t60,50\t0,50", "12 (blockStarts)", "without overlapping: block 1 ends at 60, block 2 starts at 50"),
    (BLOCKS + "\t2\t10,40\t0,50", "12 (blockStarts)", "last block must end at chromEnd 200, it ends at 190"),
])
def test_malformed_bed_line_names_file_line_and_column(tmp_path, line, column, reason):
    path = _write(tmp_path / "bad.bed", f"# header\nchr1\t0\t10\n{line}\n")
    where = "" if column is None else re.escape(f"column {column} ")
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}:3: {where}.*{reason}"):
        read_bed(path)


def test_split_from_a_numbered_or_named_column(tmp_path):
    text = ("#chrom\tstart\tend\tname\tscore\tstrand\tfold\tnote\n"
            "chr1\t0\t10\ta\t1\t+\ttrain\tx\nchr2\t5\t15\tb\t0\t-\ttest\ty\nchr3\t1\t2\tc\t0\t.\tvalid\tz\n")
    path = _write(tmp_path / "x.bed", text)
    by_name, by_number = read_bed(path, split_column="fold"), read_bed(path, split_column=7)
    assert by_name == by_number
    assert [(r.strand, r.thick_start, r.split, r.extra) for r in by_name] == [
        ("+", None, "train", ("train", "x")), ("-", None, "test", ("test", "y")), (".", None, "valid", ("valid", "z"))]
    bed3_split = _write(tmp_path / "bed3.bed", "chr1\t0\t10\ttest\n")
    assert read_bed(bed3_split, split_column=4)[0].split == "test"
    assert read_bed(bed3_split, split_column=4)[0].name is None  # column 4 is the split, not a name


@pytest.mark.parametrize("text, kw, message", [
    ("chr1\t0\t10\ta\t1\t+\ttraining\n", dict(split_column=7), r":1: column 7 \(the split column\) must be one of"),
    ("chr1\t0\t10\ta\t1\t+\n", dict(split_column=7), r":1: no split column 7 \(the line has 6 columns\)"),
    ("#chrom\tstart\tend\tfold\nchr1\t0\t10\ttrain\n", dict(split_column="split"),
     r"split_column='split' names no column: the header line names 'chrom', 'start', 'end', 'fold'"),
    ("chr1\t0\t10\ttrain\n", dict(split_column="split"), "split_column='split' names no column: it has no '#' header"),
    ("#chrom\tstart\tend\nchr1\t0\t10\n", dict(split_column="end"), "is column 3, one of chrom"),
    ("chr1\t0\t10\ta\t1\t+\t0\t10\t0\ttrain\n", dict(split_column=7, bed_columns=9), "must lie past the 9 standard"),
    ("chr1\t0\t10\ttrain\n", dict(split_column=2), "split_column must be a column number from 4"),
    ("chr1\t0\t10\ttrain\n", dict(split_column=True), "split_column must be a column number from 4"),
])
def test_bad_split_column_says_why(tmp_path, text, kw, message):
    path = _write(tmp_path / "x.bed", text)
    with pytest.raises(ValueError, match=message):
        read_bed(path, **kw)


def test_split_by_chrom(tmp_path, caplog):
    path = _write(tmp_path / "x.bed", "chr1\t0\t10\nchr8\t0\t10\nchr9\t5\t9\nchr1\t20\t30\n")
    records = split_by_chrom(read_bed(path), {"valid": ["chr8"], "test": ["chr9", "chr10"]})
    assert [(r.chrom, r.split) for r in records] == [("chr1", "train"), ("chr8", "valid"), ("chr9", "test"),
                                                      ("chr1", "train")]
    assert [r.line for r in records] == [1, 2, 3, 4]  # still names its line
    assert any("'chr10'" in r.getMessage() and "'test'" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="'chr8' is in both 'valid' and 'test'"):
        split_by_chrom(records, {"valid": ["chr8"], "test": ["chr8"]})
    with pytest.raises(ValueError, match="unknown split 'validation'"):
        split_by_chrom(records, {"validation": ["chr8"]})
    with pytest.raises(TypeError, match="must be a list of chromosome names, got the string 'chr8'"):
        split_by_chrom(records, {"valid": "chr8"})


def test_resize_about_the_centre():
    assert (resize(Interval("c", 100, 200), 50).start, resize(Interval("c", 100, 200), 50).end) == (125, 175)
    assert (resize(Interval("c", 100, 200), 300).start, resize(Interval("c", 100, 200), 300).end) == (0, 300)
    assert (resize(Interval("c", 10, 30), 100).start, resize(Interval("c", 10, 30), 100).end) == (-30, 70)
    assert (resize(Interval("c", 10, 21), 4).start, resize(Interval("c", 10, 21), 4).end) == (13, 17)
    assert resize(Interval("c", 5, 6, name="x", strand="-"), 3) == Interval("c", 4, 7, name="x", strand="-")
    with pytest.raises(ValueError):
        resize(Interval("c", 5, 6), 0)


# --- GenomeWindowDataset -----------------------------------------------------------------

def test_windows_are_real_genome_and_deterministic_by_seed(chloroplast, chloroplast_text):
    dataset = GenomeWindowDataset(chloroplast, 512, 20, seed=3, objective=None)
    starts = []
    for i in range(len(dataset)):
        item = dataset[i]
        start = item["start"]
        assert item["chrom"] == CP and decode(item["input_ids"]) == chloroplast_text[start:start + 512]
        starts.append(item["start"])
    assert len(set(starts)) == 20
    again = GenomeWindowDataset(CHLOROPLAST, 512, 20, seed=3, objective=None,
                                index_dir=chloroplast.index_path.parent)
    assert [again[i]["start"] for i in range(20)] == starts
    assert [GenomeWindowDataset(chloroplast, 512, 20, seed=4)[i]["start"] for i in range(20)] != starts
    dataset.set_epoch(1)
    assert [dataset[i]["start"] for i in range(20)] != starts
    with pytest.raises(IndexError):
        dataset[20]


def test_window_reverse_complement_augmentation(chloroplast, chloroplast_text):
    dataset = GenomeWindowDataset(chloroplast, 300, 40, seed=0, objective=None, rc_prob=0.5)
    flipped = 0
    for i in range(len(dataset)):
        item = dataset[i]
        forward = chloroplast_text[item["start"]:item["start"] + 300]
        expected = slow_reverse_complement(forward) if item["reverse_complement"] else forward
        assert decode(item["input_ids"]) == expected
        flipped += item["reverse_complement"]
    assert 5 < flipped < 35


def test_masked_lm_labels(chloroplast, chloroplast_text):
    dataset = GenomeWindowDataset(chloroplast, 2_000, 10, seed=1, objective="mlm")
    masked = total = 0
    for i in range(len(dataset)):
        item = dataset[i]
        original = encode(chloroplast_text[item["start"]:item["start"] + 2_000])
        is_mask = item["input_ids"] == MASK_ID
        assert torch.equal(item["labels"][is_mask], original[is_mask])
        assert (item["labels"][~is_mask] == IGNORE_INDEX).all()
        assert torch.equal(item["input_ids"][~is_mask], original[~is_mask])
        masked, total = masked + int(is_mask.sum()), total + 2_000
    assert 0.13 < masked / total < 0.17


def test_masked_lm_never_masks_n(tmp_path):
    path = _write(tmp_path / "n.fa", ">c\n" + "ACGTNNNNNN" * 100 + "\n")
    item = GenomeWindowDataset(path, 500, 1, objective="mlm", mask_prob=0.5, max_n_fraction=0.7)[0]
    assert (item["input_ids"] == MASK_ID).any()
    original = encode(FastaFile(path).fetch("c", item["start"], item["start"] + 500))
    assert (item["labels"][original == N_ID] == IGNORE_INDEX).all()


def test_causal_lm_shift(chloroplast, chloroplast_text):
    item = GenomeWindowDataset(chloroplast, 256, 1, seed=0, objective="clm")[0]
    window = encode(chloroplast_text[item["start"]:item["start"] + 257])
    assert torch.equal(item["input_ids"], window[:-1]) and torch.equal(item["labels"], window[1:])


def test_fasta_file_pickles_without_its_handle(chloroplast, chloroplast_text):
    copy = pickle.loads(pickle.dumps(chloroplast))  # what a spawned DataLoader worker gets
    assert copy._handle is None and copy.fetch(CP, 500, 600) == chloroplast_text[500:600]


def test_dataloader_workers_give_the_same_items(chloroplast):
    dataset = GenomeWindowDataset(chloroplast, 128, 8, seed=5, objective="mlm")
    loader = DataLoader(dataset, batch_size=4, num_workers=2)
    batches = list(loader)
    expected = torch.stack([dataset[i]["input_ids"] for i in range(8)])
    assert torch.equal(torch.cat([b["input_ids"] for b in batches]), expected)


def test_mostly_n_windows_are_redrawn_then_a_clear_error(tmp_path):
    path = _write(tmp_path / "gappy.fa", ">gap\n" + "N" * 5_000 + "\n>real\n" + "ACGT" * 500 + "\n")
    dataset = GenomeWindowDataset(path, 100, 30, seed=0, objective=None, max_n_fraction=0.1)
    assert all(dataset[i]["chrom"] == "real" for i in range(30))  # 72% of starts are in 'gap'
    only_n = _write(tmp_path / "only_n.fa", ">gap\n" + "N" * 1_000 + "\n")
    with pytest.raises(RuntimeError, match=r"at most 50% N .* in 7 tries"):
        GenomeWindowDataset(only_n, 100, 1, max_tries=7)[0]
    with pytest.raises(ValueError, match="at least 2000 bases"):
        GenomeWindowDataset(only_n, 2_000, 1)


# --- IntervalDataset ---------------------------------------------------------------------

def test_interval_dataset_items(tmp_path, chloroplast, chloroplast_text):
    seq, n = chloroplast_text, len(chloroplast_text)
    bed = _write(tmp_path / "x.bed", f"{CP}\t1000\t1100\ta\t1\t+\n{CP}\t10\t30\tb\t0\t-\n"
                                     f"{CP}\t{n - 20}\t{n}\tc\t1\t-\n")
    dataset = IntervalDataset(chloroplast, bed, length=200)
    x, label = dataset[0]
    assert torch.equal(x, torch.from_numpy(slow_one_hot(seq[1000 - 50:1100 + 50], 0.25)).float())
    assert label.dtype == torch.float32 and [float(dataset[i][1]) for i in range(3)] == [1.0, 0.0, 1.0]
    tokens = IntervalDataset(chloroplast, bed, length=100, output="tokens", labels=[2, 0, 1])
    assert decode(tokens[1][0]) == "N" * 30 + seq[:70] and tokens[1][1].dtype == torch.long
    stranded = IntervalDataset(chloroplast, bed, length=100, output="tokens", stranded=True)
    assert decode(stranded[2][0]) == slow_reverse_complement(seq[n - 60:] + "N" * 40)
    assert decode(stranded[0][0]) == seq[1000:1100]


def test_interval_dataset_shift_and_split(tmp_path, chloroplast, chloroplast_text):
    bed = _write(tmp_path / "x.bed", f"{CP}\t5000\t5100\ta\t1\t+\ttrain\n{CP}\t6000\t6100\tb\t0\t+\ttest\n")
    records = read_bed(bed, split_column=7)
    train = IntervalDataset(chloroplast, records, length=100, output="tokens", split="train", max_shift=20)
    assert len(train) == 1
    seen = set()
    for epoch in range(20):
        train.set_epoch(epoch)
        window = decode(train[0][0])
        shift = chloroplast_text.find(window, 5000 - 20) - 5000
        assert -20 <= shift <= 20 and chloroplast_text[5000 + shift:5100 + shift] == window
        seen.add(shift)
    assert len(seen) > 5
    # Read as BED7, the file's 7th column is thickStart: the error says how to read it as a split.
    with pytest.raises(ValueError, match=r":1: column 7 \(thickStart\) 'train' is not an integer; .*split_column=7"):
        IntervalDataset(chloroplast, bed, length=10, split="train")
    bed6 = _write(tmp_path / "x6.bed", f"{CP}\t5000\t5100\ta\t1\t+\n")
    with pytest.raises(ValueError, match=r"x6.bed:1: split='train' asked for but the record has no split: .*split_column"):
        IntervalDataset(chloroplast, bed6, length=10, split="train")
    with pytest.raises(ValueError, match="split must be one of train, valid, test or None, got 'training'"):
        IntervalDataset(chloroplast, records, length=10, split="training")


def test_interval_dataset_holds_out_a_chromosome(tmp_path, raw, index_dir):
    fasta = FastaFile(HG38, index_dir=index_dir)
    first, second = fasta.contigs
    bed = _write(tmp_path / "x.bed", f"{first}\t100\t200\ta\t1\n{second}\t300\t400\tb\t0\n{first}\t500\t600\tc\t1\n")
    records = split_by_chrom(read_bed(bed), {"test": [second]})
    train = IntervalDataset(fasta, records, length=100, output="tokens", split="train")
    test = IntervalDataset(fasta, records, length=100, output="tokens", split="test")
    assert [r.name for r in train.records] == ["a", "c"] and [r.name for r in test.records] == ["b"]
    assert decode(test[0][0]) == raw[HG38.name][second][300:400].upper()


def test_bad_interval_record_raises_with_the_bed_line_or_is_skipped(tmp_path, chloroplast, caplog):
    n = chloroplast.contig_length(CP)
    bed = _write(tmp_path / "x.bed", f"# header\n{CP}\t100\t200\tok1\t1\nchrUn\t100\t200\tbad1\t0\n"
                                     f"{CP}\t{n - 10}\t{n + 5}\tbad2\t0\n{CP}\t300\t400\tok2\t0\n")
    with pytest.raises(ValueError, match=rf"{re.escape(str(bed))}:3: .*'chrUn'"):
        IntervalDataset(chloroplast, bed, length=100)
    with pytest.raises(ValueError, match=rf"{re.escape(str(bed))}:4: .*{n}"):
        IntervalDataset(chloroplast, read_bed(bed)[:1] + read_bed(bed)[2:], length=100)
    with caplog.at_level(logging.WARNING, logger="genoflash.data.datasets"):
        dataset = IntervalDataset(chloroplast, bed, length=100, labels=[10, 20, 30, 40], on_error="skip")
    assert [r.name for r in dataset.records] == ["ok1", "ok2"]
    assert [int(dataset[i][1]) for i in range(2)] == [10, 40]  # labels stay with their records
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and f"{bed}:3" in warnings[0] and f"{bed}:4" in warnings[1]


def test_illegal_base_in_a_fasta_names_the_record(tmp_path):
    path = _write(tmp_path / "x.fa", ">c\nACGTACGT\nAC*TACGT\n")
    with pytest.raises(ValueError, match=r"'\*' at position 10 in record 'c:0-16'"):
        GenomeWindowDataset(path, 16, 1)[0]
    bed = _write(tmp_path / "x.bed", "c\t8\t16\tx\t1\n")
    with pytest.raises(ValueError, match=rf"'\*' at position 2 in record '{re.escape(str(bed))}:1"):
        IntervalDataset(path, bed, length=8)[0]


# --- synthetic long-range task -----------------------------------------------------------

def motif_text(codes) -> str:
    return "".join("ACGT"[int(b)] for b in codes)


def find_families(sequence: str, grammar: MotifGrammar) -> tuple[list[int], list[int]]:
    """Every (family, position) occurrence of the grammar's motifs, found by string search."""
    def occurrences(motifs):
        return [(f, m.start()) for f, motif in enumerate(motifs)
                for m in re.finditer(f"(?={motif_text(motif)})", sequence)]
    return occurrences(grammar.enhancers), occurrences(grammar.promoters)


def test_synthetic_is_reproducible():
    a = SyntheticLongRangeDataset(20, 2_000, 1_000, seed=7)
    b = SyntheticLongRangeDataset(20, 2_000, 1_000, seed=7)
    assert all(torch.equal(a[i][0], b[i][0]) and a[i][1] == b[i][1] for i in range(20))
    c = SyntheticLongRangeDataset(20, 2_000, 1_000, seed=8)
    assert not torch.equal(a[0][0], c[0][0])
    assert np.array_equal(a.grammar.enhancers, c.grammar.enhancers)  # seeds share the grammar
    assert np.array_equal(a.grammar.partner, c.grammar.partner)


@pytest.mark.parametrize("distance", [1_000, 10_000, 100_000])
def test_synthetic_motifs_sit_at_the_asked_distance(distance):
    dataset = SyntheticLongRangeDataset(3, distance + 400, distance, seed=1)
    positions = set()
    for i in range(3):
        tokens, _ = dataset[i]
        assert tokens.shape == (distance + 400,)
        (e, e_start), = find_families(decode(tokens), dataset.grammar)[0]
        (p, p_start), = find_families(decode(tokens), dataset.grammar)[1]
        assert p_start - e_start == distance and e_start >= 64 and p_start + 16 <= distance + 400 - 64
        positions.add(e_start)
    assert len(positions) > 1  # the pair's position jitters


def test_each_motif_alone_is_uninformative_but_the_pair_decides():
    dataset = SyntheticLongRangeDataset(4_000, 1_200, 1_000, seed=0)
    grammar = dataset.grammar
    rows = []
    for i in range(len(dataset)):
        tokens, label = dataset[i]
        enhancers, promoters = find_families(decode(tokens), grammar)
        assert len(enhancers) == 1 and len(promoters) == 1
        rows.append((enhancers[0][0], promoters[0][0], int(label)))
    e, p, y = np.array(rows).T
    assert abs(y.mean() - 0.5) < 0.03
    for families in (e, p):
        for family in range(grammar.n_families):
            chosen = families == family
            assert abs(chosen.mean() - 1 / grammar.n_families) < 0.03  # every family is used
            assert abs(y[chosen].mean() - 0.5) < 0.06                  # and alone says nothing
    for pair in set(zip(e, p)):  # the pair decides the label, and positives use the partner
        labels = y[(e == pair[0]) & (p == pair[1])]
        assert len(set(labels)) == 1 and labels[0] == (grammar.partner[pair[0]] == pair[1])
    assert len(set(zip(e[y == 1], p[y == 1]))) == grammar.n_families


def test_synthetic_rejects_impossible_geometry():
    with pytest.raises(ValueError, match="too short"):
        SyntheticLongRangeDataset(1, 1_000, 1_000)
    with pytest.raises(ValueError, match="overlap"):
        SyntheticLongRangeDataset(1, 1_000, 8)
    with pytest.raises(ValueError, match="overlap"):  # 4 sites x (16 + 4) = 80 bases > distance 70
        SyntheticLongRangeDataset(1, 1_000, 70, sites=4, spacer=4)
    with pytest.raises(ValueError, match="too short"):  # 300 + 80 + 2 * 64 > 500
        SyntheticLongRangeDataset(1, 500, 300, sites=4, spacer=4)
    for bad in (dict(sites=0), dict(spacer=-1), dict(sites=2.0), dict(margin=-3)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SyntheticLongRangeDataset(1, 5_000, 1_000, **bad)


@pytest.mark.parametrize("sites, spacer", [(1, 0), (4, 0), (5, 3)])
def test_synthetic_elements_are_site_clusters_at_the_asked_distance(sites, spacer):
    # Every copy sits inside its own slot of motif_length + spacer bases, all of the
    # element's family; the promoter element starts `distance` after the enhancer element.
    dataset = SyntheticLongRangeDataset(40, 900, 400, seed=3, sites=sites, spacer=spacer, margin=16)
    slot = 16 + spacer
    assert dataset.element_length == sites * slot and dataset.gap == 400 - sites * slot
    offsets = set()
    for i in range(len(dataset)):
        sample = dataset.sample(i)
        enhancers, promoters = find_families(decode(sample.tokens), dataset.grammar)
        for found, start, family in ((enhancers, sample.enhancer_start, sample.enhancer_family),
                                     (promoters, sample.promoter_start, sample.promoter_family)):
            inside = sorted(pos for fam, pos in found if start <= pos < start + dataset.element_length)
            assert len(inside) == sites  # one copy per slot (a background copy would be 1e-7 likely)
            assert {fam for fam, pos in found if pos in inside} == {family}
            for k, pos in enumerate(inside):
                assert start + k * slot <= pos <= start + k * slot + spacer
                offsets.add(pos - start - k * slot)
        assert sample.promoter_start - sample.enhancer_start == 400
        assert 16 <= sample.enhancer_start and sample.promoter_start + dataset.element_length <= 900 - 16
    assert offsets == set(range(spacer + 1))  # every offset in the slot is used


def test_one_site_without_spacer_keeps_the_bare_motif_samples():
    # The cluster option must not change the default task's samples (seeded runs stay reproducible).
    bare = SyntheticLongRangeDataset(5, 2_000, 1_000, seed=4)
    explicit = SyntheticLongRangeDataset(5, 2_000, 1_000, seed=4, sites=1, spacer=0)
    assert all(torch.equal(bare[i][0], explicit[i][0]) for i in range(5))


def test_markov_background_fitted_on_the_chloroplast_keeps_its_gc(chloroplast_text, index_dir):
    gc = sum(chloroplast_text.count(b) for b in "GC") / len(chloroplast_text)
    background = MarkovBackground.from_fasta(CHLOROPLAST, order=3, index_dir=index_dir)
    codes = background.sample(200_000, np.random.default_rng(0))
    assert abs(np.isin(codes, [1, 2]).mean() - gc) < 0.01
    # P(A | TTT) from overlapping counts (pseudocount 1 per cell), counted here independently
    ttt = [sum(1 for i in range(len(chloroplast_text) - 3) if chloroplast_text.startswith("TTT" + b, i))
           for b in "ACGT"]
    assert background.transitions[0b111111, 0] == pytest.approx((ttt[0] + 1) / (sum(ttt) + 4))
    dataset = SyntheticLongRangeDataset(20, 5_000, 1_000, seed=0, background=background)
    sampled = torch.cat([dataset[i][0] for i in range(20)])
    assert abs(torch.isin(sampled, torch.tensor([C_ID, G_ID])).float().mean().item() - gc) < 0.01


def test_write_fasta_bed_round_trip(tmp_path):
    dataset = SyntheticLongRangeDataset(6, 1_300, 1_000, seed=2)
    write_fasta_bed(dataset, tmp_path / "s.fa", tmp_path / "s.bed")
    reread = IntervalDataset(tmp_path / "s.fa", tmp_path / "s.bed", length=1_300, output="tokens")
    for i in range(6):
        tokens, label = dataset[i]
        assert torch.equal(reread[i][0], tokens) and float(reread[i][1]) == float(label)
