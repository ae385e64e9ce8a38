"""`explain(op, *args)`: which tuned config a call uses, from where, and its provenance.

The call is made once (on the tensors given, so on their shapes and device) while every
config lookup it does is recorded: the answer is the op's own decision, not a re-derivation
of it. An op may look up several configs (a backward's statistics kernel, attention's key
chunks): each is listed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config_store import ConfigDecision, recording_decisions


@dataclass(frozen=True)
class Explanation:
    """The config decisions of one op call, in the order the op made them."""

    op: str
    decisions: tuple[ConfigDecision, ...]

    def __str__(self) -> str:
        if not self.decisions:
            return f"{self.op}: the call looked up no tuned config"
        seen: list[str] = []
        for d in self.decisions:
            text = d.describe()
            if text not in seen:
                seen.append(text)
        return "\n".join(seen)


def explain(op: str, *args: Any, **kwargs: Any) -> Explanation:
    """Run `torch.ops.nki.<op>(*args, **kwargs)` once and report its config decisions."""
    import torch

    packet = getattr(torch.ops.nki, op, None) if isinstance(op, str) else None
    if packet is None:
        from ..ops import registered_ops

        raise ValueError(f"op: expected one of {sorted(registered_ops())}; got {op!r}")
    with recording_decisions() as out, torch.no_grad():
        packet(*args, **kwargs)
    return Explanation(op, tuple(out))


__all__ = ["Explanation", "explain"]
