"""Property: whatever is broken in a user config directory (the fault matrix of
tests/runtime/store_faults.py, next to valid entries of other problems), the norm ops
give exactly the result they give without a user directory, and report the fault once
(issue 31)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from fuzz_support import count_case
from hypothesis import given
from hypothesis import strategies as st

import nki_kernels.ops.norm  # noqa: F401  (registers the ops)
from nki_kernels.runtime import config_store as cs
from nki_kernels.runtime.config_store import InvalidEntryWarning

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))
from store_faults import FAULTS

# as root every file is readable: that fault is not one there
NAMES = sorted(f for f in FAULTS if f != "unreadable" or os.geteuid() != 0)


@st.composite
def store_case(draw: st.DrawFn) -> dict:
    return {
        "fault": draw(st.sampled_from(NAMES)),
        "op": draw(st.sampled_from(["rms_norm", "layer_norm"])),
        "rows": draw(st.integers(1, 300)),
        "hidden": draw(st.sampled_from([8, 64, 100])),
        "other_files": draw(st.booleans()),  # valid files of other ops beside the fault
        "seed": draw(st.integers(0, 2**16)),
    }


def _call(op: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if op == "rms_norm":
        return torch.ops.nki.rms_norm(x, w, 1e-6)
    return torch.ops.nki.layer_norm(x, w, None, 1e-5)


@given(store_case())
def test_a_broken_user_store_never_changes_or_stops_an_op(c: dict) -> None:
    count_case("config-store")
    g = torch.Generator().manual_seed(c["seed"])
    x, w = torch.randn(c["rows"], c["hidden"], generator=g), torch.randn(c["hidden"], generator=g)
    saved = cs._default
    try:
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            cs.set_config_dir(None)
            want = _call(c["op"], x, w)
            user = FAULTS[c["fault"]](Path(tmp) / "user")
            if c["other_files"] and (user / "trn2").is_dir():
                other = user / "trn2" / "moe_mlp.json"
                other.parent.mkdir(parents=True, exist_ok=True)
                if not other.exists():
                    other.write_text(json.dumps({"format": 1, "entries": {}}))
            cs.set_config_dir(user)
            seen.clear()
            got = [_call(c["op"], x, w) for _ in range(2)]
            for y in got:
                assert torch.equal(y, want)
            if c["op"] == "rms_norm":  # the faults break rms_norm's file
                reports = [m for m in seen if issubclass(m.category, InvalidEntryWarning)]
                assert len(reports) == 1, [str(m.message) for m in seen]
    finally:
        cs._default = saved
