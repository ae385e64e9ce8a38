"""Imports its sibling by bare name, as the SDK examples do."""

from scaling_nki_kernels import double_kernel

KERNEL = double_kernel
