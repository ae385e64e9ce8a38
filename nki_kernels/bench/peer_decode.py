"""Peer rows for decode: nki-library's token-generation attention priced like ours.

AWS's `core/attention/attention_tkg.py::attention_tkg` (nki-library @ d2ad3a57) is a
subkernel: it takes its Q and active K already in SBUF, an `SbufManager` and an
`AttnTKGConfig`, and writes into an output its caller allocates. `tkg_harness` is this
project's thin `@nki.jit` caller around it (written here, not copied from AWS's tests):
it stages q [d, B * H * s_active] and k_active [d, B * s_active] into SBUF with one DMA
each, allocates out [B, H, d, s_active] in HBM and calls `attention_tkg` unmodified,
loaded from a local checkout through `nki_kernels.conformance.loader`.

Configuration priced (facts read from the kernel's signature and `AttnTKGConfig`):
one KV head per call (k_prior [B, 1, S, d], `tp_k_prior=True`: the cache in the same
[B, Hkv, S, D] row layout ours reads, transposed by the kernel while loading),
q_head = 4 (Llama-3 8B's query heads per KV head), s_active = 1, d = 128, bf16,
`use_pos_id=True` (the mask built in the kernel from position ids, as ours builds it
from per-row bounds), no RoPE fusion, LNC 1. Paged: `block_len` 16-key blocks,
k_prior / v_prior [B * blocks, 16, d], an active block table [B, blocks] (uint32) and
`strided_mm1=False` (both required by the kernel for a block cache). A Llama-3
8B layer is 8 such calls (one per KV head): the row multiplies one call by 8.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..interp import TensorSpec
from ..model_shapes import LLAMA3_8B_ATTN
from .peer import checkout_commit

TKG_MODULE = "nkilib.core.attention.attention_tkg"
BLOCK_LEN = 16
SBUF_RESERVE = 16 * 1024  # bytes per partition left to the compiler, as nki-library budgets


def tkg_harness(checkout: str | Path) -> Any:
    """The interpreter kernel that calls the checkout's `attention_tkg` unmodified."""
    from ..conformance import loader
    from ..nki import nisa, nl

    tkg = loader.load_module(checkout, TKG_MODULE)
    alloc = loader.load_module(checkout, "nkilib.core.utils.allocator")
    logging = loader.load_module(checkout, "nkilib.core.utils.logging")

    def harness(q, k_active, v_active, k_prior, v_prior, mask, pos_ids, block_table, cfg):  # type: ignore[no-untyped-def]
        sbm = alloc.SbufManager(
            0,
            nl.tile_size.total_available_sbuf_size - SBUF_RESERVE,
            logging.Logger("SBM", logging.LogLevel.WARN),
        )
        sbm.open_scope()
        out = nl.ndarray(
            (cfg.bs, cfg.q_head, cfg.d_head, cfg.s_active), dtype=q.dtype, buffer=nl.shared_hbm
        )
        q_sb = sbm.alloc_stack(q.shape, dtype=q.dtype, buffer=nl.sbuf)
        k_sb = sbm.alloc_stack(k_active.shape, dtype=k_active.dtype, buffer=nl.sbuf)
        nisa.dma_copy(q_sb, q)
        nisa.dma_copy(k_sb, k_active)
        tkg.attention_tkg(
            q_sb, k_sb, v_active, k_prior, v_prior, mask, out, cfg, sbm,
            None, pos_ids, None, None, block_table, None,
        )  # fmt: skip
        sbm.close_scope()
        return out

    return loader.jit(harness), tkg


def tkg_args(
    tkg: Any, batch: int, cache: int, paged: bool, group: int | None = None
) -> tuple[Any, ...]:
    """The harness's arguments for one KV head at `batch` x `cache` keys: Llama-3 8B's
    4 query heads per KV head, or `group` (8: Llama-3 70B's GQA 8 : 1)."""
    s = LLAMA3_8B_ATTN
    h, d, sa = group or s.num_heads // s.num_kv_heads, s.head_dim, 1
    bf = "bfloat16"
    cfg = tkg.AttnTKGConfig(
        bs=batch, q_head=h, s_active=sa, curr_sprior=cache, full_sprior=cache, d_head=d,
        block_len=BLOCK_LEN if paged else 0, tp_k_prior=True, use_pos_id=True,
        fuse_rope=False, qk_in_sb=True, strided_mm1=not paged,
    )  # fmt: skip
    if paged:
        blocks = cache // BLOCK_LEN
        kv = TensorSpec((batch * blocks, BLOCK_LEN, d), bf)
        table = TensorSpec((batch, blocks), "uint32")
    else:
        kv = TensorSpec((batch, 1, cache, d), bf)
        table = None
    return (
        TensorSpec((d, batch * h * sa), bf),
        TensorSpec((d, batch * sa), bf),
        TensorSpec((batch, 1, sa, d), bf),
        kv,
        kv,
        TensorSpec((sa, batch, h, sa), "uint8"),
        TensorSpec((batch, sa), "float32"),
        table,
        cfg,
    )


def price_tkg(
    checkout: str | Path,
    batch: int,
    cache: int,
    paged: bool,
    target: str = "trn2",
    group: int | None = None,
    lnc: int = 1,
) -> dict[str, Any]:
    """One harness launch priced (trace-only interpretation + cost model, with the band
    over the cost model's parameter sets widened by its structural error, and the
    per-set latencies `samples_us`), or the reason it could not be; at `lnc` 2 the
    kernel runs as `kernel[2]` (its own batch / sequence sharding)."""
    from ..conformance import loader
    from ..perfmodel import estimate_trace, schedule, trace_kernel
    from .bands import latency_band, parameter_sets

    t0 = time.perf_counter()
    try:
        kernel, tkg = tkg_harness(checkout)
        args = tkg_args(tkg, batch, cache, paged, group)
        with loader.mapped_nki():
            trace = trace_kernel(kernel, *args, target=target, lnc=lnc)
        est = estimate_trace(trace, target)
    except Exception as e:  # the reason goes into the row: which rule or API stopped it
        msg = f"{type(e).__name__}: {e}".splitlines()[0]
        return {"latency_us": None, "error": msg[:300]}
    samples = [schedule(trace, p).latency_ns / 1e3 for p in parameter_sets(target)]
    return {
        "latency_us": est.latency_ns / 1e3,
        "band_us": latency_band(samples, target),
        "samples_us": samples,
        "instructions": len(trace),
        "busiest": est.bottleneck,
        "label": est.label,
        "seconds": time.perf_counter() - t0,
        "nki_library_commit": checkout_commit(Path(checkout)),
    }


__all__ = ["BLOCK_LEN", "price_tkg", "tkg_args", "tkg_harness"]
