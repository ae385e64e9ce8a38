"""Cases for kernels of aws-neuron/nki-library (`src/nkilib_src/nkilib/...`).

Each case calls a kernel as its docstring documents (shapes from the docstring's
Dimensions / Args sections, at small sizes) and compares with the kernel's own torch
reference in the checkout (`<kernel>_torch.py`), which takes the kernel's arguments.
Kernels that are plain functions (no `@nki.jit` in the library) are wrapped in
`nki.jit`, as the library's tests do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from .runner import Case

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.float32
LIB = "nkilib.core"


def _torch(x: Any) -> Any:
    import torch

    if isinstance(x, np.ndarray):
        if x.dtype.kind == "f" or x.dtype == BF16:
            return torch.tensor(x.astype(np.float32))
        return torch.tensor(x)
    return x


def torch_ref(module: str, attr: str, keys: tuple[str, ...] | None = None) -> Callable[..., Any]:
    """The checkout's torch reference `module.attr`, called with the kernel's arguments
    (arrays as fp32 / integer torch tensors); returns the values of `keys` (dict result)."""

    def reference(ctx: Any, args: Any, kwargs: Any) -> Any:
        fn = ctx.load(module, attr)
        out = fn(*(_torch(a) for a in args), **{k: _torch(v) for k, v in kwargs.items()})
        if isinstance(out, dict):
            return tuple(out[k] for k in keys) if keys else tuple(out.values())
        return out

    return reference


def _arrays(*specs: tuple[tuple[int, ...], Any], scale: float = 1.0, **kw: Any) -> Any:
    def build(rng: np.random.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
        arrays = tuple((rng.standard_normal(s) * scale).astype(d) for s, d in specs)
        return arrays, dict(kw)

    return build


# ---- attention_cte ------------------------------------------------------------------------
CTE = f"{LIB}.attention.attention_cte"
CTE_REF = torch_ref(f"{CTE}_torch", "attention_cte_torch_ref")


def _cte(b: int, sq: int, sk: int, d: int, causal: bool) -> Any:
    def build(rng: np.random.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
        q = rng.standard_normal((b, sq, d)).astype(BF16)  # tp_q=True: (b, sq, d)
        k = rng.standard_normal((b, d, sk)).astype(BF16)  # tp_k=False: (b, d, sk)
        v = rng.standard_normal((b, sk, d)).astype(BF16)
        return (q, k, v), {"scale": float(d) ** -0.5, "causal_mask": causal}

    return build


# ---- router_topk --------------------------------------------------------------------------
TOPK = f"{LIB}.router_topk.router_topk"


def _router(t: int, h: int, e: int, k: int, act: str) -> Any:
    def build(rng: np.random.Generator, ctx: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        act_t = ctx.load(f"{LIB}.utils.common_types", "RouterActFnType")
        x = rng.standard_normal((h, t)).astype(BF16)  # x_hbm_layout 0: [H, T]
        w = (rng.standard_normal((h, e)) / np.sqrt(h)).astype(BF16)
        bias = rng.standard_normal((1, e)).astype(BF16)
        logits = np.zeros((t, e), F32)
        affin = np.zeros((t, e), F32)
        index = np.zeros((t, k), np.uint32)
        args = (x, w, bias, logits, affin, index, getattr(act_t, act), k, 0, 0)
        return args, {}

    return build


def _router_ref(ctx: Any, args: Any, kwargs: Any) -> Any:
    ref = torch_ref(f"{TOPK}_torch", "router_topk_torch_ref",
                    ("router_logits", "expert_index", "expert_affinities"))  # fmt: skip
    logits, index, affin = ref(ctx, args, kwargs)
    return logits, np.asarray(index), affin


# ---- the rest -----------------------------------------------------------------------------
def _nonzero(t: int, c: int) -> Any:
    def build(rng: np.random.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
        x = (rng.random((t, c)) < 0.2).astype(F32) * rng.integers(1, 9, (t, c)).astype(F32)
        return (x,), {}

    return build


def _flatten(e: int, t: int, f_len: int) -> Any:
    def build(rng: np.random.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
        x = rng.integers(0, 1000, (e, t)).astype(np.int32)
        blocks = t // f_len
        offsets = (np.arange(e, dtype=np.int32) * blocks).astype(np.int32)
        return (x, f_len, e * t, offsets), {}

    return build


def _rope(d: int, b: int, h: int, s: int, contiguous: bool) -> Any:
    def build(rng: np.random.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
        x = rng.standard_normal((d, b, h, s)).astype(F32)
        ang = rng.uniform(0, np.pi, (d // 2, b, s))
        return (x, np.cos(ang).astype(F32), np.sin(ang).astype(F32)), {
            "contiguous_layout": contiguous
        }

    return build


def _rope_hf(b: int, hq: int, hk: int, s: int, d: int) -> Any:
    def build(rng: np.random.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
        q = rng.standard_normal((b, hq, s, d)).astype(F32)
        k = rng.standard_normal((b, hk, s, d)).astype(F32)
        ang = rng.uniform(0, np.pi, (b, s, d))
        return (q, k, np.zeros_like(q), np.zeros_like(k)), {
            "cos": np.cos(ang).astype(F32),
            "sin": np.sin(ang).astype(F32),
        }

    return build


CASES: list[Case] = [
    Case("attention_cte", "causal 1x512x512 d128 bf16", CTE, "attention_cte",
         _cte(1, 512, 512, 128, True), CTE_REF, jit=True, rtol=2e-2, atol=2e-2),
    Case("attention_cte", "non-causal 2x256x1024 d64 bf16", CTE, "attention_cte",
         _cte(2, 256, 1024, 64, False), CTE_REF, jit=True, rtol=2e-2, atol=2e-2),
    Case("attention_cte", "causal 1x1024x1024 d128 bf16 LNC2", CTE, "attention_cte",
         _cte(1, 1024, 1024, 128, True), CTE_REF, jit=True, lnc=2, rtol=2e-2, atol=2e-2),
    Case("cumsum", "(4, 300) fp32 axis -1", f"{LIB}.cumsum.cumsum", "cumsum",
         _arrays(((4, 300), F32)), torch_ref(f"{LIB}.cumsum.cumsum_torch", "cumsum_torch_ref"),
         rtol=1e-4, atol=1e-4),
    Case("cascaded_max", "(1, 2, 4096) fp32 LNC2", f"{LIB}.max.cascaded_max", "cascaded_max",
         _arrays(((1, 2, 4096), F32)),
         torch_ref(f"{LIB}.max.cascaded_max_torch", "cascaded_max_torch_ref"), lnc=2,
         rtol=0, atol=0),
    Case("cascaded_max", "(1, 1, 8192) fp32", f"{LIB}.max.cascaded_max", "cascaded_max",
         _arrays(((1, 1, 8192), F32)),
         torch_ref(f"{LIB}.max.cascaded_max_torch", "cascaded_max_torch_ref"), rtol=0, atol=0),
    Case("router_topk", "T=128 H=256 E=16 k=2 softmax", TOPK, "router_topk",
         _router(128, 256, 16, 2, "SOFTMAX"), _router_ref, jit=True, rtol=2e-2, atol=2e-2),
    Case("find_nonzero_indices", "T=256 C=8 LNC2", f"{LIB}.subkernels.find_nonzero_indices",
         "find_nonzero_indices", _nonzero(256, 8),
         torch_ref(f"{LIB}.subkernels.find_nonzero_indices_torch",
                   "find_nonzero_indices_torch_ref"), lnc=2, rtol=0, atol=0),
    Case("indexed_flatten", "E=4 T=2048 f_len=128 LNC2", f"{LIB}.subkernels.indexed_flatten",
         "indexed_flatten", _flatten(4, 2048, 128),
         torch_ref(f"{LIB}.subkernels.indexed_flatten_torch", "indexed_flatten_torch_ref"),
         lnc=2, rtol=0, atol=0),
    Case("RoPE", "d128 B1 H2 S256 contiguous fp32", f"{LIB}.embeddings.rope", "RoPE",
         _rope(128, 1, 2, 256, True), torch_ref(f"{LIB}.embeddings.rope_torch", "rope_torch_ref"),
         rtol=1e-4, atol=1e-4),
    Case("RoPE", "d64 B2 H1 S128 interleaved fp32", f"{LIB}.embeddings.rope", "RoPE",
         _rope(64, 2, 1, 128, False),
         torch_ref(f"{LIB}.embeddings.rope_torch", "rope_torch_ref"), rtol=1e-4, atol=1e-4),
    Case("rope_hf", "B1 Hq4 Hk2 S128 d64 fp32", f"{LIB}.embeddings.rope_hf", "rope_hf",
         _rope_hf(1, 4, 2, 128, 64),
         torch_ref(f"{LIB}.embeddings.rope_hf_torch", "rope_hf_torch_ref"),
         rtol=1e-4, atol=1e-4),
]  # fmt: skip


# ---- moe_cte (blockwise MoE MLP) -----------------------------------------------------------
# Compared with nki-library's own `moe_cte_torch_ref`, which names the variant with the
# `BWMMFunc` enum of the library's test helpers (imported from the checkout's `test/`;
# their `neuron_dtypes` import gets the loader's stand-in when AWS's package is absent).
MOE = f"{LIB}.moe.moe_cte.moe_cte"
_BWMM = {"shard_on_i": "SHARD_ON_INTERMEDIATE", "shard_on_block": "SHARD_ON_BLOCK"}


def _moe(t: int, h: int, i: int, e: int, b: int, k: int, impl: str) -> Any:
    def build(rng: np.random.Generator, ctx: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        chosen = np.argsort(rng.random((t, e)), axis=1)[:, :k]  # k distinct experts a token
        slots: list[int] = []
        block_expert: list[int] = []
        for ex in range(e):  # each expert's tokens in blocks of b, padded with token id t
            toks = [int(v) for v in np.flatnonzero((chosen == ex).any(axis=1))]
            nblk = max(1, -(-len(toks) // b))
            toks += [t] * (nblk * b - len(toks))
            slots += toks
            block_expert += [ex] * nblk
        x = np.zeros((t + 1, h), np.float32)
        x[:t] = rng.standard_normal((t, h))
        aff = np.zeros((t + 1, e), np.float32)
        for j in range(k):
            aff[np.arange(t), chosen[:, j]] = rng.uniform(0.2, 1.0, t) / k
        wgu = (rng.standard_normal((e, h, 2, i)) / np.sqrt(h)).astype(BF16)
        wd = (rng.standard_normal((e, i, h)) / np.sqrt(i)).astype(BF16)
        spec_t = ctx.load(MOE, "MoECTESpec")
        impl_t = ctx.load(MOE, "MoECTEImplementation")
        args = (
            x.astype(BF16),
            aff.reshape(-1, 1).astype(BF16),
            wgu,
            wd,
            np.asarray(slots, np.int32),
            np.asarray(block_expert, np.int32).reshape(-1, 1),
            b,
            spec_t(implementation=getattr(impl_t, impl)),
        )
        # as AWS's tests call it (test_moe_cte_common): accumulate across experts for top-k > 1
        return args, {"is_tensor_update_accumulating": k != 1}

    return build


def _real_tokens(out: Any) -> Any:
    out = out[0] if isinstance(out, tuple) else out
    return out[:-1]  # without the padding token's row


def _moe_ref(impl: str, k: int) -> Callable[..., Any]:
    def reference(ctx: Any, args: Any, kwargs: Any) -> Any:
        import torch

        fn = ctx.load(f"{MOE}_torch", "moe_cte_torch_ref")
        bwmm = ctx.load("test.integration.nkilib.core.moe.moe_cte.test_moe_cte_common", "BWMMFunc")
        x, aff, wgu, wd, slots, block_expert, b, _ = args
        out = fn(
            _torch(x), _torch(aff), _torch(wgu), _torch(wd), torch.tensor(slots),
            torch.tensor(block_expert), b, getattr(bwmm, _BWMM[impl]), lnc_degree=2,
            is_tensor_update_accumulating=kwargs["is_tensor_update_accumulating"], top_k=k,
        )  # fmt: skip
        # the padding token's row (index T) is scratch: shard_on_block leaves one of its
        # two core slices unwritten, and AWS's shard_on_block tests all skip that token
        return out["output"][: x.shape[0] - 1]

    return reference


CASES += [
    Case("moe_cte", "shard_on_i T=512 H=512 I=256 E=4 B=256 top2 LNC2", MOE, "moe_cte",
         _moe(512, 512, 256, 4, 256, 2, "shard_on_i"), _moe_ref("shard_on_i", 2), jit=True, lnc=2,
         rtol=3e-2, atol=3e-2, select=_real_tokens),
    Case("moe_cte", "shard_on_block T=512 H=512 I=256 E=4 B=256 top2 LNC2", MOE, "moe_cte",
         _moe(512, 512, 256, 4, 256, 2, "shard_on_block"), _moe_ref("shard_on_block", 2), jit=True,
         lnc=2, rtol=3e-2, atol=3e-2, select=_real_tokens),
]  # fmt: skip


# ---- TKG norm subkernels (output in SBUF [128, B*S, H/128]) -------------------------------
def _sbuf_out_norm(fn: Any) -> Any:
    """A kernel of ours around a TKG norm subkernel: x, gamma in HBM -> its SBUF output,
    copied to shared HBM."""
    from ..nki import nisa, nl

    def kernel(x: Any, gamma: Any) -> Any:
        rows, h = x.shape[0] * x.shape[1], x.shape[2]
        o = nl.ndarray((128, rows, h // 128), x.dtype, buffer=nl.sbuf)
        fn(x, gamma, o)
        out = nl.ndarray((128, rows, h // 128), x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=o)
        return out

    return kernel


def _norm_ref(module: str, attr: str) -> Callable[..., Any]:
    def reference(ctx: Any, args: Any, kwargs: Any) -> Any:
        fn = ctx.load(module, attr)
        return fn(_torch(args[0]), _torch(args[1]), None)["out"]

    return reference


SUB = f"{LIB}.subkernels"
CASES += [
    Case("rmsnorm_tkg", "B2 S8 H1024 bf16", f"{SUB}.rmsnorm_tkg", "rmsnorm_tkg",
         _arrays(((2, 8, 1024), BF16), ((1, 1024), BF16)),
         _norm_ref(f"{SUB}.rmsnorm_torch", "rmsnorm_tkg_torch_ref_lnc1"), wrap=_sbuf_out_norm,
         rtol=2e-2, atol=3e-2),
    Case("rmsnorm_tkg", "B2 S8 H1024 bf16 LNC2", f"{SUB}.rmsnorm_tkg", "rmsnorm_tkg",
         _arrays(((2, 8, 1024), BF16), ((1, 1024), BF16)),
         _norm_ref(f"{SUB}.rmsnorm_torch", "rmsnorm_tkg_torch_ref"), wrap=_sbuf_out_norm,
         lnc=2, rtol=2e-2, atol=3e-2),
    Case("layernorm_tkg", "B2 S8 H1024 bf16", f"{SUB}.layernorm_tkg", "layernorm_tkg",
         _arrays(((2, 8, 1024), BF16), ((1, 1024), BF16)),
         _norm_ref(f"{SUB}.layernorm_torch", "layernorm_tkg_torch_ref_lnc1"),
         wrap=_sbuf_out_norm, rtol=2e-2, atol=3e-2),
    Case("layernorm_tkg", "B2 S8 H1024 bf16 LNC2", f"{SUB}.layernorm_tkg", "layernorm_tkg",
         _arrays(((2, 8, 1024), BF16), ((1, 1024), BF16)),
         _norm_ref(f"{SUB}.layernorm_torch", "layernorm_tkg_torch_ref"), wrap=_sbuf_out_norm,
         lnc=2, rtol=2e-2, atol=3e-2),
]  # fmt: skip
