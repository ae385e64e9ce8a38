"""The `nki.isa` enums. Enum arguments must be members: raw ints are refused."""

from __future__ import annotations

from enum import Enum, IntEnum


class engine(Enum):
    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6


class reduce_cmd(Enum):
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(Enum):
    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(Enum):
    error = 0
    skip = 1


class matmul_perf_mode(Enum):
    none = "none"
    double_row = "double_row"


class dma_engine(Enum):
    dma = 1
    gpsimd_dma = 2


class nc_version(IntEnum):  # ordered: kernels compare `>= nc_version.gen4`
    gen2 = 2
    gen3 = 3
    gen4 = 4


# Deprecated aliases nki-library still uses.
tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown
