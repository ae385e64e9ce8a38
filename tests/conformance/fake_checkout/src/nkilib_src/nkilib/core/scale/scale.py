"""A kernel in nki-library's style (our own code): imports nki as AWS's kernels do."""

from dataclasses import dataclass

import nki
import nki.isa as nisa
import nki.language as nl
import nki.typing as nt
from nki.isa.constants import oob_mode


@dataclass
class ScaleParams(nl.NKIObject):
    factor = 2.0
    rows = None


def scale(x: nt.tensor, params: ScaleParams, dtype: nki.dtype = nl.float32):
    """out = x * params.factor, tile by tile over rows (ragged last tile)."""
    assert oob_mode.error is not None
    rows, cols = x.shape
    out = nl.ndarray((rows, cols), dtype, buffer=nl.shared_hbm)
    for r0 in range(0, rows, 128):
        n = min(128, rows - r0)
        t = nl.ndarray((n, cols), x.dtype)
        nisa.dma_copy(dst=t, src=x[r0 : r0 + n, :], dge_mode=3)
        o = nl.ndarray((n, cols), dtype)
        nisa.tensor_scalar(dst=o, data=t, op0=nl.multiply, operand0=params.factor)
        nisa.dma_copy(dst=out[r0 : r0 + n, :], src=o)
    return out


@nki.jit
def scale_kernel(x):
    """The jit-decorated entry point."""
    return scale(x, ScaleParams(factor=3.0))
