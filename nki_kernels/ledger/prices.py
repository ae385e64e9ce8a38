"""Instances, their hourly prices (data with sources: `instances.json`) and payback arithmetic.

No price is used unless it is confirmed on a stored public AWS page or given with
`--price INSTANCE=USD_PER_HOUR`; every printed cost names the price and where it came
from. The payback arithmetic is the seeds' question: porting takes `port_weeks` of an
engineer costing `engineer_usd_per_week`; the current monthly spend falls by the ledger's
saving fraction; how many months until the port has paid for itself?
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INSTANCES_FILE = Path(__file__).with_name("instances.json")
DEFAULT_INSTANCE = {"trn2": "trn2.48xlarge", "trn3": "trn3-chip"}
DEFAULT_GPU_INSTANCE = "p5en.48xlarge"


@dataclass(frozen=True)
class Instance:
    name: str
    accelerator: str  # "trn2" / "trn3" / a GPU name
    chips: int
    cores_per_chip: int
    usd_per_hour: float | None
    price_source: str  # where the price came from, or why there is none

    def logical_cores(self, lnc: int) -> int:
        """Trainium: physical cores / LNC; a GPU instance: its GPUs."""
        if self.accelerator.startswith("trn"):
            return self.chips * self.cores_per_chip // lnc
        return self.chips


def load_instances(path: Path = INSTANCES_FILE) -> tuple[dict[str, Instance], dict[str, Any]]:
    raw = json.loads(path.read_text())
    out = {}
    for name, d in raw["instances"].items():
        usd = d.get("on_demand_usd_per_hour")
        out[name] = Instance(
            name,
            d["accelerator"],
            int(d["chips"]),
            int(d["cores_per_chip"]),
            None if usd is None else float(usd),
            d.get("price_source", "") if usd is not None else d["price_status"],
        )
    return out, raw


def parse_price(text: str) -> tuple[str, float]:
    """'trn2.48xlarge=12.5' -> ('trn2.48xlarge', 12.5), with a clean error naming --price."""
    name, sep, usd = text.partition("=")
    try:
        value = float(usd)
    except ValueError:
        value = float("nan")
    if not sep or not name or not value > 0:
        raise ValueError(
            f"--price: expected INSTANCE=USD_PER_HOUR (a positive number); got {text!r}"
        )
    return name, value


def with_overrides(instances: dict[str, Instance], prices: list[str]) -> dict[str, Instance]:
    """The instances with `--price` overrides applied (an unknown instance is an error)."""
    out = dict(instances)
    for text in prices:
        name, usd = parse_price(text)
        if name not in out:
            raise ValueError(
                f"--price: unknown instance {name!r}; expected one of {', '.join(out)}"
            )
        i = out[name]
        out[name] = Instance(
            i.name, i.accelerator, i.chips, i.cores_per_chip, usd, "given with --price"
        )
    return out


def price_text(inst: Instance) -> str:
    if inst.usd_per_hour is None:
        return f"{inst.name}: no price ({inst.price_source})"
    return f"{inst.name} at ${inst.usd_per_hour:,.2f}/h ({inst.price_source})"


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
