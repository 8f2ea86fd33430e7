"""One-hot encoding in ACGT order: shape (..., length, 4), channels A, C, G, T.

N (and every IUPAC ambiguity code, which the tokenizer maps to N) becomes either all
0.25 (``n_value=0.25``, the default: "any base, uniformly", so each row still sums to 1
as Basenji/Enformer use) or all zeros (``n_value=0.0``: "no evidence", as DeepSEA-style
models use). [PAD] becomes all zeros; the other special tokens have no one-hot form.
"""

from __future__ import annotations

import torch

from .tokenizer import A_ID, CLS_ID, MASK_ID, N_ID, SEP_ID, VOCAB, VOCAB_SIZE, check_token_ids, encode

N_VALUES = (0.25, 0.0)


def one_hot(x: str | torch.Tensor, *, n_value: float = 0.25,
            dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """One-hot of a DNA string (-> (len, 4)) or of token ids of any shape (-> (..., 4))."""
    if n_value not in N_VALUES:
        raise ValueError(f"n_value must be 0.25 (uniform) or 0.0 (zeros), got {n_value!r}")
    tokens = encode(x) if isinstance(x, str) else check_token_ids(x)
    unencodable = torch.isin(tokens, torch.tensor([MASK_ID, CLS_ID, SEP_ID], device=tokens.device))
    if unencodable.any():
        first = int(tokens[unencodable].reshape(-1)[0])
        raise ValueError(f"{VOCAB[first]} has no one-hot encoding (only bases, N and [PAD] do)")
    table = torch.zeros(VOCAB_SIZE, 4, dtype=dtype, device=tokens.device)
    table[A_ID:A_ID + 4] = torch.eye(4, dtype=dtype)
    table[N_ID] = n_value
    return table[tokens]
