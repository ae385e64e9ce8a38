"""View methods of NKI tensors: slice / select / reshape / permute / broadcast / rearrange /
view(dtype) and the explicit access patterns of `.ap()`, with their rules.

`ViewMethods` is a mixin of `tensor.NkiTensor`; every method returns a new view of the
same storage. Indirect views carry an `Indirect` index resolved when an instruction runs.
"""

from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING, Any

import numpy as np

from . import dtypes as dt
from .errors import fail

if TYPE_CHECKING:
    from .tensor import NkiTensor, Storage

_index = operator.index
_prod = math.prod


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


class ViewMethods:
    """The view operations of `NkiTensor` (see the module docstring)."""

    __slots__ = ()

    if TYPE_CHECKING:
        _st: Storage
        shape: tuple[int, ...]
        strides: tuple[int, ...]
        offset: int
        dtype: dt.NkiDtype
        indirect: Indirect | None

        def __getitem__(self, key: Any) -> NkiTensor: ...
        def check_bounds(self) -> None: ...
        def in_bounds(self) -> bool: ...
        @property
        def name(self) -> str: ...
        @property
        def ndim(self) -> int: ...
        @property
        def size(self) -> int: ...
        @property
        def on_chip(self) -> bool: ...
        @property
        def free_size(self) -> int: ...

    def _new(
        self,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        offset: int,
        dtype: dt.NkiDtype,
        indirect: Indirect | None = None,
    ) -> NkiTensor:
        return type(self)(self._st, shape, strides, offset, dtype, indirect)  # type: ignore[call-arg, return-value]

    def _derive(self, shape: tuple[int, ...], strides: tuple[int, ...]) -> NkiTensor:
        return self._new(shape, strides, self.offset, self.dtype, self.indirect)

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

    def slice(self, dim: int, start: int, end: int, step: int = 1) -> NkiTensor:
        """Elements start:end:step of dim `dim` (step >= 1, inside the dim)."""
        d = self._dim(dim, "slice")
        start, end, step = (
            _int_arg(v, a, "slice") for v, a in ((start, "start"), (end, "end"), (step, "step"))
        )
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
        """The view with dim `dim` fixed at `index` (an int; or a (1, 1) index tensor or register,
        resolved at run time). On chip, dim 0 cannot be selected."""
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
            return self._new(shape, strides, self.offset, self.dtype, ind)
        key: list[Any] = [slice(None)] * self.ndim
        key[d] = index
        view = self[tuple(key)]
        if view.ndim > self.ndim - 1 and view.ndim > (2 if self.on_chip else 1):
            # the >= 2-D / >= 1-D rule kept a size-1 dim where none was needed
            return view._derive(view.shape[:-1], view.strides[:-1])
        return view

    def vector_select(self, dim: int, vector_offset: NkiTensor) -> NkiTensor:
        """Rows of an HBM tensor picked by a (P, 1) on-chip index tensor (dim 0 only)."""
        if dim != 0:
            raise fail("VIEW", f"vector_select supports dim=0 only; got dim={dim}")
        if self.on_chip:
            raise fail("VIEW", f"vector_select is only supported on HBM tensors ('{self.name}')")
        self._no_indirect("a second dynamic select")
        _vector_index(vector_offset, None, "vector_select")
        p = vector_offset.shape[0]
        ind = Indirect("vector", vector_offset, self.strides[0])
        return self._new((p, *self.shape[1:]), (0, *self.strides[1:]), self.offset, self.dtype, ind)

    def reshape(self, *shape_args: Any) -> NkiTensor:
        """The same elements with a new shape (no copy: the layout must allow it; on chip dim 0
        stays)."""
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
        """Dim `dim` split into `shape` (one entry may be -1)."""
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
        """Dims start_dim..end_dim merged into one (not the partition dim on chip)."""
        s, e = self._dim(start_dim, "flatten_dims"), self._dim(end_dim, "flatten_dims")
        if self.on_chip and s == 0:
            raise fail("VIEW", "flatten_dims cannot merge the partition dim of an on-chip tensor")
        if e < s:
            raise fail("VIEW", f"flatten_dims({start_dim}, {end_dim}): end before start")
        merged = _prod(self.shape[s : e + 1])
        return self.reshape((*self.shape[:s], merged, *self.shape[e + 1 :]))

    def expand_dim(self, dim: int) -> NkiTensor:
        """A size-1 dim inserted before dim `dim` (0..ndim; not before the partition dim)."""
        dim = _int_arg(dim, "dim", "expand_dim")
        if not 0 <= dim <= self.ndim:
            raise fail("IDX", f"expand_dim({dim}) outside 0..{self.ndim} ('{self.name}')")
        if (self.on_chip or self.indirect is not None) and dim == 0:
            raise fail("VIEW", "expand_dim cannot insert before the partition dim")
        return self._derive(
            (*self.shape[:dim], 1, *self.shape[dim:]),
            (*self.strides[:dim], 0, *self.strides[dim:]),
        )

    def squeeze_dim(self, dim: int) -> NkiTensor:
        """Size-1 dim `dim` removed (not the partition dim on chip)."""
        d = self._dim(dim, "squeeze_dim")
        if self.shape[d] != 1:
            raise fail("VIEW", f"squeeze_dim({dim}) of '{self.name}' {self.shape}: size is not 1")
        if (self.on_chip or self.indirect is not None) and d == 0:
            raise fail("VIEW", "squeeze_dim cannot remove the partition dim")
        return self._derive(
            self.shape[:d] + self.shape[d + 1 :], self.strides[:d] + self.strides[d + 1 :]
        )

    def broadcast(self, dim: int, size: int) -> NkiTensor:
        """Size-1 dim `dim` repeated `size` times with stride 0 (not dim 0 on chip)."""
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
        """The dims reordered (dim 0 stays first on chip)."""
        dims = tuple(dims)
        if sorted(dims) != list(range(self.ndim)):
            raise fail("VIEW", f"permute{dims} is not a permutation of {self.ndim} dims")
        if (self.on_chip or self.indirect is not None) and dims[0] != 0:
            raise fail("VIEW", f"permute{dims} moves the partition dim of '{self.name}'")
        return self._derive(
            tuple(self.shape[d] for d in dims), tuple(self.strides[d] for d in dims)
        )

    def rearrange(
        self, src_pattern: tuple[Any, ...], dst_pattern: tuple[Any, ...], fixed_sizes: Any = None
    ) -> NkiTensor:
        """einops-style split / reorder / merge of dims, e.g.
        `t.rearrange(('b', ('h', 'w')), ('b', 'w', 'h'), {'h': 4})`; a view, so merges need
        a compatible layout. Group sizes come from `fixed_sizes` (one may be inferred)."""
        self._no_indirect("rearrange")
        src, dst = tuple(src_pattern), tuple(dst_pattern)
        sizes = dict(fixed_sizes or {})
        if len(src) != self.ndim:
            raise fail("VIEW", f"rearrange: {src} names {len(src)} dims of a {self.ndim}-D tensor")
        names: list[str] = []
        split_shape: list[int] = []
        for entry, n in zip(src, self.shape):
            group = entry if isinstance(entry, tuple) else (entry,)
            known = [sizes[g] for g in group if g in sizes]
            unknown = [g for g in group if g not in sizes]
            if len(unknown) > 1 or (not unknown and _prod(known) != n) or n % _prod(known):
                raise fail(
                    "VIEW", f"rearrange: cannot split dim of size {n} into {group} with {sizes}"
                )
            for g in unknown:
                sizes[g] = n // _prod(known)
            names.extend(group)
            split_shape.extend(sizes[g] for g in group)
        flat_dst = [g for e in dst for g in (e if isinstance(e, tuple) else (e,))]
        if sorted(flat_dst) != sorted(names) or len(set(names)) != len(names):
            raise fail("VIEW", f"rearrange: {dst} must use each name of {src} exactly once")
        view = self.reshape(tuple(split_shape))
        view = view.permute(tuple(names.index(g) for g in flat_dst))
        merged = tuple(
            _prod([sizes[g] for g in e]) if isinstance(e, tuple) else sizes[e] for e in dst
        )
        return view.reshape(merged)

    def view(self, dtype: Any) -> NkiTensor:
        """Bit-level reinterpretation; the last dim is rescaled by the itemsize ratio."""
        self._no_indirect("view(dtype)")
        new = dt.as_dtype(dtype, "view(dtype)")
        old_sz, new_sz = self.dtype._size, new._size
        if old_sz == new_sz:
            return self._new(self.shape, self.strides, self.offset, new)
        if self.strides[-1] != 1 and self.shape[-1] != 1:
            raise fail("VIEW", f"view({new}) needs a contiguous last dim on '{self.name}'")
        last_bytes = self.shape[-1] * old_sz
        if last_bytes % new_sz or (self.offset * old_sz) % new_sz:
            raise fail(
                "VIEW",
                f"view({new}) of '{self.name}': last dim of {last_bytes} B is not a multiple "
                f"of {new_sz} B",
            )
        for s in self.strides[:-1]:
            if (s * old_sz) % new_sz:
                raise fail("VIEW", f"view({new}) of '{self.name}': strides do not divide")
        strides = (*(s * old_sz // new_sz for s in self.strides[:-1]), 1)
        shape = (*self.shape[:-1], last_bytes // new_sz)
        return self._new(shape, strides, self.offset * old_sz // new_sz, new)

    reinterpret_cast = view

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
        only) makes row i of the pattern start at `index[i] * strides[0]` (a row of this
        view's dim 0: the index replaces the pattern's partition stride);
        `scalar_offset` moves the whole pattern by `index * strides[indirect_dim]`.
        """
        self._no_indirect(".ap()")
        new_dtype = self.dtype if dtype is None else dt.as_dtype(dtype, ".ap(dtype)")
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
        old_sz, new_sz = self.dtype._size, new_dtype._size
        if (self.offset * old_sz) % new_sz:
            raise fail("VIEW", f".ap(dtype={new_dtype}): the view offset does not divide")
        off = self.offset * old_sz // new_sz + (0 if offset is None else _index(offset))
        if st.buffer.on_chip:
            pstride = st.pstride * st.dtype._size // new_sz
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
            # The index counts rows of the indexed tensor's dim 0 (its stride), not steps
            # of the pattern's partition pair; nki-library relies on it: router_topk
            # scatters into a flattened (T*E,) view with partition stride k,
            # attention_block_tkg into a (B*S, d) cache with partition stride 1 ("the DMA
            # engine scales token_indices[b] by d_head (stride of indirect_dim=0)"), and
            # moe_cte's shard_on_block reads token rows of its (T, 2, H) output.
            ind = Indirect("vector", vector_offset, self._row_stride(0, old_sz, new_dtype))
        elif scalar_offset is not None:
            d = self._dim(indirect_dim, ".ap(indirect_dim)")
            row = self._row_stride(d, old_sz, new_dtype)
            ind = Indirect("scalar", _index_operand(scalar_offset, ".ap(scalar_offset)"), row)
        view = self._new(shape, strides, off, new_dtype, ind)
        if ind is None and not view.in_bounds():
            # A pattern built but used by no instruction is legal: nki-library's
            # output_projection_tkg builds its last, partial PSUM tile's stationary view
            # before the `if h_2_idx < h_2_size` that skips the matmul. Such a view is
            # checked where an instruction uses it (engine.emit, rule IDX).
            from .state import active

            launch = active()
            if launch is None:
                view.check_bounds()
            else:
                launch.check_operand_bounds = True
        return view

    def _row_stride(self, d: int, old_sz: int, new_dtype: Any) -> int:
        """The stride of this view's dim `d` in elements of `new_dtype` (an index's unit)."""
        if (self.strides[d] * old_sz) % new_dtype._size:
            raise fail(
                "VIEW", f".ap(): stride of indirect_dim {d} does not divide into {new_dtype}"
            )
        return self.strides[d] * old_sz // new_dtype._size


def _int_arg(value: Any, arg: str, what: str) -> int:
    try:
        return _index(value)
    except TypeError:
        raise fail("ARG", f"{what}: {arg} must be an int; got {value!r}") from None


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
    if not isinstance(index, ViewMethods) or not index.on_chip:
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
    if isinstance(index, ViewMethods):
        if not index.on_chip or index.size != 1:
            raise fail(
                "VIEW", f"{what}: a tensor index must be a (1, 1) on-chip tensor; got {index.shape}"
            )
        return index
    if hasattr(index, "value"):  # a virtual register
        return index
    raise fail("VIEW", f"{what}: expected a (1, 1) SBUF tensor or a register; got {index!r}")
