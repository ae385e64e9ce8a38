"""Modeled performance of the flash-attention kernels (used by benchmarks/bench_attention.py).

`attention_rows()` prices the forward and backward kernels with the cost model
(trace-only interpretation + timeline) for a model shape (default Llama-3 8B attention:
32 query heads, 8 key/value heads, D = 128, bf16, B = 1) on trn2 / trn3, causal and not,
and returns one row per case: modeled latency, MFU counting only the FLOPs of allowed
(query, key) pairs, the busiest engine and the roofline bound. Every figure is labeled
"modeled (cost model vN, target)" -- none is a measurement.

Pricing method. The kernels run one program per (batch, kv-head) pair, one pair after the
other, each with identical work (masks here depend only on shapes). When the full trace
would be longer than `max_instructions`, one pair is priced and its latency multiplied
by the number of pairs. That is an upper bound of the full trace's latency: in the full
trace the next pair's K/V staging overlaps the previous pair's tail and TensorE starts
warm (`pricing_check()` measures the gap where both fit; rows say which method was used).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from ..interp import TensorSpec
from ..model_shapes import LLAMA3_8B_ATTN, AttentionShape
from ..targets import get_target
from . import masks
from ._bwd_plan import bwd_row_order, mark_diagonal
from .config import AttentionProblem, FlashBwdConfig, FlashFwdConfig, with_kv_overlap

DEFAULT_SEQS = (2048, 8192, 32768)
DEFAULT_TARGETS = ("trn2", "trn3")
MAX_INSTRUCTIONS = 400_000  # full traces up to this size; above it, one pair x pairs
# instructions per (query tile, 512 keys) unit, for choosing the pricing method up front
_INSTR_PER_UNIT = {"fwd": 12, "bwd": 30}


@dataclass(frozen=True)
class Row:
    """One modeled benchmark case."""

    op: str  # "fwd" | "bwd"
    model: str
    target: str
    seq: int
    causal: bool
    batch: int
    q_heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    latency_us: float
    mfu: float  # useful (unmasked) FLOPs / (TensorE peak x latency)
    busiest: str  # engine with the most busy time
    bound_by: str  # roofline resource
    tensor_active: float
    vector_active: float
    scalar_active: float
    pricing: str  # "full trace" | "1 of N pairs x N"
    instructions: int
    price_seconds: float
    config: str
    label: str
    timestamp: str
    # the latency's band over the cost model's parameter sets (perfmodel.band); None
    # when priced without bands
    latency_lo_us: float | None = None
    latency_hi_us: float | None = None

    def latency_band(self) -> tuple[float, float] | None:
        """(low, high) latency in us, the low end no lower than the time TensorE needs at
        its peak for the counted FLOPs (rows priced before `perfmodel.band` stopped at
        the roofline could widen past it)."""
        if self.latency_lo_us is None or self.latency_hi_us is None:
            return None
        return max(self.latency_lo_us, self.mfu * self.latency_us), self.latency_hi_us

    def mfu_band(self) -> tuple[float, float] | None:
        """(low, high) MFU over the band (MFU falls as latency grows; at most 100 %)."""
        lat = self.latency_band()
        if lat is None:
            return None
        scale = self.mfu * self.latency_us
        return scale / lat[1], scale / lat[0]


def useful_flops(
    op: str, seq_q: int, seq_k: int, d: int, heads: int, batch: int, causal: bool
) -> float:
    """Matmul FLOPs of the allowed (query, key) pairs: 4 D per pair forward (QK^T, PV),
    10 D backward (S, dP, dV, dK, dQ)."""
    if causal:
        lo, hi = masks.query_bounds(1, seq_q, seq_k, causal=True)
        pairs = float((hi - lo).sum())
    else:
        pairs = float(seq_q) * seq_k
    per_pair = 4 * d if op == "fwd" else 10 * d
    return per_pair * pairs * heads * batch


def _specs(
    op: str,
    seq: int,
    shape: AttentionShape,
    batch: int,
    heads_q: int,
    heads_kv: int,
    dtype: str,
    causal: bool,
    config: Any,
) -> tuple[Any, tuple[Any, ...]]:
    d = shape.head_dim
    q = TensorSpec((batch, heads_q, seq, d), dtype)
    kv = TensorSpec((batch, heads_kv, seq, d), dtype)
    plan: Any = ()
    bounds = None
    if causal:
        lo, hi = masks.query_bounds(1, seq, seq, causal=True)
        if op == "bwd":  # the backward's tiles are its own row order (_bwd_plan)
            perm = bwd_row_order(seq)
            lo, hi = lo[:, perm], hi[:, perm]
        classes = masks.classify_tiles(lo, hi, seq)
        if op == "bwd":
            mark_diagonal(classes, lo, hi, seq)
        plan = masks.tile_plan(classes)
        bounds = TensorSpec((batch, 128, 2, -(-seq // 128)), "float32")
    c = config.to_dict()
    args: tuple[Any, ...]
    if op == "fwd":
        from .flash_fwd import flash_attention_fwd

        args = (
            q,
            kv,
            kv,
            bounds,
            d**-0.5,
            plan,
            c["kv_tile"],
            c["q_tiles"],
            c["dma_quarters"],
            c["scalar_evac"],
            c["kv_buffers"],
        )
        return flash_attention_fwd, args
    from .flash_bwd import flash_attention_bwd

    lse = TensorSpec((batch, heads_q, 128, -(-seq // 128)), "float32")
    args = (
        q,
        kv,
        kv,
        q,
        q,
        lse,
        None,
        bounds,
        d**-0.5,
        plan,
        c["section"],
        c["dma_quarters"],
        c["scalar_evac"],
    )
    return flash_attention_bwd, args


def price(
    op: str,
    seq: int,
    target: str,
    causal: bool,
    shape: AttentionShape = LLAMA3_8B_ATTN,
    batch: int = 1,
    dtype: str = "bfloat16",
    max_instructions: int = MAX_INSTRUCTIONS,
    config: Any = None,
    force: str | None = None,
    lnc: int = 1,
    bands: bool = False,
) -> Row:
    """Model one case; see the module docstring for the pricing method. `lnc` 2: launched
    as kernel[2] (both programs traced, each on its own physical core, one kv head each
    per launch); the latency is the logical core's. `bands`: also price the latency's
    band (the same trace scheduled under each of the cost model's parameter sets)."""
    from ..perfmodel import estimate_trace, modeled_label, trace_kernel
    from ..perfmodel.band import band
    from ..perfmodel.compiled import reuse_compiled

    tgt = get_target(target)
    problem = AttentionProblem(
        seq,
        seq,
        shape.head_dim,
        shape.num_heads,
        shape.num_kv_heads,
        batch,
        dtype,
        "causal" if causal else "none",
    )
    cls = FlashFwdConfig if op == "fwd" else FlashBwdConfig
    cfg = config if config is not None else cls.heuristic(problem, tgt)
    if isinstance(cfg, FlashFwdConfig) and config is None:
        cfg = with_kv_overlap(cfg, problem, tgt)  # as the op launches it
    pairs = batch * shape.num_kv_heads
    units = (seq // 128) * (seq // 512) * shape.num_heads * batch * (0.5 if causal else 1.0)
    full = units * _INSTR_PER_UNIT[op] <= max_instructions
    if force is not None:
        full = force == "full"
    t0 = time.perf_counter()
    if full:
        kernel, args = _specs(
            op, seq, shape, batch, shape.num_heads, shape.num_kv_heads, dtype, causal, cfg
        )
        mult = 1
    else:
        group = shape.num_heads // shape.num_kv_heads
        unit = lnc if pairs % lnc == 0 else 1  # one (batch, kv head) pair per program
        kernel, args = _specs(op, seq, shape, 1, group * unit, unit, dtype, causal, cfg)
        mult = pairs // unit
    trace = trace_kernel(kernel, *args, target=tgt, lnc=lnc)
    with reuse_compiled():  # the estimate and the band share one compiled trace
        est = estimate_trace(trace, tgt)
        lo_ns, hi_ns = band(trace, tgt) if bands else (None, None)
    elapsed = time.perf_counter() - t0
    latency = est.latency_ns * mult
    flops = useful_flops(op, seq, seq, shape.head_dim, shape.num_heads, batch, causal)
    act = est.active_pct
    return Row(
        op=op,
        model=shape.model,
        target=tgt.name,
        seq=seq,
        causal=causal,
        batch=batch,
        q_heads=shape.num_heads,
        kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        dtype=dtype,
        latency_us=latency / 1e3,
        mfu=flops / (latency * tgt.tensor_peak_flops_per_ns),
        busiest=est.bottleneck,
        bound_by=est.bound_by,
        tensor_active=act.get("tensor", 0.0),
        vector_active=act.get("vector", 0.0),
        scalar_active=act.get("scalar", 0.0),
        pricing=("full trace" if mult == 1 else f"{pairs // mult} of {pairs} pairs x {mult}")
        + (f", kernel[{lnc}]" if lnc > 1 else ""),
        instructions=len(trace),
        price_seconds=elapsed,
        config=cfg.key(),
        label=modeled_label(tgt.name, est.model_version),
        timestamp=datetime.now(UTC).isoformat(timespec="seconds"),
        latency_lo_us=None if lo_ns is None else lo_ns * mult / 1e3,
        latency_hi_us=None if hi_ns is None else hi_ns * mult / 1e3,
    )


def attention_rows(
    seqs: tuple[int, ...] = DEFAULT_SEQS,
    targets: tuple[str, ...] = DEFAULT_TARGETS,
    ops: tuple[str, ...] = ("fwd", "bwd"),
    causal: tuple[bool, ...] = (False, True),
    shape: AttentionShape = LLAMA3_8B_ATTN,
    max_instructions: int = MAX_INSTRUCTIONS,
    bands: bool = False,
) -> list[Row]:
    """Every (target, op, seq, causal) case as a `Row` (with `bands`: each with its band)."""
    return [
        price(op, s, t, c, shape=shape, max_instructions=max_instructions, bands=bands)
        for t in targets
        for op in ops
        for s in seqs
        for c in causal
    ]


def format_table(rows: list[Row]) -> str:
    """A plain-text table of rows (every figure labeled modeled)."""
    head = (
        f"{'target':6s} {'op':3s} {'seq':>6s} {'causal':>6s} {'latency us':>11s} {'MFU %':>6s} "
        f"{'busiest':>8s} {'PE %':>5s} {'DVE %':>5s} {'ACT %':>5s}  pricing"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r.target:6s} {r.op:3s} {r.seq:6d} {r.causal!s:>6s} {r.latency_us:11.1f} "
            f"{100 * r.mfu:6.1f} {r.busiest:>8s} {r.tensor_active:5.0f} {r.vector_active:5.0f} "
            f"{r.scalar_active:5.0f}  {r.pricing}"
        )
        mb, lb = r.mfu_band(), r.latency_band()
        if mb is not None and lb is not None:
            lines.append(
                f"{'':6s} {'':3s} {'':6s} {'band':>6s} "
                f"{lb[0]:.1f}-{lb[1]:.1f} us, MFU {100 * mb[0]:.1f}-{100 * mb[1]:.1f} %"
            )
    labels = sorted({r.label for r in rows})
    lines.append(
        f"All figures {', '.join(labels)}; {rows[0].model if rows else ''} attention "
        "(B=1, bf16, D=128); MFU counts only unmasked FLOPs."
    )
    return "\n".join(lines)


def markdown_table(rows: list[Row]) -> str:
    """The rows as the README's markdown table: latency and MFU with their bands."""
    from ..bench.bands import ceiling_label
    from ..perfmodel.band import format_band

    lines = [
        "| target | op | S | causal | modeled latency (ms) | MFU % | busiest |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lat = f"{r.latency_us / 1e3:.2f}"
        mfu = f"{100 * r.mfu:.1f}"
        mb, lb = r.mfu_band(), r.latency_band()
        if mb is not None and lb is not None:
            lat = format_band(r.latency_us / 1e3, lb[0] / 1e3, lb[1] / 1e3, "", 2)
            mfu = format_band(100 * r.mfu, 100 * mb[0], 100 * mb[1], "", 1)
        # an MFU above the best published attention measurement is a ceiling of the model
        mfu = ceiling_label(mfu, "flash_attention", r.mfu)
        causal = "yes" if r.causal else "no"
        lines.append(f"| {r.target} | {r.op} | {r.seq} | {causal} | {lat} | {mfu} | {r.busiest} |")
    return "\n".join(lines)


def pricing_check(seq: int = 2048, target: str = "trn2", causal: bool = False) -> dict[str, float]:
    """Full-trace vs one-pair x pairs latency for both kernels (the method's error)."""
    out = {}
    for op in ("fwd", "bwd"):
        full = price(op, seq, target, causal, force="full")
        one = price(op, seq, target, causal, force="pair")
        out[op] = one.latency_us / full.latency_us - 1.0
    return out


def rows_as_dicts(rows: list[Row]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]


__all__ = [
    "DEFAULT_SEQS",
    "DEFAULT_TARGETS",
    "Row",
    "attention_rows",
    "format_table",
    "markdown_table",
    "price",
    "pricing_check",
    "rows_as_dicts",
    "useful_flops",
]
