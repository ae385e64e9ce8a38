"""The cases `nki-kernels hwcheck` runs: every op at the README's model shapes.

Shapes come from `nki_kernels.model_shapes` (Llama-3 8B / 70B norms and attention at
2048 tokens, Llama-3 8B decode over a 2048-slot cache of ragged lengths, Mixtral-8x7B MoE
at 512 tokens), bf16; `quick=True` gives small shapes of
the same ops (odd sizes, ragged tiles) for a smoke test. Each case's reference is the
fp32 torch composition of `nki_kernels/*/reference.py`.

Cases that `make bench` also has (the norms at [16384, 4096], causal attention at
S = 2048) carry its row texts, so their measured rows show beside the modeled ones. The
bench's MoE cases fix the experts' token counts (uniform / skewed) rather than routing
logits, so no hwcheck MoE row is labelled with them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..model_shapes import LLAMA3_8B_ATTN, LLAMA3_8B_NORM, LLAMA3_70B_NORM, MIXTRAL_8X7B_MOE
from .hwcheck import Case

EPS = 1e-6
DECODE_LENS = [2048, 1500, 700, 33]  # ragged cache lengths of the decode case
BF16 = torch.bfloat16


def _norm_cases(rows: int, hidden: int, label: str, bench: bool = False) -> list[Case]:
    def make(g: torch.Generator) -> dict[str, Any]:
        return {
            "x": torch.randn(rows, hidden, generator=g).to(BF16),
            "residual": torch.randn(rows, hidden, generator=g).to(BF16),
            "weight": (1 + 0.1 * torch.randn(hidden, generator=g)).to(BF16),
            "bias": (0.1 * torch.randn(hidden, generator=g)).to(BF16),
        }

    from ..norm.reference import add_rms_norm_ref, layer_norm_ref, rms_norm_ref

    def only(*names: str) -> Any:
        return lambda g: {k: v for k, v in make(g).items() if k in names}

    red = max(rows, hidden)
    shape = f"{label} [{rows}, {hidden}] bf16"
    nki = torch.ops.nki

    def rows_of(op: str) -> tuple[str, str, str] | None:  # `make bench`'s norm row texts
        return (f"{op} fwd", f"{op} bwd", f"[{rows}, {hidden}] bf16") if bench else None

    return [
        Case("rms_norm", shape, only("x", "weight"),
             lambda i: nki.rms_norm(i["x"], i["weight"], EPS),
             lambda i: rms_norm_ref(i["x"], i["weight"], EPS)[0], red, rows_of("rms_norm")),
        Case("layer_norm", shape, only("x", "weight", "bias"),
             lambda i: nki.layer_norm(i["x"], i["weight"], i["bias"], 1e-5),
             lambda i: layer_norm_ref(i["x"], i["weight"], i["bias"], 1e-5)[0], red,
             rows_of("layer_norm")),
        Case("add_rms_norm", shape, only("x", "residual", "weight"),
             lambda i: nki.add_rms_norm(i["x"], i["residual"], i["weight"], EPS)[0],
             lambda i: add_rms_norm_ref(i["x"], i["residual"], i["weight"], EPS)[0], red,
             rows_of("add_rms_norm")),
    ]  # fmt: skip


def _attention_case(
    b: int, hq: int, hkv: int, s: int, d: int, label: str, bench: bool = False
) -> Case:
    from ..attention.reference import attention_reference

    def make(g: torch.Generator) -> dict[str, Any]:
        return {
            "q": torch.randn(b, hq, s, d, generator=g).to(BF16),
            "k": torch.randn(b, hkv, s, d, generator=g).to(BF16),
            "v": torch.randn(b, hkv, s, d, generator=g).to(BF16),
        }

    # `make bench`'s attention row texts (its cases have B = 1)
    bench_rows = (
        "flash_attention fwd causal",
        "flash_attention bwd causal",
        f"B={b} H={hq}/{hkv} S={s} D={d} bf16",
    )
    return Case(
        "flash_attention",
        f"{label} B={b} Hq={hq} Hkv={hkv} S={s} D={d} causal bf16",
        make,
        lambda i: torch.ops.nki.flash_attention(i["q"], i["k"], i["v"], causal=True),
        lambda i: attention_reference(i["q"], i["k"], i["v"], causal=True)[0],
        max(s, d),
        bench_rows if bench else None,
    )


def _decode_case(
    b: int, hq: int, hkv: int, s_max: int, d: int, lens: list[int], label: str
) -> Case:
    """One new token per sequence over a contiguous cache of ragged lengths (inference)."""
    from ..attention.reference import attention_reference

    def make(g: torch.Generator) -> dict[str, Any]:
        return {
            "q": torch.randn(b, hq, 1, d, generator=g).to(BF16),
            "k_cache": torch.randn(b, hkv, s_max, d, generator=g).to(BF16),
            "v_cache": torch.randn(b, hkv, s_max, d, generator=g).to(BF16),
            "cache_lens": torch.tensor(lens),
        }

    def call(i: dict[str, Any]) -> Any:
        return torch.ops.nki.decode_attention(i["q"], i["k_cache"], i["v_cache"],
                                              i["cache_lens"])[0]  # fmt: skip

    def ref(i: dict[str, Any]) -> Any:  # Sq = 1: the new token sees keys < cache_len
        lens_t = i["cache_lens"].to(torch.int64)
        return attention_reference(i["q"], i["k_cache"], i["v_cache"], kv_lens=lens_t)[0]

    shape = f"{label} B={b} Hq={hq} Hkv={hkv} S_max={s_max} D={d} lens={lens} bf16"
    return Case("decode_attention", shape, make, call, ref, max(s_max, d), backward=False)


def _moe_case(t: int, h: int, inter: int, e: int, k: int, label: str) -> Case:
    from ..moe.reference import moe_reference

    def make(g: torch.Generator) -> dict[str, Any]:
        return {
            "hidden": torch.randn(t, h, generator=g).to(BF16),
            "router_logits": torch.randn(t, e, generator=g).to(BF16),
            "w_gate_up": (torch.randn(e, h, 2 * inter, generator=g) * h**-0.5).to(BF16),
            "w_down": (torch.randn(e, inter, h, generator=g) * inter**-0.5).to(BF16),
        }

    def call(i: dict[str, Any]) -> Any:
        return torch.ops.nki.moe_mlp(
            i["hidden"], i["router_logits"], i["w_gate_up"], i["w_down"], top_k=k
        )

    def ref(i: dict[str, Any]) -> Any:
        return moe_reference(i["hidden"], i["router_logits"], i["w_gate_up"], i["w_down"], k)

    return Case("moe_mlp", f"{label} T={t} H={h} I={inter} E={e} k={k} bf16", make, call, ref,
                max(h, inter, t))  # fmt: skip


def all_cases(quick: bool = False) -> list[Case]:
    """Every case: the README's shapes, or (quick) small odd ones."""
    if quick:
        return [
            *_norm_cases(300, 256, "small"),
            _attention_case(1, 2, 1, 640, 64, "small"),
            _decode_case(2, 4, 2, 150, 64, [150, 37], "small"),
            _moe_case(100, 128, 256, 4, 2, "small"),
        ]
    a, m = LLAMA3_8B_ATTN, MIXTRAL_8X7B_MOE
    return [
        *_norm_cases(2048, LLAMA3_8B_NORM.hidden, "llama3-8b"),
        *_norm_cases(2048, LLAMA3_70B_NORM.hidden, "llama3-70b"),
        *_norm_cases(16384, LLAMA3_8B_NORM.hidden, "bench", bench=True),
        _attention_case(1, a.num_heads, a.num_kv_heads, 2048, a.head_dim, a.model, bench=True),
        _decode_case(4, a.num_heads, a.num_kv_heads, 2048, a.head_dim, DECODE_LENS, a.model),
        _moe_case(512, m.hidden, m.intermediate, m.num_experts, m.top_k, m.model),
    ]


def cases_for(ops: Sequence[str] | None, quick: bool = False) -> list[Case]:
    """The cases of `ops` (None: all); ValueError naming unknown ops."""
    cases = all_cases(quick)
    if ops is None:
        return cases
    known = sorted({c.op for c in cases})
    unknown = [o for o in ops if o not in known]
    if unknown:
        raise ValueError(f"--ops: expected some of {known}; got {unknown}")
    return [c for c in cases if c.op in ops]


__all__ = ["all_cases", "cases_for"]
