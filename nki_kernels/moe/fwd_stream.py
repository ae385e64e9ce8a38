"""The forward's gate/up weight stream and cross-block prefetch (`moe_mlp_fwd`).

A block's gate/up weights arrive as units [128 H rows x units' H tiles, chunk columns]
(`weight_units`, in consumption order), `w_bufs - 1` loads ahead of their matmuls
(`weight_stream`). Persistent "head" buffers hold the next block's slot tokens, expert
id, token rows and first weight unit, refilled while the current block computes, so a
block starts without waiting for its gathers or weights.
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nl
from .param_layout import build_index, index_cols, load_k_major
from .tiles import P, block_ap, cdiv, expert_column, gather_rows


def row_indexes(d: dict[str, Any], exp: Any, exp_col: Any, tile_i: int) -> dict[str, Any]:
    """The block's expert as the loads take it: {"exp": id [1, 1], "gu" / "dn": that
    expert's row index of the transposed gate/up / down storage, or None}."""
    ex = {"exp": exp, "gu": None, "dn": None}
    for kind, rows in (("gu", min(tile_i, d["I"])), ("dn", d["H"])):
        if d["ix_" + kind]:
            ix = nl.ndarray((P, index_cols(rows)), dtype=nl.uint32, buffer=nl.sbuf)
            ex[kind] = build_index(d["w_" + kind], exp_col, d["ramp"], ix)
    return ex


def head_buffers(d: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Persistent buffers the next block's metadata, token rows and first gate/up weight
    unit are loaded into while the current block computes (one set: each is consumed
    early in a block and then refilled for the next one)."""
    _, _, nh = weight_units(d, cfg)[0]
    ns, dt, ti = d["NS"], d["dt"], cfg["tile_i"]
    return {
        "tok": nl.ndarray((P, ns), dtype=nl.int32, buffer=nl.sbuf),
        "exp": nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf),
        "x": nl.ndarray((P, ns, d["H"]), dtype=dt, buffer=nl.sbuf),
        "wg": nl.ndarray((P, nh, ti), dtype=dt, buffer=nl.sbuf),
        "wu": nl.ndarray((P, nh, ti), dtype=dt, buffer=nl.sbuf),
        "col": nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf),  # exp, every partition
    }


def prefetch_meta(d: dict[str, Any], ws: tuple[Any, ...], head: dict[str, Any], addr: Any) -> None:
    """head tok / exp <- block addr's slot tokens and expert (past the last block: skipped,
    the old values stay and the prefetches below reload the current block's data)."""
    slot_token, block_expert = ws[3], ws[4]
    ns, skip = d["NS"], nisa.oob_mode.skip
    tok = block_ap(slot_token, addr, [[ns, P], [1, ns]])
    nisa.dma_copy(dst=head["tok"], src=tok, oob_mode=skip)
    exp = block_ap(block_expert, addr, [[1, 1], [1, 1]])
    nisa.dma_copy(dst=head["exp"], src=exp, oob_mode=skip)
    if d["ramp"] is not None:  # transposed weights: the id on every partition (row indexes)
        expert_column(block_expert, addr, head["col"], oob_skip=True)


def prefetch_rows(d: dict[str, Any], hidden: Any, head: dict[str, Any], ns: int) -> None:
    """head x <- the token rows of head tok's first `ns` sub-tiles (padding slots read zeros)."""
    for c in range(ns):
        gather_rows(hidden, head["tok"][:, c : c + 1], head["x"][:, c, :], d["H"])


def prefetch_unit(
    d: dict[str, Any], cfg: dict[str, Any], w_gate_up: Any, head: dict[str, Any]
) -> None:
    """head wg / wu <- the first gate/up weight unit of expert head exp."""
    ex = row_indexes({**d, "ix_dn": False}, head["exp"], head["col"], cfg["tile_i"])
    load_gate_up(d, cfg, w_gate_up, ex, weight_units(d, cfg)[0], head)


def weight_units(d: dict[str, Any], cfg: dict[str, Any]) -> list[tuple[int, int, int]]:
    """(chunk, first H tile, H tiles) of every gate/up weight load, in consumption order."""
    ht, ti = d["HT"], cfg["tile_i"]
    units = []
    for ic in range(cdiv(d["I"], ti)):
        if cfg["loop_order"] == "i_outer":
            units.append((ic, 0, ht))
        else:
            for h0 in range(0, ht, cfg["dma_h"]):
                units.append((ic, h0, min(cfg["dma_h"], ht - h0)))
    return units


def load_gate_up(
    d: dict[str, Any],
    cfg: dict[str, Any],
    w_gate_up: Any,
    exp: Any,
    unit: tuple[int, int, int],
    into: dict[str, Any] | None = None,
) -> tuple[Any, Any]:
    """A gate/up weight unit, H on partitions: [128, H tiles, chunk columns] each (into
    `into` wg / wu, else fresh tiles sized to the chunk)."""
    ic, h0, nh = unit
    ti = cfg["tile_i"]
    i0 = ic * ti
    icw = min(ti, d["I"] - i0)
    nrows = min(nh * P, d["H"] - h0 * P)
    if into is None:
        wg = nl.ndarray((P, nh, icw), dtype=d["dt"], buffer=nl.sbuf)
        wu = nl.ndarray((P, nh, icw), dtype=d["dt"], buffer=nl.sbuf)
    else:
        wg, wu = into["wg"], into["wu"]
    ex = (exp["exp"], exp["gu"])
    for (w, c0), dst in zip(d["parts"], (wg, wu)):
        load_k_major(w, ex, (h0 * P, nrows), (c0 + i0, icw), dst, d["gu_t"])
    return wg, wu


def weight_stream(
    d: dict[str, Any],
    cfg: dict[str, Any],
    w_gate_up: Any,
    exp: Any,
    head: dict[str, Any] | None,
) -> Any:
    """A `fetch()` returning the block's next gate/up weight unit, `w_bufs - 1` loads ahead.

    Unit 0 is the head unit (prefetched by the previous block); when the block fetches
    unit 1 (unit 0 consumed), or `fetch(last=True)` ends the stream, the head unit is
    refilled with the next block's first unit. Other units die when their consumer drops
    them: at most `w_bufs` are live (buffers rotate through the allocator). `head` None
    (a block of merged passes, `merged_chunks`): unit 0 is loaded here like the others
    and the head unit is left alone (only blocks of merged passes follow this one).
    """
    units = weight_units(d, cfg)
    depth = max(1, cfg["w_bufs"] - 1)
    first = 0 if head is None else 1
    loaded: dict[str, Any] = {} if head is None else {"0": (head["wg"], head["wu"])}
    state = {"next": 0}

    def issue(u: int) -> None:
        if first <= u < len(units):
            loaded[str(u)] = load_gate_up(d, cfg, w_gate_up, exp, units[u])

    for u in range(first, depth):  # fetch(u) issues unit u + depth
        issue(u)

    def fetch(last: bool = False) -> Any:
        u = state["next"]
        if head is not None and (u == 1 or (last and u <= 1)):
            prefetch_unit(d, cfg, w_gate_up, head)
        if last:
            return None
        state["next"] = u + 1
        issue(u + depth)
        return loaded.pop(str(u))

    return fetch


# Merged passes stop at runs of 2 KiB: the DMA descriptor curve's knee (81 % of the
# engine rate at 2 KiB, 97 % at 4 KiB), where a 1 KiB run is at ~64 %. Past it the gain
# is small and a serial pass's stalls can cost more (Mixtral at T = 512, 256-row blocks
# of tile_i 1024: 2 KiB -> 4 KiB runs, serial, 4.589 -> 4.654 ms modeled).
MERGED_RUN_BYTES = 2048


def merged_chunks(d: dict[str, Any], cfg: dict[str, Any], s: int) -> tuple[int, bool]:
    """(m, serial): a block of s sub-tiles contracts m tile_i chunks in one gate/up pass
    (1: as configured); `serial`: its down-weight tiles are loaded one at a time.

    A gate/up unit's DMA moves one run of its columns per H row (tile_i * itemsize
    bytes: 1 KiB at tile_i 512 in bf16, where a descriptor's fixed cost holds the DMA
    rate to ~64 %), and a small block's matmuls are too short to hide that: Mixtral's 256-row
    blocks wait on their weight stream. A small block's accumulators take a fraction of
    a PSUM bank (`psum_accumulators`), so its pass can span m chunks (runs m times as
    long, units of dma_h / m H tiles: the same bytes) while it needs no more PSUM banks
    and SBUF than a full block, up to runs of MERGED_RUN_BYTES. The pass's m down-weight
    tiles are live together where that fits, else (`serial`; e.g. H = 7168) one at a
    time: each waits for the previous chunk's down projection, a TensorE stall that only
    a DMA-bound block affords (the DeepSeek-V3-like 128-row blocks: 386 -> 322 us).
    The down projection runs chunk by chunk, so every sum is the one of m = 1
    (bit-identical). h_outer, row-major gate/up only."""
    ns, ti, dma_h = d["NS"], cfg["tile_i"], cfg["dma_h"]
    nic = cdiv(d["I"], ti)
    if s >= ns or cfg["loop_order"] != "h_outer" or d["gu_t"]:
        return 1, False
    nit = cdiv(min(ti, d["I"]), P)
    banks, sbuf = _psum_banks(2 * nit, ns * P), _fwd_sbuf(d, cfg, ns, 1, 1)
    fits = {}  # m -> whether its m down tiles fit together
    m = 2
    dsz = 4 if d["dt"] == nl.float32 else 2
    while m <= min(dma_h, nic) and dma_h % m == 0 and m * ti * dsz <= MERGED_RUN_BYTES:
        if _psum_banks(2 * nit * m, s * P) > banks or _fwd_sbuf(d, cfg, s, m, 1) > sbuf:
            break
        fits[m] = _fwd_sbuf(d, cfg, s, m, m) <= sbuf
        m *= 2
    if not fits:
        return 1, False
    best = max(fits)
    return best, not fits[best]


def _psum_banks(n: int, bsz: int) -> int:
    """PSUM banks of n fp32 accumulators [128, bsz] as `psum_accumulators` packs them."""
    return n * cdiv(bsz, 512) if bsz >= 512 else cdiv(n, 512 // bsz)


def _fwd_sbuf(d: dict[str, Any], cfg: dict[str, Any], s: int, m: int, wds: int) -> int:
    """SBUF bytes per partition of a block's buffers that depend on its size s and merge
    m: xT, the y sums, the pass's activations and SwiGLU scratch, `wds` down-weight tiles."""
    dsz = 4 if d["dt"] == nl.float32 else 2
    h, ti = d["H"], min(cfg["tile_i"], d["I"])
    nit = cdiv(ti, P)
    y = s * h * (4 if cdiv(d["I"], cfg["tile_i"]) > 1 else dsz)
    return d["HT"] * s * P * dsz + y + m * nit * s * P * dsz + s * P * 4 + wds * nit * h * dsz
