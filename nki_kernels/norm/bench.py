"""Modeled performance of the fused-norm kernels (used by benchmarks/bench_norm.py and
`nki-kernels bench`).

`price(op, kernel, tokens, hidden, target)` prices one norm kernel (forward, backward, or
the statistics kernel the ops' backward uses to recompute rstd / mean) with the cost model,
with the config the op would use (config store, else the heuristic default); `op_parts`
lists the kernels one op call launches (the backward: the backward kernel, and the
statistics kernel only when the backward's config does not compute them itself).

"% of bound" = the HBM-bandwidth bound / the modeled latency, where the bound is the
time to move the kernel's essential bytes (each input read once, each output written
once: e.g. rms_norm fwd reads x and w and writes y and rstd) at the target's HBM
bandwidth. Every latency is "modeled (cost model vN, target)", never a measurement.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from ..interp import TensorSpec
from ..perfmodel import COST_MODEL_VERSION, estimate_trace, modeled_label, trace_kernel
from ..perfmodel.band import band, format_band
from ..runtime import lookup_config
from ..targets import get_target
from . import config as C
from .layernorm import layer_norm_fwd, layer_norm_stats
from .layernorm_bwd import layer_norm_bwd
from .rmsnorm import add_rms_norm_fwd, rms_norm_fwd, rms_norm_stats
from .rmsnorm_bwd import rms_norm_bwd

HIDDENS = (4096, 8192)
TOKENS = (2048, 4096, 8192, 16384, 32768)
QUICK_TOKENS = (4096, 16384)
GOAL = ("rms_norm", "fwd", 16384, 4096, 0.85)  # issue 4: >= 85 % of the HBM bound
DTYPE, ITEM = "bfloat16", 2


@dataclass(frozen=True)
class Row:
    """One kernel at one shape: modeled latency and its share of the HBM-bandwidth bound."""

    op: str
    kernel: str  # fwd | bwd | stats
    tokens: int
    hidden: int
    target: str
    latency_us: float
    bound_us: float
    hbm_fraction: float  # bound / latency
    mbu: float  # the cost model's HBM utilization (all traffic, incl. re-reads)
    busiest: str
    config: str
    label: str
    # the latency's band over the cost model's parameter sets (perfmodel.band); None
    # when priced without bands
    latency_lo_us: float | None = None
    latency_hi_us: float | None = None


STATS = TensorSpec((1,), "float32")  # stands for a per-row statistic argument in _specs


def _specs(op: str, kernel: str, n: int, h: int) -> tuple[Any, tuple[Any, ...], int, str]:
    """(kernel fn, args, essential HBM bytes, config op name); the backward's statistics
    arguments are `STATS` (`price` replaces them by [N] vectors or None)."""
    x, w = TensorSpec((n, h), DTYPE), TensorSpec((h,), DTYPE)
    f = STATS
    rows, vec, stat = n * h * ITEM, h * ITEM, n * 4
    table = {
        ("rms_norm", "fwd"): (rms_norm_fwd, (x, w, 1e-6), 2 * rows + vec + stat, "rms_norm"),
        ("rms_norm", "stats"): (rms_norm_stats, (x, 1e-6), rows + stat, "rms_norm"),
        ("rms_norm", "bwd"): (
            rms_norm_bwd,
            (x, x, w, f),
            3 * rows + 2 * vec + stat,
            "rms_norm_bwd",
        ),
        ("add_rms_norm", "fwd"): (
            add_rms_norm_fwd,
            (x, x, w, 1e-6),
            4 * rows + vec + stat,
            "add_rms_norm",
        ),
        ("add_rms_norm", "bwd"): (
            rms_norm_bwd,
            (x, x, w, f, x),
            4 * rows + 2 * vec + stat,
            "add_rms_norm_bwd",
        ),
        ("layer_norm", "fwd"): (
            layer_norm_fwd,
            (x, w, w, 1e-5),
            2 * rows + 2 * vec + 2 * stat,
            "layer_norm",
        ),
        ("layer_norm", "stats"): (layer_norm_stats, (x, 1e-5), rows + 2 * stat, "layer_norm"),
        ("layer_norm", "bwd"): (
            layer_norm_bwd,
            (x, x, w, True, f, f),
            3 * rows + 3 * vec + 2 * stat,
            "layer_norm_bwd",
        ),
    }
    return table[(op, kernel)]


KERNELS = (
    ("rms_norm", "fwd"),
    ("rms_norm", "bwd"),
    ("rms_norm", "stats"),
    ("add_rms_norm", "fwd"),
    ("add_rms_norm", "bwd"),
    ("layer_norm", "fwd"),
    ("layer_norm", "bwd"),
    ("layer_norm", "stats"),
)


def price(
    op: str,
    kernel: str,
    tokens: int,
    hidden: int,
    target: str = "trn2",
    lnc: int = 1,
    bands: bool = False,
) -> Row:
    """Model one kernel at [tokens, hidden] bf16 with the config its op would use, launched
    as kernel[lnc] (LNC 2: both programs traced, each on its own physical core; the
    latency is the logical core's). `bands`: also the latency's band (the same trace
    scheduled under each of the cost model's parameter sets)."""
    tgt = get_target(target)
    fn, args, nbytes, _ = _specs(op, kernel, tokens, hidden)
    cfg = _config(op, kernel, tokens, hidden, tgt, lnc)
    kwargs = cfg.to_dict()
    if C.stats_in_kernel(cfg):  # statistics computed in the kernel: none read
        eps = 1e-5 if op == "layer_norm" else 1e-6
        nstats = 2 if op == "layer_norm" else 1
        args = tuple(None if a is STATS else a for a in args)
        nbytes -= nstats * tokens * 4
        kwargs["eps"] = eps
    else:
        f = TensorSpec((tokens,), "float32")
        args = tuple(f if a is STATS else a for a in args)
    trace = trace_kernel(fn, *args, target=tgt, lnc=lnc, **kwargs)
    est = estimate_trace(trace, tgt)
    lo, hi = band(trace, tgt) if bands else (None, None)
    bound = nbytes / tgt.hbm_bytes_per_ns
    busy = {k: v for k, v in est.busy_ns.items() if k != "dma"}
    return Row(
        op=op,
        kernel=kernel,
        tokens=tokens,
        hidden=hidden,
        target=tgt.name,
        latency_us=est.latency_ns / 1e3,
        bound_us=bound / 1e3,
        hbm_fraction=bound / est.latency_ns,
        mbu=est.mbu,
        busiest=max(busy, key=lambda k: busy[k]),
        config=cfg.key(),
        label=modeled_label(tgt.name, COST_MODEL_VERSION),
        latency_lo_us=None if lo is None else lo / 1e3,
        latency_hi_us=None if hi is None else hi / 1e3,
    )


def _config(op: str, kernel: str, tokens: int, hidden: int, tgt: Any, lnc: int = 1) -> Any:
    """The config the op would use for this kernel launched at `lnc` (config store at
    that LNC's keys, else heuristic)."""
    fn, _, _, cfg_op = _specs(op, kernel, tokens, hidden)
    affine = "wb" if op == "layer_norm" else "w"
    problem = C.NormProblem(tokens, hidden, DTYPE, affine)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return lookup_config(cfg_op, problem, fn, target=tgt, config_cls=C.CONFIGS[cfg_op], lnc=lnc)


def op_parts(
    op: str, kind: str, tokens: int, hidden: int, target: str = "trn2", lnc: int = 1
) -> list[Row]:
    """The kernels one call of the op launches, priced (`kind` fwd or bwd): the backward
    kernel, preceded by the statistics kernel unless the backward computes them itself."""
    parts = [price(op, kind, tokens, hidden, target, lnc)]
    cfg = _config(op, kind, tokens, hidden, get_target(target), lnc)
    if kind == "bwd" and not C.stats_in_kernel(cfg):
        parts.append(
            price(
                "layer_norm" if op == "layer_norm" else "rms_norm",
                "stats",
                tokens,
                hidden,
                target,
                lnc,
            )
        )
    return parts


def run(
    quick: bool = False,
    target: str = "trn2",
    bands: bool = False,
    tokens: tuple[int, ...] | None = None,
) -> list[Row]:
    """Every benchmark row (prints nothing); `bands`: each latency with its band; `tokens`
    overrides the token counts."""
    if tokens is None:
        tokens = QUICK_TOKENS if quick else TOKENS
    return [
        price(op, kernel, n, h, target, bands=bands)
        for op, kernel in KERNELS
        for h in HIDDENS
        for n in tokens
    ]


def table(rows: list[Row]) -> str:
    """The rows as a text table, with the provenance label in the header."""
    labels = sorted({r.label for r in rows})
    head = (
        f"{'kernel':<20} {'tokens':>6} {'hidden':>6} {'latency us':>11} {'bound us':>9} "
        f"{'% bound':>8} {'MBU %':>6}  busiest"
    )
    lines = [f"fused norms, bf16, one NeuronCore -- {', '.join(labels)}", head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.op + ' ' + r.kernel:<20} {r.tokens:>6} {r.hidden:>6} {r.latency_us:>11.1f} "
            f"{r.bound_us:>9.1f} {100 * r.hbm_fraction:>7.1f}% {100 * r.mbu:>5.1f}  {r.busiest}"
        )
    banded = [r for r in rows if r.latency_lo_us is not None and r.latency_hi_us is not None]
    if banded:
        lines.append("bands (latency over the cost model's parameter sets, % bound over them):")
        for r in banded:
            lo, hi = r.latency_lo_us or 0.0, r.latency_hi_us or 0.0
            lines.append(
                f"  {r.op + ' ' + r.kernel:<20} {r.tokens:>6} {r.hidden:>6} "
                f"{lo:.1f}-{hi:.1f} us, {100 * r.bound_us / hi:.1f}-{100 * r.bound_us / lo:.1f} %"
            )
    lines.append(
        "% bound = (essential HBM bytes / HBM bandwidth) / modeled latency; "
        "the ops' backward = bwd kernel (+ stats kernel for streamed plans)."
    )
    return "\n".join(lines)


def markdown_table(rows: list[Row], shapes: list[tuple[int, int]]) -> str:
    """One target's README table: per kernel, 'latency us (band), % of bound (band)' for
    each [tokens, hidden] of `shapes`, and the busiest engine(s)."""
    from ..bench.bands import ceiling_label

    by = {(r.op, r.kernel, r.tokens, r.hidden): r for r in rows}
    head = "| kernel | " + " | ".join(f"[{n}, {h}]" for n, h in shapes) + " | busiest engine |"
    lines = [head, "|---|" + "---|" * len(shapes) + "---|"]
    for op, kernel in KERNELS:
        cells, busiest = [], []
        for n, h in shapes:
            r = by.get((op, kernel, n, h))
            if r is None:
                cells.append("")
                continue
            cell = f"{r.latency_us:.0f} us, {100 * r.hbm_fraction:.1f} %"
            if r.latency_lo_us is not None and r.latency_hi_us is not None:
                # the structural term can widen the fast end past the HBM bound; no kernel
                # moves its bytes faster than HBM allows, so the band stops at the bound
                lo, hi = max(r.latency_lo_us, r.bound_us), r.latency_hi_us
                lat = format_band(r.latency_us, lo, hi, "us")
                pct = 100 * r.hbm_fraction, 100 * r.bound_us / hi, 100 * r.bound_us / lo
                cell = f"{lat}, {format_band(*pct, '%', 1)}"
            # a bandwidth fraction above the best published one is a ceiling of the model
            cells.append(ceiling_label(cell, f"{op} {kernel}", None, r.hbm_fraction))
            if r.busiest not in busiest:
                busiest.append(r.busiest)
        lines.append(f"| {op} {kernel} | " + " | ".join(cells) + f" | {' / '.join(busiest)} |")
    return "\n".join(lines)


def check(rows: list[Row]) -> list[str]:
    """Missed goals (empty when issue 4's goal is met)."""
    op, kernel, n, h, goal = GOAL
    hits = [
        r
        for r in rows
        if (r.op, r.kernel, r.tokens, r.hidden, r.target) == (op, kernel, n, h, "trn2")
    ]
    if not hits:
        hits = [price(op, kernel, n, h, "trn2")]
    return [
        f"{op} {kernel} [{n}, {h}] trn2: {100 * r.hbm_fraction:.1f} % of the HBM bound "
        f"< {100 * goal:.0f} % ({r.label})"
        for r in hits
        if r.hbm_fraction < goal
    ]
