"""`nki-kernels configs show|summary|diff|which|validate`: the stored tuned configs.

    nki-kernels configs show [--target trn2] [--op rms_norm] [--config-dir DIR]
    nki-kernels configs summary [--op rms_norm] [--config-dir DIR|shipped] [--lnc 1|2]
    nki-kernels configs diff DIR_A DIR_B [--target trn2] [--op rms_norm]
    nki-kernels configs which OP --shape SHAPE --size N [--target trn2] [--dtype D]
        [--bucket-policy SPEC] [--config-dir DIR] [--lnc 1|2]
    nki-kernels configs validate [--config-dir DIR] [--target trn2] [--op rms_norm]

`which` answers what a call of OP at dynamic size N (rows / tokens / sequence length) of
that shape uses: the bucket (under the op's policy), the config, from where (tuned entry,
nearest bucket, heuristic default) and its provenance, through the same lookup the op runs,
at the LNC it names (--lnc; default, as `tune` and as the calls of this process: the
runtime's LNC, `runtime.lnc.runtime_lnc`), and which store won and why (the directories
in search order, exact keys before nearest buckets, and any entry it shadows).
`summary` prints every modeled latency and speedup with its band where the entry has one
("1.23 ms (1.20–1.26)": the range over the cost model's parameter sets, stated once under
the table), labels the entries by cost model when the table holds more than one, and
gives the speedup geomean per cost model and LNC (figures of different models are never
pooled). `show` and `validate` report a file that does not parse, or an entry that fails the schema
or its own problem's fit check, instead of stopping; `validate` exits 1 if any does.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import Any


def add_configs_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `nki-kernels configs`."""
    sub = p.add_subparsers(
        dest="configs_cmd", metavar="show|summary|diff|which|validate", required=True
    )
    show = sub.add_parser("show", help="list stored tuned configs with their provenance")
    show.add_argument("--target", default=None)
    show.add_argument("--op", default=None)
    show.add_argument("--config-dir", default=None, help="a user dir (default: env + shipped)")
    show.add_argument("--markdown", action="store_true", help="one markdown table row per entry")
    summ = sub.add_parser(
        "summary", help="markdown table: tuned vs default latency per op, bucket and target"
    )
    summ.add_argument("--op", default=None)
    summ.add_argument("--config-dir", default="shipped", help="default: the packaged configs")
    summ.add_argument("--lnc", type=int, choices=(1, 2), default=None, help="only this LNC")
    diff = sub.add_parser("diff", help="compare two config directories ('shipped' = packaged)")
    diff.add_argument("a")
    diff.add_argument("b")
    diff.add_argument("--target", default=None)
    diff.add_argument("--op", default=None)
    which = sub.add_parser("which", help="which config a call uses, from where, provenance")
    which.add_argument("op")
    which.add_argument("--shape", required=True, help="model name or dims (as tune --shape)")
    which.add_argument("--size", type=int, required=True, help="rows / tokens / seq of the call")
    which.add_argument("--target", default="trn2")
    which.add_argument("--dtype", default=None)
    which.add_argument("--bucket-policy", default=None, help="default: the op's policy")
    which.add_argument("--config-dir", default=None, help="a user dir (default: env + shipped)")
    which.add_argument(
        "--lnc",
        type=int,
        choices=(1, 2),
        default=None,
        help="LNC of the call (default: the LNC the ops launch at here, as "
        "`nki-kernels doctor` prints)",
    )
    val = sub.add_parser("validate", help="check every stored entry (schema, fit, kernel hash)")
    val.add_argument("--target", default=None)
    val.add_argument("--op", default=None)
    val.add_argument("--config-dir", default=None, help="a user dir (default: env + shipped)")


def _dir(arg: str, what: str) -> Path:
    """The directory `arg` names ('shipped': the packaged configs); a ValueError naming
    `what` when there is none (a mistyped path would read as a directory of no configs)."""
    from ..runtime.config_store import SHIPPED_DIR

    if arg == "shipped":
        return SHIPPED_DIR
    if not Path(arg).is_dir():
        raise ValueError(f"{what}: expected a config directory or 'shipped'; got {arg!r}")
    return Path(arg)


def _dirs(arg: str | None, what: str = "--config-dir") -> list[Path]:
    from ..runtime.config_store import default_store

    if arg is None:
        return list(default_store().search_dirs)
    return [_dir(arg, what)]


def _files(directory: Path, target: str | None, op: str | None) -> dict[tuple[str, str], Path]:
    out = {}
    for path in sorted(directory.glob("*/*.json")):
        t, o = path.parent.name, path.stem
        if (target is None or t == target) and (op is None or o == op):
            out[(t, o)] = path
    return out


def _entries(path: Path) -> dict[str, Any]:
    """A file's entries; ValueError naming the file when it does not parse."""
    from ..runtime.config_store import _read

    return dict(_read(path).get("entries", {}))


def _entries_or_report(path: Path) -> dict[str, Any] | None:
    try:
        return _entries(path)
    except (OSError, ValueError) as e:
        print(f"{path}: not used: {e}", file=sys.stderr)
        return None


def _current_hash(op: str) -> str | None:
    from .families import OPS

    if op not in OPS:
        return None
    try:
        return OPS[op].make_tunable().source_hash()
    except Exception:
        return None


def _compact_problem(key: str) -> str:
    """A problem key without the fields every shipped entry shares (bf16, weighted)."""
    parts = [p for p in key.split(",") if p not in ("dtype=bfloat16", "affine=w", "batch=1")]
    return ", ".join(parts)


def _unit(ns_values: list[float]) -> tuple[str, float]:
    """The unit ('ms' or 'us') that suits the largest of `ns_values`, and its scale."""
    return ("ms", 1e6) if max(ns_values) >= 1e6 else ("us", 1e3)


def banded_latency(ns: float, band: Any) -> str:
    """'1.23 ms (1.20–1.26)' (the band in the figure's unit), or '1.23 ms' without one."""
    unit, scale = _unit([ns, *(band or [])])
    digits = 2 if ns / scale < 100 else 1
    text = f"{ns / scale:.{digits}f} {unit}"
    if band:
        text += f" ({band[0] / scale:.{digits}f}–{band[1] / scale:.{digits}f})"
    return text


def banded_speedup(x: float, band: Any) -> str:
    """'x1.23 (1.20–1.26)', or 'x1.23' without a band."""
    return f"x{x:.2f}" + (f" ({band[0]:.2f}–{band[1]:.2f})" if band else "")


def _model_tag(measurer: str) -> str:
    """'modeled (cost model v2, trn2, LNC 2; one of 8 units, x8)' -> 'cost model v2'."""
    m = re.search(r"cost model (v\d+)", measurer)
    return f"cost model {m.group(1)}" if m else measurer


def _configs_summary(directory: Path, op: str | None, lnc: int | None = None) -> list[str]:
    """The markdown table of `configs summary` (see the module docstring)."""
    from ..runtime.config_records import BAND_MEANING

    files = _files(directory, None, op)
    targets = sorted({t for t, _ in files})
    rows: dict[tuple[str, str], dict[str, str]] = {}
    speedups: list[tuple[str, float, Any]] = []
    measurers: set[str] = set()
    cells: list[tuple[tuple[str, str], str, str, str]] = []
    for (t, o), path in files.items():
        current = _current_hash(o)
        for key, entry in (_entries_or_report(path) or {}).items():
            prov = entry.get("provenance", {}) if isinstance(entry, dict) else {}
            if not isinstance(prov, dict):
                continue
            if lnc is not None and ("lnc=2" in key.split(",")) != (lnc == 2):
                continue
            lat, dflt = _latencies(prov)
            stale = "" if current is None or prov.get("kernel_hash") == current else " STALE"
            at = 2 if "lnc=2" in key.split(",") else 1
            group = f"{_model_tag(str(prov.get('measurer', 'unlabeled')))}, LNC {at}"
            speedups.append((group, dflt / lat, prov.get("speedup_band")))
            # "modeled (cost model v1, trn2; one of 8 units, x8)" -> "modeled (cost model v1, trn2)"
            measurers.add(re.sub(r";[^)]*\)", ")", str(prov.get("measurer", "unlabeled"))))
            cell = (
                f"{banded_latency(dflt, prov.get('default_latency_band_ns'))} → "
                f"{banded_latency(lat, prov.get('latency_band_ns'))}, "
                f"{banded_speedup(dflt / lat, prov.get('speedup_band'))}"
            )
            tag = _model_tag(str(prov.get("measurer", "unlabeled")))
            rank = f", {prov['rank']}" if prov.get("rank") == "pessimistic" else ""
            cells.append(((o, key), t, cell + stale, tag + rank))
    tags = {c[3].split(",")[0] for c in cells}
    for (o, key), t, cell, tag in cells:
        # label each entry with its cost model when the table holds more than one, and
        # name the entries ranked by the band's slow end
        show = tag if len(tags) > 1 else tag.partition(", ")[2]
        rows.setdefault((o, key), {})[t] = cell + (f" [{show}]" if show else "")
    head = ["op", "bucketed problem", *(f"{t}: default → tuned, speedup" for t in targets)]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (o, key), by_target in sorted(
        rows.items(), key=lambda kv: (kv[0][0], _natural((kv[0][1], 0)))
    ):
        out.append(
            f"| {o} | {_compact_problem(key)} | "
            + " | ".join(by_target.get(t, "–") for t in targets)
            + " |"
        )
    if speedups:
        out.append("")
        groups = sorted({g for g, _, _ in speedups})
        # one line per cost model and LNC: figures of different models are not pooled
        for g in groups:
            xs = [x for gg, x, _ in speedups if gg == g]
            bands = [b for gg, _, b in speedups if gg == g and b]
            gm = math.exp(sum(math.log(x) for x in xs) / len(xs))
            band = ""
            if len(bands) == len(xs):
                lo = math.exp(sum(math.log(b[0]) for b in bands) / len(bands))
                hi = math.exp(sum(math.log(b[1]) for b in bands) / len(bands))
                band = f" ({lo:.3f}–{hi:.3f}: geomeans of the band ends)"
            out.append(
                f"{g}: {len(xs)} entries; speedup geomean x{gm:.3f}{band}, "
                f"max x{max(xs):.2f}, min x{min(xs):.2f}."
            )
        out.append("Latencies: " + "; ".join(sorted(measurers)) + ".")
        n_banded = sum(1 for _, _, b in speedups if b)
        if n_banded:
            out.append(f"Bands: {BAND_MEANING}; the speedup's band is default / tuned taken "
                       "parameter set by parameter set.")  # fmt: skip
        if n_banded < len(speedups):
            out.append(f"{len(speedups) - n_banded} entries have no band (tuned before "
                       "bands were recorded).")  # fmt: skip
    return out


def config_ops() -> set[str]:
    """The op names a config file can hold: those of the KernelConfig subclasses."""
    from .. import ops
    from ..kernel_config import KernelConfig

    ops.load_all()  # the op families define their kernels' config classes
    names: set[str] = set()
    stack = list(KernelConfig.__subclasses__())
    while stack:
        cls = stack.pop()
        names.add(cls.op_name)
        stack.extend(cls.__subclasses__())
    return names - {""}


def _check_filters(args: argparse.Namespace) -> None:
    """--op / --target name an op and a target that exist (a typo would otherwise filter
    every file out: "no stored configs", "0 differences", "0 entries checked" and exit 0).
    --target becomes the target's canonical name, as the config directories are named."""
    op = getattr(args, "op", None)
    if op is not None and args.configs_cmd != "which" and op not in config_ops():
        raise ValueError(f"--op: expected one of {', '.join(sorted(config_ops()))}; got {op!r}")
    target = getattr(args, "target", None)
    if target is not None and args.configs_cmd != "which":
        from ..targets import get_target

        try:
            args.target = get_target(target).name
        except ValueError as e:
            raise ValueError(f"--{e}") from None


def run_configs(args: argparse.Namespace) -> int:
    """`nki-kernels configs show|summary|diff|which|validate`."""
    if args.configs_cmd == "which":
        return _which(args)
    _check_filters(args)
    if args.configs_cmd == "validate":
        return _validate(args)
    if args.configs_cmd == "summary":
        lines = _configs_summary(_dirs(args.config_dir)[0], args.op, args.lnc)
        print("\n".join(lines) if len(lines) > 2 else "no stored configs")
        return 0
    if args.configs_cmd == "show":
        from .export import describe_entry

        found = False
        if args.markdown:
            print("| op | target | bucketed problem | default (us) | tuned (us) | speedup | "
                  "tuned config | measurer |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
        for d in _dirs(args.config_dir):
            for (t, o), path in _files(d, args.target, args.op).items():
                found = True
                current = _current_hash(o)
                if not args.markdown:
                    print(f"{path}  ({t}, {o})")
                entries = _entries_or_report(path)
                for key, entry in sorted((entries or {}).items(), key=_natural):
                    bad = _schema_problem(o, entry)
                    if bad:
                        print(f"  {key}\n    INVALID: {bad}")
                        continue
                    h = entry.get("provenance", {}).get("kernel_hash")
                    stale = "" if current is None or h == current else "  STALE (kernel changed)"
                    if args.markdown:
                        print(_markdown_row(o, t, key, entry, stale))
                    else:
                        print(f"  {key}\n    {describe_entry(entry)}{stale}")
        if not found:
            print("no stored configs", file=sys.stderr)
        return 0
    fa = _files(_dir(args.a, "a"), args.target, args.op)
    fb = _files(_dir(args.b, "b"), args.target, args.op)
    changes = 0
    for to in sorted(set(fa) | set(fb)):
        ea = (_entries_or_report(fa[to]) or {}) if to in fa else {}
        eb = (_entries_or_report(fb[to]) or {}) if to in fb else {}
        for key in sorted(set(ea) | set(eb)):
            line = _diff_line(ea.get(key), eb.get(key))
            if line:
                changes += 1
                print(f"{to[0]}/{to[1]} {key}: {line}")
    print(f"{changes} difference(s)")
    return 0


def _natural(item: tuple[str, Any]) -> list[tuple[str, int, str]]:
    """Sort key of a problem key: numeric fields compare as numbers."""
    out = []
    for part in item[0].split(","):
        name, _, value = part.partition("=")
        out.append((name, int(value), "") if value.isdigit() else (name, -1, value))
    return out


def _latencies(prov: dict[str, Any]) -> tuple[float, float]:
    """(tuned, default) latency of a stored provenance; null (never measured) is nan."""
    from ..runtime.config_records import stored_number

    return tuple(stored_number(prov.get(k)) for k in ("latency_ns", "default_latency_ns"))  # type: ignore[return-value]


def _markdown_row(op: str, target: str, key: str, entry: dict[str, Any], stale: str) -> str:
    prov = entry.get("provenance", {})
    lat, dflt = _latencies(prov)
    cfg = ", ".join(f"{k}={v}" for k, v in entry.get("config", {}).items())
    return (
        f"| {op} | {target} | {key} | {dflt / 1e3:.1f} | {lat / 1e3:.1f} | "
        f"{dflt / lat:.3f}x | {cfg} | {prov.get('measurer', '?')}{stale} |"
    )


def _diff_line(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
    if a is None or b is None:
        return "only in " + ("B" if a is None else "A")
    ca, cb = a.get("config", {}), b.get("config", {})
    fields = [
        f"{k}: {ca.get(k)} -> {cb.get(k)}"
        for k in sorted(set(ca) | set(cb))
        if ca.get(k) != cb.get(k)
    ]
    la = a.get("provenance", {}).get("latency_ns", math.nan)
    lb = b.get("provenance", {}).get("latency_ns", math.nan)
    if not fields and la == lb:
        return ""
    lat = f"latency {la / 1e3:.2f} -> {lb / 1e3:.2f} us"
    return "; ".join([*fields, lat])


def _schema_problem(op: str, entry: Any) -> str:
    """Why `entry` fails the schema of `op`'s config class ('' when it passes or the op
    is unknown here)."""
    from ..runtime.config_schema import EntryError, check_entry
    from ..runtime.config_store import config_class_for

    try:
        cls = config_class_for(op)
    except LookupError:
        return ""
    try:
        check_entry(cls, entry)
    except EntryError as e:
        return str(e)
    return ""


def _store_for(config_dir: str | None) -> Any:
    from ..runtime.config_store import SHIPPED_DIR, ConfigStore, default_store

    if config_dir is None:
        return default_store()
    return ConfigStore([_dir(config_dir, "--config-dir"), SHIPPED_DIR], None)


def _which(args: argparse.Namespace) -> int:
    import warnings

    from ..runtime.buckets import policy_for, using_policy
    from ..runtime.config_store import ConfigFallbackWarning
    from .families import get

    spec = get(args.op)
    policy = policy_for(args.op, args.bucket_policy)
    if args.size < 1:
        raise ValueError(f"--size: expected an int >= 1; got {args.size}")
    b = policy.bucket(args.size)
    dtype = args.dtype or spec.dtypes[0]
    with using_policy(policy):
        problem = spec.make_problem(args.shape, b, dtype)
    from .cli import tune_lnc

    lnc = tune_lnc(args)
    tunable = spec.make_tunable()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d = _store_for(args.config_dir).decide(
            args.op, args.target, problem, kernel_hash=tunable.source_hash(), lnc=lnc
        )
    lnc_why = "--lnc" if args.lnc is not None else "the LNC calls here launch at; --lnc to change"
    print(f"size {args.size} -> bucket {b} ({spec.bucket_dim}, policy {policy.name()}), "
          f"LNC {lnc} ({lnc_why})")  # fmt: skip
    print(d.describe())
    print(_why(_store_for(args.config_dir), d, args.op, args.target))
    for w in caught:
        if not issubclass(w.category, ConfigFallbackWarning):  # "uses heuristic default" says it
            print(f"  warning: {w.message}")
    return 0


def _why(store: Any, d: Any, op: str, target: str) -> str:
    """Which store won the lookup `d`, and why, in a line or two."""
    from pathlib import Path

    from ..runtime.config_store import DEFAULT, NEAREST, SHIPPED_DIR

    def name(path: Any) -> str:
        p = Path(path).resolve()
        shipped = SHIPPED_DIR.resolve()
        return "shipped" if p == shipped or shipped in p.parents else f"your {path}"

    order = ", then ".join(name(x) for x in store.search_dirs)
    if len(store.search_dirs) == 1 and d.source != DEFAULT:
        return (f"  why    {name(d.file)} wins: the only store searched (no --config-dir, "
                "$NKI_KERNELS_CONFIG_DIR unset)")  # fmt: skip
    if d.source == DEFAULT:
        return (f"  why    no usable entry for this key or a nearby bucket in {order}: "
                "the kernel's heuristic default")  # fmt: skip
    rule = "an exact key is used before a nearest bucket; " if d.source == NEAREST else ""
    text = (f"  why    {name(d.file)} wins: {rule}directories are searched in order "
            f"({order}), the first usable entry is taken")  # fmt: skip
    shadowed = [src for k, _, src in store.entries(op, target) if k == d.problem and src != d.file]
    if shadowed:
        text += f"; it shadows the entry in {', '.join(name(x) for x in shadowed)}"
    return text


def _problem_of(op: str, key: str) -> Any:
    """The bucketed problem a stored key names (None when the op is not tunable here)."""
    import dataclasses

    from ..runtime.config_keys import parse_key
    from .families import OPS

    if op not in OPS:
        return None
    spec = OPS[op]
    cls = type(spec.make_problem(spec.shapes[0], spec.standard_buckets[0], spec.dtypes[0]))
    fields = {f.name for f in dataclasses.fields(cls)}
    values = parse_key(key)
    values.pop("lnc", None)  # the launch's LNC (config_store.lnc_items), not a problem field
    if set(values) != fields:
        raise ValueError(f"key fields {sorted(values)} are not {cls.__name__}'s {sorted(fields)}")
    return cls(**values)


def _validate(args: argparse.Namespace) -> int:
    from ..kernel_config import InvalidConfig
    from ..runtime.config_schema import EntryError, check_entry
    from ..runtime.config_store import config_class_for
    from ..targets import get_target

    bad = total = 0
    for d in _dirs(args.config_dir):
        for (t, o), path in _files(d, args.target, args.op).items():
            entries = _entries_or_report(path)
            if entries is None:
                bad += 1
                continue
            current = _current_hash(o)
            for key, entry in sorted(entries.items(), key=_natural):
                total += 1
                try:
                    cfg, prov = check_entry(config_class_for(o), entry)
                    problem = _problem_of(o, key)
                    if problem is not None:
                        cfg.validate(problem, get_target(t))
                    if current is not None and prov["kernel_hash"] != current:
                        raise ValueError(f"stale: tuned for kernel hash {prov['kernel_hash']}, "
                                         f"current {current}")  # fmt: skip
                except (EntryError, InvalidConfig, ValueError, TypeError, LookupError) as e:
                    bad += 1
                    print(f"{path}: entry {key!r}: {e}")
    print(f"{total} entries checked, {bad} problem(s)")
    return 1 if bad else 0
