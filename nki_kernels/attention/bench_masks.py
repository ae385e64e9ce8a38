"""Modeled benchmarks of masked attention and decode (benchmarks/bench_attention_masks.py).

Every figure is "modeled (cost model vN, target)": trace-only interpretation + timeline,
never a measurement. Each row carries its band: the same traces scheduled under every
parameter set of the cost model (`perfmodel.band`; min and max over the sets, widened by the
model's cross-validated error, `perfmodel.band.widen`).

Masks (forward, Llama-3 8B attention: one (batch, kv-head) program of 4 query heads,
D = 128, bf16, priced once and multiplied by the 8 kv heads, an upper bound as in
`bench.py`), each mask three ways:

- `ours`: the op's plan -- tiles classified from the mask, SKIP tiles not computed;
  interval masks (mask_mods: document + causal, window) through bounds and
  `range_select`, others (block-sparse, ALiBi's additive bias) through loaded tiles;
- `ours, dense (no block map)`: the same kernel with every tile PARTIAL and its mask
  loaded: our own dense-mask path without skipping;
- `S x S decomposition`: what TorchNeuron runs for SDPA with a mask tensor (its flash
  kernel takes no mask): per head S = Q K^T, S + mask, softmax, P V as separate steps
  with HBM round trips (`baselines.native`, generous to the compiler: every step a
  well-tiled kernel).

Decode (Llama-3 8B: 32 query / 8 KV heads, D = 128, bf16, Sq = 1): our kernel at batch
1 / 8 / 64, cache 2 K / 32 K / 128 K, contiguous or paged (16-key blocks), with its
heuristic config (the op now runs the streamed kernel: `bench_decode.py`), priced on one
(batch, kv-head) program and multiplied by B * 8 programs; MBU
counts the K / V bytes the lengths need. Peers: nki-library's `attention_tkg` through
this project's harness (`bench.peer_decode`: one KV head for the whole batch, x 8), and
the S x S decomposition with Sq = 1 per query head.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..baselines import native
from ..baselines import steps as native_steps
from ..baselines.native import Step
from ..interp import TensorSpec
from ..targets import Target, get_target
from . import masks
from .decode import decode_attention_fwd
from .decode_host import DecodeConfig, DecodeProblem, kernel_args
from .flash_fwd import flash_attention_fwd

GROUP, KV_HEADS, D = 4, 8, 128
MASK_SEQS = (2048, 8192)
MASK_KINDS = ("document+causal", "window 1024", "ALiBi + causal", "block-sparse 50%")
DECODE_BATCHES = (1, 8, 64)
DECODE_CACHES = (2048, 32768, 131072)
AWS_TKG = "nki-library attention_tkg"


@dataclass(frozen=True)
class MaskRow:
    target: str
    mask: str
    seq: int
    method: str
    latency_us: float
    tiles_computed: float  # fraction of (query tile, key tile) pairs computed
    label: str
    band_us: tuple[float, float] = (float("nan"), float("nan"))


@dataclass(frozen=True)
class DecodeRow:
    target: str
    method: str
    batch: int
    cache: int
    paged: bool
    latency_us: float
    mbu: float  # K / V bytes of the lengths / (HBM bandwidth x latency)
    config: str
    label: str
    band_us: tuple[float, float] = (float("nan"), float("nan"))
    note: str = ""


def _banded(kernel: Any, args: tuple[Any, ...], tgt: Target) -> tuple[float, tuple, str]:
    """(latency ns, band ns, label) of one trace-only launch."""
    from ..perfmodel import estimate_trace, trace_kernel
    from ..perfmodel.band import band

    trace = trace_kernel(kernel, *args, target=tgt)
    est = estimate_trace(trace, tgt)
    return est.latency_ns, band(trace, tgt), est.label


def _native_banded(step_list: list[Step], tgt: Target) -> tuple[float, tuple, str]:
    """(latency ns, band ns, label) of a native decomposition, each step's trace reused
    across the parameter sets; the band widened as `perfmodel.band.band` widens a
    kernel's (the model's cross-validated error)."""
    from ..bench.bands import parameter_sets, replayed_traces
    from ..perfmodel.band import widen

    with replayed_traces():
        first = native.price(step_list, tgt)
        vals = [first.latency_ns] + [
            native.price(step_list, p).latency_ns for p in parameter_sets(tgt)[1:]
        ]
    return first.latency_ns, widen(min(vals), max(vals), tgt), first.label


def _mask(kind: str, s: int, seed: int = 0) -> np.ndarray:
    """bool [1, 1, S, S] allowed map of a benchmark mask."""
    i, j = np.arange(s)[:, None], np.arange(s)[None, :]
    if kind == "document+causal":  # 4 equal documents
        doc = np.arange(s) * 4 // s
        allowed = (doc[:, None] == doc[None, :]) & (j <= i)
    elif kind == "window 1024":
        allowed = (j <= i) & (i - j < 1024)
    elif kind == "ALiBi + causal":
        allowed = j <= i
    elif kind == "block-sparse 50%":  # random 128 x 128 tiles kept, the diagonal always
        rng = np.random.default_rng(seed)
        n = s // 128
        keep = rng.random((n, n)) < 0.5
        keep |= np.eye(n, dtype=bool)
        allowed = np.kron(keep, np.ones((128, 128), dtype=bool)) & (rng.random((s, s)) < 0.9)
    else:
        raise ValueError(f"mask: unknown benchmark mask {kind!r}")
    return allowed[None, None]


def _fwd_args(
    s: int, plan: Any, dense: bool, bounds: bool, cfg: dict, bias: bool = False
) -> tuple[Any, ...]:
    q = TensorSpec((1, GROUP, s, D), "bfloat16")
    kv = TensorSpec((1, 1, s, D), "bfloat16")
    bnd = TensorSpec((1, 128, 2, s // 128), "float32") if bounds else None
    heads = GROUP if bias else 1  # ALiBi: one bias (and mask) map per query head
    mk = TensorSpec((1, heads, s, s), "uint8") if dense else None
    bs = TensorSpec((1, heads, s, s), "float32") if bias else None
    fields = ("kv_tile", "q_tiles", "dma_quarters", "scalar_evac", "kv_buffers")
    return (q, kv, kv, bnd, D**-0.5, plan, *(cfg[f] for f in fields), mk, bs)


def _plan(kind: str, s: int) -> tuple[Any, np.ndarray, bool]:
    """(the op's tile plan, its tile classes, whether it runs on row bounds)."""
    allowed = _mask(kind, s)
    if kind == "ALiBi + causal":  # every kept tile carries a nonzero bias: PARTIAL
        classes = masks.classify_dense(allowed)
        classes[classes == masks.FULL] = masks.PARTIAL
        return masks.tile_plan(classes), classes, False
    classes = masks.classify_dense(allowed)
    iv = masks.row_intervals(allowed[:, 0])
    if iv is not None:
        classes = masks.classify_tiles(iv[0], iv[1], s)
    return masks.tile_plan(classes), classes, iv is not None


def mask_rows(
    seqs: tuple[int, ...] = MASK_SEQS, target: str = "trn2", kinds: tuple[str, ...] = MASK_KINDS
) -> list[MaskRow]:
    """Every (mask, seq) case three ways (see the module docstring)."""
    from .config import AttentionProblem, FlashFwdConfig

    tgt = get_target(target)
    rows = []
    for s in seqs:
        prob = AttentionProblem(s, s, D, GROUP * KV_HEADS, KV_HEADS, 1, "bfloat16", "data")
        cfg = FlashFwdConfig.heuristic(prob, tgt).to_dict()
        for kind in kinds:
            plan, classes, on_bounds = _plan(kind, s)
            bias = kind.startswith("ALiBi")
            ours = _fwd_args(s, plan, not on_bounds, on_bounds, cfg, bias)
            every = masks.tile_plan(np.full_like(classes, masks.PARTIAL))
            dense = _fwd_args(s, every, True, False, cfg, bias)
            frac = masks.allowed_fraction(classes)
            for method, args, computed in (
                ("ours", ours, frac),
                ("ours, dense (no block map)", dense, 1.0),
            ):
                ns, (lo, hi), label = _banded(flash_attention_fwd, args, tgt)
                k = KV_HEADS / 1e3
                rows.append(MaskRow(tgt.name, kind, s, method, ns * k, computed, label,
                                    (lo * k, hi * k)))  # fmt: skip
            ns, (lo, hi), label = _native_banded(_sxs_with_mask(GROUP * KV_HEADS, s), tgt)
            rows.append(MaskRow(tgt.name, kind, s, "S x S decomposition", ns / 1e3, 1.0, label,
                                (lo / 1e3, hi / 1e3)))  # fmt: skip
    return rows


def _sxs_with_mask(heads: int, s: int) -> list[Step]:
    """native.attention_fwd with the mask added to S as one more streaming step."""
    parts = native.attention_fwd(1, heads, s, s, D, "bfloat16")
    sxs = TensorSpec((s, s), "bfloat16")
    add = Step(
        "S + mask", native_steps.stream_rows, (sxs, sxs, None, None, 0, 1, "bfloat16"), heads
    )
    return [parts[0], add, *parts[1:]]


def _kv_bytes(batch: int, cache: int) -> float:
    return 2.0 * batch * KV_HEADS * cache * D * 2  # K and V, bf16


def decode_rows(
    batches: tuple[int, ...] = DECODE_BATCHES,
    caches: tuple[int, ...] = DECODE_CACHES,
    target: str = "trn2",
    paged: tuple[bool, ...] = (False, True),
    peers: bool = True,
    aws_checkout: str | None = None,
) -> list[DecodeRow]:
    """Decode cases (see the module docstring); AWS rows only with `aws_checkout`."""
    from ..runtime.buckets import bucket

    tgt = get_target(target)
    rows = []
    bw = tgt.hbm_bytes_per_ns
    for cache in caches:
        for pg in paged:
            layout = "paged" if pg else "contiguous"
            prob = DecodeProblem(1, GROUP * KV_HEADS, KV_HEADS, 1, bucket(cache), D, "bfloat16",
                                 layout)  # fmt: skip
            cfg = DecodeConfig.heuristic(prob, tgt)
            unit = DecodeProblem(1, GROUP, 1, 1, cache, D, "bfloat16", layout)
            args = kernel_args(unit, cfg)  # type: ignore[arg-type]
            ns, (lo, hi), label = _banded(decode_attention_fwd, args, tgt)
            for b in batches:
                n = b * KV_HEADS / 1e3
                lat = ns * n
                rows.append(DecodeRow(tgt.name, "ours", b, cache, pg, lat,
                                      _kv_bytes(b, cache) / (lat * 1e3 * bw), cfg.key(), label,
                                      (lo * n, hi * n)))  # fmt: skip
            if aws_checkout is not None:
                rows += aws_decode_rows(aws_checkout, batches, cache, pg, tgt.name)
    if peers:
        for cache in caches:
            steps = native.attention_fwd(1, GROUP * KV_HEADS, 1, cache, D, "bfloat16")
            ns, (lo, hi), label = _native_banded(steps, tgt)
            for b in batches:
                lat = ns * b / 1e3
                rows.append(DecodeRow(tgt.name, "S x S decomposition (Sq = 1)", b, cache, False,
                                      lat, _kv_bytes(b, cache) / (lat * 1e3 * bw), "-", label,
                                      (lo * b / 1e3, hi * b / 1e3)))  # fmt: skip
    return rows


def aws_decode_rows(
    checkout: str, batches: tuple[int, ...], cache: int, paged: bool, target: str
) -> list[DecodeRow]:
    """nki-library's attention_tkg through `bench.peer_decode`: one KV head for the whole
    batch per launch, x 8 KV heads; a case it cannot run is a row with its reason."""
    from ..bench.peer_decode import price_tkg

    out = []
    bw = get_target(target).hbm_bytes_per_ns
    for b in batches:
        r = price_tkg(checkout, b, cache, paged, target)
        if r["latency_us"] is None:
            out.append(DecodeRow(target, AWS_TKG, b, cache, paged, float("nan"), float("nan"),
                                 "-", "not priced", note=r["error"]))  # fmt: skip
            continue
        lat = r["latency_us"] * KV_HEADS
        lo, hi = (x * KV_HEADS for x in r["band_us"])
        note = f"nki-library {r['nki_library_commit']}, {r['instructions']} instructions x 8"
        out.append(DecodeRow(target, AWS_TKG, b, cache, paged, lat,
                             _kv_bytes(b, cache) / (lat * 1e3 * bw), "-", r["label"], (lo, hi),
                             note))  # fmt: skip
    return out


def rows_as_dicts(rows: list[Any]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]


__all__ = [
    "AWS_TKG",
    "DecodeRow",
    "MaskRow",
    "aws_decode_rows",
    "decode_rows",
    "mask_rows",
    "rows_as_dicts",
]
