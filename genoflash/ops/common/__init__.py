"""Pieces more than one operator uses: host-side integer helpers (host.py), argument checks
(checks.py), the depthwise short convolution (short_conv.py) and linear layers over the
channels-first layout (projection.py)."""
