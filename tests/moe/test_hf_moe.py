"""`nki_kernels.patch` on tiny random-init DeepSeek-V3 and Qwen3-MoE models (no download):
logits, every gradient and the router's outputs match the unpatched model; generate()
gives the same tokens; GPT-OSS is refused by name."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import nki_kernels

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)
ATOL, RTOL = 2e-5, 1e-4  # fp32: the same sums in other orders, 2 layers deep


def _deepseek_v3() -> Any:
    cfg = transformers.DeepseekV3Config(
        vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        n_routed_experts=16, n_shared_experts=1, num_experts_per_tok=4, n_group=4,
        topk_group=2, first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, routed_scaling_factor=2.5,
        norm_topk_prob=True, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(cfg).float()
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # selection-only bias, non-zero
                b.copy_(torch.randn(b.shape) * 0.2)
    return model


def _qwen3_moe(**kw: Any) -> Any:
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=64,
        **kw,
    )  # fmt: skip
    torch.manual_seed(1)
    return transformers.Qwen3MoeForCausalLM(cfg).float()


BUILD = {"deepseek_v3": _deepseek_v3, "qwen3_moe": _qwen3_moe}


def _loss_and_grads(model: Any, ids: torch.Tensor) -> tuple[Any, ...]:
    model.zero_grad()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), out.loss.detach(), grads


@pytest.mark.parametrize("model_type", sorted(BUILD))
def test_patched_logits_and_every_gradient_match(model_type: str) -> None:
    model = BUILD[model_type]().train()
    keys = list(model.state_dict())
    ids = torch.randint(3, 128, (2, 11), generator=torch.Generator().manual_seed(0))
    ref = _loss_and_grads(model, ids)
    report = nki_kernels.patch(model)
    kinds = " ".join(report.counts())
    expected = "HFExperts" if model_type == "deepseek_v3" else "HFSparseMoeBlock"
    assert expected in kinds, str(report)
    assert list(model.state_dict()) == keys
    logits, loss, grads = _loss_and_grads(model, ids)
    torch.testing.assert_close(logits, ref[0], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(loss, ref[1], atol=ATOL, rtol=RTOL)
    assert grads.keys() == ref[2].keys()
    for name, g in grads.items():
        torch.testing.assert_close(g, ref[2][name], atol=ATOL, rtol=RTOL, msg=name)
    nki_kernels.unpatch(model)
    assert not any("nki_kernels" in type(m).__module__ for m in model.modules())


@pytest.mark.parametrize("model_type", sorted(BUILD))
def test_generate_gives_the_same_tokens(model_type: str) -> None:
    model = BUILD[model_type]().eval()
    ids = torch.randint(3, 128, (1, 7), generator=torch.Generator().manual_seed(2))
    kw = {"max_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    ref = model.generate(input_ids=ids, **kw)
    nki_kernels.patch(model)
    assert torch.equal(model.generate(input_ids=ids, **kw), ref)


def test_qwen3_moe_router_logits_and_aux_loss_survive() -> None:
    model = _qwen3_moe(output_router_logits=True).train()
    ids = torch.randint(3, 128, (2, 9), generator=torch.Generator().manual_seed(3))
    ref = model(input_ids=ids, labels=ids)
    nki_kernels.patch(model)
    out = model(input_ids=ids, labels=ids)
    for a, b in zip(out.router_logits, ref.router_logits, strict=True):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)
    assert ref.aux_loss is not None and ref.aux_loss > 0
    torch.testing.assert_close(out.aux_loss, ref.aux_loss, atol=ATOL, rtol=RTOL)


def test_deepseek_v3_router_is_the_models_own() -> None:
    """The router (sigmoid, correction bias for selection only, group-limited top-k,
    scaling) still runs as the model's module: its outputs are those of the unpatched
    model, and the experts receive them."""
    model = _deepseek_v3().eval()
    ids = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(4))
    seen: list[Any] = []
    gate = model.model.layers[1].mlp.gate
    hook = gate.register_forward_hook(lambda m, a, o: seen.append(o))
    model(input_ids=ids)
    nki_kernels.patch(model)
    model(input_ids=ids)
    hook.remove()
    (logits0, w0, ids0), (logits1, w1, ids1) = seen  # inputs differ by the patched norms' ulps
    torch.testing.assert_close(logits1, logits0, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(w1, w0, atol=ATOL, rtol=RTOL)
    assert torch.equal(ids1, ids0)
    assert type(model.model.layers[1].mlp.experts).__name__ == "HFExperts"


def test_gpt_oss_is_refused_by_name() -> None:
    cfg = transformers.GptOssConfig(
        vocab_size=128, hidden_size=32, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_local_experts=4,
        num_experts_per_tok=2,
    )  # fmt: skip
    model = transformers.GptOssForCausalLM(cfg)
    with pytest.raises(ValueError, match="model_type 'gpt_oss'"):
        nki_kernels.patch(model)
