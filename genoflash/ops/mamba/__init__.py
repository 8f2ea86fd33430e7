"""Mamba's selective scan: reference.py (the recurrence), scan.py (Triton, chunked over the
sequence), scan_channels_first.py (the same with a loop over states, for channels-first
activations), interface.py (`selective_scan_fn`)."""

from .interface import selective_scan_fn
from .reference import selective_scan_reference

__all__ = ["selective_scan_fn", "selective_scan_reference"]
