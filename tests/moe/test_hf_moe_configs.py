"""`nki_kernels.patch` on tiny random-init MoE models in configurations beside
test_hf_moe.py's: Qwen3-MoE with top-k 10 (> moe_mlp's 8) and with 160 experts (> 128),
both without renormalization or with it; Qwen2-MoE (sigmoid-gated shared expert,
norm_topk_prob False); Mixtral with 5 experts, top-3; DeepSeek-V3 with 2 groups keeping 1,
no renormalization, two shared experts and no dense layer; GPT-OSS with another clamp
limit and alpha. Each: the NKI ops run, logits, loss, every gradient, every layer's
router logits and the aux loss (output_router_logits=True) match the unpatched model,
and generate() gives the same tokens."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_hf_moe import _OpCalls  # tests/moe on sys.path

import nki_kernels

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)
ATOL, RTOL = 2e-5, 1e-4  # fp32: the same sums in other orders, 2 layers deep
VOCAB = 96


def _common(**kw: Any) -> dict[str, Any]:
    base = dict(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        max_position_embeddings=64, output_router_logits=True,
    )  # fmt: skip
    return {**base, **kw}


def _qwen3(experts: int, top_k: int, norm: bool) -> Any:
    cfg = transformers.Qwen3MoeConfig(**_common(
        num_key_value_heads=1, head_dim=16, intermediate_size=48, moe_intermediate_size=8,
        num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=norm,
    ))  # fmt: skip
    return transformers.Qwen3MoeForCausalLM(cfg)


def _qwen2_moe() -> Any:
    cfg = transformers.Qwen2MoeConfig(**_common(
        num_key_value_heads=2, intermediate_size=48, moe_intermediate_size=8,
        shared_expert_intermediate_size=24, num_experts=6, num_experts_per_tok=3,
        norm_topk_prob=False,
    ))  # fmt: skip
    return transformers.Qwen2MoeForCausalLM(cfg)


def _mixtral() -> Any:
    cfg = transformers.MixtralConfig(**_common(
        num_key_value_heads=1, intermediate_size=24, num_local_experts=5, num_experts_per_tok=3,
    ))  # fmt: skip
    return transformers.MixtralForCausalLM(cfg)


def _deepseek_v3() -> Any:
    cfg = transformers.DeepseekV3Config(**_common(
        num_key_value_heads=2, intermediate_size=48, moe_intermediate_size=8,
        n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=3, n_group=2,
        topk_group=1, first_k_dense_replace=0, q_lora_rank=None, kv_lora_rank=16,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, routed_scaling_factor=1.5,
        norm_topk_prob=False,
    ))  # fmt: skip
    model = transformers.DeepseekV3ForCausalLM(cfg)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # selection-only bias, non-zero
                b.copy_(torch.randn(b.shape) * 0.3)
    return model


def _gpt_oss() -> Any:
    cfg = transformers.GptOssConfig(**_common(
        num_key_value_heads=1, head_dim=16, intermediate_size=8, num_local_experts=6,
        num_experts_per_tok=3, sliding_window=4, swiglu_limit=2.0,
    ))  # fmt: skip
    cfg.swiglu_alpha = 1.1
    model = transformers.GptOssForCausalLM(cfg)
    with torch.no_grad():  # non-zero biases and sinks; experts scaled so both clamps cut
        for name, p in model.named_parameters():
            if name.endswith(("_bias", "router.bias", "sinks")):
                p.copy_(torch.randn(p.shape) * 0.5)
            if name.endswith("gate_up_proj"):
                p.mul_(20.0)
    return model


# name: (builder, the nki op the patched MoE layers must run)
MODELS: dict[str, tuple[Any, str]] = {
    "qwen3-k10-no-renorm": (lambda: _qwen3(12, 10, False), "nki.moe_experts"),
    "qwen3-160-experts": (lambda: _qwen3(160, 3, True), "nki.moe_experts"),
    "qwen2-moe-no-renorm": (_qwen2_moe, "nki.moe_mlp"),
    "mixtral-5-top3": (_mixtral, "nki.moe_mlp"),
    "deepseek-v3-2-groups-keep-1": (_deepseek_v3, "nki.moe_route_options"),
    "gpt-oss-limit-2-alpha-1.1": (_gpt_oss, "nki.expert_act"),
}


def _run(model: Any, ids: torch.Tensor) -> tuple[Any, dict[str, torch.Tensor]]:
    model.zero_grad()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


@pytest.mark.parametrize("name", sorted(MODELS))
def test_patched_model_matches_in_training_and_generate(name: str) -> None:
    build, op = MODELS[name]
    torch.manual_seed(7)
    model = build().float().train()
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    ref, ref_grads = _run(model, ids)
    report = nki_kernels.patch(model)
    moe_skips = [s for s in report.skipped if "mlp" in s[0]]
    assert not moe_skips, str(report)
    with _OpCalls() as calls:
        out, grads = _run(model, ids)
    runs = sum(n for k, n in calls.calls.items() if k.startswith(op))  # op or op_train
    assert runs >= 2, calls.calls  # one per layer at least
    torch.testing.assert_close(out.logits, ref.logits, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(out.loss, ref.loss, atol=ATOL, rtol=RTOL)
    assert len(out.router_logits) == len(ref.router_logits) == 2
    for a, b in zip(out.router_logits, ref.router_logits, strict=True):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)
    if ref.aux_loss is not None:  # DeepSeek-V3 has none
        assert ref.aux_loss > 0
        torch.testing.assert_close(out.aux_loss, ref.aux_loss, atol=ATOL, rtol=RTOL)
    assert grads.keys() == ref_grads.keys()
    for n, g in grads.items():
        torch.testing.assert_close(g, ref_grads[n], atol=ATOL, rtol=RTOL, msg=n)
    model.eval()
    kw = {"max_new_tokens": 3, "do_sample": False, "pad_token_id": 0}
    prompt = ids[:1, :6]
    patched = model.generate(input_ids=prompt, **kw)
    nki_kernels.unpatch(model)
    assert torch.equal(patched, model.generate(input_ids=prompt, **kw))


@pytest.mark.parametrize("kind", ["deepseek_v3", "gpt_oss", "qwen3_moe"])
def test_top_k_above_16_keeps_the_models_moe_with_the_reason(kind: str) -> None:
    """Beyond the kernels' top-k <= 16 the router and the experts both stay the model's
    (patching the experts alone failed at the first forward), reported as skipped."""
    one = dict(num_hidden_layers=1, num_experts_per_tok=17)
    if kind == "deepseek_v3":
        cfg = transformers.DeepseekV3Config(**_common(
            num_key_value_heads=2, intermediate_size=48, moe_intermediate_size=8,
            n_routed_experts=20, n_shared_experts=1, n_group=1, topk_group=1,
            first_k_dense_replace=0, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8,
            qk_nope_head_dim=8, v_head_dim=8, **one,
        ))  # fmt: skip
        model = transformers.DeepseekV3ForCausalLM(cfg)
    elif kind == "gpt_oss":
        cfg = transformers.GptOssConfig(**_common(
            num_key_value_heads=1, head_dim=16, intermediate_size=8, num_local_experts=18,
            sliding_window=4, **one,
        ))  # fmt: skip
        model = transformers.GptOssForCausalLM(cfg)
    else:
        cfg = transformers.Qwen3MoeConfig(**_common(
            num_key_value_heads=1, head_dim=16, intermediate_size=48, moe_intermediate_size=8,
            num_experts=18, **one,
        ))  # fmt: skip
        model = transformers.Qwen3MoeForCausalLM(cfg)
    torch.manual_seed(3)
    model = model.float().eval()
    ids = torch.randint(3, VOCAB, (1, 5), generator=torch.Generator().manual_seed(1))
    ref = model(input_ids=ids).logits
    report = nki_kernels.patch(model)
    moe = [why for path, why in report.skipped if ".mlp" in path]
    assert moe and all("top-17" in why for why in moe), str(report)
    assert not any("Experts" in r.after or "Moe" in r.after for r in report.replaced)
    torch.testing.assert_close(model(input_ids=ids).logits, ref, atol=ATOL, rtol=RTOL)
