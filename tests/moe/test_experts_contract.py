"""The expert layers against transformers' own modules run in float64 (no reference of
ours in between): GPT-OSS's experts (`GptOssExperts`: biases, interleaved gate / up, the
clamped SwiGLU) and its `_apply_gate` at the clamp bounds; DeepSeek-V3's experts with
transformers' expert-parallel id E slots; Qwen2-MoE's sigmoid-gated and DeepSeek-V3's
ungated shared expert (the blocks themselves, on their own routing). Duplicate ids in a
token, an empty expert, all tokens on one expert, a NaN token; forward and every
gradient; the prefill composition and the decode launch."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nki_kernels.ops.moe_gated_experts import moe_gated_experts

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)
F64 = torch.float64
H, I, E = 16, 12, 6


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach()
    return float((a - b).abs().max() / max(1e-30, float(b.abs().max())))


def _routing(t: int, k: int, seed: int, one: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """ids with a duplicate expert in token 0, expert 4 empty, tokens 1..5 all on expert 2;
    `one`: every slot of every token on expert 1."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(t)])
    ids[ids == 4] = 5
    ids[0, :2] = 3
    ids[1:6] = 2
    if one:
        ids[:] = 1
    return torch.softmax(torch.randn(t, k, generator=g), -1), ids


def _gpt_oss_experts() -> Any:
    cfg = transformers.GptOssConfig(
        hidden_size=H, intermediate_size=I, num_local_experts=E, num_experts_per_tok=3
    )
    cfg._experts_implementation = "eager"
    torch.manual_seed(0)
    m = transformers.models.gpt_oss.modeling_gpt_oss.GptOssExperts(cfg).to(F64)
    with torch.no_grad():  # scales at which both clamps cut (checked below)
        m.gate_up_proj.normal_(0, 1.2)
        m.gate_up_proj_bias.normal_(0, 2)
        m.down_proj.normal_(0, 0.3)
        m.down_proj_bias.normal_(0, 1)
    return m


@pytest.mark.parametrize(
    ("t", "grad", "one"),
    [(70, True, False), (8, True, False), (8, False, False), (9, True, True), (9, False, True)],
    ids=["prefill", "small-grad", "decode", "all-on-one-grad", "all-on-one-decode"],
)
def test_gpt_oss_experts_match_transformers_module(t: int, grad: bool, one: bool) -> None:
    m = _gpt_oss_experts()
    x = torch.randn(t, H, generator=torch.Generator().manual_seed(1), dtype=F64)
    w, ids = _routing(t, 3, seed=2, one=one)
    pre = x @ m.gate_up_proj[2] + m.gate_up_proj_bias[2]
    assert (pre[:, ::2] > m.limit).any() and (pre[:, 1::2].abs() > m.limit).any()
    xr, wr = x.clone().requires_grad_(grad), w.double().requires_grad_(grad)
    ref = m(xr, ids, wr)
    names = ("gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias")
    params = [getattr(m, n).detach().float().requires_grad_(grad) for n in names]
    xo, wo = x.float().requires_grad_(grad), w.float().requires_grad_(grad)
    out = moe_gated_experts(
        xo, wo, ids, params[0], params[1], b_gate_up=params[2], b_down=params[3],
        activation="gpt_oss", interleaved=True, alpha=m.alpha, limit=m.limit,
    )  # fmt: skip
    assert out.dtype == torch.float32
    assert _rel(out, ref) < 2e-6
    if not grad:
        return
    dy = torch.randn(t, H, generator=torch.Generator().manual_seed(3), dtype=F64)
    want = torch.autograd.grad(ref, [xr, wr, *(getattr(m, n) for n in names)], dy)
    got = torch.autograd.grad(out, [xo, wo, *params], dy.float())
    for name, a, b in zip(("hidden", "weights", *names), got, want):
        assert _rel(a, b) < 4e-6, name


def test_gpt_oss_activation_matches_apply_gate_at_the_clamps() -> None:
    """expert_act("gpt_oss") against GptOssExperts._apply_gate itself: gate and up at,
    just inside and past the bounds, +-inf and NaN; forward and d h (torch's clamp passes
    the gradient at the bound itself, and gives 0 past it and to NaN)."""
    m = _gpt_oss_experts()
    lim = m.limit
    nxt = float(torch.nextafter(torch.tensor(lim), torch.tensor(100.0)))
    values = [lim, nxt, -lim, -nxt, 0.5, -3.0, 100.0, float("inf"), float("-inf"), float("nan")]
    gate, up = torch.meshgrid(torch.tensor(values), torch.tensor(values), indexing="ij")
    h = torch.stack([gate.reshape(-1), up.reshape(-1)], -1).reshape(-1, 2)  # interleaved
    h = h.repeat(1, 3)  # I = 3: a few columns per row
    offs = torch.tensor([h.shape[0]], dtype=torch.int32)
    hr = h.to(F64).requires_grad_()
    ref = m._apply_gate(hr)
    ho = h.clone().requires_grad_()
    out = torch.ops.nki.expert_act(ho, None, offs, "gpt_oss", True, m.alpha, lim)
    torch.testing.assert_close(out.double(), ref.detach(), atol=1e-6, rtol=1e-6, equal_nan=True)
    dy = torch.linspace(-1, 1, ref.numel(), dtype=F64).reshape(ref.shape)
    (want,) = torch.autograd.grad(ref, [hr], dy)
    (got,) = torch.autograd.grad(out, [ho], dy.float())
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-6, equal_nan=True)


def _deepseek_config(**kw: Any) -> Any:
    return transformers.DeepseekV3Config(
        hidden_size=H, moe_intermediate_size=I, n_routed_experts=E, num_experts_per_tok=3,
        n_group=2, topk_group=2, n_shared_experts=2, **kw,
    )  # fmt: skip


def test_deepseek_v3_experts_with_expert_parallel_slots_match_transformers() -> None:
    """transformers' DeepseekV3Experts skips local id E (experts on another rank): its
    weight is never read, a NaN there included."""
    cfg = _deepseek_config()
    torch.manual_seed(4)
    m = transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3Experts(cfg).to(F64)
    with torch.no_grad():
        m.gate_up_proj.normal_(0, 0.4)
        m.down_proj.normal_(0, 0.4)
    t = 70
    x = torch.randn(t, H, generator=torch.Generator().manual_seed(5), dtype=F64)
    w, ids = _routing(t, 3, seed=6)
    ids[::3, 2] = E  # every third token: one slot not on this rank
    w[::3, 2] = float("nan")
    xr, wr = x.clone().requires_grad_(), w.double().requires_grad_()
    ref = m(xr, ids, wr)
    gu, dn = (p.detach().float().requires_grad_() for p in (m.gate_up_proj, m.down_proj))
    xo, wo = x.float().requires_grad_(), w.float().requires_grad_()
    for fn in ("moe_experts", "moe_gated_experts"):
        args = (xo, wo, ids, gu.transpose(1, 2), dn.transpose(1, 2))
        out = torch.ops.nki.moe_experts(*args) if fn == "moe_experts" else moe_gated_experts(*args)
        assert torch.isfinite(out).all() and _rel(out, ref) < 2e-6, fn
        dy = torch.randn(t, H, generator=torch.Generator().manual_seed(7), dtype=F64)
        want = torch.autograd.grad(
            ref, [xr, wr, m.gate_up_proj, m.down_proj], dy, retain_graph=True
        )
        got = torch.autograd.grad(out, [xo, wo, gu, dn], dy.float())
        assert torch.equal(got[1][::3, 2], torch.zeros(24)), fn  # the id E slots' weights
        for name, a, b in zip(("hidden", "weights", "gate_up", "down"), got, want):
            assert _rel(a, b) < 4e-6, f"{fn}: d {name}"
    with torch.no_grad():  # 8 tokens without gradients: the decode launches
        ref8 = m(x[:8], ids[:8], w[:8].double())
        args = (x[:8].float(), w[:8].float(), ids[:8], gu.transpose(1, 2), dn.transpose(1, 2))
        for fn, out in (
            ("moe_experts", torch.ops.nki.moe_experts(*args)),
            ("moe_gated_experts", moe_gated_experts(*args)),
        ):
            assert torch.isfinite(out).all() and _rel(out, ref8) < 2e-6, f"{fn} decode"


def _block(kind: str) -> Any:
    torch.manual_seed(8)
    if kind == "qwen2_moe":
        cfg = transformers.Qwen2MoeConfig(
            hidden_size=H, moe_intermediate_size=I, shared_expert_intermediate_size=20,
            num_experts=E, num_experts_per_tok=3, norm_topk_prob=False,
        )  # fmt: skip
        block = transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock(cfg)
    else:
        cfg = _deepseek_config()
        block = transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3MoE(cfg)
    block = block.to(F64)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.4)
    return block


@pytest.mark.parametrize("kind", ["qwen2_moe", "deepseek_v3"])
@pytest.mark.parametrize("t", [70, 5], ids=["prefill", "decode"])
def test_shared_expert_blocks_match_transformers(kind: str, t: int) -> None:
    """The block on its own routing: Qwen2-MoE's shared expert sigmoid-gated, DeepSeek-V3's
    ungated (two shared experts' width); nn.Linear weights passed as views."""
    block = _block(kind)
    x = torch.randn(1, t, H, generator=torch.Generator().manual_seed(9), dtype=F64)
    x[0, 2, 5] = float("nan")  # a NaN token: its row only
    with torch.no_grad():
        ref = block(x)[0]
        _, w, ids = block.gate(x.reshape(t, H))
    shared = block.shared_expert if kind == "qwen2_moe" else block.shared_experts
    kw: dict[str, Any] = {
        "shared_gate_up": shared.gate_proj.weight.float().t(),
        "shared_up": shared.up_proj.weight.float().t(),
        "shared_down": shared.down_proj.weight.float().t(),
    }
    if kind == "qwen2_moe":
        kw["shared_gate"] = block.shared_expert_gate.weight.float().reshape(-1)
    ex = block.experts
    out = moe_gated_experts(
        x[0].float(), w.float(), ids, ex.gate_up_proj.float().transpose(1, 2),
        ex.down_proj.float().transpose(1, 2), **kw,
    )  # fmt: skip
    bad = (~torch.isfinite(out)).any(-1).nonzero().flatten().tolist()
    assert bad == [2]
    assert bool(torch.isnan(out[2]).all())
    keep = torch.arange(t) != 2
    assert _rel(out[keep], ref[keep]) < 2e-6


@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
@pytest.mark.parametrize("activation", ["geglu", "swiglu"])
def test_activations_match_torch_functional(activation: str, interleaved: bool) -> None:
    """expert_act against torch.nn.functional's exact gelu / silu in float64, a bias per
    group added first (rows 0..6 group 0, 7..7 empty, 7..19 group 2), a NaN in one row."""
    g = torch.Generator().manual_seed(10)
    h = torch.randn(20, 2 * I, generator=g) * 3
    h[4, 1] = float("nan")
    bias = torch.randn(3, 2 * I, generator=g)
    offs = torch.tensor([7, 7, 20], dtype=torch.int32)
    hr, br = h.to(F64).requires_grad_(), bias.to(F64).requires_grad_()
    rows_bias = br[torch.tensor([0] * 7 + [2] * 13)]
    z = hr + rows_bias
    gate, up = (z[:, ::2], z[:, 1::2]) if interleaved else (z[:, :I], z[:, I:])
    fn = torch.nn.functional.gelu if activation == "geglu" else torch.nn.functional.silu
    ref = fn(gate) * up
    ho, bo = h.clone().requires_grad_(), bias.clone().requires_grad_()
    out = torch.ops.nki.expert_act(ho, bo, offs, activation, interleaved, 1.702, 7.0)
    torch.testing.assert_close(out.double(), ref.detach(), atol=2e-6, rtol=2e-6, equal_nan=True)
    assert (~torch.isfinite(out)).any(-1).nonzero().flatten().tolist() == [4]
    dy = torch.randn(ref.shape, generator=g, dtype=F64)
    want = torch.autograd.grad(ref, [hr, br], dy)
    got = torch.autograd.grad(out, [ho, bo], dy.float())
    keep = torch.arange(20) != 4
    torch.testing.assert_close(got[0][keep].double(), want[0][keep], atol=2e-6, rtol=2e-6)
    assert torch.equal(got[1][1], torch.zeros(2 * I))  # the empty group's bias
    torch.testing.assert_close(got[1][2].double(), want[1][2], atol=2e-6, rtol=2e-6)
    assert not torch.isfinite(got[1][0]).all()  # group 0 holds the NaN row


@pytest.mark.parametrize("kind", ["qwen2_moe", "deepseek_v3"])
def test_shared_expert_block_gradients_match_transformers(kind: str) -> None:
    """Every gradient of the block on a fixed routing (its router returns the routing
    given, so the block's autograd covers experts and shared expert only): hidden, the
    routing weights, the experts' and the shared expert's weights, Qwen2-MoE's gate."""
    block = _block(kind)
    t = 70
    x = torch.randn(t, H, generator=torch.Generator().manual_seed(11), dtype=F64)
    with torch.no_grad():
        logits, w, ids = block.gate(x)
    wr = w.clone().requires_grad_()
    block.gate.forward = lambda _h: (logits, wr, ids)
    xr = x.clone().requires_grad_()
    ref = block(xr[None])[0]
    shared = block.shared_expert if kind == "qwen2_moe" else block.shared_experts
    lins = [shared.gate_proj, shared.up_proj, shared.down_proj]
    if kind == "qwen2_moe":
        lins.append(block.shared_expert_gate)
    theirs = [xr, wr, block.experts.gate_up_proj, block.experts.down_proj]
    theirs += [m.weight for m in lins]
    dy = torch.randn(t, H, generator=torch.Generator().manual_seed(12), dtype=F64)
    want = torch.autograd.grad(ref, theirs, dy)
    ours = [p.detach().float().requires_grad_() for p in theirs]
    xo, wo, gu, dn, sg, su, sd = ours[:7]
    kw: dict[str, Any] = {"shared_gate_up": sg.t(), "shared_up": su.t(), "shared_down": sd.t()}
    if kind == "qwen2_moe":
        kw["shared_gate"] = ours[7].reshape(-1)
    out = moe_gated_experts(xo, wo, ids, gu.transpose(1, 2), dn.transpose(1, 2), **kw)
    assert _rel(out, ref) < 2e-6
    got = torch.autograd.grad(out, ours, dy.float())
    names = ["hidden", "weights", "gate_up_proj", "down_proj", "gate", "up", "down", "gate"]
    for name, a, b in zip(names, got, want):
        assert a.shape == b.shape and _rel(a, b) < 4e-6, name
