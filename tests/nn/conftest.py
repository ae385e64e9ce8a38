"""Module tests reuse the norm tests' references and derived bounds (tests/norm)."""

from __future__ import annotations

import sys
from pathlib import Path

_NORM_TESTS = str(Path(__file__).resolve().parent.parent / "norm")
if _NORM_TESTS not in sys.path:
    sys.path.insert(0, _NORM_TESTS)
