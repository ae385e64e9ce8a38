"""Rule 46, TensorE tiling mode (perfmodel/pe_tiles.py), priced through traced kernels.

nc_matmul ISA page (aws-neuron-sdk @ 81ce03ae, `nki/api/nki/isa/__init__.py`): "Tensor
Engine supports both row and column tiling modes, which allow multiple ``nc_matmul``
instructions with a stationary tile size smaller than [128, 128] to run in parallel to
improve hardware utilization. Row tiling mode slices the 128 PE rows into 2x 64 row tiles
(NeuronCore-v2 or newer), or 4x 32 row tiles (NeuronCore-v3 or newer). Column tiling
mode slices the 128 PE columns in the same fashion."
"""

from __future__ import annotations

import copy

import pytest
from test_cost_compiled import _attention, _same

from nki_kernels.interp import TensorSpec
from nki_kernels.interp.trace import Trace
from nki_kernels.nki import nisa, nki, nl
from nki_kernels.perfmodel import estimate_trace, trace_kernel
from nki_kernels.perfmodel.band import parameter_sets
from nki_kernels.perfmodel.costs import compute_ns
from nki_kernels.perfmodel.estimate import _bounds
from nki_kernels.perfmodel.timeline import schedule
from nki_kernels.targets import TRN2


@nki.jit
def _two_matmuls(x, tiles, rows, psum_rows):
    """One matmul per entry of `tiles` ((tile_position, tile_size), or None for no
    tiling), each of one [rows, 32] stationary by one [rows, 512] moving tile, into the
    32 PSUM partitions from its `psum_rows` entry of one tile; then one VectorE copy of
    all the results."""
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    st = nl.ndarray((rows, 32), dtype=x.dtype, buffer=nl.sbuf)
    mv = nl.ndarray((rows, 512), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=st, src=x[0:rows, 0:32])
    nisa.dma_copy(dst=mv, src=x[0:rows, :])
    acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
    for tile, p in zip(tiles, psum_rows):
        kw = {} if tile is None else {"tile_position": tile[0], "tile_size": tile[1]}
        nisa.nc_matmul(dst=acc[p : p + 32, :], stationary=st, moving=mv, **kw)
    res = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=out, src=res)
    return out


def _priced(tiles, rows=128, psum_rows=(0, 32), target="trn2"):
    tr = trace_kernel(
        _two_matmuls, TensorSpec((128, 512), "bfloat16"), tiles, rows, psum_rows, target=target
    )
    mm = [i for i, ins in enumerate(tr.instrs) if ins.opcode == "nc_matmul"]
    (copy,) = [i for i, ins in enumerate(tr.instrs) if ins.opcode == "tensor_copy"]
    sched = schedule(tr, target)
    ref = schedule(tr, target, compiled=False)
    _same(sched, ref)  # the compiled path runs the same tile rules
    return tr, sched, mm, copy


COL0, COL1 = ((0, 0), (128, 32)), ((0, 32), (128, 32))


def test_matmuls_on_disjoint_column_tiles_run_in_parallel():
    # "allow multiple nc_matmul instructions ... to run in parallel": two [128, 32]
    # stationaries on column tiles 0 and 1, into disjoint PSUM partitions
    _, s, (a, b), evac = _priced((COL0, COL1))
    assert s.start[b] == s.start[a] and s.end[b] == s.end[a]
    # TensorE's busy time is its wall time, not the sum of the two matmuls
    assert s.busy_ns["tensor"] == pytest.approx(s.end[a] - s.start[a])
    # whatever reads both results waits for both
    assert s.start[evac] >= max(s.end[a], s.end[b])
    _, untiled, (ua, ub), _ = _priced((None, None))
    assert untiled.start[ub] >= untiled.end[ua]
    assert s.latency_ns < untiled.latency_ns


def test_four_column_tiles_stay_above_the_roofline():
    # four [128, 32] stationaries on the four column tiles do one full array's work at
    # once: TensorE time never drops below the FLOPs at peak (estimate checks the bound)
    tiles = tuple(((0, 32 * j), (128, 32)) for j in range(4))
    tr, s, mm, _ = _priced(tiles, psum_rows=(0, 32, 64, 96))
    assert len({s.start[i] for i in mm}) == 1
    est = estimate_trace(tr, "trn2")
    assert est.busy_ns["tensor"] >= _bounds(tr, TRN2, 1)[0] > 0


def test_matmuls_on_disjoint_row_tiles_run_in_parallel():
    # "Row tiling mode slices the 128 PE rows into 2x 64 row tiles (NeuronCore-v2 or
    # newer)": 64-partition stationaries on the two row halves, on trn1 (NC-v2) too
    for target in ("trn1", "trn2"):
        tiles = (((0, 0), (64, 128)), ((64, 0), (64, 128)))
        _, s, (a, b), _ = _priced(tiles, rows=64, target=target)
        assert s.start[b] == s.start[a]


def test_matmuls_on_the_same_tile_serialize():
    _, s, (a, b), _ = _priced((COL0, COL0))
    assert s.start[b] >= s.end[a]
    # overlapping tiles (a 64-column tile covers column tile 1) serialize too
    _, s, (a, b), _ = _priced((((0, 0), (128, 64)), COL1))
    assert s.start[b] >= s.end[a]


def test_tiled_and_untiled_matmuls_serialize():
    # an untiled matmul holds the whole array ("the default is to use the full systolic
    # array"), before or after a tiled one
    for tiles in ((COL0, None), (None, COL1)):
        _, s, (a, b), _ = _priced(tiles)
        assert s.start[b] >= s.end[a]


def test_disjoint_tiles_writing_the_same_psum_partitions_serialize():
    # the PE tiles are free, but the second matmul overwrites the first one's PSUM
    # bytes (write-after-write, kept per 32-partition quadrant)
    _, s, (a, b), _ = _priced((COL0, COL1), psum_rows=(0, 0))
    assert s.start[b] >= s.end[a]


def test_a_tiled_matmul_costs_what_it_costs_untiled():
    # the page states no cost for tiling mode: a tiled matmul is priced as rule 1 prices
    # it untiled (assumed), only its occupancy of the array changes
    tiled, *_ = _priced((COL0, COL1))
    untiled, *_ = _priced((None, None))
    for t, u in zip(tiled.instrs, untiled.instrs):
        if t.opcode == "nc_matmul":
            assert compute_ns(t, TRN2) == compute_ns(u, TRN2)


def test_full_array_tiling_prices_as_untiled():
    # "equivalent to tile_position=(0, 0) and tile_size=(128, 128)"
    full = ((0, 0), (128, 128))
    _, s, *_ = _priced((full, full))
    _, u, *_ = _priced((None, None))
    _same(s, u)


@pytest.mark.parametrize("compiled", [True, False])
def test_untiled_instructions_keep_their_floats_in_a_tiled_trace(compiled):
    # Turning the tile tables on (a trace with one tiled matmul) must not move any
    # untiled instruction: our attention forward, priced alone and with a tiled matmul
    # appended after it, gives the same start and end floats for every one of its
    # instructions, under every parameter set of trn2 (program order).
    base = _attention("fwd", True, 2, "trn2")
    extra, *_ = _priced((COL0, COL1))
    (tiled_mm,) = [ins for ins in extra.instrs if ins.attrs.get("pe_tile") == COL1[0] + COL1[1]]
    mixed = Trace(base.target, base.lnc)
    for ins in (*base.instrs, copy.copy(tiled_mm)):
        mixed.append(ins)
    n = len(base.instrs)
    for tgt in parameter_sets("trn2"):
        a = schedule(base, tgt, compiled=compiled)
        b = schedule(mixed, tgt, compiled=compiled)
        assert a.start == b.start[:n] and a.end == b.end[:n]
        assert a.busy_ns["vector"] == b.busy_ns["vector"]


def test_the_band_spans_the_overlap_on_and_off():
    # no cost is documented for tiling mode, so the overlap is an unanchored parameter:
    # the band's slow corner prices tiled matmuls as holding the whole engine (the
    # pricing before rule 46), the fast corner and the shipped set let them overlap
    sets = parameter_sets("trn2")
    slow, fast = sets[-2], sets[-1]
    assert (slow.tensor_tile_overlap, fast.tensor_tile_overlap) == (0.0, 1.0)
    assert sets[0].tensor_tile_overlap == 1.0
    tr, *_ = _priced((COL0, COL1))
    (a, b) = [i for i, ins in enumerate(tr.instrs) if ins.opcode == "nc_matmul"]
    for compiled in (True, False):
        s = schedule(tr, slow, compiled=compiled)
        assert s.start[b] >= s.end[a]
        stripped = Trace(tr.target, tr.lnc)
        for ins in tr.instrs:
            ins = copy.copy(ins)
            ins.attrs = {k: v for k, v in ins.attrs.items() if k != "pe_tile"}
            stripped.append(ins)
        _same(s, schedule(stripped, slow, compiled=compiled))
        f = schedule(tr, fast, compiled=compiled)
        assert f.start[b] == f.start[a]
