"""`torch.ops.nki.decode_attention`: Sq = 1..k new queries over a (paged) KV cache.

    decode_attention(q [B, Hq, Sq, D], k_cache, v_cache, cache_lens [B], block_table=None,
                     *, softmax_scale=None, kv_layout="vllm")
        -> (out [B, Hq, Sq, D], lse [B, Hq, Sq] fp32)

Cache layouts: contiguous k_cache, v_cache [B, Hkv, S_max, D] (Hugging Face's per-layer
cache tensors), or paged with `block_table` [B, max_blocks] int: [num_blocks, block_size,
Hkv, D] (vLLM's layout, kv_layout="vllm") or [num_blocks, Hkv, block_size, D]
(kv_layout="head_major"). `cache_lens[b]` counts the cached keys including the Sq new
tokens, which are the last Sq positions: query i sees keys j <= cache_len - Sq + i.
Positions past a length and blocks no sequence uses never contribute, whatever they hold.

Its own op rather than a mode of flash_attention: the arguments differ (a block table,
a cache longer than the keys in use), the kernel differs (the streamed kernel
`attention/decode_stream.py`: the whole batch per launch, keys on partitions, whole-slab
gathers), and decode needs no backward, so the op is inference-only (its autograd raises).

The kernel's piece tables are planned from `cache_lens` (and the block table) on the
host, so under `torch.compile` (traced through TorchNeuron's `nki_op`) the whole call is
one `nki_host::decode_attention` node.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ..attention.decode_host import decode
from .attention import SOFTMAX_SCALE_MIN
from .checks import FLOAT_DTYPES, check_is_tensor, check_positive, check_tensor
from .registry import call_host_op, define_host_op, define_op, tracing

HEAD_DIM_MAX = 256  # Q^T / K^T in 128-row chunks
PACKED_ROWS_MAX = 128  # (Hq / Hkv) * Sq rows share one 128-partition tile
INDEX_DTYPES = (torch.int32, torch.int64)
# paged block layouts: vLLM's [num_blocks, block_size, Hkv, D] and head-major
# [num_blocks, Hkv, block_size, D]
KV_LAYOUTS = ("vllm", "head_major")


def _validate(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_lens: Tensor,
    block_table: Tensor | None = None,
    **kw: Any,
) -> None:
    for arg, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(arg, t, dtypes=FLOAT_DTYPES, min_dim=4)
        if t.dim() != 4:
            raise ValueError(f"{arg}: expected 4 dims; got shape {tuple(t.shape)}")
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(
                f"{arg}: expected dtype {q.dtype} on {q.device} (as q); got {t.dtype} on {t.device}"
            )
    b, hq, sq, d = q.shape
    if d > HEAD_DIM_MAX:
        raise ValueError(f"q: expected head_dim (dim 3) <= {HEAD_DIM_MAX}; got {d}")
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(
            f"v_cache: expected shape {tuple(k_cache.shape)} (as k_cache); got "
            f"{tuple(v_cache.shape)}"
        )
    paged = block_table is not None
    kv_layout = kw.get("kv_layout", "vllm")
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout: expected one of {KV_LAYOUTS}; got {kv_layout!r}")
    head_major = paged and kv_layout == "head_major"
    layout = (
        ("[num_blocks, Hkv, block_size, D]" if head_major else "[num_blocks, block_size, Hkv, D]")
        if paged
        else "[B, Hkv, S_max, D]"
    )
    hkv = k_cache.shape[1] if head_major or not paged else k_cache.shape[2]
    if k_cache.shape[3] != d or (not paged and k_cache.shape[0] != b):
        raise ValueError(
            f"k_cache: expected {layout} with B = {b}, D = {d}; got {tuple(k_cache.shape)}"
        )
    if hq % hkv:
        raise ValueError(
            f"k_cache: expected a number of KV heads dividing q's {hq} (k_cache {layout}); "
            f"got {hkv}"
        )
    if hq // hkv * sq > PACKED_ROWS_MAX:
        raise ValueError(
            f"q: expected (Hq / Hkv) * Sq <= {PACKED_ROWS_MAX} (one packed tile per KV head); "
            f"got {hq // hkv} * {sq}"
        )
    check_tensor("cache_lens", cache_lens, dtypes=INDEX_DTYPES)
    if tuple(cache_lens.shape) != (b,):
        raise ValueError(f"cache_lens: expected shape ({b},) [B]; got {tuple(cache_lens.shape)}")
    if paged:
        assert block_table is not None
        check_tensor("block_table", block_table, dtypes=INDEX_DTYPES)
        if block_table.dim() != 2 or block_table.shape[0] != b:
            raise ValueError(
                f"block_table: expected shape ({b}, max_blocks); got {tuple(block_table.shape)}"
            )
    scale = kw.get("softmax_scale")
    if scale is not None:
        check_positive("softmax_scale", scale)
        if not math.isfinite(scale):
            raise ValueError(f"softmax_scale: expected a finite number; got {scale}")
        if scale < SOFTMAX_SCALE_MIN:  # masked keys' fill must still underflow to weight 0
            raise ValueError(
                f"softmax_scale: expected a number >= {SOFTMAX_SCALE_MIN:g} (masking limit); "
                f"got {scale:g}"
            )


def _fake(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_lens: Tensor, *args: Any, **kw: Any
) -> tuple[Tensor, Tensor]:
    b, h, s, _ = q.shape
    return torch.empty_like(q), q.new_empty((b, h, s), dtype=torch.float32)


def _examples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 1, 64, generator=g)
    kc = torch.randn(2, 2, 150, 64, generator=g)
    lens = torch.tensor([150, 37])
    pool = torch.randn(12, 16, 2, 64, generator=g)
    table = torch.tensor([[3, 0, 7], [11, 5, 2]], dtype=torch.int32)
    return [
        ((q, kc, kc.clone(), lens), {}),
        ((q, pool, pool.clone(), torch.tensor([40, 3]), table), {"softmax_scale": 0.2}),
    ]


def _decode_attention_op(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_lens: Tensor,
    block_table: Tensor | None = None,
    *,
    softmax_scale: float | None = None,
    kv_layout: str = "vllm",
) -> tuple[Tensor, Tensor]:
    """(out, lse) of Sq new queries over the cache; see the module docstring."""
    if tracing(q, k_cache, cache_lens, block_table):  # the piece plan reads cache_lens
        return call_host_op("decode_attention", q, k_cache, v_cache, cache_lens, block_table,
                            softmax_scale=softmax_scale, kv_layout=kv_layout)  # fmt: skip
    return decode(q, k_cache, v_cache, cache_lens, block_table, softmax_scale,
                  kv_layout=kv_layout)  # fmt: skip


define_host_op("decode_attention", _decode_attention_op, fake=_fake, validate=_validate)
define_op("decode_attention", _decode_attention_op, fake=_fake, validate=_validate,
          examples=_examples, traceable=True)  # fmt: skip


def decode_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_lens: Tensor,
    *,
    block_table: Tensor | None = None,
    softmax_scale: float | None = None,
    return_lse: bool = False,
    kv_layout: str = "vllm",
) -> Tensor | tuple[Tensor, Tensor]:
    """`torch.ops.nki.decode_attention`, returning `out` (or `(out, lse)`).

    Rows whose query sees no key (cache_len - Sq + i < 0) return 0 and lse = -inf.
    `kv_layout` (paged caches): "vllm" [num_blocks, block_size, Hkv, D] or
    "head_major" [num_blocks, Hkv, block_size, D].
    """
    check_is_tensor(q=q, k_cache=k_cache, v_cache=v_cache, cache_lens=cache_lens)
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse: expected a bool; got {type(return_lse).__name__}")
    out, lse = torch.ops.nki.decode_attention(
        q, k_cache, v_cache, cache_lens, block_table, softmax_scale=softmax_scale,
        kv_layout=kv_layout,
    )  # fmt: skip
    return (out, lse) if return_lse else out


__all__ = ["decode_attention"]
