"""Mamba's selective scan: reference.py (the recurrence), scan.py (Triton, chunked over the
sequence), interface.py (`selective_scan_fn`)."""

from .interface import selective_scan_fn
from .reference import selective_scan_reference

__all__ = ["selective_scan_fn", "selective_scan_reference"]
