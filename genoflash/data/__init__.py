"""Genomic data: FASTA and BED access, tokens and one-hot, augmentation, datasets.

Coordinates are 0-based and half-open everywhere (as in BED and Python slicing).

| module | what |
|---|---|
| ``fasta`` | ``FastaFile``: indexed random access through pyfaidx, soft-mask, N padding |
| ``examples`` | ``example_fasta(name)``: the small public genomes shipped with the package |
| ``bed`` | ``read_bed`` (BED3-BED12 and extra columns), ``Interval``, ``split_by_chrom``, ``resize`` |
| ``tokenizer`` | single-nucleotide tokens (PAD=0, MASK, CLS, SEP, A, C, G, T, N) |
| ``onehot`` | one-hot in ACGT order |
| ``augment`` | reverse complement, random shift, random reverse complement |
| ``datasets`` | ``GenomeWindowDataset`` (language modelling), ``ChromosomeDataset`` (whole chromosomes), ``IntervalDataset`` (labelled BED) |
| ``annotations`` | ``AnnotationTrack`` (per-base classes from a BED of features), ``AnnotationWindowDataset``, ``Labelled`` |
| ``synthetic`` | the long-range motif-grammar demo task |
"""

from .annotations import AnnotationTrack, AnnotationWindowDataset, Labelled
from .augment import (random_reverse_complement, random_shift, reverse_complement,
                      reverse_complement_one_hot, reverse_complement_str, reverse_complement_tokens)
from .bed import SPLITS, Interval, read_bed, resize, split_by_chrom
from .datasets import IGNORE_INDEX, ChromosomeDataset, GenomeWindowDataset, IntervalDataset
from .examples import EXAMPLES, example_fasta
from .fasta import FastaFile, UnknownContigError
from .onehot import one_hot
from .synthetic import MarkovBackground, MotifGrammar, SyntheticLongRangeDataset, write_fasta_bed
from .tokenizer import (A_ID, C_ID, CLS_ID, G_ID, MASK_ID, N_ID, PAD_ID, SEP_ID, T_ID, VOCAB,
                        VOCAB_SIZE, decode, encode)

__all__ = [
    "FastaFile", "UnknownContigError", "EXAMPLES", "example_fasta",
    "Interval", "read_bed", "resize", "split_by_chrom", "SPLITS",
    "encode", "decode", "VOCAB", "VOCAB_SIZE",
    "PAD_ID", "MASK_ID", "CLS_ID", "SEP_ID", "A_ID", "C_ID", "G_ID", "T_ID", "N_ID",
    "one_hot",
    "reverse_complement", "reverse_complement_str", "reverse_complement_tokens",
    "reverse_complement_one_hot", "random_reverse_complement", "random_shift",
    "GenomeWindowDataset", "IntervalDataset", "IGNORE_INDEX", "AnnotationTrack", "AnnotationWindowDataset", "Labelled",
    "ChromosomeDataset",
    "MarkovBackground", "MotifGrammar", "SyntheticLongRangeDataset", "write_fasta_bed",
]
