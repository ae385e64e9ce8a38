"""Modeled latency of the serving op's kernels against the plain composition and AWS's
kernels (trn2, bands; cost model of this checkout).

    PYTHONPATH=. python benchmarks/bench_serving.py [--target trn2] [--nki-library PATH]
                                                    [--out benchmarks/data/serving_rows.json]
    PYTHONPATH=. python benchmarks/bench_serving.py --from-data     # the committed rows

One attention layer per case (Llama-3 8B: Hq 32, Hkv 8, D 128; GPT-OSS 20B: Hq 64,
Hkv 8, D 64), bf16 queries, 16-key blocks, LNC 1. Per case:

* ours: what `serving_attention` launches for the step, one launch writing the step's
  new K / V and attending: the decode-step kernel (`serving/decode_step.py`: write +
  the streamed decode body) for decode rows and drafts of <= 32 packed rows, the mixed
  kernel (write + decode body + segmented body) when prefill chunks come with them, the
  segmented kernel (`serving/segmented.py`) for prefill alone and fp8 caches;
* composition: the write alone (`cache_write_fwd`) + the same attention without the
  write, two launches (latencies summed);
* segmented: the segmented kernel for the same step (what decode steps ran before);
* AWS: nki-library's kernel for the case, through this project's harness, unmodified
  (a local checkout, `--nki-library`; commit recorded): `attention_tkg` (token
  generation; paged 16-key blocks, `qk_in_sb`, `use_pos_id`, s_active = queries per
  sequence, `start_pos_ids` for a window, `sink` [H, 1], its FP8 KV path for an fp8
  cache: every K / V operand float8_e4m3) one KV head per call x Hkv, and
  `attention_cte` with `k_prior` / `v_prior` / `prior_used_len` (its prefix caching over
  a contiguous prefix: it reads no block table) for prefill chunks, all heads in one call
  (batch = Hq, batch_kv = Hkv). AWS's kernels write no cache: "AWS + write" adds our
  `cache_write_fwd` (a separate launch, as vLLM-Neuron writes through `slot_mapping`).

Bands: each figure re-priced under every parameter set of the cost model (the trace
replayed), widened by the model's structural error (`bench.bands`); ratios pair the
same set on both sides (`ratio_band`). Every figure is modeled; none is a measurement.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nki_kernels.attention.decode_host import DecodeProblem, StreamConfig
from nki_kernels.attention.decode_stream import decode_stream_fwd
from nki_kernels.bench.bands import latency_band, parameter_sets, ratio_band
from nki_kernels.bench.peer import checkout_commit
from nki_kernels.interp import TensorSpec
from nki_kernels.perfmodel import COST_MODEL_VERSION, schedule, trace_kernel
from nki_kernels.perfmodel.estimate import modeled_label
from nki_kernels.runtime.buckets import bucket
from nki_kernels.runtime.config_store import lookup_config
from nki_kernels.serving.cache_write import cache_write_fwd
from nki_kernels.serving.decode_step import serving_decode_fwd, serving_mixed_fwd
from nki_kernels.serving.decode_step_host import decode_sequences, plan, stream_config
from nki_kernels.serving.host import CacheGeometry, key_step
from nki_kernels.serving.segmented import serving_attention_fwd

BS = 16
BF16 = "bfloat16"
FP8 = torch.float8_e4m3fn  # the fp8 rows' cache dtype (vLLM's)
OUT = Path(__file__).resolve().parent / "data" / "serving_rows.json"


@dataclass(frozen=True)
class Case:
    seqs: int  # sequences of `new` queries after `ctx` cached keys
    ctx: int
    new: int
    layout: str = "hnd"
    cache_dtype: str = BF16
    heads: tuple[int, int, int] = (32, 8, 128)  # Hq, Hkv, D
    window: int | None = None
    sinks: bool = False
    chunk: tuple[int, int] | None = None  # one more sequence: (cached, new) prefill chunk


LLAMA, GPT_OSS = (32, 8, 128), (64, 8, 64)
CASES = {
    "decode 8 x 1, 2K cached, vLLM layout (nhd)": Case(8, 2048, 1, "nhd"),
    "decode 8 x 1, 2K cached, vLLM-Neuron layout (hnd)": Case(8, 2048, 1),
    "decode 64 x 1, 2K cached, hnd": Case(64, 2048, 1),
    "decode 8 x 1, 2K cached, hnd, fp8 e4m3 cache": Case(8, 2048, 1, cache_dtype="float8_e4m3fn"),
    "speculative 8 x 4 drafts, 2K cached, hnd": Case(8, 2048, 4),
    "speculative 8 x 8 drafts, 2K cached, hnd": Case(8, 2048, 8),
    "speculative 8 x 16 drafts, 2K cached, hnd": Case(8, 2048, 16),
    "GPT-OSS decode 8 x 1, 2K cached, window 128 + sinks, hnd": Case(
        8, 2048, 1, heads=GPT_OSS, window=128, sinks=True
    ),
    "chunked prefill 1 x 256 after 1K prefix, hnd": Case(0, 0, 0, chunk=(1024, 256)),
    "mixed: 8 decode rows (2K) + 1 x 256 chunk after 1K, hnd": Case(8, 2048, 1, chunk=(1024, 256)),
}


def _seq_lists(c: Case) -> tuple[np.ndarray, np.ndarray]:
    ctx = [c.ctx] * c.seqs + ([c.chunk[0]] if c.chunk else [])
    new = [c.new] * c.seqs + ([c.chunk[1]] if c.chunk else [])
    return np.array(ctx, np.int64), np.array(new, np.int64)


def _geometry(c: Case) -> tuple[CacheGeometry, np.ndarray, TensorSpec]:
    """Each sequence's blocks consecutive in a pool with one spare block."""
    ctx, new = _seq_lists(c)
    need = -(-(ctx + new) // BS)
    width = int(need.max())
    table = np.zeros((len(ctx), width), np.int64)
    used = 0
    for s, n in enumerate(need):
        table[s, :n] = used + np.arange(n)
        used += int(n)
    _hq, hkv, d = c.heads
    geo = CacheGeometry(c.layout, used + 1, BS, hkv, d)
    shape = (used + 1, BS, hkv, d) if c.layout == "nhd" else (used + 1, hkv, BS, d)
    return geo, table, TensorSpec(shape, c.cache_dtype)


def _new_rows(c: Case) -> tuple[TensorSpec, TensorSpec]:
    _ctx, new = _seq_lists(c)
    t = int(new.sum())
    return TensorSpec((t, c.heads[1] * c.heads[2]), BF16), TensorSpec((t, 1), "int32")


def _decode_mask(c: Case) -> np.ndarray:
    ctx, new = _seq_lists(c)
    return decode_sequences(new, ctx, c.heads[0] // c.heads[1], c.window)


def decode_step_args(c: Case, write: bool) -> tuple[Any, ...]:
    """`serving_decode_fwd`'s arguments for the case's decode sequences, planned as the
    op plans them."""
    hq, hkv, d = c.heads
    ctx, new = _seq_lists(c)
    dec = _decode_mask(c)
    geo, table, cache = _geometry(c)
    qsl = np.concatenate([[0], np.cumsum(new)])
    sq, longest = int(new[dec].max()), int((ctx + new)[dec].max())
    problem = DecodeProblem(1, hq, hkv, sq, bucket(longest), d, BF16, "contiguous")
    cfg = lookup_config("decode_attention", problem, decode_stream_fwd, target="trn2",
                        config_cls=StreamConfig, lnc=1)  # fmt: skip
    assert isinstance(cfg, StreamConfig)
    cfg = stream_config(cfg, FP8 if c.cache_dtype.startswith("float8") else torch.bfloat16)
    p = plan(qsl, ctx, table, geo, hq, 2, c.window, cfg, 1, dec).stream
    rows, wrows = _new_rows(c)
    arrays = [TensorSpec(a.shape, str(a.dtype)) for a in (p.idx, p.kpos, p.tail_idx,
                                                          p.tail_kpos, p.hi, p.full)]  # fmt: skip
    q = TensorSpec((int(dec.sum()), hq, sq, d), BF16)
    w = (rows, rows, cache, cache, wrows) if write else (None, None, cache, cache, None)
    if not c.cache_dtype.startswith("float8"):
        return (q, *w, *arrays, 1.0 / math.sqrt(d), *p.static_args())
    # fp8: softmax_scale * k_scale multiplies K (the body's softmax scale 1), v_scale
    # each column's output; the write quantizes with the [Hkv, 4] scales
    fp8 = (TensorSpec((hkv, 4), "float32"), 448.0, TensorSpec((1, hkv), "float32"),
           TensorSpec(p.hi.shape, "float32"))  # fmt: skip
    return (q, *w, *arrays, 1.0, *p.static_args(), *fp8)


def segmented_args(c: Case, write: bool, only: np.ndarray | None = None) -> tuple[Any, ...]:
    """`serving_attention_fwd`'s arguments for the case (the host plan's shapes), over
    the sequences of `only` (default: all)."""
    hq, hkv, d = c.heads
    ctx, new = _seq_lists(c)
    if only is not None:
        ctx, new = ctx[only], new[only]
    _geo, _table, cache = _geometry(c)
    group = hq // hkv
    tq = max(1, min(128 // group, int(new.max())))
    items = int(sum(-(-int(n) // tq) for n in new))
    longest = int((ctx + new).max())
    kv_tile = key_step(longest)
    steps = -(-longest // kv_tile)
    row_bytes = d * (1 if c.cache_dtype.startswith("float8") else 2)
    grouped = kv_tile == 512 and BS % 4 == 0 and row_bytes % 4 == 0  # as step_key_tiles
    rows, wrows = _new_rows(c)
    krows = TensorSpec((items, steps, 128, 1 if grouped else kv_tile // 128), "int32")
    kmask = TensorSpec((items, steps, 128, 4), "int32") if grouped else None
    fp8 = 448.0 if c.cache_dtype.startswith("float8") else 0.0
    w = (rows, rows, cache, cache, wrows) if write else (None, None, cache, cache, None)
    return (TensorSpec((items, hkv, d, group * tq), BF16), *w, krows, kmask,
            TensorSpec((items, hkv, 128, 4), "float32"), TensorSpec((hkv, 4), "float32"),
            c.layout, steps, kv_tile, fp8)  # fmt: skip


def mixed_args(c: Case, write: bool) -> tuple[Any, ...]:
    """`serving_mixed_fwd`'s arguments: the decode body's, then the segmented body's
    (q_t, key_rows, key_mask, rowinfo, scales, n_steps, kv_tile) over the rest."""
    rest = ~_decode_mask(c)
    seg = segmented_args(c, False, rest)
    dec = decode_step_args(c, write)
    if not c.cache_dtype.startswith("float8"):
        return (*dec, seg[0], *seg[6:10], *seg[11:13])
    # fp8: the [Hkv, 4] scales serve the write and the segmented body
    return (*dec[:21], seg[0], *seg[6:10], *seg[11:13], *dec[22:])


def write_args(c: Case) -> tuple[Any, ...]:
    _geo, _table, cache = _geometry(c)
    rows, wrows = _new_rows(c)
    fp8 = 448.0 if c.cache_dtype.startswith("float8") else 0.0
    return (rows, rows, cache, cache, wrows, TensorSpec((c.heads[1], 4), "float32"), c.layout,
            fp8)  # fmt: skip


def samples(kernel: Any, args: tuple[Any, ...], target: str, lnc: int = 1) -> list[float]:
    """The launch's modeled latency (us) under each parameter set (shipped set first)."""
    trace = trace_kernel(kernel, *args, target=target, lnc=lnc)
    return [schedule(trace, s).latency_ns / 1e3 for s in parameter_sets(target)]


# ---- AWS's kernels through our harness (a local nki-library checkout) ----


def aws_tkg_harness(checkout: str) -> tuple[Any, Any]:
    """A thin `@nki.jit` caller of nki-library's `attention_tkg` (unmodified): Q and the
    active K staged into SBUF (its block-cache mode requires `qk_in_sb`), out in HBM."""
    from nki_kernels.conformance import loader
    from nki_kernels.nki import nisa, nl

    tkg = loader.load_module(checkout, "nkilib.core.attention.attention_tkg")
    alloc = loader.load_module(checkout, "nkilib.core.utils.allocator")
    logging = loader.load_module(checkout, "nkilib.core.utils.logging")

    def harness(q, k_active, v_active, k_prior, v_prior, mask, pos, start, sink, table, cfg):  # type: ignore[no-untyped-def]
        sbm = alloc.SbufManager(0, nl.tile_size.total_available_sbuf_size - 16 * 1024,
                                logging.Logger("SBM", logging.LogLevel.WARN))  # fmt: skip
        sbm.open_scope()
        out = nl.ndarray((cfg.bs, cfg.q_head, cfg.d_head, cfg.s_active), dtype=q.dtype,
                         buffer=nl.shared_hbm)  # fmt: skip
        q_sb = sbm.alloc_stack(q.shape, dtype=q.dtype, buffer=nl.sbuf)
        k_sb = sbm.alloc_stack(k_active.shape, dtype=k_active.dtype, buffer=nl.sbuf)
        nisa.dma_copy(q_sb, q)
        nisa.dma_copy(k_sb, k_active)
        tkg.attention_tkg(q_sb, k_sb, v_active, k_prior, v_prior, mask, out, cfg, sbm, None,
                          pos, start, sink, table, None)  # fmt: skip
        sbm.close_scope()
        return out

    return loader.jit(harness), tkg


def aws_tkg(checkout: str, c: Case, target: str) -> list[float]:
    """attention_tkg for the case's decode / draft sequences: one KV head per call x Hkv."""
    from nki_kernels.conformance import loader

    kernel, tkg = aws_tkg_harness(checkout)
    hq, hkv, d = c.heads
    h, b, sa, s = hq // hkv, c.seqs, c.new, c.ctx
    cfg = tkg.AttnTKGConfig(bs=b, q_head=h, s_active=sa, curr_sprior=s, full_sprior=s, d_head=d,
                            block_len=BS, tp_k_prior=True, use_pos_id=True, fuse_rope=False,
                            qk_in_sb=True, strided_mm1=False)  # fmt: skip
    # an fp8 cache: its FP8 KV path (every K / V operand float8_e4m3, trn2's e4m3)
    kdt = "float8_e4m3" if c.cache_dtype.startswith("float8") else BF16
    kv = TensorSpec((b * (s // BS), BS, d), kdt)
    args = (TensorSpec((d, b * h * sa), BF16), TensorSpec((d, b * sa), kdt),
            TensorSpec((b, 1, sa, d), kdt), kv, kv, TensorSpec((sa, b, h, sa), "uint8"),
            TensorSpec((b, sa), "float32"),
            TensorSpec((b, sa), "float32") if c.window else None,
            TensorSpec((h, 1), "float32") if c.sinks else None,
            TensorSpec((b, s // BS), "uint32"), cfg)  # fmt: skip
    with loader.mapped_nki():
        one = samples(kernel, args, target)
    return [x * hkv for x in one]


def aws_cte(checkout: str, c: Case, target: str) -> list[float]:
    """attention_cte with prefix caching for the case's prefill chunk, all heads at once."""
    from nki_kernels.conformance import loader

    assert c.chunk is not None
    hq, hkv, d = c.heads
    prior, n = c.chunk
    mod = loader.load_module(checkout, "nkilib.core.attention.attention_cte")
    fn = mod.attention_cte
    kernel = fn if hasattr(fn, "fn") else loader.jit(fn)
    args = (TensorSpec((hq, n, d), BF16), TensorSpec((hkv, d, n), BF16),
            TensorSpec((hkv, n, d), BF16))  # fmt: skip
    kw = {"scale": 1.0, "causal_mask": True, "k_prior": TensorSpec((hkv, d, prior), BF16),
          "v_prior": TensorSpec((hkv, prior, d), BF16),
          "prior_used_len": TensorSpec((1,), "int32"), "tp_q": True, "tp_k": False}  # fmt: skip
    with loader.mapped_nki():
        trace = trace_kernel(kernel, *args, target=target, **kw)
    return [schedule(trace, s).latency_ns / 1e3 for s in parameter_sets(target)]


def aws_samples(checkout: str | None, c: Case, target: str) -> tuple[list[float] | None, str]:
    """(AWS's latency samples, what was priced) or (None, why not)."""
    if checkout is None:
        return None, "no nki-library checkout given"
    if c.cache_dtype != BF16 and c.chunk:
        return None, "not priced: attention_cte reads no fp8 prefix"
    parts, what = [], []
    try:
        if c.seqs:
            parts.append(aws_tkg(checkout, c, target))
            what.append(f"attention_tkg x {c.heads[1]}")
        if c.chunk:
            parts.append(aws_cte(checkout, c, target))
            what.append("attention_cte (prefix)")
    except Exception as e:  # the reason goes into the row
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return [sum(x) for x in zip(*parts, strict=True)], " + ".join(what)


def price(case: str, target: str, checkout: str | None) -> dict[str, Any]:
    c = CASES[case]
    dec = _decode_mask(c)
    seg_fused = samples(serving_attention_fwd, segmented_args(c, True), target)
    if dec.all():
        path = "decode step"
        ours = samples(serving_decode_fwd, decode_step_args(c, True), target)
        attend = samples(serving_decode_fwd, decode_step_args(c, False), target)
    elif dec.any():
        path = "mixed (decode + segmented bodies)"
        ours = samples(serving_mixed_fwd, mixed_args(c, True), target)
        attend = samples(serving_mixed_fwd, mixed_args(c, False), target)
    else:
        path = "segmented"
        ours = seg_fused
        attend = samples(serving_attention_fwd, segmented_args(c, False), target)
    write = samples(cache_write_fwd, write_args(c), target)
    aws, what = aws_samples(checkout, c, target)
    row: dict[str, Any] = {
        "case": case,
        "path": path,
        "ours_us": ours,
        "write_us": write,
        "composition_us": [a + w for a, w in zip(attend, write, strict=True)],
        "segmented_us": seg_fused,
        "aws_us": aws,
        "aws_kernel": what,
    }
    if aws is not None:
        row["aws_write_us"] = [a + w for a, w in zip(aws, write, strict=True)]
    return row


def _fmt(v: list[float] | None, target: str) -> str:
    if v is None:
        return "-"
    lo, hi = latency_band(v, target)
    return f"{v[0]:.1f} [{lo:.1f}, {hi:.1f}]"


def _ratio(ours: list[float], other: list[float] | None, target: str) -> str:
    if other is None:
        return "-"
    lo, hi = ratio_band(ours, other, target)
    return f"x{other[0] / ours[0]:.2f} [{lo:.2f}, {hi:.2f}]"


def table(rows: list[dict[str, Any]], target: str) -> str:
    lines = [
        "| case | path | ours: write + attend, 1 launch (us) | write, then attend: 2 launches "
        "(us) | segmented kernel, 1 launch (us) | AWS kernel, no write (us) | AWS + our write, "
        "2 launches (us) | (AWS + write) / ours |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        aws = _fmt(r["aws_us"], target)
        if r["aws_us"] is not None:
            aws += f" ({r['aws_kernel']})"
        lines.append(
            f"| {r['case']} | {r['path']} | {_fmt(r['ours_us'], target)} | "
            f"{_fmt(r['composition_us'], target)} | {_fmt(r['segmented_us'], target)} | {aws} | "
            f"{_fmt(r.get('aws_write_us'), target)} | "
            f"{_ratio(r['ours_us'], r.get('aws_write_us'), target)} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="trn2")
    ap.add_argument("--nki-library", default=None, help="a local aws-neuron/nki-library checkout")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--case", action="append", help="price only these cases (substring)")
    ap.add_argument("--from-data", action="store_true", help="print the table of --out's rows")
    args = ap.parse_args()
    if args.from_data:
        data = json.loads(Path(args.out).read_text())
        print(f"{data['label']}; nki-library {data['nki_library_commit']}; {data['date']}")
        print(table(data["rows"], data["target"]))
        return
    names = [n for n in CASES if not args.case or any(s in n for s in args.case)]
    rows = []
    for name in names:
        t0 = time.perf_counter()
        rows.append(price(name, args.target, args.nki_library))
        print(f"  {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    label = modeled_label(args.target)
    print(f"{label}; band over {len(parameter_sets(args.target))} parameter sets, widened by "
          "the structural error; LNC 1")  # fmt: skip
    print(table(rows, args.target))
    data = {
        "cost_model": COST_MODEL_VERSION,
        "target": args.target,
        "label": label,
        "nki_library_commit": checkout_commit(Path(args.nki_library)) if args.nki_library else None,
        "date": time.strftime("%Y-%m-%d"),
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
