"""The case lists per kind of checkout."""

from __future__ import annotations

from .runner import Case


def cases_for(kind: str) -> list[Case]:
    """The cases for an 'nki-library' or 'sdk' checkout (see `loader.checkout_kind`)."""
    if kind == "sdk":
        from .cases_sdk import CASES
    elif kind == "nki-library":
        from .cases_nkilib import CASES
    else:
        raise ValueError(f"kind: expected 'nki-library' or 'sdk'; got {kind!r}")
    return list(CASES)
