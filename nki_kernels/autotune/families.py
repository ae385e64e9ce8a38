"""The tunable ops of the kernel families: `Tunable` adapters and their problems.

`OPS` maps an op name to an `OpSpec`: how to build its bucketed problem from a model shape
(`nki_kernels.model_shapes`), a bucket size and a dtype, and how to make its `Tunable`
(kernel launch, reduced problem, reference, tolerances). Adapters are built lazily so that
importing this module stays cheap.

The reduced problem of the correctness gate keeps the config's tile structure: the rows
cover two full row tiles (128 x rows_per_partition rows each), a partial-height tile and a
ragged tail of fewer than 128 rows; the hidden size keeps two full column chunks plus the
same ragged last chunk as the real problem (or the whole row when the config uses one
chunk per row).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..kernel_config import InvalidConfig, KernelConfig
from ..targets import Target
from .attention_family import AttentionOp, attention_problem
from .family_common import by_model, config_cls, np_dtype, to_numpy
from .tunable import Tunable

EPS = 1e-6


@dataclass(frozen=True)
class OpSpec:
    """One tunable op: its problem builder, `Tunable` factory and standard shapes."""

    op: str
    family: str
    make_tunable: Callable[..., Tunable]  # (lnc=1): the op as launched at that LNC
    make_problem: Callable[[str, int, str], Any]  # (model shape name, bucket, dtype)
    shapes: tuple[str, ...]  # model shape names (model_shapes) the op is tuned for
    bucket_dim: str  # what the bucket counts: "rows" | "tokens" | "seq"
    standard_buckets: tuple[int, ...]
    dtypes: tuple[str, ...] = ("bfloat16",)

    def tunable(self, lnc: int = 1) -> Tunable:
        """The op's `Tunable` as launched at `lnc` logical cores (`kernel[lnc]`)."""
        from ..runtime.lnc import check_lnc

        check_lnc(lnc, "lnc")
        if lnc == 1:
            return self.make_tunable()
        try:
            return self.make_tunable(lnc=lnc)
        except TypeError:
            raise ValueError(
                f"lnc: op {self.op!r} is tuned at LNC 1 only (its tuner family takes no "
                f"LNC); got {lnc}"
            ) from None


# --------------------------------------------------------------------------- norms
def _torch(a: np.ndarray) -> Any:
    """A CPU torch tensor with `a`'s values and dtype (the references round to it, e.g.
    the residual sum h of add_rms_norm is rounded to the input dtype)."""
    import torch

    from ..interp import dtypes

    t = torch.from_numpy(np.asarray(a, dtype=np.float32))
    return (
        t.to(torch.bfloat16) if a.dtype == dtypes.bfloat16 else t.to(getattr(torch, a.dtype.name))
    )


def _norm_reduced(problem: Any, config: KernelConfig, target: Target) -> Any:
    kk = int(getattr(config, "rows_per_partition", 1))
    rows = min(problem.rows, 2 * 128 * kk + 128 + 37)
    chunk = int(getattr(config, "chunk", problem.hidden))
    hidden = problem.hidden
    if chunk < hidden and hidden > 2 * chunk:
        hidden = 2 * chunk + hidden % chunk
    reduced = replace(problem, rows=rows, hidden=hidden)
    try:
        # a plan's shape can depend on the row length (e.g. the backward's pipeline depth),
        # so the config must be as valid on the reduced rows as on the bucket's
        config.validate(reduced, target)
    except InvalidConfig:
        reduced = replace(problem, rows=rows)
    return reduced


def _norm_tol(problem: Any, n_row_outputs: int, n_sum_outputs: int) -> list[tuple[float, float]]:
    import torch

    from ..testing.tolerances import tolerance

    dt = getattr(torch, problem.dtype)
    row = tolerance(dt, reduction=problem.hidden)
    # weight / bias gradients sum over rows: magnitude ~ sqrt(rows) for unit-scale data
    col = tolerance(dt, reduction=problem.rows, scale=math.sqrt(problem.rows))
    # statistics (mean, rstd) are fp32 sums over the row
    stat = tolerance(torch.float32, reduction=problem.hidden)
    tols = [(row.atol, row.rtol)] * n_row_outputs + [(col.atol, col.rtol)] * n_sum_outputs
    return tols + [(stat.atol, stat.rtol)] * 2


class _NormOp:
    """Launch arguments, numeric inputs and reference of one norm op."""

    def __init__(self, op: str, lnc: int = 1) -> None:
        from ..norm import config as ncfg

        self.op = op
        self.lnc = lnc
        self.config_cls = ncfg.CONFIGS[op]

    def kernel(self) -> Any:
        from ..norm import layernorm, layernorm_bwd, rmsnorm, rmsnorm_bwd

        return {
            "rms_norm": rmsnorm.rms_norm_fwd,
            "add_rms_norm": rmsnorm.add_rms_norm_fwd,
            "rms_norm_bwd": rmsnorm_bwd.rms_norm_bwd,
            "add_rms_norm_bwd": rmsnorm_bwd.rms_norm_bwd,
            "layer_norm": layernorm.layer_norm_fwd,
            "layer_norm_bwd": layernorm_bwd.layer_norm_bwd,
        }[self.op]

    def args(self, p: Any, arrays: dict[str, Any] | None) -> tuple[Any, ...]:
        """Positional kernel arguments; `arrays` None means TensorSpecs (trace-only)."""
        from ..interp import TensorSpec

        def t(name: str, shape: tuple[int, ...], dtype: str) -> Any:
            return TensorSpec(shape, dtype) if arrays is None else arrays[name]

        n, h, d = p.rows, p.hidden, p.dtype
        w = t("w", (h,), d) if p.has_weight else None
        b = t("b", (h,), d) if p.has_bias else None
        x = t("x", (n, h), d)
        if self.op == "rms_norm":
            return (x, w, EPS)
        if self.op == "add_rms_norm":
            return (x, t("res", (n, h), d), w, EPS)
        if self.op == "layer_norm":
            return (x, w, b, EPS)
        dy = t("dy", (n, h), d)
        if self.op == "rms_norm_bwd":
            return (dy, x, w, t("rstd", (n,), "float32"))
        if self.op == "add_rms_norm_bwd":  # x is h = x + residual; dh its incoming gradient
            return (dy, x, w, t("rstd", (n,), "float32"), t("res", (n, h), d))
        return (dy, x, w, p.has_bias, t("mean", (n,), "float32"), t("rstd", (n,), "float32"))

    def trace(self, p: Any, config: KernelConfig, target: Target) -> Any:
        from ..interp import run

        args, kw = self._call(p, config, None)
        return run(self.kernel(), *args, target=target, lnc=self.lnc, trace_only=True, **kw).trace

    def _call(
        self, p: Any, config: KernelConfig, arrays: dict[str, Any] | None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """(positional args, keyword args) of one launch as the op makes it: a backward
        config that computes the statistics in the kernel gets None for them, and eps."""
        from ..norm.config import stats_in_kernel

        args, kw = self.args(p, arrays), config.to_dict()
        if stats_in_kernel(config):
            nstats = 2 if self.op == "layer_norm_bwd" else 1
            at = 4 if self.op == "layer_norm_bwd" else 3
            args = (*args[:at], *(None,) * nstats, *args[at + nstats :])
            kw["eps"] = EPS
        return args, kw

    def arrays(self, p: Any, seed: int) -> dict[str, np.ndarray]:
        """Seeded inputs by name (the statistics inputs of the backward ops are
        placeholders here; `numeric` replaces them with the reference's)."""
        rng = np.random.default_rng(seed)
        dt = np_dtype(p.dtype)
        n, h = p.rows, p.hidden

        def rnd(*shape: int, loc: float = 0.0, scale: float = 1.0) -> np.ndarray:
            return (loc + scale * rng.standard_normal(shape)).astype(dt)

        a = {"x": rnd(n, h, loc=0.3), "w": rnd(h, loc=1.0, scale=0.1), "b": rnd(h, scale=0.1)}
        a["res"], a["dy"] = rnd(n, h), rnd(n, h)
        a["rstd"] = np.ones(n, np.float32)
        a["mean"] = np.zeros(n, np.float32)
        return a

    def device_launcher(self, p: Any, config: KernelConfig, target: Target) -> Any:
        from .device import device_runner

        return device_runner(self.kernel(), self.args(p, self.arrays(p, 0)), config, target)

    def numeric(
        self, p: Any, config: KernelConfig, target: Target, seed: int
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        from ..interp import run
        from ..norm import reference as ref

        a = self.arrays(p, seed)
        x, w = _torch(a["x"]), _torch(a["w"]) if p.has_weight else None
        b = _torch(a["b"]) if p.has_bias else None
        expect: tuple[Any, ...]
        if self.op == "rms_norm":
            expect = ref.rms_norm_ref(x, w, EPS)
        elif self.op == "add_rms_norm":
            y, hsum, rstd = ref.add_rms_norm_ref(x, _torch(a["res"]), w, EPS)
            expect = (y, hsum, rstd)
        elif self.op == "layer_norm":
            expect = ref.layer_norm_ref(x, w, b, EPS)
        elif self.op in ("rms_norm_bwd", "add_rms_norm_bwd"):
            a["rstd"] = to_numpy(ref.rms_norm_ref(x, None, EPS)[1])
            dx, dw = ref.rms_norm_bwd_ref(_torch(a["dy"]), x, w, EPS)
            if self.op == "add_rms_norm_bwd":
                dx = dx + _torch(a["res"])  # the residual stream's gradient passes through
            expect = (dx, dw)
        else:
            _, mean, rstd = ref.layer_norm_ref(x, None, None, EPS)
            a["mean"], a["rstd"] = to_numpy(mean), to_numpy(rstd)
            expect = ref.layer_norm_bwd_ref(_torch(a["dy"]), x, w, b, EPS)
        args, kw = self._call(p, config, a)
        out = run(self.kernel(), *args, target=target, lnc=self.lnc, **kw).outputs
        outs = list(out) if isinstance(out, tuple) else [out]
        refs = [to_numpy(e) for e in expect if e is not None]
        outs = [o for o in outs if o is not None]
        # LNC 2 backward: weight / bias gradients come back as [programs, H] fp32 column
        # sums, one row per program, which the op adds (ops/norm.py)
        outs = [
            np.asarray(o, np.float64).sum(0) if np.ndim(o) == 2 and np.ndim(r) == 1 else o
            for o, r in zip(outs, refs)
        ]
        return [np.asarray(o, dtype=np.float64) for o in outs], refs

    def tolerance(self, p: Any) -> list[tuple[float, float]]:
        if self.op in ("rms_norm", "layer_norm"):
            return _norm_tol(p, 1, 0)
        if self.op == "add_rms_norm":
            return _norm_tol(p, 2, 0)
        return _norm_tol(p, 1, 2)

    def tunable(self) -> Tunable:
        return Tunable(
            op=self.op,
            config_cls=self.config_cls,
            trace=self.trace,
            reduced=_norm_reduced,
            run_numeric=self.numeric,
            tolerance=self.tolerance,
            bucket_key=lambda p: f"rows{p.rows}-h{p.hidden}-{p.affine}",
            dtype=lambda p: p.dtype,
            kernels=(self.kernel(),),
            device_launcher=self.device_launcher,
            describe=lambda p: f"rows={p.rows} hidden={p.hidden} {p.dtype} affine={p.affine}",
            lnc=self.lnc,
        )


def _norm_problem(affine: str) -> Callable[[str, int, str], Any]:
    def make(shape: str, bucket: int, dtype: str) -> Any:
        from ..model_shapes import NORM_SHAPES
        from ..norm.config import NormProblem
        from ..runtime.buckets import bucket as to_bucket

        hidden = by_model(NORM_SHAPES, shape).hidden
        return NormProblem(rows=to_bucket(bucket), hidden=hidden, dtype=dtype, affine=affine)

    return make


def _norm_spec(op: str, affine: str) -> OpSpec:
    return OpSpec(
        op=op,
        family="norm",
        make_tunable=lambda lnc=1: _NormOp(op, lnc).tunable(),
        make_problem=_norm_problem(affine),
        shapes=("llama3-8b", "llama3-70b"),
        bucket_dim="rows",
        standard_buckets=(2048, 8192, 32768),
    )


# ----------------------------------------------------------------------------- MoE
class _MoEOp:
    """Blockwise expert MLP forward, priced with balanced routing."""

    op = "moe_mlp"

    def __init__(self, lnc: int = 1) -> None:
        self.lnc = lnc

    def kernel(self) -> Any:
        from ..moe.blockwise_mlp import moe_mlp_fwd

        return moe_mlp_fwd

    def trace(self, p: Any, config: KernelConfig, target: Target) -> Any:
        """Balanced routing: every expert gets ceil(T*k/E) assignments, in the sized
        plan's blocks (E * ceil(T*k / (E*B)) of them); all of them are static (no device
        loop, whose trip count a trace-only run cannot read)."""
        from ..interp import TensorSpec, run
        from ..moe.grouping import sized_kinds

        b = int(config.block_size)  # type: ignore[attr-defined]
        per_expert = -(-p.tokens * p.top_k // p.experts)
        kinds = sized_kinds(np.full(p.experts, per_expert), b)
        used = sum(kinds)
        t, k, dt = p.tokens, p.top_k, p.dtype
        args = (
            TensorSpec((t, p.hidden), dt),
            TensorSpec((p.experts, p.hidden, 2 * p.intermediate), dt),
            TensorSpec((p.experts, p.intermediate, p.hidden), dt),
            TensorSpec((used, 128, b // 128), "int32"),
            TensorSpec((used, 1), "int32"),
            TensorSpec((1, b // 128 + 1), "int32"),
            TensorSpec((t, k), "int32"),
            TensorSpec((t, k), "float32"),
            None,  # save_cols: the inference forward (nothing saved)
            None,  # save_holes
            kinds,
            False,
        )
        return run(self.kernel(), *args, target=target, lnc=self.lnc, trace_only=True,
                   **config.to_dict()).trace  # fmt: skip

    def numeric(
        self, p: Any, config: KernelConfig, target: Target, seed: int
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        import torch

        from ..interp import run
        from ..moe.reference import moe_reference

        args, logits = self.args(p, config, seed)
        out = run(self.kernel(), *args, target=target, lnc=self.lnc, **config.to_dict()).outputs
        t = [torch.from_numpy(a.astype(np.float32)) for a in args[:3]]
        ref = moe_reference(t[0], torch.from_numpy(logits), t[1], t[2], p.top_k)
        return [np.asarray(out, np.float64)], [to_numpy(ref)]

    def args(self, p: Any, config: KernelConfig, seed: int) -> tuple[tuple[Any, ...], Any]:
        """(the kernel's positional arguments, the router logits) for seeded inputs routed
        by the reference router and grouped by the op's block planner."""
        import torch

        from ..moe.grouping import plan_blocks
        from ..moe.reference import route_reference

        rng = np.random.default_rng(seed)
        dt = np_dtype(p.dtype)
        h, i, e = p.hidden, p.intermediate, p.experts
        x = rng.standard_normal((p.tokens, h)).astype(dt)
        wgu = (rng.standard_normal((e, h, 2 * i)) / math.sqrt(h)).astype(dt)
        wd = (rng.standard_normal((e, i, h)) / math.sqrt(i)).astype(dt)
        logits = rng.standard_normal((p.tokens, e)).astype(np.float32)
        weights, ids = route_reference(torch.from_numpy(logits), p.top_k)
        bs = int(config.block_size)  # type: ignore[attr-defined]
        plan = plan_blocks(ids.numpy(), weights.numpy(), e, bs, sized=True)
        args = (x, wgu, wd, plan.slot_token, plan.block_expert, plan.kind_bounds,
                plan.token_slot, plan.token_weight, None, None, None, plan.may_drop)  # fmt: skip
        return args, logits

    def device_launcher(self, p: Any, config: KernelConfig, target: Target) -> Any:
        from .device import device_runner

        return device_runner(self.kernel(), self.args(p, config, 0)[0], config, target)

    def reduced(self, p: Any, config: KernelConfig, target: Target) -> Any:
        """Two experts with two blocks each plus a ragged tail of tokens; hidden and
        intermediate sizes with one full tile of every kind the config uses and a ragged
        remainder."""
        b = int(config.block_size)  # type: ignore[attr-defined]
        ti = int(config.tile_i)  # type: ignore[attr-defined]
        dma_h = int(config.dma_h)  # type: ignore[attr-defined]
        down_n = int(config.down_n)  # type: ignore[attr-defined]
        experts, top_k = min(p.experts, 2), min(p.top_k, 2)
        return replace(
            p,
            tokens=min(p.tokens, (2 * b * experts) // top_k + 37),
            hidden=min(p.hidden, max(128 * dma_h, down_n) + 128),
            intermediate=min(p.intermediate, ti + 64),
            experts=experts,
            top_k=top_k,
        )

    def tolerance(self, p: Any) -> tuple[float, float]:
        import torch

        from ..testing.tolerances import tolerance

        tol = tolerance(getattr(torch, p.dtype), reduction=p.hidden + p.intermediate)
        return (tol.atol, tol.rtol)

    def tunable(self) -> Tunable:
        return Tunable(
            op=self.op,
            config_cls=config_cls("moe_mlp"),
            trace=self.trace,
            reduced=self.reduced,
            run_numeric=self.numeric,
            tolerance=self.tolerance,
            bucket_key=lambda p: (
                f"t{p.tokens}-h{p.hidden}-i{p.intermediate}-e{p.experts}-k{p.top_k}"
            ),
            dtype=lambda p: p.dtype,
            kernels=(self.kernel(),),
            device_launcher=self.device_launcher,
            price=lambda p, config, target: _moe_price(p, config, target, self.lnc),
            describe=lambda p: (
                f"T={p.tokens} H={p.hidden} I={p.intermediate} E={p.experts} k={p.top_k} "
                f"{p.dtype} (balanced routing)"
            ),
            lnc=self.lnc,
        )


def _moe_price(
    p: Any, config: KernelConfig, target: Target, lnc: int = 1
) -> tuple[float, dict[str, Any]]:
    """The MoE family's pricing (moe.pricing): trace-only runs of a few blocks under
    balanced routing, extrapolated to the used blocks, launched at `lnc`."""
    from ..moe.pricing import price_blocks, routing_ids, used_blocks

    ids = routing_ids("uniform", p.tokens, p.experts, p.top_k)
    blocks = used_blocks(ids, p.experts, int(config.block_size))  # type: ignore[attr-defined]
    bp = price_blocks("fwd", p, config, blocks, target, lnc=lnc)
    return bp.latency_ns, {"extrapolation_check": bp.extrapolation_check, "exact": bp.exact}


def _moe_problem(shape: str, bucket: int, dtype: str) -> Any:
    from ..model_shapes import MOE_SHAPES
    from ..moe.config import MoEProblem
    from ..runtime.buckets import bucket as to_bucket

    s = by_model(MOE_SHAPES, shape)
    return MoEProblem(to_bucket(bucket), s.hidden, s.intermediate, s.num_experts, s.top_k, dtype)


OPS: dict[str, OpSpec] = {
    s.op: s
    for s in (
        _norm_spec("rms_norm", "w"),
        _norm_spec("add_rms_norm", "w"),
        _norm_spec("layer_norm", "wb"),
        _norm_spec("rms_norm_bwd", "w"),
        _norm_spec("add_rms_norm_bwd", "w"),
        _norm_spec("layer_norm_bwd", "wb"),
        OpSpec(
            op="flash_attention",
            family="attention",
            make_tunable=lambda lnc=1: AttentionOp(lnc).tunable(),
            make_problem=attention_problem("causal"),
            shapes=("llama3-8b", "llama3-70b", "mixtral-8x7b"),
            bucket_dim="seq",
            standard_buckets=(2048, 8192, 32768),
        ),
        OpSpec(
            op="moe_mlp",
            family="moe",
            make_tunable=lambda lnc=1: _MoEOp(lnc).tunable(),
            make_problem=_moe_problem,
            shapes=("mixtral-8x7b", "fine-grained-64e"),
            bucket_dim="tokens",
            standard_buckets=(512, 4096, 16384),
        ),
    )
}


from .decode_family import register as _register_decode  # noqa: E402 (uses OpSpec)

_register_decode(OPS)


def get(op: str) -> OpSpec:
    """The `OpSpec` of `op`."""
    if op not in OPS:
        raise ValueError(f"op: expected one of {sorted(OPS)}; got {op!r}")
    return OPS[op]
