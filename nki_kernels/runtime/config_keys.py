"""Keys of stored configs: a bucketed problem as its canonical key string (with the
launch's LNC), a key parsed back, and the distance between two keys along the bucketed
dimensions (see config_store.py, "Lookup")."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

BUCKET_FIELDS = frozenset({"rows", "tokens", "seq_q", "seq_k", "seq"})


def problem_items(problem: Any) -> dict[str, Any]:
    if isinstance(problem, Mapping):
        items = dict(problem)
    elif dataclasses.is_dataclass(problem) and not isinstance(problem, type):
        items = dataclasses.asdict(problem)
    else:
        raise TypeError(
            f"problem: expected a Mapping or a dataclass instance; got {type(problem).__name__}"
        )
    for k, v in items.items():
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            raise TypeError(f"problem field {k!r}: expected int, float or str; got {v!r}")
        if isinstance(v, str) and ("," in v or "=" in v):
            raise ValueError(f"problem field {k!r}: ',' and '=' are reserved; got {v!r}")
    return items


def lnc_items(problem: Any, lnc: int) -> dict[str, Any]:
    """The key fields of `problem` launched at `lnc` logical cores: an `lnc` field is added
    when lnc != 1, so keys without one (every entry stored before LNC entered the key)
    are LNC 1 and a lookup at LNC 2 never takes a config tuned for one core."""
    items = problem_items(problem)
    if "lnc" in items:
        raise ValueError("problem: 'lnc' is reserved for the launch's LNC (pass lnc=)")
    if lnc != 1:
        items["lnc"] = lnc
    return items


def problem_key(problem: Any) -> str:
    """Canonical key string of a bucketed problem: 'name=value' pairs sorted by name."""
    items = problem_items(problem)
    return ",".join(f"{k}={items[k]}" for k in sorted(items))


def parse_key(key: str) -> dict[str, int | float | str]:
    out: dict[str, int | float | str] = {}
    for part in key.split(","):
        name, _, raw = part.partition("=")
        value: int | float | str = raw
        for conv in (int, float):
            try:
                value = conv(raw)
                break
            except ValueError:
                continue
        out[name] = value
    return out


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def key_distance(
    a: Mapping[str, Any], b: Mapping[str, Any], bucket_fields: frozenset[str] = BUCKET_FIELDS
) -> float | None:
    """log2 distance along the bucketed fields; None unless every other field is equal."""
    if set(a) != set(b):
        return None
    d = 0.0
    for k, va in a.items():
        vb = b[k]
        numeric = is_number(va) and is_number(vb)
        if k not in bucket_fields or not numeric:
            if str(va) != str(vb):
                return None
        elif va != vb:
            if va <= 0 or vb <= 0:
                return None
            d += abs(math.log2(va / vb))
    return d
