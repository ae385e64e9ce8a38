"""Per-model pricing, built once: every op of a step priced for each implementation, then
summed per layer, per step, per instance and per million tokens.

`build()` is what both `nki-kernels ledger` and `nki-kernels bench --model` call: the
first prints the step, tokens/s and cost per million tokens of ours vs native vs the
GPU; the second prints the per-op table of ours vs native vs AWS for that shape.

Per-instance throughput assumes each logical core (each GPU) runs the whole step for its
own `batch` sequences and the instance's cores run side by side with nothing between
them: it is a compute bound for the instance, which the left-out list names.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .figure import Figure, total
from .gpu import MISSING, GpuRows
from .gpu import price_op as gpu_price
from .layers import LEFT_OUT, Op, Step, head_ops, layer_kinds, layer_ops
from .models import ModelSpec
from .prices import Instance, instance_hours_per_million, usd_per_million
from .store import STALE, RowStore
from .trainium import price_op

TRAINIUM_IMPLS = ("ours", "native", "aws")
PARTIAL = "partial: leaves out "


def missing_of(figs: list[Figure]) -> list[str]:
    """The ops the figures' partial sums left out."""
    out = []
    for f in figs:
        for n in f.notes:
            if n.startswith(PARTIAL):
                out += n.removeprefix(PARTIAL).split("; ")
    return out


def _with_missing(f: Figure, missing: list[str]) -> Figure:
    if not missing:
        return f
    return replace(f, notes=(*f.notes, PARTIAL + "; ".join(sorted(set(missing)))))


@dataclass
class OpFigures:
    """One op of one layer kind with its figure per implementation (None: no such op)."""

    layer: str
    op: Op
    figs: dict[str, Figure | None]


@dataclass
class Ledger:
    model: ModelSpec
    step: Step
    target: str
    lnc: int
    ops: list[OpFigures]
    kinds: list[tuple[str, int, bool]]  # (layer kind, count, MoE)
    gpu_device: str = ""
    notes: list[str] = field(default_factory=list)
    gpu_rows: GpuRows | None = None

    # ---- sums ---------------------------------------------------------------------------
    def layer_total(self, layer: str, impl: str, group: str | None = None) -> Figure | None:
        """One layer of this kind (or one group of its ops), for `impl`. The GPU's sum
        leaves out the ops no measured row covers (`gpu.MISSING`) and says so: a partial
        sum, a lower bound on the GPU's time."""
        figs, missing = [], []
        for o in self.ops:
            if o.layer != layer or (group is not None and o.op.group != group):
                continue
            f = o.figs.get(impl)
            if f is None:
                if impl == "gpu" and o.op.kind in MISSING:
                    missing.append(MISSING[o.op.kind])
                    continue
                return None
            figs.append(f.scaled(o.op.count) if o.op.count != 1 else f)
        return _with_missing(total(figs), missing) if figs else None

    def step_total(self, impl: str) -> Figure | None:
        """The whole step: every layer kind times its count, plus the head."""
        parts = []
        for name, count, _ in self.kinds:
            f = self.layer_total(name, impl)
            if f is None:
                return None
            parts.append(f.scaled(count))
        head = self.layer_total("head", impl)
        if head is None:
            return None
        return _with_missing(total([*parts, head]), missing_of([*parts, head]))

    def is_stale(self, impl: str, layer: str | None = None, group: str | None = None) -> bool:
        """Some figure of `impl` in this layer (group; None: the whole step) comes from a
        stale row (`store.RowStore`)."""
        return any(
            (layer is None or o.layer == layer)
            and (group is None or o.op.group == group)
            and (f := o.figs.get(impl)) is not None
            and any(n.startswith(STALE) for n in f.notes)
            for o in self.ops
        )

    def stale_ops(self) -> dict[str, str]:
        """Each op with a figure from a stale row -> what changed since it was priced."""
        out: dict[str, str] = {}
        for o in self.ops:
            for f in o.figs.values():
                for n in f.notes if f is not None else ():
                    if n.startswith(STALE):
                        out[o.op.name] = n.removeprefix(STALE)
        return out

    def missing(self, impl: str = "gpu") -> list[str]:
        """What `impl`'s totals leave out (no measured row), once each."""
        if impl != "gpu":
            return []
        gone = {
            MISSING[o.op.kind]
            for o in self.ops
            if o.op.kind in MISSING and "gpu" in o.figs and o.figs["gpu"] is None
        }
        return sorted(gone)

    def measured_share(self, impl: str = "gpu") -> float:
        """Fraction of the step's time that comes from directly measured rows."""
        meas = tot = 0.0
        counts = {name: c for name, c, _ in self.kinds} | {"head": 1}
        for o in self.ops:
            f = o.figs.get(impl)
            if f is None:
                continue
            t = f.us * o.op.count * counts[o.layer]
            tot += t
            meas += t if f.kind == "measured" else 0.0
        return meas / tot if tot else 0.0

    def tokens_per_s(self, impl: str, inst: Instance) -> float | None:
        st = self.step_total(impl)
        if st is None or not st.us > 0:
            return None
        return inst.logical_cores(self.lnc) * self.step.tokens / (st.us * 1e-6)

    def cost(self, impl: str, inst: Instance) -> dict[str, float | None]:
        """tokens/s per instance, instance-hours and USD per million tokens (with band
        ends: the band's slow end gives the higher cost)."""
        st = self.step_total(impl)
        tps = self.tokens_per_s(impl, inst)
        if st is None or tps is None:
            return {"tokens_per_s": None, "hours_per_m": None, "usd_per_m": None}
        out: dict[str, float | None] = {
            "tokens_per_s": tps,
            "hours_per_m": instance_hours_per_million(tps),
            "usd_per_m": usd_per_million(tps, inst),
            "usd_per_m_lo": None,
            "usd_per_m_hi": None,
        }
        band = st.full_band
        if band is not None and inst.usd_per_hour is not None:
            lo_tps = tps * st.us / band[1]
            hi_tps = tps * st.us / band[0]
            out["usd_per_m_lo"] = usd_per_million(hi_tps, inst)
            out["usd_per_m_hi"] = usd_per_million(lo_tps, inst)
        return out

    @property
    def left_out(self) -> tuple[str, ...]:
        return LEFT_OUT


def build(
    model: ModelSpec,
    step: Step,
    target: str = "trn2",
    lnc: int = 2,
    store: RowStore | None = None,
    gpu: GpuRows | None = None,
    impls: tuple[str, ...] = ("ours", "native"),
    log: object = None,
) -> Ledger:
    """Price every op of `step` for `model` on `target` at `lnc` for each of `impls`
    (Trainium: ours / native / aws) and, with `gpu`, from the GPU's measured rows."""
    if step.phase not in ("train", "prefill", "decode"):
        raise ValueError(f"--phase: expected train, prefill or decode; got {step.phase!r}")
    if lnc not in (1, 2):
        raise ValueError(f"--lnc: expected 1 or 2; got {lnc}")
    store = store or RowStore()
    kinds = layer_kinds(model)
    ops: list[OpFigures] = []
    plan = [(name, layer_ops(model, step, moe)) for name, _, moe in kinds]
    plan.append(("head", head_ops(model, step)))
    for layer, layer_op_list in plan:
        for op in layer_op_list:
            figs: dict[str, Figure | None] = {}
            for impl in impls:
                figs[impl] = price_op(store, op, impl, model, target, lnc)
            if gpu is not None:
                figs["gpu"] = gpu_price(gpu, op, model)
            if callable(log):
                log(f"priced {layer}: {op.name}")
            ops.append(OpFigures(layer, op, figs))
    led = Ledger(model, step, target, lnc, ops, kinds, gpu.device if gpu else "", gpu_rows=gpu)
    if model.changes:
        led.notes.append(f"{model.name}: {model.changes}")
    return led
