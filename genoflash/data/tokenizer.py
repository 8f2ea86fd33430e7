"""Single-nucleotide tokenizer: one token per base.

Vocabulary (ids are fixed; models and checkpoints depend on them):

| id | token    | meaning |
|----|----------|---------|
| 0  | [PAD]    | padding (0, as most embedding / loss code expects) |
| 1  | [MASK]   | masked-language-model mask |
| 2  | [CLS]    | sequence summary token |
| 3  | [SEP]    | separator |
| 4  | A        | |
| 5  | C        | |
| 6  | G        | |
| 7  | T        | |
| 8  | N        | unknown base; also every IUPAC ambiguity code (R Y S W K M B D H V) |

The bases are contiguous and in ACGT order, so ``token - A_ID`` is the one-hot channel.
Lower case (soft-masked) bases encode like upper case; anything else is an error, since
a stray character in a FASTA file is a bug to find, not a base to guess.
"""

from __future__ import annotations

import numpy as np
import torch

PAD_ID, MASK_ID, CLS_ID, SEP_ID = 0, 1, 2, 3
A_ID, C_ID, G_ID, T_ID, N_ID = 4, 5, 6, 7, 8
VOCAB: tuple[str, ...] = ("[PAD]", "[MASK]", "[CLS]", "[SEP]", "A", "C", "G", "T", "N")
VOCAB_SIZE = len(VOCAB)
SPECIAL_IDS = (PAD_ID, MASK_ID, CLS_ID, SEP_ID)
IUPAC_AMBIGUITY_CODES = "RYSWKMBDHV"


def _encode_table() -> np.ndarray:
    """Byte -> token id; -1 marks a character that is not a nucleotide code."""
    table = np.full(256, -1, dtype=np.int64)
    for letters, token in (("A", A_ID), ("C", C_ID), ("G", G_ID), ("T", T_ID),
                           ("N" + IUPAC_AMBIGUITY_CODES, N_ID)):
        for letter in letters:
            table[ord(letter)] = table[ord(letter.lower())] = token
    return table


_ENCODE = _encode_table()
_DECODE_BASES = np.frombuffer(b"????ACGTN", dtype=np.uint8)  # specials take the slow path


def encode(sequence: str, *, name: str | None = None) -> torch.Tensor:
    """Token ids (int64, shape (len(sequence),)) of a DNA string.

    ``name`` (e.g. a FASTA record or ``chrom:start-end``) only goes into the error raised
    for an illegal character, together with the character's 0-based position.
    """
    # One byte per character even for non-ASCII text, so byte index == string index.
    codes = np.frombuffer(sequence.encode("ascii", errors="replace"), dtype=np.uint8)
    tokens = _ENCODE[codes]
    bad = np.flatnonzero(tokens < 0)
    if bad.size:
        where = f" in record {name!r}" if name is not None else ""
        raise ValueError(
            f"illegal character {sequence[bad[0]]!r} at position {bad[0]}{where} "
            f"({bad.size} illegal in total); expected A, C, G, T, N or an IUPAC code "
            f"({IUPAC_AMBIGUITY_CODES}), either case")
    return torch.from_numpy(tokens)


def decode(tokens: torch.Tensor) -> str:
    """The string of a 1-D tensor of token ids; special tokens appear as ``[PAD]`` etc."""
    if check_token_ids(tokens).dim() != 1:
        raise ValueError(f"decode takes a 1-D tensor of token ids, got shape {tuple(tokens.shape)}")
    ids = tokens.cpu().numpy()
    if ids.size and ids.min() >= A_ID:
        return _DECODE_BASES[ids].tobytes().decode("ascii")
    return "".join(VOCAB[i] for i in ids)


def check_token_ids(tokens: torch.Tensor) -> torch.Tensor:
    """Raise unless ``tokens`` is an integer tensor of ids inside the vocabulary."""
    if not isinstance(tokens, torch.Tensor) or tokens.is_floating_point() or tokens.is_complex():
        raise TypeError(f"expected an integer tensor of token ids, got {type(tokens).__name__}"
                        + (f" of {tokens.dtype}" if isinstance(tokens, torch.Tensor) else ""))
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= VOCAB_SIZE):
        raise ValueError(f"token ids must lie in [0, {VOCAB_SIZE}), got "
                         f"min {int(tokens.min())} and max {int(tokens.max())}")
    return tokens
