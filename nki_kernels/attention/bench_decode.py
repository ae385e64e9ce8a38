"""Modeled decode benchmarks: the streamed kernel, the per-program kernel and nki-library's
attention_tkg on one table (benchmarks/bench_decode.py).

Every figure is "modeled (cost model vN, target)": a trace-only interpretation of one
launch scheduled by the cost model, with its band (the same trace scheduled under each of
the cost model's parameter sets, `perfmodel.band`). Cases: Llama-3 shapes with 8 KV
heads, D = 128, bf16, Sq = 1, every sequence `cache` keys long, batch 1 / 8 / 64, cache
2 K / 32 K / 128 K, contiguous ([B, Hkv, S, D]) or paged (vLLM's [blocks, 16, Hkv, D]);
GQA 4 : 1 (Llama-3 8B, 32 query heads) or 8 : 1 (Llama-3 70B's 64 query heads over 8 KV
heads); LNC 1 or 2.

- "ours (streamed)": `decode_stream_fwd`, the op's kernel, priced as one launch of the
  whole batch with the config the op looks up;
- "ours (per program)": `decode_attention_fwd`, the previous kernel with its heuristic
  config, one (sequence, KV head) program priced and multiplied by the programs each
  core runs (B * 8, halved at LNC 2 where the programs are shared out);
- "nki-library attention_tkg": `bench.peer_decode` (one KV head for the whole batch per
  launch, x 8), at LNC 2 as `kernel[2]` (its own batch / sequence sharding).

MBU counts the K / V bytes of the lengths against the modeled HBM bandwidth of the cores
in use (LNC x per-core bandwidth).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..targets import get_target
from .decode import decode_attention_fwd
from .decode_host import DecodeConfig, DecodeProblem, StreamConfig, kernel_args, stream_kernel_args
from .decode_stream import decode_stream_fwd

KV_HEADS, D = 8, 128
BATCHES = (1, 8, 64)
CACHES = (2048, 32768, 131072)
STREAMED, PER_PROGRAM, AWS_TKG = (
    "ours (streamed)",
    "ours (per program)",
    "nki-library attention_tkg",
)


@dataclass(frozen=True)
class Row:
    target: str
    method: str
    group: int  # query heads per KV head
    lnc: int
    batch: int
    cache: int
    paged: bool
    latency_us: float
    band_us: tuple[float, float]
    mbu: float
    label: str
    config: str = "-"
    note: str = ""
    # latency (us) under each of the cost model's parameter sets, shipped set first: a
    # speedup's band pairs the same set on both sides (`bench.bands.ratio_band`)
    samples_us: tuple[float, ...] = ()


def kv_bytes(batch: int, cache: int) -> float:
    return 2.0 * batch * KV_HEADS * cache * D * 2  # K and V, bf16


def _priced(
    kernel: Any, args: tuple[Any, ...], target: str, lnc: int
) -> tuple[float, tuple[float, float], str, int, tuple[float, ...]]:
    """(latency ns, band ns, label, instructions, per-set latencies in us): the band is
    the range over the parameter sets widened by the structural error
    (`bench.bands.latency_band`)."""
    from ..bench.bands import latency_band, parameter_sets
    from ..perfmodel import estimate_trace, schedule, trace_kernel

    trace = trace_kernel(kernel, *args, target=target, lnc=lnc)
    est = estimate_trace(trace, target)
    samples = tuple(schedule(trace, p).latency_ns for p in parameter_sets(target))
    lo, hi = latency_band(samples, target)
    n = len(trace)
    del trace
    return est.latency_ns, (lo, hi), est.label, n, tuple(x / 1e3 for x in samples)


def _problem(group: int, batch: int, cache: int, paged: bool) -> DecodeProblem:
    layout = "paged" if paged else "contiguous"
    return DecodeProblem(batch, group * KV_HEADS, KV_HEADS, 1, cache, D, "bfloat16", layout)


def streamed_row(
    group: int, batch: int, cache: int, paged: bool, lnc: int = 1, target: str = "trn2"
) -> Row:
    """The op's kernel on one launch of the whole batch."""
    from ..runtime.buckets import bucket
    from ..runtime.config_store import lookup_config

    tgt = get_target(target)
    key = _problem(group, 1, bucket(cache), paged)  # the op's key: layout, batch 1, LNC
    cfg = lookup_config("decode_attention", key, decode_stream_fwd, target=tgt,
                        config_cls=StreamConfig, lnc=lnc)  # fmt: skip
    assert isinstance(cfg, StreamConfig)
    args = stream_kernel_args(_problem(group, batch, cache, paged), cfg, lnc=lnc)
    ns, (lo, hi), label, n, samples = _priced(decode_stream_fwd, args, target, lnc)
    mbu = kv_bytes(batch, cache) / (ns * tgt.hbm_bytes_per_ns * lnc)
    return Row(tgt.name, STREAMED, group, lnc, batch, cache, paged, ns / 1e3,
               (lo / 1e3, hi / 1e3), mbu, label, cfg.key(), f"{n} instructions",
               samples)  # fmt: skip


def per_program_rows(
    group: int, cache: int, paged: bool, batches: tuple[int, ...], lnc: int = 1,
    target: str = "trn2",
) -> list[Row]:  # fmt: skip
    """The per-program kernel: one (sequence, KV head) program x the programs per core."""
    from ..runtime.buckets import bucket

    tgt = get_target(target)
    key = _problem(group, 1, bucket(cache), paged)
    cfg = DecodeConfig.heuristic(key, tgt)
    unit = DecodeProblem(1, group, 1, 1, cache, D, "bfloat16", key.layout)
    ns, (lo, hi), label, n, samples = _priced(
        decode_attention_fwd,
        kernel_args(unit, cfg),  # type: ignore[arg-type]
        target,
        1,
    )
    rows = []
    for b in batches:
        k = math.ceil(b * KV_HEADS / lnc) / 1e3
        lat = ns * k
        mbu = kv_bytes(b, cache) / (lat * 1e3 * tgt.hbm_bytes_per_ns * lnc)
        rows.append(Row(tgt.name, PER_PROGRAM, group, lnc, b, cache, paged, lat,
                        (lo * k, hi * k), mbu, label, cfg.key(),
                        f"{n} instructions x {b * KV_HEADS // lnc}",
                        tuple(x * k * 1e3 for x in samples)))  # fmt: skip
    return rows


def aws_row(
    checkout: str, group: int, batch: int, cache: int, paged: bool, lnc: int = 1,
    target: str = "trn2",
) -> Row:  # fmt: skip
    """nki-library's attention_tkg through `bench.peer_decode` (x 8 KV heads)."""
    from ..bench.peer_decode import price_tkg

    tgt = get_target(target)
    r = price_tkg(checkout, batch, cache, paged, target, group=group, lnc=lnc)
    if r["latency_us"] is None:
        nan = float("nan")
        return Row(tgt.name, AWS_TKG, group, lnc, batch, cache, paged, nan, (nan, nan), nan,
                   "not priced", note=r["error"])  # fmt: skip
    lat = r["latency_us"] * KV_HEADS
    lo, hi = (x * KV_HEADS for x in r["band_us"])
    note = f"nki-library {r['nki_library_commit']}, {r['instructions']} instructions x 8"
    return Row(tgt.name, AWS_TKG, group, lnc, batch, cache, paged, lat, (lo, hi),
               kv_bytes(batch, cache) / (lat * 1e3 * tgt.hbm_bytes_per_ns * lnc), r["label"],
               note=note, samples_us=tuple(x * KV_HEADS for x in r["samples_us"]))  # fmt: skip


def rows_as_dicts(rows: list[Row]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]


__all__ = [
    "AWS_TKG",
    "BATCHES",
    "CACHES",
    "PER_PROGRAM",
    "STREAMED",
    "Row",
    "aws_row",
    "kv_bytes",
    "per_program_rows",
    "rows_as_dicts",
    "streamed_row",
]
