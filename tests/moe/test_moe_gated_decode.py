"""moe_gated_experts at decode sizes: T <= 64 without gradients runs one launch of the
decode MoE kernel (`torch.ops.nki.moe_gated_decode`) with every expert option and the
shared expert fused in; with gradients, or T > 64, the grouped composition. Forward
against the float64 loop (`moe/gated_reference.py`) at T = 1 / 8 / 64, the shared expert
split over the programs at LNC 1 and 2, id E slots, empty experts, all tokens on one
expert, a NaN / Inf in a token, eagerly, compiled and on the emulated neuron device."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from test_moe_gated_experts import BF16, F16, F32, TENSORS, _case, _check, _close

import nki_kernels.ops.moe_gated_experts as gated_ops
from nki_kernels.moe.decode_mlp import moe_decode_fwd
from nki_kernels.moe.gated_reference import gated_experts_reference
from nki_kernels.ops.moe_gated_experts import moe_gated_experts
from nki_kernels.runtime import launch

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)


def _no_composition(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the grouped composition ran")


def _no_decode(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the decode launch ran")


def _ref(case: dict[str, Any], **opts: Any) -> torch.Tensor:
    return gated_experts_reference(
        **{n: v.double() if n in TENSORS else v for n, v in case.items()}, **opts
    )


def _decoded(case: dict[str, Any], device: str = "cpu", fn: Any = moe_gated_experts,
             **opts: Any) -> torch.Tensor:  # fmt: skip
    with torch.no_grad():
        return fn(**{n: v.to(device) for n, v in case.items()}, **opts).cpu()


OPTIONS = [
    ({"activation": "swiglu"}, {"bias": True}),
    ({"activation": "swiglu", "interleaved": True}, {"bias": False, "shared": "gated"}),
    ({"activation": "geglu"}, {"bias": True, "shared": "ungated"}),
    ({"activation": "gpt_oss", "interleaved": True}, {"bias": True, "scale": 3.0}),
    ({"activation": "gpt_oss"}, {"bias": False, "shared": "gated", "scale": 3.0}),
]


@pytest.mark.parametrize("t", [1, 8, 64])
@pytest.mark.parametrize(("opts", "case_opts"), OPTIONS)
def test_every_option_runs_one_decode_launch(
    monkeypatch: Any, t: int, opts: dict[str, Any], case_opts: dict[str, Any]
) -> None:
    monkeypatch.setattr(gated_ops, "_mlp", _no_composition)
    case = _case(t=t, seed=t, **case_opts)
    out = _decoded(case, **opts)
    assert out.shape == case["hidden"].shape and out.dtype == F32
    _close(out, _ref(case, **opts), F32, f"T = {t} {opts} {case_opts}")


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_16_bit(monkeypatch: Any, dtype: Any) -> None:
    monkeypatch.setattr(gated_ops, "_mlp", _no_composition)
    case = _case(t=19, dtype=dtype, shared="gated")
    opts = {"activation": "gpt_oss", "interleaved": True}
    out = _decoded(case, **opts)
    assert out.dtype == dtype
    _close(out, _ref(case, **opts), dtype, "16-bit")


def test_gradients_or_more_tokens_take_the_grouped_composition(monkeypatch: Any) -> None:
    monkeypatch.setattr(gated_ops, "decode_gated_experts", _no_decode)
    # T = 8 with gradients: the composition's forward and backward, against float64
    _check(_case(t=8, shared="gated"), activation="gpt_oss", interleaved=True)
    _decoded(_case(t=65, shared="ungated"), activation="geglu")  # T = 65: no decode launch
    with pytest.raises(AssertionError, match="decode launch ran"):
        _decoded(_case(t=64))


def test_decode_and_composition_agree() -> None:
    case = _case(t=33, shared="gated", scale=3.0)
    opts = {"activation": "gpt_oss", "interleaved": True}
    _close(_decoded(case, **opts), moe_gated_experts(**case, **opts).detach(), F32, "agree")


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize(
    ("h", "si", "dtype"),
    [(300, 136, F32),  # ragged H and shared I tiles: 2 x 128 + 44, 128 + 8
     (256, 300, BF16)],  # p-major x^T (H % 128 == 0, narrow rows); 3 shared tiles
)  # fmt: skip
def test_shared_expert_split_over_the_programs(lnc: int, h: int, si: int, dtype: Any) -> None:
    # each program streams its half of the shared expert's intermediate tiles (LNC 2: 2 + 1
    # or 1 + 1), the sigmoid gate broadcast from one row of logits
    g = torch.Generator().manual_seed(si)
    c = _case(t=6, h=h, i=40, e=5, k=2, dtype=dtype, bias=False)
    shared = ((torch.randn(h, 2 * si, generator=g) / h**0.5).to(dtype),
              (torch.randn(si, h, generator=g) / si**0.5).to(dtype),
              (torch.randn(h, generator=g) / h**0.5).to(dtype))  # fmt: skip
    e = c["w_gate_up"].shape[0]
    present = torch.zeros(e, dtype=torch.int32)
    present[c["ids"].flatten()] = 1
    experts = torch.argsort(1 - present, stable=True).to(torch.int32).reshape(1, e)
    n = present.sum().to(torch.int32).reshape(1, 1)
    out = launch(
        moe_decode_fwd, c["hidden"], c["w_gate_up"], c["w_down"], c["ids"].to(torch.int32),
        c["weights"], experts, n, None, None, shared[0][None], shared[1][None],
        shared[2][None], target="trn2", lnc=lnc,
    )  # fmt: skip
    c.update(shared_gate_up=shared[0], shared_down=shared[1], shared_gate=shared[2])
    _close(out, _ref(c), dtype, f"shared expert, lnc {lnc}")


def test_empty_experts_and_all_tokens_on_one_expert(monkeypatch: Any) -> None:
    monkeypatch.setattr(gated_ops, "_mlp", _no_composition)
    t, e = 12, 6
    ids = torch.stack([torch.zeros(t, dtype=torch.int64), torch.full((t,), 3)], 1)
    case = _case(t=t, e=e, ids=ids, shared="ungated")
    opts = {"activation": "gpt_oss", "interleaved": True}
    _close(_decoded(case, **opts), _ref(case, **opts), F32, "experts 0 and 3 only")
    one = _case(t=t, e=e, k=1, ids=torch.zeros(t, 1, dtype=torch.int64))
    _close(_decoded(one, activation="geglu"), _ref(one, activation="geglu"), F32, "one expert")


def test_id_e_slots_contribute_nothing(monkeypatch: Any) -> None:
    # transformers' expert-parallel mask (local id E); NaN / Inf weights there, a token
    # with no expert on this rank (the shared expert alone), and no shared expert
    monkeypatch.setattr(gated_ops, "_mlp", _no_composition)
    for shared in ("gated", None):
        c = _case(t=19, e=5, k=3, shared=shared)
        off = torch.rand(19, 3, generator=torch.Generator().manual_seed(4)) < 0.4
        off[7] = True
        c["ids"] = torch.where(off, 5, c["ids"])
        c["weights"] = torch.where(off, torch.tensor(float("nan")), c["weights"])
        c["weights"][off.nonzero()[::2].unbind(1)] = float("inf")
        out = _decoded(c, activation="swiglu")
        assert torch.isfinite(out).all()
        _close(out, _ref(c, activation="swiglu"), F32, f"id E slots, shared {shared}")
        if shared is None:
            assert not out[7].any(), "a token with no expert on this rank got a value"


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_inf_in_a_token_stays_in_its_row(monkeypatch: Any, bad: float) -> None:
    monkeypatch.setattr(gated_ops, "_mlp", _no_composition)
    c = _case(t=8, e=6, k=2, shared="gated")
    c["hidden"][5, 3] = bad
    c["weights"][2, 1] = bad
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = _decoded(c, activation="gpt_oss", interleaved=True)
    bad_rows = (~torch.isfinite(out)).any(dim=1).nonzero().flatten().tolist()
    assert bad_rows == [2, 5]
    clean = [r for r in range(8) if r not in bad_rows]
    ref = _ref(c, activation="gpt_oss", interleaved=True)
    _close(out[clean], ref[clean], F32, "clean rows")


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_torch_compile_fullgraph(device: str, request: pytest.FixtureRequest) -> None:
    if device == "neuron":
        device = request.getfixturevalue("neuron")
    torch._dynamo.reset()
    compiled = torch.compile(moe_gated_experts, backend="aot_eager", fullgraph=True)
    c = _case(t=8, shared="gated")
    opts = {"activation": "gpt_oss", "interleaved": True}
    _close(_decoded(c, device, compiled, **opts), _ref(c, **opts), F32, "compiled")


def test_emulated_neuron_device_eager(neuron: str) -> None:
    c = _case(t=5, shared="ungated")
    _close(_decoded(c, neuron, activation="geglu"), _ref(c, activation="geglu"), F32, "neuron")


def test_autocast_gives_the_composition_dtype() -> None:
    c = _case(t=8, shared="gated")
    with torch.autocast("cpu", dtype=BF16):
        dec = _decoded(c, activation="swiglu")
        comp = moe_gated_experts(**c, activation="swiglu")
    assert dec.dtype == comp.dtype == F32
    _close(dec, _ref(c, activation="swiglu"), BF16, "autocast")


def test_op_refuses_more_than_64_tokens() -> None:
    c = _case(t=65, bias=False)
    args = (c["hidden"], c["weights"], c["ids"], c["w_gate_up"], c["w_down"])
    with pytest.raises(ValueError, match="hidden: expected at most 64 tokens; got 65"):
        torch.ops.nki.moe_gated_decode(*args, None, None, None, None, None, "swiglu", False,
                                       1.702, 7.0)  # fmt: skip


def test_shared_expert_pricing_fused_vs_its_own_launches() -> None:
    from nki_kernels.moe.decode_pricing import price_decode, shared_decode_comparison

    r = shared_decode_comparison(6, 8, 256, 128, 8, 2, 512, True, "trn2")
    assert r.label.startswith("modeled (cost model v") and r.label.endswith("trn2)")
    assert r.fused_band[0] <= r.fused_us <= r.fused_band[1]
    assert r.unfused_band[0] <= r.unfused_us <= r.unfused_band[1]
    assert r.speedup_band[0] <= r.speedup <= r.speedup_band[1]
    assert abs(r.speedup - r.unfused_us / r.fused_us) < 1e-9
    # both forms add time to the routed experts' launch alone (3 experts per program,
    # traced exactly; the shared expert's time from the exact launches)
    routed_us = price_decode(6, 8, 256, 128, 8, 2, "trn2").latency_ns[0] / 1e3
    assert routed_us < r.fused_us and routed_us < r.unfused_us
    assert r.shared_hbm > 0


def test_threads_give_the_serial_result() -> None:
    from concurrent.futures import ThreadPoolExecutor

    cases = [
        (_case(t=3 + 5 * n, seed=n, shared="gated" if n % 2 else None),
         {"activation": ("swiglu", "gpt_oss")[n % 2], "interleaved": bool(n % 2)})
        for n in range(4)
    ]  # fmt: skip
    serial = [_decoded(c, **o) for c, o in cases]
    with ThreadPoolExecutor(4) as pool:
        threaded = list(pool.map(lambda co: _decoded(co[0], **co[1]), cases * 2))
    for n, out in enumerate(threaded):
        assert torch.equal(out, serial[n % 4]), n
