"""Real model shapes, shared by tests, tuning buckets and benchmarks.

Published architecture hyper-parameters of the models users run on Trainium. Tuning and
benchmarks take their shapes from here so that "Llama-3 8B" means the same everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionShape:
    model: str
    num_heads: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class NormShape:
    model: str
    hidden: int


@dataclass(frozen=True)
class MoEShape:
    model: str
    hidden: int
    intermediate: int
    num_experts: int
    top_k: int


LLAMA3_8B_ATTN = AttentionShape("llama3-8b", num_heads=32, num_kv_heads=8, head_dim=128)
LLAMA3_70B_ATTN = AttentionShape("llama3-70b", num_heads=64, num_kv_heads=8, head_dim=128)
MIXTRAL_8X7B_ATTN = AttentionShape("mixtral-8x7b", num_heads=32, num_kv_heads=8, head_dim=128)

LLAMA3_8B_NORM = NormShape("llama3-8b", hidden=4096)
LLAMA3_70B_NORM = NormShape("llama3-70b", hidden=8192)

MIXTRAL_8X7B_MOE = MoEShape("mixtral-8x7b", hidden=4096, intermediate=14336, num_experts=8, top_k=2)
# Fine-grained MoE (Qwen1.5-MoE-A2.7B-like: 60 routed experts rounded to 64, top-4 + shared
# experts in the original; the benchmarks use the 64 experts, top-6).
FINE_GRAINED_MOE = MoEShape(
    "fine-grained-64e", hidden=2048, intermediate=1408, num_experts=64, top_k=6
)
# The 2026 MoE models (issue shapes: routed experts only, from each published config.json)
DEEPSEEK_V3_LIKE_MOE = MoEShape(
    "deepseek-v3-like", hidden=7168, intermediate=2048, num_experts=256, top_k=8
)
QWEN3_MOE_LIKE_MOE = MoEShape(
    "qwen3-moe-like", hidden=2048, intermediate=768, num_experts=128, top_k=8
)
GPT_OSS_LIKE_MOE = MoEShape(
    "gpt-oss-like", hidden=2880, intermediate=2880, num_experts=128, top_k=4
)

ATTENTION_SHAPES = (LLAMA3_8B_ATTN, LLAMA3_70B_ATTN, MIXTRAL_8X7B_ATTN)
NORM_SHAPES = (LLAMA3_8B_NORM, LLAMA3_70B_NORM)
MOE_SHAPES = (MIXTRAL_8X7B_MOE, FINE_GRAINED_MOE)
MOE_MODEL_SHAPES = (
    MIXTRAL_8X7B_MOE, FINE_GRAINED_MOE, DEEPSEEK_V3_LIKE_MOE, QWEN3_MOE_LIKE_MOE, GPT_OSS_LIKE_MOE,
)  # fmt: skip

# Sequence lengths / token counts the benchmarks and shipped configs cover.
SEQUENCE_LENGTHS = (2048, 8192, 32768)
TOKEN_COUNTS = (512, 4096, 16384)
