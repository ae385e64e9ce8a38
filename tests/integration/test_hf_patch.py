"""`nki_kernels.patch` on tiny random-init transformers models (no download): logits and
gradients match the unpatched model on a left-padded batch, batched left-padded
`generate()` gives the same tokens, the router logits (aux loss) survive, and `unpatch`
restores the model."""

from __future__ import annotations

import pytest
import torch

import nki_kernels
from nki_kernels.integrations import hf_attention

transformers = pytest.importorskip("transformers")
from nki_kernels.parity.models import MODEL_TYPES, tiny_model  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)

# fp32 models: the NKI kernels vs torch's SDPA / eager norms / expert loop. Both are fp32
# computations of the same sums in different orders (a few ulps per op, 2 layers deep).
ATOL, RTOL = 2e-5, 1e-4


def _batch(seed: int = 0, b: int = 2, s: int = 11, pad: int = 4):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 128, (b, s), generator=g)
    mask = torch.ones(b, s, dtype=torch.long)
    mask[1, :pad] = 0  # left padding
    ids[1, :pad] = 0
    return ids, mask


def _loss_and_grads(model, ids, mask):
    model.zero_grad()
    labels = ids.masked_fill(mask == 0, -100)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), out.loss.detach(), grads


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_patched_logits_and_grads_match(model_type: str) -> None:
    model = tiny_model(model_type).train()
    keys = list(model.state_dict())
    ids, mask = _batch()
    logits_ref, loss_ref, grads_ref = _loss_and_grads(model, ids, mask)
    before = dict(hf_attention.fallbacks())
    report = nki_kernels.patch(model)
    kinds = " ".join(report.counts())
    assert "nki_kernels.nn.RMSNorm" in kinds and "sdpa -> nki" in kinds
    if "moe" in model_type or model_type == "mixtral":
        assert "HFSparseMoeBlock" in kinds
    assert list(model.state_dict()) == keys  # parameters shared, not copied
    logits, loss, grads = _loss_and_grads(model, ids, mask)
    assert hf_attention.fallbacks() == before  # every attention call ran the NKI op
    valid = mask.bool()
    torch.testing.assert_close(logits[valid], logits_ref[valid], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(loss, loss_ref, atol=ATOL, rtol=RTOL)
    assert grads.keys() == grads_ref.keys()
    for name, g in grads.items():
        torch.testing.assert_close(g, grads_ref[name], atol=ATOL, rtol=RTOL, msg=name)
    nki_kernels.unpatch(model)
    assert model.config._attn_implementation == "sdpa"
    assert not any("nki_kernels" in type(m).__module__ for m in model.modules())


@pytest.mark.parametrize("model_type", ["llama", "mistral", "mixtral"])
def test_left_padded_batched_generate_gives_the_same_tokens(model_type: str) -> None:
    model = tiny_model(model_type)
    ids, mask = _batch(seed=1, s=9, pad=3)
    kw = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    ref = model.generate(input_ids=ids, attention_mask=mask, **kw)
    nki_kernels.patch(model)
    before = dict(hf_attention.fallbacks())
    with _OpCalls() as seen:
        out = model.generate(input_ids=ids, attention_mask=mask, **kw)
    assert hf_attention.fallbacks() == before
    assert torch.equal(out, ref)
    # the prefill runs flash_attention, each of the 5 decode steps decode_attention (2 layers)
    assert seen.calls.get("nki.flash_attention") == 2
    assert seen.calls.get("nki.decode_attention") == 2 * 5


def test_router_logits_and_aux_loss_survive() -> None:
    model = tiny_model("mixtral", output_router_logits=True).train()
    ids, mask = _batch(seed=2)
    ref = model(input_ids=ids, attention_mask=mask, labels=ids)
    nki_kernels.patch(model)
    out = model(input_ids=ids, attention_mask=mask, labels=ids)
    assert len(out.router_logits) == len(ref.router_logits) == 2
    for a, b in zip(out.router_logits, ref.router_logits, strict=True):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)
    assert ref.aux_loss is not None and ref.aux_loss > 0
    torch.testing.assert_close(out.aux_loss, ref.aux_loss, atol=ATOL, rtol=RTOL)


def test_patch_twice_and_unknown_models_fail_by_name() -> None:
    model = tiny_model("llama")
    nki_kernels.patch(model)
    with pytest.raises(RuntimeError, match="already patched"):
        nki_kernels.patch(model)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2))
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        nki_kernels.patch(gpt2)


def test_mask_plans() -> None:
    """Each plan reproduces transformers' boolean mask; what has no exact mapping is dense."""
    from transformers.masking_utils import sdpa_mask

    pad = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]], dtype=torch.bool)
    dense = sdpa_mask(batch_size=2, q_length=6, kv_length=6, attention_mask=pad)
    p = hf_attention.plan(dense, pad, 2, 6, 6, 0, None, "cpu")
    assert p.kind == "segments" and p.segment_ids.tolist() == [[0] * 6, [0, 0, 1, 1, 1, 1]]
    step = sdpa_mask(batch_size=2, q_length=1, kv_length=6, q_offset=5, attention_mask=pad)
    p = hf_attention.plan(step, pad, 2, 1, 6, 0, None, "cpu")
    assert p.kind == "decode" and p.kv_lens.tolist() == [6, 4]
    assert p.gather[1, :4].tolist() == [2, 3, 4, 5]
    holes = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 0, 1, 0, 1, 1]], dtype=torch.bool)
    chunk = sdpa_mask(batch_size=2, q_length=2, kv_length=6, q_offset=4, attention_mask=holes)
    p = hf_attention.plan(chunk, holes, 2, 2, 6, 0, None, "cpu")
    assert p.kind == "decode" and p.kv_lens.tolist() == [6, 4]
    assert p.gather[1, :4].tolist() == [0, 2, 4, 5]
    assert hf_attention.plan(None, None, 2, 1, 6, 0, None, "cpu").kind == "decode"
    custom = torch.tensor([[[[True, False, True, True, False, True]] * 2]])
    assert hf_attention.plan(custom, None, 2, 2, 6, 0, None, "cpu").kind == "dense"
    assert hf_attention.plan(None, None, 2, 6, 6, 0, 4, "cpu").window == 4


def test_moe_from_mixtral_reads_the_fused_layout() -> None:
    model = tiny_model("mixtral")
    block = model.model.layers[0].mlp
    moe = nki_kernels.nn.MoE.from_mixtral(block)
    x = torch.randn(1, 7, 64)
    y, logits = moe(x, return_router_logits=True)
    torch.testing.assert_close(y, block(x), atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(logits, block.gate(x.reshape(-1, 64))[0])


def test_plain_pytorch_swap_by_class() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(24, 24), torch.nn.RMSNorm(24), torch.nn.LayerNorm(24)
    )
    x = torch.randn(5, 24)
    ref = model(x)
    weight = model[1].weight
    report = nki_kernels.patch(model)
    assert [r.after for r in report.replaced] == ["RMSNorm", "LayerNorm"]
    assert isinstance(model[1], nki_kernels.nn.RMSNorm) and model[1].weight is weight
    torch.testing.assert_close(model(x), ref, atol=1e-5, rtol=1e-5)
    nki_kernels.unpatch(model)
    assert type(model[1]) is torch.nn.RMSNorm


def test_a_mask_with_no_segment_form_runs_the_dense_path() -> None:
    dense = torch.tensor([[[[True, False, True, True, False, True]] * 2]])  # no causal form
    plan = hf_attention.plan(dense, None, 2, 2, 6, 0, None, "cpu")
    assert plan.kind == "dense"
    q, k, v = torch.randn(2, 4, 2, 16), torch.randn(2, 2, 6, 16), torch.randn(2, 2, 6, 16)
    before = hf_attention.fallbacks()
    out, _ = hf_attention.nki_attention_forward(torch.nn.Module(), q, k, v, plan, scaling=0.25)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=dense, scale=0.25, enable_gqa=True
    )
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=1e-5, rtol=1e-5)
    assert hf_attention.fallbacks() == before
    hf_attention.nki_attention_forward(torch.nn.Module(), q, k, v, plan, dropout=0.1)
    assert hf_attention.fallbacks()["attention dropout (0.1)"] >= 1


class _OpCalls(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the nki ops dispatched (by name) while active."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name.startswith("nki."):
            self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("sq", [1, 3])
def test_decode_plan_matches_sdpa_on_a_padded_cache(sq: int) -> None:
    """A chunk of sq new queries over a cache with padding holes: decode_attention (no
    grad) and the flash_attention fallback (grad) both give SDPA's output."""
    from transformers.masking_utils import sdpa_mask

    pad = torch.tensor([[1] * 8, [0, 0, 1, 1, 0, 1, 1, 1]], dtype=torch.bool)
    dense = sdpa_mask(batch_size=2, q_length=sq, kv_length=8, q_offset=8 - sq, attention_mask=pad)
    plan = hf_attention.plan(dense, pad, 2, sq, 8, 0, None, "cpu")
    assert plan.kind == "decode"
    g = torch.Generator().manual_seed(sq)
    q = torch.randn(2, 4, sq, 16, generator=g)
    k, v = torch.randn(2, 2, 8, 16, generator=g), torch.randn(2, 2, 8, 16, generator=g)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=dense, scale=0.3, enable_gqa=True
    ).transpose(1, 2)
    with torch.no_grad(), _OpCalls() as seen:
        out, _ = hf_attention.nki_attention_forward(torch.nn.Module(), q, k, v, plan, scaling=0.3)
    assert seen.calls == {"nki.decode_attention": 1}
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    qg = q.clone().requires_grad_()
    out, _ = hf_attention.nki_attention_forward(torch.nn.Module(), qg, k, v, plan, scaling=0.3)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    out.sum().backward()
    assert qg.grad is not None and torch.isfinite(qg.grad).all()


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_custom_4d_attention_mask(kind: str) -> None:
    """A 4-D `attention_mask` (a custom mask: transformers hands it to the attention
    function as is, not through the mask function) runs on the op's dense path; it used to
    raise "expected the 'nki' mask function's NkiMask". Two documents packed in one row
    (block-diagonal causal), every query row sees a key; grads match too."""
    model = tiny_model("llama").train()
    ids, _ = _batch(seed=2, s=10, pad=0)
    allowed = torch.ones(10, 10, dtype=torch.bool).tril()
    allowed[4:, :4] = False
    allowed = allowed.expand(2, 1, 10, 10)
    if kind == "bool":
        mask = allowed
    else:  # transformers' additive convention: 0 allowed, dtype minimum masked
        mask = torch.zeros(2, 1, 10, 10).masked_fill(~allowed, torch.finfo(torch.float32).min)

    def run():
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=mask, labels=ids)
        out.loss.backward()
        return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    logits_ref, grads_ref = run()
    nki_kernels.patch(model)
    before = dict(hf_attention.fallbacks())
    logits, grads = run()
    assert hf_attention.fallbacks() == before
    torch.testing.assert_close(logits, logits_ref, atol=ATOL, rtol=RTOL)
    for name, g in grads.items():
        torch.testing.assert_close(g, grads_ref[name], atol=ATOL, rtol=RTOL, msg=name)


@pytest.mark.parametrize("model_type", ["llama", "mistral"])
def test_generate_with_a_static_cache(model_type: str) -> None:
    """With a compileable (static) cache, `generate()` builds each step's mask ahead
    through the mask function and passes the plan back in as `attention_mask`, which
    transformers' mask preprocessing reads `.ndim` of: it used to fail with "'NkiMask'
    object has no attribute 'ndim'". Same tokens as the unpatched model, left-padded."""
    model = tiny_model(model_type)
    ids, mask = _batch(seed=3, s=9, pad=3)
    kw = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": 0}
    ref = model.generate(input_ids=ids, attention_mask=mask, cache_implementation="static", **kw)
    nki_kernels.patch(model)
    before = dict(hf_attention.fallbacks())
    out = model.generate(input_ids=ids, attention_mask=mask, cache_implementation="static", **kw)
    assert hf_attention.fallbacks() == before
    assert torch.equal(out, ref)
