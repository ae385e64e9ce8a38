"""The committed parity reports of the built-in tiny models (the manual's parity table is
generated from them) reproduce: each report is consistent with its own losses, and a
rerun of its first steps on this tree gives the same losses bit for bit. A kernel change
that moves a tiny model's training trajectory fails here until the reports are re-recorded
(`nki-kernels parity --dtype float32|bfloat16 --out benchmarks/results/parity`, then
`python scripts/build_readme.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
from nki_kernels.parity.data import tiny_lm_batches
from nki_kernels.parity.harness import environment, run_parity, tolerance_for
from nki_kernels.parity.models import BUILTIN

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)

RECORDS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "parity"
BUILTIN_REPORTS = sorted(
    p for p in RECORDS.glob("*.json") if p.name.split("-float")[0].split("-bfloat")[0] in BUILTIN
)
# the trajectory is sequential, so a rerun's first steps are the report's prefix; the
# gradient norms see a backward change at step 0, before it reaches a loss
RERUN_STEPS = 2


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_every_builtin_model_and_dtype_has_a_report() -> None:
    names = {p.name for p in BUILTIN_REPORTS}
    assert names == {f"{m}-{d}.json" for m in BUILTIN for d in ("float32", "bfloat16")}


@pytest.mark.parametrize("path", BUILTIN_REPORTS, ids=lambda p: p.stem)
def test_a_report_is_consistent_with_its_losses(path: Path) -> None:
    r = _load(path)
    ref, alt, cand = (r[k]["losses"] for k in ("reference", "alternative", "candidate"))
    assert len(ref) == len(alt) == len(cand) == r["steps"]
    floor = max(abs(a - b) for a, b in zip(ref, alt))
    assert r["floor"] == floor
    tol, rule = tolerance_for(floor, ref[0], getattr(torch, r["dtype"]))
    assert (r["tolerance"], r["tolerance_rule"]) == (tol, rule)
    assert r["deltas"] == [abs(c - a) for c, a in zip(cand, ref)]
    first = next((i for i, d in enumerate(r["deltas"]) if not d <= tol), None)
    assert r["first_divergent_step"] == first
    resumed, half = r["resumed"]["losses"], r["resume_from"]
    assert r["resume_max_delta"] == max(abs(a - b) for a, b in zip(resumed, cand[half:]))
    env = r["environment"]  # what a rerun must match, and what the seconds were measured on
    assert env["torch_threads"] == 1 and env["deterministic_algorithms"] is True
    assert env["date"] and env["machine"] and "load_average_1min" in env


@pytest.mark.parametrize("path", BUILTIN_REPORTS, ids=lambda p: p.stem)
def test_a_rerun_reproduces_the_committed_trajectory(path: Path) -> None:
    r = _load(path)
    here, then = environment(), r["environment"]
    versions = ("torch", "transformers", "numpy")
    if any(here[k] != then[k] for k in versions):
        pytest.skip(
            "the report was recorded with "
            + ", ".join(f"{k} {then[k]}" for k in versions)
            + "; this environment has "
            + ", ".join(f"{k} {here[k]}" for k in versions)
        )
    rerun = run_parity(
        BUILTIN[r["model"]],
        tiny_lm_batches,
        steps=RERUN_STEPS,
        seed=r["seed"],
        dtype=getattr(torch, r["dtype"]),
        log=lambda _: None,
    )
    for run in ("reference", "alternative", "candidate"):
        got = (getattr(rerun, run).losses, getattr(rerun, run).grad_norms)
        want = (r[run]["losses"][:RERUN_STEPS], r[run]["grad_norms"][:RERUN_STEPS])
        assert got == want, (
            f"{path.name}: the {run} run moved (losses, gradient norms: {want} committed, "
            f"{got} now): "
            "re-record with `nki-kernels parity --dtype "
            f"{r['dtype']} --out benchmarks/results/parity` and rebuild the README"
        )
