"""The ledger's chart: cost per million tokens by phase, ours vs native vs the GPU.

Trainium bars are modeled (their band as error bars: the range of the step over the cost
model's parameter sets); GPU bars come from measured rows (some ops derived from them, as
the ledger says). With a price for both instances the unit is USD; otherwise it is
instance-hours per million tokens, which a price multiplies into dollars.
"""

from __future__ import annotations

from pathlib import Path

from .ledger import Ledger
from .prices import Instance


def _value(led: Ledger, impl: str, inst: Instance, usd: bool) -> tuple[float, float, float]:
    """(value, minus, plus) for an error bar."""
    c = led.cost(impl, inst)
    tps = c["tokens_per_s"]
    if tps is None:
        return float("nan"), 0.0, 0.0
    per_hour = inst.usd_per_hour if usd and inst.usd_per_hour is not None else 1.0
    v = per_hour * 1e6 / tps / 3600.0
    st = led.step_total(impl)
    band = None if st is None else st.full_band
    if st is None or band is None:
        return v, 0.0, 0.0
    lo, hi = v * band[0] / st.us, v * band[1] / st.us
    return v, v - lo, hi - v


def cost_chart(ledgers: list[Ledger], trn: Instance, gpu: Instance, path: str | Path) -> Path:
    """Bars per phase (one ledger each), error bars from the bands; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    usd = trn.usd_per_hour is not None and gpu.usd_per_hour is not None
    gone = sorted({m for led in ledgers for m in led.missing("gpu")})
    gpu_name = f"{ledgers[0].gpu_device} (measured rows)"
    if gone:
        gpu_name += ", a LOWER BOUND (see below)"
    impls = (
        ("ours", trn, "Trainium, ours (modeled)"),
        ("native", trn, "Trainium, native (modeled)"),
        ("gpu", gpu, gpu_name),
    )
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    width = 0.26
    for j, (impl, inst, name) in enumerate(impls):
        vals = [_value(led, impl, inst, usd) for led in ledgers]
        xs = [i + (j - 1) * width for i in range(len(ledgers))]
        ax.bar(
            xs,
            [v[0] for v in vals],
            width,
            yerr=[[v[1] for v in vals], [v[2] for v in vals]],
            capsize=3,
            label=f"{name} on {inst.name}"
            + (f" at ${inst.usd_per_hour:,.2f}/h, {inst.price_kind}" if usd else ""),
        )
    ax.set_xticks(range(len(ledgers)))
    ax.set_xticklabels([led.step.describe() for led in ledgers], fontsize=8)
    ax.set_yscale("log")
    unit = "USD" if usd else "instance-hours"
    ax.set_ylabel(f"{unit} per million tokens (log)")
    first = ledgers[0]
    version = first.step_total("ours")
    label = version.label if version is not None else ""
    ax.set_title(
        f"{first.model.name}: cost per million tokens by phase ({first.target}, LNC "
        f"{first.lnc}; Trainium {label})",
        fontsize=9,
    )
    ax.legend(fontsize=7)
    note = (
        "error bars: the Trainium step's band over the cost model's parameter sets; "
        "left out: collectives, data loading, host, compile time"
    )
    if not usd:
        note += "; no price confirmed: multiply by each instance's hourly price"
    if gone:
        note += "\nGPU bars leave out (not measured): " + "; ".join(gone)
    fig.text(0.01, 0.01, note, fontsize=6)
    fig.tight_layout(rect=(0, 0.05 if gone else 0.03, 1, 1))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
