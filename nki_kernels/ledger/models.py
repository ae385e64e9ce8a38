"""The models the ledger prices: the published architecture numbers a layer's cost needs.

Each entry is read off the model's published `config.json` (Hugging Face hub, the repo
named in `source`); "-like" entries keep the shape of the original where our ops can
express it and say what they change. A transformers config (a `config.json` file or a
directory holding one) is read the same way, with no transformers import.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from ..model_shapes import (
    DEEPSEEK_V3_LIKE_MOE,
    LLAMA3_8B_ATTN,
    LLAMA3_70B_ATTN,
    MIXTRAL_8X7B_ATTN,
    MIXTRAL_8X7B_MOE,
    QWEN3_MOE_LIKE_MOE,
    AttentionShape,
    MoEShape,
)


@dataclass(frozen=True)
class ModelSpec:
    """One decoder-only transformer, as far as its per-layer cost goes."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int = 0  # dense MLP width (0: every layer is MoE)
    experts: int = 0  # routed experts (0: dense model)
    top_k: int = 0
    moe_intermediate: int = 0
    shared_intermediate: int = 0  # shared-expert MLP width beside the routed experts
    dense_layers: int = 0  # leading layers with a dense MLP in an MoE model
    # multi-head latent attention (DeepSeek-V2 / V3; 0: plain attention): queries through
    # a rank-`q_lora_rank` bottleneck, keys and values from a `kv_lora_rank` latent plus
    # one shared rotary key of `qk_rope_dim`; q / k heads are nope_dim + qk_rope_dim wide,
    # v heads head_dim (`ledger/mla.py`)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_dim: int = 0
    qk_nope_dim: int = 0  # the q / k heads' non-rotary part (0: head_dim)
    source: str = ""
    changes: str = ""  # what a "-like" entry changes from the original

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    def attention_shape(self) -> AttentionShape:
        return AttentionShape(self.name, self.heads, self.kv_heads, self.head_dim)

    def moe_shape(self) -> MoEShape:
        if not self.is_moe:
            raise ValueError(f"model: {self.name} has no MoE layers")
        return MoEShape(self.name, self.hidden, self.moe_intermediate, self.experts, self.top_k)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def nope_dim(self) -> int:
        return self.qk_nope_dim or self.head_dim

    def projections(self) -> list[tuple[str, int, int]]:
        """The attention block's matmuls left to the compiler: (name, K, N) of x[T, K] W[K, N]."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        if not self.is_mla:
            return [("qkv_proj", self.hidden, q + 2 * kv), ("o_proj", q, self.hidden)]
        qk = self.heads * (self.nope_dim + self.qk_rope_dim)
        q_in = [("q_a_proj", self.hidden, self.q_lora_rank), ("q_b_proj", self.q_lora_rank, qk)]
        return [
            *(q_in if self.q_lora_rank else [("q_proj", self.hidden, qk)]),
            ("kv_a_proj", self.hidden, self.kv_lora_rank + self.qk_rope_dim),
            ("kv_b_proj", self.kv_lora_rank, self.heads * (self.nope_dim + self.head_dim)),
            ("o_proj", q, self.hidden),
        ]


class _AttentionFields(TypedDict):
    heads: int
    kv_heads: int
    head_dim: int


class _MoEFields(TypedDict):
    hidden: int
    experts: int
    top_k: int
    moe_intermediate: int


def _attention(shape: AttentionShape) -> _AttentionFields:
    """ModelSpec's attention fields from the project's shared shape table."""
    return {"heads": shape.num_heads, "kv_heads": shape.num_kv_heads, "head_dim": shape.head_dim}


def _moe(shape: MoEShape) -> _MoEFields:
    """ModelSpec's routed-expert fields (and hidden size) from the shared MoE shape table."""
    return {
        "hidden": shape.hidden,
        "experts": shape.num_experts,
        "top_k": shape.top_k,
        "moe_intermediate": shape.intermediate,
    }


def _llama3(size: str, attn: AttentionShape, layers: int, hidden: int, inter: int) -> ModelSpec:
    """A Llama-3 size: its vocabulary is shared, the rest from meta-llama's config.json."""
    return ModelSpec(
        f"llama3-{size}",
        layers=layers,
        hidden=hidden,
        **_attention(attn),
        vocab=128256,
        intermediate=inter,
        source=f"meta-llama/Meta-Llama-3-{size.upper()} config.json",
    )


LLAMA3_8B = _llama3("8b", LLAMA3_8B_ATTN, layers=32, hidden=4096, inter=14336)
LLAMA3_70B = _llama3("70b", LLAMA3_70B_ATTN, layers=80, hidden=8192, inter=28672)
MIXTRAL_8X7B = ModelSpec(
    "mixtral-8x7b",
    layers=32,
    **_attention(MIXTRAL_8X7B_ATTN),
    **_moe(MIXTRAL_8X7B_MOE),
    vocab=32000,
    source="mistralai/Mixtral-8x7B-v0.1 config.json",
)
QWEN3_MOE_LIKE = ModelSpec(
    "qwen3-moe-like",
    layers=48,
    heads=32,
    kv_heads=4,
    head_dim=128,
    **_moe(QWEN3_MOE_LIKE_MOE),
    vocab=151936,
    source="Qwen/Qwen3-30B-A3B config.json",
    changes="the q / k RMSNorms of Qwen3 attention are left out",
)
DEEPSEEK_V3_LIKE = ModelSpec(
    "deepseek-v3-like",
    layers=61,
    heads=128,
    kv_heads=128,
    head_dim=128,
    vocab=129280,
    intermediate=18432,
    **_moe(DEEPSEEK_V3_LIKE_MOE),
    shared_intermediate=2048,
    dense_layers=3,
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_rope_dim=64,
    source="deepseek-ai/DeepSeek-V3 config.json",
    changes=(
        "multi-head latent attention priced as it runs (ledger/mla.py): q / k heads 192 wide "
        "(128 + 64 rotary), v heads 128, the latent projections and their RMSNorms as the "
        "compiler's matmuls and norms; our flash op takes one head dim for q, k and v, so "
        "ours falls back to TorchNeuron's SDPA (head dim 192: the S x S composition); "
        "decode is the absorbed form over the 576-value latent cache (DeepSeek's reference "
        "inference; transformers' DeepseekV3Attention caches per-head K / V instead, not "
        "priced), which our decode kernel cannot run (head dim <= 256, K and V one width): "
        "ours = the native composition; APPROXIMATED: sigmoid group-limited routing priced "
        "as top-8 softmax routing, and the rotary embedding left out as for every model"
    ),
)

MLA_NOTE = (
    "multi-head latent attention priced as it runs (ledger/mla.py): q / k heads nope + rope "
    "wide, v heads v_head_dim, the latent projections and norms as the compiler's ops; ours "
    "falls back to TorchNeuron's path (our kernels take one head dim for q, k and v); "
    "decode in the absorbed form over the latent cache; APPROXIMATED: the model's routing "
    "priced as top-k softmax routing"
)

MODELS: dict[str, ModelSpec] = {
    m.name: m for m in (LLAMA3_8B, LLAMA3_70B, MIXTRAL_8X7B, DEEPSEEK_V3_LIKE, QWEN3_MOE_LIKE)
}


def _get(cfg: dict[str, Any], *names: str, default: Any = None) -> Any:
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


def from_hf_config(path: str | Path) -> ModelSpec:
    """A ModelSpec from a transformers `config.json` (or a directory holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        cfg = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"model: cannot read a transformers config at {path}: {exc}") from None
    need = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
    missing = [k for k in need if k not in cfg]
    if missing:
        raise ValueError(f"model: {p} lacks {', '.join(missing)} (not a decoder config?)")
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    experts = int(_get(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0))
    shared = int(_get(cfg, "shared_expert_intermediate_size", default=0))
    if not shared and _get(cfg, "n_shared_experts"):
        shared = int(cfg["n_shared_experts"]) * int(_get(cfg, "moe_intermediate_size", default=0))
    inter = int(_get(cfg, "intermediate_size", default=0))
    mla = int(_get(cfg, "kv_lora_rank", default=0))
    head_dim = int(_get(cfg, "head_dim", default=hidden // heads))
    nope = 0
    if mla:  # DeepSeek's head_dim is the rotary part; ModelSpec.head_dim is the v width
        head_dim = int(_get(cfg, "v_head_dim", "qk_nope_head_dim", default=head_dim))
        nope = int(_get(cfg, "qk_nope_head_dim", default=head_dim))
    moe_inter = int(_get(cfg, "moe_intermediate_size", default=inter if experts else 0))
    return ModelSpec(
        name=str(_get(cfg, "_name_or_path", default="") or p.parent.name or "config"),
        layers=int(cfg["num_hidden_layers"]),
        hidden=hidden,
        heads=heads,
        kv_heads=int(_get(cfg, "num_key_value_heads", default=heads)),
        head_dim=head_dim,
        vocab=int(cfg["vocab_size"]),
        intermediate=inter,
        experts=experts,
        top_k=int(_get(cfg, "num_experts_per_tok", default=0)) if experts else 0,
        moe_intermediate=moe_inter if experts else 0,
        shared_intermediate=shared,
        dense_layers=int(_get(cfg, "first_k_dense_replace", default=0)) if experts else 0,
        q_lora_rank=int(_get(cfg, "q_lora_rank", default=0)) if mla else 0,
        kv_lora_rank=mla,
        qk_rope_dim=int(_get(cfg, "qk_rope_head_dim", default=0)) if mla else 0,
        qk_nope_dim=nope,
        source=f"transformers config {p}",
        changes=MLA_NOTE if mla else "",
    )


def get_model(name: str) -> ModelSpec:
    """A named model, or a transformers config path."""
    if name in MODELS:
        return MODELS[name]
    if Path(name).exists():
        return from_hf_config(name)
    raise ValueError(
        f"--model: expected one of {', '.join(MODELS)} or a transformers config path; got {name!r}"
    )
