"""Which tile each program computes.

The grid is one-dimensional: axis 0 allows 2^31 - 1 programs, while axes 1 and 2 stop
at 65,535, which batch * nheads (or the number of row blocks at genomic lengths) can pass.

Programs are numbered head-major, so programs running at the same time work on the
same (batch, head) and share its K/V tiles in L2.
"""

import triton
import triton.language as tl


@triton.jit
def _tile_of_program(pid, num_row_blocks, nheads, BLOCK: tl.constexpr, HEAVY_LAST: tl.constexpr):
    """Returns (start_row, batch, head) for this program.

    HEAVY_LAST: the last row blocks carry the most work (causal queries see the most keys),
    so they are launched first to keep the tail of the grid short.
    """
    bh = pid // num_row_blocks
    block = pid % num_row_blocks
    if HEAVY_LAST:
        block = num_row_blocks - 1 - block
    return block * BLOCK, bh // nheads, bh % nheads
