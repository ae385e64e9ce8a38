"""moe/options_pricing.py: the priced compositions hold the option's work on each side,
and every figure is labelled modeled (small shapes: seconds)."""

from __future__ import annotations

import pytest

from nki_kernels.baselines.native import price
from nki_kernels.moe.options_pricing import (
    Options,
    _ours_extra,
    fused_shared_us,
    native_steps,
    options_comparison,
    price_expert_act,
)
from nki_kernels.perfmodel.band import structural_pct
from nki_kernels.targets import get_target

COUNTS = [200, 0, 56, 128]  # an empty expert, a ragged one


def test_native_composition_carries_the_options() -> None:
    plain = {s.name for s in native_steps(384, 256, 128, 4, COUNTS, Options())}
    assert "swiglu (+ biases)" in plain and "out += w * y" in plain
    gpt = {s.name for s in native_steps(384, 256, 128, 4, COUNTS, Options("gpt_oss", True))}
    assert {"gpt_oss (+ biases)", "out += w * (y + b_down)"} <= gpt
    shared = native_steps(384, 256, 128, 4, COUNTS, Options(shared_inter=64, shared_gated=True))
    assert {"shared x W_gate_up", "shared act", "shared gate x w", "out += g * shared"} <= {
        s.name for s in shared
    }


def test_ours_prices_each_launch_the_op_runs() -> None:
    tgt = get_target("trn2")
    parts = _ours_extra(384, 256, 128, COUNTS, Options("gpt_oss", True, 64, True), tgt, "bfloat16")
    assert set(parts) == {"gate_up", "down", "act", "down bias", "shared gate_up",
                          "shared down", "shared act", "shared gate"}  # fmt: skip
    assert all(min(v) > 0 for v in parts.values())
    # a gated activation reads 2I columns and writes I: more work than the bias pass over I
    act = price_expert_act(384, 256, 4, "gpt_oss", True, tgt)
    bias = price_expert_act(384, 128, 4, "none", True, tgt)
    assert act[0] > bias[0]


def test_comparison_is_labelled_modeled_with_a_band() -> None:
    r = options_comparison(384, 256, 128, 4, COUNTS, Options("gpt_oss", True))
    assert r.label.startswith("modeled (cost model v")
    lo, hi = r.speedup_band
    assert lo <= r.speedup <= hi
    # the parameter sets' spread widened by the structural error of two modeled figures
    f = 1.0 + structural_pct("trn2") / 100.0 * 2**0.5
    assert lo * f <= r.speedup <= hi / f
    nat = price(native_steps(384, 256, 128, 4, COUNTS, Options("gpt_oss", True)), "trn2")
    assert abs(r.native_us - nat.latency_ns / 1e3) < 1e-6 * r.native_us


def test_fused_shared_expert_prices_the_stacked_launches() -> None:
    o = Options(shared_inter=256, shared_gated=True)  # 2 stacked experts of I = 128
    us, (lo, hi) = fused_shared_us(384, 256, 128, 4, COUNTS, o)
    assert lo <= us <= hi and us > 0
    # more rows through the same kernels: the stacked form is never cheaper than the
    # routed part alone
    alone = options_comparison(384, 256, 128, 4, COUNTS, Options())
    assert us > alone.ours_us
    with pytest.raises(ValueError, match="multiple of I"):
        fused_shared_us(384, 256, 128, 4, COUNTS, Options(shared_inter=100))


def test_ours_prices_the_nki_dispatch_and_combine_for_natives_gathers() -> None:
    from nki_kernels.moe.gather_pricing import price_dispatch_combine
    from nki_kernels.moe.options_pricing import _is_gather_or_combine, price_dispatch_combine_sets

    nat = native_steps(384, 256, 128, 4, COUNTS, Options())
    names = [s.name for s in nat]
    moved = {n for n in names if _is_gather_or_combine(n)}
    assert moved == {"gather token rows", "gather out rows", "out += w * y", "scatter out rows"}
    # native's gathers and combine: one launch each over all 384 routed rows, not per group
    for s in nat:
        if s.name in moved:
            assert s.repeat == 1 and names.count(s.name) == 1, s.name
            assert 384 in (s.args[0].shape[0], s.args[1].shape[0]), s.name
    assert not {"x W_gate_up", "h W_down"} & moved
    # the same two launches gather_pricing prices (COUNTS sum to 384 rows: k = 1)
    sets = price_dispatch_combine_sets(384, 256, 1, get_target("trn2"))
    d, c = price_dispatch_combine(384, 256, 1)
    assert abs(sets[0] / 1e3 - (d.us + c.us)) <= 1e-9 * sets[0]


@pytest.mark.parametrize(
    "o",
    [Options(), Options("gpt_oss", True), Options(shared_inter=32),
     Options(shared_inter=32, shared_gated=True)],
)  # fmt: skip
def test_ours_prices_the_torch_ops_the_layer_runs_outside_its_launches(o: Options) -> None:
    # moe_gated_experts (grouped composition) runs, on torch ops over [T, H], the cast of
    # its fp32 combine to the layer's dtype and, with a shared expert, the shared output's
    # cast to fp32, its gate scale and the add: count them on the real op (T = 65, no
    # gradients: the composition) and find one priced step each
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from nki_kernels.moe.options_pricing import ours_glue_steps
    from nki_kernels.ops.moe_gated_experts import moe_gated_experts

    t, h, i, e = 65, 24, 16, 4
    g = torch.Generator().manual_seed(0)
    args = {"hidden": torch.randn(t, h, generator=g).bfloat16(),
            "weights": torch.rand(t, 2, generator=g),
            "ids": torch.stack([torch.randperm(e, generator=g)[:2] for _ in range(t)]),
            "w_gate_up": torch.randn(e, h, 2 * i, generator=g).bfloat16(),
            "w_down": torch.randn(e, i, h, generator=g).bfloat16()}  # fmt: skip
    if o.biases:
        args.update(b_gate_up=torch.zeros(e, 2 * i).bfloat16(), b_down=torch.zeros(e, h).bfloat16())
    if o.shared_inter:
        args.update(shared_gate_up=torch.randn(h, 2 * o.shared_inter).bfloat16(),
                    shared_down=torch.randn(o.shared_inter, h).bfloat16())  # fmt: skip
        if o.shared_gated:
            args["shared_gate"] = torch.randn(h).bfloat16()

    class TorchPasses(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, a=(), kw=None):  # type: ignore[no-untyped-def]
            out = func(*a, **(kw or {}))
            name = func.name()
            if not name.startswith("nki::") and getattr(out, "shape", None) == (t, h):
                self.ops.append(name)
            return out

    with torch.no_grad(), TorchPasses() as mode:
        moe_gated_experts(**args, activation=o.activation, interleaved=o.activation == "gpt_oss")
    priced = ours_glue_steps(t, h, o, "bfloat16")
    assert len(priced) == len(mode.ops), (mode.ops, [s.name for s in priced])
    assert all(s.args[0].shape == (t, h) for s in priced)
