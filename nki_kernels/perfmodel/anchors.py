"""Published Trainium measurements (`anchors.json`) and how the cost model prices each one.

Each anchor names its source (repository, commit, path), target, kernel, shape, dtype,
compiler flags and what was measured (`quantity`):

- `latency`: one kernel launch, priced as the schedule's latency;
- `dma_engine_transfer`: one DMA engine's transfer time as the profiler shows it, priced
  as that engine's share of the kernel's first DMA (`costs.dma_plan`);
- `instruction_interval`: the initiation interval of a chain of dependent instructions,
  priced as (start of the last - start of the first) / (count - 1) on their engine.

Kernels are priced as they were measured. `aws-kernel` anchors run AWS's own source file
unmodified through the interpreter (trace-only, imported by `conformance.loader`); the
file is found in a local checkout of its repository (`NKI_KERNELS_EXT_DIR`, default
/work/ext, one directory per repository named `owner+name`), and an
anchor whose checkout is absent, or that the interpreter cannot yet run, is reported as
unavailable with the reason -- never replaced by a kernel of ours. `faithful-
reimplementation` anchors are the documents' own code blocks (or, where the document
shows only a profile, the instruction pattern it describes), written in `_doc_kernels`.

`AnchorSet.price(target)` re-prices every available anchor on a parameter set from the
cached traces, which is what the fitter (`perfmodel.fit`) calls.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..interp import TensorSpec
from ..interp import nisa as _nisa
from ..interp import nki as _nki
from ..interp import nl as _nl
from ..interp.launch import settings
from ..interp.trace import Trace
from ..targets import Target, get_target
from .api import trace_kernel
from .costs import dma_plan
from .timeline import _chip_region, schedule

ANCHORS_FILE = Path(__file__).with_name("anchors.json")
EXT_DIR_ENV = "NKI_KERNELS_EXT_DIR"
DEFAULT_EXT_DIR = "/work/ext"


@dataclass(frozen=True)
class Anchor:
    """One published measurement (a row of anchors.json)."""

    id: str
    target: str
    kernel: str
    quantity: str
    measured_ns: float
    priced_by: str
    source: dict[str, str]
    shape: dict[str, Any]
    dtype: str
    compiler_flags: str
    kernel_source: dict[str, str] | None = None
    note: str = ""
    fit: bool = True  # False: priced and shown, but not used by the fit (see the reason)
    # held out of the fit on purpose: its error is out-of-sample and joins the
    # cross-validated error (the bands' structural term) with the leave-one-out errors
    held_out: bool = False
    not_fitted_because: str = ""

    @property
    def citation(self) -> str:
        """'owner/repo @ commit8 path'."""
        s = self.source
        return f"{s['repo']} @ {s['commit'][:8]} {s['path']}"


def load_anchors(path: str | os.PathLike[str] = ANCHORS_FILE) -> list[Anchor]:
    """Every anchor of the file, in file order."""
    data = json.loads(Path(path).read_text())
    fields = set(Anchor.__dataclass_fields__)
    return [Anchor(**{k: v for k, v in row.items() if k in fields}) for row in data["anchors"]]


def ext_dir() -> Path:
    """Where public checkouts live (`NKI_KERNELS_EXT_DIR`, default /work/ext)."""
    return Path(os.environ.get(EXT_DIR_ENV) or DEFAULT_EXT_DIR)


def load_public(repo: str, path: str, function: str) -> Any:
    """`function` of file `path` of the checkout of `repo`, imported unmodified by the
    conformance loader (its `nki` imports resolve to the interpreter).

    Raises FileNotFoundError naming the expected location when the checkout is absent.
    """
    from ..conformance.loader import NKILIB_SRC, SDK_EXAMPLES, load_kernel

    root = ext_dir() / repo.replace("/", "+")
    file = root / path
    if not file.is_file():
        raise FileNotFoundError(f"{repo} checkout: expected {file} ({EXT_DIR_ENV})")
    rel = Path(path).with_suffix("")
    for base in (NKILIB_SRC, SDK_EXAMPLES):
        if rel.is_relative_to(base):
            rel = rel.relative_to(base)
    return load_kernel(root, ".".join(rel.parts), function)


def load_public_file(repo: str, path: str, function: str) -> Any:
    """`function` of one self-contained kernel file `path` of the checkout of `repo`
    (no package around it, e.g. nki-autotune's kernel_library), imported unmodified with
    `nki` mapped to the interpreter."""
    import importlib.util
    import sys

    from ..conformance.loader import mapped_nki

    file = ext_dir() / repo.replace("/", "+") / path
    if not file.is_file():
        raise FileNotFoundError(f"{repo} checkout: expected {file} ({EXT_DIR_ENV})")
    name = "anchor_" + "".join(c if c.isalnum() else "_" for c in path)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with mapped_nki():
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        finally:
            del sys.modules[name]
    return getattr(module, function)


# ---- the documents' kernels (faithful re-implementations) -----------------------------------
@_nki.jit
def _dma_overview_exp(in_tensor: Any) -> Any:
    """The DMA overview's `tensor_exp_kernel_isa`: load, exp on ScalarE, store."""
    out_tensor = _nl.ndarray(in_tensor.shape, dtype=_nl.bfloat16, buffer=_nl.shared_hbm)
    sbuf_tensor = _nl.ndarray(in_tensor.shape, dtype=_nl.bfloat16, buffer=_nl.sbuf)
    out_tile = _nl.ndarray(in_tensor.shape, dtype=_nl.bfloat16, buffer=_nl.sbuf)
    _nisa.dma_copy(dst=sbuf_tensor, src=in_tensor)
    _nisa.activation(dst=out_tile, op=_nl.exp, data=sbuf_tensor)
    _nisa.dma_copy(dst=out_tensor, src=out_tile)
    return out_tensor


@_nki.jit
def _dependent_activations(x: Any, chain: int) -> Any:
    """`chain` IDENTITY activations with scale and bias on one [128, 1] fp32 tile, each
    reading what the previous one wrote (the perf guide's Opt #5a profile)."""
    out = _nl.ndarray(x.shape, dtype=x.dtype, buffer=_nl.shared_hbm)
    t = _nl.ndarray(x.shape, dtype=x.dtype, buffer=_nl.sbuf)
    _nisa.dma_copy(dst=t, src=x)
    for _ in range(chain):
        _nisa.activation(dst=t, op=_nl.copy, data=t, scale=1.5, bias=None)
    _nisa.dma_copy(dst=out, src=t)
    return out


def _trace_anchor(a: Anchor) -> Trace:
    tgt = get_target(a.target)
    ks = a.kernel_source or {}
    if a.id.startswith("matmul_tutorial."):
        kernel = load_public(ks["repo"], ks["path"], ks["function"])
        lhsT = TensorSpec(tuple(a.shape["lhsT"]), a.dtype)
        rhs = TensorSpec(tuple(a.shape["rhs"]), a.dtype)
        # The tutorial's fully blocked kernel compiles and runs on trn1; the interpreter's
        # first-fit allocator fragments its 16 KiB + 264 B compiler reserve (L on trn1)
        # so that the last 32 KiB block does not fit. Trace it without the reserve.
        return trace_kernel(kernel, lhsT, rhs, target=tgt.replace(sbuf_reserved_bytes=0))
    if a.id.startswith("fused_mamba."):
        kernel = load_public(ks["repo"], ks["path"], ks["function"])
        b, c, s, n = (a.shape[k] for k in ("batch", "channels", "seq_len", "state_size"))
        specs = (
            TensorSpec((b, c, s), a.dtype),
            TensorSpec((b, c, s), a.dtype),
            TensorSpec((c, n), a.dtype),
            TensorSpec((b, n, s), a.dtype),
            TensorSpec((b, n, s), a.dtype),
        )
        # As for the fully blocked matmul: v3 at S = 8192 ran on the chip, but the
        # interpreter's first-fit allocator fragments SBUF; trace without the reserve.
        return trace_kernel(kernel, *specs, target=tgt.replace(sbuf_reserved_bytes=0))
    if a.id.startswith("nki_autotune.attention_cte"):
        from ..conformance.loader import jit

        kernel = jit(load_public(ks["repo"], ks["path"], ks["function"]))
        b, s, d = a.shape["batch"], a.shape["seq"], a.shape["head_dim"]
        # nki-library's layout with tp_q=True: q [b, s, d], k [b, d, s], v [b, s, d];
        # one physical core (the MFU is quoted against one core's 78.64 TFLOP/s)
        q = TensorSpec((b, s, d), a.dtype)
        k = TensorSpec((b, d, s), a.dtype)
        v = TensorSpec((b, s, d), a.dtype)
        return trace_kernel(kernel, q, k, v, target=tgt, scale=float(d) ** -0.5, causal_mask=True)
    if a.id.startswith(("nki_autotune.matmul", "nki_autotune.double_matmul")):
        from ..conformance.loader import jit

        kernel = jit(load_public_file(ks["repo"], ks["path"], ks["function"]))
        if "inputs" in a.shape:
            shapes = [tuple(x) for x in a.shape["inputs"]]
        else:
            m, k, n = a.shape["M"], a.shape["K"], a.shape["N"]
            # lhsT_rhs takes lhs_T [K, M]; lhs_rhs takes lhs [M, K] (it DMA-transposes it)
            shapes = [(k, m) if a.shape.get("lhs_transposed") else (m, k), (k, n)]
        # the compiler drops allocations no instruction touches (the lhs_rhs kernel
        # allocates 4 x 4 rotating groups and uses 2 x 2), as for AWS's kernels
        with settings(free_unused_tiles=True):
            return trace_kernel(kernel, *(TensorSpec(x, a.dtype) for x in shapes), target=tgt)
    if a.id.startswith("dma_overview."):
        spec = TensorSpec(tuple(a.shape["in_tensor"]), a.dtype)
        return trace_kernel(_dma_overview_exp, spec, target=tgt)
    if a.id == "perf_guide.dependent_activations":
        spec = TensorSpec(tuple(a.shape["tile"]), a.dtype)
        return trace_kernel(_dependent_activations, spec, a.shape["chain"], target=tgt)
    raise NotImplementedError(f"{a.id}: no pricer for this anchor yet ({a.kernel})")


def _first_dma_engine_ns(trace: Trace, target: Target) -> float:
    ins = next(i for i in trace.instrs if i.engine == "dma")
    return dma_plan(ins, _chip_region(ins), target).per_engine_ns


def _chain_interval_ns(trace: Trace, target: Target) -> float:
    sched = schedule(trace, target)
    idx = [i for i, ins in enumerate(trace.instrs) if ins.engine == "scalar"]
    return (sched.start[idx[-1]] - sched.start[idx[0]]) / (len(idx) - 1)


QUANTITIES: dict[str, Callable[[Trace, Target], float]] = {
    "latency": lambda trace, target: schedule(trace, target).latency_ns,
    # priced with the compiler's instruction scheduling off (nki-autotune's flag)
    "latency_scheduling_off": lambda trace, target: (
        schedule(trace, target, scheduling=False).latency_ns
    ),
    "dma_engine_transfer": _first_dma_engine_ns,
    "instruction_interval": _chain_interval_ns,
}


@dataclass
class AnchorSet:
    """The anchors of one target with their traces (built once), ready to re-price."""

    target: str
    anchors: list[Anchor]
    traces: dict[str, Trace] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)

    @classmethod
    def build(cls, target: str, anchors: list[Anchor] | None = None) -> AnchorSet:
        """Trace every anchor of `target`; those that cannot be run go to `unavailable`."""
        rows = [a for a in (anchors or load_anchors()) if a.target == target]
        out = cls(target, [])
        for a in rows:
            try:
                out.traces[a.id] = _trace_anchor(a)
                out.anchors.append(a)
            except Exception as exc:  # the reason is reported, the anchor is not priced
                out.unavailable[a.id] = f"{type(exc).__name__}: {str(exc)[:160]}"
        return out

    def price(self, target: Target, ids: list[str] | None = None) -> dict[str, float]:
        """Modeled value (ns) of each available anchor (or of `ids`) on `target`."""
        out = {}
        for a in self.anchors:
            if ids is None or a.id in ids:
                q = a.quantity
                if q == "latency" and "instruction-scheduling=false" in a.compiler_flags:
                    q = "latency_scheduling_off"
                out[a.id] = QUANTITIES[q](self.traces[a.id], target)
        return out

    @property
    def fitted_ids(self) -> list[str]:
        """The available anchors the fit uses (`fit` true)."""
        return [a.id for a in self.anchors if a.fit]

    def log_errors(self, target: Target, ids: list[str] | None = None) -> dict[str, float]:
        """log(modeled / measured) per fitted anchor (or per `ids`): the fit's residuals."""
        meas = {a.id: a.measured_ns for a in self.anchors}
        prices = self.price(target, ids if ids is not None else self.fitted_ids)
        return {k: math.log(v / meas[k]) for k, v in prices.items()}
