"""The decode launch on transposed weight storage (transformers' experts [E, 2I, H] /
[E, H, I], nn.Linear shared experts, TorchTitan's w1 / w3 / w2), read by DMA transposes:
bit-identical to the row-major launch (same matmuls in the same order), close to the
float64 loop, no copy of such weights (the launch gets their storage), a copy for any
other layout, the serial result under threads, and bad layouts named."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from test_moe_gated_experts import BF16, F32, _case, _close

import nki_kernels.moe.decode_mlp as decode_mlp
import nki_kernels.ops.moe_decode as moe_decode
from nki_kernels.moe.gated_reference import gated_experts_reference
from nki_kernels.ops.moe_gated_experts import moe_gated_experts

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)


def _t(w: torch.Tensor) -> torch.Tensor:
    """w [.., K, N] as a transposed view of [.., N, K] storage (same values)."""
    return w.transpose(-2, -1).contiguous().transpose(-2, -1)


def _launched(monkeypatch: Any) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    real = moe_decode.launch

    def recorded(kernel: Any, *args: Any, **statics: Any) -> Any:
        seen.append((args, statics))
        return real(kernel, *args, **statics)

    monkeypatch.setattr(moe_decode, "launch", recorded)
    return seen


def _ref(c: dict[str, Any], **opts: Any) -> torch.Tensor:
    return gated_experts_reference(
        **{n: v.double() if n not in ("ids",) else v for n, v in c.items()}, **opts
    )


@pytest.mark.parametrize(
    ("shape", "dtype", "lnc", "groups"),
    [
        ((5, 300, 136, 16, 4), BF16, 2, False),  # ragged H and I tiles (300 = 2 x 128 + 44)
        ((1, 16, 24, 6, 2), F32, 1, False),  # 4-byte: natural loads and PE transposes
        ((8, 256, 72, 10, 3), BF16, 2, False),  # narrow gate/up rows (row-major: p-major)
        ((64, 200, 260, 3, 1), BF16, 2, True),  # column groups: gate / up runs apart
    ],
)
def test_transposed_experts_match_the_row_major_launch_bit_for_bit(
    monkeypatch: Any, shape: tuple[int, ...], dtype: Any, lnc: int, groups: bool
) -> None:
    t, h, i, e, k = shape
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", str(lnc))
    if groups:
        monkeypatch.setattr(decode_mlp, "GU_BANKS", 1)
    c = _case(t, h, i, e, k, dtype=dtype, bias=True, seed=t + e)
    seen = _launched(monkeypatch)
    with torch.no_grad():
        rows = moe_gated_experts(**c)
        hf = dict(c, w_gate_up=_t(c["w_gate_up"]), w_down=_t(c["w_down"]))
        got = moe_gated_experts(**hf)
    assert torch.equal(got, rows)
    _close(got, _ref(c), dtype, "transposed experts")
    (_, first), (args, second) = seen
    assert first["transposed"] == (False,) * 4 and second["transposed"][:2] == (True, True)
    assert args[1].data_ptr() == hf["w_gate_up"].data_ptr()  # the storage, not a copy
    assert args[2].data_ptr() == hf["w_down"].data_ptr()


@pytest.mark.parametrize(("dtype", "lnc", "gated"), [(BF16, 2, True), (F32, 1, False)])
def test_nn_linear_shared_expert_reads_gate_up_and_down_where_they_lie(
    monkeypatch: Any, dtype: Any, lnc: int, gated: bool
) -> None:
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", str(lnc))
    c = _case(6, 136, 40, 6, 2, dtype=dtype, bias=False, shared="gated" if gated else "ungated")
    si = c["shared_down"].shape[0]
    gate, up = c["shared_gate_up"][:, :si], c["shared_gate_up"][:, si:]
    lin = {"shared_gate_up": _t(gate), "shared_up": _t(up), "shared_down": _t(c["shared_down"])}
    seen = _launched(monkeypatch)
    with torch.no_grad():
        rows = moe_gated_experts(**c)
        got = moe_gated_experts(**dict(c, **lin))
    assert torch.equal(got, rows)
    _close(got, _ref(c), dtype, "nn.Linear shared expert")
    args, statics = seen[1]
    assert statics["transposed"][2:] == (True, True)
    for a, name in (
        (args[9], "shared_gate_up"),
        (args[12], "shared_up"),
        (args[10], "shared_down"),
    ):
        assert a.data_ptr() == lin[name].data_ptr(), name


def test_torchtitan_w1_w3_w2_as_three_tensors(monkeypatch: Any) -> None:
    c = _case(7, 144, 48, 5, 2, dtype=BF16, bias=False, seed=3)
    i = c["w_down"].shape[1]
    w1, w3 = c["w_gate_up"][:, :, :i], c["w_gate_up"][:, :, i:]
    parts = {"w_gate_up": _t(w1), "w_up": _t(w3), "w_down": _t(c["w_down"])}
    seen = _launched(monkeypatch)
    with torch.no_grad():
        rows = moe_gated_experts(**c)
        got = moe_gated_experts(**dict(c, **parts))
    assert torch.equal(got, rows)
    args, _ = seen[1]
    assert args[1].data_ptr() == parts["w_gate_up"].data_ptr()
    assert args[13].data_ptr() == parts["w_up"].data_ptr()
    # with a gradient: the grouped composition on the stacked weights, the same layer
    grad = {n: v.detach().clone().requires_grad_() for n, v in parts.items()}
    comp = moe_gated_experts(**dict(c, **grad))
    _close(comp, _ref(c), BF16, "composition with w_up")
    comp.float().sum().backward()
    assert all(v.grad is not None for v in grad.values())


def test_any_other_layout_is_copied_and_still_right(monkeypatch: Any) -> None:
    c = _case(4, 48, 24, 4, 2, dtype=F32, bias=False, seed=5)
    wide = torch.zeros(4, 48, 2 * 2 * 24)
    wide[:, :, ::2] = c["w_gate_up"]
    strided = wide[:, :, ::2]  # neither row-major nor a transposed view: one copy per call
    seen = _launched(monkeypatch)
    with torch.no_grad():
        got = moe_gated_experts(**dict(c, w_gate_up=strided))
    args, statics = seen[0]
    assert statics["transposed"][0] is False and args[1].is_contiguous()
    assert args[1].data_ptr() != strided.data_ptr()
    _close(got, _ref(c), F32, "strided weights (copied)")


def test_threads_give_the_serial_result() -> None:
    c = _case(5, 136, 40, 6, 2, dtype=BF16, bias=False, shared="gated", seed=7)
    hf = dict(c, w_gate_up=_t(c["w_gate_up"]), w_down=_t(c["w_down"]))
    with torch.no_grad():
        serial = moe_gated_experts(**hf)
    outs: list[Any] = [None] * 4

    def run(j: int) -> None:
        with torch.no_grad():
            outs[j] = moe_gated_experts(**hf)

    threads = [threading.Thread(target=run, args=(j,)) for j in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert all(torch.equal(o, serial) for o in outs)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"w_up": torch.zeros(5, 24, 7)}, r"w_up: expected \[E, H, I\] = \(5, 24, 20\)"),
        ({"w_up": torch.zeros(5, 24, 20), "interleaved": True}, "w_up: expected None with"),
        ({"shared_up": torch.zeros(24, 9)}, r"shared_up: expected \[H, Is\] = \(24, 16\)"),
    ],
)
def test_bad_split_weights_are_named(change: dict[str, Any], match: str) -> None:
    c = _case(4, bias=False, shared="ungated")
    if "w_up" in change:
        c["w_gate_up"] = c["w_gate_up"][:, :, :20]
    if "shared_up" in change:
        c["shared_gate_up"] = c["shared_gate_up"][:, :16]
    with pytest.raises(ValueError, match=match):
        moe_gated_experts(**c, **change)


def test_pricing_prices_the_transposing_read() -> None:
    """layout='hf' traces the launch on transposed storage (DMA transposes, modeled below
    the copy rate): slower than the row-major launch on every parameter set; an unknown
    layout is refused by name."""
    from nki_kernels.moe.decode_pricing import price_decode

    args = (4, 8, 256, 128, 16, 2, "trn2")
    rows = price_decode(*args, layout="rows").latency_ns
    hf = price_decode(*args, layout="hf").latency_ns
    assert all(b > a for a, b in zip(rows, hf)), (rows, hf)
    with pytest.raises(ValueError, match="layout: expected one of"):
        price_decode(*args, layout="cols")
