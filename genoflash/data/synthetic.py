"""A synthetic long-range grammar task: genoflash's demo data.

Each sequence holds an "enhancer" element and, ``distance`` bases downstream, a "promoter"
element, in background DNA. An element is a homotypic cluster: ``sites`` copies of its
family's motif (a transcription-factor binding site), each at a random offset inside its own
slot of ``motif_length + spacer`` bases, as real enhancers hold several sites of one factor.
``sites=1, spacer=0`` plants one bare motif. There are ``n_families`` enhancer and promoter
motif families; a fixed, seeded pairing makes each enhancer family compatible with exactly one promoter
family. The label is 1 when the planted pair is compatible and 0 when it is not.

Why it needs long-range attention: positives draw the enhancer family uniformly and
take its partner; negatives draw the enhancer uniformly and a promoter uniformly among
the others. Both motif families are then uniform in each class, so either motif alone
says nothing about the label: only a model that relates the two positions, ``distance``
bases apart, can beat chance.

Difficulty: chance is 50%, and a model that sees only one motif (e.g. a CNN whose
receptive field is shorter than ``distance``) stays there. A model that relates both
positions can reach ~100%, less the label noise of motif copies that occur in the
background by chance (about ``length * 2 * n_families / 4**motif_length`` per sequence:
2e-4 at 100 kb with the defaults, more with an AT- or GC-rich Markov background).
Difficulty grows with ``distance`` and ``length`` (the motifs are a smaller part of a
longer sequence) and with ``n_families`` (more pairs to learn).

How large the elements must be for gradient descent to find the rule (measured with
genoflash's 2-layer classifier, dim 128, mean pool, 300-500 steps of 16). The label is an
interaction of two far positions, and a model from a random start finds it only when the
elements are a large part of the sequence:
- at 256 bp, 16- and 32-base elements stayed at chance and a 64-base one learned;
- at 224 bp, 64-base elements (29%) learned;
- at 512 bp, 96-base elements (19%) stayed at chance and 160-base ones (31%) learned;
- on an H200, 192 bases at 2 kb and 384 at 8 kb (9% and 5%) stayed at chance.
So, at 16 sequences per step, about 30% of the sequence. Larger batches lower the bar: at
512 bp the 19% elements learned with 300 steps of 32 (and not with 600 of 16). That is why the
demo plants clusters of sites. A recipe that learns with small elements at 32 kb and beyond
is open work.

Reproducible: sample ``i`` is a pure function of ``(seed, i)``, and the motifs and
pairing come from the grammar, shared by datasets with different seeds (train/valid/test).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
from torch.utils.data import Dataset

from .fasta import FastaFile
from .tokenizer import A_ID, decode, encode


@dataclass(frozen=True, eq=False)
class MotifGrammar:
    """Motif families and their compatible pairs.

    ``enhancers`` and ``promoters`` are (n_families, motif_length) base codes 0..3 in ACGT
    order; enhancer family ``e`` is compatible with promoter family ``partner[e]`` only.
    """

    enhancers: np.ndarray
    promoters: np.ndarray
    partner: np.ndarray

    @classmethod
    def random(cls, n_families: int = 4, motif_length: int = 16, seed: int = 0) -> MotifGrammar:
        """Random motifs, every two at Hamming distance >= motif_length / 2, and a random pairing."""
        if n_families < 2 or motif_length < 4:
            raise ValueError("need n_families >= 2 (negatives need an incompatible pair) "
                             "and motif_length >= 4")
        rng = np.random.default_rng(seed)
        while True:  # redraw until no two motifs are near-copies (rarely more than twice)
            motifs = rng.integers(0, 4, (2 * n_families, motif_length), dtype=np.uint8)
            hamming = (motifs[:, None] != motifs[None]).sum(-1)
            np.fill_diagonal(hamming, motif_length)  # a motif's distance to itself does not count
            if hamming.min() >= motif_length / 2:
                break
        return cls(motifs[:n_families], motifs[n_families:], rng.permutation(n_families))

    @property
    def n_families(self) -> int:
        return len(self.partner)

    @property
    def motif_length(self) -> int:
        return self.enhancers.shape[1]


def _codes(sequence: str) -> np.ndarray:
    """Base codes 0..3 (ACGT) of a DNA string; 4 for N and ambiguity codes."""
    return (encode(sequence).numpy() - A_ID).astype(np.uint8)


def _kmer_counts(sequence: str, k: int) -> np.ndarray:
    """Counts of the 4**k k-mers (base-4 index, first base most significant); k-mers with N skipped."""
    codes = _codes(sequence).astype(np.int64)
    n = codes.size - k + 1
    if n <= 0:
        return np.zeros(4 ** k)
    index, valid = np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool)
    for j in range(k):  # k vector passes over the sequence, not a pass per base
        part = codes[j:j + n]
        index = index * 4 + np.minimum(part, 3)
        valid &= part < 4
    return np.bincount(index[valid], minlength=4 ** k).astype(np.float64)


@dataclass(frozen=True, eq=False)
class MarkovBackground:
    """An order-k Markov chain over A, C, G, T, fitted to real DNA.

    ``transitions[s, b]`` is P(next base b | previous k bases s) with s the k-mer's
    base-4 index; ``initial[s]`` is the frequency of k-mer s, used for the first k bases.
    """

    order: int
    transitions: np.ndarray
    initial: np.ndarray

    @classmethod
    def fit(cls, sequences: str | Iterable[str], order: int = 3,
            pseudocount: float = 1.0) -> MarkovBackground:
        """Fit from (k+1)-mer counts of one or more sequences (k-mers spanning N are skipped)."""
        if order < 0:
            raise ValueError(f"order must be >= 0, got {order}")
        if isinstance(sequences, str):
            sequences = [sequences]
        counts = np.zeros(4 ** (order + 1))
        for sequence in sequences:
            counts += _kmer_counts(sequence, order + 1)
        counts = counts.reshape(4 ** order, 4) + pseudocount
        return cls(order, counts / counts.sum(1, keepdims=True), counts.sum(1) / counts.sum())

    @classmethod
    def from_fasta(cls, path: str | os.PathLike, order: int = 3,
                   index_dir: str | os.PathLike | None = None) -> MarkovBackground:
        """Fit to every contig of a FASTA file (counts never span two contigs).

        Each contig is read whole; for a large genome, pass chosen contigs to ``fit``.
        """
        fasta = FastaFile(path, index_dir=index_dir)
        return cls.fit((fasta.fetch(c, 0, n) for c, n in fasta.contig_lengths.items()), order)

    def sample(self, length: int, rng: np.random.Generator) -> np.ndarray:
        """``length`` base codes 0..3 (uint8).

        Each base depends on the ``order`` bases before it, so this is a Python loop over
        pre-drawn uniforms (about 0.2 us a base: 20 ms for 100 kb); numpy cannot vectorise it.
        """
        state = int(rng.choice(self.initial.size, p=self.initial))
        first = [(state >> 2 * (self.order - 1 - i)) & 3 for i in range(self.order)]
        out = bytearray(first[:length]) + bytearray(max(0, length - self.order))
        cumulative = self._cumulative
        uniforms = rng.random(len(out)).tolist()
        keep = self.initial.size - 1  # state = last `order` bases, base-4
        for i in range(self.order, length):
            c, u = cumulative[state], uniforms[i]
            base = 0 if u < c[0] else 1 if u < c[1] else 2 if u < c[2] else 3
            out[i] = base
            state = ((state << 2) | base) & keep
        return np.frombuffer(out, dtype=np.uint8)

    @cached_property
    def _cumulative(self) -> list[list[float]]:
        """Cumulative transition probabilities as lists: fast to index in the sampling loop."""
        return np.cumsum(self.transitions, axis=1).tolist()


def element_length(sites: int, motif_length: int, spacer: int) -> int:
    """Bases a cluster of ``sites`` motif copies spans, each in a slot of motif_length + spacer."""
    return sites * (motif_length + spacer)


@dataclass(frozen=True)
class SyntheticSample:
    """One sequence of the task and what was planted in it (0-based starts of the two elements)."""

    tokens: torch.Tensor
    label: int
    enhancer_family: int
    promoter_family: int
    enhancer_start: int
    promoter_start: int


class SyntheticLongRangeDataset(Dataset):
    """``n`` sequences of the long-range grammar task (see the module docstring).

    Items are ``(tokens, label)``: int64 token ids (length,) and an int64 scalar (0/1).

    Args:
        n: number of sequences.
        length: bases per sequence; at least ``distance + motif_length + 2 * margin``.
        distance: promoter start minus enhancer start, in bases (1 kb to 100 kb+).
        seed: which sequences; datasets with different seeds share the grammar.
        background: ``"uniform"`` (i.i.d. bases) or a fitted ``MarkovBackground``.
        grammar: motif families and pairing; default ``MotifGrammar.random()``.
        margin: bases kept free of motifs at each end. The element pair's position is
            uniform over all placements inside the margins (it jitters per sample).
        sites: motif copies per element (a homotypic cluster).
        spacer: extra bases per site's slot; each copy sits at a uniform offset 0..spacer in
            its slot, background around it. An element spans ``sites * (motif_length + spacer)``
            bases (``element_length``).
    """

    def __init__(self, n: int, length: int, distance: int, seed: int = 0,
                 background: str | MarkovBackground = "uniform", grammar: MotifGrammar | None = None,
                 margin: int = 64, sites: int = 1, spacer: int = 0):
        self.grammar = grammar if grammar is not None else MotifGrammar.random()
        for name, value, low in (("sites", sites, 1), ("spacer", spacer, 0), ("margin", margin, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        self.sites, self.spacer = sites, spacer
        element = self.element_length
        if distance < element:
            raise ValueError(f"distance {distance} is shorter than an element ({element} bases: "
                             f"{sites} sites x (motif {self.grammar.motif_length} + spacer {spacer})): "
                             "the elements would overlap")
        if length < distance + element + 2 * margin:
            raise ValueError(f"length {length} is too short: need distance + element_length + 2 * margin "
                             f"= {distance + element + 2 * margin}")
        if not (background == "uniform" or isinstance(background, MarkovBackground)):
            raise ValueError(f"background must be 'uniform' or a MarkovBackground, got {background!r}")
        self.n, self.length, self.distance, self.seed = n, length, distance, seed
        self.background, self.margin = background, margin

    def __len__(self) -> int:
        return self.n

    @property
    def element_length(self) -> int:
        """Bases an enhancer or promoter element spans: sites * (motif_length + spacer)."""
        return element_length(self.sites, self.grammar.motif_length, self.spacer)

    @property
    def gap(self) -> int:
        """Bases between the end of the enhancer element and the start of the promoter element:
        a model must relate positions at least this far apart to see both."""
        return self.distance - self.element_length

    def sample(self, index: int) -> SyntheticSample:
        """Sample ``index`` with its planted families and positions."""
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} out of range for {self.n} samples")
        # A child stream of the seed: distinct from the grammar's stream even when the
        # seeds are equal (numpy's default_rng([seed, 0]) would equal default_rng(seed)).
        rng = np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(index,)))
        g = self.grammar
        label = int(rng.integers(2))
        enhancer = int(rng.integers(g.n_families))
        offset = 0 if label else int(rng.integers(1, g.n_families))  # any family but the partner
        promoter = int((g.partner[enhancer] + offset) % g.n_families)
        slack = self.length - 2 * self.margin - self.distance - self.element_length
        enhancer_start = self.margin + int(rng.integers(slack + 1))
        promoter_start = enhancer_start + self.distance
        if self.background == "uniform":
            codes = rng.integers(0, 4, self.length, dtype=np.uint8)
        else:
            codes = self.background.sample(self.length, rng)
        slot = g.motif_length + self.spacer
        # Drawn after the background, so sites=1, spacer=0 reproduces the bare-motif samples.
        offsets = rng.integers(0, self.spacer + 1, (2, self.sites)) if self.spacer else np.zeros((2, self.sites), int)
        for start, motif, jitter in ((enhancer_start, g.enhancers[enhancer], offsets[0]),
                                     (promoter_start, g.promoters[promoter], offsets[1])):
            for site in range(self.sites):
                at = start + site * slot + int(jitter[site])
                codes[at:at + g.motif_length] = motif
        tokens = torch.from_numpy(codes.astype(np.int64) + A_ID)
        return SyntheticSample(tokens, label, enhancer, promoter, enhancer_start, promoter_start)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        sample = self.sample(index)
        return sample.tokens, torch.tensor(sample.label)


def write_fasta_bed(dataset: SyntheticLongRangeDataset, fasta_path: str | os.PathLike,
                    bed_path: str | os.PathLike, line_width: int = 80) -> None:
    """Write the dataset as FASTA records ``synthetic_<i>`` and a BED with one line each.

    BED columns: record, 0, length, name ``e<enhancer family>_p<promoter family>``,
    score = label, strand ``.``; so ``IntervalDataset(fasta, bed, length=dataset.length)``
    reads it back with the labels (as floats, from the score column).
    """
    with open(fasta_path, "w") as fasta, open(bed_path, "w") as bed:
        for i in range(len(dataset)):
            sample = dataset.sample(i)
            sequence = decode(sample.tokens)
            lines = (sequence[j:j + line_width] for j in range(0, len(sequence), line_width))
            fasta.write(f">synthetic_{i}\n" + "\n".join(lines) + "\n")
            bed.write(f"synthetic_{i}\t0\t{dataset.length}\te{sample.enhancer_family}_p"
                      f"{sample.promoter_family}\t{sample.label}\t.\n")
