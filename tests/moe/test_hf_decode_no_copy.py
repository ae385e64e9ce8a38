"""A patched transformers MoE model's decode (generate) on tiny random-init DeepSeek-V3,
Qwen2-MoE and Qwen3-MoE models (no download): the experts' [E, 2I, H] / [E, H, I]
Parameters and the shared expert's nn.Linear weights reach the decode kernel as they lie
(the launch gets their storage; no op copies or casts them), the shared expert is fused
into that launch, and the tokens and logits are the unpatched model's."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_hf_moe import ATOL, RTOL, _deepseek_v3, _qwen3_moe
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

import nki_kernels
import nki_kernels.ops.moe_decode as moe_decode
import nki_kernels.ops.moe_gated_experts as gated_ops

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)
COPIES = {"clone", "_to_copy", "copy_", "cat", "stack", "contiguous", "index_select",
          "transpose_copy", "permute_copy", "t_copy"}  # fmt: skip


def _qwen2_moe(**kw: Any) -> Any:
    cfg = transformers.Qwen2MoeConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        shared_expert_intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False,
        max_position_embeddings=64, **kw,
    )  # fmt: skip
    torch.manual_seed(3)
    return transformers.Qwen2MoeForCausalLM(cfg).float()


BUILD = {"deepseek_v3": _deepseek_v3, "qwen2_moe": _qwen2_moe, "qwen3_moe": _qwen3_moe}
SHARED = {"deepseek_v3": True, "qwen2_moe": True, "qwen3_moe": False}


class _WeightCopies(TorchDispatchMode):
    """Records every copying op that reads a weight's storage (outside the launch)."""

    def __init__(self, storages: set[int], seen: list[str]) -> None:
        super().__init__()
        self.storages, self.seen = storages, seen

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        flat = torch.utils._pytree.tree_leaves((args, kwargs or {}))
        if name in COPIES and any(
            isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() in self.storages
            for a in flat
        ):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def _weights(model: Any) -> dict[int, str]:
    """data_ptr -> name of every expert / shared-expert weight."""
    keys = ("experts.", "shared_expert")
    return {p.data_ptr(): n for n, p in model.named_parameters() if any(k in n for k in keys)}


@pytest.mark.parametrize("model_type", sorted(BUILD))
def test_generate_reads_the_parameters_where_they_lie(monkeypatch: Any, model_type: str) -> None:
    model = BUILD[model_type]().eval()
    ids = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(4))
    kw = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    ref = model.generate(input_ids=ids, **kw)
    nki_kernels.patch(model)
    weights = _weights(model)
    launches: list[tuple[Any, ...]] = []
    real = moe_decode.launch

    def recorded(kernel: Any, *args: Any, **statics: Any) -> Any:
        launches.append((args, statics))
        with _disable_current_modes():  # the interpreter's own host read is not the model's
            return real(kernel, *args, **statics)

    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: list[str] = []
    real_host = moe_decode.decode_gated_experts

    def watched(*args: Any, **kwargs: Any) -> Any:
        # a custom op's body runs outside the caller's dispatch mode: watch it from inside
        with _WeightCopies(storages, seen):
            return real_host(*args, **kwargs)

    monkeypatch.setattr(moe_decode, "launch", recorded)
    monkeypatch.setattr(moe_decode, "decode_gated_experts", watched)
    monkeypatch.setattr(gated_ops, "decode_gated_experts", watched)
    with _WeightCopies(storages, seen):
        out = model.generate(input_ids=ids, **kw)
    assert torch.equal(out, ref)
    assert seen == [], f"weights copied: {seen}"
    moe_layers = sum(1 for m in model.modules() if hasattr(m, "experts"))
    steps = out.shape[1] - ids.shape[1]  # prefill (6 tokens), then one token per step
    assert steps >= 2 and len(launches) == moe_layers * steps
    for args, statics in launches:
        gu_t, dn_t, sgu_t, sdn_t = statics["transposed"]
        assert gu_t and dn_t  # the experts' [E, 2I, H] / [E, H, I] storage
        names = [weights.get(a.data_ptr()) for a in (args[1], args[2])]
        assert all(n is not None for n in names), names
        shared = args[9] is not None
        assert shared == SHARED[model_type]
        if shared:  # nn.Linear's [Is, H] / [H, Is] weights: gate, up (args[12]), down
            assert sgu_t and sdn_t
            for a in (args[9], args[10], args[12]):
                assert weights.get(a.data_ptr(), "").startswith("model.layers."), a.shape


@pytest.mark.parametrize("model_type", ["deepseek_v3", "qwen2_moe"])
def test_fused_shared_expert_logits_match(model_type: str) -> None:
    model = BUILD[model_type]().eval()
    ids = torch.randint(3, 128, (2, 5), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    report = nki_kernels.patch(model)
    kinds = " ".join(report.counts())
    assert ("HFSharedMoE" if model_type == "deepseek_v3" else "HFSparseMoeBlock") in kinds
    with torch.no_grad():
        got = model(input_ids=ids).logits
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=RTOL)
    # with gradients the model's own shared module runs (and gets its gradient)
    model.zero_grad()
    model(input_ids=ids, labels=ids).loss.backward()
    shared = [p for n, p in model.named_parameters() if "shared_expert" in n]
    assert shared and all(p.grad is not None for p in shared)
    nki_kernels.unpatch(model)
    assert not any("nki_kernels" in type(m).__module__ for m in model.modules())
