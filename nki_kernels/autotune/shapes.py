"""Model shapes for `tune --shape`: a named model, explicit dimensions, or both.

    llama3-8b                          the named model of the op's table (model_shapes)
    hidden=5120                        a norm of hidden size 5120
    E=16,top_k=4,H=2048,I=1408         an MoE layer (experts, top-k, hidden, intermediate)
    head_dim=64,q_heads=32,kv_heads=8  an attention layer
    llama3-8b,head_dim=64              a named model with some dimensions replaced

Names are the fields of the op's shape type (`NormShape`, `AttentionShape`, `MoEShape`)
or their short aliases (H, I, E, k, D, Hq, Hkv, heads, experts, ...). Every value is an
integer >= 1; a dimension neither given nor inherited from a named model is an error
naming it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

ALIASES = {
    "h": "hidden",
    "hidden_size": "hidden",
    "i": "intermediate",
    "intermediate_size": "intermediate",
    "e": "num_experts",
    "experts": "num_experts",
    "k": "top_k",
    "topk": "top_k",
    "d": "head_dim",
    "hq": "num_heads",
    "heads": "num_heads",
    "q_heads": "num_heads",
    "hkv": "num_kv_heads",
    "kv_heads": "num_kv_heads",
}


def _canonical(name: str, fields: Sequence[str]) -> str | None:
    n = name.strip()
    if n in fields:
        return n
    alias = ALIASES.get(n.lower())
    return alias if alias in fields else None


def resolve_shape(table: Sequence[Any], text: str) -> Any:
    """The shape `text` names in `table` (a tuple of one shape dataclass type)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"--shape: expected a model name or dims like hidden=5120; got {text!r}")
    cls = type(table[0])
    fields = [f.name for f in dataclasses.fields(cls) if f.name != "model"]
    models = [s.model for s in table]
    base: Any = None
    dims: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if "=" not in part:
            if base is not None or part not in models:
                raise ValueError(
                    f"--shape: expected one model name of {models} and/or dims NAME=INT with "
                    f"NAME in {fields}; got {part!r} in {text!r}"
                )
            base = next(s for s in table if s.model == part)
            continue
        name, _, raw = part.partition("=")
        field = _canonical(name, fields)
        if field is None:
            raise ValueError(
                f"--shape: unknown dimension {name.strip()!r}; expected one of {fields}"
            )
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"--shape: {field}: expected an integer >= 1; got {raw!r}") from None
        if value < 1:
            raise ValueError(f"--shape: {field}: expected an integer >= 1; got {value}")
        dims[field] = value
    if base is None and not dims:
        raise ValueError(f"--shape: expected a model name or dims; got {text!r}")
    if base is None:
        missing = [f for f in fields if f not in dims]
        if missing:
            raise ValueError(
                f"--shape: {text!r} lacks {missing} (give them, or start from a model of {models})"
            )
        return cls(model=text, **dims)
    if not dims:
        return base
    return dataclasses.replace(base, model=text, **dims)


__all__ = ["ALIASES", "resolve_shape"]
