"""A training step (forward + backward, > 64 tokens: the blockwise kernels) of a patched
tiny transformers MoE model and of TorchTitan's MoE block reads the experts' Parameters
where they lie: the launches get their storage (transformers' [E, 2I, H] / [E, H, I];
TorchTitan's w1 / w3 [E, I, H] and w2 [E, H, I], gate and up apart), no op copies,
casts or transposes a weight, the weight gradients come back in the parameters' layout,
and the gradients match the unpatched model's (TorchTitan: the old concatenated
row-major weights' bit for bit; fp32 parameters are cast to bf16 per call, as before)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_hf_decode_no_copy import _WeightCopies
from test_hf_moe import ATOL, RTOL, _qwen3_moe
from torch.utils._python_dispatch import _disable_current_modes

import nki_kernels
import nki_kernels.ops.moe as moe_ops
import nki_kernels.ops.moe_experts as experts_ops
import nki_kernels.ops.moe_launch as launch_ops

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)
KERNELS = {"moe_mlp_fwd", "moe_mlp_bwd", "moe_mlp_fwd_split", "moe_mlp_bwd_split"}


def _watch(monkeypatch: Any, storages: set[int]) -> tuple[list[Any], list[str]]:
    """Record the blockwise launches and watch the ops' host code for weight copies (a
    custom op's body runs outside the caller's dispatch mode: watched from inside)."""
    launches: list[Any] = []
    seen: list[str] = []
    real_launch = launch_ops.launch

    def recorded(kernel: Any, *args: Any, **statics: Any) -> Any:
        launches.append((kernel.__name__, args, statics))
        with _disable_current_modes():  # the interpreter's own host read is not the model's
            return real_launch(kernel, *args, **statics)

    monkeypatch.setattr(launch_ops, "launch", recorded)
    for mod in (moe_ops, experts_ops):
        for name in ("launch_experts_fwd", "launch_experts_bwd"):
            real = getattr(mod, name)

            def watched(*args: Any, _real: Any = real, **kw: Any) -> Any:
                with _WeightCopies(storages, seen):
                    return _real(*args, **kw)

            monkeypatch.setattr(mod, name, watched)
    return launches, seen


def _check_launches(launches: list[Any], params: dict[int, str], want: set[str]) -> None:
    runs = [(n, a, s) for n, a, s in launches if n in KERNELS]
    assert {n for n, _, _ in runs} == want, [n for n, _, _ in launches]
    for name, args, statics in runs:
        assert statics["transposed"] == (True, True), name
        split = name.endswith("_split")
        for a in args[1 : 4 if split else 3]:  # the weights, as the kernel reads them
            assert a.is_contiguous() and params.get(a.data_ptr()) is not None, (name, a.shape)
            assert tuple(a.shape) == tuple(params[a.data_ptr()][1].shape), name


def test_hf_training_step_reads_the_parameters_in_place(monkeypatch: Any) -> None:
    ref = _qwen3_moe().train()
    model = _qwen3_moe().train()
    ids = torch.randint(3, 128, (2, 40), generator=torch.Generator().manual_seed(6))
    ref(input_ids=ids, labels=ids).loss.backward()
    nki_kernels.patch(model)
    experts = {p.data_ptr(): (n, p) for n, p in model.named_parameters() if ".experts." in n}
    assert experts
    launches, seen = _watch(
        monkeypatch, {p.untyped_storage().data_ptr() for _, p in experts.values()}
    )
    with _WeightCopies({p.untyped_storage().data_ptr() for _, p in experts.values()}, seen):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    assert seen == [], f"weights copied: {seen}"
    _check_launches(launches, experts, {"moe_mlp_fwd", "moe_mlp_bwd"})
    want = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert p.grad.stride() == p.stride(), name  # the parameter's own layout
        torch.testing.assert_close(p.grad, want[name].grad, atol=ATOL, rtol=RTOL, msg=name)


def _titan_block(fused: bool) -> Any:
    from torchtitan.models.deepseek_v3 import model_registry

    from nki_kernels.integrations import torchtitan as tt

    cfg = model_registry("debugmodel", converters=[tt.NkiConverter.Config()])
    cfg = cfg.model.layers[1].moe
    cfg.fused, cfg.nki_experts = fused, True
    torch.manual_seed(0)
    block = cfg.build()
    block.init_states(buffer_device=None)
    return block.bfloat16()


@pytest.mark.parametrize("fused", [True, False])
def test_torchtitan_training_step_reads_w1_w3_w2_in_place(monkeypatch: Any, fused: bool) -> None:
    pytest.importorskip("torchtitan")
    from nki_kernels.integrations import torchtitan as tt

    block = _titan_block(fused)
    ex = block.routed_experts.inner_experts
    x = torch.randn(2, 40, 256, generator=torch.Generator().manual_seed(7)).bfloat16()

    def step() -> list[torch.Tensor]:
        block.zero_grad()
        xs = x.clone().requires_grad_()
        out = block(xs)
        out.float().square().sum().backward()
        return [out, xs.grad, ex.w1_EFD.grad, ex.w3_EFD.grad, ex.w2_EDF.grad]

    params = {p.data_ptr(): (n, p) for n, p in ex.named_parameters()}
    with monkeypatch.context() as m:  # the former path: gate / up concatenated, row-major

        def concatenated(self: Any) -> tuple[torch.Tensor, torch.Tensor, None]:
            gu = torch.cat([ex.w1_EFD, ex.w3_EFD], dim=1).transpose(1, 2).contiguous()
            return gu, ex.w2_EDF.transpose(1, 2).contiguous(), None

        m.setattr(tt.NkiMoE, "_weights", concatenated)
        want = step()
    launches, seen = _watch(
        monkeypatch, {p.untyped_storage().data_ptr() for _, p in params.values()}
    )
    with _WeightCopies({p.untyped_storage().data_ptr() for _, p in params.values()}, seen):
        got = step()
    assert seen == [], f"weights copied: {seen}"
    _check_launches(launches, params, {"moe_mlp_fwd_split", "moe_mlp_bwd_split"})
    for name, w, g in zip(("out", "dx", "d w1", "d w3", "d w2"), want, got):
        assert torch.equal(w, g), name
    for p in (ex.w1_EFD, ex.w3_EFD, ex.w2_EDF):
        assert p.grad is not None and p.grad.stride() == p.stride()
