"""NKI tensors: storages in HBM / SBUF / PSUM and the views kernels index into them.

A `Storage` is one allocation. On-chip storages are laid out partition-major: element
(p, f...) sits at p * F + flat(f...) where F is the number of elements per partition, so
the partition stride of every on-chip view is F (the `.ap()` rule). An `NkiTensor` is a
view: shape, element strides and an element offset into its storage, in units of its own
dtype, exactly the `NkiTensor` attributes of NKI 0.6. Indirect views (`.ap()` with a
scalar or vector offset, `vector_select`, dynamic `select`) carry a run-time index that
is resolved when an instruction touches them.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

from . import dtypes as dt
from .errors import fail
from .state import Launch, current
from .trace import HBM, PSUM, SBUF, Region

_index = operator.index
_prod = math.prod
_FULL = slice(None)


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


def row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a contiguous row-major layout."""
    strides = []
    acc = 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


class Storage:
    """One allocation. `data` is a flat array of `dtype` (None in trace-only mode).

    On-chip storages hold a place in their program's SBUF or PSUM (`addr`, `nbytes_pp`
    bytes per partition) until the last view of them dies. PSUM storages also keep
    `mm_mask`: which elements a matmul has written since allocation (accumulate=None).
    """

    __slots__ = (
        "__weakref__",
        "addr",
        "buffer",
        "data",
        "dirty",
        "dtype",
        "is_input",
        "memory",
        "mm_mask",
        "name",
        "nbytes_pp",
        "pending",
        "pstride",
        "shape",
        "sid",
        "size",
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
        self.sid = sid = launch.next_sid
        launch.next_sid = sid + 1
        self.shape = shape
        self.dtype = dtype
        self.buffer = buffer
        self.name = name or f"t{sid}"
        self.memory = None
        self.addr = 0
        self.nbytes_pp = 0
        self.mm_mask: np.ndarray | None = None
        self.pending: Any = None  # deferred matmuls into this PSUM storage (isa_tensor)
        self.dirty = False
        self.is_input = False
        self.size = size = _prod(shape)
        self.pstride = _prod(shape[1:])
        if buffer.on_chip:
            limit = launch.target.partitions
            if shape[0] > limit:
                raise fail(
                    "TC1",
                    f"partition dim {shape[0]} of {buffer.name} tensor '{self.name}' {shape} "
                    f"exceeds {limit}",
                )
            self.nbytes_pp = nb = self.pstride * dtype.itemsize
            mem = launch.programs[launch.program_id].memory
            if buffer is psum:
                self.addr = mem.place_psum(nb, self)
            else:
                self.addr = mem.place_sbuf(nb, self)
            self.memory = mem
        if launch.trace_only:
            self.data = None
        elif data is not None:
            self.data = data
        else:
            self.data = np.full(size, dt.fresh_fill(dtype), dtype=dtype)
            if buffer is psum:
                self.mm_mask = np.zeros(size, dtype=np.bool_)

    def describe(self) -> str:
        return f"'{self.name}' {self.shape} {self.dtype.name}"

    def __del__(self) -> None:
        mem = self.memory
        if mem is not None:
            self.memory = None
            if self.buffer is psum:
                mem.psum.release(self.addr, self.nbytes_pp)
            else:
                mem.sbuf.release(self.addr, self.nbytes_pp)


class Indirect:
    """A run-time index attached to a view.

    kind "vector": partition (row) i of the view reads row `index[i]` -- the view's dim-0
    stride is replaced by `index[i] * row_stride`. kind "scalar": the whole view moves by
    `index * row_stride` elements. `index` is an on-chip tensor (or an object with an
    integer `value`, such as a virtual register).
    """

    __slots__ = ("index", "kind", "row_stride")

    def __init__(self, kind: str, index: Any, row_stride: int) -> None:
        self.kind = kind
        self.index = index
        self.row_stride = row_stride


class NkiTensor:
    """A view of a storage: the tensor type every NKI call takes and returns."""

    __slots__ = ("_st", "dtype", "indirect", "offset", "shape", "strides")

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
        return self.shape[0]

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

    def __iter__(self) -> Any:
        raise TypeError("NKI tensors are not iterable; index them with slices or nl.ds")

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
    def _derive(self, shape: tuple[int, ...], strides: tuple[int, ...]) -> NkiTensor:
        return NkiTensor(self._st, shape, strides, self.offset, self.dtype, self.indirect)

    def _no_indirect(self, what: str) -> None:
        if self.indirect is not None:
            raise fail("VIEW", f"{what} is not supported on an indirect view of '{self.name}'")

    def _dim(self, dim: Any, what: str) -> int:
        try:
            d = _index(dim)
        except TypeError:
            raise fail("ARG", f"{what}: dim must be an int; got {dim!r}") from None
        nd = len(self.shape)
        if not -nd <= d < nd:
            raise fail("IDX", f"{what}: dim {d} outside a {nd}-D tensor '{self.name}'")
        return d + nd if d < 0 else d

    def __getitem__(self, key: Any) -> NkiTensor:
        if self.indirect is not None:
            self._no_indirect("indexing")
        shape = self.shape
        if len(shape) == 2 and (type(key) is slice or (type(key) is tuple and len(key) == 2)):
            # fast path for the commonest views: t[a:b, c:d] and t[a:b] of a 2-D tensor
            k0, k1 = (key, _FULL) if type(key) is slice else key
            if type(k0) is slice and type(k1) is slice and k0.step is None and k1.step is None:
                n0, n1 = shape
                a0 = 0 if k0.start is None else k0.start
                b0 = n0 if k0.stop is None else k0.stop
                a1 = 0 if k1.start is None else k1.start
                b1 = n1 if k1.stop is None else k1.stop
                if (
                    type(a0) is int
                    and type(b0) is int
                    and type(a1) is int
                    and type(b1) is int
                    and 0 <= a0 <= b0 <= n0
                    and 0 <= a1 <= b1 <= n1
                ):
                    s0, s1 = self.strides
                    return NkiTensor(
                        self._st,
                        (b0 - a0, b1 - a1),
                        (s0, s1),
                        self.offset + a0 * s0 + a1 * s1,
                        self.dtype,
                    )
        if type(key) is not tuple:
            key = (key,)
        nd = len(shape)
        nk = len(key)
        if nk > nd or Ellipsis in key:
            key = self._expand_key(key)
            nk = nd
        strides = self.strides
        offset = self.offset
        new_shape: list[int] = []
        new_strides: list[int] = []
        dropped_stride = -1
        on_chip = self._st.buffer.on_chip
        try:
            for d in range(nd):
                k = key[d] if d < nk else _FULL
                n = shape[d]
                s = strides[d]
                if type(k) is slice:
                    step = k.step
                    if step is None or step == 1:
                        start = k.start
                        if start is None:
                            start = 0
                        elif type(start) is not int:
                            start = _index(start)
                        stop = k.stop
                        if stop is None:
                            stop = n
                        elif type(stop) is not int:
                            stop = _index(stop)
                        if start < 0:
                            start += n
                        if stop < 0:
                            stop += n
                        if not 0 <= start <= stop <= n:
                            raise fail(
                                "IDX",
                                f"slice {k.start}:{k.stop} out of range for dim {d} of size "
                                f"{n} of '{self.name}'",
                            )
                        new_shape.append(stop - start)
                        new_strides.append(s)
                        offset += start * s
                    else:
                        start, count, step = _stepped_slice(k, n, d, self.name)
                        new_shape.append(count)
                        new_strides.append(s * step)
                        offset += start * s
                elif type(k) is bool or isinstance(k, np.bool_):
                    raise TypeError
                else:
                    i = _index(k)
                    if i < 0:
                        i += n
                    if not 0 <= i < n:
                        raise fail(
                            "IDX",
                            f"index {k} out of range for dim {d} of size {n} of '{self.name}'",
                        )
                    offset += i * s
                    if on_chip and d == 0:
                        new_shape.append(1)
                        new_strides.append(s)
                    else:
                        dropped_stride = s
        except TypeError:
            raise fail(
                "IDX",
                f"index {key!r} of '{self.name}': expected ints, slices, ... or nl.ds(start, size)"
                " (tensor-valued indexes use .ap(), select or vector_select)",
            ) from None
        if len(new_shape) < (2 if on_chip else 1):
            # on-chip results stay at least 2-D (the last dropped free dim is kept at
            # size 1); HBM results stay at least 1-D
            new_shape.append(1)
            new_strides.append(dropped_stride if dropped_stride >= 0 else 1)
        return NkiTensor(self._st, tuple(new_shape), tuple(new_strides), offset, self.dtype)

    def _expand_key(self, key: tuple[Any, ...]) -> tuple[Any, ...]:
        nd = len(self.shape)
        n_ell = sum(1 for k in key if k is Ellipsis)
        if n_ell > 1:
            raise fail("IDX", f"index {key} has more than one Ellipsis")
        n_real = len(key) - n_ell
        if n_real > nd:
            raise fail(
                "IDX",
                f"index {key} has {n_real} entries for {nd}-D tensor '{self.name}' {self.shape}",
            )
        if n_ell:
            i = key.index(Ellipsis)
            return key[:i] + (slice(None),) * (nd - n_real) + key[i + 1 :]
        return key + (slice(None),) * (nd - len(key))

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
        d = self._dim(dim, "slice")
        if step < 1 or not 0 <= start < end <= self.shape[d]:
            raise fail(
                "IDX",
                f"slice(dim={dim}, start={start}, end={end}, step={step}) outside "
                f"0..{self.shape[d]} of '{self.name}'",
            )
        key: list[Any] = [slice(None)] * self.ndim
        key[d] = slice(start, end, step)
        return self[tuple(key)]

    def select(self, dim: int, index: int | NkiTensor) -> NkiTensor:
        d = self._dim(dim, "select")
        if self.on_chip and d == 0:
            raise fail("VIEW", f"select on the partition dim of on-chip '{self.name}'")
        if not isinstance(index, (int, np.integer)):
            self._no_indirect("a second dynamic select")
            shape = self.shape[:d] + self.shape[d + 1 :]
            strides = self.strides[:d] + self.strides[d + 1 :]
            if self.on_chip and len(shape) < 2:
                raise fail("VIEW", f"select would leave on-chip '{self.name}' with one dim")
            ind = Indirect("scalar", _index_operand(index, "select"), self.strides[d])
            return NkiTensor(self._st, shape, strides, self.offset, self.dtype, ind)
        key: list[Any] = [slice(None)] * self.ndim
        key[d] = index
        view = self[tuple(key)]
        if view.ndim > self.ndim - 1 and view.ndim > (2 if self.on_chip else 1):
            # the >= 2-D / >= 1-D rule kept a size-1 dim where none was needed
            return view._derive(view.shape[:-1], view.strides[:-1])
        return view

    def vector_select(self, dim: int, vector_offset: NkiTensor) -> NkiTensor:
        if dim != 0:
            raise fail("VIEW", f"vector_select supports dim=0 only; got dim={dim}")
        if self.on_chip:
            raise fail("VIEW", f"vector_select is only supported on HBM tensors ('{self.name}')")
        self._no_indirect("a second dynamic select")
        _vector_index(vector_offset, None, "vector_select")
        p = vector_offset.shape[0]
        ind = Indirect("vector", vector_offset, self.strides[0])
        return NkiTensor(
            self._st, (p, *self.shape[1:]), (0, *self.strides[1:]), self.offset, self.dtype, ind
        )

    def reshape(self, *shape_args: Any) -> NkiTensor:
        self._no_indirect("reshape")
        shape = shape_args[0] if len(shape_args) == 1 else shape_args
        try:
            shape = tuple(
                _index(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,))
            )
        except TypeError:
            raise fail(
                "ARG", f"reshape: shape must be a tuple of ints; got {shape_args!r}"
            ) from None
        if shape.count(-1) > 1 or any(s < -1 or s == 0 for s in shape):
            raise fail("VIEW", f"reshape of '{self.name}': invalid shape {shape}")
        if -1 in shape:
            known = _prod([s for s in shape if s != -1])
            shape = tuple(self.size // known if s == -1 else s for s in shape)
        if _prod(shape) != self.size:
            raise fail(
                "VIEW",
                f"reshape of '{self.name}' {self.shape} to {shape} changes the element count",
            )
        if self.on_chip and shape[0] != self.shape[0]:
            raise fail(
                "VIEW",
                f"reshape of on-chip '{self.name}' {self.shape} to {shape} changes the partition "
                "dim",
            )
        strides = _reshape_strides(self.shape, self.strides, shape)
        if strides is None:
            raise fail(
                "VIEW",
                f"reshape of '{self.name}' {self.shape} (strides {self.strides}) to {shape} "
                "needs a copy: the layout is not compatible",
            )
        return self._derive(shape, strides)

    def reshape_dim(self, dim: int, shape: tuple[int, ...]) -> NkiTensor:
        d = self._dim(dim, "reshape_dim")
        shape = tuple(shape)
        if -1 in shape:
            known = _prod([s for s in shape if s != -1])
            shape = tuple(self.shape[d] // known if s == -1 else s for s in shape)
        if _prod(shape) != self.shape[d]:
            raise fail(
                "VIEW",
                f"reshape_dim({d}, {shape}): product must equal {self.shape[d]} ('{self.name}')",
            )
        return self.reshape(self.shape[:d] + shape + self.shape[d + 1 :])

    def flatten_dims(self, start_dim: int, end_dim: int) -> NkiTensor:
        s, e = self._dim(start_dim, "flatten_dims"), self._dim(end_dim, "flatten_dims")
        if self.on_chip and s == 0:
            raise fail("VIEW", "flatten_dims cannot merge the partition dim of an on-chip tensor")
        if e < s:
            raise fail("VIEW", f"flatten_dims({start_dim}, {end_dim}): end before start")
        merged = _prod(self.shape[s : e + 1])
        return self.reshape((*self.shape[:s], merged, *self.shape[e + 1 :]))

    def expand_dim(self, dim: int) -> NkiTensor:
        if not 0 <= dim <= self.ndim:
            raise fail("IDX", f"expand_dim({dim}) outside 0..{self.ndim} ('{self.name}')")
        if (self.on_chip or self.indirect is not None) and dim == 0:
            raise fail("VIEW", "expand_dim cannot insert before the partition dim")
        return self._derive(
            (*self.shape[:dim], 1, *self.shape[dim:]),
            (*self.strides[:dim], 0, *self.strides[dim:]),
        )

    def squeeze_dim(self, dim: int) -> NkiTensor:
        d = self._dim(dim, "squeeze_dim")
        if self.shape[d] != 1:
            raise fail("VIEW", f"squeeze_dim({dim}) of '{self.name}' {self.shape}: size is not 1")
        if (self.on_chip or self.indirect is not None) and d == 0:
            raise fail("VIEW", "squeeze_dim cannot remove the partition dim")
        return self._derive(
            self.shape[:d] + self.shape[d + 1 :], self.strides[:d] + self.strides[d + 1 :]
        )

    def broadcast(self, dim: int, size: int) -> NkiTensor:
        d = self._dim(dim, "broadcast")
        if self.shape[d] != 1:
            raise fail(
                "VIEW", f"broadcast({dim}, {size}) of '{self.name}' {self.shape}: size is not 1"
            )
        if self.on_chip and d == 0:
            raise fail("VIEW", "on-chip tensors cannot broadcast the partition dim")
        if not isinstance(size, (int, np.integer)) or size < 1:
            raise fail("ARG", f"broadcast: size must be a positive int; got {size!r}")
        return self._derive(
            (*self.shape[:d], int(size), *self.shape[d + 1 :]),
            (*self.strides[:d], 0, *self.strides[d + 1 :]),
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
        """Bit-level reinterpretation; the last dim is rescaled by the itemsize ratio."""
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
        strides = (*(s * old_sz // new_sz for s in self.strides[:-1]), 1)
        shape = (*self.shape[:-1], last_bytes // new_sz)
        return NkiTensor(self._st, shape, strides, self.offset * old_sz // new_sz, new)

    def ap(
        self,
        pattern: Any,
        offset: int | None = None,
        scalar_offset: Any = None,
        vector_offset: NkiTensor | None = None,
        indirect_dim: int = 0,
        dtype: Any = None,
    ) -> NkiTensor:
        """An explicit access pattern `[[stride, count], ...]` over this view's storage.

        Addresses are in elements of `dtype` (default: the view's dtype), starting at the
        view's offset plus `offset`. `vector_offset` (a (P, 1) SBUF index; HBM tensors
        only) makes row i of the pattern start at `index[i] * pattern[0][0]`;
        `scalar_offset` moves the whole pattern by `index * strides[indirect_dim]`.
        """
        self._no_indirect(".ap()")
        new_dtype = self.dtype if dtype is None else dt.as_dtype(dtype)
        try:
            pairs = [(_index(s), _index(n)) for s, n in pattern]
        except (TypeError, ValueError):
            raise fail(
                "ARG", f".ap(): pattern must be [[stride, count], ...]; got {pattern!r}"
            ) from None
        if not pairs or any(n < 1 for _, n in pairs):
            raise fail("VIEW", f".ap(): pattern {pattern!r} needs [stride, count>=1] pairs")
        if scalar_offset is not None and vector_offset is not None:
            raise fail("VIEW", ".ap(): scalar_offset and vector_offset are mutually exclusive")
        st = self._st
        old_sz, new_sz = self.dtype.itemsize, new_dtype.itemsize
        if (self.offset * old_sz) % new_sz:
            raise fail("VIEW", f".ap(dtype={new_dtype.name}): the view offset does not divide")
        off = self.offset * old_sz // new_sz + (0 if offset is None else _index(offset))
        if st.buffer.on_chip:
            pstride = st.pstride * st.dtype.itemsize // new_sz
            if pairs[0][0] != pstride:
                raise fail(
                    "VIEW",
                    f".ap() on on-chip '{self.name}': the partition pair's stride {pairs[0][0]} "
                    f"must equal the per-partition element count {pstride}",
                )
        shape = tuple(n for _, n in pairs)
        strides = tuple(s for s, _ in pairs)
        ind = None
        if vector_offset is not None:
            if st.buffer.on_chip:
                raise fail(
                    "VIEW", f".ap(vector_offset=...) needs an HBM tensor; '{self.name}' is on chip"
                )
            if indirect_dim != 0:
                raise fail(
                    "VIEW", f".ap(): vector_offset supports indirect_dim=0 only; got {indirect_dim}"
                )
            _vector_index(vector_offset, shape[0], ".ap()")
            ind = Indirect("vector", vector_offset, strides[0])
        elif scalar_offset is not None:
            d = self._dim(indirect_dim, ".ap(indirect_dim)")
            if (self.strides[d] * old_sz) % new_sz:
                raise fail(
                    "VIEW",
                    f".ap(): stride of indirect_dim {d} does not divide into {new_dtype.name}",
                )
            row = self.strides[d] * old_sz // new_sz
            ind = Indirect("scalar", _index_operand(scalar_offset, ".ap(scalar_offset)"), row)
        view = NkiTensor(st, shape, strides, off, new_dtype, ind)
        if ind is None:
            view.check_bounds()
        return view

    # ---- access ---------------------------------------------------------------------
    def storage_elements(self) -> int:
        """Size of the storage in elements of this view's dtype."""
        st = self._st
        return st.size * st.dtype.itemsize // self.dtype.itemsize

    def check_bounds(self) -> None:
        lo, hi = self._extent()
        total = self.storage_elements()
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
        if self._st.pending is not None:
            self._st.pending.flush()
        isz = self.dtype.itemsize
        return np.ndarray(
            self.shape,
            self.dtype,
            buffer=self._st.data,
            offset=self.offset * isz,
            strides=tuple([s * isz for s in self.strides]),
        )

    def region(self) -> Region:
        """The physical region this view touches, for the trace's dependency tracking."""
        st = self._st
        buf = st.buffer
        if self.indirect is not None:
            if buf.on_chip:
                return (buf.space, 0, 0, st.shape[0], st.addr, st.addr + st.nbytes_pp)
            return (HBM, st.sid, 0, 1, 0, st.size * st.dtype.itemsize)
        isz = self.dtype.itemsize
        shape = self.shape
        strides = self.strides
        lo = hi = self.offset
        if not buf.on_chip:
            for i in range(len(shape)):
                n = shape[i]
                if n > 1:
                    s = strides[i]
                    if s > 0:
                        hi += (n - 1) * s
                    else:
                        lo += (n - 1) * s
            return (HBM, st.sid, 0, 1, lo * isz, (hi + 1) * isz)
        pst = st.nbytes_pp  # bytes per partition
        p0, flo = divmod(lo * isz, pst)
        n0 = shape[0]
        p1 = p0 + 1 + ((n0 - 1) * strides[0] * isz) // pst if n0 > 1 else p0 + 1
        fhi = flo
        if len(shape) == 2:
            n1, s1 = shape[1], strides[1]
            if n1 > 1:
                if s1 > 0:
                    fhi += (n1 - 1) * s1 * isz
                else:
                    flo += (n1 - 1) * s1 * isz
            base = st.addr
            return (buf.space, 0, p0, p1, base + flo, base + fhi + isz)
        for i in range(1, len(shape)):
            n = shape[i]
            if n > 1:
                s = strides[i]
                if s > 0:
                    fhi += (n - 1) * s * isz
                else:
                    flo += (n - 1) * s * isz
        base = st.addr
        return (buf.space, 0, p0, p1, base + flo, base + fhi + isz)


def _stepped_slice(k: slice, n: int, d: int, name: str) -> tuple[int, int, int]:
    """(start, count, step) of a slice with an explicit step (negative steps allowed)."""
    step = _index(k.step)
    if step == 0:
        raise fail("IDX", f"slice step 0 for dim {d} of '{name}'")
    if step < 0:
        start, stop, step = k.indices(n)
        return start, len(range(start, stop, step)), step
    start = 0 if k.start is None else _index(k.start)
    stop = n if k.stop is None else _index(k.stop)
    if start < 0:
        start += n
    if stop < 0:
        stop += n
    if not 0 <= start <= stop <= n:
        raise fail(
            "IDX", f"slice {k.start}:{k.stop} out of range for dim {d} of size {n} of '{name}'"
        )
    return start, len(range(start, stop, step)), step


def _reshape_strides(
    shape: tuple[int, ...], strides: tuple[int, ...], new_shape: tuple[int, ...]
) -> tuple[int, ...] | None:
    """Strides of a no-copy reshape of a strided view, or None when a copy is needed."""
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]
    # group the old dims into maximal row-major-contiguous chunks
    chunks: list[list[int]] = []  # [count, innermost stride]
    for n, s in dims:
        if chunks and chunks[-1][1] == s * n:
            chunks[-1][0] *= n
            chunks[-1][1] = s
        else:
            chunks.append([n, s])
    out: list[int] = [0] * len(new_shape)
    # walk the new dims from the innermost, consuming chunks from the innermost
    chunks_rev = list(reversed(chunks))
    ci = 0
    remaining = chunks_rev[0][0] if chunks_rev else 1
    stride = chunks_rev[0][1] if chunks_rev else 1
    for j in range(len(new_shape) - 1, -1, -1):
        n = new_shape[j]
        if n == 1:
            out[j] = stride
            continue
        if ci >= len(chunks_rev) or remaining % n:
            return None
        out[j] = stride
        stride *= n
        remaining //= n
        if remaining == 1:
            ci += 1
            if ci < len(chunks_rev):
                remaining = chunks_rev[ci][0]
                stride = chunks_rev[ci][1]
    if ci != len(chunks_rev):
        return None
    return tuple(out)


def _vector_index(index: Any, rows: int | None, what: str) -> None:
    if not isinstance(index, NkiTensor) or not index.on_chip:
        raise fail(
            "VIEW", f"{what}: vector_offset must be an on-chip (P, 1) index tensor; got {index!r}"
        )
    if rows is None or index.free_size == 1:
        if rows is not None and index.shape[0] != rows:
            raise fail(
                "VIEW",
                f"{what}: vector_offset has {index.shape[0]} partitions but the pattern's first "
                f"count is {rows}",
            )
        return
    if index.size < rows:
        raise fail(
            "VIEW", f"{what}: vector_offset {index.shape} holds fewer than {rows} row indexes"
        )


def _index_operand(index: Any, what: str) -> Any:
    if isinstance(index, NkiTensor):
        if not index.on_chip or index.size != 1:
            raise fail(
                "VIEW", f"{what}: a tensor index must be a (1, 1) on-chip tensor; got {index.shape}"
            )
        return index
    if hasattr(index, "value"):  # a virtual register
        return index
    raise fail("VIEW", f"{what}: expected a (1, 1) SBUF tensor or a register; got {index!r}")


def allocate(
    shape: Any, dtype: Any, buffer: Buffer, name: str = "", data: np.ndarray | None = None
) -> NkiTensor:
    """Create a fresh storage and return the full view of it."""
    launch = current()
    if type(buffer) is not Buffer:
        raise fail(
            "ARG", f"buffer: expected nl.sbuf, nl.psum, nl.hbm or nl.shared_hbm; got {buffer!r}"
        )
    if type(shape) is not tuple:
        if isinstance(shape, (int, np.integer)):
            shape = (shape,)
        elif isinstance(shape, list):
            shape = tuple(shape)
        else:
            raise fail("ARG", f"shape: expected a tuple of ints; got {shape!r}")
    try:
        shape = tuple([_index(s) for s in shape])
    except TypeError:
        raise fail("ARG", f"shape: expected a tuple of ints; got {shape!r}") from None
    if not shape or min(shape) <= 0:
        raise fail("ARG", f"shape: expected a non-empty tuple of positive ints; got {shape}")
    d = dtype if isinstance(dtype, np.dtype) and dtype in dt.ALL_DTYPES else dt.as_dtype(dtype)
    if buffer is shared_hbm and data is None:
        prog = launch.programs[launch.program_id]
        i = prog.shared_hbm_count
        prog.shared_hbm_count += 1
        if launch.program_id > 0 and i < len(launch.shared_hbm):
            # LNC2: the n-th shared_hbm allocation of every program is the same tensor
            st = launch.shared_hbm[i]
            if st.shape != shape or st.dtype != d:
                raise fail(
                    "LAUNCH",
                    f"shared_hbm allocation #{i} differs between programs: {st.shape} "
                    f"{st.dtype.name} vs {shape} {d.name}",
                )
            return NkiTensor(st, shape, row_major(shape), 0, d)
        st = Storage(launch, shape, d, buffer, name)
        launch.shared_hbm.append(st)
        return NkiTensor(st, shape, row_major(shape), 0, d)
    st = Storage(launch, shape, d, buffer, name, data)
    return NkiTensor(st, shape, row_major(shape), 0, d)
