"""`probe(model)`: which of a model's ops this library takes over, which not, and why.

It inspects the modules and the config (it runs nothing, so a model built on the meta
device works) with the same rules `patch` applies, plus the limits of the ops that only
show at run time: head_dim, attention dropout, the MoE expert count,
activation and dtype, and the masks that fall back to torch (`hf_attention`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..ops.attention import HEAD_DIM_MAX
from .hf import SUPPORTED_MODEL_TYPES, is_hf_model, is_hf_rmsnorm, is_hf_sparse_moe, moe_unsupported
from .swap import DEFAULT_SWAPS


@dataclass(frozen=True)
class Finding:
    """One kind of op in the model: how many, whether the library runs it, and why."""

    op: str
    count: int
    taken: bool
    why: str


def _attention(model: nn.Module, n: int) -> list[Finding]:
    config: Any = model.config
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    d = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else 0)
    window = getattr(config, "sliding_window", None)
    out = []
    if d > HEAD_DIM_MAX:
        return [Finding("attention", n, False, f"head_dim {d} > {HEAD_DIM_MAX}")]
    cap = getattr(config, "attn_logit_softcapping", None)
    kv = getattr(config, "num_key_value_heads", None) or heads
    how = f"flash_attention (head_dim {d}, GQA {heads}/{kv}"
    how += f", sliding window {window}" if window else ""
    how += f", logit softcap {cap})" if cap else ")"
    out.append(Finding("attention", n, True, how + "; padding -> segment_ids / kv_lens"))
    if float(getattr(config, "attention_dropout", 0.0) or 0.0) > 0:
        out.append(Finding("attention (training)", n, False, "attention dropout > 0: torch SDPA"))
    out.append(
        Finding(
            "attention, other masks (padded chunk over a KV cache, custom)",
            n,
            True,
            "flash_attention's dense attn_mask path",
        )
    )
    return out


def probe(model: nn.Module) -> list[Finding]:
    """What `nki_kernels.patch(model)` would run on the NKI ops, and what not, with why."""
    findings: list[Finding] = []
    hf = is_hf_model(model)
    kind = str(getattr(getattr(model, "config", None), "model_type", ""))
    if hf and kind not in SUPPORTED_MODEL_TYPES:
        return [
            Finding(
                f"model type {kind!r}",
                1,
                False,
                f"patch supports {', '.join(SUPPORTED_MODEL_TYPES)}",
            )
        ]
    taken: Counter[str] = Counter()
    moe_skips: Counter[str] = Counter()
    other: Counter[str] = Counter()
    attn = 0
    for _, m in model.named_modules():
        name = type(m).__name__
        if hf and is_hf_rmsnorm(m):
            taken[f"{name} -> nki rms_norm"] += 1
        elif hf and is_hf_sparse_moe(m):
            why = moe_unsupported(model, m)
            if why is None:
                taken[f"{name} -> nki moe_mlp (router logits kept)"] += 1
            else:
                moe_skips[f"{name}: {why}"] += 1
        elif not hf and type(m) in DEFAULT_SWAPS:
            taken[f"{name} -> nki {name}"] += 1
        elif hf and name.endswith("Attention"):
            attn += 1
        elif isinstance(m, nn.Linear):
            other["nn.Linear"] += 1
        elif name.endswith("MLP"):
            other[f"{name} (dense MLP or shared expert)"] += 1
        elif name.endswith("RotaryEmbedding"):
            other[name] += 1
        elif isinstance(m, nn.LayerNorm | nn.GroupNorm) or "Norm" in name:
            other[name] += 1
    findings += [
        Finding(op, n, True, "patch swaps it (parameters shared)") for op, n in taken.items()
    ]
    if attn:
        findings += _attention(model, attn)
    elif not hf:
        findings.append(
            Finding(
                "scaled_dot_product_attention calls",
                0,
                False,
                "not visible in modules: call nki_kernels.sdpa (or assign it to "
                "F.scaled_dot_product_attention)",
            )
        )
    findings += [Finding(op, n, False, "unsupported") for op, n in moe_skips.items()]
    reasons = {
        "nn.Linear": "plain matmuls: left to the compiler's native lowering (no kernel here)",
    }
    for op in other:
        if op.endswith("RotaryEmbedding"):
            reasons[op] = "elementwise: left to the compiler (no kernel here)"
    for op, n in other.items():
        findings.append(Finding(op, n, False, reasons.get(op, "no kernel in this library")))
    dtypes = {p.dtype for p in model.parameters()}
    if torch.float16 in dtypes and any("moe_mlp" in f.op for f in findings if f.taken):
        findings.append(Finding("fp16 MoE", 1, False, "moe_mlp runs fp32 / bf16 only"))
    return findings


def render(findings: list[Finding]) -> str:
    """The findings as a Markdown table."""
    rows = ["| op | count | NKI | why |", "|---|---:|:---:|---|"]
    for f in findings:
        rows.append(f"| {f.op} | {f.count} | {'yes' if f.taken else 'no'} | {f.why} |")
    return "\n".join(rows)


__all__ = ["Finding", "probe", "render"]
