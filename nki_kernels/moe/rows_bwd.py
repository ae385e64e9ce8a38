"""Token rows of the MoE backward's phase A, optionally gathered one unit ahead of use.

A unit is one sub-block (`sub_block` tokens) of one block; units run in order (block b,
sub-blocks 0 .. B/SB - 1, then the program's next block: b+1, or b+2 at LNC 2). A unit
first turns its gathered rows of x and do into xT / doT (PE transposes) and stores
w * x, w * do to the wgrad scratch; after that the row set is free. With `prefetch_rows`,
unit u+1's rows are then gathered into it while unit u computes (after its first chunk's
recompute is queued), and at the last unit of a block the next block's metadata (slot
tokens, slot weights, expert id) is loaded first, into the other of two metadata sets
(chosen by block parity, static in every body as in `tiles.block_loop`). So a block
starts on rows already on chip instead of waiting for its metadata, then its gathers.
Without it, a unit gathers its own rows (and a block loads its metadata) when it starts.

The prefetch after the last used block reads the next block's metadata with
`oob_mode.skip` (past NB nothing is read); its rows are gathered but never used. Padding
slots (token T) are skipped by the gathers, so their rows keep what the set held before:
earlier tokens' rows (finite), or zeros from the one-time fill. Their routing weight is 0,
so they reach no gradient (w * x and w * do rows, w * dx; dws is not gathered for them).
"""

from __future__ import annotations

from typing import Any

from ..nki import nisa, nl
from .tiles import (
    TRANSPOSE_GROUP,
    P,
    block_ap,
    block_row0,
    cdiv,
    expert_column,
    expert_row_index,
    slot_tiles,
    tile_rows,
)


def row_sets(d: dict[str, Any]) -> dict[str, Any]:
    """Two metadata sets (tokens out of range) and, with prefetching, the row set
    (zero-filled once) and the xT / doT tiles, all alive through phase A."""
    ns = d["NS"]
    meta = []
    for _ in range(2):
        tok = nl.ndarray((P, ns), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=tok, value=d["T"])
        one = {
            "tok": tok,
            "wsl": nl.ndarray((P, ns), dtype=nl.float32, buffer=nl.sbuf),
            "exp": nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf),
        }
        if d["GU"] is not None:  # the block's first column in the saved gate / up
            one["col0"] = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        if d["ramp"] is not None:  # expert 0 until loaded: a skipped load keeps a valid id
            one["exp_col"] = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf)
            nisa.memset(dst=one["exp_col"], value=0)
            for name, rows in (("wd_rows", min(d["TI"], d["I"])), ("wgu_rows", d["H"])):
                k = min(cdiv(rows, P), d["DH"]) if name == "wgu_rows" else cdiv(rows, P)
                one[name] = nl.ndarray((P, k), dtype=nl.uint32, buffer=nl.sbuf)
        meta.append(one)
    if not d["PF"]:
        return {"meta": meta}
    xT = _row_tiles(d) if d["GU"] is None else None  # only the recompute reads xT
    doT = nl.ndarray((P, d["HT"], d["SB"]), dtype=d["dt"], buffer=nl.sbuf)
    return {"meta": meta, "rows": _zero_rows(d), "xT": xT, "doT": doT}


def _row_tiles(d: dict[str, Any]) -> Any:
    return nl.ndarray((P, d["HT"], d["SB"]), dtype=d["dt"], buffer=nl.sbuf)


def _zero_rows(d: dict[str, Any]) -> dict[str, Any]:
    shape = (P, d["SB"] // P, d["H"])
    rows = {name: nl.ndarray(shape, dtype=d["dt"], buffer=nl.sbuf) for name in ("x", "do")}
    for t in rows.values():
        nisa.memset(dst=t, value=0.0)
    return rows


def block_start(
    d: dict[str, Any], ws: tuple[Any, ...], sets: dict[str, Any], addr: Any, parity: int
) -> dict[str, Any]:
    """The block's metadata set (loaded now unless it was prefetched)."""
    if d["PF"]:
        return sets["meta"][parity]
    meta = sets["meta"][0]
    load_meta(d, ws, meta, addr)
    return meta


def load_meta(d: dict[str, Any], ws: tuple[Any, ...], meta: dict[str, Any], addr: Any) -> None:
    """Block addr's slot tokens, slot weights and expert id (nothing past NB)."""
    slot_token, slot_weight, block_expert = ws[4], ws[5], ws[6]
    ns, skip = d["NS"], nisa.oob_mode.skip
    pat = [[ns, P], [1, ns]]
    nisa.dma_copy(dst=meta["tok"], src=block_ap(slot_token, addr, pat), oob_mode=skip)
    one = block_ap(block_expert, addr, [[1, 1], [1, 1]])
    nisa.dma_copy(dst=meta["exp"], src=one, oob_mode=skip)
    if d["ramp"] is not None:  # the column loads' row indexes (tiles.load_weight_cols)
        expert_column(block_expert, addr, meta["exp_col"], oob_skip=True)
        expert_row_index(ws[2], meta["exp_col"], d["ramp"], meta["wd_rows"])
        expert_row_index(ws[1], meta["exp_col"], d["ramp"], meta["wgu_rows"])
    nisa.dma_copy(dst=meta["wsl"], src=block_ap(slot_weight, addr, pat), oob_mode=skip)
    if d["GU"] is not None:  # (register + extra) * B: computed, so in range up to NB + 1
        row0 = block_row0(addr, d["B"])
        nisa.tensor_scalar(dst=meta["col0"], data=row0, op0=nl.add, operand0=addr[1] * d["B"])


def gather_unit(
    d: dict[str, Any], ws: tuple[Any, ...], meta: dict[str, Any], rows: dict[str, Any], s: int
) -> None:
    """rows[x / do][p, c] = hidden / dout[token of slot (s * SB / 128 + c, p)] (skip padding)."""
    hidden, dout = ws[0], ws[3]
    h, nsa = d["H"], d["SB"] // P
    for c in range(nsa):
        col = s * nsa + c
        idx = meta["tok"][:, col : col + 1]
        for src, name in ((hidden, "x"), (dout, "do")):
            view = src.ap([[h, P], [1, h]], offset=0, vector_offset=idx, indirect_dim=0)
            nisa.dma_copy(dst=rows[name][:, c, :], src=view, oob_mode=nisa.oob_mode.skip)


def prefetch_next(
    d: dict[str, Any], ws: tuple[Any, ...], blk: dict[str, Any], sets: dict[str, Any], s: int
) -> None:
    """With `prefetch_rows`: gather the unit after sub-block s of block blk (the next
    block's first one at the end of a block, after loading its metadata)."""
    if not d["PF"]:
        return
    if s + 1 < d["B"] // d["SB"]:
        gather_unit(d, ws, blk["meta"], sets["rows"], s + 1)
        return
    reg, extra = blk["addr"]
    nxt = sets["meta"][1 - blk["parity"]]
    load_meta(d, ws, nxt, (reg, extra + d["STEP"]))  # this LNC program's next block
    gather_unit(d, ws, nxt, sets["rows"], 0)


def transposed_rows(
    d: dict[str, Any], ws: tuple[Any, ...], blk: dict[str, Any], sets: dict[str, Any], s: int
) -> tuple[Any, Any, dict[str, Any]]:
    """xT, doT [128, H tiles, SB] of sub-block s and its gathered rows (for
    `store_scaled_rows`). With prefetching both were made during the previous unit
    (`transpose_rows`; the kernel's prologue for the first one); else the rows are
    gathered and transposed now."""
    if d["PF"]:
        return sets["xT"], sets["doT"], sets["rows"]
    rows = _zero_rows(d)  # padding rows read as zeros
    gather_unit(d, ws, blk["meta"], rows, s)
    xT = _row_tiles(d) if d["GU"] is None else None
    doT = _row_tiles(d)
    transpose_rows(d, rows, xT, doT)
    return xT, doT, rows


def transpose_rows(d: dict[str, Any], rows: dict[str, Any], xT: Any, doT: Any) -> None:
    """xT / doT[:, t, :] = (H tile t of the rows)^T: PE transposes through a PSUM ring,
    evacuated by VectorE (ScalarE scales dx rows around the unit boundaries); xT None:
    gate / up are the forward's, only doT is needed."""
    h, nsa = d["H"], d["SB"] // P
    ring = psum_ring(d["dt"], ROW_RING, (nisa.engine.vector,))
    for t in range(d["HT"]):
        cols = slice(t * P, t * P + tile_rows(h, t))
        for name, out in (("x", xT), ("do", doT)):
            if out is None:
                continue
            ring_transpose(ring, [rows[name][:, c, cols] for c in range(nsa)], out[:, t, :])


def transpose_next(d: dict[str, Any], sets: dict[str, Any]) -> None:
    """With prefetching: the next unit's xT / doT from its gathered rows, once the
    current unit's last recompute (their last reader) is queued."""
    if d["PF"]:
        transpose_rows(d, sets["rows"], sets["xT"], sets["doT"])


def store_scaled_rows(
    d: dict[str, Any], ws: tuple[Any, ...], blk: dict[str, Any], rows: dict[str, Any], s: int
) -> None:
    """w * x and w * do of sub-block s -> the wgrad scratch (ScalarE scales, DMA stores)."""
    h, dt, scr, nsa = d["H"], d["dt"], ws[7], d["SB"] // P
    for c in range(nsa):
        col = s * nsa + c
        w_col = blk["meta"]["wsl"][:, col : col + 1]
        for name, dst in (("x", "x"), ("do", "dy")):
            wrow = nl.ndarray((P, h), dtype=dt, buffer=nl.sbuf)
            nisa.activation(dst=wrow, op=nl.copy, data=rows[name][:, c, :], scale=w_col)
            nisa.dma_copy(dst=slot_tiles(scr[dst], blk["addr"], col * P, 1, 0, h), src=wrow)


# ---- PE transposes through a ring of PSUM banks -------------------------------------------
ROW_RING = 4  # PSUM banks for the row transposes (the chunk loop's accumulators are dead)
ACT_RING = 3  # PSUM banks for a chunk's act / dg / du transposes (between its accumulators)


def psum_ring(dt: Any, n: int, engines: tuple[Any, ...]) -> dict[str, Any]:
    """n PSUM tiles [128, TRANSPOSE_GROUP * 128] used in turn, whose turn it is, and the
    engines that evacuate the groups in turn."""
    tiles = [nl.ndarray((P, TRANSPOSE_GROUP * P), dtype=dt, buffer=nl.psum) for _ in range(n)]
    return {"tiles": tiles, "next": 0, "engines": engines}


def ring_transpose(ring: dict[str, Any], srcs: list[Any], dst: Any) -> None:
    """dst[:, sum(p_<j) + q] = srcs[j][q, :]^T, as `tiles.transpose_into`, but each group
    of TRANSPOSE_GROUP transposes takes the ring's next PSUM tile: a group waits for the
    evacuation of the group n before it, not of the one just before (the ring's engines
    evacuate in turn)."""
    f = srcs[0].shape[1] if len(srcs[0].shape) == 2 else srcs[0].free_size
    col = 0
    for g0 in range(0, len(srcs), TRANSPOSE_GROUP):
        k = ring["next"]
        ring["next"] = k + 1
        tp = ring["tiles"][k % len(ring["tiles"])]
        width = 0
        for src in srcs[g0 : g0 + TRANSPOSE_GROUP]:
            p = src.shape[0]
            nisa.nc_transpose(dst=tp[0:f, width : width + p], data=src)
            width += p
        eng = ring["engines"][k % len(ring["engines"])]
        nisa.tensor_copy(dst=dst[0:f, col : col + width], src=tp[0:f, 0:width], engine=eng)
        col += width
