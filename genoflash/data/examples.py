"""Example genomes shipped with the package (genoflash/data/examples/README.md says what each is):
small public records, so that the examples, `genoflash train` and the tests need nothing beside a
fresh install.

    from genoflash.data import FastaFile, example_fasta
    chloroplast = FastaFile(example_fasta("arabidopsis-chloroplast"))

Their `.fai` indexes go to the cache directory (fasta.py), never into the installed package.
"""

from __future__ import annotations

import os
from pathlib import Path

EXAMPLES_DIR = Path(__file__).resolve().parent / "examples"

# name -> (file, what it is)
EXAMPLES: dict[str, tuple[str, str]] = {
    "arabidopsis-chloroplast": ("NC_000932.arabidopsis_chloroplast.fa",
                                "Arabidopsis thaliana chloroplast, complete genome, 154,478 bp"),
    "yersinia-plasmid": ("NC_005816.yersinia_pestis_pPCP1.fa",
                         "Yersinia pestis plasmid pPCP1, complete sequence, 9,609 bp"),
    "hg38-fragments": ("hg38.blat_fragments.fa",
                       "two human hg38 regions (chr13, chr4), soft-masked, 55,989 + 5,685 bp"),
}


def example_fasta(name: str) -> Path:
    """The path of a bundled example genome, by its name (one of EXAMPLES)."""
    if name not in EXAMPLES:
        raise ValueError(f"unknown example genome {name!r}; the bundled ones are {', '.join(EXAMPLES)}")
    return EXAMPLES_DIR / EXAMPLES[name][0]


def resolve_fasta(path_or_name: str | os.PathLike) -> Path:
    """A FASTA path as a command line gives it: an existing file, or the name of a bundled example."""
    path = Path(path_or_name)
    if path.is_file():
        return path
    if str(path_or_name) in EXAMPLES:
        return example_fasta(str(path_or_name))
    raise FileNotFoundError(f"FASTA file not found: {path_or_name} (nor is it a bundled example: "
                            f"{', '.join(EXAMPLES)})")
