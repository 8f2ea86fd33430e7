"""Per-base classes from a BED of features (AnnotationTrack) against a brute-force painter, and
labelled windows (AnnotationWindowDataset)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from genoflash.data import IGNORE_INDEX, AnnotationTrack, AnnotationWindowDataset, Interval, N_ID, decode

TYPES = ["CDS", "tRNA", "gene"]


def brute_force(intervals, types, chrom, start, end) -> np.ndarray:
    """Each base's class: the first of types covering it, else other (len(types) + 1), else none (0)."""
    out = np.zeros(end - start, dtype=np.int64)
    for t in range(start, end):
        covering = [r.extra[0] for r in intervals if r.chrom == chrom
                    and any(a <= t < b for a, b in r.blocks)]
        ranks = [types.index(k) + 1 if k in types else len(types) + 1 for k in covering]
        out[t - start] = min(ranks) if ranks else 0
    return out


def random_features(seed: int, n: int = 40, length: int = 500) -> list[Interval]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a = rng.randrange(length)
        b = min(length, a + rng.randint(1, 120))
        kind = rng.choice(TYPES + ["LTR", "rep_origin"])
        if rng.random() < 0.2:  # a BED12 record: two blocks, the gap unlabelled
            mid = (b - a) // 2
            out.append(Interval("chrA", a, b, extra=(kind,), block_sizes=(max(1, mid // 2), 1),
                                block_starts=(0, b - a - 1)))
        else:
            out.append(Interval("chrA", a, b, extra=(kind,)))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_base_gets_the_first_type_covering_it(seed):
    features = random_features(seed)
    track = AnnotationTrack(features, TYPES, type_column=7)
    assert track.classes == ["none", "CDS", "tRNA", "gene", "other"]
    for start, end in ((0, 500), (17, 129), (250, 251), (499, 500), (480, 700), (40, 40)):
        np.testing.assert_array_equal(track.labels("chrA", start, end), brute_force(features, TYPES, "chrA", start,
                                                                                      min(end, 700)))
    assert not track.labels("chrB", 0, 10).any()  # a chromosome without features is all none


def test_a_long_feature_that_starts_before_the_window_is_found():
    # The long gene starts first; a later short CDS ends before the window: the running maximum of
    # the ends, not the last start, decides where the search begins.
    track = AnnotationTrack([Interval("c", 0, 1000, extra=("gene",)), Interval("c", 10, 20, extra=("CDS",))],
                            TYPES, type_column=7)
    np.testing.assert_array_equal(track.labels("c", 500, 505), [3] * 5)


def test_types_by_name_and_bad_arguments(tmp_path):
    bed = tmp_path / "f.bed"
    bed.write_text("c\t0\t10\tCDS\nc\t5\t20\tgene\n")
    track = AnnotationTrack.from_bed(bed, ["CDS", "gene"])
    np.testing.assert_array_equal(track.labels("c", 0, 22), [1] * 10 + [2] * 10 + [0] * 2)
    with pytest.raises(ValueError, match="type_column must be 4"):
        AnnotationTrack.from_bed(bed, ["CDS"], type_column=5)
    with pytest.raises(ValueError, match="reserved class names"):
        AnnotationTrack([], ["CDS", "other"])
    with pytest.raises(ValueError, match="distinct non-empty names"):
        AnnotationTrack([], ["CDS", "CDS"])
    with pytest.raises(ValueError, match="f.bed:1: bed_columns=6 standard columns expected, got 4"):
        AnnotationTrack.from_bed(bed, ["CDS"], type_column=7)  # a BED4 has no 7th column
    with pytest.raises(ValueError, match="interval c:0-10: the feature has no column 8"):
        AnnotationTrack([Interval("c", 0, 10, extra=("CDS",))], ["CDS"], type_column=8)
    with pytest.raises(ValueError, match="must have 0 <= start <= end"):
        track.labels("c", 5, 4)


def test_windows_carry_the_labels_of_their_bases(tmp_path):
    rng = random.Random(3)
    seq = "".join(rng.choice("ACGT") for _ in range(400))
    seq = seq[:100] + "N" * 30 + seq[130:]
    (tmp_path / "g.fa").write_text(f">chrA\n{seq}\n>chrB\n{seq[::-1]}\n")
    features = random_features(4, length=400)
    track = AnnotationTrack(features, TYPES, type_column=7)
    data = AnnotationWindowDataset(tmp_path / "g.fa", track, 64, 30, seed=1, contigs=["chrA"])
    seen_n = False
    for i in range(len(data)):
        item = data[i]
        assert item["chrom"] == "chrA"
        start = item["start"]
        assert decode(item["input_ids"]) == seq[start:start + 64]
        want = torch.from_numpy(brute_force(features, TYPES, "chrA", start, start + 64))
        n = item["input_ids"] == N_ID
        seen_n |= bool(n.any())
        torch.testing.assert_close(item["labels"], want.masked_fill(n, IGNORE_INDEX))
    assert seen_n  # the N run was drawn and its bases are ignored
