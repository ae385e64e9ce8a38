"""The README's benchmark section, generated from the committed rows (`bench --markdown`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from .bands import widen_ratio
from .rows import BenchRow
from .table import comparison_table, dropping_table, group

FAMILIES = (
    ("norm", "Fused norms (forward and backward)"),
    ("attention", "Flash attention (Llama-3 8B heads, B = 1)"),
    ("moe", "MoE layer forward (router + experts)"),
)
GOALS = {"norm": 1.1, "attention": 1.3, "moe": 1.3}  # the goals vs AWS's kernels


def _geo(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _pairs(
    rows: Sequence[BenchRow],
    family: str,
    target: str,
    lnc: int,
    other: str,
    cost_model: str | None,
) -> list[tuple[str, str, BenchRow, BenchRow]]:
    """(op, case, ours, other's row) for every case of the family with both figures from
    the same cost model (`cost_model` when given): rows of different models never pair."""
    out = []
    for (fam, op, case, tgt, n), impls in group(rows).items():
        if fam != family or tgt != target or n != lnc:
            continue
        ours, o = impls.get("nki"), impls.get(other)
        if ours is None or o is None or math.isnan(o.latency_us):
            continue
        if ours.provenance != o.provenance:
            continue
        if cost_model is not None and f"cost model {cost_model}," not in ours.provenance:
            continue
        out.append((op, case, ours, o))
    return out


def speedups(
    rows: Sequence[BenchRow],
    family: str,
    target: str,
    lnc: int,
    other: str,
    cost_model: str | None = None,
) -> list[tuple[str, str, float]]:
    """(op, case, other / ours) for every case of the family with both figures (priced by
    `cost_model` when given)."""
    pairs = _pairs(rows, family, target, lnc, other, cost_model)
    return [(op, case, o.latency_us / ours.latency_us) for op, case, ours, o in pairs]


def geo_band(
    rows: Sequence[BenchRow], family: str, target: str, lnc: int, other: str, cost_model: str
) -> tuple[float, float] | None:
    """The geometric-mean speedup's band: the geometric mean per parameter set (the same
    set on both sides of each ratio), min and max over the sets; None without samples."""
    per_set: list[list[float]] = []
    for _op, _case, ours, o in _pairs(rows, family, target, lnc, other, cost_model):
        a, b = ours.extra.get("samples_us"), o.extra.get("samples_us")
        if not a or not b or len(a) != len(b):
            return None
        per_set.append([y / x for x, y in zip(a, b, strict=True)])
    if not per_set:
        return None
    means = [_geo([r[i] for r in per_set]) for i in range(len(per_set[0]))]
    return widen_ratio(min(means), max(means), target, f"cost model {cost_model}")


def goal_text(
    family: str, geo: float, band: tuple[float, float] | None, cases: tuple[int, int] | None = None
) -> str:
    """The issue's goal for the family (geometric mean >= GOALS[family] and the band's
    low end >= 1.0x) and whether it is met; when missed, by how much. `cases` = (cases
    with an AWS figure, all cases): a goal judged on part of the cases says so."""
    goal = GOALS[family]
    text = f"goal {goal}x with band low end >= 1.0x: "
    if cases is not None and cases[0] < cases[1]:
        text = (
            f"goal {goal}x with band low end >= 1.0x, judged on the {cases[0]} of {cases[1]} "
            "cases that have an AWS figure (the others: no nki-library kernel for the op, or "
            "it does not run through the interpreter; see the notes): "
        )
    misses = []
    if geo < goal:
        misses.append(f"geometric mean {geo:.2f}x is {goal - geo:.2f}x short")
    if band is None:
        misses.append("no band")
    elif band[0] < 1.0:
        misses.append(f"band low end {band[0]:.2f}x")
    return text + ("met" if not misses else "missed (" + ", ".join(misses) + ")")


def configs_note(rows: Sequence[BenchRow]) -> str:
    """Which shipped configs priced our rows (main's commit when the rows were priced)."""
    commits = sorted(
        {str(r.extra["configs_commit"]) for r in rows if r.extra.get("configs_commit")}
    )
    if not commits:
        return ""
    return (
        "Our norm rows use the configs the op looks up (`nki_kernels/configs/`, as on main at "
        f"commit {', '.join(commits)} when they were priced); attention and MoE rows use the "
        "kernels' heuristic defaults."
    )


def headline(
    rows: Sequence[BenchRow],
    targets: Sequence[str],
    lnc: int,
    cost_model: str | None = None,
    goals: bool = False,
) -> list[str]:
    """One Markdown bullet per (family, target): geometric mean and range of the speedups
    over AWS's kernels and over the native path, and the losing cases (with `goals`: the
    project's goal for the family and whether it is met, for maintainers)."""
    lines = []
    for family, title in FAMILIES:
        for target in targets:
            parts = []
            for other, name in (("aws", "AWS's kernel"), ("native", "TorchNeuron's path")):
                sp = speedups(rows, family, target, lnc, other, cost_model)
                if not sp:
                    parts.append(f"vs {name}: no figure")
                    continue
                vals = [s for _, _, s in sp]
                lost = sum(v < 1.0 for v in vals)
                band = (
                    geo_band(rows, family, target, lnc, other, cost_model) if cost_model else None
                )
                btxt = f" (band {band[0]:.2f}–{band[1]:.2f}x)" if band else ""
                text = (
                    f"vs {name}: {_geo(vals):.2f}x{btxt} geometric mean; "
                    f"{min(vals):.2f}–{max(vals):.2f}x over {len(vals)} cases"
                )
                text += f", ours slower in {lost}" if lost else ""
                if other == "aws" and goals:
                    every = speedups(rows, family, target, lnc, "native", cost_model)
                    cases = (len(vals), max(len(vals), len(every)))
                    text += " — " + goal_text(family, _geo(vals), band, cases)
                parts.append(text)
            if all(p.endswith("no figure") for p in parts):
                continue
            lines.append(f"- **{title}, {target}, LNC {lnc}**: " + "; ".join(parts) + ".")
    return lines


V1_CAVEAT = (
    "Cost model v1 prices AWS's attention and norm kernels far slower than ours partly "
    "through a known model error: their instruction streams wait on chains of DMAs, each "
    "charged v1's fixed 1.3 us start (AWS's `attention_cte` at S = 2048: latency 3x its "
    "busiest engine's busy time); the cost-model issue measures v1 1.6-1.9x too slow on "
    "that kernel. Read the speedups over AWS's kernels as upper bounds until v2."
)


def _band_sets(targets: Sequence[str]) -> list[str]:
    """The parameter sets every band of `targets` spans (one paragraph each), or none."""
    try:
        from ..perfmodel.band import describe_sets
    except ImportError:
        return []
    return [f"Band, {t}: {describe_sets(t)}.\n" for t in targets]


def markdown(rows: Sequence[BenchRow], cost_model: str, commits: Sequence[str]) -> tuple[str, str]:
    """(tables page, details page) of the manual: the LNC 2 headline bullets and tables,
    and the LNC 1 ones with the capacity-factor rows."""
    targets = sorted({r.target for r in rows})
    head = [
        f"AWS's rows: nki-library {', '.join(commits) or 'none'}.",
        "",
        f"**Headline (LNC 2, the default on trn2; assumed on trn3; cost model {cost_model} "
        "rows only, with bands: the range over the cost model's parameter sets, widened by "
        "its cross-validated error).**",
        "",
        *(headline(rows, targets, 2, cost_model) or ["- no case priced by this cost model yet"]),
        "",
        *_band_sets(targets),
    ]
    note = configs_note(rows)
    if note:
        head += [note, ""]
    older = sorted(
        {r.provenance.split(",")[0] for r in rows if f"model {cost_model}," not in r.provenance}
    )
    if older:
        cases = sorted(
            {f"{r.family} {r.case}" for r in rows if f"model {cost_model}," not in r.provenance}
        )
        head += [
            f"Rows labelled {', '.join(o.replace('modeled (', '') for o in older)} were priced "
            f"before cost model {cost_model} and are not re-priced yet (`nki-kernels bench "
            "--reprice --full --bands`, `--peer PATH --full`); they are left out of the "
            "headline, and rows of different cost models are never compared ('mixed'). "
            f"Those cases: {'; '.join(cases)}.",
            "",
        ]
    if cost_model == "v1":
        head += [f"*Caveat.* {V1_CAVEAT}", ""]
    failing = sorted(
        {
            f"{r.family}: {r.extra['error'].split(';')[0][:160]}"
            for r in rows
            if r.impl == "aws" and r.extra.get("error")
        }
    )
    if failing:
        head += [
            "*AWS kernels that do not run through the interpreter yet* (no AWS figure for "
            "those rows; `make bench` lists every error):",
            "",
            *[f"- {f}" for f in failing],
            "",
        ]
    details = [
        "### Per physical core (LNC 1) and the capacity-factor composition",
        "",
        "The same cases at LNC 1 (one physical core), from the same committed rows.",
        "",
        *headline(rows, targets, 1, cost_model),
        "",
    ]
    for family, title in FAMILIES:
        fam = [r for r in rows if r.family == family]
        if not fam:
            continue
        two = [r for r in fam if r.lnc == 2]
        one = [r for r in fam if r.lnc == 1]
        if two:
            head += [f"**{title} — LNC 2, per logical core**", "", comparison_table(two), ""]
        if one:
            details += [f"**{title} — LNC 1, per physical core**", "", comparison_table(one), ""]
        drop = dropping_table(fam)
        if drop:
            details += [
                "**Capacity-factor composition (drops tokens; not a baseline)**",
                "",
                drop,
                "",
            ]
    return "\n".join(head), "\n".join(details)
