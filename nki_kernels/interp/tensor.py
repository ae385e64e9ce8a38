"""NKI tensors: storages in HBM / SBUF / PSUM and the views kernels index into them.

A `Storage` (storage.py) is one allocation. On-chip storages are laid out
partition-major: element (p, f...) sits at p * F + flat(f...) where F is the number of
elements per partition, so the partition stride of every on-chip view is F (the `.ap()`
rule). An `NkiTensor` is a view: shape, element strides and an element offset into its
storage, in units of its own dtype, exactly the `NkiTensor` attributes of NKI 0.6.
Indirect views (`.ap()` with a scalar or vector offset, `vector_select`, dynamic
`select`) carry a run-time index that is resolved when an instruction touches them.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

from . import dtypes as dt
from .errors import fail
from .state import current
from .storage import Buffer, Storage, hbm, private_hbm, psum, row_major, sbuf, shared_hbm
from .trace import HBM, Region
from .views import Indirect, ViewMethods

_index = operator.index
_prod = math.prod
_FULL = slice(None)


class NkiTensor(ViewMethods):
    """A view of a storage: the tensor type every NKI call takes and returns.

    The view methods (reshape, permute, `.ap()`, ...) live in `views.ViewMethods`.
    """

    __slots__ = ("_st", "dtype", "indirect", "offset", "shape", "strides")

    def __init__(
        self,
        storage: Storage,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        offset: int,
        dtype: dt.NkiDtype,
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
        """The buffer the storage lives in."""
        return self._st.buffer

    @property
    def name(self) -> str:
        """The storage's name."""
        return self._st.name

    @property
    def ndim(self) -> int:
        """Number of dims of the view."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements of the view."""
        return _prod(self.shape)

    @property
    def storage(self) -> Storage:
        """The allocation the view reads."""
        return self._st

    @property
    def on_chip(self) -> bool:
        """Whether the view is in SBUF or PSUM."""
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
            f"dtype={self.dtype}, strides={self.strides}, offset={self.offset})"
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
        """Whether the view carries a run-time index (.ap offsets, dynamic select)."""
        return self.indirect is not None

    def get_pattern(self) -> list[list[int]]:
        """The access pattern [[stride, count], ...] of the view, dim 0 first."""
        return [[s, n] for n, s in zip(self.shape, self.strides)]

    # ---- indexing -------------------------------------------------------------------
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

    # ---- access ---------------------------------------------------------------------
    def storage_elements(self) -> int:
        """Size of the storage in elements of this view's dtype."""
        st = self._st
        return st.size * st.dtype._size // self.dtype._size

    def in_bounds(self) -> bool:
        """Whether every element of the view lies inside its storage."""
        lo, hi = self._extent()
        return not self.size or (lo >= 0 and hi < self.storage_elements())

    def check_bounds(self) -> None:
        """Rule IDX unless every element of the view lies inside its storage."""
        if not self.in_bounds():
            lo, hi = self._extent()
            total = self.storage_elements()
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
        isz = self.dtype._size
        return np.ndarray(
            self.shape,
            self.dtype._np,
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
                return (buf.space, st.aid, 0, st.shape[0], st.addr, st.addr + st.nbytes_pp)
            return (HBM, st.sid, 0, 1, 0, st.size * st.dtype._size)
        isz = self.dtype._size
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
            return (buf.space, st.aid, p0, p1, base + flo, base + fhi + isz)
        for i in range(1, len(shape)):
            n = shape[i]
            if n > 1:
                s = strides[i]
                if s > 0:
                    fhi += (n - 1) * s * isz
                else:
                    flo += (n - 1) * s * isz
        base = st.addr
        return (buf.space, st.aid, p0, p1, base + flo, base + fhi + isz)


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


def allocate(
    shape: Any,
    dtype: Any,
    buffer: Buffer,
    name: str = "",
    data: np.ndarray | None = None,
    address: Any = None,
) -> NkiTensor:
    """Create a fresh storage and return the full view of it (on chip: at the
    `(partition_offset, byte_offset)` of `address` if given)."""
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
    d = dtype if type(dtype) is dt.NkiDtype and dtype in dt.ALL_DTYPES else dt.as_dtype(dtype)
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
                    f"{st.dtype} vs {shape} {d}",
                )
            return NkiTensor(st, shape, row_major(shape), 0, d)
        st = Storage(launch, shape, d, buffer, name)
        launch.shared_hbm.append(st)
        return NkiTensor(st, shape, row_major(shape), 0, d)
    st = Storage(launch, shape, d, buffer, name, data, _address(address, buffer))
    return NkiTensor(st, shape, row_major(shape), 0, d)


def _address(address: Any, buffer: Buffer) -> int | None:
    """The byte offset of an `address=(partition_offset, free_offset)` placement."""
    if address is None:
        return None
    if not buffer.on_chip:
        raise fail("ARG", f"address: only SBUF / PSUM tensors are placed; got {buffer!r}")
    ok = isinstance(address, tuple) and len(address) == 2
    if not ok or any(isinstance(a, bool) or not isinstance(a, (int, np.integer)) for a in address):
        raise fail(
            "ARG", f"address: expected (partition_offset, free_offset) ints; got {address!r}"
        )
    p_off, f_off = int(address[0]), int(address[1])
    if p_off != 0:
        from .errors import not_supported

        raise not_supported("address= with a partition offset", f"got {address!r}")
    if f_off < 0:
        raise fail("ARG", f"address: free_offset must be >= 0; got {f_off}")
    return f_off


__all__ = [
    "Buffer", "NkiTensor", "Storage", "allocate", "hbm", "private_hbm", "psum", "row_major",
    "sbuf", "shared_hbm",
]  # fmt: skip
