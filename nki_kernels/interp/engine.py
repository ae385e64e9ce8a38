"""Shared machinery of the ISA instructions: operand checks, fp32 I/O, trace records."""

from __future__ import annotations

import functools
import inspect
import operator
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from . import dtypes as dt
from . import ops
from .enums import engine as engine_enum
from .errors import fail
from .state import current
from .tensor import NkiTensor, psum
from .trace import Instr, Region

ENGINE_NAMES = {
    engine_enum.tensor: "tensor",
    engine_enum.vector: "vector",
    engine_enum.scalar: "scalar",
    engine_enum.gpsimd: "gpsimd",
    engine_enum.dma: "dma",
    engine_enum.sync: "sync",
}

# The ALU operators of the ISA (nki.api.shared, "Supported Math Operators"); nl.max / nl.min
# are accepted as the docstrings' spelling of maximum / minimum.
ALU_ARITH = frozenset(
    {
        "add", "subtract", "multiply", "maximum", "minimum", "max", "min", "equal",
        "not_equal", "greater_equal", "greater", "less_equal", "less", "logical_and",
        "logical_or", "logical_xor", "power", "abs_max", "abs_min",
    }
)  # fmt: skip
ALU_UNARY = frozenset({"abs", "square", "relu", "rsqrt", "reciprocal"})
ALU_BITVEC = frozenset(
    {"invert", "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift"}
)

_DNAMES: dict[dt.NkiDtype, str] = {d: str(d) for d in dt.ALL_DTYPES}
# Partitions of every NeuronCore generation (targets.py); allocation enforces the target's.
PMAX = 128


def tensor_arg(x: Any, arg: str, instr: str) -> NkiTensor:
    """`x` itself when it is an NKI tensor (rule ARG otherwise)."""
    if type(x) is not NkiTensor:
        raise fail("ARG", f"{instr}: {arg} must be an NKI tensor; got {type(x).__name__}")
    return x


def on_chip(t: Any, arg: str, instr: str, *, sbuf_only: bool = False) -> NkiTensor:
    """Check an on-chip operand: SBUF (or PSUM when allowed) and at most 128 partitions."""
    if type(t) is not NkiTensor:
        raise fail("ARG", f"{instr}: {arg} must be an NKI tensor; got {type(t).__name__}")
    buf = t._st.buffer
    if not buf.on_chip or (sbuf_only and buf is psum):
        where = "SBUF" if sbuf_only else "SBUF or PSUM"
        raise fail("BUF", f"{instr}: {arg} must be in {where}; got {buf!r} ('{t.name}')")
    if t.shape[0] > PMAX:
        limit = current().target.partitions
        raise fail("TC1", f"{instr}: partition dim {t.shape[0]} of {arg} exceeds {limit}")
    return t


def same_partitions(instr: str, **operands: NkiTensor) -> int:
    """The common partition count of the operands (rule PART when they differ)."""
    values = iter(operands.values())
    p: int = next(values).shape[0]
    for t in values:
        if t.shape[0] != p:
            detail = ", ".join(f"{n}={x.shape[0]}" for n, x in operands.items())
            raise fail("PART", f"{instr}: operands use different partition counts ({detail})")
    return p


def same_free(instr: str, **operands: NkiTensor) -> int:
    """The common elements-per-partition count of the operands (rule FREE otherwise)."""
    values = iter(operands.values())
    n = _size(next(values).shape[1:])
    for t in values:
        if _size(t.shape[1:]) != n:
            detail = ", ".join(f"{k}={x.free_size}" for k, x in operands.items())
            raise fail(
                "FREE", f"{instr}: operands hold different elements per partition ({detail})"
            )
    return n


def psum_in(*ts: NkiTensor) -> bool:
    """Whether any of the operands is in PSUM (the cost model prices PSUM reads apart)."""
    for t in ts:
        if t._st.buffer is psum:
            return True
    return False


def not_both_psum(instr: str, **two: NkiTensor) -> None:
    """Two-input engines read at most one operand from PSUM (rule BUF)."""
    (a, ta), (b, tb) = two.items()
    if ta._st.buffer is psum and tb._st.buffer is psum:
        raise fail("BUF", f"{instr}: {a} and {b} cannot both be in PSUM")


def acc_lanes(t: NkiTensor) -> slice:
    """The accumulator-register lanes an operand drives: its physical partitions."""
    p0 = t.region()[2]
    return slice(p0, p0 + t.shape[0])


_INT32 = (-(2**31), 2**31 - 1)


def int_arg(x: Any, arg: str, instr: str, lo: int = _INT32[0], hi: int = _INT32[1]) -> int:
    """A compile-time integer argument within [lo, hi] (bools and floats are refused)."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise fail("ARG", f"{instr}: {arg} must be a compile-time int; got {x!r}")
    if not lo <= int(x) <= hi:
        raise fail("ARG", f"{instr}: {arg}={int(x)} is outside [{lo}, {hi}]")
    return int(x)


def float_arg(x: Any, arg: str, instr: str) -> float:
    """A compile-time number used as an fp32 immediate."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise fail("ARG", f"{instr}: {arg} must be a compile-time number; got {x!r}")
    return float(np.float32(x))


def flag(x: Any, arg: str, instr: str) -> bool:
    """A boolean option (True / False; strings and numbers are refused)."""
    if not isinstance(x, (bool, np.bool_)):
        raise fail("ARG", f"{instr}: {arg} must be True or False; got {x!r}")
    return bool(x)


def reduce_axes(axis: Any, ndim: int, instr: str) -> tuple[int, ...]:
    """Normalized reduction axes: an int or a tuple of ints naming trailing free dims."""
    raw = axis if isinstance(axis, (tuple, list)) else (axis,)
    if not raw or any(isinstance(a, (bool, np.bool_)) for a in raw):
        raise fail("ARG", f"{instr}: axis must be an int or a tuple of ints; got {axis!r}")
    try:
        idx = [operator.index(a) for a in raw]
    except TypeError:
        raise fail(
            "ARG", f"{instr}: axis must be an int or a tuple of ints; got {axis!r}"
        ) from None
    axes = tuple(sorted(a + ndim if a < 0 else a for a in idx))
    if 0 in axes or axes != tuple(range(ndim - len(axes), ndim)):
        raise fail(
            "REDUCE_AXIS",
            f"{instr}: axis {axis} must name trailing free dims of a {ndim}-D tile "
            f"(e.g. {(ndim - 1,)}); dim 0, the partition dim, cannot be reduced",
        )
    return axes


def pick_engine(requested: Any, default: str, allowed: tuple[str, ...], instr: str) -> str:
    """The engine an instruction runs on: `default` for engine.unknown, else the requested
    one if it is among `allowed` (rule ENGINE otherwise)."""
    if requested is engine_enum.unknown:
        return default
    if not isinstance(requested, engine_enum):
        raise fail("ARG", f"{instr}: engine must be an nisa.engine member; got {requested!r}")
    name = ENGINE_NAMES[requested]
    if name not in allowed:
        raise fail("ENGINE", f"{instr} cannot run on the {name} engine (allowed: {allowed})")
    return name


def no_psum_on_gpsimd(eng: str, instr: str, **operands: NkiTensor | None) -> None:
    """GpSimd has no path to PSUM (rule GPSIMD_PSUM)."""
    if eng != "gpsimd":
        return
    for name, t in operands.items():
        if t is not None and t.buffer is psum:
            raise fail("GPSIMD_PSUM", f"{instr} on GpSimd cannot access PSUM ({name})")


def need_version(minimum: int, what: str) -> None:
    """Refuse `what` on targets older than NeuronCore v`minimum` (rule VERSION)."""
    t = current().target
    if t.nc_version < minimum:
        raise fail(
            "VERSION",
            f"{what} needs NeuronCore v{minimum}+; target {t.name} is NC-v{t.nc_version}",
        )


def op_token(op: Any, arg: str, instr: str) -> ops.Op:
    """Resolve an `op=` argument: nl op tokens only (raw ints, strings, ufuncs refused)."""
    if isinstance(op, ops.Op):
        return op
    raise fail("OP", f"{instr}: {arg} must be an nl op token such as nl.add; got {op!r}")


def alu_op(op: Any, arg: str, instr: str, *, unary: bool = False, bitvec: bool = True) -> ops.Op:
    """An ALU operator token: arithmetic, bitvec (unless `bitvec=False`) and, when
    `unary=True`, the unary ALU ops; newer-generation ops need their NeuronCore version."""
    o = op_token(op, arg, instr)
    name = o.name
    if name in ALU_ARITH or (bitvec and name in ALU_BITVEC) or (unary and name in ALU_UNARY):
        if o.version > current().target.nc_version:
            raise fail(
                "VERSION", f"{instr}: nl.{name} needs NC-v{o.version}+ ({current().target.name})"
            )
        return o
    kinds = ["binary"] + (["bitvec"] if bitvec else []) + (["unary"] if unary else [])
    raise fail("OP", f"{instr}: {arg}=nl.{name} is not an ALU operator ({', '.join(kinds)})")


def is_bitvec(o: ops.Op | None) -> bool:
    """Whether the op is a bitvec (integer bit-pattern) operator."""
    return o is not None and o.name in ALU_BITVEC


# ---- values ---------------------------------------------------------------------------
def _affine(shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    nd = len(shape)
    addr = np.zeros(shape, dtype=np.int64)
    for d in range(nd):
        if shape[d] > 1 and strides[d]:
            bshape = [1] * nd
            bshape[d] = shape[d]
            addr += (np.arange(shape[d], dtype=np.int64) * strides[d]).reshape(bshape)
    return addr


def scalar_index(index: Any) -> int:
    """The run-time value of a scalar index: a (1, 1) tensor or a register."""
    if isinstance(index, NkiTensor):
        return int(read(index).reshape(-1)[0])
    return int(index.value)


def addresses(t: NkiTensor) -> tuple[np.ndarray, np.ndarray]:
    """Element addresses (in t.dtype units) of an indirect view, and the in-bounds mask.

    Vector indirection addresses row i at `index[i] * row_stride` (a (P, K) index is
    read column-major); a row is out of bounds when its index is negative or any of its
    elements falls outside the storage. Scalar indirection moves the whole view; it is
    in bounds only when every element is.
    """
    ind = t.indirect
    assert ind is not None
    shape = t.shape
    total = t.storage_elements()
    if ind.kind == "vector":
        idx = read(ind.index).astype(np.int64)
        rows = idx.T.reshape(-1)[: shape[0]]
        inner = _affine(shape[1:], t.strides[1:]) + t.offset
        bshape = (shape[0],) + (1,) * (len(shape) - 1)
        addr = rows.reshape(bshape) * ind.row_stride + inner
        lo, hi = int(inner.min()), int(inner.max())
        start = rows * ind.row_stride
        ok = (rows >= 0) & (start + lo >= 0) & (start + hi < total)
        return addr, np.broadcast_to(ok.reshape(bshape), shape)
    v = scalar_index(ind.index)
    addr = _affine(shape, t.strides) + (t.offset + v * ind.row_stride)
    in_bounds = v >= 0 and int(addr.min()) >= 0 and int(addr.max()) < total
    return addr, np.full(shape, in_bounds)


def _flat(t: NkiTensor) -> np.ndarray:
    if t._st.pending is not None:
        t._st.pending.flush()
    data = t._st.data
    assert data is not None
    nd = t.dtype._np
    return data.view(nd) if data.dtype != nd else data


def read(t: NkiTensor, oob_skip: bool = False) -> np.ndarray:
    """The tensor's values in its own dtype (indirect views are gathered)."""
    if t.indirect is None:
        return t.array()
    addr, valid = addresses(t)
    flat = _flat(t)
    if not valid.all():
        if not oob_skip:
            bad = int(addr[~valid].reshape(-1)[0])
            raise fail(
                "DMA_OOB",
                f"indirect read of '{t.name}' out of bounds (element {bad} of "
                f"{t.storage_elements()}); pass oob_mode=nisa.oob_mode.skip to skip it",
            )
        out = np.zeros(t.shape, dtype=t.dtype._np)
        out[valid] = flat[addr[valid]]
        return out
    return flat[addr]


def read_f32(t: NkiTensor) -> np.ndarray:
    """The tensor's values converted to fp32, as the engines compute."""
    return dt.to_f32(read(t))


def mm_view(t: NkiTensor) -> np.ndarray | None:
    """The PSUM 'written by a matmul' mask of a view (None outside PSUM or for a reinterpreted
    view), used by accumulate=None."""
    st = t._st
    if st.mm_mask is None or t.dtype._size != st.dtype._size:
        return None
    return np.ndarray(t.shape, np.bool_, buffer=st.mm_mask, offset=t.offset, strides=t.strides)


def write(t: NkiTensor, values: np.ndarray, mask: np.ndarray | None = None) -> None:
    """Store `values` into `t`, rounding to t.dtype; where `mask` is False keep dst."""
    st = t._st
    if st.borrowed:
        st.own()
    st.dirty = True
    vals = dt.cast(np.asarray(values), t.dtype)
    if vals.shape != t.shape:
        vals = vals.reshape(t.shape)
    if t.indirect is None:
        arr = t.array()
        if mask is None:
            arr[...] = vals
        else:
            np.copyto(arr, vals, where=mask)
        if st.mm_mask is not None:
            mm = mm_view(t)
            if mm is not None:
                mm[...] = False
        return
    addr, valid = addresses(t)
    keep = valid if mask is None else valid & mask
    _flat(t)[addr[keep]] = vals[keep]


def convert(values: np.ndarray, src: dt.NkiDtype, dst: dt.NkiDtype) -> np.ndarray:
    """A copy engine's conversion: bit-exact for equal dtypes, otherwise through fp32."""
    if src == dst:
        return values
    return values.astype(np.float32)


# ---- trace ------------------------------------------------------------------------------


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
    launch = current()
    live = launch.liveness
    if live is not None and live.starts:
        live.before(launch.program_id)
    for group in (dsts, srcs):
        for t in group:
            if t.dtype in _PACKED:
                _packed_operands(opcode, dsts, srcs)
    if launch.check_operand_bounds:
        for t in dsts + srcs:
            if t.indirect is None:
                t.check_bounds()
    reads = []
    hbm_read = 0
    for t in srcs:
        reads.append(t.region())
        if not t._st.buffer.on_chip:
            hbm_read += _size(t.shape) * t.dtype._size
        ind = t.indirect
        if ind is not None and type(ind.index) is NkiTensor:
            reads.append(ind.index.region())
    writes = []
    hbm_write = 0
    for t in dsts:
        writes.append(t.region())
        if not t._st.buffer.on_chip:
            hbm_write += _size(t.shape) * t.dtype._size
        ind = t.indirect
        if ind is not None and type(ind.index) is NkiTensor:
            reads.append(ind.index.region())
    if extra_reads:
        reads.extend(extra_reads)
    if engine in _ACCESS_ENGINES:
        attrs = _with_access(attrs, dsts + srcs)
    instr = Instr(
        engine,
        opcode,
        p,
        n,
        _DNAMES[dsts[0].dtype] if dsts else "",
        tuple([_DNAMES[t.dtype] for t in srcs]),
        tuple(reads),
        tuple(writes),
        flops,
        hbm_read,
        hbm_write,
        nbytes,
        attrs,
        name,
    )
    instr.program = launch.program_id
    instr.no_reorder = launch.programs[launch.program_id].no_reorder_block
    instrs = launch.trace.instrs
    instr.index = len(instrs)
    instrs.append(instr)
    if launch.liveness is not None:
        launch.liveness.touched(dsts, srcs, launch.program_id, instr)
    return instr


_PACKED = dt.PACKED_MX_DTYPES
# Engines whose SBUF / PSUM access pattern the cost model prices (`_with_access`).
_ACCESS_ENGINES = frozenset({"vector", "scalar", "gpsimd"})


def _with_access(attrs: dict[str, Any] | None, ts: tuple[NkiTensor, ...]) -> dict[str, Any]:
    """`attrs` plus the operands' innermost access: `stride_bytes`, the largest byte stride
    of an on-chip operand's most-minor free dimension with more than one element, and
    `contig`, whether every on-chip operand's most-minor elements are physically adjacent
    (the architecture guides price both: VectorE perf modes, the 16-byte stride rule)."""
    out = dict(attrs) if attrs else {}
    widest = 0
    contig = True
    for t in ts:
        if not t._st.buffer.on_chip:
            continue
        step = 1
        for size, stride in zip(reversed(t.shape[1:]), reversed(t.strides[1:])):
            if size > 1:
                step = stride
                break
        if step != 1:
            contig = False
        widest = max(widest, abs(step) * t.dtype._size)
    out.setdefault("stride_bytes", widest)
    out.setdefault("contig", contig)
    return out


# Instructions that move packed MX words unchanged (all their operands of one dtype), or
# that fill / produce / consume them by definition.
_X4_COPIES = frozenset(
    {"dma_copy", "dma_transpose", "sendrecv", "tensor_copy", "nc_transpose", "nc_stream_shuffle"}
)
_X4_OWN = frozenset({"memset", "quantize_mx", "nc_matmul_mx", "core_barrier"})


def _packed_operands(opcode: str, dsts: tuple[NkiTensor, ...], srcs: tuple[NkiTensor, ...]) -> None:
    """Packed MX operands only in copies between equal dtypes and the MX instructions."""
    if opcode in _X4_OWN:
        return
    kinds = {t.dtype for t in dsts + srcs}
    if opcode in _X4_COPIES and len(kinds) == 1:
        return
    names = ", ".join(sorted(str(d) for d in kinds))
    raise fail(
        "DTYPE_X4",
        f"{opcode} on packed MX operands ({names}): engines cannot convert values to or from "
        "the *_x4 dtypes; only copies between equal dtypes, memset(value=0), "
        "nisa.quantize_mx and nisa.nc_matmul_mx handle them",
    )


def _size(shape: tuple[int, ...]) -> int:
    r = 1
    for n in shape:
        r *= n
    return r


def scalar_or_column(x: Any, p: int, arg: str, instr: str) -> np.ndarray | float | None:
    """An operand that is a Python scalar or a (P, 1) tile, as fp32 (None passes through)."""
    if x is None:
        return None
    if type(x) is NkiTensor:
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


class _NoInstruction:
    """Handle returned by an ISA call that recorded no instruction (e.g. empty views)."""

    __slots__ = ()

    def depends_on(self, *producers: Any) -> _NoInstruction:
        return self


NO_INSTRUCTION = _NoInstruction()

F = TypeVar("F", bound=Callable[..., Any])


def instruction(fn: F) -> F:
    """Wrap an ISA function: refuse undocumented keyword arguments (rule KWARG) and
    return an instruction handle (`.depends_on(...)` returns it)."""
    params = inspect.signature(fn).parameters
    allowed = frozenset(params)
    n_params = len(params)
    qualname = f"nisa.{fn.__name__}"

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kwargs and not allowed.issuperset(kwargs):
            raise fail(
                "KWARG",
                f"{qualname}() got unexpected keyword argument(s) {sorted(set(kwargs) - allowed)}",
            )
        if len(args) > n_params:
            raise fail("KWARG", f"{qualname}() takes {n_params} arguments; got {len(args)}")
        result = fn(*args, **kwargs)
        return NO_INSTRUCTION if result is None else result

    return wrapper  # type: ignore[return-value]
