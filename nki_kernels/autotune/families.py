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

from ..kernel_config import KernelConfig
from ..targets import Target
from .tunable import Tunable

EPS = 1e-6


@dataclass(frozen=True)
class OpSpec:
    """One tunable op: its problem builder, `Tunable` factory and standard shapes."""

    op: str
    family: str
    make_tunable: Callable[[], Tunable]
    make_problem: Callable[[str, int, str], Any]  # (model shape name, bucket, dtype)
    shapes: tuple[str, ...]  # model shape names (model_shapes) the op is tuned for
    bucket_dim: str  # what the bucket counts: "rows" | "tokens" | "seq"
    standard_buckets: tuple[int, ...]
    dtypes: tuple[str, ...] = ("bfloat16",)


# --------------------------------------------------------------------------- norms
def _np_dtype(name: str) -> Any:
    from ..interp import dtypes

    return dtypes.as_dtype(name)


def _torch(a: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(np.asarray(a, dtype=np.float32))


def _np(t: Any) -> np.ndarray:
    return t.detach().to("cpu").float().numpy()


def _norm_reduced(problem: Any, config: KernelConfig, target: Target) -> Any:
    kk = int(getattr(config, "rows_per_partition", 1))
    rows = min(problem.rows, 2 * 128 * kk + 128 + 37)
    chunk = int(getattr(config, "chunk", problem.hidden))
    hidden = problem.hidden
    if chunk < hidden and hidden > 2 * chunk:
        hidden = 2 * chunk + hidden % chunk
    return replace(problem, rows=rows, hidden=hidden)


def _norm_tol(problem: Any, n_row_outputs: int, n_sum_outputs: int) -> list[tuple[float, float]]:
    import torch

    from ..testing.tolerances import tolerance

    dt = getattr(torch, problem.dtype)
    # per-row outputs and statistics (mean, rstd: fp32, but computed from data of the op's
    # dtype, so schedules may legitimately differ at that dtype's precision)
    row = tolerance(dt, reduction=problem.hidden)
    # weight / bias gradients sum over rows: magnitude ~ sqrt(rows) for unit-scale data
    col = tolerance(dt, reduction=problem.rows, scale=math.sqrt(problem.rows))
    tols = [(row.atol, row.rtol)] * n_row_outputs + [(col.atol, col.rtol)] * n_sum_outputs
    return tols + [(row.atol, row.rtol)] * 2


class _NormOp:
    """Launch arguments, numeric inputs and reference of one norm op."""

    def __init__(self, op: str) -> None:
        from ..norm import config as ncfg

        self.op = op
        self.config_cls = ncfg.CONFIGS[op]

    def kernel(self) -> Any:
        from ..norm import layernorm, layernorm_bwd, rmsnorm, rmsnorm_bwd

        return {
            "rms_norm": rmsnorm.rms_norm_fwd,
            "add_rms_norm": rmsnorm.add_rms_norm_fwd,
            "rms_norm_bwd": rmsnorm_bwd.rms_norm_bwd,
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
        return (dy, x, w, p.has_bias, t("mean", (n,), "float32"), t("rstd", (n,), "float32"))

    def trace(self, p: Any, config: KernelConfig, target: Target) -> Any:
        from ..interp import run

        kw = config.to_dict()
        return run(self.kernel(), *self.args(p, None), target=target, trace_only=True, **kw).trace

    def numeric(
        self, p: Any, config: KernelConfig, target: Target, seed: int
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        from ..interp import run
        from ..norm import reference as ref

        rng = np.random.default_rng(seed)
        dt = _np_dtype(p.dtype)
        n, h = p.rows, p.hidden

        def rnd(*shape: int, loc: float = 0.0, scale: float = 1.0) -> np.ndarray:
            return (loc + scale * rng.standard_normal(shape)).astype(dt)

        a = {"x": rnd(n, h, loc=0.3), "w": rnd(h, loc=1.0, scale=0.1), "b": rnd(h, scale=0.1)}
        a["res"], a["dy"] = rnd(n, h), rnd(n, h)
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
        elif self.op == "rms_norm_bwd":
            a["rstd"] = _np(ref.rms_norm_ref(x, None, EPS)[1])
            expect = ref.rms_norm_bwd_ref(_torch(a["dy"]), x, w, EPS)
        else:
            _, mean, rstd = ref.layer_norm_ref(x, None, None, EPS)
            a["mean"], a["rstd"] = _np(mean), _np(rstd)
            expect = ref.layer_norm_bwd_ref(_torch(a["dy"]), x, w, b, EPS)
        kw = config.to_dict()
        out = run(self.kernel(), *self.args(p, a), target=target, **kw).outputs
        outs = list(out) if isinstance(out, tuple) else [out]
        refs = [_np(e) for e in expect if e is not None]
        outs = [o for o in outs if o is not None]
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
            describe=lambda p: f"rows={p.rows} hidden={p.hidden} {p.dtype} affine={p.affine}",
        )


def _norm_problem(affine: str) -> Callable[[str, int, str], Any]:
    def make(shape: str, bucket: int, dtype: str) -> Any:
        from ..model_shapes import NORM_SHAPES
        from ..norm.config import NormProblem
        from ..runtime.buckets import bucket as to_bucket

        hidden = _by_model(NORM_SHAPES, shape).hidden
        return NormProblem(rows=to_bucket(bucket), hidden=hidden, dtype=dtype, affine=affine)

    return make


def _by_model(table: Any, name: str) -> Any:
    for s in table:
        if s.model == name:
            return s
    raise ValueError(f"shape: expected one of {[s.model for s in table]}; got {name!r}")


def _norm_spec(op: str, affine: str) -> OpSpec:
    return OpSpec(
        op=op,
        family="norm",
        make_tunable=lambda: _NormOp(op).tunable(),
        make_problem=_norm_problem(affine),
        shapes=("llama3-8b", "llama3-70b"),
        bucket_dim="rows",
        standard_buckets=(2048, 8192, 32768),
    )


OPS: dict[str, OpSpec] = {
    s.op: s
    for s in (
        _norm_spec("rms_norm", "w"),
        _norm_spec("add_rms_norm", "w"),
        _norm_spec("layer_norm", "wb"),
        _norm_spec("rms_norm_bwd", "w"),
        _norm_spec("layer_norm_bwd", "wb"),
    )
}


def get(op: str) -> OpSpec:
    """The `OpSpec` of `op`."""
    if op not in OPS:
        raise ValueError(f"op: expected one of {sorted(OPS)}; got {op!r}")
    return OPS[op]
