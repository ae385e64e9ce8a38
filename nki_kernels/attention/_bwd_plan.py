"""Static work plan of the flash-attention backward kernel (plain Python, no NKI calls).

Query rows are grouped in *units* of 512 (four 128-row tiles of one head). A full unit
is staged with one 1 KiB-per-partition DMA per operand: partition p holds rows
r0 + 4p .. r0 + 4p + 3, so tile j of the unit is the strided row set {r0 + 4p + j}
(`bwd_row_order` is that order; the host puts lse, bounds and the tile plan in it). A
ragged last unit keeps natural 128-row tiles. Keys are handled the same way: a full
512-key block is staged interleaved, and its dK / dV / dS^T sub-tile ("slot") j holds
keys k0 + 4p + j, while the score columns stay in natural key order (the mask compares
column indices with the row bounds).

An interleaved block is computed whole or not at all for a query tile: when any of its
128-key sub-tiles is allowed, its SKIP sub-tiles are masked like PARTIAL ones (their
probabilities are then exactly 0), since each slot spans all four sub-tiles.
"""

from __future__ import annotations

from typing import Any

P = 128
GROUP = 4  # 128-row tiles per unit, 128-key sub-tiles per key block
UNIT = GROUP * P  # rows per query unit and keys per key block
FULL, PARTIAL, SKIP = 2, 1, 0  # tile classes of masks.py
DIAG = 3  # PARTIAL sub-tile whose mask is the aligned causal diagonal (marked by the host)
NONE, SELECT = 0, 1  # mask kinds of a computed sub-tile (and DIAG)


def bwd_row_order(sq: int) -> list[int]:
    """Row of each position in the backward's query order: within every full 512-row
    unit, position r0 + 128 j + p is row r0 + 4 p + j; rows past the last full unit
    keep their place."""
    order = []
    full = sq // UNIT
    for u in range(full):
        r0 = u * UNIT
        order += [r0 + GROUP * p + j for j in range(GROUP) for p in range(P)]
    order += list(range(full * UNIT, sq))
    return order


def tile_work(classes: Any, t: int, kb: int, nk: int, sk: int, diag: bool = False) -> dict | None:
    """What query tile t computes against key block kb, or None (nothing).

    subs: (sub-tile index in the block, absolute sub-tile, mask kind) of the score columns
    to compute, the kind being NONE, SELECT (range_select against the row bounds) or
    DIAG (the constant causal-diagonal bias, when `diag`); slots: (slot, keys,
    interleaved) of the dV / dK / dS^T products.
    """
    k0 = kb * UNIT
    n = min(UNIT, sk - k0)
    cls = [
        classes[t][u] if len(classes) > 0 else FULL
        for u in range(kb * GROUP, kb * GROUP + -(-n // P))
    ]
    if all([c == SKIP for c in cls]):
        return None
    if n == UNIT:
        subs = [(ul, kb * GROUP + ul, _kind(c, diag)) for ul, c in enumerate(cls)]
        slots = [(j, P, True) for j in range(GROUP)]
    else:
        subs = [(ul, kb * GROUP + ul, _kind(c, False)) for ul, c in enumerate(cls) if c != SKIP]
        slots = [(ul, min(P, sk - u * P), False) for ul, u, _ in subs]
    return {"subs": subs, "slots": slots}


def _kind(c: int, diag: bool) -> int:
    if c == FULL:
        return NONE
    return DIAG if c == DIAG and diag else SELECT


def runs(subs: list, split_masked: bool = False) -> list:
    """Runs of consecutive sub-tiles: (first sub-tile in block, absolute, count, kind);
    with `split_masked` only sub-tiles of one mask kind share a run."""
    out: list[tuple[int, int, int, int]] = []
    for ul, u, kind in subs:
        same = not split_masked or (out and out[-1][3] == kind)
        if out and same and out[-1][1] + out[-1][2] == u:
            r = out[-1]
            out[-1] = (r[0], r[1], r[2] + 1, r[3])
        else:
            out.append((ul, u, 1, kind))
    return out


def head_group_plan(
    classes: Any, heads: range, sq: int, sk: int, units_per_section: int, diag: bool = False
) -> dict:
    """Units, sections and jobs of one (batch, kv-head) program.

    Returns units (each: h, r0, interleaved, tiles [(t, rows, slot j, item or None)]),
    sections (lists of unit indices), `zero_tiles` [(h, t, unit, j)] without any allowed
    key, and `touch[kb][slot]`: the sections whose items write that dK / dV slot.
    """
    nq, nk = -(-sq // P), -(-sk // P)
    nkb = -(-sk // UNIT)
    units: list[dict] = []
    zero_tiles = []
    for h in heads:
        for qb in range(-(-nq // GROUP)):
            r0 = qb * UNIT
            il = r0 + UNIT <= sq
            unit: dict[str, Any] = {"h": h, "r0": r0, "il": il, "items": []}
            for j, t in enumerate(range(qb * GROUP, min(nq, qb * GROUP + GROUP))):
                work = [tile_work(classes, t, kb, nk, sk, diag) for kb in range(nkb)]
                rows = P if il else min(P, sq - t * P)
                if any([w is not None for w in work]):
                    unit["items"].append({"h": h, "t": t, "j": j, "rows": rows, "work": work})
                else:
                    zero_tiles.append((h, t, j, il, r0, rows))
            if len(unit["items"]) > 0:
                unit["ntiles"] = min(nq, qb * GROUP + GROUP) - qb * GROUP
                units.append(unit)
    per = max(1, units_per_section)
    sections = [list(range(s0, min(len(units), s0 + per))) for s0 in range(0, len(units), per)]
    touch: list[list[list[int]]] = [[[] for _ in range(GROUP)] for _ in range(nkb)]
    for si, sec in enumerate(sections):
        for ui in sec:
            for it in units[ui]["items"]:
                for kb, w in enumerate(it["work"]):
                    if w is None:
                        continue
                    for sl, _, _ in w["slots"]:
                        if len(touch[kb][sl]) == 0 or touch[kb][sl][-1] != si:
                            touch[kb][sl].append(si)
    return {"units": units, "sections": sections, "zero_tiles": zero_tiles, "touch": touch}


def mark_diagonal(classes: Any, lo: Any, hi: Any, sk: int) -> None:
    """Re-class (in place) PARTIAL sub-tiles as DIAG where the mask is exactly the
    causal diagonal of an interleaved unit over a full key block: row r0 + 4p + j
    allows keys <= k0 + 4p + j (rows without keys excepted). classes: int8 [B, nq, nk]
    in the backward's row order, lo / hi: [B, Sq] key bounds in that order."""
    import numpy as np

    units = lo.shape[1] // UNIT
    full_blocks = sk // UNIT
    for t, u in np.argwhere((classes == PARTIAL).any(axis=0)):
        if t >= units * GROUP or u >= full_blocks * GROUP:
            continue
        j, k0 = t % GROUP, (u // GROUP) * UNIT
        s0, s1 = u * P, u * P + P
        rl, rh = lo[:, t * P : t * P + P], hi[:, t * P : t * P + P]
        want = k0 + GROUP * np.arange(P) + j + 1
        ok = (rh <= rl) | ((rl <= s0) & (np.clip(rh, s0, s1) == np.clip(want, s0, s1)))
        hit = ok.all(axis=1) & (classes[:, t, u] == PARTIAL)
        classes[hit, t, u] = DIAG


__all__ = [
    "DIAG",
    "GROUP",
    "UNIT",
    "P",
    "bwd_row_order",
    "head_group_plan",
    "mark_diagonal",
    "runs",
    "tile_work",
]
