"""The comparison behind `make bench`: our kernels against what a Trainium user really has.

For each case three implementations are priced by the same cost model on the same target:

- `nki`: this library's kernels, as the op launches them;
- `aws`: AWS's own nki-library kernel for the op, run unmodified through the interpreter
  (`peer.py`; rows committed as data, since the checkout is not part of the project);
- `native`: TorchNeuron's path for the plain PyTorch code (`baselines.native`): for SDPA
  that is AWS's flash kernel wherever TorchNeuron routes it there (every attention case
  here), so the native attention row is the `aws` row under another name; norms one
  fused pass; dropless MoE the faster of NxD's blockwise composition and
  `aten::_grouped_mm`. `native_cf` rows (GShard capacity factor 1.25) may drop tokens
  and are shown apart, never as the baseline.

LNC. trn2's default is LNC = 2 (two physical cores per logical core; "With LNC=2
(default)", about-neuron/arch/neuron-features/logical-neuroncore-config.rst); trn3's
default is not stated in the docs read (aws-neuron-sdk @ 81ce03ae); its tutorials run
LNC = 2 and the NKI FAQ allows "up to two physical NeuronCores" on Trn2 or Trn3, so LNC
= 2 is assumed for trn3 too. Rows with `lnc` = 1 are per physical core; rows with `lnc`
= 2 are per logical core (`LNC2_METHOD`): our kernels and AWS's are launched as
kernel[2] and both programs are traced by the interpreter and each scheduled on its own
physical core (the latency is the later core's), so each kernel's own LNC split (rows,
kv heads, hidden columns) and its imbalance are priced; TorchNeuron's native
compositions (not kernels) are priced as two cores each running half of the work.
Nothing here is a measurement.
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..baselines import moe_native, native
from ..model_shapes import FINE_GRAINED_MOE, LLAMA3_8B_ATTN, MIXTRAL_8X7B_MOE, MoEShape
from ..perfmodel import modeled_label
from ..targets import Target, get_target
from .rows import BenchRow

LNC2_METHOD = (
    "LNC 2 = one logical core of two physical cores: our kernels and AWS's launched as "
    "kernel[2], both programs traced and each scheduled on its own core (the kernel's "
    "own split); TorchNeuron's native compositions as half of the work per core; no "
    "shared-HBM contention between the cores modeled"
)
DEFAULT_LNC = {"trn2": 2, "trn3": 2}  # trn3: assumed, see the module docstring


@dataclass(frozen=True)
class Case:
    """One op at one shape and target, priced at one LNC."""

    family: str
    op: str  # e.g. "rms_norm fwd", "flash_attention bwd causal", "moe_mlp fwd skewed"
    case: str  # shape text
    target: str | Target  # a name, or a parameter set of one (bands)
    lnc: int


def _native_row(
    c: Case,
    path: str,
    step_list: list[native.Step],
    useful_flops: float,
    hbm_min_bytes: float,
    impl: str = "native",
) -> BenchRow:
    tgt = get_target(c.target)
    est = native.price(step_list, tgt)
    return BenchRow(
        family=c.family,
        op=c.op,
        case=c.case,
        target=tgt.name,
        impl=impl,
        latency_us=est.latency_ns / 1e3,
        provenance=est.label,
        mfu=useful_flops / (est.latency_ns * tgt.tensor_peak_flops_per_ns)
        if useful_flops
        else None,
        hbm_fraction=(hbm_min_bytes / tgt.hbm_bytes_per_ns / est.latency_ns)
        if hbm_min_bytes
        else None,
        bound_by=_busiest_step(est),
        lnc=c.lnc,
        extra={"path": path, "steps": [[name, ns / 1e3] for name, ns in est.steps]},
    )


def _busiest_step(est: native.NativeEstimate) -> str:
    name, _ = max(est.steps, key=lambda s: s[1])
    return f"step: {name}"


@functools.cache
def _configs_commit() -> dict[str, str]:
    """{"configs_commit": the checkout's short commit} when the package runs from a git
    checkout with no uncommitted change to its shipped configs, else {} (the README's note
    on which configs priced the rows reads it)."""
    root = Path(__file__).resolve().parents[2]
    try:
        run = functools.partial(subprocess.run, cwd=root, capture_output=True, text=True)
        head = run(["git", "rev-parse", "--short", "HEAD"], check=True).stdout.strip()
        dirty = run(["git", "status", "--porcelain", "--", "nki_kernels/configs"], check=True)
    except (OSError, subprocess.CalledProcessError):
        return {}
    return {} if dirty.stdout.strip() or not head else {"configs_commit": head}


def _half(n: int, lnc: int) -> int:
    return -(-n // lnc)


# ---- norms ------------------------------------------------------------------------------
_NORM_NATIVE: dict[tuple[str, str], Callable[[int, int, str], list[native.Step]]] = {
    ("rms_norm", "fwd"): native.rms_norm_fwd,
    ("rms_norm", "bwd"): native.rms_norm_bwd,
    ("add_rms_norm", "fwd"): native.add_rms_norm_fwd,
    ("layer_norm", "fwd"): native.layer_norm_fwd,
    ("layer_norm", "bwd"): native.layer_norm_bwd,
}
_NORM_PATH = {
    "fwd": "one fused pass",
    "bwd": "two fused passes",
}
# HBM tensors of [N, H] each op must read or write at least once (inputs + outputs)
_NORM_MIN_TENSORS = {
    ("rms_norm", "fwd"): 2,
    ("rms_norm", "bwd"): 3,
    ("add_rms_norm", "fwd"): 4,
    ("layer_norm", "fwd"): 2,
    ("layer_norm", "bwd"): 3,
}


def norm_rows(
    tokens: Iterable[int], hiddens: Iterable[int], targets: Iterable[str], lncs: Iterable[int]
) -> list[BenchRow]:
    """Fused norms (ours) vs TorchNeuron's fused pass (native), bf16.

    Our backward is the backward kernel, plus the statistics kernel when the backward's
    config does not compute them itself. The native backward reuses the forward's saved
    statistics (no recompute), which favours native.
    """
    from ..norm import bench as nb

    rows = []
    for target in targets:
        for lnc in lncs:
            for h in hiddens:
                for n in tokens:
                    part_rows = _half(n, lnc)
                    for (op, kind), build in _NORM_NATIVE.items():
                        c = Case("norm", f"{op} {kind}", f"[{n}, {h}] bf16", target, lnc)
                        parts = nb.op_parts(op, kind, n, h, target, lnc)
                        latency = sum(p.latency_us for p in parts)
                        min_bytes = _NORM_MIN_TENSORS[(op, kind)] * part_rows * h * 2.0
                        rows.append(
                            BenchRow(
                                family="norm",
                                op=c.op,
                                case=c.case,
                                target=parts[0].target,
                                impl="nki",
                                latency_us=latency,
                                provenance=parts[0].label,
                                hbm_fraction=parts[0].bound_us / latency / lnc,
                                bound_by=parts[0].busiest,
                                lnc=lnc,
                                extra={
                                    "kernels": [[p.kernel, p.latency_us] for p in parts],
                                    "config": parts[0].config,
                                    **_configs_commit(),
                                },
                            )
                        )
                        rows.append(
                            _native_row(
                                c,
                                _NORM_PATH[kind],
                                build(part_rows, h, "bfloat16"),
                                0.0,
                                min_bytes,
                            )
                        )
    return rows


# ---- attention -----------------------------------------------------------------------
def attention_rows(
    seqs: Iterable[int],
    targets: Iterable[str],
    lncs: Iterable[int],
    backward: bool = True,
    decomposition: bool = False,
    ops: Iterable[str] = ("fwd", "bwd"),
    causals: Iterable[bool] = (False, True),
) -> list[BenchRow]:
    """Our flash attention (Llama-3 8B heads, B = 1, bf16). The native row of each case is
    AWS's flash kernel (TorchNeuron's SDPA route, `native.sdpa_route`), added from the
    peer data by `merge_peer`; `ops` / `causals` choose a part of the cases (re-pricing
    in pieces); `decomposition` also prices the S x S composition that
    SDPA falls back to off that route (as `native_decomposition` rows, informational)."""
    from ..attention import bench as attn
    from ..model_shapes import AttentionShape

    full = LLAMA3_8B_ATTN
    ops, causals = tuple(ops), tuple(causals)
    rows = []
    for target in targets:
        for seq in seqs:
            for causal in causals:
                for op in [o for o in ops if backward or o == "fwd"]:
                    name = f"flash_attention {op}" + (" causal" if causal else "")
                    case = (
                        f"B=1 H={full.num_heads}/{full.num_kv_heads} S={seq} D={full.head_dim} bf16"
                    )
                    for lnc in lncs:
                        # per launch one kv-head group per program (kernel[lnc]), times the
                        # remaining groups, for every S: the method of the AWS rows (an
                        # upper bound for ours: the full trace overlaps one group's tail
                        # with the next group's staging)
                        r = attn.price(op, seq, target, causal, shape=full, force="pair", lnc=lnc)
                        shape = AttentionShape(
                            full.model,
                            num_heads=full.num_heads // lnc,
                            num_kv_heads=full.num_kv_heads // lnc,
                            head_dim=full.head_dim,
                        )
                        flops = attn.useful_flops(
                            op, seq, seq, full.head_dim, shape.num_heads, 1, causal
                        )
                        tgt = get_target(target)
                        rows.append(
                            BenchRow(
                                family="attention",
                                op=name,
                                case=case,
                                target=r.target,
                                impl="nki",
                                latency_us=r.latency_us,
                                provenance=r.label,
                                mfu=flops / (r.latency_us * 1e3 * tgt.tensor_peak_flops_per_ns),
                                bound_by=r.busiest,
                                lnc=lnc,
                                extra={"pricing": r.pricing, "config": r.config},
                            )
                        )
                        if decomposition:
                            build = native.attention_fwd if op == "fwd" else native.attention_bwd
                            steps = build(1, shape.num_heads, seq, seq, full.head_dim, "bfloat16")
                            rows.append(
                                _native_row(
                                    Case("attention", name, case, target, lnc),
                                    "SDPA off the flash route: S = QK^T, softmax, PV steps",
                                    steps,
                                    flops,
                                    0.0,
                                    impl="native_decomposition",
                                )
                            )
    return rows


# ---- MoE --------------------------------------------------------------------------------
def moe_case_text(shape: MoEShape, tokens: int) -> str:
    return (
        f"{shape.model} T={tokens} H={shape.hidden} I={shape.intermediate} "
        f"E={shape.num_experts} top-{shape.top_k} bf16"
    )


def expert_counts(routing: str, tokens: int, experts: int, top_k: int) -> list[int]:
    """Routed rows per expert under the benchmark's routing (`moe.pricing.routing_ids`)."""
    from ..moe.pricing import routing_ids

    ids = routing_ids(routing, tokens, experts, top_k)
    return [int(c) for c in np.bincount(ids.ravel(), minlength=experts)]


def moe_rows(
    shapes: Iterable[MoEShape],
    tokens: Iterable[int],
    targets: Iterable[str],
    routings: Iterable[str],
    lncs: Iterable[int],
) -> list[BenchRow]:
    """Our blockwise MoE forward vs the dropless compositions AWS's stack runs (NxD
    blockwise, `_grouped_mm`) and, apart, the capacity-factor one that may drop tokens."""
    from ..moe.pricing import layer_row

    rows = []
    for target in targets:
        for shape in shapes:
            for t in tokens:
                for routing in routings:
                    for lnc in lncs:
                        part = _half(t, lnc)
                        rows += _moe_case(shape, t, part, routing, target, lnc, layer_row)
    return rows


def _moe_case(
    shape: MoEShape, t: int, part: int, routing: str, target: str, lnc: int, layer_row: Any
) -> list[BenchRow]:
    h, i, e, k = shape.hidden, shape.intermediate, shape.num_experts, shape.top_k
    c = Case("moe", f"moe_mlp fwd {routing}", moe_case_text(shape, t), target, lnc)
    r = layer_row(shape, t, routing, target, lnc=lnc)  # kernel[lnc] on the whole batch
    flops = 2.0 * part * k * 3 * h * i  # per physical core (the MFU's denominator)
    out = [
        BenchRow(
            family="moe",
            op=c.op,
            case=c.case,
            target=r["target"],
            impl="nki",
            latency_us=r["latency_ms"] * 1e3,
            provenance=r["label"],
            mfu=r["mfu_routed_pct"] / 100.0 / lnc,
            bound_by=r["busiest_engine"],
            lnc=lnc,
            extra={"blocks": r["blocks"], "config": r["config"]},
        )
    ]
    counts = expert_counts(routing, part, e, k)
    nb = moe_native.blockwise_blocks(part, e, k)
    candidates = [
        _native_row(
            c,
            f"NxD blockwise ({nb} blocks of {moe_native.NXD_BLOCK})",
            moe_native.blockwise_fwd(part, h, i, e, k, "bfloat16"),
            flops,
            0.0,
        ),
        _native_row(
            c,
            "aten::_grouped_mm (128-row groups)",
            moe_native.grouped_mm_fwd(part, h, i, e, "bfloat16", counts),
            flops,
            0.0,
        ),
    ]
    best = min(candidates, key=lambda row: row.latency_us)
    for row in candidates:
        row.extra["baseline"] = row is best
    out += candidates
    cap = moe_native.moe_capacity(part, e, k, 1.25)
    dropped = sum(max(0, n - cap) for n in counts)
    cf = _native_row(
        c,
        f"capacity factor 1.25 (C = {cap} rows per expert): drops {dropped} of "
        f"{part * k} routed rows",
        moe_native.capacity_factor_fwd(part, h, i, e, k, "bfloat16", 1.25),
        flops,
        0.0,
        impl="native_cf",
    )
    return [*out, cf]


@dataclass(frozen=True)
class Suite:
    """One family's part of the comparison: a name and a function producing its rows
    (arguments: the whole matrix or the quick set; with bands or not)."""

    name: str
    rows: Callable[[bool, bool], list[BenchRow]]


TARGETS = ("trn2", "trn3")
LNCS = (1, 2)


def _per_target(
    price: Callable[[Any], list[BenchRow]], targets: Iterable[str], bands: bool
) -> list[BenchRow]:
    from .bands import with_bands

    out: list[BenchRow] = []
    for t in targets:
        out += with_bands(price, t) if bands else price(t)
    return out


def _attention_suite(full: bool, bands: bool = False) -> list[BenchRow]:
    seqs = (2048, 8192, 32768) if full else (2048,)
    targets = TARGETS if full else ("trn2",)
    return _per_target(lambda t: attention_rows(seqs, [t], LNCS), targets, bands)


def _moe_suite(full: bool, bands: bool = False) -> list[BenchRow]:
    targets = TARGETS if full else ("trn2",)
    shapes = (MIXTRAL_8X7B_MOE, FINE_GRAINED_MOE)
    # the quick set (make bench's live check) prices MoE at LNC 1 only: the LNC 2 rows
    # trace both programs of the whole batch, minutes per shape
    lncs = LNCS if full else (1,)
    return _per_target(
        lambda t: moe_rows(shapes, (4096,), [t], ("uniform", "skewed"), lncs), targets, bands
    )


def _norm_suite(full: bool, bands: bool = False) -> list[BenchRow]:
    hiddens = (4096, 8192) if full else (4096,)
    targets = TARGETS if full else ("trn2",)
    return _per_target(lambda t: norm_rows((16384,), hiddens, [t], LNCS), targets, bands)


SUITES: dict[str, Suite] = {
    "norm": Suite("norm", _norm_suite),
    "attention": Suite("attention", _attention_suite),
    "moe": Suite("moe", _moe_suite),
}


def label_note(target: str) -> str:
    return f"All figures {modeled_label(target)}; none is a hardware measurement."


__all__ = [
    "DEFAULT_LNC",
    "LNC2_METHOD",
    "SUITES",
    "Suite",
    "attention_rows",
    "label_note",
    "moe_rows",
    "norm_rows",
]


SDPA_NATIVE_PATH = "SDPA -> AWS flash kernel"


def merge_peer(rows: list[BenchRow], peer: list[BenchRow]) -> list[BenchRow]:
    """Our rows + the peer rows of the same cases, and for attention cases on TorchNeuron's
    flash route a `native` row that is the AWS row (SDPA calls that kernel)."""
    keys = {(r.family, r.op, r.case, r.target, r.lnc) for r in rows}
    out = list(rows)
    d = LLAMA3_8B_ATTN.head_dim
    for p in peer:
        if (p.family, p.op, p.case, p.target, p.lnc) not in keys:
            continue
        out.append(p)
        if p.family == "attention":
            seq = int(p.case.split("S=")[1].split()[0])
            if native.sdpa_route(seq, seq, d) == "aws_flash":
                kernels = " / ".join(p.extra.get("kernels", []))
                out.append(
                    replace(
                        p,
                        impl="native",
                        extra={**p.extra, "path": f"{SDPA_NATIVE_PATH}: {kernels}"},
                    )
                )
    return out
