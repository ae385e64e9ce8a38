"""TorchTitan 0.3.0 on the NKI ops through `NkiConverter` (its own config-converter
mechanism): each swapped module against TorchTitan's semantics, and the debug models
training against stock TorchTitan (CI size: the first blocks, a few steps; the 10-step
runs are in docs/readme/use-in-a-model.md)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from nki_kernels.integrations import torchtitan as tt
from nki_kernels.parity import titan
from nki_kernels.parity.harness import run_parity


def _dense_reference(q, k, v, allowed, scale):
    """q, k, v [B, L, N, H] (v's H may differ) -> (out [B, L, N, Hv], lse [B, L, N])."""
    q, k, v = (t.transpose(1, 2).double() for t in (q, k, v))
    k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, -1)
    out = torch.softmax(s, -1) @ v
    return out.transpose(1, 2).float(), lse.transpose(1, 2).float()


def _qkv(b=2, length=40, hq=4, hkv=2, d=16, dv=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, length, hq, d, generator=g, requires_grad=True)
    k = torch.randn(b, length, hkv, d, generator=g, requires_grad=True)
    v = torch.randn(b, length, hkv, dv or d, generator=g, requires_grad=True)
    return q, k, v


def _varlen_meta(cu, max_len):
    cu = torch.tensor(cu, dtype=torch.int32)
    return tt.VarlenMetadata(cu, cu, max_len, max_len)


def _doc_allowed(cu, b, length, causal, sliding):
    seg = tt._segments(torch.tensor(cu), b * length)
    i = torch.arange(b * length)
    allowed = seg[:, None] == seg[None, :]
    if causal:
        allowed &= i[None, :] <= i[:, None]
    if sliding is not None:
        allowed &= i[None, :] > i[:, None] - sliding
    return allowed


@pytest.mark.parametrize(
    "window, cu",
    [
        ((-1, 0), [0, 13, 40, 52, 80]),  # causal documents within rows
        ((5, 0), [0, 13, 40, 52, 80]),  # sliding: the query and 5 keys before it
        ((-1, -1), [0, 13, 40, 52, 80]),  # full attention within documents
        ((-1, 0), [0, 13, 52, 80]),  # a document across the row boundary (packed path)
    ],
)
def test_varlen_attention_matches_documents_window_gqa_and_lse(window, cu) -> None:
    b, length = 2, 40
    q, k, v = _qkv(b, length)
    causal, sliding = tt.window_to_sliding(window)
    big = _doc_allowed(cu, b, length, causal, sliding)  # over the packed B*L tokens
    attn = tt.NkiVarlenAttention.Config(window_size=window).build()
    got = attn(q, k, v, attention_masks=_varlen_meta(cu, 40), scale=0.3,
               out_transform=lambda o, lse: (o, lse))  # fmt: skip
    flat = [t.reshape(1, b * length, *t.shape[2:]) for t in (q, k, v)]
    want_out, want_lse = _dense_reference(*flat, big, 0.3)
    torch.testing.assert_close(got[0], want_out.view(b, length, 4, 16), atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(got[1], want_lse.view(b, length, 4), atol=2e-5, rtol=1e-5)
    (got[0].square().sum() + got[1].sum()).backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    out, lse = _dense_reference(*[t.reshape(1, b * length, *t.shape[2:]) for t in (q, k, v)],
                                big, 0.3)  # fmt: skip
    (out.square().sum() + lse.sum()).backward()
    for g, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(g, t.grad, atol=1e-4, rtol=1e-4)


def test_window_size_refused_by_name() -> None:
    with pytest.raises(ValueError, match="window_size"):
        tt.window_to_sliding((4, 4))


def test_flex_attention_block_mask_mla_head_dims_and_score_mod() -> None:
    b, length, window = 2, 40, 7
    q, k, v = _qkv(b, length, hq=4, hkv=4, d=24, dv=16)  # MLA: value head dim differs

    def sliding(b_, h, qi, ki):
        return (ki <= qi) & (qi - ki < window)

    bm = create_block_mask(sliding, b, None, length, length, device="cpu")
    attn = tt.NkiFlexAttention.Config().build()
    out = attn(q, k, v, attention_masks=bm, scale=0.25)
    i = torch.arange(length)
    allowed = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < window)
    want, _ = _dense_reference(q, k, v, allowed, 0.25)
    assert out.shape == (b, length, 4, 16)
    torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-5)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))

    def bias(score, b_, h, qi, ki):
        return score + 0.1 * (ki - qi)

    with_bias = attn(q, k, v, attention_masks=bm, scale=0.25, score_mod=bias)
    scores_bias = 0.1 * (i[None, :] - i[:, None]).double()
    qd, kd, vd = (t.detach().transpose(1, 2).double() for t in (q, k, v))
    s = (qd @ kd.transpose(-1, -2)) * 0.25 + scores_bias
    want_b = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1) @ vd
    torch.testing.assert_close(with_bias, want_b.transpose(1, 2).float(), atol=2e-5, rtol=1e-5)


def _router(**kw):
    from torchtitan.models.common.linear import Linear

    cfg = dict(num_experts=8, top_k=2, gate=Linear.Config(in_features=16, out_features=8))
    cfg.update(kw)
    torch.manual_seed(0)
    stock = tt.TokenChoiceTopKRouter.Config(**cfg).build()
    torch.nn.init.normal_(stock.gate.weight, std=0.5)
    ours = tt.NkiRouter.Config(**cfg).build()
    ours.load_state_dict(stock.state_dict())
    return stock, ours


@pytest.mark.parametrize(
    "options",
    [
        {"score_func": "sigmoid", "route_norm": True, "route_scale": 2.5},
        {"score_func": "softmax"},
        {"score_func": "sigmoid", "num_expert_groups": 4, "num_limited_groups": 2},
    ],
)
def test_router_matches_torchtitan(options) -> None:
    stock, ours = _router(**options)
    x = torch.randn(2, 5, 16)
    tt.reset_fallbacks()
    want = stock(x)
    got = ours(x)
    order_w, order_g = want[1].sort(-1), got[1].sort(-1)
    assert torch.equal(order_w.values, order_g.values)
    torch.testing.assert_close(
        got[0].gather(-1, order_g.indices),
        want[0].gather(-1, order_w.indices),
        atol=1e-6,
        rtol=1e-6,
    )
    torch.testing.assert_close(got[2], want[2])
    path = (
        "router: torch (expert groups)" if "num_expert_groups" in options else "router: moe_route"
    )
    assert tt.fallbacks() == {path: 1}


def _moe_block(**router):
    """The first MoE block of the debug model's config (router options overridden), stock
    and converted."""
    from torchtitan.models.deepseek_v3 import model_registry

    stock_cfg = model_registry("debugmodel").model.layers[1].moe
    nki_cfg = model_registry("debugmodel", converters=[tt.NkiConverter.Config()])
    nki_cfg = nki_cfg.model.layers[1].moe
    for cfg in (stock_cfg, nki_cfg):
        for k, v in router.items():
            setattr(cfg.router, k, v)
    return stock_cfg, nki_cfg


@pytest.mark.parametrize(
    "router, fused, nki_experts, path",
    [
        ({}, True, True, "moe: fused moe_mlp"),
        ({}, False, True, "not fused: disabled (fused=False)"),
        ({}, False, False, "moe: torch dispatch (not fused: disabled (fused=False))"),
        (
            {"score_func": "sigmoid", "num_expert_groups": 4, "num_limited_groups": 2},
            True,
            True,
            "not fused: expert groups",
        ),
    ],
)
def test_moe_paths_match_stock(router, fused, nki_experts, path) -> None:
    stock_cfg, nki_cfg = _moe_block(**router)
    torch.manual_seed(0)
    stock = stock_cfg.build()
    stock.init_states(buffer_device=None)
    x = torch.randn(2, 24, 256)
    nki_cfg.fused, nki_cfg.nki_experts = fused, nki_experts
    ours = nki_cfg.build()
    ours.load_state_dict(stock.state_dict())
    tt.reset_fallbacks()
    xs, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = stock(xs), ours(xo)
    torch.testing.assert_close(got, want, atol=3e-3, rtol=2e-2)  # bf16 experts, as stock
    want.square().sum().backward()
    got.square().sum().backward()
    torch.testing.assert_close(xo.grad, xs.grad, atol=3e-3, rtol=3e-2)
    for name, p in stock.named_parameters():
        torch.testing.assert_close(dict(ours.named_parameters())[name].grad, p.grad,
                                   atol=3e-3, rtol=3e-2, msg=name)  # fmt: skip
    torch.testing.assert_close(ours.tokens_per_expert_E, stock.tokens_per_expert_E)
    counts = tt.fallbacks()
    moe_path = [k for k in counts if k.startswith("moe:")]
    assert len(moe_path) == 1 and path in moe_path[0], counts
    if "torch dispatch" in moe_path[0]:
        key = (
            "grouped_mm: torch.ops.nki.grouped_mm"
            if tt.has_grouped_mm()
            else "grouped_mm: torch._grouped_mm (no torch.ops.nki.grouped_mm)"
        )
        assert counts[key] == 3  # w1, w3, w2: one seam call each in the forward
    elif "moe_experts" not in moe_path[0]:
        assert moe_path[0].startswith("moe: fused") or not tt.has_op("moe_experts")


@pytest.mark.parametrize(
    "router", [{}, {"score_func": "sigmoid", "num_expert_groups": 4, "num_limited_groups": 2}]
)
def test_decode_reads_w1_w3_w2_where_they_lie(monkeypatch, router) -> None:
    """<= 64 tokens without gradients: one decode launch whose weight arguments are the
    bf16 w1 / w2 / w3 Parameters' own storage (no concatenation, no cast), routed as
    configured (fused options on moe_route; expert groups on TorchTitan's router), with
    stock TorchTitan's output."""
    import nki_kernels.ops.moe_decode as moe_decode

    stock_cfg, nki_cfg = _moe_block(**router)
    torch.manual_seed(0)
    stock = stock_cfg.build()
    stock.init_states(buffer_device=None)
    stock = stock.bfloat16()
    ours = nki_cfg.build().bfloat16()
    ours.load_state_dict(stock.state_dict())
    seen = []
    real = moe_decode.launch

    def recorded(kernel, *args, **statics):
        seen.append((args, statics))
        return real(kernel, *args, **statics)

    monkeypatch.setattr(moe_decode, "launch", recorded)
    x = torch.randn(1, 5, 256).bfloat16()
    tt.reset_fallbacks()
    with torch.no_grad():
        want, got = stock(x), ours(x)
    torch.testing.assert_close(got, want, atol=3e-3, rtol=2e-2)  # bf16 experts, as stock
    assert [k for k in tt.fallbacks() if k.startswith("moe:")] == [
        "moe: decode launch (weights as they lie)"
    ]
    ex = ours.routed_experts.inner_experts
    ((args, statics),) = seen
    assert statics["transposed"][:2] == (True, True)
    assert args[1].data_ptr() == ex.w1_EFD.data_ptr() and args[1].shape == ex.w1_EFD.shape
    assert args[2].data_ptr() == ex.w2_EDF.data_ptr() and args[2].shape == ex.w2_EDF.shape
    assert args[13].data_ptr() == ex.w3_EFD.data_ptr()


def test_converter_swaps_by_config_class() -> None:
    from torchtitan.models.deepseek_v3 import model_registry as dsv3
    from torchtitan.models.llama3 import model_registry as llama3

    with torch.device("meta"):
        llama = llama3("debugmodel", converters=[tt.NkiConverter.Config()]).model.build()
        varlen = llama3("debugmodel", attn_backend="varlen",
                        converters=[tt.NkiConverter.Config(norms=False)]).model.build()  # fmt: skip
        moe = dsv3("debugmodel", converters=[tt.NkiConverter.Config()]).model.build()

    def kinds(m):
        return {type(x).__name__ for x in m.modules()}

    assert {"NkiFlexAttention", "NkiRMSNorm"} <= kinds(llama)
    assert "RMSNorm" not in kinds(llama) and "FlexAttention" not in kinds(llama)
    assert "NkiVarlenAttention" in kinds(varlen) and "RMSNorm" in kinds(varlen)
    assert {"NkiMoE", "NkiRouter", "NkiGroupedExperts", "NkiFlexAttention"} <= kinds(moe)
    names = {k for k, _ in moe.state_dict().items()}
    with torch.device("meta"):
        plain = dsv3("debugmodel").model.build()
    assert names == set(plain.state_dict())  # same parameters, buffers and keys


def test_llama3_debug_trains_like_stock_torchtitan() -> None:
    r = run_parity(
        titan.titan_factory("llama3_debugmodel", layers=1),
        titan.titan_batches,
        name="llama3_debugmodel@1",
        steps=2,
        log=lambda _: None,
    )
    assert r.passed, (r.deltas, r.tolerance)
    assert r.patched == {"NkiRMSNorm": 3, "NkiFlexAttention": 1}


def test_deepseek_v3_debug_moe_step_matches_stock_torchtitan() -> None:
    batch = titan.titan_batches(0, 0)
    runs = {}
    for nki in (False, True):
        m = titan.build("deepseekv3_debugmodel", nki=nki, layers=2)
        tt.reset_fallbacks()
        loss = m(**batch)
        loss.backward()
        runs[nki] = (loss.detach(), {n: p.grad for n, p in m.named_parameters()})
    assert tt.fallbacks() == {"moe: fused moe_mlp": 1}
    torch.testing.assert_close(runs[True][0], runs[False][0], atol=2e-5, rtol=0)
    for name, g in runs[False][1].items():
        torch.testing.assert_close(runs[True][1][name], g, atol=2e-4, rtol=5e-2, msg=name)


def test_titan_names_are_checked() -> None:
    assert titan.parse("llama3_debugmodel") == ("llama3", "debugmodel")
    assert titan.parse("tiny-llama") is None
    with pytest.raises(ValueError, match="TorchTitan config name"):
        titan.build("gpt2_small", nki=True)


@pytest.mark.slow
def test_fsdp2_with_torchtitans_activation_checkpointing_and_checkpoint_layout(tmp_path) -> None:
    """`parity --nproc 2` on the MoE debug model's first two blocks: DDP and TorchTitan's
    own FullAC + apply_fsdp_to_decoder, NKI path on the reference's trajectory, a DCP
    checkpoint in TorchTitan's layout restored in fresh processes."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parents[2]
    model = "deepseekv3_debugmodel@2"
    cmd = [sys.executable, "-m", "nki_kernels.cli", "parity", "--nproc", "2", "--model", model]
    cmd += ["--steps", "2", "--out", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    saved = json.loads((tmp_path / f"{model}-dist2.json").read_text())
    assert saved["passed"] and saved["world_size"] == 2
    for wrapper in ("ddp", "fsdp2"):
        w = saved[wrapper]
        assert w["params_in_sync"] == {"reference": True, "candidate": True, "resumed": True}
        assert w["max_delta"] <= saved["tolerance"] and w["resume_max_delta"] <= saved["tolerance"]
    assert (tmp_path / "checkpoints" / f"{model}-fsdp2" / ".metadata").is_file()


@pytest.mark.parametrize("name", ["llama3_debugmodel", "deepseekv3_debugmodel"])
def test_parity_setup_keeps_the_complex_rotary_table_and_stock_forward(name) -> None:
    import importlib
    import warnings

    family, flavor = titan.parse(name)
    batch = titan.titan_batches(0, 0)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*imaginary part.*")
        built = {nki: titan.build(name, nki=nki, layers=1) for nki in (False, True)}
    for lm in built.values():
        caches = {n: t for n, t in lm.model.named_buffers() if n.endswith("rope.cache")}
        assert caches and all(t.is_complex() for t in caches.values()), caches.keys()
    spec = importlib.import_module(titan.FAMILIES[family]).model_registry(
        flavor, attn_backend="flex", converters=[]
    )
    spec.model.layers = spec.model.layers[:1]
    torch.manual_seed(0)
    stock = spec.model.build()  # uncast: TorchTitan's own dtypes
    stock.init_states(buffer_device=None)
    ref = built[False].model
    stock_bufs = dict(stock.named_buffers())
    for n, t in ref.named_buffers():
        torch.testing.assert_close(t, stock_bufs[n], atol=0, rtol=0, msg=n)
    with torch.no_grad():
        masks = stock.get_attention_masks(batch["positions"])
        want = stock(batch["tokens"], batch["positions"], masks)
        got = ref(batch["tokens"], batch["positions"], ref.get_attention_masks(batch["positions"]))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_path_counts_are_exact_under_threads_and_count_compiled_calls() -> None:
    import threading

    tt.reset_fallbacks()
    start = threading.Barrier(8)

    def work() -> None:
        start.wait()
        for _ in range(2000):
            tt._record_path("router: moe_route")

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert tt.fallbacks() == {"router: moe_route": 16000}

    tt.reset_fallbacks()

    @torch.compile(fullgraph=True, backend="eager")
    def step(x):
        tt._record_path("moe: fused moe_mlp")
        return x * 2

    for _ in range(3):
        step(torch.ones(2))
    assert tt.fallbacks() == {"moe: fused moe_mlp": 3}
    tt.reset_fallbacks()


def test_triton_stand_in_never_shadows_a_findable_triton(monkeypatch) -> None:
    import importlib.util
    import sys

    found = importlib.util.find_spec("triton") is not None
    current = sys.modules.get(tt._EP_KERNELS)
    if not found:  # this build: the stand-in is registered, and only that one module
        assert current is not None and getattr(current, "__file__", None) is None
        with pytest.raises(RuntimeError, match="needs triton"):
            current.some_kernel()
    monkeypatch.delitem(sys.modules, tt._EP_KERNELS, raising=False)
    real_find_spec = importlib.util.find_spec

    def triton_present(name, *a, **k):
        return object() if name == "triton" else real_find_spec(name, *a, **k)

    monkeypatch.setattr(importlib.util, "find_spec", triton_present)
    tt._triton_stand_in()
    assert tt._EP_KERNELS not in sys.modules
    import types

    specless = types.ModuleType("triton")  # imported, without a spec: find_spec raises
    specless.__spec__ = None
    monkeypatch.setitem(sys.modules, "triton", specless)
    monkeypatch.setattr(importlib.util, "find_spec", real_find_spec)
    tt._triton_stand_in()
    assert tt._EP_KERNELS not in sys.modules


def test_load_balancing_hook_moves_the_bias_and_the_nki_moe_routes_by_it() -> None:
    """The parity optimizer gets TorchTitan's `register_moe_load_balancing_hook` (the
    model spec's post-optimizer hook); after the first step the expert bias is non-zero,
    so the NKI MoE routes by TorchTitan's router code with that bias (the fused kernel
    does not take one) and its experts run on `moe_experts`, on the stock loss."""
    from nki_kernels.parity.harness import _optimizer

    batch = titan.titan_batches(0, 0)
    runs = {}
    for nki in (False, True):
        m = titan.build("deepseekv3_debugmodel", nki=nki, layers=2)
        opt = _optimizer(m, 1e-3)
        m(**batch).backward()
        opt.step()  # the pre-step hook moves expert_bias_E from the token counts
        bias = m.model.layers["1"].moe.expert_bias_E
        tt.reset_fallbacks()
        with torch.no_grad():
            runs[nki] = (bias.clone(), m(**titan.titan_batches(0, 1)))
        paths = tt.fallbacks()
    assert bool((runs[False][0] != 0).any())
    torch.testing.assert_close(runs[True][0], runs[False][0], atol=0, rtol=0)
    assert paths == {
        "moe: router + moe_experts (not fused: a non-zero load-balancing bias (it changes "
        "the choice, not the weights))": 1,
        "router: torch (a non-zero load-balancing bias (it changes the choice, not the "
        "weights))": 1,
    }
    torch.testing.assert_close(runs[True][1], runs[False][1], atol=2e-5, rtol=0)


def test_floor_alternative_keeps_the_math_backend_under_activation_checkpointing() -> None:
    """The floor's second implementation picks SDPA's math backend inside each attention
    module's forward, so TorchTitan's FullAC recomputation (during backward) runs the same
    backend as the forward (a context around the model's forward did not reach it)."""
    from torchtitan.distributed.activation_checkpoint import FullAC

    batch = titan.titan_batches(0, 0)
    plain = titan.build("llama3_debugmodel", nki=False, layers=1, alternative=True)
    plain(**batch).backward()
    checkpointed = titan.build("llama3_debugmodel", nki=False, layers=1, alternative=True)
    FullAC.Config().build(dump_folder="").apply(checkpointed.model)
    checkpointed(**batch).backward()
    grads = dict(plain.named_parameters())
    for name, p in checkpointed.named_parameters():
        key = name.replace("._checkpoint_wrapped_module", "")
        torch.testing.assert_close(p.grad, grads[key].grad, atol=0, rtol=0, msg=name)
