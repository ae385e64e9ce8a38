"""Trainium figures of one op, per logical core: ours, TorchNeuron's native path, AWS's kernel.

Every figure is modeled (cost model, target, band over its parameter sets) and comes from
the committed op-level rows where the case is one of theirs, else from the ledger cache,
else is priced now (`store.RowStore`). What each implementation is:

- `ours`: this library's kernel for attention, decode attention, the fused norms and the
  MoE layer; the matmuls and the SwiGLU product are left to the compiler, priced as the
  native path runs them (`baselines.steps`), the same figure in both columns.
- `native`: TorchNeuron for the plain PyTorch code (`baselines.native`): SDPA is AWS's
  flash kernel on its route (S a multiple of 512, so `aws` and `native` are one figure),
  the S x S composition off it and at decode (Sq = 1); norms one fused pass (backward two);
  dropless MoE the faster of NxD blockwise and `_grouped_mm` (backward: `native_moe`;
  at decode under LNC 2 also the faster of splitting the tokens or the expert weights
  across the cores: `native_moe_decode`).
- `aws`: AWS's nki-library kernel where one exists for the op (flash attention, decode
  `attention_tkg`, RMSNorm); these come only from committed rows (pricing them needs an
  nki-library checkout), carried to other shapes by scaling, each scaling named.

LNC 2 (a logical core of two physical cores): our kernels as kernel[2] (committed rows, or
priced so); compositions as two cores each running half of the work, as the op-level
benchmark does (`bench.compare.LNC2_METHOD`), and native's decode MoE also as the weight
split (above). Our MoE layer is the exception: its forward
is the committed kernel[2] row where the case is one; any other forward, and every
backward, is priced like a composition, two cores each routing half of the tokens through
the LNC 1 kernels (kernel[2] of the MoE forward takes minutes to trace).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import replace
from typing import Any

from ..baselines import moe_native, native, steps
from ..interp import TensorSpec
from .figure import Figure
from .layers import Op
from .models import ModelSpec
from .store import RowStore, current_version, figure_of, structural_pct_of, version_of

BF16 = "bfloat16"
LLAMA_GROUP = (32, 8)  # heads of the committed attention rows (Llama-3 8B)


def _half(n: int, lnc: int) -> int:
    return -(-n // lnc)


def _committed(
    store: RowStore, family: str, op: str, case: str, target: str, lnc: int, impl: str
) -> Figure | None:
    """The committed row of this exact case, if it is of the current cost-model version."""
    r = store.op_row(family, op, case, target, lnc, impl)
    if r is None or version_of(r.provenance) != current_version():
        return None
    return figure_of(r, f"committed row: {impl} {op} {case} LNC {lnc}")


def _steps_us(build: Any) -> Any:
    """price(target) -> us of a native composition built by `build()`."""

    def price(tgt: Any) -> float:
        return native.price(build(), tgt).latency_ns / 1e3

    return price


def _t(*shape: int, dtype: str = BF16) -> TensorSpec:
    return TensorSpec(tuple(shape), dtype)


# ---- the compiler's ops: the same figure for ours and native --------------------------------
# The matmul step walks output blocks of MM_BLOCK_M x MM_BLOCK_N one after another, each
# with identical work over the full K: a large output is priced on at most MATMUL_BLOCKS
# blocks per dimension and scaled by the output's area (named in the figure's source).
MATMUL_BLOCKS = 2


def matmul(store: RowStore, m: int, k: int, n: int, target: str, lnc: int) -> Figure:
    # LNC 2: the cores split the larger output dimension (rows for a training step's
    # activations, weight columns for a small decode batch, so no core reads every weight)
    rows, n = (_half(m, lnc), n) if m >= n else (m, _half(n, lnc))
    pm = min(rows, MATMUL_BLOCKS * steps.MM_BLOCK_M)
    pn = min(n, MATMUL_BLOCKS * steps.MM_BLOCK_N)
    key = f"matmul [{pm}, {k}] x [{k}, {pn}] bf16 (per core)"
    build = lambda: [native.Step("matmul", steps.matmul_step, (_t(k, pm), _t(k, pn), BF16))]  # noqa: E731
    f = store.get_or_price(key, target, lnc, "compiler", _steps_us(build), "matmul")
    scale = (rows * n) / (pm * pn)
    if scale == 1:
        return f
    return f.scaled(scale, f"[{rows}, {k}] x [{k}, {n}] per core: x {scale:.3g} by output area")


def swiglu(store: RowStore, t: int, inter: int, kind: str, target: str, lnc: int) -> Figure:
    rows = _half(t, lnc)
    # fwd: h = silu(g) * u, one fused pass over g and u; bwd: dg and du, one fused pass
    # over (dh, g, u) writing two outputs -- priced as two streaming passes
    key = f"swiglu {kind} [{rows}, {inter}] bf16 (per core)"
    x = _t(rows, inter)
    step = native.Step("silu(g) * u", steps.stream_rows, (x, x, None, None, 1, 1, BF16))
    build = lambda: [step] if kind == "fwd" else [step, step]  # noqa: E731
    return store.get_or_price(key, target, lnc, "compiler", _steps_us(build), "swiglu")


# ---- norms --------------------------------------------------------------------------------
def norm(
    store: RowStore, impl: str, op: str, kind: str, t: int, h: int, target: str, lnc: int
) -> Figure | None:
    name, case = f"{op} {kind}", f"[{t}, {h}] bf16"
    if impl == "aws":
        if (op, kind) != ("rms_norm", "fwd"):
            return None
        r = store.op_row("norm", name, case, target, lnc, "aws")
        return None if r is None else figure_of(r, f"committed row: aws {name} {case} LNC {lnc}")
    row_impl = "nki" if impl == "ours" else "native"
    got = _committed(store, "norm", name, case, target, lnc, row_impl)
    if got is not None:
        return got
    key = f"norm {name} {case} ({impl})"
    if impl == "ours":

        def price(tgt: Any) -> float:
            from ..norm import bench as nb

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return sum(p.latency_us for p in nb.op_parts(op, kind, t, h, tgt, lnc))

        return store.get_or_price(key, target, lnc, impl, price, "norm")
    build_fn = {
        ("rms_norm", "fwd"): native.rms_norm_fwd,
        ("rms_norm", "bwd"): native.rms_norm_bwd,
        ("add_rms_norm", "fwd"): native.add_rms_norm_fwd,
    }[(op, kind)]
    rows = _half(t, lnc)
    return store.get_or_price(
        key, target, lnc, impl, _steps_us(lambda: build_fn(rows, h, BF16)), "norm"
    )


# ---- attention (training / prefill) ----------------------------------------------------------
def _attn_case(seq: int) -> str:
    return f"B=1 H={LLAMA_GROUP[0]}/{LLAMA_GROUP[1]} S={seq} D=128 bf16"


def attention(
    store: RowStore, impl: str, args: tuple[Any, ...], target: str, lnc: int
) -> Figure | None:
    kind, seq, batch, heads, kv, d = args
    opname = f"flash_attention {kind} causal"
    llama = (heads, kv, d) == (*LLAMA_GROUP, 128)
    on_route = native.sdpa_route(seq, seq, d) == "aws_flash"
    if impl == "native" and not on_route:
        h = _half(heads, lnc)  # two cores, half the heads each
        build = native.attention_fwd if kind == "fwd" else native.attention_bwd
        key = f"sdpa decomposition {kind} B=1 H={h} S={seq} D={d} (per core)"
        f = store.get_or_price(
            key, target, lnc, impl, _steps_us(lambda: build(1, h, seq, seq, d, BF16)), "attention"
        )
        return f.scaled(batch, f"x {batch} sequences") if batch != 1 else f
    if impl in ("native", "aws"):
        aws = _aws_attention(store, opname, seq, heads, kv, target, lnc)
        if aws is None:
            return None
        return aws.scaled(batch, f"x {batch} sequences") if batch != 1 else aws
    if llama:
        got = _committed(store, "attention", opname, _attn_case(seq), target, lnc, "nki")
        if got is not None:
            return got.scaled(batch, f"x {batch} sequences") if batch != 1 else got
    key = f"flash_attention {kind} causal B=1 H={heads}/{kv} S={seq} D={d} (ours)"

    def price(tgt: Any) -> float:
        from ..attention import bench as attn
        from ..model_shapes import AttentionShape

        shape = AttentionShape("ledger", heads, kv, d)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return attn.price(kind, seq, tgt, True, shape=shape, force="pair", lnc=lnc).latency_us

    f = store.get_or_price(key, target, lnc, impl, price, "attention")
    return f.scaled(batch, f"x {batch} sequences") if batch != 1 else f


def _aws_attention(
    store: RowStore, opname: str, seq: int, heads: int, kv: int, target: str, lnc: int
) -> Figure | None:
    """AWS's flash kernel from the committed rows (Llama-3 8B heads, S = 2K / 8K / 32K):
    exact, or log-log interpolated in S between the two nearest rows, then scaled by
    query heads (each query head is its own S x S work); every step named."""
    points = []
    for r in store.bench_rows():
        if (r.family, r.op, r.target, r.lnc, r.impl) == ("attention", opname, target, lnc, "aws"):
            if r.latency_us == r.latency_us:
                points.append((int(r.case.split("S=")[1].split()[0]), r))
    if not points:
        return None
    points.sort(key=lambda p: p[0])
    exact = [r for s, r in points if s == seq]
    if exact:
        f = figure_of(exact[0], f"committed row: aws {opname} {exact[0].case} LNC {lnc}")
    else:
        lo = max([p for p in points if p[0] < seq], key=lambda p: p[0], default=points[0])
        hi = min([p for p in points if p[0] > seq], key=lambda p: p[0], default=points[-1])
        if lo[0] == hi[0]:  # outside the rows: the nearest pair's exponent
            pair = points[:2] if seq < points[0][0] else points[-2:]
            lo, hi = pair[0], pair[1]
        expo = math.log(hi[1].latency_us / lo[1].latency_us) / math.log(hi[0] / lo[0])
        k = (seq / lo[0]) ** expo
        how = "interpolated" if lo[0] < seq < hi[0] else "extrapolated"
        base = figure_of(lo[1], f"committed row: aws {opname} {lo[1].case} LNC {lnc}")
        f = base.scaled(k, f"{how} to S={seq} as S^{expo:.2f} (rows at S={lo[0]} and {hi[0]})")
    if heads != LLAMA_GROUP[0]:
        f = f.scaled(heads / LLAMA_GROUP[0], f"scaled by query heads {heads}/{LLAMA_GROUP[0]}")
    if kv != LLAMA_GROUP[1]:
        f = f.scaled(1.0, f"rows have {LLAMA_GROUP[1]} kv heads, used as is for {kv}")
    return f


# ---- decode attention ---------------------------------------------------------------------
def decode_attention(
    store: RowStore, impl: str, args: tuple[Any, ...], target: str, lnc: int
) -> Figure | None:
    batch, ctx, heads, kv, d = args
    group = heads // kv
    programs = batch * kv  # one (sequence, kv head) program each, split across the cores
    per_core = _half(programs, lnc)
    if impl == "aws":
        return _aws_decode(store, batch, ctx, kv, target, lnc)
    if impl == "native":
        h = group  # SDPA at Sq = 1 is off the flash route: the S x S composition per head
        key = f"sdpa decomposition decode Hq={h} Sq=1 L={ctx} D={d} (one kv group)"
        build = lambda: native.attention_fwd(1, h, 1, ctx, d, BF16)  # noqa: E731
        f = store.get_or_price(key, target, 1, impl, _steps_us(build), "decode attention")
        return f.scaled(per_core, f"x {per_core} (sequence, kv head) groups per core")
    got = _stream_row(store, batch, ctx, heads, kv, d, target, lnc)
    if got is not None:
        return got
    if batch > EXTRAPOLATE_FROM[1]:
        # a launch whose batch tiles repeat one schedule grows linearly in tiles once its
        # pipeline is full: the decode benchmark's extrapolation (benchmarks/bench_decode.py)
        b1, b2 = EXTRAPOLATE_FROM
        f1, f2 = (_ours_decode(store, b, ctx, heads, kv, d, target, lnc) for b in (b1, b2))
        k = (batch - b1) / (b2 - b1)
        samples = None
        if f1.samples and f2.samples and len(f1.samples) == len(f2.samples):
            samples = tuple(x + k * (y - x) for x, y in zip(f1.samples, f2.samples, strict=True))
        band = None
        if f1.band is not None and f2.band is not None:
            band = (f1.band[0] + k * (f2.band[0] - f1.band[0]),
                    f1.band[1] + k * (f2.band[1] - f1.band[1]))  # fmt: skip
        return Figure(
            f1.us + k * (f2.us - f1.us),
            f1.label,
            f"{f1.source} and {f2.source}: B={batch} extrapolated from B={b1} and B={b2} "
            "(linear in batch tiles, as the decode benchmark)",
            band if samples is None else (min(samples), max(samples)),
            samples,
            tuple(dict.fromkeys(f1.notes + f2.notes)),
            f1.structural_pct,
        )
    return _ours_decode(store, batch, ctx, heads, kv, d, target, lnc)


EXTRAPOLATE_FROM = (1, 8)  # batches our decode kernel is priced at; larger ones extrapolated


def _ours_decode(
    store: RowStore, batch: int, ctx: int, heads: int, kv: int, d: int, target: str, lnc: int
) -> Figure:
    key = f"decode_attention B={batch} Hq={heads} Hkv={kv} Sq=1 L={ctx} D={d} (ours, one launch)"

    def price(tgt: Any) -> float:
        # the op's streamed kernel: the whole batch in one launch, split over the LNC's cores
        from ..attention.decode_host import DecodeProblem, StreamConfig, stream_kernel_args
        from ..attention.decode_stream import decode_stream_fwd
        from ..perfmodel import estimate_trace, trace_kernel
        from ..runtime.buckets import bucket
        from ..runtime.config_store import lookup_config

        op_key = DecodeProblem(1, heads, kv, 1, bucket(ctx), d, BF16, "contiguous")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = lookup_config("decode_attention", op_key, decode_stream_fwd, target=tgt,
                                config_cls=StreamConfig, lnc=1)  # fmt: skip
        prob = DecodeProblem(batch, heads, kv, 1, ctx, d, BF16, "contiguous")
        args = stream_kernel_args(prob, cfg, lnc=lnc)  # type: ignore[arg-type]
        trace = trace_kernel(decode_stream_fwd, *args, target=tgt, lnc=lnc)
        return estimate_trace(trace, tgt).latency_ns / 1e3

    return store.get_or_price(key, target, lnc, "ours", price, "decode attention")


def _stream_row(
    store: RowStore, batch: int, ctx: int, heads: int, kv: int, d: int, target: str, lnc: int
) -> Figure | None:
    """Our streamed decode kernel's committed op-level row (`decode_stream_rows.json`: 8 kv
    heads, D = 128, contiguous; exact group, batch, cache and LNC), used only when priced
    on the current kernel source and cost model; other kv head counts scaled by kv heads
    (one program per (sequence, kv head))."""
    if d != 128 or heads % kv:
        return None
    want = ("ours (streamed)", target, heads // kv, lnc, batch, ctx, False)
    for r in store.decode_stream_rows():
        have = (r["method"], r["target"], r["group"], r["lnc"], r["batch"], r["cache"], r["paged"])
        if have != want or version_of(r["label"]) != current_version():
            continue
        from ..attention.decode_stream import decode_stream_fwd
        from ..runtime.kernel_cache import kernel_source_hash

        if r.get("kernel_hash") != kernel_source_hash(decode_stream_fwd):
            return None  # priced on other kernel source: the ledger prices it itself
        samples = r.get("samples_us") or None
        band = (min(samples), max(samples)) if samples else tuple(r["band_us"])
        case = f"group {heads // kv} B={batch} L={ctx} LNC {lnc}"
        note = f"; {r['note']}" if r.get("note") else ""
        f = Figure(
            r["latency_us"],
            r["label"],
            f"committed row: ours (streamed) decode {case} (decode_stream_rows.json{note})",
            band,  # type: ignore[arg-type]
            None if not samples else tuple(float(x) for x in samples),
            structural_pct=structural_pct_of(r["label"], target) if samples else 0.0,
        )
        return f.scaled(kv / 8, f"scaled by kv heads {kv}/8") if kv != 8 else f
    return None


def _aws_decode(
    store: RowStore, batch: int, ctx: int, kv: int, target: str, lnc: int
) -> Figure | None:
    """nki-library attention_tkg, committed rows (LNC 1, contiguous, 8 kv heads): exact
    batch and cache only, scaled by kv heads and split over the LNC's cores."""
    for r in store.decode_aws_rows():
        if (r["target"], r["batch"], r["cache"], r["paged"]) == (target, batch, ctx, False):
            band = tuple(r["band_us"]) if r.get("band_us") else None
            f = Figure(
                r["latency_us"],
                r["label"],
                f"committed row: nki-library attention_tkg B={batch} L={ctx} "
                "(decode_aws_rows.json)",
                band,  # type: ignore[arg-type]
            )
            if kv != 8:
                f = f.scaled(kv / 8, f"scaled by kv heads {kv}/8")
            return f.scaled(1 / lnc, f"split over {lnc} cores") if lnc != 1 else f
    return None


# ---- MoE ----------------------------------------------------------------------------------
def moe(
    store: RowStore, impl: str, model: ModelSpec, t: int, kind: str, target: str, lnc: int
) -> Figure | None:
    if impl == "aws":
        return None  # nki-library's moe_cte did not run through the interpreter (peer rows)
    from ..bench.compare import moe_case_text

    shape = model.moe_shape()
    case = moe_case_text(shape, t)
    from ..ops.moe_decode import use_decode_mode

    decode = kind == "fwd" and use_decode_mode(t, None)
    if impl == "native" and decode and lnc > 1:
        return _native_moe_decode(store, shape, t, target, lnc)
    if kind == "fwd":
        got = _committed(
            store,
            "moe",
            "moe_mlp fwd uniform",
            case,
            target,
            lnc,
            "nki" if impl == "ours" else "native",
        )
        if got is not None:
            return got
    if impl == "ours" and decode:  # what moe_mlp runs
        return _moe_decode(store, shape, t, target, lnc)
    # LNC 2: our forward as kernel[2] is minutes to trace; both directions priced as two
    # cores each routing half of the tokens at LNC 1 (the op-level rows use kernel[2])
    part = _half(t, lnc)
    key = f"moe {kind} {case} uniform (per core: {part} tokens) ({impl})"
    h, i, e, k = shape.hidden, shape.intermediate, shape.num_experts, shape.top_k
    if impl == "ours":

        def price(tgt: Any) -> float:
            from ..model_shapes import MoEShape
            from ..moe.pricing import layer_row

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                r = layer_row(
                    MoEShape(shape.model, h, i, e, k), part, "uniform", tgt, backward=kind == "bwd"
                )
            return (r["bwd_ms"] if kind == "bwd" else r["latency_ms"]) * 1e3

        return store.get_or_price(key, target, lnc, impl, price, "moe")
    from ..bench.compare import expert_counts
    from . import native_moe

    counts = expert_counts("uniform", part, e, k)

    def price_native(tgt: Any) -> float:
        if kind == "bwd":
            return (
                native.price(native_moe.grouped_mm_bwd(part, h, i, e, BF16, counts), tgt).latency_ns
                / 1e3
            )
        a = native.price(moe_native.blockwise_fwd(part, h, i, e, k, BF16), tgt).latency_ns
        b = native.price(moe_native.grouped_mm_fwd(part, h, i, e, BF16, counts), tgt).latency_ns
        return min(a, b) / 1e3

    return store.get_or_price(key, target, lnc, impl, price_native, "moe")


def _moe_decode(store: RowStore, shape: Any, t: int, target: str, lnc: int) -> Figure:
    """What `moe_mlp` runs on a dropless call of at most 64 tokens: our router, then one
    launch of the decode kernel (its programs take alternate touched experts, so at LNC 2
    no core streams every touched expert's weights), on transformers' weight layout (read
    by DMA transposes: the patched HF model's path, the slower of the two layouts)."""
    from ..bench.compare import expert_counts, moe_case_text

    h, i, e, k = shape.hidden, shape.intermediate, shape.num_experts, shape.top_k
    touched = sum(1 for c in expert_counts("uniform", t, e, k) if c)
    key = (
        f"moe decode {moe_case_text(shape, t)} uniform ({touched} experts touched; router + "
        "one decode-kernel launch, transformers' weight layout) (ours)"
    )

    def price(tgt: Any) -> float:
        from ..moe.decode_pricing import price_decode, router_latency

        router = router_latency(t, e, k, tgt, lnc, band=False)[0]
        experts = price_decode(touched, t, h, i, e, k, tgt, lnc=lnc, layout="hf", band=False)
        return (router + experts.latency_ns[0]) / 1e3

    return store.get_or_price(key, target, lnc, "ours", price, "moe decode")


def _native_moe_decode(store: RowStore, shape: Any, t: int, target: str, lnc: int) -> Figure:
    """Native's dropless MoE at decode under LNC > 1: the faster, per parameter set, of
    the token split and the weight split of its compositions (`native_moe_decode`)."""
    from ..bench.compare import moe_case_text
    from . import native_moe_decode

    h, i, e, k = shape.hidden, shape.intermediate, shape.num_experts, shape.top_k
    part = _half(t, lnc)
    key = (
        f"moe decode {moe_case_text(shape, t)} uniform (native: the faster of the token "
        f"split, {part} tokens per core, and the weight split, {t} tokens on "
        f"I/{lnc} per core)"
    )

    def price(tgt: Any) -> float:
        return native_moe_decode.decode_us(t, h, i, e, k, BF16, lnc, tgt)

    f = store.get_or_price(key, target, lnc, "native", price, "moe decode")
    why = (
        "native at decode: the faster, per parameter set, of the token split (each core "
        f"{part} tokens on whole experts) and the weight split (each core all {t} tokens "
        f"on 1/{lnc} of each touched expert's columns, plus the partial sums' reduction)"
    )
    return replace(f, source=f"{f.source}; {why}")


def price_op(
    store: RowStore, op: Op, impl: str, model: ModelSpec, target: str, lnc: int
) -> Figure | None:
    """One op's figure for `impl` (ours / native / aws) per logical core, or None when the
    implementation has no such op (AWS's figure then reads 'n/a')."""
    a: Any = op.args
    if op.kind == "matmul":
        return None if impl == "aws" else matmul(store, a[0], a[1], a[2], target, lnc)
    if op.kind == "swiglu":
        return None if impl == "aws" else swiglu(store, a[0], a[1], a[2], target, lnc)
    if op.kind == "norm":
        return norm(store, impl, a[0], a[1], a[2], a[3], target, lnc)
    if op.kind == "attention":
        return attention(store, impl, a, target, lnc)
    if op.kind == "decode_attention":
        return decode_attention(store, impl, a, target, lnc)
    if op.kind == "moe":
        return moe(store, impl, model, a[0], a[1], target, lnc)
    if op.kind in ("mla_attention", "mla_decode"):
        from . import mla

        return mla.price(store, op, impl, target, lnc)
    raise ValueError(f"op kind: unknown {op.kind!r}")
