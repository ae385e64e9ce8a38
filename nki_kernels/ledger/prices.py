"""Instances, their hourly prices (data with sources: `instances.json`) and payback arithmetic.

A price is used only when the data file gives the instance a `default_price` (one read on
AWS's own page; none is, as of the file's `read` date) or the user names it:
`--price INSTANCE=USD_PER_HOUR[:KIND]` (KIND: on-demand, capacity-block, savings-plan,
spot) or `--price INSTANCE=recorded` (the instance's first price recorded from another
page, with its kind, region and source). Every printed cost names its price, the price's
kind and where it came from. The payback arithmetic is the seeds' question: porting takes
`port_weeks` of an engineer costing `engineer_usd_per_week`; the current monthly spend falls
by the ledger's saving fraction; how many months until the port has paid for itself?
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

INSTANCES_FILE = Path(__file__).with_name("instances.json")
DEFAULT_INSTANCE = {"trn2": "trn2.48xlarge", "trn3": "trn3-chip"}
DEFAULT_GPU_INSTANCE = "p5en.48xlarge"
KINDS = {
    "on-demand": "On-Demand",
    "capacity-block": "Capacity Block",
    "savings-plan": "Savings Plan",
    "spot": "Spot",
}
UNSTATED = "kind not stated"


@dataclass(frozen=True)
class Instance:
    name: str
    accelerator: str  # "trn2" / "trn3" / a GPU name
    chips: int
    cores_per_chip: int
    usd_per_hour: float | None
    price_source: str  # where the price came from, or why there is none
    price_kind: str = UNSTATED  # On-Demand / Capacity Block / Savings Plan / Spot
    recorded: tuple[dict[str, Any], ...] = ()  # prices found on other pages, not used unasked

    def logical_cores(self, lnc: int) -> int:
        """Trainium: physical cores / LNC; a GPU instance: its GPUs."""
        if self.accelerator.startswith("trn"):
            return self.chips * self.cores_per_chip // lnc
        return self.chips


def _record_kind(r: dict[str, Any]) -> str:
    """The record's kind, and whether AWS's own page stated it."""
    aws = r["publisher"].startswith("AWS")
    return r["kind"] if aws else f"{r['kind']}, not from an AWS page"


def _record_source(r: dict[str, Any]) -> str:
    return f"recorded from {r['source']} ({r['publisher']}; region {r['region']}; read {r['read']})"


def load_instances(path: Path = INSTANCES_FILE) -> tuple[dict[str, Instance], dict[str, Any]]:
    raw = json.loads(path.read_text())
    out = {}
    for name, d in raw["instances"].items():
        recorded = tuple(d.get("recorded", []))
        default = d.get("default_price")
        usd, source, kind = None, d["price_status"], UNSTATED
        if default is not None:  # an index into `recorded`: a price read on AWS's own page
            r = recorded[int(default)]
            usd, source, kind = float(r["usd_per_hour"]), _record_source(r), _record_kind(r)
        out[name] = Instance(
            name,
            d["accelerator"],
            int(d["chips"]),
            int(d["cores_per_chip"]),
            usd,
            source,
            kind,
            recorded,
        )
    return out, raw


def parse_price(text: str) -> tuple[str, float | None, str]:
    """'trn2.48xlarge=12.5' -> ('trn2.48xlarge', 12.5, 'kind not stated');
    'x=12.5:capacity-block' -> (..., 'Capacity Block'); 'x=recorded' -> ('x', None, 'recorded'),
    with a clean error naming --price."""
    name, sep, rest = text.partition("=")
    usd, _, kind = rest.partition(":")
    if sep and name and usd == "recorded" and not kind:
        return name, None, "recorded"
    try:
        value = float(usd)
    except ValueError:
        value = float("nan")
    if kind and kind not in KINDS:
        raise ValueError(
            f"--price: expected KIND one of {', '.join(KINDS)} after ':'; got {kind!r} in {text!r}"
        )
    if not sep or not name or not 0 < value < float("inf"):
        raise ValueError(
            "--price: expected INSTANCE=USD_PER_HOUR[:KIND] (a positive, finite number) or "
            f"INSTANCE=recorded; got {text!r}"
        )
    return name, value, KINDS[kind] if kind else UNSTATED


def with_overrides(instances: dict[str, Instance], prices: list[str]) -> dict[str, Instance]:
    """The instances with `--price` overrides applied (an unknown instance is an error)."""
    out = dict(instances)
    for text in prices:
        name, usd, kind = parse_price(text)
        if name not in out:
            raise ValueError(
                f"--price: unknown instance {name!r}; expected one of {', '.join(out)}"
            )
        i = out[name]
        if usd is None:  # recorded
            if not i.recorded:
                raise ValueError(
                    f"--price: {name} has no recorded price; give it as {name}=USD_PER_HOUR"
                )
            r = i.recorded[0]
            out[name] = replace(
                i,
                usd_per_hour=float(r["usd_per_hour"]),
                price_source=_record_source(r),
                price_kind=_record_kind(r),
            )
        else:
            out[name] = replace(
                i, usd_per_hour=usd, price_source="given with --price", price_kind=kind
            )
    return out


def price_text(inst: Instance) -> str:
    if inst.usd_per_hour is None:
        return f"{inst.name}: no price ({inst.price_source})"
    return f"{inst.name} at ${inst.usd_per_hour:,.2f}/h, {inst.price_kind} ({inst.price_source})"


def usd_per_million(tokens_per_s: float, inst: Instance) -> float | None:
    if inst.usd_per_hour is None or not tokens_per_s > 0:
        return None
    return inst.usd_per_hour / 3600.0 / tokens_per_s * 1e6


def instance_hours_per_million(tokens_per_s: float) -> float:
    return 1e6 / tokens_per_s / 3600.0 if tokens_per_s > 0 else float("inf")


@dataclass(frozen=True)
class Payback:
    port_cost_usd: float
    monthly_saving_usd: float
    months: float | None  # None: never (no saving)

    def text(self) -> str:
        head = (
            f"porting cost ${self.port_cost_usd:,.0f}; monthly saving "
            f"${self.monthly_saving_usd:,.0f}"
        )
        if self.months is None:
            return f"{head}: never pays back (no saving at these figures)"
        return f"{head}: break-even after {self.months:.1f} months"


def payback(
    port_weeks: float, engineer_usd_per_week: float, monthly_spend_usd: float, cost_ratio: float
) -> Payback:
    """`cost_ratio` = new cost per token / current cost per token (same work moved)."""
    for name, v in (
        ("--port-weeks", port_weeks),
        ("--engineer-cost", engineer_usd_per_week),
        ("--monthly-spend", monthly_spend_usd),
    ):
        if not v >= 0:
            raise ValueError(f"{name}: expected a non-negative number; got {v}")
    port = port_weeks * engineer_usd_per_week
    saving = monthly_spend_usd * (1.0 - cost_ratio)
    months = port / saving if saving > 0 else None
    return Payback(port, saving, months)
