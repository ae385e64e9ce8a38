"""TensorE tiling mode (rule 46): matmuls on disjoint tiles of the PE array overlap.

The `nki.isa.nc_matmul` page (aws-neuron-sdk @ 81ce03ae, `nki/api/nki/isa/__init__.py`):
"Tensor Engine supports both row and column tiling modes, which allow multiple
``nc_matmul`` instructions with a stationary tile size smaller than [128, 128] to run in
parallel to improve hardware utilization. Row tiling mode slices the 128 PE rows into 2x
64 row tiles (NeuronCore-v2 or newer), or 4x 32 row tiles (NeuronCore-v3 or newer).
Column tiling mode slices the 128 PE columns in the same fashion." The interpreter
records a tiling-mode matmul's tile as `attrs["pe_tile"]` = (start_row, start_column,
row_size, column_size); a matmul without it (and every other TensorE instruction) holds
the whole array.

How the timeline uses it (the page gives no cost figure; the rest is assumed):

- the PE array is a 4 x 4 grid of 32 x 32 cells (the finest tile, NC-v3+; a 64-wide tile
  covers two); an instruction waits for the cells its tile covers, not for the engine;
- a tiled matmul costs what the same matmul costs untiled (rule 1's max(N, 64) cycles
  plus the fitted per-instruction cycles): assumed, no source gives a tiled cost;
- TensorE still issues in program order: an instruction starts no earlier than the one
  before it started (assumed: one sequencer per engine, trainium_inferentia2_arch);
- the engine's busy time is the wall time any cell is busy, and the throttle ramp
  (rule 43) advances with that time; a tiled matmul runs at the ramp speed the engine
  had reached when it starts (assumed: the guide describes the limit per engine);
- PSUM dependencies of a tiled matmul are tracked per 32-partition quadrant of each
  64 B block (the column tiles write disjoint PSUM partitions, as nki-library's
  `mlp_tkg` / `qkv_tkg` / `router_topk` place them); every other instruction keeps the
  partition-blind tables, which also record the tiled matmuls' writes, so whatever reads
  a tiled result waits for all of it.

A trace with no tiled matmul is priced by exactly the code and floats it was before.
"""

from __future__ import annotations

from ..interp.trace import PSUM, Instr

CELL = 32  # the finest PE tile (4 x 32 from NC-v3), and the PSUM partition quadrant
GRID = 128 // CELL
FULL = (1 << (GRID * GRID)) - 1  # the whole PE array


def pe_mask(instr: Instr) -> int:
    """Bit (row cell * 4 + column cell) of each 32 x 32 PE cell `instr` occupies."""
    tile = instr.attrs.get("pe_tile") if instr.engine == "tensor" else None
    if tile is None:
        return FULL
    r0, c0, rs, cs = tile
    mask = 0
    for r in range(r0 // CELL, (r0 + rs) // CELL):
        for c in range(c0 // CELL, (c0 + cs) // CELL):
            mask |= 1 << (r * GRID + c)
    return mask


def has_tiles(instrs: list[Instr]) -> bool:
    """Whether any instruction is a tiling-mode matmul (then the tile tables are kept)."""
    return any(ins.engine == "tensor" and "pe_tile" in ins.attrs for ins in instrs)


def psum_quadrants(regs: tuple, shift: int) -> tuple[tuple[int, int, int, int], ...]:
    """(first quadrant, end quadrant, first block, end block) of each PSUM region."""
    out = []
    for reg in regs:
        if reg[0] != PSUM:
            continue
        b, e = reg[4] >> shift, ((reg[5] - 1) >> shift) + 1
        if e > b and reg[3] > reg[2]:
            out.append((reg[2] // CELL, (reg[3] - 1) // CELL + 1, b, e))
    return tuple(out)


class TileState:
    """Per core: when each PE cell is free, the last TensorE start, and the last access
    of each (PSUM quadrant, 64 B block)."""

    __slots__ = ("cells", "issue", "quad")

    def __init__(self, psum_blocks: int) -> None:
        self.cells = [0.0] * (GRID * GRID)
        self.issue = 0.0
        self.quad = [[0.0] * psum_blocks for _ in range(GRID)]

    def cells_free(self, mask: int) -> float:
        """When every cell of `mask` is free and the previous instruction has started."""
        t = self.issue
        cells = self.cells
        bit = 0
        while mask:
            if mask & 1 and cells[bit] > t:
                t = cells[bit]
            mask >>= 1
            bit += 1
        return t

    def occupy(self, mask: int, start: float, end: float) -> None:
        cells = self.cells
        bit = 0
        while mask:
            if mask & 1:
                cells[bit] = end
            mask >>= 1
            bit += 1
        self.issue = start

    def quad_ready(self, quads: tuple) -> float:
        """When the PSUM quadrants / blocks `quads` are no longer accessed."""
        dep = 0.0
        quad = self.quad
        for q0, q1, b, e in quads:
            for q in range(q0, q1):
                t = max(quad[q][b:e])
                if t > dep:
                    dep = t
        return dep

    def quad_publish(self, quads: tuple, end: float) -> None:
        quad = self.quad
        for q0, q1, b, e in quads:
            for q in range(q0, q1):
                row = quad[q]
                row[b:e] = [x if x > end else end for x in row[b:e]]


def tiled_start(tiles: TileState, mask: int, dep: float, sem: float) -> float:
    """When a tiled matmul ready at `dep` starts: its cells free, in issue order, plus
    the semaphore latency when it waited on another engine (as `timeline.start_compute`)."""
    free = tiles.cells_free(mask)
    return dep + sem if dep > free else free


def run_tiled(
    core: object, tiles: TileState, mask: int, start: float, work: float, throttle: tuple | None
) -> float:
    """Run a tiled matmul of `work` full-speed ns from `start` on its cells: its end.

    `core` is the timeline's `_Core` (its TensorE free time, busy time and warm-up)."""
    from .timeline import throttled_duration

    free = core.free[0]  # type: ignore[attr-defined]
    warm = base = core.warm  # type: ignore[attr-defined]
    if throttle is not None:
        s0, ramp, reengage = throttle
        if start >= free:  # as run_compute: a long idle gap re-engages the limit
            warm = base = 0.0 if start - free > reengage else warm
        elif warm < ramp:  # the warm-up the engine had reached at `start`
            warm = warm - (free - start) if warm > free - start else 0.0
        dur = throttled_duration(work, warm, s0, ramp)
    else:
        dur = work
    end = start + dur
    # wall time any cell is busy: starts come in issue order, so the union grows by the
    # part of [start, end) past the engine's latest end
    added = end - (start if start > free else free)
    if added > 0.0:
        core.busy[0] += added  # type: ignore[attr-defined]
        core.free[0] = end  # type: ignore[attr-defined]
        if throttle is not None:
            base += added
            core.warm = base if base < throttle[1] else throttle[1]  # type: ignore[attr-defined]
    tiles.occupy(mask, start, end)
    return end
