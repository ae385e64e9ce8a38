"""Text reports of a ledger: the cost ledger (`nki-kernels ledger`) and the per-op table
of `nki-kernels bench --model`. Every figure carries its label; the labels are stated
once in the header and repeated in each column title."""

from __future__ import annotations

from .figure import Figure, fmt_band, fmt_us
from .gpu import MISSING
from .ledger import PARTIAL, Ledger
from .prices import Instance, price_text

GROUPS = (
    ("attention", "attention (ours: our kernel; native: TorchNeuron SDPA)"),
    ("moe", "MoE layer (router + experts)"),
    ("mlp", "MLP element-wise (SwiGLU product)"),
    ("norms", "norms (fused add + RMSNorm, RMSNorm bwd)"),
    ("matmuls", "matmuls left to the compiler (same both)"),
)


MLA_GROUP = "MLA attention (ours falls back to native's path)"


def _missing_group(led: Ledger, layer: str, group: str) -> bool:
    """The GPU has no figure for this group because its ops are not measured."""
    return any(o.layer == layer and o.op.group == group and o.op.kind in MISSING for o in led.ops)


def _partial(f: Figure) -> bool:
    return any(n.startswith(PARTIAL) for n in f.notes)


def _cell(f: Figure | None, width: int = 34, stale: bool = False) -> str:
    """A figure with its band; '>= x (partial)' for a sum that leaves ops out; 'stale'
    after a figure with a part from a stale row."""
    if f is None:
        return "n/a".ljust(width)
    text = f">= {fmt_band(f)} (partial)" if _partial(f) else fmt_band(f)
    text = text + " stale" if stale else text
    return text.ljust(width) if len(text) < width else text + " "


def trainium_label(led: Ledger) -> str:
    f = led.step_total("ours")
    return f.label if f is not None else f"modeled ({led.target})"


def _structural(led: Ledger) -> str:
    f = led.step_total("ours")
    return f" ({f.structural_pct:.1f} %)" if f is not None and f.structural_pct else ""


def header(led: Ledger, gpu: bool = True) -> list[str]:
    m, s = led.model, led.step
    out = [
        f"{m.name} ({m.source}): {s.describe()} per logical core; {led.target}, LNC {led.lnc}",
        f"Trainium columns: {trainium_label(led)}; the band in brackets is the range over "
        "the cost model's parameter sets, carried through every sum per set, widened by "
        f"its structural error{_structural(led)} (taken as the same on every op).",
    ]
    if gpu and led.gpu_device:
        share = led.measured_share()
        out.append(
            f"GPU column: one {led.gpu_device}; {share:.0%} of its step time from directly "
            "measured rows, the rest derived from measured rows (--detail names each)."
        )
        out.append(
            "Modeled (Trainium) and measured (GPU) figures sit side by side: they are "
            "different kinds of figure, not one method applied twice."
        )
        gone = led.missing("gpu")
        if gone:
            out.append(
                f"GPU column MISSING: {'; '.join(gone)}; its totals leave it out, so they are "
                "lower bounds on the GPU's time, marked '>= ... (partial)'."
            )
    stale = led.stale_ops()
    if stale:
        what = sorted(set(stale.values()))
        out.append(
            f"STALE: the Trainium figures of {len(stale)} op(s) come from rows priced before a "
            f"change to what determines them ({'; '.join(what)}); they are printed as priced, "
            "marked 'stale': --refresh-stale prices them again."
        )
    for n in led.notes:
        out.append(f"Model note: {n}")
    return out


def layer_table(led: Ledger, impls: tuple[str, ...], titles: dict[str, str]) -> list[str]:
    out = []
    names = [name for name, _, _ in led.kinds] + ["head"]
    for name in names:
        count = dict((n, c) for n, c, _ in led.kinds).get(name, 1)
        title = f"one {name} (x {count} in the model)" if name != "head" else "head, once"
        out.append("")
        out.append(f"{title:<58}" + "".join(f"{titles[i]:<34}" for i in impls))
        groups = GROUPS if name != "head" else (("head", "final norm + lm_head matmuls"),)
        if led.model.is_mla and name != "head":
            groups = ((GROUPS[0][0], MLA_GROUP), *GROUPS[1:])
        for g, desc in groups:
            if not any(o.layer == name and o.op.group == g for o in led.ops):
                continue
            row = [led.layer_total(name, i, g) for i in impls]
            cells = [
                "MISSING (not measured)".ljust(34)
                if f is None and i == "gpu" and _missing_group(led, name, g)
                else _cell(f, stale=led.is_stale(i, name, g))
                for i, f in zip(impls, row, strict=True)
            ]
            out.append(f"  {desc:<56}" + "".join(cells))
        tot = [(i, led.layer_total(name, i)) for i in impls]
        out.append(
            f"  {'total':<56}" + "".join(_cell(f, stale=led.is_stale(i, name)) for i, f in tot)
        )
    return out


def detail(led: Ledger, impls: tuple[str, ...]) -> list[str]:
    out = ["", "Each op, each figure's source:"]
    for o in led.ops:
        cnt = f" x {o.op.count}" if o.op.count != 1 else ""
        out.append(f"  [{o.layer}] {o.op.name}{cnt}")
        for i in impls:
            f = o.figs.get(i)
            out.append(f"      {i}: " + ("n/a" if f is None else f"{fmt_band(f)}  {f.label}"))
            if f is not None:
                out.append(f"          from {f.source}")
    return out


def cost_lines(led: Ledger, trn: Instance, gpu_inst: Instance | None) -> list[str]:
    rows = [("ours", trn), ("native", trn)]
    if gpu_inst is not None and led.gpu_device:
        rows.append(("gpu", gpu_inst))
    out = ["", "Per instance (every core runs its own step; nothing between cores is priced):"]
    for impl, inst in rows:
        st = led.step_total(impl)
        if st is None:
            continue
        c = led.cost(impl, inst)
        cores = inst.logical_cores(led.lnc)
        unit = "logical cores" if inst.accelerator.startswith("trn") else "GPUs"
        usd = c["usd_per_m"]
        band = ""
        if c.get("usd_per_m_lo") is not None:
            band = f" ({c['usd_per_m_lo']:,.3g}-{c['usd_per_m_hi']:,.3g})"
        money = (
            f"${usd:,.3g}{band} per M tokens at ${inst.usd_per_hour:,.2f}/h ({inst.price_kind})"
            if usd is not None and inst.usd_per_hour is not None
            else "USD: needs --price"
        )
        kind = "modeled" if impl != "gpu" else "measured + derived"
        if _partial(st):
            kind += f", a LOWER BOUND (leaves out {'; '.join(led.missing(impl))})"
        out.append(
            f"  {impl:<7} {inst.name} ({cores} {unit}), {kind}: step {fmt_band(st)}; "
            f"{c['tokens_per_s']:,.0f} tokens/s; {c['hours_per_m']:,.3g} instance-hours "
            f"per M tokens; {money}"
        )
    out.append("  prices: " + "; ".join(sorted({price_text(i) for _, i in rows})))
    return out


def ledger_text(
    led: Ledger, trn: Instance, gpu_inst: Instance | None, show_detail: bool = False
) -> str:
    impls = ("ours", "native") + (("gpu",) if led.gpu_device else ())
    titles = {
        "ours": "ours (modeled)",
        "native": "native (modeled)",
        "gpu": f"{led.gpu_device} (measured rows)",
    }
    out = header(led)
    out += layer_table(led, impls, titles)
    step = [(i, led.step_total(i)) for i in impls]
    out.append("")
    out.append(f"{'step total':<58}" + "".join(_cell(f, stale=led.is_stale(i)) for i, f in step))
    if led.gpu_device and led.step.phase != "decode":
        out += _whole_layer_check(led)
    out += cost_lines(led, trn, gpu_inst)
    if show_detail:
        out += detail(led, impls)
    out.append("")
    out.append("Left out: " + "; ".join(led.left_out) + ".")
    return "\n".join(line.rstrip() for line in out)


def _whole_layer_check(led: Ledger) -> list[str]:
    rows = led.gpu_rows
    if rows is None:
        return []
    r = rows.whole_layer(led.model, led.step.seq)
    if r is None or led.step.batch != 1:
        return []
    name = led.kinds[-1][0]
    ours = led.layer_total(name, "gpu")
    if ours is None:
        return []
    key = "fwd_plus_bwd_us" if led.step.phase == "train" else "latency_us"
    return [
        f"  check: the GPU's per-op sum for one {name} is {fmt_us(ours.us)}; one whole "
        f"transformers decoder layer measured {fmt_us(r[key])} ({r['op']}, {r['case']})"
    ]


def carried(led: Ledger, impls: tuple[str, ...]) -> list[str]:
    """The figures carried from rows at another shape (interpolated / scaled), named."""
    seen: list[str] = []
    for o in led.ops:
        for i in impls:
            f = o.figs.get(i)
            if f is not None and any(
                w in f.source for w in ("interpolated", "extrapolated", "scaled by", "used as is")
            ):
                line = f"  {i} {o.op.name}: {f.source}"
                if line not in seen:
                    seen.append(line)
    return ["", "Carried from rows at another shape:", *seen] if seen else []


def bench_model_text(led: Ledger) -> str:
    """ours vs native vs AWS per op of one layer of each kind, with ours' speedup."""
    out = header(led, gpu=False)
    out.append("AWS column: AWS's nki-library kernel for the op, where one exists (n/a else).")
    impls = ("ours", "native", "aws")
    for name, count, _ in led.kinds:
        out.append("")
        out.append(
            f"{f'one {name} (x {count})':<46}"
            + "".join(f"{t:<34}" for t in ("ours", "native", "AWS kernel"))
            + "ours vs native"
        )
        for o in led.ops:
            if o.layer != name:
                continue
            figs = [o.figs.get(i) for i in impls]
            cnt = f" x {o.op.count}" if o.op.count != 1 else ""
            sp = ""
            if figs[0] is not None and figs[1] is not None:
                sp = f"{figs[1].us / figs[0].us:.2f}x"
            out.append(f"  {o.op.name + cnt:<44}" + "".join(_cell(f) for f in figs) + sp)
        tot = [led.layer_total(name, i) for i in ("ours", "native")]
        sp = f"{tot[1].us / tot[0].us:.2f}x" if tot[0] and tot[1] else ""
        out.append(f"  {'layer total':<44}" + _cell(tot[0]) + _cell(tot[1]) + " " * 34 + sp)
    out += carried(led, impls)
    out.append("")
    out.append("Left out: " + "; ".join(led.left_out) + ".")
    return "\n".join(line.rstrip() for line in out)
