"""DMA transpose pricing: documented efficiencies per kind, block padding, floors, trn1.

trn2 (trainium2_arch, "DMA Transpose"): HBM -> SBUF transposes reach up to 90 % of the
DMA copy throughput, SBUF -> SBUF up to 50 %; the 16 engines write [128, 16]-element
destination blocks. Engine rate: trn2 23 B/ns, trn3 33 B/ns; 8 partitions per engine.
"""

from __future__ import annotations

import pytest
from cost_fixtures import hbm, make_trace, sbuf

from nki_kernels.interp import TensorSpec
from nki_kernels.interp.trace import Instr
from nki_kernels.nki import nisa, nki, nl
from nki_kernels.perfmodel import estimate_trace, trace_kernel
from nki_kernels.perfmodel.costs import descriptor_ns, dma_plan
from nki_kernels.targets import TRN1, TRN2, TRN3

# SBUF -> SBUF transpose rates in B/ns per engine (copy rate x fitted efficiency)
SB2 = TRN2.dma_engine_bytes_per_ns * TRN2.dma_transpose_sbuf_efficiency
SB3 = TRN3.dma_engine_bytes_per_ns * TRN3.dma_transpose_sbuf_efficiency


def transpose(kind: str, parts: int, inner: int, outer: int = 1, itemsize: int = 2) -> Instr:
    """A dma_transpose record onto `parts` partitions of [outer, inner] elements each."""
    row = outer * inner * itemsize
    src = sbuf(64 * 1024, parts * row) if kind == "sbuf2sbuf" else hbm(1, 0, parts * row)
    return Instr(
        "dma",
        "dma_transpose",
        parts,
        outer * inner,
        "bfloat16" if itemsize == 2 else "float32",
        ("bfloat16" if itemsize == 2 else "float32",),
        (src,),
        (sbuf(0, row, p=parts),),
        hbm_read=parts * row if kind == "hbm2sbuf" else 0,
        nbytes=parts * row,
        attrs={
            "descriptors": parts * outer * inner,
            "descriptor_bytes": itemsize,
            "partitions": parts,
            "indirect": False,
            "dge": "unknown",
            "queue": "sync",
            "transpose": kind,
            "transpose_inner": inner,
            "itemsize": itemsize,
        },
    )


def per_engine(ins: Instr, target) -> float:
    return dma_plan(ins, ins.writes[0], target).per_engine_ns


def test_hbm_to_sbuf_runs_at_its_efficiency_of_the_copy_rate():
    # [128, 512] bf16: 16 engines x 8 rows x 1 KiB; 8 KiB / (rate x 0.9): ~401 ns at the v3 fit
    # (the documented "up to 90 %"; the HBM cap, 361.1 ns, does not bind)
    assert TRN2.dma_transpose_hbm_efficiency == 0.9
    rate = TRN2.dma_engine_bytes_per_ns * 0.9
    assert per_engine(transpose("hbm2sbuf", 128, 512), TRN2) == pytest.approx(8192 / rate)


def test_sbuf_to_sbuf_runs_at_its_efficiency():
    # the attention forward's P^T: [128 keys, 4 x 128 queries] bf16 = 8 rows x 1 KiB per
    # engine: 8192 / (rate x SBUF efficiency): the v3 fit puts the efficiency at 0.41 ("up to 50 %")
    ins = transpose("sbuf2sbuf", 128, 128, outer=4)
    assert per_engine(ins, TRN2) == pytest.approx(8192 / SB2)
    assert per_engine(ins, TRN3) == pytest.approx(8192 / SB3)
    plan = dma_plan(ins, ins.writes[0], TRN2)
    assert (plan.engines, plan.hbm_bytes, plan.dge) == (range(0, 16), 0, "")


def test_four_byte_elements_move_twice_the_bytes():
    # [128, 128] fp32 SBUF -> SBUF: 8 rows x 512 B = 4 KiB per engine / SB2
    ins = transpose("sbuf2sbuf", 128, 128, itemsize=4)
    assert per_engine(ins, TRN2) == pytest.approx(4096 / SB2)


def test_inner_dim_is_padded_to_whole_16_element_blocks():
    # inner 100 -> 112 elements: rows of 200 B cost 224 B; 8 x 224 / SB2
    assert per_engine(transpose("sbuf2sbuf", 128, 100), TRN2) == pytest.approx(8 * 224 / SB2)


def test_fewer_partitions_use_fewer_engines():
    # 40 partitions -> engines 0..4, 8 rows each: 8 x 1 KiB / SB2, on 5 engines
    ins = transpose("sbuf2sbuf", 40, 512)
    plan = dma_plan(ins, ins.writes[0], TRN2)
    assert plan.engines == range(0, 5)
    assert plan.per_engine_ns == pytest.approx(8192 / SB2)


def test_a_tiny_transpose_pays_one_descriptor_floor():
    # [128, 16] bf16: 8 x 32 B / SB2 = 27 ns < the descriptor floor (67 ns, v3 fit)
    floor = TRN2.dma_descriptor_min_ns
    assert per_engine(transpose("sbuf2sbuf", 128, 16), TRN2) == pytest.approx(floor)


def test_trn1_has_no_transpose_hardware_every_element_is_a_descriptor():
    # 128 x 512 elements of 2 B on 16 engines: 4096 descriptors per engine, each at the
    # descriptor floor (smooth max of 2 B / rate and the floor)
    ins = transpose("hbm2sbuf", 128, 512)
    assert per_engine(ins, TRN1) == pytest.approx(4096 * descriptor_ns(2, TRN1))
    assert per_engine(ins, TRN1) > 200 * per_engine(ins, TRN2)  # 163 us vs 0.71 us (v2)


def test_isolated_transpose_latency_keeps_the_fixed_cost():
    # one SBUF -> SBUF transpose, nothing else: trigger-to-start (v2 fit: 0 ns on trn2)
    # + 712.35 ns
    est = estimate_trace(make_trace("trn2", transpose("sbuf2sbuf", 128, 128, outer=4)))
    assert est.latency_ns == pytest.approx(TRN2.dma_fixed_ns + 8192 / SB2)


@nki.jit
def _p_transpose(p_hbm):
    """P [128, 512] loaded to SBUF, then P^T per 128-key block by the DMA engines."""
    p_sb = nl.ndarray((128, 512), dtype=p_hbm.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=p_sb, src=p_hbm)
    pt = nl.ndarray((128, 4, 128), dtype=p_hbm.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=pt, src=p_sb.reshape((128, 4, 128)), axes=(2, 1, 0))
    out = nl.ndarray((128, 4, 128), dtype=p_hbm.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=pt)
    return out


def test_interpreted_transpose_is_priced_from_its_record():
    # the interpreter's record of an SBUF -> SBUF [128, 4, 128] bf16 transpose prices
    # exactly like the hand-built one above
    tr = trace_kernel(_p_transpose, TensorSpec((128, 512), "bfloat16"), target="trn2")
    ins = next(i for i in tr.instrs if i.opcode == "dma_transpose")
    assert ins.attrs["transpose"] == "sbuf2sbuf" and ins.attrs["transpose_inner"] == 128
    assert per_engine(ins, TRN2) == pytest.approx(8192 / SB2)
