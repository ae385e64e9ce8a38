"""Kernels in nki-library's style (our own code) whose outcomes the runner sorts."""

import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def too_many_partitions(x):
    """Loads 256 rows into one tile: rejected (TC1)."""
    t = nl.ndarray((256, x.shape[1]), x.dtype)
    nisa.dma_copy(dst=t, src=x)
    return x


@nki.jit
def uses_rand(x):
    """Calls a documented name the interpreter lacks."""
    nl.rand((2, 2))
    return x


@nki.jit
def python_error(x):
    """Fails in plain Python."""
    return x.no_such_attribute


def double_into(x_sb, out_sb):
    """A subkernel on SBUF operands (no nki.jit), as nki-library's TKG subkernels are."""
    nisa.tensor_tensor(dst=out_sb, data1=x_sb, data2=x_sb, op=nl.add)
