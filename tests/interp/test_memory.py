"""Memory accounting: SBUF bytes per partition and PSUM banks against the target, tile
reuse when a tile dies, peak figures, and the physical regions in the trace."""

from __future__ import annotations

import numpy as np
import pytest

from nki_kernels.interp import MemoryPlanError, NkiValidationError, nisa, nl, run, settings
from nki_kernels.interp.memory import SBUF_ALIGN
from nki_kernels.targets import get_target

KIB = 1024


def _plan_error(rule, kernel, target="trn2"):
    # these kernels allocate tiles no instruction touches: by default the replay drops
    # such dead allocations as the compiler does; the strict mode (the configs' dry
    # runs) keeps them, which is what these tests account
    with pytest.raises(MemoryPlanError) as e, settings(free_unused_tiles=False):
        run(kernel, target=target)
    assert e.value.rule == rule and isinstance(e.value, NkiValidationError)
    return str(e.value)


def test_sbuf_overflow_reports_the_numbers():
    usable = get_target("trn2").sbuf_usable_bytes

    def kernel():
        live = [nl.ndarray((128, 16 * KIB), nl.float32, buffer=nl.sbuf) for _ in range(3)]
        assert len(live) == 3  # 192 KiB live
        nl.ndarray((128, 4 * KIB), nl.float32, buffer=nl.sbuf)  # 16 KiB more: > usable

    msg = _plan_error("SBUF_OVERFLOW", kernel)
    assert f"of {usable} usable B per partition" in msg
    assert "needs 16384 B per partition" in msg and "196608" in msg and "trn2" in msg


def test_the_same_plan_fits_a_larger_target():
    def kernel():
        nl.ndarray((128, 216 * KIB // 2), nl.bfloat16, buffer=nl.sbuf)

    _plan_error("SBUF_OVERFLOW", kernel, target="trn2")  # 216 KiB > 224 KiB - 16 KiB - 8
    res = run(kernel, target="trn3")
    assert res.peak_sbuf_bytes == 216 * KIB


def test_usable_sbuf_is_physical_less_the_compilers_two_reserved_locations():
    # nki-library d2ad3a57, core/mlp/mlp_cte/mlp_cte_constants.py: "# Total available
    # SBUF - DynamicDMAScratchLoc - EvalAccelReservedLoc - identity tensor size for
    # transpose" / MAX_AVAILABLE_SBUF_SIZE = 224 * 1024 - 16384 - 8 - 256. The identity
    # (128 x 128 bf16: 256 B per partition; fp32, 512 B, in bwmm_bwd_dropless.py's
    # "- 8 - 520") is the kernel's own tile: a kernel that allocates it and fills
    # nki-library's budget fits, one byte-granule more does not.
    trn2 = get_target("trn2")
    assert trn2.sbuf_usable_bytes == 224 * KIB - 16384 - 8
    budget = 224 * 1024 - 16384 - 8 - 256
    rest = (budget // SBUF_ALIGN) * SBUF_ALIGN  # the kernel's tiles in whole granules

    def kernel(extra):
        live = [nl.ndarray((128, 128), nl.bfloat16, buffer=nl.sbuf)]  # the identity
        live.append(nl.ndarray((128, rest // 4 + extra), nl.float32, buffer=nl.sbuf))
        assert len(live) == 2

    with settings(free_unused_tiles=False):
        res = run(kernel, 0, target="trn2")
    assert res.peak_sbuf_bytes == 256 + rest <= trn2.sbuf_usable_bytes
    msg = _plan_error("SBUF_OVERFLOW", lambda: kernel(SBUF_ALIGN // 4 + 1))
    assert f"of {trn2.sbuf_usable_bytes} usable B per partition" in msg


def test_psum_has_eight_two_kib_banks():
    def kernel():
        live = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(7)]
        live.append(nl.ndarray((128, 100), nl.bfloat16, buffer=nl.psum))  # still a whole bank
        nl.ndarray((1, 1), nl.float32, buffer=nl.psum)

    msg = _plan_error("PSUM_OVERFLOW", kernel)
    assert "needs 1 bank(s) of 2048 B but 8 of 8 banks are live" in msg


def test_a_psum_tile_larger_than_psum_fails():
    def kernel():
        nl.ndarray((128, 4097), nl.float32, buffer=nl.psum)

    assert "needs 9 bank(s)" in _plan_error("PSUM_OVERFLOW", kernel, target="trn3")


def test_dead_tiles_give_their_space_back():
    def kernel():
        for _ in range(50):  # each iteration's tiles die when the names are rebound
            a = nl.ndarray((128, 40 * KIB // 4), nl.float32, buffer=nl.sbuf)
            ps = nl.ndarray((128, 2048), nl.float32, buffer=nl.psum)  # 4 banks
        assert a.shape[0] == ps.shape[0]

    res = run(kernel)
    # two generations are live while a loop variable is rebound: double buffering
    assert res.peak_sbuf_bytes == 2 * 40 * KIB
    assert res.peak_psum_banks == 8


def test_peaks_count_allocation_granules():
    def kernel():
        live = [
            nl.ndarray((128, 100), nl.float32, buffer=nl.sbuf),  # 400 B -> 448 B
            nl.ndarray((64, 1), nl.bfloat16, buffer=nl.sbuf),  # 2 B -> 64 B
            nl.ndarray((8, 600), nl.float32, buffer=nl.psum),  # 2400 B -> 2 banks
        ]
        assert len(live) == 3

    res = run(kernel)
    assert SBUF_ALIGN == 64
    assert res.peak_sbuf_bytes == 448 + 64
    assert res.peak_psum_banks == 2


def test_trace_regions_are_physical_and_freed_buffers_rotate():
    def kernel(x):
        for _ in range(3):
            t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=t[0:4, 8:16], src=x)

    res = run(kernel, np.zeros((4, 8), np.float32))
    writes = [i.writes[0] for i in res.trace]
    # (space, allocation, partition start, partition end, byte start, byte end): columns
    # 8..15 of three allocations, each named by its own storage id
    assert [w[0] for w in writes] == [0, 0, 0] and all(w[2:4] == (0, 4) for w in writes)
    assert writes[0][5] - writes[0][4] == 32
    assert 0 < writes[0][1] < writes[1][1] < writes[2][1]
    assert writes[1] != writes[0]  # the previous tile is still live while t is rebound
    # ...then dies, but with free SBUF left the next tile goes past it (rotation)
    assert writes[2][4] > writes[1][4] > writes[0][4]


def test_an_explicit_placement_names_no_allocation():
    # address= may alias other tiles on purpose: its regions carry allocation 0, so the
    # cost model's scheduler does not rename around it
    def kernel(x):
        t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf, address=(0, 4096))
        u = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[0:4, 0:8], src=x)
        nisa.dma_copy(dst=u[0:4, 0:8], src=x)

    res = run(kernel, np.zeros((4, 8), np.float32))
    pinned, tile = (i.writes[0] for i in res.trace)
    assert pinned[1] == 0 and pinned[4] == 4096
    assert tile[1] > 0


def test_freed_buffers_alias_once_the_free_space_runs_out():
    third = get_target("trn2").sbuf_usable_bytes // 3 // 64 * 64

    def kernel(x):
        for _ in range(4):  # two generations of a third of SBUF each: the third wraps
            t = nl.ndarray((128, third // 4), nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=t[0:4, 0:8], src=x)

    res = run(kernel, np.zeros((4, 8), np.float32))
    starts = [i.writes[0][4] for i in res.trace]
    assert starts[0] == 0 and starts[1] == third and starts[2] == 2 * third
    assert starts[3] == 0  # the first generation's place, long dead, is handed out again
    reads = res.trace.instrs[0].reads[0]
    assert reads[0] == 2 and reads[4:] == (0, 4 * 8 * 4)  # HBM byte range of x


def test_hbm_allocations_do_not_count_against_sbuf():
    def kernel():
        nl.ndarray((100_000, 1024), nl.float32, buffer=nl.shared_hbm)

    res = run(kernel, trace_only=True)
    assert res.peak_sbuf_bytes == 0
