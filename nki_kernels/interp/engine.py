"""Shared machinery of the ISA instructions: operand checks, fp32 I/O, trace records."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes as dt
from .enums import engine as engine_enum
from .errors import fail
from .state import Launch, current
from .tensor import NkiTensor, psum
from .trace import HBM, Instr, Region

ENGINE_NAMES = {
    engine_enum.tensor: "tensor",
    engine_enum.vector: "vector",
    engine_enum.scalar: "scalar",
    engine_enum.gpsimd: "gpsimd",
    engine_enum.dma: "dma",
    engine_enum.sync: "sync",
}


def launch() -> Launch:
    return current()


def tensor_arg(x: Any, arg: str, instr: str) -> NkiTensor:
    if not isinstance(x, NkiTensor):
        raise fail("ARG", f"{instr}: {arg} must be an NKI tensor; got {type(x).__name__}")
    return x


def on_chip(t: NkiTensor, arg: str, instr: str, *, sbuf_only: bool = False) -> NkiTensor:
    """Check an on-chip operand: SBUF (or PSUM when allowed) and at most 128 partitions."""
    tensor_arg(t, arg, instr)
    buf = t.buffer
    if not buf.on_chip or (sbuf_only and buf is psum):
        where = "SBUF" if sbuf_only else "SBUF or PSUM"
        raise fail("BUF", f"{instr}: {arg} must be in {where}; got {buf!r} ('{t.name}')")
    limit = current().target.partitions
    if t.shape[0] > limit:
        raise fail("TC1", f"{instr}: partition dim {t.shape[0]} of {arg} exceeds {limit}")
    return t


def same_partitions(instr: str, **operands: NkiTensor) -> int:
    items = list(operands.items())
    p = items[0][1].shape[0]
    for name, t in items[1:]:
        if t.shape[0] != p:
            detail = ", ".join(f"{n}={x.shape[0]}" for n, x in items)
            raise fail("PART", f"{instr}: operands use different partition counts ({detail})")
    return p


def same_free(instr: str, **operands: NkiTensor) -> int:
    items = list(operands.items())
    n = items[0][1].free_size
    for _, t in items[1:]:
        if t.free_size != n:
            detail = ", ".join(f"{k}={x.free_size}" for k, x in items)
            raise fail("FREE", f"{instr}: operands hold different elements per partition ({detail})")
    return n


def pick_engine(requested: Any, default: str, allowed: tuple[str, ...], instr: str) -> str:
    if not isinstance(requested, engine_enum):
        raise fail("ARG", f"{instr}: engine must be an nisa.engine member; got {requested!r}")
    if requested is engine_enum.unknown:
        return default
    name = ENGINE_NAMES[requested]
    if name not in allowed:
        raise fail("ENGINE", f"{instr} cannot run on the {name} engine (allowed: {allowed})")
    return name


def no_psum_on_gpsimd(eng: str, instr: str, **operands: NkiTensor | None) -> None:
    if eng != "gpsimd":
        return
    for name, t in operands.items():
        if t is not None and t.buffer is psum:
            raise fail("GPSIMD_PSUM", f"{instr} on GpSimd cannot access PSUM ({name})")


def need_version(minimum: int, what: str) -> None:
    t = current().target
    if t.nc_version < minimum:
        raise fail(
            "VERSION",
            f"{what} needs NeuronCore v{minimum}+; target {t.name} is NC-v{t.nc_version}",
        )


# ---- values ---------------------------------------------------------------------------
def addresses(t: NkiTensor) -> tuple[np.ndarray, np.ndarray | None]:
    """Element addresses (in t.dtype units) of an indirect view, and the in-range mask."""
    ind = t.indirect
    assert ind is not None
    idx = read(ind.index).astype(np.int64)
    addr = np.full(t.shape, t.offset, dtype=np.int64)
    for d, (n, s) in enumerate(zip(t.shape, t.strides)):
        if ind.kind == "vector" and d == 0:
            continue
        shape = [1] * t.ndim
        shape[d] = n
        addr = addr + (np.arange(n, dtype=np.int64) * s).reshape(shape)
    if ind.kind == "vector":
        rows = idx.reshape(-1)[: t.shape[0]]
        if rows.size != t.shape[0]:
            raise fail("VIEW", f"vector offset holds {rows.size} indexes for {t.shape[0]} rows")
        valid_rows = (rows >= 0) & (rows < ind.extent)
        addr = addr + (rows * ind.row_stride).reshape((-1,) + (1,) * (t.ndim - 1))
        valid = np.broadcast_to(valid_rows.reshape((-1,) + (1,) * (t.ndim - 1)), t.shape)
    else:
        v = int(idx.reshape(-1)[0])
        addr = addr + v * ind.row_stride
        valid = np.full(t.shape, 0 <= v < ind.extent)
    return addr, valid


def _flat(t: NkiTensor) -> np.ndarray:
    data = t.storage.data
    assert data is not None
    return data.view(t.dtype) if data.dtype != t.dtype else data


def read(t: NkiTensor, oob_skip: bool = False) -> np.ndarray:
    """The tensor's values in its own dtype (indirect views are gathered)."""
    if t.indirect is None:
        return t.array()
    addr, valid = addresses(t)
    flat = _flat(t)
    if not valid.all():
        if not oob_skip:
            bad = addr[~valid].reshape(-1)[0]
            raise fail("DMA_OOB", f"indirect read of '{t.name}' out of range (element {bad})")
        out = np.zeros(t.shape, dtype=t.dtype)
        out[valid] = flat[addr[valid]]
        return out
    return flat[addr]


def read_f32(t: NkiTensor) -> np.ndarray:
    return dt.to_f32(read(t))


def write(t: NkiTensor, values: np.ndarray, mask: np.ndarray | None = None) -> None:
    """Store `values` into `t`, rounding to t.dtype; `mask` keeps destination elements."""
    st = t.storage
    st.dirty = True
    vals = dt.cast(np.asarray(values).reshape(t.shape), t.dtype)
    if t.indirect is None:
        arr = t.array()
        if mask is None:
            arr[...] = vals
        else:
            np.copyto(arr, vals, where=mask)
        if st.mm_mask is not None:
            mm = np.ndarray(
                t.shape, np.bool_, buffer=st.mm_mask, offset=t.offset, strides=t.strides
            )
            mm[...] = False
        return
    addr, valid = addresses(t)
    keep = valid if mask is None else valid & mask
    _flat(t)[addr[keep]] = vals[keep]


# ---- trace ------------------------------------------------------------------------------
def _hbm_bytes(ts: tuple[NkiTensor, ...]) -> int:
    return sum(t.size * t.dtype.itemsize for t in ts if t.buffer.space == HBM)


def emit(
    engine: str,
    opcode: str,
    dsts: tuple[NkiTensor, ...],
    srcs: tuple[NkiTensor, ...],
    p: int,
    n: int,
    *,
    flops: int = 0,
    nbytes: int = 0,
    attrs: dict[str, Any] | None = None,
    name: str | None = None,
    extra_reads: tuple[Region, ...] = (),
) -> Instr:
    """Record one instruction in the current launch's trace."""
    reads = tuple(t.region() for t in srcs) + extra_reads
    for t in srcs:
        if t.indirect is not None:
            reads += (t.indirect.index.region(),)
    for t in dsts:
        if t.indirect is not None:
            reads += (t.indirect.index.region(),)
    instr = Instr(
        engine,
        opcode,
        p,
        n,
        dsts[0].dtype.name if dsts else "",
        tuple(t.dtype.name for t in srcs),
        reads,
        tuple(t.region() for t in dsts),
        flops=flops,
        hbm_read=_hbm_bytes(srcs),
        hbm_write=_hbm_bytes(dsts),
        nbytes=nbytes,
        attrs=attrs,
        name=name,
    )
    return current().record(instr)


def scalar_or_column(x: Any, p: int, arg: str, instr: str) -> np.ndarray | float | None:
    """An operand that is a Python scalar or a (P, 1) tile, as fp32 (None passes through)."""
    if x is None:
        return None
    if isinstance(x, NkiTensor):
        on_chip(x, arg, instr)
        if x.shape[0] != p or x.free_size != 1:
            raise fail(
                "FREE",
                f"{instr}: {arg} must be a scalar or a ({p}, 1) tile; got shape {x.shape}",
            )
        if current().trace_only:
            return None
        return read_f32(x).reshape(p, 1)
    if isinstance(x, (bool, np.bool_)):
        return float(x)
    if isinstance(x, (int, float, np.integer, np.floating)):
        return float(x)
    raise fail("ARG", f"{instr}: {arg} must be a number or a (P, 1) tile; got {type(x).__name__}")


def check_kwargs(instr: str, kwargs: dict[str, Any]) -> None:
    if kwargs:
        raise fail("KWARG", f"{instr}() got unexpected keyword argument(s) {sorted(kwargs)}")


def instruction(fn: Any) -> Any:
    """Refuse keyword arguments the documented signature does not have (rule KWARG)."""
    import functools
    import inspect

    params = inspect.signature(fn).parameters
    allowed = frozenset(params)
    positional = len(params)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kwargs and not allowed.issuperset(kwargs):
            raise fail(
                "KWARG",
                f"nisa.{fn.__name__}() got unexpected keyword argument(s) "
                f"{sorted(set(kwargs) - allowed)}",
            )
        if len(args) > positional:
            raise fail("KWARG", f"nisa.{fn.__name__}() takes {positional} arguments")
        return fn(*args, **kwargs)

    return wrapper
