"""`nki_kernels.patch` on tiny random-init DeepSeek-V3, Qwen3-MoE and GPT-OSS models (no
download): logits, every gradient and the router's outputs (router logits, aux loss)
match the unpatched model; generate() gives the same tokens."""

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


def _deepseek_v3(**kw: Any) -> Any:
    cfg = transformers.DeepseekV3Config(
        vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        n_routed_experts=16, n_shared_experts=1, num_experts_per_tok=4, n_group=4,
        topk_group=2, first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, routed_scaling_factor=2.5,
        norm_topk_prob=True, max_position_embeddings=64, **kw,
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


def _gpt_oss(**kw: Any) -> Any:
    kw.setdefault("num_hidden_layers", 2)
    cfg = transformers.GptOssConfig(
        vocab_size=128, hidden_size=32, intermediate_size=16,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_local_experts=8,
        num_experts_per_tok=2, max_position_embeddings=64, sliding_window=4, **kw,
    )  # fmt: skip
    torch.manual_seed(2)
    model = transformers.GptOssForCausalLM(cfg).float()
    with torch.no_grad():  # non-zero biases and sinks; experts scaled so the clamps cut
        for name, p in model.named_parameters():
            if name.endswith(("_bias", "router.bias", "sinks")):
                p.copy_(torch.randn(p.shape) * 0.5)
            if name.endswith("gate_up_proj"):
                p.mul_(40.0)
    return model


BUILD = {"deepseek_v3": _deepseek_v3, "qwen3_moe": _qwen3_moe, "gpt_oss": _gpt_oss}
REPLACED = {
    "deepseek_v3": "HFExperts",
    "qwen3_moe": "HFSparseMoeBlock",
    "gpt_oss": "HFGatedExperts",
}


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
    assert REPLACED[model_type] in kinds, str(report)
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


def test_gpt_oss_generate_runs_the_decode_launch(monkeypatch: Any) -> None:
    """generate() is under no_grad with T <= 64: the patched GPT-OSS experts run one
    decode-kernel launch per layer call (moe_gated_decode), and the tokens are the
    unpatched model's."""
    import nki_kernels.ops.moe_gated_experts as gated_ops

    calls = []
    real = gated_ops.decode_gated_experts

    def counted(*a: Any, **k: Any) -> Any:
        calls.append(a[0].shape[0])
        return real(*a, **k)

    monkeypatch.setattr(gated_ops, "decode_gated_experts", counted)
    model = BUILD["gpt_oss"]().eval()
    ids = torch.randint(3, 128, (1, 7), generator=torch.Generator().manual_seed(3))
    kw = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": 0}
    ref = model.generate(input_ids=ids, **kw)
    nki_kernels.patch(model)
    assert torch.equal(model.generate(input_ids=ids, **kw), ref)
    layers = model.config.num_hidden_layers
    assert calls[:layers] == [7] * layers and calls[layers:] == [1] * (3 * layers), calls


@pytest.mark.parametrize("model_type", ["deepseek_v3", "gpt_oss"])
def test_router_runs_on_the_nki_router_with_the_models_outputs(model_type: str) -> None:
    """DeepSeek-V3's router (sigmoid, correction bias for selection only, group-limited
    top-k, scaling) and GPT-OSS's (softmax over the top-k logits) run on
    `torch.ops.nki.moe_route_options`: logits, weights and chosen experts as the unpatched
    router's (experts compared as sets: transformers' top-k order is unspecified)."""
    model = BUILD[model_type]().eval()
    ids = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(4))
    layer = model.model.layers[1].mlp
    router = layer.gate if model_type == "deepseek_v3" else layer.router
    seen: list[Any] = []
    hook = router.register_forward_hook(lambda m, a, o: seen.append((a[0], o)))
    model(input_ids=ids)
    report = nki_kernels.patch(model)
    layer = model.model.layers[1].mlp  # DeepSeek-V3's block is HFSharedMoE now (same gate)
    new = layer.gate if model_type == "deepseek_v3" else layer.router
    assert type(new).__name__ == "Nki" + type(router).__name__ and isinstance(new, type(router))
    assert any(r.after.startswith("Nki") for r in report.replaced)
    with _OpCalls() as calls:
        model(input_ids=ids)
    hook.remove()
    assert calls.calls.get("nki.moe_route_options", 0) >= 1, calls.calls
    x = seen[0][0]
    logits0, w0, ids0 = router(x)  # the model's own router on the same input
    logits1, w1, ids1 = new(x)
    torch.testing.assert_close(logits1, logits0, atol=0, rtol=0)
    o0, o1 = ids0.argsort(-1), ids1.argsort(-1)
    assert torch.equal(ids1.gather(1, o1), ids0.gather(1, o0))
    torch.testing.assert_close(w1.gather(1, o1), w0.gather(1, o0), atol=1e-6, rtol=1e-6)
    assert len(seen) == 2  # hooks registered before the patch still run


@pytest.mark.parametrize("model_type", sorted(BUILD))
def test_router_logits_and_aux_loss_match(model_type: str) -> None:
    """output_router_logits=True: every layer's router logits, the aux loss and the loss
    with it, and the gradients through the routers, as unpatched."""
    model = BUILD[model_type](output_router_logits=True).train()
    ids = torch.randint(3, 128, (2, 9), generator=torch.Generator().manual_seed(5))
    ref = model(input_ids=ids, labels=ids)
    ref.loss.backward()
    ref_grads = {
        n: p.grad.clone() for n, p in model.named_parameters() if "gate" in n or "router" in n
    }
    model.zero_grad()
    nki_kernels.patch(model)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    assert len(out.router_logits) == len(ref.router_logits) > 0
    for a, b in zip(out.router_logits, ref.router_logits, strict=True):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)
    if ref.aux_loss is not None:
        assert ref.aux_loss > 0
        torch.testing.assert_close(out.aux_loss, ref.aux_loss, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(out.loss, ref.loss, atol=ATOL, rtol=RTOL)
    assert ref_grads
    for name, g in ref_grads.items():
        p = dict(model.named_parameters())[name]
        torch.testing.assert_close(p.grad, g, atol=ATOL, rtol=RTOL, msg=name)


def test_gpt_oss_clamps_cut_and_sink_attention_is_patched() -> None:
    """The test model reaches GPT-OSS's clamps (gate > 7, |up| > 7), so the matches above
    cover the clamped branches; its attention (sinks, sliding and full layers) runs the
    "nki" implementation: sink_attention in every layer."""
    model = _gpt_oss().eval()
    seen: list[Any] = []
    experts = model.model.layers[0].mlp.experts
    hook = experts.register_forward_hook(lambda m, a, o: seen.append(a))
    ids = torch.randint(3, 128, (1, 8), generator=torch.Generator().manual_seed(6))
    model(input_ids=ids)
    hook.remove()
    x, idx, _ = seen[0]
    z = (
        torch.einsum("th,thn->tn", x, experts.gate_up_proj[idx[:, 0]])
        + experts.gate_up_proj_bias[idx[:, 0]]
    )
    assert (z[:, 0::2] > 7).any() and (z[:, 1::2].abs() > 7).any()
    assert model.config.layer_types[:2] == ["sliding_attention", "full_attention"]
    report = nki_kernels.patch(model)
    assert not report.skipped, str(report)
    assert model.config._attn_implementation == "nki"
    assert type(model.model.layers[0].mlp.experts).__name__ == "HFGatedExperts"
    with _OpCalls() as calls:
        model(input_ids=ids)
    assert calls.calls.get("nki.sink_attention") == 2, calls.calls


class _OpCalls(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the nki ops dispatched (by name) while active."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func.overloadpacket)
        if name.startswith("nki."):
            self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def _padded(seed: int, b: int = 2, s: int = 11, pad: int = 4) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 128, (b, s), generator=g)
    mask = torch.ones(b, s, dtype=torch.long)
    mask[1, :pad] = 0  # left padding
    ids[1, :pad] = 0
    return ids, mask


def test_gpt_oss_sinks_on_a_left_padded_batch() -> None:
    """Padding makes the sink layers take flash_attention's segment / dense plans with its
    log-sum-exp joined to the sinks: logits of real tokens, loss and every gradient (the
    sinks' included) as unpatched."""
    model = _gpt_oss().train()
    ids, mask = _padded(seed=9)
    labels = ids.masked_fill(mask == 0, -100)

    def run() -> tuple[Any, ...]:
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return out.logits.detach(), out.loss.detach(), grads

    ref = run()
    nki_kernels.patch(model)
    with _OpCalls() as calls:
        logits, loss, grads = run()
    assert calls.calls.get("nki.flash_attention") == 2, calls.calls  # one per layer
    valid = mask.bool()
    torch.testing.assert_close(logits[valid], ref[0][valid], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(loss, ref[1], atol=ATOL, rtol=RTOL)
    assert grads.keys() == ref[2].keys() and any(n.endswith("sinks") for n in grads)
    for name, g in grads.items():
        torch.testing.assert_close(g, ref[2][name], atol=ATOL, rtol=RTOL, msg=name)


def test_gpt_oss_left_padded_batched_generate_gives_the_same_tokens() -> None:
    model = _gpt_oss().eval()
    ids, mask = _padded(seed=10, s=9, pad=3)
    kw = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    ref = model.generate(input_ids=ids, attention_mask=mask, **kw)
    nki_kernels.patch(model)
    assert torch.equal(model.generate(input_ids=ids, attention_mask=mask, **kw), ref)


def test_patched_gpt_oss_compiles_fullgraph() -> None:
    """torch.compile(fullgraph=True) of the patched GPT-OSS model (aot_eager): loss,
    logits and every gradient as the unpatched eager model."""
    model = _gpt_oss(num_hidden_layers=1).train()
    ids = torch.randint(3, 128, (2, 9), generator=torch.Generator().manual_seed(8))
    ref = _loss_and_grads(model, ids)
    nki_kernels.patch(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    logits, loss, grads = _loss_and_grads(compiled, ids)
    grads = {n.removeprefix("_orig_mod."): g for n, g in grads.items()}
    torch.testing.assert_close(logits, ref[0], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(loss, ref[1], atol=ATOL, rtol=RTOL)
    assert grads.keys() == ref[2].keys()
    for name, g in grads.items():
        torch.testing.assert_close(g, ref[2][name], atol=ATOL, rtol=RTOL, msg=name)


@pytest.mark.parametrize("window", [None, 3])
def test_sinks_fallback_is_the_models_eager_formula(window: Any) -> None:
    """head_dim > 256 with sinks: not on the kernels; the fallback is GPT-OSS's eager
    attention (same output and gradients), counted by reason."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    from nki_kernels.integrations import hf_attention

    g = torch.Generator().manual_seed(11)
    q = torch.randn(2, 4, 7, 264, generator=g, requires_grad=True)
    k = torch.randn(2, 2, 7, 264, generator=g, requires_grad=True)
    v = torch.randn(2, 2, 7, 264, generator=g, requires_grad=True)
    sinks = torch.nn.Parameter(torch.randn(4, generator=g))
    module = torch.nn.Module()
    module.sinks, module.num_key_value_groups, module.is_causal = sinks, 2, True
    allowed = hf_attention._allowed(7, 7, True, window, "cpu")
    additive = torch.zeros(7, 7).masked_fill(~allowed, float("-inf"))[None, None]
    before = hf_attention.fallbacks().get("head_dim 264 > 256 with sinks", 0)
    outs = []
    for fn, mask, kw in (
        (eager_attention_forward, additive, {}),
        (hf_attention.nki_attention_forward, None, {"s_aux": sinks, "sliding_window": window}),
    ):
        out = fn(module, q, k, v, mask, scaling=0.1, **kw)[0]
        grads = torch.autograd.grad(out.square().sum(), (q, k, v, sinks))
        outs.append((out.detach(), *grads))
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)
    assert hf_attention.fallbacks()["head_dim 264 > 256 with sinks"] == before + 1
