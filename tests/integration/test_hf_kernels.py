"""Hugging Face Kernels (`kernels` 0.19.1): `kernelize` loads the NKI layers from the local
layer repository (no download) into tiny transformers models; logits and gradients match
the model as transformers runs it, in training and under torch.compile, and a layer whose
declared support lacks the mode keeps its original forward."""

from __future__ import annotations

import copy
import functools
import operator

import pytest
import torch

kernels = pytest.importorskip("kernels")  # test_seams fails loudly when it is missing

from nki_kernels.integrations import hf_kernels  # noqa: E402
from nki_kernels.parity.models import tiny_model  # noqa: E402

EXPECTED = {
    "llama": {"LlamaAttention": 2, "RMSNorm": 5},
    "mixtral": {"MixtralAttention": 2, "MixtralSparseMoeBlock": 2, "RMSNorm": 5},
}


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 128, (2, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left-padded
    ids[1, :4] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def _run(model, batch):
    out = model(**batch)
    out.loss.backward()
    grads = {n.removeprefix("_orig_mod."): p.grad for n, p in model.named_parameters()}
    return out.logits.detach(), grads


def _assert_same(ref, got):
    torch.testing.assert_close(got[0], ref[0], atol=2e-5, rtol=1e-5)
    for name, g in ref[1].items():
        torch.testing.assert_close(got[1][name], g, atol=2e-5, rtol=1e-4, msg=name)


def test_repository_is_a_local_layer_repository_with_declared_support() -> None:
    classes = hf_kernels.layer_classes()
    assert set(classes) == set(hf_kernels.LAYERS)
    for cls in classes.values():
        assert cls.has_backward is True and cls.can_torch_compile is True
    assert (hf_kernels.REPO_PATH / "torch-universal" / "metadata.json").is_file()


@pytest.mark.parametrize("model_type", ["llama", "mixtral"])
@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_kernelize_training_matches_transformers(model_type, device) -> None:
    ref = tiny_model(model_type).train()
    model = copy.deepcopy(ref)
    hf_kernels.kernelize_model(model, device=device, mode=kernels.Mode.TRAINING)
    assert hf_kernels.kernelized(model) == EXPECTED[model_type]
    batch = _batch()
    _assert_same(_run(ref, batch), _run(model, batch))


@pytest.mark.parametrize("model_type", ["llama", "mixtral"])
def test_kernelize_for_torch_compile_compiles_and_matches(model_type) -> None:
    ref = tiny_model(model_type, num_hidden_layers=1).train()
    model = copy.deepcopy(ref)
    mode = kernels.Mode.TRAINING | kernels.Mode.TORCH_COMPILE
    hf_kernels.kernelize_model(model, device="cpu", mode=mode)
    assert hf_kernels.kernelized(model) == {
        k: 1 if k != "RMSNorm" else 3 for k in EXPECTED[model_type]
    }
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    batch = _batch()
    _assert_same(_run(ref, batch), _run(compiled, batch))


def test_declarations_are_the_supports_these_tests_exercise() -> None:
    """Truthful declarations: a layer declares `has_backward` only if the training test
    above runs its backward against transformers' gradients, and `can_torch_compile`
    only if the compile test above runs it compiled with fullgraph=True (forward and
    backward); both tests together cover the layers that EXPECTED lists."""
    exercised = {layer for layers in EXPECTED.values() for layer in layers}
    for name, cls in hf_kernels.layer_classes().items():
        declared = {flag for flag in ("has_backward", "can_torch_compile") if getattr(cls, flag)}
        assert declared <= ({"has_backward", "can_torch_compile"} if name in exercised else set())


@pytest.mark.parametrize(
    "attr, mode, used",
    [
        ("has_backward", "TRAINING", False),
        ("has_backward", "INFERENCE", True),
        ("can_torch_compile", "INFERENCE|TORCH_COMPILE", False),
        ("can_torch_compile", "TRAINING", True),
    ],
)
def test_a_layer_without_the_modes_support_keeps_its_forward(attr, mode, used) -> None:
    rms = hf_kernels.layer_classes()["RMSNorm"]  # the class kernelize loads (memoized)
    model = tiny_model("llama", num_hidden_layers=1)
    try:
        setattr(rms, attr, False)
        flags = functools.reduce(operator.or_, (getattr(kernels.Mode, m) for m in mode.split("|")))
        hf_kernels.kernelize_model(model, device="cpu", mode=flags)
    finally:
        setattr(rms, attr, True)
    assert ("RMSNorm" in hf_kernels.kernelized(model)) is used
    assert hf_kernels.kernelized(model)["LlamaAttention"] == 1


def test_unknown_device_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="device"):
        hf_kernels.kernelize_model(tiny_model("llama"), device="cuda")


def test_kernelized_for_neuron_trains_on_the_emulated_neuron_device(neuron) -> None:
    """device="neuron": the repository's layers on the (emulated) neuron device, forward
    and backward on device tensors, against transformers on CPU."""
    ref = tiny_model("llama", num_hidden_layers=1).train()
    model = copy.deepcopy(ref)
    hf_kernels.kernelize_model(model, device="neuron", mode=kernels.Mode.TRAINING)
    assert hf_kernels.kernelized(model) == {"LlamaAttention": 1, "RMSNorm": 3}
    model = model.to(neuron)
    batch = _batch()
    out = model(**{k: v.to(neuron) for k, v in batch.items()})
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert out.logits.device.type == "neuron" and all(
        g.device.type == "neuron" for g in grads.values()
    )
    got = (out.logits.detach().cpu(), {n: g.cpu() for n, g in grads.items()})
    _assert_same(_run(ref, batch), got)


def test_kernelized_mixtral_decode_reads_the_experts_where_they_lie(monkeypatch) -> None:
    """Inference (generate, no gradient): the Mixtral MoE layer's decode launch gets the
    experts' [E, 2I, H] / [E, H, I] Parameters' own storage (DMA transposes in the
    kernel, no per-call copy), and generate() gives transformers' tokens."""
    import nki_kernels.ops.moe_decode as moe_decode

    ref = tiny_model("mixtral").eval()
    model = copy.deepcopy(ref)
    hf_kernels.kernelize_model(model, device="cpu", mode=kernels.Mode.INFERENCE)
    seen = []
    real = moe_decode.launch

    def recorded(kernel, *args, **statics):
        seen.append((args, statics))
        return real(kernel, *args, **statics)

    monkeypatch.setattr(moe_decode, "launch", recorded)
    ids = torch.randint(3, 128, (1, 5), generator=torch.Generator().manual_seed(3))
    kw = {"max_new_tokens": 3, "do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    assert torch.equal(model.generate(input_ids=ids, **kw), ref.generate(input_ids=ids, **kw))
    params = {p.data_ptr() for n, p in model.named_parameters() if ".experts." in n}
    assert len(seen) == 2 * 3  # 2 layers, 3 forward calls
    for args, statics in seen:
        assert statics["transposed"][:2] == (True, True)
        assert args[1].data_ptr() in params and args[2].data_ptr() in params
