"""The golden-batch harness on a small plain model: a correct NKI path passes, a wrong one
is caught at its first divergent step, non-finite gradients fail the run, the resume
check holds, and the command writes its JSON report and plot."""

from __future__ import annotations

import json
import math

import plain_model
import pytest
import torch
from torch import nn

from nki_kernels.cli import main
from nki_kernels.integrations import swap
from nki_kernels.nn import RMSNorm
from nki_kernels.parity import report, run_parity, tolerance_for

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)


def _quiet(_: str) -> None:
    pass


def test_a_correct_path_passes_within_the_floor_tolerance() -> None:
    r = run_parity(plain_model.model, plain_model.data, steps=4, log=_quiet)
    assert r.passed and r.first_divergent_step is None
    assert max(r.deltas) <= r.tolerance
    assert r.resume_max_delta == 0.0  # same state, same batches, deterministic CPU
    assert r.patched == {"modules": 1}
    assert len(r.reference.losses) == len(r.candidate.losses) == 4
    assert len(r.resumed.losses) == 2 and r.resume_from == 2
    assert "verdict: PASS" in report.table(r)


def _bad_norm(scale: float):
    def make(old: nn.Module) -> nn.Module:
        new = swap._rms(old)
        forward = new.forward
        new.forward = lambda x: forward(x) * scale  # type: ignore[method-assign]
        return new

    return make


def test_a_wrong_path_diverges_at_its_first_bad_step(monkeypatch) -> None:
    monkeypatch.setitem(swap.DEFAULT_SWAPS, nn.RMSNorm, _bad_norm(1.01))
    r = run_parity(plain_model.model, plain_model.data, steps=3, log=_quiet)
    assert not r.passed and r.first_divergent_step == 0
    assert "**no**" in report.table(r)


def test_non_finite_gradients_fail_the_run(monkeypatch) -> None:
    monkeypatch.setitem(swap.DEFAULT_SWAPS, nn.RMSNorm, _bad_norm(math.inf))
    r = run_parity(plain_model.model, plain_model.data, steps=2, log=_quiet, tolerance=1e9)
    assert sum(r.candidate.nonfinite) > 0 and sum(r.reference.nonfinite) == 0
    assert not r.passed


def test_tolerance_is_the_floor_margin_or_the_fp32_ulp_term() -> None:
    assert tolerance_for(1e-3, 5.0, torch.bfloat16)[0] == pytest.approx(3e-3)
    tol, rule = tolerance_for(0.0, 5.0, torch.float32)
    assert tol == pytest.approx(16 * torch.finfo(torch.float32).eps * 5.0)
    assert "noise floor" in rule


def test_the_command_prints_the_tolerance_first_and_writes_json_and_plot(tmp_path, capsys):
    rc = main(
        [
            "parity",
            "--model",
            "plain_model:model",
            "--data",
            "plain_model:data",
            "--steps",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert out.index("tolerance, fixed before the run") < out.index("| step |")
    saved = json.loads((tmp_path / "plain_model_model-float32.json").read_text())
    assert saved["passed"] and len(saved["deltas"]) == 2
    pytest.importorskip("matplotlib")
    assert (tmp_path / "parity-float32.png").stat().st_size > 0


def test_a_model_without_a_loss_is_refused_by_name() -> None:
    def bad_model(seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
        return RMSNorm(16)

    with pytest.raises(TypeError, match="model: expected the forward to return a scalar loss"):
        run_parity(bad_model, lambda s, i: {"x": torch.randn(2, 16)}, steps=2, log=_quiet)


@pytest.mark.slow
def test_nproc_2_ddp_and_fsdp2_with_a_sharded_checkpoint_resumed_in_fresh_processes(
    tmp_path,
) -> None:
    """One run of the command (two torchrun launches) on the tiny Mixtral: norms,
    attention and MoE ops under DDP and FSDP2, parameters identical on all ranks, the
    NKI path on the reference's trajectory, the DCP checkpoint restored and continued."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-m", "nki_kernels.cli", "parity", "--nproc", "2"]
    cmd += ["--model", "tiny-mixtral", "--steps", "2", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    saved = json.loads((tmp_path / "tiny-mixtral-dist2.json").read_text())
    assert saved["world_size"] == 2 and saved["passed"]
    for wrapper in ("ddp", "fsdp2"):
        w = saved[wrapper]
        assert w["params_in_sync"] == {"reference": True, "candidate": True, "resumed": True}
        assert w["max_delta"] <= saved["tolerance"] and w["first_divergent_step"] is None
        assert len(w["resumed_losses"]) == 1 and w["resume_max_delta"] <= saved["tolerance"]
        assert w["nonfinite_grads"] == {"reference": [0, 0], "candidate": [0, 0]}
    assert max(saved["fsdp2_vs_ddp_max_delta"].values()) <= saved["tolerance"]
    assert (tmp_path / "checkpoints" / "tiny-mixtral-fsdp2" / ".metadata").is_file()
    assert "FSDP2 (fully_shard)" in proc.stdout
    out = proc.stdout
    assert out.index("tolerance, fixed before the NKI runs") < out.index("ddp nki run")
    pytest.importorskip("matplotlib")
    assert (tmp_path / "parity-dist2.png").stat().st_size > 0


def _phase(losses: list[float], sync: bool = True, bad: int = 0) -> dict:
    nonfinite = [bad] * len(losses)
    return {
        "losses": losses,
        "nonfinite_grads": nonfinite,
        "params_in_sync": sync,
        "seconds_per_step": 0.1,
    }


def _phases(cand: list[float], resumed: list[float], sync: bool = True) -> tuple[dict, dict]:
    from nki_kernels.parity.dist_rank import floor_tolerance

    ref = [2.0, 1.9, 1.8, 1.7]
    paths = ("reference", "alternative", "nki")
    train = {f"{w}/{p}": _phase(ref) for w in ("ddp", "fsdp2") for p in paths}
    train["tolerance"] = floor_tolerance(train, ref, None, 2)  # floor 0: the ulp term
    train["fsdp2/nki"] = _phase(cand, sync)
    return train, {"ddp/resumed": _phase(ref[2:]), "fsdp2/resumed": _phase(resumed)}


def test_distributed_merge_flags_divergence_a_bad_resume_and_lost_sync() -> None:
    from nki_kernels.parity.distributed import merge

    good = merge("m", 2, 4, *_phases([2.0, 1.9, 1.8, 1.7], [1.8, 1.7]))
    assert good["passed"] and good["fsdp2"]["resume_max_delta"] == 0.0
    diverged = merge("m", 2, 4, *_phases([2.0, 1.9, 1.85, 1.7], [1.85, 1.7]))
    assert not diverged["passed"] and diverged["fsdp2"]["first_divergent_step"] == 2
    bad_resume = merge("m", 2, 4, *_phases([2.0, 1.9, 1.8, 1.7], [1.8, 1.75]))
    assert not bad_resume["fsdp2"]["passed"] and bad_resume["fsdp2"]["resume_max_delta"] > 0.04
    unsynced = merge("m", 2, 4, *_phases([2.0, 1.9, 1.8, 1.7], [1.8, 1.7], sync=False))
    assert not unsynced["passed"] and unsynced["ddp"]["passed"]
    train, resume = _phases([2.0, 1.9, 1.8, 1.7], [1.8, 1.7])
    train["ddp/nki"] = _phase([2.0, 1.9, 1.8, 1.7], bad=3)
    nonfinite = merge("m", 2, 4, train, resume)
    assert (
        not nonfinite["ddp"]["passed"] and nonfinite["ddp"]["nonfinite_grads"]["candidate"][0] == 3
    )


def test_device_mode_compares_the_neuron_device_with_cpu(neuron: str) -> None:
    r = run_parity(plain_model.model, plain_model.data, steps=2, device=neuron, log=_quiet)
    assert r.mode == "cpu vs neuron (both NKI)"
    assert r.passed, (r.deltas, r.tolerance)
