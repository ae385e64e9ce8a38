"""`torch.compile` of a whole patched Hugging Face model (tiny, one layer, random init):
forward and backward with aot_eager and inductor, `fullgraph=True` (no graph break), on
a batch without a padding mask (the "plain" causal plan) and on a left-padded batch (the
"dense" plan: under compile the mask function cannot read mask values). The compiled
model's loss, logits and every gradient match the unpatched eager model."""

from __future__ import annotations

import pytest
import torch

import nki_kernels

pytest.importorskip("transformers")
from nki_kernels.parity.models import tiny_model

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)

ATOL, RTOL = 2e-5, 1e-4  # as the eager patch tests: fp32 sums in a different order


def _batch(padded: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, 128, (2, 12), generator=g)
    mask = torch.ones_like(ids)
    if not padded:
        return {"input_ids": ids, "labels": ids}
    mask[1, :4] = 0
    ids[1, :4] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def _run(model: torch.nn.Module, batch: dict[str, torch.Tensor]):
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    named = getattr(model, "_orig_mod", model).named_parameters()
    grads = {n: p.grad.detach().clone() for n, p in named}
    return out.loss.detach(), out.logits.detach(), grads


@pytest.mark.parametrize(
    ("model_type", "backend", "padded"),
    [
        ("llama", "aot_eager", False),
        ("llama", "aot_eager", True),
        ("mixtral", "aot_eager", False),
        ("mixtral", "aot_eager", True),
        pytest.param("llama", "inductor", True, marks=pytest.mark.slow),
        pytest.param("mixtral", "inductor", True, marks=pytest.mark.slow),
    ],
)
def test_compiled_patched_model_matches_eager(model_type: str, backend: str, padded: bool):
    model = tiny_model(model_type, num_hidden_layers=1).train()
    batch = _batch(padded)
    loss_ref, logits_ref, grads_ref = _run(model, batch)
    nki_kernels.patch(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    loss, logits, grads = _run(compiled, batch)
    rows = batch.get("attention_mask", torch.ones_like(batch["input_ids"])).bool()
    torch.testing.assert_close(loss, loss_ref, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(logits[rows], logits_ref[rows], atol=ATOL, rtol=RTOL)
    assert grads.keys() == grads_ref.keys()
    for name, g in grads.items():
        torch.testing.assert_close(g, grads_ref[name], atol=ATOL, rtol=RTOL, msg=name)


def test_the_mask_function_under_compile_plans_without_reading_values() -> None:
    """What the compiled graph runs: "plain" without a padding mask, "dense" with one."""
    from nki_kernels.integrations import hf_attention

    plans = []

    def record(*args, **kwargs):
        plans.append(hf_attention.nki_mask(*args, **kwargs))
        return plans[-1]

    pad = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]])

    @torch.compile(backend="eager", fullgraph=True)
    def both(pad):
        plain = record(2, 6, 6, attention_mask=None)
        dense = record(2, 6, 6, attention_mask=pad.bool())
        return plain, dense.dense

    _, dense = both(pad)
    assert [p.kind for p in plans] == ["plain", "dense"] and plans[0].causal
    assert dense.shape == (2, 1, 6, 6) and not bool(dense[1, 0, :, :2].any())
