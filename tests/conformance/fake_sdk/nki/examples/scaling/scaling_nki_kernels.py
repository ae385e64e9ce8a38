"""A kernel in the SDK examples' style (our own code)."""

import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def double_kernel(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_tensor(dst=t, data1=t, data2=t, op=nl.add)
    nisa.dma_copy(dst=out, src=t)
    return out
