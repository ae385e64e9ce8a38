"""The property-based suite (profiles: `tests/conftest.py`): prints how many cases ran."""

from __future__ import annotations

from typing import Any

import fuzz_support


def pytest_terminal_summary(terminalreporter: Any) -> None:
    cases = fuzz_support.CASES
    if cases:
        parts = ", ".join(f"{k} {v}" for k, v in sorted(cases.items()))
        terminalreporter.write_line(f"fuzz cases: {sum(cases.values())} ({parts})")
