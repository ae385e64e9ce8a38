"""Expert weights read in the layout their parameters have (the blockwise MoE kernels).

A kernel's matmuls see each expert weight as W [E, K, N] (w_gate_up [E, H, 2I], w_down
[E, I, H]). Training frameworks hold them otherwise: transformers' experts as
`gate_up_proj` [E, 2I, H] / `down_proj` [E, H, I], TorchTitan's as w1 / w3 [E, I, H] and
w2 [E, H, I] -- W^T per expert, gate and up possibly two tensors. The ops pass that
storage as it lies with a static `transposed` flag per weight (`ops.moe_decode.
kernel_layout`), and every load below gives the SBUF tile the row-major layout would give,
so the matmuls, their operands and their order are unchanged:

- `load_k_major` (K on partitions: the forward's units): row-major storage loads as
  contiguous runs (`tiles.load_weight_rows`); transposed storage by DMA transposes
  (`tiles.load_weight_cols`: for 2-byte dtypes an indirect transpose through the
  expert's row index, else a natural load and PE transposes);
- `load_n_major` (N on partitions: the backward's Wd^T units and Wg / Wu strips): the
  mirror image -- transposed storage is now the natural load, row-major storage the
  transposing one.

Gate and up as two tensors (`w_up`, same shape and layout as the gate's): `gate_up_parts`
names where each half lives. Row indexes (`index_cols`) cover one expert's rows of the
stored tensor, exp * rows + r, rows = the stored tensor's dim 1.
"""

from __future__ import annotations

from typing import Any

from .tiles import P, cdiv, expert_row_index, load_weight_cols, load_weight_rows, row_index_ok


def load_k_major(w: Any, ex: tuple[Any, Any], rows: tuple[int, int], cols: tuple[int, int],
                 dst: Any, transposed: bool) -> None:  # fmt: skip
    """dst[p, j, c] = W[e, r0 + j * 128 + p, c0 + c] for W's rows (r0, nr) and columns
    (c0, nc); `w` is W ([E, K, N]) or, `transposed`, its storage W^T ([E, N, K]).
    ex = (expert id [1, 1], the expert's row index of `w` or None)."""
    (r0, nr), (c0, nc) = rows, cols
    if transposed:
        load_weight_cols(w, ex, c0, nc, r0, nr, dst)
    else:
        load_weight_rows(w, ex[0], r0, nr, c0, nc, dst)


def load_n_major(w: Any, ex: tuple[Any, Any], rows: tuple[int, int], cols: tuple[int, int],
                 dst: Any, transposed: bool) -> None:  # fmt: skip
    """dst[p, j, r] = W[e, r0 + r, c0 + j * 128 + p] (W's columns on partitions), `w` as
    in `load_k_major`."""
    (r0, nr), (c0, nc) = rows, cols
    if transposed:
        load_weight_rows(w, ex[0], c0, nc, r0, nr, dst)
    else:
        load_weight_cols(w, ex, r0, nr, c0, nc, dst)


def gate_up_width(w_gate_up: Any, w_up: Any, transposed: bool) -> tuple[int, int]:
    """(H, I) of the gate / up weights: w_gate_up [E, H, 2I] (gate columns :I) or, with
    `w_up`, the gate's [E, H, I] alone; stored transposed, dims 1 and 2 swap."""
    _, a, b = w_gate_up.shape
    h, n = (b, a) if transposed else (a, b)
    return h, (n if w_up is not None else n // 2)


def gate_up_parts(w_gate_up: Any, w_up: Any, i: int) -> tuple[tuple[Any, int], tuple[Any, int]]:
    """((tensor, first N column) of the gate, of the up): the halves of w_gate_up, or
    w_gate_up and w_up."""
    if w_up is None:
        return (w_gate_up, 0), (w_gate_up, i)
    return (w_gate_up, 0), (w_up, 0)


def index_cols(nrows: int) -> int:
    """Columns of a [128, k] row index covering `nrows` rows."""
    return cdiv(nrows, P)


def uses_index(w: Any, transposed: bool) -> bool:
    """True when `w`'s K-major loads are indirect DMA transposes (stored transposed,
    2-byte dtype, row ids exact: `tiles.row_index_ok`)."""
    return transposed and row_index_ok(w)


def build_index(w: Any, exp_col: Any, ramp: Any, dst: Any) -> Any:
    """dst [128, k] uint32 = the row index of the expert in exp_col [128, 1] (`w`'s rows)."""
    expert_row_index(w, exp_col, ramp, dst)
    return dst
