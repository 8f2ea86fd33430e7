"""Where each sequence lives: fixed-length batches and packed varlen batches alike.

For a fixed-length batch every sequence starts at row 0 of its own batch slice; for a
varlen batch (cu_seqlens) the batch stride is 0 and sequence b occupies rows
[cu_seqlens[b], cu_seqlens[b+1]) of the packed tensor. Kernels ask this once and then
never branch on which of the two they have.
"""

import triton
import triton.language as tl


@triton.jit
def _sequence_bounds(off_b, CU_SEQLENS_Q, CU_SEQLENS_K, seqlen_q, seqlen_k, IS_VARLEN: tl.constexpr):
    """(q_start, seqlen_q, k_start, seqlen_k) of batch element off_b."""
    if IS_VARLEN:
        q_start = tl.load(CU_SEQLENS_Q + off_b)
        k_start = tl.load(CU_SEQLENS_K + off_b)
        return (q_start, tl.load(CU_SEQLENS_Q + off_b + 1) - q_start,
                k_start, tl.load(CU_SEQLENS_K + off_b + 1) - k_start)
    return 0, seqlen_q, 0, seqlen_k
