"""nki-kernels' layers for Hugging Face Kernels (`kernels.kernelize`); see
`nki_kernels.integrations.hf_kernels`."""

from . import layers

__all__ = ["layers"]
