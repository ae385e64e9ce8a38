"""Norm configs: every valid config of each search space runs correctly on a small shape;
validate() refuses what cannot run (with the reason), and its SBUF estimate bounds the
interpreter's own accounting."""

from __future__ import annotations

from typing import Any

import norm_helpers as nh
import pytest
import torch

from nki_kernels.interp import TensorSpec, run
from nki_kernels.interp.errors import MemoryPlanError
from nki_kernels.kernel_config import InvalidConfig
from nki_kernels.norm import config as C
from nki_kernels.norm import reference as ref
from nki_kernels.norm.layernorm import layer_norm_fwd
from nki_kernels.norm.layernorm_bwd import layer_norm_bwd
from nki_kernels.norm.rmsnorm import add_rms_norm_fwd, rms_norm_fwd
from nki_kernels.norm.rmsnorm_bwd import rms_norm_bwd
from nki_kernels.targets import get_target

DTYPE = torch.bfloat16
TARGET = get_target("trn2")
# 260 rows: two rows per partition possible plus a 4-row tail; 640 columns: a 512 chunk
# and a ragged 128 one.
ROWS, HIDDEN = 260, 640


def _inputs() -> dict[str, Any]:
    x = nh.make((ROWS, HIDDEN), DTYPE, 1, loc=0.5)
    return {
        "x": x,
        "r": nh.make((ROWS, HIDDEN), DTYPE, 2),
        "dy": nh.make((ROWS, HIDDEN), DTYPE, 3),
        "w": nh.make((HIDDEN,), DTYPE, 4, loc=1.0),
        "b": nh.make((HIDDEN,), DTYPE, 5),
    }


def _case(op: str, a: dict[str, Any]) -> tuple[Any, tuple[Any, ...], Any]:
    """(kernel, positional args, checker(outputs)) of one op on the inputs `a`."""
    x, w, b, dy = a["x"], a["w"], a["b"], a["dy"]
    tol = nh.TOL[DTYPE]
    if op == "rms_norm":
        yr, bound = nh.rms_fwd_bound(x, w, *tol)
        return rms_norm_fwd, (x, w, nh.EPS), lambda o: nh.assert_within("y", o[0], yr, bound)
    if op == "add_rms_norm":
        _, hr, _ = ref.add_rms_norm_ref(x, a["r"], w, nh.EPS)
        yr, bound = nh.rms_fwd_bound(hr, w, *tol)

        def check_add(o: Any) -> None:
            assert torch.equal(o[1], hr)
            nh.assert_within("y", o[0], yr, bound)

        return add_rms_norm_fwd, (x, a["r"], w, nh.EPS), check_add
    if op == "layer_norm":
        yr, bound = nh.ln_fwd_bound(x, w, b, *tol)
        return layer_norm_fwd, (x, w, b, 1e-5), lambda o: nh.assert_within("y", o[0], yr, bound)
    if op in ("rms_norm_bwd", "add_rms_norm_bwd"):
        _, rstd = ref.rms_norm_ref(x, None, nh.EPS)
        want = nh.rms_bwd_bounds(dy, x, w, *tol)
        dh = a["r"] if op == "add_rms_norm_bwd" else None
        if dh is not None:
            rdx, bdx = want["dx"]
            want["dx"] = (rdx + dh.float(), bdx + tol[0] * dh.float().abs())
        return (
            rms_norm_bwd,
            (dy, x, w, rstd, dh),
            lambda o: nh.check_all({"dx": o[0], "dw": o[1]}, want, op),
        )
    _, mean, rstd = ref.layer_norm_ref(x, None, None, 1e-5)
    want = nh.ln_bwd_bounds(dy, x, w, b, *tol)
    return (
        layer_norm_bwd,
        (dy, x, w, True, mean, rstd),
        lambda o: nh.check_all({"dx": o[0], "dw": o[1], "db": o[2]}, want, op),
    )


@pytest.mark.parametrize("op", sorted(C.CONFIGS))
def test_every_valid_config_runs_correctly(op: str) -> None:
    cls = C.CONFIGS[op]
    affine = "wb" if op.startswith("layer") else "w"
    problem = C.NormProblem(ROWS, HIDDEN, "bfloat16", affine)
    kernel, args, check = _case(op, _inputs())
    valid = [cfg for cfg in cls.space(problem, TARGET) if cfg.is_valid(problem, TARGET)]
    assert len(valid) >= 20, f"{op}: suspiciously few valid configs ({len(valid)})"
    assert cls.heuristic(problem, TARGET) in valid
    for cfg in valid:
        call, kw = _inline_args(op, args, cfg)
        outputs = run(kernel, *call, target=TARGET, **kw, **cfg.to_dict()).outputs
        try:
            check(outputs)
        except AssertionError as e:
            raise AssertionError(f"{cfg}: {e}") from None


def _inline_args(op: str, args: tuple[Any, ...], cfg: Any) -> tuple[tuple[Any, ...], dict]:
    """A backward config that computes its statistics gets None for them, and eps."""
    if not op.endswith("_bwd") or not cfg.inline_stats():
        return args, {}
    if op == "layer_norm_bwd":
        return (*args[:4], None, None), {"eps": 1e-5}
    return (*args[:3], None, *args[4:]), {"eps": nh.EPS}


@pytest.mark.parametrize(
    "cls,problem,changes,reason",
    [
        (C.RMSNormConfig, (512, 4096, "bfloat16"), {"resident": True, "bufs": 2}, "bufs"),
        (C.RMSNormConfig, (512, 4096, "bfloat16"), {"chunk": 5000}, "chunk"),
        (C.RMSNormConfig, (512, 4096, "bfloat16"), {"gpsimd_eighths": 9}, "gpsimd_eighths"),
        (C.RMSNormConfig, (512, 4096, "bfloat16"), {"scale_mode": "fused"}, "scale_mode"),
        (C.RMSNormBwdConfig, (512, 4096, "bfloat16"), {"chunk": 1000}, "chunk"),
        (C.RMSNormBwdConfig, (512, 131072, "bfloat16"), {"chunk": 512}, "hidden"),
        (C.LayerNormConfig, (512, 4096, "float32"), {"stats": "mixed"}, "stats"),
        (
            C.RMSNormConfig,
            (512, 32768, "float32"),
            {"resident": True, "chunk": 32768, "bufs": 4},
            "SBUF",
        ),
    ],
)
def test_validate_refuses_with_reason(cls: Any, problem: tuple, changes: dict, reason: str) -> None:
    p = C.NormProblem(*problem, affine="w")
    cfg = C.replace(cls.heuristic(p, TARGET) if problem[1] <= 65536 else cls(), **changes)
    with pytest.raises(InvalidConfig, match=reason):
        cfg.validate(p, TARGET)


def _specs(op: str, p: C.NormProblem) -> tuple[Any, tuple[Any, ...]]:
    n, h, d = p.rows, p.hidden, p.dtype
    x, w, f = TensorSpec((n, h), d), TensorSpec((h,), d), TensorSpec((n,), "float32")
    return {
        "rms_norm": (rms_norm_fwd, (x, w, nh.EPS)),
        "add_rms_norm": (add_rms_norm_fwd, (x, x, w, nh.EPS)),
        "rms_norm_bwd": (rms_norm_bwd, (x, x, w, f)),
        "add_rms_norm_bwd": (rms_norm_bwd, (x, x, w, f, x)),
        "layer_norm": (layer_norm_fwd, (x, w, w, 1e-5)),
        "layer_norm_bwd": (layer_norm_bwd, (x, x, w, True, f, f)),
    }[op]


@pytest.mark.parametrize("op", sorted(C.CONFIGS))
def test_sbuf_estimate_bounds_the_interpreter(op: str) -> None:
    """Trace-only runs at large hidden sizes: a plan validate() accepts never overflows
    SBUF, and its estimate is at least the interpreter's peak."""
    affine = "wb" if op.startswith("layer") else "w"
    cls = C.CONFIGS[op]
    for hidden, dtype in ((8192, "bfloat16"), (16384, "float32")):
        p = C.NormProblem(1024, hidden, dtype, affine)
        kernel, args = _specs(op, p)
        seen = set()
        for cfg in cls.space(p, TARGET):
            key = (cfg.rows_per_partition, cfg.chunk, cfg.resident, cfg.bufs)
            if key in seen or not cfg.is_valid(p, TARGET):
                continue
            seen.add(key)
            call, kw = _inline_args(op, args, cfg)
            try:
                peak = run(kernel, *call, target=TARGET, trace_only=True, **kw, **cfg.to_dict())
            except MemoryPlanError as e:
                raise AssertionError(f"{op} {p}: valid {cfg} overflowed: {e}") from None
            assert peak.peak_sbuf_bytes <= cfg.sbuf_bytes(p), (op, p, cfg)
        assert seen, f"{op} {p}: no valid plan"


def test_heuristics_prefer_prefetching_resident_plans() -> None:
    p = C.NormProblem(16384, 4096, "bfloat16", "w")
    cfg = C.RMSNormConfig.heuristic(p, TARGET)
    assert cfg.resident and cfg.bufs >= 4 and cfg.chunk == 4096
    wide = C.NormProblem(1024, 16384, "float32", "w")
    assert not C.RMSNormConfig.heuristic(wide, TARGET).resident
