"""NKI tensors: storages in HBM / SBUF / PSUM and the views kernels index into them.

A `Storage` is one allocation. On-chip storages are laid out partition-major: element
(p, f...) sits at p * F + flat(f...) where F is the number of elements per partition, so
the partition stride of every on-chip view is F (the `.ap()` rule). An `NkiTensor` is a
view: shape, element strides and an element offset into its storage, in units of its own
dtype, exactly the `NkiTensor` attributes of NKI 0.6. Indirect views (`.ap()` with a
scalar or vector offset, `vector_select`, dynamic `select`) add an index tensor that is
resolved when an instruction touches them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import dtypes as dt
from .errors import fail
from .state import Launch, current
from .trace import HBM, PSUM, SBUF, Region


class Buffer:
    """A memory region token: `nl.sbuf`, `nl.psum`, `nl.hbm`/`nl.private_hbm`, `nl.shared_hbm`."""

    __slots__ = ("name", "on_chip", "space")

    def __init__(self, name: str, on_chip: bool, space: int) -> None:
        self.name = name
        self.on_chip = on_chip
        self.space = space

    def __repr__(self) -> str:
        return f"nl.{self.name}"


sbuf = Buffer("sbuf", True, SBUF)
psum = Buffer("psum", True, PSUM)
private_hbm = Buffer("private_hbm", False, HBM)
hbm = private_hbm
shared_hbm = Buffer("shared_hbm", False, HBM)


def _prod(xs: tuple[int, ...] | list[int]) -> int:
    return math.prod(xs)


def _row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


class Storage:
    """One allocation. `data` is a flat array of `dtype` (None in trace-only mode)."""

    __slots__ = (
        "sid",
        "shape",
        "dtype",
        "buffer",
        "data",
        "name",
        "addr",
        "nbytes_pp",
        "memory",
        "mm_mask",
        "dirty",
        "__weakref__",
    )

    def __init__(
        self,
        launch: Launch,
        shape: tuple[int, ...],
        dtype: np.dtype,
        buffer: Buffer,
        name: str = "",
        data: np.ndarray | None = None,
    ) -> None:
        self.sid = launch.next_sid
        launch.next_sid += 1
        self.shape = shape
        self.dtype = dtype
        self.buffer = buffer
        self.name = name or f"t{self.sid}"
        self.memory = None
        self.addr = 0
        self.nbytes_pp = 0
        self.mm_mask: np.ndarray | None = None
        self.dirty = False
        size = _prod(shape)
        if buffer.on_chip:
            limit = launch.target.partitions
            if not shape or shape[0] > limit:
                pdim = shape[0] if shape else 0
                raise fail(
                    "TC1",
                    f"partition dim {pdim} of {buffer.name} tensor '{self.name}' {shape} "
                    f"exceeds {limit}",
                )
            self.nbytes_pp = _prod(shape[1:]) * dtype.itemsize
            mem = launch.program.memory
            what = f"'{self.name}' {shape} {dtype.name}"
            if buffer is psum:
                self.addr = mem.place_psum(self.nbytes_pp, what)
            else:
                self.addr = mem.place_sbuf(self.nbytes_pp, what)
            self.memory = mem
        if launch.trace_only:
            self.data = None
        elif data is not None:
            self.data = data
        else:
            self.data = np.full(size, dt.fresh_fill(dtype), dtype=dtype)
            if buffer is psum:
                self.mm_mask = np.zeros(size, dtype=np.bool_)

    def __del__(self) -> None:
        mem = self.memory
        if mem is not None:
            self.memory = None
            if self.buffer is psum:
                mem.psum.release(self.addr, self.nbytes_pp)
            else:
                mem.sbuf.release(self.addr, self.nbytes_pp)

    @property
    def pstride(self) -> int:
        """Elements per partition (on-chip partition stride)."""
        return _prod(self.shape[1:])


class Indirect:
    """A run-time index attached to a view: vector (per partition) or scalar."""

    __slots__ = ("kind", "index", "dim", "row_stride", "extent")

    def __init__(self, kind: str, index: NkiTensor, dim: int, row_stride: int, extent: int):
        self.kind = kind
        self.index = index
        self.dim = dim
        self.row_stride = row_stride
        self.extent = extent


class NkiTensor:
    """A view of a storage: the tensor type every NKI call takes and returns."""

    __slots__ = ("_st", "shape", "strides", "offset", "dtype", "indirect")

    def __init__(
        self,
        storage: Storage,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        offset: int,
        dtype: np.dtype,
        indirect: Indirect | None = None,
    ) -> None:
        self._st = storage
        self.shape = shape
        self.strides = strides
        self.offset = offset
        self.dtype = dtype
        self.indirect = indirect

    # ---- attributes ------------------------------------------------------------------
    @property
    def buffer(self) -> Buffer:
        return self._st.buffer

    @property
    def name(self) -> str:
        return self._st.name

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return _prod(self.shape)

    @property
    def storage(self) -> Storage:
        return self._st

    @property
    def on_chip(self) -> bool:
        return self._st.buffer.on_chip

    @property
    def partitions(self) -> int:
        """Partition count of an on-chip view (dim 0)."""
        return self.shape[0] if self.shape else 1

    @property
    def free_size(self) -> int:
        """Elements per partition of an on-chip view."""
        return _prod(self.shape[1:])

    def __repr__(self) -> str:
        return (
            f"NkiTensor({self._st.name}, {self.buffer!r}, shape={self.shape}, "
            f"dtype={self.dtype.name}, strides={self.strides}, offset={self.offset})"
        )

    def __len__(self) -> int:
        return self.shape[0]

    # ---- queries ------------------------------------------------------------------
    def is_contiguous(self) -> bool:
        """Row-major contiguity over the free dims (on-chip) or all dims (HBM)."""
        dims = list(zip(self.shape, self.strides))
        if self.on_chip:
            dims = dims[1:]
        expected = 1
        for n, s in reversed(dims):
            if n != 1 and s != expected:
                return False
            expected *= n
        return True

    def is_indirect(self) -> bool:
        return self.indirect is not None

    def get_pattern(self) -> list[list[int]]:
        return [[s, n] for n, s in zip(self.shape, self.strides)]

    # ---- view construction ----------------------------------------------------------
    def _derive(
        self, shape: tuple[int, ...], strides: tuple[int, ...], offset: int | None = None
    ) -> NkiTensor:
        return NkiTensor(
            self._st,
            shape,
            strides,
            self.offset if offset is None else offset,
            self.dtype,
            self.indirect,
        )

    def _no_indirect(self, what: str) -> None:
        if self.indirect is not None:
            raise fail("VIEW", f"{what} is not supported on an indirect view of '{self.name}'")

    def __getitem__(self, key: Any) -> NkiTensor:
        self._no_indirect("indexing")
        if not isinstance(key, tuple):
            key = (key,)
        n_ell = sum(1 for k in key if k is Ellipsis)
        if n_ell > 1:
            raise fail("IDX", f"index {key} has more than one Ellipsis")
        n_real = len(key) - n_ell
        if n_real > self.ndim:
            raise fail("IDX", f"index {key} has {n_real} entries for a {self.ndim}-D tensor")
        if n_ell:
            i = key.index(Ellipsis)
            key = key[:i] + (slice(None),) * (self.ndim - n_real) + key[i + 1 :]
        else:
            key = key + (slice(None),) * (self.ndim - len(key))
        on_chip = self.on_chip
        shape: list[int] = []
        strides: list[int] = []
        offset = self.offset
        dropped: tuple[int, int] | None = None
        for d, (k, n, s) in enumerate(zip(key, self.shape, self.strides)):
            if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
                k = int(k)
                idx = k + n if k < 0 else k
                if not 0 <= idx < n:
                    raise fail(
                        "IDX", f"index {k} out of range for dim {d} of size {n} of '{self.name}'"
                    )
                offset += idx * s
                if on_chip and d == 0:
                    shape.append(1)
                    strides.append(s)
                else:
                    dropped = (1, s)
            elif isinstance(k, slice):
                start, stop, step = _check_slice(k, n, d, self.name)
                offset += start * s
                shape.append(max(0, -(-(stop - start) // step)))
                strides.append(s * step)
            else:
                raise fail(
                    "IDX",
                    f"index entry {k!r} for dim {d} of '{self.name}': expected an int, a slice "
                    "or nl.ds(start, size) (tensor-valued indexes use .ap())",
                )
        if on_chip and len(shape) < 2:
            # on-chip results stay at least 2-D: keep the last dropped free dim at size 1
            n1, s1 = dropped if dropped is not None else (1, 1)
            shape.append(n1)
            strides.append(s1)
        return self._derive(tuple(shape), tuple(strides), offset)

    def __setitem__(self, key: Any, value: Any) -> None:
        from . import isa

        dst = self[key]
        if isinstance(value, NkiTensor):
            if dst.on_chip and value.on_chip:
                isa.tensor_copy(dst, value)
            else:
                isa.dma_copy(dst, value)
        else:
            isa.memset(dst, value)

    def slice(self, dim: int, start: int, end: int, step: int = 1) -> NkiTensor:
        key: list[Any] = [slice(None)] * self.ndim
        if step < 1 or not 0 <= start < end <= self.shape[dim]:
            raise fail(
                "IDX",
                f"slice(dim={dim}, start={start}, end={end}, step={step}) outside 0..{self.shape[dim]}"
                f" of '{self.name}'",
            )
        key[dim] = slice(start, end, step)
        return self[tuple(key)]

    def select(self, dim: int, index: int | NkiTensor) -> NkiTensor:
        if isinstance(index, NkiTensor):
            self._no_indirect("a second dynamic select")
            if self.on_chip and dim == 0:
                raise fail("VIEW", "dynamic select on the partition dim of an on-chip tensor")
            shape = self.shape[:dim] + self.shape[dim + 1 :]
            strides = self.strides[:dim] + self.strides[dim + 1 :]
            ind = Indirect("scalar", index, dim, self.strides[dim], self.shape[dim])
            return NkiTensor(self._st, shape, strides, self.offset, self.dtype, ind)
        key: list[Any] = [slice(None)] * self.ndim
        key[dim] = index
        if self.on_chip and dim == 0:
            raise fail("VIEW", "select on the partition dim of an on-chip tensor")
        view = self[tuple(key)]
        if self.on_chip and view.ndim > self.ndim - 1:
            # the >= 2-D rule kept a size-1 dim; select always removes it
            return view._derive(view.shape[:-1], view.strides[:-1])
        return view

    def vector_select(self, dim: int, vector_offset: NkiTensor) -> NkiTensor:
        if dim != 0:
            raise fail("VIEW", f"vector_select supports dim=0 only; got dim={dim}")
        if self.on_chip:
            raise fail("VIEW", "vector_select is only supported on HBM tensors")
        self._no_indirect("a second dynamic select")
        p = vector_offset.shape[0]
        ind = Indirect("vector", vector_offset, 0, self.strides[0], self.shape[0])
        return NkiTensor(
            self._st, (p,) + self.shape[1:], (0,) + self.strides[1:], self.offset, self.dtype, ind
        )

    def reshape(self, *shape_args: Any) -> NkiTensor:
        self._no_indirect("reshape")
        shape = shape_args[0] if len(shape_args) == 1 else shape_args
        shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        if -1 in shape:
            known = _prod([s for s in shape if s != -1])
            shape = tuple(self.size // max(known, 1) if s == -1 else s for s in shape)
        if _prod(shape) != self.size:
            raise fail(
                "VIEW", f"reshape of '{self.name}' {self.shape} to {shape} changes the element count"
            )
        if self.on_chip and shape[0] != self.shape[0]:
            raise fail(
                "VIEW",
                f"reshape of on-chip '{self.name}' {self.shape} to {shape} changes the partition "
                "dim",
            )
        probe = np.lib.stride_tricks.as_strided(
            np.zeros(1, dtype=np.int8), shape=self.shape, strides=self.strides
        )
        try:
            new = np.reshape(probe, shape, copy=False)
        except ValueError:
            raise fail(
                "VIEW",
                f"reshape of '{self.name}' {self.shape} (strides {self.strides}) to {shape} "
                "needs a copy: the layout is not compatible",
            ) from None
        return self._derive(shape, tuple(new.strides))

    def reshape_dim(self, dim: int, shape: tuple[int, ...]) -> NkiTensor:
        shape = tuple(shape)
        if -1 in shape:
            known = _prod([s for s in shape if s != -1])
            shape = tuple(self.shape[dim] // known if s == -1 else s for s in shape)
        return self.reshape(self.shape[:dim] + shape + self.shape[dim + 1 :])

    def flatten_dims(self, start_dim: int, end_dim: int) -> NkiTensor:
        if self.on_chip and start_dim == 0:
            raise fail("VIEW", "flatten_dims cannot merge the partition dim of an on-chip tensor")
        merged = _prod(self.shape[start_dim : end_dim + 1])
        return self.reshape(self.shape[:start_dim] + (merged,) + self.shape[end_dim + 1 :])

    def expand_dim(self, dim: int) -> NkiTensor:
        if self.on_chip and dim == 0:
            raise fail("VIEW", "expand_dim cannot insert before the partition dim")
        return self._derive(
            self.shape[:dim] + (1,) + self.shape[dim:], self.strides[:dim] + (0,) + self.strides[dim:]
        )

    def squeeze_dim(self, dim: int) -> NkiTensor:
        if self.shape[dim] != 1:
            raise fail("VIEW", f"squeeze_dim({dim}) of '{self.name}' {self.shape}: size is not 1")
        if self.on_chip and dim == 0:
            raise fail("VIEW", "squeeze_dim cannot remove the partition dim")
        return self._derive(
            self.shape[:dim] + self.shape[dim + 1 :], self.strides[:dim] + self.strides[dim + 1 :]
        )

    def broadcast(self, dim: int, size: int) -> NkiTensor:
        if self.shape[dim] != 1:
            raise fail(
                "VIEW", f"broadcast({dim}, {size}) of '{self.name}' {self.shape}: size is not 1"
            )
        if self.on_chip and dim == 0:
            raise fail("VIEW", "on-chip tensors cannot broadcast the partition dim")
        return self._derive(
            self.shape[:dim] + (size,) + self.shape[dim + 1 :],
            self.strides[:dim] + (0,) + self.strides[dim + 1 :],
        )

    def permute(self, dims: tuple[int, ...] | list[int]) -> NkiTensor:
        dims = tuple(dims)
        if sorted(dims) != list(range(self.ndim)):
            raise fail("VIEW", f"permute{dims} is not a permutation of {self.ndim} dims")
        if (self.on_chip or self.indirect is not None) and dims[0] != 0:
            raise fail("VIEW", f"permute{dims} moves the partition dim of '{self.name}'")
        return self._derive(
            tuple(self.shape[d] for d in dims), tuple(self.strides[d] for d in dims)
        )

    def view(self, dtype: Any) -> NkiTensor:
        self._no_indirect("view(dtype)")
        new = dt.as_dtype(dtype)
        old_sz, new_sz = self.dtype.itemsize, new.itemsize
        if old_sz == new_sz:
            return NkiTensor(self._st, self.shape, self.strides, self.offset, new)
        if self.strides[-1] != 1 and self.shape[-1] != 1:
            raise fail("VIEW", f"view({new.name}) needs a contiguous last dim on '{self.name}'")
        last_bytes = self.shape[-1] * old_sz
        if last_bytes % new_sz or (self.offset * old_sz) % new_sz:
            raise fail(
                "VIEW",
                f"view({new.name}) of '{self.name}': last dim of {last_bytes} B is not a multiple "
                f"of {new_sz} B",
            )
        for s in self.strides[:-1]:
            if (s * old_sz) % new_sz:
                raise fail("VIEW", f"view({new.name}) of '{self.name}': strides do not divide")
        strides = tuple(s * old_sz // new_sz for s in self.strides[:-1]) + (1,)
        shape = self.shape[:-1] + (last_bytes // new_sz,)
        return NkiTensor(self._st, shape, strides, self.offset * old_sz // new_sz, new)

    def ap(
        self,
        pattern: list[list[int]] | tuple[tuple[int, int], ...],
        offset: int | None = None,
        scalar_offset: NkiTensor | None = None,
        vector_offset: NkiTensor | None = None,
        indirect_dim: int = 0,
        dtype: Any = None,
    ) -> NkiTensor:
        """Explicit access pattern over the base storage (does not compose with the view)."""
        self._no_indirect(".ap()")
        new_dtype = self.dtype if dtype is None else dt.as_dtype(dtype)
        pairs = [(int(s), int(n)) for s, n in pattern]
        if not pairs:
            raise fail("VIEW", ".ap() needs at least one [stride, count] pair")
        st = self._st
        if scalar_offset is not None and vector_offset is not None:
            raise fail("VIEW", ".ap(): scalar_offset and vector_offset are mutually exclusive")
        scale = self.dtype.itemsize / new_dtype.itemsize
        base_offset = int(self.offset * scale)
        off = base_offset + (int(offset) if offset is not None else 0)
        if self.on_chip:
            pstride = int(st.pstride * st.dtype.itemsize / new_dtype.itemsize)
            if pairs[0][0] != pstride:
                raise fail(
                    "VIEW",
                    f".ap() on on-chip '{self.name}': the partition pair's stride {pairs[0][0]} "
                    f"must equal the per-partition element count {pstride}",
                )
        shape = tuple(n for _, n in pairs)
        strides = tuple(s for s, _ in pairs)
        ind = None
        base_shape = st.shape
        if scalar_offset is not None or vector_offset is not None:
            if not 0 <= indirect_dim < len(base_shape):
                raise fail("VIEW", f".ap(): indirect_dim {indirect_dim} outside the base shape")
            row = int(_prod(base_shape[indirect_dim + 1 :]) * st.dtype.itemsize / new_dtype.itemsize)
            if vector_offset is not None:
                if indirect_dim != 0:
                    raise fail("VIEW", ".ap(): vector_offset supports indirect_dim=0 only")
                if vector_offset.shape[0] != shape[0]:
                    raise fail(
                        "VIEW",
                        f".ap(): vector_offset has {vector_offset.shape[0]} partitions but the "
                        f"pattern's first count is {shape[0]}",
                    )
                ind = Indirect("vector", vector_offset, 0, row, base_shape[0])
            else:
                assert scalar_offset is not None
                ind = Indirect("scalar", scalar_offset, indirect_dim, row, base_shape[indirect_dim])
        view = NkiTensor(st, shape, strides, off, new_dtype, ind)
        if ind is None:
            view.check_bounds()
        return view

    # ---- access ---------------------------------------------------------------------
    def check_bounds(self) -> None:
        lo, hi = self._extent()
        total = _prod(self._st.shape) * self._st.dtype.itemsize // self.dtype.itemsize
        if self.size and (lo < 0 or hi >= total):
            raise fail(
                "IDX",
                f"view of '{self.name}' reaches elements {lo}..{hi} outside its storage of {total}",
            )

    def _extent(self) -> tuple[int, int]:
        lo = hi = self.offset
        for n, s in zip(self.shape, self.strides):
            if n > 1:
                if s > 0:
                    hi += (n - 1) * s
                else:
                    lo += (n - 1) * s
        return lo, hi

    def array(self) -> np.ndarray:
        """A NumPy view of a direct (non-indirect) tensor's elements (numeric mode only)."""
        isz = self.dtype.itemsize
        return np.ndarray(
            self.shape,
            self.dtype,
            buffer=self._st.data,
            offset=self.offset * isz,
            strides=tuple(s * isz for s in self.strides),
        )

    def region(self) -> Region:
        """The physical region this view touches, for the trace's dependency tracking."""
        st = self._st
        isz = self.dtype.itemsize
        if self.indirect is not None or not self.size:
            if st.buffer.on_chip:
                return (st.buffer.space, 0, 0, st.shape[0], st.addr, st.addr + st.nbytes_pp)
            return (HBM, st.sid, 0, 1, 0, _prod(st.shape) * st.dtype.itemsize)
        if not st.buffer.on_chip:
            lo, hi = self._extent()
            return (HBM, st.sid, 0, 1, lo * isz, (hi + 1) * isz)
        pst = st.pstride * st.dtype.itemsize  # bytes per partition
        start = self.offset * isz
        p0, f0 = divmod(start, pst) if pst else (0, 0)
        n0, s0 = self.shape[0], self.strides[0] * isz
        p1 = p0 + ((n0 - 1) * s0 // pst if pst else 0) + 1
        flo = fhi = f0
        for n, s in zip(self.shape[1:], self.strides[1:]):
            if n > 1:
                if s > 0:
                    fhi += (n - 1) * s * isz
                else:
                    flo += (n - 1) * s * isz
        return (st.buffer.space, 0, p0, p1, st.addr + flo, st.addr + fhi + isz)


def _check_slice(k: slice, n: int, d: int, name: str) -> tuple[int, int, int]:
    step = 1 if k.step is None else int(k.step)
    if step == 0:
        raise fail("IDX", f"slice step 0 for dim {d} of '{name}'")
    if step < 0:
        start, stop, step = k.indices(n)
        return start, stop, step
    start = 0 if k.start is None else int(k.start)
    stop = n if k.stop is None else int(k.stop)
    if start < 0:
        start += n
    if stop < 0:
        stop += n
    if not (0 <= start <= n and start <= stop <= n):
        raise fail(
            "IDX",
            f"slice {k.start}:{k.stop} out of range for dim {d} of size {n} of '{name}'",
        )
    return start, stop, step


def allocate(
    shape: Any, dtype: Any, buffer: Buffer, name: str = "", data: np.ndarray | None = None
) -> NkiTensor:
    """Create a fresh storage and return the full view of it."""
    launch = current()
    if not isinstance(buffer, Buffer):
        raise fail("ARG", f"buffer: expected nl.sbuf, nl.psum, nl.hbm or nl.shared_hbm; got {buffer!r}")
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise fail("ARG", f"shape: expected a tuple of ints; got {shape!r}") from None
    if any(s <= 0 for s in shape):
        raise fail("ARG", f"shape: every dim must be positive; got {shape}")
    d = dt.as_dtype(dtype)
    if buffer is shared_hbm and data is None:
        prog = launch.program
        i = prog.shared_hbm_count
        prog.shared_hbm_count += 1
        if launch.program_id > 0 and i < len(launch.shared_hbm):
            st = launch.shared_hbm[i]
            if st.shape != shape or st.dtype != d:
                raise fail(
                    "LAUNCH",
                    f"shared_hbm allocation #{i} differs between programs: {st.shape} "
                    f"{st.dtype.name} vs {shape} {d.name}",
                )
            return NkiTensor(st, shape, _row_major(shape), 0, d)
        st = Storage(launch, shape, d, buffer, name)
        launch.shared_hbm.append(st)
        return NkiTensor(st, shape, _row_major(shape), 0, d)
    st = Storage(launch, shape, d, buffer, name, data)
    return NkiTensor(st, shape, _row_major(shape), 0, d)
