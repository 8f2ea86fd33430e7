"""Mamba's selective scan, one stage per file: reference.py (the recurrence, what it computes),
recurrence.py (the pieces every stage's kernels share), layout.py (`time_contiguous`, the host's
layout test, free of triton), forward.py (the forward: sequential recurrences over segments),
chunk_states.py (the carry walk over chunks), backward.py and
backward_channels_first.py (the chunked backward for (token, channel) rows and for
channels-first activations), interface.py (`selective_scan_fn`)."""

from .interface import selective_scan_fn
from .layout import time_contiguous
from .reference import selective_scan_reference

__all__ = ["selective_scan_fn", "selective_scan_reference", "time_contiguous"]
