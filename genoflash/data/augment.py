"""Augmentations that keep the biology: reverse complement and coordinate shifts.

DNA is double-stranded, so a window read on the other strand (reverse complement) is an
equally valid input. A shift moves a window by a few bases; it is applied to the
coordinates *before* fetching (``random_shift``), so the shifted window holds real
genome, never N padding where the genome has bases.
"""

from __future__ import annotations

import torch

from .tokenizer import A_ID, C_ID, G_ID, T_ID, VOCAB_SIZE, check_token_ids

_DNA_COMPLEMENT = {"A": "T", "C": "G", "G": "C", "T": "A", "N": "N",
                   "R": "Y", "Y": "R", "S": "S", "W": "W", "K": "M", "M": "K",
                   "B": "V", "V": "B", "D": "H", "H": "D"}
_STR_COMPLEMENT = str.maketrans({**_DNA_COMPLEMENT,
                                 **{k.lower(): v.lower() for k, v in _DNA_COMPLEMENT.items()}})
_DELETE_LEGAL = str.maketrans("", "", "".join(_DNA_COMPLEMENT) + "".join(_DNA_COMPLEMENT).lower())

_TOKEN_COMPLEMENT = torch.arange(VOCAB_SIZE)  # specials and N map to themselves
_TOKEN_COMPLEMENT[[A_ID, C_ID, G_ID, T_ID]] = torch.tensor([T_ID, G_ID, C_ID, A_ID])


def reverse_complement_str(sequence: str) -> str:
    """Reverse complement of a DNA string; IUPAC codes complement, case is kept."""
    illegal = sequence.translate(_DELETE_LEGAL)
    if illegal:
        position = sequence.index(illegal[0])
        raise ValueError(f"illegal character {illegal[0]!r} at position {position}")
    return sequence.translate(_STR_COMPLEMENT)[::-1]


def reverse_complement_tokens(tokens: torch.Tensor) -> torch.Tensor:
    """Reverse complement of token ids (..., length): A<->T, C<->G, N and specials kept."""
    table = _TOKEN_COMPLEMENT.to(check_token_ids(tokens).device)
    return table[tokens].flip(-1)


def reverse_complement_one_hot(x: torch.Tensor) -> torch.Tensor:
    """Reverse complement of a one-hot (..., length, 4) in ACGT order.

    Complement is T, G, C, A: the channel axis reversed. So both axes flip, and an N row
    (all 0.25 or all 0) stays what it was.
    """
    if x.dim() < 2 or x.shape[-1] != 4:
        raise ValueError(f"expected a one-hot of shape (..., length, 4), got {tuple(x.shape)}")
    return x.flip(-2, -1)


def reverse_complement(x: str | torch.Tensor) -> str | torch.Tensor:
    """Reverse complement of a string, integer token ids, or a float one-hot."""
    if isinstance(x, str):
        return reverse_complement_str(x)
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return reverse_complement_one_hot(x)
    return reverse_complement_tokens(x)


def random_reverse_complement(x: torch.Tensor, generator: torch.Generator,
                              p: float = 0.5) -> tuple[torch.Tensor, bool]:
    """``x`` reverse-complemented with probability ``p``; also says whether it was."""
    flip = bool(torch.rand((), generator=generator) < p)
    return (reverse_complement(x) if flip else x), flip


def random_shift(start: int, end: int, max_shift: int, contig_length: int,
                 generator: torch.Generator) -> tuple[int, int]:
    """[start, end) moved by a uniform shift in [-max_shift, max_shift].

    The shift never moves the window further past a contig end than it already is, so it
    adds no N padding; near an edge the range is cut on that side only.
    """
    if max_shift < 0:
        raise ValueError(f"max_shift must be >= 0, got {max_shift}")
    lowest = max(-max_shift, min(0, -start))
    highest = min(max_shift, max(0, contig_length - end))
    shift = int(torch.randint(lowest, highest + 1, (), generator=generator))
    return start + shift, end + shift
