"""Expert weights of the MoE backward's phase A: the Wd stream and the Wg / Wu strips.

Per sub-block the chunks of `tile_i` intermediate columns each need

- Wd^T in units of `dma_h` 128-row H tiles ([128, dma_h, tile_i], H on partitions), one
  stream over all chunks and sub-blocks of a block, `w_bufs - 1` units ahead;
- Wg and Wu with I on partitions ("strips", [128, H, tile_i / 128] each), loaded in
  pieces of `dma_h` H tiles (a piece waits only for the dgrad matmuls that read it, which
  run in H order).

Both column loads are indirect DMA transposes for 2-byte dtypes (`tiles.load_weight_cols`),
through the row indexes of the block's expert that `rows_bwd.load_meta` builds with its
metadata ("wd_rows", "wgu_rows"); the functions below take that metadata set. Weights
stored transposed (the parameters' layouts: transformers' [E, 2I, H] / [E, H, I],
TorchTitan's w1 / w3 / w2) already hold these columns as rows: their loads are natural
ones (`param_layout.load_n_major`), no index.

With `prefetch_rows` the next unit's first chunk is loaded ahead too, into buffers that
live through phase A ("heads"): its strips right after the current unit's last dgrad, and
at the end of a block the next block's first Wd units (its expert id is already on chip).
So a unit's first recompute does not wait for the previous unit's stores.
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nl
from .param_layout import gate_up_parts, load_n_major
from .tiles import P, cdiv


def weight_layout(d: dict[str, Any], gate_up: tuple[Any, Any], transposed: Any) -> None:
    """d's weight layouts (param_layout.py): "gu_t" / "dn_t" (stored transposed) and
    "parts" (where gate and up live: w_gate_up's halves, or w_gate_up and w_up)."""
    d["gu_t"], d["dn_t"] = bool(transposed[0]), bool(transposed[1])
    d["parts"] = gate_up_parts(gate_up[0], gate_up[1], d["I"])


def wd_units(d: dict[str, Any]) -> list[tuple[int, int, int]]:
    """(chunk, first H tile, H tiles) of every Wd unit of one sub-block, in order."""
    units = []
    for ic in range(cdiv(d["I"], d["TI"])):
        for h0 in range(0, d["HT"], d["DH"]):
            units.append((ic, h0, min(d["DH"], d["HT"] - h0)))
    return units


def stream_depth(d: dict[str, Any]) -> int:
    """Wd units loaded ahead of their use."""
    return max(1, d["WB"] - 1)


def load_wd_unit(d: dict[str, Any], w_down: Any, meta: Any, unit: Any, dst: Any) -> None:
    """dst[p, j, i] = Wd[exp, i0 + i, (h0 + j) * 128 + p] for one Wd unit (exp: meta's)."""
    ic, h0, nh = unit
    i0 = ic * d["TI"]
    icw = min(d["TI"], d["I"] - i0)
    nrows = min(nh * P, d["H"] - h0 * P)
    ex = (meta["exp"], meta.get("wd_rows"))
    load_n_major(w_down, ex, (i0, icw), (h0 * P, nrows), dst, d["dn_t"])


def wd_head(d: dict[str, Any]) -> list[Any]:
    """Buffers for the first `stream_depth` Wd units of a block (phase-A lifetime)."""
    n = min(stream_depth(d), len(wd_units(d)))
    return [nl.ndarray((P, d["DH"], d["TI"]), dtype=d["dt"], buffer=nl.sbuf) for _ in range(n)]


def load_wd_head(d: dict[str, Any], w_down: Any, meta: Any, head: list[Any]) -> None:
    """The first Wd units of the block of metadata set `meta` into `head`."""
    for unit, dst in zip(wd_units(d), head):
        load_wd_unit(d, w_down, meta, unit, dst)


def weight_stream(d: dict[str, Any], w_down: Any, meta: Any, head: list[Any] | None) -> Any:
    """A `fetch()` returning the block's next Wd unit, `stream_depth` units ahead.

    The units of all sub-blocks of the block form one stream, so the first units of a
    chunk or sub-block load while the previous one finishes. A unit dies when its
    consumer drops it: at most `w_bufs` are live (buffers rotate through the allocator).
    `head`: the first units, already loaded (`load_wd_head`); else they are loaded now.
    """
    units = wd_units(d) * (d["B"] // d["SB"])
    depth = stream_depth(d)
    loaded: dict[str, Any] = {}
    state = {"next": 0}

    def issue(u: int) -> None:
        if u >= len(units):
            return
        if head is not None and u < len(head):
            loaded[str(u)] = head[u]
            return
        wdT = nl.ndarray((P, units[u][2], d["TI"]), dtype=d["dt"], buffer=nl.sbuf)
        load_wd_unit(d, w_down, meta, units[u], wdT)
        loaded[str(u)] = wdT

    for u in range(depth):
        issue(u)

    def fetch() -> Any:
        u = state["next"]
        state["next"] = u + 1
        issue(u + depth)
        return loaded.pop(str(u))

    return fetch


def new_strips(d: dict[str, Any]) -> list[Any]:
    """One strip set: Wg and Wu of a chunk, [128 I rows, H, tile_i / 128] each (one H
    piece is one contiguous range per partition); with the forward's gate / up saved,
    also the chunk's gT and uT of one unit, [128 I rows, tile_i / 128, sub_block]."""
    shape = (P, d["H"], cdiv(d["TI"], P))
    strips = [nl.ndarray(shape, dtype=d["dt"], buffer=nl.sbuf) for _ in range(2)]
    if d["GU"] is not None:
        gu = (P, cdiv(d["TI"], P), d["SB"])
        strips += [nl.ndarray(gu, dtype=d["dt"], buffer=nl.sbuf) for _ in range(2)]
    return strips


def load_strips(
    d: dict[str, Any], w_gate_up: Any, meta: Any, ic: int, strips: list[Any], s: int
) -> None:
    """strips[c, h, it] = chunk ic of Wg and Wu with I on partitions (I = it*128 + c),
    in pieces of `dma_h` H tiles; with gate / up saved, first the chunk's gT / uT of
    sub-block s (the pointwise needs them before the dgrad needs the strips)."""
    ti, h = d["TI"], d["H"]
    i0 = ic * ti
    icw = min(ti, d["I"] - i0)
    if d["GU"] is not None:
        for dst, r0 in zip(strips[2:], (i0, d["I"] + i0)):
            load_saved(d, meta, (r0, icw), s, dst)
    ex = (meta["exp"], meta.get("wgu_rows"))
    for h0 in range(0, d["HT"], d["DH"]):
        r0, nrows = h0 * P, min(d["DH"] * P, h - h0 * P)
        for strip, (w, c0) in zip(strips[0:2], d["parts"]):
            piece = strip[:, r0 : r0 + nrows, :].permute((0, 2, 1))
            load_n_major(w, ex, (r0, nrows), (c0 + i0, icw), piece, d["gu_t"])


def load_saved(d: dict[str, Any], meta: Any, rows: tuple[int, int], s: int, dst: Any) -> None:
    """dst[c, it, t] = gate_up[r0 + it*128 + c, col0 + s * sub_block + t]: the saved
    gate (or up) rows r0 .. r0 + n of sub-block s, I-major as the forward stored them
    (col0: the block's first column, in `meta`). One DMA for the whole 128-row tiles,
    one for a ragged last tile."""
    gate_up, (r0, n) = d["GU"], rows
    ncol, sb = gate_up.shape[1], d["SB"]
    full = n // P
    c0 = s * sb
    if full:
        pat = [[ncol, P], [P * ncol, full], [1, sb]]
        view = gate_up.ap(pat, offset=r0 * ncol + c0, scalar_offset=meta["col0"], indirect_dim=1)
        nisa.dma_copy(dst=dst[:, 0:full, :], src=view)
    if n % P:
        pat = [[ncol, n % P], [1, sb]]
        off = (r0 + full * P) * ncol + c0
        view = gate_up.ap(pat, offset=off, scalar_offset=meta["col0"], indirect_dim=1)
        nisa.dma_copy(dst=dst[0 : n % P, full, :], src=view)
