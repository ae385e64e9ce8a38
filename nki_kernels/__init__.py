"""nki-kernels: hand-written NKI kernels for AWS Trainium as PyTorch custom ops."""

from __future__ import annotations

__version__ = "0.1.0"
