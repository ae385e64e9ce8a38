"""`nki.isa` (nisa) as the interpreter implements it: instructions, enums, versions."""

from __future__ import annotations

from .enums import (  # noqa: F401 - re-exported
    dge_mode,
    dma_engine,
    engine,
    gpsimd_engine,
    matmul_perf_mode,
    nc_version,
    oob_mode,
    reduce_cmd,
    scalar_engine,
    tensor_engine,
    unknown_engine,
    vector_engine,
)
from .errors import NkiValidationError, unsupported_getattr  # noqa: F401
from .isa_accumulate import activate2, exponential, tensor_scalar_cumulative  # noqa: F401
from .isa_activation import activation, activation_reduce  # noqa: F401
from .isa_dma import dma_compute, dma_copy, dma_transpose  # noqa: F401
from .isa_elementwise import (  # noqa: F401
    memset,
    reciprocal,
    scalar_tensor_tensor,
    tensor_copy,
    tensor_reduce,
    tensor_scalar,
    tensor_tensor,
)
from .isa_gather import local_gather, nc_n_gather, sequence_bounds  # noqa: F401
from .isa_gpsimd import affine_select, iota, tensor_partition_reduce  # noqa: F401
from .isa_mx import nc_matmul_mx, quantize_mx  # noqa: F401
from .isa_shuffle import nc_stream_shuffle, nonzero_with_count  # noqa: F401
from .isa_sync import core_barrier, sendrecv  # noqa: F401
from .isa_tensor import nc_matmul, nc_transpose  # noqa: F401
from .isa_vector import (  # noqa: F401
    bn_aggr,
    bn_stats,
    max8,
    nc_find_index8,
    nc_match_replace8,
    tensor_copy_predicated,
    tensor_tensor_scan,
)
from .isa_vector_acc import range_select, select_reduce, tensor_scalar_reduce  # noqa: F401
from .loops import (  # noqa: F401
    VirtualRegister,
    register_alloc,
    register_load,
    register_move,
    register_store,
)
from .state import current as _current
from .trace import Instr as NkiInstruction  # noqa: F401 - the handle ISA calls return


def get_nc_version() -> nc_version:
    """The NeuronCore version of the target being interpreted."""
    return nc_version(_current().target.nc_version)


def get_nc_sub_version() -> int:
    """The NeuronCore sub-version (always 0 in the interpreter)."""
    return 0


NOT_SUPPORTED: dict[str, str] = {
    "rng": "random numbers are not modeled",
    "dropout": "random numbers are not modeled",
    "set_rng_seed": "random numbers are not modeled",
    "rand_set_state": "random numbers are not modeled",
    "rand_get_state": "random numbers are not modeled",
    "rand2": "random numbers are not modeled",
    "topk": (
        "its docs leave the output layout open: the source is a snake over each 16 "
        "partitions and val_dst / idx_dst are [par_dim, k], but which partitions hold a "
        "snake's top-k is not given (the SDK's gpsimd-topk library page de-snakes the "
        "results); nki-library @ d2ad3a57 does not call it"
    ),
}

__getattr__ = unsupported_getattr("nki.isa", NOT_SUPPORTED)
