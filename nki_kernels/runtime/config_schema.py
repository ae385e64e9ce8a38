"""Schema checks of stored config entries: what a config file may hold before a kernel sees it.

A config file entry is `{"config": {...}, "provenance": {...}}`. Before an entry can be
used, `check_entry` verifies:

- `config` is an object whose fields are exactly the config class's fields, each of its
  declared type (`bool` fields take JSON true/false only -- `"no"` is not false; `int`
  fields take integers only -- `"5120"` is not 5120; `float` fields take numbers;
  `str` fields take strings; `X | None` also takes null);
- `provenance` holds every `Provenance` field with its type (hash / measurer / date
  strings, latencies numbers, trials an integer >= 0).

Range and fit (`KernelConfig.validate(problem, target)`) are checked by the lookup for the
problem at hand. Every failure is an `EntryError` naming the field.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

from ..kernel_config import KernelConfig


class EntryError(ValueError):
    """A stored entry does not match the schema; `field` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"field {field!r}: {message}")
        self.field = field


_PROVENANCE_TYPES: dict[str, tuple[type, ...]] = {
    "kernel_hash": (str,),
    "measurer": (str,),
    "latency_ns": (int, float),
    "default_latency_ns": (int, float),
    "trials": (int,),
    "date": (str,),
}


# optional provenance fields (written since LNC-2 tuning and bands): name -> check
_OPTIONAL_PROVENANCE = ("lnc", "rank", "latency_band_ns", "default_latency_band_ns",
                        "speedup_band")  # fmt: skip

_TYPES: dict[type, dict[str, tuple[tuple[type, ...], bool]]] = {}


def _field_types(cls: type[KernelConfig]) -> dict[str, tuple[tuple[type, ...], bool]]:
    """Per field: (accepted JSON types, None allowed)."""
    if cls in _TYPES:
        return _TYPES[cls]
    hints = typing.get_type_hints(cls)
    out: dict[str, tuple[tuple[type, ...], bool]] = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        args = typing.get_args(hint)
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        members = [a for a in args if a is not type(None)] if union else [hint]
        nullable = union and type(None) in args
        accepted: list[type] = []
        for m in members:
            if m is float:
                accepted += [int, float]
            elif typing.get_origin(m) is typing.Literal:
                accepted += [type(v) for v in typing.get_args(m)]
            elif isinstance(m, type):
                accepted.append(m)
        out[f.name] = (tuple(accepted), nullable)
    _TYPES[cls] = out
    return out


def _type_ok(value: Any, accepted: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in accepted
    return isinstance(value, accepted)


def _names(accepted: tuple[type, ...], nullable: bool) -> str:
    names = sorted({t.__name__ for t in accepted})
    return " or ".join(names + (["null"] if nullable else []))


def check_config(cls: type[KernelConfig], data: Any) -> KernelConfig:
    """`cls` built from stored `data` after the type checks (EntryError naming the field)."""
    if not isinstance(data, Mapping):
        raise EntryError("config", f"expected an object; got {type(data).__name__}")
    types_ = _field_types(cls)
    unknown = sorted(set(data) - set(types_))
    if unknown:
        raise EntryError(f"config.{unknown[0]}", f"not a field of {cls.__name__}")
    for name, (accepted, nullable) in types_.items():
        if name not in data:
            raise EntryError(f"config.{name}", "missing")
        v = data[name]
        if v is None and nullable:
            continue
        if not _type_ok(v, accepted):
            raise EntryError(
                f"config.{name}",
                f"expected {_names(accepted, nullable)}; got {type(v).__name__} {v!r}",
            )
    try:
        return cls(**dict(data))
    except (TypeError, ValueError) as e:
        raise EntryError("config", f"{cls.__name__} refuses it: {e}") from None


def check_provenance(data: Any) -> dict[str, Any]:
    """The provenance fields after the type checks (EntryError naming the field)."""
    if not isinstance(data, Mapping):
        raise EntryError("provenance", f"expected an object; got {type(data).__name__}")
    for name, accepted in _PROVENANCE_TYPES.items():
        if name not in data:
            raise EntryError(f"provenance.{name}", "missing")
        v = data[name]
        if v is None and name == "default_latency_ns":  # null: the default was not measured
            continue
        if isinstance(v, bool) or not isinstance(v, accepted):
            raise EntryError(
                f"provenance.{name}",
                f"expected {_names(accepted, False)}; got {type(v).__name__} {v!r}",
            )
    if data["trials"] < 0:
        raise EntryError("provenance.trials", f"expected >= 0; got {data['trials']}")
    out = {k: data[k] for k in _PROVENANCE_TYPES}
    if out["default_latency_ns"] is None:
        out["default_latency_ns"] = math.nan
    for name in _OPTIONAL_PROVENANCE:
        v = data.get(name)
        if v is None:
            continue
        if name == "lnc":
            ok = isinstance(v, int) and not isinstance(v, bool) and v in (1, 2)
            want = "1 or 2"
        elif name == "rank":
            ok, want = v in ("nominal", "pessimistic"), "'nominal' or 'pessimistic'"
        else:
            ok = (
                isinstance(v, list)
                and len(v) == 2
                and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)
                and v[0] <= v[1]
            )
            want = "[low, high] numbers"
        if not ok:
            raise EntryError(f"provenance.{name}", f"expected {want}; got {v!r}")
        out[name] = v
    return out


def check_entry(cls: type[KernelConfig], entry: Any) -> tuple[KernelConfig, dict[str, Any]]:
    """(config, provenance fields) of a stored entry, or EntryError naming the field."""
    if not isinstance(entry, Mapping):
        raise EntryError("entry", f"expected an object; got {type(entry).__name__}")
    if "config" not in entry:
        raise EntryError("config", "missing")
    if "provenance" not in entry:
        raise EntryError("provenance", "missing")
    prov = check_provenance(entry["provenance"])
    return check_config(cls, entry["config"]), prov


__all__ = ["EntryError", "check_config", "check_entry", "check_provenance"]
